"""aten's backward kernels, and the forwards whose saved values they read, as torch-language symbols.

Reverse-mode rules call these so that the torch executor runs the very kernels eager autograd runs
(bit-identical gradients: a training run then matches eager step by step). Each symbol's body is a
decomposition in clang and prims, so a second derivative differentiates it and the prims-only
executor runs it. Arguments are the aten op's, positionally and by keyword (see
`torch.ops.aten.<op>.default._schema`); `torch.ops.aten.<op>.default` called while tracing is routed
here too.

In an execution trace the torch executor calls each as ``aten_<op>(...)``: a plain function around
the OpOverload, because the executor names an operator after its callable, and an OpOverload's
name (``gelu_backward.default``) is no identifier: two of them in one trace would both print as
``torch_op`` and clash.
"""
from __future__ import annotations

import math

import torch

from thunderfn import clang, prims
from thunderfn.clang import maybe_convert_to_dtype
from thunderfn.core import dtypes, symbolic
from thunderfn.core.symbol import Symbol
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import canonical_dim, check, check_dtype_supported
from thunderfn.torch.base import torchsymbol
from thunderfn.torch.opaque import aten_call
from thunderfn.torch.shape import detach

aten = torch.ops.aten
__all__ = ["gelu_backward", "softmax_backward_data", "log_softmax_backward_data", "native_layer_norm",
           "native_layer_norm_backward", "native_batch_norm", "native_batch_norm_legit_functional",
           "native_batch_norm_backward", "native_group_norm", "native_group_norm_backward", "nll_loss_forward",
           "nll_loss_backward", "embedding_dense_backward", "tanh_backward", "sigmoid_backward", "threshold_backward",
           "silu_backward", "hardswish_backward", "hardsigmoid_backward", "hardtanh_backward"]


def _aten(op):
    """The symbol's torch callables: a named function around op, which the torch executor calls, then op itself
    (routed to the symbol while tracing)."""
    return aten_call(op), op


def _float_args(opname, *tensors):
    """The tensors in the computation dtype of their promoted dtype (float32 for half types), and that dtype."""
    dtype = dtypes.result_type(*tensors)
    check_dtype_supported(dtypes.is_float(dtype), opname, dtype)
    compute = dtypes.computation_dtype(dtype)
    return [maybe_convert_to_dtype(t, compute) for t in tensors], dtype


def _row_sum(x, dims):
    return clang.keepdim_reshape(prims.sum(x, dims), x, dims) if dims else x


# -- elementwise -------------------------------------------------------------------------------
_SQRT_HALF, _INV_SQRT_2PI, _SQRT_2_OVER_PI = math.sqrt(0.5), 1 / math.sqrt(2 * math.pi), math.sqrt(2 / math.pi)
_KAPPA = 0.044715  # the tanh approximation's cubic coefficient


@torchsymbol(*_aten(aten.gelu_backward.default))
def gelu_backward(grad_output, self, *, approximate="none"):
    """aten's GeluBackward, op by op: dy * (cdf(x) + x * pdf(x)), or the tanh approximation's derivative."""
    check(approximate in ("none", "tanh"), lambda: "approximate argument must be either none or tanh.")
    (dy, x), dtype = _float_args("GeluBackwardKernelImpl", grad_output, self)
    if approximate == "none":
        cdf = clang.mul(clang.add(clang.erf(clang.mul(x, _SQRT_HALF)), 1.0), 0.5)
        pdf = clang.mul(clang.exp(clang.mul(clang.mul(x, x), -0.5)), _INV_SQRT_2PI)
        return maybe_convert_to_dtype(clang.mul(dy, clang.add(cdf, clang.mul(x, pdf))), dtype)
    x_sq = clang.mul(x, x)
    tanh_inner = clang.tanh(clang.mul(clang.add(x, clang.mul(clang.mul(x_sq, x), _KAPPA)), _SQRT_2_OVER_PI))
    left_derivative = clang.mul(clang.add(tanh_inner, 1.0), 0.5)
    inner_derivative = clang.mul(clang.add(clang.mul(x_sq, 3 * _KAPPA), 1.0), _SQRT_2_OVER_PI)
    right_derivative = clang.mul(clang.mul(clang.mul(x, 0.5), clang.sub(1.0, clang.mul(tanh_inner, tanh_inner))),
                                 inner_derivative)
    return maybe_convert_to_dtype(clang.mul(dy, clang.add(left_derivative, right_derivative)), dtype)


@torchsymbol(*_aten(aten.tanh_backward.default))
def tanh_backward(grad_output, output):
    (dy, y), dtype = _float_args("tanh_backward_cpu", grad_output, output)
    return maybe_convert_to_dtype(clang.mul(dy, clang.sub(1.0, clang.mul(y, y))), dtype)


@torchsymbol(*_aten(aten.sigmoid_backward.default))
def sigmoid_backward(grad_output, output):
    (dy, y), dtype = _float_args("sigmoid_backward_cpu", grad_output, output)
    return maybe_convert_to_dtype(clang.mul(clang.mul(dy, clang.sub(1.0, y)), y), dtype)


@torchsymbol(*_aten(aten.threshold_backward.default))
def threshold_backward(grad_output, self, threshold):
    """relu's backward (threshold 0): grad_output where self > threshold, else 0."""
    dtype = dtypes.result_type(grad_output, self)
    return clang.where(clang.le(self, threshold), 0, maybe_convert_to_dtype(grad_output, dtype))


@torchsymbol(*_aten(aten.silu_backward.default))
def silu_backward(grad_output, self):
    """dy * s * (1 + x * (1 - s)) with s = sigmoid(x), in the computation dtype (-0 where exp(-x) overflows)."""
    (dy, x), dtype = _float_args("silu_backward_cpu", grad_output, self)
    s = clang.reciprocal(clang.add(clang.exp(clang.neg(x)), 1.0))  # sigmoid, in x's (computation) dtype
    return maybe_convert_to_dtype(clang.mul(dy, clang.mul(s, clang.add(clang.mul(x, clang.sub(1.0, s)), 1.0))), dtype)


@torchsymbol(*_aten(aten.hardswish_backward.default))
def hardswish_backward(grad_output, self):
    """0 for x <= -3, dy * (x / 3 + 1/2) inside, dy for x >= 3 (torch 2.13's boundaries)."""
    (dy, x), dtype = _float_args("hardswish_backward_cpu", grad_output, self)
    inside = clang.mul(dy, clang.add(clang.true_divide(x, 3.0), 0.5))
    return maybe_convert_to_dtype(clang.where(clang.le(x, -3.0), 0.0, clang.where(clang.lt(x, 3.0), inside, dy)), dtype)


@torchsymbol(*_aten(aten.hardsigmoid_backward.default))
def hardsigmoid_backward(grad_output, self):
    """dy / 6 strictly inside (-3, 3), else 0."""
    (dy, x), dtype = _float_args("hardsigmoid_backward_cpu", grad_output, self)
    inside = clang.bitwise_and(clang.gt(x, -3.0), clang.lt(x, 3.0))
    return maybe_convert_to_dtype(clang.where(inside, clang.mul(dy, 1 / 6), 0.0), dtype)


@torchsymbol(*_aten(aten.hardtanh_backward.default))
def hardtanh_backward(grad_output, self, min_val, max_val):
    """dy strictly inside (min_val, max_val), else 0 (relu6 is hardtanh(0, 6))."""
    dtype = dtypes.result_type(grad_output, self)
    inside = clang.bitwise_and(clang.gt(self, min_val), clang.lt(self, max_val))
    return clang.where(inside, maybe_convert_to_dtype(grad_output, dtype), 0)


# -- softmax family ----------------------------------------------------------------------------
def _softmax_backward_args(opname, grad_output, output, dim, input_dtype):
    """(dy, y) in the computation dtype, the reduced dims, and the result dtype: grad_output's on CPU, whose
    kernel ignores input_dtype; input_dtype elsewhere (CUDA writes float gradients of a half softmax as half)."""
    check(isinstance(input_dtype, torch.dtype),
          lambda: f"{opname}: input_dtype must be a torch.dtype, got {input_dtype!r}", TypeError)
    d = canonical_dim(dim, max(output.ndim, 1))  # a 0-dim output takes dim 0 or -1, and has no dim to reduce
    dims = (d,) if output.ndim else ()
    (dy, y), _ = _float_args(opname, grad_output, output)
    return dy, y, dims, grad_output.dtype if grad_output.device.type == "cpu" else input_dtype


@torchsymbol(*_aten(aten._softmax_backward_data.default), name="softmax_backward_data")
def softmax_backward_data(grad_output, output, dim, input_dtype):
    """(dy - sum(dy * y)) * y over dim, y = softmax's output."""
    dy, y, dims, dtype = _softmax_backward_args("softmax_backward_data", grad_output, output, dim, input_dtype)
    return maybe_convert_to_dtype(clang.mul(clang.sub(dy, _row_sum(clang.mul(dy, y), dims)), y), dtype)


@torchsymbol(*_aten(aten._log_softmax_backward_data.default), name="log_softmax_backward_data")
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    """dy - exp(y) * sum(dy) over dim, y = log_softmax's output."""
    dy, y, dims, dtype = _softmax_backward_args("log_softmax_backward_data", grad_output, output, dim, input_dtype)
    return maybe_convert_to_dtype(clang.sub(dy, clang.mul(clang.exp(y), _row_sum(dy, dims))), dtype)


# -- layer norm ------------------------------------------------------------------------------------
def _layer_norm_dims(input, normalized_shape, weight, bias):
    """(normalized dims, the statistics' shape: the batch dims, then 1 per normalized dim), with aten's checks."""
    normalized_shape = tuple(normalized_shape)
    n = len(normalized_shape)
    check(n > 0,
          lambda: "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, "
                  f"but got normalized_shape = {list(normalized_shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        check(p is None or tuple(p.shape) == normalized_shape,
              lambda: f"Expected {name} to be of same shape as normalized_shape, but got {name} of shape "
                      f"{list(p.shape)} and normalized_shape = {list(normalized_shape)}")
    check(input.ndim >= n and tuple(input.shape[input.ndim - n:]) == normalized_shape,
          lambda: f"Given normalized_shape={list(normalized_shape)}, expected input with shape "
                  f"[*, {', '.join(map(str, normalized_shape))}], but got input of size{list(input.shape)}")
    check_dtype_supported(dtypes.is_float(input.dtype), "LayerNormKernelImpl", input.dtype)
    axis = input.ndim - n
    return tuple(range(axis, input.ndim)), tuple(input.shape[:axis]) + (1,) * n


@torchsymbol(*_aten(aten.native_layer_norm.default))
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    """(output, mean, rstd): layer_norm's output and the statistics its backward reads, shaped like the input
    with each normalized dim 1, in float32 for a half input with float32 parameters, else in the input's dtype."""
    dims, stats_shape = _layer_norm_dims(input, normalized_shape, weight, bias)
    compute = dtypes.computation_dtype(input.dtype)
    x = maybe_convert_to_dtype(input, compute)
    var, mean = prims.var_mean(x, dims, correction=0)
    mean, rstd = clang.reshape(mean, stats_shape), clang.reshape(clang.rsqrt(clang.add(var, eps)), stats_shape)
    out = clang.mul(clang.sub(x, mean), rstd)
    if weight is not None:
        out = clang.mul(out, maybe_convert_to_dtype(weight, compute))
    if bias is not None:
        out = clang.add(out, maybe_convert_to_dtype(bias, compute))
    params = [p for p in (weight, bias) if p is not None]
    mixed = input.dtype in dtypes.low_precision and bool(params) and all(p.dtype is torch.float32 for p in params)
    stats_dtype = torch.float32 if mixed else input.dtype
    return (maybe_convert_to_dtype(out, input.dtype), maybe_convert_to_dtype(mean, stats_dtype),
            maybe_convert_to_dtype(rstd, stats_dtype))


@torchsymbol(*_aten(aten.native_layer_norm_backward.default))
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    """(grad_input, grad_weight, grad_bias), each None where output_mask says so (as aten gives them):
    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) over the normalized dims, dxhat = dy * weight;
    dweight = sum(dy * xhat), dbias = sum(dy) over the batch dims. mean and rstd are native_layer_norm's."""
    dims, stats_shape = _layer_norm_dims(input, normalized_shape, weight, bias)
    check(len(output_mask) == 3, lambda: f"output_mask must hold 3 bools, got {list(output_mask)}")
    want_input, want_weight, want_bias = (bool(m) for m in output_mask)
    # aten writes each gradient into a tensor shaped like the parameter
    check(not want_weight or weight is not None, lambda: "native_layer_norm_backward: output_mask[1] (grad_weight) "
                                                         "needs weight; pass weight or set output_mask[1] to False")
    check(not want_bias or bias is not None, lambda: "native_layer_norm_backward: output_mask[2] (grad_bias) "
                                                     "needs bias; pass bias or set output_mask[2] to False")
    compute = dtypes.computation_dtype(input.dtype)
    x, dy = maybe_convert_to_dtype(input, compute), maybe_convert_to_dtype(grad_out, compute)
    mean, rstd = (maybe_convert_to_dtype(clang.reshape(t, stats_shape), compute) for t in (mean, rstd))
    xhat = clang.mul(clang.sub(x, mean), rstd)
    batch = tuple(range(input.ndim - len(dims)))

    def over_batch(t, like):
        return maybe_convert_to_dtype(prims.sum(t, batch) if batch else t, like.dtype)

    grad_input = grad_weight = grad_bias = None
    if want_input:
        n = symbolic.product(input.shape[d] for d in dims)
        dxhat = dy if weight is None else clang.mul(dy, maybe_convert_to_dtype(weight, compute))
        mean_dxhat = clang.true_divide(_row_sum(dxhat, dims), n)
        mean_dxhat_xhat = clang.true_divide(_row_sum(clang.mul(dxhat, xhat), dims), n)
        dx = clang.mul(rstd, clang.sub(clang.sub(dxhat, mean_dxhat), clang.mul(xhat, mean_dxhat_xhat)))
        grad_input = maybe_convert_to_dtype(dx, input.dtype)
    if want_weight:
        grad_weight = over_batch(clang.mul(dy, xhat), weight)
    if want_bias:
        grad_bias = over_batch(dy, bias)
    return grad_input, grad_weight, grad_bias


# -- batch norm ------------------------------------------------------------------------------------
def _per_channel(t, ndim, compute):
    """A (C,) tensor shaped to broadcast along dim 1 of an ndim-dim (N, C, ...) tensor, in the computation dtype."""
    return clang.reshape(maybe_convert_to_dtype(t, compute), (t.shape[0],) + (1,) * (ndim - 2))


def _scale_shift(x, mean, invstd, weight, bias):
    """x * alpha + beta with alpha = invstd * weight and beta = bias - mean * alpha: torch's CPU batch norm
    kernel's arithmetic (all operands broadcastable to x)."""
    alpha = invstd if weight is None else clang.mul(invstd, weight)
    shift = clang.mul(mean, alpha)
    beta = clang.neg(shift) if bias is None else clang.sub(bias, shift)
    return clang.add(clang.mul(x, alpha), beta)


def normalize_channels(input, stats_dims, running_mean, running_var, weight, bias, eps, *, stats_rounded: bool):
    """Batch and instance norm: (output, mean, invstd), input normalized per channel (dim 1) with the statistics over
    stats_dims, or with the running statistics when stats_dims is None; mean and invstd are in the computation dtype,
    shaped to broadcast against the input. torch keeps batch statistics in the parameters' dtype: with
    `stats_rounded` (a half-precision input without float32 parameters) mean and 1/std are rounded to half before
    normalizing, in float32, with them."""
    compute = dtypes.computation_dtype(input.dtype)
    x = maybe_convert_to_dtype(input, compute)
    batch_stats = stats_dims is not None
    if batch_stats:
        var, mean = prims.var_mean(x, stats_dims, correction=0)
        mean, var = clang.keepdim_reshape(mean, x, stats_dims), clang.keepdim_reshape(var, x, stats_dims)
    else:
        mean, var = _per_channel(running_mean, input.ndim, compute), _per_channel(running_var, input.ndim, compute)
    invstd = clang.reciprocal(clang.sqrt(clang.add(var, eps)))
    w = None if weight is None else _per_channel(weight, input.ndim, compute)
    b = None if bias is None else _per_channel(bias, input.ndim, compute)
    if batch_stats and stats_rounded:
        mean, invstd = (maybe_convert_to_dtype(maybe_convert_to_dtype(t, input.dtype), compute) for t in (mean, invstd))
        out = clang.mul(clang.sub(x, mean), invstd)
        out = out if w is None else clang.mul(out, w)
        out = out if b is None else clang.add(out, b)
    else:
        out = _scale_shift(x, mean, invstd, w, b)
    return maybe_convert_to_dtype(out, input.dtype), mean, invstd


def _updated_running_stats(input, running_mean, running_var, stats_dims, momentum, *, per_instance: bool):
    """torch's update of running statistics, in double as its CPU kernel accumulates:
    momentum * batch + (1 - momentum) * running, with the unbiased batch variance. Instance
    norm (torch's batch norm on (1, N*C, ...)) first averages the N per-instance statistics.

    Its derivative is not this body's but torch's, in its rules (transforms/rules/nn.py): torch's
    kernel writes the new values into the running statistics outside autograd, so the input's derivative does not reach
    them, and each statistic keeps the derivative it had before the write: torch.func.jvp gives the new running_mean the
    tangent of the old one (not (1 - momentum) times it, the derivative of the formula), and reverse mode passes the new
    one's cotangent back to the old one, the transpose (torch.autograd refuses a running statistic
    that requires grad)."""
    check(running_mean is not None and running_var is not None,
          lambda: "running statistics: pass both running_mean and running_var, or neither")
    input, running_mean, running_var = detach(input), detach(running_mean), detach(running_var)
    n = symbolic.product([input.shape[d] for d in stats_dims])
    var, mean = prims.var_mean(maybe_convert_to_dtype(input, torch.float64), stats_dims, correction=0)
    unbiased = clang.mul(var, n / (n - 1)) if n > 1 else var

    def updated(running, batch):
        if per_instance:
            batch = clang.true_divide(prims.sum(batch, (0,)), input.shape[0])
        value = clang.add(clang.mul(batch, momentum),
                          clang.mul(maybe_convert_to_dtype(running, torch.float64), 1 - momentum))
        return maybe_convert_to_dtype(value, running.dtype)

    return updated(running_mean, mean), updated(running_var, unbiased)


# a composite of its own (not an ltorch symbol: it mirrors no torch function), so that its rules apply
updated_running_stats = Symbol("updated_running_stats", ("torch", "updated_running_stats"), fn=_updated_running_stats,
                               print_name="updated_running_stats",
                               namespace={"updated_running_stats": _updated_running_stats})


def _batch_norm_stats_dtype(input, *params):
    """The dtype of aten's saved statistics: float32 for a half-precision input whose parameters (those given) are all
    float32, else the input's (CPU's rule; CUDA's kernels agree for the dtypes both take)."""
    given = [p for p in params if p is not None]
    mixed = input.dtype in dtypes.low_precision and bool(given) and all(p.dtype is torch.float32 for p in given)
    return torch.float32 if mixed else input.dtype


def _batch_norm_dims(input, *params):
    check(input.ndim >= 2, lambda: f"batch_norm: expected an input of at least 2 dims (N, C, ...), got {input.ndim}")
    channels = input.shape[1]
    for p in params:
        check(p is None or p.numel() == channels, lambda: f"batch_norm: expected {channels} elements per channel "
                                                          f"parameter, got {p.numel()}")
    check_dtype_supported(dtypes.is_float(input.dtype), "batch_norm", input.dtype)
    return (0, *range(2, input.ndim))


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, eps, stats_dtype):
    dims = _batch_norm_dims(input, weight, bias, running_mean, running_var)
    out, mean, invstd = normalize_channels(input, dims if training else None, running_mean, running_var, weight, bias,
                                           eps, stats_rounded=stats_dtype in dtypes.low_precision)
    if not training:  # two tensors, as aten's
        return (out, *(clang.full((0,), 0.0, device=input.device, dtype=stats_dtype) for _ in range(2)))
    channels = (input.shape[1],)
    return (out, maybe_convert_to_dtype(clang.reshape(mean, channels), stats_dtype),
            maybe_convert_to_dtype(clang.reshape(invstd, channels), stats_dtype))


@torchsymbol(_aten(aten.native_batch_norm.default)[0])  # not the OpOverload: torch/nn.py routes it (it may write)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(output, save_mean, save_invstd): batch norm's output and the (C,) statistics its backward reads, the batch's
    mean and 1 / sqrt(var + eps) in training mode, empty (0,) tensors in evaluation mode (normalized with the
    running statistics). In training mode aten also writes new running statistics into running_mean and
    running_var: that form is native_batch_norm_legit_functional, so here they must be None."""
    check(not (training and (running_mean is not None or running_var is not None)),
          lambda: "native_batch_norm(training=True) with running statistics updates them in place; thunderfn records "
                  "that as native_batch_norm_legit_functional (torch.ops.aten.native_batch_norm and F.batch_norm "
                  "called while tracing are recorded so)", UnsupportedOpError)
    check(training or running_mean is not None and running_var is not None,
          lambda: "running_mean and running_var must be defined in evaluation mode")
    return _native_batch_norm(input, weight, bias, running_mean, running_var, training, eps,
                              _batch_norm_stats_dtype(input, weight, bias, running_mean, running_var))


@torchsymbol(*_aten(aten._native_batch_norm_legit_functional.default), name="native_batch_norm_legit_functional")
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(output, save_mean, save_invstd, new running_mean, new running_var): native_batch_norm with running
    statistics as a function, the statistics it would write returned instead (for training=False, the given ones).
    Under jit, where the new statistics are written back into the tensors they came from, the torch executor runs
    native_batch_norm, which writes them there in place as eager does (executors/torch_rewrites.py)."""
    check(running_mean is not None and running_var is not None,
          lambda: "native_batch_norm_legit_functional: running_mean and running_var must be tensors")
    _batch_norm_dims(input, weight, bias, running_mean, running_var)
    stats_dtype = _batch_norm_stats_dtype(input, weight, bias, running_mean, running_var)
    if not training:
        return (*_native_batch_norm(input, weight, bias, running_mean, running_var, False, eps, stats_dtype),
                clang.add(running_mean, 0), clang.add(running_var, 0))  # as they were, derivative included
    out, save_mean, save_invstd = _native_batch_norm(input, weight, bias, None, None, True, eps, stats_dtype)
    return (out, save_mean, save_invstd, *updated_running_stats(input, running_mean, running_var,
                                                                (0, *range(2, input.ndim)), momentum,
                                                                per_instance=False))


@torchsymbol(*_aten(aten.native_batch_norm_backward.default))
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                               output_mask):
    """(grad_input, grad_weight, grad_bias), each None where output_mask says so (as aten gives them). With
    train, from the batch statistics native_batch_norm saved: dx = invstd * weight * (dy - mean(dy) -
    xc * invstd^2 * mean(dy * xc)), xc = x - mean; without, from the running statistics: dx = dy * invstd *
    weight, invstd = 1 / sqrt(running_var + eps). dweight = sum(dy * xc) * invstd, dbias = sum(dy), over every
    dim but the channels (1)."""
    check(len(output_mask) == 3, lambda: f"output_mask must hold 3 bools, got {list(output_mask)}")
    dims = _batch_norm_dims(input, weight, running_mean, running_var, *((save_mean, save_invstd) if train else ()))
    want_input, want_weight, want_bias = (bool(m) for m in output_mask)
    compute = dtypes.computation_dtype(input.dtype)
    x, dy = maybe_convert_to_dtype(input, compute), maybe_convert_to_dtype(grad_out, compute)
    if train:
        check(save_mean is not None and save_invstd is not None,
              lambda: "native_batch_norm_backward(train=True) needs save_mean and save_invstd")
        mean, invstd = _per_channel(save_mean, input.ndim, compute), _per_channel(save_invstd, input.ndim, compute)
    else:
        check(running_mean is not None and running_var is not None,
              lambda: "native_batch_norm_backward(train=False) needs running_mean and running_var")
        mean = _per_channel(running_mean, input.ndim, compute)
        invstd = clang.reciprocal(clang.sqrt(clang.add(_per_channel(running_var, input.ndim, compute), eps)))
    xc = clang.sub(x, mean)
    sum_dy = prims.sum(dy, dims)
    dot = prims.sum(clang.mul(dy, xc), dims)
    param_dtype = input.dtype if weight is None else weight.dtype
    grad_input = grad_weight = grad_bias = None
    if want_input:
        scale = invstd if weight is None else clang.mul(invstd, _per_channel(weight, input.ndim, compute))
        if train:
            n = symbolic.product([input.shape[d] for d in dims])
            mean_dy = clang.keepdim_reshape(clang.true_divide(sum_dy, n), x, dims)
            projection = clang.mul(clang.keepdim_reshape(clang.true_divide(dot, n), x, dims), clang.mul(invstd, invstd))
            dx = clang.mul(clang.sub(clang.sub(dy, mean_dy), clang.mul(xc, projection)), scale)
        else:
            dx = clang.mul(dy, scale)
        grad_input = maybe_convert_to_dtype(dx, input.dtype)
    if want_weight:
        grad_weight = maybe_convert_to_dtype(clang.mul(dot, clang.reshape(invstd, (input.shape[1],))), param_dtype)
    if want_bias:
        grad_bias = maybe_convert_to_dtype(sum_dy, param_dtype)
    return grad_input, grad_weight, grad_bias


# -- group norm ------------------------------------------------------------------------------------
_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _kernel_layout(t):
    """The memory format aten's group norm kernels take t in: channels-last where t is laid out so (what
    suggest_memory_format, which Python does not see, says for such a tensor), else contiguous."""
    channels_last = _CHANNELS_LAST.get(t.ndim)
    if channels_last is not None and not t.is_contiguous() and t.is_contiguous(memory_format=channels_last):
        return channels_last
    return torch.contiguous_format


def _laid_out(t, fmt):
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def aten_native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    """torch.ops.aten.native_group_norm on the input laid out as its kernel requires, as aten's group_norm passes
    it (a contiguous input goes as it is: no copy, no extra op)."""
    return aten.native_group_norm.default(_laid_out(input, _kernel_layout(input)), weight, bias, N, C, HxW, group, eps)


def aten_native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    """torch.ops.aten.native_group_norm_backward with grad_out and input laid out as the input's kernel takes it, as
    eager's derivative formula passes them."""
    fmt = _kernel_layout(input)
    return aten.native_group_norm_backward.default(_laid_out(grad_out, fmt), _laid_out(input, fmt), mean, rstd, weight,
                                                   N, C, HxW, group, output_mask)


def _group_norm_blocks(input, weight, N, C, HxW, group):
    """aten's checks, then the computation dtype and the shape (N, group, C / group, HxW) the input is viewed as."""
    check(group > 0 and C % group == 0, lambda: f"Expected number of channels in input to be divisible by num_groups, "
                                                f"but got input of shape {list(input.shape)} and num_groups={group}")
    check(input.numel() == N * C * HxW, lambda: f"Expected input to have {N * C * HxW} elements (N * C * HxW), got "
                                                f"{input.numel()}")
    check(weight is None or weight.numel() == C, lambda: f"Expected weight to be a vector of size equal to the number "
                                                         f"of channels in input, but got weight of shape "
                                                         f"{list(weight.shape)} and input of shape {list(input.shape)}")
    check_dtype_supported(dtypes.is_float(input.dtype), "GroupNormKernelImpl", input.dtype)
    return dtypes.computation_dtype(input.dtype), (N, group, C // group, HxW)


def _per_group(t, blocks, compute):
    """(N, group) statistics, or a (C,) parameter, shaped to broadcast against the (N, group, C / group, HxW) blocks."""
    shape = (blocks[0], blocks[1], 1, 1) if t.ndim == 2 else (1, blocks[1], blocks[2], 1)
    return clang.reshape(maybe_convert_to_dtype(t, compute), shape)


@torchsymbol(aten_native_group_norm, aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    """(output, mean, rstd): group_norm's output and each sample's and group's mean and 1 / std, (N, group), which its
    backward reads; float32 for a half-precision input with float32 parameters, else in the input's dtype."""
    compute, blocks = _group_norm_blocks(input, weight, N, C, HxW, group)
    check(bias is None or bias.numel() == C, lambda: f"Expected bias to be a vector of size equal to the number of "
                                                     f"channels in input, but got bias of shape {list(bias.shape)} and "
                                                     f"input of shape {list(input.shape)}")
    x = clang.reshape(maybe_convert_to_dtype(input, compute), blocks)
    var, mean = prims.var_mean(clang.reshape(x, (N, group, blocks[2] * HxW)), (2,), correction=0)
    rstd = clang.rsqrt(clang.add(var, eps))
    # (x - mean) * (rstd * weight) + bias: closer to torch's kernels than x * alpha + beta for small groups
    scale = _per_group(rstd, blocks, compute)
    scale = scale if weight is None else clang.mul(scale, _per_group(weight, blocks, compute))
    out = clang.mul(clang.sub(x, _per_group(mean, blocks, compute)), scale)
    out = out if bias is None else clang.add(out, _per_group(bias, blocks, compute))
    stats_dtype = _batch_norm_stats_dtype(input, weight, bias)
    return (maybe_convert_to_dtype(clang.reshape(out, tuple(input.shape)), input.dtype),
            maybe_convert_to_dtype(mean, stats_dtype), maybe_convert_to_dtype(rstd, stats_dtype))


@torchsymbol(aten_native_group_norm_backward, aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    """(grad_input, grad_weight, grad_bias), each None where output_mask says so (as aten gives them): per sample and
    group, dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * weight; dweight = sum(dy *
    xhat), dbias = sum(dy) over the samples and the spatial dims. mean and rstd are native_group_norm's."""
    check(len(output_mask) == 3, lambda: f"output_mask must hold 3 bools, got {list(output_mask)}")
    want_input, want_weight, want_bias = (bool(m) for m in output_mask)
    # aten writes grad_weight and grad_bias into tensors like the weight
    check(not (want_weight or want_bias) or weight is not None,
          lambda: "native_group_norm_backward: output_mask[1] and [2] (grad_weight, grad_bias) need "
                  "weight; pass weight or set them to False")
    compute, blocks = _group_norm_blocks(input, weight, N, C, HxW, group)
    x, dy = (clang.reshape(maybe_convert_to_dtype(t, compute), blocks) for t in (input, grad_out))
    xhat = clang.mul(clang.sub(x, _per_group(mean, blocks, compute)), _per_group(rstd, blocks, compute))
    grad_input = grad_weight = grad_bias = None
    if want_input:
        n = blocks[2] * HxW
        dxhat = dy if weight is None else clang.mul(dy, _per_group(weight, blocks, compute))
        mean_dxhat = clang.true_divide(_row_sum(dxhat, (2, 3)), n)
        mean_dxhat_xhat = clang.true_divide(_row_sum(clang.mul(dxhat, xhat), (2, 3)), n)
        dx = clang.mul(_per_group(rstd, blocks, compute),
                       clang.sub(clang.sub(dxhat, mean_dxhat), clang.mul(xhat, mean_dxhat_xhat)))
        grad_input = maybe_convert_to_dtype(clang.reshape(dx, tuple(input.shape)), input.dtype)
    if want_weight:
        grad_weight = maybe_convert_to_dtype(clang.reshape(prims.sum(clang.mul(dy, xhat), (0, 3)), (C,)), weight.dtype)
    if want_bias:
        grad_bias = maybe_convert_to_dtype(clang.reshape(prims.sum(dy, (0, 3)), (C,)), weight.dtype)
    return grad_input, grad_weight, grad_bias


# -- nll_loss -------------------------------------------------------------------------------------
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # aten's Reduction enum


def _nll_loss_rows(self, target, weight, reduction, ignore_index):
    """aten's checks, then per row of self viewed as (N, C): the target's column (0 where ignored), whether it
    counts, and its weight (0 where ignored), in the computation dtype."""
    check(self.ndim in (1, 2), lambda: "input tensor should be 1D or 2D")
    check(target.ndim <= 1, lambda: "0D or 1D target tensor expected, multi-target not supported")
    check(self.ndim == 1 and target.ndim == 0 or target.ndim == 1 and self.shape[0] == target.shape[0],
          lambda: f"size mismatch (got input: {list(self.shape)}, target: {list(target.shape)})")
    check(target.dtype in (torch.int64, torch.uint8),
          lambda: f"expected target dtype to be Long or Byte, but got {clang.scalar_type_name(target.dtype)}")
    classes = self.shape[-1]
    check(weight is None or weight.numel() == classes,
          lambda: f"weight tensor should be defined either for all {classes} classes or no classes but got weight "
                  f"tensor of shape: {list(weight.shape)}")
    check(reduction in _REDUCTIONS, lambda: f"{reduction} is not a valid value for reduction")
    check_dtype_supported(dtypes.is_float(self.dtype), "nll_loss", self.dtype)
    batch = self.shape[0] if self.ndim == 2 else 1
    if self.ndim == 1 and target.ndim == 1:  # aten reads only target[0]
        target = clang.slice_in_dim(target, 0, 1)
    t = clang.reshape(maybe_convert_to_dtype(target, torch.int64), (batch,))
    counts = clang.ne(t, ignore_index)
    column = clang.where(counts, t, 0)  # an ignored target may be any number (-100): never index with it
    compute = dtypes.computation_dtype(self.dtype)
    w = clang.full((batch,), 1.0, device=self.device, dtype=compute) if weight is None else \
        prims.take(maybe_convert_to_dtype(weight, compute), column, 0)
    return column, counts, clang.where(counts, w, 0.0), compute


@torchsymbol(*_aten(aten.nll_loss_forward.default))
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    """(output, total_weight) for self of shape (N, C) or (C,) (images' (N, C, H, W) go to nll_loss2d):
    output is -self[i, target[i]] * weight[target[i]] per row, summed (sum), or summed and divided by the
    total weight of the rows that count (mean: nan when none counts). total_weight is that total, a 0-dim
    tensor of self's dtype; 0 for reduction none on (N, C)."""
    column, counts, w, compute = _nll_loss_rows(self, target, weight, reduction, ignore_index)
    rows = clang.reshape(maybe_convert_to_dtype(self, compute), (column.shape[0], self.shape[-1]))
    picked = clang.reshape(prims.take_along_axis(rows, clang.unsqueeze(column, 1), 1), (column.shape[0],))
    losses = clang.where(counts, clang.neg(clang.mul(picked, w)), 0.0)
    if _REDUCTIONS[reduction] == "none" and self.ndim == 2:
        return maybe_convert_to_dtype(losses, self.dtype), clang.full((), 0.0, device=self.device, dtype=self.dtype)
    total_weight = prims.sum(w, (0,))
    out = prims.sum(losses, (0,))
    if _REDUCTIONS[reduction] == "mean":
        out = clang.true_divide(out, total_weight)
    return maybe_convert_to_dtype(out, self.dtype), maybe_convert_to_dtype(total_weight, self.dtype)


@torchsymbol(*_aten(aten.nll_loss_backward.default))
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    """The gradient with respect to self: zero but at each counted row's target column, where it is
    -weight[target[i]] * (grad_output[i] for reduction none on (N, C); grad_output / total_weight for mean;
    grad_output for sum)."""
    column, counts, w, compute = _nll_loss_rows(self, target, weight, reduction, ignore_index)
    per_row = _REDUCTIONS[reduction] == "none" and self.ndim == 2
    check(grad_output.numel() == (column.shape[0] if per_row else 1),
          lambda: f"Expected a tensor of dimension 1 and tensor.size[0] == {column.shape[0]} but got: dimension "
                  f"{grad_output.ndim} and tensor.size[0] == {grad_output.shape[0] if grad_output.ndim else 1}"
          if per_row else f"Expected a single element grad_output tensor, but got: {list(grad_output.shape)}")
    g = clang.reshape(maybe_convert_to_dtype(grad_output, compute), (column.shape[0],) if per_row else ())
    if _REDUCTIONS[reduction] == "mean":
        g = clang.true_divide(g, clang.reshape(maybe_convert_to_dtype(total_weight, compute), ()))
    value = clang.mul(w, clang.neg(g))
    classes = clang.unsqueeze(clang.arange(0, self.shape[-1], 1, device=self.device, dtype=torch.int64), 0)
    hit = clang.bitwise_and(clang.eq(classes, clang.unsqueeze(column, 1)), clang.unsqueeze(counts, 1))
    grad = clang.where(hit, clang.unsqueeze(value, 1) if value.ndim else value, 0.0)
    return maybe_convert_to_dtype(clang.reshape(grad, self.shape), self.dtype)


# -- embedding --------------------------------------------------------------------------------------
@torchsymbol(*_aten(aten.embedding_dense_backward.default))
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The (num_weights, D) gradient of embedding's weight: each row of grad_output added into the row its index
    names, skipping index padding_idx (-1: none), divided by how often the index occurs if scale_grad_by_freq."""
    check(indices.dtype in (torch.int64, torch.int32),
          lambda: f"Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
                  f"but got {clang.legacy_type_name(indices)} instead (while checking arguments for "
                  f"embedding_backward)")
    n, dim = indices.numel(), grad_output.shape[-1]
    # int64: scatter_add's backward gathers with the index broadcast, which torch 2.13 reads wrongly for int32
    index = clang.reshape(maybe_convert_to_dtype(indices, torch.int64), (n,))
    compute = dtypes.computation_dtype(grad_output.dtype)
    rows = clang.reshape(maybe_convert_to_dtype(grad_output, compute), (n, dim))
    if scale_grad_by_freq:
        ones, zeros = (clang.full((size,), fill, device=indices.device, dtype=torch.int64)
                       for size, fill in ((n, 1), (num_weights, 0)))
        counts = prims.take(prims.scatter_add(zeros, index, ones, 0), index, 0)  # each row's index's count
        rows = clang.true_divide(rows, clang.unsqueeze(maybe_convert_to_dtype(counts, rows.dtype), 1))
    if padding_idx >= 0:
        rows = clang.where(clang.unsqueeze(clang.ne(index, padding_idx), 1), rows, 0.0)
    zeros = clang.full((num_weights, dim), 0, device=grad_output.device, dtype=compute)
    out = prims.scatter_add(zeros, clang.expand_to(clang.unsqueeze(index, 1), (n, dim)), rows, 0)
    return maybe_convert_to_dtype(out, grad_output.dtype)
