"""Rules of the elementwise family: the elementwise prims (from their partial derivatives, once),
the conversions, and the torch-language activations that keep torch's conventions.

An elementwise prim's VJP and JVP are both made from its partials (`partials` below); its
batching rule brings every operand to the output's shape with the batch dimension in front.
The torch-language activations (sigmoid, relu, gelu, ...) have VJP rules that copy torch's
backward kernels (a kink's value, where exp overflows), and their JVPs are those rules applied to
the tangent, since their Jacobians are diagonal.
"""
from __future__ import annotations

import math
from typing import Callable

import thunderfn.torch as ltorch
from thunderfn import prims
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.rules import JVPRule, rules_of, set_rule, set_underivable
from thunderfn.prims import PrimIDs
from thunderfn.torch.elementwise import _SELU_ALPHA, _SELU_SCALE
from thunderfn.transforms.rules.common import (
    add_tangents,
    as_tensor_like,
    batch_size_of,
    expanded_like,
    is_float_tensor,
    move_to_front,
    only_input,
    operand_cotangent,
    square,
    tangent_like,
    to_dtype,
    zeros_like,
)
from thunderfn.transforms.rules.define import defbatch, defjvp, deflinear, defvjp, refuse_complex


def _where0(pred, x):
    """x where pred, else 0."""
    return ltorch.where(pred, x, 0.0)


# -- elementwise: the partial derivatives, once -----------------------------------------------
# partials[prim id] has one function per positional input of an elementwise prim: `partial(g, *args,
# out, **kwargs)` is g times d(out)/d(that input), elementwise, for g of out's shape. Both directions
# are made from it: the VJP rule gives each float tensor input its partial at the cotangent, summed to
# the input's shape (`operand_cotangent`), and the JVP rule sums each input's partial at its tangent.
# A partial may return ZERO: the input's derivative is zero (reverse mode gives a tensor of zeros, as
# torch does; forward mode adds nothing); a None in place of a partial: no derivative (None).
# The table is keyed by prim id here, not written on prims.py's table lines, because partials are in
# the torch language, which the prims layer cannot import. torch's conventions (pow at zero, ties of
# maximum, atan2 at the origin) are in the partials themselves; where torch's forward mode differs from
# its reverse mode (maximum and minimum at NaN, atan2 at the origin), the JVP rules below say so and keep
# torch.func.jvp's formula.
ZERO = object()
_LN2, _LN10, _2_OVER_SQRT_PI = math.log(2.0), math.log(10.0), 2.0 / math.sqrt(math.pi)


def _times(derivative):
    """The partial of a unary prim whose derivative is derivative(x, out): g times it."""
    return lambda g, x, y: ltorch.mul(g, derivative(x, y))


def _zero(*args, **kwargs):
    """The partial of an input whose derivative is zero (piecewise constant, or torch ignores it):
    reverse mode gives it a tensor of zeros, as torch does (`zeros_like`), not None."""
    return ZERO


def _pow_da(g, a, b, y):
    # torch's conventions: d/da is 0 where b == 0 (even at a == 0), d/db is 0 where a == 0 and b >= 0.
    # The masked-out branch computes on a base of 1, so that its own derivative stays finite
    # (no 0 * inf = nan when this rule is differentiated again).
    ta, tb = as_tensor_like(a, y), as_tensor_like(b, y)
    masked = expanded_like(ltorch.eq(tb, 0.0), y)
    base = ltorch.where(masked, 1.0, ta)
    return ltorch.where(masked, 0.0, ltorch.mul(g, ltorch.mul(tb, ltorch.pow(base, ltorch.sub(tb, 1.0)))))


def _pow_db(g, a, b, y):
    ta, tb = as_tensor_like(a, y), as_tensor_like(b, y)
    masked = expanded_like(ltorch.bitwise_and(ltorch.eq(ta, 0.0), ltorch.ge(tb, 0.0)), y)
    base = ltorch.where(masked, 1.0, ta)
    return ltorch.where(masked, 0.0, ltorch.mul(g, ltorch.mul(y, ltorch.log(base))))


def _atan2_recip(a, b, y):
    # torch zeroes 1 / (a² + b²) where it is infinite, so atan2(0, 0) gets gradient 0
    recip = ltorch.div(1.0, ltorch.add(square(as_tensor_like(a, y)), square(as_tensor_like(b, y))))
    return ltorch.where(ltorch.eq(recip, float("inf")), 0.0, recip)


def _extremum(loses):
    """The partial of maximum/minimum for the operand that loses where loses(a, b): torch splits g
    equally between tied operands; the losing operand gets 0."""
    def partial(g, a, b, y):
        ta, tb = as_tensor_like(a, y), as_tensor_like(b, y)
        split = ltorch.where(expanded_like(ltorch.eq(ta, tb), g), ltorch.mul(g, 0.5), g)
        return ltorch.where(expanded_like(loses(ta, tb), g), 0.0, split)

    return partial


def _mod_db(rounding_mode):
    """fmod and remainder are a - b * trunc(a / b) and a - b * floor(a / b): b's partial."""
    return lambda g, a, b, y: ltorch.mul(ltorch.neg(g),
                                         ltorch.div(as_tensor_like(a, y), b, rounding_mode=rounding_mode))


def _div_da(g, a, b, y, rounding_mode=None):
    return ZERO if rounding_mode is not None else ltorch.div(g, b)


def _div_db(g, a, b, y, rounding_mode=None):
    if rounding_mode is not None:
        return ZERO
    return ltorch.neg(ltorch.mul(g, ltorch.div(ltorch.div(as_tensor_like(a, b), b), b)))


partials = {
    PrimIDs.ABS: (_times(lambda x, y: ltorch.sign(x)),),
    PrimIDs.NEG: (lambda g, x, y: ltorch.neg(g),),
    PrimIDs.EXP: (_times(lambda x, y: y),),
    PrimIDs.EXP2: (_times(lambda x, y: ltorch.mul(y, _LN2)),),
    PrimIDs.EXPM1: (_times(lambda x, y: ltorch.add(y, 1.0)),),
    PrimIDs.LOG: (_times(lambda x, y: ltorch.reciprocal(x)),),
    PrimIDs.LOG1P: (_times(lambda x, y: ltorch.reciprocal(ltorch.add(x, 1.0))),),
    PrimIDs.LOG2: (_times(lambda x, y: ltorch.reciprocal(ltorch.mul(x, _LN2))),),
    PrimIDs.LOG10: (_times(lambda x, y: ltorch.reciprocal(ltorch.mul(x, _LN10))),),
    PrimIDs.SQRT: (_times(lambda x, y: ltorch.div(0.5, y)),),
    PrimIDs.RSQRT: (_times(lambda x, y: ltorch.mul(ltorch.mul(y, square(y)), -0.5)),),
    PrimIDs.RECIPROCAL: (_times(lambda x, y: ltorch.neg(square(y))),),
    PrimIDs.SIN: (_times(lambda x, y: ltorch.cos(x)),),
    PrimIDs.COS: (_times(lambda x, y: ltorch.neg(ltorch.sin(x))),),
    PrimIDs.TAN: (_times(lambda x, y: ltorch.add(square(y), 1.0)),),
    PrimIDs.ASIN: (_times(lambda x, y: ltorch.rsqrt(ltorch.sub(1.0, square(x)))),),
    PrimIDs.ACOS: (_times(lambda x, y: ltorch.neg(ltorch.rsqrt(ltorch.sub(1.0, square(x))))),),
    PrimIDs.ATAN: (_times(lambda x, y: ltorch.reciprocal(ltorch.add(square(x), 1.0))),),
    PrimIDs.SINH: (_times(lambda x, y: ltorch.cosh(x)),),
    PrimIDs.COSH: (_times(lambda x, y: ltorch.sinh(x)),),
    PrimIDs.TANH: (_times(lambda x, y: ltorch.sub(1.0, square(y))),),
    PrimIDs.ASINH: (_times(lambda x, y: ltorch.rsqrt(ltorch.add(square(x), 1.0))),),
    PrimIDs.ACOSH: (_times(lambda x, y: ltorch.rsqrt(ltorch.sub(square(x), 1.0))),),
    PrimIDs.ATANH: (_times(lambda x, y: ltorch.reciprocal(ltorch.sub(1.0, square(x)))),),
    PrimIDs.ERF: (_times(lambda x, y: ltorch.mul(ltorch.exp(ltorch.neg(square(x))), _2_OVER_SQRT_PI)),),
    PrimIDs.ERFC: (_times(lambda x, y: ltorch.mul(ltorch.exp(ltorch.neg(square(x))), -_2_OVER_SQRT_PI)),),
    PrimIDs.ERFINV: (_times(lambda x, y: ltorch.mul(ltorch.exp(square(y)), math.sqrt(math.pi) / 2)),),
    PrimIDs.LGAMMA: (_times(lambda x, y: ltorch.digamma(x)),),
    PrimIDs.FLOOR: (_zero,),
    PrimIDs.CEIL: (_zero,),
    PrimIDs.ROUND: (_zero,),
    PrimIDs.TRUNC: (_zero,),
    PrimIDs.SIGN: (_zero,),
    PrimIDs.ADD: (lambda g, a, b, y: g, lambda g, a, b, y: g),
    PrimIDs.SUB: (lambda g, a, b, y: g, lambda g, a, b, y: ltorch.neg(g)),
    PrimIDs.MUL: (lambda g, a, b, y: ltorch.mul(g, b), lambda g, a, b, y: ltorch.mul(g, a)),
    PrimIDs.DIV: (_div_da, _div_db),
    PrimIDs.FMOD: (lambda g, a, b, y: g, _mod_db("trunc")),
    PrimIDs.REMAINDER: (lambda g, a, b, y: g, _mod_db("floor")),
    PrimIDs.POW: (_pow_da, _pow_db),
    PrimIDs.ATAN2: (lambda g, a, b, y: ltorch.mul(g, ltorch.mul(as_tensor_like(b, y), _atan2_recip(a, b, y))),
                    lambda g, a, b, y: ltorch.mul(g,
                                                  ltorch.mul(ltorch.neg(as_tensor_like(a, y)), _atan2_recip(a, b, y)))),
    PrimIDs.MAXIMUM: (_extremum(ltorch.lt), _extremum(ltorch.gt)),
    PrimIDs.MINIMUM: (_extremum(ltorch.gt), _extremum(ltorch.lt)),
    # copysign: g * sign(a) * sign(b) in torch's form, out / a, 0 where a == 0; b's gradient is zeros, as torch's
    PrimIDs.COPYSIGN: (lambda g, a, b, y: ltorch.mul(g, ltorch.where(expanded_like(ltorch.eq(a, 0.0), y), 0.0,
                                                                     ltorch.div(y, a))),
                       _zero),
    # nextafter(a, b) is a, one ulp towards b: torch passes g to a, except where a == b, where it gives 0
    PrimIDs.NEXTAFTER: (lambda g, a, b, y: _where0(ltorch.ne(a, b), g), _zero),
    PrimIDs.WHERE: (None, lambda g, pred, a, b, y: _where0(pred, g),
                    lambda g, pred, a, b, y: ltorch.where(pred, 0.0, g)),
}


# prims differentiable in principle, without a rule: the transforms' refusal says why
set_underivable(PrimIDs.DIGAMMA, "its derivative is polygamma(1, x), and there is no polygamma prim")
for _prim_id in (PrimIDs.REAL, PrimIDs.IMAG):
    set_underivable(_prim_id, "complex autodiff is not implemented (needs a conjugation convention and a conj prim)")


def vjp_from_partials(fns) -> Callable:
    """The VJP rule of an elementwise prim with these partials (one per positional input): each float
    tensor input gets its partial at g, summed back to its shape; nothing for a non-float output."""
    def rule(call, g):
        args, out = call.args, call.out
        if not is_float_tensor(out):
            return (None,) * len(args)
        cts = []
        for arg, partial in zip(args, fns):
            if partial is None or not is_float_tensor(arg):
                cts.append(None)
                continue
            d = partial(g, *args, out, **call.kwargs)
            cts.append(zeros_like(arg) if d is ZERO else operand_cotangent(d, arg))
        return tuple(cts)

    return rule


def jvp_from_partials(fns) -> Callable:
    """The JVP rule of an elementwise prim with these partials (one per positional input, as in
    `partials`): the sum over inputs of partial(tangent), a 0-dim operand's tangent broadcast
    to the output first; None for a non-float output or where every term is zero."""
    def rule(call, t):
        args, out = call.args, call.out
        if not is_float_tensor(out):
            return None
        total = None
        for partial, ti in zip(fns, t):
            if partial is None or ti is None:
                continue
            d = partial(tangent_like(ti, out), *args, out, **call.kwargs)
            total = add_tangents(total, None if d is ZERO else d)
        return total

    return rule


def _elementwise_batch(prim):
    """Operands moved to the front and brought to the output's shape. Elementwise prims take operands
    of one shape (or 0-dim tensors and numbers, which they broadcast): a batched operand whose example
    is 0-dim beside a larger one, and an unbatched operand beside a batched one, are broadcast to
    (batch, *out.shape) here; 0-dim unbatched tensors and numbers pass as they are."""
    # prims.where's condition has the output's shape even when it is 0-dim for each example
    full_shape_operands = 1 if prim.id is PrimIDs.WHERE else 0

    def rule(call, dims):
        batch = batch_size_of(call.args, dims)
        shape = (batch,) + tuple(call.out.shape)
        operands = []
        for i, (a, d) in enumerate(zip(call.args, dims)):
            if d is not None:
                a = move_to_front(a, d)
                if a.ndim - 1 < len(call.out.shape):
                    a = prims.broadcast_in_dim(a, shape, (0,))
            elif isinstance(a, TensorProxy) and (a.ndim > 0 or i < full_shape_operands):
                a = prims.broadcast_in_dim(a, shape, tuple(range(1, a.ndim + 1)))
            operands.append(a)
        return prim(*operands, **call.kwargs), 0

    rule.__name__ = rule.__qualname__ = f"_{prim.name}_batch"
    return rule


def defpartials(prim, *fns) -> None:
    """Give an elementwise prim its partial derivatives, one per positional input (`partials` above
    says how they are written), and so its VJP and JVP rules; and its batching rule. The one way in
    for an elementwise prim, the library's and thunderfn.extend.elementwise_op's."""
    defvjp(prim.id)(vjp_from_partials(fns))
    defjvp(prim.id)(jvp_from_partials(fns))
    defbatch(prim.id)(_elementwise_batch(prim))


for _prim_id, _fns in partials.items():
    defpartials(getattr(prims, _prim_id.name.lower()), *_fns)
for _op in prims.elementwise_ops.values():  # those whose outputs carry no derivative: their batching rule alone
    if _op.prim.id not in partials:
        defbatch(_op.prim.id)(_elementwise_batch(_op.prim))


# torch's forward-mode formulas for these differ from its reverse-mode ones at points the partials
# cannot serve both ways, and forward mode matches torch.func.jvp: maximum and minimum with a NaN
# operand give the tangent of b alone (reverse mode gives g to both), atan2 at (0, 0) is nan (reverse
# mode zeroes it). Everywhere else these equal the sum of the partials.
def _float_out(fwd):
    """Wrap fwd so that a non-floating output (integer arithmetic) gets no tangent."""
    def rule(call, tangents):
        return fwd(call, tangents) if is_float_tensor(call.out) else None

    rule.__name__, rule.__doc__ = fwd.__name__, fwd.__doc__
    return rule


def _mul_or_none(t, x):
    return None if t is None else prims.mul(t, x)


def _binary(prim_id, fwd):
    """fwd(a, b, ta, tb, out) on a and b as tensors (numbers made 0-dim tensors of out's dtype)
    and ta, tb as out-shaped tangents or None."""
    def rule(call, t):
        (a, b), out = call.args, call.out
        return fwd(as_tensor_like(a, out), as_tensor_like(b, out), tangent_like(t[0], out),
                   tangent_like(t[1], out), out)

    rule.__name__ = f"_{prim_id.name.lower()}_jvp"
    defjvp(prim_id)(_float_out(rule))


_binary(PrimIDs.ATAN2, lambda a, b, ta, tb, out: prims.div(
    add_tangents(_mul_or_none(ta, b), None if tb is None else prims.neg(prims.mul(tb, a))),
    prims.add(square(a), square(b))))


def _extremum_fwd(a_wins):
    """torch's tie convention: tied operands each get half their tangent."""
    def fwd(a, b, ta, tb, out):
        winner = prims.where(expanded_like(a_wins(a, b), out), 0.0 if ta is None else ta, 0.0 if tb is None else tb)
        return prims.where(expanded_like(prims.eq(a, b), out), prims.mul(add_tangents(ta, tb), 0.5), winner)

    return fwd


_binary(PrimIDs.MAXIMUM, _extremum_fwd(prims.gt))
_binary(PrimIDs.MINIMUM, _extremum_fwd(prims.lt))


# -- conversions: each element alone, the shape kept -----------------------------------------
def _same_layout(prim):
    """Ops that change each element alone and keep the shape: the batch dim stays where it is."""
    def rule(call, dims):
        return prim(*call.args, **call.kwargs), dims[0]

    rule.__name__ = rule.__qualname__ = f"_{prim.name}_batch"
    return rule


@defvjp(PrimIDs.CONVERT_ELEMENT_TYPE)
def _convert_element_type_vjp(call, g):
    a = call.args[0]
    return (to_dtype(g, a.dtype) if is_float_tensor(a) and is_float_tensor(call.out) else None), None


@defjvp(PrimIDs.CONVERT_ELEMENT_TYPE)
def _convert_element_type_jvp(call, t):
    if is_float_tensor(call.out):
        return prims.convert_element_type(t[0], call.args[1])
    if call.out.dtype.is_complex and t[0] is not None:  # a real tangent made complex: no tangent would be wrong
        refuse_complex("jvp", PrimIDs.CONVERT_ELEMENT_TYPE, (call.out,))
    return None
defbatch(PrimIDs.CONVERT_ELEMENT_TYPE)(_same_layout(prims.convert_element_type))

deflinear(prims.device_put, lambda call, g: (
    operand_cotangent(ltorch.to(g, call.args[0].device), call.args[0]), None))
defbatch(PrimIDs.DEVICE_PUT)(_same_layout(prims.device_put))


# -- torch-language activations ---------------------------------------------------------------
# eager's kernels, from the saved output: finite where the decomposition's exp(-x) overflows
defvjp(ltorch.sigmoid.id)(lambda call, g: only_input(call, ltorch.sigmoid_backward(g, call.out)))
defvjp(ltorch.tanh.id)(lambda call, g: only_input(call, ltorch.tanh_backward(g, call.out)))
defvjp(ltorch.relu.id)(lambda call, g: only_input(call, ltorch.threshold_backward(g, call.out, 0)))
# relu's backward is differentiable in its gradient; its `self` gets zeros (torch's formula), not None
defvjp(ltorch.threshold_backward.id)(lambda call, g: (
    ltorch.threshold_backward(g, call.arg("self"), call.arg("threshold")), zeros_like(call.arg("self")), None))


# eager's kernels, one call each (torch/aten_backward.py has their formulas)
defvjp(ltorch.hardtanh.id)(lambda call, g: only_input(call, ltorch.hardtanh_backward(
    g, call.args[0], call.arg("min_val"), call.arg("max_val"))))
defvjp(ltorch.relu6.id)(lambda call, g: only_input(call, ltorch.hardtanh_backward(g, call.args[0], 0.0, 6.0)))
defvjp(ltorch.hardsigmoid.id)(lambda call, g: only_input(call, ltorch.hardsigmoid_backward(g, call.args[0])))
defvjp(ltorch.hardswish.id)(lambda call, g: only_input(call, ltorch.hardswish_backward(g, call.args[0])))
# like threshold_backward: linear in its gradient; its `self` gets zeros (torch's formula), not None
defvjp(ltorch.hardtanh_backward.id)(lambda call, g: (
    ltorch.hardtanh_backward(g, call.arg("self"), call.arg("min_val"), call.arg("max_val")),
    zeros_like(call.arg("self")), None, None))


@defvjp(ltorch.softplus.id)
def _softplus_vjp(call, g):  # torch: g past the threshold, else g * z / (z + 1) with z = exp(beta * x)
    x = call.args[0]
    beta, threshold = call.arg("beta"), call.arg("threshold")
    scaled = ltorch.mul(x, beta)
    z = ltorch.exp(scaled)
    return only_input(call,
                      ltorch.where(ltorch.gt(scaled, threshold), g, ltorch.mul(g, ltorch.div(z, ltorch.add(z, 1.0)))))


# torch: g * sigmoid(-x), 1/2 at 0 (the decomposition's min(x, 0) and |x| both give 0 there)
defvjp(ltorch.logsigmoid.id)(lambda call, g: only_input(call, ltorch.mul(g, ltorch.sigmoid(ltorch.neg(call.args[0])))))


defvjp(ltorch.silu.id)(lambda call, g: only_input(call, ltorch.silu_backward(g, call.args[0])))


def _elu_backward(call, g, alpha: float, scale: float, input_scale: float):
    """torch's elu_backward: g * scale above 0, g * input_scale * alpha * scale * exp(x * input_scale) at and
    below; the exp reads min(x, 0), so the branch not taken cannot overflow (nor give a second derivative nan)."""
    x = call.args[0]
    negative = ltorch.le(x, 0)
    below = ltorch.mul(ltorch.exp(ltorch.mul(ltorch.where(negative, x, 0.0), input_scale)), input_scale * alpha * scale)
    return only_input(call, ltorch.mul(g, ltorch.where(negative, below, scale)))


defvjp(ltorch.elu.id)(lambda call, g: _elu_backward(call, g, call.arg("alpha"), 1.0, 1.0))
defvjp(ltorch.selu.id)(lambda call, g: _elu_backward(call, g, _SELU_ALPHA, _SELU_SCALE, 1.0))
defvjp(ltorch.celu.id)(lambda call, g: _elu_backward(call, g, call.arg("alpha"), 1.0, 1.0 / call.arg("alpha")))


# eager's kernel: the forward saved the input
defvjp(ltorch.gelu.id)(lambda call, g: only_input(call, ltorch.gelu_backward(g, call.args[0],
                                                                            approximate=call.arg("approximate"))))


# Their Jacobian is diagonal, so the tangent is the VJP rule applied to the input's tangent: forward
# mode gets torch's conventions (logsigmoid at 0, a kink's bounds, where exp overflows) from the
# same formula, and the forward keeps each op whole.
def _diagonal_jvp_from_vjp(symbol):
    vjp = rules_of(symbol.id).vjp.bwd

    def fwd(call, tangents):
        return None if not tangents or tangents[0] is None else vjp(call, tangents[0])[0]

    fwd.__name__ = fwd.__qualname__ = f"{vjp.__name__}_as_jvp"
    set_rule(symbol.id, "jvp", JVPRule(fwd))


for _symbol in (ltorch.sigmoid, ltorch.tanh, ltorch.relu, ltorch.logsigmoid, ltorch.silu, ltorch.elu, ltorch.selu,
                ltorch.celu, ltorch.hardtanh, ltorch.relu6, ltorch.hardsigmoid, ltorch.hardswish, ltorch.softplus,
                ltorch.gelu):
    _diagonal_jvp_from_vjp(_symbol)
