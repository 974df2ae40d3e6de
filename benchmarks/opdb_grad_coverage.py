"""How much of PyTorch `tf.grad` differentiates: torch's OpInfo database as the yardstick.

For every entry of `torch.testing._internal.common_methods_invocations.op_db` that
supports autograd and has float64, the first N sample inputs (CPU, float64,
requires_grad=True) are differentiated. The function under test takes the sample's
floating tensor leaves that require grad (the input and any such tensors in
args/kwargs, found with torch's pytree) positionally, rebuilds the call, and returns
the sum of all floating outputs (each floating output tensor summed, then added).
The reference is `torch.autograd.grad` of that sum w.r.t. the leaves (unused leaves
get a zero gradient); thunderfn's is `tf.grad(fn, argnums=tuple(range(n)))(*leaves)`
on detached plain tensors.

An entry passes when every sample's gradients match (assert_close, NaNs equal,
float64 defaults unless --rtol/--atol are given). Entries are left out when the
eager forward or gradient raises, is nondeterministic (two runs under
torch.manual_seed(0) disagree), or the samples have no floating leaf or no floating
output. A thunderfn run that raises counts as an error (a refusal if it raises a
ThunderFnError, otherwise a CRASH); a gradient that differs counts as WRONG, the
one outcome that must never happen.

    python benchmarks/opdb_grad_coverage.py            # summary
    python benchmarks/opdb_grad_coverage.py -v         # one line per entry
    python benchmarks/opdb_grad_coverage.py -k sin     # entries whose name contains 'sin'

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
from harness import (  # (run from benchmarks/ or the root)
    Timeout,
    add_sample_options,
    check_tolerances,
    entry_name,
    error_outcome,
    print_failures,
    run_all,
)
from opdb_coverage import first_samples  # the sibling forward harness


def _is_float_tensor(x) -> bool:
    # Under tf.grad the outputs are thunderfn proxies, not torch.Tensors: go by dtype.
    dtype = getattr(x, "dtype", None)
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point and not isinstance(x, (int, float))


def _make_fn(op, sample):
    """(fn, leaves): fn(*leaves) = sum of op's floating outputs, the other arguments fixed."""
    flat, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = [i for i, x in enumerate(flat) if _is_float_tensor(x) and x.requires_grad]
    # Non-leaf constants are detached copies, so nothing outside the leaves carries grad.
    base = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in flat]
    leaves = [flat[i].detach().clone() for i in positions]

    def fn(*xs):
        vals = list(base)
        for i, x in zip(positions, xs):
            vals[i] = x
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        out = op(inp, *args, **kwargs)
        total = None
        for o in pytree.tree_leaves(out):
            if isinstance(o, torch.dtype):
                continue
            if _is_float_tensor(o):
                s = o.sum()
                total = s if total is None else total + s
        return total

    return fn, leaves


def _eager_grad(fn, leaves):
    """(value, gradients) by torch.autograd; None gradients become zeros."""
    xs = [x.detach().clone().requires_grad_(True) for x in leaves]
    torch.manual_seed(0)
    value = fn(*xs)
    if value is None:
        raise LookupError("no floating output")
    if not value.requires_grad:
        raise LookupError("output does not depend on the leaves")
    grads = torch.autograd.grad(value, xs, allow_unused=True)
    grads = tuple(torch.zeros_like(x) if g is None else g for x, g in zip(xs, grads))
    return value.detach(), grads


def _same(a, b, rtol, atol) -> str | None:
    """None when a matches b, else the first line of the mismatch."""
    try:
        torch.testing.assert_close(a, b, equal_nan=True, rtol=rtol, atol=atol)
        return None
    except (AssertionError, TypeError, ValueError, RuntimeError) as e:
        return " ".join(str(e).split())[:200]


def _tf_grad(fn, leaves) -> tuple:
    g = tf.grad(fn, argnums=tuple(range(len(leaves))))
    torch.manual_seed(0)
    return tuple(g(*[x.detach().clone() for x in leaves]))


class _Skipped(Exception):
    """An entry left out of the count, and why."""


def run_entry(opinfo, samples: int, rtol, atol, *, dtype=torch.float64, differentiate=_tf_grad):
    """('pass'|'wrong'|'error'|'skip', detail); `differentiate(fn, leaves)` gives the gradients under
    test (opdb_dynamo_coverage.py gives torch.autograd's through torch.compile)."""
    try:
        cases = _eager_cases(opinfo, samples, dtype)
    except _Skipped as e:
        return "skip", str(e)
    return _compared(cases, rtol, atol, differentiate)


def _eager_cases(opinfo, samples: int, dtype) -> list:
    """(sample, fn, leaves, eager's gradients) per sample with a floating leaf and output; _Skipped where eager
    gives no reference."""
    if dtype not in opinfo.dtypes:
        raise _Skipped(f"no {str(dtype).removeprefix('torch.')}")
    try:
        sample_list = first_samples(opinfo, dtype, samples, requires_grad=True)
    except Exception as e:
        raise _Skipped(f"sample_inputs raised {type(e).__name__}") from None
    cases = []
    for s in sample_list:
        fn, leaves = _make_fn(opinfo.op, s)
        if not leaves:
            continue
        try:
            value, expected = _eager_grad(fn, leaves)
            again_value, again = _eager_grad(fn, leaves)
        except LookupError:
            continue
        except Exception as e:
            raise _Skipped(f"eager raised {type(e).__name__}") from None
        if _same((value, expected), (again_value, again), 0, 0) is not None:
            raise _Skipped("eager is nondeterministic")
        cases.append((s, fn, leaves, expected))
    if not cases:
        raise _Skipped("no floating leaves or no floating output")
    return cases


def _compared(cases: list, rtol, atol, differentiate):
    """('pass'|'wrong'|'error', detail): the gradients under test against eager's, sample by sample."""
    for k, (s, fn, leaves, expected) in enumerate(cases):
        try:
            got = differentiate(fn, leaves)
        except Timeout:
            raise
        except Exception as e:
            return error_outcome(e)
        if len(got) != len(expected):
            return "wrong", f"sample {k}: {len(got)} gradients for {len(expected)} leaves"
        for j, (g, e) in enumerate(zip(got, expected)):
            mismatch = _same(g, e, rtol, atol)
            if mismatch is not None:
                try:
                    diff = f"max abs diff {(g - e).abs().nan_to_num(0.0).max().item():.3g}; "
                except Exception:
                    diff = ""
                return "wrong", f"sample {k}, gradient {j} of {len(leaves)} {tuple(e.shape)}: {diff}{mismatch}"[:300]
    return "pass", ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sample_options(parser)
    args = parser.parse_args(argv)
    check_tolerances(parser, args)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    start = time.perf_counter()
    entries = [(entry_name(o), o) for o in op_db if o.supports_autograd and args.k in entry_name(o)]
    results, failures, slow = run_all(entries, lambda o: run_entry(o, args.samples, args.rtol, args.atol),
                                      verbose=args.verbose, timeout=args.timeout)
    counted = results["pass"] + results["wrong"] + results["error"]
    print(f"\nautograd-capable op_db entries: {sum(results.values())}; left out (no float64, eager raises, "
          f"nondeterministic, no floating leaves or outputs): {results['skip']}; counted: {counted}")
    if counted:
        crashes = sum(1 for o, _, d in failures if o == "error" and d.startswith(("CRASH", "TIMEOUT")))
        print(f"pass {results['pass']} ({100 * results['pass'] / counted:.1f}%), "
              f"error {results['error']} (of which crashes {crashes}), WRONG {results['wrong']}"
              f"   [{time.perf_counter() - start:.0f} s]")
    if slow:
        print("slow entries (> 5 s): " + ", ".join(f"{n} {t:.0f}s" for t, n in sorted(slow, reverse=True)))
    if not args.verbose:
        print_failures(failures)
    return 1 if results["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
