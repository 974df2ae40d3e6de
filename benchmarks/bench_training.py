"""Training-step cost: forward + loss.backward() through eager, torch.compile and thunderfn.jit,
side by side in one process.

    python benchmarks/bench_training.py                # both workloads
    python benchmarks/bench_training.py --no-compile   # skip torch.compile (its cold compile takes ~10 s)

Workloads: an MLP (4 x Linear 1024 with GELU, batch 64) and a GPT block (n_embd 256, 4 heads,
sequence 128, batch 8). Columns: median step time, ratio to eager, first step (tracing and
compiling included) and, on CUDA, peak memory allocated during a step (CPU allocations are not
tracked by torch, so it says n/a there). Every variant's gradients are checked against eager
before timing.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.examples.gpt import Block, GPTConfig


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


def measure(model, loss_of, device, rounds: int, calls: int):
    for _ in range(3):
        step(model, loss_of)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            step(model, loss_of)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e3)
    peak = "n/a"
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        step(model, loss_of)
        torch.cuda.synchronize()
        peak = f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
    return statistics.median(times), peak


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device {device}, torch {torch.__version__}, intra-op threads {torch.get_num_threads()}")
    rows = []
    for name, make in (("mlp 4x1024 b64", mlp_workload), ("gpt block 256/4h/128", gpt_block_workload)):
        torch.manual_seed(0)
        base, loss_of = make(device)
        variants = {"eager": copy.deepcopy(base), "thunderfn.jit(module)": tf.jit(copy.deepcopy(base))}
        if not args.no_compile:
            variants["torch.compile"] = torch.compile(copy.deepcopy(base))
        reference = None
        eager_ms = None
        for variant, model in variants.items():
            try:
                start = time.perf_counter()
                step(model, loss_of)  # the first step: tracing and compiling included
                first_ms = (time.perf_counter() - start) * 1e3
                grads = [p.grad.clone() for p in model.parameters()]
                if reference is None:
                    reference = grads
                else:
                    for g, r in zip(grads, reference):
                        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-3)
                ms, peak = measure(model, loss_of, device, args.rounds, args.calls)
            except Exception as e:  # a variant that cannot build or run here is reported, not fatal
                rows.append((name, variant, f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:60]})", "", "", ""))
                continue
            eager_ms = eager_ms or ms
            rows.append((name, variant, f"{ms:.2f}", f"{ms / eager_ms:.2f}x", f"{first_ms:.0f}", peak))
    header = ("workload", "variant", "median step ms", "vs eager", "first step ms", "peak memory")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    main()
