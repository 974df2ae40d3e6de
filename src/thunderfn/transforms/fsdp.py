"""Fully sharded data parallelism: what the forward/backward split keeps of gathered parameters.

`tf.distributed.fsdp` leaves each rank 1/world of every parameter (a flat, padded shard);
the jitted module's forward trace rebuilds each whole parameter with `unshard` (an
all_gather) before its use, and `unshard`'s gradient reduce-scatters the whole gradient,
so the backward ends with each rank's shard of the averaged gradient
(torch/distributed.py, transforms/rules/collectives.py). What remains is what the backward
may keep between the two halves:

- "SHARD_GRAD_OP": a gathered parameter the backward reads is a residual like any other:
  whole parameters stay alive from the forward to the backward (memory), and the backward
  communicates nothing but the gradients' reduce-scatters.
- "FULL_SHARD" (`regather_in_backward`): the forward keeps only shards. A gathered parameter
  dies after its last use in the forward (the trace's `del`), and the backward gathers it
  again right before its first use there, from the shard it keeps instead. Whole parameters
  then live one stretch of the program at a time, at the price of a second all_gather each.

Two schedules make that true and overlap the communication:
- `gather_where_needed` (on the traced program, before the split): each gather moves to
  right before the first use of what it gathers, so the forward holds one layer's whole
  parameters at a time (the module's forward asked for them all up front), and the
  backward, which mirrors the forward, reduce-scatters each layer's gradients as soon as
  they are complete;
- `reduce_scatter_async` (on the backward): each reduce-scatter starts asynchronously where
  it was and is waited on at the return, so it overlaps the rest of the backward.
"""
from __future__ import annotations

import dataclasses
import time

from thunderfn.core.passes import dce
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.trace import stamp_provenance
from thunderfn.torch import distributed as collectives
from thunderfn.transforms.autograd_split import Split

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP")
_GATHERS = (collectives.unshard, collectives.unshard_bucket)
BUCKETING = ("none", "module")


@dataclasses.dataclass
class Sharded:
    """How a module's parameters are sharded: set by tf.distributed.fsdp, read by ThunderModule and jit."""
    group_id: int
    world_size: int
    strategy: str
    shapes: list  # per parameter (in named_parameters order): its whole shape
    buckets: list  # lists of parameter positions gathered by one all_gather (one each, or one per module)


def _before_first_read(body: list, pending: list) -> list:
    """body with each bound symbol of `pending` (not in body) put right before the first one that
    reads one of its outputs; those nothing reads (returned as they are) at the end."""
    waiting = {o.name: b for b in pending for o in b.proxy_outs()}
    out, placed = [], set()
    for bsym in body:
        for p in bsym.proxy_args():
            b = waiting.get(p.name)
            if b is not None and id(b) not in placed:
                placed.add(id(b))
                out.append(b)
        out.append(bsym)
    return out + [b for b in pending if id(b) not in placed]


def _shards(gather) -> list:
    """The shard proxies an unshard or unshard_bucket call gathers."""
    first = gather.args[0]
    return list(first) if isinstance(first, (list, tuple)) else [first]


def regather_in_backward(split: Split) -> Split:
    """split with every gathered parameter the backward reads re-gathered there from its shard,
    which the forward keeps instead (see the module docstring)."""
    start = time.perf_counter_ns()
    fwd, bwd = split.forward, split.backward
    gathered_by = {o.name: b for b in fwd.bound_symbols if b.sym in _GATHERS for o in b.proxy_outs()}
    outputs, residuals = fwd.output
    if not any(r.name in gathered_by for r in residuals):
        return split
    kept, names = [], set()
    for r in residuals:
        # a gathered parameter: keep the shards it was gathered from instead
        for keep in (_shards(gathered_by[r.name]) if r.name in gathered_by else [r]):
            if keep.name not in names:
                names.add(keep.name)
                kept.append(keep)
    regather = list({id(gathered_by[r.name]): gathered_by[r.name] for r in residuals if r.name in gathered_by}.values())
    body = _before_first_read(bwd.bound_symbols, regather)
    new_fwd = fwd.derive("")
    new_fwd.output = (outputs, tuple(kept))
    new_fwd = dce(new_fwd)
    n_cotangents = len(bwd.args) - len(residuals)
    new_bwd = bwd.derive("", body)
    new_bwd.args = kept + list(bwd.args[len(bwd.args) - n_cotangents:])
    provenance = "FSDP: parameters gathered again in the backward (FULL_SHARD)"
    return dataclasses.replace(split, forward=stamp_provenance(new_fwd, provenance, start),
                               backward=stamp_provenance(new_bwd, provenance, start))


def gather_where_needed(trc):
    """trc with each parameter gather moved to just before the first use of what it gathers."""
    start = time.perf_counter_ns()
    gathers = [b for b in trc.bound_symbols if b.sym in _GATHERS]
    if not gathers:
        return trc
    body = _before_first_read([b for b in trc.bound_symbols if b.sym not in _GATHERS], gathers)
    return stamp_provenance(trc.derive("", body), "FSDP: parameters gathered where first used", start)


def reduce_scatter_async(bwd):
    """bwd with each reduce-scatter started asynchronously where it is, and waited on at the end
    together with what only cuts its result into the gradients returned (a bucket's shards); where
    the backward reads a result sooner, the wait comes right before that read."""
    start = time.perf_counter_ns()
    body, waits = [], []
    for bsym in bwd.bound_symbols:
        if bsym.sym is collectives.reduce_scatter and not (len(bsym.args) > 3 and bsym.args[3]):
            x, op, gid = (list(bsym.args) + ["sum", 0])[:3]
            pending = TensorProxy(bwd.names.take(prefix="pending"), shape=bsym.output.shape, dtype=bsym.output.dtype,
                                  device=bsym.output.device)
            body.append(collectives.reduce_scatter.bind(x, op, gid, True, output=pending))
            waits.append(collectives.wait.bind(pending, output=bsym.output))
        else:
            body.append(bsym)
    if not waits:
        return bwd
    deferred = {w.output.name for w in waits}  # names available only after the waits
    now, later = [], []
    for bsym in body:
        if any(p.name in deferred for p in bsym.proxy_args()):
            later.append(bsym)
            deferred.update(o.name for o in bsym.proxy_outs())
        else:
            now.append(bsym)
    if any(p.name in deferred for b in now for p in b.proxy_args()):  # read sooner: wait where first read
        return stamp_provenance(bwd.derive("", _before_first_read(body, waits)),
                                "FSDP: reduce-scatters overlapped with the backward", start)
    return stamp_provenance(bwd.derive("", now + waits + later), "FSDP: reduce-scatters overlapped with the backward",
                            start)

