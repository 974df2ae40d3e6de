"""karpathy/nanoGPT's GPT (benchmarks/nanogpt.py), one training step by depth: eager against thunderfn's
default step, `tf.jit(model)` (no fusion).

    python benchmarks/bench_nanogpt.py                    # 2, 8 and 32 layers, one torch thread
    python benchmarks/bench_nanogpt.py --layers 8 --rounds 21

Tiny width (n_embd 64, 4 heads, vocab 256), batch 2 x 32 tokens, training mode with dropout 0, fp32, on
the CPU. A step is: gradients cleared, forward, loss, backward. Per depth it prints the median step time
of each (rounds alternate between the two, `harness.interleaved`) and thunderfn's ratio to eager, in wall
time and in this process's CPU time (which other processes on a shared machine do not inflate); the
matrix multiplies (mm, addmm, bmm, baddbmm) and copies (copy_) one step runs, nested calls included
(thunderfn/testing/op_counts.py: `kernel_counts`); the top-level aten ops of a step; and the largest
gradient difference from eager. The default step runs eager's kernels on eager's operand layouts, so
where the counts match the remaining difference in time is the per-op cost of running the trace.
Benchmarks are not tests: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

import thunderfn as tf
from thunderfn.testing.op_counts import kernel_counts, top_level_aten_ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nanogpt  # noqa: E402  (sibling scripts, not a package)
from harness import interleaved  # noqa: E402


def step(model, idx, targets):
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, targets)
    loss.backward()


def gradient_error(model, reference) -> float:
    """The largest |g - g_ref| / (1 + |g_ref|) over the parameters' gradients."""
    return max(((p.grad - q.grad).abs() / (1 + q.grad.abs())).max().item()
               for p, q in zip(model.parameters(), reference.parameters()))


def measure(n_layer: int, rounds: int, calls: int) -> dict:
    eager, idx, targets = nanogpt.tiny(n_layer)
    jitted = tf.jit(copy.deepcopy(eager))
    models = {"eager": eager, "thunderfn": jitted}
    for model in models.values():
        step(model, idx, targets)  # thunderfn traces and compiles here
    row = {"layers": n_layer, "grad_error": gradient_error(jitted, eager)}
    for name, model in models.items():
        kernels = kernel_counts(lambda: step(model, idx, targets))
        row[name] = {"matmul": kernels["matmul"], "copy": kernels["copy"],
                     "aten_ops": sum(top_level_aten_ops(lambda: step(model, idx, targets)).values())}
    steps = {name: (lambda m=model: step(m, idx, targets)) for name, model in models.items()}
    wall, cpu = interleaved(steps, rounds, calls), interleaved(steps, rounds, calls, clock=time.process_time)
    for name in models:
        row[name]["ms"], row[name]["cpu_ms"] = wall[name], cpu[name]
    return row


def _cells(r: dict) -> tuple:
    e, t = r["eager"], r["thunderfn"]
    return (str(r["layers"]), f"{e['ms']:.2f}", f"{t['ms']:.2f}", f"{t['ms'] / e['ms']:.2f}x",
            f"{e['cpu_ms']:.2f}/{t['cpu_ms']:.2f}", f"{t['cpu_ms'] / e['cpu_ms']:.2f}x",
            *(f"{e[k]}/{t[k]}" for k in ("matmul", "copy", "aten_ops")), f"{r['grad_error']:.1e}")


def _print(rows: list[dict]) -> None:
    header = ("layers", "eager ms", "thunderfn ms", "ratio", "CPU ms eager/tf", "CPU ratio", "matmuls eager/tf",
              "copies eager/tf", "aten ops eager/tf", "grad error")
    table = [header] + [_cells(r) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[2, 8, 32])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, thunderfn {tf.__version__}, CPU, intra-op threads {args.threads}, "
          f"nanoGPT n_embd {nanogpt.TINY['n_embd']}, batch 2 x {nanogpt.TINY['block_size']} tokens, fp32")
    rows = [measure(n, args.rounds, args.calls) for n in args.layers]
    _print(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
