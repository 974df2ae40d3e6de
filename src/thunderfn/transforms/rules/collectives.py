"""Rules of the collectives family (torch/distributed.py): each collective's VJP is its transpose
over the same process group (all_gather and reduce_scatter, all_reduce itself, FSDP's unshard a
reduce-scatter of the averaged gradient)."""
from __future__ import annotations

import math

import thunderfn.torch as ltorch
from thunderfn.errors import UnsupportedOpError
from thunderfn.torch import distributed as collectives
from thunderfn.transforms.rules.define import defvjp


def _synchronous(call, name: str) -> None:
    if call.arg("async_op"):
        raise UnsupportedOpError(f"vjp of an asynchronous {name}: differentiate its synchronous form (the async "
                                  f"ones are placed by transforms, after differentiation)")


@defvjp(collectives.all_gather.id)
def _all_gather_vjp(call, g):
    """Each rank's shard reached every rank: its gradient is the sum of every rank's gradient of it."""
    _synchronous(call, "all_gather")
    return (collectives.reduce_scatter(g, "sum", call.arg("gid")),) + (None,) * (len(call.args) - 1)


@defvjp(collectives.reduce_scatter.id)
def _reduce_scatter_vjp(call, g):
    _synchronous(call, "reduce_scatter")
    if call.arg("op") != "sum":
        raise UnsupportedOpError("vjp of a reduce_scatter other than a sum")
    return (collectives.all_gather(g, call.arg("gid")),) + (None,) * (len(call.args) - 1)


@defvjp(collectives.all_reduce.id)
def _all_reduce_vjp(call, g):
    _synchronous(call, "all_reduce")
    if call.arg("op") != "sum":
        raise UnsupportedOpError("vjp of an all_reduce other than a sum")
    return (collectives.all_reduce(g, "sum", call.arg("gid")),) + (None,) * (len(call.args) - 1)


@defvjp(collectives.unshard.id)
def _unshard_vjp(call, g):
    """The whole parameter's gradient, flattened and padded as the shards are, averaged over the ranks
    (each computed it for its own share of the batch) and reduce-scattered: each rank gets its shard's."""
    shard, gid = call.args[0], call.arg("gid")
    world = collectives.world_size(gid)
    flat = ltorch.reshape(g, (-1,))
    padding = shard.shape[0] * world - flat.shape[0]
    if padding:
        flat = ltorch.cat([flat, ltorch.zeros((padding,), dtype=flat.dtype, device=flat.device)])
    return (collectives.reduce_scatter(ltorch.div(flat, world), "sum", gid), None, None)[:len(call.args)]


@defvjp(collectives.unshard_bucket.id)
def _unshard_bucket_vjp(call, g):
    """Each parameter's gradient laid out as its shards are (flattened, padded, one row per rank),
    the rows concatenated as the shards were, averaged over the ranks and reduce-scattered once."""
    shards, shapes, gid = call.args[0], call.arg("shapes"), call.arg("gid")
    world = collectives.world_size(gid)
    columns = []
    for grad, shard, shape in zip(g, shards, shapes):
        flat = ltorch.reshape(grad, (-1,)) if grad is not None else \
            ltorch.zeros((math.prod(shape),), dtype=shard.dtype, device=shard.device)
        padding = shard.shape[0] * world - flat.shape[0]
        if padding:
            flat = ltorch.cat([flat, ltorch.zeros((padding,), dtype=flat.dtype, device=flat.device)])
        columns.append(ltorch.reshape(flat, (world, shard.shape[0])))
    stacked = ltorch.cat(columns, 1) if len(columns) > 1 else columns[0]
    reduced = collectives.reduce_scatter(ltorch.div(ltorch.reshape(stacked, (-1,)), world), "sum", gid)
    grads, offset = [], 0
    for shard in shards:
        grads.append(ltorch.narrow(reduced, 0, offset, shard.shape[0]))
        offset += shard.shape[0]
    return (tuple(grads), None, None)[:len(call.args)]
