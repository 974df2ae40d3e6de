"""tf.profile: where a jitted function's time goes, by operation, fusion region and executor.

`tf.profile(jitted, *args, **kwargs)` compiles what `jitted` compiles once more, with the same
options, into code with a timing statement after every operation (the jitted function's own
cache is left as it was), runs it forward and, where an output requires grad, backward, and
reports the median time of each operation or fusion region, the sum per executor, and, for
comparison, the time of a whole step of `jitted` itself (without timing statements) and of
the function run eagerly. On CUDA each timing statement synchronizes, so the times are the
kernels' and the sum of the rows exceeds the uninstrumented step. `tf.visualize(jitted, path,
profile=...)` writes the times into the picture.
"""
from __future__ import annotations

import collections
import dataclasses
import statistics
import time

import torch

from thunderfn.compile_stages import instrumenting
from thunderfn.core.bodies import Body
from thunderfn.core.pytree import tree_leaves
from thunderfn.core.symbol import Symbol
from thunderfn.core.trace import Trace
from thunderfn.errors import ArgumentTypeError, ArgumentValueError
from thunderfn.executors.fusion import FusionExecutor
from thunderfn.jit import JitState, jit_with_options
from thunderfn.module import ThunderModule, jit_module

_UNTIMED = {"python.del"}  # statements that free memory: their time is the next operation's


@dataclasses.dataclass(frozen=True)
class Row:
    """One operation or fusion region of an execution trace, and its median time."""
    trace: str  # "forward" or "backward"
    index: int  # its position among the trace's bound symbols
    name: str  # the op, or the fusion region's name
    executor: str | None
    ops: int  # the operations it runs (a region's fused ops; 1 otherwise)
    ms: float
    choices: tuple = ()  # a fusion region's: how each layout it was compiled for runs (inductor.RegionChoice)


@dataclasses.dataclass
class Profile:
    """What tf.profile measured (see the module docstring); `str()` is a table."""
    function: str
    calls: int
    rows: list  # Row, in trace order, forward first
    step_ms: float  # a whole step of the jitted function, without timing statements
    eager_ms: float | None  # the same step of the function without tf.jit (None where it cannot run so)
    traces: dict  # "forward"/"backward" -> the execution trace that was timed (tf.visualize draws them)

    def by_executor(self) -> dict:
        """{executor name: (forward ms, backward ms)}, summed over its rows."""
        totals = collections.defaultdict(lambda: [0.0, 0.0])
        for r in self.rows:
            totals[r.executor or "python"][r.trace == "backward"] += r.ms
        return {e: tuple(t) for e, t in sorted(totals.items(), key=lambda kv: -sum(kv[1]))}

    def __str__(self) -> str:
        eager = f", eager {self.eager_ms:.3f} ms ({self.step_ms / self.eager_ms:.2f}x eager's time)" \
            if self.eager_ms else ""
        lines = [f"tf.profile({self.function}): median of {self.calls} steps"
                 f"{' (forward and backward)' if 'backward' in self.traces else ''}: jitted {self.step_ms:.3f} ms"
                 + eager, ""]
        totals = self.by_executor()
        width = max([len("executor"), *map(len, totals)]) + 2
        lines += [f"{'executor':<{width}}{'forward ms':>12}{'backward ms':>13}"]
        lines += [f"{e:<{width}}{f:>12.3f}{b:>13.3f}" for e, (f, b) in totals.items()]
        slowest = sorted(self.rows, key=lambda r: -r.ms)[:15]
        # the columns are as wide as their longest entry: a name cut short may name another op
        name_width = max([len("operation or region"), *(len(r.name) for r in slowest)]) + 2
        executor_width = max([len("executor"), *(len(str(r.executor)) for r in slowest)]) + 2
        lines += ["", f"{'trace':<10}{'operation or region':<{name_width}}{'executor':<{executor_width}}"
                      f"{'ops':>5}{'ms':>10}"]
        lines += [f"{r.trace:<10}{r.name:<{name_width}}{str(r.executor):<{executor_width}}{r.ops:>5}{r.ms:>10.3f}"
                  for r in slowest]
        timed = [r for r in self.rows if r.choices]
        unfused = [r for r in timed if not all(c.fused for c in r.choices)]
        if timed:
            lines += ["", f"fusion regions timed against their unfused ops when compiled: {len(timed) - len(unfused)} "
                          f"run compiled, {len(unfused)} unfused (slower compiled)"]
            lines += [f"  {r.trace} {r.name}: {'; '.join(map(str, r.choices))}" for r in unfused]
        return "\n".join(lines)


class _Clock:
    """The timing statements' target: each records the time since the one before it."""

    def __init__(self):
        self.samples = collections.defaultdict(list)  # (trace def_name, index) -> seconds per call
        self.traces: dict = {}  # def_name -> the execution trace before timing statements
        self.sync = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.last = 0.0
        self.tick_symbol = Symbol("profile_tick", "python.profile_tick", is_prim=True, printer=self._print_tick,
                                  tags=frozenset({"no_dce"}))

    def tick(self, trace_name: str, index: int) -> None:
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        if index >= 0:
            self.samples[(trace_name, index)].append(now - self.last)
        self.last = time.perf_counter()  # the bookkeeping above is nobody's time

    def _print_tick(self, bsym, ns) -> str:
        ns["profile_tick"] = self.tick
        return f"profile_tick({bsym.args[0]!r}, {bsym.args[1]})"

    def instrument(self, trc: Trace) -> Trace:
        """trc with a timing statement first and after each operation."""
        self.traces[trc.def_name] = trc
        body = [self.tick_symbol.bind(trc.def_name, -1, output=None)]
        for k, bsym in enumerate(trc.bound_symbols):
            body.append(bsym)
            if bsym.sym.id not in _UNTIMED:
                body.append(self.tick_symbol.bind(trc.def_name, k, output=None))
        return trc.derive("Timing statements (tf.profile)", body)


def profile(jitted, *args, calls: int = 20, warmup: int = 3, **kwargs) -> Profile:
    """Time `jitted` (a function or module from tf.jit) on these arguments, by operation, fusion
    region and executor, forward and (where an output requires grad) backward; see the module
    docstring. Gradients are computed with torch.autograd.grad, so no `.grad` is changed.

        >>> import torch, thunderfn as tf
        >>> model = tf.jit(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)))
        >>> report = tf.profile(model, torch.randn(8, 16), calls=5)
        >>> sorted({row.trace for row in report.rows})
        ['backward', 'forward']
        >>> "torch" in report.by_executor()
        True
        >>> print(report)  # doctest: +SKIP
    """
    if not (isinstance(calls, int) and calls >= 1 and isinstance(warmup, int) and warmup >= 0):
        raise ArgumentValueError(f"profile: calls must be a positive int and warmup a non-negative int, "
                                 f"got {calls!r} and {warmup!r}")
    twin, original, wrt = _twin(jitted, args)
    clock = _Clock()
    with instrumenting(clock.instrument):
        _step(twin, args, kwargs, wrt)  # compiles, with timing statements
    clock.samples.clear()
    for _ in range(warmup):
        _step(twin, args, kwargs, wrt)
    clock.samples.clear()
    for _ in range(calls):
        _step(twin, args, kwargs, wrt)
    titles = {"computation": "forward", "backward": "backward"}
    rows = []
    for def_name, trc in clock.traces.items():
        for k, bsym in enumerate(trc.bound_symbols):
            samples = clock.samples.get((def_name, k))
            if not samples:
                continue
            region = isinstance(bsym.sym.executor, FusionExecutor) and bool(bsym.subsymbols)
            choices = getattr(bsym.sym.eager, "region_choices", None) if region else None
            # a call of a body (a repeated layer's block, a loop's step) names the body: many calls share one name
            bodies = [a.__name__ for a in bsym.args if isinstance(a, Body)]
            name = f"{bsym.sym.name}({', '.join(bodies)})" if bodies else bsym.sym.name
            rows.append(Row(titles.get(def_name, def_name), k, name, getattr(bsym.sym.executor, "name", None),
                            len(bsym.subsymbols) if region else 1, statistics.median(samples) * 1e3,
                            tuple(choices()) if choices is not None else ()))
    step_ms = _median_step_ms(jitted, args, kwargs, wrt, calls, warmup)
    try:
        eager_ms = _median_step_ms(original, args, kwargs, wrt, calls, warmup)
    except Exception:  # a transform of a function (tf.jit(tf.grad(f))) has no eager form to time
        eager_ms = None
    return Profile(getattr(original, "__name__", type(original).__name__), calls, rows, step_ms, eager_ms,
                   {titles.get(n, n): t for n, t in clock.traces.items()})


def _twin(jitted, args):
    """(a fresh jit of what `jitted` compiles, with its options; the function it jits; the tensors a
    backward differentiates with respect to: the arguments and, for a module, parameters requiring grad)."""
    leaves = [a for a in tree_leaves(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if isinstance(jitted, ThunderModule):
        module = jitted.module
        twin = jit_module(module, jitted._thunderfn_jit, jitted._thunderfn_options)
        return twin, module, leaves + [p for p in module.parameters() if p.requires_grad]
    state = getattr(jitted, "_thunderfn_state", None)
    if not isinstance(state, JitState):
        raise ArgumentTypeError(f"profile expects a function or module returned by tf.jit, got {type(jitted).__name__}")
    if state.options.donate_argnums:
        raise ArgumentValueError(f"profile calls '{getattr(state.fn, '__name__', 'fn')}' many times with the same "
                                 f"arguments, and donate_argnums consumes the donated ones on the first call: profile "
                                 f"it jitted without donate_argnums")
    return jit_with_options(state.fn, state.options), state.fn, leaves


def _step(fn, args, kwargs, wrt) -> None:
    out = fn(*args, **kwargs)
    differentiable = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if differentiable and wrt:
        torch.autograd.grad(differentiable, wrt, grad_outputs=[torch.ones_like(o) for o in differentiable],
                            allow_unused=True)


def _median_step_ms(fn, args, kwargs, wrt, calls, warmup) -> float:
    sync = torch.cuda.is_available() and torch.cuda.is_initialized()
    for _ in range(warmup):
        _step(fn, args, kwargs, wrt)
    times = []
    for _ in range(calls):
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        _step(fn, args, kwargs, wrt)
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3
