"""Whether `tf.jit` under `torch.autocast` computes what eager does: torch's OpInfo database as the yardstick.

For every entry of `torch.testing._internal.common_methods_invocations.op_db`, the first
N CPU sample inputs in float32 and in bfloat16 (autocast casts float32 inputs down for
matmul-like ops and bfloat16 inputs up for the float32 list, so both matter) are run
under `torch.autocast("cpu", dtype=torch.bfloat16)`: eagerly, and through `tf.jit`
called under the same autocast. The runs must agree on every output's dtype exactly
and on its values (assert_close at the output dtype's default tolerances, NaNs equal).

An entry passes when all its samples agree. Entries are left out when eager raises or
is random (two eager runs under different seeds disagree). A jitted run that raises is
an error (a refusal if it raises a ThunderFnError, otherwise a CRASH); a different dtype
or value is WRONG.

    python benchmarks/opdb_autocast_coverage.py            # summary; exit status 1 if any entry is WRONG
    python benchmarks/opdb_autocast_coverage.py -v -k mm   # one line per entry, names containing 'mm'

Needs `pip install expecttest` (torch's test helpers import it).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch
from torch.utils import _pytree as pytree

import thunderfn as tf
from harness import Timeout, entry_name, first_line, print_failures, run_all  # (run from benchmarks/ or the root)
from opdb_coverage import UNSPECIFIED_CONTENTS, first_samples  # the sibling forward harness

AUTOCAST_DTYPE = torch.bfloat16


def _under_autocast(fn, *args, **kwargs):
    with torch.autocast("cpu", dtype=AUTOCAST_DTYPE):
        return fn(*args, **kwargs)


def _compare(got, want) -> str | None:
    """Why got differs from want (dtype first), or None."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    if got_spec != want_spec:
        return f"output structure {got_spec} != {want_spec}"
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.dtype != w.dtype:
                return f"dtype {getattr(g, 'dtype', type(g).__name__)} where eager gives {w.dtype}"
            try:
                torch.testing.assert_close(g, w, equal_nan=True)
            except AssertionError as e:
                return "values differ: " + " ".join(str(e).split())[:120]
    return None


def run_entry(opinfo, samples: int):
    """('pass'|'wrong'|'error'|'skip', detail)."""
    if opinfo.name in UNSPECIFIED_CONTENTS:
        return "skip", "contents unspecified (uninitialized memory)"
    tested = 0
    for dtype in (torch.float32, torch.bfloat16):
        if dtype not in opinfo.supported_dtypes("cpu"):
            continue
        try:
            sample_list = first_samples(opinfo, dtype, samples, requires_grad=False)
        except Exception as e:
            return "skip", f"sample_inputs raised {type(e).__name__}"
        for s in sample_list:
            args = (s.input, *s.args)
            try:
                torch.manual_seed(0)
                want = _under_autocast(opinfo.op, *args, **s.kwargs)
                torch.manual_seed(1)
                again = _under_autocast(opinfo.op, *args, **s.kwargs)
            except Exception:
                continue
            if _compare(again, want) is not None:
                return "skip", "random (two eager runs differ)"
            try:
                torch.manual_seed(0)
                got = _under_autocast(tf.jit(lambda *a, **k: opinfo.op(*a, **k)), *args, **s.kwargs)
            except Timeout:
                raise
            except Exception as e:
                kind = "" if isinstance(e, tf.ThunderFnError) else "CRASH "
                return "error", f"{dtype}: {kind}{type(e).__name__}: {first_line(e)}"
            why = _compare(got, want)
            if why is not None:
                return "wrong", f"{dtype}: {why}"
            tested += 1
    return ("pass", "") if tested else ("skip", "eager raises on every sample")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-k", default="", help="only entries whose name contains this")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=60, help="seconds per entry")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    start = time.perf_counter()
    entries = [(entry_name(o), o) for o in op_db if args.k in entry_name(o)]
    results, failures, _ = run_all(entries, lambda o: run_entry(o, args.samples), verbose=args.verbose,
                                   timeout=args.timeout)
    compared = results["pass"] + results["error"] + results["wrong"]
    print(f"\nop_db under torch.autocast('cpu', bfloat16), tf.jit against eager: {results['pass']} of {compared} "
          f"pass ({100 * results['pass'] / max(compared, 1):.1f}%), error {results['error']}, WRONG "
          f"{results['wrong']}; left out {results['skip']}; {time.perf_counter() - start:.0f} s")
    print_failures(failures)
    return 1 if results["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
