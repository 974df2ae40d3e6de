"""Tensor factories: zeros, ones, full, empty, arange and their *_like forms.

They are traced (not run at trace time) so that a created tensor follows the call's
device and default dtype. Random factories arrive with randomness support; until
then they are refused rather than frozen into a constant.
"""
from __future__ import annotations

import math
import numbers

import torch

from thunderfn import clang
from thunderfn.clang import maybe_convert_to_dtype
from thunderfn.core import dtypes, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import check
from thunderfn.torch.base import torchsymbol
from thunderfn.torch.shape import detach

T = torch.Tensor
__all__ = ["full", "zeros", "ones", "empty", "full_like", "zeros_like", "ones_like", "empty_like", "arange",
           "scalar_tensor", "new_zeros", "new_ones", "new_full", "new_empty"]


def _device(device):
    if device is None:
        return torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")
    return torch.device(device)


def _size(size: tuple, name: str) -> tuple:
    """`f(2, 3)`, `f((2, 3))` and `f([2, 3])` all mean size (2, 3); checked as torch checks it."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    for s in size:
        check(symbolic.is_int(s),
              lambda: f"{name}(): argument 'size' must be tuple of ints, but found element of type {type(s).__name__}",
              TypeError)
    check(all(s >= 0 for s in size), lambda: "zeros: Dimension size must be non-negative." if name == "zeros"
          else f"Trying to create tensor with negative dimension {min(size)}: {list(size)}")
    return tuple(size)


def _check_unsupported(layout=None, out=None):
    check(layout in (None, torch.strided), lambda: f"thunderfn supports strided tensors only, got layout={layout}",
          UnsupportedOpError)
    check(out is None, lambda: "out= writes in place; thunderfn does not trace out= arguments (use the result instead)",
          UnsupportedOpError)


def _fill_dtype(fill_value):
    """The dtype torch.full infers: a Python number's, or a 0-dim tensor's read as a number."""
    if isinstance(fill_value, TensorProxy):
        return dtypes.scalar_dtype({0: True, 1: 0, 2: 0.0}.get(dtypes.category(fill_value.dtype), 0j))
    return dtypes.scalar_dtype(fill_value)


def _filled(size, fill_value, *, device, dtype):
    """A tensor of shape size holding fill_value: a number, or a 0-dim tensor (expanded).

    A tensor fill is a constant, as in torch: full, full_like, new_full and scalar_tensor take their
    fill as a Scalar, so torch reads a tensor's value as a number and no derivative flows through it
    (torch.func.jvp's tangent is zero; torch.autograd refuses a fill that requires grad). Detached
    here, it gets a zero tangent in forward mode and a zero gradient in reverse mode, which keeps
    <vjp(ct), t> == <ct, jvp(t)>. (torch.fill and Tensor.fill_ take a Tensor, and differentiate it.)"""
    if isinstance(fill_value, TensorProxy):
        check(fill_value.ndim == 0,
              lambda: "full(): argument 'fill_value' (position 2) must be Number, not Tensor", TypeError)
        return clang.expand_to(maybe_convert_to_dtype(detach(fill_value), dtype), size)
    return clang.full(size, fill_value, device=device, dtype=dtype)


@torchsymbol(torch.full)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, out=None):
    _check_unsupported(layout, out)
    return _filled(_size((size,), "full"), fill_value, device=_device(device), dtype=dtype or _fill_dtype(fill_value))


def _constant_factory(value, name):
    def factory(*size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, out=None,
                memory_format=None):
        _check_unsupported(layout, out)
        return clang.full(_size(size, name), value, device=_device(device),
                          dtype=dtype or torch.get_default_dtype())

    return factory


zeros = torchsymbol(torch.zeros, name="zeros")(_constant_factory(0, "zeros"))
ones = torchsymbol(torch.ones, name="ones")(_constant_factory(1, "ones"))
# empty's contents are unspecified; zeros are a valid choice and keep results deterministic
empty = torchsymbol(torch.empty, name="empty")(_constant_factory(0, "empty"))


def _like_factory(value):
    def factory(a, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, memory_format=None):
        _check_unsupported(layout)
        return clang.full(a.shape, value, device=_device(device) if device is not None else a.device,
                          dtype=dtype or a.dtype)

    return factory


zeros_like = torchsymbol(torch.zeros_like, name="zeros_like")(_like_factory(0))
ones_like = torchsymbol(torch.ones_like, name="ones_like")(_like_factory(1))
empty_like = torchsymbol(torch.empty_like, name="empty_like")(_like_factory(0))


@torchsymbol(torch.full_like)
def full_like(a, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False,
              memory_format=None):
    _check_unsupported(layout)
    return _filled(a.shape, fill_value, device=_device(device) if device is not None else a.device,
                   dtype=dtype or a.dtype)


def _new_factory(value, name):
    def factory(a, *size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
        _check_unsupported(layout)
        return clang.full(_size(size, name), value, device=_device(device) if device is not None else a.device,
                          dtype=dtype or a.dtype)

    return factory


new_zeros = torchsymbol(T.new_zeros, name="new_zeros")(_new_factory(0, "new_zeros"))
new_ones = torchsymbol(T.new_ones, name="new_ones")(_new_factory(1, "new_ones"))
new_empty = torchsymbol(T.new_empty, name="new_empty")(_new_factory(0, "new_empty"))


@torchsymbol(T.new_full)
def new_full(a, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    _check_unsupported(layout)
    return _filled(_size((size,), "new_full"), fill_value, device=_device(device) if device is not None else a.device,
                   dtype=dtype or a.dtype)


@torchsymbol(torch.scalar_tensor)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    _check_unsupported(layout)
    return _filled((), s, device=_device(device), dtype=dtype or torch.get_default_dtype())


@torchsymbol(torch.arange)
def arange(start, end=None, step=1, *, out=None, dtype=None, layout=None, device=None, pin_memory=False,
           requires_grad=False):
    _check_unsupported(layout, out)
    if end is None:
        start, end = 0, start
    # a float computed from a symbolic size (x.shape[-1] / 2) is specialized: the length's rounding is the
    # number's, and guarding its exact value keeps it right for every call the entry takes
    start, end, step = (float(v) if isinstance(v, torch.SymFloat) else v for v in (start, end, step))
    for v in (start, end, step):
        if isinstance(v, TensorProxy):
            raise UnsupportedOpError("arange() with tensor bounds has a length that depends on their values, which "
                                     "thunderfn cannot trace; pass Python numbers (shapes such as "
                                     "x.shape[0] are numbers)")
        check(isinstance(v, (numbers.Real, torch.SymInt)),
              lambda: f"arange(): argument 'end' must be Number, not {type(v).__name__}", TypeError)
    integral = all(isinstance(v, (numbers.Integral, torch.SymInt)) for v in (start, end, step))
    if dtype is None:
        dtype = torch.int64 if integral else torch.get_default_dtype()
    check(dtype is not torch.bool, lambda: "\"arange_cpu\" not implemented for 'Bool'", NotImplementedError)
    check(integral or math.isfinite(start) and math.isfinite(end), lambda: f"unsupported range: {start} -> {end}")
    if not dtypes.is_inexact(dtype):
        # torch truncates fractional bounds for integer dtypes but sizes the result differently per dtype
        check(integral, lambda: f"arange() with integer dtype {dtype} and fractional start, end or step rounds them in "
                                "ways torch does not agree on across integer dtypes; thunderfn "
                                f"refuses rather than guess. Pass integers (int(end)) or a floating dtype",
              UnsupportedOpError)
    return clang.arange(start, end, step, device=_device(device), dtype=dtype)
