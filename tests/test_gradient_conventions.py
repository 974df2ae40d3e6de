"""Gradient conventions in training loops: every output keeps its position in the cotangents,
integer outputs get none, the derivative with respect to a Python float is a 0-d tensor (as JAX's),
and which tensors get a gradient (None vs zeros) and which outputs require grad is eager's."""
import pytest
import torch

import thunderfn as tf
from thunderfn.testing.grad_presence import grad_presence_mismatches
from thunderfn.testing.opinfo import SampleInput
from thunderfn.testing.opinfos import op_db


def _argmax_and_exp(x):
    return x.argmax(-1), x.exp()


# -- a non-differentiable output before a differentiable one keeps its place ----------------------
def test_vjp_keeps_each_output_in_its_position():
    x = torch.randn(3, 4)
    out, vjp_fn = tf.vjp(_argmax_and_exp, x)
    assert out[0].dtype == torch.int64
    g = torch.randn(3, 4)
    (with_none,) = vjp_fn((None, g))
    (with_int,) = vjp_fn((torch.zeros(3, dtype=torch.int64), g))  # torch.func passes one for integer outputs
    torch.testing.assert_close(with_none, g * x.exp())
    torch.testing.assert_close(with_int, g * x.exp())


def test_vjp_with_a_cotangent_of_the_wrong_structure_says_so():
    _, vjp_fn = tf.vjp(_argmax_and_exp, torch.randn(3, 4))
    with pytest.raises(TypeError, match="Expected pytree structure of cotangents to be the same as pytree structure of "
                                        "outputs to the function"):
        vjp_fn(torch.ones(3, 4))


def test_jit_backward_reaches_parameters_behind_an_integer_output():
    torch.manual_seed(0)
    model, x, y = torch.nn.Linear(4, 3), torch.randn(5, 4), torch.randint(0, 3, (5,))

    def step(x, y):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        return (logits.argmax(-1) == y).sum(), loss  # accuracy first, as training loops write it

    expected_correct, loss = step(x, y)
    loss.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    correct, loss = tf.jit(step)(x, y)
    loss.backward()
    assert correct.item() == expected_correct.item() and not correct.requires_grad
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e)


def test_grad_with_integer_and_none_aux():
    x = torch.randn(3, 4)
    g, aux = tf.grad(lambda x: ((x ** 2).sum(), {"index": x.argmax(), "nothing": None}), has_aux=True)(x)
    torch.testing.assert_close(g, 2 * x)
    assert aux["index"].item() == x.argmax().item() and aux["nothing"] is None


def test_jvp_of_an_integer_output_is_zero_as_torch_func():
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    out, tangents = tf.jvp(_argmax_and_exp, (x,), (t,))
    expected_out, expected_tangents = torch.func.jvp(_argmax_and_exp, (x,), (t,))
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(tangents, expected_tangents)


# -- the derivative with respect to a Python float ------------------------------------------------
def test_grad_with_respect_to_a_python_float_is_its_derivative():
    g = tf.grad(lambda x: x ** 3)
    assert g(2.0).item() == 12.0 and g(3.0).item() == 27.0
    assert g(2.0).shape == () and g(2.0).dtype == torch.get_default_dtype()
    assert tf.cache_info(g)["misses"] == 1  # the float is an input, not a baked-in constant


def test_grad_with_respect_to_floats_mixed_with_tensors_matches_torch():
    x = torch.randn(3)
    gx, gs = tf.grad(lambda x, s: torch.sin(x * s).sum(), argnums=(0, 1))(x, 0.5)
    s = torch.tensor(0.5, requires_grad=True)
    xr = x.clone().requires_grad_()
    torch.sin(xr * s).sum().backward()
    torch.testing.assert_close((gx, gs), (xr.grad, s.grad))
    value, grads = tf.value_and_grad(lambda p: p["a"] * 2 + (p["b"] ** 2).sum())({"a": 1.5, "b": torch.ones(2)})
    assert value.item() == 5.0 and grads["a"].item() == 2.0


def test_grad_with_respect_to_a_python_int_is_refused_like_jax():
    with pytest.raises(TypeError, match="Thing passed to transform API must be Tensor.*got 3"):
        tf.grad(lambda x: x * 2)(3)


# -- None vs zeros, and which outputs require grad, as eager -----------------------------------------
def _first_floating_dtype(op):
    return torch.float64 if torch.float64 in op.dtypes else next((d for d in op.dtypes if d.is_floating_point), None)


_DIFFERENTIABLE_OPS = [pytest.param(op, id=op.name) for op in op_db if _first_floating_dtype(op) is not None]


@pytest.mark.parametrize("op", _DIFFERENTIABLE_OPS)
def test_grad_presence_and_requires_grad_match_eager_over_the_opinfo_db(op):
    samples = list(op.sample_inputs("cpu", _first_floating_dtype(op)))[:3]
    assert not grad_presence_mismatches(op, samples)


class _Named:
    def __init__(self, name, op):
        self.name, self.op = name, op


_F = torch.nn.functional
_X, _SIGNS = torch.randn(4, 3), torch.randn(4, 3).sign()
TRAINING_LOOP_CASES = {
    # eager: the output requires grad, the input's gradient is zeros (not None)
    "zero_": (lambda a: (a * 1).zero_(), (_X,)),
    "copy_": (lambda a, b: (a * 1).copy_(b), (_X, _X.flip(0))),
    "floor_division": (lambda a: torch.div(a, 2, rounding_mode="floor"), (_X,)),
    "round": (lambda a: a.round() + a.sign(), (_X,)),
    "addmm_beta_0": (lambda a, b, c: torch.addmm(a, b, c, beta=0), (torch.randn(4, 4), _X, _X.T)),
    # eager: the target's gradient is None (its formula ignores it)
    "hinge_embedding_target": (lambda a, t: _F.hinge_embedding_loss(a, t), (_X, _SIGNS)),
    "cosine_embedding_target": (lambda a, b, t: _F.cosine_embedding_loss(a, b, t), (_X, _X.flip(0), _SIGNS[:, 0])),
    "norm_ord_0": (lambda a: torch.linalg.norm(a, ord=0), (_X,)),
    # eager: the output does not require grad
    "detach": (lambda a: a.detach() * 2, (_X,)),
    "zeros_like": (lambda a: torch.zeros_like(a), (_X,)),
}


@pytest.mark.parametrize("name", TRAINING_LOOP_CASES)
def test_grad_presence_matches_eager_in_training_loop_idioms(name):
    fn, args = TRAINING_LOOP_CASES[name]
    assert not grad_presence_mismatches(_Named(name, fn), [SampleInput(args)])


def test_adamw_decays_exactly_the_parameters_eager_decays():
    # AdamW skips parameters whose .grad is None: a zero gradient where eager has None (or the
    # reverse) changes the weights. `unused` feeds only a loss's target, whose gradient is None.
    def run(jit):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 3)
        unused = torch.nn.Parameter(torch.randn(4, 3).sign())
        opt = torch.optim.AdamW([*model.parameters(), unused], lr=0.1, weight_decay=0.5)
        step = (lambda x: _F.hinge_embedding_loss(model(x), unused))
        step = tf.jit(step) if jit else step
        for _ in range(3):
            opt.zero_grad()
            step(torch.randn(4, 3)).backward()
            opt.step()
        return [p.detach().clone() for p in [*model.parameters(), unused]], unused.grad

    (eager, eager_grad), (jitted, jitted_grad) = run(False), run(True)
    assert eager_grad is None and jitted_grad is None
    torch.testing.assert_close(jitted, eager)
