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
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import check
from thunderfn.torch import torchsymbol

T = torch.Tensor
__all__ = ["getitem", "index_select", "gather", "take_along_dim"]


def _normalize_key(a, key) -> list:
    if not isinstance(key, tuple):
        key = (key,)
    key = list(key)
    for k in key:
        if isinstance(k, TensorProxy) and k.dtype is torch.bool:
            raise UnsupportedOpError(
                "indexing with a boolean mask gives a shape that depends on the mask's values, which thunderfn "
                "cannot trace; use torch.where(mask, x, other) or multiply by the mask instead")
        check(k is None or k is Ellipsis or isinstance(k, (int, slice, TensorProxy)) and not isinstance(k, bool),
              lambda: "only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are valid indices "
                      f"(got {type(k).__name__})", IndexError)
        if isinstance(k, TensorProxy):
            check(k.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8),
                  lambda: "tensors used as indices must be long, int, byte or bool tensors", IndexError)
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    check(consumed <= a.ndim, lambda: f"too many indices for tensor of dimension {a.ndim}", IndexError)
    ellipses = [i for i, k in enumerate(key) if k is Ellipsis]
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
        if k is None or isinstance(k, TensorProxy):
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
    # Positions of the remaining entries (None adds a dim, int removed one, tensors stay).
    remaining = [k for k in key if not isinstance(k, int)]
    if squeeze_dims:
        out = prims.squeeze(out, tuple(squeeze_dims))
    if any(k is None for k in remaining):
        shape, src = [], iter(out.shape)
        for k in remaining:
            shape.append(1 if k is None else next(src))
        out = clang.reshape(out, tuple(shape))
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
    index_shape = clang.broadcast_shapes(*(i.shape for i in indices))
    linear = None
    for idx, size, d in zip(indices, sizes, dims):
        idx = maybe_convert_to_dtype(idx, torch.int64)
        idx = clang.where(clang.lt(idx, 0), clang.add(idx, size), idx)  # negative indices count from the end
        stride = 1
        for later in sizes[dims.index(d) + 1:]:
            stride *= later
        term = clang.mul(idx, stride) if stride != 1 else idx
        linear = term if linear is None else clang.add(linear, term)
    linear = clang.expand_to(linear, index_shape)
    merged = torch.Size(sizes).numel()
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
    shape = list(clang.broadcast_shapes(a.shape, indices.shape))
    d = prims.canonical_dim(dim, a.ndim)
    a_shape, i_shape = list(shape), list(shape)
    a_shape[d], i_shape[d] = a.shape[d], indices.shape[d]
    return prims.take_along_axis(clang.expand_to(a, a_shape), clang.expand_to(indices, i_shape), d)
