"""Rules of the indexing family: take, take_along_axis, scatter, scatter_add and nonzero, and the
torch-language indexing whose batching has a rule of its own (a batched boolean mask is refused).

take and take_along_axis are linear in the tensor they read (their transpose is a scatter_add);
scatter and scatter_add are linear in both the tensor and the values. nonzero's output is indices
(tagged not differentiable where it is made); batched, it is the nonzero positions of each example,
stacked, which needs every example to have as many (checked when it runs: a ragged batch is refused).
"""
from __future__ import annotations

import torch

import thunderfn.torch as ltorch
from thunderfn import prims
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.rules import TAG_NOT_DIFFERENTIABLE
from thunderfn.core.symbol import Symbol
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
def nonzero_of_each_example(a: torch.Tensor) -> torch.Tensor:
    """torch.nonzero(a[i]) for each example i (a batched at 0), stacked: the rows of torch.nonzero(a) whose
    first column is i, in order, without that column. Stacking needs the same count in every example, checked
    here, when the values are known (a ragged batch is refused by name)."""
    nonzero = a != 0
    counts = nonzero.sum(tuple(range(1, a.ndim))) if a.ndim > 1 else nonzero.long()
    if a.shape[0] > 1 and not bool((counts == counts[0]).all()):
        raise BatchingError(f"vmap: nonzero (argwhere, masked_select, a boolean mask's index) found {counts.tolist()} "
                            "nonzero elements in the examples of the batch: its result would have a different length "
                            "in each, which a batched tensor cannot hold. Keep the count the same in every example, "
                            "or loop over the examples.")
    count = int(counts[0]) if a.shape[0] else 0
    return torch.nonzero(a)[:, 1:].reshape(a.shape[0], count, a.ndim - 1)


def _nonzero_of_each_example_op(count) -> Symbol:
    """nonzero_of_each_example as an op whose output's length is `count`, the example's data-dependent size
    itself: what the example's program computed from that size (a slice to it, a broadcast against it) still
    holds, and generated code binds the size from this op's output."""
    def meta(a):
        return TensorProxy(shape=(a.shape[0], count, a.ndim - 1), dtype=torch.int64, device=a.device)

    return Symbol("nonzero_of_each_example", "vmap.nonzero_of_each_example", meta=meta, is_prim=True,
                  namespace={"nonzero_of_each_example": nonzero_of_each_example}, eager=nonzero_of_each_example,
                  torch_fn=nonzero_of_each_example, tags=frozenset({"opaque", TAG_NOT_DIFFERENTIABLE}))


@defbatch(PrimIDs.NONZERO)
def _nonzero_batch(call, dims):
    return _nonzero_of_each_example_op(call.out.shape[0])(move_to_front(call.args[0], dims[0])), 0


@defbatch("vmap.nonzero_of_each_example")
def _nonzero_of_each_example_batch(call, dims):
    # vmap of vmap: the two batch dims folded into one, the examples of every inner batch counted together
    a = move_to_front(call.args[0], dims[0])
    outer, inner, count = a.shape[0], a.shape[1], call.out.shape[1]
    folded = _nonzero_of_each_example_op(count)(prims.reshape(a, (outer * inner, *a.shape[2:])))
    return prims.reshape(folded, (outer, inner, count, a.ndim - 2)), 0


