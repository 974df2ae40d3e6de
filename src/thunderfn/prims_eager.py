"""How prims compute on real tensors: the torch implementations that are not one torch call.

prims.py's `torch_impls` table maps each prim to its torch implementation (these
functions, or torch's own: torch.add for prims.add); every prim computes eagerly with
it, and the torch executor lowers prims to the same calls (executors/torch_executor.py).
Functions defined here print under their own names in execution traces
(`reduce_sum(t0, (0,))`).

In the prims layer, below prims.py: may import nothing of thunderfn's.
"""
from __future__ import annotations

import builtins

import torch

from thunderfn.errors import ArgumentIndexError

Tensor = torch.Tensor


# -- implementations of prims that are not one torch call ----------------------------------
def broadcast_in_dim(a, shape, broadcast_dimensions):
    view = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        view[d] = a.shape[i]
    return a.reshape(view).expand(shape)


def slice_prim(a, start_indices, end_indices, strides=None):
    strides = strides or (1,) * len(start_indices)
    return a[tuple(builtins.slice(s, e, st) for s, e, st in zip(start_indices, end_indices, strides))]


# A reduction over no dims is the input's value; a new tensor, as every torch reduction returns,
# so a jitted function's output never aliases its input where eager's does not.
def reduce_sum(a, dims):
    return torch.sum(a, dims, dtype=a.dtype) if dims else a.clone()


def reduce_prod(a, dims):
    if not dims:
        return a.clone()
    for d in sorted(dims, reverse=True):
        a = torch.prod(a, d, dtype=a.dtype)
    return a


def reduce_amax(a, dims):
    return torch.amax(a, dims) if dims else a.clone()


def reduce_amin(a, dims):
    return torch.amin(a, dims) if dims else a.clone()


def reduce_var(a, dims, *, correction):
    return torch.var(a, dims, correction=correction) if dims else torch.var(a.unsqueeze(-1), -1, correction=correction)


def reduce_var_mean(a, dims, *, correction):
    if not dims:
        return torch.var_mean(a.unsqueeze(-1), -1, correction=correction)
    return torch.var_mean(a, dims, correction=correction)


def iota(length, *, start, step, device, dtype):
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.arange(length, device=device, dtype=torch.float64) * step + start).to(dtype)
    return torch.arange(start, start + length * step, step, device=device, dtype=dtype)


def convert_element_type(a, dtype):
    return a.to(dtype)


def device_put(a, device):
    return a.to(device)


def take(a, index, dim):
    try:
        return torch.index_select(a, dim, index.reshape(-1) if index.ndim == 0 else index)
    except RuntimeError as e:
        # index_select reports an index out of range as IndexError on some dims and RuntimeError on
        # others; take always raises IndexError, as torch's indexing does
        if "out of DATA bounds" in str(e):
            raise ArgumentIndexError(f"index out of range in self ({e})") from None
        raise


def take_along_axis(a, index, dim):
    # torch 2.13's gather reads a broadcast (stride-0) int32 index wrongly; int64 is read right
    return torch.gather(a, dim, index if index.dtype is torch.int64 else index.long())


def where(pred, a, b):
    return torch.where(pred, a, b)


def with_tensor_operands(torch_fn):
    """Binary prims may take a Python number on either side; torch functions want a
    tensor first (and some want two), so the number becomes a 0-dim tensor of the
    other operand's dtype, which is how clang already promoted it."""

    def impl(a, b, **kwargs):
        like = a if isinstance(a, Tensor) else b
        if not isinstance(a, Tensor):
            a = torch.scalar_tensor(a, dtype=like.dtype, device=like.device)
        if not isinstance(b, Tensor):
            b = torch.scalar_tensor(b, dtype=like.dtype, device=like.device)
        return torch_fn(a, b, **kwargs)

    impl.__name__ = f"{torch_fn.__name__}_with_number"
    return impl


# -- scans and sorting ---------------------------------------------------------------------
def cumsum(a, dim):
    return torch.cumsum(a, dim, dtype=a.dtype)  # torch would promote integers to int64; the prim keeps a's dtype


def cumprod(a, dim):
    return torch.cumprod(a, dim, dtype=a.dtype)


def sort_prim(a, dim, descending, stable):
    return tuple(torch.sort(a, dim=dim, descending=descending, stable=stable))


def topk_prim(a, k, dim, largest, sorted):
    return tuple(torch.topk(a, k, dim=dim, largest=largest, sorted=sorted))


# -- scattering and padding ----------------------------------------------------------------
def scatter_prim(a, index, value, dim):
    return torch.scatter(a, dim, index, value)


def scatter_add_prim(a, index, value, dim):
    return torch.scatter_add(a, dim, index, value)


def pad_prim(a, padding_value, padding_config):
    """jax.lax.pad: interior padding by writing a into a strided view of a filled tensor,
    then negative low/high crop and positive ones pad."""
    if any(interior for _, _, interior in padding_config):
        dilated = torch.full([n + max(n - 1, 0) * i for n, (_, _, i) in zip(a.shape, padding_config)], padding_value,
                             dtype=a.dtype, device=a.device)
        dilated[tuple(builtins.slice(None, None, i + 1) for _, _, i in padding_config)] = a
        a = dilated
    if any(lo < 0 or hi < 0 for lo, hi, _ in padding_config):  # (no crop, no alias op: a backward's pads have none)
        a = a[tuple(builtins.slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi, _) in zip(a.shape, padding_config))]
    pads = [p for lo, hi, _ in reversed(padding_config) for p in (max(lo, 0), max(hi, 0))]
    return torch.constant_pad_nd(a, pads, padding_value) if any(pads) else a.clone()


def binary_eager(tensors_fn, numbers_fn):
    """A binary prim's eager form: tensors_fn on two tensors, numbers_fn (with_tensor_operands)
    when a Python number is an operand."""

    def eager(a, b, **kwargs):
        if isinstance(a, Tensor) and isinstance(b, Tensor):
            return tensors_fn(a, b, **kwargs)
        return numbers_fn(a, b, **kwargs)

    eager.__name__ = tensors_fn.__name__
    return eager
