"""Rules of the indexing family: take, take_along_axis, scatter, scatter_add and nonzero, and the
torch-language indexing whose batching has a rule of its own (a batched boolean mask is refused).

take and take_along_axis are linear in the tensor they read (their transpose is a scatter_add);
scatter and scatter_add are linear in both the tensor and the values. nonzero's output is indices
(tagged not differentiable where it is made), and vmap refuses it in torch.func's words: each
example would have its own number of rows.
"""
from __future__ import annotations

import torch

import thunderfn.torch as ltorch
from thunderfn import prims
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import BatchingError
from thunderfn.prims import PrimIDs, canonical_dim
from thunderfn.transforms.rules.common import (
    as_scalars,
    as_vectors,
    batch_size_of,
    batched_front,
    is_float_tensor,
    move_to_front,
    operand_cotangent,
    or_zeros,
    shifted_dims,
    zeros_like,
)
from thunderfn.transforms.rules.define import defbatch, defjvp, deflinear, defvjp

# torch.func.vmap's refusal, in its words: each example would have its own number of rows
DYNAMIC_SHAPE_REFUSAL = ("vmap: We do not support batching operators that can output dynamic shape. Attempted to vmap "
                         "over aten::{op}. Please file an issue at "
                         "https://github.com/pytorch/pytorch/issues if you need this feature.")


def _same_rank_operands(prim, n_tensors: int):
    """take_along_axis(a, index, dim), scatter(a, index, value, dim), scatter_add(...): operands of
    one rank, each brought to the front (unbatched ones broadcast), dim shifted."""
    def rule(call, dims):
        args, out = call.args, call.out
        batch = batch_size_of(args, dims)
        if out.ndim == 0:  # 0-dim examples
            return as_scalars(prim(*as_vectors(args[:n_tensors], dims[:n_tensors], batch), 1), batch)
        tensors = [batched_front(t, d, batch) for t, d in zip(args[:n_tensors], dims[:n_tensors])]
        return prim(*tensors, shifted_dims((args[n_tensors],), out.ndim)[0]), 0

    return rule


# -- take and take_along_axis: linear in the tensor they read ---------------------------------
def _take_vjp(call, g):
    a, index, dim = call.args
    if not is_float_tensor(a):
        return None, None, None
    if a.ndim == 0:
        return g, None, None
    d = canonical_dim(dim, a.ndim)
    flat = ltorch.reshape(index, (1,)) if index.ndim == 0 else index
    # index along d, repeated along every other dim of g
    spread = ltorch.expand(ltorch.reshape(flat, tuple(-1 if i == d else 1 for i in range(g.ndim))), tuple(g.shape))
    return ltorch.scatter_add(zeros_like(a), d, spread, g), None, None


deflinear(prims.take, _take_vjp)


@defbatch(PrimIDs.TAKE)
def _take_batch(call, dims):
    args, out = call.args, call.out
    a, index, dim = args
    a_dim, index_dim = dims[0], dims[1]
    if out.ndim == 0:  # 0-dim examples (and one index each)
        batch = batch_size_of(args, dims)
        a, = as_vectors([a], [a_dim], batch)
        if index_dim is None:
            return as_scalars(prims.take(a, prims.reshape(index, (1,)), 1), batch)
        return as_scalars(prims.take_along_axis(a, *as_vectors([index], [index_dim], batch), 1), batch)
    d = canonical_dim(dim, out.ndim)
    if index_dim is None:  # the same rows of every example
        return prims.take(move_to_front(a, a_dim), index, d + 1), 0
    # a different index per example: a gather along d + 1 with the index broadcast over the other dims
    batch = index.shape[index_dim]
    a = batched_front(a, a_dim, batch)
    index = prims.reshape(move_to_front(index, index_dim), (batch, out.shape[d]))
    index = prims.broadcast_in_dim(index, (batch,) + tuple(out.shape), (0, d + 1))
    return prims.take_along_axis(a, index, d + 1), 0


def _take_along_axis_vjp(call, g):
    a, index, dim = call.args
    if not is_float_tensor(a):
        return None, None, None
    if a.ndim == 0:  # every index is 0: each element of g is a
        return ltorch.sum(g) if g.ndim else g, None, None
    return ltorch.scatter_add(zeros_like(a), dim, index, g), None, None


deflinear(prims.take_along_axis, _take_along_axis_vjp)
defbatch(PrimIDs.TAKE_ALONG_AXIS)(_same_rank_operands(prims.take_along_axis, 2))


# -- scatter and scatter_add: linear in the tensor and the values --------------------------------
@defvjp(PrimIDs.SCATTER_ADD)
def _scatter_add_vjp(call, g):
    a, index, value, dim = call.args
    return operand_cotangent(g, a), None, operand_cotangent(ltorch.gather(g, dim, index), value), None


@defvjp(PrimIDs.SCATTER)
def _scatter_vjp(call, g):
    """Overwritten positions of `a` get no cotangent; every index reads g back into
    `value`, duplicates included (as torch's gather does)."""
    a, index, value, dim = call.args
    if not is_float_tensor(a):
        return None, None, None, None
    return ltorch.scatter(g, dim, index, zeros_like(value)), None, ltorch.gather(g, dim, index), None


defjvp(PrimIDs.SCATTER_ADD)(lambda call, t: prims.scatter_add(
    or_zeros(t[0], call.args[0]), call.args[1], or_zeros(t[2], call.args[2]), call.args[3]))
defjvp(PrimIDs.SCATTER)(lambda call, t: prims.scatter(
    or_zeros(t[0], call.args[0]), call.args[1], or_zeros(t[2], call.args[2]), call.args[3]))
defbatch(PrimIDs.SCATTER_ADD)(_same_rank_operands(prims.scatter_add, 3))
defbatch(PrimIDs.SCATTER)(_same_rank_operands(prims.scatter, 3))


# -- nonzero ------------------------------------------------------------------------------------
@defbatch(PrimIDs.NONZERO)
def _nonzero_batch(call, dims):
    raise BatchingError(DYNAMIC_SHAPE_REFUSAL.format(op="nonzero"))


# -- torch-language indexing: a batched boolean mask has no batched form -----------------------
def _is_mask(x) -> bool:
    return isinstance(x, TensorProxy) and x.dtype in (torch.bool, torch.uint8)


@defbatch(ltorch.getitem.id)
def _getitem(call, dims):
    args = call.args
    key, key_dims = args[1], dims[1]
    keys, key_dims = (key, key_dims) if isinstance(key, (tuple, list)) else ((key,), (key_dims,))
    if any(_is_mask(k) and d is not None for k, d in zip(keys, key_dims or (None,) * len(keys))):
        raise BatchingError("vmap: We do not support batching operators that can support dynamic shape. Attempting to "
                            "batch over indexing with a boolean mask.")
    return NotImplemented


@defbatch(ltorch.masked_select.id)
def _masked_select(call, dims):
    if dims[1] is not None:
        raise BatchingError("vmap: Attempted to vmap over `mask` in torch.masked_select(self, mask) We cannot support "
                            "this because for each batch this would return a differently shaped Tensor. Please file an "
                            "issue at https://github.com/pytorch/pytorch/issues if you need this feature.")
    return NotImplemented


@defbatch(ltorch.where.id)
def _where(call, dims):
    args, kwargs = call.args, call.kwargs
    if len(args) == 1 and not kwargs:  # torch.where(condition): its nonzero positions
        raise BatchingError(DYNAMIC_SHAPE_REFUSAL.format(op="where"))
    return NotImplemented
