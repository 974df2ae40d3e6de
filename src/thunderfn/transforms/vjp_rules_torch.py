"""VJP rules for torch-language symbols whose derivative torch defines by its own formula.

Differentiating a decomposition gives the derivative of that decomposition, which agrees
with torch everywhere except where torch picks a convention: at a kink (hardtanh's bounds),
or where the decomposition's intermediates overflow (sigmoid at -inf, softplus far past
its threshold). These rules copy torch's backward formulas (aten's *_backward), so those
points get torch's gradient, and the forward keeps each op whole (one torch call).
"""
from __future__ import annotations

from thunderfn import clang
import thunderfn.torch as ltorch
from thunderfn.transforms.vjp_rules import defvjp


def _only_input(res, ct) -> tuple:
    """A cotangent for the input (the first argument) and None for every other argument."""
    return (ct,) + (None,) * (len(res.args) - 1)


def _argument(res, position: int, name: str, default):
    if len(res.args) > position:
        return res.args[position]
    return res.kwargs.get(name, default)


def _inside(x, low, high, g):
    """g where low < x < high (strictly: torch's gradient is 0 at the bounds), else 0."""
    return clang.where(clang.bitwise_and(clang.gt(x, low), clang.lt(x, high)), g, 0.0)


@defvjp(ltorch.sigmoid.id)
def _sigmoid_vjp(res, g):  # torch: g * y * (1 - y), finite where exp(-x) overflows
    y = res.out
    return _only_input(res, clang.mul(g, clang.mul(y, clang.sub(1.0, y))))


@defvjp(ltorch.hardtanh.id)
def _hardtanh_vjp(res, g):
    x = res.args[0]
    return _only_input(res, _inside(x, _argument(res, 1, "min_val", -1.0), _argument(res, 2, "max_val", 1.0), g))


defvjp(ltorch.relu6.id)(lambda res, g: _only_input(res, _inside(res.args[0], 0.0, 6.0, g)))
defvjp(ltorch.hardsigmoid.id)(lambda res, g: _only_input(res, clang.mul(_inside(res.args[0], -3.0, 3.0, g), 1 / 6)))


@defvjp(ltorch.hardswish.id)
def _hardswish_vjp(res, g):  # torch: 0 for x <= -3, g * (x / 3 + 1/2) inside, g for x >= 3
    x = res.args[0]
    inside = clang.mul(g, clang.add(clang.true_divide(x, 3.0), 0.5))
    return _only_input(res, clang.where(clang.le(x, -3.0), 0.0, clang.where(clang.lt(x, 3.0), inside, g)))


@defvjp(ltorch.softplus.id)
def _softplus_vjp(res, g):  # torch: g past the threshold, else g * z / (z + 1) with z = exp(beta * x)
    x = res.args[0]
    beta, threshold = _argument(res, 1, "beta", 1.0), _argument(res, 2, "threshold", 20.0)
    scaled = clang.mul(x, beta)
    z = clang.exp(scaled)
    return _only_input(res, clang.where(clang.gt(scaled, threshold), g, clang.mul(g, clang.true_divide(z, clang.add(z, 1.0)))))
