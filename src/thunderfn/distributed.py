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

`fsdp(module)` shards instead: each rank keeps 1/world of every parameter, the jitted
forward gathers each parameter before use and the backward reduce-scatters gradients
(transforms/fsdp.py). `module.parameters()` are then the shards, so an ordinary torch
optimizer steps them; `full_parameters` and `full_state_dict` rebuild the whole model.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from thunderfn.errors import ArgumentValueError, DistributedError
from thunderfn.module import ThunderModule
from thunderfn.torch import distributed as collectives
from thunderfn.transforms.ddp import DataParallel
from thunderfn.transforms.fsdp import BUCKETING, STRATEGIES, Sharded

__all__ = ["ddp", "no_sync", "fsdp", "full_parameters", "full_state_dict", "load_full_state_dict", "all_reduce",
           "all_gather", "reduce_scatter", "broadcast", "DataParallel", "Sharded"]


# -- the collectives, as functions of tensors --------------------------------------------------------
def all_reduce(x: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """x reduced over the ranks ("sum", "avg", "max", "min", "product"), as a new tensor (x is not
    written). Eagerly, or traced as a collective inside tf.jit, tf.grad, ... (a sum's gradient is
    the all_reduce of the cotangent)."""
    return collectives.all_reduce(x, op, collectives.group_id(group))


def all_gather(x: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's x concatenated along dim 0, in rank order (gradient: a reduce_scatter)."""
    return collectives.all_gather(x, collectives.group_id(group))


def reduce_scatter(x: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """This rank's 1/world of dim 0 of x reduced over the ranks (gradient: an all_gather)."""
    return collectives.reduce_scatter(x, op, collectives.group_id(group))


def broadcast(x: torch.Tensor, src: int = 0, group=None) -> torch.Tensor:
    """Rank src's x, on every rank, as a new tensor."""
    return collectives.broadcast(x, src, collectives.group_id(group))


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
    in the backward, in buckets of about `bucket_size_in_mb`.

    Needs torch.distributed's default process group initialized (`process_group` picks
    another group to work in), else a DistributedError saying to call init_process_group. A
    module prepared twice, one already jitted or one wrapped in DistributedDataParallel is a
    DistributedError too (write `tf.jit(tf.distributed.ddp(model))`). Every rank must then call
    the jitted module the same number of times with the same shapes. The all-reduces start
    asynchronously as each bucket's gradients are produced (tf.last_backward_traces shows
    them); `tf.distributed.no_sync(module)` skips them while accumulating micro-batches.

        >>> import torch, torch.distributed as dist, thunderfn as tf
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # this process alone
        >>> model = torch.nn.Linear(4, 2)
        >>> jitted = tf.jit(tf.distributed.ddp(model))
        >>> jitted(torch.randn(8, 4)).pow(2).mean().backward()  # model.weight.grad: averaged over ranks
        >>> "dist_all_reduce(" in str(tf.last_backward_traces(jitted)[-1])
        True
        >>> dist.destroy_process_group()
    """
    if not bucket_size_in_mb > 0:
        raise ArgumentValueError(f"bucket_size_in_mb must be positive, got {bucket_size_in_mb}")
    world = _prepare(module, "ddp", broadcast_from, process_group)
    module._thunderfn_data_parallel = DataParallel(
        group_id=collectives.group_id(process_group), world_size=world, bucket_bytes=int(bucket_size_in_mb * 2**20),
        n_params=len(list(module.named_parameters())))
    return module


def _prepare(module: torch.nn.Module, what: str, broadcast_from: int, process_group) -> int:
    """What ddp and fsdp check and do first, on every rank (a collective): the module is a plain one,
    prepared once; the process group exists; every rank holds the same parameters; rank
    `broadcast_from`'s parameters and buffers are copied to the others. The world size."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        raise DistributedError(f"tf.distributed.{what} takes the model itself, not one wrapped in "
                               f"DistributedDataParallel")
    if isinstance(module, ThunderModule):
        raise DistributedError(f"tf.distributed.{what} goes inside tf.jit: write tf.jit(tf.distributed.{what}(model))")
    if module.__dict__.get("_thunderfn_fsdp") is not None or module.__dict__.get("_thunderfn_data_parallel"):
        raise DistributedError("this module is prepared for tf.distributed already (ddp or fsdp): prepare it once")
    _require_process_group(f"tf.distributed.{what}")
    world = dist.get_world_size(process_group)
    if not 0 <= broadcast_from < world:
        raise ArgumentValueError(f"broadcast_from={broadcast_from} is not a rank of a group of {world}")
    _check_same_parameters(module, process_group)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, broadcast_from, group=process_group)
    return world


def _inner(module: torch.nn.Module) -> torch.nn.Module:
    """The module tf.distributed prepared, given it or the jitted module around it."""
    return module.module if isinstance(module, ThunderModule) else module


def _config(module) -> DataParallel:
    inner = _inner(module)
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
            inner = _inner(module)
            with torch.no_grad():
                for p in inner.parameters():
                    if p.grad is not None:
                        p.grad.div_(config.world_size)
                        dist.all_reduce(p.grad, group=group)


# -- fsdp -------------------------------------------------------------------------------------------
def fsdp(module: torch.nn.Module, *, sharding_strategy: str = "FULL_SHARD", bucketing: str = "none",
         broadcast_from: int = 0, process_group=None) -> torch.nn.Module:
    """The module with every parameter replaced by this rank's shard, prepared for tf.jit.

    A collective: every rank calls it. After checking that the ranks hold the same parameters
    and broadcasting rank `broadcast_from`'s, each parameter is flattened, padded to a multiple
    of the world size and cut in equal parts; rank r keeps part r as the module's parameter
    (same name, requires_grad as before). `tf.jit(module)` gathers parameters in the forward
    and reduce-scatters their gradients in the backward. "FULL_SHARD" frees a gathered
    parameter after its last use in the forward and gathers it again in the backward;
    "SHARD_GRAD_OP" keeps it from the forward to the backward. Buffers stay whole (broadcast).
    `bucketing`: "none", one all_gather (and one reduce_scatter) per parameter, or "module", one
    for all the parameters each submodule holds itself (a Linear's weight and bias): fewer,
    larger collectives. The module computes only under tf.jit from then on.

    Returns the module itself. Its `parameters()` are the flat shards, so an ordinary torch
    optimizer made afterwards steps them; full_parameters and full_state_dict rebuild the
    whole ones. It needs a process group, as ddp does; an unknown sharding_strategy or
    bucketing is an ArgumentValueError.

        >>> import torch, torch.distributed as dist, thunderfn as tf
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # this process alone
        >>> model = tf.distributed.fsdp(torch.nn.Linear(4, 3))
        >>> {name: tuple(p.shape) for name, p in model.named_parameters()}  # one rank: all of it, flat
        {'weight': (12,), 'bias': (3,)}
        >>> jitted = tf.jit(model)
        >>> jitted(torch.randn(8, 4)).sum().backward()
        >>> model.weight.grad.shape  # the gradient of this rank's shard
        torch.Size([12])
        >>> dist.destroy_process_group()
    """
    if sharding_strategy not in STRATEGIES:
        raise ArgumentValueError(f"sharding_strategy must be one of {STRATEGIES}, got {sharding_strategy!r}")
    if bucketing not in BUCKETING:
        raise ArgumentValueError(f"bucketing must be one of {BUCKETING}, got {bucketing!r}")
    world = _prepare(module, "fsdp", broadcast_from, process_group)
    rank = dist.get_rank(process_group)
    shapes, sharded, owners = [], {}, []
    with torch.no_grad():
        for name, param in list(module.named_parameters()):
            shapes.append(tuple(param.shape))
            if id(param) not in sharded:  # a parameter shared by two modules: one shard, shared too
                sharded[id(param)] = torch.nn.Parameter(_shard_of(param.detach(), world, rank).clone(),
                                                        requires_grad=param.requires_grad)
            owner_name, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            owners.append(owner_name)
            setattr(owner, attr, sharded[id(param)])
        _share_tied(module, sharded)
    if bucketing == "module":  # each submodule's own parameters together, in order
        by_owner: dict = {}
        for i, owner in enumerate(owners):
            by_owner.setdefault(owner, []).append(i)
        buckets = list(by_owner.values())
    else:
        buckets = [[i] for i in range(len(shapes))]
    module._thunderfn_fsdp = Sharded(group_id=collectives.group_id(process_group), world_size=world,
                                     strategy=sharding_strategy, shapes=shapes, buckets=buckets)
    return module


def _shard_of(whole: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s part of `whole`: flattened, padded with zeros to a multiple of world, cut in
    world equal parts (ltorch.unshard puts them back together)."""
    per_rank = collectives.shard_numel(whole.numel(), world)
    flat = torch.nn.functional.pad(whole.reshape(-1), (0, per_rank * world - whole.numel()))
    return flat[rank * per_rank:(rank + 1) * per_rank]


def _share_tied(module: torch.nn.Module, sharded: dict) -> None:
    """Parameters named_parameters() left out as duplicates (tied weights) get their shard too."""
    for owner in module.modules():
        for attr, param in list(owner._parameters.items()):
            if param is not None and id(param) in sharded:
                owner._parameters[attr] = sharded[id(param)]


def _sharding(module) -> tuple[torch.nn.Module, Sharded]:
    inner = _inner(module)
    config = inner.__dict__.get("_thunderfn_fsdp")
    if config is None:
        raise DistributedError("this is for a module prepared with tf.distributed.fsdp")
    return inner, config


def full_parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, by name (a collective: every rank calls it and gets all of them).

    For a module prepared with tf.distributed.fsdp (another is a DistributedError): each
    parameter's shards are gathered from the ranks and reshaped to the parameter's original
    shape. For a checkpoint with the buffers too, use tf.distributed.full_state_dict.

        >>> import torch, torch.distributed as dist, thunderfn as tf
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # this process alone
        >>> linear = torch.nn.Linear(4, 3)
        >>> weight = linear.weight.detach().clone()
        >>> model = tf.distributed.fsdp(linear)
        >>> full = tf.distributed.full_parameters(model)
        >>> {name: tuple(p.shape) for name, p in full.items()}
        {'weight': (3, 4), 'bias': (3,)}
        >>> torch.testing.assert_close(full["weight"], weight)
        >>> dist.destroy_process_group()
    """
    inner, config = _sharding(module)
    with torch.no_grad():
        return {name: collectives.unshard(shard.detach(), shape, config.group_id)
                for (name, shard), shape in zip(inner.named_parameters(), config.shapes)}


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model's state_dict (whole parameters and the buffers); a collective. Save it
    from one rank to get a checkpoint an unsharded model loads. `module.state_dict()` is the
    sharded one: each rank's shards, padded, which `module.load_state_dict` takes back."""
    inner, _ = _sharding(module)
    whole = full_parameters(module)
    return {name: whole.get(name, value) for name, value in inner.state_dict().items()}


def load_full_state_dict(module: torch.nn.Module, state_dict: dict) -> None:
    """Load an unsharded state_dict (a full_state_dict, or an unsharded model's) into a sharded
    module: each rank copies in its shard of every parameter, and the buffers whole."""
    inner, config = _sharding(module)
    rank = dist.get_rank(collectives._groups[config.group_id])
    with torch.no_grad():
        for (name, shard), shape in zip(inner.named_parameters(), config.shapes):
            whole = state_dict[name]
            if tuple(whole.shape) != tuple(shape):
                raise ArgumentValueError(f"load_full_state_dict: {name} is {tuple(whole.shape)} in the state_dict but "
                                 f"{tuple(shape)} in the model")
            shard.copy_(_shard_of(whole, config.world_size, rank))
        for name, buffer in inner.named_buffers():
            if name in state_dict:
                buffer.copy_(state_dict[name])
