"""Guards (core/guards.py, jit.py): a compiled entry runs only while the Python state its trace read
(training flags, hooks, attributes, closed-over and global values, the input layout it relies on) is
unchanged; anything else retraces, says why, and counts against the cache's size limit. What the traced
code writes is not guarded, and a dropped function frees what its cache entries held."""
import gc
import linecache
import warnings
import weakref

import pytest
import torch

import thunderfn as tf

SCALE = 2.0


def _scaled_by_global(x):
    return x * SCALE


class Tempered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.temperature = 1.0

    def forward(self, x):
        return self.linear(x) / self.temperature


class WithSubmodules(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.bn(self.linear(x)))


# -- every submodule's training flag ---------------------------------------------------------------
def test_submodule_eval_retraces_to_the_eval_trace():
    model, x = WithSubmodules(), torch.randn(8, 4)
    jm = tf.jit(model)
    jm(x)
    model.bn.eval()
    model.drop.eval()  # top-level model stays in training mode
    torch.testing.assert_close(jm(x), model(x))
    assert tf.cache_info(jm)["recompiles"] == ["'WithSubmodules.drop'.training changed from True to False"]


def test_mc_dropout_submodule_in_training_under_an_eval_model():
    model = WithSubmodules().eval()
    jm, x = tf.jit(model), torch.randn(8, 4)
    torch.testing.assert_close(jm(x), model(x))
    model.drop.train()  # Monte Carlo dropout: the dropout layer alone samples
    torch.manual_seed(0)
    expected = model(x)
    torch.manual_seed(0)
    torch.testing.assert_close(jm(x), expected)
    assert not torch.equal(expected, model.eval()(x))


# -- hooks, module attributes, closed-over and global values the trace read ------------------------
def test_forward_hook_registered_after_the_first_call_runs():
    model, x = Tempered(), torch.randn(2, 4)
    jm = tf.jit(model)
    jm(x)
    handle = model.linear.register_forward_hook(lambda mod, args, out: out * 10)
    torch.testing.assert_close(jm(x), model(x))
    handle.remove()
    torch.testing.assert_close(jm(x), model(x))


def test_global_forward_hook_registered_after_the_first_call_runs():
    model, x = Tempered(), torch.randn(2, 4)
    jm = tf.jit(model)
    jm(x)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: out + 1)
    try:
        torch.testing.assert_close(jm(x), model(x))
    finally:
        handle.remove()


def test_module_attribute_read_by_forward_is_guarded():
    model, x = Tempered(), torch.randn(2, 4)
    jm = tf.jit(model)
    jm(x)
    model.temperature = 4.0
    torch.testing.assert_close(jm(x), model(x))
    info = tf.cache_info(jm)
    assert info["recompiles"] == ["attribute 'Tempered.temperature' changed from 1.0 to 4.0"]
    model.temperature = 1.0  # back to the first entry: no third compile
    torch.testing.assert_close(jm(x), model(x))
    assert tf.cache_info(jm)["misses"] == 2


def test_global_number_is_guarded():
    global SCALE
    jf, x = tf.jit(_scaled_by_global), torch.ones(3)
    assert jf(x).tolist() == [2.0] * 3
    SCALE = 3.0
    try:
        assert jf(x).tolist() == [3.0] * 3
        assert "global 'SCALE'" in tf.cache_info(jf)["recompiles"][0]
    finally:
        SCALE = 2.0


def test_closed_over_number_is_guarded():
    def make():
        scale = 2.0

        def f(x):
            return x * scale

        def set_scale(v):
            nonlocal scale
            scale = v

        return f, set_scale

    f, set_scale = make()
    jf, x = tf.jit(f), torch.ones(3)
    assert jf(x).tolist() == [2.0] * 3
    set_scale(5.0)
    assert jf(x).tolist() == [5.0] * 3


def test_a_closed_over_float_is_guarded_by_type_and_value_and_nan_stays_nan():
    def make(scale):
        def f(x):
            return x * scale

        def set_scale(v):
            nonlocal scale
            scale = v

        return f, set_scale

    f, set_scale = make(2.0)
    jf, x = tf.jit(f), torch.ones(3)
    for value, misses in ((2.0, 1), (2, 2), (2.0, 2), (3.5, 3), (float("nan"), 4), (float("nan"), 4), (True, 5)):
        set_scale(value)
        torch.testing.assert_close(jf(x), x * value, equal_nan=True)
        assert tf.cache_info(jf)["misses"] == misses, (value, tf.cache_info(jf))


def test_closed_over_number_under_grad_is_guarded():
    scale = [2.0]

    def loss(x):
        return (x * scale[0]).sum()

    g, x = tf.grad(loss), torch.ones(3)
    assert g(x).tolist() == [2.0] * 3
    scale[0] = 7.0
    assert g(x).tolist() == [7.0] * 3


# -- Python state the traced code writes: not guarded, and no traced tensor left in it -------------
def test_value_written_by_the_traced_code_is_not_guarded():
    # A counter the function bumps runs once, at trace time; guarding it would retrace forever.
    class Counter:
        calls = 0

    counter = Counter()

    def f(x):
        counter.calls += 1
        return x + 1

    jf, x = tf.jit(f), torch.ones(2)
    for _ in range(3):
        jf(x)
    assert counter.calls == 1 and tf.cache_info(jf)["misses"] == 1


def test_storing_a_traced_tensor_on_the_module_is_refused_and_leaves_no_proxy():
    class KeepsActivation(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)
            self.last = None

        def forward(self, x):
            out = self.linear(x)
            self.last = out  # eager keeps the tensor; a trace would keep a proxy
            return out.relu()

    model = KeepsActivation()
    with pytest.raises(tf.UnsupportedOpError, match=r"stored a tensor it computed in 'KeepsActivation.last'"):
        tf.jit(model)(torch.randn(2, 3))
    assert model.last is None


# -- tensors held by plain objects passed as arguments ---------------------------------------------
def test_tensor_held_by_a_plain_argument_is_not_frozen():
    class Box:
        def __init__(self, t):
            self.t = t

    def f(x, box):
        return x + box.t

    jf, box, x = tf.jit(f), Box(torch.ones(3)), torch.zeros(3)
    assert jf(x, box).tolist() == [1.0] * 3
    box.t = torch.full((3,), 10.0)
    assert jf(x, box).tolist() == [10.0] * 3
    box.t.add_(1)  # in place: the same object, read by reference
    assert jf(x, box).tolist() == [11.0] * 3


# -- input layout: part of the signature where the trace relies on it ------------------------------
def _contiguous_doubled_in_place(x):
    y = x.contiguous()  # x itself when x is contiguous, else a copy
    y.mul_(2)
    return y


def test_input_contiguity_a_trace_relies_on_is_part_of_its_signature():
    jitted = tf.jit(_contiguous_doubled_in_place)
    for _ in range(2):
        for make in (lambda: torch.ones(2, 3), lambda: torch.ones(3, 2).t()):
            x = make()
            jitted(x)
            assert torch.equal(x, torch.full((2, 3), 2.0 if x.is_contiguous() else 1.0))  # as eager
    info = tf.cache_info(jitted)
    assert (info["misses"], info["hits"]) == (2, 2)
    assert info["recompiles"] == ["tensor argument 0's is_contiguous(memory_format=torch.contiguous_format) "
                                  "changed: True -> False"]


def test_input_layout_is_not_part_of_the_signature_of_a_trace_that_does_not_rely_on_it():
    jitted = tf.jit(lambda x: x.contiguous() * 2)  # no write: view or copy gives the same values
    jitted(torch.ones(2, 3))
    jitted(torch.ones(3, 2).t())
    assert tf.cache_info(jitted)["misses"] == 1


def test_input_strides_a_reshape_relies_on_are_part_of_the_signature():
    def flattened_bumped(x):
        x.reshape(-1).add_(1)  # writes x when the reshape is a view
        return x * 1

    jitted = tf.jit(flattened_bumped)
    for make in (lambda: torch.zeros(2, 3), lambda: torch.zeros(3, 2).t(), lambda: torch.zeros(2, 3)):
        x, expected = make(), make()
        flattened_bumped(expected)
        torch.testing.assert_close(jitted(x), expected)
    assert tf.cache_info(jitted)["misses"] == 2


# -- a symbolic compile guards what the traced code read, not torch's shape machinery --------------
def test_a_symbolic_compile_records_no_guards_in_the_code_torchs_shape_machinery_runs():
    """A symbolic trace runs thousands of sympy (ShapeEnv) and networkx functions; watched, each added
    guards on sympy's objects (10,000 for one reshape), checked on every call of the entry."""
    jitted = tf.jit(lambda x: (x * 2).reshape(-1, 2).sum(0), dynamic=True)
    x = torch.randn(4, 6)
    torch.testing.assert_close(jitted(x), (x * 2).reshape(-1, 2).sum(0))
    (entry,) = jitted._thunderfn_state.symbolic_entries
    assert len(entry.guards) < 100, len(entry.guards)


# -- the cache: hits counted, a size limit, and the reason for each recompile ----------------------
def test_cache_info_counts_fast_path_hits():
    jf, x = tf.jit(lambda a, b: a * b), torch.randn(3)
    for _ in range(5):
        jf(x, x)
    info = tf.cache_info(jf)
    assert (info["hits"], info["misses"], info["entries"]) == (4, 1, 1)


def test_cache_info_explains_each_recompile():
    jf = tf.jit(lambda x: x.sum())
    jf(torch.ones(2))
    jf(torch.ones(3))
    jf(torch.ones(3, dtype=torch.float64))
    with torch.no_grad():
        jf(torch.ones(2))
    assert tf.cache_info(jf)["recompiles"] == [
        "tensor argument 0 changed: shape (2,) -> (3,): compiled with symbolic sizes s0 = argument 'x'.shape[0]",
        "tensor argument 0 changed: dtype torch.float32 -> torch.float64",
        "torch's grad mode changed (is_grad_enabled() was True, now False)",
    ]


def test_cache_size_limit_warns_once_and_runs_eagerly():
    # (dynamic=False: each float a compile of its own; by default the second value is traced as a value)
    jf = tf.jit(lambda x, n: x * n, cache_size_limit=2, dynamic=False)
    x = torch.ones(2)
    jf(x, 1.0)
    jf(x, 2.0)
    with pytest.warns(UserWarning, match=r"cache_size_limit \(2\).*argument 1 changed from 2.0 to 3.0"):
        assert jf(x, 3.0).tolist() == [3.0, 3.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        assert jf(x, 4.0).tolist() == [4.0, 4.0]
    assert tf.cache_info(jf)["entries"] == 2
    assert jf(x, 1.0).tolist() == [1.0, 1.0]  # cached entries still run compiled


def test_transforms_past_the_cache_size_limit_drop_their_oldest_entry():
    # tf.grad has no eager form to fall back to: it keeps working, with at most the limit cached
    # (each exponent is a Python number, baked in: a signature of its own; a new shape would not be, see
    # tests/test_dynamic_shapes.py)
    g = tf.grad(lambda x, k: (x ** k).sum())
    for k in range(1, 9):
        torch.testing.assert_close(g(torch.ones(3), k), torch.full((3,), float(k)))
    # past the limit it says so once, in jit's words, and what it does instead
    with pytest.warns(UserWarning, match=r"reached cache_size_limit \(8\) and now compiles each call that matches "
                                         r"none of its compiled entries in place of its oldest entry"):
        torch.testing.assert_close(g(torch.ones(3), 9), torch.full((3,), 9.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        for k in range(10, 12):
            torch.testing.assert_close(g(torch.ones(3), k), torch.full((3,), float(k)))
    assert tf.cache_info(g)["entries"] == 8
    torch.testing.assert_close(g(torch.ones(3), 11), torch.full((3,), 11.0))
    assert tf.cache_info(g)["misses"] == 11


def test_cache_size_limit_is_validated():
    with pytest.raises(ValueError, match="cache_size_limit must be a positive int"):
        tf.jit(lambda x: x, cache_size_limit=0)


# -- a dropped function frees what its cache entries held ------------------------------------------
def test_dropped_jitted_function_frees_its_generated_source():
    def make():
        jf = tf.jit(lambda x: x * 3)
        jf(torch.ones(2))
        return [k for k in linecache.cache if str(k).startswith("<thunderfn generated")]

    before = {k for k in linecache.cache if str(k).startswith("<thunderfn generated")}
    made = set(make()) - before
    gc.collect()
    assert made and not (made & set(linecache.cache))


def test_custom_vjp_made_in_a_loop_does_not_keep_its_tensors_alive():
    def make(captured):
        @tf.custom_vjp
        def f(x):
            return x * captured

        f.defvjp(lambda x: (x * captured, x), lambda res, g: (g * captured,))
        return f

    def differentiate_once(captured):
        f = make(captured)
        tf.grad(lambda x: f(x).sum())(torch.ones(1000))

    refs = []
    for _ in range(3):
        captured = torch.ones(1000)
        refs.append(weakref.ref(captured))
        differentiate_once(captured)
        del captured
    gc.collect()
    assert all(r() is None for r in refs)


def test_a_guard_set_checked_in_bulk_fails_on_any_one_slot_changed():
    """GuardSet.compile checks the common kinds of guard in bulk (core/guards.py): each kind, each slot, must
    still fail alone, and a value of another type (True for 1, a tensor for 3) fails rather than compares equal
    or raises."""
    from thunderfn.core.guards import GuardSet

    def cell_of(value):
        return (lambda: value).__closure__[0]

    marker, table, hooks = object(), {}, {1: "hook"}
    state = {"obj": marker, "flag": True, "none": None, "dtype": torch.float32, "n": 1, "name": "gelu",
             "scale": 0.5, "nan": float("nan"), "shape": (4, 4)}
    cell = cell_of(3)
    guards = GuardSet()
    for key, value in state.items():
        guards.add(state, key, value, "id" if key == "obj" else "value", key)
    guards.add(state, "absent", None, "absent", "absent")
    guards.add(cell, None, 3, "value", "cell")
    guards.add(table, "", (), "keys", "empty table")
    guards.add(hooks, "", (1,), "keys", "hooks")
    holds = guards.compile()
    assert holds() and guards.failure() is None

    changes = {"obj": object(), "flag": 1, "none": 0, "dtype": torch.float64, "n": True, "name": "relu",
               "scale": 0.25, "nan": 1.0, "shape": (4, 5)}
    for key, changed in [*changes.items(), ("n", torch.tensor(1)), ("n", 1.0)]:
        before = state[key]
        state[key] = changed
        assert not holds(), key
        assert key in guards.failure()
        state[key] = before
        assert holds()
    for undo, change in [(lambda: state.pop("absent"), lambda: state.update(absent=0)),
                         (lambda: table.clear(), lambda: table.update(x=1)),
                         (lambda: hooks.pop(2), lambda: hooks.update({2: "hook"})),
                         (lambda: state.update(n=1), lambda: state.pop("n"))]:
        change()
        assert not holds() and guards.failure() is not None
        undo()
        assert holds()
