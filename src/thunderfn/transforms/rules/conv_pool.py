"""Rules of the convolution and pooling family: VJP rules that run eager's backward kernels, from what
eager saves.

The forward ops are opaque (torch/conv_pool.py): without a rule, reverse mode would differentiate each
through torch.func when the backward runs, which runs the forward op again before its backward. With
these rules a training step runs the forward once and, backward, the one aten kernel eager autograd
calls (convolution_backward, max_pool2d_with_indices_backward, avg_pool2d_backward, ...), with eager's
arguments, so gradients are eager's bit for bit. convolution_backward computes only the gradients
that are wanted (its output_mask): an input that needs none (a network's images, a missing bias) gets
None, as in eager. 1-d pooling is 2-d pooling over a height of 1 in aten, forward and backward: its
rules call the 2-d kernel on views with that height, as eager's autograd does.

A call a rule does not cover goes through torch.func as before: a tensor passed by keyword (rules
give cotangents by position), complex tensors, and padding="same" that pads one side more than the
other (eager pads the input first; the padded input, which the kernel would read, is not kept).

vmap and jvp do not use these rules: they batch and differentiate the opaque ops through torch.func.
The kernels are opaque too, so a second derivative differentiates them through torch.func (each has
a derivative formula in torch). The rules read which inputs the backward being traced needs gradients
for (define.wants_gradient).
"""
from __future__ import annotations

import math

import thunderfn.torch as ltorch
from thunderfn.core.proxies import TensorProxy
from thunderfn.torch import conv_pool as kernels
from thunderfn.transforms.rules.common import only_input
from thunderfn.transforms.rules.define import defvjp, wants_gradient


def _bound(args, kwargs, params) -> dict:
    """The call's arguments by name, params being torch's ((name, default), ...) in order."""
    return {name: args[i] if i < len(args) else kwargs.get(name, default) for i, (name, default) in enumerate(params)}


def _per_dim(value, dims: int) -> tuple:
    """An int, or a sequence of one int or one per spatial dim, as one per spatial dim (torch expands them so)."""
    if isinstance(value, (tuple, list)):
        return tuple(value) * dims if len(value) == 1 else tuple(value)
    return (value,) * dims


def _covered(*args, **kwargs) -> bool:
    """Whether a rule can give every tensor its cotangent: each tensor is positional (a cotangent per
    positional argument is what rules return) and real (complex autodiff goes through torch.func)."""
    return (not any(isinstance(v, TensorProxy) for v in kwargs.values())
            and all(a.dtype.is_floating_point for a in args if isinstance(a, TensorProxy)))


def _as_2d(t):
    """A 1-d pooling's tensor as aten pools it: a height of 1 before the last dim."""
    return ltorch.unsqueeze(t, -2)


# -- convolution -------------------------------------------------------------------------------------
_CONVOLUTION = (("input", None), ("weight", None), ("bias", None), ("stride", 1), ("padding", 0), ("dilation", 1),
                ("groups", 1))
_TRANSPOSED = (("input", None), ("weight", None), ("bias", None), ("stride", 1), ("padding", 0),
               ("output_padding", 0), ("groups", 1), ("dilation", 1))


def _padding(padding, weight, dilation, dims: int):
    """The padding of each spatial dim as convolution applies it, or None for padding="same" that pads one side
    more (an odd dilation * (kernel - 1)), which eager computes by padding the input first."""
    if padding == "valid":
        return (0,) * dims
    if padding == "same":
        totals = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
        return None if any(t % 2 for t in totals) else tuple(t // 2 for t in totals)
    return _per_dim(padding, dims)


def _convolution_rule(dims: int, transposed: bool):
    params = _TRANSPOSED if transposed else _CONVOLUTION

    def applies(*args, **kwargs):
        a = _bound(args, kwargs, params)
        return _covered(*args, **kwargs) and _padding(a["padding"], a["weight"], _per_dim(a["dilation"], dims),
                                                      dims) is not None

    def bwd(call, g):
        """convolution_backward with eager's arguments: an unbatched input is convolved as a batch of one."""
        a = _bound(call.args, call.kwargs, params)
        x, w, b = a["input"], a["weight"], a["bias"]
        mask = [wants_gradient(x), wants_gradient(w), b is not None and wants_gradient(b)]
        if not any(mask):
            return (None,) * len(call.args)
        dilation = _per_dim(a["dilation"], dims)
        unbatched = x.ndim == dims + 1
        dx, dw, db = kernels.convolution_backward(
            ltorch.unsqueeze(g, 0) if unbatched else g, ltorch.unsqueeze(x, 0) if unbatched else x, w,
            None if b is None else list(b.shape), _per_dim(a["stride"], dims),
            _padding(a["padding"], w, dilation, dims), dilation, transposed, _per_dim(a.get("output_padding", 0), dims),
            a["groups"], mask)
        if unbatched and dx is not None:
            dx = ltorch.squeeze(dx, 0)
        return ((dx, dw, db) + (None,) * len(call.args))[:len(call.args)]

    return applies, bwd


for _dims in (1, 2, 3):
    for _table, _transposed in ((kernels.convolutions, False), (kernels.transposed_convolutions, True)):
        _applies, _bwd = _convolution_rule(_dims, _transposed)
        defvjp(_table[_dims].id, applies=_applies)(_bwd)


# -- pooling -------------------------------------------------------------------------------------------
_MAX_POOL = (("input", None), ("kernel_size", None), ("stride", None), ("padding", 0), ("dilation", 1),
             ("ceil_mode", False))
_AVG_POOL = (("input", None), ("kernel_size", None), ("stride", None), ("padding", 0), ("ceil_mode", False),
             ("count_include_pad", True), ("divisor_override", None))


def _window(a, dims: int) -> tuple:
    """(kernel, stride, padding) per spatial dim; no stride (None, or torch's []) means the kernel's."""
    kernel = _per_dim(a["kernel_size"], dims)
    stride = a["stride"]
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) else _per_dim(stride, dims)
    return kernel, stride, _per_dim(a["padding"], dims)


def _max_pool_rule(dims: int):
    def bwd(call, g):
        """max_pool{2,3}d_with_indices_backward, from the indices the forward returned."""
        a = _bound(call.args, call.kwargs, _MAX_POOL)
        x, (_, indices), g = a["input"], call.out, g[0]
        kernel, stride, padding = _window(a, dims)
        dilation, ceil_mode = _per_dim(a["dilation"], dims), a["ceil_mode"]
        if dims == 1:
            dx = kernels.max_pool2d_with_indices_backward(_as_2d(g), _as_2d(x), (1,) + kernel, (1,) + stride,
                                                          (0,) + padding, (1,) + dilation, ceil_mode, _as_2d(indices))
            return only_input(call, ltorch.squeeze(dx, -2))
        kernel_of = {2: kernels.max_pool2d_with_indices_backward, 3: kernels.max_pool3d_with_indices_backward}[dims]
        return only_input(call, kernel_of(g, x, kernel, stride, padding, dilation, ceil_mode, indices))

    return bwd


def _avg_pool_rule(dims: int):
    def bwd(call, g):
        a = _bound(call.args, call.kwargs, _AVG_POOL)
        x = a["input"]
        kernel, stride, padding = _window(a, dims)
        ceil_mode, count_include_pad = a["ceil_mode"], a["count_include_pad"]
        if dims == 1:  # (avg_pool1d has no divisor_override)
            dx = kernels.avg_pool2d_backward(_as_2d(g), _as_2d(x), (1,) + kernel, (1,) + stride, (0,) + padding,
                                             ceil_mode, count_include_pad, None)
            return only_input(call, ltorch.squeeze(dx, -2))
        kernel_of = {2: kernels.avg_pool2d_backward, 3: kernels.avg_pool3d_backward}[dims]
        return only_input(call, kernel_of(g, x, kernel, stride, padding, ceil_mode, count_include_pad,
                                          a["divisor_override"]))

    return bwd


def _adaptive_avg_pool_rule(dims: int):
    def bwd(call, g):
        """To a single output per channel aten computes a mean, whose backward spreads g evenly (expand, then
        divide, as eager's does); otherwise _adaptive_avg_pool{2,3}d_backward."""
        x = call.args[0]
        if all(s == 1 for s in call.out.shape[-dims:]):
            return only_input(call, ltorch.div(ltorch.expand(g, tuple(x.shape)), math.prod(x.shape[-dims:])))
        if dims == 1:
            return only_input(call, ltorch.squeeze(kernels.adaptive_avg_pool2d_backward(_as_2d(g), _as_2d(x)), -2))
        kernel_of = {2: kernels.adaptive_avg_pool2d_backward, 3: kernels.adaptive_avg_pool3d_backward}[dims]
        return only_input(call, kernel_of(g, x))

    return bwd


def _adaptive_max_pool_rule(dims: int):
    def bwd(call, g):
        x, (_, indices), g = call.args[0], call.out, g[0]
        if dims == 1:
            dx = kernels.adaptive_max_pool2d_backward(_as_2d(g), _as_2d(x), _as_2d(indices))
            return only_input(call, ltorch.squeeze(dx, -2))
        kernel_of = {2: kernels.adaptive_max_pool2d_backward, 3: kernels.adaptive_max_pool3d_backward}[dims]
        return only_input(call, kernel_of(g, x, indices))

    return bwd


for _dims in (1, 2, 3):
    defvjp(kernels.max_pool_with_indices[_dims].id, applies=_covered)(_max_pool_rule(_dims))
    defvjp(kernels.avg_pools[_dims].id, applies=_covered)(_avg_pool_rule(_dims))
    defvjp(*[table[_dims].id for table in (kernels.adaptive_avg_pools, kernels.autocast_adaptive_avg_pools)
             if _dims in table], applies=_covered)(_adaptive_avg_pool_rule(_dims))
    defvjp(kernels.adaptive_max_pool_with_indices[_dims].id, applies=_covered)(_adaptive_max_pool_rule(_dims))
