"""VJP rules for torch-language symbols: for torch's conventions, and for speed.

Differentiating a decomposition gives the derivative of that decomposition, which agrees
with torch everywhere except where torch picks a convention: at a kink (hardtanh's bounds),
or where the decomposition's intermediates overflow (sigmoid at -inf, softplus far past
its threshold). These rules copy torch's backward formulas (aten's *_backward), so those
points get torch's gradient, and the forward keeps each op whole (one torch call).

A symbol without a rule also runs, forward and backward, as its decomposition: many prim
calls where torch makes one. The ops of a transformer training step (linear, gelu,
layer_norm, softmax, log_softmax, cross_entropy, scaled_dot_product_attention, embedding)
have rules for that reason: one torch call forward, a few torch-level ops backward.
"""
from __future__ import annotations

import math

import torch

from thunderfn import clang
import thunderfn.torch as ltorch
from thunderfn.core import dtypes
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import canonical_dim
from thunderfn.torch.nn import _legacy_reduction, _repeat_heads
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


# -- the ops of a transformer training step --------------------------------------------------------
# Without a rule, reverse mode would run each of these as its decomposition (many prim calls,
# forward and backward); with one, the forward is one torch call and the backward a few
# torch-level ops, recomputing what it needs from the inputs (mean and rstd, the attention
# weights) rather than saving it. Every rule is traceable, so a second derivative works.
def _computed(*tensors):
    """The tensors in the computation dtype of the first (float32 for half precision)."""
    compute = dtypes.computation_dtype(tensors[0].dtype)
    return tuple(None if t is None else clang.maybe_convert_to_dtype(t, compute) for t in tensors)


def _sum_to(x, shape):
    """Undo the broadcasting of something of `shape` to x's shape."""
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
    return clang.reshape(ltorch.sum(x, dims) if dims else x, shape)


def _matrix_t(x):
    return clang.transpose(x, -2, -1)


@defvjp(ltorch.linear.id)
def _linear_vjp(res, g):  # out = x @ w.T + b; w is (out, in), or (in,) for a dot product over the last dim
    x, w = res.args[:2]
    b = _argument(res, 2, "bias", None)
    rows = torch.Size(x.shape[:-1]).numel()
    if w.ndim == 1:
        dx = clang.mul(clang.unsqueeze(g, -1) if g.ndim else g, w)
        dw = clang.mul(g, x) if x.ndim == 1 else ltorch.matmul(clang.reshape(g, (rows,)), clang.reshape(x, (rows, w.shape[0])))
    else:
        dx = ltorch.matmul(g, w)
        g2, x2 = clang.reshape(g, (rows, w.shape[0])), clang.reshape(x, (rows, w.shape[1]))
        dw = ltorch.matmul(_matrix_t(g2), x2)
    return (dx, dw) + ((_sum_to(g, b.shape) if b is not None else None),) + (None,) * (len(res.args) - 3)


_SQRT_HALF, _INV_SQRT_2PI, _SQRT_2_OVER_PI = math.sqrt(0.5), 1 / math.sqrt(2 * math.pi), math.sqrt(2 / math.pi)


@defvjp(ltorch.gelu.id)
def _gelu_vjp(res, g):  # torch's GeluBackward, in the computation dtype
    x, g = _computed(res.args[0], g)
    if _argument(res, 1, "approximate", "none") == "none":  # cdf(x) + x * pdf(x)
        cdf = clang.mul(clang.add(clang.erf(clang.mul(x, _SQRT_HALF)), 1.0), 0.5)
        deriv = clang.add(cdf, clang.mul(x, clang.mul(clang.exp(clang.mul(clang.mul(x, x), -0.5)), _INV_SQRT_2PI)))
    else:  # 0.5 * (1 + t) + 0.5 * x * (1 - t^2) * inner', t = tanh(inner)
        x_sq = clang.mul(x, x)
        t = clang.tanh(clang.mul(clang.add(x, clang.mul(clang.mul(x_sq, x), 0.044715)), _SQRT_2_OVER_PI))
        inner_deriv = clang.mul(clang.add(clang.mul(x_sq, 3 * 0.044715), 1.0), _SQRT_2_OVER_PI)
        deriv = clang.add(clang.mul(clang.add(t, 1.0), 0.5),
                          clang.mul(clang.mul(clang.mul(x, 0.5), clang.sub(1.0, clang.mul(t, t))), inner_deriv))
    return _only_input(res, clang.mul(g, deriv))


def _softmax_dims(res) -> tuple:
    x, dim = res.args[0], _argument(res, 1, "dim", None)
    if dim is None:  # F.softmax's implicit dim (the forward warned about it)
        dim = 0 if x.ndim in (0, 1, 3) else 1
    return (canonical_dim(dim, x.ndim),) if x.ndim else ()


def _row_sum(x, dims):
    return ltorch.sum(x, dims, keepdim=True) if dims else x


@defvjp(ltorch.softmax.id)
def _softmax_vjp(res, g):  # y * (g - sum(g * y)); y, the output, carries dtype= if given
    y, g = _computed(res.out, g)
    return _only_input(res, clang.mul(y, clang.sub(g, _row_sum(clang.mul(g, y), _softmax_dims(res)))))


@defvjp(ltorch.log_softmax.id)
def _log_softmax_vjp(res, g):  # g - exp(y) * sum(g)
    y, g = _computed(res.out, g)
    return _only_input(res, clang.sub(g, clang.mul(clang.exp(y), _row_sum(g, _softmax_dims(res)))))


@defvjp(ltorch.layer_norm.id)
def _layer_norm_vjp(res, g):
    """torch's formula: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * weight,
    over the normalized dims; mean and rstd recomputed from the input."""
    x, normalized_shape = res.args[:2]
    weight, bias, eps = _argument(res, 2, "weight", None), _argument(res, 3, "bias", None), _argument(res, 4, "eps", 1e-5)
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    batch = tuple(range(x.ndim - len(normalized_shape)))
    xc, gc, w = _computed(x, g, weight)
    var, mean = ltorch.var_mean(xc, dims, correction=0, keepdim=True)
    rstd = clang.rsqrt(clang.add(var, eps))
    xhat = clang.mul(clang.sub(xc, mean), rstd)
    dxhat = gc if w is None else clang.mul(gc, w)
    centered = clang.sub(dxhat, ltorch.mean(dxhat, dims, keepdim=True))
    dx = clang.mul(rstd, clang.sub(centered, clang.mul(xhat, ltorch.mean(clang.mul(dxhat, xhat), dims, keepdim=True))))

    def over_batch(t):
        return ltorch.sum(t, batch) if batch else t

    dw = None if weight is None else over_batch(clang.mul(gc, xhat))
    db = None if bias is None else over_batch(gc)
    return (dx, None, dw, db) + (None,) * (len(res.args) - 4)


@defvjp(ltorch.cross_entropy.id)
def _cross_entropy_vjp(res, g):
    """The gradient of log_softmax followed by the loss: dx = dlogp - softmax * sum(dlogp) over the classes.
    Per element i and class c the loss is -sum_c k_ic * weight_c * logp_ic with k = (g, or g over the mean's
    denominator) * M, where M is the (smoothed) target probabilities, or with class indices (1 - ls) * onehot
    + ls / C, and k is 0 where the target is ignore_index, exactly (even where g over the denominator is inf
    or nan: torch leaves ignored elements' gradient at 0). The target, given as probabilities, and the weight
    get their gradients too."""
    x, target = res.args[:2]
    weight, ignore_index = _argument(res, 2, "weight", None), _argument(res, 4, "ignore_index", -100)
    reduction = _legacy_reduction(_argument(res, 3, "size_average", None), _argument(res, 5, "reduce", None),
                                  _argument(res, 6, "reduction", "mean"))
    smoothing = _argument(res, 7, "label_smoothing", 0.0)
    class_dim = 0 if x.ndim == 1 else 1
    n_classes = x.shape[class_dim]
    per_class = (n_classes,) + (1,) * (x.ndim - 2)  # a (C,) tensor reshaped to broadcast along x's class dim
    logp, g, weight_c, out = _computed(ltorch.log_softmax(x, class_dim), g, weight, res.out)
    weight_c = None if weight_c is None else clang.reshape(weight_c, per_class)

    def along_classes(t):  # a tensor of x's shape without the class dim, broadcastable against x
        return clang.unsqueeze(t, class_dim) if x.ndim > 1 and t.ndim else t

    def smoothed(m):
        return clang.add(clang.mul(m, 1 - smoothing), smoothing / n_classes) if smoothing > 0 else m

    if tuple(target.shape) == tuple(x.shape):  # class probabilities
        m = smoothed(clang.maybe_convert_to_dtype(target, logp.dtype))
        if reduction == "none":
            k = along_classes(g)
        else:  # the mean is over the elements: numel / C of them
            k = g if reduction == "sum" else clang.true_divide(g, x.numel() / n_classes if n_classes else 0.0)
        dtarget = clang.mul(clang.mul(k, logp), -(1 - smoothing))
        dtarget = dtarget if weight_c is None else clang.mul(dtarget, weight_c)
        count = None
    else:  # class indices
        tgt = clang.maybe_convert_to_dtype(target, torch.int64)
        tgt = clang.reshape(tgt, ()) if x.ndim == 1 else tgt
        valid = clang.ne(tgt, ignore_index)
        safe = clang.where(valid, tgt, 0)
        classes = clang.reshape(clang.arange(0, n_classes, 1, device=x.device, dtype=torch.int64), per_class)
        onehot = clang.maybe_convert_to_dtype(clang.eq(along_classes(safe), classes), logp.dtype)
        m = smoothed(onehot)
        k = g
        if reduction == "mean":  # over the weight of the valid elements' targets (their count, unweighted)
            counted = valid if weight is None else clang.where(valid, ltorch.take(weight, safe), 0.0)
            k = clang.true_divide(g, ltorch.sum(clang.maybe_convert_to_dtype(counted, logp.dtype)))
        k = along_classes(clang.where(valid, k, 0.0))
        dtarget, count = None, (onehot if reduction == "mean" else None)
    km = clang.mul(k, m)
    dlogp = clang.neg(km if weight_c is None else clang.mul(km, weight_c))
    dx = clang.sub(dlogp, clang.mul(clang.exp(logp), ltorch.sum(dlogp, class_dim, keepdim=True)))
    dweight = None
    if weight is not None:  # d/dweight_c of -sum k M weight logp, and for the mean, of its denominator
        per_element = clang.mul(km, logp)
        if count is not None:
            per_element = clang.add(per_element, clang.mul(clang.mul(k, count), out))
        others = tuple(d for d in range(x.ndim) if d != class_dim)
        dweight = clang.neg(ltorch.sum(per_element, others) if others else per_element)
    return (dx, dtarget, dweight) + (None,) * (len(res.args) - 3)


def _attention_weights(scores, rows_may_be_masked: bool):
    """softmax over the last dim, 0 on rows where everything is masked out (as torch's attention gives), by a
    softmax over zeros there: no nan arises that a second derivative would carry."""
    if not rows_may_be_masked or scores.shape[-1] == 0:
        return ltorch.softmax(scores, -1)
    dead = clang.eq(ltorch.amax(scores, -1, keepdim=True), -float("inf"))
    return clang.where(dead, 0.0, ltorch.softmax(clang.where(dead, 0.0, scores), -1))


def _fold_heads(d, like):
    """The cotangent of heads repeated for grouped-query attention (torch/nn.py's _repeat_heads): summed per group."""
    if d.ndim < 3 or like.ndim < 3 or d.shape[-3] == like.shape[-3]:
        return d
    shape, heads = tuple(d.shape), like.shape[-3]
    return ltorch.sum(clang.reshape(d, shape[:-3] + (heads, shape[-3] // heads) + shape[-2:]), -3)


@defvjp(ltorch.scaled_dot_product_attention.id)
def _scaled_dot_product_attention_vjp(res, g):
    """The attention weights P recomputed (matmul and softmax), then dv = P^T g, dS = P * (dP - sum(dP * P))
    with dP = g v^T, dq = scale * dS k, dk = scale * dS^T q; a float mask gets dS."""
    query, key, value = res.args[:3]
    attn_mask, dropout_p = _argument(res, 3, "attn_mask", None), _argument(res, 4, "dropout_p", 0.0)
    is_causal, scale = _argument(res, 5, "is_causal", False), _argument(res, 6, "scale", None)
    if dropout_p > 0.0:  # F.scaled_dot_product_attention with dropout is traced as its decomposition instead
        raise UnsupportedOpError("thunderfn cannot differentiate ltorch.scaled_dot_product_attention called directly with "
                                 "dropout_p > 0: torch's forward draws a dropout mask the backward cannot see; call "
                                 "torch.nn.functional.scaled_dot_product_attention, which is differentiated through its "
                                 "decomposition when dropout_p > 0")
    q, k, v, g = _computed(query, key, value, g)
    if _argument(res, 7, "enable_gqa", False) and query.ndim >= 3:
        k, v = _repeat_heads(k, q.shape[-3] // k.shape[-3]), _repeat_heads(v, q.shape[-3] // v.shape[-3])
    L, S = query.shape[-2], key.shape[-2]
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = clang.mul(ltorch.matmul(q, _matrix_t(k)), scale)
    mask = attn_mask
    if is_causal:  # as the forward combines it with an explicit mask
        causal = clang.ge(clang.unsqueeze(clang.arange(0, L, 1, device=query.device, dtype=torch.int64), 1),
                          clang.unsqueeze(clang.arange(0, S, 1, device=query.device, dtype=torch.int64), 0))
        mask = causal if mask is None else (clang.bitwise_and(mask, causal) if mask.dtype is torch.bool
                                            else clang.where(causal, mask, -float("inf")))
    if mask is not None:
        scores = (clang.where(mask, scores, -float("inf")) if mask.dtype is torch.bool
                  else clang.add(scores, clang.maybe_convert_to_dtype(mask, scores.dtype)))
    probs = _attention_weights(scores, attn_mask is not None)
    dv = ltorch.matmul(_matrix_t(probs), g)
    dprobs = ltorch.matmul(g, _matrix_t(v))
    dscores = clang.mul(probs, clang.sub(dprobs, ltorch.sum(clang.mul(dprobs, probs), -1, keepdim=True)))
    dq = clang.mul(ltorch.matmul(dscores, k), scale)
    dk = clang.mul(ltorch.matmul(_matrix_t(dscores), q), scale)
    dmask = None if attn_mask is None or attn_mask.dtype is torch.bool else _sum_to(dscores, attn_mask.shape)
    cts = (_sum_to(dq, query.shape), _sum_to(_fold_heads(dk, key), key.shape), _sum_to(_fold_heads(dv, value), value.shape))
    return cts + (dmask,) + (None,) * (len(res.args) - 4)


@defvjp(ltorch.embedding.id)
def _embedding_vjp(res, g):  # the rows of g added into zeros at the indices
    indices, weight = res.args[:2]
    if _argument(res, 2, "padding_idx", None) is not None or _argument(res, 5, "scale_grad_by_freq", False):
        # embedding's decomposition refuses these when weight is differentiated (torch runs it, opaque)
        raise RuntimeError("internal: embedding's rule met padding_idx or scale_grad_by_freq")
    n = indices.numel()
    # int64: index_add's own backward gathers with the index broadcast, which torch 2.13 gets wrong for int32
    flat = clang.reshape(clang.maybe_convert_to_dtype(indices, torch.int64), (n,))
    zeros = clang.full(weight.shape, 0, device=weight.device, dtype=g.dtype)
    dweight = ltorch.index_add(zeros, 0, flat, clang.reshape(g, (n, weight.shape[1])))
    return (None, dweight) + (None,) * (len(res.args) - 2)
