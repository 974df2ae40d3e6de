"""What the coverage harnesses share: the loop over entries with a time limit per entry,
the outcome counts, and the list of failures.

Each harness gives `run_all` its entries as (name, argument) pairs and a
`run_entry(argument) -> (outcome, detail)` with outcome 'pass', 'wrong', 'error' or
'skip'; an entry that runs past the limit counts as an error.
"""
from __future__ import annotations

import collections
import signal
import time


class Timeout(BaseException):  # not Exception: no `except Exception` may swallow it
    pass


def _on_alarm(signum, frame):
    raise Timeout()


def first_line(e: BaseException) -> str:
    s = str(e)
    return s.splitlines()[0][:160] if s else ""


def entry_name(opinfo) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def run_all(entries, run_entry, *, verbose: bool, timeout: int = 0):
    """(outcome counts, [(outcome, name, detail)] of wrong and error entries, [(seconds, name)] of
    entries slower than 5 s)."""
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
        if outcome in ("wrong", "error"):
            failures.append((outcome, name, detail))
        if verbose:
            print(f"{outcome:6} {name:45} {elapsed:5.1f}s {detail}", flush=True)
    return results, failures, slow


def print_failures(failures) -> None:
    for outcome, name, detail in sorted(failures):
        print(f"  {outcome:6} {name:40} {detail}")
