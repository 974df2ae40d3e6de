"""tf.testing.check_grads: JAX's finite-difference check of forward and reverse derivatives.
The point of a checker is what it catches, so most tests hand it a wrong rule."""
import pytest
import torch

import thunderfn as tf
from test_autograd_function import WrongSquare  # its backward gives 3 g x for x * x


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _wrong_by(scale):
    """A custom_vjp sin whose backward is scaled: the kind of slip a hand-written rule makes."""
    @tf.custom_vjp
    def f(x):
        return x.sin()

    f.defvjp(lambda x: (x.sin(), x), lambda x, g: (g * x.cos() * scale,))
    return f


def test_passes_on_correct_derivatives_to_second_order():
    x, w = _x(3, 4), _x(4, 2, seed=1)
    tf.testing.check_grads(lambda x, w: torch.tanh(x @ w).sum(0), (x, w), order=2)
    tf.testing.check_grads(lambda d: d["a"].sin() * d["b"], ({"a": x, "b": x.cos()},), order=2)


def test_integer_arguments_are_held_fixed():
    tf.testing.check_grads(lambda x, i: x[i].exp(), (_x(5), torch.tensor([0, 3])), order=2)


def test_float32_uses_float32_tolerances():
    x = _x(8, 8).float()
    tf.testing.check_grads(lambda x: torch.nn.functional.gelu(x).sum(), (x,))


def test_catches_a_wrong_custom_vjp_rule():
    tf.testing.check_grads(_wrong_by(1.0), (_x(4),), modes=("rev",), order=2)
    with pytest.raises(AssertionError, match=r"VJP: <vjp\(ct\), t> differs"):
        tf.testing.check_grads(_wrong_by(1.01), (_x(4),), modes=("rev",))


def test_catches_a_wrong_custom_jvp_rule():
    @tf.custom_jvp
    def f(x):
        return x.exp()

    f.defjvp(lambda primals, tangents: (primals[0].exp(), tangents[0] * primals[0].exp() * 0.5))
    with pytest.raises(AssertionError, match="JVP: the tangent of f's output differs"):
        tf.testing.check_grads(f, (_x(4),), modes=("fwd",))


def test_catches_a_wrong_autograd_function_backward():
    with pytest.raises(AssertionError, match="VJP"):
        tf.testing.check_grads(WrongSquare.apply, (_x(4),), modes=("rev",))


def test_order_two_catches_a_rule_right_only_to_first_order():
    @tf.custom_vjp
    def f(x):
        return x.sin()

    # correct values, but cos(x) is treated as a constant, so the second derivative is lost
    f.defvjp(lambda x: (x.sin(), x.cos().detach()), lambda c, g: (g * c,))
    tf.testing.check_grads(f, (_x(4),), modes=("rev",), order=1)
    with pytest.raises(AssertionError, match="VJP of VJP"):
        tf.testing.check_grads(f, (_x(4),), modes=("rev",), order=2)


@pytest.mark.parametrize("call, message", [
    (lambda: tf.testing.check_grads(torch.sin, _x(3)), "args must be a tuple"),
    (lambda: tf.testing.check_grads(torch.sin, (_x(3),), order=0), "order must be a positive integer"),
    (lambda: tf.testing.check_grads(torch.sin, (_x(3),), modes=("backward",)), "modes must name"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()
