"""Rules of the reductions family: reductions (sum, prod, amax, amin, var, var_mean, argmax), scans
(cumsum, cumprod, logcumsumexp) and sorting (sort, topk), and the torch-language reductions whose
rules keep torch's conventions at edge points (mean, norms, std, max and min).

Each prim's VJP (torch language), JVP and batching rule (prims) sit together. A reduction's batching
rule moves the batch dimension to the front and shifts its dimension arguments by one.
"""
from __future__ import annotations

import math

import torch

import thunderfn.torch as ltorch
from thunderfn import clang, prims
from thunderfn.core import dtypes
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.rules import JVPRule, rules_of, set_rule
from thunderfn.prims import PrimIDs, canonical_dim, canonical_dims
from thunderfn.prims import torch_impls as prim_impls
from thunderfn.torch.opaque import torch_vjp_op
from thunderfn.torch.reductions import _correction, _var_args, sum_to
from thunderfn.transforms.rules.common import (
    as_scalars,
    as_vectors,
    computed,
    contract,
    in_dtype,
    inverse_permutation,
    is_float_tensor,
    move_to_front,
    ones_like,
    only_input,
    reduced_dims,
    row_sum,
    shifted_dims,
    unreduce,
    zeros_like,
)
from thunderfn.transforms.rules.define import defbatch, defjvp, deflinear, defvjp


# -- reductions: the batch dimension to the front, the reduced dimensions shifted by one ------------
def _reduction(prim):
    def rule(call, dims):
        args, kwargs = call.args, call.kwargs
        a = move_to_front(args[0], dims[0])
        n = a.ndim - 1
        reduced = shifted_dims(args[1], n) if n else ()  # a 0-dim example reduces nothing
        return prim(a, reduced, *args[2:], **kwargs), 0

    return rule


# sum
@defvjp(PrimIDs.SUM)
def _sum_vjp(call, g):
    a, dims = call.args
    return (unreduce(g, a, reduced_dims(a, dims)) if is_float_tensor(a) else None), None


defjvp(PrimIDs.SUM)(lambda call, t: prims.sum(t[0], call.args[1]))
defbatch(PrimIDs.SUM)(_reduction(prims.sum))


# prod: its derivative (the product of the other elements, exact at zeros) is its VJP rule's
# cotangent for an output cotangent of ones, and so is amax's and amin's (ties share equally)
@defvjp(PrimIDs.PROD)
def _prod_vjp(call, g):
    """Product of all the other elements, by exclusive prefix and suffix products (no
    division, so zeros in the input get torch's gradient)."""
    a, dims = call.args
    if not is_float_tensor(a):
        return None, None
    dims = reduced_dims(a, dims)
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
    return ltorch.mul(unreduce(g, a, dims), ltorch.permute(others, inverse_permutation(perm))), None


defjvp(PrimIDs.PROD)(lambda call, t: contract(t[0], _prod_vjp(call, ones_like(call.out))[0], reduced_dims(*call.args)))
defbatch(PrimIDs.PROD)(_reduction(prims.prod))


# amax and amin
def _extremum_reduction_vjp(call, g):
    """torch (amax, amin) distributes g equally among the elements tied for the extremum;
    where the extremum is NaN no element equals it, and the gradient is NaN, as torch's."""
    a, dims = call.args
    if not is_float_tensor(a):
        return None, None
    dims = reduced_dims(a, dims)
    hit = ltorch.to(ltorch.eq(a, unreduce(call.out, a, dims)), a.dtype)
    count = ltorch.sum(hit, dims) if dims else hit
    return ltorch.mul(hit, unreduce(ltorch.div(g, count), a, dims)), None


defvjp(PrimIDs.AMAX, PrimIDs.AMIN)(_extremum_reduction_vjp)
defjvp(PrimIDs.AMAX, PrimIDs.AMIN)(lambda call, t: contract(
    t[0], _extremum_reduction_vjp(call, ones_like(call.out))[0], reduced_dims(*call.args)))
defbatch(PrimIDs.AMAX)(_reduction(prims.amax))
defbatch(PrimIDs.AMIN)(_reduction(prims.amin))


# var and var_mean
def _var_mean_vjp(a, dims, correction, g_var, g_mean):
    dims = canonical_dims(dims, a.ndim) if a.ndim else ()
    n = math.prod(a.shape[d] for d in dims)
    da = None
    if g_var is not None:
        mean = unreduce(ltorch.div(ltorch.sum(a, dims), n), a, dims) if dims else a
        da = ltorch.mul(unreduce(g_var, a, dims), ltorch.div(ltorch.mul(ltorch.sub(a, mean), 2.0), n - correction))
    if g_mean is not None:
        dm = unreduce(ltorch.div(g_mean, n), a, dims)
        da = dm if da is None else ltorch.add(da, dm)
    return da


defvjp(PrimIDs.VAR)(lambda call, g: (_var_mean_vjp(*call.args, call.arg("correction"), g, None), None))
defvjp(PrimIDs.VAR_MEAN)(lambda call, g: (_var_mean_vjp(*call.args, call.arg("correction"), *g), None))


def _var_jvp(call, var, t):
    """var' = sum(2 (a - mean) t) / (n - correction)."""
    a, dims = call.args
    weights = _var_mean_vjp(a, dims, call.arg("correction"), ones_like(var), None)
    return contract(t, weights, reduced_dims(a, dims))


def _mean_jvp(a, dims, t):
    dims = reduced_dims(a, dims)
    return prims.div(prims.sum(t, dims), math.prod(a.shape[d] for d in dims)) if dims else t


defjvp(PrimIDs.VAR)(lambda call, t: _var_jvp(call, call.out, t[0]))
defjvp(PrimIDs.VAR_MEAN)(lambda call, t: (_var_jvp(call, call.out[0], t[0]), _mean_jvp(*call.args, t[0])))
defbatch(PrimIDs.VAR)(_reduction(prims.var))


_var_mean_reduction = _reduction(prims.var_mean)


@defbatch(PrimIDs.VAR_MEAN)
def _var_mean_batch(call, dims):
    return _var_mean_reduction(call, dims)[0], (0, 0)


# argmax and argmin: indices, tagged not differentiable where they are made; batched only
def _arg_reduction(prim):
    def rule(call, dims):
        args = call.args
        a = move_to_front(args[0], dims[0])
        dim = args[1]
        if a.ndim == 1:  # a 0-dim example: its argmax is 0
            return prims.full((a.shape[0],), 0, device=a.device, dtype=torch.int64), 0
        if dim is None:  # over all elements of each example
            return prim(prims.reshape(a, (a.shape[0], a.numel() // a.shape[0])), 1), 0
        return prim(a, shifted_dims((dim,), a.ndim - 1)[0]), 0

    return rule


defbatch(PrimIDs.ARGMAX)(_arg_reduction(prims.argmax))
defbatch(PrimIDs.ARGMIN)(_arg_reduction(prims.argmin))


# -- scans and sorting: batched along their one dimension -----------------------------------------
def _along_one_dim(prim):
    """cumsum(a, dim), cumprod(a, dim), sort(a, dim, ...), topk(a, k, dim, ...): the dim shifts."""
    dim_position = 2 if prim is prims.topk else 1

    def rule(call, dims):
        args, kwargs = call.args, call.kwargs
        a, rest = move_to_front(args[0], dims[0]), list(args[1:])
        if a.ndim == 1:  # 0-dim examples
            rest[dim_position - 1] = 1
            return as_scalars(prim(*as_vectors([a], [0], a.shape[0]), *rest, **kwargs), a.shape[0])
        rest[dim_position - 1] = shifted_dims((rest[dim_position - 1],), a.ndim - 1)[0]
        result = prim(a, *rest, **kwargs)
        return (result, 0) if isinstance(result, TensorProxy) else (result, (0,) * len(result))

    return rule


# cumsum: linear
def _reverse_cumsum(x, dim):
    return ltorch.flip(ltorch.cumsum(ltorch.flip(x, (dim,)), dim), (dim,))


def _cumsum_vjp(call, g):
    a, dim = call.args
    if not is_float_tensor(a):
        return None, None
    return (g if a.ndim == 0 else _reverse_cumsum(g, canonical_dim(dim, a.ndim))), None


deflinear(prims.cumsum, _cumsum_vjp)
defbatch(PrimIDs.CUMSUM)(_along_one_dim(prims.cumsum))


# cumprod
@defvjp(PrimIDs.CUMPROD)
def _cumprod_vjp(call, g):
    """torch computes this gradient at run time. With zeros in the input, an exact gradient
    needs the position of the first zero, which traceable ops only give to first order (a
    second derivative would be wrong at that zero); run by torch, first order is exact and a
    second differentiation is refused (torch_vjp has no rule) instead of silently wrong."""
    a, dim = call.args
    if not is_float_tensor(a):
        return None, None
    (ct,) = torch_vjp_op(prim_impls[PrimIDs.CUMPROD], (a, dim), {}, (g,), (0,), None)
    return ct, None


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
    replaced = prims.where(prims.eq(j, k), prims.broadcast_in_dim(t[0], shape, keep),
                           prims.broadcast_in_dim(a, shape, keep))
    return prims.sum(prims.where(prims.le(j, k), prims.cumprod(replaced, d + 1), 0.0), (d,))


defbatch(PrimIDs.CUMPROD)(_along_one_dim(prims.cumprod))


# sort and topk
def _selected_vjp(call, g):
    """sort and topk pick elements of a: their value cotangent goes back to the picked places."""
    a, dim = call.args[0], call.args[2 if len(call.args) == 5 else 1]
    g_values = g[0]
    if g_values is None or not is_float_tensor(a):
        return (None,) * len(call.args)
    if a.ndim == 0:
        return (g_values,) + (None,) * (len(call.args) - 1)
    d = canonical_dim(dim, a.ndim)
    return (ltorch.scatter_add(zeros_like(a), d, call.out[1], g_values),) + (None,) * (len(call.args) - 1)


defvjp(PrimIDs.SORT, PrimIDs.TOPK)(_selected_vjp)


def _selected_jvp(call, t):
    """sort and topk pick elements of a: the values' tangent is the tangent at the picked places."""
    a, dim = call.args[0], call.args[2 if len(call.args) == 5 else 1]
    values = t[0] if a.ndim == 0 else prims.take_along_axis(t[0], call.out[1], canonical_dim(dim, a.ndim))
    return values, None


defjvp(PrimIDs.SORT, PrimIDs.TOPK)(_selected_jvp)
defbatch(PrimIDs.SORT)(_along_one_dim(prims.sort))
defbatch(PrimIDs.TOPK)(_along_one_dim(prims.topk))


# -- torch's conventions at edge points: norms, std, losses, max and min -----------------------------------
# The decompositions' derivatives agree with torch at ordinary points. These rules copy torch's formulas
# (aten's *_backward, FunctionsManual.cpp) for the points where torch picks a value: 0 for the norm of a
# zero vector and the std of a constant tensor (not 0/0), the sign for a loss at an infinite difference,
# the index torch.max(x, dim) returned (not a share of each tie). Denominators that torch masks after
# dividing are masked before dividing here, so no nan reaches a second derivative.
def _kept(t, x, dims, keepdim):
    """A reduction's output (or its cotangent) with its reduced dims back, as size 1: broadcastable against x."""
    return t if keepdim else ltorch.reshape(t, tuple(1 if i in dims else s for i, s in enumerate(x.shape)))


def _nonzero(t):
    """t, with 1 where it is 0: a denominator whose quotient is masked out there anyway."""
    return ltorch.where(ltorch.eq(t, 0), 1.0, t)


def _norm_backward(g, x, ord, norm, dims):
    """torch's norm_backward: the cotangent of x for vector_norm(x, ord) over dims, given g and the norm with
    those dims kept: 0 where the norm is 0, and for ord inf an even share among the elements whose |x| is the
    norm or NaN; None for ord 0, a count."""
    if ord == 0:
        return None
    if ord == 1:
        return ltorch.mul(ltorch.sign(x), g)
    zero = ltorch.eq(norm, 0)
    if ord == 2:
        return ltorch.mul(g, ltorch.where(zero, 0.0, ltorch.div(x, _nonzero(norm))))
    if math.isinf(ord):
        a = ltorch.abs(x)
        mask = in_dtype(ltorch.bitwise_or(ltorch.eq(a, norm), ltorch.isnan(a)), g.dtype)
        return ltorch.mul(ltorch.sign(x), ltorch.mul(ltorch.div(g, row_sum(mask, dims)), mask))
    if ord < 1:  # |x|^(ord - 1) read as 0 at x = 0
        scaled = ltorch.where(ltorch.eq(x, 0), 0.0, ltorch.pow(_nonzero(ltorch.abs(x)), ord - 1))
        return ltorch.mul(ltorch.mul(ltorch.mul(ltorch.sign(x), scaled), g), ltorch.pow(norm, 1 - ord))
    scaled = (ltorch.mul(ltorch.sign(x), ltorch.pow(ltorch.abs(x), ord - 1)) if ord < 2
              else ltorch.mul(x, ltorch.pow(ltorch.abs(x), ord - 2)))
    return ltorch.mul(scaled, ltorch.where(zero, 0.0, ltorch.div(g, ltorch.pow(_nonzero(norm), ord - 1))))


@defvjp(ltorch.mean.id)
def _mean_vjp(call, g):  # eager's MeanBackward: g expanded back over the reduced dims, divided by their size
    x = call.args[0]
    dims, keepdim = clang.reduction_dims(x, call.arg("dim")), call.arg("keepdim")
    n = math.prod(x.shape[d] for d in dims)
    # (a 0-d g expands as it is)
    spread = ltorch.expand(g if g.ndim == 0 else _kept(g, x, dims, keepdim), tuple(x.shape))
    return only_input(call, in_dtype(ltorch.div(spread, n), x.dtype) if dtypes.is_inexact(x.dtype) else None)


@defvjp(ltorch.vector_norm.id)
def _vector_norm_vjp(call, g):  # torch.norm and torch.linalg.norm of a vector reach it as a subsymbol
    x, ord = call.args[0], call.arg("ord")
    dims, keepdim = clang.reduction_dims(x, call.arg("dim")), call.arg("keepdim")
    return only_input(call, _norm_backward(_kept(g, x, dims, keepdim), x, ord, _kept(call.out, x, dims, keepdim), dims))


@defvjp(ltorch.normalize.id)
def _normalize_vjp(call, g):
    """F.normalize is x / clamp_min(norm, eps) to torch's autograd: the norm gets the quotient's gradient where it
    is at least eps (clamp_min's), then norm_backward's; a zero vector's gradient is g / eps."""
    x, p = call.args[0], call.arg("p")
    dim, eps = call.arg("dim"), call.arg("eps")
    dims = clang.reduction_dims(x, tuple(dim) if isinstance(dim, (tuple, list)) else (dim,))
    norm = ltorch.vector_norm(x, p, dims, keepdim=True)
    denom = ltorch.where(ltorch.lt(norm, eps), eps, norm)
    dquotient = ltorch.neg(ltorch.div(row_sum(ltorch.mul(g, call.out), dims), denom))  # of x / denom, for denom
    dnorm = ltorch.where(ltorch.ge(norm, eps), dquotient, 0.0)
    dx, through_norm = ltorch.div(g, denom), _norm_backward(dnorm, x, p, norm, dims)
    return only_input(call, dx if through_norm is None else ltorch.add(dx, through_norm))


def _var_backward(g, x, dim, dims, correction):
    """torch's var_backward, g with the reduced dims kept: 2 / (n - correction) * g * (x - mean); over all dims
    (no dim given) with n <= correction, g times nan where x is the mean and inf elsewhere."""
    mean = ltorch.mean(x, dims, keepdim=True) if dims else x
    dof = math.prod(x.shape[d] for d in dims) - correction
    if (dim is None or x.ndim == 0) and dof <= 0:
        return ltorch.mul(g, ltorch.where(ltorch.eq(x, mean), float("nan"), float("inf")))
    return ltorch.mul(ltorch.mul(g, ltorch.sub(x, mean)), 2.0 / dof if dof else math.inf)


def _std_backward(g, x, std, dim, dims, correction):  # torch's: the var's cotangent is g / (2 std), 0 where std is 0
    return _var_backward(ltorch.where(ltorch.eq(std, 0), 0.0, ltorch.div(g, ltorch.mul(_nonzero(std), 2.0))),
                         x, dim, dims, correction)


def _std_arguments(call, name):
    x = call.args[0]
    dim, unbiased = _var_args(call.arg("dim"), call.arg("unbiased"))
    dims, keepdim = clang.reduction_dims(x, dim), call.arg("keepdim")
    return x, dim, dims, keepdim, _correction(unbiased, call.arg("correction"), name)


@defvjp(ltorch.std.id)
def _std_vjp(call, g):
    x, dim, dims, keepdim, correction = _std_arguments(call, "std")
    xc, g, std = computed(x, g, call.out)
    g, std = _kept(g, x, dims, keepdim), _kept(std, x, dims, keepdim)
    return only_input(call, _std_backward(g, xc, std, dim, dims, correction))


@defvjp(ltorch.std_mean.id)
def _std_mean_vjp(call, g):  # std's cotangent as std's rule gives it, plus the mean's spread evenly
    x, dim, dims, keepdim, correction = _std_arguments(call, "std_mean")
    (g_std, g_mean), (std, _) = g, call.out
    xc = computed(x)[0]
    dx = None
    if g_std is not None:
        g_std, std = computed(x, g_std, std)[1:]
        dx = _std_backward(_kept(g_std, x, dims, keepdim), xc, _kept(std, x, dims, keepdim), dim, dims, correction)
    if g_mean is not None:
        n = math.prod(x.shape[d] for d in dims)
        spread = ltorch.expand(ltorch.div(_kept(g_mean, x, dims, keepdim), n), x.shape)
        dx = spread if dx is None else ltorch.add(dx, spread)
    return only_input(call, dx)


def _max_or_min_vjp(call, g, loses):
    """torch's three backwards: torch.max(a, b) as maximum's (half of g each where they tie; where either is
    NaN, all of it to both); torch.max(x, dim) gives g to the index it returned; torch.max(x) spreads g
    evenly over the elements equal to the result, or over the NaNs when it is NaN."""
    x, dim, keepdim = call.args[0], call.arg("dim"), call.arg("keepdim")
    if clang.is_tensor(dim):
        other = dim
        half = ltorch.where(ltorch.eq(x, other), ltorch.div(g, 2.0), g)
        return (sum_to(ltorch.where(loses(x, other), 0.0, half), x.shape),
                sum_to(ltorch.where(loses(other, x), 0.0, half), other.shape)) + (None,) * (len(call.args) - 2)
    if dim is None:
        nan_max = ltorch.bitwise_and(ltorch.isnan(x), ltorch.isnan(call.out))
        mask = in_dtype(ltorch.bitwise_or(ltorch.eq(x, call.out), nan_max), g.dtype)
        return only_input(call, ltorch.mul(mask, ltorch.div(g, ltorch.sum(mask))))
    g, indices = g[0], call.out[1]
    if g is None or x.ndim == 0:
        return only_input(call, g)
    d = canonical_dim(dim, x.ndim)
    if not keepdim:
        g, indices = ltorch.unsqueeze(g, d), ltorch.unsqueeze(indices, d)
    positions = ltorch.reshape(ltorch.arange(0, x.shape[d], 1, device=x.device, dtype=torch.int64),
                              tuple(-1 if i == d else 1 for i in range(x.ndim)))
    return only_input(call, ltorch.where(ltorch.eq(positions, indices), g, 0.0))


defvjp(ltorch.max.id)(lambda call, g: _max_or_min_vjp(call, g, clang.lt))
defvjp(ltorch.min.id)(lambda call, g: _max_or_min_vjp(call, g, clang.gt))


@defvjp(ltorch.logcumsumexp.id)
def _logcumsumexp_vjp(call, g):
    """torch's formula (logcumsumexp_backward): exp(x + reversed logcumsumexp(log|g| - out)), the positive and the
    negative parts of g apart. Differentiating the scan instead is exact in float64 but rounds otherwise than
    eager in float32 (by 3e-4 on op_db's first sample), where eager's formula is the reference."""
    x, dim = call.args[0], call.arg("dim")
    if x.ndim == 0 or x.numel() == 0:
        return only_input(call, g)
    log_abs = ltorch.log(ltorch.abs(g))
    lowest = torch.finfo(g.dtype).min  # torch's stand-in for log(0)

    def part(chosen):
        logs = ltorch.sub(ltorch.where(chosen, log_abs, lowest), call.out)
        return ltorch.exp(ltorch.add(ltorch.flip(ltorch.logcumsumexp(ltorch.flip(logs, (dim,)), dim), (dim,)), x))

    return only_input(call, ltorch.sub(part(ltorch.gt(g, 0)), part(ltorch.lt(g, 0))))


def _reduction_jvp_from_vjp(symbol_id, dims_of):
    """A reduction whose every output element reads its own slice of the input (a norm, a std): the VJP
    rule at a cotangent of ones gives each input element's derivative, and the tangent is the sum over
    the slice (the dims `dims_of(call)` names, read from the call as the VJP rule reads them) of
    derivative times tangent. torch's masks (the norm of zero) come along."""
    vjp = rules_of(symbol_id).vjp.bwd

    def fwd(call, tangents):
        t = tangents[0] if tangents else None
        if t is None:
            return None
        out = call.out
        d = vjp(call, prims.full(tuple(out.shape), 1.0, device=out.device, dtype=out.dtype))[0]
        if d is None:  # a count (the 0-norm): constant where it is differentiable
            return None
        return prims.reshape(prims.sum(prims.mul(d, t), dims_of(call)), tuple(out.shape))

    fwd.__name__ = fwd.__qualname__ = f"{vjp.__name__}_as_jvp"
    set_rule(symbol_id, "jvp", JVPRule(fwd))


_reduction_jvp_from_vjp(ltorch.vector_norm.id, lambda call: clang.reduction_dims(call.args[0], call.arg("dim")))
# std(x, True) is std(x, unbiased=True): its dims as the VJP rule reads them
_reduction_jvp_from_vjp(ltorch.std.id, lambda call: _std_arguments(call, "std")[2])
