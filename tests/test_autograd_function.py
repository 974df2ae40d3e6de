"""torch.autograd.Function and torch.library custom ops with register_autograd inside traced code:
the user's backward is the gradient (eager values and gradients under tf.jit + backward(), tf.grad,
tf.vjp, grad of grad), ctx means what it means in eager, vmap and jvp follow torch.func's rules,
and what cannot be transformed is a named error, never a dropped backward."""
import importlib
import types

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import thunderfn as tf
from thunderfn.errors import BatchingError, UserGradientError
from thunderfn.testing.optional_libraries import why_unavailable
from thunderfn.transforms import user_functions


# -- Functions used below ------------------------------------------------------------------------
class WrongSquare(torch.autograd.Function):
    """A deliberately 'wrong' gradient (3 g x for x*x): a traced call must use it, not autodiff."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 3 * g * x


class WrongSquareNew(torch.autograd.Function):
    """The same, new style (forward without ctx, setup_context)."""
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 3 * g * x


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.scale * g, None


class Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return 2 * g


class StraightThroughRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, g):
        return g


class ScaledPair(torch.autograd.Function):
    """Tuple outputs, a Python number argument, a tensor ctx attribute, None for an input."""

    @staticmethod
    def forward(ctx, x, y, k):
        ctx.k = k
        ctx.y = y
        ctx.shape = x.shape
        return x * y * k, x.sin()

    @staticmethod
    def backward(ctx, g1, g2):
        return g1 * ctx.y * ctx.k + g2 * 7, None, None


def _rand(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def _eager_and_jit_grads(fn, *inputs):
    """(eager output, eager grads, jitted output, jitted grads) of fn(*inputs).sum().backward()."""
    a = [t.clone().requires_grad_() for t in inputs]
    b = [t.clone().requires_grad_() for t in inputs]
    out_e = fn(*a)
    out_e.sum().backward()
    out_j = tf.jit(fn)(*b)
    assert out_j.requires_grad
    out_j.sum().backward()
    return out_e, [t.grad for t in a], out_j, [t.grad for t in b]


# -- a deliberately wrong backward is the gradient, not autodiff of forward -----------------------
@pytest.mark.parametrize("fn_cls", [WrongSquare, WrongSquareNew])
def test_jit_output_requires_grad_and_backward_uses_the_functions_backward(fn_cls):
    w = _rand(3, 3)
    x = _rand(3, 3)
    out_e, grads_e, out_j, grads_j = _eager_and_jit_grads(lambda w: fn_cls.apply(x @ w), w)
    torch.testing.assert_close(out_j, out_e)
    torch.testing.assert_close(grads_j[0], grads_e[0])


@pytest.mark.parametrize("fn_cls", [WrongSquare, WrongSquareNew])
def test_grad_through_a_function_is_its_backward_not_zeros(fn_cls):
    w, x = _rand(3, 3), _rand(3, 3)
    expected = torch.autograd.grad(fn_cls.apply(x @ w.requires_grad_()).sum(), w)[0]
    got = tf.grad(lambda w: fn_cls.apply(x @ w).sum())(w.detach())
    torch.testing.assert_close(got, expected)
    assert got.abs().sum() > 0


def test_a_mixed_path_keeps_the_functions_contribution():
    w, x = _rand(3, 3), _rand(3, 3)

    def f(w):
        y = x @ w
        return WrongSquare.apply(y).sum() + (y * 2).sin().sum()

    _, grads_e, _, grads_j = _eager_and_jit_grads(lambda w: f(w).reshape(1), w)
    torch.testing.assert_close(grads_j[0], grads_e[0])
    torch.testing.assert_close(tf.grad(f)(w), grads_e[0])


class LeavesGradModeOn(torch.autograd.Function):
    """A forward that switches grad mode off, computes, and leaves it on (as Dynamo's captured
    forwards do): in eager, apply gives the caller its own mode back."""

    @staticmethod
    def forward(ctx, x):
        torch._C._set_grad_enabled(False)
        y = x * 2
        torch._C._set_grad_enabled(True)
        return y

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_a_grad_mode_switch_left_by_a_functions_forward_ends_with_it():
    def f(x):
        y = LeavesGradModeOn.apply(x)
        with torch.no_grad():
            z = y * 3  # under no_grad, after the Function: no gradient flows through z
        return (y + z).sum()

    x, xe = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    with torch.no_grad():
        xe.copy_(x)
    tf.jit(f)(x).backward()
    f(xe).backward()
    torch.testing.assert_close(x.grad, xe.grad)


def test_gradient_reversal_gives_the_negated_scaled_gradient():
    x = _rand(4)
    got = tf.grad(lambda x: (GradReverse.apply(x, 0.5) * x).sum())(x)
    # d/dx of (r(x) * x) with r's backward -0.5 g: x * (-0.5) + r(x)
    torch.testing.assert_close(got, -0.5 * x + x)
    _, grads_e, out_j, grads_j = _eager_and_jit_grads(lambda x: GradReverse.apply(x, 0.5) * 3, x)
    torch.testing.assert_close(grads_j[0], grads_e[0])


def test_an_output_that_is_the_input_gets_the_functions_gradient():
    x = _rand(3)
    torch.testing.assert_close(tf.grad(lambda x: Identity.apply(x).sum())(x), torch.full((3,), 2.0, dtype=x.dtype))
    torch.testing.assert_close(tf.grad(lambda x: (Identity.apply(x) + x).sum())(x),
                               torch.full((3,), 3.0, dtype=x.dtype))


def test_straight_through_estimator_passes_the_gradient_round_does_not():
    x = _rand(5)
    torch.testing.assert_close(tf.grad(lambda x: (StraightThroughRound.apply(x) * x).sum())(x),
                               torch.round(x) + x)


def test_tuple_outputs_number_arguments_and_tensor_ctx_attributes():
    x, y = _rand(3), _rand(3)

    def f(x, y):
        a, b = ScaledPair.apply(x, y, 2.5)
        return (a * b).sum()

    xe, ye = x.clone().requires_grad_(), y.clone().requires_grad_()
    f(xe, ye).backward()
    gx, gy = tf.grad(f, argnums=(0, 1))(x, y)
    torch.testing.assert_close(gx, xe.grad)
    torch.testing.assert_close(gy, torch.zeros_like(y))  # backward returned None for y: no gradient, as eager
    assert ye.grad is None
    torch.testing.assert_close(tf.vjp(lambda x: ScaledPair.apply(x, y, 2.5)[0], x)[1](torch.ones(3, dtype=x.dtype))[0],
                               y * 2.5)


def test_function_inside_a_module_under_jit_module():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4).double()

        def forward(self, x):
            return GradReverse.apply(WrongSquare.apply(self.lin(x)), 1.0).sum()

    torch.manual_seed(0)
    net = Net()
    x = _rand(2, 4)
    net(x).backward()
    expected = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    tf.jit(net)(x).backward()
    for p, e in zip(net.parameters(), expected):
        torch.testing.assert_close(p.grad, e)


# -- grad of grad -------------------------------------------------------------------------------
class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 3 * g * x * x


class CubeOnce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 3 * g * x * x


def test_grad_of_grad_differentiates_the_users_backward():
    x = torch.tensor(1.5, dtype=torch.float64)
    torch.testing.assert_close(tf.grad(tf.grad(lambda x: Cube.apply(x)))(x), 6 * x)
    xe = x.clone().requires_grad_()
    g, = torch.autograd.grad(Cube.apply(xe), xe, create_graph=True)
    torch.testing.assert_close(tf.grad(tf.grad(lambda x: Cube.apply(x)))(x), torch.autograd.grad(g, xe)[0])


def test_once_differentiable_works_once_and_refuses_twice():
    x = torch.tensor(1.5, dtype=torch.float64)
    torch.testing.assert_close(tf.grad(lambda x: CubeOnce.apply(x))(x), 3 * x * x)
    with pytest.raises(UserGradientError, match="once_differentiable"):
        tf.grad(tf.grad(lambda x: CubeOnce.apply(x)))(x)


# -- ctx -----------------------------------------------------------------------------------------
def test_needs_input_grad_says_which_inputs_are_differentiated():
    seen = []

    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, g):
            seen.append(ctx.needs_input_grad)
            a, b = ctx.saved_tensors
            return (g * b if ctx.needs_input_grad[0] else None), (g * a if ctx.needs_input_grad[1] else None)

    a, b = _rand(3), _rand(3)
    torch.testing.assert_close(tf.grad(lambda a: Mul.apply(a, b).sum())(a), b)
    assert seen[-1] == (True, False)
    torch.testing.assert_close(tf.grad(lambda b: Mul.apply(a, b).sum())(b), a)
    assert seen[-1] == (False, True)
    ga, gb = tf.grad(lambda a, b: Mul.apply(a, b).sum(), argnums=(0, 1))(a, b)
    assert seen[-1] == (True, True)
    torch.testing.assert_close((ga, gb), (b, a))


def test_mark_non_differentiable_outputs_get_no_gradient():
    class SortWithIndex(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            values, idx = torch.sort(x)
            ctx.mark_non_differentiable(idx)
            ctx.save_for_backward(idx)
            return values, idx

        @staticmethod
        def backward(ctx, g, g_idx):
            idx, = ctx.saved_tensors
            assert g_idx is None or not g_idx.any() if isinstance(g_idx, torch.Tensor) else True
            return torch.zeros_like(g).scatter(0, idx, g)

    x = _rand(5)
    xe = x.clone().requires_grad_()
    v, i = SortWithIndex.apply(xe)
    (v * torch.arange(5.0, dtype=x.dtype)).sum().backward()
    got = tf.grad(lambda x: (SortWithIndex.apply(x)[0] * torch.arange(5.0, dtype=x.dtype)).sum())(x)
    torch.testing.assert_close(got, xe.grad)


@pytest.mark.parametrize("materialize", [True, False])
def test_set_materialize_grads_gives_zeros_or_none(materialize):
    got = []

    class Two(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(materialize)
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, g1, g2):
            got.append(g2)
            return 2 * g1 + (0 if g2 is None else 3 * g2)

    x = _rand(3)
    torch.testing.assert_close(tf.grad(lambda x: Two.apply(x)[0].sum())(x), torch.full((3,), 2.0, dtype=x.dtype))
    assert (got[-1] is None) is (not materialize)


def test_mark_dirty_is_refused_by_name():
    class AddOneInPlace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(UserGradientError, match="in place"):
        tf.jit(lambda x: AddOneInPlace.apply(x * 1))(torch.randn(3))


def test_a_tensor_hidden_in_an_object_on_ctx_is_a_named_error():
    class Hidden(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.box = types.SimpleNamespace(t=x.sin())
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * ctx.box.t

    with pytest.raises(UserGradientError, match="SimpleNamespace"):
        tf.grad(lambda x: Hidden.apply(x).sum())(torch.randn(3))


def test_a_backward_returning_too_few_gradients_is_a_named_error():
    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(UserGradientError, match="returned 1 gradients"):
        tf.grad(lambda x: Bad.apply(x, x).sum())(torch.randn(3))


def test_a_broadcast_gradient_is_summed_to_the_input_shape_as_torch_does():
    class Expand(torch.autograd.Function):
        @staticmethod
        def forward(ctx, b):
            return b * 1

        @staticmethod
        def backward(ctx, g):
            return g.expand(4, 3)

    b = _rand(3)
    torch.testing.assert_close(tf.grad(lambda b: Expand.apply(b).sum())(b), torch.full((3,), 4.0, dtype=b.dtype))


def test_a_backward_returning_a_captured_tensor_uses_it():
    const = torch.full((3,), 2.0)

    class ConstantGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 5

        @staticmethod
        def backward(ctx, g):
            return const

    torch.testing.assert_close(tf.grad(lambda x: ConstantGradient.apply(x).sum())(torch.ones(3)), const)


def test_keyword_arguments_of_apply():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(x, k=2.0):
            return x * k

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.k = inputs[1]

        @staticmethod
        def backward(ctx, g):
            return g * ctx.k * 10, None

    x = _rand(3)
    torch.testing.assert_close(tf.grad(lambda x: Scale.apply(x, k=3.0).sum())(x), torch.full((3,), 30.0, dtype=x.dtype))


# -- vmap and jvp -------------------------------------------------------------------------------
def test_vmap_with_generate_vmap_rule_batches_forward_and_backward():
    xs = _rand(4, 3)
    torch.testing.assert_close(tf.vmap(WrongSquareNew.apply)(xs), xs * xs)
    torch.testing.assert_close(tf.vmap(tf.grad(lambda x: WrongSquareNew.apply(x).sum()))(xs), 3 * xs)
    torch.testing.assert_close(tf.grad(lambda xs: tf.vmap(WrongSquareNew.apply)(xs).sum())(xs), 3 * xs)
    expected = torch.func.vmap(torch.func.grad(lambda x: WrongSquareNew.apply(x).sum()))(xs)
    torch.testing.assert_close(tf.vmap(tf.grad(lambda x: WrongSquareNew.apply(x).sum()))(xs), expected)


class SquareWithVmap(WrongSquareNew):
    """WrongSquareNew's forward and backward, with its own vmap and jvp rules."""
    generate_vmap_rule = False

    @staticmethod
    def vmap(info, in_dims, x):
        calls.append((info.batch_size, in_dims))
        return SquareWithVmap.apply(x), in_dims[0]

    @staticmethod
    def jvp(ctx, t):
        x, = ctx.saved_tensors
        return 5 * x * t


calls = []


def test_vmap_uses_the_vmap_staticmethod():
    xs = _rand(4, 3)
    calls.clear()
    torch.testing.assert_close(tf.vmap(SquareWithVmap.apply)(xs), xs * xs)
    assert calls == [(4, (0,))]
    torch.testing.assert_close(tf.grad(lambda xs: tf.vmap(SquareWithVmap.apply)(xs).sum())(xs), 3 * xs)
    torch.testing.assert_close(tf.vmap(tf.grad(lambda x: SquareWithVmap.apply(x).sum()))(xs), 3 * xs)


def test_vmap_without_a_rule_is_a_named_error_as_in_torch_func():
    with pytest.raises(BatchingError, match="generate_vmap_rule"):
        tf.vmap(WrongSquare.apply)(_rand(4, 3))


def test_jvp_uses_the_jvp_staticmethod():
    class SquareJvp(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_forward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            raise AssertionError("not used")

        @staticmethod
        def jvp(ctx, t):
            x, = ctx.saved_tensors
            return 5 * x * t

    x, t = _rand(3), _rand(3)
    out, tangent = tf.jvp(SquareJvp.apply, (x,), (t,))
    torch.testing.assert_close(out, x * x)
    torch.testing.assert_close(tangent, 5 * x * t)
    torch.testing.assert_close(tangent, torch.func.jvp(SquareJvp.apply, (x,), (t,))[1])


def test_jvp_without_a_jvp_staticmethod_is_a_named_error():
    with pytest.raises(UserGradientError, match="no jvp staticmethod"):
        tf.jvp(WrongSquare.apply, (_rand(3),), (_rand(3),))
    with pytest.raises(UserGradientError, match="no jvp staticmethod"):
        tf.jacfwd(WrongSquare.apply)(_rand(3))


# -- custom ops ---------------------------------------------------------------------------------
@torch.library.custom_op("thunderfn_test::wrong_cube", mutates_args=())
def wrong_cube(x: torch.Tensor, k: float) -> torch.Tensor:
    return x.pow(3) * k


@wrong_cube.register_fake
def _(x, k):
    return torch.empty_like(x)


def _wrong_cube_setup(ctx, inputs, output):
    x, k = inputs
    ctx.save_for_backward(x)
    ctx.k = k


def _wrong_cube_backward(ctx, g):
    x, = ctx.saved_tensors
    return g * 5 * x * ctx.k, None  # deliberately not 3 x^2: the registered rule must be the one used


wrong_cube.register_autograd(_wrong_cube_backward, setup_context=_wrong_cube_setup)


def test_custom_op_with_register_autograd_under_grad_and_jit():
    x = _rand(4)
    xe = x.clone().requires_grad_()
    wrong_cube(xe, 2.0).sum().backward()
    torch.testing.assert_close(tf.grad(lambda x: wrong_cube(x, 2.0).sum())(x), xe.grad)
    xj = x.clone().requires_grad_()
    out = tf.jit(lambda x: torch.ops.thunderfn_test.wrong_cube(x, 2.0).sum())(xj)
    out.backward()
    torch.testing.assert_close(xj.grad, xe.grad)
    torch.testing.assert_close(out, wrong_cube(x, 2.0).sum())


_lib = torch.library.Library("thunderfn_test_lib", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CPU")
torch.library.register_fake("thunderfn_test_lib::twice", lambda x: torch.empty_like(x), lib=_lib)
torch.library.register_autograd("thunderfn_test_lib::twice", lambda ctx, g: g * 7, lib=_lib)


def test_register_autograd_on_a_library_defined_op_is_its_gradient():
    x = _rand(3)
    xe = x.clone().requires_grad_()
    torch.ops.thunderfn_test_lib.twice(xe).sum().backward()
    torch.testing.assert_close(tf.grad(lambda x: torch.ops.thunderfn_test_lib.twice(x).sum())(x), xe.grad)
    torch.testing.assert_close(xe.grad, torch.full((3,), 7.0, dtype=x.dtype))


def test_a_formula_thunderfn_did_not_see_registered_is_a_named_error_not_zeros():
    """torch.func refuses a Python autograd formula it finds inside an opaque op (one registered
    before thunderfn was imported, simulated by hiding the record): a named error, never zeros."""
    lib = torch.library.Library("thunderfn_test_hidden", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    torch.library.register_fake("thunderfn_test_hidden::twice", lambda x: torch.empty_like(x), lib=lib)
    torch.library.register_autograd("thunderfn_test_hidden::twice", lambda ctx, g: g * 7, lib=lib)
    user_functions._library_gradients.pop(torch.ops.thunderfn_test_hidden.twice.default)
    with pytest.raises(UserGradientError, match="register_autograd"):
        tf.grad(lambda x: torch.ops.thunderfn_test_hidden.twice(x).sum())(torch.ones(3))


def test_custom_op_under_vmap_and_grad_of_vmap():
    xs = _rand(4, 3)
    torch.testing.assert_close(tf.vmap(lambda x: wrong_cube(x, 2.0))(xs), xs ** 3 * 2)
    torch.testing.assert_close(tf.grad(lambda xs: tf.vmap(lambda x: wrong_cube(x, 2.0))(xs).sum())(xs), 10 * xs)


def test_custom_op_under_jvp_is_a_named_error():
    with pytest.raises(UserGradientError, match="wrong_cube"):
        tf.jvp(lambda x: wrong_cube(x, 2.0), (_rand(3),), (_rand(3),))


def test_the_trace_records_the_call_as_one_user_function():
    text = str(tf.trace(lambda x: WrongSquare.apply(x).sum(), torch.ones(2)))
    assert "user_function_WrongSquare" in text
    assert "set_grad_enabled" not in text


def test_function_in_a_module_under_grad_of_functional_call():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2).double()

        def forward(self, x):
            return WrongSquare.apply(self.lin(x)).sum()

    torch.manual_seed(0)
    net, x = Net(), _rand(4, 3)
    net(x).backward()
    params = {k: v.detach() for k, v in net.named_parameters()}
    grads = tf.grad(lambda p: tf.functional_call(net, p, (x,)))(params)
    for name, p in net.named_parameters():
        torch.testing.assert_close(grads[name], p.grad)


def test_examine_reports_user_functions_and_custom_ops(capsys):
    report = tf.examine(lambda x: WrongSquare.apply(wrong_cube(x, 2.0)).sum(), torch.randn(3))
    found = {c.name: c for c in report.by_status("user gradient")}
    assert any("WrongSquare" in name for name in found), report
    assert any("wrong_cube" in name for name in found), report


# -- real code ----------------------------------------------------------------------------------
def test_in_place_true_division_is_traced_as_a_division():
    """`x /= y` reaches tracing as torch.Tensor.__idiv__ (torch's __itruediv__ is that method):
    functionalized like `x += y`, not an opaque op whose gradient torch.func refuses."""
    def f(x):
        y = x * 1
        y /= 2
        return y

    x = torch.ones(3, requires_grad=True)
    assert "__idiv__" not in str(tf.trace(f, x))
    tf.jit(f)(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 0.5))


def test_hugging_face_mixtral_moe_fallback_gradients_match_eager():
    """Mixtral's experts on CPU run transformers' grouped_mm_fallback custom op, whose gradient is
    registered with register_autograd (its backward is another custom op)."""
    why = why_unavailable("transformers")
    if why is not None:
        pytest.skip(why)
    transformers = importlib.import_module("transformers")
    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=32)
    model = transformers.MixtralForCausalLM(config)
    ids = torch.randint(0, 64, (2, 8))
    expected_loss = model(ids, labels=ids).loss
    expected_loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    jitted = tf.jit(model)
    loss = jitted(ids, labels=ids).loss
    loss.backward()
    assert "user_function_transformers__grouped_mm_fallback" in str(tf.last_traces(jitted)[0])
    torch.testing.assert_close(loss, expected_loss)
    for name, grad in expected.items():
        torch.testing.assert_close(model.get_parameter(name).grad, grad, atol=1e-5, rtol=1e-4)


def test_reentrant_checkpoint_is_traced_as_its_function():
    """torch.utils.checkpoint(use_reentrant=True) is an autograd.Function whose backward runs
    torch.autograd: traced as the function it checkpoints, so the gradient is that function's."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    lin(x).sin().sum().backward()
    expected = x.grad.clone(), lin.weight.grad.clone()
    x.grad = lin.weight.grad = lin.bias.grad = None
    tf.jit(lambda x: checkpoint(lambda x: lin(x).sin(), x, use_reentrant=True).sum())(x).backward()
    torch.testing.assert_close((x.grad, lin.weight.grad), expected)


def test_an_input_returned_and_marked_non_differentiable_gets_no_gradient():
    class PassMarked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_non_differentiable(x)
            return x, x * 2

        @staticmethod
        def backward(ctx, g_x, g_twice):
            return 2 * g_twice

    x = _rand(3)
    xe = x.clone().requires_grad_()
    a, b = PassMarked.apply(xe)
    (a.sum() + b.sum()).backward() if a.requires_grad else b.sum().backward()
    got = tf.grad(lambda x: sum(o.sum() for o in PassMarked.apply(x)))(x)
    torch.testing.assert_close(got, xe.grad)


def test_a_function_applied_under_no_grad_passes_no_gradient():
    x = _rand(3)

    def f(x):
        with torch.no_grad():
            y = WrongSquare.apply(x)
        return (y * x).sum()

    torch.testing.assert_close(tf.grad(f)(x), x * x)
