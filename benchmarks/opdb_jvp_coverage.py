"""How much of PyTorch `tf.jvp` differentiates in forward mode: torch's OpInfo database as the yardstick.

For every entry of `torch.testing._internal.common_methods_invocations.op_db` with float64,
the first N sample inputs (CPU, float64, requires_grad=True) are differentiated in forward
mode. The function under test takes the sample's floating tensor leaves that require grad
(the input and any such tensors in args/kwargs, found with torch's pytree: op_db's own word on
which arguments are differentiable; a loss's class weights are not) positionally, rebuilds the
call, and returns the op's floating output tensors. Each leaf gets a random tangent (from a generator of the
harness's own, so the global one is untouched). The reference is `torch.func.jvp` under
`torch.manual_seed(0)`; thunderfn's is `tf.jvp` under `torch.manual_seed(0)` too, so a random
op (dropout, rrelu, fractional max pooling) draws what torch drew, and its tangent must be
computed with the primal's draws.

An entry matches when every sample's outputs and tangents match (assert_close, NaNs equal,
float64 defaults unless --rtol/--atol are given; TORCH_IMPRECISE lists where torch.func.jvp's own
tangent is off, compared at 1e-5 and said so). Entries are left out (skipped, with the
reason) when the sample inputs raise, torch.func.jvp raises (no forward-mode formula in
torch, or the op rejects the sample), torch.func.jvp gives two answers under the same seed,
or no sample has a floating input and a floating output. A thunderfn run that raises counts
as an error (a refusal if it raises a ThunderFnError, named by its class, otherwise a CRASH);
a primal or tangent that differs counts as a MISMATCH: a silent wrong answer, the one
outcome that must never happen.

    python benchmarks/opdb_jvp_coverage.py                        # table of outcomes, totals
    python benchmarks/opdb_jvp_coverage.py -v                     # one line per entry, with its time
    python benchmarks/opdb_jvp_coverage.py --ops dropout2d rrelu  # these entries only (names as listed)
    python benchmarks/opdb_jvp_coverage.py -k pool                # entries whose name contains 'pool'

Needs `pip install expecttest` (torch's test helpers import it).
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
import warnings

import torch
from torch.utils import _pytree as pytree

import thunderfn as tf
from harness import (  # (run from benchmarks/ or the root)
    Timeout,
    add_sample_options,
    check_tolerances,
    clone,
    entry_name,
    error_outcome,
    print_failures,
    run_all,
)
from opdb_coverage import UNSPECIFIED_CONTENTS, first_samples  # the sibling forward harness

SEED = 0
# Entries where torch.func.jvp's tangent is not the derivative to float64's tolerance, with why: compared at
# LOOSE instead (a wrong rule still shows), and listed apart.
TORCH_IMPRECISE = {
    "logcumsumexp": "torch's forward formula loses digits on the sample of values near 1e4: its tangent is 2e-6 "
                    "off the exact sum of exp(x_j - out_i) t_j, thunderfn's 1e-12",
}
LOOSE = 1e-5


def _is_float_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype.is_floating_point


def _make_fn(op, sample):
    """(fn, primals): fn(*primals) = the op's floating outputs (a tuple), the other arguments fixed
    (detached copies)."""
    flat, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = [i for i, x in enumerate(flat) if _is_float_tensor(x) and x.requires_grad]
    base = clone(flat)
    primals = [flat[i].detach().clone() for i in positions]

    def fn(*xs):
        vals = clone(base)  # an op that writes into an argument gets a fresh one each run
        for i, x in zip(positions, xs):
            vals[i] = x
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        out = op(inp, *args, **kwargs)
        # (under tf.jvp the outputs are proxies: go by dtype, as opdb_grad_coverage.py does)
        return tuple(o for o in pytree.tree_leaves(out)
                     if isinstance(getattr(o, "dtype", None), torch.dtype) and o.dtype.is_floating_point)

    return fn, primals


def _tangents(primals, k: int) -> tuple:
    g = torch.Generator().manual_seed(1000 + k)
    return tuple(torch.randn(p.shape, dtype=p.dtype, generator=g) for p in primals)


def _torch_jvp(fn, primals, tangents):
    torch.manual_seed(SEED)
    return torch.func.jvp(fn, tuple(clone(primals)), tuple(clone(tangents)))


def _tf_jvp(fn, primals, tangents):
    torch.manual_seed(SEED)
    return tf.jvp(fn, tuple(clone(primals)), tuple(clone(tangents)))


def _mismatch(a, b, rtol, atol) -> str | None:
    try:
        torch.testing.assert_close(a, b, equal_nan=True, rtol=rtol, atol=atol)
        return None
    except (AssertionError, TypeError, ValueError, RuntimeError) as e:
        return " ".join(str(e).split())[:160]


def _max_diff(a, b) -> str:
    try:
        diffs = [(x - y).abs().nan_to_num(0.0).max().item() for x, y in zip(a, b) if x.numel()]
        return f"max abs diff {max(diffs):.3g}; " if diffs else ""
    except Exception:
        return ""


class _Skipped(Exception):
    """An entry left out of the count, and why."""


def run_entry(opinfo, samples: int, rtol, atol):
    """('pass'|'wrong'|'error'|'skip', detail)."""
    try:
        cases = _torch_cases(opinfo, samples)
    except _Skipped as e:
        return "skip", str(e)
    loose = entry_name(opinfo) in TORCH_IMPRECISE
    if loose:
        rtol = atol = LOOSE
    outcome, detail = _compared(cases, rtol, atol)
    if outcome == "pass" and loose:
        return "pass", f"at rtol=atol={LOOSE}: {TORCH_IMPRECISE[entry_name(opinfo)]}"
    return outcome, detail


def _torch_cases(opinfo, samples: int) -> list:
    """(fn, primals, tangents, torch.func.jvp's (outputs, tangents)) per sample with a floating input and output;
    _Skipped where torch.func.jvp gives no reference."""
    if torch.float64 not in opinfo.dtypes:
        raise _Skipped("no float64")
    if opinfo.name in UNSPECIFIED_CONTENTS:
        raise _Skipped("contents unspecified (uninitialized memory)")
    try:
        sample_list = first_samples(opinfo, torch.float64, samples, requires_grad=True)
    except Exception as e:
        raise _Skipped(f"sample_inputs raised {type(e).__name__}") from None
    cases = []
    for k, s in enumerate(sample_list):
        fn, primals = _make_fn(opinfo.op, s)
        if not primals:
            continue
        tangents = _tangents(primals, k)
        try:
            expected = _torch_jvp(fn, primals, tangents)
            again = _torch_jvp(fn, primals, tangents)
        except Exception:
            raise _Skipped("torch.func.jvp raises") from None
        if not expected[0]:
            continue
        if _mismatch(expected, again, 0, 0) is not None:
            raise _Skipped("torch.func.jvp differs from itself under one seed")
        cases.append((fn, primals, tangents, expected))
    if not cases:
        raise _Skipped("no sample with a floating input and a floating output")
    return cases


def _compared(cases: list, rtol, atol):
    """('pass'|'wrong'|'error', detail): tf.jvp's outputs and tangents against torch.func.jvp's, sample by sample."""
    for k, (fn, primals, tangents, (out, tangent)) in enumerate(cases):
        try:
            got_out, got_tangent = _tf_jvp(fn, primals, tangents)
        except Timeout:
            raise
        except Exception as e:
            return error_outcome(e)
        for what, got, want in (("primal", got_out, out), ("tangent", got_tangent, tangent)):
            mismatch = _mismatch(tuple(got), tuple(want), rtol, atol)
            if mismatch is not None:
                return "wrong", f"sample {k}, {what}: {_max_diff(got, want)}{mismatch}"[:300]
    return "pass", ""


def _error_kind(detail: str) -> str:
    return detail.split(":", 1)[0]


def _print_table(title: str, counts: collections.Counter) -> None:
    if not counts:
        return
    print(f"\n{title}")
    for key, n in counts.most_common():
        print(f"  {n:4}  {key}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sample_options(parser)
    parser.add_argument("--ops", nargs="+", default=None, help="only these entries (names as the table lists them)")
    args = parser.parse_args(argv)
    check_tolerances(parser, args)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    start = time.perf_counter()
    entries = [(entry_name(o), o) for o in op_db if args.k in entry_name(o)
               and (args.ops is None or entry_name(o) in args.ops)]
    if args.ops is not None and len(entries) < len(set(args.ops)):
        unknown = sorted(set(args.ops) - {name for name, _ in entries})
        parser.error(f"no op_db entry named {', '.join(unknown)}")
    skips = collections.Counter()

    def run(opinfo):
        outcome, detail = run_entry(opinfo, args.samples, args.rtol, args.atol)
        if outcome == "skip":
            skips[detail] += 1
        return outcome, detail

    results, failures, slow = run_all(entries, run, verbose=args.verbose, timeout=args.timeout, keep_passes=True)
    loose = [(name, detail) for o, name, detail in failures if o == "pass"]
    failures = [f for f in failures if f[0] != "pass"]
    counted = results["pass"] + results["wrong"] + results["error"]
    errors = collections.Counter(_error_kind(d) for o, _, d in failures if o == "error")
    print(f"\ntf.jvp against torch.func.jvp (float64, random tangents, torch.manual_seed({SEED}) before each)")
    print(f"  {'outcome':10} entries")
    for label, key in (("match", "pass"), ("MISMATCH", "wrong"), ("error", "error"), ("skipped", "skip")):
        print(f"  {label:10} {results[key]:7}")
    print(f"  {'total':10} {sum(results.values()):7}")
    _print_table("errors by kind:", errors)
    _print_table("skipped, by reason:", skips)
    if counted:
        print(f"\nchecked {counted}: match {results['pass']} ({100 * results['pass'] / counted:.1f}%), "
              f"error {results['error']}, MISMATCH {results['wrong']}   [{time.perf_counter() - start:.0f} s]")
    for name, detail in loose:
        print(f"  {name} matches only {detail}")
    if slow:
        print("slow entries (> 5 s): " + ", ".join(f"{n} {t:.0f}s" for t, n in sorted(slow, reverse=True)))
    if not args.verbose and failures:
        print()
        print_failures(failures)
    return 1 if results["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
