"""Tensor factories: zeros, ones, full, empty, arange and their *_like forms.

They are traced (not run at trace time) so that a created tensor follows the call's
device and default dtype. Random factories arrive with randomness support; until
then they are refused rather than frozen into a constant.
"""
from __future__ import annotations

import numbers

import torch

from thunderfn import clang
from thunderfn.core import dtypes
from thunderfn.prims import check
from thunderfn.torch import torchsymbol

T = torch.Tensor
__all__ = ["full", "zeros", "ones", "empty", "full_like", "zeros_like", "ones_like", "empty_like", "arange",
           "scalar_tensor", "new_zeros", "new_ones", "new_full", "new_empty"]


def _device(device):
    if device is None:
        return torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")
    return torch.device(device)


def _size(size) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    for s in size:
        check(isinstance(s, int) and not isinstance(s, bool),
              lambda: f"full(): argument 'size' must be tuple of ints, but found element of type {type(s).__name__}", TypeError)
    return tuple(size)


def _check_unsupported(layout=None, pin_memory=False, **_):
    check(layout in (None, torch.strided), lambda: f"thunderfn supports strided tensors only, got layout={layout}", NotImplementedError)


@torchsymbol(torch.full)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, out=None):
    _check_unsupported(layout)
    check(out is None, lambda: "full(out=...) writes in place; thunderfn does not trace out= arguments", NotImplementedError)
    dtype = dtype or (dtypes.scalar_dtype(fill_value) if isinstance(fill_value, numbers.Number) else torch.get_default_dtype())
    return clang.full(_size((size,)), fill_value, device=_device(device), dtype=dtype)


def _constant_factory(value):
    def factory(*size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, out=None, memory_format=None):
        _check_unsupported(layout)
        check(out is None, lambda: "out= writes in place; thunderfn does not trace out= arguments", NotImplementedError)
        return clang.full(_size(size), value, device=_device(device), dtype=dtype or torch.get_default_dtype())

    return factory


zeros = torchsymbol(torch.zeros, name="zeros")(_constant_factory(0))
ones = torchsymbol(torch.ones, name="ones")(_constant_factory(1))
# empty's contents are unspecified; zeros are a valid choice and keep results deterministic
empty = torchsymbol(torch.empty, name="empty")(_constant_factory(0))


def _like_factory(value):
    def factory(a, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, memory_format=None):
        _check_unsupported(layout)
        return clang.full(a.shape, value, device=_device(device) if device is not None else a.device, dtype=dtype or a.dtype)

    return factory


zeros_like = torchsymbol(torch.zeros_like, name="zeros_like")(_like_factory(0))
ones_like = torchsymbol(torch.ones_like, name="ones_like")(_like_factory(1))
empty_like = torchsymbol(torch.empty_like, name="empty_like")(_like_factory(0))


@torchsymbol(torch.full_like)
def full_like(a, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, memory_format=None):
    _check_unsupported(layout)
    return clang.full(a.shape, fill_value, device=_device(device) if device is not None else a.device, dtype=dtype or a.dtype)


def _new_factory(value):
    def factory(a, *size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
        return clang.full(_size(size), value, device=_device(device) if device is not None else a.device, dtype=dtype or a.dtype)

    return factory


new_zeros = torchsymbol(T.new_zeros, name="new_zeros")(_new_factory(0))
new_ones = torchsymbol(T.new_ones, name="new_ones")(_new_factory(1))
new_empty = torchsymbol(T.new_empty, name="new_empty")(_new_factory(0))


@torchsymbol(T.new_full)
def new_full(a, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    return clang.full(_size((size,)), fill_value, device=_device(device) if device is not None else a.device, dtype=dtype or a.dtype)


@torchsymbol(torch.scalar_tensor)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    return clang.full((), s, device=_device(device), dtype=dtype or torch.get_default_dtype())


@torchsymbol(torch.arange)
def arange(start, end=None, step=1, *, out=None, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    _check_unsupported(layout)
    if end is None:
        start, end = 0, start
    for v in (start, end, step):
        check(isinstance(v, numbers.Number), lambda: f"arange(): expected Python numbers, got {type(v).__name__} "
                                                     f"(tensor bounds depend on values; pass numbers)", TypeError)
    if dtype is None:
        dtype = torch.int64 if all(isinstance(v, numbers.Integral) for v in (start, end, step)) else torch.get_default_dtype()
    return clang.arange(start, end, step, device=_device(device), dtype=dtype)
