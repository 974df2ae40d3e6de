"""Convolution and pooling: torch's own kernels, forward and backward.

None of these has a decomposition: convolution and pooling run as opaque torch ops (torch/opaque.py),
which vmap and jvp batch and differentiate through torch.func. Reverse mode has rules for them
(transforms/rules/conv_pool.py), so that a training step runs what eager autograd runs: the forward
op once, then one of torch's backward kernels below (convolution_backward, ...), reading what eager
saves. The kernels are opaque ops too; a second derivative differentiates them through torch.func
(each has a derivative formula in torch).

Max pooling's backward reads where the maxima were, which F.max_pool2d does not return: its symbol
computes them with F.max_pool2d_with_indices (the op eager's max_pool2d calls when its input requires
grad), so a forward that a backward follows keeps the indices; without gradients the torch executor
runs the symbol whole, as F.max_pool2d.

May import: core/, prims, torch/opaque.py, torch/base.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from thunderfn.core.interception import register_handler
from thunderfn.torch.base import torchsymbol
from thunderfn.torch.opaque import aten_kernel, mark_traceable, opaque_symbol

aten = torch.ops.aten
__all__ = ["convolution_backward", "max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
           "avg_pool2d_backward", "avg_pool3d_backward", "adaptive_avg_pool2d_backward", "adaptive_avg_pool3d_backward",
           "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward", "max_pool1d", "max_pool2d", "max_pool3d",
           "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"]


# -- the backward kernels: each prints as aten_<op>(...) --------------------------------------------
def _kernel(op):
    """op as an opaque op, which a traced call of op itself reaches too."""
    sym = aten_kernel(op)
    register_handler(op, sym)
    return sym


convolution_backward = _kernel(aten.convolution_backward.default)
max_pool2d_with_indices_backward = _kernel(aten.max_pool2d_with_indices_backward.default)
max_pool3d_with_indices_backward = _kernel(aten.max_pool3d_with_indices_backward.default)
avg_pool2d_backward = _kernel(aten.avg_pool2d_backward.default)
avg_pool3d_backward = _kernel(aten.avg_pool3d_backward.default)
adaptive_avg_pool2d_backward = _kernel(aten._adaptive_avg_pool2d_backward.default)
adaptive_avg_pool3d_backward = _kernel(aten._adaptive_avg_pool3d_backward.default)
adaptive_max_pool2d_backward = _kernel(aten.adaptive_max_pool2d_backward.default)
adaptive_max_pool3d_backward = _kernel(aten.adaptive_max_pool3d_backward.default)

# -- the forward ops that run as they are (opaque), by number of spatial dims ------------------------
convolutions = {1: opaque_symbol(torch.conv1d), 2: opaque_symbol(torch.conv2d), 3: opaque_symbol(torch.conv3d)}
transposed_convolutions = {1: opaque_symbol(torch.conv_transpose1d), 2: opaque_symbol(torch.conv_transpose2d),
                           3: opaque_symbol(torch.conv_transpose3d)}
avg_pools = {1: opaque_symbol(F.avg_pool1d), 2: opaque_symbol(F.avg_pool2d), 3: opaque_symbol(F.avg_pool3d)}
adaptive_avg_pools = {1: opaque_symbol(F.adaptive_avg_pool1d), 2: opaque_symbol(F.adaptive_avg_pool2d),
                      3: opaque_symbol(F.adaptive_avg_pool3d)}
# Under torch.autocast tracing runs F.adaptive_avg_pool2d's Python body (torch/autocast.py): what it records is the
# torch._C._nn function the body calls, with the output size completed.
autocast_adaptive_avg_pools = {2: opaque_symbol(torch._C._nn.adaptive_avg_pool2d),
                               3: opaque_symbol(torch._C._nn.adaptive_avg_pool3d)}

# -- max pooling: the forward computes the indices its backward reads --------------------------------
# (opaque ops: torch runs them, and they return (values, indices) whatever return_indices says)
max_pool_with_indices = {1: opaque_symbol(F.max_pool1d_with_indices), 2: opaque_symbol(F.max_pool2d_with_indices),
                         3: opaque_symbol(F.max_pool3d_with_indices)}
adaptive_max_pool_with_indices = {1: opaque_symbol(F.adaptive_max_pool1d_with_indices),
                                  2: opaque_symbol(F.adaptive_max_pool2d_with_indices),
                                  3: opaque_symbol(F.adaptive_max_pool3d_with_indices)}

# Each of these is one torch call without effects, which a compiler that traces torch code can call
# inside a compiled graph (Inductor makes convolution and pooling its extern kernels, as under
# torch.compile): fusion regions take them in instead of ending at every convolution (executors/fusion.py).
for _sym in (convolution_backward, max_pool2d_with_indices_backward, max_pool3d_with_indices_backward,
             avg_pool2d_backward, avg_pool3d_backward, adaptive_avg_pool2d_backward, adaptive_avg_pool3d_backward,
             adaptive_max_pool2d_backward, adaptive_max_pool3d_backward, *convolutions.values(),
             *transposed_convolutions.values(), *avg_pools.values(), *adaptive_avg_pools.values(),
             *autocast_adaptive_avg_pools.values(), *max_pool_with_indices.values(),
             *adaptive_max_pool_with_indices.values()):
    mark_traceable(_sym)


def _max_pool(dims, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    values, indices = max_pool_with_indices[dims](input, kernel_size, stride, padding, dilation, ceil_mode)
    return (values, indices) if return_indices else values


@torchsymbol(F.max_pool1d, torch.max_pool1d)
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@torchsymbol(F.max_pool2d, torch.max_pool2d)
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@torchsymbol(F.max_pool3d, torch.max_pool3d)
def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def _adaptive_max_pool(dims, input, output_size, return_indices):
    values, indices = adaptive_max_pool_with_indices[dims](input, output_size)
    return (values, indices) if return_indices else values


@torchsymbol(F.adaptive_max_pool1d)
def adaptive_max_pool1d(input, output_size, return_indices=False):
    return _adaptive_max_pool(1, input, output_size, return_indices)


@torchsymbol(F.adaptive_max_pool2d)
def adaptive_max_pool2d(input, output_size, return_indices=False):
    return _adaptive_max_pool(2, input, output_size, return_indices)


@torchsymbol(F.adaptive_max_pool3d)
def adaptive_max_pool3d(input, output_size, return_indices=False):
    return _adaptive_max_pool(3, input, output_size, return_indices)
