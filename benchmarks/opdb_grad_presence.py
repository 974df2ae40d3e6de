"""Which tensors get a gradient under `tf.jit` + `torch.autograd`, against eager, over torch's OpInfo database.

For every entry of `torch.testing._internal.common_methods_invocations.op_db` that
supports autograd and has float64, the first N sample inputs (CPU, float64) are run
with every floating tensor argument requiring grad, eagerly and through `tf.jit`, and
`backward()` is taken of the sum of the outputs that require grad
(`thunderfn.testing.grad_presence`). They must agree on each output's
`requires_grad`, on each argument's `.grad` being None or a tensor, and on its value.

An entry passes when every sample agrees. Entries are left out when every sample's
eager run raises, or when eager is nondeterministic (two runs differ). A jitted run
that raises where eager does not is an error; any disagreement is WRONG.

    python benchmarks/opdb_grad_presence.py            # summary; exit status 1 if any entry is WRONG
    python benchmarks/opdb_grad_presence.py -v -k norm

Needs `pip install expecttest` (torch's test helpers import it).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

from harness import entry_name, print_failures, run_all  # (run from benchmarks/ or the repo root)
from opdb_coverage import first_samples
from thunderfn.testing.grad_presence import grad_presence_mismatches
from thunderfn.testing.opinfo import SampleInput


class _Entry:
    """An op_db entry as grad_presence_mismatches reads it: a name and a callable."""

    def __init__(self, opinfo):
        self.name, self.op = entry_name(opinfo), opinfo.op


def _strided(sample: SampleInput) -> bool:
    """thunderfn traces dense tensors only (sparse arguments are refused): such samples are left out."""
    leaves = torch.utils._pytree.tree_leaves((sample.args, sample.kwargs))
    return all(x.layout == torch.strided for x in leaves if isinstance(x, torch.Tensor))


def _deterministic(op, sample: SampleInput) -> bool:
    def once():
        torch.manual_seed(0)
        return op(*sample.args, **sample.kwargs)

    try:
        a, b = once(), once()
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
        return True
    except Exception:
        return False


def run_entry(opinfo, count: int):
    """('pass'|'wrong'|'error'|'skip', detail)."""
    if torch.float64 not in opinfo.dtypes:
        return "skip", "no float64"
    try:
        samples = [SampleInput((s.input, *s.args), dict(s.kwargs))
                   for s in first_samples(opinfo, torch.float64, count, requires_grad=False)]
    except Exception as e:
        return "skip", f"sample_inputs raised {type(e).__name__}"
    samples = [s for s in samples if _strided(s) and _deterministic(opinfo.op, s)]
    if not samples:
        return "skip", "eager raises or is nondeterministic"
    found = grad_presence_mismatches(_Entry(opinfo), samples)
    if not found:
        return "pass", ""
    if all(" jit raised " in f for f in found):
        return "error", found[0][:200]
    return "wrong", next(f for f in found if " jit raised " not in f)[:300]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-k", default="", help="only entries whose name contains this")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=60, help="seconds per entry (counts as an error)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    start = time.perf_counter()
    entries = [(entry_name(o), o) for o in op_db if o.supports_autograd and args.k in entry_name(o)]
    results, failures, _ = run_all(entries, lambda o: run_entry(o, args.samples), verbose=args.verbose,
                                   timeout=args.timeout)
    tested = results["pass"] + results["wrong"] + results["error"]
    print(f"\nop_db through tf.jit + torch.autograd: {results['pass']}/{tested} entries agree with eager "
          f"({100 * results['pass'] / max(tested, 1):.1f}%), {results['wrong']} WRONG, {results['error']} errors, "
          f"{results['skip']} left out; {time.perf_counter() - start:.0f} s")
    print_failures(failures)
    return 1 if results["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
