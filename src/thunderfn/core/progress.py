"""What a long compile is doing, told on stderr while it happens.

A compile (jit's trace, passes, lowering and first run, which is where fusion
executors compile their regions) that is still running after `THRESHOLD_S` seconds
starts reporting: the stage it is in, each stage it moves to, and, at the end, how
long each stage took. A compile shorter than that prints nothing.

    thunderfn: compiling 'GPT.forward' (1.0 s so far): lowering onto executors, code generation
    thunderfn: compiling 'GPT.forward' (1.4 s so far): first run: Inductor compiling a fusion region (12 ops)
    thunderfn: compiled 'GPT.forward' in 9.3 s: tracing 0.4 s, ..., first run: Inductor ... 8.1 s

Set THUNDERFN_PROGRESS=0 to silence it. Compiles started while one is running on the
same thread (jit inside grad) are stages of the outer one.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

THRESHOLD_S = 1.0
REPEAT_S = 10.0  # a stage that runs on is reported again this often

_local = threading.local()


class _Compile:
    def __init__(self, name: str):
        self.name = name
        self.start = time.perf_counter()
        self.stages: list[tuple[str, float]] = []  # (stage, when it started)
        self.reporting = False
        self.finished = False
        self.lock = threading.Lock()
        self.timer = self._schedule(THRESHOLD_S)

    def _schedule(self, delay: float) -> threading.Timer:
        timer = threading.Timer(delay, self._tick)
        timer.daemon = True
        timer.start()
        return timer

    def _say(self, text: str) -> None:
        print(f"thunderfn: {text}", file=sys.stderr, flush=True)

    def _current(self) -> str:
        return self.stages[-1][0] if self.stages else "starting"

    def _tick(self) -> None:
        with self.lock:
            if self.finished:
                return
            self.reporting = True
            self._say(f"compiling '{self.name}' ({time.perf_counter() - self.start:.1f} s so far): {self._current()}")
            self.timer = self._schedule(REPEAT_S)

    def stage(self, name: str) -> None:
        with self.lock:
            self.stages.append((name, time.perf_counter()))
            if self.reporting:
                self._say(f"compiling '{self.name}' ({time.perf_counter() - self.start:.1f} s so far): {name}")

    def finish(self) -> None:
        with self.lock:
            self.finished = True
            self.timer.cancel()
            if not self.reporting:
                return
            end = time.perf_counter()
            ends = [when for _, when in self.stages[1:]] + [end]
            spent = ", ".join(f"{name} {stop - when:.1f} s" for (name, when), stop in zip(self.stages, ends))
            self._say(f"compiled '{self.name}' in {end - self.start:.1f} s: {spent}")


@contextlib.contextmanager
def compiling(name: str):
    """Report on the compile of `name` while the block runs, if it runs long."""
    if getattr(_local, "current", None) is not None or os.environ.get("THUNDERFN_PROGRESS", "1") == "0":
        yield
        return
    _local.current = current = _Compile(name)
    try:
        yield
    finally:
        _local.current = None
        current.finish()


def stage(name: str) -> None:
    """The compile running on this thread (if any) has moved on to `name`."""
    current = getattr(_local, "current", None)
    if current is not None:
        current.stage(name)
