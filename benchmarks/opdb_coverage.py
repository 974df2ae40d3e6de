"""How much of PyTorch runs under thunderfn: torch's own OpInfo database as the yardstick.

For every entry of `torch.testing._internal.common_methods_invocations.op_db`, the
first N sample inputs (CPU, float32) run eagerly and through `tf.jit`. An entry
passes when every sample matches (assert_close, NaNs equal). Entries whose eager run
raises or is nondeterministic (two eager runs disagree: random ops) are left out.
A jitted run that raises counts as an error (a refusal, if it is a thunderfn error
naming the op); one that returns a different value counts as WRONG, the one outcome
that must never happen.

    python benchmarks/opdb_coverage.py            # summary
    python benchmarks/opdb_coverage.py -v         # one line per entry
    python benchmarks/opdb_coverage.py -k sin     # entries whose name contains 'sin'

Needs `pip install expecttest` (torch's test helpers import it).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

import thunderfn as tf
from harness import clone, entry_name, error_outcome, print_failures, run_all  # (run from benchmarks/ or the repo root)


def _mismatch(a, b) -> str | None:
    """None when a matches b, else the first words of how they differ."""
    try:
        torch.testing.assert_close(a, b, equal_nan=True, check_device=True)
        return None
    except (AssertionError, TypeError, ValueError, RuntimeError) as e:
        return " ".join(str(e).split())[:200]


def _same(a, b) -> bool:
    return _mismatch(a, b) is None


# Factories of uninitialized memory: any contents are correct, so values cannot be compared.
UNSPECIFIED_CONTENTS = {"empty", "empty_like", "new_empty", "empty_strided", "empty_permuted", "new_empty_strided"}


def first_samples(opinfo, dtype, count: int, *, requires_grad: bool) -> list:
    """The first `count` CPU sample inputs of an op_db entry (shared with opdb_grad_coverage.py)."""
    chosen = []
    for sample in opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad):
        chosen.append(sample)
        if len(chosen) == count:
            break
    return chosen


def run_entry(opinfo, samples: int, compile=tf.jit, dtype=torch.float32):
    """('pass'|'wrong'|'error'|'skip', detail); `compile(fn)` is what runs the op under test
    (opdb_dynamo_coverage.py gives torch.compile's)."""
    if opinfo.name in UNSPECIFIED_CONTENTS:
        return "skip", "contents unspecified (uninitialized memory)"
    try:
        sample_list = first_samples(opinfo, dtype, samples, requires_grad=False)
    except Exception as e:
        return "skip", f"sample_inputs raised {type(e).__name__}"
    if not sample_list:
        return "skip", f"no {str(dtype).removeprefix('torch.')} samples"
    op = opinfo.op
    for s in sample_list:
        args = (s.input, *s.args)
        try:
            torch.manual_seed(0)
            expected = op(*clone(args), **clone(s.kwargs))
            torch.manual_seed(0)
            again = op(*clone(args), **clone(s.kwargs))
        except Exception as e:
            return "skip", f"eager raised {type(e).__name__}"
        if not _same(expected, again):
            return "skip", "eager is nondeterministic"
        try:
            jitted = compile(lambda *a, **k: op(*a, **k))
            torch.manual_seed(0)
            got = jitted(*clone(args), **clone(s.kwargs))
        except Exception as e:  # (an entry's error, named or a crash: harness.error_outcome)
            return error_outcome(e)
        mismatch = _mismatch(got, expected)
        if mismatch is not None:
            return "wrong", f"{mismatch}; sample {s}"[:300]
    return "pass", ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-k", default="", help="only entries whose name contains this")
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    start = time.perf_counter()
    entries = [(entry_name(o), o) for o in op_db if args.k in entry_name(o)]
    results, failures, _ = run_all(entries, lambda o: run_entry(o, args.samples), verbose=args.verbose)
    counted = results["pass"] + results["wrong"] + results["error"]
    print(f"\nop_db entries: {sum(results.values())}; left out (eager raises, nondeterministic, unspecified "
          f"contents or no samples): {results['skip']}; counted: {counted}")
    if counted:
        print(f"pass {results['pass']} ({100 * results['pass'] / counted:.1f}%), "
              f"error {results['error']}, WRONG {results['wrong']}   [{time.perf_counter() - start:.0f} s]")
    if not args.verbose:
        print_failures(failures)
    return 1 if results["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
