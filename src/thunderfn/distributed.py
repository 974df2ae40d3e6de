"""`tf.distributed`: data-parallel training on torch.distributed's engine.

    torch.distributed.init_process_group("gloo")         # or "nccl"; torchrun sets the rest
    model = tf.jit(tf.distributed.ddp(model))             # parameters broadcast from rank 0
    loss = model(local_batch).mean(); loss.backward()     # gradients: the average over ranks
    optimizer.step()

`ddp(module)` prepares a module for `tf.jit`: its parameters and buffers are broadcast
from one rank, and the module is marked so that jit puts the gradients' all-reduces in
the backward trace, bucketed and asynchronous (transforms/ddp.py; the collectives are
symbols of their own, torch/distributed.py, shown by `tf.last_backward_traces`). Every
rank must call the jitted module the same number of times with the same shapes: each
call issues the same collectives in the same order, and a rank that skips one leaves
the others waiting until the process group's timeout (`init_process_group(timeout=)`,
30 minutes by default for gloo) ends them with an error.

torch's own `DistributedDataParallel(tf.jit(model))` works too: DDP's hooks see the
gradients the jitted backward produces, as they see eager's.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from thunderfn.errors import DistributedError
from thunderfn.module import ThunderModule
from thunderfn.torch import distributed as collectives
from thunderfn.transforms.ddp import DataParallel

__all__ = ["ddp", "no_sync", "DataParallel"]


def _require_process_group(what: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedError(
            f"{what} needs torch.distributed's default process group, and none is initialized: call "
            f"torch.distributed.init_process_group(backend) on every rank first (gloo on CPU, nccl on GPU; torchrun "
            f"sets the rank, world size and rendezvous address it reads).")


def _check_same_parameters(module: torch.nn.Module, group) -> None:
    """Every rank holds a model with the same parameters (names, shapes, dtypes): a collective."""
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in module.named_parameters()]
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    for rank, theirs in enumerate(everyone):
        if theirs == mine:
            continue
        for a, b in zip(mine, theirs):
            if a != b:
                raise DistributedError(
                    f"ranks hold different models: parameter {a[0]} is {a[1]} {a[2]} on rank {dist.get_rank(group)} "
                    f"but {b[0]} is {b[1]} {b[2]} on rank {rank}. Build the same model on every rank.")
        raise DistributedError(f"ranks hold different models: rank {dist.get_rank(group)} has {len(mine)} parameters, "
                               f"rank {rank} has {len(theirs)}. Build the same model on every rank.")


def ddp(module: torch.nn.Module, *, bucket_size_in_mb: float = 25.0, broadcast_from: int = 0,
        process_group=None) -> torch.nn.Module:
    """The module, prepared for data-parallel training under tf.jit (see the module docstring).

    A collective: every rank calls it. Checks that all ranks hold the same parameters, copies
    rank `broadcast_from`'s parameters and buffers to the others, and returns the module
    itself, marked; `tf.jit(module)` then averages its parameters' gradients over the ranks
    in the backward, in buckets of about `bucket_size_in_mb`."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        raise DistributedError("tf.distributed.ddp takes the model itself, not one wrapped in DistributedDataParallel")
    if isinstance(module, ThunderModule):
        raise DistributedError("tf.distributed.ddp goes inside tf.jit: write tf.jit(tf.distributed.ddp(model))")
    if not bucket_size_in_mb > 0:
        raise ValueError(f"bucket_size_in_mb must be positive, got {bucket_size_in_mb}")
    _require_process_group("tf.distributed.ddp")
    world = dist.get_world_size(process_group)
    if not 0 <= broadcast_from < world:
        raise ValueError(f"broadcast_from={broadcast_from} is not a rank of a group of {world}")
    _check_same_parameters(module, process_group)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, broadcast_from, group=process_group)
    module._thunderfn_data_parallel = DataParallel(
        group_id=collectives.group_id(process_group), world_size=world, bucket_bytes=int(bucket_size_in_mb * 2**20),
        n_params=len(list(module.named_parameters())))
    return module


def _config(module) -> DataParallel:
    inner = module.module if isinstance(module, ThunderModule) else module
    config = inner.__dict__.get("_thunderfn_data_parallel")
    if config is None:
        raise DistributedError("no_sync() is for a module prepared with tf.distributed.ddp")
    return config


@contextlib.contextmanager
def no_sync(module: torch.nn.Module):
    """Accumulate gradients locally (no communication) for the backward passes inside the block,
    as DistributedDataParallel.no_sync does. On leaving it, the accumulated gradients are
    averaged over the ranks once (one synchronous all-reduce per parameter), so the next
    synchronized backward adds its averaged gradients to averaged ones: the sum is the
    average of all the accumulated gradients, as with DDP."""
    config = _config(module)
    was_syncing = config.sync
    config.sync = False
    try:
        yield
    finally:
        config.sync = was_syncing
        if was_syncing:
            group = collectives._groups[config.group_id]
            inner = module.module if isinstance(module, ThunderModule) else module
            with torch.no_grad():
                for p in inner.parameters():
                    if p.grad is not None:
                        p.grad.div_(config.world_size)
                        dist.all_reduce(p.grad, group=group)
