"""jit's compile pipeline: from a call to the function its cache entry runs, in named stages.

    trace -> optimize -> split -> rematerialize -> distribute -> lower -> generate

Each stage takes the compile's state (`Compilation`) and returns it with its part added; `STAGES` lists
them in order and `run` runs them. The traces each stage makes are appended to `traces` (the forward's,
or the only ones) and `backward`: what `tf.last_traces` and `tf.last_backward_traces` show, each with
the pass that made it and its time ("# Constructed by ... (took N milliseconds)").

- trace: the function traced with proxies for the executors chosen, recording the Python state it
  reads (its guards, core/guards.py).
- optimize: dead code elimination and common-subexpression elimination; under tf.distributed.fsdp,
  each parameter gathered where it is used (the distribution's rewrite of the forward, which the split
  then differentiates).
- split: under grad mode, the trace differentiated and cut into a forward and a backward that
  torch.autograd runs (transforms/autograd_split.py); `why_no_backward` says why not where it is not.
- rematerialize: the split's forward saves less and its backward recomputes cheap values
  (transforms/rematerialize.py), by default only where a fusion executor will fuse the recomputation.
- distribute: tf.distributed's synchronization of the split's gradients, a rule per configuration
  (`DISTRIBUTIONS`): ddp's bucketed all-reduces (transforms/ddp.py), fsdp's gathers again in the
  backward and reduce-scatters (transforms/fsdp.py).
- lower: each trace (the split's halves, or the only one) claimed by the executors, then the passes
  on the claimed trace (fusion, numbers lifted to tensors, in-place rewrites where nothing records
  autograd, `del`s).
- generate: the Python source of each lowered trace compiled into functions, and the call a cache
  entry runs (torch.autograd.Function over the halves, autocast and call-time guards around it).

The progress of a long compile (core/progress.py) names the stages as it reaches them ("tracing",
"optimizing the trace", ...).

The api layer: imported by jit.py, which keeps the options and the cache.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import threading
import warnings
from typing import Callable

import torch

from thunderfn import executors as _executors
from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.block)
from thunderfn.blocks import RetraceInline
from thunderfn.core import context, progress, symbolic
from thunderfn.core.bodies import Body
from thunderfn.core.call_time import guarded
from thunderfn.core.guards import GuardRecorder, GuardSet
from thunderfn.core.passes import cse, dce, del_last_used, write_back_on_failure_pass
from thunderfn.core.symbol import BoundSymbol
from thunderfn.core.trace import Trace, timed_pass
from thunderfn.core.trace import trace as trace_function
from thunderfn.donation import DonationSkipped, donating
from thunderfn.errors import UnsupportedOpError
from thunderfn.executors.fusion import FusionExecutor
from thunderfn.executors.torch_rewrites import (
    UnlessFunctorch,
    collapse_reshapes,
    lift_number_operands,
    records_no_autograd,
    reuse_dead_buffers,
    write_into_written_back_inputs,
)
from thunderfn.jit_options import JitOptions
from thunderfn.torch.autocast import autocast_state
from thunderfn.torch.autocast import switched_off as autocast_switched_off
from thunderfn.transforms.autograd_split import CompiledSplit, Split, try_split
from thunderfn.transforms.ddp import DataParallel, bucketed_all_reduce
from thunderfn.transforms.executor_lower import lower_trace
from thunderfn.transforms.fsdp import Sharded, gather_where_needed, reduce_scatter_async, regather_in_backward
from thunderfn.transforms.rematerialize import rematerialize as rematerialized

CSE = "Common Subexpression Elimination"


class FloatsStayStatic(UnsupportedOpError):
    """A compile that traced floats as values met what cannot take them yet (a `.grad` read at call time, which
    is passed where the floats are; a number computed from one returned through torch.autograd's Function, which
    returns tensors); jit compiles with the floats' values."""

    def __init__(self, why: str):
        super().__init__(f"{why}: its Python floats stay values of the cache key (a compile per value)")


@dataclasses.dataclass
class Lowered:
    """One trace lowered for execution: the passes' traces (the last one runs), whether it runs under
    torch.no_grad(), and, where it writes into its inputs or dead intermediates, the trace before those
    rewrites (what runs under torch.func's transforms)."""
    traces: list[Trace]
    no_grad: bool
    without_writes: Trace | None


@dataclasses.dataclass
class Compilation:
    """One compile: what it was asked for, and what each stage has made so far."""
    fn: Callable
    name: str  # the function's, for errors
    args: tuple
    kwargs: dict
    options: JitOptions  # tf.jit's (distributed: tf.distributed's configuration of the module, or None)
    executors: tuple  # options.executors resolved, in priority order
    sizes: symbolic.SymbolicInputs | None  # the dimensions traced symbolic, if any
    donated: frozenset = frozenset()  # the numbers of the input tensors whose memory it may reuse (donation.py)
    called_with_grad: bool = False
    traces: list[Trace] = dataclasses.field(default_factory=list)  # the forward's (or the only) traces
    backward: list[Trace] = dataclasses.field(default_factory=list)  # the split's backward traces
    guards: GuardSet | None = None  # trace: the Python state the trace read
    split: Split | None = None
    tried_split: bool = False  # split: whether the function was differentiated (then why_no_backward says)
    why_no_backward: str | None = None
    backward_rewritten: bool = False  # rematerialize or distribute rewrote the split's backward
    forward_lowered: Lowered | None = None
    backward_lowered: Lowered | None = None
    compiled: Callable | None = None  # generate: what the cache entry calls with the call's tensors


def begin(fn, name: str, args, kwargs, options: JitOptions, open_dims=None, hints=None,
          numbers=frozenset(), donated=frozenset()) -> Compilation:
    """A compile of fn for this call with tf.jit's options, with the dimensions in open_dims (tensor number
    -> dims) symbolic, traced at the sizes in hints ((tensor number, dim) -> size) where given, the floats
    at the places `numbers` (among the call's flattened arguments) traced as values, and the memory of the
    input tensors numbered `donated` reused."""
    progress.stage("choosing executors")
    sizes = symbolic.SymbolicInputs(open_dims or {}, hints, numbers) if open_dims or numbers else None
    return Compilation(fn, name, args, kwargs, options, _executors.resolve(options.executors,
                                                                           fallback=options.fallback), sizes,
                       donated=frozenset(donated))


def trace(c: Compilation) -> Compilation:
    # tf.grad & co. called inside the function differentiate for these executors (the VJPs they
    # register): jit's argument, which they cannot be handed otherwise (core/context.py)
    progress.stage("tracing")
    c.called_with_grad = torch.is_grad_enabled()
    while True:  # again where a module's layer turned out not to be a block (blocks.py's RetraceInline)
        recorder = GuardRecorder(c.fn)
        try:
            with context.active_executors(c.executors):
                # With disable_torch_autograd the function runs under no_grad: traced so too, or a
                # torch.enable_grad() block inside it would switch grad back on from the recorded mode.
                with recorder, (torch.no_grad() if c.options.disable_torch_autograd else contextlib.nullcontext()), \
                        symbolic.opening(c.sizes):
                    c.traces.append(trace_function(c.fn, *c.args, **c.kwargs))
            break
        except RetraceInline:
            continue
    c.guards = recorder.guards
    if c.sizes is not None and c.sizes.number_names and c.traces[-1].grad_reads:
        raise FloatsStayStatic(f"'{c.name}' reads a .grad at call time")
    return c


def optimize(c: Compilation) -> Compilation:
    progress.stage("optimizing the trace")
    c.traces.append(timed_pass("Dead Code Elimination", dce, c.traces[-1]))
    c.traces.append(timed_pass(CSE, cse, c.traces[-1]))
    distribution = _distribution(c.options.distributed)
    if distribution is not None and distribution.forward is not None:
        c.traces.append(distribution.forward(c.traces[-1]))
    return c


def split(c: Compilation) -> Compilation:
    # (grad mode as it is after tracing: a function called under no_grad that switches it on is differentiated)
    if not c.options.disable_torch_autograd and torch.is_grad_enabled():
        progress.stage("differentiating: the forward and backward traces")
        c.split, c.why_no_backward = try_split(c.traces[-1], c.executors)
        c.tried_split = True
        if (c.split is not None and c.sizes is not None and c.sizes.number_names
                and any(kind == "value" and symbolic.symbols_in(v) for kind, v in c.split.leaf_plan)):
            raise FloatsStayStatic(f"'{c.name}' is differentiated by torch.autograd and returns a number computed "
                                   f"from a float")
        if c.split is not None:
            # torch.autograd drives the two halves: see transforms/autograd_split.py
            c.traces.append(c.split.forward)
            c.backward.append(c.split.backward)
    return c


def rematerialize(c: Compilation) -> Compilation:
    if c.split is None or not _rematerializes(c.options.rematerialize, c.executors):
        return c
    progress.stage("rematerialization")
    forward_trace, backward_trace = rematerialized(c.split.forward, c.split.backward)
    if forward_trace is not c.split.forward:
        c.split = dataclasses.replace(c.split, forward=forward_trace, backward=backward_trace)
        c.traces.append(forward_trace)
        c.backward.append(backward_trace)
        c.backward_rewritten = True
    return c


def distribute(c: Compilation) -> Compilation:
    distribution = _distribution(c.options.distributed)
    if distribution is None:
        return c
    if c.split is None:
        differentiated = torch.is_grad_enabled() and not c.options.disable_torch_autograd
        if differentiated and any(p.requires_grad for p in c.traces[0].args):
            raise UnsupportedOpError(
                f"tf.distributed synchronizes gradients in thunderfn's own backward trace, and "
                f"'{c.name}' has none: {c.why_no_backward}. For data parallelism, wrap the module in "
                f"torch's DistributedDataParallel instead: DistributedDataParallel(tf.jit(module)).")
        return c
    progress.stage(distribution.stage)
    distribution.split(c, c.options.distributed)
    c.backward_rewritten = True
    return c


def lower(c: Compilation) -> Compilation:
    if c.split is None:
        # writing into dead intermediates is legal where torch.autograd records nothing
        no_autograd = (c.options.disable_torch_autograd or not torch.is_grad_enabled()
                       or records_no_autograd(c.traces[-1]))
        progress.stage("lowering onto executors, code generation")
        donated = frozenset(c.traces[-1].args[k].name for k in c.donated)
        c.forward_lowered = lower_for_execution(c.traces[-1], c.executors, no_autograd=no_autograd,
                                                no_grad=c.options.disable_torch_autograd, donated=donated)
        c.traces += c.forward_lowered.traces
        return c
    if c.donated:
        warnings.warn(f"thunderfn.jit: '{c.name}' donates nothing in this compile (donate_argnums): torch.autograd "
                      f"differentiates it (an input requires grad), and may need a donated tensor's value for the "
                      f"backward. Donate under torch.no_grad(), or differentiate with tf.grad.", DonationSkipped,
                      stacklevel=2)
    # the derivative's rules repeat work (x * x's backward computes g * x twice): each half is CSE'd again;
    # both run without autograd recording (torch.autograd.Function's forward and backward)
    c.traces.append(timed_pass(CSE, cse, c.split.forward))
    progress.stage("lowering onto executors, code generation")
    c.forward_lowered = lower_for_execution(c.traces[-1], c.executors, no_autograd=True)
    c.traces += c.forward_lowered.traces
    c.backward.append(timed_pass(CSE, cse, c.split.backward))
    c.backward_lowered = lower_for_execution(c.backward[-1], c.executors, no_autograd=True)
    c.backward += c.backward_lowered.traces
    return c


def generate(c: Compilation) -> Compilation:
    fn = generated(c.forward_lowered)
    if c.donated and c.split is None:  # (the tensors it captured, read by reference, must not be written either)
        captured = {id(p.constant): p.constant for b in c.traces[-1].bound_symbols for p in b.proxy_args()
                    if isinstance(p.constant, torch.Tensor)}
        fn = donating(fn, c.donated, tuple(captured.values()))
    if c.split is not None:
        executors, split_ = c.executors, c.split

        def backward_without(absent):
            with cyclic_gc_paused():
                trc = split_.backward_without(absent)
                return None if trc is None else generated(lower_for_execution(cse(trc), executors, no_autograd=True))

        # a backward for calls where some outputs get no gradient, made when one first comes: from the split
        # as it is (where rematerialization or a distribution rewrote the backward, the absent gradients are zeros)
        plain = not c.backward_rewritten and split_.backward_without is not None
        # the backward's first run, where fusion executors compile its regions, comes after this compile's
        # line: reported as its continuation (core/progress.py)
        fn = CompiledSplit(split_, fn, generated(c.backward_lowered), backward_without if plain else None,
                           first_run=progress.later("the backward"))
        if not c.called_with_grad:
            # called under no_grad, the function switched grad on and left it on (a piece of a graph
            # torch.compile split): eager would record the rest for torch.autograd and leave the mode on
            fn = _switching_grad_on(fn)
    if autocast_state():  # the trace holds autocast's casts: running it under autocast would cast again
        fn = _without_autocast(fn)
    c.compiled = guarded(fn, c.traces[0])
    return c


STAGES = (trace, optimize, split, rematerialize, distribute, lower, generate)


def run(c: Compilation) -> Compilation:
    with cyclic_gc_paused():
        for stage in STAGES:
            c = stage(c)
    return c


# A compile builds tens of thousands of objects that stay alive until it ends (bound symbols, proxies,
# traces), and Python's cyclic collector scans all of them again at every full collection it triggers:
# 17% of a 32-layer GPT-2's first step, more the larger the program. A compile makes little cyclic garbage,
# so the collector is off while any compile runs in the process and back as it was when the last ends.
_gc_lock = threading.Lock()
_gc_pauses = [0, True]  # compiles running, whether the collector was on before the first


@contextlib.contextmanager
def cyclic_gc_paused():
    with _gc_lock:
        if _gc_pauses[0] == 0:
            _gc_pauses[1] = gc.isenabled()
            gc.disable()
        _gc_pauses[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses[0] -= 1
            if _gc_pauses[0] == 0 and _gc_pauses[1]:
                gc.enable()


# -- distribute: a rule per tf.distributed configuration ----------------------------------------------
@dataclasses.dataclass(frozen=True)
class Distribution:
    """What the distribute stage does for one kind of tf.distributed configuration: `forward`, a rewrite
    of the forward before it is differentiated (run by optimize), and `split`, the rewrite of the split
    (its backward's gradient synchronization), announced as `stage`."""
    stage: str
    split: Callable[[Compilation, object], None]
    forward: Callable[[Trace], Trace] | None = None


def _data_parallel(c: Compilation, config: DataParallel) -> None:
    c.split = dataclasses.replace(c.split, backward=bucketed_all_reduce(c.split.backward, range(config.n_params),
                                                                          config))
    c.backward.append(c.split.backward)


def _sharded(c: Compilation, config: Sharded) -> None:
    if config.strategy == "FULL_SHARD":
        c.split = regather_in_backward(c.split)
        c.traces.append(c.split.forward)
    c.split = dataclasses.replace(c.split, backward=reduce_scatter_async(c.split.backward))
    c.backward.append(c.split.backward)


DISTRIBUTIONS = {
    DataParallel: Distribution("data parallel: bucketed gradient all-reduces", _data_parallel),
    Sharded: Distribution("fsdp: where parameters are gathered, when gradients are reduce-scattered", _sharded,
                          forward=gather_where_needed),
}


def _distribution(config) -> Distribution | None:
    return next((d for kind, d in DISTRIBUTIONS.items() if isinstance(config, kind)), None)


# -- lower and generate, for one trace ----------------------------------------------------------------
def lower_for_execution(trc: Trace, executors, *, no_autograd: bool, no_grad: bool = False,
                        donated=frozenset()) -> Lowered:
    """The passes from a transformed trace to the one that runs (run under torch.no_grad() with `no_grad`):
    lower onto the executors, drop what lowering made unused, fuse, lift Python numbers, write into
    written-back inputs and dead intermediates, and the inputs named in `donated` after their last read (only
    where the trace runs with `no_autograd` recording; see executors/torch_rewrites.py), insert `del`s."""
    traces = [timed_pass("Transform for execution", lower_trace, trc, executors)]
    traces.append(timed_pass("Dead Code Elimination", dce, traces[-1]))
    collapsed = timed_pass("Collapse reshapes", collapse_reshapes, traces[-1])
    traces += [collapsed] if collapsed is not traces[-1] else []
    for ex in executors:
        if isinstance(ex, FusionExecutor):
            traces.append(timed_pass(f"Fusion ({ex.name})", ex.fuse, traces[-1]))
    lifted = timed_pass("Lift number operands", lift_number_operands, traces[-1])
    lifted = timed_pass("Write back on failure", write_back_on_failure_pass, lifted)
    traces += [lifted] if lifted is not traces[-1] else []
    reused = lifted
    if no_autograd:
        for name, rewrite in (("Write into written-back inputs", write_into_written_back_inputs),
                              ("Reuse dead buffers", functools.partial(reuse_dead_buffers, donated=donated))):
            rewritten = timed_pass(name, rewrite, reused)
            traces += [rewritten] if rewritten is not reused else []
            reused = rewritten
    traces.append(timed_pass("Delete Last Used", del_last_used, traces[-1]))
    with_bodies = timed_pass("Rewrite bodies", _bodies_rewritten, traces[-1], no_autograd)
    traces += [with_bodies] if with_bodies is not traces[-1] else []
    return Lowered(traces, no_grad, lifted if reused is not lifted else None)


def _runs_block(bsym) -> bool:
    """Whether bsym calls a repeated layer's body (prims.block, as lowered: the torch executor calls its impl)."""
    return bsym.sym.id == prims.block.id or any(sub.sym.id == prims.block.id for sub in bsym.subsymbols)


def _bodies_rewritten(trc: Trace, no_autograd: bool) -> Trace:
    """trc with the bodies its blocks run (prims.block: a repeated layer's, core/bodies.py) rewritten as a whole
    trace is after lowering: reshapes collapsed, numbers lifted, dead buffers reused (where nothing records
    autograd), `del`s inserted; once per body, however many calls share it."""
    def passes(t):
        t = lift_number_operands(collapse_reshapes(t))
        return del_last_used(reuse_dead_buffers(t) if no_autograd else t)

    def rewritten(body: Body) -> Body:
        return body.once(("rewritten", no_autograd), lambda: body.lowered(passes))

    bsyms, changed = [], False
    for bsym in trc.bound_symbols:
        if _runs_block(bsym):
            bsym = BoundSymbol(bsym.sym, tuple(rewritten(a) if isinstance(a, Body) else a for a in bsym.args),
                               bsym.kwargs, bsym.output, bsym.subsymbols)
            changed = True
        bsyms.append(bsym)
    return trc.derive("Rewrite bodies", bsyms) if changed else trc


def generated(lowered: Lowered) -> Callable:
    """The function a lowered trace compiles to."""
    fn = _compiled(lowered.traces[-1], lowered.no_grad)
    if lowered.without_writes is not None:  # torch.func's transforms get the trace without in-place writes
        without = lowered.without_writes
        fn = UnlessFunctorch(fn, lambda: _compiled(del_last_used(without), lowered.no_grad))
    return fn


class _Instrumenting(threading.local):
    def __init__(self):
        self.instrument: Callable | None = None  # trace -> the trace that runs, with timing statements


_instrumenting = _Instrumenting()


@contextlib.contextmanager
def instrumenting(instrument: Callable):
    """Compiles on this thread generate `instrument(trace)` in place of each execution trace
    (tf.profile's timing statements); the jitted function's own cache is never compiled so."""
    previous, _instrumenting.instrument = _instrumenting.instrument, instrument
    try:
        yield
    finally:
        _instrumenting.instrument = previous


def _compiled(t: Trace, no_grad: bool) -> Callable:
    if _instrumenting.instrument is not None:
        t = _instrumenting.instrument(t)
    fn = t.python_callable()
    if not no_grad:
        return fn
    wrapped = torch.no_grad()(fn)
    wrapped.__thunderfn_no_grad__ = fn  # (a compiled entry written to disk says so: disk_cache.py)
    return wrapped


def _rematerializes(option, executors) -> bool:
    """Whether a split is rematerialized: as asked, or, by default (None), where a fusion executor
    will fuse the recomputed ops into the backward's regions (without one each recomputed op is
    one more kernel, which torch.compile does not pay either)."""
    if option is None:
        return any(isinstance(ex, FusionExecutor) for ex in executors)
    return option


def _switching_grad_on(fn):
    def run(*tensors):
        torch._C._set_grad_enabled(True)
        return fn(*tensors)

    return run


def _without_autocast(fn):
    def run(*tensors):
        with autocast_switched_off():
            return fn(*tensors)

    return run
