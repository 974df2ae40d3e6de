"""Helpers the op families' rules share: cotangents (torch language), tangents (prims) and batched
operands (prims). Each family module imports what it uses."""
from __future__ import annotations

import numbers

import torch

import thunderfn.torch as ltorch
from thunderfn import clang, prims
from thunderfn.core import dtypes, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import InternalError
from thunderfn.prims import canonical_dim, canonical_dims
from thunderfn.torch.reductions import sum_to


def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def is_float_tensor(x) -> bool:
    """A tensor (proxy or real) of a real floating dtype: what the rules give a cotangent or a tangent."""
    return is_tensor(x) and x.dtype.is_floating_point


def only_input(call, ct) -> tuple:
    """A cotangent for the input (the first argument) and None for every other argument."""
    return (ct,) + (None,) * (len(call.args) - 1)


# -- cotangents (the torch language) ------------------------------------------------------
def to_dtype(g, dtype):
    return g if g.dtype == dtype else ltorch.to(g, dtype)


def in_dtype(x, dtype):
    """x in dtype: a tensor converted by ltorch.to where it differs, a number as torch converts it."""
    if clang.is_tensor(x):
        return x if x.dtype == dtype else ltorch.to(x, dtype)
    return clang.maybe_convert_to_dtype(x, dtype)


def computed(*tensors):
    """The tensors in the computation dtype of the first (float32 for half precision)."""
    compute = dtypes.computation_dtype(tensors[0].dtype)
    return tuple(None if t is None else in_dtype(t, compute) for t in tensors)


def row_sum(x, dims):
    return ltorch.sum(x, dims, keepdim=True) if dims else x


def matrix_t(x):
    return ltorch.transpose(x, -2, -1)


def zeros_like(like):
    return ltorch.full(tuple(like.shape), 0.0, device=like.device, dtype=like.dtype)


def as_tensor_like(x, like):
    """A Python number as a 0-dim tensor of like's dtype, so rules can compute with it."""
    return ltorch.full((), x, device=like.device, dtype=like.dtype) if isinstance(x, numbers.Number) else x


def operand_cotangent(g, arg):
    """g as the cotangent of an elementwise operand: None unless arg is a float tensor;
    summed to () when arg is a 0-dim tensor the prim broadcast."""
    if g is None or not is_float_tensor(arg):
        return None
    if arg.ndim == 0 and g.ndim > 0:
        g = sum_to(g, ())
    if g.device != arg.device:  # a CPU scalar tensor beside a CUDA tensor
        g = ltorch.to(g, arg.device)
    return to_dtype(g, arg.dtype)


def unreduce(g, a, dims):
    """g, the output of a reduction of a over dims, broadcast back to a's shape."""
    if tuple(dims) != tuple(range(len(dims))):  # expand adds leading dims itself; others need a 1 in place
        g = ltorch.reshape(g, tuple(1 if i in dims else s for i, s in enumerate(a.shape)))
    return ltorch.expand(g, tuple(a.shape))


def reduced_dims(a, dims) -> tuple:
    return canonical_dims(dims, a.ndim) if a.ndim else ()


def expanded_like(x, like):
    """A 0-dim x broadcast to like's shape, so a mask built from scalars has the result's shape."""
    return ltorch.expand(x, tuple(like.shape)) if x.ndim == 0 and like.ndim > 0 else x


def square(x):
    return ltorch.mul(x, x)


def inverse_permutation(permutation) -> tuple:
    return tuple(sorted(range(len(permutation)), key=lambda i: permutation[i]))


# -- tangents (prims) ---------------------------------------------------------------------
def tangent_like(t, out):
    """A tangent t of an elementwise operand as a tangent of out: a 0-dim t (from a 0-dim
    operand the prim broadcast) is broadcast to out's shape, moved to out's device, cast."""
    if t is None:
        return None
    if t.ndim == 0 and out.ndim > 0:
        t = prims.broadcast_in_dim(t, tuple(out.shape), ())
    if t.device != out.device:  # a CPU scalar tensor beside a CUDA tensor
        t = prims.device_put(t, out.device)
    return to_dtype(t, out.dtype)


def add_tangents(x, y):
    """Sum of tangents, None standing for zero."""
    return y if x is None else x if y is None else prims.add(x, y)


def or_zeros(t, like):
    return zeros_like(like) if t is None else t


def ones_like(like):
    return prims.full(tuple(like.shape), 1.0, device=like.device, dtype=like.dtype)


def contract(t, weights, dims):
    """sum over dims of t * weights: the tangent of a reduction whose derivative is weights."""
    tw = prims.mul(t, weights)
    return prims.sum(tw, dims) if dims else tw


# -- batched operands (prims) ---------------------------------------------------------------
def batch_size_of(args, dims) -> int:
    for a, d in zip(args, dims):
        if isinstance(d, tuple):
            return batch_size_of(a, d)
        if d is not None:
            return a.shape[d]
    raise InternalError("internal: a batching rule was called with no batched argument")


def move_to_front(x: TensorProxy, dim: int) -> TensorProxy:
    """x with its batch dimension `dim` moved to position 0 (a view: prims.transpose)."""
    return clang.move_dim(x, dim, 0)


move_batch_dim = clang.move_dim  # x with its batch dimension moved from `dim` to `to` (both non-negative)


def batched_front(x, dim, batch_size: int) -> TensorProxy:
    """x with the batch dimension at 0; an unbatched tensor is broadcast (an expand, no copy)."""
    return clang.move_dim(x, dim, 0) if dim is not None else clang.expand_to(x, (batch_size, *x.shape))


def reshaped(x: TensorProxy, shape: tuple) -> TensorProxy:
    """x reshaped, or x itself when it has that shape already (keeps traces free of no-op reshapes)."""
    return x if symbolic.same_shape(x.shape, shape) else prims.reshape(x, tuple(shape))


def as_vectors(tensors, dims, batch_size: int) -> list:
    """0-dim examples as 1-element vectors: each tensor (batch, 1), unbatched ones broadcast. A rule
    for an op along a dim then runs it along dim 1, and as_scalars turns the results back."""
    return [prims.reshape(batched_front(t, d, batch_size), (batch_size, 1)) for t, d in zip(tensors, dims)]


def as_scalars(result, batch_size: int):
    """The results of an op on as_vectors' (batch, 1) tensors, as (batch,): 0-dim examples again."""
    if isinstance(result, TensorProxy):
        return prims.reshape(result, (batch_size,)), 0
    return tuple(prims.reshape(r, (batch_size,)) for r in result), (0,) * len(result)


def shifted_dims(dims, per_example_ndim: int) -> tuple:
    """Dimension arguments of a per-example tensor, as dimensions of its batched form (batch at 0)."""
    return tuple(canonical_dim(d, per_example_ndim) + 1 for d in dims)


# -- tuples of tensors, for rules whose arguments are tuples of them (the control-flow primitives) ----------
def zeros_or(g, like):
    return zeros_like(like) if g is None else g


def float_tangents(leaves, tangents) -> tuple:
    """The tangents of the float leaves, zeros for those given none."""
    return tuple(zeros_or(t, x) for x, t in zip(leaves, tangents) if is_float_tensor(x))


def per_leaf(entries, leaves) -> tuple:
    """A tuple argument's tangents or batch dims, one per leaf (the transforms give None for a tuple none of
    whose leaves has one)."""
    return (None,) * len(leaves) if entries is None else tuple(entries)


def full_tangents(leaves, float_tangents) -> tuple:
    """One tangent per leaf again: the float leaves' from float_tangents, zeros (which forward mode reads as
    no tangent) for the others, so that the tangents' leaves line up with the primals'."""
    it = iter(float_tangents)
    return tuple(next(it) if is_float_tensor(x) else zeros_like(x) for x in leaves)


def output_tangents(outs, tangents) -> tuple:
    return tuple(t if is_float_tensor(o) else None for o, t in zip(outs, tangents))
