"""Neural-network operations: matmul family, linear, layer_norm, embedding,
cross_entropy, scaled_dot_product_attention and dropout, decomposed so that the
transforms and fusion executors see their insides."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from thunderfn import clang, prims
from thunderfn.clang import keepdim_reshape, maybe_convert_to_dtype
from thunderfn.core import context, dtypes, symbolic
from thunderfn.core.interception import dispatch
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.statements import emit_runtime_check
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import canonical_dim, check, check_dtype_supported
from thunderfn.torch import sdp_state
from thunderfn.torch.aten_backward import (
    native_batch_norm,
    native_batch_norm_legit_functional,
    native_group_norm,
    native_layer_norm,
    nll_loss_forward,
    normalize_channels,
    updated_running_stats,
)
from thunderfn.torch.base import register_alias, stand_in_front, torchsymbol
from thunderfn.torch.elementwise import add, logsigmoid, mul, neg, rsub, sub
from thunderfn.torch.indexing import getitem
from thunderfn.torch.inplace import rebind
from thunderfn.torch.opaque import opaque_symbol
from thunderfn.torch.reductions import all as reduction_all
from thunderfn.torch.reductions import log_softmax, softmax
from thunderfn.torch.reductions import mean as reduction_mean
from thunderfn.torch.reductions import sum as reduction_sum
from thunderfn.torch.shape import clone

T = torch.Tensor
__all__ = ["matmul", "mm", "bmm", "linear", "layer_norm", "embedding", "cross_entropy", "nll_loss",
           "scaled_dot_product_attention", "dropout", "mse_loss", "rms_norm", "batch_norm",
           "instance_norm", "group_norm", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss", "softmin"]


def _check_same_dtype(a, b):
    check(a.dtype == b.dtype, lambda: f"expected m1 and m2 to have the same dtype, but got: "
                                      f"{clang.CPP_TYPE_NAMES.get(a.dtype, a.dtype)} != "
                                      f"{clang.CPP_TYPE_NAMES.get(b.dtype, b.dtype)}")


@torchsymbol(torch.matmul, T.matmul, T.__matmul__)
def matmul(a, b):
    if a.ndim == 1 and b.ndim == 1:
        check(a.dtype == b.dtype, lambda: f"dot : expected both vectors to have same dtype, but found "
                                          f"{clang.scalar_type_name(a.dtype)} and {clang.scalar_type_name(b.dtype)}")
    _check_same_dtype(a, b)
    return prims.matmul(a, b)


register_alias(T.__rmatmul__, lambda self, other: matmul(other, self))


@torchsymbol(torch.mm, T.mm)
def mm(a, b):
    check(a.ndim == 2, lambda: "self must be a matrix")
    check(b.ndim == 2, lambda: "mat2 must be a matrix")
    check(a.shape[1] == b.shape[0], lambda: f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
                                            f"{b.shape[0]}x{b.shape[1]})")
    _check_same_dtype(a, b)
    return prims.matmul(a, b)


@torchsymbol(torch.bmm, T.bmm)
def bmm(a, b):
    check(a.ndim == 3, lambda: "batch1 must be a 3D tensor")
    check(b.ndim == 3, lambda: "batch2 must be a 3D tensor")
    check(a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1],
          lambda: f"Expected size for first two dimensions of batch2 tensor to be: [{a.shape[0]}, {a.shape[2]}] but "
                  f"got: [{b.shape[0]}, {b.shape[1]}].")
    check(a.dtype == b.dtype,
          lambda: f"expected scalar type {clang.scalar_type_name(a.dtype)} but found {clang.scalar_type_name(b.dtype)}")
    return prims.matmul(a, b)


@torchsymbol(F.linear, torch._C._nn.linear)
def linear(input, weight, bias=None):
    check(input.ndim >= 1,
          lambda: f"both arguments to linear need to be at least 1D, but they are {input.ndim}D and {weight.ndim}D")
    check(weight.ndim in (1, 2), lambda: f"t() expects a tensor with <= 2 dimensions, but self is {weight.ndim}D")
    check(bias is None or weight.ndim == 2, lambda: f"mat2 must be a matrix, got {weight.ndim}-D tensor")
    _check_same_dtype(input, weight)
    if bias is None:
        return prims.matmul(input, clang.transpose(weight, 0, 1) if weight.ndim == 2 else weight)
    check(bias.dtype == input.dtype, lambda: f"self and mat2 must have the same dtype, but got "
                                             f"{clang.scalar_type_name(bias.dtype)} and "
                                             f"{clang.scalar_type_name(weight.dtype)}")
    if bias.ndim <= 1:  # torch adds it to the output with input's batch dims folded into rows
        rows, n_out, n = symbolic.product(input.shape[:-1]), weight.shape[0], bias.shape[0] if bias.ndim else 1
        check(symbolic.expands_to(n, n_out),
              lambda: f"The expanded size of the tensor ({n_out}) must match the existing size ({n}) at "
                                       f"non-singleton dimension 1.  Target sizes: [{rows}, "
                                       f"{n_out}].  Tensor sizes: [{n}]")
    # torch's fused kernel adds the bias before rounding a half-precision result once; so do we
    compute = dtypes.computation_dtype(input.dtype)
    x, w, b = (maybe_convert_to_dtype(t, compute) for t in (input, weight, bias))
    out = clang.add(prims.matmul(x, clang.transpose(w, 0, 1)), b)
    return maybe_convert_to_dtype(out, input.dtype)


@torchsymbol(F.layer_norm)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    _check_normalized_shape("layer_norm", input, normalized_shape, (("weight", weight), ("bias", bias)),
                            shape_text=lambda shape: f"[*, {', '.join(map(str, shape))}]")
    check(dtypes.is_float(input.dtype),
          lambda: f"\"LayerNormKernelImpl\" not implemented for '{clang.scalar_type_name(input.dtype)}'",
          NotImplementedError)
    for p in (weight, bias):
        # float32 parameters may go with a half-precision input; otherwise parameters match the input
        check(p is None or p.dtype == input.dtype or p.dtype is torch.float32 and input.dtype in dtypes.low_precision,
              lambda: "mixed dtype (CPU): expect parameter to have scalar type of "
                      f"{clang.scalar_type_name(input.dtype)}")
    # aten's native_layer_norm also returns the mean and rstd its backward reads: reverse mode saves them
    return native_layer_norm(input, list(normalized_shape), weight, bias, eps)[0]


def _check_normalized_shape(fn_name, input, normalized_shape, params, *, shape_text):
    """torch's checks of normalized_shape against the input and the (name, tensor) params; the normalized dims."""
    check(isinstance(normalized_shape, (tuple, list, torch.Size)),
          lambda: f"{fn_name}(): argument 'normalized_shape' (position 2) must be tuple of ints, not "
                  f"{type(normalized_shape).__name__}",
          TypeError)
    normalized_shape = tuple(normalized_shape)
    n = len(normalized_shape)
    check(n > 0,
          lambda: "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, "
                  f"but got normalized_shape = {list(normalized_shape)}")
    for name, p in params:
        check(p is None or tuple(p.shape) == normalized_shape,
              lambda: f"Expected {name} to be of same shape as normalized_shape, but got {name} of shape "
                      f"{list(p.shape)} and normalized_shape = {list(normalized_shape)}")
    check(tuple(input.shape[input.ndim - n:]) == normalized_shape and input.ndim >= n,
          lambda: f"Given normalized_shape={list(normalized_shape)}, expected input with shape "
                  f"{shape_text(normalized_shape)}, but got input of size{list(input.shape)}")
    return tuple(range(input.ndim - n, input.ndim))


@torchsymbol(F.rms_norm, torch.rms_norm)
def rms_norm(input, normalized_shape, weight=None, eps=None):
    check(input.ndim >= 1, lambda: f"Input tensor must have at least 1 dimensions, but got {input.ndim}", ValueError)
    dims = _check_normalized_shape("rms_norm", input, normalized_shape, (("weight", weight),),
                                   shape_text=lambda shape: f"[*{', '.join(map(str, shape))}]")
    check_dtype_supported(dtypes.is_inexact(input.dtype), "rms_norm", input.dtype)
    compute = dtypes.computation_dtype(input.dtype)
    if eps is None:  # torch's default: the epsilon of the dtype it computes in (float32 for half types)
        eps = torch.finfo(compute).eps
    x = maybe_convert_to_dtype(input, compute)
    mean_square = clang.true_divide(prims.sum(clang.mul(x, x), dims), symbolic.product([input.shape[d] for d in dims]))
    out = clang.mul(x, clang.rsqrt(clang.add(keepdim_reshape(mean_square, x, dims), eps)))
    if weight is not None:  # torch's fused kernel scales in the computation dtype and rounds once, to input's dtype
        out = clang.mul(out, maybe_convert_to_dtype(weight, compute))
    return maybe_convert_to_dtype(out, input.dtype)


def _check_norm_params(input, *params):
    """torch's CPU rule for normalization parameters: the input's dtype, or all float32 with a half-precision input."""
    given = [p for p in params if p is not None]
    mixed = input.dtype in dtypes.low_precision and all(p.dtype is torch.float32 for p in given)
    check(mixed or all(p.dtype == input.dtype for p in given),
          lambda: "mixed dtype (CPU): expect parameter to have scalar type of Float")


def _instance_norm_channels(input, stats_dims, running_mean, running_var, weight, bias, eps):
    """Instance norm's output: torch runs batch norm on the input viewed as (1, N*C, ...); its statistics are
    rounded to half precision unless the parameters (weight, bias) are float32."""
    params = [p for p in (weight, bias) if p is not None]
    stats_rounded = input.dtype in dtypes.low_precision and not (params and params[0].dtype is torch.float32)
    return normalize_channels(input, stats_dims, running_mean, running_var, weight, bias, eps,
                              stats_rounded=stats_rounded)[0]


def _check_more_than_one_value(input, count_dims, what, shape_text):
    count = symbolic.product([input.shape[d] for d in count_dims])
    check(count != 1, lambda: f"Expected more than 1 {what} when training, got input size {shape_text}", ValueError)


def _check_batch_norm(input, running_mean, running_var, weight, bias, training):
    """F.batch_norm's and torch's checks, in their order."""
    if training:  # F.batch_norm's own check, before torch's
        _check_more_than_one_value(input, (0, *range(2, input.ndim)), "value per channel",
                                   f"torch.Size({list(input.shape)})")
    if not training:
        check(running_mean is not None, lambda: "running_mean must be defined in evaluation mode")
        check(running_var is not None, lambda: "running_var must be defined in evaluation mode")
    channels = input.shape[1] if input.ndim >= 2 else 0
    for name, p in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        check(p is None or p.numel() == channels, lambda: f"{name} should contain {channels} elements not {p.numel()}")
    canonical_dim(1, input.ndim)
    check_dtype_supported(dtypes.is_float(input.dtype), "batch_norm", input.dtype)
    _check_norm_params(input, running_mean, running_var, weight, bias)


@torchsymbol(F.batch_norm)  # not torch.batch_norm: its arguments come in another order
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """Batch norm without a write: in evaluation mode, or in training mode without running statistics
    (_batch_norm_entry records the writing form). Its decomposition is aten's kernel, whose rule runs
    native_batch_norm_backward."""
    check(not training or running_mean is None and running_var is None,
          lambda: "batch_norm(training=True) with running_mean/running_var updates running_mean/running_var in place: "
                  "call F.batch_norm, which thunderfn records as native_batch_norm_legit_functional",
          UnsupportedOpError)
    _check_batch_norm(input, running_mean, running_var, weight, bias, training)
    # momentum is unused here (and may be None, or the tensor of nn.BatchNorm's cumulative average)
    return native_batch_norm(input, weight, bias, running_mean, running_var, training, 0.0, eps)[0]


def _rebind_running_stats(running_mean, running_var, new_mean, new_var, because: str) -> None:
    """The in-place update eager makes, functionalized: the statistics' proxies now hold the new
    values (written back to the module's buffers when the function ends)."""
    rebind(running_mean, new_mean, because=because)
    rebind(running_var, new_var, because=because)


def _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps, because: str):
    """Training-mode batch norm that writes new running statistics, as aten's kernel does: recorded as
    native_batch_norm_legit_functional and a rebinding of the statistics; with nn.BatchNorm's
    cumulative average (momentum a tensor, torch/nn_modules.py) the update is decomposed."""
    check(running_mean is not None and running_var is not None,
          lambda: "running statistics: pass both running_mean and running_var, or neither")
    if isinstance(momentum, TensorProxy):
        out = batch_norm(input, None, None, weight, bias, True, 0.0, eps)
        new_mean, new_var = updated_running_stats(input, running_mean, running_var, (0, *range(2, input.ndim)),
                                                  momentum, per_instance=False)
        _rebind_running_stats(running_mean, running_var, new_mean, new_var, because)
        return out, None, None
    out, save_mean, save_invstd, new_mean, new_var = native_batch_norm_legit_functional(
        input, weight, bias, running_mean, running_var, True, momentum, eps)
    _rebind_running_stats(running_mean, running_var, new_mean, new_var, because)
    return out, save_mean, save_invstd


def _empty_batch_norm(input, weight, bias):
    """aten's batch_norm of an input with no elements: no statistics (the running ones stay as they are) and
    input.clone() * weight[0] + bias[0], an empty output still wired to weight and bias (zero gradients, not None)."""
    out = clone(input)
    if weight is not None:
        out = mul(out, getitem(weight, 0))
    return out if bias is None else add(out, getitem(bias, 0))


def _batch_norm_entry(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """F.batch_norm while tracing: in training mode with running statistics, torch's in-place
    update of them, functionalized."""
    if input.numel() == 0:  # (F.batch_norm's own check passes: there is no value at all; aten checks nothing)
        return _empty_batch_norm(input, weight, bias)
    if not (training and (running_mean is not None or running_var is not None)):
        return batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    _check_batch_norm(input, running_mean, running_var, weight, bias, training)
    check(momentum is not None, lambda: "batch_norm(momentum=None) needs the number of batches seen as a Python value; "
                                        "pass a float momentum", UnsupportedOpError)
    return _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps,
                                   "batch_norm(training=True)")[0]


def _native_batch_norm_entry(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """torch.ops.aten.native_batch_norm while tracing: in training mode with running statistics it writes
    them, functionalized as for F.batch_norm."""
    if not (training and (running_mean is not None or running_var is not None)):
        return native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps,
                                   "native_batch_norm(training=True)")


register_alias(F.batch_norm, _batch_norm_entry)
register_alias(torch.ops.aten.native_batch_norm.default, _native_batch_norm_entry)


@torchsymbol(F.instance_norm)  # not torch.instance_norm: its arguments come in another order
def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    if use_input_stats:  # F.instance_norm's own check, before torch's
        _check_more_than_one_value(input, tuple(range(2, input.ndim)), "spatial element",
                                   f"torch.Size({list(input.shape)})")
    check(not use_input_stats or running_mean is None and running_var is None,
          lambda: "instance_norm(use_input_stats=True) with running_mean/running_var updates running_mean/running_var "
                  "in place, which thunderfn does not trace yet; pass running_mean=None and running_var=None",
          UnsupportedOpError)
    check(use_input_stats or running_mean is not None and running_var is not None,
          lambda: "Expected running_mean and running_var to be defined when use_input_stats is false")
    # torch runs batch norm on the input viewed as (1, N*C, ...), with per-channel parameters repeated N times
    n, c = input.shape[0], input.shape[1] if input.ndim >= 2 else 0
    for name, p in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        check(p is None or p.numel() == c, lambda: f"{name} should contain {n * c} elements not {n * p.numel()}")
    check_dtype_supported(dtypes.is_float(input.dtype), "batch_norm", input.dtype)
    _check_norm_params(input, running_mean, running_var, weight, bias)
    stats_dims = tuple(range(2, input.ndim)) if use_input_stats else None
    return _instance_norm_channels(input, stats_dims, running_mean, running_var, weight, bias, eps)


def instance_norm_running_update(input, running_mean, running_var, weight, bias, momentum, eps):
    """Instance norm using input statistics, as a function: (output, new running_mean, new running_var)."""
    new_mean, new_var = running_mean.clone(), running_var.clone()
    return F.instance_norm(input, new_mean, new_var, weight, bias, True, momentum, eps), new_mean, new_var


@torchsymbol(instance_norm_running_update, name="instance_norm_running_update")
def _instance_norm_running_update(input, running_mean, running_var, weight, bias, momentum, eps):
    out = instance_norm(input, None, None, weight, bias, True, momentum, eps)
    return (out, *updated_running_stats(input, running_mean, running_var, tuple(range(2, input.ndim)), momentum,
                                        per_instance=True))


def _instance_norm_entry(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                         momentum=0.1, eps=1e-5):
    """F.instance_norm while tracing: with input and running statistics, torch's in-place update
    of the latter, functionalized (as for batch norm)."""
    if not (use_input_stats and (running_mean is not None or running_var is not None)):
        return instance_norm(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
    _check_more_than_one_value(input, tuple(range(2, input.ndim)), "spatial element",
                               f"torch.Size({list(input.shape)})")
    out, new_mean, new_var = _instance_norm_running_update(input, running_mean, running_var, weight,
                                                           bias, momentum, eps)
    _rebind_running_stats(running_mean, running_var, new_mean, new_var, "instance_norm(use_input_stats=True)")
    return out


register_alias(F.instance_norm, _instance_norm_entry)


@torchsymbol(F.group_norm)  # not torch.group_norm: it takes cudnn_enabled too
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    check(input.ndim >= 2, lambda: f"Expected at least 2 dimensions for input tensor but received {input.ndim}")
    check(num_groups != 0, lambda: "integer division or modulo by zero", ZeroDivisionError)
    n, c = input.shape[0], input.shape[1]
    # F.group_norm's own check, on the input viewed as (N*C/G, G, ...)
    grouped = [n * c // num_groups, num_groups, *input.shape[2:]]
    check(symbolic.product([grouped[0], *grouped[2:]]) != 1,
          lambda: f"Expected more than 1 value per channel when training, got input size {grouped}", ValueError)
    check(c % num_groups == 0,
          lambda: f"Expected number of channels in input to be divisible by num_groups, but got input "
                  f"of shape {list(input.shape)} and num_groups={num_groups}")
    for name, p in (("weight", weight), ("bias", bias)):
        check(p is None or p.ndim == 1 and p.numel() == c,
              lambda: f"Expected {name} to be a vector of size equal to the number of channels in "
                      f"input, but got {name} of shape {list(p.shape)} and input of shape {list(input.shape)}")
    check_dtype_supported(dtypes.is_float(input.dtype), "GroupNormKernelImpl", input.dtype)
    _check_norm_params(input, weight, bias)
    # aten's native_group_norm also returns the mean and rstd its backward reads: reverse mode saves them
    return native_group_norm(input, weight, bias, n, c, symbolic.product(input.shape[2:]), num_groups, eps)[0]


@torchsymbol(F.embedding)
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    check(max_norm is None,
          lambda: "embedding(max_norm=...) renormalizes the weight in place; thunderfn does not trace that",
          UnsupportedOpError)
    check(weight.ndim == 2, lambda: "'weight' must be 2-D")
    if padding_idx is not None:  # padding_idx only shapes the gradient; the forward ignores it
        check(-weight.shape[0] <= padding_idx < weight.shape[0],
              lambda: "Padding_idx must be within num_embeddings", AssertionError)
    check(input.dtype in (torch.int64, torch.int32),
          lambda: "Expected tensor for argument #1 'indices' to have one of the following scalar "
                  f"types: Long, Int; but got {clang.legacy_type_name(input)} instead (while checking "
                  "arguments for embedding)")
    # padding_idx and scale_grad_by_freq only shape the gradient (a zero row, counts), which differentiating
    # this gather does not give: reverse mode always takes embedding's rule (aten's embedding_dense_backward,
    # transforms/rules/nn.py); forward mode's derivative, like torch's, ignores both
    flat = prims.take(weight, clang.reshape(input, (input.numel(),)), 0)
    return clang.reshape(flat, tuple(input.shape) + (weight.shape[1],))


def _differentiable_proxy(x) -> bool:
    return dtypes.is_inexact(x.dtype)


def _check_reduction(reduction):
    check(reduction in ("none", "mean", "sum"), lambda: f"{reduction} is not a valid value for reduction", ValueError)


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


def _check_class_targets(input, target, weight):
    """torch's checks on nll_loss's (and cross_entropy's class-index) arguments, in torch's order."""
    check(input.ndim >= 1, lambda: f"Expected 1 or more dimensions (got {input.ndim})", ValueError)
    if input.ndim == 1 and target.ndim == 1:
        check(target.shape[0] == 1,
              lambda: f"For 1D input, 1D target must have size 1, but got target size: {target.shape[0]}", ValueError)
    check(input.ndim == 1 or target.ndim >= 1 and input.shape[0] == target.shape[0],
          lambda: f"Expected input batch_size ({input.shape[0]}) to match target batch_size "
                  f"({target.shape[0] if target.ndim else 1}).",
          ValueError)
    if input.ndim >= 3:
        check(tuple(target.shape[1:]) == tuple(input.shape[2:]),
              lambda: f"Expected target size {[input.shape[0], *input.shape[2:]]}, got {list(target.shape)}")
    else:
        check(target.ndim <= 1, lambda: "0D or 1D target tensor expected, multi-target not supported")
    n_classes = input.shape[1] if input.ndim > 1 else input.shape[0]
    check(weight is None or weight.ndim == 1 and weight.shape[0] == n_classes,
          lambda: f"weight tensor should be defined either for all {n_classes} classes or no classes but got weight "
                  f"tensor of shape: {list(weight.shape)}")
    check(target.dtype in (torch.int64, torch.uint8),
          lambda: f"expected target dtype to be Long or Byte, but got {clang.scalar_type_name(target.dtype)}")
    check(weight is None or weight.dtype == input.dtype,
          lambda: f"expected scalar type {clang.scalar_type_name(input.dtype)} but found "
                  f"{clang.scalar_type_name(weight.dtype)}")


def _nll(logp, target, weight, ignore_index, reduction):
    """-logp[target] per element (weighted, ignore_index masked), reduced; an out-of-range target makes the
    gather raise when the function runs."""
    if logp.ndim == 2 and target.dtype is torch.int64:  # aten's kernel (whose backward reverse mode then runs)
        return nll_loss_forward(logp, target, weight, {"none": 0, "mean": 1, "sum": 2}[reduction], ignore_index)[0]
    batch_shape = tuple(target.shape) if logp.ndim > 1 else ()
    tgt = maybe_convert_to_dtype(clang.reshape(target, (-1,)), torch.int64)
    valid = clang.ne(tgt, ignore_index)
    safe = clang.where(valid, tgt, 0)
    picked = clang.reshape(prims.take_along_axis(_class_dim_last(logp), clang.unsqueeze(safe, 1), 1), (-1,))
    w = clang.where(valid, prims.take(weight, safe, 0) if weight is not None else 1.0, 0.0)
    w = maybe_convert_to_dtype(w, logp.dtype)
    loss = clang.neg(clang.mul(picked, w))
    if reduction == "none":
        return clang.reshape(loss, batch_shape)
    total = prims.sum(loss, (0,))
    return total if reduction == "sum" else clang.true_divide(total, prims.sum(w, (0,)))


@torchsymbol(F.nll_loss)
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    _check_class_targets(input, target, weight)
    kernel = "nll_loss_out_frame" if input.ndim <= 2 else "nll_loss2d_forward_out_frame"
    check(dtypes.is_float(input.dtype),
          lambda: f"\"{kernel}\" not implemented for '{clang.scalar_type_name(input.dtype)}'", NotImplementedError)
    return _nll(input, target, weight, ignore_index, reduction)


@torchsymbol(F.cross_entropy)
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    check(label_smoothing <= 1.0, lambda: f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    class_dim = 0 if input.ndim == 1 else 1
    probabilities = tuple(target.shape) == tuple(input.shape)  # torch's rule: same shape means class probabilities
    if probabilities:
        check(dtypes.is_float(target.dtype),
              lambda: "Expected floating point type for target with class probabilities, got "
                      f"{clang.scalar_type_name(target.dtype)}")
        check(ignore_index < 0, lambda: "ignore_index is not supported for floating point target")
        n_classes = input.shape[canonical_dim(class_dim, input.ndim)]
        check(weight is None or weight.ndim == 1 and weight.shape[0] == n_classes,
              lambda: f"cross_entropy: weight tensor should be defined either for all {n_classes} classes or no "
                      f"classes but got weight tensor of shape: {list(weight.shape)}")
    kernel = "log_softmax_lastdim_kernel_impl" if class_dim == input.ndim - 1 else "log_softmax_kernel_impl"
    check(dtypes.is_float(input.dtype),
          lambda: f"\"{kernel}\" not implemented for '{clang.scalar_type_name(input.dtype)}'", NotImplementedError)
    if probabilities:
        return _cross_entropy_with_probabilities(input, target, weight, class_dim, reduction, label_smoothing)
    _check_class_targets(input, target, weight)
    logp = log_softmax(input, class_dim)
    nll = _nll(logp, target, weight, ignore_index, reduction)
    if label_smoothing <= 0:
        return nll
    # smoothing term: mean over classes of -logp (weighted), masked like nll
    n_classes = input.shape[class_dim]
    flat = _class_dim_last(logp)
    tgt = maybe_convert_to_dtype(clang.reshape(target, (-1,)), torch.int64)
    valid = clang.ne(tgt, ignore_index)
    per_class = flat if weight is None else clang.mul(flat, weight)
    smooth = clang.where(valid, clang.neg(prims.sum(per_class, (1,))), 0.0)
    if reduction == "none":
        smooth = clang.reshape(smooth, tuple(target.shape) if input.ndim > 1 else ())
    elif reduction == "sum":
        smooth = prims.sum(smooth, (0,))
    else:
        if weight is None:
            denom = prims.sum(maybe_convert_to_dtype(valid, input.dtype), (0,))
        else:
            denom = prims.sum(clang.where(valid, prims.take(weight, clang.where(valid, tgt, 0), 0), 0.0), (0,))
        smooth = clang.true_divide(prims.sum(smooth, (0,)), denom)
    return clang.add(clang.mul(nll, 1 - label_smoothing), clang.mul(smooth, label_smoothing / n_classes))


def _cross_entropy_with_probabilities(input, target, weight, class_dim, reduction, label_smoothing):
    logp = log_softmax(input, class_dim)
    n_classes = input.shape[class_dim]
    if label_smoothing > 0:
        target = clang.add(clang.mul(target, 1 - label_smoothing), label_smoothing / n_classes)
    terms = clang.mul(logp, target)
    if weight is not None:
        shape = [1] * input.ndim
        shape[class_dim] = n_classes
        terms = clang.mul(terms, clang.reshape(weight, tuple(shape)))
    loss = clang.neg(prims.sum(terms, (class_dim,)))
    if reduction == "none":
        return loss
    total = prims.sum(loss, tuple(range(loss.ndim)))
    if reduction == "sum":
        return total
    # torch divides by the number of samples (numel / classes); 0/0 gives nan for an empty batch, as in torch
    return clang.true_divide(total, input.numel() / n_classes if n_classes else 0.0)


@torchsymbol(F.mse_loss)
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if weight is not None:  # torch's Python path for weights: its own messages, mean divides by the weights' sum
        check(tuple(weight.shape) == tuple(input.shape),
              lambda: "Weights and input must have the same size.", ValueError)
        check(reduction in ("none", "mean", "sum"),
              lambda: f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', 'sum'.", ValueError)
    else:
        _check_reduction(reduction)
    diff = clang.sub(input, target)
    check(dtypes.is_inexact(diff.dtype),
          lambda: f"\"mse_cpu\" not implemented for '{clang.scalar_type_name(diff.dtype)}'", NotImplementedError)
    loss = clang.mul(diff, diff)
    if weight is not None:
        loss = clang.mul(loss, weight)
    if reduction == "none":
        return loss
    total = prims.sum(loss, tuple(range(loss.ndim)))
    if reduction == "sum":
        return total
    if weight is not None:
        return clang.true_divide(total, prims.sum(weight, tuple(range(weight.ndim))))
    return clang.true_divide(total, loss.numel() if loss.numel() else float("nan"))



def _apply_reduction(loss, reduction):
    """torch's apply_loss_reduction: loss.mean(), loss.sum() or loss itself."""
    if reduction == "none":
        return loss
    return reduction_mean(loss) if reduction == "mean" else reduction_sum(loss)


def _broadcast_pair(input, target):
    """torch.broadcast_tensors(input, target), as the Python losses do (torch warns about differing sizes)."""
    return clang.broadcast(input, target) if input.ndim and target.ndim else (input, target)


@torchsymbol(F.l1_loss)
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    input, target = _broadcast_pair(input, target)
    if weight is not None:  # torch's Python path for weights, as mse_loss's
        check(tuple(weight.shape) == tuple(input.shape),
              lambda: "Weights and input must have the same size.", ValueError)
        check(reduction in ("none", "mean", "sum"),
              lambda: f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', 'sum'.", ValueError)
        loss = clang.mul(clang.abs(sub(input, target)), weight)
        if reduction == "none":
            return loss
        total = reduction_sum(loss)
        return total if reduction == "sum" else clang.true_divide(total, reduction_sum(weight))
    _check_reduction(reduction)
    return _apply_reduction(clang.abs(sub(input, target)), reduction)


@torchsymbol(F.gaussian_nll_loss)
def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """torch's formula op for op; its check that var has no negative entry reads values, so it
    is a runtime check (a ValueError when the compiled function runs, as in eager)."""
    if isinstance(var, symbolic.NUMBER_TYPES):
        check(var >= 0, lambda: "var has negative entry/entries", ValueError)
        var = clang.full(input.shape, float(var), device=input.device, dtype=input.dtype)
    else:
        emit_runtime_check(reduction_all(clang.ge(var, 0)), "ValueError", "var has negative entry/entries")
        if tuple(var.shape) != tuple(input.shape):
            if tuple(input.shape[:-1]) == tuple(var.shape):
                var = clang.unsqueeze(var, -1)  # homoscedastic: one variance per row
            else:
                check(input.ndim == var.ndim and sum(y for x, y in zip(input.shape, var.shape) if x != y) == 1,
                      lambda: "var is of incorrect size", ValueError)
    check(reduction in ("none", "mean", "sum"), lambda: f"{reduction} is not valid", ValueError)
    var = clang.where(clang.lt(var, eps), eps, var)  # torch's clamp_(min=eps); NaN stays NaN
    diff = sub(input, target)
    loss = mul(0.5, clang.add(clang.log(var), clang.true_divide(mul(diff, diff), var)))
    if full:
        loss = clang.add(loss, 0.5 * math.log(2 * math.pi))
    if reduction == "mean":
        return reduction_mean(loss)
    return reduction_sum(loss) if reduction == "sum" else loss


def _every_argument(original, /, *args, **kwargs):
    """torch 2.13's F.l1_loss leaves `weight` out of its __torch_function__ call, so a traced
    call would silently lose it. Standing in front of it: while tracing, dispatch the call with
    every argument (to the symbol, registered for the original); otherwise, torch's own function."""
    tracer = context.current_tracer()
    if tracer is None or tracer.symbol_depth:
        return original(*args, **kwargs)
    return dispatch(original, args, kwargs)


stand_in_front(F, "l1_loss", _every_argument)


def _float_loss(name, kernel, input, target):
    """(input, target) in the computation dtype of their promoted dtype, and that dtype; torch's kernel refuses
    integer results."""
    dtype = dtypes.result_type(input, target)
    check_dtype_supported(dtypes.is_inexact(dtype), kernel, dtype)
    compute = dtypes.computation_dtype(dtype)
    return maybe_convert_to_dtype(input, compute), maybe_convert_to_dtype(target, compute), dtype


@torchsymbol(F.smooth_l1_loss)
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    input, target = _broadcast_pair(input, target)
    if beta == 0.0:  # torch's own shortcut
        _check_reduction(reduction)
        return _apply_reduction(clang.abs(sub(input, target)), reduction)
    _check_reduction(reduction)
    check(beta >= 0, lambda: "smooth_l1_loss does not support negative values for beta.")
    x, y, dtype = _float_loss("smooth_l1_loss", "smooth_l1_cpu", input, target)
    z = clang.abs(clang.sub(x, y))
    loss = clang.where(clang.lt(z, beta), clang.true_divide(clang.mul(clang.mul(z, z), 0.5), beta),
                       clang.sub(z, 0.5 * beta))
    return _apply_reduction(maybe_convert_to_dtype(loss, dtype), reduction)


@torchsymbol(F.huber_loss)
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    input, target = _broadcast_pair(input, target)
    if weight is not None:
        check(tuple(weight.shape) == tuple(input.shape),
              lambda: "Weights and input must have the same size.", ValueError)
    else:
        _check_reduction(reduction)
    check(delta > 0, lambda: "huber_loss does not support non-positive values for delta.")
    x, y, dtype = _float_loss("huber_loss", "huber_cpu", input, target)
    z = clang.abs(clang.sub(x, y))
    loss = clang.where(clang.lt(z, delta), clang.mul(clang.mul(z, z), 0.5), clang.mul(clang.sub(z, 0.5 * delta), delta))
    loss = maybe_convert_to_dtype(loss, input.dtype)  # torch writes the loss in the input's dtype
    if weight is None:
        return _apply_reduction(loss, reduction)
    check(reduction in ("none", "mean", "sum"),
          lambda: f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', 'sum'.", ValueError)
    return _apply_reduction(mul(loss, weight), reduction)  # weighted 'mean' is a plain mean, as in torch


def _torch_size(t):
    return f"torch.Size({list(t.shape)})"


@torchsymbol(F.binary_cross_entropy)
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    check(tuple(target.shape) == tuple(input.shape),
          lambda: f"Using a target size ({_torch_size(target)}) that is different to the input size "
                  f"({_torch_size(input)}) is deprecated. Please ensure they have the same size.", ValueError)
    if weight is not None:  # F.binary_cross_entropy expands weight to the target's shape
        for i in range(1, min(weight.ndim, target.ndim) + 1):
            check(symbolic.expands_to(weight.shape[-i], target.shape[-i]),
                  lambda: f"Attempting to broadcast a dimension of length {weight.shape[-i]} at {-i}! "
                          f"Mismatching argument at index 1 had {_torch_size(weight)}; but expected shape should "
                          f"be broadcastable to {list(target.shape)}")
        weight = clang.expand_to(weight, target.shape)
    check_dtype_supported(dtypes.is_float(input.dtype), "binary_cross_entropy", input.dtype)
    check(target.dtype == input.dtype, lambda: f"Found dtype {prims.scalar_type_name(target.dtype)} but expected "
                                               f"{prims.scalar_type_name(input.dtype)}")
    compute = dtypes.computation_dtype(input.dtype)
    x, y = maybe_convert_to_dtype(input, compute), maybe_convert_to_dtype(target, compute)
    # eager's check on values (NaN fails it too), made when the compiled function runs
    emit_runtime_check(reduction_all(clang.bitwise_and(clang.ge(x, 0), clang.le(x, 1))), "RuntimeError",
                       "all elements of input should be between 0 and 1")
    # torch clamps each log at -100, so a 0 or 1 input gives a finite loss
    log_x = clang.maximum(clang.log(x), clang.full((), -100.0, device=x.device, dtype=compute))
    log_1mx = clang.maximum(clang.log1p(clang.neg(x)), clang.full((), -100.0, device=x.device, dtype=compute))
    loss = clang.sub(clang.mul(clang.sub(y, 1.0), log_1mx), clang.mul(y, log_x))
    if weight is not None:
        loss = clang.mul(loss, maybe_convert_to_dtype(weight, compute))
    return _apply_reduction(maybe_convert_to_dtype(loss, input.dtype), reduction)


@torchsymbol(F.binary_cross_entropy_with_logits)  # torch.binary_cross_entropy_with_logits takes an enum reduction
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    check(tuple(target.shape) == tuple(input.shape),
          lambda: f"Target size ({_torch_size(target)}) must be the same as input size ({_torch_size(input)})",
          ValueError)
    # torch's own sequence of ops, each rounding in its dtype:
    # (1 - target) * input - log_weight * logsigmoid(input), log_weight = (pos_weight - 1) * target + 1
    log_sigmoid = logsigmoid(input)
    if pos_weight is not None:
        log_weight = clang.add(clang.mul(clang.sub(pos_weight, 1), target), 1)
        log_sigmoid = clang.mul(log_sigmoid, log_weight)
    loss = clang.sub(clang.mul(rsub(target, 1), input), log_sigmoid)
    if weight is not None:
        loss = clang.mul(loss, weight)
    # torch accumulates in place into a tensor of the target's dtype
    check(dtypes.category(loss.dtype) <= dtypes.category(target.dtype),
          lambda: f"result type {prims.scalar_type_name(loss.dtype)} can't be cast to the desired output type "
                  f"{prims.scalar_type_name(target.dtype)}")
    return _apply_reduction(maybe_convert_to_dtype(loss, target.dtype), reduction)


def _xlogy_self(t):
    """torch.xlogy(t, t): 0 where t is 0, NaN where t is NaN; as torch's kernel, log(t) rounds to t's dtype
    before the product does."""
    out = clang.where(clang.eq(t, 0), 0.0, clang.mul(t, clang.log(t)))
    return clang.where(clang.isnan(t), float("nan"), out)


@torchsymbol(F.kl_div)  # torch.kl_div takes an enum reduction
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    legacy = size_average is not None or reduce is not None
    kernel_reduction = _legacy_reduction(size_average, reduce, reduction) if legacy else \
        ("sum" if reduction == "batchmean" else reduction)
    _check_reduction(kernel_reduction)
    check(dtypes.is_inexact(input.dtype) and dtypes.is_inexact(target.dtype),
          lambda: "kl_div: Integral inputs not supported.")
    # torch's formulas, op by op
    if log_target:
        loss = clang.mul(clang.exp(target), clang.sub(target, input))
    else:
        loss = clang.sub(_xlogy_self(target), clang.mul(target, input))
    out = _apply_reduction(loss, kernel_reduction)
    if reduction == "batchmean" and input.ndim != 0:  # F.kl_div divides by the batch size (even with legacy args)
        out = clang.true_divide(out, input.shape[0])
    return out


@torchsymbol(F.soft_margin_loss)
def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    # torch's ops in place on a tensor of the input's dtype: log1p(exp(-input * target))
    check(dtypes.is_inexact(input.dtype),
          lambda: f"result type Float can't be cast to the desired output type {prims.scalar_type_name(input.dtype)}")
    loss = maybe_convert_to_dtype(clang.mul(clang.neg(input), target), input.dtype)
    return _apply_reduction(clang.log1p(clang.exp(loss)), reduction)


@torchsymbol(F.softmin)
def softmin(input, dim=None, _stacklevel=3, dtype=None):
    return softmax(neg(input), dim, dtype=dtype)  # F.softmin's own definition: (-input).softmax(dim, dtype=dtype)

def _cpp_name(dtype):
    return clang.CPP_TYPE_NAMES.get(dtype, str(dtype))


@torchsymbol(F.scaled_dot_product_attention)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    check(0.0 <= dropout_p <= 1.0,
          lambda: f"dropout probability has to be between 0 and 1, but got {dropout_p}", ValueError)
    if isinstance(query, TensorProxy):
        sdp_state.guard_trace()  # executors lower attention by torch's backend switches (torch/sdp_state.py)
    check(query.ndim >= 2 and key.ndim >= 2 and value.ndim >= 2,
          lambda: f"Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: {query.ndim} "
                  f"key.dim: {key.ndim} and value.dim: {value.ndim} instead.")
    check(query.dtype == key.dtype == value.dtype,
          lambda: "Expected query, key, and value to have the same dtype, but got query.dtype: "
                  f"{_cpp_name(query.dtype)} key.dtype: {_cpp_name(key.dtype)} and value.dtype: "
                  f"{_cpp_name(value.dtype)} instead.")
    check(dtypes.is_float(query.dtype),
          lambda: f"expected scalar type Float but found {clang.scalar_type_name(query.dtype)}")
    check(attn_mask is None or attn_mask.dtype in (torch.bool, torch.float32, query.dtype),
          lambda: f"Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
                  f"{_cpp_name(attn_mask.dtype)} and  query.dtype: {_cpp_name(query.dtype)} instead.")
    L, S, E = query.shape[-2], key.shape[-2], query.shape[-1]
    if enable_gqa and query.ndim >= 3:
        heads = query.shape[-3]
        check(heads % key.shape[-3] == 0 and heads % value.shape[-3] == 0,
              lambda: "Number of heads in key and value must divide the number of heads in ")
        key, value = _repeat_heads(key, heads // key.shape[-3]), _repeat_heads(value, heads // value.shape[-3])
    scale_factor = 1 / torch.sym_sqrt(E) if scale is None else scale  # (math.sqrt would pin a symbolic E)
    compute = dtypes.computation_dtype(query.dtype)
    q, k = maybe_convert_to_dtype(query, compute), maybe_convert_to_dtype(key, compute)
    scores = clang.mul(prims.matmul(q, clang.transpose(k, -2, -1)), scale_factor)
    if is_causal:  # combined with an explicit mask when both are given, as torch does
        rows = clang.unsqueeze(clang.arange(0, L, 1, device=query.device, dtype=torch.int64), 1)
        cols = clang.unsqueeze(clang.arange(0, S, 1, device=query.device, dtype=torch.int64), 0)
        causal = clang.ge(rows, cols)
        if attn_mask is None or attn_mask.dtype is torch.bool:
            attn_mask = causal if attn_mask is None else clang.bitwise_and(attn_mask, causal)
        else:
            attn_mask = clang.where(causal, attn_mask, -float("inf"))
    if attn_mask is not None:
        if attn_mask.dtype is torch.bool:
            scores = clang.where(attn_mask, scores, -float("inf"))
        else:
            scores = clang.add(scores, maybe_convert_to_dtype(attn_mask, scores.dtype))
    probs = _safe_softmax(scores)
    if dropout_p > 0.0:
        # the torch executor runs F.scaled_dot_product_attention itself (eager's draws); this decomposition
        # drops attention weights with dropout's own mask, reproducible under a seed but not eager's draws
        probs = dropout(probs, dropout_p)
    # half-precision inputs: computed in float32 and rounded once (torch's kernels accumulate in float32 too,
    # blockwise, so results agree to rounding)
    return maybe_convert_to_dtype(prims.matmul(probs, maybe_convert_to_dtype(value, compute)), query.dtype)


def _safe_softmax(scores):
    """softmax over the last dim, giving zeros (not nan) on rows where every position is masked out, as torch's
    attention does."""
    if scores.shape[-1] == 0:
        return scores
    last = (scores.ndim - 1,)
    m = keepdim_reshape(prims.amax(scores, last), scores, last)
    m = clang.where(clang.eq(m, -float("inf")), 0.0, m)
    e = clang.exp(clang.sub(scores, m))
    s = keepdim_reshape(prims.sum(e, last), scores, last)
    return clang.where(clang.eq(s, 0.0), 0.0, clang.true_divide(e, s))


def _repeat_heads(t, reps):
    if reps == 1:
        return t
    shape = tuple(t.shape)
    x = clang.unsqueeze(t, -3)  # (..., Hk, 1, S, E)
    x = clang.expand_to(x, shape[:-3] + (shape[-3], reps) + shape[-2:])
    return clang.reshape(x, shape[:-3] + (shape[-3] * reps,) + shape[-2:])


@torchsymbol(F.dropout)
def dropout(input, p=0.5, training=True, inplace=False):
    check(0.0 <= p <= 1.0, lambda: f"dropout probability has to be between 0 and 1, but got {p}", ValueError)
    check(not inplace, lambda: "dropout(inplace=True) mutates its input, which thunderfn does not trace yet; "
                               "use inplace=False", UnsupportedOpError)
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return clang.mul(input, False if input.dtype is torch.bool else 0)  # torch multiplies by zeros: NaN stays NaN
    check(dtypes.is_float(input.dtype),
          lambda: f"result type Float can't be cast to the desired output type {input.dtype}")
    return clang.mul(input, opaque_symbol(dropout_noise)(input, 1.0 - p))


def dropout_noise(like: torch.Tensor, keep: float) -> torch.Tensor:
    """Dropout's scaled keep-mask, drawn exactly as torch's CPU kernel draws it (so the
    decomposition reproduces eager's masks under the same seed)."""
    return torch.empty_like(like).bernoulli_(keep).div_(keep)
