"""custom_vjp: a user's gradient replaces autodiff of the body, composes with jit and grad, holds in
eager calls that torch.autograd differentiates, and mistakes in fwd/bwd are reported naming the
function and the position."""
import gc
import weakref

import pytest
import torch
from hypothesis import given

import thunderfn as tf
from thunderfn.testing import strategies as tst


def _sin_times(x):
    return torch.sin(x) * x


sin_times = tf.custom_vjp(_sin_times)
sin_times.defvjp(lambda x: (_sin_times(x), x), lambda x, g: (g * (torch.cos(x) * x + torch.sin(x)),))


@given(tst.tensors(dtypes=(torch.float64,)))
def test_custom_vjp_with_the_true_derivative_equals_autodiff_of_its_body(x):
    expected = tf.grad(lambda t: _sin_times(t).sum())(x)
    torch.testing.assert_close(tf.grad(lambda t: sin_times(t).sum())(x), expected)


@tf.custom_vjp
def clipped(x, lo, hi):
    return x * 1


clipped.defvjp(lambda x, lo, hi: (x * 1, (lo, hi)), lambda res, g: (g.clamp(*res), None, None))


def test_the_custom_rule_replaces_autodiff():
    x = torch.randn(4, dtype=torch.float64)
    g = tf.grad(lambda t: (clipped(t, -0.1, 0.1) * 5).sum())(x)
    torch.testing.assert_close(g, torch.full((4,), 0.1, dtype=torch.float64))


def test_outside_transforms_the_function_itself_runs():
    x = torch.randn(3)
    torch.testing.assert_close(clipped(x, -1, 1), x)
    torch.testing.assert_close(tf.jit(lambda t: clipped(t, -1, 1))(x), x)


def test_custom_vjp_composes_with_jit_and_grad_of_grad():
    x = torch.randn(3, dtype=torch.float64)
    first = lambda t: tf.grad(lambda u: sin_times(u).sum())(t)  # noqa: E731
    torch.testing.assert_close(tf.jit(first)(x), torch.cos(x) * x + torch.sin(x))
    second = tf.grad(lambda t: first(t).sum())(x)  # bwd is traced, so it is differentiated too
    torch.testing.assert_close(second, 2 * torch.cos(x) - torch.sin(x) * x)


def test_grad_of_grad_differentiates_residuals_fwd_computed():
    """bwd reads cos(x), which fwd computed: the second derivative flows through it back into fwd (a
    residual's cotangent was once dropped, giving 0 here), and a residual that is an output or an
    argument itself is counted once."""
    @tf.custom_vjp
    def sin(x, scale):
        return torch.sin(x) * scale

    def fwd(x, scale):
        out = torch.sin(x) * scale
        return out, (torch.cos(x) * scale, out, x, scale)

    sin.defvjp(fwd, lambda res, g: (g * res[0], (g * res[1] / res[3]).sum()))
    x, scale = torch.randn(3, dtype=torch.float64), torch.tensor(1.5, dtype=torch.float64)

    def first(x, scale):
        dx, dscale = tf.grad(lambda x, s: sin(x, s).sum(), argnums=(0, 1))(x, scale)
        return (dx * dx).sum() + dscale * x.sum()

    def reference(x, scale):
        dx, dscale = torch.autograd.grad((torch.sin(x) * scale).sum(), (x, scale), create_graph=True)
        return (dx * dx).sum() + dscale * x.sum()

    got = tf.grad(first, argnums=(0, 1))(x, scale)
    leaves = [x.clone().requires_grad_(), scale.clone().requires_grad_()]
    torch.testing.assert_close(got, torch.autograd.grad(reference(*leaves), leaves))


def test_nondiff_argnums_are_passed_to_bwd_first():
    @tf.custom_vjp
    def apply(activation, x):
        return activation(x)

    apply.nondiff_argnums = (0,)
    apply.defvjp(lambda act, x: (act(x), x), lambda act, x, g: (g * 2,))
    g = tf.grad(lambda t: apply(torch.tanh, t).sum())(torch.randn(3))
    torch.testing.assert_close(g, torch.full((3,), 2.0))


def test_pytree_arguments_get_pytree_cotangents():
    @tf.custom_vjp
    def product(d):
        return d["a"] * d["b"]

    product.defvjp(lambda d: (d["a"] * d["b"], d), lambda d, g: ({"a": g * d["b"], "b": g * d["a"]},))
    d = {"a": torch.tensor(3.0), "b": torch.tensor(4.0)}
    g = tf.grad(product)(d)
    torch.testing.assert_close(g["a"], torch.tensor(4.0))
    torch.testing.assert_close(g["b"], torch.tensor(3.0))


def _broken(bwd):
    f = tf.custom_vjp(lambda x, y: x * y)
    f.__name__ = "broken"
    f.defvjp(lambda x, y: (x * y, (x, y)), bwd)
    return f


@pytest.mark.parametrize("bwd, error, match", [
    (lambda res, g: (g,), TypeError, r"'<lambda>': bwd returned 1 cotangents, but the function has 2 differentiable"),
    (lambda res, g: g, TypeError, "bwd must return a tuple"),
    (lambda res, g: (g.sum(), None), ValueError, r"argument 0 has shape \(\), but the argument has shape \(3,\)"),
    (lambda res, g: ((g,), None), TypeError, "argument 0 has structure"),
], ids=["count", "not-a-tuple", "shape", "structure"])
def test_bwd_mistakes_name_the_function_and_position(bwd, error, match):
    f = _broken(bwd)
    with pytest.raises(error, match=match):
        tf.grad(lambda x, y: f(x, y).sum())(torch.randn(3), torch.randn(3))


def test_a_traced_tensor_in_nondiff_argnums_is_refused():
    f = tf.custom_vjp(lambda x, y: x * y, nondiff_argnums=(1,))
    f.defvjp(lambda x, y: (x * y, y), lambda y, res, g: (g * res,))
    with pytest.raises(TypeError, match="argument 1 is in nondiff_argnums but holds a traced tensor"):
        tf.grad(lambda x, y: f(x, y).sum())(torch.randn(3), torch.randn(3))


def test_calling_before_defvjp_is_refused_while_tracing():
    f = tf.custom_vjp(lambda x: x * 2)
    with pytest.raises(TypeError, match="defvjp"):
        tf.jit(f)(torch.randn(2))


@pytest.mark.parametrize("transform", ["jvp", "jacfwd", "hessian"])
def test_forward_mode_refuses_a_custom_vjp_and_points_to_custom_jvp(transform):
    """JAX refuses too: differentiating fwd's body would silently ignore the rule (jacfwd != jacrev)."""
    x = torch.tensor([0.3, 0.7], dtype=torch.float64)
    run = {"jvp": lambda: tf.jvp(sin_times, (x,), (x,)), "jacfwd": lambda: tf.jacfwd(sin_times)(x),
           "hessian": lambda: tf.hessian(lambda t: sin_times(t).sum())(x)}[transform]
    with pytest.raises(tf.errors.ForwardModeError, match=r"'_sin_times', a tf.custom_vjp function.*tf.custom_jvp") as e:
        run()
    assert isinstance(e.value, TypeError)
    tf.jacrev(tf.jacrev(lambda t: sin_times(t).sum()))(x)  # the reverse-mode Hessian it suggests works


def test_custom_vjp_with_options_is_a_decorator_too():
    @tf.custom_vjp(nondiff_argnums=(0,))
    def scaled(factor, x):
        return x * 1.0

    scaled.defvjp(lambda factor, x: (x * 1.0, None), lambda factor, residuals, g: (g * factor,))
    assert isinstance(scaled, tf.custom_vjp) and scaled.nondiff_argnums == (0,)
    torch.testing.assert_close(tf.grad(lambda x: scaled(5.0, x).sum())(torch.ones(2)), torch.full((2,), 5.0))


@pytest.mark.parametrize("transform", ["grad", "jit-backward"])
def test_a_rule_for_an_identity_is_the_only_gradient_that_reaches_the_argument(transform):
    # fwd returns its argument itself (gradient clipping, straight-through): only the rule differentiates it
    @tf.custom_vjp(nondiff_argnums=(0,))
    def clip_gradient(limit, x):
        return x

    clip_gradient.defvjp(lambda limit, x: (x, None), lambda limit, residuals, g: (g.clamp(-limit, limit),))
    loss = lambda x: (clip_gradient(0.5, x) * 3).sum()  # noqa: E731
    x = torch.ones(2)
    if transform == "grad":
        got = tf.grad(loss)(x)
    else:
        x.requires_grad_()
        tf.jit(loss)(x).backward()
        got = x.grad
    torch.testing.assert_close(got, torch.full((2,), 0.5))


def test_fwd_may_call_the_function_itself():
    # JAX's own examples write `def f_fwd(x): return f(x), x`: inside its fwd the function is its primal
    @tf.custom_vjp
    def softplus(x):
        return torch.nn.functional.softplus(x)

    softplus.defvjp(lambda x: (softplus(x), x), lambda x, g: (g * torch.sigmoid(x),))
    x = torch.randn(5, dtype=torch.float64)
    loss = lambda x: softplus(x).sum()  # noqa: E731
    torch.testing.assert_close(tf.grad(loss)(x), torch.sigmoid(x))
    torch.testing.assert_close(tf.jit(tf.grad(loss))(x), torch.sigmoid(x))
    s = torch.sigmoid(x)
    torch.testing.assert_close(tf.jacrev(tf.grad(loss))(x), torch.diag(s * (1 - s)))
    leaf = x.clone().requires_grad_()
    softplus(leaf).sum().backward()  # eager, differentiated by torch.autograd through the rule
    torch.testing.assert_close(leaf.grad, torch.sigmoid(x))


# -- called eagerly: the rule holds where torch.autograd differentiates, else the function runs ---
def _straight_through_round():
    def st_round(x, scale):
        return torch.round(x * scale) / scale

    rounded = tf.custom_vjp(st_round, nondiff_argnums=(1,))
    rounded.defvjp(lambda x, scale: (st_round(x, scale), None), lambda scale, res, g: (g,))
    return rounded


def test_custom_vjp_rule_holds_when_called_eagerly_with_tensors_requiring_grad():
    st_round = _straight_through_round()
    x = torch.randn(5)
    grads = []
    for call in (st_round, tf.jit(st_round)):
        leaf = x.clone().requires_grad_()
        (call(leaf, 4.0) * torch.arange(5.0)).sum().backward()
        grads.append(leaf.grad)
    via_grad = tf.grad(lambda t: (st_round(t, 4.0) * torch.arange(5.0)).sum())(x)
    torch.testing.assert_close(grads[0], torch.arange(5.0))  # the rule, not round's zero derivative
    torch.testing.assert_close(grads[1], grads[0])
    torch.testing.assert_close(via_grad, grads[0])


def test_custom_vjp_without_grad_runs_the_primal_function():
    calls = []

    @tf.custom_vjp
    def f(x):
        calls.append("fn")
        return x * 2

    f.defvjp(lambda x: (calls.append("fwd") or x * 2, None), lambda res, g: (g * 2,))
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 2)
    with torch.no_grad():
        f(x.requires_grad_())
    assert calls == ["fn", "fn"]


# -- fwd calling the function itself, under every transform (thunderfn issue 38) -------------------
def _jax_example(scale=1):
    """JAX's own custom_vjp example, whose fwd calls f itself; `scale` multiplies the rule's
    cotangent for x, so a result that is the rule's, not autodiff of the body, is visible."""
    @tf.custom_vjp
    def f(x, y):
        return torch.sin(x) * y

    def f_fwd(x, y):
        return f(x, y), (torch.cos(x), torch.sin(x), y)

    def f_bwd(res, g):
        cos_x, sin_x, y = res
        return (scale * cos_x * g * y, sin_x * g)

    f.defvjp(f_fwd, f_bwd)
    return f


def _sin_times_y(x, y):
    return torch.sin(x) * y


_per_example_grads = torch.func.vmap(torch.func.grad(lambda x, y: _sin_times_y(x, y).sum(), argnums=(0, 1)))


@pytest.mark.parametrize("jitted", [False, True])
@pytest.mark.parametrize("transform", ["vmap", "vmap(grad)", "grad(vmap)", "vmap(vmap)"])
def test_fwd_calling_the_function_itself_under_vmap_and_its_compositions(transform, jitted):
    f = _jax_example()
    x, y = tst.make((3, 4), torch.float64, 0), tst.make((3, 4), torch.float64, 1)
    run, expected = {
        "vmap": (tf.vmap(f), lambda x, y: torch.func.vmap(_sin_times_y)(x, y)),
        "vmap(grad)": (tf.vmap(tf.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1))), _per_example_grads),
        "grad(vmap)": (tf.grad(lambda x, y: tf.vmap(f)(x, y).sum()), lambda x, y: torch.cos(x) * y),
        "vmap(vmap)": (tf.vmap(tf.vmap(f)), lambda x, y: torch.func.vmap(torch.func.vmap(_sin_times_y))(x, y)),
    }[transform]
    got = (tf.jit(run) if jitted else run)(x, y)
    torch.testing.assert_close(got, expected(x, y))


def test_under_vmap_a_fwd_calling_the_function_itself_still_uses_the_rule():
    f = _jax_example(scale=3)  # the rule: 3x the true derivative in x
    x, y = tst.make((3, 4), torch.float64, 0), tst.make((3, 4), torch.float64, 1)
    per_example = tf.vmap(tf.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1)))(x, y)
    torch.testing.assert_close(per_example, (3 * torch.cos(x) * y, torch.sin(x)))
    torch.testing.assert_close(tf.grad(lambda x: tf.vmap(f)(x, y).sum())(x), 3 * torch.cos(x) * y)


def test_forward_mode_refuses_a_fwd_calling_the_function_itself_under_vmap_too():
    f = _jax_example()
    x, y = tst.make((3, 4), torch.float64, 0), tst.make((3, 4), torch.float64, 1)
    for run in (lambda: tf.jvp(f, (x, y), (x, y)), lambda: tf.jvp(tf.vmap(f), (x, y), (x, y)),
                lambda: tf.vmap(lambda x, y: tf.jvp(f, (x, y), (x, y))[1])(x, y)):
        with pytest.raises(tf.errors.ForwardModeError, match="tf.custom_jvp"):
            run()


def test_the_docs_softplus_under_vmap_of_grad():
    # docs/testing.md's example: fwd calls softplus itself
    @tf.custom_vjp
    def softplus(x):
        return torch.nn.functional.softplus(x)

    softplus.defvjp(lambda x: (softplus(x), x), lambda x, g: (g * torch.sigmoid(x),))
    x = tst.make((4, 5), torch.float64, 0)
    torch.testing.assert_close(tf.vmap(tf.grad(lambda t: softplus(t).sum()))(x), torch.sigmoid(x))
    torch.testing.assert_close(tf.grad(lambda t: tf.vmap(softplus)(t).sum())(x), torch.sigmoid(x))


@pytest.mark.parametrize("transform", ["jit", "grad", "vmap", "vmap(grad)"])
def test_an_error_in_fwd_leaves_no_state_behind(transform):
    """Were fwd's mark left set, the next traced call would be the primal and autodiff of the body
    would silently replace the rule (here 3x the true derivative)."""
    failing = [True]

    @tf.custom_vjp
    def f(x):
        return torch.sin(x)

    def f_fwd(x):
        if failing[0]:
            raise ValueError("fwd failed")
        return f(x), x

    f.defvjp(f_fwd, lambda x, g: (3 * g * torch.cos(x),))
    x = tst.make((3, 4), torch.float64, 0)
    loss = lambda t: f(t).sum()  # noqa: E731
    run = {"jit": tf.jit(f), "grad": tf.grad(loss), "vmap": tf.vmap(f), "vmap(grad)": tf.vmap(tf.grad(loss))}[transform]
    with pytest.raises(ValueError, match="fwd failed"):
        run(x)
    assert tf.core.context.tracer_stack() == []
    failing[0] = False
    torch.testing.assert_close(tf.grad(loss)(x), 3 * torch.cos(x))
    torch.testing.assert_close(tf.vmap(tf.grad(loss))(x), 3 * torch.cos(x))


def test_redefining_the_rule_after_vmap_used_it_takes_the_new_rule():
    # vmap keeps each custom_vjp's batched form: it must follow defvjp, fwd and bwd alike
    @tf.custom_vjp
    def f(x):
        return torch.sin(x)

    f.defvjp(lambda x: (f(x), (torch.cos(x),)), lambda res, g: (res[0] * g,))
    x = tst.make((3, 4), torch.float64, 0)
    batched_grad = lambda: tf.grad(lambda t: tf.vmap(f)(t).sum())(x)  # noqa: E731
    torch.testing.assert_close(batched_grad(), torch.cos(x))
    f.defvjp(lambda x: (f(x), (2 * torch.cos(x),)), lambda res, g: (res[0] * g,))  # a new fwd, the same bwd
    torch.testing.assert_close(batched_grad(), 2 * torch.cos(x))
    f.defvjp(lambda x: (f(x), (torch.cos(x),)), lambda res, g: (5 * res[0] * g,))
    torch.testing.assert_close(batched_grad(), 5 * torch.cos(x))
    torch.testing.assert_close(tf.vmap(tf.grad(lambda t: f(t).sum()))(x), 5 * torch.cos(x))


def _used_under_vmap_and_grad() -> list:
    """Weak references to a custom_vjp and a custom_jvp that grad(vmap(.)) used, and nothing else holds."""
    x = tst.make((3, 4), torch.float64, 0)
    f = _jax_example()
    tf.grad(lambda t: tf.vmap(f)(t, t).sum())(x)

    @tf.custom_jvp
    def g(x):
        return torch.sin(x)

    g.defjvp(lambda primals, tangents: (g(*primals), torch.cos(primals[0]) * tangents[0]))
    tf.grad(lambda t: tf.vmap(g)(t).sum())(x)
    return [weakref.ref(f), weakref.ref(g)]


def test_a_custom_vjp_or_custom_jvp_vmap_batched_goes_away_with_its_last_user():
    # vmap keeps each one's batched forms while it lives; the forms must not keep it alive themselves
    alive = _used_under_vmap_and_grad()
    gc.collect()
    assert [r() for r in alive] == [None, None]
