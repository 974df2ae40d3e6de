"""Batching rules for prims: `batching_rules[prim id].batch(args, dims, kwargs, out)` is the
batched output of the prim, with its batch dimension.

`args` are the prim's positional arguments with every batched tensor replaced by its batched
value (one more dimension, of the batch size, at the position `dims` gives); `dims` has one
entry per positional argument: the batch dimension of that argument (an int), or None for an
unbatched tensor or a non-tensor (prims.cat's first entry is a tuple, one entry per tensor).
`out` is the prim's output for one example, as it was traced (so its shape is the per-example
shape the rule must produce, after the batch dimension). A rule returns `(batched output,
batch dim)`; a multi-output prim returns a tuple of outputs and a tuple of dims.

Rules are written in prims, so the batched program is an ordinary trace: no loop over the
examples, and it can be differentiated, lowered and batched again. Most rules move the batch
dimension to the front and shift the prim's dimension arguments by one.

Conventions (the driver relies on them): a rule is called only when some argument is batched;
every tensor argument of the prim is passed by position (the driver moves keyword tensors).

Every rule is a BatchRule entered with register_batch (core/batching.py, the table's one way in,
re-exported here); `@defbatch(symbol id, ...)` is its spelling for a function. Every prim has a
rule or is in NOT_BATCHED with the reason (tests/test_vmap.py checks it).
"""
from __future__ import annotations

from typing import Callable

import torch

from thunderfn import clang, prims
from thunderfn.core import symbolic
from thunderfn.core.batching import BatchRule, batching_rules, register_batch, unregister_batch  # noqa: F401  (re-exported)
from thunderfn.core.proxies import TensorProxy
from thunderfn.prims import PrimIDs, canonical_dim
from thunderfn.errors import BatchingError, InternalError


def defbatch(*symbol_ids):
    """Register the decorated `batch(args, dims, kwargs, out)` as the BatchRule of each symbol id."""
    def register(batch: Callable):
        for sid in symbol_ids:
            register_batch(sid, BatchRule(batch))
        return batch

    return register


# prims without a rule, and why: the driver batches only a call with a batched tensor argument
NOT_BATCHED = {
    PrimIDs.FULL: "it takes no tensor, so no call of it is batched: its value is the same for every example",
    PrimIDs.IOTA: "it takes no tensor, so no call of it is batched: its value is the same for every example",
}


# -- helpers ----------------------------------------------------------------------------
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


def _shifted(dims, per_example_ndim: int) -> tuple:
    """Dimension arguments of a per-example tensor, as dimensions of its batched form (batch at 0)."""
    return tuple(canonical_dim(d, per_example_ndim) + 1 for d in dims)


# -- elementwise: operands moved to the front and brought to the output's shape ----------------
# Elementwise prims take operands of one shape (or 0-dim tensors and numbers, which they
# broadcast). A batched operand whose example is 0-dim beside a larger one, and an unbatched
# operand beside a batched one, are broadcast to (batch, *out.shape) here; 0-dim unbatched
# tensors and numbers pass as they are.
def _elementwise(prim):
    # prims.where's condition has the output's shape even when it is 0-dim for each example
    full_shape_operands = 1 if prim.id is PrimIDs.WHERE else 0

    def rule(args, dims, kwargs, out):
        batch = batch_size_of(args, dims)
        shape = (batch,) + tuple(out.shape)
        operands = []
        for i, (a, d) in enumerate(zip(args, dims)):
            if d is not None:
                a = move_to_front(a, d)
                if a.ndim - 1 < len(out.shape):
                    a = prims.broadcast_in_dim(a, shape, (0,))
            elif isinstance(a, TensorProxy) and (a.ndim > 0 or i < full_shape_operands):
                a = prims.broadcast_in_dim(a, shape, tuple(range(1, a.ndim + 1)))
            operands.append(a)
        return prim(*operands, **kwargs), 0

    return rule


for _sym in vars(prims).copy().values():
    if isinstance(getattr(_sym, "id", None), PrimIDs) and "elementwise" in _sym.tags:
        register_batch(_sym.id, BatchRule(_elementwise(_sym)))


def defbatch_elementwise(prim) -> None:
    """Batch an elementwise prim made after this module (thunderfn.extend.elementwise_op) as the
    library's are."""
    register_batch(prim.id, BatchRule(_elementwise(prim)))


def _same_layout(prim):
    """Ops that change each element alone and keep the shape: the batch dim stays where it is."""
    def rule(args, dims, kwargs, out):
        return prim(*args, **kwargs), dims[0]

    return rule


for _prim in (prims.convert_element_type, prims.device_put):
    register_batch(_prim.id, BatchRule(_same_layout(_prim)))


# -- reductions, scans, sorting: the dimension arguments shift by one ---------------------------
def _reduction(prim):
    def rule(args, dims, kwargs, out):
        a = move_to_front(args[0], dims[0])
        n = a.ndim - 1
        reduced = _shifted(args[1], n) if n else ()  # a 0-dim example reduces nothing
        return prim(a, reduced, *args[2:], **kwargs), 0

    return rule


for _prim in (prims.sum, prims.prod, prims.amax, prims.amin, prims.var):
    register_batch(_prim.id, BatchRule(_reduction(_prim)))


_var_mean_reduction = _reduction(prims.var_mean)


@defbatch(PrimIDs.VAR_MEAN)
def _var_mean_batch(args, dims, kwargs, out):
    return _var_mean_reduction(args, dims, kwargs, out)[0], (0, 0)


def _arg_reduction(prim):
    def rule(args, dims, kwargs, out):
        a = move_to_front(args[0], dims[0])
        dim = args[1]
        if a.ndim == 1:  # a 0-dim example: its argmax is 0
            return prims.full((a.shape[0],), 0, device=a.device, dtype=torch.int64), 0
        if dim is None:  # over all elements of each example
            return prim(prims.reshape(a, (a.shape[0], a.numel() // a.shape[0])), 1), 0
        return prim(a, _shifted((dim,), a.ndim - 1)[0]), 0

    return rule


for _prim in (prims.argmax, prims.argmin):
    register_batch(_prim.id, BatchRule(_arg_reduction(_prim)))


def _along_one_dim(prim):
    """cumsum(a, dim), cumprod(a, dim), sort(a, dim, ...), topk(a, k, dim, ...): the dim shifts."""
    dim_position = 2 if prim is prims.topk else 1

    def rule(args, dims, kwargs, out):
        a, rest = move_to_front(args[0], dims[0]), list(args[1:])
        if a.ndim == 1:  # 0-dim examples
            rest[dim_position - 1] = 1
            return as_scalars(prim(*as_vectors([a], [0], a.shape[0]), *rest, **kwargs), a.shape[0])
        rest[dim_position - 1] = _shifted((rest[dim_position - 1],), a.ndim - 1)[0]
        result = prim(a, *rest, **kwargs)
        return (result, 0) if isinstance(result, TensorProxy) else (result, (0,) * len(result))

    return rule


for _prim in (prims.cumsum, prims.cumprod, prims.sort, prims.topk):
    register_batch(_prim.id, BatchRule(_along_one_dim(_prim)))


# -- shapes ------------------------------------------------------------------------------
@defbatch(PrimIDs.BROADCAST_IN_DIM)
def _broadcast_in_dim_batch(args, dims, kwargs, out):
    a = move_to_front(args[0], dims[0])
    shape, broadcast_dimensions = args[1], args[2]
    return prims.broadcast_in_dim(a, (a.shape[0],) + tuple(shape), (0,) + tuple(d + 1 for d in broadcast_dimensions)), 0


@defbatch(PrimIDs.RESHAPE)
def _reshape_batch(args, dims, kwargs, out):
    a = move_to_front(args[0], dims[0])
    return prims.reshape(a, (a.shape[0],) + tuple(args[1])), 0


@defbatch(PrimIDs.TRANSPOSE)
def _transpose_batch(args, dims, kwargs, out):
    a = move_to_front(args[0], dims[0])
    return prims.transpose(a, (0,) + tuple(p + 1 for p in args[1])), 0


@defbatch(PrimIDs.SLICE)
def _slice_batch(args, dims, kwargs, out):
    a = move_to_front(args[0], dims[0])
    starts, ends = tuple(args[1]), tuple(args[2])
    strides = tuple(args[3]) if len(args) > 3 and args[3] is not None else (1,) * len(starts)
    return prims.slice(a, (0,) + starts, (a.shape[0],) + ends, (1,) + strides), 0


@defbatch(PrimIDs.SQUEEZE)
def _squeeze_batch(args, dims, kwargs, out):
    a = move_to_front(args[0], dims[0])
    return prims.squeeze(a, _shifted(args[1], a.ndim - 1)), 0


@defbatch(PrimIDs.FLIP)
def _flip_batch(args, dims, kwargs, out):
    a = move_to_front(args[0], dims[0])
    return prims.flip(a, _shifted(args[1], a.ndim - 1)), 0


@defbatch(PrimIDs.CAT)
def _cat_batch(args, dims, kwargs, out):
    tensors, tensor_dims = args[0], dims[0]
    batch = batch_size_of(tensors, tensor_dims)
    fronted = [batched_front(t, d, batch) for t, d in zip(tensors, tensor_dims)]
    return prims.cat(fronted, _shifted((args[1],), tensors[0].ndim - (tensor_dims[0] is not None))[0]), 0


@defbatch(PrimIDs.PAD)
def _pad_batch(args, dims, kwargs, out):
    a = move_to_front(args[0], dims[0])
    return prims.pad(a, args[1], ((0, 0, 0),) + tuple(tuple(c) for c in args[2])), 0


# -- indexing and scattering ---------------------------------------------------------------
def _same_rank_operands(prim, n_tensors: int):
    """take_along_axis(a, index, dim), scatter(a, index, value, dim), scatter_add(...): operands of
    one rank, each brought to the front (unbatched ones broadcast), dim shifted."""
    def rule(args, dims, kwargs, out):
        batch = batch_size_of(args, dims)
        if out.ndim == 0:  # 0-dim examples
            return as_scalars(prim(*as_vectors(args[:n_tensors], dims[:n_tensors], batch), 1), batch)
        tensors = [batched_front(t, d, batch) for t, d in zip(args[:n_tensors], dims[:n_tensors])]
        return prim(*tensors, _shifted((args[n_tensors],), out.ndim)[0]), 0

    return rule


register_batch(PrimIDs.TAKE_ALONG_AXIS, BatchRule(_same_rank_operands(prims.take_along_axis, 2)))
register_batch(PrimIDs.SCATTER, BatchRule(_same_rank_operands(prims.scatter, 3)))
register_batch(PrimIDs.SCATTER_ADD, BatchRule(_same_rank_operands(prims.scatter_add, 3)))


# torch.func.vmap's refusal, in its words: each example would have its own number of rows
DYNAMIC_SHAPE_REFUSAL = ("vmap: We do not support batching operators that can output dynamic shape. Attempted to vmap "
                         "over aten::{op}. Please file an issue at https://github.com/pytorch/pytorch/issues if you need "
                         "this feature.")


@defbatch(PrimIDs.NONZERO)
def _nonzero_batch(args, dims, kwargs, out):
    raise BatchingError(DYNAMIC_SHAPE_REFUSAL.format(op="nonzero"))


@defbatch(PrimIDs.TAKE)
def _take_batch(args, dims, kwargs, out):
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


# -- linear algebra -------------------------------------------------------------------------
@defbatch(PrimIDs.MATMUL)
def _matmul_batch(args, dims, kwargs, out):
    """Both operands as stacks of matrices (a vector is a 1-row or 1-column matrix), the batched
    ones with the batch dimension first and 1s padding their per-example batch dims to a common
    rank, so torch.matmul's broadcasting pairs each example with its own operand; then one
    reshape drops the vector dims."""
    (a, b), (a_dim, b_dim) = args, dims
    batch = batch_size_of(args, dims)
    a_example = tuple(a.shape[:a_dim] + a.shape[a_dim + 1:]) if a_dim is not None else tuple(a.shape)
    b_example = tuple(b.shape[:b_dim] + b.shape[b_dim + 1:]) if b_dim is not None else tuple(b.shape)
    a_matrix = (1,) + a_example if len(a_example) == 1 else a_example
    b_matrix = b_example + (1,) if len(b_example) == 1 else b_example
    stack_rank = max(len(a_matrix), len(b_matrix)) - 2

    def as_stack(x, d, matrix):
        if d is None:
            return reshaped(x, matrix)
        return reshaped(move_to_front(x, d), (batch,) + (1,) * (stack_rank + 2 - len(matrix)) + matrix)

    product = prims.matmul(as_stack(a, a_dim, a_matrix), as_stack(b, b_dim, b_matrix))
    return reshaped(product, (batch,) + tuple(out.shape)), 0

