"""Indexing: `x[...]` with ints, slices, None, Ellipsis and integer tensors.

Basic indexing becomes one slice, one squeeze and one reshape; integer-tensor
indices (advanced indexing, with torch's placement rules) become one index_select
on the indexed dims merged into one. Boolean masks have data-dependent shapes and
are refused with a pointer to torch.where.
"""
from __future__ import annotations

import torch

from thunderfn import clang, prims
from thunderfn.clang import maybe_convert_to_dtype
from thunderfn.core import context
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import check
from thunderfn.torch import torchsymbol

T = torch.Tensor
__all__ = ["getitem", "index_select", "gather", "take_along_dim"]


_INDEX_DTYPES = (torch.int64, torch.int32)
_MASK_MESSAGE = ("indexing with a boolean mask gives a shape that depends on the mask's values, which thunderfn "
                 "cannot trace; use torch.where(mask, x, other) or multiply by the mask instead")


class _BoolScalarIndex:
    """x[True] / x[False]: torch inserts a dim of size 1 and indexes it with the tensor [0]
    (True) or [] (False), an advanced index that takes part in torch's placement rules."""

    def __init__(self, keep: bool):
        self.keep = keep


def _sequence_is_tuple(key: list) -> bool:
    """torch's legacy rule: a list holding sequences, slices, None, ... or tensors means a tuple."""
    return len(key) < 32 and any(isinstance(k, (list, tuple, slice, TensorProxy)) or k is None or k is Ellipsis for k in key)


def _list_index(k: list) -> TensorProxy:
    """A list of ints indexes like the tensor torch.tensor(k) would (a constant of the trace)."""
    with torch._C.DisableTorchFunction():
        t = torch.tensor(k)
    if t.numel() == 0:
        t = t.long()
    return context.current_trace().constant(t)


def _normalize_key(a, key) -> list:
    if isinstance(key, list) and _sequence_is_tuple(key):
        key = tuple(key)
    if not isinstance(key, tuple):
        key = (key,)
    key = [_list_index(k) if isinstance(k, list) else _BoolScalarIndex(k) if isinstance(k, bool) else k for k in key]
    for k in key:
        if isinstance(k, TensorProxy) and k.dtype in (torch.bool, torch.uint8):  # torch reads uint8 indices as masks
            raise UnsupportedOpError(_MASK_MESSAGE)
        check(k is None or k is Ellipsis or isinstance(k, (int, slice, TensorProxy, _BoolScalarIndex)),
              lambda: "only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are valid indices "
                      f"(got {type(k).__name__})", IndexError)
        if isinstance(k, TensorProxy):
            check(k.dtype in _INDEX_DTYPES, lambda: "tensors used as indices must be long, int, byte or bool tensors", IndexError)
        if isinstance(k, slice):
            check(k.step != 0, lambda: "slice step cannot be zero", ValueError)
    consumed = sum(1 for k in key if isinstance(k, (int, slice, TensorProxy)))
    check(a.ndim > 0 or not any(isinstance(k, int) for k in key),
          lambda: "invalid index of a 0-dim tensor. Use `tensor.item()` in Python or `tensor.item<T>()` in C++ to convert "
                  "a 0-dim tensor to a number", IndexError)
    check(consumed <= a.ndim, lambda: f"too many indices for tensor of dimension {a.ndim}", IndexError)
    ellipses = [i for i, k in enumerate(key) if k is Ellipsis]
    # torch accepts some keys with several ellipses with surprising results; refusing is clearer
    check(len(ellipses) <= 1, lambda: "an index can only have a single ellipsis ('...')", IndexError)
    fill = [slice(None)] * (a.ndim - consumed)
    if ellipses:
        i = ellipses[0]
        return key[:i] + fill + key[i + 1:]
    return key + fill


@torchsymbol(T.__getitem__)
def getitem(a, key):
    key = _normalize_key(a, key)
    starts, stops, steps, squeeze_dims = [], [], [], []
    dim = 0
    for k in key:
        if k is None or isinstance(k, _BoolScalarIndex):
            continue
        if isinstance(k, TensorProxy):
            starts.append(0), stops.append(a.shape[dim]), steps.append(1)
            dim += 1
            continue
        n = a.shape[dim]
        if isinstance(k, int):
            check(-n <= k < n, lambda: f"index {k} is out of bounds for dimension {dim} with size {n}", IndexError)
            k = k % n
            starts.append(k), stops.append(k + 1), steps.append(1)
            squeeze_dims.append(dim)
        else:
            check(k.step is None or k.step > 0, lambda: "step must be greater than zero", ValueError)
            start, stop, step = k.indices(n)
            stop = max(start, stop)
            starts.append(start), stops.append(stop), steps.append(step)
        dim += 1
    out = a
    if a.ndim and (any(starts) or list(stops) != list(a.shape) or any(s != 1 for s in steps)):
        out = prims.slice(a, tuple(starts), tuple(stops), tuple(steps))
    # Positions of the remaining entries (None and bools add a dim, ints removed one, tensors stay).
    remaining = [k for k in key if not isinstance(k, int)]
    if squeeze_dims:
        out = prims.squeeze(out, tuple(squeeze_dims))
    if any(k is None or isinstance(k, _BoolScalarIndex) for k in remaining):
        shape, src = [], iter(out.shape)
        for k in remaining:
            shape.append(1 if k is None or isinstance(k, _BoolScalarIndex) else next(src))
        out = clang.reshape(out, tuple(shape))
    remaining = [clang.full((int(k.keep),), 0, device=a.device, dtype=torch.int64) if isinstance(k, _BoolScalarIndex) else k
                 for k in remaining]
    tensor_dims = [i for i, k in enumerate(remaining) if isinstance(k, TensorProxy)]
    if tensor_dims:
        out = _advanced_index(out, [remaining[i] for i in tensor_dims], tensor_dims)
    return out


def _advanced_index(a, indices, dims):
    """torch's rule: adjacent index tensors put the broadcast index shape where they
    stood; separated ones put it first."""
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if not adjacent:
        a = clang.permute(a, tuple(dims) + tuple(d for d in range(a.ndim) if d not in dims))
        dims = list(range(len(dims)))
    first = dims[0]
    sizes = [a.shape[d] for d in dims]
    try:
        index_shape = clang.broadcast_shapes(*(i.shape for i in indices))
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(str(list(i.shape)) for i in indices)) from None
    linear = in_range = None
    merged = torch.Size(sizes).numel()
    for idx, size, d in zip(indices, sizes, dims):
        idx = maybe_convert_to_dtype(idx, torch.int64)
        idx = clang.where(clang.lt(idx, 0), clang.add(idx, size), idx)  # negative indices count from the end
        if len(indices) > 1:
            ok = clang.bitwise_and(clang.ge(idx, 0), clang.lt(idx, size))
            in_range = ok if in_range is None else clang.bitwise_and(in_range, ok)
        stride = 1
        for later in sizes[dims.index(d) + 1:]:
            stride *= later
        term = clang.mul(idx, stride) if stride != 1 else idx
        linear = term if linear is None else clang.add(linear, term)
    if in_range is not None:
        # An index out of range in one dim could land in range of the merged dim (a wrong answer);
        # send it past the end instead, so the take raises IndexError as torch does.
        linear = clang.where(in_range, linear, merged)
    linear = clang.expand_to(linear, index_shape)
    shape = tuple(a.shape)
    flat = clang.reshape(a, shape[:first] + (merged,) + shape[first + len(dims):])
    picked = prims.take(flat, clang.reshape(linear, (linear.numel(),)), first)
    return clang.reshape(picked, shape[:first] + tuple(index_shape) + shape[first + len(dims):])


@torchsymbol(torch.index_select, T.index_select)
def index_select(a, dim, index):
    check(index.ndim <= 1, lambda: "index_select(): Index is supposed to be a vector", IndexError)
    return prims.take(a, index, dim)


@torchsymbol(torch.gather, T.gather)
def gather(a, dim, index, *, sparse_grad=False):
    return prims.take_along_axis(a, index, dim)


@torchsymbol(torch.take_along_dim, T.take_along_dim)
def take_along_dim(a, indices, dim=None):
    if dim is None:
        return prims.take_along_axis(clang.reshape(a, (-1,)), clang.reshape(indices, (-1,)), 0)
    check(indices.dtype is torch.int64,
          lambda: f"torch.take_along_dim(): dtype of indices should be Long but got {clang.LEGACY_TYPE_NAMES[indices.dtype][:-len('Tensor')]}")
    check(a.ndim == indices.ndim, lambda: f"torch.take_along_dim(): input and indices should have the same number of dimensions, "
                                          f"but got {a.ndim} dimensions for input, and {indices.ndim} dimensions for indices")
    check(a.ndim > 0, lambda: f"Dimension specified as {dim} but tensor has no dimensions", IndexError)
    d = prims.canonical_dim(dim, a.ndim)
    # every dim but `dim` broadcasts
    others = clang.broadcast_shapes(*(tuple(1 if i == d else s for i, s in enumerate(t.shape)) for t in (a, indices)))
    a_shape, i_shape = list(others), list(others)
    a_shape[d], i_shape[d] = a.shape[d], indices.shape[d]
    return prims.take_along_axis(clang.expand_to(a, a_shape), clang.expand_to(indices, i_shape), d)
