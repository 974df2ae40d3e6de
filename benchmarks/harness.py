"""What the coverage harnesses share: the loop over entries with a time limit per entry,
the outcome counts, and the list of failures.

Each harness gives `run_all` its entries as (name, argument) pairs and a
`run_entry(argument) -> (outcome, detail)` with outcome 'pass', 'wrong', 'error' or
'skip'; an entry that runs past the limit counts as an error. `ThunderfnBackend` is how the
`*_dynamo_coverage.py` harnesses compile through torch.compile's thunderfn backend.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import torch

import thunderfn as tf


class Timeout(BaseException):  # not Exception: no `except Exception` may swallow it
    pass


def _on_alarm(signum, frame):
    raise Timeout()


def clone(x):
    """x with every tensor in it (nested lists, tuples, dicts) a detached copy: each run of an op gets inputs
    of its own (ops write into their arguments)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(clone(v) for v in x)
    if isinstance(x, dict):
        return {k: clone(v) for k, v in x.items()}
    return x


def first_line(e: BaseException) -> str:
    s = str(e)
    return s.splitlines()[0][:160] if s else ""


def error_outcome(e: Exception) -> tuple[str, str]:
    """An entry's ('error', detail) for an exception: a named thunderfn error as itself, anything else a CRASH."""
    if isinstance(e, tf.ThunderFnError):
        return "error", f"{type(e).__name__}: {first_line(e)}"
    return "error", f"CRASH {type(e).__name__}: {first_line(e)}"


def add_sample_options(parser) -> None:
    """The options the op_db sweeps over float64 samples share: -v, -k, --samples, --rtol/--atol, --timeout
    (check the tolerances with `check_tolerances` after parsing)."""
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-k", default="", help="only entries whose name contains this")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--rtol", type=float, default=None, help="default: assert_close's for float64")
    parser.add_argument("--atol", type=float, default=None, help="default: assert_close's for float64")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per entry (counts as an error)")


def check_tolerances(parser, args) -> None:
    if (args.rtol is None) != (args.atol is None):
        parser.error("give both --rtol and --atol, or neither")


def entry_name(opinfo) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def in_fresh_process(script: str, *child_args, timeout: float = 600, env: dict | None = None) -> dict | None:
    """Run `script --child child_args...` in a new Python (cold: nothing imported, traced or compiled yet), with
    `env` added to the environment, and return the JSON object its last `{`-line printed; None if it ran past
    `timeout` seconds."""
    try:
        done = subprocess.run([sys.executable, script, "--child", *map(str, child_args)], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, "THUNDERFN_PROGRESS": "0", **(env or {})})
    except subprocess.TimeoutExpired:
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"child {child_args} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def interleaved(fns: dict, rounds: int, calls: int, clock=time.perf_counter) -> dict:
    """Median ms per call of each function; rounds alternate between them so that a machine that speeds up or
    slows down affects all alike. `clock=time.process_time` counts the CPU time of this process only: on a
    shared machine, other processes' work then no longer lands in the time of the function they interrupted."""
    for fn in fns.values():
        fn(), fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = clock()
            for _ in range(calls):
                fn()
            times[name].append((clock() - start) / calls * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def run_all(entries, run_entry, *, verbose: bool, timeout: int = 0, keep_passes: bool = False):
    """(outcome counts, [(outcome, name, detail)] of wrong and error entries (and of passes with a
    detail, with keep_passes), [(seconds, name)] of entries slower than 5 s)."""
    use_alarm = hasattr(signal, "SIGALRM") and timeout > 0
    if use_alarm:
        signal.signal(signal.SIGALRM, _on_alarm)
    results, failures, slow = collections.Counter(), [], []
    for name, argument in entries:
        start = time.perf_counter()
        if use_alarm:
            signal.alarm(timeout)
        try:
            outcome, detail = run_entry(argument)
        except Timeout:
            outcome, detail = "error", f"TIMEOUT after {timeout} s"
        finally:
            if use_alarm:
                signal.alarm(0)
        elapsed = time.perf_counter() - start
        if elapsed > 5:
            slow.append((elapsed, name))
        results[outcome] += 1
        if outcome in ("wrong", "error") or (keep_passes and outcome == "pass" and detail):
            failures.append((outcome, name, detail))
        if verbose:
            print(f"{outcome:6} {name:45} {elapsed:5.1f}s {detail}", flush=True)
    return results, failures, slow


def print_failures(failures) -> None:
    for outcome, name, detail in sorted(failures):
        print(f"  {outcome:6} {name:40} {detail}")


class ThunderfnBackend:
    """`compile(fn)`: torch.compile(fn) through thunderfn's backend, Dynamo reset first, so each
    sample compiles anew (no entry of an earlier sample is reused and no recompile limit is reached).
    With `reset_each=False`, Dynamo is reset only by `clear()` (once per entry): a later sample
    calls the code Dynamo compiled for an earlier one, whose guards fail on new sizes, and Dynamo
    recompiles it with those sizes dynamic (symbolic), as it does for a function called with new shapes.
    `dynamic` is torch.compile's (True: every size symbolic from the first compile).

    `ran_elsewhere()` lists what the backend did not run with thunderfn since `clear()`: the nodes it
    split out and the graphs it could not compile (they ran eagerly), and says when Dynamo handed it
    no graph at all; a sample that matches eager only because nothing ran in thunderfn shows here."""

    def __init__(self, reset_each: bool = True, dynamic: bool | None = None):
        self.backend = _RecordsKept()
        self.reset_each, self.dynamic = reset_each, dynamic
        self.compiles = 0

    def compile(self, fn):
        import torch._dynamo  # (here, not at the top: bench_compile's fresh processes time compiles without it)

        if self.reset_each:
            torch._dynamo.reset()
        self.compiles += 1
        return torch.compile(fn, backend=self.backend, dynamic=self.dynamic)

    def clear(self) -> None:
        import torch._dynamo

        torch._dynamo.reset()
        self.backend.records.clear()
        self.compiles = 0

    def ran_elsewhere(self) -> list[str]:
        graphs = self.backend.records.of(None)
        notes = {}
        for g in graphs:
            for p in g.pieces:
                for u in p.unsupported:
                    notes.setdefault(f"split {u.target}: {u.reason.splitlines()[0][:120]}", None)
                if p.error:
                    notes.setdefault(f"graph ran eagerly: {p.error.splitlines()[0][:120]}", None)
        if self.compiles and not graphs:
            notes["Dynamo handed the backend no graph"] = None
        return list(notes)


class _RecordsKept(tf.dynamo.Backend):
    # torch._dynamo.reset() calls a backend's reset(), which forgets its graph records; the harness
    # resets Dynamo before each sample and reads the records of all of an entry's samples after them.
    def reset(self) -> None:
        pass
