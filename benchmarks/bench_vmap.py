"""Batching: per-example gradients and Jacobians, torch.func vs thunderfn, in one process.

Workloads:
  per-example grads  `vmap(grad(loss), in_axes=(None, 0, 0))` of a 3-layer MLP (width 512,
                     GELU, squared error), batch 64: the DP-SGD step's gradients. Against
                     torch.func.vmap(torch.func.grad(...)), thunderfn eagerly and under
                     tf.jit, and a Python loop of torch.func.grad over the examples.
  jacrev             the Jacobian of a 256 -> 256 MLP (2 layers, tanh) at one input:
                     torch.func.jacrev against tf.jacrev, eagerly and under tf.jit.

Ratios are to the first variant of each workload (torch.func). The loop is bench_overhead.py's:
every variant's output is checked against the first one's, then timed in interleaved rounds.

    python benchmarks/bench_vmap.py
    python benchmarks/bench_vmap.py --rounds 15 --threads 2
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import thunderfn as tf  # noqa: E402
from bench_overhead import parse_timing_options, print_table, run_workload  # noqa: E402


def mlp(params, x):
    for i in range(0, len(params) - 2, 2):
        x = F.gelu(x @ params[i] + params[i + 1])
    return x @ params[-2] + params[-1]


def squared_error(params, x, y):
    return ((mlp(params, x) - y) ** 2).sum()


def tanh_mlp(params, x):
    return torch.tanh(torch.tanh(x @ params[0] + params[1]) @ params[2] + params[3])


def make_params(sizes, generator):
    params = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        params += [torch.randn(fan_in, fan_out, generator=generator) / fan_in ** 0.5, torch.zeros(fan_out)]
    return params


def python_loop_grads(params, xs, ys):
    """One torch.func.grad call per example, the gradients stacked: what batching replaces."""
    per_example = [torch.func.grad(squared_error)(params, x, y) for x, y in zip(xs, ys)]
    return [torch.stack(gs) for gs in zip(*per_example)]


def make_workloads(batch: int, width: int):
    generator = torch.Generator().manual_seed(0)
    params = make_params([width, width, width, 10], generator)
    xs, ys = torch.randn(batch, width, generator=generator), torch.randn(batch, 10, generator=generator)
    jac_params = make_params([256, 256, 256], generator)
    x0 = torch.randn(256, generator=generator)
    per_example = {
        "torch.func.vmap(grad)": lambda: torch.func.vmap(torch.func.grad(squared_error), in_dims=(None, 0, 0)),
        "tf.vmap(tf.grad)": lambda: tf.vmap(tf.grad(squared_error), in_axes=(None, 0, 0)),
        "tf.jit(tf.vmap(tf.grad))": lambda: tf.jit(tf.vmap(tf.grad(squared_error), in_axes=(None, 0, 0))),
        "python loop of torch.func.grad": lambda: python_loop_grads,
    }
    jacobian = {
        "torch.func.jacrev": lambda: torch.func.jacrev(tanh_mlp, argnums=1),
        "tf.jacrev": lambda: tf.jacrev(tanh_mlp, argnums=1),
        "tf.jit(tf.jacrev)": lambda: tf.jit(tf.jacrev(tanh_mlp, argnums=1)),
    }
    return {
        f"per-example grads, MLP 3x{width}, batch {batch}": {"args": (params, xs, ys), "variants": per_example},
        "jacrev, MLP 256->256->256": {"args": (jac_params, x0), "variants": jacobian},
    }


def main(argv=None) -> None:
    options = parse_timing_options(
        argv, __doc__.splitlines()[0], rounds=9, round_ms=100.0, warmup=3,
        extra=lambda parser: (parser.add_argument("--batch", type=int, default=64),
                              parser.add_argument("--width", type=int, default=512)))
    rows = []
    for name, workload in make_workloads(options.batch, options.width).items():
        rows += run_workload(name, workload, options)
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
