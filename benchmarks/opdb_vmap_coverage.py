"""How much of PyTorch `tf.vmap` batches: torch's OpInfo database as the yardstick.

For every entry of `torch.testing._internal.common_methods_invocations.op_db`, the
first N sample inputs (CPU, float32 where the op takes it) are batched three ways, each
with 3 examples: every tensor of the call batched at dim 0; every tensor batched at dim -1;
only the first tensor batched (at 0), the others shared (in_axes None). A floating example k
is the sample's tensor scaled by 1 + k/4, so examples differ; integer and boolean tensors
(indices, masks) repeat. An entry that does not take float32 (bitwise ops, gcd, view_as_real,
one_hot, ...) is measured at the first of int64, complex64 and bool it takes, its integer
and boolean examples varying too: example k is reversed (flipped over every dim) for odd k,
which keeps its values (valid indices, counts) but moves them. The reference is the law's
right side, a loop over the examples (`x.select(dim, k)`, views of the batched input),
eager, its outputs stacked; the batched run is `tf.vmap` of a function taking the call's
tensors positionally, with in_axes per tensor.

An entry passes when every way of every sample matches (assert_close, NaNs equal). A way
whose loop raises, cannot stack its examples' outputs (shapes differ between examples) or
returns something other than tensors is left out (a native_group_norm example strided by
dim -1, say), and so is an entry with no way left. A random
op (the loop under seed 0 and seed 1 disagree) cannot match a loop, whose three draws of
one example are not one draw of the batch: it is batched with randomness="different"
and compared with torch.func.vmap's draws under the same seed, and counted apart (left
out when torch.func.vmap cannot batch it either). With --torch-func that comparison is
torch.func.vmap against itself. A batched run that raises counts as an
error (a refusal, if it raises a ThunderFnError); one that returns a different value
counts as WRONG, the one outcome that must never happen.

    python benchmarks/opdb_vmap_coverage.py                 # tf.vmap, summary
    python benchmarks/opdb_vmap_coverage.py --torch-func    # torch.func.vmap on the same harness
    python benchmarks/opdb_vmap_coverage.py -v -k sin       # one line per entry, names containing 'sin'

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
from harness import Timeout, entry_name, first_line, print_failures, run_all  # (run from benchmarks/ or the root)
from opdb_coverage import UNSPECIFIED_CONTENTS, first_samples  # the sibling forward harness

BATCH = 3
WAYS = ("all_at_0", "all_at_-1", "first_only")


def _same(a, b) -> bool:
    try:
        torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-4, atol=1e-5)
        return True
    except (AssertionError, TypeError, ValueError, RuntimeError):
        return False


# the dtype of an entry's samples: float32, or the first of the others that the op takes
DTYPES = (torch.float32, torch.int64, torch.complex64, torch.bool)


def _dtype_of(opinfo) -> torch.dtype:
    supported = opinfo.supported_dtypes("cpu")
    return next((d for d in DTYPES if d in supported), torch.float32)


def _example(x: torch.Tensor, k: int, vary_integers: bool) -> torch.Tensor:
    if x.is_floating_point() or x.is_complex():
        return x.detach() * (1 + k / 4)
    if vary_integers and k % 2:
        return x.detach().flip(tuple(range(x.ndim)))
    return x.detach().clone()


def _batched(x: torch.Tensor, dim: int, vary_integers: bool) -> torch.Tensor:
    # (dim -1 leaves examples strided)
    return torch.stack([_example(x, k, vary_integers) for k in range(BATCH)], dim % (x.ndim + 1))


def _call_with_tensors(op, spec, leaves, positions):
    """op as a function of the call's tensors (by position), the other leaves fixed."""
    def call(*tensors):
        filled = list(leaves)
        for i, t in zip(positions, tensors):
            filled[i] = t
        args, kwargs = pytree.tree_unflatten(filled, spec)
        return op(*args, **kwargs)
    return call


def _loop(call, batched_inputs, dims):
    """The reference, the law's right side: call on each example x.select(dim, k) (a view, as a
    loop over the batch would take it), outputs stacked at 0."""
    outs = [call(*[x.select(d, k) if d is not None else x for x, d in zip(batched_inputs, dims)])
            for k in range(BATCH)]
    leaves, spec = pytree.tree_flatten(outs[0])
    if not leaves or not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        raise TypeError("returns something other than tensors")
    per_example = [pytree.tree_flatten(o)[0] for o in outs]
    return pytree.tree_unflatten([torch.stack([ex[i] for ex in per_example]) for i in range(len(leaves))], spec)


def _random_entry(call, dims, batched_inputs, vmap):
    """A random op: its draws cannot match a loop's (one draw of the batch is not three draws of
    one example), so it is batched with randomness="different" and compared with
    torch.func.vmap's draws under the same seed."""
    try:
        torch.manual_seed(0)
        expected = torch.func.vmap(call, in_dims=tuple(dims), randomness="different")(*batched_inputs)
    except Exception as e:
        return "skip", f"random, and torch.func.vmap cannot batch it to compare ({type(e).__name__})"
    try:
        torch.manual_seed(0)
        got = vmap(call, tuple(dims), "different")(*batched_inputs)
    except Timeout:
        raise
    except Exception as e:
        return "error", f"random: {type(e).__name__}: {first_line(e)}"
    if not _same(got, expected):
        return "error", "random: draws differ from torch.func.vmap's under the same seed"
    return "pass", ""


def run_entry(opinfo, samples: int, vmap):
    """('pass'|'wrong'|'error'|'skip', detail, random)."""
    if opinfo.name in UNSPECIFIED_CONTENTS:
        return ("skip", "contents unspecified (uninitialized memory)"), False
    dtype = _dtype_of(opinfo)
    try:
        sample_list = first_samples(opinfo, dtype, samples, requires_grad=False)
    except Exception as e:
        return ("skip", f"sample_inputs raised {type(e).__name__}"), False
    tested, left_out = 0, None
    for s in sample_list:
        leaves, spec = pytree.tree_flatten(((s.input, *s.args), s.kwargs))
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        if not positions:
            continue
        call = _call_with_tensors(opinfo.op, spec, leaves, positions)
        tensors = [leaves[i] for i in positions]
        for way in WAYS:
            if way == "first_only" and len(tensors) == 1:
                continue
            outcome = _checked_way(call, tensors, way, vmap, s, vary_integers=dtype is not torch.float32)
            if outcome is not None and outcome[0][0] == "skip" and not outcome[1]:
                left_out = left_out or outcome  # (this way's loop raised: the entry counts with the other ways)
                continue
            if outcome is not None:
                return outcome
            tested += 1
    if not tested:
        return left_out or (("skip", "no sample with a tensor"), False)
    return ("pass", ""), False


def _checked_way(call, tensors: list, way: str, vmap, sample, vary_integers: bool):
    """vmap against the loop for one sample with its batch dims placed one of WAYS: None where they agree,
    else the entry's (outcome, detail) and whether it draws random values."""
    dims = [0 if way == "all_at_0" or (way == "first_only" and j == 0) else -1 if way == "all_at_-1" else None
            for j in range(len(tensors))]
    try:
        batched_inputs = [_batched(t, d, vary_integers) if d is not None else t for t, d in zip(tensors, dims)]
        torch.manual_seed(0)
        expected = _loop(call, batched_inputs, dims)
        torch.manual_seed(1)
        other_seed = _loop(call, batched_inputs, dims)
    except Exception as e:
        return ("skip", f"the loop raised {type(e).__name__}: {first_line(e)[:80]}"), False
    if not _same(expected, other_seed):
        return _random_entry(call, dims, batched_inputs, vmap), True
    try:
        got = vmap(call, tuple(dims), "error")(*batched_inputs)
    except Timeout:
        raise
    except Exception as e:
        if "randomness error mode" in str(e):  # it draws, though this sample's values do not show it
            return _random_entry(call, dims, batched_inputs, vmap), True
        if isinstance(e, tf.ThunderFnError):
            return ("error", f"{way}: {type(e).__name__}: {first_line(e)}"), False
        return ("error", f"{way}: CRASH {type(e).__name__}: {first_line(e)}"), False
    if not _same(got, expected):
        return ("wrong", f"{way}: sample {sample}"[:200]), False
    return None


def _tf_vmap(fn, in_dims, randomness):
    return tf.vmap(fn, in_axes=in_dims, randomness=randomness)


def _torch_func_vmap(fn, in_dims, randomness):
    return torch.func.vmap(fn, in_dims=in_dims, randomness=randomness)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-k", default="", help="only entries whose name contains this")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=60, help="seconds per entry")
    parser.add_argument("--torch-func", action="store_true", help="measure torch.func.vmap instead of tf.vmap")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    vmap = _torch_func_vmap if args.torch_func else _tf_vmap
    start = time.perf_counter()
    entries = [(entry_name(o), o) for o in op_db if args.k in entry_name(o)]
    random_outcomes = collections.Counter()  # of the random ops, compared with torch.func's draws

    def run(opinfo):
        result, random = run_entry(opinfo, args.samples, vmap)
        if random:
            random_outcomes[result[0]] += 1
        return result

    results, failures, _ = run_all(entries, run, verbose=args.verbose, timeout=args.timeout)
    passed, errors = results["pass"] - random_outcomes["pass"], results["error"] - random_outcomes["error"]
    loop = passed + errors + results["wrong"]
    print(f"\n{'torch.func.vmap' if args.torch_func else 'tf.vmap'}: op_db entries {sum(results.values())}; left out "
          f"(the loop raises or returns non-tensors, a random op torch.func.vmap cannot batch, no samples): "
          f"{results['skip']}")
    print(f"against a loop over the examples: {passed} of {loop} pass ({100 * passed / max(loop, 1):.1f}%), "
          f"error {errors}, WRONG {results['wrong']}")
    print(f"random ops against torch.func.vmap's draws (randomness='different', same seed): "
          f"{random_outcomes['pass']} of {random_outcomes['pass'] + random_outcomes['error']} pass   "
          f"[{time.perf_counter() - start:.0f} s]")
    if not args.verbose:
        print_failures(failures)
    return 1 if results["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
