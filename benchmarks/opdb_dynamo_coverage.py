"""How much of PyTorch runs through `torch.compile(fn, backend="thunderfn")` exactly like eager:
torch's OpInfo database as the yardstick, through Dynamo and the thunderfn backend.

The same checks as opdb_coverage.py (forward) and opdb_grad_coverage.py (gradients), with the
function under test compiled by torch.compile with the thunderfn backend instead of tf.jit/tf.grad,
Dynamo reset before each sample:

- forward: the first N float32 samples (--dtype) of every op_db entry, `op(*args, **kwargs)` compiled, every
  output against eager (assert_close, NaNs equal);
- gradients: for the entries that support autograd, the first N float32 samples with
  requires_grad=True; the compiled function returns the sum of the op's floating outputs, and
  torch.autograd.grad of it with respect to the sample's floating leaves is compared with eager's.

Counts: pass (matches eager), WRONG (a different value: the outcome that must never happen), error
(raised; CRASH when not a thunderfn error), left out (eager raises or is nondeterministic, ...). A
passing entry where the backend ran nodes eagerly (split out) or got no graph from Dynamo is
listed with what ran elsewhere.

    python benchmarks/opdb_dynamo_coverage.py               # both, summary
    python benchmarks/opdb_dynamo_coverage.py -v -k sin     # one line per entry whose name contains 'sin'
    python benchmarks/opdb_dynamo_coverage.py --only grad   # gradients only

Needs `pip install expecttest` (torch's test helpers import it).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

import opdb_coverage
import opdb_grad_coverage
from harness import ThunderfnBackend, entry_name, print_failures, run_all  # (run from benchmarks/ or the root)


def forward_entry(opinfo, samples: int, backend: ThunderfnBackend, dtype=torch.float32):
    """opdb_coverage.run_entry with the op compiled through the backend."""
    return opdb_coverage.run_entry(opinfo, samples, compile=backend.compile, dtype=dtype)


def grad_entry(opinfo, samples: int, backend: ThunderfnBackend, dtype=torch.float32):
    """opdb_grad_coverage.run_entry with the gradients torch.autograd takes through the compiled function."""
    def differentiate(fn, leaves):
        return opdb_grad_coverage._eager_grad(backend.compile(fn), leaves)[1]

    return opdb_grad_coverage.run_entry(opinfo, samples, None, None, dtype=dtype, differentiate=differentiate)


def checked_by(backend: ThunderfnBackend, run_entry):
    """run_entry, with a pass where something ran outside thunderfn noted in its detail."""
    def run(argument):
        backend.clear()
        outcome, detail = run_entry(argument)
        elsewhere = backend.ran_elsewhere()
        if outcome == "pass" and elsewhere:
            detail = "ran elsewhere: " + "; ".join(elsewhere)
        elif outcome in ("wrong", "error") and elsewhere:
            detail += " [ran elsewhere: " + "; ".join(elsewhere) + "]"
        return outcome, detail
    return run


def report(title: str, results, failures, seconds: float) -> None:
    counted = results["pass"] + results["wrong"] + results["error"]
    partly = sorted((name, detail) for outcome, name, detail in failures if outcome == "pass")
    print(f"\n{title}: {results['pass']} of {counted} pass (match eager), {results['wrong']} WRONG, "
          f"{results['error']} errors; {results['skip']} left out; {seconds:.0f} s")
    print(f"  of the passes, {len(partly)} ran something outside thunderfn:")
    for name, detail in partly:
        print(f"    {name:40} {detail[:240]}")
    print_failures([f for f in failures if f[0] != "pass"])


def backend_arguments(description: str) -> argparse.ArgumentParser:
    """The options both database checks through the backend take (this one and moduledb_dynamo_coverage.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-k", default="", help="only entries whose name contains this")
    parser.add_argument("--recompile", action="store_true",
                        help="reset Dynamo once per entry, not per sample: later samples recompile with dynamic sizes")
    parser.add_argument("--dynamic", action="store_true", help="torch.compile(dynamic=True): every size symbolic")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per entry (counts as an error)")
    return parser


def backend_for(args) -> ThunderfnBackend:
    warnings.filterwarnings("ignore")
    return ThunderfnBackend(reset_each=not args.recompile, dynamic=args.dynamic or None)


def main(argv=None) -> int:
    parser = backend_arguments(__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--only", choices=("forward", "grad"), default=None)
    parser.add_argument("--dtype", default="float32", help="the samples' dtype (torch.<dtype>)")
    args = parser.parse_args(argv)
    backend = backend_for(args)
    from torch.testing._internal.common_methods_invocations import op_db

    dtype = getattr(torch, args.dtype)
    entries = [(entry_name(o), o) for o in op_db if args.k in entry_name(o)]
    wrong = 0
    if args.only in (None, "forward"):
        start = time.perf_counter()
        forward = checked_by(backend, lambda o: forward_entry(o, args.samples, backend, dtype))
        results, failures, _ = run_all(entries, forward, verbose=args.verbose, timeout=args.timeout, keep_passes=True)
        report(f"op_db forward ({args.dtype}) through torch.compile(backend='thunderfn')", results, failures,
               time.perf_counter() - start)
        wrong += results["wrong"]
    if args.only in (None, "grad"):
        start = time.perf_counter()
        grad = checked_by(backend, lambda o: grad_entry(o, args.samples, backend, dtype))
        results, failures, _ = run_all([(n, o) for n, o in entries if o.supports_autograd], grad,
                                       verbose=args.verbose, timeout=args.timeout, keep_passes=True)
        report(f"op_db gradients ({args.dtype}) through torch.compile(backend='thunderfn')", results, failures,
               time.perf_counter() - start)
        wrong += results["wrong"]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
