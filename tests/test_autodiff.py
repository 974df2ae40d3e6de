"""Reverse mode: grad, value_and_grad and vjp agree with torch.autograd, and compose with
each other and with jit in every order."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given

import thunderfn as tf
from thunderfn.testing import strategies as tst


def _torch_grad(fn, *args):
    leaves = [a.detach().clone().requires_grad_(True) for a in args]
    return torch.autograd.grad(fn(*leaves), leaves, allow_unused=True)


SCALAR_FUNCTIONS = {
    "elementwise": lambda x, w: (torch.sin(x) * w + x.exp() / (1 + w ** 2)).sum(),
    "matmul_tanh": lambda x, w: torch.tanh(x @ w.T).mean(),
    "broadcast_and_reduce": lambda x, w: (x[:, None, :] * w[None]).amax(-1).sum(),
    "softmax_logsumexp": lambda x, w: (torch.softmax(x, -1) * w).sum() + torch.logsumexp(x, 1).sum(),
    "layer_norm": lambda x, w: F.layer_norm(x, (x.shape[-1],), w[0], w[1]).pow(2).sum(),
    "cross_entropy": lambda x, w: F.cross_entropy(x @ w.T, torch.tensor([0, 2, 1])),
    "indexing": lambda x, w: (x[1:, ::2] * w[:2, :2]).sum() + x[torch.tensor([0, 2])].sum(),
    "where_clamp": lambda x, w: torch.where(x > 0, x * w, w.clamp(min=-0.5)).var(),
}


@pytest.fixture
def xw():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("fn", SCALAR_FUNCTIONS.values(), ids=SCALAR_FUNCTIONS.keys())
def test_grad_matches_torch_autograd(fn, xw):
    got = tf.grad(fn, argnums=(0, 1))(*xw)
    for g, expected in zip(got, _torch_grad(fn, *xw)):
        torch.testing.assert_close(g, expected)


@pytest.mark.parametrize("fn", SCALAR_FUNCTIONS.values(), ids=SCALAR_FUNCTIONS.keys())
def test_grad_jit_and_jit_grad_and_grad_agree(fn, xw):
    """grad(jit(f)) == jit(grad(f)) == grad(f)."""
    plain = tf.grad(fn)(*xw)
    torch.testing.assert_close(tf.grad(tf.jit(fn))(*xw), plain)
    torch.testing.assert_close(tf.jit(tf.grad(fn))(*xw), plain)


def test_grad_of_grad_is_the_second_derivative():
    x = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    f = lambda t: (t ** 3).sum() + torch.sin(t).sum()  # noqa: E731
    second = tf.grad(lambda t: tf.grad(f)(t).sum())(x)
    torch.testing.assert_close(second, 6 * x - torch.sin(x))


def test_hessian_vector_product_matches_torch_func():
    x = torch.randn(4, dtype=torch.float64)
    v = torch.randn(4, dtype=torch.float64)
    f = lambda t: (torch.tanh(t) * t.exp()).sum()  # noqa: E731
    hvp = tf.grad(lambda t: (tf.grad(f)(t) * v).sum())(x)
    torch.testing.assert_close(hvp, torch.func.hessian(f)(x) @ v)


def test_value_and_grad_and_has_aux():
    x = torch.randn(3, dtype=torch.float64)
    (value, aux), g = tf.value_and_grad(lambda t: ((t ** 2).sum(), t.mean()), has_aux=True)(x)
    torch.testing.assert_close(value, (x ** 2).sum())
    torch.testing.assert_close(aux, x.mean())
    torch.testing.assert_close(g, 2 * x)
    g2, aux2 = tf.grad(lambda t: ((t ** 2).sum(), "label"), has_aux=True)(x)
    assert aux2 == "label"
    torch.testing.assert_close(g2, 2 * x)


def test_grad_over_a_parameter_dict():
    params = {"w": torch.randn(4, 3, dtype=torch.float64), "b": torch.randn(3, dtype=torch.float64)}
    x = torch.randn(5, 4, dtype=torch.float64)
    loss = lambda p, x: torch.tanh(x @ p["w"] + p["b"]).pow(2).mean()  # noqa: E731
    got = tf.grad(loss)(params, x)
    expected = _torch_grad(lambda w, b: loss({"w": w, "b": b}, x), params["w"], params["b"])
    assert set(got) == {"w", "b"}
    torch.testing.assert_close(got["w"], expected[0])
    torch.testing.assert_close(got["b"], expected[1])


def test_vjp_of_a_non_scalar_function():
    x = torch.randn(3, 4, dtype=torch.float64)
    ct = torch.randn(3, dtype=torch.float64)
    f = lambda t: torch.sin(t).sum(1)  # noqa: E731
    out, vjp_fn = tf.vjp(f, x)
    torch.testing.assert_close(out, f(x))
    (got,) = vjp_fn(ct)
    _, pullback = torch.func.vjp(f, x)
    torch.testing.assert_close(got, pullback(ct)[0])


def test_vjp_inside_jit():
    x, ct = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    jitted = tf.jit(lambda t, c: tf.vjp(torch.exp, t)[1](c)[0])
    torch.testing.assert_close(jitted(x, ct), torch.exp(x) * ct)


# -- vjp_fn is the derivative of the forward tf.vjp ran (JAX's residuals), not a re-run of fn --------
def test_vjp_fn_closes_over_the_forward_not_the_closure_at_call_time():
    s = [2.0]
    x = torch.ones(3)
    out, vjp_fn = tf.vjp(lambda t: t * s[0], x)
    s[0] = 5.0
    torch.testing.assert_close(vjp_fn(torch.ones(3))[0], torch.full((3,), 2.0))
    torch.testing.assert_close(out, torch.full((3,), 2.0))


def test_vjp_fn_does_not_call_the_function_again():
    calls = []

    def f(t):
        calls.append(1)
        return torch.sin(t) * t

    x = torch.randn(3, dtype=torch.float64)
    _, vjp_fn = tf.vjp(f, x)
    n = len(calls)
    vjp_fn(torch.ones(3, dtype=torch.float64))
    vjp_fn(torch.ones(3, dtype=torch.float64))
    assert len(calls) == n


def test_vjp_fn_of_a_random_function_uses_the_forwards_draws():
    torch.manual_seed(0)
    out, vjp_fn = tf.vjp(lambda t: F.dropout(t, 0.5), torch.ones(1000))
    torch.randn(10)  # the generator moves on; the mask does not
    torch.testing.assert_close(vjp_fn(torch.ones(1000))[0], out)


_F = lambda t: torch.sin(t) * t.exp()  # noqa: E731
_COMPOSED_WITH_VJP_FN = {  # (thunderfn's, torch.func's), each given (vjp_fn, cotangent)
    "vjp_of_vjp_fn": (lambda v, c: tf.vjp(v, c)[1]((c,)), lambda v, c: torch.func.vjp(v, c)[1]((c,))),
    "grad_of_vjp_fn": (lambda v, c: tf.grad(lambda u: v(u)[0].pow(2).sum())(c),
                       lambda v, c: torch.func.grad(lambda u: v(u)[0].pow(2).sum())(c)),
    "jvp_of_vjp_fn": (lambda v, c: tf.jvp(v, (c,), (c,))[1], lambda v, c: torch.func.jvp(v, (c,), (c,))[1]),
    "vmap_of_vjp_fn": (lambda v, c: tf.vmap(v)(torch.stack([c, 2 * c])),
                       lambda v, c: torch.func.vmap(v)(torch.stack([c, 2 * c]))),
    "jit_of_vjp_fn": (lambda v, c: tf.jit(v)(c), lambda v, c: v(c)),
}


@pytest.mark.parametrize("name", _COMPOSED_WITH_VJP_FN)
def test_vjp_fn_is_a_function_every_transform_takes(name):
    ours, theirs = _COMPOSED_WITH_VJP_FN[name]
    x, ct = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(ours(tf.vjp(_F, x)[1], ct), theirs(torch.func.vjp(_F, x)[1], ct))


def test_second_derivative_through_vjp_inside_grad():
    x, ct = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    got = tf.grad(lambda t: tf.vjp(_F, t)[1](ct)[0].sum())(x)
    torch.testing.assert_close(got, torch.func.grad(lambda t: torch.func.vjp(_F, t)[1](ct)[0].sum())(x))


def test_vjp_fn_refuses_values_modified_in_place_after_vjp():
    w = torch.ones(3, dtype=torch.float64)
    _, vjp_fn = tf.vjp(lambda t: t * w, torch.randn(3, dtype=torch.float64))
    w.mul_(3)
    with pytest.raises(tf.errors.SavedTensorModifiedError, match="modified by an in-place operation"):
        vjp_fn(torch.ones(3, dtype=torch.float64))


def test_vjp_fn_cotangent_mismatches_are_named():
    out, vjp_fn = tf.vjp(lambda t: (t * 2, t.sum()), torch.randn(3))
    with pytest.raises(tf.errors.CotangentError, match="shape"):
        vjp_fn((torch.ones(4), torch.ones(())))
    with pytest.raises(tf.errors.CotangentError, match="structure"):
        vjp_fn(torch.ones(3))
    torch.testing.assert_close(vjp_fn((None, torch.ones(()))), (torch.ones(3),))


def test_unused_input_gets_zero_gradient():
    x, y = torch.randn(2, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
    gx, gy = tf.grad(lambda a, b: a.sum(), argnums=(0, 1))(x, y)
    torch.testing.assert_close(gx, torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(gy, torch.zeros(2, dtype=torch.float64))


def test_no_grad_block_stops_the_gradient():
    x = torch.randn(3, dtype=torch.float64)

    def f(t):
        with torch.no_grad():
            scale = t.sum()
        return (t * scale).sum()

    torch.testing.assert_close(tf.grad(f)(x), torch.full((3,), x.sum().item(), dtype=torch.float64))


# -- an outer torch.no_grad() does not reach a transform (torch.func and JAX compute the derivative) --
_SIN_SUM = lambda t: (torch.sin(t) * t).sum()  # noqa: E731
_UNDER_NO_GRAD = {
    "grad": (lambda x: tf.grad(_SIN_SUM)(x), lambda x: torch.func.grad(_SIN_SUM)(x)),
    "value_and_grad": (lambda x: tf.value_and_grad(_SIN_SUM)(x),
                       lambda x: torch.func.grad_and_value(_SIN_SUM)(x)[::-1]),
    "vjp": (lambda x: tf.vjp(torch.sin, x)[1](torch.ones_like(x)),
            lambda x: torch.func.vjp(torch.sin, x)[1](torch.ones_like(x))),
    "jacrev": (lambda x: tf.jacrev(torch.sin)(x), lambda x: torch.func.jacrev(torch.sin)(x)),
    "jacfwd": (lambda x: tf.jacfwd(torch.sin)(x), lambda x: torch.func.jacfwd(torch.sin)(x)),
    "hessian": (lambda x: tf.hessian(_SIN_SUM)(x), lambda x: torch.func.hessian(_SIN_SUM)(x)),
    "jvp": (lambda x: tf.jvp(torch.sin, (x,), (torch.ones_like(x),)),
            lambda x: torch.func.jvp(torch.sin, (x,), (torch.ones_like(x),))),
    "jit_of_grad": (lambda x: tf.jit(tf.grad(_SIN_SUM))(x), lambda x: torch.func.grad(_SIN_SUM)(x)),
}


@pytest.mark.parametrize("name", _UNDER_NO_GRAD)
def test_transforms_differentiate_under_an_outer_no_grad_as_torch_func(name):
    ours, theirs = _UNDER_NO_GRAD[name]
    x = torch.tensor([0.5, 1.0, -2.0], dtype=torch.float64)
    with torch.no_grad():
        got, expected = ours(x), theirs(x)
        assert not torch.is_grad_enabled()  # the caller's mode is back
    torch.testing.assert_close(got, expected)
    assert any(t.abs().sum() > 0 for t in torch.utils._pytree.tree_leaves(got))


def test_no_grad_around_a_transform_inside_a_function_is_seen_by_the_enclosing_transform():
    def g(grad, x):
        with torch.no_grad():  # the inner gradient is a constant for the outer grad (torch.func's levels)
            a = grad(_SIN_SUM)(x)
        return (a * x).sum() + grad(_SIN_SUM)(x).sum()

    x = torch.tensor([0.5, 1.0], dtype=torch.float64)
    expected = torch.func.grad(lambda x: g(torch.func.grad, x))(x)
    torch.testing.assert_close(tf.grad(lambda x: g(tf.grad, x))(x), expected)
    torch.testing.assert_close(tf.jit(tf.grad(lambda x: g(tf.grad, x)))(x), expected)


def test_no_grad_block_inside_the_function_still_stops_the_gradient_under_an_outer_no_grad():
    def f(t):
        with torch.no_grad():
            y = torch.sin(t)
        return (t * y).sum()

    x = torch.tensor([0.5, 1.0], dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(tf.grad(f)(x), torch.func.grad(f)(x))


def test_grad_inside_a_jitted_no_grad_block_is_computed_and_not_tracked():
    def h(x):
        with torch.no_grad():
            return tf.grad(_SIN_SUM)(x)

    x = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
    out = tf.jit(h)(x)
    torch.testing.assert_close(out, torch.func.grad(_SIN_SUM)(x.detach()))
    assert not out.requires_grad and torch.is_grad_enabled()


def test_torch_funcs_no_grad_cases_nested_and_with_vjp():
    """torch.func's own tests of grad mode around and inside transforms (test_eager_transforms.py)."""
    def f(x):
        with torch.no_grad():
            shift = x ** 3
        return x ** 3 - shift

    def g(x):  # only grad(f)'s first use is differentiable
        r1 = tf.grad(f)(x)
        with torch.no_grad():
            shift = tf.grad(f)(x)
        return r1 - shift

    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    y = tf.grad(g)(x)
    torch.testing.assert_close(y, 6 * x.detach())
    torch.testing.assert_close(torch.autograd.grad(y, x)[0], torch.tensor(6.0, dtype=torch.float64))

    h = lambda t: t ** 2  # noqa: E731
    with torch.no_grad():
        out, vjp_fn = tf.vjp(h, x)
    (gx,) = vjp_fn(torch.tensor(1.0, dtype=torch.float64))  # called under grad mode: differentiable, as torch.func's
    assert not out.requires_grad and gx.requires_grad
    torch.testing.assert_close(torch.autograd.grad(gx, x)[0], torch.tensor(2.0, dtype=torch.float64))
    out, vjp_fn = tf.vjp(h, x)
    with torch.no_grad():
        (gx,) = vjp_fn(torch.tensor(1.0, dtype=torch.float64))
    assert out.requires_grad and not gx.requires_grad


def test_an_error_inside_a_transform_gives_back_the_callers_grad_mode():
    with torch.no_grad():
        with pytest.raises(tf.ConcretizationError):
            tf.grad(lambda t: t.sum() * t.sum().item())(torch.ones(2))
        assert not torch.is_grad_enabled()
        with pytest.raises(tf.ConcretizationError):
            tf.jvp(lambda t: t * t.sum().item(), (torch.ones(2),), (torch.ones(2),))
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()


def test_opaque_op_is_differentiated_by_torch_at_run_time():
    x = torch.randn(1, 2, 8, dtype=torch.float64)
    f = lambda t: torch.kthvalue(t, 2, -1).values.pow(2).sum()  # noqa: E731  (kthvalue has no thunderfn symbol)
    torch.testing.assert_close(tf.grad(f)(x), _torch_grad(f, x)[0])


def test_grad_of_non_scalar_output_says_to_reduce():
    with pytest.raises(RuntimeError, match=r"requires a scalar output.*sum\(\)"):
        tf.grad(torch.sin)(torch.randn(3))


def test_grad_with_respect_to_an_integer_input_says_so():
    with pytest.raises(TypeError, match="only Tensors of floating point dtype can require gradients .*torch.int64"):
        tf.grad(lambda t: t.float().sum())(torch.arange(3))


def test_last_traces_of_a_grad_function_show_the_backward():
    g = tf.grad(lambda t: torch.sin(t).sum())
    g(torch.randn(3))
    execution = str(tf.last_traces(g)[-1])
    assert "torch.cos" in execution  # sin's derivative, computed by the compiled backward


@given(tst.programs(), tst.program_inputs(dtypes=(torch.float64,)))
def test_grad_of_random_programs_matches_torch_autograd(program, inputs):
    """grad(jit(f)) == jit(grad(f)) == torch.autograd on randomly composed programs."""
    scalar = lambda *a: program(*a).sum()  # noqa: E731
    try:
        expected = _torch_grad(scalar, *inputs)
    except RuntimeError:
        assume(False)
    expected = [torch.zeros_like(x) if e is None else e for x, e in zip(inputs, expected)]
    for transformed in (tf.grad(scalar, argnums=(0, 1)), tf.jit(tf.grad(scalar, argnums=(0, 1))),
                        tf.grad(tf.jit(scalar), argnums=(0, 1))):
        for got, e in zip(transformed(*inputs), expected):
            torch.testing.assert_close(got, e, equal_nan=True)


def test_gradient_of_a_random_opaque_op_uses_the_forwards_draws():
    """dropout2d has no thunderfn symbol: torch re-runs it in the backward, from the generator state
    the forward ran with, so the gradient's mask is the output's mask."""
    x = torch.randn(4, 8, 5, 5, dtype=torch.float64)
    out, vjp_fn = tf.vjp(lambda t: F.dropout2d(t, p=0.5, training=True), x)
    (g,) = vjp_fn(torch.ones_like(out))
    assert torch.equal(g != 0, out != 0)


def test_opaque_ops_with_integer_outputs_and_named_tuples_are_differentiated():
    x = torch.randn(3, 3, dtype=torch.float64)
    median = lambda t: torch.median(t, 1).values.sum()  # noqa: E731  (values and integer indices)
    qr = lambda t: torch.linalg.qr(t).Q.sum()  # noqa: E731  (a torch.return_types named tuple)
    for f in (median, qr):
        torch.testing.assert_close(tf.grad(f)(x), _torch_grad(f, x)[0])


def test_opaque_op_is_only_differentiated_with_respect_to_what_depends_on_the_inputs():
    x = torch.randn(3, 3, dtype=torch.float64)
    rtol = torch.tensor(0.1, dtype=torch.float64)
    f = lambda t: torch.linalg.pinv(t, rtol=rtol).sum()  # noqa: E731  (rtol is a constant: not differentiated)
    torch.testing.assert_close(tf.grad(f)(x), _torch_grad(f, x)[0])


@pytest.mark.parametrize("options", [{"padding_idx": 1}, {"padding_idx": -1}, {"scale_grad_by_freq": True},
                                     {"padding_idx": 0, "scale_grad_by_freq": True}],
                         ids=["padding_idx", "negative padding_idx", "scale_grad_by_freq", "both"])
def test_embedding_gradient_options_match_torch_in_one_backward_kernel(options):
    """These options only change embedding's gradient, which differentiating its gather would not give:
    the backward is aten's embedding_dense_backward with them, not embedding run again by torch.func."""
    w = torch.randn(4, 3, dtype=torch.float64)
    idx = torch.tensor([0, 1, 1, 3])
    f = lambda weight: F.embedding(idx, weight, **options).pow(2).sum()  # noqa: E731
    torch.testing.assert_close(tf.grad(f)(w), _torch_grad(f, w)[0])
    jitted = tf.jit(f)
    weight = w.clone().requires_grad_()
    jitted(weight).backward()
    torch.testing.assert_close(weight.grad, _torch_grad(f, w)[0])
    backward = str(tf.last_backward_traces(jitted)[-1])
    assert "aten_embedding_dense_backward" in backward and "torch_vjp" not in backward


TORCH_CONVENTIONS = {  # points where torch's backward formula picks a value a decomposition would not
    "hardswish_at_bounds": (F.hardswish, [-3.5, -3.0, -1.0, 3.0, 3.5]),
    "hardsigmoid_at_bounds": (F.hardsigmoid, [-3.5, -3.0, -1.0, 3.0, 3.5]),
    "hardtanh_at_bounds": (F.hardtanh, [-2.0, -1.0, 0.0, 1.0, 2.0]),
    "hardtanh_keyword_bounds": (lambda t: F.hardtanh(t, min_val=-0.5, max_val=2.0), [-1.0, -0.5, 0.0, 2.0, 3.0]),
    "relu6_at_bounds": (F.relu6, [-1.0, 0.0, 3.0, 6.0, 7.0]),
    "sigmoid_where_exp_overflows": (torch.sigmoid, [-float("inf"), -1000.0, 0.0, 1000.0]),
    "softplus_past_threshold": (F.softplus, [1000.0, 25.0, 20.0, 0.0, -1000.0]),
    "softplus_beta_threshold": (lambda t: F.softplus(t, beta=2.0, threshold=5.0), [1.0, 2.5, 3.0, -1.0]),
}


@pytest.mark.parametrize("fn, points", TORCH_CONVENTIONS.values(), ids=TORCH_CONVENTIONS.keys())
def test_gradient_follows_torchs_convention_at_kinks_and_overflow(fn, points):
    x = torch.tensor(points, dtype=torch.float64)
    f = lambda t: fn(t).sum()  # noqa: E731
    torch.testing.assert_close(tf.grad(f)(x), _torch_grad(f, x)[0])


def test_second_derivative_through_a_torch_level_rule():
    x = torch.randn(5, dtype=torch.float64)
    f = lambda t: torch.sigmoid(t).sum()  # noqa: E731
    second = tf.grad(lambda t: tf.grad(f)(t).sum())(x)
    y = torch.sigmoid(x)
    torch.testing.assert_close(second, y * (1 - y) * (1 - 2 * y))


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_gradient_of_a_product_over_an_empty_dimension_is_empty_like_torchs(dim):
    x = torch.randn(0, 3, dtype=torch.float64)
    f = (lambda t: t.prod()) if dim is None else (lambda t: t.prod(dim).sum())
    leaf = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(f(leaf), leaf)
    torch.testing.assert_close(tf.grad(f)(x), expected)


@pytest.mark.parametrize("how", ["jvp", "vjp inside", "vjp_fn made outside", "grad"])
def test_differentiating_with_respect_to_a_captured_tensor_inside_jit_is_not_zero(how):
    # the captured tensor is a constant of the trace; its derivative must still be taken (it was silently 0/None)
    def f(x):
        return torch.sin(x) * 3

    x = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    _, vjp_fn = tf.vjp(f, x)
    body = {
        "jvp": lambda t: tf.jvp(f, (x,), (t,))[1],
        "vjp inside": lambda t: tf.vjp(f, x)[1](t)[0],
        "vjp_fn made outside": lambda t: vjp_fn(t)[0],
        "grad": lambda t: tf.grad(lambda z: f(z).sum())(x) * t,
    }[how]
    torch.testing.assert_close(tf.jit(body)(torch.ones(3, dtype=torch.float64)), 3 * torch.cos(x))


# -- where torch.func answers, so does thunderfn ---------------------------------------------------
@pytest.mark.parametrize("constant",
                         [lambda t: torch.tensor(1.0), lambda t: torch.ones(()), lambda t: t.detach().sum()],
                         ids=["torch_tensor", "ones", "detached"])
def test_grad_of_a_scalar_that_ignores_the_input_is_zeros(constant):
    for x in (torch.tensor(0.5), torch.ones(3)):
        torch.testing.assert_close(tf.grad(constant)(x), torch.func.grad(constant)(x))
        torch.testing.assert_close(tf.vjp(constant, x)[1](torch.tensor(1.0)),
                                   torch.func.vjp(constant, x)[1](torch.tensor(1.0)))


@pytest.mark.parametrize("transform", [tf.grad, tf.value_and_grad])
def test_argnums_out_of_range_is_a_named_error_as_torch_func(transform):
    f = lambda a, b: a * b  # noqa: E731
    x = torch.tensor(0.5)
    with pytest.raises(RuntimeError, match="Got argnum=-3, but only 2 positional inputs"):
        torch.func.grad(f, argnums=-3)(x, x)
    for bad in (-3, 2, (0, 5)):
        with pytest.raises(tf.errors.TransformArgumentError, match=r"Got argnum=-?\d, but only 2 positional inputs"):
            transform(f, argnums=bad)(x, x)
    got = tf.grad(f, argnums=-1)(x, 2 * x)
    torch.testing.assert_close(got, torch.func.grad(f, argnums=-1)(x, 2 * x))
    assert tf.grad(lambda a, s: a * s ** 2, argnums=-1)(x, 3.0).item() == 3.0  # a float at a negative argnum


def test_vjp_fn_result_is_differentiable_by_torch_autograd_as_torch_funcs():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    ct = torch.randn(3, dtype=torch.float64)
    ours = tf.vjp(_F, x)[1](ct)[0]
    theirs = torch.func.vjp(_F, x)[1](ct)[0]
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), x)[0], torch.autograd.grad(theirs.sum(), x)[0])


def test_an_empty_slice_adds_no_zeros_to_the_backward_and_gradients_stay_eagers():
    """Rotary embeddings rotate x[..., :n] and cat x[..., n:] back, which is empty when n is the
    head size: the cotangent through the empty piece is zero, and costs no narrow, pad or add."""
    def rope_like(x):
        rotated, rest = x[..., :4] * 2, x[..., 4:]
        return torch.cat((rotated, rest), -1).sin().sum()

    x = torch.randn(2, 4, requires_grad=True)
    jitted = tf.jit(rope_like)
    jitted(x).backward()
    got, x.grad = x.grad, None
    rope_like(x).backward()
    torch.testing.assert_close(got, x.grad)
    backward = str(tf.last_backward_traces(jitted)[-1])
    assert "pad" not in backward and "narrow" not in backward
