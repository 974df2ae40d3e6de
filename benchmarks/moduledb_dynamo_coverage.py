"""How many of torch's nn modules train through `torch.compile(module, backend="thunderfn")` exactly
like eager: torch's ModuleInfo database as the yardstick, through Dynamo and the thunderfn backend.

The same check as moduledb_coverage.py (float64 module inputs (--dtype), training and eval mode, forward and
backward of the sum of floating outputs; outputs, their requires_grad, every parameter's and input's
gradient and every buffer against eager), with the module compiled by torch.compile with the
thunderfn backend instead of tf.jit, Dynamo reset before each module input. A passing entry where
the backend ran nodes eagerly (split out) or got no graph from Dynamo is listed with what ran
elsewhere.

    python benchmarks/moduledb_dynamo_coverage.py            # summary; exit status 1 if any entry is WRONG
    python benchmarks/moduledb_dynamo_coverage.py -v -k Norm # one line per entry whose name contains 'Norm'

Needs `pip install expecttest` (torch's test helpers import it).
"""
from __future__ import annotations

import sys
import time

import torch

import moduledb_coverage
from harness import run_all  # (run from benchmarks/ or the root)
from opdb_dynamo_coverage import backend_arguments, backend_for, checked_by, report


def main(argv=None) -> int:
    parser = backend_arguments(__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=3, help="module inputs per mode")
    parser.add_argument("--dtype", default="float64", help="the modules' and inputs' dtype (torch.<dtype>)")
    args = parser.parse_args(argv)
    backend = backend_for(args)
    from torch.testing._internal.common_modules import module_db

    start = time.perf_counter()
    entries = [(m.name, m) for m in module_db if args.k in m.name]
    run = checked_by(backend, lambda m: moduledb_coverage.run_entry(
        m, args.inputs, compile=backend.compile, dtype=getattr(torch, args.dtype)))
    results, failures, _ = run_all(entries, run, verbose=args.verbose, timeout=args.timeout, keep_passes=True)
    report(f"module_db ({args.dtype}, train and eval) through torch.compile(backend='thunderfn')", results, failures,
           time.perf_counter() - start)
    return 1 if results["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
