"""Indexing: `x[...]` with ints, slices, None, Ellipsis, integer tensors and boolean masks.

Basic indexing becomes one slice, one squeeze and one reshape; integer-tensor
indices (advanced indexing, with torch's placement rules) become one index_select
on the indexed dims merged into one. A boolean mask is read as torch reads it: the
index tensors of its True positions (prims.nonzero), one per dimension it covers,
whose length is a data-dependent size (core/symbolic.py); nonzero, argwhere and
masked_select are the same positions.

The functional writes (scatter, index_add/copy/fill, masked_fill, index_put, put)
are one prims.scatter or prims.scatter_add each, or a where when the positions
are a mask; `index_put_key` is `a[key] = value` for any key getitem reads.
"""
from __future__ import annotations

import itertools

import torch

from thunderfn import clang, prims
from thunderfn.clang import maybe_convert_to_dtype
from thunderfn.core import context, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.symbol import DecompositionUnavailable
from thunderfn.errors import ArgumentIndexError, ArgumentRuntimeError, InvalidArgumentError
from thunderfn.prims import check
from thunderfn.torch.base import torchsymbol
from thunderfn.torch.shape import _zero, diagonal

T = torch.Tensor
__all__ = ["getitem", "nonzero", "argwhere", "masked_select", "index_select", "gather", "take_along_dim", "scatter",
           "scatter_add", "index_add", "index_copy", "index_fill", "masked_fill", "index_put", "take", "put",
           "slice_scatter", "select_scatter", "diagonal_scatter", "scatter_reduce", "combinations"]


_INDEX_DTYPES = (torch.int64, torch.int32)
_MASK_DTYPES = (torch.bool, torch.uint8)  # torch reads uint8 indices as masks (with a deprecation warning)


def _is_mask(k) -> bool:
    return isinstance(k, TensorProxy) and k.dtype in _MASK_DTYPES


class _BoolScalarIndex:
    """x[True] / x[False] / x[mask] of a 0-dim mask: torch inserts a dim of size 1 and indexes it with the
    tensor [0] (True) or [] (False), an advanced index that takes part in torch's placement rules; a 0-dim
    mask's is known only at run time (its nonzero positions)."""

    def __init__(self, keep):
        self.keep = keep  # a bool, or a 0-dim mask

    def index(self, device) -> TensorProxy:
        if isinstance(self.keep, TensorProxy):
            return clang.nonzero_columns(self.keep)[0]
        return clang.full((int(self.keep),), 0, device=device, dtype=torch.int64)


def _sequence_is_tuple(key: list) -> bool:
    """torch's legacy rule: a list holding sequences, slices, None, ... or tensors means a tuple."""
    return (len(key) < 32
            and any(isinstance(k, (list, tuple, slice, TensorProxy)) or k is None or k is Ellipsis for k in key))


def _list_index(k: list) -> TensorProxy:
    """A list of ints indexes like the tensor torch.tensor(k) would (a constant of the trace)."""
    with torch._C.DisableTorchFunction():
        t = torch.tensor(k)
    if t.numel() == 0:
        t = t.long()
    return context.current_tracer().constant(t)


def _normalize_key(a, key) -> list:
    if isinstance(key, list) and _sequence_is_tuple(key):
        key = tuple(key)
    if not isinstance(key, tuple):
        key = (key,)
    key = [_list_index(k) if isinstance(k, list) else
           _BoolScalarIndex(k) if isinstance(k, bool) or _is_mask(k) and k.ndim == 0 else k for k in key]
    for k in key:
        if _is_mask(k):
            continue
        check(k is None or k is Ellipsis or isinstance(k, (int, torch.SymInt, slice, TensorProxy, _BoolScalarIndex)),
              lambda: "only integers, slices (`:`), ellipsis (`...`), None and long or byte "
                      f"Variables are valid indices (got {type(k).__name__})", IndexError)
        if isinstance(k, TensorProxy):
            check(k.dtype in _INDEX_DTYPES,
                  lambda: "tensors used as indices must be long, int, byte or bool tensors", IndexError)
        if isinstance(k, slice):
            check(k.step != 0, lambda: "slice step cannot be zero", ValueError)
    consumed = sum(k.ndim if _is_mask(k) else 1 for k in key if isinstance(k, (int, torch.SymInt, slice, TensorProxy)))
    check(a.ndim > 0 or not any(isinstance(k, (int, torch.SymInt)) for k in key),
          lambda: "invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                  "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number", IndexError)
    check(consumed <= a.ndim, lambda: f"too many indices for tensor of dimension {a.ndim}", IndexError)
    ellipses = [i for i, k in enumerate(key) if k is Ellipsis]
    # torch accepts some keys with several ellipses with surprising results; refusing is clearer
    check(len(ellipses) <= 1, lambda: "an index can only have a single ellipsis ('...')", IndexError)
    fill = [slice(None)] * (a.ndim - consumed)
    if ellipses:
        i = ellipses[0]
        return _mask_positions(a, key[:i] + fill + key[i + 1:])
    return _mask_positions(a, key + fill)


def _mask_positions(a, key: list) -> list:
    """key with each boolean mask replaced by the index tensors of its True positions, one per dimension of a it
    covers (torch's reading of a mask), after checking that the mask has those dimensions' sizes."""
    out, dim = [], 0
    for k in key:
        if not _is_mask(k):
            out.append(k)
            dim += 1 if isinstance(k, (int, torch.SymInt, slice, TensorProxy)) else 0
            continue
        for j, n in enumerate(k.shape):
            check(n == a.shape[dim + j],
                  lambda: f"The shape of the mask {list(k.shape)} at index {j} does not match the shape of the indexed "
                          f"tensor {list(a.shape)} at index {dim + j}", IndexError)
        out += clang.nonzero_columns(maybe_convert_to_dtype(k, torch.bool))
        dim += k.ndim
    return out


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
        if isinstance(k, (int, torch.SymInt)):
            check(-n <= k < n, lambda: f"index {k} is out of bounds for dimension {dim} with size {n}", IndexError)
            k = k + n if type(k) is int and k < 0 else k % n  # (x[:, -1] of a symbolic size: s0 - 1)
            starts.append(k), stops.append(k + 1), steps.append(1)
            squeeze_dims.append(dim)
        else:
            check(k.step is None or k.step > 0, lambda: "step must be greater than zero", ValueError)
            start, stop, step = symbolic.slice_indices(k, n)
            stop = stop if symbolic.holds(stop >= start) else max(start, stop)
            starts.append(start), stops.append(stop), steps.append(step)
        dim += 1
    out = a
    # (a symbolic bound is sliced rather than asked whether it makes a no-op, which would guard it)
    if a.ndim and (not symbolic.same_shape(starts, [0] * len(starts)) or not symbolic.same_shape(stops, a.shape)
                   or any(s != 1 for s in steps)):
        out = prims.slice(a, tuple(starts), tuple(stops), tuple(steps))
    # Positions of the remaining entries (None and bools add a dim, ints removed one, tensors stay).
    remaining = [k for k in key if not isinstance(k, (int, torch.SymInt))]
    if squeeze_dims:
        out = prims.squeeze(out, tuple(squeeze_dims))
    if any(k is None or isinstance(k, _BoolScalarIndex) for k in remaining):
        shape, src = [], iter(out.shape)
        for k in remaining:
            shape.append(1 if k is None or isinstance(k, _BoolScalarIndex) else next(src))
        out = clang.reshape(out, tuple(shape))
    remaining = [k.index(a.device) if isinstance(k, _BoolScalarIndex) else k for k in remaining]
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
    except InvalidArgumentError:
        raise ArgumentIndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(str(list(i.shape)) for i in indices)) from None
    linear = in_range = None
    merged = symbolic.product(sizes)
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


@torchsymbol(torch.nonzero, T.nonzero)
def nonzero(a, *, as_tuple=False):
    """The positions of a's nonzero elements: how many there are is a data-dependent size (core/symbolic.py)."""
    if as_tuple:
        return tuple(clang.nonzero_columns(a))
    return prims.nonzero(a)


@torchsymbol(torch.argwhere, T.argwhere)
def argwhere(a):
    return prims.nonzero(a)


@torchsymbol(torch.masked_select, T.masked_select)
def masked_select(a, mask):
    """a's elements where mask (broadcast together) is True, in order: a take at the mask's nonzero positions."""
    check(mask.dtype is torch.bool, lambda: "masked_select: expected BoolTensor for mask")
    shape = clang.broadcast_shapes(a.shape, mask.shape)
    flat = clang.reshape(clang.expand_to(a, shape), (symbolic.product(shape),))
    positions = clang.nonzero_columns(clang.reshape(clang.expand_to(mask, shape), (symbolic.product(shape),)))[0]
    return prims.take(flat, positions, 0)


@torchsymbol(torch.index_select, T.index_select)
def index_select(a, dim, index):
    check(index.ndim <= 1, lambda: "index_select(): Index is supposed to be a vector", IndexError)
    return prims.take(a, index, dim)


@torchsymbol(torch.gather, T.gather)
def gather(a, dim, index, *, sparse_grad=False):
    if symbolic.holds(index.numel() == 0):  # torch checks the index's dtype only when it has elements
        index = maybe_convert_to_dtype(index, torch.int64)
    return prims.take_along_axis(a, index, dim)


@torchsymbol(torch.take_along_dim, T.take_along_dim)
def take_along_dim(a, indices, dim=None):
    if dim is None:
        return prims.take_along_axis(clang.reshape(a, (-1,)), clang.reshape(indices, (-1,)), 0)
    check(indices.dtype is torch.int64,
          lambda: "torch.take_along_dim(): dtype of indices should be Long but got "
                  f"{clang.LEGACY_TYPE_NAMES[indices.dtype][:-len('Tensor')]}")
    check(a.ndim == indices.ndim,
          lambda: f"torch.take_along_dim(): input and indices should have the same number of dimensions, "
                  f"but got {a.ndim} dimensions for input, and {indices.ndim} "
                  "dimensions for indices")
    check(a.ndim > 0, lambda: f"Dimension specified as {dim} but tensor has no dimensions", IndexError)
    d = prims.canonical_dim(dim, a.ndim)
    # every dim but `dim` broadcasts
    others = clang.broadcast_shapes(*(tuple(1 if i == d else s for i, s in enumerate(t.shape)) for t in (a, indices)))
    a_shape, i_shape = list(others), list(others)
    a_shape[d], i_shape[d] = a.shape[d], indices.shape[d]
    # along a dim torch counts a negative index from the end (gather does not, nor the backward's scatter_add)
    return prims.take_along_axis(clang.expand_to(a, a_shape),
                                 _count_from_end(clang.expand_to(indices, i_shape), a.shape[d]), d)


# -- functional writes: scatter, index_*, masked_fill, index_put, take, put -----------------
def _fill_value(value, a, opname):
    """A fill value for a: a number converted as torch converts it (truncating into integer
    dtypes), or a 0-dim tensor converted to a's dtype."""
    if isinstance(value, TensorProxy):
        check(value.ndim == 0, lambda: f"{opname} only supports a 0-dimensional value tensor, but got tensor with "
                                       f"{value.ndim} dimension(s).")
        return maybe_convert_to_dtype(value, a.dtype)
    if a.dtype is torch.bool:
        return bool(value)
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        return int(value)
    return float(value) if not isinstance(value, complex) else value


def _filled(a, mask, value):
    """where(mask, value, a) keeping a's dtype; mask broadcasts to a."""
    if not isinstance(value, TensorProxy):
        value = clang.full((), value, device=a.device, dtype=a.dtype)
    return clang.where(clang.expand_to(mask, a.shape) if mask.ndim else mask, value, a)


def _count_from_end(index, size):
    index = maybe_convert_to_dtype(index, torch.int64)
    return clang.where(clang.lt(index, 0), clang.add(index, size), index)


def _check_scatter(a, dim, index, src, name):
    check(index.dtype in _INDEX_DTYPES, lambda: f"{name}(): Expected dtype int32/int64 for index")
    check(src is None or src.dtype == a.dtype, lambda: f"{name}(): Expected self.dtype to be equal to src.dtype")
    d = prims.canonical_dim(dim, a.ndim)
    if symbolic.holds(index.numel() == 0):
        return d
    check(max(index.ndim, 1) == max(a.ndim, 1),
          lambda: "Index tensor must have the same number of dimensions as self tensor")
    check(src is None or max(index.ndim, 1) == max(src.ndim, 1),
          lambda: "Index tensor must have the same number of dimensions as src tensor")
    too_big = any(i != d and index.shape[i] > a.shape[i] for i in range(min(index.ndim, a.ndim)))
    if src is not None:
        too_big = too_big or any(index.shape[i] > src.shape[i] for i in range(min(index.ndim, src.ndim)))
        check(not too_big,
              lambda: f"Expected index {list(index.shape)} to be no larger than self {list(a.shape)} apart from "
                      f"dimension {d} and to be no larger size than src {list(src.shape)}")
    check(not too_big, lambda: f"Expected index {list(index.shape)} to be no larger than self {list(a.shape)} "
                               f"apart from dimension {d}")
    return d


def _corner(src, shape):
    """The leading `shape` corner of src: the part of src torch's scatter kernels read."""
    shape = tuple(shape)
    if symbolic.same_shape(src.shape, shape):
        return src
    if src.ndim != len(shape):  # 0-dim and 1-element 1-dim tensors are interchangeable here
        src = clang.reshape(src, (1,) * len(shape))
    return prims.slice(src, (0,) * len(shape), shape)


def _scatter(a, dim, index, src, prim):
    if symbolic.holds(index.numel() == 0):
        return clang.add(a, False) if a.dtype is torch.bool else clang.add(a, 0)  # a new value, as torch returns a copy
    if a.ndim == 0:  # torch reads 0-dim tensors as 1-dim here
        out = _scatter(clang.reshape(a, (1,)), dim, clang.reshape(index, (1,)), clang.reshape(src, (-1,)), prim)
        return clang.reshape(out, ())
    if index.ndim == 0:
        index = clang.reshape(index, (1,))
    return prim(a, index, _corner(src, index.shape), dim)


@torchsymbol(torch.scatter, T.scatter)
def scatter(a, dim, index, src=None, value=None, *, reduce=None):
    if src is None:
        src = value
    check(reduce in (None, "add", "multiply"), lambda: "reduce argument must be either add or multiply.")
    if reduce == "multiply":  # deprecated in torch, and no scatter_mul prim: torch runs it
        raise DecompositionUnavailable
    tensor_src = isinstance(src, TensorProxy)
    d = _check_scatter(a, dim, index, src if tensor_src else None, "scatter")
    if not tensor_src:
        src = clang.full(index.shape, _fill_value(src, a, "scatter"), device=a.device, dtype=a.dtype)
    return _scatter(a, d, index, src, prims.scatter_add if reduce == "add" else prims.scatter)


@torchsymbol(torch.scatter_add, T.scatter_add)
def scatter_add(a, dim, index, src):
    d = _check_scatter(a, dim, index, src, "scatter_add")
    return _scatter(a, d, index, src, prims.scatter_add)


def _check_index_vector(index, name):
    check(index.ndim <= 1, lambda: f"{name}(): Index is supposed to be a vector, but got dim: {index.ndim} with type: "
                                   f"{clang.scalar_type_name(index.dtype)} and size: {list(index.shape)}", IndexError)


def _index_scatter(a, dim, index, source, prim):
    """Write source's slices along dim into a at index's positions (index_add, index_copy)."""
    if a.ndim == 0:
        out = _index_scatter(clang.reshape(a, (1,)), 0, index, clang.reshape(source, (1,)), prim)
        return clang.reshape(out, ())
    index = clang.reshape(index, (index.numel(),))
    if source.ndim == 0:
        source = clang.reshape(source, (1,))
    expanded = prims.broadcast_in_dim(index, tuple(source.shape), (dim,))
    return prim(a, expanded, source, dim)


def _check_index_source(a, d, index, source, name):
    check(index.numel() == (source.shape[d] if source.ndim else 1),
          lambda: f"{name}(): Number of indices ({index.numel()}) should be equal to source.size(dim): "
                  f"({source.shape[d] if source.ndim else 1}), for dim: {d}" if name == "index_add_" else
                  f"{name}(): Number of indices ({index.numel()}) should be equal to source.size(dim) "
                  f"({source.shape[d] if source.ndim else 1})",
          IndexError if name == "index_copy_" else RuntimeError)


@torchsymbol(torch.index_add, T.index_add)
def index_add(a, dim, index, source, *, alpha=1):
    d = prims.canonical_dim(dim, a.ndim)
    _check_index_vector(index, "index_add_")
    check(index.dtype in _INDEX_DTYPES,
          lambda: f"index_add_(): Expected dtype int32/int64 for index but got: {clang.scalar_type_name(index.dtype)}")
    check(a.dtype == source.dtype, lambda: f"index_add_(): self ({clang.scalar_type_name(a.dtype)}) and source "
                                           f"({clang.scalar_type_name(source.dtype)}) must have the same scalar type")
    _check_index_source(a, d, index, source, "index_add_")
    check(max(a.ndim, 1) == max(source.ndim, 1) and all(i == d or a.shape[i] == source.shape[i] for i in range(a.ndim)),
          lambda: f"source tensor shape must match self tensor shape, excluding the specified dimension. "
                  f"Got self.shape = {list(a.shape)} source.shape = {list(source.shape)}")
    alpha = _fill_value(alpha, a, "index_add")
    if alpha is not True and alpha != 1:
        source = clang.mul(source, alpha)
    return _index_scatter(a, d, index, source, prims.scatter_add)


@torchsymbol(torch.index_copy, T.index_copy)
def index_copy(a, dim, index, source):
    d = prims.canonical_dim(dim, a.ndim)
    check(index.dtype is torch.int64,
          lambda: f"index_copy_(): Expected a long tensor for index, but got {clang.scalar_type_name(index.dtype)}")
    check(index.ndim <= 1, lambda: f"index_copy_(): Index should have dimension 1 or 0 (got {index.ndim})", IndexError)
    check(a.dtype == source.dtype,
          lambda: f"index_copy_(): self and source expected to have the same dtype, but got (self) "
                  f"{clang.scalar_type_name(a.dtype)} and (source) "
                  f"{clang.scalar_type_name(source.dtype)}")
    for i in range(max(a.ndim, source.ndim)):
        if i == d:
            continue
        check(i < a.ndim and i < source.ndim and a.shape[i] == source.shape[i],
              lambda: f"index_copy_(): Source/destination tensor must have same slice shapes. Destination slice shape: "
                      f"{a.shape[i] if i < a.ndim else 1} at dimension {i} and source slice shape: "
                      f"{source.shape[i] if i < source.ndim else 1} at dimension {i}.")
    _check_index_source(a, d, index, source, "index_copy_")
    return _index_scatter(a, d, index, source, prims.scatter)


@torchsymbol(torch.index_fill, T.index_fill)
def index_fill(a, dim, index, value):
    check(index.dtype is torch.int64, lambda: "index_fill_(): Expected dtype int64 for index.", IndexError)
    check(index.ndim <= 1, lambda: "Index has to be a vector/scalar")
    d = prims.canonical_dim(dim, a.ndim)
    value = _fill_value(value, a, "index_fill_")
    n = a.shape[d] if a.ndim else 1
    index = _count_from_end(clang.reshape(index, (index.numel(),)), n)
    hit = prims.scatter(clang.full((n,), False, device=a.device, dtype=torch.bool), index,
                        clang.full((index.numel(),), True, device=a.device, dtype=torch.bool), 0)
    if a.ndim == 0:
        return _filled(a, clang.reshape(hit, ()), value)
    mask = prims.broadcast_in_dim(hit, tuple(a.shape), (d,))
    return _filled(a, mask, value)


@torchsymbol(torch.masked_fill, T.masked_fill)
def masked_fill(a, mask, value):
    check(mask.dtype is torch.bool, lambda: f"masked_fill_ only supports boolean masks, but got mask with dtype "
                                            f"{clang.CPP_TYPE_NAMES.get(mask.dtype, mask.dtype)}")
    value = _fill_value(value, a, "masked_fill_")
    shape = clang.broadcast_shapes(mask.shape, a.shape)
    return _filled(clang.expand_to(a, shape), mask, value)


def index_put_entries(a, indices, values, accumulate=False):
    """index_put with None entries meaning `:` (as aten.index_put takes them): writes values
    (broadcast to the shape a[indices] has) at the indexed positions, summing if accumulate.

    One scatter on a's indexed dims merged into one (moved first when the index tensors are
    not adjacent, torch's placement rule). A single boolean mask with one value is a where."""
    indices = list(indices)
    check(len(indices) <= a.ndim or (a.ndim == 0 and len(indices) <= 1 and not any(
          isinstance(i, TensorProxy) and i.dtype in _INDEX_DTYPES for i in indices)),
          lambda: f"too many indices for tensor of dimension {a.ndim} (got {len(indices)})", IndexError)
    for i in indices:
        check(i is None or i.dtype in _INDEX_DTYPES + (torch.bool, torch.uint8),
              lambda: "tensors used as indices must be long, int, byte or bool tensors", IndexError)
    check(values.dtype == a.dtype, lambda: f"Index put requires the source and destination dtypes match, got "
                                           f"{clang.scalar_type_name(a.dtype)} for the destination and "
                                           f"{clang.scalar_type_name(values.dtype)} for the source.")
    masks = [k for k, i in enumerate(indices) if _is_mask(i)]
    if masks and _is_where(indices, values):
        return _mask_put(a, indices, masks[0], values, accumulate)
    if masks:  # each mask read as the positions of its True elements: as many values as it has
        indices = _mask_positions(a, [slice(None) if i is None else i for i in indices])
        indices = [None if isinstance(i, slice) else i for i in indices]
    indices = indices + [None] * (a.ndim - len(indices))
    dims = [k for k, i in enumerate(indices) if i is not None]
    if not dims:  # every entry `:`: values, broadcast to a
        values = clang.expand_to(values, a.shape)
        return clang.add(a, values) if accumulate else clang.add(values, False if a.dtype is torch.bool else 0)
    tensors = [indices[k] for k in dims]
    try:
        index_shape = clang.broadcast_shapes(*(i.shape for i in tensors))
    except InvalidArgumentError:
        raise ArgumentIndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(str(list(i.shape)) for i in tensors)) from None
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    perm = list(range(a.ndim)) if adjacent else dims + [k for k in range(a.ndim) if k not in dims]
    moved = clang.permute(a, tuple(perm))
    first = dims[0] if adjacent else 0
    sizes = [a.shape[k] for k in dims]
    merged = symbolic.product(sizes)
    linear = in_range = None
    for idx, size, pos in zip(tensors, sizes, range(len(sizes))):
        idx = _count_from_end(idx, size)
        if len(tensors) > 1:  # out of range in one dim could land in range of the merged dim
            ok = clang.bitwise_and(clang.ge(idx, 0), clang.lt(idx, size))
            in_range = ok if in_range is None else clang.bitwise_and(in_range, ok)
        stride = symbolic.product(sizes[pos + 1:])
        term = clang.mul(idx, stride) if stride != 1 else idx
        linear = term if linear is None else clang.add(linear, term)
    if in_range is not None:
        linear = clang.where(in_range, linear, merged)  # past the end: the scatter raises
    linear = clang.reshape(clang.expand_to(linear, index_shape), (-1,))
    shape = tuple(moved.shape)
    pre, post = shape[:first], shape[first + len(dims):]
    result_shape = pre + tuple(index_shape) + post
    try:
        values = clang.expand_to(values, clang.broadcast_shapes(values.shape, result_shape))
        check(tuple(values.shape) == result_shape, lambda: "")
    except InvalidArgumentError:
        raise ArgumentRuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be "
                                   f"broadcast to indexing result of shape {list(result_shape)}") from None
    k = linear.numel()
    flat = clang.reshape(moved, pre + (merged,) + post)
    values = clang.reshape(values, pre + (k,) + post)
    index = prims.broadcast_in_dim(linear, pre + (k,) + post, (first,))
    if not symbolic.holds(k == 0):
        flat = (prims.scatter_add if accumulate else prims.scatter)(flat, index, values, first)
    out = clang.reshape(flat, shape)
    inverse = [perm.index(k) for k in range(a.ndim)]
    return clang.permute(out, tuple(inverse))


def _is_where(indices, values) -> bool:
    """A boolean mask as the only index, writing one value: a where (no data-dependent size)."""
    tensors = [i for i in indices if i is not None]
    return len(tensors) == 1 and _is_mask(tensors[0]) and symbolic.holds(values.numel() == 1)


def _mask_put(a, indices, pos, values, accumulate):
    mask = indices[pos]
    for j, s in enumerate(mask.shape):
        check(pos + j < a.ndim and a.shape[pos + j] == s,
              lambda: f"The shape of the mask {list(mask.shape)} at index {j} does not match the shape of the indexed "
                      f"tensor {list(a.shape)} at index {pos + j}", IndexError)
    mask = maybe_convert_to_dtype(mask, torch.bool)
    mask = prims.broadcast_in_dim(mask, tuple(a.shape), tuple(range(pos, pos + mask.ndim)))
    value = clang.reshape(values, ())
    if accumulate:
        return clang.where(mask, clang.add(a, value), a)
    return clang.where(mask, value, a)


@torchsymbol(torch.index_put, T.index_put)
def index_put(a, indices, values, accumulate=False):
    check(isinstance(indices, (tuple, list)),
          lambda: f"index_put(): argument 'indices' (position 2) must be tuple of Tensors, "
                  f"not {type(indices).__name__}", TypeError)
    for k, i in enumerate(indices):
        check(isinstance(i, TensorProxy),
              lambda: f"expected Tensor as element {k} in argument 1, but got {type(i).__name__}", TypeError)
    check(len(indices) > 0,
          lambda: "index_put with no indices writes every element; thunderfn refuses it as torch does "
                  "(use torch.where or expand)")
    return index_put_entries(a, indices, values, accumulate)


@torchsymbol(torch.take, T.take)
def take(a, index):
    check(index.dtype is torch.int64,
          lambda: f"take(): Expected a long tensor for index, but got {clang.scalar_type_name(index.dtype)}")
    check(a.numel() > 0 or index.numel() == 0, lambda: "take(): tried to take from an empty tensor", IndexError)
    if symbolic.holds(index.numel() == 0):
        return clang.full(index.shape, 0, device=a.device, dtype=a.dtype)
    flat = clang.reshape(a, (a.numel(),))
    picked = prims.take(flat, clang.reshape(_count_from_end(index, a.numel()), (index.numel(),)), 0)
    return clang.reshape(picked, tuple(index.shape))


@torchsymbol(torch.put, T.put)
def put(a, index, source, accumulate=False):
    check(index.dtype is torch.int64,
          lambda: f"put_(): Expected a long tensor for index, but got {clang.scalar_type_name(index.dtype)}")
    check(a.dtype == source.dtype,
          lambda: f"put_(): self and source expected to have the same dtype, but got self.dtype = "
                  f"{clang.scalar_type_name(a.dtype)} and source.dtype = "
                  f"{clang.scalar_type_name(source.dtype)}")
    check(index.numel() == source.numel(),
          lambda: f"put_(): Expected source and index to have the same number of elements, "
                  f"but got source.numel() = {source.numel()}, "
                  f"index.numel() = {index.numel()}", IndexError)
    check(a.numel() > 0 or index.numel() == 0, lambda: "put_(): Tried to put elements into an empty tensor", IndexError)
    if symbolic.holds(index.numel() == 0):
        return clang.add(a, False) if a.dtype is torch.bool else clang.add(a, 0)
    n = index.numel()
    flat = clang.reshape(a, (a.numel(),))
    out = (prims.scatter_add if accumulate else prims.scatter)(
        flat, clang.reshape(_count_from_end(index, a.numel()), (n,)), clang.reshape(source, (n,)), 0)
    return clang.reshape(out, tuple(a.shape))


def index_put_key(a, key, value, accumulate=False):
    """Functional `a[key] = value` (or `+=` when accumulate) for any key `a[key]` reads: ints,
    slices, None, Ellipsis, integer tensors, lists. The positions of a's elements, indexed by
    the same key, say where each element of a[key] lives, so every rule getitem follows
    (placement of advanced indices, negative and out-of-range indices) holds for the write
    too; one flat scatter then writes value, converted and broadcast as torch's setitem does
    (leading size-1 dims of value dropped). A boolean mask as the whole key with one value
    is a where; other masks write as many values as they have True entries and are refused."""
    parts = key if isinstance(key, tuple) else (key,)
    if not isinstance(value, TensorProxy):
        value = clang.full((), _fill_value(value, a, "index_put"), device=a.device, dtype=a.dtype)
    advanced = any(isinstance(k, (TensorProxy, list)) for k in parts)
    # torch converts values written through basic indices, and requires a's dtype through advanced ones
    check(not advanced or value.dtype == a.dtype,
          lambda: f"Index put requires the source and destination dtypes match, got {clang.scalar_type_name(a.dtype)} "
                  f"for the destination and {clang.scalar_type_name(value.dtype)} for the source.")
    value = maybe_convert_to_dtype(value, a.dtype)
    if all(isinstance(k, TensorProxy) for k in parts) and _is_where(parts, value):
        return index_put_entries(a, parts, value, accumulate)
    n = a.numel()
    positions = clang.reshape(prims.iota(n, start=0, step=1, device=a.device, dtype=torch.int64), tuple(a.shape))
    target = getitem(positions, key)
    while value.ndim > target.ndim and symbolic.holds(value.shape[0] == 1):
        value = clang.reshape(value, tuple(value.shape[1:]))
    if not advanced and value.ndim <= target.ndim:
        value = clang.expand_to(value, target.shape)  # torch's copy_ wording: "The expanded size of the tensor ..."
    try:
        value = clang.expand_to(value, clang.broadcast_shapes(value.shape, target.shape))
        check(tuple(value.shape) == tuple(target.shape), lambda: "")
    except InvalidArgumentError:
        raise ArgumentRuntimeError(f"shape mismatch: value tensor of shape {list(value.shape)} cannot be "
                                   f"broadcast to indexing result of shape {list(target.shape)}") from None
    k = target.numel()
    if symbolic.holds(k == 0):
        return clang.add(a, False) if a.dtype is torch.bool else clang.add(a, 0)
    flat = clang.reshape(a, (n,))
    out = (prims.scatter_add if accumulate else prims.scatter)(flat, clang.reshape(target, (k,)),
                                                               clang.reshape(value, (k,)), 0)
    return clang.reshape(out, tuple(a.shape))


# -- view scatters: the functional writes through a slice, a select or a diagonal --------------
def scatter_into_view(a, view, src):
    """a with src written over the elements view(a) picks: view picks from a's positions,
    and one flat scatter writes there (src converted to a's dtype, as torch does)."""
    n = a.numel()
    target = view(clang.reshape(prims.iota(n, start=0, step=1, device=a.device, dtype=torch.int64), tuple(a.shape)))
    check(tuple(src.shape) == tuple(target.shape), lambda: f"expected src to have a size equal to the slice of self. "
                                                           f"src size = {list(src.shape)}, slice size = "
                                                           f"{list(target.shape)}")
    src = maybe_convert_to_dtype(src, a.dtype)
    k = target.numel()
    if symbolic.holds(k == 0):
        return clang.add(a, False) if a.dtype is torch.bool else clang.add(a, 0)
    out = prims.scatter(clang.reshape(a, (n,)), clang.reshape(target, (k,)), clang.reshape(src, (k,)), 0)
    return clang.reshape(out, tuple(a.shape))


@torchsymbol(torch.slice_scatter, T.slice_scatter)
def slice_scatter(a, src, dim=0, start=None, end=None, step=1):
    check(step > 0, lambda: "slice step must be positive")
    d = prims.canonical_dim(dim, a.ndim)
    first, stop, _ = symbolic.slice_indices(slice(start, end, step), a.shape[d])
    return scatter_into_view(a, lambda p: clang.slice_in_dim(p, first, max(first, stop), step, d), src)


@torchsymbol(torch.select_scatter, T.select_scatter)
def select_scatter(a, src, dim, index):
    d = prims.canonical_dim(dim, a.ndim)
    n = a.shape[d]
    check(-n <= index < n,
          lambda: f"select(): index {index} out of range for tensor of size {list(a.shape)} at dimension {d}",
          IndexError)
    i = index % n
    return scatter_into_view(a, lambda p: clang.squeeze(clang.slice_in_dim(p, i, i + 1, 1, d), (d,)), src)


@torchsymbol(torch.diagonal_scatter, T.diagonal_scatter)
def diagonal_scatter(a, src, offset=0, dim1=0, dim2=1):
    return scatter_into_view(a, lambda p: diagonal(p, offset, dim1, dim2), src)


_SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


@torchsymbol(torch.scatter_reduce, T.scatter_reduce)
def scatter_reduce(a, dim, index, src, reduce, *, include_self=True):
    check(reduce in _SCATTER_REDUCTIONS,
          lambda: f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    d = _check_scatter(a, dim, index, src, "scatter")
    if reduce not in ("sum", "mean"):
        raise DecompositionUnavailable  # no scatter_mul/max/min prims: torch runs it
    prims.check_dtype_supported(reduce == "sum" or a.dtype is not torch.bool,
                                "scatter_gather_tensor_cpu_reduce_mean", a.dtype)
    if symbolic.holds(index.numel() == 0):
        return _scatter(a, d, index, src, prims.scatter_add)
    base = a
    if not include_self:  # the written positions start from zero instead of a
        base = _scatter(a, d, index,
                        clang.full(index.shape, _zero(a.dtype), device=a.device, dtype=a.dtype), prims.scatter)
    total = _scatter(base, d, index, src, prims.scatter_add)
    if reduce == "sum":
        return total
    counts = _scatter(clang.full(a.shape, int(include_self), device=a.device, dtype=a.dtype), d, index,
                      clang.full(index.shape, 1, device=a.device, dtype=a.dtype), prims.scatter_add)
    counts = clang.where(clang.eq(counts, 0), clang.full((), 1, device=a.device, dtype=a.dtype), counts)
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return clang.div(total, counts)
    return clang.div(total, counts, rounding_mode="floor")


@torchsymbol(torch.combinations)
def combinations(input, r=2, with_replacement=False):
    """A gather: which elements make up each combination depends only on the length, so the
    index tensor is computed at trace time and read by the compiled code."""
    check(input.ndim == 1, lambda: f"Expect a 1D vector, but got shape {list(input.shape)}")
    check(r >= 0, lambda: f"Expect a non-negative number, but got {r}")
    if r == 0:
        return clang.full((0,), 0, device=input.device, dtype=input.dtype)
    choose = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    picks = [i for combo in choose(range(input.shape[0]), r) for i in combo]
    if not picks:
        return clang.full((0, r), 0, device=input.device, dtype=input.dtype)
    index = context.current_tracer().constant(torch.tensor(picks, dtype=torch.int64, device=input.device))
    return clang.reshape(prims.take(input, index, 0), (len(picks) // r, r))
