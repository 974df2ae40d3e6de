"""Per-call overhead: eager PyTorch vs torch.compile vs thunderfn.jit, in one process.

Workloads:
  tiny  `torch.sin(x) * y + x` on 16-element tensors: three torch ops whose compute
        is negligible, so the per-call time is almost all framework overhead.
  scalar `torch.sin(x * 2 + 1)` on 16 elements: the cached-call goal (<= 1.0x eager);
        each Python-number operand costs torch a wrapped-number tensor, in eager as in the trace.
  gpt   forward of thunderfn.examples.gpt.GPT (vocab 64, 64 channels, 4 heads,
        32 tokens, batch 4) with loss, eval mode, no_grad.

Every variant's output is checked against eager before it is timed. Timing: one
untimed first call (reported: for the compiled variants it includes tracing and
compilation), warmup calls, then ROUNDS rounds of REPS back-to-back calls timed with
time.perf_counter_ns; the reported per-call time is the median over rounds. Rounds
of the variants are interleaved so that a burst of background load hits all of them.
First-call times are measured in this one process, so a module imported lazily (torch.compile
pulls in sympy, which thunderfn's shape checks also use) is paid by the first variant that
needs it.

    python benchmarks/bench_overhead.py                 # everything
    python benchmarks/bench_overhead.py --no-compile    # skip torch.compile (~10 s+ per workload)
"""
from __future__ import annotations

import argparse
import statistics
import time
import traceback

import torch

import thunderfn as tf
from thunderfn.examples.gpt import GPTConfig, make_example


def tiny(x, y):
    return torch.sin(x) * y + x


def tiny_scalar(x):
    return torch.sin(x * 2 + 1)


def make_workloads():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, generator=generator)
    y = torch.randn(16, generator=generator)
    model, idx, targets = make_example(GPTConfig(), seed=0)

    def gpt_forward(idx, targets):
        return model(idx, targets)

    return {
        "tiny (3 ops, 16 elements)": {
            "args": (x, y),
            "variants": {
                "eager": lambda: tiny,
                "torch.compile": lambda: torch.compile(tiny),
                "thunderfn.jit": lambda: tf.jit(tiny),
            },
        },
        "sin(x*2+1) (16 elements)": {
            "args": (x,),
            "variants": {
                "eager": lambda: tiny_scalar,
                "torch.compile": lambda: torch.compile(tiny_scalar),
                "thunderfn.jit": lambda: tf.jit(tiny_scalar),
            },
        },
        "gpt block forward + loss": {
            "args": (idx, targets),
            "variants": {
                "eager": lambda: model,
                "torch.compile": lambda: torch.compile(model),
                "thunderfn.jit(fn)": lambda: tf.jit(gpt_forward),
                "thunderfn.jit(module)": lambda: tf.jit(model),
            },
        },
    }


class Variant:
    """One callable under test: built, first-called, checked, then timed round by round."""

    def __init__(self, name: str, build):
        self.name = name
        self.build = build
        self.fn = None
        self.first_call_ms: float | None = None
        self.round_us: list[float] = []
        self.failure: str | None = None  # why it was not timed

    def prepare(self, args, reference, warmup: int, verbose: bool = False) -> None:
        try:
            start = time.perf_counter_ns()
            self.fn = self.build()
            out = self.fn(*args)
            self.first_call_ms = (time.perf_counter_ns() - start) / 1e6
        except Exception as e:  # torch.compile needs a C++ compiler and more; report, don't crash
            self.failure = f"{type(e).__name__}: {_first_line(e)}"
            if verbose:
                traceback.print_exc()
            return
        if reference is not None and not _allclose(out, reference):
            self.failure = "wrong result: output differs from eager"
            return
        for _ in range(warmup):
            self.fn(*args)

    def time_round(self, args, reps: int) -> None:
        fn = self.fn
        start = time.perf_counter_ns()
        for _ in range(reps):
            fn(*args)
        self.round_us.append((time.perf_counter_ns() - start) / reps / 1e3)

    @property
    def median_us(self) -> float:
        return statistics.median(self.round_us)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 100 else line[:97] + "..."


def _allclose(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_allclose(x, y) for x, y in zip(a, b))
    return a == b


def reps_for(variant: Variant, args, target_round_ms: float) -> int:
    """Calls per round so that one round of this variant takes about target_round_ms."""
    start = time.perf_counter_ns()
    calls = 0
    while time.perf_counter_ns() - start < 20e6:  # 20 ms of probing
        variant.fn(*args)
        calls += 1
    per_call_ns = (time.perf_counter_ns() - start) / calls
    return max(10, int(target_round_ms * 1e6 / per_call_ns))


def run_workload(name: str, workload: dict, options) -> list[tuple]:
    args = workload["args"]
    variants = [Variant(n, build) for n, build in workload["variants"].items()
                if not (options.no_compile and n == "torch.compile")]
    eager = variants[0]
    eager.prepare(args, None, options.warmup, options.verbose)
    reference = eager.fn(*args)
    for v in variants[1:]:
        print(f"  preparing {name}: {v.name}", flush=True)
        v.prepare(args, reference, options.warmup, options.verbose)
    timed = [v for v in variants if v.failure is None]
    reps = {v.name: reps_for(v, args, options.round_ms) for v in timed}
    for _ in range(options.rounds):
        for v in timed:
            v.time_round(args, reps[v.name])
    rows = []
    for v in variants:
        if v.failure is not None:
            rows.append((name, v.name, f"n/a ({v.failure})", "", ""))
            continue
        ratio = v.median_us / eager.median_us
        rows.append((name, v.name, f"{v.median_us:.1f}", f"{ratio:.2f}x", f"{v.first_call_ms:.1f}"))
    return rows


def print_table(rows) -> None:
    header = ("workload", "variant", "median us/call", "vs eager", "first call ms")
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    print(fmt.format(*header))
    print(fmt.format(*("-" * w for w in widths)))
    for row in rows:
        print(fmt.format(*row))


def parse_timing_options(argv, description: str, *, rounds: int, round_ms: float, warmup: int, extra=None):
    """The options every timing benchmark takes (bench_fusion.py too); `extra(parser)` adds its own.
    Sets torch's thread count and prints the run's settings."""
    parser = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(parser)
    parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds per variant; the median is reported")
    parser.add_argument("--round-ms", type=float, default=round_ms,
                        help="target duration of one round (sets calls/round)")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed calls after the first call")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a busy 2-core machine a second thread "
                             "turns other processes' load into large, erratic slowdowns)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks of variants that fail")
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    print(f"torch {torch.__version__}, thunderfn {tf.__version__}, intra-op threads: {torch.get_num_threads()}, "
          f"{options.rounds} rounds of ~{options.round_ms:g} ms per variant, median reported")
    return options


def main(argv=None) -> None:
    options = parse_timing_options(argv, __doc__.splitlines()[0], rounds=15, round_ms=50.0, warmup=20)
    rows = []
    with torch.no_grad():
        for name, workload in make_workloads().items():
            rows += run_workload(name, workload, options)
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
