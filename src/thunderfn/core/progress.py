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

Some of a compile's work waits for a later call: a differentiated function's backward runs
first when torch.autograd calls it, after the compile's line has closed, and that first run
is where a fusion executor compiles the backward's regions (seconds each under Inductor).
`later(what)` names such work while the compile runs; the compile's line then says that it
follows, and its first run reports as a line of its own, printed whenever the compile's was
(however short it is) or when it runs long itself, with the time since the compile began:

    thunderfn: compiled 'GPT.forward' in 9.3 s: ...; the backward's first run is reported when it comes
    thunderfn: compiled the backward of 'GPT.forward' in 7.2 s: ... (first step 17.1 s since 'GPT.forward' ...)

Work that no compile's line covers (a fusion region's compile for a new input layout, a
backward made for outputs that got no gradient) reports as a compile of its own
(`compiling` outside any compile), so no compile that blocks a call goes unsaid.
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
    def __init__(self, name: str, first: _Compile | None = None):
        self.name = name  # as the lines say it: "'f'", "the backward of 'f'"
        self.first = first  # the compile this one continues (a backward's first run: the forward's), or None
        self.to_come: list[str] = []  # what of it runs later, reported when it comes (`later`)
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
            self._say(f"compiling {self.name} ({time.perf_counter() - self.start:.1f} s so far): {self._current()}")
            self.timer = self._schedule(REPEAT_S)

    def stage(self, name: str) -> None:
        with self.lock:
            self.stages.append((name, time.perf_counter()))
            if self.reporting:
                self._say(f"compiling {self.name} ({time.perf_counter() - self.start:.1f} s so far): {name}")

    def finish(self) -> None:
        with self.lock:
            self.finished = True
            self.timer.cancel()
            end = time.perf_counter()
            # a continuation of a compile whose line was printed is printed too, however short: the user who
            # read "compiled in X s" reads the rest of what the first step cost
            if not (self.reporting or (self.first is not None and self.first.reporting)):
                return
            ends = [when for _, when in self.stages[1:]] + [end]
            spent = ", ".join(f"{name} {stop - when:.1f} s" for (name, when), stop in zip(self.stages, ends))
            line = f"compiled {self.name} in {end - self.start:.1f} s: {spent or 'nothing'}"
            if self.first is not None:
                line += f" (first step {end - self.first.start:.1f} s since {self.first.name} began compiling)"
            if self.to_come:
                line += f"; {' and '.join(self.to_come)} is reported when it comes"
            self._say(line)


@contextlib.contextmanager
def compiling(name: str, *, quoted: bool = True, first: _Compile | None = None, stage_name: str | None = None):
    """Report on the compile of `name` (a function's name, quoted in the lines, unless `quoted` is False)
    while the block runs, if it runs long; `first`: the compile it continues (see `later`); `stage_name`: its
    first stage. Inside another compile on this thread, the block is part of that one (its stage `stage_name`)."""
    if getattr(_local, "current", None) is not None or os.environ.get("THUNDERFN_PROGRESS", "1") == "0":
        if stage_name is not None:
            stage(stage_name)
        yield
        return
    _local.current = current = _Compile(f"'{name}'" if quoted else name, first)
    if stage_name is not None:
        current.stage(stage_name)
    try:
        yield
    finally:
        _local.current = None
        current.finish()


def compiling_region(region: str, stage_name: str):
    """A fusion executor compiling `region` on its first call (stage `stage_name`): a stage of the compile
    running on this thread (jit's first run, a backward's first run), or a compile of its own when none is
    (a call with a new input layout, torch.compile's first call of a graph it had compiled ahead)."""
    return compiling(f"fusion region {region}", quoted=False, stage_name=stage_name)


class _Later:
    """What of a compile runs later, on a call of its own: `running()` around that call reports it as a
    compile that continues the first one (module docstring)."""

    def __init__(self, what: str, first: _Compile):
        self.what, self.first = what, first

    def running(self):
        return compiling(f"{self.what} of {self.first.name}", quoted=False, first=self.first,
                         stage_name=f"{self.what}'s first run")


def later(what: str) -> _Later | None:
    """`what` (say "the backward") of the compile running on this thread runs later, on a call of its own, and
    compiles there what waits for a first call: its `running()` is the context to run that call in, which reports
    it (module docstring); None where no compile is running here (or progress is silenced), which reports nothing."""
    current = getattr(_local, "current", None)
    if current is None:
        return None
    current.to_come.append(f"{what}'s first run")
    return _Later(what, current)


def stage(name: str) -> None:
    """The compile running on this thread (if any) has moved on to `name`."""
    current = getattr(_local, "current", None)
    if current is not None:
        current.stage(name)
