"""Forward-mode rules for prims: `jvp_rules[prim id].fwd(call, tangents)` is the tangent of the
prim's output, given one tangent per positional argument. The forward twin of vjp_rules.

Rules are written in prims; an elementwise prim's rule is the sum of its partial derivatives
(vjp_rules.partials, in the torch language, shared with its VJP rule) at the tangents. Rules
trace like any other function and can be differentiated again (jvp of jvp, grad of jvp). On
real tensors they compute eagerly, which is how tests/test_jvp_rules.py checks each one against torch.func.jvp.

Conventions (the driver relies on them):
- `tangents` has one entry per positional argument: a tangent of that argument's shape and
  dtype, or None (zero, not a tensor, or not floating point); prims.cat's first entry is a
  tuple, one tangent (or None) per tensor;
- a rule is called only when some tangent is not None, and returns the output's tangent
  (call.out's shape and dtype), or None when it is zero;
- a multi-output prim (var_mean, sort, topk) returns a tuple, None for integer outputs;
- a 0-dim tensor operand that a binary prim broadcast has a 0-dim tangent, broadcast here.
Rules are for real floating dtypes; a complex argument raises NotImplementedError, as in
vjp_rules. Where torch picks a convention (ties of maximum and amax, pow at zero) we match
torch.func.jvp.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

import thunderfn.torch as ltorch
from thunderfn import prims
from thunderfn.clang import reduction_dims
from thunderfn.prims import PrimIDs, canonical_dim
from thunderfn.torch.aten_backward import updated_running_stats
from thunderfn.transforms import vjp_rules as _vjp
from thunderfn.transforms import vjp_rules_torch  # (the torch-language symbols' VJP rules, read below)
from thunderfn.transforms.vjp_rules import NON_DIFFERENTIABLE, RecordedCall  # noqa: F401  (re-exported for the driver)
from thunderfn.transforms.vjp_rules import _is_float_tensor, _expand, _reduced, _scalar, _sq, _to, _zeros, refuse_complex
from thunderfn.errors import ArgumentTypeError


@dataclasses.dataclass(frozen=True)
class JVPRule:
    """How forward mode differentiates one symbol: `fwd(call, tangents)` is the tangent of its
    output, given one tangent per positional argument (the conventions above)."""
    fwd: Callable


jvp_rules: dict = {}  # symbol id -> JVPRule; entered only through register_jvp


def unregister_jvp(symbol_id) -> None:
    """Drop symbol_id's rule, if it has one (a custom_jvp, or a user Function's call whose trace, went away)."""
    jvp_rules.pop(symbol_id, None)


def register_jvp(symbol_id, rule: JVPRule) -> None:
    """The one way a rule enters jvp_rules: defjvp and the rules derived from VJP rules wrap it."""
    if not isinstance(rule, JVPRule):
        raise ArgumentTypeError(f"the JVP rule for {_vjp._rule_name(symbol_id)} must be a JVPRule, got {type(rule).__name__}")
    jvp_rules[symbol_id] = rule


# differentiable in principle, but without a forward rule here (the same prims as vjp_rules)
NOT_DIFFERENTIATED = dict(_vjp.NOT_DIFFERENTIATED)


def defjvp(*prim_ids):
    """Register the decorated `fwd(call, tangents)` as the forward rule of each prim id,
    refusing complex arguments."""
    def register(fwd):
        def checked(call: RecordedCall, tangents):
            refuse_complex("jvp", prim_ids[0], call.args)
            return fwd(call, tuple(tangents))

        checked.__name__ = checked.__qualname__ = fwd.__name__
        checked.__doc__ = fwd.__doc__
        for pid in prim_ids:
            register_jvp(pid, JVPRule(checked))
        return fwd

    return register


# -- helpers (prims only) ----------------------------------------------------------------
def _like(t, out):
    """A tangent t of an elementwise operand as a tangent of out: a 0-dim t (from a 0-dim
    operand the prim broadcast) is broadcast to out's shape, moved to out's device, cast."""
    if t is None:
        return None
    if t.ndim == 0 and out.ndim > 0:
        t = prims.broadcast_in_dim(t, tuple(out.shape), ())
    if t.device != out.device:  # a CPU scalar tensor beside a CUDA tensor
        t = prims.device_put(t, out.device)
    return _to(t, out.dtype)


def _add(x, y):
    """Sum of tangents, None standing for zero."""
    return y if x is None else x if y is None else prims.add(x, y)


def _mul_or_none(t, x):
    return None if t is None else prims.mul(t, x)


def _or_zeros(t, like):
    return _zeros(like) if t is None else t


def _float_out(fwd):
    """Wrap fwd so that a non-floating output (integer arithmetic) gets no tangent."""
    def rule(call, tangents):
        return fwd(call, tangents) if _is_float_tensor(call.out) else None

    rule.__name__, rule.__doc__ = fwd.__name__, fwd.__doc__
    return rule


# -- elementwise: the sum of each input's partial at its tangent (vjp_rules.partials) --------
def jvp_from_partials(fns) -> Callable:
    """The JVP rule of an elementwise prim with these partials (one per positional input, as in
    vjp_rules.partials): the sum over inputs of partial(tangent), a 0-dim operand's tangent broadcast
    to the output first; None for a non-float output or where every term is zero."""
    def rule(call, t):
        args, out = call.args, call.out
        if not _is_float_tensor(out):
            return None
        total = None
        for partial, ti in zip(fns, t):
            if partial is None or ti is None:
                continue
            d = partial(_like(ti, out), *args, out, **call.kwargs)
            total = _add(total, None if d is _vjp.ZERO else d)
        return total

    return rule


def defpartials(prim_id, *fns) -> None:
    """Give an elementwise prim its partial derivatives, one per positional input (vjp_rules.partials
    says how they are written), and so both its VJP and its JVP rule: the one way in for a prim made
    after these modules (thunderfn.extend.elementwise_op). jvp_rules imports vjp_rules, so the entry
    that registers both directions lives here."""
    _vjp.partials[prim_id] = tuple(fns)
    _vjp.defvjp(prim_id)(_vjp.vjp_from_partials(fns))
    defjvp(prim_id)(jvp_from_partials(fns))


for _prim_id, _fns in _vjp.partials.items():
    defjvp(_prim_id)(jvp_from_partials(_fns))


# torch's forward-mode formulas for these differ from its reverse-mode ones at points the partials
# cannot serve both ways, and forward mode matches torch.func.jvp: maximum and minimum with a NaN
# operand give the tangent of b alone (reverse mode gives g to both), atan2 at (0, 0) is nan (reverse
# mode zeroes it). Everywhere else these equal the sum of the partials.
def _binary(prim_id, fwd):
    """fwd(a, b, ta, tb, out) on a and b as tensors (numbers made 0-dim tensors of out's dtype)
    and ta, tb as out-shaped tangents or None."""
    def rule(call, t):
        (a, b), out = call.args, call.out
        return fwd(_scalar(a, out), _scalar(b, out), _like(t[0], out), _like(t[1], out), out)

    rule.__name__ = f"_{prim_id.name.lower()}_jvp"
    defjvp(prim_id)(_float_out(rule))


_binary(PrimIDs.ATAN2, lambda a, b, ta, tb, out: prims.div(
    _add(_mul_or_none(ta, b), None if tb is None else prims.neg(prims.mul(tb, a))), prims.add(_sq(a), _sq(b))))


def _extremum_fwd(a_wins):
    """torch's tie convention: tied operands each get half their tangent."""
    def fwd(a, b, ta, tb, out):
        winner = prims.where(_expand(a_wins(a, b), out), 0.0 if ta is None else ta, 0.0 if tb is None else tb)
        return prims.where(_expand(prims.eq(a, b), out), prims.mul(_add(ta, tb), 0.5), winner)

    return fwd


_binary(PrimIDs.MAXIMUM, _extremum_fwd(prims.gt))
_binary(PrimIDs.MINIMUM, _extremum_fwd(prims.lt))


# -- reductions --------------------------------------------------------------------------
def _contract(t, weights, dims):
    """sum over dims of t * weights: the tangent of a reduction whose derivative is weights."""
    tw = prims.mul(t, weights)
    return prims.sum(tw, dims) if dims else tw


def _ones(like):
    return prims.full(tuple(like.shape), 1.0, device=like.device, dtype=like.dtype)


defjvp(PrimIDs.SUM)(lambda call, t: prims.sum(t[0], call.args[1]))
# the derivative of prod (product of the other elements, exact at zeros) and of amax/amin (ties
# share equally, as in torch) is the vjp rule's cotangent for an output cotangent of ones
defjvp(PrimIDs.PROD)(lambda call, t: _contract(t[0], _vjp._prod_vjp(call, _ones(call.out))[0], _reduced(*call.args)))
defjvp(PrimIDs.AMAX, PrimIDs.AMIN)(lambda call, t: _contract(
    t[0], _vjp._extremum_reduction_vjp(call, _ones(call.out))[0], _reduced(*call.args)))


def _var_jvp(call, var, t):
    """var' = sum(2 (a - mean) t) / (n - correction)."""
    a, dims = call.args
    weights = _vjp._var_mean_vjp(a, dims, call.arg("correction"), _ones(var), None)
    return _contract(t, weights, _reduced(a, dims))


def _mean_jvp(a, dims, t):
    dims = _reduced(a, dims)
    return prims.div(prims.sum(t, dims), math.prod(a.shape[d] for d in dims)) if dims else t


defjvp(PrimIDs.VAR)(lambda call, t: _var_jvp(call, call.out, t[0]))
defjvp(PrimIDs.VAR_MEAN)(lambda call, t: (_var_jvp(call, call.out[0], t[0]), _mean_jvp(*call.args, t[0])))


# -- linear in their first argument: the prim applied to the tangent -----------------------
def _linear(*prim_ids):
    for pid in prim_ids:
        def rule(call, t, prim=getattr(prims, pid.name.lower())):
            return prim(t[0], *call.args[1:], **call.kwargs)

        rule.__name__ = f"_{pid.name.lower()}_jvp"
        defjvp(pid)(rule)


_linear(PrimIDs.BROADCAST_IN_DIM, PrimIDs.RESHAPE, PrimIDs.TRANSPOSE, PrimIDs.SLICE, PrimIDs.SQUEEZE, PrimIDs.FLIP,
        PrimIDs.TAKE, PrimIDs.TAKE_ALONG_AXIS, PrimIDs.DEVICE_PUT, PrimIDs.CUMSUM)
# the padding value is a number: its tangent is zero
defjvp(PrimIDs.PAD)(lambda call, t: prims.pad(t[0], 0.0, call.args[2]))
defjvp(PrimIDs.CONVERT_ELEMENT_TYPE)(
    lambda call, t: prims.convert_element_type(t[0], call.args[1]) if _is_float_tensor(call.out) else None)


@defjvp(PrimIDs.CAT)
def _cat_jvp(call, t):
    tensors, dim = call.args
    if all(x is None for x in t[0]):
        return None
    return prims.cat([_or_zeros(x, a) for x, a in zip(t[0], tensors)], dim)


defjvp(PrimIDs.SCATTER_ADD)(lambda call, t: prims.scatter_add(
    _or_zeros(t[0], call.args[0]), call.args[1], _or_zeros(t[2], call.args[2]), call.args[3]))
defjvp(PrimIDs.SCATTER)(lambda call, t: prims.scatter(
    _or_zeros(t[0], call.args[0]), call.args[1], _or_zeros(t[2], call.args[2]), call.args[3]))


# -- linear algebra ----------------------------------------------------------------------
@defjvp(PrimIDs.MATMUL)
def _matmul_jvp(call, t):
    (a, b), (ta, tb) = call.args, t
    return _add(None if ta is None else prims.matmul(ta, b), None if tb is None else prims.matmul(a, tb))


# -- scans and sorting ---------------------------------------------------------------------
@defjvp(PrimIDs.CUMPROD)
def _cumprod_jvp(call, t):
    """out_i = prod_{k<=i} a_k, so out'_i = sum_{j<=i} cumprod(a with a_j replaced by t_j)_i:
    exact at zeros (no division), at O(n^2) memory along dim. A new axis j is put before dim."""
    a, dim = call.args
    if a.ndim == 0:
        return t[0]
    d = canonical_dim(dim, a.ndim)
    n = a.shape[d]
    shape = tuple(a.shape[:d]) + (n,) + tuple(a.shape[d:])
    keep = tuple(range(d)) + tuple(range(d + 1, a.ndim + 1))
    iota = prims.iota(n, start=0, step=1, device=a.device, dtype=torch.int64)
    j, k = prims.broadcast_in_dim(iota, shape, (d,)), prims.broadcast_in_dim(iota, shape, (d + 1,))
    replaced = prims.where(prims.eq(j, k), prims.broadcast_in_dim(t[0], shape, keep), prims.broadcast_in_dim(a, shape, keep))
    return prims.sum(prims.where(prims.le(j, k), prims.cumprod(replaced, d + 1), 0.0), (d,))


def _selected_jvp(call, t):
    """sort and topk pick elements of a: the values' tangent is the tangent at the picked places."""
    a, dim = call.args[0], call.args[2 if len(call.args) == 5 else 1]
    values = t[0] if a.ndim == 0 else prims.take_along_axis(t[0], call.out[1], canonical_dim(dim, a.ndim))
    return values, None


defjvp(PrimIDs.SORT, PrimIDs.TOPK)(_selected_jvp)


# -- the running statistics' update (torch/aten_backward.py) ---------------------------------
# torch's kernels write the new statistics into the running ones in place, outside autograd: the
# input's tangent does not reach them, and each keeps the tangent it had before the write, which is
# what torch.func.jvp returns for them (not the formula's (1 - momentum) * tangent). The VJP rule
# (vjp_rules_torch.py) is the transpose.
defjvp(updated_running_stats.id)(lambda call, t: (t[1], t[2]))


# -- torch-level elementwise functions with a torch-level VJP rule ---------------------------------
# Their Jacobian is diagonal, so the tangent is the VJP rule applied to the input's tangent: forward
# mode gets torch's conventions (logsigmoid at 0, a kink's bounds, where exp overflows) from the
# same formula, and the forward keeps each op whole.
def _diagonal_jvp_from_vjp(symbol_id):
    vjp = _vjp.vjp_rules[symbol_id].bwd

    def fwd(call, tangents):
        return None if not tangents or tangents[0] is None else vjp(call, tangents[0])[0]

    fwd.__name__ = fwd.__qualname__ = f"{vjp.__name__}_as_jvp"
    register_jvp(symbol_id, JVPRule(fwd))


def _elementwise_symbols():
    return (ltorch.sigmoid, ltorch.tanh, ltorch.relu, ltorch.logsigmoid, ltorch.silu, ltorch.elu, ltorch.selu,
            ltorch.celu, ltorch.hardtanh, ltorch.relu6, ltorch.hardsigmoid, ltorch.hardswish, ltorch.softplus,
            ltorch.gelu)


for _symbol in _elementwise_symbols():
    _diagonal_jvp_from_vjp(_symbol.id)


def _reduction_jvp_from_vjp(symbol_id, reduced_dims):
    """A reduction whose every output element reads its own slice of the input (a norm, a std): the VJP
    rule at a cotangent of ones gives each input element's derivative, and the tangent is the sum over
    the slice (the dims `reduced_dims(call)` names, read from the call as the VJP rule reads them) of
    derivative times tangent. torch's masks (the norm of zero) come along."""
    vjp = _vjp.vjp_rules[symbol_id].bwd

    def fwd(call, tangents):
        t = tangents[0] if tangents else None
        if t is None:
            return None
        out = call.out
        d = vjp(call, prims.full(tuple(out.shape), 1.0, device=out.device, dtype=out.dtype))[0]
        if d is None:  # a count (the 0-norm): constant where it is differentiable
            return None
        return prims.reshape(prims.sum(prims.mul(d, t), reduced_dims(call)), tuple(out.shape))

    fwd.__name__ = fwd.__qualname__ = f"{vjp.__name__}_as_jvp"
    register_jvp(symbol_id, JVPRule(fwd))


_reduction_jvp_from_vjp(ltorch.vector_norm.id, lambda call: reduction_dims(call.args[0], call.arg("dim")))
# std(x, True) is std(x, unbiased=True): its dims as the VJP rule reads them
_reduction_jvp_from_vjp(ltorch.std.id, lambda call: vjp_rules_torch._std_arguments(call, "std")[2])
