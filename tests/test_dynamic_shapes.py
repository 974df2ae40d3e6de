"""Dynamic shapes: one trace for every size of a dimension, guarded by what the trace relied on."""
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import thunderfn as tf
from thunderfn.core import symbolic
from thunderfn.testing import strategies as tst


def _block(x, w, b):
    """Reshapes of computed sizes, broadcasting against a bias, a reduction, softmax, slicing: a small
    attention-like block over a sequence of any length."""
    n, t, d = x.shape
    h = torch.tanh(x @ w + b)  # (n, t, d)
    heads = h.reshape(n, t, 2, d // 2).transpose(1, 2)  # (n, 2, t, d/2)
    scores = (heads @ heads.transpose(-1, -2)) / (d // 2) ** 0.5  # (n, 2, t, t)
    mixed = scores.softmax(-1) @ heads
    out = mixed.transpose(1, 2).reshape(n, t, d) + x
    return out[:, -1].sum() + out.mean() + x[:, : t - 1].sum() * 0.1


def _check_grads(jitted, fn, *args):
    out, ref = jitted(*args), fn(*args)
    torch.testing.assert_close(out, ref)
    inputs = [a for a in args if a.requires_grad]
    got = torch.autograd.grad(out, inputs)
    want = torch.autograd.grad(ref, inputs)
    torch.testing.assert_close(got, want)


def test_fifty_lengths_compile_at_most_twice_and_match_eager_forward_and_backward():
    w = torch.randn(8, 8, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    jitted = tf.jit(_block)
    lengths = random.Random(0).sample(range(1, 513), 50)
    for t in lengths:
        _check_grads(jitted, _block, torch.randn(2, t, 8, requires_grad=True), w, b)
    info = tf.cache_info(jitted)
    assert info["misses"] <= 2, info["recompiles"]
    assert info["symbolic"] and "argument 'x'.shape[1]" in info["symbolic"][-1].values()


def test_a_module_over_lengths_one_to_many_compiles_at_most_twice():
    layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    jitted = tf.jit(layer)
    for t in [5, 1, 9, 17, 2, 33]:
        x = torch.randn(3, t, 8)
        torch.testing.assert_close(jitted(x), layer(x))
    assert tf.cache_info(jitted)["misses"] <= 2, tf.cache_info(jitted)["recompiles"]


def test_trace_names_symbols_and_binds_them_from_the_inputs():
    def f(x):
        return x.sum(1) / (x.shape[0] * x.shape[1])

    jitted = tf.jit(f, dynamic=True)
    x = torch.randn(4, 6)
    torch.testing.assert_close(jitted(x), f(x))
    source = str(tf.last_traces(jitted)[-1])
    assert "s0 = x.shape[0]" in source and "s1 = x.shape[1]" in source
    assert '"cpu f32[s0, s1]"' in source or "f32[s0, s1]" in source
    assert tf.cache_info(jitted)["symbolic"] == [{"s0": "argument 'x'.shape[0]", "s1": "argument 'x'.shape[1]"}]
    for shape in [(3, 5), (7, 2), (1, 9)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(jitted(x), f(x))
    assert tf.cache_info(jitted)["misses"] == 1


def test_backward_computes_with_a_size_no_saved_tensor_holds():
    """x.sum()'s backward expands to x's shape: the backward is given the forward's size."""
    def f(x):
        return (x.sum() * 2).exp()

    jitted = tf.jit(f, dynamic=True)
    for n in [3, 8]:
        x = torch.randn(n, 4, requires_grad=True) * 0.1
        _check_grads(jitted, f, x)
    assert tf.cache_info(jitted)["misses"] == 1
    assert "s0" in str(tf.last_backward_traces(jitted)[-1])


def test_a_branch_on_a_size_is_guarded_and_recompiles_when_it_flips():
    def f(x):
        if x.shape[0] > 8:
            return x * 2
        return x * 3

    jitted = tf.jit(f, dynamic=True)
    for n in [4, 12, 6, 20]:
        x = torch.randn(n)
        torch.testing.assert_close(jitted(x), f(x))
    info = tf.cache_info(jitted)
    assert info["misses"] == 2
    assert any("s0 > 8" in fact or "8 < s0" in fact or "s0 <= 8" in fact for facts in info["size_guards"]
               for fact in facts), info["size_guards"]


def test_a_relation_between_inputs_is_guarded():
    """x + y with equal symbolic lengths relies on them being equal; lengths that differ (broadcasting a 1,
    or an error) are never run by that trace."""
    def f(x, y):
        return x + y

    jitted = tf.jit(f, dynamic=True)
    torch.testing.assert_close(jitted(torch.ones(5), torch.ones(5)), torch.full((5,), 2.0))
    torch.testing.assert_close(jitted(torch.ones(7), torch.ones(7)), torch.full((7,), 2.0))
    assert tf.cache_info(jitted)["misses"] == 1
    torch.testing.assert_close(jitted(torch.ones(4), torch.ones(1) * 3), torch.full((4,), 4.0))
    with pytest.raises(RuntimeError, match="must match the size"):
        jitted(torch.ones(4), torch.ones(3))


def test_divisibility_a_view_relied_on_is_guarded():
    def f(x):
        return x.view(-1, 4).sum(1)

    jitted = tf.jit(f)
    for n in [8, 12, 16]:
        x = torch.randn(n)
        torch.testing.assert_close(jitted(x), f(x))
    with pytest.raises(RuntimeError, match="invalid for input of size 10"):
        jitted(torch.randn(10))


def _sizes_of_last_symbolic_entry(jitted) -> symbolic.SymbolicInputs:
    return jitted._thunderfn_state.symbolic_entries[-1].sizes.inputs


@pytest.mark.parametrize("program, calls", [
    (lambda x: x.view(-1, 4).sum(1), [(8,), (12,)]),  # divisibility
    (lambda x, y: x + y, [((5,), (5,)), ((7,), (7,))]),  # equal sizes of two inputs
    (lambda x: x[: x.shape[0] // 2] * 2 if x.shape[0] > 6 else x, [(8, 3), (10, 3)]),  # a branch, a floor division
    (lambda x: x.reshape(x.shape[0] * x.shape[1]).sum() + int(x.shape[1]), [(4, 3), (5, 6)]),  # a pinned size
    (lambda x, w: (x @ w).tanh(), [((4, 3), (3, 2)), ((5, 7), (7, 2))]),  # inner sizes that must agree
])
def test_size_guards_are_the_expression_torchs_shapeenv_produces(program, calls):
    """thunderfn prints a compile's size guards itself (core/symbolic.py's _guards_expression: torch's own
    produce_guards imports torch._dynamo); it prints what torch's would, guard for guard."""
    jitted = tf.jit(program)
    for shapes in calls:
        shapes = shapes if isinstance(shapes[0], tuple) else (shapes,)
        jitted(*(torch.randn(s) for s in shapes))
    inputs = _sizes_of_last_symbolic_entry(jitted)
    expected = inputs.env.produce_guards_expression(inputs.placeholders, ignore_static=True)
    assert symbolic._guards_expression(inputs.env, inputs.placeholders) == expected


def test_a_symbolic_compile_imports_neither_dynamo_nor_inductor_and_leaves_torchs_modules_as_they_were():
    """What ShapeEnv would import torch._dynamo for (a question of translation validation, guard sources, the
    first structured-trace record) is answered without it: seconds of a small function's first symbolic compile."""
    script = textwrap.dedent("""
        import sys, torch, thunderfn as tf
        f = tf.jit(lambda x: x.sin() + 1)
        f(torch.randn(4, 4)); f(torch.randn(5, 4)); f(torch.randn(6, 4))
        assert tf.cache_info(f)["misses"] == 2 and tf.cache_info(f)["symbolic"], tf.cache_info(f)
        print(sorted(m for m in ("torch._dynamo", "torch._inductor", "torch.fx.experimental.validator")
                     if m in sys.modules))
        import torch.fx.experimental.validator as validator  # torch's own, whole, once asked for
        print(validator.ValidationException.__name__, validator.translation_validation_enabled())
        print(torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2)).tolist())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["[]", "ValidationException False", "[2.0, 2.0]"]


def test_dynamic_false_compiles_every_size():
    jitted = tf.jit(lambda x: x * 2, dynamic=False)
    for n in [2, 3, 4]:
        jitted(torch.randn(n))
    info = tf.cache_info(jitted)
    assert info["misses"] == 3 and info["symbolic"] == []


def test_mark_dynamic_and_mark_static():
    def f(x):
        return x.sum(0)

    jitted = tf.jit(f, dynamic=False)
    x = torch.randn(5, 3)
    tf.mark_dynamic(x, 0)
    jitted(x)
    assert tf.cache_info(jitted)["symbolic"] == [{"s0": "argument 'x'.shape[0]"}]
    y = torch.randn(9, 3)
    torch.testing.assert_close(jitted(y), f(y))  # an unmarked tensor of another length fits the pattern
    assert tf.cache_info(jitted)["misses"] == 1

    everything = tf.jit(f, dynamic=True)
    z = torch.randn(5, 3)
    tf.mark_static(z, 1)
    everything(z)
    assert tf.cache_info(everything)["symbolic"] == [{"s0": "argument 'x'.shape[0]"}]
    with pytest.raises(IndexError, match="Dimension out of range"):
        tf.mark_dynamic(z, 2)
    with pytest.raises(TypeError, match="expects a tensor"):
        tf.mark_dynamic([1, 2], 0)


def test_python_numbers_stay_static():
    """A changing Python number is a value in the signature (docs/sharp_bits.md), not a symbol."""
    def f(x, scale):
        return x * scale

    jitted = tf.jit(f)
    for scale in [1, 2, 3]:
        torch.testing.assert_close(jitted(torch.ones(2), scale), torch.full((2,), float(scale)))
    assert tf.cache_info(jitted)["misses"] == 3


def test_the_recompile_reason_names_the_dimension_made_symbolic():
    jitted = tf.jit(lambda x: x + 1)
    jitted(torch.randn(2, 3))
    jitted(torch.randn(2, 5))
    (reason,) = tf.cache_info(jitted)["recompiles"]
    assert "shape (2, 3) -> (2, 5)" in reason and "s0 = argument 'x'.shape[1]" in reason


def test_dynamic_option_is_checked():
    with pytest.raises(ValueError, match="dynamic must be None"):
        tf.jit(lambda x: x, dynamic="yes")


def test_inductor_regions_take_ops_with_symbolic_arguments():
    """A reshape to a symbolic size joins the Inductor region, which takes the symbol as an int input and
    compiles once for every size (executors/inductor.py)."""
    def f(x):
        return (x.sin() * 2).reshape(x.shape[0] * 2, -1).cos()

    jitted = tf.jit(f, fusion=True, dynamic=True)
    for n in [2, 3]:
        x = torch.randn(n, 4)
        torch.testing.assert_close(jitted(x), f(x))
    assert tf.cache_info(jitted)["misses"] == 1
    calls = [b for b in tf.last_traces(jitted)[-1].bound_symbols if b.sym.name not in ("del", "python_return")]
    assert len(calls) == 1 and "inductor_fusion_0(x, s0)" in str(tf.last_traces(jitted)[-1])


@given(tst.programs(), tst.program_inputs(), st.integers(1, 3))
def test_dynamic_jit_of_program_equals_program_at_every_size(program, inputs, grow):
    """jit(f, dynamic=True)(x) == f(x), for the drawn inputs and for inputs grown along their first dimension."""
    expected = _eager_or_none(program, *inputs)
    assume(expected is not None)
    jitted = tf.jit(program, dynamic=True)
    torch.testing.assert_close(jitted(*inputs), expected, equal_nan=True)
    grown = tuple(torch.cat([x] * (grow + 1)) for x in inputs)
    expected = _eager_or_none(program, *grown)
    if expected is None:
        with pytest.raises(RuntimeError):
            jitted(*grown)
    else:
        torch.testing.assert_close(jitted(*grown), expected, equal_nan=True)


def _eager_or_none(fn, *args):
    try:
        return fn(*args)
    except RuntimeError:
        return None


# -- the op library under symbolic sizes (benchmarks/opdb_dynamic_coverage.py found each) ----------------------
def _loss_grads(fn, *args):
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    out = fn(*leaves)
    return out, torch.autograd.grad(out, [x for x in leaves if x.requires_grad])


ONE_ENTRY_AT_EVERY_SIZE = {
    # the VJP's 2 / (n - 1) is a float computed from the sizes: CSE hashed it, which guarded its value
    "std backward": (lambda x: x.std().exp(), [(2, 3, 4), (2, 7, 4), (3, 5, 2)]),
    # the mean reduction's 1 / numel was float(numel), which pinned every size
    "mse_loss backward": (lambda x, y: torch.nn.functional.mse_loss(x, y), [(2, 3), (2, 6), (5, 9)]),
    "smooth_l1_loss backward": (lambda x, y: torch.nn.functional.smooth_l1_loss(x, y), [(2, 3), (2, 6), (5, 9)]),
    # min/max of the sizes guarded which was smaller
    "diagonal with an offset": (lambda x: torch.diagonal(x * 1.5, 2).sum(), [(4, 5), (4, 8), (9, 3), (3, 9)]),
    # 1 / math.sqrt(E) pinned the head dimension
    "scaled_dot_product_attention": (
        lambda q: torch.nn.functional.scaled_dot_product_attention(q, q * 0.5, q.cos()).sum(),
        [(2, 3, 4, 8), (2, 3, 5, 11), (1, 2, 7, 3)]),
    # the size guards' sympy expressions reached the guard recorder, which guarded their attributes
    "max_pool2d over two symbolic sizes": (lambda x: torch.nn.functional.max_pool2d(x, 3).sum(),
                                           [(2, 3, 7, 7), (2, 3, 10, 10), (1, 2, 13, 9)]),
    # a shift and a k computed from a size were refused (isinstance(k, int)): the compile fell back static
    "roll by a symbolic shift": (lambda x: (torch.roll(x, x.shape[0] // 2, 0) * x.cos()).sum(),
                                 [(6, 3), (10, 4), (9, 5)]),
    "topk of a symbolic k": (lambda x: torch.topk(x, x.shape[-1] // 2).values.exp().sum(), [(3, 6), (4, 10), (2, 9)]),
    # an op without a symbol runs torch's meta kernel, which failed on plain meta tensors of symbolic sizes
    "unfold (an opaque op)": (lambda x: (x.unfold(0, 2, 1) ** 2).sum(), [(6, 3), (10, 4), (9, 5)]),
    # a factory without a symbol was run at trace time and baked, which pinned its size
    "eye of a symbolic size": (lambda x: (torch.eye(x.shape[0], dtype=x.dtype) @ x).sin().sum(),
                               [(6, 3), (10, 4), (9, 5)]),
    # arange(numel) asked the sign of a float quotient of the sizes
    "arange over a symbolic count": (lambda x: (torch.arange(x.numel(), dtype=x.dtype).reshape(x.shape) * x).sum(),
                                     [(2, 3), (4, 5), (3, 7)]),
}


@pytest.mark.parametrize("name", list(ONE_ENTRY_AT_EVERY_SIZE))
def test_op_is_one_exact_entry_at_every_size(name):
    fn, shapes = ONE_ENTRY_AT_EVERY_SIZE[name]
    n_args = fn.__code__.co_argcount
    jitted = tf.jit(fn, dynamic=True)
    for k, shape in enumerate(shapes):
        g = torch.Generator().manual_seed(k)
        args = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n_args)]
        got, expected = _loss_grads(jitted, *args), _loss_grads(fn, *args)
        torch.testing.assert_close(got, expected)
    info = tf.cache_info(jitted)
    assert info["misses"] == 1 and not info["pinned"] and not info["static_fallbacks"], info


def test_a_size_one_that_broadcasts_stays_static_and_the_rest_symbolic():
    """A size-1 dimension is traced at another size; where the 1 broadcast against a size, that trace fails and
    the compile keeps the 1 static and the other dimensions symbolic (cache_info says which), not every size."""
    def f(a, b):
        return a + b

    jitted = tf.jit(f, dynamic=True)
    for n in [3, 5, 8]:
        a, b = torch.randn(n, 1), torch.randn(n, 4)
        torch.testing.assert_close(jitted(a, b), f(a, b))
    info = tf.cache_info(jitted)
    assert info["misses"] == 1 and not info["static_fallbacks"], info
    (pinned,) = info["pinned"]  # with why: broadcasting the 1 against the other size, traced at 2, failed
    assert (pinned.startswith("tensor 0's dimension 1 == 1 (its trace at size 2 could not take 1: ")
            and "must match" in pinned)
    # (a's and b's first sizes are one symbol, named after either: the addition guarded them equal)
    assert {"argument 'a'.shape[0]", "argument 'b'.shape[0]"} & set(info["symbolic"][0].values())


def test_a_symbolic_compile_that_fails_falls_back_static_and_says_why():
    """Code that cannot run with a symbolic size still compiles, per size, and cache_info says why."""
    def f(x):
        n = x.shape[0]
        assert isinstance(n, int), "wants a Python int"
        return x * n

    jitted = tf.jit(f, dynamic=True)
    for n in [2, 3]:
        x = torch.randn(n, 4)
        torch.testing.assert_close(jitted(x), f(x))
    info = tf.cache_info(jitted)
    assert info["misses"] == 2 and info["symbolic"] == []
    assert info["static_fallbacks"] == ["AssertionError: wants a Python int"] * 2


@given(tst.programs(), tst.program_inputs(), st.integers(1, 3))
def test_dynamic_jit_of_grad_of_program_equals_grad_at_every_size(program, inputs, grow):
    """jit(grad(f), dynamic=True) == grad(f) (torch.autograd's), for the drawn inputs and for inputs grown along
    their first dimension: one trace of the derivative for every size, where the sizes fit it."""
    def loss(*xs):
        return program(*xs).sum()

    def eager_grads(*xs):
        leaves = [x.detach().clone().requires_grad_() for x in xs]
        try:
            out = loss(*leaves)
        except RuntimeError:
            return None
        grads = torch.autograd.grad(out, leaves, allow_unused=True) if out.requires_grad else [None] * len(xs)
        return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, xs)]

    expected = eager_grads(*inputs)
    assume(expected is not None)
    jitted = tf.jit(tf.grad(loss, argnums=tuple(range(len(inputs)))), dynamic=True)
    torch.testing.assert_close(list(jitted(*inputs)), expected, equal_nan=True)
    grown = tuple(torch.cat([x] * (grow + 1)) for x in inputs)
    expected = eager_grads(*grown)
    if expected is None:
        with pytest.raises(RuntimeError):
            jitted(*grown)
    else:
        torch.testing.assert_close(list(jitted(*grown)), expected, equal_nan=True)


shape = (2, 3)  # a global sharing its name with the attribute the function below reads (x.shape)


def test_an_attribute_named_like_a_global_does_not_guard_the_global():
    """The guard recorder read the names a function's code uses (co_names, attributes among them): `x.shape`
    guarded this module's global `shape`, so a loop rebinding it recompiled every call."""
    global shape

    def f(x):
        return x.reshape(x.shape[0], -1).sum() * 2

    jitted = tf.jit(f)
    for shape in [(2, 3), (2, 6), (2, 9), (2, 12)]:  # noqa: B007 (rebinding the global is the point)
        x = torch.randn(shape)
        torch.testing.assert_close(jitted(x), f(x))
    info = tf.cache_info(jitted)
    assert info["misses"] == 2 and not any("global" in r for r in info["recompiles"]), info["recompiles"]


def test_many_lengths_keep_the_fast_path_table_bounded():
    """Each concrete size a symbolic entry serves is a key of the fast path's table: bounded, so a long
    generation does not keep one per token; calls stay exact and the entry is still one."""
    jitted = tf.jit(lambda x: x * 2, dynamic=True)
    for n in range(1, 600):
        jitted(torch.ones(n))
    assert len(jitted._thunderfn_state.fast_cache) <= 256
    torch.testing.assert_close(jitted(torch.ones(700)), torch.full((700,), 2.0))
    assert tf.cache_info(jitted)["misses"] == 1


# -- the everyday decoder patterns (thunderfn/examples/decoder.py) ---------------------------------------------
@pytest.mark.parametrize("training", [False, True])
def test_decoder_over_twelve_lengths_matches_eager_and_compiles_no_more_than_torch_compile(training):
    """Positions sliced by a length read from a shape, a causal mask built from it, nn.MultiheadAttention with it
    and cross-entropy over B*T rows keep the length symbolic: at most 3 compiles for 12 lengths (torch.compile's
    graphs for the same calls: static, the specialized length 1, one symbolic), each result eager's."""
    from thunderfn.examples.decoder import DECODER_LENGTHS, Decoder

    torch.manual_seed(0)
    model = Decoder().train(training)
    jitted = tf.jit(model)
    for n, length in enumerate(DECODER_LENGTHS):
        g = torch.Generator().manual_seed(n)
        idx, targets = torch.randint(0, 50, (2, length), generator=g), torch.randint(0, 50, (2, length), generator=g)
        if training:
            loss, expected = jitted(idx, targets), model(idx, targets)
            got = torch.autograd.grad(loss, list(model.parameters()))
            want = torch.autograd.grad(expected, list(model.parameters()))
            torch.testing.assert_close((loss, got), (expected, want), atol=1e-5, rtol=1e-5)
        else:
            with torch.no_grad():
                out, expected = jitted(idx), model(idx)
            assert out.shape == expected.shape == (2, length, 50)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    info = tf.cache_info(jitted)
    assert info["misses"] <= 3 and not info["static_fallbacks"], info
    assert any("argument 'idx'.shape[1]" in s.values() for s in info["symbolic"]), info


def test_a_pinned_size_names_the_line_that_read_it_and_the_limit_warning_says_so():
    def f(x):
        n = int(x.shape[1])  # the read that pins
        return x * n

    jitted = tf.jit(f, cache_size_limit=3)
    with pytest.warns(UserWarning, match=r"relied on these sizes being one number.*test_dynamic_shapes.py:\d+"):
        for n in range(2, 8):
            torch.testing.assert_close(jitted(torch.ones(2, n)), f(torch.ones(2, n)))
    pinned = tf.cache_info(jitted)["pinned"]
    assert pinned and all("test_dynamic_shapes.py:" in p and "int()" in p for p in pinned), pinned


def test_a_size_pinned_by_an_op_names_the_op_and_line():
    def g(x):
        return x.view(2, 3) * 2  # an (n,) tensor viewed as (2, 3): n must be 6

    jitted = tf.jit(g, dynamic=True)
    torch.testing.assert_close(jitted(torch.ones(6)), g(torch.ones(6)))
    (pinned,) = tf.cache_info(jitted)["pinned"]
    assert "== 6" in pinned and "pinned by torch.Tensor.view at test_dynamic_shapes.py:" in pinned, pinned


def test_a_length_one_refused_by_a_symbolic_entrys_guard_compiles_once_and_says_where():
    """12, 7, then 1: the symbolic entry's guard `s0 > 1` refuses 1; a trace at another size would be that entry
    again (it compiled twice and kept a duplicate), so 1 compiles static at once, and cache_info says which guard
    told 1 apart and which line asked it."""
    def f(x):
        return x.sum(1, keepdim=True) if x.shape[1] > 1 else x + 1

    jitted = tf.jit(f)
    for n in (12, 7, 1, 3, 1):
        torch.testing.assert_close(jitted(torch.ones(2, n)), f(torch.ones(2, n)))
    info = tf.cache_info(jitted)
    assert info["entries"] == info["misses"] == 3, info
    (pinned,) = info["pinned"]
    assert "s0 > 1 (asked at test_dynamic_shapes.py:" in pinned, pinned


class _CausalSelfAttention(torch.nn.Module):
    """nanoGPT's attention: a causal buffer sliced [:, :, :T, :T], positions from torch.arange(T), heads by views of
    computed sizes, and SDPA with a mask built by comparing two aranges."""

    def __init__(self, d=16, heads=2, max_len=64):
        super().__init__()
        self.qkv, self.proj, self.heads = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), heads
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))
        self.wte, self.wpe, self.head = (torch.nn.Embedding(50, d), torch.nn.Embedding(max_len, d),
                                         torch.nn.Linear(d, 50))

    def forward(self, idx, targets):
        B, T = idx.size()
        x = self.wte(idx) + self.wpe(torch.arange(0, T, dtype=torch.long))
        C = x.size(-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = ((q @ k.transpose(-2, -1)) / k.size(-1) ** 0.5).masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        mask = torch.arange(T)[:, None] >= torch.arange(T)[None, :]
        y = att.softmax(-1) @ v + torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        logits = self.head(self.proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def test_nanogpt_attention_over_lengths_trains_as_eager_with_few_compiles():
    torch.manual_seed(0)
    model = _CausalSelfAttention()
    jitted = tf.jit(model)
    for n, length in enumerate([5, 1, 9, 17, 2, 33, 3, 64]):
        g = torch.Generator().manual_seed(n)
        idx, targets = torch.randint(0, 50, (2, length), generator=g), torch.randint(0, 50, (2, length), generator=g)
        loss, expected = jitted(idx, targets), model(idx, targets)
        got = torch.autograd.grad(loss, list(model.parameters()))
        want = torch.autograd.grad(expected, list(model.parameters()))
        torch.testing.assert_close((loss, got), (expected, want), atol=1e-5, rtol=1e-5)
    info = tf.cache_info(jitted)
    assert info["misses"] <= 3 and not info["static_fallbacks"], info  # torch.compile: 4 graphs for these calls
