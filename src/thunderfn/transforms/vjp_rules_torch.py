"""VJP rules for torch-language symbols: for torch's conventions, and for speed.

Differentiating a decomposition gives the derivative of that decomposition, which agrees
with torch everywhere except where torch picks a convention: at a kink (hardtanh's bounds,
logsigmoid at 0), where the decomposition's intermediates overflow (sigmoid at -inf, softplus
far past its threshold, elu's unselected exp), where torch masks a 0/0 (the norm of a zero
vector, the std of a constant tensor), or where it picks among equal candidates (torch.max
with dim at a tie). These rules copy torch's backward formulas (aten's *_backward), so those
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
from thunderfn.core import dtypes, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.prims import canonical_dim
from thunderfn.torch.elementwise import _SELU_ALPHA, _SELU_SCALE
from thunderfn.torch.reductions import sum_to as _sum_to
from thunderfn.torch.nn import _legacy_reduction, _repeat_heads
from thunderfn.torch import distributed as collectives
from thunderfn.torch.aten_backward import updated_running_stats
from thunderfn.torch.reductions import _correction, _var_args
from thunderfn.transforms.vjp_rules import NON_DIFFERENTIABLE, _zeros, defvjp, wants_gradient
from thunderfn.errors import UnsupportedOpError


def _to(x, dtype):
    """x in dtype: a tensor converted by ltorch.to where it differs, a number as torch converts it."""
    if clang.is_tensor(x):
        return x if x.dtype == dtype else ltorch.to(x, dtype)
    return clang.maybe_convert_to_dtype(x, dtype)


def _only_input(call, ct) -> tuple:
    """A cotangent for the input (the first argument) and None for every other argument."""
    return (ct,) + (None,) * (len(call.args) - 1)


def _inside(x, low, high, g):
    """g where low < x < high (strictly: torch's gradient is 0 at the bounds), else 0."""
    return ltorch.where(ltorch.bitwise_and(ltorch.gt(x, low), ltorch.lt(x, high)), g, 0.0)


# eager's kernels, from the saved output: finite where the decomposition's exp(-x) overflows
defvjp(ltorch.sigmoid.id)(lambda call, g: _only_input(call, ltorch.sigmoid_backward(g, call.out)))
defvjp(ltorch.tanh.id)(lambda call, g: _only_input(call, ltorch.tanh_backward(g, call.out)))
NON_DIFFERENTIABLE.add(ltorch.detach.id)  # its output does not require grad, in reverse and forward mode
defvjp(ltorch.relu.id)(lambda call, g: _only_input(call, ltorch.threshold_backward(g, call.out, 0)))
# relu's backward is differentiable in its gradient; its `self` gets zeros (torch's formula), not None
defvjp(ltorch.threshold_backward.id)(lambda call, g: (
    ltorch.threshold_backward(g, call.arg("self"), call.arg("threshold")), _zeros(call.arg("self")), None))


# eager's kernels, one call each (torch/aten_backward.py has their formulas)
defvjp(ltorch.hardtanh.id)(lambda call, g: _only_input(call, ltorch.hardtanh_backward(
    g, call.args[0], call.arg("min_val"), call.arg("max_val"))))
defvjp(ltorch.relu6.id)(lambda call, g: _only_input(call, ltorch.hardtanh_backward(g, call.args[0], 0.0, 6.0)))
defvjp(ltorch.hardsigmoid.id)(lambda call, g: _only_input(call, ltorch.hardsigmoid_backward(g, call.args[0])))
defvjp(ltorch.hardswish.id)(lambda call, g: _only_input(call, ltorch.hardswish_backward(g, call.args[0])))
# like threshold_backward: linear in its gradient; its `self` gets zeros (torch's formula), not None
defvjp(ltorch.hardtanh_backward.id)(lambda call, g: (
    ltorch.hardtanh_backward(g, call.arg("self"), call.arg("min_val"), call.arg("max_val")), _zeros(call.arg("self")),
    None, None))


@defvjp(ltorch.softplus.id)
def _softplus_vjp(call, g):  # torch: g past the threshold, else g * z / (z + 1) with z = exp(beta * x)
    x = call.args[0]
    beta, threshold = call.arg("beta"), call.arg("threshold")
    scaled = ltorch.mul(x, beta)
    z = ltorch.exp(scaled)
    return _only_input(call, ltorch.where(ltorch.gt(scaled, threshold), g, ltorch.mul(g, ltorch.div(z, ltorch.add(z, 1.0)))))


# torch: g * sigmoid(-x), 1/2 at 0 (the decomposition's min(x, 0) and |x| both give 0 there)
defvjp(ltorch.logsigmoid.id)(lambda call, g: _only_input(call, ltorch.mul(g, ltorch.sigmoid(ltorch.neg(call.args[0])))))


defvjp(ltorch.silu.id)(lambda call, g: _only_input(call, ltorch.silu_backward(g, call.args[0])))


def _elu_backward(call, g, alpha: float, scale: float, input_scale: float):
    """torch's elu_backward: g * scale above 0, g * input_scale * alpha * scale * exp(x * input_scale) at and
    below; the exp reads min(x, 0), so the branch not taken cannot overflow (nor give a second derivative nan)."""
    x = call.args[0]
    negative = ltorch.le(x, 0)
    below = ltorch.mul(ltorch.exp(ltorch.mul(ltorch.where(negative, x, 0.0), input_scale)), input_scale * alpha * scale)
    return _only_input(call, ltorch.mul(g, ltorch.where(negative, below, scale)))


defvjp(ltorch.elu.id)(lambda call, g: _elu_backward(call, g, call.arg("alpha"), 1.0, 1.0))
defvjp(ltorch.selu.id)(lambda call, g: _elu_backward(call, g, _SELU_ALPHA, _SELU_SCALE, 1.0))
defvjp(ltorch.celu.id)(lambda call, g: _elu_backward(call, g, call.arg("alpha"), 1.0, 1.0 / call.arg("alpha")))


# -- the ops of a transformer training step --------------------------------------------------------
# Without a rule, reverse mode would run each of these as its decomposition (many prim calls,
# forward and backward); with one, the forward is one torch call and the backward a few
# torch-level ops, recomputing what it needs from the inputs (mean and rstd, the attention
# weights) rather than saving it. Every rule is traceable, so a second derivative works.
def _computed(*tensors):
    """The tensors in the computation dtype of the first (float32 for half precision)."""
    compute = dtypes.computation_dtype(tensors[0].dtype)
    return tuple(None if t is None else _to(t, compute) for t in tensors)


def _matrix_t(x):
    return ltorch.transpose(x, -2, -1)


@defvjp(ltorch.linear.id)
def _linear_vjp(call, g):  # out = x @ w.T + b; w is (out, in), or (in,) for a dot product over the last dim
    x, w = call.args[:2]
    b = call.arg("bias")
    rows = symbolic.product(x.shape[:-1])
    if w.ndim == 1:
        dx = ltorch.mul(ltorch.unsqueeze(g, -1) if g.ndim else g, w)
        dw = ltorch.mul(g, x) if x.ndim == 1 else ltorch.matmul(ltorch.reshape(g, (rows,)), ltorch.reshape(x, (rows, w.shape[0])))
    else:
        dx = ltorch.matmul(g, w)
        g2, x2 = ltorch.reshape(g, (rows, w.shape[0])), ltorch.reshape(x, (rows, w.shape[1]))
        dw = ltorch.matmul(_matrix_t(g2), x2)
    if b is not None and b.ndim == 1 and w.ndim == 2 and b.shape[0] == w.shape[0] and rows:
        db = ltorch.sum(ltorch.reshape(g, (rows, w.shape[0])), 0)  # as eager's addmm over the folded rows sums it
    else:
        db = None if b is None else _sum_to(g, b.shape)
    return (dx, dw, db) + (None,) * (len(call.args) - 3)


@defvjp(ltorch.addmm.id)
def _addmm_vjp(call, g):  # out = beta * input + alpha * mat1 @ mat2: eager's AddmmBackward, one mm per matrix
    input, mat1, mat2 = call.args[:3]
    beta, alpha = call.arg("beta"), call.arg("alpha")
    scaled = g if alpha == 1 else ltorch.mul(g, alpha)
    d_input = _sum_to(g if beta == 1 else ltorch.mul(g, beta), input.shape)
    return d_input, ltorch.matmul(scaled, _matrix_t(mat2)), ltorch.matmul(_matrix_t(mat1), scaled)


# eager's kernel: the forward saved the input
defvjp(ltorch.gelu.id)(lambda call, g: _only_input(call, ltorch.gelu_backward(g, call.args[0],
                                                                            approximate=call.arg("approximate"))))


def _softmax_dims(call) -> tuple:
    x, dim = call.args[0], call.arg("dim")
    if dim is None:  # F.softmax's implicit dim (the forward warned about it)
        dim = 0 if x.ndim in (0, 1, 3) else 1
    return (canonical_dim(dim, x.ndim),) if x.ndim else ()


def _row_sum(x, dims):
    return ltorch.sum(x, dims, keepdim=True) if dims else x


def _softmax_like_vjp(call, g, backward_data):
    """eager's kernel (the forward saved its output), then back to the input's dtype where dtype= changed it."""
    x, y = call.args[0], call.out
    dims = _softmax_dims(call)
    dx = backward_data(g, y, dims[0] if dims else 0, y.dtype)
    return _only_input(call, _to(dx, x.dtype))


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
        xc, mean_c, rstd_c = _computed(x, mean, rstd)
        extra = None
        if g_mean is not None:  # mean = sum(x) / n
            extra = ltorch.div(_to(g_mean, xc.dtype), n)
        if g_rstd is not None:  # rstd = (var + eps) ** -1/2, var = sum((x - mean)^2) / n
            d = ltorch.mul(ltorch.mul(_to(g_rstd, xc.dtype), ltorch.mul(rstd_c, ltorch.mul(rstd_c, rstd_c))),
                          ltorch.div(ltorch.sub(xc, mean_c), -n))
            extra = d if extra is None else ltorch.add(extra, d)
        extra = _to(ltorch.expand(extra, tuple(x.shape)), x.dtype)
        dx = extra if dx is None else ltorch.add(dx, extra)
    return dx, None, dw, db, None


def _batch_norm_statistics_cotangent(x, save_mean, save_invstd, g_mean, g_invstd):
    """The input's cotangent through batch norm's saved (C,) statistics, which a second derivative reaches (the
    first backward reads both): mean = sum(x) / n and invstd = (var + eps) ** -1/2, var = sum((x - mean)^2) / n,
    over every dim but the channels."""
    n = x.numel() // x.shape[1]
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    xc, mean_c, invstd_c = _computed(x, save_mean, save_invstd)
    extra = None
    if g_mean is not None:
        extra = ltorch.reshape(ltorch.div(_to(g_mean, xc.dtype), n), shape)
    if g_invstd is not None:
        cubed = ltorch.mul(invstd_c, ltorch.mul(invstd_c, invstd_c))
        d = ltorch.mul(ltorch.reshape(ltorch.mul(_to(g_invstd, xc.dtype), cubed), shape),
                       ltorch.div(ltorch.sub(xc, ltorch.reshape(mean_c, shape)), -n))
        extra = d if extra is None else ltorch.add(extra, d)
    return _to(ltorch.expand(extra, tuple(x.shape)), x.dtype)


def _batch_norm_running_stats_cotangents(x, weight, running_mean, running_var, eps, g_out):
    """Evaluation mode's cotangents of the running statistics, which aten does not differentiate (torch refuses a
    running_mean that requires grad): out = (x - running_mean) * invstd * weight + bias with
    invstd = (running_var + eps) ** -1/2."""
    dims = (0, *range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    xc, g, mean, var, w = _computed(x, g_out, running_mean, running_var, weight)
    invstd = ltorch.rsqrt(ltorch.add(var, eps))
    scale = invstd if w is None else ltorch.mul(invstd, w)
    d_mean = ltorch.neg(ltorch.mul(ltorch.sum(g, dims), scale))
    dot = ltorch.sum(ltorch.mul(g, ltorch.sub(xc, ltorch.reshape(mean, shape))), dims)
    d_var = ltorch.mul(ltorch.mul(dot, ltorch.mul(scale, ltorch.mul(invstd, invstd))), -0.5)
    return _to(d_mean, running_mean.dtype), _to(d_var, running_var.dtype)


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
# reaches them, and each keeps the derivative it had (torch/aten_backward.py; the JVP rule in jvp_rules.py)
defvjp(updated_running_stats.id)(lambda call, g: (None, g[0], g[1]) + (None,) * (len(call.args) - 3))


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
            db = _to(ltorch.sum(ltorch.reshape(g_out, (n, c, hxw)), (0, 2)), bias.dtype)
    if g_mean is not None or g_rstd is not None:
        size = c // group * hxw
        xc, mean_c, rstd_c = _computed(ltorch.reshape(x, (n, group, size)), mean, rstd)
        extra = None
        if g_mean is not None:  # mean = sum(x) / size per sample and group
            extra = ltorch.unsqueeze(ltorch.div(_to(g_mean, xc.dtype), size), 2)
        if g_rstd is not None:  # rstd = (var + eps) ** -1/2, var = sum((x - mean)^2) / size
            cubed = ltorch.mul(rstd_c, ltorch.mul(rstd_c, rstd_c))
            d = ltorch.mul(ltorch.unsqueeze(ltorch.mul(_to(g_rstd, xc.dtype), cubed), 2),
                           ltorch.div(ltorch.sub(xc, ltorch.unsqueeze(mean_c, 2)), -size))
            extra = d if extra is None else ltorch.add(extra, d)
        extra = _to(ltorch.reshape(ltorch.expand(extra, (n, group, size)), tuple(x.shape)), x.dtype)
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
    logp, g, weight_c, out = _computed(ltorch.log_softmax(x, class_dim), g, weight, call.out)
    weight_c = None if weight_c is None else ltorch.reshape(weight_c, per_class)

    def along_classes(t):  # a tensor of x's shape without the class dim, broadcastable against x
        return ltorch.unsqueeze(t, class_dim) if x.ndim > 1 and t.ndim else t

    def smoothed(m):
        return ltorch.add(ltorch.mul(m, 1 - smoothing), smoothing / n_classes) if smoothing > 0 else m

    if tuple(target.shape) == tuple(x.shape):  # class probabilities
        m = smoothed(_to(target, logp.dtype))
        if reduction == "none":
            k = along_classes(g)
        else:  # the mean is over the elements: numel / C of them
            k = g if reduction == "sum" else ltorch.div(g, x.numel() / n_classes if n_classes else 0.0)
        dtarget = ltorch.mul(ltorch.mul(k, logp), -(1 - smoothing))
        dtarget = dtarget if weight_c is None else ltorch.mul(dtarget, weight_c)
        count = None
    else:  # class indices
        tgt = _to(target, torch.int64)
        tgt = ltorch.reshape(tgt, ()) if x.ndim == 1 else tgt
        valid = ltorch.ne(tgt, ignore_index)
        safe = ltorch.where(valid, tgt, 0)
        classes = ltorch.reshape(ltorch.arange(0, n_classes, 1, device=x.device, dtype=torch.int64), per_class)
        onehot = _to(ltorch.eq(along_classes(safe), classes), logp.dtype)
        m = smoothed(onehot)
        k = g
        if reduction == "mean":  # over the weight of the valid elements' targets (their count, unweighted)
            counted = valid if weight is None else ltorch.where(valid, ltorch.take(weight, safe), 0.0)
            k = ltorch.div(g, ltorch.sum(_to(counted, logp.dtype)))
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
    q, k, v, g = _computed(query, key, value, g)
    if call.arg("enable_gqa") and query.ndim >= 3:
        k, v = _repeat_heads(k, q.shape[-3] // k.shape[-3]), _repeat_heads(v, q.shape[-3] // v.shape[-3])
    L, S = query.shape[-2], key.shape[-2]
    scale = 1 / torch.sym_sqrt(query.shape[-1]) if scale is None else scale  # (math.sqrt would pin a symbolic size)
    scores = ltorch.mul(ltorch.matmul(q, _matrix_t(k)), scale)
    mask = attn_mask
    if is_causal:  # as the forward combines it with an explicit mask
        causal = ltorch.ge(ltorch.unsqueeze(ltorch.arange(0, L, 1, device=query.device, dtype=torch.int64), 1),
                          ltorch.unsqueeze(ltorch.arange(0, S, 1, device=query.device, dtype=torch.int64), 0))
        mask = causal if mask is None else (ltorch.bitwise_and(mask, causal) if mask.dtype is torch.bool
                                            else ltorch.where(causal, mask, -float("inf")))
    if mask is not None:
        scores = (ltorch.where(mask, scores, -float("inf")) if mask.dtype is torch.bool
                  else ltorch.add(scores, _to(mask, scores.dtype)))
    probs = _attention_weights(scores, attn_mask is not None)
    dv = ltorch.matmul(_matrix_t(probs), g)
    dprobs = ltorch.matmul(g, _matrix_t(v))
    dscores = ltorch.mul(probs, ltorch.sub(dprobs, ltorch.sum(ltorch.mul(dprobs, probs), -1, keepdim=True)))
    dq = ltorch.mul(ltorch.matmul(dscores, k), scale)
    dk = ltorch.mul(ltorch.matmul(_matrix_t(dscores), q), scale)
    dmask = None if attn_mask is None or attn_mask.dtype is torch.bool else _sum_to(dscores, attn_mask.shape)
    cts = (_sum_to(dq, query.shape), _sum_to(_fold_heads(dk, key), key.shape), _sum_to(_fold_heads(dv, value), value.shape))
    return cts + (dmask,) + (None,) * (len(call.args) - 4)


@defvjp(ltorch.split.id)
def _split_vjp(call, g):  # eager's: one cat of the pieces' cotangents (zeros for the unused), not a pad per piece
    a = call.args[0]
    dim = canonical_dim(call.arg("dim"), a.ndim)
    pieces = [c if c is not None else _zeros(o) for c, o in zip(g, call.out)]
    return (ltorch.cat(pieces, dim),) + (None,) * (len(call.args) - 1)


@defvjp(ltorch.embedding.id)
def _embedding_vjp(call, g):  # eager's kernel: the rows of g summed into zeros at the indices
    indices, weight = call.args[:2]
    padding_idx, scale_grad_by_freq = call.arg("padding_idx"), call.arg("scale_grad_by_freq")
    padding_idx = -1 if padding_idx is None else padding_idx % weight.shape[0]  # F.embedding's normalization
    return (None, ltorch.embedding_dense_backward(g, indices, weight.shape[0], padding_idx, scale_grad_by_freq)) + (
        None,) * (len(call.args) - 2)


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
        mask = _to(ltorch.bitwise_or(ltorch.eq(a, norm), ltorch.isnan(a)), g.dtype)
        return ltorch.mul(ltorch.sign(x), ltorch.mul(ltorch.div(g, _row_sum(mask, dims)), mask))
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
    spread = ltorch.expand(g if g.ndim == 0 else _kept(g, x, dims, keepdim), tuple(x.shape))  # (a 0-d g expands as it is)
    return _only_input(call, _to(ltorch.div(spread, n), x.dtype) if dtypes.is_inexact(x.dtype) else None)


@defvjp(ltorch.vector_norm.id)
def _vector_norm_vjp(call, g):  # torch.norm and torch.linalg.norm of a vector reach it as a subsymbol
    x, ord = call.args[0], call.arg("ord")
    dims, keepdim = clang.reduction_dims(x, call.arg("dim")), call.arg("keepdim")
    return _only_input(call, _norm_backward(_kept(g, x, dims, keepdim), x, ord, _kept(call.out, x, dims, keepdim), dims))


@defvjp(ltorch.normalize.id)
def _normalize_vjp(call, g):
    """F.normalize is x / clamp_min(norm, eps) to torch's autograd: the norm gets the quotient's gradient where it
    is at least eps (clamp_min's), then norm_backward's; a zero vector's gradient is g / eps."""
    x, p = call.args[0], call.arg("p")
    dim, eps = call.arg("dim"), call.arg("eps")
    dims = clang.reduction_dims(x, tuple(dim) if isinstance(dim, (tuple, list)) else (dim,))
    norm = ltorch.vector_norm(x, p, dims, keepdim=True)
    denom = ltorch.where(ltorch.lt(norm, eps), eps, norm)
    dquotient = ltorch.neg(ltorch.div(_row_sum(ltorch.mul(g, call.out), dims), denom))  # of x / denom, for denom
    dnorm = ltorch.where(ltorch.ge(norm, eps), dquotient, 0.0)
    dx, through_norm = ltorch.div(g, denom), _norm_backward(dnorm, x, p, norm, dims)
    return _only_input(call, dx if through_norm is None else ltorch.add(dx, through_norm))


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
    xc, g, std = _computed(x, g, call.out)
    g, std = _kept(g, x, dims, keepdim), _kept(std, x, dims, keepdim)
    return _only_input(call, _std_backward(g, xc, std, dim, dims, correction))


@defvjp(ltorch.std_mean.id)
def _std_mean_vjp(call, g):  # std's cotangent as std's rule gives it, plus the mean's spread evenly
    x, dim, dims, keepdim, correction = _std_arguments(call, "std_mean")
    (g_std, g_mean), (std, _) = g, call.out
    xc = _computed(x)[0]
    dx = None
    if g_std is not None:
        g_std, std = _computed(x, g_std, std)[1:]
        dx = _std_backward(_kept(g_std, x, dims, keepdim), xc, _kept(std, x, dims, keepdim), dim, dims, correction)
    if g_mean is not None:
        n = math.prod(x.shape[d] for d in dims)
        spread = ltorch.expand(ltorch.div(_kept(g_mean, x, dims, keepdim), n), x.shape)
        dx = spread if dx is None else ltorch.add(dx, spread)
    return _only_input(call, dx)


def _loss_scale(g, reduction, numel):
    """The cotangent of each element of the unreduced loss: g, or for the mean g over the element count."""
    return ltorch.div(g, numel) if reduction == "mean" else g  # (a symbolic count stays one: no float())


def _difference(input, target):
    """input - target, broadcast, in the computation dtype of their promoted dtype (as the losses compute it)."""
    compute = dtypes.computation_dtype(dtypes.result_type(input, target))
    return ltorch.sub(_to(input, compute), _to(target, compute))


def _difference_cotangents(call, d):
    """d, the cotangent of input - target, as the input's and the target's."""
    input, target = call.args[:2]
    return _sum_to(d, input.shape), _sum_to(ltorch.neg(d), target.shape)


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
    loss = ltorch.where(ltorch.lt(z, delta), ltorch.mul(ltorch.mul(z, z), 0.5), ltorch.mul(ltorch.sub(z, 0.5 * delta), delta))
    cts = _difference_cotangents(call, ltorch.mul(ltorch.mul(slope, k), _to(weight, diff.dtype)))
    return cts + (None, None, _sum_to(ltorch.mul(loss, k), weight.shape)) + (None,) * (len(call.args) - 5)


_BCE_EPSILON = float(torch.tensor(1e-12, dtype=torch.float32))  # torch's kernel clamps with a float constant


@defvjp(ltorch.binary_cross_entropy.id)
def _binary_cross_entropy_vjp(call, g):
    """torch's: g * (x - y) / max((1 - x) * x, 1e-12) for the input, g * -logit(x) for the target, each times the
    weight: large or infinite at an input of 0 or 1, where the decomposition's clamped logs give nan. torch does
    not differentiate the weight; here it gets the unweighted loss (logs clamped at -100) times g."""
    input, target = call.args[:2]
    weight = call.arg("weight")
    reduction = _legacy_reduction(call.arg("size_average"), call.arg("reduce"), call.arg("reduction"))
    x, y, g, w = _computed(input, target, g, weight)
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
        dweight = _sum_to(ltorch.mul(loss, k), weight.shape)
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
        dvar = ltorch.reshape(_sum_to(dv, v.shape), var.shape)
    return _difference_cotangents(call, dd) + (dvar,) + (None,) * (len(call.args) - 3)


def _max_or_min_vjp(call, g, loses):
    """torch's three backwards: torch.max(a, b) as maximum's (half of g each where they tie; where either is
    NaN, all of it to both); torch.max(x, dim) gives g to the index it returned; torch.max(x) spreads g
    evenly over the elements equal to the result, or over the NaNs when it is NaN."""
    x, dim, keepdim = call.args[0], call.arg("dim"), call.arg("keepdim")
    if clang.is_tensor(dim):
        other = dim
        half = ltorch.where(ltorch.eq(x, other), ltorch.div(g, 2.0), g)
        return (_sum_to(ltorch.where(loses(x, other), 0.0, half), x.shape),
                _sum_to(ltorch.where(loses(other, x), 0.0, half), other.shape)) + (None,) * (len(call.args) - 2)
    if dim is None:
        nan_max = ltorch.bitwise_and(ltorch.isnan(x), ltorch.isnan(call.out))
        mask = _to(ltorch.bitwise_or(ltorch.eq(x, call.out), nan_max), g.dtype)
        return _only_input(call, ltorch.mul(mask, ltorch.div(g, ltorch.sum(mask))))
    g, indices = g[0], call.out[1]
    if g is None or x.ndim == 0:
        return _only_input(call, g)
    d = canonical_dim(dim, x.ndim)
    if not keepdim:
        g, indices = ltorch.unsqueeze(g, d), ltorch.unsqueeze(indices, d)
    positions = ltorch.reshape(ltorch.arange(0, x.shape[d], 1, device=x.device, dtype=torch.int64),
                              tuple(-1 if i == d else 1 for i in range(x.ndim)))
    return _only_input(call, ltorch.where(ltorch.eq(positions, indices), g, 0.0))


defvjp(ltorch.max.id)(lambda call, g: _max_or_min_vjp(call, g, clang.lt))
defvjp(ltorch.min.id)(lambda call, g: _max_or_min_vjp(call, g, clang.gt))


@defvjp(ltorch.logcumsumexp.id)
def _logcumsumexp_vjp(call, g):
    """torch's formula (logcumsumexp_backward): exp(x + reversed logcumsumexp(log|g| - out)), the positive and the
    negative parts of g apart. Differentiating the scan instead is exact in float64 but rounds otherwise than
    eager in float32 (by 3e-4 on op_db's first sample), where eager's formula is the reference."""
    x, dim = call.args[0], call.arg("dim")
    if x.ndim == 0 or x.numel() == 0:
        return _only_input(call, g)
    log_abs = ltorch.log(ltorch.abs(g))
    lowest = torch.finfo(g.dtype).min  # torch's stand-in for log(0)

    def part(chosen):
        logs = ltorch.sub(ltorch.where(chosen, log_abs, lowest), call.out)
        return ltorch.exp(ltorch.add(ltorch.flip(ltorch.logcumsumexp(ltorch.flip(logs, (dim,)), dim), (dim,)), x))

    return _only_input(call, ltorch.sub(part(ltorch.gt(g, 0)), part(ltorch.lt(g, 0))))


# -- collectives (torch/distributed.py): each one's transpose, over the same group --------------
def _synchronous(call, name: str) -> None:
    if call.arg("async_op"):
        raise UnsupportedOpError(f"vjp of an asynchronous {name}: differentiate its synchronous form (the async "
                                  f"ones are placed by transforms, after differentiation)")


@defvjp(collectives.all_gather.id)
def _all_gather_vjp(call, g):
    """Each rank's shard reached every rank: its gradient is the sum of every rank's gradient of it."""
    _synchronous(call, "all_gather")
    return (collectives.reduce_scatter(g, "sum", call.arg("gid")),) + (None,) * (len(call.args) - 1)


@defvjp(collectives.reduce_scatter.id)
def _reduce_scatter_vjp(call, g):
    _synchronous(call, "reduce_scatter")
    if call.arg("op") != "sum":
        raise UnsupportedOpError("vjp of a reduce_scatter other than a sum")
    return (collectives.all_gather(g, call.arg("gid")),) + (None,) * (len(call.args) - 1)


@defvjp(collectives.all_reduce.id)
def _all_reduce_vjp(call, g):
    _synchronous(call, "all_reduce")
    if call.arg("op") != "sum":
        raise UnsupportedOpError("vjp of an all_reduce other than a sum")
    return (collectives.all_reduce(g, "sum", call.arg("gid")),) + (None,) * (len(call.args) - 1)


@defvjp(collectives.unshard.id)
def _unshard_vjp(call, g):
    """The whole parameter's gradient, flattened and padded as the shards are, averaged over the ranks
    (each computed it for its own share of the batch) and reduce-scattered: each rank gets its shard's."""
    shard, gid = call.args[0], call.arg("gid")
    world = collectives.world_size(gid)
    flat = ltorch.reshape(g, (-1,))
    padding = shard.shape[0] * world - flat.shape[0]
    if padding:
        flat = ltorch.cat([flat, ltorch.zeros((padding,), dtype=flat.dtype, device=flat.device)])
    return (collectives.reduce_scatter(ltorch.div(flat, world), "sum", gid), None, None)[:len(call.args)]


@defvjp(collectives.unshard_bucket.id)
def _unshard_bucket_vjp(call, g):
    """Each parameter's gradient laid out as its shards are (flattened, padded, one row per rank),
    the rows concatenated as the shards were, averaged over the ranks and reduce-scattered once."""
    shards, shapes, gid = call.args[0], call.arg("shapes"), call.arg("gid")
    world = collectives.world_size(gid)
    columns = []
    for grad, shard, shape in zip(g, shards, shapes):
        flat = ltorch.reshape(grad, (-1,)) if grad is not None else \
            ltorch.zeros((math.prod(shape),), dtype=shard.dtype, device=shard.device)
        padding = shard.shape[0] * world - flat.shape[0]
        if padding:
            flat = ltorch.cat([flat, ltorch.zeros((padding,), dtype=flat.dtype, device=flat.device)])
        columns.append(ltorch.reshape(flat, (world, shard.shape[0])))
    stacked = ltorch.cat(columns, 1) if len(columns) > 1 else columns[0]
    reduced = collectives.reduce_scatter(ltorch.div(ltorch.reshape(stacked, (-1,)), world), "sum", gid)
    grads, offset = [], 0
    for shard in shards:
        grads.append(ltorch.narrow(reduced, 0, offset, shard.shape[0]))
        offset += shard.shape[0]
    return (tuple(grads), None, None)[:len(call.args)]
