"""Fusion: an elementwise chain, eager vs torch.compile vs thunderfn (default executors and
executors=["inductor"]), in one process.

Workload:
  elementwise  `gelu(x * w + b) * sigmoid(x)`, x of 2048 x 2048 floats (4M), w and b of 2048,
               forward only, under torch.no_grad(). Five torch calls in eager, each reading
               and writing 16 MB; one fused kernel reads x once and writes the result once.

The loop is bench_overhead.py's: every variant's output is checked against eager, then
timed in interleaved rounds; the median per call, its ratio to eager, and the first call
(tracing and compilation included) are printed. Importing Inductor (seconds) is paid by
the first variant that compiles, torch.compile, not by thunderfn's. Inductor keeps an on-disk cache of
compiled kernels, so a first call is much shorter on the second run on a machine; set
TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 to measure a cold compile.

    python benchmarks/bench_fusion.py
    python benchmarks/bench_fusion.py --threads 2 --rounds 15
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import thunderfn as tf  # noqa: E402
from bench_overhead import parse_timing_options, print_table, run_workload  # noqa: E402


def elementwise(x, w, b):
    return F.gelu(x * w + b) * torch.sigmoid(x)


def make_workloads(n: int):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=generator)
    w = torch.randn(n, generator=generator)
    b = torch.randn(n, generator=generator)
    return {
        f"elementwise gelu(x*w+b)*sigmoid(x), {n * n / 2**20:g}M floats": {
            "args": (x, w, b),
            "variants": {
                "eager": lambda: elementwise,
                "torch.compile": lambda: torch.compile(elementwise),
                "thunderfn.jit (defaults)": lambda: tf.jit(elementwise),
                'thunderfn.jit executors=["inductor"]': lambda: tf.jit(elementwise, executors=["inductor"]),
            },
        },
    }


def main(argv=None) -> None:
    options = parse_timing_options(
        argv, __doc__.splitlines()[0], rounds=9, round_ms=100.0, warmup=5,
        extra=lambda parser: parser.add_argument("--n", type=int, default=2048,
                                                 help="x is n x n (default 2048: 4M floats)"))
    print(f"inductor executor: {tf.executors.available()['inductor']}")
    rows = []
    with torch.no_grad():
        for name, workload in make_workloads(options.n).items():
            rows += run_workload(name, workload, options)
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
