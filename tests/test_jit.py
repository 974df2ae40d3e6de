"""jit (jit.py, module.py): the cache and its signature, static arguments, non-tensor arguments (numpy
scalars among them), outputs, modules, nesting, and generated code that user-chosen names cannot break."""
import ast
import collections

import numpy as np
import pytest
import torch

import thunderfn as tf
from thunderfn.fast_path import MISS

Pair = collections.namedtuple("Pair", "a b")


class Counted:
    """A jitted function plus how many times its Python body ran (once per trace)."""

    def __init__(self, fn, **jit_options):
        self.traces = 0

        def body(*args, **kwargs):
            self.traces += 1
            return fn(*args, **kwargs)

        body.__name__ = getattr(fn, "__name__", "body")
        self.jitted = tf.jit(body, **jit_options)

    def __call__(self, *args, **kwargs):
        return self.jitted(*args, **kwargs)


@pytest.fixture
def x():
    return torch.randn(2, 3)


def _source(jf) -> str:
    return str(tf.last_traces(jf)[-1])


# -- the cache ------------------------------------------------------------------------------
def test_same_signature_does_not_retrace(x):
    f = Counted(lambda a, b: a * b)
    for _ in range(3):
        f(x, x)
    f(torch.randn(2, 3), torch.randn(2, 3))
    assert f.traces == 1
    assert tf.cache_info(f.jitted)["entries"] == 1


def test_same_signature_with_non_tensor_arguments_does_not_retrace(x):
    f = Counted(lambda a, n, pair: a * n + pair[0])
    for _ in range(3):
        f(x, 2, (x, "s"))
    assert f.traces == 1
    info = tf.cache_info(f.jitted)
    assert (info["entries"], info["hits"], info["misses"], info["recompiles"]) == (1, 2, 1, [])


def _meta_ok():
    try:
        torch.ones(2, device="meta") * 2
        return True
    except Exception:
        return False


SIGNATURE_CHANGES = {
    "shape": lambda t: t.reshape(3, 2),
    "dtype": lambda t: t.double(),
    "requires_grad": lambda t: t.detach().requires_grad_(True),
    "device": pytest.param(lambda t: t.to("meta"), marks=pytest.mark.skipif(not _meta_ok(), reason="no meta device")),
}


@pytest.mark.parametrize("change", SIGNATURE_CHANGES.values(), ids=SIGNATURE_CHANGES.keys())
def test_changing_a_tensor_property_retraces(change, x):
    f = Counted(lambda a: a * 2)
    f(x)
    out = f(change(x))
    assert f.traces == 2
    assert out.shape == change(x).shape and out.dtype == change(x).dtype and out.device == change(x).device
    f(x)
    f(change(x))
    assert f.traces == 2, "both signatures stay cached"


def test_alternating_signatures_each_run_their_own_entry_and_count_as_hits():
    # the fast path keeps one entry per arity hot; the others are found by key
    jitted = tf.jit(lambda a, b: a * b + 1)  # two named parameters: the fast path's per-arity branch
    calls = [(torch.randn(3), torch.randn(3)), (torch.randn(2, 2), torch.randn(2, 2)),
             (torch.randn(3).double(), torch.randn(3).double()), (torch.randn(3).requires_grad_(), torch.randn(3))]
    for _ in range(3):
        for a, b in calls:
            out = jitted(a, b)
            torch.testing.assert_close(out, a * b + 1)
            assert out.dtype == a.dtype and out.requires_grad == a.requires_grad
            with torch.no_grad():
                assert not jitted(a, b).requires_grad
    info = tf.cache_info(jitted)
    assert (info["entries"], info["misses"], info["hits"]) == (8, 8, 16)


def test_calls_with_tensors_by_keyword_take_the_fast_path_and_still_find_their_entry():
    """A Hugging Face model is called model(input_ids=..., labels=...): such a call is checked by one
    generated function (the tensors found by position and by name), not keyed through the slow path."""
    def f(a, b=None, *, scale=None):
        return a * b + (0 if scale is None else scale)

    jitted = tf.jit(f)
    state = jitted._thunderfn_state
    a, b, s = torch.randn(3), torch.randn(3), torch.randn(3)
    torch.testing.assert_close(jitted(a, b=b), a * b)
    assert list(state.keyword_cache) == [(1, "b")]
    hit = state.keyword_cache[(1, "b")]
    for _ in range(2):
        torch.testing.assert_close(jitted(a, b=b), a * b)
    torch.testing.assert_close(hit((a,), {"b": s}), a * s)  # the same entry, through the hit function itself
    torch.testing.assert_close(jitted(b=b, a=a), a * b)  # a by name too: another structure, another entry
    torch.testing.assert_close(jitted(a=a, b=b), a * b)  # keyword order: the same entry, a hit
    torch.testing.assert_close(jitted(a, b=b, scale=s), a * b + s)  # another set of names: another entry
    torch.testing.assert_close(jitted(a, b=b.double()), a * b.double())  # another dtype: a miss, retraced
    torch.testing.assert_close(jitted(a.reshape(3, 1), b=b), a.reshape(3, 1) * b)
    info = tf.cache_info(jitted)
    assert (info["entries"], info["misses"], info["hits"]) == (5, 5, 4), info
    assert hit((a, b), {"b": b}) is MISS and hit((), {"a": a, "b": b}) is MISS and hit((a,), {"c": b}) is MISS
    assert hit((a,), {"b": 1.0}) is MISS  # not a tensor


def test_returning_to_a_requires_grad_input_gives_a_differentiable_result(x):
    f = Counted(lambda a: (a * 2).sum())
    f(x)
    xr = x.clone().requires_grad_()
    f(xr).backward()
    torch.testing.assert_close(xr.grad, torch.full_like(x, 2.0))


@pytest.mark.parametrize("first, second", [((1, 2), [1, 2]), ({"a": 1}, {"b": 1}), ((1,), (1, None)),
                                           ({"a": 1, "b": 2}, {"a": 1})], ids=["tuple-list", "dict-keys",
                                                                               "tuple-len", "dict-size"])
def test_changing_pytree_structure_retraces(first, second, x):
    f = Counted(lambda a, tree: a)
    f(x, first)
    f(x, second)
    assert f.traces == 2


def test_changing_tensor_container_type_retraces_and_returns_matching_structure(x):
    f = Counted(lambda t: type(t)(v * 2 for v in t))
    assert type(f((x, x))) is tuple
    assert type(f([x, x])) is list
    assert f.traces == 2


@pytest.mark.parametrize("values", [(1, 1.0, True), (0.0, -0.0), (2, 3), ("a", "b")],
                         ids=["int-float-bool", "zero-signs", "ints", "strings"])
def test_non_tensor_arguments_are_keyed_by_value_and_type(values, x):
    # (dynamic=False: a float's second value is not traced as a value, so each trace sees the float itself)
    f = Counted(lambda a, v: (a * 0 + (1.0 if isinstance(v, str) else v), type(v).__name__), dynamic=False)
    for v in values:
        out, tname = f(x, v)
        assert tname == type(v).__name__
        if not isinstance(v, str):
            torch.testing.assert_close(out, x * 0 + v)
    assert f.traces == len(values)


def test_negative_zero_is_not_served_the_positive_zero_compilation():
    f = tf.jit(lambda a, s: a * s)
    assert torch.signbit(f(torch.ones(1), 0.0)).item() is False
    assert torch.signbit(f(torch.ones(1), -0.0)).item() is True


def test_nan_argument_does_not_retrace_every_call(x):
    f = Counted(lambda a, s: a + s)
    f(x, float("nan"))
    f(x, float("nan"))
    assert f.traces == 1


def test_grad_mode_is_part_of_the_signature(x):
    f = Counted(lambda a: a * 2)
    f(x)
    with torch.no_grad():
        f(x)
    assert f.traces == 2
    f(x)
    assert f.traces == 2


def test_default_dtype_is_part_of_the_signature(x):
    f = Counted(lambda a: a + torch.ones(3))
    assert f(x).dtype is torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert f(x).dtype is torch.float64
    finally:
        torch.set_default_dtype(old)
    assert f.traces == 2


def test_kwargs_are_part_of_the_signature(x):
    f = Counted(lambda a, *, scale=1, b=None: a * scale if b is None else a * scale + b)
    torch.testing.assert_close(f(x, scale=2), x * 2)
    torch.testing.assert_close(f(x, scale=2), x * 2)
    assert f.traces == 1
    torch.testing.assert_close(f(x, scale=3), x * 3)
    torch.testing.assert_close(f(x, scale=3, b=x), x * 4)
    torch.testing.assert_close(f(a=x, scale=3, b=x), x * 4)
    assert f.traces == 4


def test_positional_then_keyword_tensor_gives_the_same_result(x):
    f = tf.jit(lambda a, b: a - b)
    y = torch.randn(2, 3)
    torch.testing.assert_close(f(x, y), x - y)
    torch.testing.assert_close(f(x, b=y), x - y)
    torch.testing.assert_close(f(b=y, a=x), x - y)


# -- static arguments ---------------------------------------------------------------------
def test_static_argnums_are_keyed_by_value(x):
    f = Counted(lambda a, n: a * n, static_argnums=1)
    torch.testing.assert_close(f(x, 2), x * 2)
    torch.testing.assert_close(f(x, 2), x * 2)
    torch.testing.assert_close(f(x, 3), x * 3)
    assert f.traces == 2


def test_static_argnames_are_keyed_by_value(x):
    f = Counted(lambda a, *, mode="sum": a.sum() if mode == "sum" else a.amax(), static_argnames="mode")
    torch.testing.assert_close(f(x, mode="sum"), x.sum())
    torch.testing.assert_close(f(x, mode="max"), x.amax())
    f(x, mode="max")
    assert f.traces == 2


def test_static_argument_allows_python_control_flow_on_its_value(x):
    f = tf.jit(lambda a, flag: a.sin() if flag else a.cos(), static_argnums=(1,))
    torch.testing.assert_close(f(x, True), x.sin())
    torch.testing.assert_close(f(x, False), x.cos())


@pytest.mark.parametrize("options, call", [
    (dict(static_argnums=1), lambda f, x: f(x, x)),
    (dict(static_argnums=(1,)), lambda f, x: f(x, [1, x])),
    (dict(static_argnames="n"), lambda f, x: f(x, n=x)),
], ids=["argnum", "argnum-nested", "argname"])
def test_tensor_passed_as_static_argument_is_a_type_error(options, call, x):
    f = tf.jit(lambda a, n=1: a, **options)
    with pytest.raises(TypeError, match="static argument"):
        call(f, x)


def test_jit_with_options_is_a_decorator_too(x):
    @tf.jit(static_argnums=1)
    def power(a, n):
        return a ** n if n > 1 else a  # Python control flow on the static argument

    torch.testing.assert_close(power(x, 3), x ** 3)
    torch.testing.assert_close(power(x, 1), x)
    assert tf.cache_info(power)["misses"] == 2

    @tf.jit
    def plain(a):
        return a + 1

    torch.testing.assert_close(plain(x), x + 1)


@pytest.mark.parametrize("decorated, call, expected", [
    (lambda f: tf.grad(argnums=1)(f), lambda g, a, b: g(a, b), lambda a, b: a),
    (lambda f: tf.value_and_grad(argnums=(0, 1))(f), lambda g, a, b: g(a, b)[1][1], lambda a, b: a),
    (lambda f: tf.jacrev(argnums=1)(f), lambda g, a, b: g(a, b), lambda a, b: a),
    (lambda f: tf.jacfwd(argnums=1)(f), lambda g, a, b: g(a, b), lambda a, b: a),
    (lambda f: tf.vmap(in_axes=(0, None))(f), lambda g, a, b: g(a[None], b)[0], lambda a, b: (a * b).sum()),
], ids=["grad", "value_and_grad", "jacrev", "jacfwd", "vmap"])
def test_transforms_with_options_are_decorators_too(decorated, call, expected):
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(call(decorated(lambda a, b: (a * b).sum()), a, b), expected(a, b))


# -- non-tensor arguments --------------------------------------------------------------------
class Unhashable:
    __hash__ = None


@pytest.mark.parametrize("value", [Unhashable(), {1, 2}, bytearray(b"ab")], ids=["object", "set", "bytearray"])
def test_unhashable_non_tensor_argument_is_a_clear_type_error(value, x):
    f = tf.jit(lambda a, v: a)
    with pytest.raises(TypeError, match="not hashable") as info:
        f(x, value)
    assert "<lambda>" in str(info.value) and type(value).__name__ in str(info.value)


def test_lists_and_dicts_of_numbers_are_pytrees_not_unhashable_leaves(x):
    f = tf.jit(lambda a, sizes, opts: a.reshape(sizes) * opts["k"])
    torch.testing.assert_close(f(x, [3, 2], {"k": 2.0}), x.reshape(3, 2) * 2.0)


NUMPY_SCALARS = [np.float32(2.5), np.float64(-0.0), np.float16(0.5), np.int64(3), np.uint8(2), np.bool_(True)]


@pytest.mark.parametrize("scalar", NUMPY_SCALARS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("dtype", [torch.float16, torch.int32, torch.bool], ids=str)
def test_numpy_scalar_arguments_compute_what_eager_computes(scalar, dtype):
    """torch reads numpy scalars as Python numbers (np.bool_ as a float: int32 * np.bool_ is float32)."""
    def f(a, s):
        return a * s, s + a, torch.full((3,), s), torch.where(a > 0, a, s), a.reshape(np.int64(1), np.int64(-1))

    a = torch.tensor([0, 1, 2]).to(dtype)
    expected, got = f(a, scalar), tf.jit(f)(a, scalar)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e, equal_nan=True)


def test_numpy_scalars_key_the_cache_on_type_and_value():
    jf = tf.jit(lambda a, s: a / s)
    a = torch.ones(2)
    assert torch.equal(jf(a, np.float64(0.0)), torch.full((2,), float("inf")))
    assert torch.equal(jf(a, np.float64(-0.0)), torch.full((2,), -float("inf")))  # -0.0 == 0.0, not the same entry
    assert jf(a, np.float32(4.0)).dtype == torch.float32
    assert torch.equal(jf(a, np.float32(4.0)), torch.full((2,), 0.25))
    assert tf.cache_info(jf)["entries"] == 3


# -- outputs --------------------------------------------------------------------------------
OUTPUTS = {
    "tensor": lambda a, w: a * 2,
    "tuple": lambda a, w: (a * 2, a + 1),
    "list": lambda a, w: [a * 2, a + 1],
    "dict": lambda a, w: {"y": a * 2, "z": a + 1},
    "nested": lambda a, w: {"y": [a * 2, (a + 1, {"deep": a.exp()})], "n": None},
    "namedtuple": lambda a, w: Pair(a * 2, a + 1),
    "none": lambda a, w: None,
    "numbers": lambda a, w: (3, 2.5, True, a.shape[0], "s"),
    "shape": lambda a, w: a.shape,
    "input": lambda a, w: a,
    "input-in-tuple": lambda a, w: (a, a * 2, a),
    "captured": lambda a, w: w,
    "captured-and-computed": lambda a, w: (w, a @ w),
    "dtype-device": lambda a, w: (a.dtype, a.device),
}


@pytest.mark.parametrize("fn", OUTPUTS.values(), ids=OUTPUTS.keys())
def test_output_structure_and_values_match_eager(fn, x):
    w = torch.randn(3, 4)
    f = tf.jit(lambda a: fn(a, w))
    for _ in range(2):  # the traced call and the cached call
        got, want = f(x), fn(x, w)
        got_leaves, got_spec = _flatten(got)
        want_leaves, want_spec = _flatten(want)
        assert got_spec == want_spec
        for g, e in zip(got_leaves, want_leaves):
            assert type(g) is type(e)
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(g, e)
            else:
                assert g == e


def _flatten(tree):
    import optree

    return optree.tree_flatten(tree, none_is_leaf=True)


def test_returning_an_input_returns_the_same_tensor_object(x):
    f = tf.jit(lambda a, b: (a, b * 2))
    for _ in range(2):
        assert f(x, x)[0] is x


def test_returning_a_captured_tensor_returns_it_by_reference(x):
    w = torch.randn(3)
    f = tf.jit(lambda a: w)
    assert f(x) is w
    assert f(x) is w


def test_output_dict_keeps_insertion_order(x):
    f = tf.jit(lambda a: {"b": a, "a": a + 1, "c": None})
    assert list(f(x)) == ["b", "a", "c"]
    assert list(f(x)) == ["b", "a", "c"]


# -- nn.Module --------------------------------------------------------------------------------
@pytest.fixture
def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def test_jit_of_module_returns_a_module_with_the_originals_parameters(model):
    jm = tf.jit(model)
    assert isinstance(jm, torch.nn.Module)
    assert [n for n, _ in jm.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert all(p is q for p, q in zip(jm.parameters(), model.parameters()))
    assert list(jm.state_dict()) == list(model.state_dict()) == ["0.weight", "0.bias", "3.weight", "3.bias"]


def test_jit_of_module_in_eval_mode_matches_eager(model, x):
    jm = tf.jit(model).eval()
    assert not model.training
    torch.testing.assert_close(jm(x), model(x))


def test_train_and_eval_retrace_the_module(model, x):
    model[1].p = 0.0  # dropout with p=0 traces in training mode
    jm = tf.jit(model)
    jm(x)
    jm.eval()
    jm(x)
    assert tf.cache_info(jm)["entries"] == 2
    jm.train()
    jm(x)
    assert tf.cache_info(jm)["entries"] == 2
    assert model.training and jm.training


def test_optimizer_step_on_jitted_module_is_seen_without_retracing(model, x):
    model.eval()
    jm = tf.jit(model)
    opt = torch.optim.SGD(jm.parameters(), lr=0.5)
    before = jm(x)
    before.sum().backward()
    opt.step()
    after = jm(x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, model(x))
    assert tf.cache_info(jm)["entries"] == 1


def test_jitted_module_gradients_match_eager(model, x):
    model.eval()
    jm = tf.jit(model)
    jm(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad)


@pytest.mark.parametrize("convert", [lambda m: m.double(), lambda m: m.to(torch.float64)], ids=["double", "to"])
def test_dtype_conversion_of_jitted_module_converts_the_originals_own_parameters(convert):
    linear = torch.nn.Linear(3, 4)  # parameters directly on the module, no children
    jm = tf.jit(linear)
    jm(torch.randn(2, 3))
    assert convert(jm) is jm
    assert linear.weight.dtype is torch.float64
    x64 = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(jm(x64), linear(x64))


def test_jitted_module_repr_shows_the_original():
    assert "Linear(in_features=3" in repr(tf.jit(torch.nn.Linear(3, 4)))


def test_last_traces_of_a_jitted_module(model, x):
    jm = tf.jit(model.eval())
    jm(x)
    source = _source(jm)
    compile(source, "<trace>", "exec")
    # parameters and buffers are inputs of the computation, named after the parameters
    signature = next(line for line in source.splitlines() if line.startswith("def computation("))
    assert "p_0_weight" in signature and "p_0_bias" in signature  # model[0].weight, model[0].bias


# -- nesting ---------------------------------------------------------------------------------
@pytest.mark.parametrize("warm_inner", [False, True], ids=["cold-inner", "warm-inner"])
def test_jit_inside_jit_traces_the_inner_function_into_the_outer_one(warm_inner, x):
    inner = tf.jit(lambda a: a * 2)
    if warm_inner:
        inner(x)  # the inner fast cache now holds an entry for this signature
    outer = tf.jit(lambda a: inner(a).sin() + 1)
    torch.testing.assert_close(outer(x), (x * 2).sin() + 1)
    torch.testing.assert_close(outer(x), (x * 2).sin() + 1)
    names = [b.sym.name for b in tf.last_traces(outer)[0].bound_symbols]
    assert names == ["mul", "sin", "add"]


def test_trace_of_a_jitted_function_is_its_computation(x):
    jf = tf.jit(lambda a: a.exp())
    assert [b.sym.name for b in tf.trace(jf, x).bound_symbols] == ["exp"]


# -- generated code cannot be broken by user names ------------------------------------------
def _generated_names_are_safe(jf):
    source = _source(jf)
    tree = ast.parse(source)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(n.col_offset == 0 and n.lineno <= 6 for n in imports), "imports only in the header"
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    return source, fn


def test_kwarg_key_that_looks_like_code_is_not_injected(x):
    jf = tf.jit(lambda **kw: kw["x; import os"] + kw["y"])
    torch.testing.assert_close(jf(**{"x; import os": x, "y": x}), x + x)
    source, fn = _generated_names_are_safe(jf)
    code = [ln for ln in source.splitlines() if not ln.lstrip().startswith("#")]
    assert not any("import os" in ln for ln in code)
    assert all(a.arg.isidentifier() for a in fn.args.args)


def test_dict_keys_that_look_like_code_are_data(x):
    evil = "'); import os; print('pwned"
    jf = tf.jit(lambda d: {evil: d[evil] * 2})
    out = jf({evil: x})
    torch.testing.assert_close(out[evil], x * 2)
    source, _ = _generated_names_are_safe(jf)
    assert "import os" not in "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith("#")
                                        and evil not in ln.replace("\\'", "'"))


def test_string_argument_that_looks_like_code_is_a_literal(x):
    jf = tf.jit(lambda a, s: (a * len(s), s))
    out, s = jf(x, "'); import os #\n")
    assert s == "'); import os #\n"
    _generated_names_are_safe(jf)


@pytest.mark.parametrize("name", ["torch", "prims", "ltorch", "computation", "tree_unflatten", "_out_spec0",
                                  "print", "len", "__builtins__", "t0"])
def test_parameter_named_like_a_generated_code_global_still_works(name, x):
    ns = {}
    exec(f"def fn({name}, other):\n    return Pair({name} * 2, other + 1)", {"Pair": Pair}, ns)
    jf = tf.jit(ns["fn"])
    for _ in range(2):
        out = jf(x, x)
        assert type(out) is Pair
        torch.testing.assert_close(out.a, x * 2)
        torch.testing.assert_close(out.b, x + 1)
    source, fn = _generated_names_are_safe(jf)
    assert "torch" not in [a.arg for a in fn.args.args]


KEYWORD_TRANSFORMS = {
    "jit": lambda g: tf.jit(g), "grad": lambda g: tf.grad(g), "value_and_grad": lambda g: tf.value_and_grad(g),
    "jacrev": lambda g: tf.jacrev(g), "jacfwd": lambda g: tf.jacfwd(g), "hessian": lambda g: tf.hessian(g),
    "jit_of_grad": lambda g: tf.jit(tf.grad(g)), "grad_of_jit": lambda g: tf.grad(tf.jit(g)),
    "vmap": lambda g: lambda x, *a, **kw: tf.vmap(g)(x[None], *(t[None] for t in a), **kw)[0],
}


# names thunderfn's own functions use for their parameters (trace(fn, ...), Symbol.__call__(self, ...),
# the transforms' options): a user keyword argument of the same name reaches the user's function
@pytest.mark.parametrize("name", ["fn", "self", "args", "kwargs", "name", "trc", "argnums", "has_aux", "primals",
                                  "executors", "in_axes", "static_argnums"])
@pytest.mark.parametrize("transform", KEYWORD_TRANSFORMS.values(), ids=KEYWORD_TRANSFORMS.keys())
def test_a_keyword_argument_named_like_an_internal_parameter_reaches_the_function(name, transform, x):
    ns = {}
    exec(f"def g(x, {name}):\n    return (x * {name}).sum()", ns)
    other = torch.randn(3)
    torch.testing.assert_close(transform(ns["g"])(x, **{name: other}), transform(ns["g"])(x, other))


@pytest.mark.parametrize("name", ["fn", "self", "args"])
def test_a_keyword_argument_named_like_an_internal_parameter_reaches_trace_examine_and_modules(name, x):
    ns = {}
    exec(f"def g(x, {name}):\n    return x * {name}", ns)
    assert [b.sym.name for b in tf.trace(ns["g"], x, **{name: x}).bound_symbols] == ["mul"]
    assert tf.examine(ns["g"], x, **{name: x}).jit_ready

    class Scale(torch.nn.Module):
        def forward(self, x, **kw):
            return x * kw[name]

    if name != "self":  # torch's own Module.__call__(self, ...) takes no keyword 'self', in eager too
        torch.testing.assert_close(tf.jit(Scale())(x, **{name: x}), x * x)


def test_tensor_made_at_trace_time_is_a_fresh_tensor_on_every_call(x):
    f = tf.jit(lambda a: (a + 1, torch.tensor([1.0, 2.0])))
    first = f(x)[1]
    first.add_(10)  # the caller owns what it gets back, as in eager
    torch.testing.assert_close(f(x)[1], torch.tensor([1.0, 2.0]))
    assert f(x)[1] is not f(x)[1]


class _OddlyNamedState(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("σ²", torch.full((3,), 2.0))
        self.register_buffer("lambda", torch.full((3,), 0.5))
        self.register_buffer("1x", torch.full((3,), 3.0))
        self.register_parameter("β_1", torch.nn.Parameter(torch.ones(3)))
        self.register_buffer("torch", torch.full((3,), -1.0))

    def forward(self, x):
        return (self.lin(x) * getattr(self, "σ²") + getattr(self, "lambda") * getattr(self, "1x")
                + getattr(self, "β_1") + getattr(self, "torch"))


def test_parameters_and_buffers_with_any_name_torch_accepts_work_under_jit():
    model, x = _OddlyNamedState(), torch.randn(2, 3)
    jm = tf.jit(model)
    out = jm(x)
    torch.testing.assert_close(out, model(x))
    out.sum().backward()
    assert model.get_parameter("β_1").grad is not None
    source = str(tf.last_traces(jm)[-1])
    assert "def computation(beta_1, lin_weight, lin_bias, sigma_2, lambda_, p_1x, torch_, x):" in source
    # pytree keys too: a dict of tensors keyed by such names
    g = tf.jit(lambda p, x: p["σ²"] * x + p["lambda"])
    torch.testing.assert_close(g({"σ²": x, "lambda": x}, x), x * x + x)


def test_strings_that_reach_generated_code_stay_names_or_comments():
    trc = tf.trace(lambda x: x + 1, torch.ones(2))
    trc.provenance = "Constructed by a pass\nimport os; os.exit(3)"  # e.g. an executor's name in a pass title
    source = str(trc)
    assert all(line.startswith(("#", "import", "def", " ", "from")) or not line for line in source.splitlines())
    torch.testing.assert_close(trc.python_callable()(torch.ones(2)), torch.full((2,), 2.0))


# -- torch state changed by the traced code ---------------------------------------------------
def test_no_grad_block_inside_jit_gives_eager_gradients():
    """`with torch.no_grad()` in the traced function is recorded, so gradients stop where eager's do."""
    def f(x, w):
        h = x * w
        with torch.no_grad():
            scale = h.sum()
        return h * scale

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    jf = tf.jit(f)
    (grad_jit,) = torch.autograd.grad(jf(x, w).sum(), w)
    (grad_eager,) = torch.autograd.grad(f(x, w).sum(), w)
    torch.testing.assert_close(grad_jit, grad_eager)
    assert torch.is_grad_enabled()  # the compiled function restores the caller's mode
    assert "torch._C._set_grad_enabled(False)" in str(tf.last_traces(jf)[0])  # recorded where the block was


def test_an_error_raised_by_the_function_on_a_cache_hit_is_raised_once_not_retried():
    """The cache-hit path checks the call, then runs the entry: an AttributeError from the user's own
    code is raised as is, not taken for a mismatched call that reruns the function on the slow path."""
    calls, fail = [], [False]

    def impl(x):
        calls.append(1)
        if fail[0]:
            raise AttributeError("raised by the operator")
        return -x

    ex = tf.executors.OperatorExecutor("raises_attribute_error")
    ex.register_operator("neg_or_raise", like=torch.neg, fn=impl)
    op = ex.operators["neg_or_raise"]
    jf = tf.jit(lambda x: op(x), executors=[ex])
    x = torch.randn(3)
    jf(x)
    jf(x)  # now cached: the fast path
    fail[0] = True
    calls.clear()
    with pytest.raises(AttributeError, match="raised by the operator"):
        jf(x)
    assert len(calls) == 1


def test_a_call_of_many_tensors_switching_between_signatures_hits_each_entry():
    """Past fast_path._UNPACKED_ARITY arguments (a jitted module's parameters) the dispatcher keeps them as one
    tuple: hot entry, cache lookup and slow path must behave as for few arguments."""
    def total(*xs):
        return sum(x.sum() for x in xs)

    jitted = tf.jit(total)
    small = [torch.randn(2) for _ in range(40)]
    large = [torch.randn(3) for _ in range(40)]
    for args in (small, small, large, small, large):
        torch.testing.assert_close(jitted(*args), total(*args))
    info = tf.cache_info(jitted)
    assert info["entries"] == 2 and info["misses"] == 2 and info["hits"] == 3
