"""Data-parallel training checked against one process: what tests/test_distributed.py spawns.

`run(scenario, world)` starts `world` processes on this machine with the gloo backend
(a file rendezvous: no network), runs the scenario on each, and returns each rank's
result. Every scenario trains a small model on its rank's share of a fixed global batch
and returns what the test compares with `reference(...)`, the same training in one
process on the whole batch.
"""
from __future__ import annotations

import datetime
import os
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import thunderfn as tf

GLOBAL_BATCH = 8
STEPS = 3


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


def global_batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g)


def _optimizer(kind: str, params):
    return torch.optim.SGD(params, lr=0.1) if kind == "sgd" else torch.optim.AdamW(params, lr=0.01)


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def reference(kind: str, accumulate: int = 1) -> list:
    """One process, the whole batch (split into `accumulate` micro-batches whose mean losses
    are averaged): the parameters after STEPS steps."""
    model = make_model(seed=0)
    optimizer = _optimizer(kind, model.parameters())
    for step in range(STEPS):
        x, y = global_batch(step)
        for xs, ys in zip(x.chunk(accumulate), y.chunk(accumulate)):
            (_loss(model, xs, ys) / accumulate).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _train(model, kind: str, rank: int, world: int, accumulate: int = 1, no_sync=None) -> list:
    optimizer = _optimizer(kind, model.parameters())
    for step in range(STEPS):
        x, y = global_batch(step)
        # this rank's share of each micro-batch, as the single process splits them
        micro = list(zip(x.chunk(accumulate), y.chunk(accumulate)))
        for i, (xs, ys) in enumerate(micro):
            local_x, local_y = xs.chunk(world)[rank], ys.chunk(world)[rank]
            quiet = no_sync(model) if (no_sync is not None and i < len(micro) - 1) else _nothing()
            with quiet:
                (_loss(model, local_x, local_y) / accumulate).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _torch_ddp_of_jit(rank, world):
    out = {}
    for kind in ("sgd", "adamw"):
        model = make_model(seed=0)
        wrapped = torch.nn.parallel.DistributedDataParallel(tf.jit(model))
        out[kind] = _train(wrapped, kind, rank, world)
    return out


def _torch_ddp_of_compiled(rank, world):
    """torch's DistributedDataParallel around a model compiled by torch.compile with the thunderfn backend."""
    out = {}
    for kind in ("sgd", "adamw"):
        torch._dynamo.reset()
        compiled = torch.compile(make_model(seed=0), backend="thunderfn")
        out[kind] = _train(torch.nn.parallel.DistributedDataParallel(compiled), kind, rank, world)
        out[kind + "_report"] = str(tf.dynamo.explain(compiled))
    return out


def _tf_ddp(rank, world):
    out = {}
    for kind in ("sgd", "adamw"):
        model = make_model(seed=rank)  # different on each rank: ddp broadcasts rank 0's
        jitted = tf.jit(tf.distributed.ddp(model, bucket_size_in_mb=0.001))  # ~1 KB: several buckets
        out[kind] = _train(jitted, kind, rank, world)
        out[kind + "_backward"] = str(tf.last_backward_traces(jitted)[-1])
    return out


def _tf_ddp_no_sync(rank, world):
    model = make_model(seed=0)
    jitted = tf.jit(tf.distributed.ddp(model))
    return {"adamw": _train(jitted, "adamw", rank, world, accumulate=2, no_sync=tf.distributed.no_sync)}


def _different_models(rank, world):
    model = torch.nn.Linear(4, 4 + rank)
    try:
        tf.distributed.ddp(model)
    except tf.errors.DistributedError as e:
        return {"error": str(e)}
    return {"error": None}


def _refusals(rank, world):
    wrapped = torch.nn.parallel.DistributedDataParallel(make_model(seed=0))
    try:
        tf.jit(wrapped)
    except tf.UnsupportedOpError as e:
        return {"error": str(e)}
    return {"error": None}


def _fused_with_inductor(rank, world):
    """ddp with a fusion executor: the fused backward still all-reduces, and no region spans a collective."""
    model = make_model(seed=0)
    jitted = tf.jit(tf.distributed.ddp(model), executors=["inductor"])
    params = _train(jitted, "sgd", rank, world)
    return {"sgd": params, "sgd_backward": str(tf.last_backward_traces(jitted)[-1])}


def _fsdp(strategy, bucketing="none"):
    def scenario(rank, world):
        out = {}
        for kind in ("sgd", "adamw"):
            model = make_model(seed=rank)
            whole_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            jitted = tf.jit(tf.distributed.fsdp(model, sharding_strategy=strategy, bucketing=bucketing))
            out[kind + "_bytes"] = (sum(p.numel() * p.element_size() for p in model.parameters()), whole_bytes)
            _train(jitted, kind, rank, world)
            whole = tf.distributed.full_parameters(jitted)
            out[kind] = list(whole.values())
        out["forward"] = str(tf.last_traces(jitted)[-1])
        out["backward"] = str(tf.last_backward_traces(jitted)[-1])
        # a checkpoint of the whole model, loaded into a freshly sharded one, gives the same parameters
        state = tf.distributed.full_state_dict(jitted)
        fresh = tf.distributed.fsdp(make_model(seed=7), sharding_strategy=strategy, bucketing=bucketing)
        tf.distributed.load_full_state_dict(fresh, state)
        out["reloaded"] = list(tf.distributed.full_parameters(fresh).values())
        return out
    return scenario


def _collectives_under_transforms(rank, world):
    x = torch.arange(3.0) + rank
    gathered_sum_of_squares = lambda t: tf.distributed.all_gather(t).square().sum()  # noqa: E731
    return {"eager": tf.distributed.all_reduce(x), "jit": tf.jit(lambda t: tf.distributed.all_reduce(t) * 2)(x),
            "grad": tf.grad(gathered_sum_of_squares)(x), "x": x,
            "jit_grad": tf.jit(tf.grad(gathered_sum_of_squares))(x)}


SCENARIOS = {"torch_ddp_of_jit": _torch_ddp_of_jit, "torch_ddp_of_compiled": _torch_ddp_of_compiled, "tf_ddp": _tf_ddp,
             "tf_ddp_no_sync": _tf_ddp_no_sync, "different_models": _different_models, "refusals": _refusals,
             "collectives_under_transforms": _collectives_under_transforms, "fused_with_inductor": _fused_with_inductor,
             "fsdp_full_shard": _fsdp("FULL_SHARD"), "fsdp_shard_grad_op": _fsdp("SHARD_GRAD_OP"),
             "fsdp_full_shard_by_module": _fsdp("FULL_SHARD", "module"),
             "fsdp_shard_grad_op_by_module": _fsdp("SHARD_GRAD_OP", "module")}


def _worker(rank: int, world: int, scenario: str, rendezvous: str, results: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        result = SCENARIOS[scenario](rank, world)
    except Exception:
        result = {"exception": traceback.format_exc()}
    # saved before gloo is torn down: see run
    torch.save(result, os.path.join(results, f"rank{rank}.pt"))
    # every rank's collectives done before any rank tears gloo down: a rank that leaves while its peer's
    # gloo threads still talk to it can abort the peer ("terminate called without an active exception");
    # bounded, since a rank whose scenario raised may never arrive
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    except RuntimeError:
        pass
    dist.destroy_process_group()


def run(scenario: str, world: int = 2) -> list[dict]:
    """Each rank's result of the scenario (a dict; {"exception": traceback} if it raised). A rank that aborts
    after every rank saved its result aborted in gloo's teardown, which the barrier above makes rarer but not
    impossible on a loaded machine (seen under two test workers on two cores): the results stand."""
    with tempfile.TemporaryDirectory() as folder:
        rendezvous = os.path.join(folder, "rendezvous")
        files = [os.path.join(folder, f"rank{r}.pt") for r in range(world)]
        try:
            mp.spawn(_worker, args=(world, scenario, rendezvous, folder), nprocs=world, join=True)
        except mp.ProcessExitedException:
            if not all(os.path.exists(f) for f in files):
                raise
        return [torch.load(f, weights_only=False) for f in files]
