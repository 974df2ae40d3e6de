"""Reverse-mode rules for prims: `vjp_rules[prim id].bwd(call, g)` is the cotangent of each
positional argument of the prim, given `call`, the prim's RecordedCall (its arguments and
output), and the cotangent `g` of its output.

Rules are written in the torch language (`ltorch.mul`, `ltorch.sum`, `ltorch.expand`), the
vocabulary of the forward trace, so an executor that claims a torch symbol (a lowering on
`tf.torch.mul`) or a fusion executor sees the same ops in the backward as in the forward.
Prims appear only where torch has no operation of the same meaning (`prims.pad` with interior
padding, a strided `prims.slice`); executors that register prims still see every prim, one
level down in each symbol's decomposition. Rules trace like any other function, so the grad
interpreter can differentiate them again (grad of grad). On real tensors they compute
eagerly, which is how tests/test_vjp_rules.py checks each one against torch.autograd.

Conventions (the interpreter relies on them):
- a rule returns one entry per positional argument; None means "no cotangent": the
  argument is not a tensor, is not floating point, or gets zero gradient;
- a cotangent has its argument's shape and dtype: an operand that a binary prim
  broadcast (a 0-dim tensor beside a bigger one) gets its cotangent summed to ();
- a multi-output prim (var_mean, sort, topk) gets a tuple `g` with None for an output
  that has no cotangent;
- prims.cat takes a list of tensors: its first entry is a tuple, one cotangent per tensor.
Rules are for real floating dtypes; a complex tensor argument raises NotImplementedError
(complex autodiff needs a conjugation convention and a conj prim that we do not have).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import threading
from typing import Callable, NamedTuple

import torch

from thunderfn import prims
import thunderfn.torch as ltorch
from thunderfn.core import dtypes, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.symbol import Symbol
from thunderfn.prims import PrimIDs, canonical_dim, canonical_dims
from thunderfn.prims import torch_impls as prim_impls
from thunderfn.torch.opaque import torch_vjp_op
from thunderfn.torch.reductions import sum_to
from thunderfn.errors import ArgumentTypeError, InternalError, UnsupportedOpError


class RecordedCall(NamedTuple):
    """One call of a symbol as the trace recorded it, which its rule differentiates. `call.arg("is_causal")`
    reads an argument by its name in the symbol's signature, wherever the call put it (by position or by
    keyword), and its default there where the call left it out."""
    symbol: Symbol
    args: tuple    # the positional args as called (proxies/tensors, numbers, tuples); every tensor is among them
    kwargs: dict
    out: object    # the output (a tensor, or a tuple for multi-output symbols)

    def arg(self, name: str):
        """The argument `name` of this call, or the signature's default for it."""
        found = self.symbol.parameters.get(name)
        if found is None:
            raise InternalError(f"a rule read argument {name!r} of {self.symbol.print_name}, whose signature has "
                                f"none: it has {', '.join(self.symbol.parameters) or 'no named parameters'}")
        position, default = found
        if position is not None and position < len(self.args):
            return self.args[position]
        value = self.kwargs.get(name, default)
        if value is inspect.Parameter.empty:
            raise InternalError(f"the recorded call of {self.symbol.print_name} lacks its required argument {name!r}")
        return value


@dataclasses.dataclass(frozen=True)
class VJPRule:
    """How reverse mode differentiates one symbol: `bwd(call, g)` is the cotangent of each
    positional argument (the conventions above). `applies(*args, **kwargs) -> bool`, when
    given, restricts the rule to some calls of a composite symbol: the others are
    differentiated through the symbol's decomposition."""
    bwd: Callable
    applies: Callable | None = None

    def applies_to(self, bsym) -> bool:
        return self.applies is None or bool(self.applies(*bsym.args, **bsym.kwargs))


vjp_rules: dict = {}  # symbol id -> VJPRule; entered only through register_vjp


def register_vjp(symbol_id, rule: VJPRule) -> None:
    """The one way a rule enters vjp_rules: defvjp and custom_vjp's defvjp wrap it."""
    if not isinstance(rule, VJPRule):
        raise ArgumentTypeError(f"the VJP rule for {_rule_name(symbol_id)} must be a VJPRule, got {type(rule).__name__}")
    vjp_rules[symbol_id] = rule


def unregister_vjp(symbol_id) -> None:
    """Drop symbol_id's rule, if it has one (a custom_vjp that went away)."""
    vjp_rules.pop(symbol_id, None)


# outputs that never carry gradient: booleans, integers, indices and constants (and, added by
# vjp_rules_torch.py, torch-level symbols that stop it: detach); forward mode shares this set
NON_DIFFERENTIABLE = {
    PrimIDs.SIGNBIT, PrimIDs.BITWISE_NOT, PrimIDs.ISFINITE, PrimIDs.ISNAN,
    PrimIDs.EQ, PrimIDs.NE, PrimIDs.LT, PrimIDs.LE, PrimIDs.GT, PrimIDs.GE,
    PrimIDs.BITWISE_AND, PrimIDs.BITWISE_OR, PrimIDs.BITWISE_XOR, PrimIDs.BITWISE_LEFT_SHIFT,
    PrimIDs.BITWISE_RIGHT_SHIFT, PrimIDs.ARGMAX, PrimIDs.ARGMIN, PrimIDs.FULL, PrimIDs.IOTA,
    PrimIDs.NONZERO,  # (integer indices)
}

# differentiable in principle, but without a rule here
NOT_DIFFERENTIATED = {
    PrimIDs.DIGAMMA: "its derivative is polygamma(1, x), and there is no polygamma prim",
    PrimIDs.REAL: "complex autodiff is not implemented (needs a conjugation convention and a conj prim)",
    PrimIDs.IMAG: "complex autodiff is not implemented (needs a conjugation convention and a conj prim)",
}


def _is_tensor(x) -> bool:
    return isinstance(x, (TensorProxy, torch.Tensor))


def _is_float_tensor(x) -> bool:
    """A tensor (proxy or real) of a real floating dtype: what these rules give a cotangent."""
    return _is_tensor(x) and x.dtype.is_floating_point


def _rule_name(symbol_id) -> str:
    """How an error names a rule's symbol: a prim by its PrimIDs member, a torch symbol by its id."""
    return f"prims.{symbol_id.name.lower()}" if isinstance(symbol_id, PrimIDs) else str(symbol_id)


def refuse_complex(mode: str, prim_id, args) -> None:
    """Complex autodiff needs a conjugate prim we do not have: refused, naming the prim."""
    for a in _tensors_in(args):
        if a.dtype.is_complex:
            raise UnsupportedOpError(
                f"{mode} of {_rule_name(prim_id)}: complex tensors are not supported "
                f"(got an argument of dtype {a.dtype}); differentiate real and imaginary parts separately")


def defvjp(*prim_ids, applies=None):
    """Register the decorated `bwd(call, g)` as the rule of each prim id (or torch-language
    symbol id), refusing complex arguments; `applies` as in VJPRule."""
    def register(bwd):
        def checked(call: RecordedCall, g):
            refuse_complex("vjp", prim_ids[0], call.args)
            if g is None or (isinstance(g, tuple) and all(x is None for x in g)):
                return (None,) * len(call.args)  # nothing flows back (an integer output, say)
            return bwd(call, g)

        checked.__name__ = checked.__qualname__ = bwd.__name__
        checked.__doc__ = bwd.__doc__
        for pid in prim_ids:
            register_vjp(pid, VJPRule(checked, applies))
        return bwd

    return register


def rule_for(bsym) -> VJPRule | None:
    """The VJP rule that differentiates this bound symbol, or None (then its decomposition does)."""
    rule = vjp_rules.get(bsym.sym.id)
    return rule if rule is not None and rule.applies_to(bsym) else None


class _Backwards(threading.local):
    def __init__(self):
        self.tapes: list = []  # the tapes (transforms/autodiff.py) whose backward is being traced, innermost last


backwards = _Backwards()


def wants_gradient(x) -> bool:
    """Whether the backward being traced needs a cotangent for x: it depends on a differentiated
    input (a user Function's ctx.needs_input_grad, an aten backward kernel's output_mask). True
    where that is not known (x made inside a symbol's decomposition, or no backward running)."""
    if not (isinstance(x, TensorProxy) and dtypes.is_inexact(x.dtype)):
        return False
    tapes = backwards.tapes
    if not tapes:
        return True
    return x.name in tapes[-1].active or x.name not in tapes[-1].seen


def _tensors_in(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _tensors_in(a)
        elif _is_tensor(a):
            yield a


# -- helpers (in the torch language) ----------------------------------------------------------------
def _to(g, dtype):
    return g if g.dtype == dtype else ltorch.to(g, dtype)


def _zeros(like):
    return ltorch.full(tuple(like.shape), 0.0, device=like.device, dtype=like.dtype)


def _scalar(x, like):
    """A Python number as a 0-dim tensor of like's dtype, so rules can compute with it."""
    return ltorch.full((), x, device=like.device, dtype=like.dtype) if isinstance(x, numbers.Number) else x


def _ct(g, arg):
    """g as the cotangent of an elementwise operand: None unless arg is a float tensor;
    summed to () when arg is a 0-dim tensor the prim broadcast."""
    if g is None or not _is_float_tensor(arg):
        return None
    if arg.ndim == 0 and g.ndim > 0:
        g = sum_to(g, ())
    if g.device != arg.device:  # a CPU scalar tensor beside a CUDA tensor
        g = ltorch.to(g, arg.device)
    return _to(g, arg.dtype)


def _unreduce(g, a, dims):
    """g, the output of a reduction of a over dims, broadcast back to a's shape."""
    if tuple(dims) != tuple(range(len(dims))):  # expand adds leading dims itself; others need a 1 in place
        g = ltorch.reshape(g, tuple(1 if i in dims else s for i, s in enumerate(a.shape)))
    return ltorch.expand(g, tuple(a.shape))


def _reduced(a, dims) -> tuple:
    return canonical_dims(dims, a.ndim) if a.ndim else ()


def _expand(x, like):
    """A 0-dim x broadcast to like's shape, so a mask built from scalars has the result's shape."""
    return ltorch.expand(x, tuple(like.shape)) if x.ndim == 0 and like.ndim > 0 else x


def _sq(x):
    return ltorch.mul(x, x)


def _where0(pred, x):
    """x where pred, else 0."""
    return ltorch.where(pred, x, 0.0)


def _inverse(permutation) -> tuple:
    return tuple(sorted(range(len(permutation)), key=lambda i: permutation[i]))


def _rev_cumsum(x, dim):
    return ltorch.flip(ltorch.cumsum(ltorch.flip(x, (dim,)), dim), (dim,))


# -- elementwise: the partial derivatives, once -----------------------------------------------
# partials[prim id] has one function per positional input of an elementwise prim: `partial(g, *args,
# out, **kwargs)` is g times d(out)/d(that input), elementwise, for g of out's shape. Both directions
# are made from it: the VJP rule gives each float tensor input its partial at the cotangent, summed to
# the input's shape (`_ct`), and the JVP rule (jvp_rules.py) sums each input's partial at its tangent.
# A partial may return ZERO: the input's derivative is zero (reverse mode gives a tensor of zeros, as
# torch does; forward mode adds nothing); a None in place of a partial: no derivative (None).
# The table is keyed by prim id here, not written on prims.py's table lines, because partials are in
# the torch language, which the prims layer cannot import. torch's conventions (pow at zero, ties of
# maximum, atan2 at the origin) are in the partials themselves; where torch's forward mode differs from
# its reverse mode (maximum and minimum at NaN, atan2 at the origin), jvp_rules.py says so and keeps
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
    ta, tb = _scalar(a, y), _scalar(b, y)
    masked = _expand(ltorch.eq(tb, 0.0), y)
    base = ltorch.where(masked, 1.0, ta)
    return ltorch.where(masked, 0.0, ltorch.mul(g, ltorch.mul(tb, ltorch.pow(base, ltorch.sub(tb, 1.0)))))


def _pow_db(g, a, b, y):
    ta, tb = _scalar(a, y), _scalar(b, y)
    masked = _expand(ltorch.bitwise_and(ltorch.eq(ta, 0.0), ltorch.ge(tb, 0.0)), y)
    base = ltorch.where(masked, 1.0, ta)
    return ltorch.where(masked, 0.0, ltorch.mul(g, ltorch.mul(y, ltorch.log(base))))


def _atan2_recip(a, b, y):
    # torch zeroes 1 / (a² + b²) where it is infinite, so atan2(0, 0) gets gradient 0
    recip = ltorch.div(1.0, ltorch.add(_sq(_scalar(a, y)), _sq(_scalar(b, y))))
    return ltorch.where(ltorch.eq(recip, float("inf")), 0.0, recip)


def _extremum(loses):
    """The partial of maximum/minimum for the operand that loses where loses(a, b): torch splits g
    equally between tied operands; the losing operand gets 0."""
    def partial(g, a, b, y):
        ta, tb = _scalar(a, y), _scalar(b, y)
        split = ltorch.where(_expand(ltorch.eq(ta, tb), g), ltorch.mul(g, 0.5), g)
        return ltorch.where(_expand(loses(ta, tb), g), 0.0, split)

    return partial


def _mod_db(rounding_mode):
    """fmod and remainder are a - b * trunc(a / b) and a - b * floor(a / b): b's partial."""
    return lambda g, a, b, y: ltorch.mul(ltorch.neg(g), ltorch.div(_scalar(a, y), b, rounding_mode=rounding_mode))


def _div_da(g, a, b, y, rounding_mode=None):
    return ZERO if rounding_mode is not None else ltorch.div(g, b)


def _div_db(g, a, b, y, rounding_mode=None):
    if rounding_mode is not None:
        return ZERO
    return ltorch.neg(ltorch.mul(g, ltorch.div(ltorch.div(_scalar(a, b), b), b)))


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
    PrimIDs.RSQRT: (_times(lambda x, y: ltorch.mul(ltorch.mul(y, _sq(y)), -0.5)),),
    PrimIDs.RECIPROCAL: (_times(lambda x, y: ltorch.neg(_sq(y))),),
    PrimIDs.SIN: (_times(lambda x, y: ltorch.cos(x)),),
    PrimIDs.COS: (_times(lambda x, y: ltorch.neg(ltorch.sin(x))),),
    PrimIDs.TAN: (_times(lambda x, y: ltorch.add(_sq(y), 1.0)),),
    PrimIDs.ASIN: (_times(lambda x, y: ltorch.rsqrt(ltorch.sub(1.0, _sq(x)))),),
    PrimIDs.ACOS: (_times(lambda x, y: ltorch.neg(ltorch.rsqrt(ltorch.sub(1.0, _sq(x))))),),
    PrimIDs.ATAN: (_times(lambda x, y: ltorch.reciprocal(ltorch.add(_sq(x), 1.0))),),
    PrimIDs.SINH: (_times(lambda x, y: ltorch.cosh(x)),),
    PrimIDs.COSH: (_times(lambda x, y: ltorch.sinh(x)),),
    PrimIDs.TANH: (_times(lambda x, y: ltorch.sub(1.0, _sq(y))),),
    PrimIDs.ASINH: (_times(lambda x, y: ltorch.rsqrt(ltorch.add(_sq(x), 1.0))),),
    PrimIDs.ACOSH: (_times(lambda x, y: ltorch.rsqrt(ltorch.sub(_sq(x), 1.0))),),
    PrimIDs.ATANH: (_times(lambda x, y: ltorch.reciprocal(ltorch.sub(1.0, _sq(x)))),),
    PrimIDs.ERF: (_times(lambda x, y: ltorch.mul(ltorch.exp(ltorch.neg(_sq(x))), _2_OVER_SQRT_PI)),),
    PrimIDs.ERFC: (_times(lambda x, y: ltorch.mul(ltorch.exp(ltorch.neg(_sq(x))), -_2_OVER_SQRT_PI)),),
    PrimIDs.ERFINV: (_times(lambda x, y: ltorch.mul(ltorch.exp(_sq(y)), math.sqrt(math.pi) / 2)),),
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
    PrimIDs.ATAN2: (lambda g, a, b, y: ltorch.mul(g, ltorch.mul(_scalar(b, y), _atan2_recip(a, b, y))),
                    lambda g, a, b, y: ltorch.mul(g, ltorch.mul(ltorch.neg(_scalar(a, y)), _atan2_recip(a, b, y)))),
    PrimIDs.MAXIMUM: (_extremum(ltorch.lt), _extremum(ltorch.gt)),
    PrimIDs.MINIMUM: (_extremum(ltorch.gt), _extremum(ltorch.lt)),
    # copysign: g * sign(a) * sign(b) in torch's form, out / a, 0 where a == 0; b's gradient is zeros, as torch's
    PrimIDs.COPYSIGN: (lambda g, a, b, y: ltorch.mul(g, ltorch.where(_expand(ltorch.eq(a, 0.0), y), 0.0, ltorch.div(y, a))),
                       _zero),
    # nextafter(a, b) is a, one ulp towards b: torch passes g to a, except where a == b, where it gives 0
    PrimIDs.NEXTAFTER: (lambda g, a, b, y: _where0(ltorch.ne(a, b), g), _zero),
    PrimIDs.WHERE: (None, lambda g, pred, a, b, y: _where0(pred, g), lambda g, pred, a, b, y: ltorch.where(pred, 0.0, g)),
}


def vjp_from_partials(fns) -> Callable:
    """The VJP rule of an elementwise prim with these partials (one per positional input): each float
    tensor input gets its partial at g, summed back to its shape; nothing for a non-float output."""
    def rule(call, g):
        args, out = call.args, call.out
        if not _is_float_tensor(out):
            return (None,) * len(args)
        cts = []
        for arg, partial in zip(args, fns):
            if partial is None or not _is_float_tensor(arg):
                cts.append(None)
                continue
            d = partial(g, *args, out, **call.kwargs)
            cts.append(_zeros(arg) if d is ZERO else _ct(d, arg))
        return tuple(cts)

    return rule


for _prim_id, _fns in partials.items():
    defvjp(_prim_id)(vjp_from_partials(_fns))


# -- reductions --------------------------------------------------------------------------
@defvjp(PrimIDs.SUM)
def _sum_vjp(call, g):
    a, dims = call.args
    return (_unreduce(g, a, _reduced(a, dims)) if _is_float_tensor(a) else None), None


@defvjp(PrimIDs.PROD)
def _prod_vjp(call, g):
    """Product of all the other elements, by exclusive prefix and suffix products (no
    division, so zeros in the input get torch's gradient)."""
    a, dims = call.args
    if not _is_float_tensor(a):
        return None, None
    dims = _reduced(a, dims)
    if not dims:
        return g, None
    if a.numel() == 0:  # nothing to differentiate: the empty gradient
        return ltorch.full(tuple(a.shape), 0.0, device=a.device, dtype=a.dtype), None
    kept = [i for i in range(a.ndim) if i not in dims]
    perm = tuple(kept + list(dims))
    moved = ltorch.permute(a, perm)
    flat_shape = tuple(a.shape[i] for i in kept) + (math.prod(a.shape[d] for d in dims),)
    flat = ltorch.reshape(moved, flat_shape)
    last = len(flat_shape) - 1
    shift = tuple((0, 0, 0) for _ in kept) + ((1, -1, 0),)  # shift right by one, filling with 1
    before = prims.pad(ltorch.cumprod(flat, last), 1.0, shift)
    after = ltorch.flip(prims.pad(ltorch.cumprod(ltorch.flip(flat, (last,)), last), 1.0, shift), (last,))
    others = ltorch.reshape(ltorch.mul(before, after), tuple(moved.shape))
    return ltorch.mul(_unreduce(g, a, dims), ltorch.permute(others, _inverse(perm))), None


def _extremum_reduction_vjp(call, g):
    """torch (amax, amin) distributes g equally among the elements tied for the extremum;
    where the extremum is NaN no element equals it, and the gradient is NaN, as torch's."""
    a, dims = call.args
    if not _is_float_tensor(a):
        return None, None
    dims = _reduced(a, dims)
    hit = ltorch.to(ltorch.eq(a, _unreduce(call.out, a, dims)), a.dtype)
    count = ltorch.sum(hit, dims) if dims else hit
    return ltorch.mul(hit, _unreduce(ltorch.div(g, count), a, dims)), None


defvjp(PrimIDs.AMAX, PrimIDs.AMIN)(_extremum_reduction_vjp)


def _var_mean_vjp(a, dims, correction, g_var, g_mean):
    dims = canonical_dims(dims, a.ndim) if a.ndim else ()
    n = math.prod(a.shape[d] for d in dims)
    da = None
    if g_var is not None:
        mean = _unreduce(ltorch.div(ltorch.sum(a, dims), n), a, dims) if dims else a
        da = ltorch.mul(_unreduce(g_var, a, dims), ltorch.div(ltorch.mul(ltorch.sub(a, mean), 2.0), n - correction))
    if g_mean is not None:
        dm = _unreduce(ltorch.div(g_mean, n), a, dims)
        da = dm if da is None else ltorch.add(da, dm)
    return da


defvjp(PrimIDs.VAR)(lambda call, g: (_var_mean_vjp(*call.args, call.arg("correction"), g, None), None))
defvjp(PrimIDs.VAR_MEAN)(lambda call, g: (_var_mean_vjp(*call.args, call.arg("correction"), *g), None))


# -- shapes ------------------------------------------------------------------------------
@defvjp(PrimIDs.BROADCAST_IN_DIM)
def _broadcast_in_dim_vjp(call, g):
    a, shape, bdims = call.args
    if not _is_float_tensor(a):
        return None, None, None
    summed = [d for d in range(len(shape)) if d not in bdims]
    summed += [d for i, d in enumerate(bdims) if symbolic.was_expanded(a.shape[i], shape[d])]
    s = ltorch.sum(g, tuple(sorted(summed))) if summed else g
    return (s if symbolic.same_shape(s.shape, a.shape) else ltorch.reshape(s, tuple(a.shape))), None, None


defvjp(PrimIDs.RESHAPE)(lambda call, g: (_ct(ltorch.reshape(g, tuple(call.args[0].shape)), call.args[0]), None))
defvjp(PrimIDs.SQUEEZE)(lambda call, g: (_ct(ltorch.reshape(g, tuple(call.args[0].shape)), call.args[0]), None))
defvjp(PrimIDs.TRANSPOSE)(lambda call, g: (_ct(ltorch.permute(g, _inverse(call.args[1])), call.args[0]), None))
defvjp(PrimIDs.FLIP)(lambda call, g: (_ct(ltorch.flip(g, call.args[1]), call.args[0]), None))


@defvjp(PrimIDs.SLICE)
def _slice_vjp(call, g):
    """A strided slice transposes to interior padding."""
    a, starts, ends = call.args[:3]
    strides = call.args[3] if len(call.args) > 3 and call.args[3] is not None else (1,) * a.ndim
    if not _is_float_tensor(a):
        return (None,) * len(call.args)
    config = []
    for n, s, st, m in zip(a.shape, starts, strides, g.shape):
        dilated = m + (m - 1) * (st - 1) if m else 0
        config.append((s, n - s - dilated, st - 1 if m else 0))
    return (prims.pad(g, 0.0, tuple(config)),) + (None,) * (len(call.args) - 1)


@defvjp(PrimIDs.PAD)
def _pad_vjp(call, g):
    """Undo low/high padding (negative pads crop, so their negation pads back), then take
    every (interior + 1)-th element."""
    a, _, config = call.args
    if not _is_float_tensor(a):
        return None, None, None
    unpadded = prims.pad(g, 0.0, tuple((-lo, -hi, 0) for lo, hi, _ in config))
    if any(i for _, _, i in config):
        unpadded = prims.slice(unpadded, (0,) * a.ndim, tuple(unpadded.shape), tuple(i + 1 for _, _, i in config))
    return unpadded, None, None


@defvjp(PrimIDs.CAT)
def _cat_vjp(call, g):
    tensors, dim = call.args
    d = canonical_dim(dim, tensors[0].ndim)
    cts, start = [], 0
    for t in tensors:
        stop = start + t.shape[d]
        cts.append(_ct(ltorch.narrow(g, d, start, stop - start), t))
        start = stop
    return tuple(cts), None


# -- indexing and scattering ---------------------------------------------------------------
@defvjp(PrimIDs.TAKE)
def _take_vjp(call, g):
    a, index, dim = call.args
    if not _is_float_tensor(a):
        return None, None, None
    if a.ndim == 0:
        return g, None, None
    d = canonical_dim(dim, a.ndim)
    flat = ltorch.reshape(index, (1,)) if index.ndim == 0 else index
    # index along d, repeated along every other dim of g
    spread = ltorch.expand(ltorch.reshape(flat, tuple(-1 if i == d else 1 for i in range(g.ndim))), tuple(g.shape))
    return ltorch.scatter_add(_zeros(a), d, spread, g), None, None


@defvjp(PrimIDs.TAKE_ALONG_AXIS)
def _take_along_axis_vjp(call, g):
    a, index, dim = call.args
    if not _is_float_tensor(a):
        return None, None, None
    if a.ndim == 0:  # every index is 0: each element of g is a
        return ltorch.sum(g) if g.ndim else g, None, None
    return ltorch.scatter_add(_zeros(a), dim, index, g), None, None


@defvjp(PrimIDs.SCATTER_ADD)
def _scatter_add_vjp(call, g):
    a, index, value, dim = call.args
    return _ct(g, a), None, _ct(ltorch.gather(g, dim, index), value), None


@defvjp(PrimIDs.SCATTER)
def _scatter_vjp(call, g):
    """Overwritten positions of `a` get no cotangent; every index reads g back into
    `value`, duplicates included (as torch's gather does)."""
    a, index, value, dim = call.args
    if not _is_float_tensor(a):
        return None, None, None, None
    return ltorch.scatter(g, dim, index, _zeros(value)), None, ltorch.gather(g, dim, index), None


# -- conversions -------------------------------------------------------------------------
@defvjp(PrimIDs.CONVERT_ELEMENT_TYPE)
def _convert_element_type_vjp(call, g):
    a = call.args[0]
    return (_to(g, a.dtype) if _is_float_tensor(a) and _is_float_tensor(call.out) else None), None


defvjp(PrimIDs.DEVICE_PUT)(lambda call, g: (_ct(ltorch.to(g, call.args[0].device), call.args[0]), None))


# -- linear algebra ----------------------------------------------------------------------
def _matrix_transpose(x):
    return ltorch.permute(x, tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


@defvjp(PrimIDs.MATMUL)
def _matmul_vjp(call, g):
    """Promote vectors to matrices (a to a row, b to a column), take the matrix rule, sum
    over the batch dims broadcasting added, and drop the promoted dims again."""
    a, b = call.args
    if not _is_float_tensor(a):
        return None, None
    if a.ndim == 1 and b.ndim == 1:
        return ltorch.mul(g, b), ltorch.mul(g, a)
    a2 = ltorch.reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = ltorch.reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    batch = tuple(g.shape[:g.ndim - (a.ndim > 1) - (b.ndim > 1)])
    g2 = ltorch.reshape(g, batch + (a2.shape[-2], b2.shape[-1]))
    da = sum_to(ltorch.matmul(g2, _matrix_transpose(b2)), a2.shape)
    db = sum_to(ltorch.matmul(_matrix_transpose(a2), g2), b2.shape)
    return ltorch.reshape(da, tuple(a.shape)), ltorch.reshape(db, tuple(b.shape))


# -- scans and sorting ---------------------------------------------------------------------
@defvjp(PrimIDs.CUMSUM)
def _cumsum_vjp(call, g):
    a, dim = call.args
    if not _is_float_tensor(a):
        return None, None
    return (g if a.ndim == 0 else _rev_cumsum(g, canonical_dim(dim, a.ndim))), None


@defvjp(PrimIDs.CUMPROD)
def _cumprod_vjp(call, g):
    """torch computes this gradient at run time. With zeros in the input, an exact gradient
    needs the position of the first zero, which traceable ops only give to first order (a
    second derivative would be wrong at that zero); run by torch, first order is exact and a
    second differentiation is refused (torch_vjp has no rule) instead of silently wrong."""
    a, dim = call.args
    if not _is_float_tensor(a):
        return None, None
    (ct,) = torch_vjp_op(prim_impls[PrimIDs.CUMPROD], (a, dim), {}, (g,), (0,), None)
    return ct, None


def _selected_vjp(call, g):
    """sort and topk pick elements of a: their value cotangent goes back to the picked places."""
    a, dim = call.args[0], call.args[2 if len(call.args) == 5 else 1]
    g_values = g[0]
    if g_values is None or not _is_float_tensor(a):
        return (None,) * len(call.args)
    if a.ndim == 0:
        return (g_values,) + (None,) * (len(call.args) - 1)
    d = canonical_dim(dim, a.ndim)
    return (ltorch.scatter_add(_zeros(a), d, call.out[1], g_values),) + (None,) * (len(call.args) - 1)


defvjp(PrimIDs.SORT, PrimIDs.TOPK)(_selected_vjp)
