"""custom_jvp: a user's forward-mode rule is the derivative every transform sees (jvp, jacfwd,
and reverse mode by differentiating the rule: grad, vjp, jacrev, hessian), composes with jit,
vmap and higher derivatives, and mistakes in the rule are reported naming the function."""
import pytest
import torch
from hypothesis import given

import thunderfn as tf
from thunderfn.testing import strategies as tst


@tf.custom_jvp
def scaled_sin(x, y):
    return torch.sin(x) * y


@scaled_sin.defjvp
def scaled_sin_jvp(primals, tangents):  # ten times the true derivative in x: visibly the rule's
    x, y = primals
    x_dot, y_dot = tangents
    return scaled_sin(x, y), 10 * torch.cos(x) * y * x_dot + torch.sin(x) * y_dot


def _rule_grad_x(x, y):
    return 10 * torch.cos(x) * y


@pytest.fixture
def xy():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)


def test_rule_is_defjvps_decorator_and_the_function_runs_as_itself(xy):
    assert scaled_sin_jvp.__name__ == "scaled_sin_jvp"
    torch.testing.assert_close(scaled_sin(*xy), torch.sin(xy[0]) * xy[1])


def test_jvp_uses_the_rule(xy):
    x, y = xy
    out, t = tf.jvp(scaled_sin, (x, y), (torch.ones_like(x), torch.zeros_like(y)))
    torch.testing.assert_close(out, torch.sin(x) * y)
    torch.testing.assert_close(t, _rule_grad_x(x, y))


@given(tst.tensors(dtypes=(torch.float64,)))
def test_jacfwd_equals_jacrev_through_the_rule(x):
    y = torch.ones_like(x) * 2
    fwd, rev = tf.jacfwd(scaled_sin, argnums=(0, 1))(x, y), tf.jacrev(scaled_sin, argnums=(0, 1))(x, y)
    torch.testing.assert_close(fwd, rev)
    n = x.numel()
    torch.testing.assert_close(rev[0].reshape(n, n), torch.diag(_rule_grad_x(x, y).reshape(-1)))


def test_reverse_mode_gives_the_rules_derivative(xy):
    x, y = xy
    gx, gy = tf.grad(lambda a, b: scaled_sin(a, b).sum(), argnums=(0, 1))(x, y)
    torch.testing.assert_close(gx, _rule_grad_x(x, y))
    torch.testing.assert_close(gy, torch.sin(x))
    ct = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(tf.vjp(scaled_sin, x, y)[1](ct)[0], ct * _rule_grad_x(x, y))


def test_second_derivatives_differentiate_the_rule(xy):
    x, y = xy
    f = lambda a: scaled_sin(a, y).sum()  # noqa: E731
    expected = torch.diag(-10 * torch.sin(x) * y)
    torch.testing.assert_close(tf.hessian(f)(x), expected)                    # forward over reverse
    torch.testing.assert_close(tf.jacrev(tf.jacrev(f))(x), expected)          # reverse over reverse
    torch.testing.assert_close(tf.jacfwd(tf.jacfwd(f))(x), expected)          # forward over forward
    torch.testing.assert_close(tf.grad(lambda a: tf.grad(f)(a).sum())(x), torch.diagonal(expected))


def test_composes_with_jit_and_torch_autograd(xy):
    x, y = xy
    torch.testing.assert_close(tf.jit(tf.grad(lambda a: scaled_sin(a, y).sum()))(x), _rule_grad_x(x, y))
    xr = x.clone().requires_grad_()
    scaled_sin(xr, y).sum().backward()  # eager, differentiated by torch.autograd: the rule holds there too
    torch.testing.assert_close(xr.grad, _rule_grad_x(x, y))


def test_vmap_keeps_the_rule(xy):
    x, y = xy
    xs = torch.stack([x, 2 * x])
    expected = torch.stack([_rule_grad_x(x, y), _rule_grad_x(2 * x, y)])
    torch.testing.assert_close(tf.vmap(tf.grad(lambda a: scaled_sin(a, y).sum()))(xs), expected)
    torch.testing.assert_close(tf.grad(lambda a: tf.vmap(lambda r: scaled_sin(r, y))(a).sum())(xs), expected)
    _, t = tf.jvp(tf.vmap(lambda r: scaled_sin(r, y)), (xs,), (torch.ones_like(xs),))
    torch.testing.assert_close(t, expected)
    for i in range(2):  # vmap(f)(x)[i] == f(x[i])
        torch.testing.assert_close(tf.vmap(lambda r: scaled_sin(r, y))(xs)[i], scaled_sin(xs[i], y))


def test_nondiff_argnums_come_first_in_the_rule(xy):
    x, _ = xy
    power = tf.custom_jvp(lambda n, t: t ** n, nondiff_argnums=(0,))
    power.defjvp(lambda n, primals, tangents: (primals[0] ** n, n * 100 * tangents[0]))
    torch.testing.assert_close(tf.grad(lambda t: power(3, t).sum())(x), torch.full_like(x, 300.0))
    torch.testing.assert_close(tf.jvp(lambda t: power(3, t), (x,), (x,))[1], 300 * x)


def test_pytree_arguments_and_outputs(xy):
    x, _ = xy

    @tf.custom_jvp
    def pair(d):
        return {"a": d["x"] * 2, "b": d["x"].sum()}

    pair.defjvp(lambda p, t: (pair(p[0]), {"a": 3 * t[0]["x"], "b": None}))  # None: a zero tangent
    torch.testing.assert_close(tf.jacrev(lambda v: pair({"x": v})["a"])(x), 3 * torch.eye(3, dtype=torch.float64))
    _, t = tf.jvp(lambda v: pair({"x": v}), (x,), (x,))
    torch.testing.assert_close(t, {"a": 3 * x, "b": torch.zeros((), dtype=torch.float64)})


def test_a_rule_of_the_wrong_shape_or_form_is_named(xy):
    x, _ = xy
    bad_shape = tf.custom_jvp(lambda t: t * 2)
    bad_shape.defjvp(lambda p, t: (p[0] * 2, torch.ones(5)))
    for transform in (lambda: tf.jvp(bad_shape, (x,), (x,)), lambda: tf.grad(lambda t: bad_shape(t).sum())(x)):
        with pytest.raises(ValueError, match=r"custom_jvp '<lambda>'.*shape \(5,\)"):
            transform()
    not_a_pair = tf.custom_jvp(lambda t: t * 2)
    not_a_pair.defjvp(lambda p, t: t[0] * 2)
    with pytest.raises(TypeError, match="must return a pair"):
        tf.jvp(not_a_pair, (x,), (x,))
    no_rule = tf.custom_jvp(lambda t: t * 2)
    with pytest.raises(TypeError, match="has no rule yet"):
        tf.grad(lambda t: no_rule(t).sum())(x)


def test_custom_jvp_with_options_is_a_decorator_too():
    @tf.custom_jvp(nondiff_argnums=(0,))
    def scaled(factor, x):
        return x * factor

    @scaled.defjvp
    def scaled_jvp(factor, primals, tangents):
        return scaled(factor, primals[0]), 3.0 * tangents[0]  # deliberately not the body's derivative

    assert isinstance(scaled, tf.custom_jvp) and scaled.nondiff_argnums == (0,)
    x = torch.ones(2)
    torch.testing.assert_close(tf.jvp(lambda t: scaled(5.0, t), (x,), (x,))[1], torch.full((2,), 3.0))
    torch.testing.assert_close(tf.grad(lambda t: scaled(5.0, t).sum())(x), torch.full((2,), 3.0))


def test_a_rule_calling_the_function_itself_holds_under_vmap_and_forward_mode():
    # JAX's own custom_jvp example: the rule's primal output is f(x, y), a call of f itself
    @tf.custom_jvp
    def f(x, y):
        return torch.sin(x) * y

    @f.defjvp
    def f_jvp(primals, tangents):  # 3x the true derivative in x: visibly the rule's
        x, y = primals
        x_dot, y_dot = tangents
        return f(x, y), 3 * torch.cos(x) * x_dot * y + torch.sin(x) * y_dot

    x, y, tx, ty = (tst.make((3, 4), torch.float64, seed) for seed in range(4))
    rule_t = 3 * torch.cos(x) * tx * y + torch.sin(x) * ty
    torch.testing.assert_close(tf.vmap(f)(x, y), torch.sin(x) * y)
    torch.testing.assert_close(tf.jvp(f, (x, y), (tx, ty))[1], rule_t)
    torch.testing.assert_close(tf.jvp(tf.vmap(f), (x, y), (tx, ty))[1], rule_t)
    torch.testing.assert_close(tf.vmap(lambda *a: tf.jvp(f, a[:2], a[2:])[1])(x, y, tx, ty), rule_t)
    per_example = tf.jit(tf.vmap(tf.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1))))(x, y)
    torch.testing.assert_close(per_example, (3 * torch.cos(x) * y, torch.sin(x)))
    torch.testing.assert_close(tf.grad(lambda x: tf.vmap(f)(x, y).sum())(x), 3 * torch.cos(x) * y)
