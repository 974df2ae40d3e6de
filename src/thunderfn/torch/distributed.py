"""Collectives: torch.distributed's communication as symbols of their own, so traces show it.

`all_reduce`, `all_gather`, `reduce_scatter` and `broadcast` take a tensor and return
a new value (functional, as everything in a trace), computed by torch.distributed when
the compiled function runs (gloo on CPU, NCCL on GPU): the torch executor calls them
like opaque ops. With `async_op=True` a collective returns at once and its result is a
*pending* value that only `wait` may read: the trace says where communication starts
and where its result is first needed, and everything recorded in between overlaps it.

A process group is named in traces by a small integer (`group_id`), since a trace
prints as Python: 0 is the default group. Each symbol is tagged "collective": it is
never removed as unused (every rank must issue every collective, in the same order),
never merged with another, and a barrier to fusion executors, which fuse on either side
of it but never across it.

`unshard`, the one composite here, rebuilds a parameter tf.distributed.fsdp sharded.

May import: core/ and the rest of the torch language.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from thunderfn.core.proxies import TensorProxy
from thunderfn.core.symbol import Symbol
from thunderfn.errors import ArgumentValueError
from thunderfn.torch.shape import cat, narrow, reshape

_groups: list = [None]  # group id -> process group; None is torch's default group

_OPS = {"sum": dist.ReduceOp.SUM, "avg": getattr(dist.ReduceOp, "AVG", None), "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


def group_id(group) -> int:
    """The integer a trace names `group` by (None, the default group, is 0)."""
    if group is None or group is dist.group.WORLD:
        return 0
    for i, known in enumerate(_groups):
        if known is group:
            return i
    _groups.append(group)
    return len(_groups) - 1


def world_size(gid: int) -> int:
    return dist.get_world_size(_groups[gid])


class Pending:
    """What an async collective returns when the compiled function runs: its tensor, written by
    torch.distributed until `wait` says it is done, and the input it reads meanwhile (held here
    too, so the trace's `del` of the input cannot free memory the collective still reads)."""
    __slots__ = ("tensor", "work", "source")

    def __init__(self, tensor: torch.Tensor, work, source: torch.Tensor):
        self.tensor, self.work, self.source = tensor, work, source


def _finish(tensor, work, async_op: bool, source):
    return Pending(tensor, work, source) if async_op else tensor


def _all_reduce(x, op: str = "sum", gid: int = 0, async_op: bool = False):
    out = x.clone(memory_format=torch.contiguous_format)
    return _finish(out, dist.all_reduce(out, op=_OPS[op], group=_groups[gid], async_op=async_op), async_op, out)


def _all_gather(x, gid: int = 0, async_op: bool = False):
    """Every rank's x, concatenated along dim 0, in rank order."""
    out = x.new_empty((world_size(gid) * x.shape[0], *x.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    source = x.contiguous()
    return _finish(out, gather(out, source, group=_groups[gid], async_op=async_op), async_op, source)


def _reduce_scatter(x, op: str = "sum", gid: int = 0, async_op: bool = False):
    """This rank's 1/world of dim 0 of the reduction of every rank's x."""
    out = x.new_empty((x.shape[0] // world_size(gid), *x.shape[1:]))
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    source = x.contiguous()
    return _finish(out, scatter(out, source, op=_OPS[op], group=_groups[gid], async_op=async_op), async_op, source)


def _broadcast(x, src: int = 0, gid: int = 0, async_op: bool = False):
    out = x.clone(memory_format=torch.contiguous_format)
    return _finish(out, dist.broadcast(out, src, group=_groups[gid], async_op=async_op), async_op, out)


def _wait(pending):
    pending.work.wait()
    return pending.tensor


def _same_meta(x, /, *args, **kwargs):
    return TensorProxy.like(x, requires_grad=False)


def _reduced_meta(x, op: str = "sum", gid: int = 0, async_op: bool = False):  # (its VJP rule reads op and gid by name)
    return _same_meta(x)


def _gathered_meta(x, gid: int = 0, async_op: bool = False):
    return TensorProxy(shape=(world_size(gid) * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)


def _scattered_meta(x, op: str = "sum", gid: int = 0, async_op: bool = False):
    world = world_size(gid)
    if x.shape[0] % world:
        raise ArgumentValueError(f"reduce_scatter: dim 0 of a {tuple(x.shape)} tensor does not split into "
                                 f"{world} equal shards")
    return TensorProxy(shape=(x.shape[0] // world, *x.shape[1:]), dtype=x.dtype, device=x.device)


def _collective(name: str, impl, meta) -> Symbol:
    printed = f"dist_{name}"
    impl.__name__ = impl.__qualname__ = printed  # how generated code calls it
    return Symbol(name, ("distributed", name), meta=meta, is_prim=True, print_name=printed,
                  namespace={printed: impl}, eager=impl, torch_fn=impl,
                  tags=frozenset({"opaque", "collective", "no_dce"}))


all_reduce = _collective("all_reduce", _all_reduce, _reduced_meta)
all_gather = _collective("all_gather", _all_gather, _gathered_meta)
reduce_scatter = _collective("reduce_scatter", _reduce_scatter, _scattered_meta)
broadcast = _collective("broadcast", _broadcast, _same_meta)
wait = _collective("wait", _wait, _same_meta)


# -- sharded parameters (tf.distributed.fsdp) ----------------------------------------------------
def shard_numel(numel: int, world: int) -> int:
    """Elements per rank of a parameter of `numel` elements: flattened, padded to a multiple of world."""
    return -(-numel // world)


def _composite(fn) -> Symbol:
    """A symbol whose body is the function (decomposed when run); not a torch-language symbol of
    ltorch's table, since it mirrors no torch function."""
    printed = f"dist_{fn.__name__}"
    return Symbol(fn.__name__, ("distributed", fn.__name__), fn=fn, print_name=printed, namespace={printed: fn},
                  tags=frozenset({"collective"}))


@_composite
def unshard(shard, shape, gid: int = 0):
    """The whole parameter of shape `shape` from each rank's flat, padded shard: an all_gather, the
    padding cut off, reshaped. Its gradient is the reduce_scatter of the whole gradient, averaged
    over the ranks (transforms/rules/collectives.py), so each rank's shard gets its part of the mean."""
    full = all_gather(shard, gid)
    return reshape(narrow(full, 0, 0, math.prod(shape)), tuple(shape))


@_composite
def unshard_bucket(shards, shapes, gid: int = 0):
    """Several parameters whole from their shards with one all_gather: each rank's shards are
    concatenated, gathered, and each parameter's columns cut out of the (world, total) result.
    Its gradient is one reduce_scatter (transforms/rules/collectives.py)."""
    world = world_size(gid)
    row = sum(s.shape[0] for s in shards)
    rows = reshape(all_gather(cat(list(shards)) if len(shards) > 1 else shards[0], gid), (world, row))
    whole, offset = [], 0
    for shard, shape in zip(shards, shapes):
        columns = reshape(narrow(rows, 1, offset, shard.shape[0]), (-1,))
        whole.append(reshape(narrow(columns, 0, 0, math.prod(shape)), tuple(shape)))
        offset += shard.shape[0]
    return tuple(whole)
