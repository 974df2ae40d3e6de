"""Training-step cost: forward + loss.backward() through eager, torch.compile and thunderfn.jit,
side by side in one process.

    python benchmarks/bench_training.py                # both workloads
    python benchmarks/bench_training.py --no-compile   # skip torch.compile (its cold compile takes ~10 s)

Variants: eager, thunderfn.jit with the default executors, thunderfn.jit with the Inductor fusion
executor first (which rematerializes by default), the same without rematerialization, and torch.compile. Workloads: an
MLP (4 x Linear 1024 with GELU, batch 64) and a GPT block (n_embd 256, 4 heads, sequence 128, batch 8). Columns: median
step time, ratio to eager, first step (tracing and compiling included), the tensors autograd keeps between forward and
backward (the activation memory; measured through saved-tensor hooks, so on CPU too) and the peak memory allocated
during a step (on CUDA torch's peak counter; on CPU the running sum of the profiler's allocation events). Every
variant's gradients are checked against eager before timing, and timing rounds alternate between the variants.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.examples.gpt import Block, GPTConfig
from thunderfn.executors import inductor


def mlp_workload(device):
    layers = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.GELU()]
    model = nn.Sequential(*layers[:-1]).to(device)
    x, y = torch.randn(64, 1024, device=device), torch.randn(64, 1024, device=device)
    return model, lambda m: F.mse_loss(m(x), y)


def gpt_block_workload(device):
    model = Block(GPTConfig(n_embd=256, n_head=4, block_size=128)).to(device)
    x = torch.randn(8, 128, 256, device=device)
    return model, lambda m: m(x).pow(2).mean()


def step(model, loss_of):
    for p in model.parameters():
        p.grad = None
    loss_of(model).backward()


def interleaved_medians(models: dict, loss_of, device, rounds: int, calls: int) -> dict:
    """Median step time (ms) of each model. Rounds alternate between the models, so that a
    machine that speeds up or slows down during the run (other work, clocks) affects all alike."""
    for model in models.values():
        for _ in range(3):
            step(model, loss_of)
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(calls):
                step(model, loss_of)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / calls * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def saved_for_backward(model, loss_of) -> str:
    """What torch.autograd keeps alive between forward and backward (every tensor saved for
    backward, each storage counted once): the activation memory of a step, measurable on CPU."""
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    for p in model.parameters():
        p.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model)
    loss.backward()
    return f"{sum(storages.values()) / 2**20:.1f} MiB"


def cpu_peak_bytes(fn) -> int:
    """The most bytes that fn's CPU allocations held at once, beyond what was allocated before it
    ran: the running sum of the profiler's allocation and free events (torch keeps no CPU peak
    counter as it does for CUDA)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for e in events:
        held += e.nbytes()
        peak = max(peak, held)
    return peak


def peak_memory(model, loss_of, device) -> str:
    if device.type != "cuda":
        step(model, loss_of)  # as on CUDA: a warm step first, so lazily made state is not counted
        return f"{cpu_peak_bytes(lambda: step(model, loss_of)) / 2**20:.0f} MiB"
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step(model, loss_of)
    torch.cuda.synchronize()
    return f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"


# Fusion on top of the default executors (sdpa for attention): the way to add a fusion executor.
# `executors=["inductor"]` alone would drop sdpa, and attention's backward would run as its math decomposition.
_WITH_INDUCTOR = [*tf.executors.get_default_executors(), "inductor"]
VARIANTS = {
    "eager": lambda model: model,
    "thunderfn.jit(module)": tf.jit,
    "thunderfn.jit(module, +inductor)": lambda model: tf.jit(model, executors=_WITH_INDUCTOR),
    # rematerialization is on by default with a fusion executor: this row shows what it changes
    "thunderfn.jit(module, +inductor, no remat)": lambda model: tf.jit(model, executors=_WITH_INDUCTOR,
                                                                       rematerialize=False),
    # the first calls run unfused while the regions compile on a background thread
    "thunderfn.jit(module, +inductor_background)": lambda model: tf.jit(
        model, executors=[*tf.executors.get_default_executors(), "inductor_background"]),
    "torch.compile": torch.compile,
}
WORKLOADS = {"mlp 4x1024 b64": mlp_workload, "gpt block 256/4h/128": gpt_block_workload}
COMPILING = ("thunderfn.jit(module, +inductor)", "thunderfn.jit(module, +inductor_background)", "torch.compile")


def cold_first_step(workload: str, variant: str) -> str:
    """The first step of `variant` in a new process with an empty Inductor cache: a cold compile,
    which a first step in this process (after other variants warmed Inductor up) is not."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        done = subprocess.run([sys.executable, __file__, "--first-step-only", workload, variant], env=env,
                              capture_output=True, text=True)
    if done.returncode != 0:
        return f"n/a ({(done.stderr.strip().splitlines() or ['failed'])[-1][:60]})"
    return done.stdout.strip().splitlines()[-1]


def first_step_only(workload: str, variant: str, threads: int) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base, loss_of = WORKLOADS[workload](torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    model = VARIANTS[variant](base)
    start = time.perf_counter()
    step(model, loss_of)
    print(f"{time.perf_counter() - start:.1f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cold", action="store_true",
                        help="also time the first step of each compiling variant in a new process with an empty "
                             "Inductor cache (a minute or more)")
    parser.add_argument("--first-step-only", nargs=2, metavar=("WORKLOAD", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_step_only:
        return first_step_only(*args.first_step_only, args.threads)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device {device}, torch {torch.__version__}, intra-op threads {torch.get_num_threads()}")
    rows = []
    for name, make in WORKLOADS.items():
        torch.manual_seed(0)
        base, loss_of = make(device)
        variants = {name: (lambda make_one=make_one: make_one(copy.deepcopy(base)))
                    for name, make_one in VARIANTS.items()
                    if not (args.no_compile and name == "torch.compile")}
        reference, ready, first = None, {}, {}
        for variant, make_variant in variants.items():
            try:
                model = make_variant()
                start = time.perf_counter()
                step(model, loss_of)  # the first step: tracing and compiling included
                first[variant] = (time.perf_counter() - start) * 1e3
                inductor.wait_for_background_compiles()  # what is timed next runs compiled
                grads = [p.grad.clone() for p in model.parameters()]
                if reference is None:
                    reference = grads
                else:
                    for g, r in zip(grads, reference):
                        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-3)
                ready[variant] = model
            except Exception as e:  # a variant that cannot build or run here is reported, not fatal
                rows.append((name, variant, f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:60]})", "", "", "", ""))
        medians = interleaved_medians(ready, loss_of, device, args.rounds, args.calls)
        for variant, model in ready.items():
            ms = medians[variant]
            rows.append((name, variant, f"{ms:.2f}", f"{ms / medians['eager']:.2f}x", f"{first[variant]:.0f}",
                         saved_for_backward(model, loss_of), peak_memory(model, loss_of, device)))
    header = ("workload", "variant", "median step ms", "vs eager", "first step ms", "saved for backward", "peak memory")
    if args.cold:
        header += ("cold first step s",)
        rows = [row + (cold_first_step(row[0], row[1]) if row[1] in COMPILING else "",) for row in rows]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    main()
