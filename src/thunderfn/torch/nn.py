"""Neural-network operations: matmul family, linear, layer_norm, embedding,
cross_entropy, scaled_dot_product_attention and dropout, decomposed so that the
transforms and fusion executors see their insides."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from thunderfn import clang, prims
from thunderfn.clang import is_tensor, keepdim_reshape, maybe_convert_to_dtype
from thunderfn.core import dtypes
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import check
from thunderfn.torch import register_alias, torchsymbol
from thunderfn.torch.reductions import log_softmax, softmax

T = torch.Tensor
__all__ = ["matmul", "mm", "bmm", "linear", "layer_norm", "embedding", "cross_entropy", "nll_loss",
           "scaled_dot_product_attention", "dropout", "mse_loss"]


def _check_same_dtype(a, b, name):
    check(a.dtype == b.dtype, lambda: f"expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}")


@torchsymbol(torch.matmul, T.matmul, T.__matmul__)
def matmul(a, b):
    _check_same_dtype(a, b, "matmul")
    return prims.matmul(a, b)


register_alias(T.__rmatmul__, lambda self, other: matmul(other, self))


@torchsymbol(torch.mm, T.mm)
def mm(a, b):
    check(a.ndim == 2, lambda: "self must be a matrix")
    check(b.ndim == 2, lambda: "mat2 must be a matrix")
    check(a.shape[1] == b.shape[0], lambda: f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})")
    _check_same_dtype(a, b, "mm")
    return prims.matmul(a, b)


@torchsymbol(torch.bmm, T.bmm)
def bmm(a, b):
    check(a.ndim == 3, lambda: f"batch1 must be a 3D tensor")
    check(b.ndim == 3, lambda: f"batch2 must be a 3D tensor")
    check(a.shape[0] == b.shape[0], lambda: f"batch1 and batch2 must have same number of batches, got {a.shape[0]} and {b.shape[0]}")
    check(a.shape[2] == b.shape[1],
          lambda: f"Expected size for first two dimensions of batch2 tensor to be: [{a.shape[0]}, {a.shape[2]}] but got: [{b.shape[0]}, {b.shape[1]}].")
    _check_same_dtype(a, b, "bmm")
    return prims.matmul(a, b)


@torchsymbol(F.linear, torch._C._nn.linear)
def linear(input, weight, bias=None):
    check(weight.ndim in (1, 2), lambda: f"t() expects a tensor with <= 2 dimensions, but self is {weight.ndim}D")
    check(input.shape[-1] == weight.shape[-1] if input.ndim else False,
          lambda: f"mat1 and mat2 shapes cannot be multiplied ({torch.Size(input.shape[:-1]).numel()}x{input.shape[-1] if input.ndim else 1} and {weight.shape[-1]}x{weight.shape[0]})")
    _check_same_dtype(input, weight, "linear")
    out = prims.matmul(input, clang.transpose(weight, 0, 1) if weight.ndim == 2 else weight)
    if bias is not None:
        check(bias.dtype == input.dtype, lambda: f"expected m1 and m2 to have the same dtype, but got: {input.dtype} != {bias.dtype}")
        out = clang.add(out, bias)
    return out


@torchsymbol(F.layer_norm)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n = len(normalized_shape)
    check(n > 0 and tuple(input.shape[input.ndim - n:]) == normalized_shape,
          lambda: f"Given normalized_shape={list(normalized_shape)}, expected input with shape [*, {', '.join(map(str, normalized_shape))}], "
                  f"but got input of size{list(input.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        check(p is None or tuple(p.shape) == normalized_shape,
              lambda: f"Expected {name} to be of same shape as normalized_shape, but got {name} of shape {list(p.shape)} and normalized_shape = {list(normalized_shape)}")
    check(dtypes.is_float(input.dtype), lambda: f"\"LayerNormKernelImpl\" not implemented for '{str(input.dtype)[6:].capitalize()}'")
    dims = tuple(range(input.ndim - n, input.ndim))
    x = maybe_convert_to_dtype(input, dtypes.computation_dtype(input.dtype))
    var, mean = prims.var_mean(x, dims, correction=0)
    rstd = clang.rsqrt(clang.add(keepdim_reshape(var, x, dims), eps))
    out = clang.mul(clang.sub(x, keepdim_reshape(mean, x, dims)), rstd)
    if weight is not None:
        out = clang.mul(out, maybe_convert_to_dtype(weight, out.dtype))
    if bias is not None:
        out = clang.add(out, maybe_convert_to_dtype(bias, out.dtype))
    return maybe_convert_to_dtype(out, input.dtype)


@torchsymbol(F.embedding)
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    check(max_norm is None, lambda: "embedding(max_norm=...) renormalizes the weight in place; thunderfn does not trace that",
          UnsupportedOpError)
    check(weight.ndim == 2, lambda: "'weight' must be 2-D")
    check(input.dtype in (torch.int64, torch.int32),
          lambda: f"Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got {input.type_string()} instead (while checking arguments for embedding)")
    flat = prims.take(weight, clang.reshape(input, (input.numel(),)), 0)
    return clang.reshape(flat, tuple(input.shape) + (weight.shape[1],))


def _reduce_loss(loss, reduction, denominator=None):
    check(reduction in ("none", "mean", "sum"), lambda: f"{reduction} is not a valid value for reduction", ValueError)
    if reduction == "none":
        return loss
    total = prims.sum(loss, tuple(range(loss.ndim)))
    if reduction == "sum":
        return total
    return clang.true_divide(total, denominator if denominator is not None else max(loss.numel(), 0) or float("nan"))


def _legacy_reduction(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return "none" if not reduce else ("mean" if size_average else "sum")


def _class_dim_last(t):
    """(N, C, d1, ...) -> (N*d1*..., C); (C,) -> (1, C)."""
    if t.ndim == 1:
        return clang.reshape(t, (1, t.shape[0]))
    if t.ndim == 2:
        return t
    moved = clang.permute(t, (0, *range(2, t.ndim), 1))
    return clang.reshape(moved, (-1, t.shape[1]))


@torchsymbol(F.nll_loss)
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    check(input.ndim >= 1, lambda: f"Expected 1 or more dimensions (got {input.ndim})", ValueError)
    check(target.dtype in (torch.int64, torch.uint8, torch.int32) or not dtypes.is_inexact(target.dtype),
          lambda: f"expected scalar type Long but found {target.dtype}")
    batch_shape = (input.shape[0],) + tuple(input.shape[2:]) if input.ndim > 1 else ()
    check(tuple(target.shape) == batch_shape,
          lambda: f"Expected input batch_size ({input.shape[0] if input.ndim > 1 else 1}) to match target batch_size ({target.shape[0] if target.ndim else 1})."
          if input.ndim == 2 else f"size mismatch (got input: {list(input.shape)}, target: {list(target.shape)})", ValueError)
    logp = _class_dim_last(input)
    tgt = clang.reshape(target, (-1,))
    valid = clang.ne(tgt, ignore_index)
    safe = clang.where(valid, tgt, 0)
    picked = clang.reshape(prims.take_along_axis(logp, clang.unsqueeze(maybe_convert_to_dtype(safe, torch.int64), 1), 1), (-1,))
    w = clang.where(valid, prims.take(weight, maybe_convert_to_dtype(safe, torch.int64), 0) if weight is not None else 1.0, 0.0)
    w = maybe_convert_to_dtype(w, input.dtype) if is_tensor(w) else w
    loss = clang.neg(clang.mul(picked, w))
    if reduction == "none":
        return clang.reshape(loss, batch_shape)
    total = prims.sum(loss, (0,))
    if reduction == "sum":
        return total
    return clang.true_divide(total, prims.sum(maybe_convert_to_dtype(w, input.dtype) if is_tensor(w) else clang.full(loss.shape, w, device=input.device, dtype=input.dtype), (0,)))


@torchsymbol(F.cross_entropy)
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    check(reduction in ("none", "mean", "sum"), lambda: f"{reduction} is not a valid value for reduction", ValueError)
    check(0.0 <= label_smoothing <= 1.0, lambda: f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    check(dtypes.is_float(input.dtype), lambda: f"\"log_softmax\" not implemented for '{input.dtype}'")
    class_dim = 1 if input.ndim > 1 else 0
    logp = log_softmax(input, class_dim)
    if dtypes.is_float(target.dtype):  # class probabilities
        check(tuple(target.shape) == tuple(input.shape),
              lambda: f"Expected target size {list(input.shape)}, got {list(target.shape)}", ValueError)
        n_classes = input.shape[class_dim]
        if label_smoothing > 0:
            target = clang.add(clang.mul(target, 1 - label_smoothing), label_smoothing / n_classes)
        terms = clang.mul(logp, target)
        if weight is not None:
            shape = [1] * input.ndim
            shape[class_dim] = n_classes
            terms = clang.mul(terms, clang.reshape(weight, tuple(shape)))
        loss = clang.neg(prims.sum(terms, (class_dim,)))
        if reduction == "mean":
            return clang.true_divide(prims.sum(loss, tuple(range(loss.ndim))), input.shape[0] if input.ndim > 1 else 1)
        return _reduce_loss(loss, reduction)
    nll = nll_loss(logp, target, weight, None, ignore_index, None, reduction)
    if label_smoothing == 0:
        return nll
    # smoothing term: mean over classes of -logp (weighted), masked like nll
    n_classes = input.shape[class_dim]
    flat = _class_dim_last(logp)
    tgt = clang.reshape(target, (-1,))
    valid = clang.ne(tgt, ignore_index)
    per_class = flat if weight is None else clang.mul(flat, weight)
    smooth = clang.where(valid, clang.neg(prims.sum(per_class, (1,))), 0.0)
    if reduction == "none":
        smooth = clang.reshape(smooth, tuple(target.shape))
    elif reduction == "sum":
        smooth = prims.sum(smooth, (0,))
    else:
        if weight is None:
            denom = prims.sum(maybe_convert_to_dtype(valid, input.dtype), (0,))
        else:
            safe = maybe_convert_to_dtype(clang.where(valid, tgt, 0), torch.int64)
            denom = prims.sum(clang.where(valid, prims.take(weight, safe, 0), 0.0), (0,))
        smooth = clang.true_divide(prims.sum(smooth, (0,)), denom)
    return clang.add(clang.mul(nll, 1 - label_smoothing), clang.mul(smooth, label_smoothing / n_classes))


@torchsymbol(F.mse_loss)
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    diff = clang.sub(input, target)
    loss = clang.mul(diff, diff)
    if weight is not None:
        loss = clang.mul(loss, weight)
    return _reduce_loss(loss, reduction)


@torchsymbol(F.scaled_dot_product_attention)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    check(dropout_p == 0.0, lambda: "scaled_dot_product_attention(dropout_p > 0) draws random numbers, which thunderfn "
                                    "does not trace yet; use dropout_p=0.0 (eval) for now", UnsupportedOpError)
    check(query.ndim >= 2 and key.ndim >= 2 and value.ndim >= 2, lambda: "scaled_dot_product_attention expects query, key and value of at least 2 dimensions")
    check(query.dtype == key.dtype == value.dtype,
          lambda: f"Expected query, key, and value to have the same dtype, but got query.dtype: {query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead.")
    check(not (is_causal and attn_mask is not None), lambda: "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    L, S, E = query.shape[-2], key.shape[-2], query.shape[-1]
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        reps = query.shape[-3] // key.shape[-3]
        key = _repeat_heads(key, reps)
        value = _repeat_heads(value, reps)
    scale_factor = 1 / math.sqrt(E) if scale is None else scale
    q = maybe_convert_to_dtype(query, dtypes.computation_dtype(query.dtype))
    k = maybe_convert_to_dtype(key, q.dtype)
    scores = clang.mul(prims.matmul(q, clang.transpose(k, -2, -1)), scale_factor)
    if is_causal:
        rows = clang.unsqueeze(clang.arange(0, L, 1, device=query.device, dtype=torch.int64), 1)
        cols = clang.unsqueeze(clang.arange(0, S, 1, device=query.device, dtype=torch.int64), 0)
        attn_mask = clang.ge(rows, cols)
    if attn_mask is not None:
        if attn_mask.dtype is torch.bool:
            scores = clang.where(attn_mask, scores, -float("inf"))
        else:
            scores = clang.add(scores, maybe_convert_to_dtype(attn_mask, scores.dtype))
    probs = softmax(scores, -1)
    out = prims.matmul(probs, maybe_convert_to_dtype(value, probs.dtype))
    return maybe_convert_to_dtype(out, query.dtype)


def _repeat_heads(t, reps):
    shape = tuple(t.shape)
    x = clang.unsqueeze(t, -3)  # (..., Hk, 1, S, E)
    x = clang.expand_to(x, shape[:-3] + (shape[-3], reps) + shape[-2:])
    return clang.reshape(x, shape[:-3] + (shape[-3] * reps,) + shape[-2:])


@torchsymbol(F.dropout)
def dropout(input, p=0.5, training=True, inplace=False):
    check(0.0 <= p <= 1.0, lambda: f"dropout probability has to be between 0 and 1, but got {p}", ValueError)
    check(not inplace, lambda: "dropout(inplace=True) mutates its input, which thunderfn does not trace yet")
    if not training or p == 0.0:
        return input
    raise UnsupportedOpError("dropout in training mode draws random numbers, which thunderfn does not trace yet; "
                             "call model.eval() or use p=0 until randomness support lands")
