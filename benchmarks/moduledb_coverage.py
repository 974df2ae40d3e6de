"""How many of torch's nn modules train under `tf.jit(module)` exactly like eager: torch's ModuleInfo database as the
yardstick.

For every entry of `torch.testing._internal.common_modules.module_db`, the first N
module inputs (CPU, float64, requires_grad=True) are run in training and in eval
mode, twice: on a module built eagerly, and on an identical copy jitted with
`tf.jit`. Each run does a forward, then `backward()` of the sum of all floating
outputs. The runs must agree on:

- every output (values, and `requires_grad` of each tensor);
- every parameter's and input's `.grad`: present or None as in eager, and equal;
- every buffer after the step (batch norm's running statistics, ...).

An entry passes when all its inputs agree in both modes (assert_close, NaNs equal,
float64 defaults). Entries are left out when eager raises or is nondeterministic (two
eager runs under torch.manual_seed(0) disagree). A jitted run that raises counts as
an error (a refusal if it raises a ThunderFnError, otherwise a CRASH); any
disagreement counts as WRONG, the one outcome that must never happen.

    python benchmarks/moduledb_coverage.py            # summary; exit status 1 if any entry is WRONG
    python benchmarks/moduledb_coverage.py -v         # one line per entry
    python benchmarks/moduledb_coverage.py -k Norm    # entries whose name contains 'Norm'

Needs `pip install expecttest` (torch's test helpers import it).
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings

import torch
from torch.utils import _pytree as pytree

import thunderfn as tf
from harness import Timeout, error_outcome, print_failures, run_all  # (run from benchmarks/ or the root)


def _detached(tree):
    def copy_leaf(x):
        if isinstance(x, torch.Tensor):
            return x.detach().clone().requires_grad_(x.requires_grad)
        return x
    return pytree.tree_map(copy_leaf, tree)


def _step(module, args, kwargs):
    """Forward and backward once: (outputs, requires_grad of each output, gradient of each
    parameter and input (None where eager has none), buffers after the step)."""
    torch.manual_seed(0)
    out = module(*args, **kwargs)
    leaves = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    floating = [o for o in leaves if o.is_floating_point() and o.requires_grad]
    if floating:
        sum(o.sum() for o in floating).backward()
    inputs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor) and x.requires_grad]
    grads = [None if p.grad is None else p.grad.clone() for p in module.parameters()]
    grads += [None if x.grad is None else x.grad.clone() for x in inputs]
    return ([o.detach() for o in leaves], [o.requires_grad for o in leaves], grads,
            [b.clone() for b in module.buffers()])


def _mismatch(eager, jitted) -> str | None:
    names = ("outputs", "requires_grad of outputs", "gradients", "buffers")
    for name, e, j in zip(names, eager, jitted):
        if len(e) != len(j):
            return f"{name}: {len(j)} under jit, {len(e)} eager"
        for i, (a, b) in enumerate(zip(e, j)):
            if (a is None) != (b is None):
                return (f"{name} {i}: {'None' if b is None else 'a tensor'} under jit, "
                        f"{'None' if a is None else 'a tensor'} eager")
            if a is None:
                continue
            try:
                torch.testing.assert_close(b, a, equal_nan=True)
            except (AssertionError, TypeError, ValueError, RuntimeError) as err:
                return f"{name} {i}: {' '.join(str(err).split())[:160]}"
    return None


def run_entry(module_info, inputs: int, compile=tf.jit, dtype=torch.float64):
    """('pass'|'wrong'|'error'|'skip', detail); `compile(module)` is what runs the module under test
    (moduledb_dynamo_coverage.py gives torch.compile's)."""
    from torch.testing._internal.common_modules import ModuleInfo  # noqa: F401 (torch's test helpers)

    cases = []
    for training in (True, False):
        try:
            module_inputs = module_info.module_inputs_func(module_info, device="cpu", dtype=dtype,
                                                           requires_grad=True, training=training)[:inputs]
        except Exception as e:
            return "skip", f"module_inputs_func raised {type(e).__name__}"
        for mi in module_inputs:
            if mi.forward_input is None:
                continue
            c_args, c_kwargs = mi.constructor_input.args, mi.constructor_input.kwargs
            try:
                torch.manual_seed(1)
                module = module_info.module_cls(*c_args, **c_kwargs).to(dtype).train(training)
                args, kwargs = mi.forward_input.args, mi.forward_input.kwargs
                twin = copy.deepcopy(module)
                eager = _step(module, _detached(args), _detached(kwargs))
                again = _step(twin, _detached(args), _detached(kwargs))
            except Exception as e:
                return "skip", f"eager raised {type(e).__name__}"
            if _mismatch(eager, again) is not None:
                return "skip", "eager is nondeterministic"
            torch.manual_seed(1)
            fresh = module_info.module_cls(*c_args, **c_kwargs).to(dtype).train(training)
            cases.append((training, fresh, args, kwargs, eager))
    if not cases:
        return "skip", "no module inputs"
    for k, (training, module, args, kwargs, eager) in enumerate(cases):
        try:
            got = _step(compile(module), _detached(args), _detached(kwargs))
        except Timeout:
            raise
        except Exception as e:
            return error_outcome(e)
        mismatch = _mismatch(eager, got)
        if mismatch is not None:
            return "wrong", f"input {k} ({'train' if training else 'eval'}): {mismatch}"[:300]
    return "pass", ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-k", default="", help="only entries whose name contains this")
    parser.add_argument("--inputs", type=int, default=3, help="module inputs per mode")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per entry (counts as an error)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_modules import module_db

    start = time.perf_counter()
    entries = [(m.name, m) for m in module_db if args.k in m.name]
    results, failures, _ = run_all(entries, lambda m: run_entry(m, args.inputs), verbose=args.verbose,
                                   timeout=args.timeout)
    tested = results["pass"] + results["wrong"] + results["error"]
    print(f"\nmodule_db through tf.jit(module): {results['pass']}/{tested} entries pass "
          f"({100 * results['pass'] / max(tested, 1):.1f}%), {results['wrong']} WRONG, {results['error']} errors, "
          f"{results['skip']} left out; {time.perf_counter() - start:.0f} s")
    print_failures(failures)
    return 1 if results["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
