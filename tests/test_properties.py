"""Laws the core must satisfy on randomly drawn inputs and programs."""
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import thunderfn as tf
from thunderfn.clang import broadcast_shapes
from thunderfn.core import dtypes
from thunderfn.testing import strategies as tst


def _eager_or_none(fn, *args):
    try:
        return fn(*args)
    except RuntimeError:  # a program invalid for these shapes (e.g. broadcasting after a reduction)
        return None


@given(tst.programs(), tst.program_inputs())
def test_jit_of_program_equals_program(program, inputs):
    """jit(f)(x) == f(x) for random programs."""
    expected = _eager_or_none(program, *inputs)
    assume(expected is not None)
    torch.testing.assert_close(tf.jit(program)(*inputs), expected, equal_nan=True)


@given(tst.programs(), tst.program_inputs())
def test_decomposition_of_program_equals_program(program, inputs):
    """Running every torch symbol as its prims gives torch's values."""
    expected = _eager_or_none(program, *inputs)
    assume(expected is not None)
    decomposed = tf.jit(program, executors=["torch_prims"], fallback=False)
    torch.testing.assert_close(decomposed(*inputs), expected, equal_nan=True, atol=1e-5, rtol=1e-4)


@given(tst.programs(), tst.program_inputs())
def test_execution_trace_source_reruns_to_same_values(program, inputs):
    """The printed execution trace is the program: compiling str(trace) again reproduces the output."""
    expected = _eager_or_none(program, *inputs)
    assume(expected is not None)
    jf = tf.jit(program)
    jf(*inputs)
    rerun = tf.last_traces(jf)[-1].python_callable()
    torch.testing.assert_close(rerun(*inputs), expected, equal_nan=True)


def _operand(kind, dtype, seed):
    if kind == "scalar":
        return {torch.bool: True, torch.float64: 2.5, torch.float32: -1.5}.get(dtype, 3)
    return tst.make((2,) if kind == "dims" else (), dtype, seed)


@given(st.sampled_from(["dims", "zerodim", "scalar"]), st.sampled_from(tst.ALL_DTYPES),
       st.sampled_from(["dims", "zerodim", "scalar"]), st.sampled_from(tst.ALL_DTYPES))
def test_result_type_matches_torch(kind_a, dtype_a, kind_b, dtype_b):
    """dtypes.result_type(a, b) == torch.result_type(a, b) over tensors with dims, 0-dim tensors and scalars."""
    a, b = _operand(kind_a, dtype_a, 0), _operand(kind_b, dtype_b, 1)
    assume(isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor))
    assert dtypes.result_type(a, b) == torch.result_type(a, b)


@given(tst.shapes(max_dims=4).flatmap(lambda s: st.tuples(st.just(s), tst.broadcastable_to(s))))
def test_broadcast_shapes_matches_torch(shapes):
    assert broadcast_shapes(*shapes) == tuple(torch.broadcast_shapes(*shapes))


@given(tst.tensors(shape=(3, 4)), tst.python_scalars())
def test_jit_with_python_scalar_matches_eager(x, s):
    """Scalars promote exactly as in torch: jit(lambda x: x * s + s)(x) == eager, dtype included."""
    fn = lambda x: x * s + s  # noqa: E731
    torch.testing.assert_close(tf.jit(fn)(x), fn(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@given(data=st.data())
def test_half_precision_composites_round_once_like_torch(dtype, data):
    """Composite ops on f16/bf16 compute in f32 and round once, so the decomposition matches torch."""
    x = data.draw(tst.tensors(shape=(4, 5), dtypes=(dtype,)))
    for fn in (torch.nn.functional.gelu, lambda t: torch.softmax(t, -1), torch.sigmoid,
               lambda t: torch.nn.functional.layer_norm(t, (5,))):
        decomposed = tf.jit(fn, executors=["torch_prims"], fallback=False)
        torch.testing.assert_close(decomposed(x), fn(x))


@given(tst.programs(in_place=True), tst.program_inputs())
def test_jit_of_in_place_program_equals_program_and_mutates_inputs_alike(program, inputs):
    """With in-place steps, jit(f)(x) == f(x) and x is left exactly as eager leaves it (or jit refuses)."""
    eager_inputs = tuple(x.clone() for x in inputs)
    expected = _eager_or_none(program, *eager_inputs)
    assume(expected is not None)
    jit_inputs = tuple(x.clone() for x in inputs)
    try:
        got = tf.jit(program)(*jit_inputs)
    except tf.UnsupportedOpError:
        return  # refused (a view made another way, or a stale view): allowed, never a different answer
    torch.testing.assert_close(got, expected, equal_nan=True)
    for mutated, reference in zip(jit_inputs, eager_inputs):
        torch.testing.assert_close(mutated, reference, equal_nan=True)


# -- control flow: tf.scan and tf.cond bodies made of random programs ---------------------------------------------
def _loop(body, init, xs):
    """What tf.scan stands for: a Python loop."""
    carry, ys = init, []
    for x in xs:
        carry, y = body(carry, x)
        ys.append(y)
    return carry, torch.stack(ys)


def _finite(*tensors) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _central_differences(f, args, eps=1e-6):
    """The gradient of the scalar f(*args) with respect to each of args, by central differences."""
    grads = []
    for i, a in enumerate(args):
        g = torch.zeros_like(a)
        for j in range(a.numel()):
            shifted = []
            for sign in (1, -1):
                moved = [x.clone() for x in args]
                moved[i].view(-1)[j] += sign * eps
                shifted.append(f(*moved))
            g.view(-1)[j] = (shifted[0] - shifted[1]) / (2 * eps)
        grads.append(g)
    return tuple(grads)


@given(tst.scan_bodies(), tst.scan_inputs())
def test_jit_of_scan_equals_its_python_loop(body, inputs):
    """jit(scan(f))(init, xs) == the Python loop of f over xs."""
    expected = _eager_or_none(_loop, body, *inputs)
    assume(expected is not None and _finite(*expected))
    torch.testing.assert_close(tf.jit(lambda init, xs: tf.scan(body, init, xs))(*inputs), expected)


@given(tst.scan_bodies(), tst.scan_inputs())
def test_grad_of_scan_matches_finite_differences(body, inputs):
    """grad(scan loss) == its gradient by central differences (float64)."""
    def loss(init, xs):
        carry, ys = tf.scan(body, init, xs)
        return carry.sum() + ys.square().sum()

    value = _eager_or_none(loss, *inputs)
    assume(value is not None and _finite(value))
    torch.testing.assert_close(tf.grad(loss, argnums=(0, 1))(*inputs), _central_differences(loss, inputs),
                               atol=1e-5, rtol=1e-4)


@given(tst.scan_bodies(), tst.scan_inputs(batch=3))
def test_vmap_of_scan_is_scan_of_each_example(body, inputs):
    """vmap(scan(f))(init, xs)[i] == scan(f)(init[i], xs[i])."""
    init, xs = inputs
    each = [_eager_or_none(_loop, body, init[i], xs[i]) for i in range(init.shape[0])]
    assume(all(e is not None and _finite(*e) for e in each))
    batched = tf.vmap(lambda init, xs: tf.scan(body, init, xs))(init, xs)
    for i, expected in enumerate(each):
        torch.testing.assert_close((batched[0][i], batched[1][i]), expected)


def _branching(branches):
    true_fn, false_fn = branches

    def f(x, y):
        return tf.cond(x.sum() > 0, true_fn, false_fn, x, y)
    return f


def _branched_eagerly(branches, x, y):
    true_fn, false_fn = branches
    return true_fn(x, y) if x.sum() > 0 else false_fn(x, y)


def _both_branches_run(branches, x, y) -> bool:
    """tf.cond traces both branches (as jax.lax.cond does): a program whose other branch does not fit the shapes
    raises where the Python `if` would not run it, so both must run eagerly for the law to be tested."""
    return all(_eager_or_none(branch, x, y) is not None for branch in branches)


@given(tst.cond_branches(), tst.program_inputs(dtypes=(torch.float64,)))
def test_jit_of_cond_equals_its_python_if(branches, inputs):
    """jit(cond(p, f, g))(x) == f(x) if p else g(x)."""
    expected = _eager_or_none(_branched_eagerly, branches, *inputs)
    assume(expected is not None and _finite(expected) and _both_branches_run(branches, *inputs))
    torch.testing.assert_close(tf.jit(_branching(branches))(*inputs), expected)


@given(tst.cond_branches(), tst.program_inputs(dtypes=(torch.float64,)))
def test_grad_of_cond_matches_finite_differences(branches, inputs):
    """grad(cond loss) == its gradient by central differences, away from the predicate's boundary."""
    def loss(x, y):
        return _branching(branches)(x, y).square().sum()

    value = _eager_or_none(loss, *inputs)
    assume(value is not None and _finite(value) and abs(float(inputs[0].sum())) > 1e-3
           and _both_branches_run(branches, *inputs))
    torch.testing.assert_close(tf.grad(loss, argnums=(0, 1))(*inputs), _central_differences(loss, inputs),
                               atol=1e-5, rtol=1e-4)


@given(tst.cond_branches(), tst.program_inputs(dtypes=(torch.float64,)))
def test_vmap_of_cond_is_cond_of_each_example(branches, inputs):
    """vmap(cond(p(x), f, g))(x)[i] == cond(p(x[i]), f, g)(x[i]): a predicate that differs between examples."""
    x, y = inputs
    assume(x.ndim >= 2)
    each = [_eager_or_none(_branched_eagerly, branches, x[i], y[i]) for i in range(x.shape[0])]
    assume(all(e is not None and _finite(e) for e in each) and _both_branches_run(branches, x[0], y[0]))
    batched = tf.vmap(_branching(branches))(x, y)
    for i, expected in enumerate(each):
        torch.testing.assert_close(batched[i], expected)
