"""Forward mode: jvp agrees with torch.func.jvp, is the transpose of vjp, is linear in the
tangent, and composes with grad (Hessian-vector products) and jit."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

import thunderfn as tf
from thunderfn.testing import strategies as tst

FUNCTIONS = {
    "elementwise": lambda a: torch.sin(a) * a.exp() - a ** 3,
    "softmax": lambda a: F.softmax(a, -1).sum(0),
    "layer_norm": lambda a: F.layer_norm(a, (a.shape[-1],)),
    "matmul": lambda a: a @ a.T,
    "opaque_max_pool": lambda a: F.max_pool1d(a[None], 2),  # an opaque op inside: torch.func.jvp at run time
    "indexing": lambda a: a[1:, ::2].cumsum(0),
}


@pytest.mark.parametrize("fn", FUNCTIONS.values(), ids=FUNCTIONS.keys())
def test_jvp_matches_torch_func_jvp(fn):
    x, t = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    out, tangent = tf.jvp(fn, (x,), (t,))
    expected_out, expected_tangent = torch.func.jvp(fn, (x,), (t,))
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(tangent, expected_tangent)


def _inner(a, b):
    return sum((x * y).sum() for x, y in zip(a, b))


@given(tst.programs(), tst.program_inputs(dtypes=(torch.float64,)), st.integers(0, 2**16))
def test_vjp_is_the_transpose_of_jvp(program, inputs, seed):
    """<vjp(ct), t> == <ct, jvp(t)> on random programs."""
    try:
        out = program(*inputs)
    except RuntimeError:
        assume(False)
    tangents = tuple(tst.make(x.shape, torch.float64, seed + i) for i, x in enumerate(inputs))
    ct = tst.make(out.shape, torch.float64, seed + 7)
    _, jvp_out = tf.jvp(program, inputs, tangents)
    _, vjp_fn = tf.vjp(program, *inputs)
    torch.testing.assert_close(_inner(vjp_fn(ct), tangents), (ct * jvp_out).sum(), equal_nan=True)


@given(tst.tensors(shape=(3, 2), dtypes=(torch.float64,)), st.floats(-3, 3), st.integers(0, 2**16))
def test_jvp_is_linear_in_the_tangent(x, scale, seed):
    f = lambda a: torch.tanh(a) @ a.T  # noqa: E731
    t1, t2 = tst.make(x.shape, torch.float64, seed), tst.make(x.shape, torch.float64, seed + 1)
    combined = tf.jvp(f, (x,), (t1 * scale + t2,))[1]
    torch.testing.assert_close(combined, tf.jvp(f, (x,), (t1,))[1] * scale + tf.jvp(f, (x,), (t2,))[1])


def test_jvp_of_grad_is_a_hessian_vector_product():
    f = lambda a: (torch.tanh(a) * a.exp()).sum()  # noqa: E731
    x, v = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    _, hvp = tf.jvp(tf.grad(f), (x,), (v,))
    torch.testing.assert_close(hvp, torch.func.hessian(f)(x) @ v)


def test_jvp_inside_jit_and_with_aux():
    x, t = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    jitted = tf.jit(lambda a, b: tf.jvp(torch.sin, (a,), (b,))[1])
    torch.testing.assert_close(jitted(x, t), torch.cos(x) * t)
    out, tangent, aux = tf.jvp(lambda a: (a * 2, "aux"), (x,), (t,), has_aux=True)
    assert aux == "aux"
    torch.testing.assert_close(tangent, 2 * t)


def test_jvp_argument_errors():
    with pytest.raises(RuntimeError, match="Expected primals to be a tuple"):  # torch.func's RuntimeError
        tf.jvp(torch.sin, torch.randn(2), torch.randn(2))
    with pytest.raises(TypeError, match="Expected primals to be a tuple"):  # and a TypeError, as before
        tf.jvp(torch.sin, torch.randn(2), torch.randn(2))
    with pytest.raises(RuntimeError, match="Expected primals and tangents to have the same python structure"):
        tf.jvp(lambda a, b: a + b, (torch.randn(2), torch.randn(2)), (torch.randn(2),))


@pytest.mark.parametrize("constant", [lambda t: torch.tensor(1.0), lambda t: (torch.ones(2), t)],
                         ids=["tensor", "tuple"])
def test_jvp_of_an_output_that_ignores_the_input_is_zeros_not_none(constant):
    x = torch.tensor(0.5)
    got = tf.jvp(constant, (x,), (torch.ones(()),))
    expected = torch.func.jvp(constant, (x,), (torch.ones(()),))
    torch.testing.assert_close(got, expected)


FILLS = {
    "full": lambda v: torch.full((2, 3), v, dtype=torch.float64) * v,
    "full_like": lambda v: torch.full_like(torch.ones(4, dtype=torch.float64), v),
    "new_full": lambda v: torch.ones(2, dtype=torch.float64).new_full((3,), v) + v,
}


@pytest.mark.parametrize("fn", FILLS.values(), ids=FILLS.keys())
def test_a_tensor_fill_is_a_constant_as_in_torch(fn):
    """torch's full takes its fill as a Scalar, so torch.func.jvp gives the fill no tangent; reverse mode
    is the transpose (torch.autograd refuses a fill that requires grad)."""
    v, t = torch.tensor(2.0, dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64)
    torch.testing.assert_close(tf.jvp(fn, (v,), (t,)), torch.func.jvp(fn, (v,), (t,)))
    ct = torch.randn(fn(v).shape, dtype=torch.float64)
    _, vjp_fn = tf.vjp(fn, v)
    torch.testing.assert_close((vjp_fn(ct)[0] * t), (ct * tf.jvp(fn, (v,), (t,))[1]).sum())


def _norm_with_running_stats(norm):
    def fn(x, running_mean, running_var, weight):
        mean, var = running_mean.clone(), running_var.clone()  # written in place by the norm
        return norm(x, mean, var, weight), mean, var
    return fn


RUNNING_STATS = {
    "instance_norm": _norm_with_running_stats(
        lambda x, m, v, w: F.instance_norm(x, m, v, w, None, use_input_stats=True, momentum=0.3)),
    "batch_norm": _norm_with_running_stats(lambda x, m, v, w: F.batch_norm(x, m, v, w, None,
                                                                           training=True, momentum=0.3)),
}


@pytest.mark.parametrize("fn", RUNNING_STATS.values(), ids=RUNNING_STATS.keys())
def test_running_statistics_keep_their_tangent_across_the_update_as_in_torch(fn):
    """torch's kernel writes the new running statistics outside autograd: the input's tangent does not reach
    them and each keeps the tangent it had (not the update formula's (1 - momentum) times it); the output's
    tangent is the norm's."""
    g = torch.Generator().manual_seed(0)
    primals = (torch.randn(4, 3, 5, dtype=torch.float64, generator=g), torch.randn(3, dtype=torch.float64, generator=g),
               torch.rand(3, dtype=torch.float64, generator=g) + 0.5, torch.randn(3, dtype=torch.float64, generator=g))
    tangents = tuple(torch.randn(p.shape, dtype=torch.float64, generator=g) for p in primals)
    out, tangent = tf.jvp(fn, primals, tangents)
    expected_out, expected_tangent = torch.func.jvp(fn, primals, tangents)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(tangent, expected_tangent)
    torch.testing.assert_close(tangent[1:], tangents[1:3])
    # and reverse mode is the transpose: the new statistics' cotangents reach the old ones
    cts = tuple(torch.randn(o.shape, dtype=torch.float64, generator=g) for o in out)
    _, vjp_fn = tf.vjp(fn, *primals)
    torch.testing.assert_close(_inner(vjp_fn(cts), tangents), _inner(cts, tangent))


def test_a_real_tangent_made_complex_is_refused_not_dropped():
    # x * 1j converts x to complex first: its tangent was silently dropped (a zero tangent, torch.func: 1j)
    with pytest.raises(tf.UnsupportedOpError, match="complex tensors are not supported"):
        tf.jvp(lambda x: x * 1j, (torch.ones(2),), (torch.ones(2),))
