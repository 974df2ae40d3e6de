"""Rules of the nn family: the ops of a training step whose rules run eager's backward kernels
(softmax, log_softmax, layer, batch and group norm, cross entropy, attention, embedding), and the
losses whose rules keep torch's conventions at edge points.

Without a rule, reverse mode would run each of these as its decomposition (many prim calls,
forward and backward); with one, the forward is one torch call and the backward a few torch-level
ops, recomputing what it needs from the inputs (mean and rstd, the attention weights) rather than
saving it. Every rule is traceable, so a second derivative works.
"""
from __future__ import annotations

import inspect
import math

import torch

import thunderfn.torch as ltorch
from thunderfn import clang
from thunderfn.core import dtypes
from thunderfn.core.proxies import TensorProxy
from thunderfn.prims import canonical_dim
from thunderfn.torch.aten_backward import updated_running_stats
from thunderfn.torch.nn import _legacy_reduction, _repeat_heads
from thunderfn.torch.reductions import sum_to
from thunderfn.transforms.rules.common import computed, in_dtype, matrix_t, move_to_front, only_input
from thunderfn.transforms.rules.define import defbatch, defjvp, defvjp, wants_gradient


def _softmax_dims(call) -> tuple:
    x, dim = call.args[0], call.arg("dim")
    if dim is None:  # F.softmax's implicit dim (the forward warned about it)
        dim = 0 if x.ndim in (0, 1, 3) else 1
    return (canonical_dim(dim, x.ndim),) if x.ndim else ()


def _softmax_like_vjp(call, g, backward_data):
    """eager's kernel (the forward saved its output), then back to the input's dtype where dtype= changed it."""
    x, y = call.args[0], call.out
    dims = _softmax_dims(call)
    dx = backward_data(g, y, dims[0] if dims else 0, y.dtype)
    return only_input(call, in_dtype(dx, x.dtype))


defvjp(ltorch.softmax.id)(lambda call, g: _softmax_like_vjp(call, g, ltorch.softmax_backward_data))
defvjp(ltorch.log_softmax.id)(lambda call, g: _softmax_like_vjp(call, g, ltorch.log_softmax_backward_data))


@defvjp(ltorch.native_layer_norm.id)
def _native_layer_norm_vjp(call, g):
    """eager's kernel, from the mean and rstd the forward returned (layer_norm is differentiated through its
    decomposition, native_layer_norm). Cotangents of the mean and rstd themselves (torch ignores them) reach
    the input too: a second derivative gets them from the first backward, which reads both."""
    x, normalized_shape, weight, bias = (call.arg(name) for name in ("input", "normalized_shape", "weight", "bias"))
    out, mean, rstd = call.out
    g_out, g_mean, g_rstd = g
    dx = dw = db = None
    if g_out is not None:
        mask = [True, weight is not None, bias is not None]
        dx, dw, db = ltorch.native_layer_norm_backward(g_out, x, normalized_shape, mean, rstd, weight, bias, mask)
    if g_mean is not None or g_rstd is not None:
        n = math.prod(normalized_shape)
        xc, mean_c, rstd_c = computed(x, mean, rstd)
        extra = None
        if g_mean is not None:  # mean = sum(x) / n
            extra = ltorch.div(in_dtype(g_mean, xc.dtype), n)
        if g_rstd is not None:  # rstd = (var + eps) ** -1/2, var = sum((x - mean)^2) / n
            d = ltorch.mul(ltorch.mul(in_dtype(g_rstd, xc.dtype), ltorch.mul(rstd_c, ltorch.mul(rstd_c, rstd_c))),
                          ltorch.div(ltorch.sub(xc, mean_c), -n))
            extra = d if extra is None else ltorch.add(extra, d)
        extra = in_dtype(ltorch.expand(extra, tuple(x.shape)), x.dtype)
        dx = extra if dx is None else ltorch.add(dx, extra)
    return dx, None, dw, db, None


def _batch_norm_statistics_cotangent(x, save_mean, save_invstd, g_mean, g_invstd):
    """The input's cotangent through batch norm's saved (C,) statistics, which a second derivative reaches (the
    first backward reads both): mean = sum(x) / n and invstd = (var + eps) ** -1/2, var = sum((x - mean)^2) / n,
    over every dim but the channels."""
    n = x.numel() // x.shape[1]
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    xc, mean_c, invstd_c = computed(x, save_mean, save_invstd)
    extra = None
    if g_mean is not None:
        extra = ltorch.reshape(ltorch.div(in_dtype(g_mean, xc.dtype), n), shape)
    if g_invstd is not None:
        cubed = ltorch.mul(invstd_c, ltorch.mul(invstd_c, invstd_c))
        d = ltorch.mul(ltorch.reshape(ltorch.mul(in_dtype(g_invstd, xc.dtype), cubed), shape),
                       ltorch.div(ltorch.sub(xc, ltorch.reshape(mean_c, shape)), -n))
        extra = d if extra is None else ltorch.add(extra, d)
    return in_dtype(ltorch.expand(extra, tuple(x.shape)), x.dtype)


def _batch_norm_running_stats_cotangents(x, weight, running_mean, running_var, eps, g_out):
    """Evaluation mode's cotangents of the running statistics, which aten does not differentiate (torch refuses a
    running_mean that requires grad): out = (x - running_mean) * invstd * weight + bias with
    invstd = (running_var + eps) ** -1/2."""
    dims = (0, *range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    xc, g, mean, var, w = computed(x, g_out, running_mean, running_var, weight)
    invstd = ltorch.rsqrt(ltorch.add(var, eps))
    scale = invstd if w is None else ltorch.mul(invstd, w)
    d_mean = ltorch.neg(ltorch.mul(ltorch.sum(g, dims), scale))
    dot = ltorch.sum(ltorch.mul(g, ltorch.sub(xc, ltorch.reshape(mean, shape))), dims)
    d_var = ltorch.mul(ltorch.mul(dot, ltorch.mul(scale, ltorch.mul(invstd, invstd))), -0.5)
    return in_dtype(d_mean, running_mean.dtype), in_dtype(d_var, running_var.dtype)


def _batch_norm_vjp(call, g_out, g_mean, g_invstd) -> tuple:
    """Cotangents of native_batch_norm's tensors: eager's kernel, native_batch_norm_backward, for the output's
    (output_mask: the arguments the backward wants), plus those through the saved statistics, and in evaluation
    mode the running statistics' where wanted."""
    x, weight, bias, running_mean, running_var, training, eps = (call.arg(name) for name in (
        "input", "weight", "bias", "running_mean", "running_var", "training", "eps"))
    save_mean, save_invstd = call.out[1:3]
    dx = dw = db = d_mean = d_var = None
    if g_out is not None:
        mask = [wants_gradient(x), weight is not None and wants_gradient(weight),
                bias is not None and wants_gradient(bias)]
        if any(mask):  # (training mode reads the saved statistics only: the running ones are not kept for it)
            stats = (None, None) if training else (running_mean, running_var)
            dx, dw, db = ltorch.native_batch_norm_backward(g_out, x, weight, *stats, save_mean, save_invstd, training,
                                                           eps, mask)
        if not training and (wants_gradient(running_mean) or wants_gradient(running_var)):
            d_mean, d_var = _batch_norm_running_stats_cotangents(x, weight, running_mean, running_var, eps, g_out)
    if training and (g_mean is not None or g_invstd is not None):
        extra = _batch_norm_statistics_cotangent(x, save_mean, save_invstd, g_mean, g_invstd)
        dx = extra if dx is None else ltorch.add(dx, extra)
    return (dx, dw, db, d_mean, d_var) + (None,) * max(0, len(call.args) - 5)


defvjp(ltorch.native_batch_norm.id)(lambda call, g: _batch_norm_vjp(call, *g))


@defvjp(ltorch.native_batch_norm_legit_functional.id)
def _batch_norm_legit_functional_vjp(call, g):
    """native_batch_norm's cotangents, and the new running statistics' passed back to the old ones, as
    updated_running_stats' rule does (eager writes them in place outside autograd: the input's gradient
    does not reach them, and a statistic keeps its own derivative; in evaluation mode they are the old ones)."""
    grads = list(_batch_norm_vjp(call, *g[:3]))
    for position, passed in ((3, g[3]), (4, g[4])):
        if passed is not None:
            grads[position] = passed if grads[position] is None else ltorch.add(grads[position], passed)
    return tuple(grads)


# torch's kernels write the new running statistics in place, outside autograd: no gradient of the input
# reaches them, and each keeps the derivative it had (torch/aten_backward.py; its JVP rule below)
defvjp(updated_running_stats.id)(lambda call, g: (None, g[0], g[1]) + (None,) * (len(call.args) - 3))


# -- the running statistics' update (torch/aten_backward.py) ---------------------------------
# torch's kernels write the new statistics into the running ones in place, outside autograd: the
# input's tangent does not reach them, and each keeps the tangent it had before the write, which is
# what torch.func.jvp returns for them (not the formula's (1 - momentum) * tangent). The VJP rule
# (above) is the transpose.
defjvp(updated_running_stats.id)(lambda call, t: (t[1], t[2]))


@defvjp(ltorch.native_group_norm.id)
def _native_group_norm_vjp(call, g):
    """eager's kernel, native_group_norm_backward, for the output's cotangent (output_mask: the arguments the
    backward wants; aten computes grad_bias only beside grad_weight, so without a weight the bias's is a sum here),
    plus the input's through the saved mean and rstd, which a second derivative reaches."""
    x, weight, bias, n, c, hxw, group = (call.arg(p) for p in ("input", "weight", "bias", "N", "C", "HxW", "group"))
    mean, rstd = call.out[1:]
    g_out, g_mean, g_rstd = g
    dx = dw = db = None
    if g_out is not None:
        mask = [wants_gradient(x), weight is not None and wants_gradient(weight),
                weight is not None and bias is not None and wants_gradient(bias)]
        if any(mask):
            dx, dw, db = ltorch.native_group_norm_backward(g_out, x, mean, rstd, weight, n, c, hxw, group, mask)
        if weight is None and bias is not None and wants_gradient(bias):
            db = in_dtype(ltorch.sum(ltorch.reshape(g_out, (n, c, hxw)), (0, 2)), bias.dtype)
    if g_mean is not None or g_rstd is not None:
        size = c // group * hxw
        xc, mean_c, rstd_c = computed(ltorch.reshape(x, (n, group, size)), mean, rstd)
        extra = None
        if g_mean is not None:  # mean = sum(x) / size per sample and group
            extra = ltorch.unsqueeze(ltorch.div(in_dtype(g_mean, xc.dtype), size), 2)
        if g_rstd is not None:  # rstd = (var + eps) ** -1/2, var = sum((x - mean)^2) / size
            cubed = ltorch.mul(rstd_c, ltorch.mul(rstd_c, rstd_c))
            d = ltorch.mul(ltorch.unsqueeze(ltorch.mul(in_dtype(g_rstd, xc.dtype), cubed), 2),
                           ltorch.div(ltorch.sub(xc, ltorch.unsqueeze(mean_c, 2)), -size))
            extra = d if extra is None else ltorch.add(extra, d)
        extra = in_dtype(ltorch.reshape(ltorch.expand(extra, (n, group, size)), tuple(x.shape)), x.dtype)
        dx = extra if dx is None else ltorch.add(dx, extra)
    return (dx, dw, db) + (None,) * max(0, len(call.args) - 3)


def _constant_or_none(t) -> bool:
    return t is None or not isinstance(t, TensorProxy) or t.constant is not None


@defvjp(ltorch.nll_loss_forward.id, applies=lambda self, target, weight, *rest: _constant_or_none(weight))
def _nll_loss_forward_vjp(call, g):
    """eager's kernel. It gives the weight no gradient (torch refuses to differentiate it), so a weight that
    may need one (not a captured constant) is differentiated through the decomposition instead."""
    self, target, weight, reduction, ignore_index = (call.arg(name) for name in (
        "self", "target", "weight", "reduction", "ignore_index"))
    if g[0] is None:
        return (None,) * len(call.args)
    return (ltorch.nll_loss_backward(g[0], self, target, weight, reduction, ignore_index, call.out[1]),) + (None,) * 4


def _by_eagers_kernels(x, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                       label_smoothing=0.0) -> bool:
    """cross_entropy calls eager computes as log_softmax then nll_loss (2-d input, class indices, no smoothing):
    its decomposition is that too, and their rules run eager's backward kernels."""
    return (x.ndim == 2 and target.ndim == 1 and target.dtype is torch.int64 and label_smoothing == 0
            and _constant_or_none(weight))


@defvjp(ltorch.cross_entropy.id, applies=lambda *args, **kwargs: not _by_eagers_kernels(*args, **kwargs))
def _cross_entropy_vjp(call, g):
    """The gradient of log_softmax followed by the loss: dx = dlogp - softmax * sum(dlogp) over the classes.
    Per element i and class c the loss is -sum_c k_ic * weight_c * logp_ic with k = (g, or g over the mean's
    denominator) * M, where M is the (smoothed) target probabilities, or with class indices (1 - ls) * onehot
    + ls / C, and k is 0 where the target is ignore_index, exactly (even where g over the denominator is inf
    or nan: torch leaves ignored elements' gradient at 0). The target, given as probabilities, and the weight
    get their gradients too."""
    x, target = call.args[:2]
    weight, ignore_index = call.arg("weight"), call.arg("ignore_index")
    reduction = _legacy_reduction(call.arg("size_average"), call.arg("reduce"), call.arg("reduction"))
    smoothing = call.arg("label_smoothing")
    class_dim = 0 if x.ndim == 1 else 1
    n_classes = x.shape[class_dim]
    per_class = (n_classes,) + (1,) * (x.ndim - 2)  # a (C,) tensor reshaped to broadcast along x's class dim
    logp, g, weight_c, out = computed(ltorch.log_softmax(x, class_dim), g, weight, call.out)
    weight_c = None if weight_c is None else ltorch.reshape(weight_c, per_class)

    def along_classes(t):  # a tensor of x's shape without the class dim, broadcastable against x
        return ltorch.unsqueeze(t, class_dim) if x.ndim > 1 and t.ndim else t

    def smoothed(m):
        return ltorch.add(ltorch.mul(m, 1 - smoothing), smoothing / n_classes) if smoothing > 0 else m

    if tuple(target.shape) == tuple(x.shape):  # class probabilities
        m = smoothed(in_dtype(target, logp.dtype))
        if reduction == "none":
            k = along_classes(g)
        else:  # the mean is over the elements: numel / C of them
            k = g if reduction == "sum" else ltorch.div(g, x.numel() / n_classes if n_classes else 0.0)
        dtarget = ltorch.mul(ltorch.mul(k, logp), -(1 - smoothing))
        dtarget = dtarget if weight_c is None else ltorch.mul(dtarget, weight_c)
        count = None
    else:  # class indices
        tgt = in_dtype(target, torch.int64)
        tgt = ltorch.reshape(tgt, ()) if x.ndim == 1 else tgt
        valid = ltorch.ne(tgt, ignore_index)
        safe = ltorch.where(valid, tgt, 0)
        classes = ltorch.reshape(ltorch.arange(0, n_classes, 1, device=x.device, dtype=torch.int64), per_class)
        onehot = in_dtype(ltorch.eq(along_classes(safe), classes), logp.dtype)
        m = smoothed(onehot)
        k = g
        if reduction == "mean":  # over the weight of the valid elements' targets (their count, unweighted)
            counted = valid if weight is None else ltorch.where(valid, ltorch.take(weight, safe), 0.0)
            k = ltorch.div(g, ltorch.sum(in_dtype(counted, logp.dtype)))
        k = along_classes(ltorch.where(valid, k, 0.0))
        dtarget, count = None, (onehot if reduction == "mean" else None)
    km = ltorch.mul(k, m)
    dlogp = ltorch.neg(km if weight_c is None else ltorch.mul(km, weight_c))
    dx = ltorch.sub(dlogp, ltorch.mul(ltorch.exp(logp), ltorch.sum(dlogp, class_dim, keepdim=True)))
    dweight = None
    if weight is not None:  # d/dweight_c of -sum k M weight logp, and for the mean, of its denominator
        per_element = ltorch.mul(km, logp)
        if count is not None:
            per_element = ltorch.add(per_element, ltorch.mul(ltorch.mul(k, count), out))
        others = tuple(d for d in range(x.ndim) if d != class_dim)
        dweight = ltorch.neg(ltorch.sum(per_element, others) if others else per_element)
    return (dx, dtarget, dweight) + (None,) * (len(call.args) - 3)


def _attention_weights(scores, rows_may_be_masked: bool):
    """softmax over the last dim, 0 on rows where everything is masked out (as torch's attention gives), by a
    softmax over zeros there: no nan arises that a second derivative would carry."""
    if not rows_may_be_masked or scores.shape[-1] == 0:
        return ltorch.softmax(scores, -1)
    dead = ltorch.eq(ltorch.amax(scores, -1, keepdim=True), -float("inf"))
    return ltorch.where(dead, 0.0, ltorch.softmax(ltorch.where(dead, 0.0, scores), -1))


def _fold_heads(d, like):
    """The cotangent of heads repeated for grouped-query attention (torch/nn.py's _repeat_heads): summed per group."""
    if d.ndim < 3 or like.ndim < 3 or d.shape[-3] == like.shape[-3]:
        return d
    shape, heads = tuple(d.shape), like.shape[-3]
    return ltorch.sum(ltorch.reshape(d, shape[:-3] + (heads, shape[-3] // heads) + shape[-2:]), -3)


def _without_dropout(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs) -> bool:
    return dropout_p == 0.0


# With dropout, torch's one call draws a mask this rule could not see: reverse mode then runs the
# decomposition, which draws it as eager does, and differentiates through it.
@defvjp(ltorch.scaled_dot_product_attention.id, applies=_without_dropout)
def _scaled_dot_product_attention_vjp(call, g):
    """The attention weights P recomputed (matmul and softmax), then dv = P^T g, dS = P * (dP - sum(dP * P))
    with dP = g v^T, dq = scale * dS k, dk = scale * dS^T q; a float mask gets dS."""
    query, key, value = call.args[:3]
    attn_mask = call.arg("attn_mask")
    is_causal, scale = call.arg("is_causal"), call.arg("scale")
    q, k, v, g = computed(query, key, value, g)
    if call.arg("enable_gqa") and query.ndim >= 3:
        k, v = _repeat_heads(k, q.shape[-3] // k.shape[-3]), _repeat_heads(v, q.shape[-3] // v.shape[-3])
    L, S = query.shape[-2], key.shape[-2]
    scale = 1 / torch.sym_sqrt(query.shape[-1]) if scale is None else scale  # (math.sqrt would pin a symbolic size)
    scores = ltorch.mul(ltorch.matmul(q, matrix_t(k)), scale)
    mask = attn_mask
    if is_causal:  # as the forward combines it with an explicit mask
        causal = ltorch.ge(ltorch.unsqueeze(ltorch.arange(0, L, 1, device=query.device, dtype=torch.int64), 1),
                          ltorch.unsqueeze(ltorch.arange(0, S, 1, device=query.device, dtype=torch.int64), 0))
        mask = causal if mask is None else (ltorch.bitwise_and(mask, causal) if mask.dtype is torch.bool
                                            else ltorch.where(causal, mask, -float("inf")))
    if mask is not None:
        scores = (ltorch.where(mask, scores, -float("inf")) if mask.dtype is torch.bool
                  else ltorch.add(scores, in_dtype(mask, scores.dtype)))
    probs = _attention_weights(scores, attn_mask is not None)
    dv = ltorch.matmul(matrix_t(probs), g)
    dprobs = ltorch.matmul(g, matrix_t(v))
    dscores = ltorch.mul(probs, ltorch.sub(dprobs, ltorch.sum(ltorch.mul(dprobs, probs), -1, keepdim=True)))
    dq = ltorch.mul(ltorch.matmul(dscores, k), scale)
    dk = ltorch.mul(ltorch.matmul(matrix_t(dscores), q), scale)
    dmask = None if attn_mask is None or attn_mask.dtype is torch.bool else sum_to(dscores, attn_mask.shape)
    cts = (sum_to(dq, query.shape), sum_to(_fold_heads(dk, key), key.shape),
           sum_to(_fold_heads(dv, value), value.shape))
    return cts + (dmask,) + (None,) * (len(call.args) - 4)


_SDPA_PARAMETERS = inspect.signature(ltorch.scaled_dot_product_attention.fn).parameters


@defbatch(ltorch.scaled_dot_product_attention.id)
def _scaled_dot_product_attention_batch(call, dims):
    """The vmapped batch folded into the call's own leading batch dimension, so the batched program is
    one attention call (which the sdpa executor's fused kernels can claim) rather than its math
    decomposition."""
    options = dict(zip(_SDPA_PARAMETERS, call.args), **call.kwargs)
    query, key, value = options.pop("query"), options.pop("key"), options.pop("value")
    q_dim, k_dim, v_dim = dims[:3]
    mask = options.get("attn_mask")
    # folded into the first of the call's own batch dims: q, k and v batched alike, per example at least
    # 3-d with equal leading dims, and nothing that would need the batch too (a batched or full-rank mask,
    # dropout's random draws)
    if (None in (q_dim, k_dim, v_dim) or any(d is not None for d in dims[3:]) or options.get("dropout_p", 0.0) != 0.0
            or (mask is not None and mask.ndim > 2)):
        return NotImplemented
    query, key, value = (move_to_front(t, d) for t, d in ((query, q_dim), (key, k_dim), (value, v_dim)))
    if query.ndim < 4 or not (query.shape[1:-2] == key.shape[1:-2] == value.shape[1:-2]):
        return NotImplemented
    n, lead = query.shape[0], query.shape[1]

    def folded(t):
        return ltorch.reshape(t, (n * lead, *t.shape[2:]))

    result = ltorch.scaled_dot_product_attention(folded(query), folded(key), folded(value), **options)
    return ltorch.reshape(result, (n, lead, *result.shape[1:])), 0


@defvjp(ltorch.embedding.id)
def _embedding_vjp(call, g):  # eager's kernel: the rows of g summed into zeros at the indices
    indices, weight = call.args[:2]
    padding_idx, scale_grad_by_freq = call.arg("padding_idx"), call.arg("scale_grad_by_freq")
    padding_idx = -1 if padding_idx is None else padding_idx % weight.shape[0]  # F.embedding's normalization
    return (None, ltorch.embedding_dense_backward(g, indices, weight.shape[0], padding_idx, scale_grad_by_freq)) + (
        None,) * (len(call.args) - 2)


# -- losses: torch's conventions at edge points ---------------------------------------------------
def _loss_scale(g, reduction, numel):
    """The cotangent of each element of the unreduced loss: g, or for the mean g over the element count."""
    return ltorch.div(g, numel) if reduction == "mean" else g  # (a symbolic count stays one: no float())


def _difference(input, target):
    """input - target, broadcast, in the computation dtype of their promoted dtype (as the losses compute it)."""
    compute = dtypes.computation_dtype(dtypes.result_type(input, target))
    return ltorch.sub(in_dtype(input, compute), in_dtype(target, compute))


def _difference_cotangents(call, d):
    """d, the cotangent of input - target, as the input's and the target's."""
    input, target = call.args[:2]
    return sum_to(d, input.shape), sum_to(ltorch.neg(d), target.shape)


@defvjp(ltorch.smooth_l1_loss.id)
def _smooth_l1_loss_vjp(call, g):
    """torch's: clamp((x - y) / beta, -1, 1) per element, so ±1 where the difference is infinite; for beta 0,
    l1_loss's sign(x - y)."""
    reduction = _legacy_reduction(call.arg("size_average"), call.arg("reduce"), call.arg("reduction"))
    beta = call.arg("beta")
    diff = _difference(*call.args[:2])
    slope = ltorch.sign(diff) if beta == 0 else ltorch.where(
        ltorch.le(diff, -beta), -1.0, ltorch.where(ltorch.ge(diff, beta), 1.0, ltorch.div(diff, beta)))
    dd = ltorch.mul(slope, _loss_scale(g, reduction, diff.numel()))
    return _difference_cotangents(call, dd) + (None,) * (len(call.args) - 2)


@defvjp(ltorch.huber_loss.id)
def _huber_loss_vjp(call, g):
    """torch's: clamp(x - y, -delta, delta) per element, so ±delta where the difference is infinite; a weight
    scales it and gets the unweighted loss times g."""
    reduction, delta = call.arg("reduction"), call.arg("delta")
    weight = call.arg("weight")
    diff = _difference(*call.args[:2])
    slope = ltorch.where(ltorch.le(diff, -delta), -delta, ltorch.where(ltorch.ge(diff, delta), delta, diff))
    k = _loss_scale(g, reduction, diff.numel())
    if weight is None:
        return _difference_cotangents(call, ltorch.mul(slope, k)) + (None,) * (len(call.args) - 2)
    z = ltorch.abs(diff)
    loss = ltorch.where(ltorch.lt(z, delta), ltorch.mul(ltorch.mul(z, z), 0.5),
                        ltorch.mul(ltorch.sub(z, 0.5 * delta), delta))
    cts = _difference_cotangents(call, ltorch.mul(ltorch.mul(slope, k), in_dtype(weight, diff.dtype)))
    return cts + (None, None, sum_to(ltorch.mul(loss, k), weight.shape)) + (None,) * (len(call.args) - 5)


_BCE_EPSILON = float(torch.tensor(1e-12, dtype=torch.float32))  # torch's kernel clamps with a float constant


@defvjp(ltorch.binary_cross_entropy.id)
def _binary_cross_entropy_vjp(call, g):
    """torch's: g * (x - y) / max((1 - x) * x, 1e-12) for the input, g * -logit(x) for the target, each times the
    weight: large or infinite at an input of 0 or 1, where the decomposition's clamped logs give nan. torch does
    not differentiate the weight; here it gets the unweighted loss (logs clamped at -100) times g."""
    input, target = call.args[:2]
    weight = call.arg("weight")
    reduction = _legacy_reduction(call.arg("size_average"), call.arg("reduce"), call.arg("reduction"))
    x, y, g, w = computed(input, target, g, weight)
    k = _loss_scale(g, reduction, x.numel())
    kw = k if w is None else ltorch.mul(k, w)
    spread = ltorch.mul(ltorch.sub(1.0, x), x)
    floored = ltorch.where(ltorch.lt(spread, _BCE_EPSILON), _BCE_EPSILON, spread)
    dx = ltorch.mul(kw, ltorch.div(ltorch.sub(x, y), floored))
    dy = ltorch.mul(kw, ltorch.neg(ltorch.log(ltorch.div(x, ltorch.sub(1.0, x)))))
    dweight = None
    if weight is not None:
        def clamped_log(t):
            return ltorch.where(ltorch.lt(t, -100.0), -100.0, t)
        log_x, log_1mx = clamped_log(ltorch.log(x)), clamped_log(ltorch.log1p(ltorch.neg(x)))
        loss = ltorch.sub(ltorch.mul(ltorch.sub(y, 1.0), log_1mx), ltorch.mul(y, log_x))
        dweight = sum_to(ltorch.mul(loss, k), weight.shape)
    return (dx, dy, dweight) + (None,) * (len(call.args) - 3)


@defvjp(ltorch.gaussian_nll_loss.id)
def _gaussian_nll_loss_vjp(call, g):
    """torch clamps var to eps in place under no_grad: every gradient is the loss's at the clamped var, and var's
    passes straight through the clamp (the decomposition's where would give var none below eps)."""
    input, target, var = call.args[0], call.args[1], call.arg("var")
    eps, reduction = call.arg("eps"), call.arg("reduction")
    if clang.is_tensor(var):
        homoscedastic = tuple(var.shape) != tuple(input.shape) and tuple(var.shape) == tuple(input.shape[:-1])
        v = ltorch.unsqueeze(var, -1) if homoscedastic else var  # one variance per row
        v = ltorch.where(ltorch.lt(v, eps), eps, v)
    else:
        v = max(float(var), eps)
    ratio = ltorch.div(ltorch.sub(input, target), v)  # the loss is 0.5 * (log(v) + diff^2 / v)
    k = _loss_scale(g, reduction, ratio.numel())
    dd = ltorch.mul(k, ratio)
    dvar = None
    if clang.is_tensor(var):
        dv = ltorch.mul(ltorch.mul(k, 0.5), ltorch.sub(ltorch.div(1.0, v), ltorch.mul(ratio, ratio)))
        dvar = ltorch.reshape(sum_to(dv, v.shape), var.shape)
    return _difference_cotangents(call, dd) + (dvar,) + (None,) * (len(call.args) - 3)
