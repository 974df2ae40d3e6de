"""Data parallelism as a transform of the backward trace: gradients all-reduced in buckets.

Every rank runs the same program on its own slice of the batch; after the backward,
each parameter's gradient must be the average over ranks. `bucketed_all_reduce` takes
the backward trace the forward/backward split made (transforms/autograd_split.py) and
the positions of the parameters' gradients among its outputs, and:

1. orders those gradients by where the backward produces them (the last layer's come
   first) and packs them into buckets of at most `bucket_bytes` (one dtype and device
   each; a larger gradient is a bucket of its own);
2. right after a bucket's last gradient is produced, flattens the bucket into one
   tensor, divides it by the number of ranks (pre-averaging, as torch's
   DistributedDataParallel does, so a sum cannot overflow where the average would
   not) and starts an asynchronous `all_reduce` of it;
3. waits on each bucket only at the end, where the gradients are returned, and cuts
   the reduced bucket back into the gradients' shapes.

So communication of the last layers' gradients overlaps the computation of the first
layers'. The bucket size trades the two: small buckets start communicating sooner but
pay each collective's fixed cost more often. The collectives are symbols of their own
(torch/distributed.py): `tf.last_backward_traces` shows them.
"""
from __future__ import annotations

import dataclasses
import time

from thunderfn import torch as ltorch
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.trace import Trace, stamp_provenance
from thunderfn.core.tracer import tracing
from thunderfn.torch import distributed as collectives


@dataclasses.dataclass
class DataParallel:
    """How a module's gradients are synchronized: set by tf.distributed.ddp, read by jit."""
    group_id: int
    world_size: int
    bucket_bytes: int
    n_params: int  # the module's parameters are the first n_params inputs of its jitted forward
    sync: bool = True  # False inside no_sync(): gradients stay local


def _buckets(grads: list, produced_at: dict, bucket_bytes: int) -> list[list]:
    """(position, gradient) pairs in buckets, in the order the backward produces them."""
    order = sorted(grads, key=lambda pg: produced_at.get(pg[1].name, -1))
    buckets, current, size, kind = [], [], 0, None
    for position, grad in order:
        nbytes = grad.shape.numel() * grad.dtype.itemsize
        if current and ((grad.dtype, grad.device) != kind or size + nbytes > bucket_bytes):
            buckets.append(current)
            current, size = [], 0
        current.append((position, grad))
        size += nbytes
        kind = (grad.dtype, grad.device)
    if current:
        buckets.append(current)
    return buckets


def bucketed_all_reduce(bwd: Trace, positions, config: DataParallel) -> Trace:
    """bwd with the gradients at `positions` among its outputs averaged over the ranks (see the
    module docstring)."""
    start = time.perf_counter_ns()
    grads = [(i, bwd.output[i]) for i in positions if isinstance(bwd.output[i], TensorProxy)]
    if not grads:
        return bwd
    produced_at = {o.name: k for k, b in enumerate(bwd.bound_symbols) for o in b.proxy_outs()}
    buckets = _buckets(grads, produced_at, config.bucket_bytes)
    launch_after: dict[int, list] = {}
    for bucket in buckets:
        launch_after.setdefault(max(produced_at.get(g.name, -1) for _, g in bucket), []).append(bucket)

    new = bwd.derive("", [])
    pending = []
    with tracing(new) as tracer:
        def launch(bucket):
            flat = ltorch.cat([ltorch.reshape(g, (-1,)) for _, g in bucket]) if len(bucket) > 1 else \
                ltorch.reshape(bucket[0][1], (-1,))
            averaged = ltorch.div(flat, config.world_size)
            pending.append((bucket, collectives.all_reduce(averaged, "sum", config.group_id, True)))

        for bucket in launch_after.get(-1, ()):  # gradients the backward receives as they are
            launch(bucket)
        for k, bsym in enumerate(bwd.bound_symbols):
            tracer.emit(bsym)
            for bucket in launch_after.get(k, ()):
                launch(bucket)
        output = list(bwd.output)
        for bucket, started in pending:
            reduced = collectives.wait(started)
            offset = 0
            for position, grad in bucket:
                n = grad.shape.numel()
                output[position] = ltorch.reshape(ltorch.narrow(reduced, 0, offset, n), tuple(grad.shape))
                offset += n
    new.output = output
    return stamp_provenance(new, f"Data parallel gradient all-reduce ({len(buckets)} buckets)", start)
