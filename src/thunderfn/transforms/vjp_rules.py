"""Reverse-mode rules for prims: `vjp_rules[prim id](res, g)` is the cotangent of each
positional argument of the prim, given the cotangent `g` of its output.

Rules are written in prims only, so they trace like any other function and the grad
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

import math
import numbers
from typing import NamedTuple

import torch

from thunderfn import prims
from thunderfn.core.proxies import TensorProxy
from thunderfn.prims import PrimIDs, canonical_dim, canonical_dims
from thunderfn.prims import torch_impls as prim_impls
from thunderfn.torch.opaque import torch_vjp_op


class Residuals(NamedTuple):
    args: tuple    # the prim's positional args as called (proxies/tensors, numbers, tuples)
    kwargs: dict
    out: object    # the prim's output (a tensor, or a tuple for multi-output prims)


vjp_rules: dict = {}

# outputs that never carry gradient: booleans, integers, indices and constants (and, added by
# vjp_rules_torch.py, torch-level symbols that stop it: detach); forward mode shares this set
NON_DIFFERENTIABLE = {
    PrimIDs.SIGNBIT, PrimIDs.BITWISE_NOT, PrimIDs.ISFINITE, PrimIDs.ISNAN,
    PrimIDs.EQ, PrimIDs.NE, PrimIDs.LT, PrimIDs.LE, PrimIDs.GT, PrimIDs.GE,
    PrimIDs.BITWISE_AND, PrimIDs.BITWISE_OR, PrimIDs.BITWISE_XOR, PrimIDs.BITWISE_LEFT_SHIFT,
    PrimIDs.BITWISE_RIGHT_SHIFT, PrimIDs.ARGMAX, PrimIDs.ARGMIN, PrimIDs.FULL, PrimIDs.IOTA,
}

# differentiable in principle, but without a rule here
NOT_DIFFERENTIATED = {
    PrimIDs.DIGAMMA: "its derivative is polygamma(1, x), and there is no polygamma prim",
    PrimIDs.REAL: "complex autodiff is not implemented (needs a conjugation convention and a conj prim)",
    PrimIDs.IMAG: "complex autodiff is not implemented (needs a conjugation convention and a conj prim)",
}


def _is_tensor(x) -> bool:
    return isinstance(x, (TensorProxy, torch.Tensor))


def _differentiable(x) -> bool:
    return _is_tensor(x) and x.dtype.is_floating_point


def _rule_name(symbol_id) -> str:
    """How an error names a rule's symbol: a prim by its PrimIDs member, a torch symbol by its id."""
    return f"prims.{symbol_id.name.lower()}" if isinstance(symbol_id, PrimIDs) else str(symbol_id)


def refuse_complex(mode: str, prim_id, args) -> None:
    """Complex autodiff needs a conjugate prim we do not have: refused, naming the prim."""
    for a in _tensors_in(args):
        if a.dtype.is_complex:
            raise NotImplementedError(
                f"{mode} of {_rule_name(prim_id)}: complex tensors are not supported "
                f"(got an argument of dtype {a.dtype}); differentiate real and imaginary parts separately")


def defvjp(*prim_ids, applies=None):
    """Register the decorated `bwd(res, g)` as the rule of each prim id. `applies(*args,
    **kwargs) -> bool`, when given, restricts the rule to some calls of a composite symbol:
    the others are differentiated through the symbol's decomposition."""
    def register(bwd):
        def rule(res: Residuals, g):
            refuse_complex("vjp", prim_ids[0], res.args)
            if g is None or (isinstance(g, tuple) and all(x is None for x in g)):
                return (None,) * len(res.args)  # nothing flows back (an integer output, say)
            return bwd(res, g)

        rule.__name__ = rule.__qualname__ = bwd.__name__
        rule.__doc__ = bwd.__doc__
        rule.applies = applies
        for pid in prim_ids:
            vjp_rules[pid] = rule
        return bwd

    return register


def rule_for(bsym):
    """The VJP rule that differentiates this bound symbol, or None (then its decomposition does)."""
    rule = vjp_rules.get(bsym.sym.id)
    applies = getattr(rule, "applies", None)
    if applies is not None and not applies(*bsym.args, **bsym.kwargs):
        return None
    return rule


def _tensors_in(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _tensors_in(a)
        elif _is_tensor(a):
            yield a


# -- helpers (prims only) ----------------------------------------------------------------
def _to(g, dtype):
    return g if g.dtype == dtype else prims.convert_element_type(g, dtype)


def _zeros(like):
    return prims.full(tuple(like.shape), 0.0, device=like.device, dtype=like.dtype)


def _zeros_ct(arg):
    """The cotangent torch gives an operand its formula ignores (`zeros_like`): zeros for a
    floating tensor, so its .grad is a tensor as in eager; None for anything else."""
    return _zeros(arg) if _differentiable(arg) else None


def _scalar(x, like):
    """A Python number as a 0-dim tensor of like's dtype, so rules can compute with it."""
    return prims.full((), x, device=like.device, dtype=like.dtype) if isinstance(x, numbers.Number) else x


def _ct(g, arg):
    """g as the cotangent of an elementwise operand: None unless arg is a float tensor;
    summed to () when arg is a 0-dim tensor the prim broadcast."""
    if g is None or not _differentiable(arg):
        return None
    if arg.ndim == 0 and g.ndim > 0:
        g = prims.sum(g, tuple(range(g.ndim)))
    if g.device != arg.device:  # a CPU scalar tensor beside a CUDA tensor
        g = prims.device_put(g, arg.device)
    return _to(g, arg.dtype)


def _sum_to(x, shape):
    """Undo numpy-style broadcasting of something of `shape` to x's shape: sum the leading
    dims and the size-1 dims that were expanded, then reshape."""
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
    if dims:
        x = prims.sum(x, dims)
    return x if tuple(x.shape) == shape else prims.reshape(x, shape)


def _unreduce(g, a, dims):
    """g, the output of a reduction of a over dims, broadcast back to a's shape."""
    return prims.broadcast_in_dim(g, tuple(a.shape), tuple(i for i in range(a.ndim) if i not in dims))


def _reduced(a, dims) -> tuple:
    return canonical_dims(dims, a.ndim) if a.ndim else ()


def _expand(x, like):
    """A 0-dim x broadcast to like's shape: prims.where wants its predicate full-size."""
    return prims.broadcast_in_dim(x, tuple(like.shape), ()) if x.ndim == 0 and like.ndim > 0 else x


def _sq(x):
    return prims.mul(x, x)


def _where0(pred, x):
    """x where pred, else 0."""
    return prims.where(pred, x, 0.0)


def _inverse(permutation) -> tuple:
    return tuple(sorted(range(len(permutation)), key=lambda i: permutation[i]))


def _rev_cumsum(x, dim):
    return prims.flip(prims.cumsum(prims.flip(x, (dim,)), dim), (dim,))


# -- elementwise unary: d(out)/d(x) times g; x = res.args[0], y = res.out ------------------
_LN2, _LN10, _2_OVER_SQRT_PI = math.log(2.0), math.log(10.0), 2.0 / math.sqrt(math.pi)

# d(out)/d(x) of each elementwise unary prim, in terms of x and out = y: written once, used by
# the VJP rule below (g * derivative) and the JVP rule in jvp_rules.py (t * derivative)
unary_derivatives = {
    PrimIDs.ABS: lambda x, y: prims.sign(x),
    PrimIDs.EXP: lambda x, y: y,
    PrimIDs.EXP2: lambda x, y: prims.mul(y, _LN2),
    PrimIDs.EXPM1: lambda x, y: prims.add(y, 1.0),
    PrimIDs.LOG: lambda x, y: prims.reciprocal(x),
    PrimIDs.LOG1P: lambda x, y: prims.reciprocal(prims.add(x, 1.0)),
    PrimIDs.LOG2: lambda x, y: prims.reciprocal(prims.mul(x, _LN2)),
    PrimIDs.LOG10: lambda x, y: prims.reciprocal(prims.mul(x, _LN10)),
    PrimIDs.SQRT: lambda x, y: prims.div(0.5, y),
    PrimIDs.RSQRT: lambda x, y: prims.mul(prims.mul(y, _sq(y)), -0.5),
    PrimIDs.RECIPROCAL: lambda x, y: prims.neg(_sq(y)),
    PrimIDs.SIN: lambda x, y: prims.cos(x),
    PrimIDs.COS: lambda x, y: prims.neg(prims.sin(x)),
    PrimIDs.TAN: lambda x, y: prims.add(_sq(y), 1.0),
    PrimIDs.ASIN: lambda x, y: prims.rsqrt(prims.sub(1.0, _sq(x))),
    PrimIDs.ACOS: lambda x, y: prims.neg(prims.rsqrt(prims.sub(1.0, _sq(x)))),
    PrimIDs.ATAN: lambda x, y: prims.reciprocal(prims.add(_sq(x), 1.0)),
    PrimIDs.SINH: lambda x, y: prims.cosh(x),
    PrimIDs.COSH: lambda x, y: prims.sinh(x),
    PrimIDs.TANH: lambda x, y: prims.sub(1.0, _sq(y)),
    PrimIDs.ASINH: lambda x, y: prims.rsqrt(prims.add(_sq(x), 1.0)),
    PrimIDs.ACOSH: lambda x, y: prims.rsqrt(prims.sub(_sq(x), 1.0)),
    PrimIDs.ATANH: lambda x, y: prims.reciprocal(prims.sub(1.0, _sq(x))),
    PrimIDs.ERF: lambda x, y: prims.mul(prims.exp(prims.neg(_sq(x))), _2_OVER_SQRT_PI),
    PrimIDs.ERFC: lambda x, y: prims.mul(prims.exp(prims.neg(_sq(x))), -_2_OVER_SQRT_PI),
    PrimIDs.ERFINV: lambda x, y: prims.mul(prims.exp(_sq(y)), math.sqrt(math.pi) / 2),
    PrimIDs.LGAMMA: lambda x, y: prims.digamma(x),
}


def _unary_vjp(derivative):
    def rule(res, g):
        x = res.args[0]
        return (prims.mul(g, derivative(x, res.out)) if _differentiable(x) else None,)

    return rule


for _prim_id, _derivative in unary_derivatives.items():
    defvjp(_prim_id)(_unary_vjp(_derivative))
defvjp(PrimIDs.NEG)(lambda res, g: (_ct(prims.neg(g), res.args[0]),))
# piecewise constant: a zero gradient (a tensor of zeros, not None), as torch gives
defvjp(PrimIDs.FLOOR, PrimIDs.CEIL, PrimIDs.ROUND, PrimIDs.TRUNC, PrimIDs.SIGN)(
    lambda res, g: (_zeros_ct(res.args[0]),))


# -- elementwise binary: a, b = res.args; either may be a number or a 0-dim tensor ---------
defvjp(PrimIDs.ADD)(lambda res, g: (_ct(g, res.args[0]), _ct(g, res.args[1])))
defvjp(PrimIDs.SUB)(lambda res, g: (_ct(g, res.args[0]), _ct(prims.neg(g), res.args[1])))
defvjp(PrimIDs.MUL)(lambda res, g: (_ct(prims.mul(g, res.args[1]), res.args[0]), _ct(prims.mul(g, res.args[0]), res.args[1])))
# nextafter(a, b) is a, one ulp towards b: torch passes g to a
# torch passes g to a, except where a == b, where it gives 0
defvjp(PrimIDs.NEXTAFTER)(lambda res, g: (_ct(_where0(prims.ne(res.args[0], res.args[1]), g), res.args[0]),
                                           _zeros_ct(res.args[1])))
# fmod and remainder are a - b * trunc(a / b) and a - b * floor(a / b)
defvjp(PrimIDs.FMOD)(lambda res, g: _mod_vjp(res, g, "trunc"))
defvjp(PrimIDs.REMAINDER)(lambda res, g: _mod_vjp(res, g, "floor"))


def _mod_vjp(res, g, rounding_mode):
    a, b = res.args
    if not _differentiable(res.out):
        return None, None
    db = _ct(prims.mul(prims.neg(g), prims.div(_scalar(a, res.out), b, rounding_mode=rounding_mode)), b) if _is_tensor(b) else None
    return _ct(g, a), db


@defvjp(PrimIDs.DIV)
def _div_vjp(res, g):
    a, b = res.args
    if res.kwargs.get("rounding_mode") is not None or not _differentiable(res.out):
        return _zeros_ct(a), _zeros_ct(b)  # piecewise constant: zeros, as torch gives
    da = _ct(prims.div(g, b), a) if _is_tensor(a) else None
    db = _ct(prims.neg(prims.mul(g, prims.div(prims.div(_scalar(a, b), b), b))), b) if _is_tensor(b) else None
    return da, db


@defvjp(PrimIDs.POW)
def _pow_vjp(res, g):
    a, b = res.args
    if not _differentiable(res.out):
        return None, None
    ta, tb = _scalar(a, res.out), _scalar(b, res.out)
    # torch's conventions: d/da is 0 where b == 0 (even at a == 0), d/db is 0 where a == 0 and b >= 0.
    # The masked-out branch computes on a base of 1, so that its own derivative stays finite
    # (no 0 * inf = nan when this rule is differentiated again).
    da = db = None
    if _is_tensor(a):
        masked = _expand(prims.eq(tb, 0.0), res.out)
        base = prims.where(masked, 1.0, ta)
        da = _ct(prims.where(masked, 0.0, prims.mul(g, prims.mul(tb, prims.pow(base, prims.sub(tb, 1.0))))), a)
    if _is_tensor(b):
        masked = _expand(prims.bitwise_and(prims.eq(ta, 0.0), prims.ge(tb, 0.0)), res.out)
        base = prims.where(masked, 1.0, ta)
        db = _ct(prims.where(masked, 0.0, prims.mul(g, prims.mul(res.out, prims.log(base)))), b)
    return da, db


@defvjp(PrimIDs.ATAN2)
def _atan2_vjp(res, g):
    a, b = res.args
    ta, tb = _scalar(a, res.out), _scalar(b, res.out)
    # torch zeroes 1 / (a² + b²) where it is infinite, so atan2(0, 0) gets gradient 0
    recip = prims.div(1.0, prims.add(_sq(ta), _sq(tb)))
    recip = prims.where(prims.eq(recip, float("inf")), 0.0, recip)
    return _ct(prims.mul(g, prims.mul(tb, recip)), a), _ct(prims.mul(g, prims.mul(prims.neg(ta), recip)), b)


def _extremum_vjp(res, g, a_loses, b_loses):
    """torch splits g equally between tied operands; the losing operand gets 0."""
    a, b = res.args
    if not _differentiable(res.out):
        return None, None
    ta, tb = _scalar(a, res.out), _scalar(b, res.out)
    split = prims.where(_expand(prims.eq(ta, tb), g), prims.mul(g, 0.5), g)
    return (_ct(prims.where(_expand(a_loses(ta, tb), g), 0.0, split), a) if _is_tensor(a) else None,
            _ct(prims.where(_expand(b_loses(ta, tb), g), 0.0, split), b) if _is_tensor(b) else None)


defvjp(PrimIDs.MAXIMUM)(lambda res, g: _extremum_vjp(res, g, prims.lt, prims.gt))
defvjp(PrimIDs.MINIMUM)(lambda res, g: _extremum_vjp(res, g, prims.gt, prims.lt))


@defvjp(PrimIDs.COPYSIGN)
def _copysign_vjp(res, g):
    a, b = res.args
    if not _is_tensor(a):
        return None, _zeros_ct(b)
    # g * sign(a) * sign(b) in torch's form: out / a, 0 where a == 0; b's gradient is zeros, as torch's
    return (_ct(prims.mul(g, prims.where(_expand(prims.eq(a, 0.0), res.out), 0.0, prims.div(res.out, a))), a),
            _zeros_ct(b))


@defvjp(PrimIDs.WHERE)
def _where_vjp(res, g):
    pred, a, b = res.args
    return None, _ct(_where0(pred, g), a), _ct(prims.where(pred, 0.0, g), b)


# -- reductions --------------------------------------------------------------------------
@defvjp(PrimIDs.SUM)
def _sum_vjp(res, g):
    a, dims = res.args
    return (_unreduce(g, a, _reduced(a, dims)) if _differentiable(a) else None), None


@defvjp(PrimIDs.PROD)
def _prod_vjp(res, g):
    """Product of all the other elements, by exclusive prefix and suffix products (no
    division, so zeros in the input get torch's gradient)."""
    a, dims = res.args
    if not _differentiable(a):
        return None, None
    dims = _reduced(a, dims)
    if not dims:
        return g, None
    if a.numel() == 0:  # nothing to differentiate: the empty gradient
        return prims.full(tuple(a.shape), 0.0, device=a.device, dtype=a.dtype), None
    kept = [i for i in range(a.ndim) if i not in dims]
    perm = tuple(kept + list(dims))
    moved = prims.transpose(a, perm)
    flat_shape = tuple(a.shape[i] for i in kept) + (math.prod(a.shape[d] for d in dims),)
    flat = prims.reshape(moved, flat_shape)
    last = len(flat_shape) - 1
    shift = tuple((0, 0, 0) for _ in kept) + ((1, -1, 0),)  # shift right by one, filling with 1
    before = prims.pad(prims.cumprod(flat, last), 1.0, shift)
    after = prims.flip(prims.pad(prims.cumprod(prims.flip(flat, (last,)), last), 1.0, shift), (last,))
    others = prims.reshape(prims.mul(before, after), tuple(moved.shape))
    return prims.mul(_unreduce(g, a, dims), prims.transpose(others, _inverse(perm))), None


def _extremum_reduction_vjp(res, g):
    """torch (amax, amin) distributes g equally among the elements tied for the extremum;
    where the extremum is NaN no element equals it, and the gradient is NaN, as torch's."""
    a, dims = res.args
    if not _differentiable(a):
        return None, None
    dims = _reduced(a, dims)
    hit = prims.convert_element_type(prims.eq(a, _unreduce(res.out, a, dims)), a.dtype)
    count = prims.sum(hit, dims) if dims else hit
    return prims.mul(hit, _unreduce(prims.div(g, count), a, dims)), None


defvjp(PrimIDs.AMAX, PrimIDs.AMIN)(_extremum_reduction_vjp)


def _var_mean_vjp(a, dims, correction, g_var, g_mean):
    dims = canonical_dims(dims, a.ndim) if a.ndim else ()
    n = math.prod(a.shape[d] for d in dims)
    da = None
    if g_var is not None:
        mean = _unreduce(prims.div(prims.sum(a, dims), n), a, dims) if dims else a
        da = prims.mul(_unreduce(g_var, a, dims), prims.div(prims.mul(prims.sub(a, mean), 2.0), n - correction))
    if g_mean is not None:
        dm = _unreduce(prims.div(g_mean, n), a, dims)
        da = dm if da is None else prims.add(da, dm)
    return da


defvjp(PrimIDs.VAR)(lambda res, g: (_var_mean_vjp(*res.args, res.kwargs["correction"], g, None), None))
defvjp(PrimIDs.VAR_MEAN)(lambda res, g: (_var_mean_vjp(*res.args, res.kwargs["correction"], *g), None))


# -- shapes ------------------------------------------------------------------------------
@defvjp(PrimIDs.BROADCAST_IN_DIM)
def _broadcast_in_dim_vjp(res, g):
    a, shape, bdims = res.args
    if not _differentiable(a):
        return None, None, None
    summed = [d for d in range(len(shape)) if d not in bdims]
    summed += [d for i, d in enumerate(bdims) if a.shape[i] == 1 and shape[d] != 1]
    s = prims.sum(g, tuple(sorted(summed))) if summed else g
    return (s if tuple(s.shape) == tuple(a.shape) else prims.reshape(s, tuple(a.shape))), None, None


defvjp(PrimIDs.RESHAPE)(lambda res, g: (_ct(prims.reshape(g, tuple(res.args[0].shape)), res.args[0]), None))
defvjp(PrimIDs.SQUEEZE)(lambda res, g: (_ct(prims.reshape(g, tuple(res.args[0].shape)), res.args[0]), None))
defvjp(PrimIDs.TRANSPOSE)(lambda res, g: (_ct(prims.transpose(g, _inverse(res.args[1])), res.args[0]), None))
defvjp(PrimIDs.FLIP)(lambda res, g: (_ct(prims.flip(g, res.args[1]), res.args[0]), None))


@defvjp(PrimIDs.SLICE)
def _slice_vjp(res, g):
    """A strided slice transposes to interior padding."""
    a, starts, ends = res.args[:3]
    strides = res.args[3] if len(res.args) > 3 and res.args[3] is not None else (1,) * a.ndim
    if not _differentiable(a):
        return (None,) * len(res.args)
    config = []
    for n, s, st, m in zip(a.shape, starts, strides, g.shape):
        dilated = m + (m - 1) * (st - 1) if m else 0
        config.append((s, n - s - dilated, st - 1 if m else 0))
    return (prims.pad(g, 0.0, tuple(config)),) + (None,) * (len(res.args) - 1)


@defvjp(PrimIDs.PAD)
def _pad_vjp(res, g):
    """Undo low/high padding (negative pads crop, so their negation pads back), then take
    every (interior + 1)-th element."""
    a, _, config = res.args
    if not _differentiable(a):
        return None, None, None
    unpadded = prims.pad(g, 0.0, tuple((-lo, -hi, 0) for lo, hi, _ in config))
    if any(i for _, _, i in config):
        unpadded = prims.slice(unpadded, (0,) * a.ndim, tuple(unpadded.shape), tuple(i + 1 for _, _, i in config))
    return unpadded, None, None


@defvjp(PrimIDs.CAT)
def _cat_vjp(res, g):
    tensors, dim = res.args
    d = canonical_dim(dim, tensors[0].ndim)
    cts, start = [], 0
    for t in tensors:
        stop = start + t.shape[d]
        starts, stops = [0] * g.ndim, list(g.shape)
        starts[d], stops[d] = start, stop
        cts.append(_ct(prims.slice(g, tuple(starts), tuple(stops)), t))
        start = stop
    return tuple(cts), None


# -- indexing and scattering ---------------------------------------------------------------
@defvjp(PrimIDs.TAKE)
def _take_vjp(res, g):
    a, index, dim = res.args
    if not _differentiable(a):
        return None, None, None
    if a.ndim == 0:
        return g, None, None
    d = canonical_dim(dim, a.ndim)
    flat = prims.reshape(index, (1,)) if index.ndim == 0 else index
    spread = prims.broadcast_in_dim(flat, tuple(g.shape), (d,))
    return prims.scatter_add(_zeros(a), spread, g, d), None, None


@defvjp(PrimIDs.TAKE_ALONG_AXIS)
def _take_along_axis_vjp(res, g):
    a, index, dim = res.args
    return (prims.scatter_add(_zeros(a), index, g, dim) if _differentiable(a) else None), None, None


@defvjp(PrimIDs.SCATTER_ADD)
def _scatter_add_vjp(res, g):
    a, index, value, dim = res.args
    return _ct(g, a), None, _ct(prims.take_along_axis(g, index, dim), value), None


@defvjp(PrimIDs.SCATTER)
def _scatter_vjp(res, g):
    """Overwritten positions of `a` get no cotangent; every index reads g back into
    `value`, duplicates included (as torch's gather does)."""
    a, index, value, dim = res.args
    if not _differentiable(a):
        return None, None, None, None
    return prims.scatter(g, index, _zeros(value), dim), None, prims.take_along_axis(g, index, dim), None


# -- conversions -------------------------------------------------------------------------
@defvjp(PrimIDs.CONVERT_ELEMENT_TYPE)
def _convert_element_type_vjp(res, g):
    a = res.args[0]
    return (_to(g, a.dtype) if _differentiable(a) and _differentiable(res.out) else None), None


defvjp(PrimIDs.DEVICE_PUT)(lambda res, g: (_ct(prims.device_put(g, res.args[0].device), res.args[0]), None))


# -- linear algebra ----------------------------------------------------------------------
def _matrix_transpose(x):
    return prims.transpose(x, tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


@defvjp(PrimIDs.MATMUL)
def _matmul_vjp(res, g):
    """Promote vectors to matrices (a to a row, b to a column), take the matrix rule, sum
    over the batch dims broadcasting added, and drop the promoted dims again."""
    a, b = res.args
    if not _differentiable(a):
        return None, None
    if a.ndim == 1 and b.ndim == 1:
        return prims.mul(g, b), prims.mul(g, a)
    a2 = prims.reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = prims.reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    batch = tuple(g.shape[:g.ndim - (a.ndim > 1) - (b.ndim > 1)])
    g2 = prims.reshape(g, batch + (a2.shape[-2], b2.shape[-1]))
    da = _sum_to(prims.matmul(g2, _matrix_transpose(b2)), a2.shape)
    db = _sum_to(prims.matmul(_matrix_transpose(a2), g2), b2.shape)
    return prims.reshape(da, tuple(a.shape)), prims.reshape(db, tuple(b.shape))


# -- scans and sorting ---------------------------------------------------------------------
@defvjp(PrimIDs.CUMSUM)
def _cumsum_vjp(res, g):
    a, dim = res.args
    if not _differentiable(a):
        return None, None
    return (g if a.ndim == 0 else _rev_cumsum(g, canonical_dim(dim, a.ndim))), None


@defvjp(PrimIDs.CUMPROD)
def _cumprod_vjp(res, g):
    """torch computes this gradient at run time. With zeros in the input, an exact gradient
    needs the position of the first zero, which traceable ops only give to first order (a
    second derivative would be wrong at that zero); run by torch, first order is exact and a
    second differentiation is refused (torch_vjp has no rule) instead of silently wrong."""
    a, dim = res.args
    if not _differentiable(a):
        return None, None
    (ct,) = torch_vjp_op(prim_impls[PrimIDs.CUMPROD], (a, dim), {}, (g,), (0,), None)
    return ct, None


def _selected_vjp(res, g):
    """sort and topk pick elements of a: their value cotangent goes back to the picked places."""
    a, dim = res.args[0], res.args[2 if len(res.args) == 5 else 1]
    g_values = g[0]
    if g_values is None or not _differentiable(a):
        return (None,) * len(res.args)
    if a.ndim == 0:
        return (g_values,) + (None,) * (len(res.args) - 1)
    d = canonical_dim(dim, a.ndim)
    return (prims.scatter_add(_zeros(a), res.out[1], g_values, d),) + (None,) * (len(res.args) - 1)


defvjp(PrimIDs.SORT, PrimIDs.TOPK)(_selected_vjp)
