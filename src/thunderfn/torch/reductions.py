"""Reductions: sum, mean, prod, amax/amin, max/min, var/std, argmax/argmin, all/any,
softmax, log_softmax and logsumexp; the scans (cumsum, cumprod, logcumsumexp, cummax,
cummin); sort, argsort and topk; vector norms; aminmax, nansum and nanmean.
Half-precision inputs accumulate in float32, as torch's kernels do."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from thunderfn import clang, prims
from thunderfn.clang import is_tensor, keepdim_reshape, maybe_convert_to_dtype, reduction_dims
from thunderfn.core import dtypes, symbolic
from thunderfn.core.symbol import DecompositionUnavailable
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import canonical_dim, check, check_dtype_supported, scalar_type_name
from thunderfn.torch.base import register_alias, torchsymbol
from thunderfn.torch.shape import reshape

T = torch.Tensor
__all__ = ["sum", "mean", "prod", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean", "argmax",
           "argmin", "all", "any", "softmax", "log_softmax", "logsumexp", "count_nonzero", "cumsum", "cumprod",
           "logcumsumexp", "cummax", "cummin", "sort", "argsort", "msort", "topk", "vector_norm", "norm", "aminmax",
           "nansum", "nanmean"]


def sum_to(x, shape):
    """x summed back to `shape`, where broadcasting `shape` made x's shape: the leading dims and the
    size-1 dims that were expanded are summed, then reshaped (not where it has the shape already).
    What a cotangent of a broadcast operand becomes: the one place reverse mode does it (the VJP rules,
    a user Function's gradient, the attention mask's gradient)."""
    shape = tuple(shape)
    dims = symbolic.broadcast_dims(x.shape, shape)
    if dims:
        x = sum(x, dims)
    return x if symbolic.same_shape(x.shape, shape) else reshape(x, shape)


def _finish(out, a, dims, keepdim, dtype):
    out = maybe_convert_to_dtype(out, dtype)
    return keepdim_reshape(out, a, dims) if keepdim else out


def _accumulate(a, dtype, prim, dims):
    """Reduce in the computation dtype (f32 for half types)."""
    return prim(maybe_convert_to_dtype(a, dtypes.computation_dtype(dtype)), dims)


def _sum_dtype(a, dtype):
    if dtype is not None:
        return dtype
    return torch.int64 if not dtypes.is_inexact(a.dtype) else a.dtype


@torchsymbol(torch.sum, T.sum)
def sum(a, dim=None, keepdim=False, *, dtype=None):
    dims = reduction_dims(a, dim)
    out_dtype = _sum_dtype(a, dtype)
    return _finish(_accumulate(maybe_convert_to_dtype(a, out_dtype), out_dtype, prims.sum, dims), a, dims,
                   keepdim, out_dtype)


@torchsymbol(torch.prod, T.prod)
def prod(a, dim=None, keepdim=False, *, dtype=None):
    dims = reduction_dims(a, dim)
    out_dtype = _sum_dtype(a, dtype)
    return _finish(_accumulate(maybe_convert_to_dtype(a, out_dtype), out_dtype, prims.prod, dims), a, dims,
                   keepdim, out_dtype)


@torchsymbol(torch.mean, T.mean)
def mean(a, dim=None, keepdim=False, *, dtype=None):
    out_dtype = dtype or a.dtype
    check(dtypes.is_inexact(out_dtype),
          lambda: f"mean(): could not infer output dtype. {'Input' if dtype is None else 'Optional'} "
                  f"dtype must be either a floating point or complex dtype. Got: {scalar_type_name(out_dtype)}")
    dims = reduction_dims(a, dim)
    n = 1
    for d in dims:
        n *= a.shape[d]
    total = _accumulate(maybe_convert_to_dtype(a, out_dtype), out_dtype, prims.sum, dims)
    return _finish(clang.true_divide(total, n), a, dims, keepdim, out_dtype)


def _check_reduction_dim_given(a, dim, name):
    check(a.numel() > 0 or (dim is not None and (isinstance(dim, int) or len(dim) > 0)),
          lambda: f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                  f"Specify the reduction dim with the 'dim' argument.")


@torchsymbol(torch.amax, T.amax)
def amax(a, dim=(), keepdim=False):
    _check_reduction_dim_given(a, dim, "amax")
    dims = reduction_dims(a, dim)
    return _finish(prims.amax(a, dims), a, dims, keepdim, a.dtype)


@torchsymbol(torch.amin, T.amin)
def amin(a, dim=(), keepdim=False):
    _check_reduction_dim_given(a, dim, "amin")
    dims = reduction_dims(a, dim)
    return _finish(prims.amin(a, dims), a, dims, keepdim, a.dtype)


def _max_or_min(a, dim, keepdim, name, reduce_prim, arg_prim, binary, result_type):
    if is_tensor(dim):  # torch.max(a, b): elementwise
        return binary(a, dim)
    if dim is None:
        _check_reduction_dim_given(a, dim, name)
        return reduce_prim(a, tuple(range(a.ndim)))
    d = canonical_dim(dim, a.ndim)
    dims = (d,) if a.ndim else ()
    values = _finish(reduce_prim(a, dims), a, dims, keepdim, a.dtype)
    # argmax/argmin refuse bool, which torch.max(dim=) takes: the same order holds in uint8
    indices = arg_prim(maybe_convert_to_dtype(a, torch.uint8) if a.dtype is torch.bool else a, d if a.ndim else None)
    indices = keepdim_reshape(indices, a, dims) if keepdim else indices
    # torch's named tuple, so `.values` and `.indices` work on the result
    return result_type((values, indices))


@torchsymbol(torch.max, T.max)
def max(a, dim=None, keepdim=False):
    return _max_or_min(a, dim, keepdim, "max", prims.amax, prims.argmax, clang.maximum, torch.return_types.max)


@torchsymbol(torch.min, T.min)
def min(a, dim=None, keepdim=False):
    return _max_or_min(a, dim, keepdim, "min", prims.amin, prims.argmin, clang.minimum, torch.return_types.min)


def _arg(a, dim, keepdim, prim):
    check(a.dtype is not torch.bool, lambda: f"{prim.name}(): does not support bool input")
    if dim is None:
        out = prim(clang.reshape(a, (-1,)) if a.ndim != 1 else a, 0 if a.numel() else None)
        return clang.reshape(out, (1,) * a.ndim) if keepdim else out
    d = canonical_dim(dim, a.ndim)
    out = prim(a, d if a.ndim else None)
    return keepdim_reshape(out, a, (d,)) if keepdim and a.ndim else out


@torchsymbol(torch.argmax, T.argmax)
def argmax(a, dim=None, keepdim=False):
    return _arg(a, dim, keepdim, prims.argmax)


@torchsymbol(torch.argmin, T.argmin)
def argmin(a, dim=None, keepdim=False):
    return _arg(a, dim, keepdim, prims.argmin)


def _correction(unbiased, correction, name) -> float:
    if correction is not None:
        check(unbiased is None, lambda: f"{name}() received an invalid combination of arguments: pass unbiased or "
                                        f"correction, not both", TypeError)
        return correction
    return 1 if unbiased is None or unbiased else 0


def _var_args(dim, unbiased):
    if isinstance(dim, bool):  # torch.var(x, False): the legacy unbiased positional
        return None, dim
    return dim, unbiased


@torchsymbol(torch.var, T.var)
def var(a, dim=None, unbiased=None, keepdim=False, *, correction=None):
    dim, unbiased = _var_args(dim, unbiased)
    dims = reduction_dims(a, dim)
    x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
    out = prims.var(x, dims, correction=_correction(unbiased, correction, "var"))
    return _finish(out, a, dims, keepdim, dtypes.to_real(a.dtype))


@torchsymbol(torch.std, T.std)
def std(a, dim=None, unbiased=None, keepdim=False, *, correction=None):
    dim, unbiased = _var_args(dim, unbiased)
    dims = reduction_dims(a, dim)
    x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
    out = clang.sqrt(prims.var(x, dims, correction=_correction(unbiased, correction, "std")))
    return _finish(out, a, dims, keepdim, dtypes.to_real(a.dtype))


def _check_var_dtype(a, name):
    check(dtypes.is_inexact(a.dtype), lambda: f"{name} only support floating point and complex dtypes")


def _var_and_mean(name, a, dim, unbiased, correction):
    """var_mean and std_mean's shared start: the variance and mean over dims, in the computation dtype."""
    _check_var_dtype(a, name)
    dim, unbiased = _var_args(dim, unbiased)
    dims = reduction_dims(a, dim)
    x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
    v, m = prims.var_mean(x, dims, correction=_correction(unbiased, correction, name))
    return v, m, dims


@torchsymbol(torch.var_mean)
def var_mean(a, dim=None, unbiased=None, keepdim=False, *, correction=None):
    v, m, dims = _var_and_mean("var_mean", a, dim, unbiased, correction)
    return _finish(v, a, dims, keepdim, dtypes.to_real(a.dtype)), _finish(m, a, dims, keepdim, a.dtype)


@torchsymbol(torch.std_mean)
def std_mean(a, dim=None, unbiased=None, keepdim=False, *, correction=None):
    v, m, dims = _var_and_mean("std_mean", a, dim, unbiased, correction)
    return _finish(clang.sqrt(v), a, dims, keepdim, dtypes.to_real(a.dtype)), _finish(m, a, dims, keepdim, a.dtype)


def _count(a, dims, predicate):
    """How many elements along dims satisfy predicate; 0 for an empty reduction."""
    return prims.sum(maybe_convert_to_dtype(predicate(a, 0), torch.int64), dims)


def _logical_reduction(a, dim, keepdim, predicate, finish):
    # unlike sum, all/any read dim=() as "reduce nothing"; and a uint8 input keeps its dtype
    dims = () if isinstance(dim, (tuple, list)) and len(dim) == 0 else reduction_dims(a, dim)
    out_dtype = torch.uint8 if a.dtype is torch.uint8 else torch.bool
    return _finish(finish(_count(a, dims, predicate), 0), a, dims, keepdim, out_dtype)


@torchsymbol(torch.all, T.all)
def all(a, dim=None, keepdim=False):
    return _logical_reduction(a, dim, keepdim, clang.eq, clang.eq)  # no element is zero


@torchsymbol(torch.any, T.any)
def any(a, dim=None, keepdim=False):
    return _logical_reduction(a, dim, keepdim, clang.ne, clang.ne)  # some element is nonzero


@torchsymbol(torch.count_nonzero, T.count_nonzero)
def count_nonzero(a, dim=None):
    return _count(a, reduction_dims(a, dim), clang.ne)


# -- softmax family ----------------------------------------------------------------------
def _softmax_input(a, dim, dtype, name):
    if dim is None:  # F.softmax's deprecated implicit dim, chosen (and warned about) as torch does
        warnings.warn(f"Implicit dimension choice for {name} has been deprecated. "
                      f"Change the call to include dim=X as an argument.", stacklevel=4)
        dim = 0 if a.ndim in (0, 1, 3) else 1
    d = canonical_dim(dim, a.ndim)
    out_dtype = dtype or a.dtype
    check_dtype_supported(dtypes.is_inexact(out_dtype), f"{name}_lastdim_kernel_impl", out_dtype)
    x = maybe_convert_to_dtype(maybe_convert_to_dtype(a, out_dtype), dtypes.computation_dtype(out_dtype))
    return x, (d,) if a.ndim else (), out_dtype


def _shifted(x, dims):
    """x - max(x) along dims, the numerically safe input to exp. As in torch, a row holding
    +inf, or only -inf, becomes NaN (inf - inf); logsumexp, unlike softmax, guards against that."""
    if not dims:
        return clang.sub(x, x)
    if x.numel() == 0:  # nothing to shift, and amax refuses an empty reduction
        return x
    return clang.sub(x, keepdim_reshape(prims.amax(x, dims), x, dims))


# F.softmax's signature (the torch executor calls it with the recorded arguments); the
# spellings whose third positional argument is dtype rather than _stacklevel pass it by name
@torchsymbol(F.softmax, torch.special.softmax)
def softmax(input, dim=None, _stacklevel=3, dtype=None):
    x, dims, out_dtype = _softmax_input(input, dim, dtype, "softmax")
    e = clang.exp(_shifted(x, dims))
    s = keepdim_reshape(prims.sum(e, dims), x, dims) if dims else e
    return maybe_convert_to_dtype(clang.true_divide(e, s), out_dtype)


@torchsymbol(F.log_softmax, torch.special.log_softmax)
def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    x, dims, out_dtype = _softmax_input(input, dim, dtype, "log_softmax")
    shifted = _shifted(x, dims)
    lse = (keepdim_reshape(clang.log(prims.sum(clang.exp(shifted), dims)), x, dims) if dims
           else clang.log(clang.exp(shifted)))
    return maybe_convert_to_dtype(clang.sub(shifted, lse), out_dtype)


for _torch_fn, _symbol in ((torch.softmax, softmax), (T.softmax, softmax), (torch.log_softmax, log_softmax),
                           (T.log_softmax, log_softmax)):
    register_alias(_torch_fn, lambda input, dim, dtype=None, _symbol=_symbol: _symbol(input, dim, dtype=dtype))


@torchsymbol(torch.logsumexp, T.logsumexp, torch.special.logsumexp)
def logsumexp(a, dim, keepdim=False):
    dims = reduction_dims(a, dim)
    x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype) if dtypes.is_inexact(a.dtype)
                               else torch.get_default_dtype())
    if x.numel() == 0:
        out = clang.log(prims.sum(clang.exp(x), dims))
    else:
        # less the maximum (of a 0-dim tensor, itself), or exp overflows: logsumexp(1000.0) is 1000, and its
        # gradient 1, not inf / inf
        m = prims.amax(x, dims) if dims else x
        m = clang.where(clang.isfinite(m), m, 0.0)
        out = clang.add(clang.log(prims.sum(clang.exp(clang.sub(x, keepdim_reshape(m, x, dims))), dims)), m)
    return _finish(out, a, dims, keepdim, a.dtype if dtypes.is_inexact(a.dtype) else torch.get_default_dtype())



# -- scans ---------------------------------------------------------------------------------
def _scan(a, dim, dtype, prim):
    # like sum, a scan of bool or integers accumulates (and returns) int64 unless told otherwise
    out_dtype = _sum_dtype(a, dtype)
    d = canonical_dim(dim, a.ndim)
    x = maybe_convert_to_dtype(maybe_convert_to_dtype(a, out_dtype), dtypes.computation_dtype(out_dtype))
    return maybe_convert_to_dtype(prim(x, d), out_dtype)


@torchsymbol(torch.cumsum, T.cumsum)
def cumsum(a, dim, *, dtype=None):
    return _scan(a, dim, dtype, prims.cumsum)


@torchsymbol(torch.cumprod, T.cumprod)
def cumprod(a, dim, *, dtype=None):
    return _scan(a, dim, dtype, prims.cumprod)


def _logaddexp(a, b):
    """log(exp(a) + exp(b)) without overflow; an infinite larger operand is the answer itself."""
    m = clang.maximum(a, b)
    finite = clang.add(m, clang.log1p(clang.exp(clang.neg(clang.abs(clang.sub(a, b))))))
    return clang.where(clang.eq(clang.abs(m), float("inf")), m, finite)


@torchsymbol(torch.logcumsumexp, T.logcumsumexp)
def logcumsumexp(a, dim):
    check_dtype_supported(dtypes.is_float(a.dtype), "logcumsumexp_out_cpu", a.dtype)
    d = canonical_dim(dim, a.ndim)
    x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
    n = a.shape[d] if a.ndim else 1
    # A Hillis-Steele scan: log2(n) rounds of logaddexp with the row shifted by 1, 2, 4, ...
    # Every step is elementwise (fusible) and each pair is combined stably, which
    # log(cumsum(exp(x - max))) is not: a prefix far below the row's maximum underflows to -inf.
    shift = 1
    while shift < n:
        pad_shape = tuple(shift if i == d else s for i, s in enumerate(x.shape))
        pad = clang.full(pad_shape, float("-inf"), device=x.device, dtype=x.dtype)
        x = _logaddexp(x, clang.cat([pad, clang.slice_in_dim(x, 0, n - shift, dim=d)], d))
        shift *= 2
    return maybe_convert_to_dtype(x, a.dtype)


def _extreme_scan(a, dim, name, takes_later, identity):
    """cummax/cummin as a Hillis-Steele scan over (value, index) pairs, combined as torch's
    loop does: a later NaN always wins, then a later value that is >= (or <=) the current one,
    so ties take the last index."""
    d = canonical_dim(dim, a.ndim)
    n = a.shape[d] if a.ndim else 1
    values = a
    indices = clang.arange(0, n, 1, device=a.device, dtype=torch.int64)
    indices = prims.broadcast_in_dim(indices, a.shape, (d,)) if a.ndim else clang.reshape(indices, ())
    shift = 1
    while shift < n:
        pad_shape = tuple(shift if i == d else s for i, s in enumerate(a.shape))
        earlier_v = clang.cat([clang.full(pad_shape, identity(a.dtype), device=a.device, dtype=a.dtype),
                               clang.slice_in_dim(values, 0, n - shift, dim=d)], d)
        earlier_i = clang.cat([clang.full(pad_shape, 0, device=a.device, dtype=torch.int64),
                               clang.slice_in_dim(indices, 0, n - shift, dim=d)], d)
        later = takes_later(values, earlier_v)
        if dtypes.is_float(a.dtype):
            later = clang.bitwise_or(clang.isnan(values),
                                     clang.bitwise_and(clang.bitwise_not(clang.isnan(earlier_v)), later))
        values, indices = clang.where(later, values, earlier_v), clang.where(later, indices, earlier_i)
        shift *= 2
    return getattr(torch.return_types, name)((values, indices))


def _lowest(dtype):
    return False if dtype is torch.bool else float("-inf") if dtypes.is_float(dtype) else torch.iinfo(dtype).min


def _highest(dtype):
    return True if dtype is torch.bool else float("inf") if dtypes.is_float(dtype) else torch.iinfo(dtype).max


@torchsymbol(torch.cummax, T.cummax)
def cummax(a, dim):
    return _extreme_scan(a, dim, "cummax", clang.ge, _lowest)


@torchsymbol(torch.cummin, T.cummin)
def cummin(a, dim):
    return _extreme_scan(a, dim, "cummin", clang.le, _highest)


# -- sorting -------------------------------------------------------------------------------
@torchsymbol(torch.sort, T.sort)
def sort(a, dim=-1, descending=False, *, stable=None):
    values, indices = prims.sort(a, canonical_dim(dim, a.ndim), bool(descending), bool(stable))
    return torch.return_types.sort((values, indices))


@torchsymbol(torch.argsort, T.argsort)
def argsort(a, dim=-1, descending=False, stable=False):
    return prims.sort(a, canonical_dim(dim, a.ndim), bool(descending), bool(stable))[1]


@torchsymbol(torch.msort, T.msort)
def msort(a):
    return prims.sort(a, 0, False, False)[0]


@torchsymbol(torch.topk, T.topk)
def topk(a, k, dim=-1, largest=True, sorted=True):
    values, indices = prims.topk(a, k, canonical_dim(dim, a.ndim), bool(largest), bool(sorted))
    return torch.return_types.topk((values, indices))


# -- norms and NaN-skipping reductions -----------------------------------------------------
def _ord_name(ord) -> str:
    return str(int(ord)) if float(ord).is_integer() else str(ord)


@torchsymbol(torch.linalg.vector_norm)
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    check(isinstance(ord, (int, float)) and not isinstance(ord, bool),
          lambda: f"linalg_vector_norm(): argument 'ord' (position 2) must be Number, not {type(ord).__name__}",
          TypeError)
    check(dtypes.is_inexact(x.dtype),
          lambda: "linalg.vector_norm: Expected a floating point or complex tensor as input. Got "
                  f"{scalar_type_name(x.dtype)}")
    if dtype is not None:
        check(dtypes.is_inexact(dtype),
              lambda: "linalg.vector_norm: dtype should be floating point or complex, but got "
                      f"{scalar_type_name(dtype)}")
        check(torch.promote_types(x.dtype, dtype) == dtype,
              lambda: f"linalg.vector_norm: the dtype of the input ({scalar_type_name(x.dtype)}) should be convertible "
                      f"without narrowing to the specified dtype ({scalar_type_name(dtype)})")
    dims = reduction_dims(x, dim)
    if ord < 0 or ord == float("inf"):  # min, max and negative powers have no identity for an empty reduction
        if dim is None or (not isinstance(dim, int) and len(dim) == 0):
            check(x.numel() > 0,
                  lambda: f"linalg.vector_norm cannot compute the {_ord_name(ord)} norm on an empty tensor "
                          f"because the operation does not have an identity")
        for d in dims:
            check(x.shape[d] > 0,
                  lambda: f"linalg.vector_norm cannot compute the {_ord_name(ord)} norm on the dimension "
                          f"{d}because this dimension is empty and the operation does "
                          "not have an identity")
    in_dtype = dtype or x.dtype
    out_dtype = dtypes.to_real(in_dtype)
    a = clang.abs(maybe_convert_to_dtype(maybe_convert_to_dtype(x, in_dtype), dtypes.computation_dtype(in_dtype)))
    if ord == float("inf"):
        out = prims.amax(a, dims)
    elif ord == float("-inf"):
        out = prims.amin(a, dims)
    elif ord == 0:
        out = prims.sum(maybe_convert_to_dtype(clang.ne(a, 0), a.dtype), dims)
    elif ord == 1:
        out = prims.sum(a, dims)
    elif ord == 2:
        out = clang.sqrt(prims.sum(clang.mul(a, a), dims))
    else:
        out = clang.pow(prims.sum(clang.pow(a, ord), dims), 1.0 / ord)
    return _finish(out, x, dims, keepdim, out_dtype)


@torchsymbol(torch.norm, T.norm)
def norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    check(out is None, lambda: "torch.norm(out=...) writes into an argument, which thunderfn does not trace; "
                               "use the result instead", UnsupportedOpError)
    dims = [dim] if isinstance(dim, int) else dim
    if isinstance(p, str):  # as torch.norm does: Frobenius over at most two dims is the vector 2-norm
        if p == "fro" and (dim is None or isinstance(dim, int) or len(dim) <= 2):
            return vector_norm(input, 2, dims, keepdim, dtype=dtype)
        # the nuclear norm (an SVD) and the other matrix norms: torch computes them, as an opaque op
        raise DecompositionUnavailable
    return vector_norm(input, 2.0 if p is None else p, dims, keepdim, dtype=dtype)


@torchsymbol(torch.aminmax, T.aminmax)
def aminmax(a, *, dim=None, keepdim=False):
    if dim is None:
        check(a.numel() > 0,
              lambda: "aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity.")
    dims = reduction_dims(a, dim)
    for d in dims:
        check(a.shape[d] > 0, lambda: f"aminmax: Expected reduction dim {d} to have non-zero size.", IndexError)
    lo, hi = (_finish(prim(a, dims), a, dims, keepdim, a.dtype) for prim in (prims.amin, prims.amax))
    return torch.return_types.aminmax((lo, hi))


def _zero_nans(a):
    return clang.where(clang.isnan(a), 0, a) if dtypes.is_float(a.dtype) else a


@torchsymbol(torch.nansum, T.nansum)
def nansum(a, dim=None, keepdim=False, *, dtype=None):
    return sum(_zero_nans(a), dim, keepdim, dtype=dtype)


@torchsymbol(torch.nanmean, T.nanmean)
def nanmean(a, dim=None, keepdim=False, *, dtype=None):
    check(dtypes.is_inexact(a.dtype),
          lambda: f"nanmean(): expected input to have floating point or complex dtype but got "
                  f"{scalar_type_name(a.dtype)}")
    count = sum(clang.bitwise_not(clang.isnan(a)), dim, keepdim)
    return clang.true_divide(nansum(a, dim, keepdim, dtype=dtype), count)
