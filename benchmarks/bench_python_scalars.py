"""A Python float that changes every call: a MAML-like meta-gradient step with a scheduled inner step size.

The outer function is `tf.grad(meta_loss)(w, x, y, alpha)`: one inner gradient step on (x, y) with step size
`alpha`, then the loss at the adapted weights, differentiated with respect to the initial weights (a second
derivative through the inner step). `alpha` follows a schedule, a new Python float on every call. Printed per
variant: the median time of a call once warmed up (over `--calls` calls, each with a new alpha), the compiles
(tf.cache_info's misses) and the largest difference from torch.func's gradient on the same calls.

- float: alpha passed as a Python float. Traced as a value after its second value, so two compiles and then
  every call is a hit; before that (thunderfn up to 0.x) every new value compiled anew, with no limit under
  tf.grad (its entries evicted in turn, silently);
- tensor: alpha passed as a 0-d tensor (what the float had to be turned into before);
- eager: torch.func.grad of the same function, uncompiled.

    python benchmarks/bench_python_scalars.py                  # 200 calls per variant (a minute on 2 cores)
    python benchmarks/bench_python_scalars.py --calls 50

Run it against another checkout (PYTHONPATH=/path/to/src) to compare before and after. Benchmarks are not
tests: nothing here asserts a time. Timings on a shared machine are noisy: compare variants within one run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import thunderfn as tf


def meta_loss_with(grad):
    """The meta-loss, its inner gradient taken by `grad` (tf.grad, or torch.func.grad for eager's)."""
    def meta_loss(w, x, y, alpha):
        def inner(w):
            return ((torch.tanh(x @ w) - y) ** 2).mean()

        adapted = w - alpha * grad(inner)(w)
        return ((torch.tanh(x @ adapted) - y) ** 2).mean()

    return meta_loss


def run(variant: str, calls: int) -> dict:
    torch.manual_seed(0)
    w, x, y = torch.randn(32, 16), torch.randn(64, 32), torch.randn(64, 16)
    alphas = [0.1 * 0.99 ** k for k in range(calls)]
    step = (torch.func.grad(meta_loss_with(torch.func.grad)) if variant == "eager"
            else tf.grad(meta_loss_with(tf.grad)))
    reference = torch.func.grad(meta_loss_with(torch.func.grad))
    times, error = [], 0.0
    for alpha in alphas:
        given = torch.tensor(alpha) if variant == "tensor" else alpha
        began = time.perf_counter()
        got = step(w, x, y, given)
        times.append(time.perf_counter() - began)
        error = max(error, (got - reference(w, x, y, alpha)).abs().max().item())
    compiles = tf.cache_info(step)["misses"] if variant != "eager" else 0
    steady = times[len(times) // 4:]  # (the first quarter warms up: compiles land there)
    return {"variant": variant, "median_ms": 1e3 * statistics.median(steady), "compiles": compiles,
            "max_error": error}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--variants", nargs="+", default=["float", "tensor", "eager"])
    args = parser.parse_args(argv)
    print(f"{'variant':<8} {'median per call':>16} {'compiles':>9} {'max |grad - torch.func|':>24}")
    for variant in args.variants:
        row = run(variant, args.calls)
        print(f"{row['variant']:<8} {row['median_ms']:>13.2f} ms {row['compiles']:>9} {row['max_error']:>24.2e}")


if __name__ == "__main__":
    main()
