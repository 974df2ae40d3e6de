"""jit: trace, pass, lower, generate Python once, cache by input signature.

The signature of a call is its pytree structure, each tensor's shape, dtype,
device and requires_grad, the value of every non-tensor argument, torch's grad
mode and default dtype. Any change retraces; nothing else does.

The cache-hit path is the hot path. A call with only positional tensors skips
pytree flattening entirely (optree alone costs more than our whole budget on a
tiny function), and the generated function returns the user's output structure
itself, so a hit is: build a tuple key, one dict lookup, one call.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Sequence

import torch

from thunderfn import executors as _executors
from thunderfn.core import context
from thunderfn.core.call_time import Guarded, guarded
from thunderfn.core.passes import dce, del_last_used
from thunderfn.core.pytree import tree_flatten
from thunderfn.core.trace import Trace, timed_pass, trace
from thunderfn.executors.base import FusionExecutor
from thunderfn.torch.optim import StepChangesOptimizerState
from thunderfn.transforms.executor_lower import lower_trace
from thunderfn.transforms.forward_backward import CompiledSplit, try_split

Tensor = torch.Tensor
_is_grad_enabled = torch.is_grad_enabled
_get_default_dtype = torch.get_default_dtype


class CacheEntry:
    __slots__ = ("fn", "traces", "tensor_positions")

    def __init__(self, fn, traces, tensor_positions):
        self.fn = fn
        self.traces = traces
        self.tensor_positions = tensor_positions


class JitState:
    """What a jitted function keeps: its caches and its most recent compile's traces."""

    def __init__(self, fn, executors, *, fallback, static_argnums, static_argnames, disable_torch_autograd):
        self.fn = fn
        self.executors = executors
        self.fallback = fallback
        self.static_argnums = tuple(static_argnums)
        self.static_argnames = tuple(static_argnames)
        self.disable_torch_autograd = disable_torch_autograd
        self.fast_cache: dict = {}
        self.cache: dict = {}
        self.last_traces: list[Trace] = []
        self.last_backward_traces: list[Trace] = []
        self.why_no_backward = "it has not been called with an input that requires grad under grad mode"
        self.cache_hits = 0  # counted on the slow path only: the fast path stays lean
        self.cache_misses = 0

    def key(self, leaves, spec) -> tuple:
        parts = [spec, _is_grad_enabled(), _get_default_dtype()]
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                parts.append((leaf.shape, leaf.dtype, leaf.device, leaf.requires_grad))
            elif type(leaf) is slice:  # slices are unhashable before Python 3.12; key on their bounds
                parts.append((slice, leaf.start, leaf.stop, leaf.step))
            elif type(leaf) is float:  # 0.0 == -0.0 but they compute differently; nan != nan would never hit
                parts.append((float, leaf.hex()))
            elif type(leaf) is complex:
                parts.append((complex, leaf.real.hex(), leaf.imag.hex()))
            else:
                try:
                    hash(leaf)
                except TypeError:
                    raise TypeError(
                        f"{type(leaf).__name__} argument to the jitted function '{_fn_name(self.fn)}' is not hashable. "
                        f"thunderfn bakes non-tensor arguments into the compiled function and keys its cache on their "
                        f"values: pass tensors, pytrees of tensors, or hashable values.") from None
                parts.append((type(leaf), leaf))
        return tuple(parts)

    def validate_static(self, args, kwargs):
        for i in self.static_argnums:
            if i < len(args) and any(isinstance(x, Tensor) for x in tree_flatten(args[i])[0]):
                raise TypeError(f"static argument {i} of '{_fn_name(self.fn)}' holds a tensor; static arguments are "
                                f"baked into the compiled function, so they must not contain tensors")
        for name in self.static_argnames:
            if name in kwargs and any(isinstance(x, Tensor) for x in tree_flatten(kwargs[name])[0]):
                raise TypeError(f"static argument '{name}' of '{_fn_name(self.fn)}' holds a tensor")

    def compile(self, args, kwargs, leaves) -> CacheEntry:
        executors = _executors.resolve(self.executors, fallback=self.fallback)
        with context.active_executors(executors):  # reverse mode uses the VJPs these executors register
            traces = [trace(self.fn, *args, **kwargs)]
            traces.append(timed_pass("Dead Code Elimination", dce, traces[-1]))
            split = None
            if not self.disable_torch_autograd and _is_grad_enabled():
                split, self.why_no_backward = try_split(traces[-1])
        if split is None:
            traces += _execution_passes(traces[-1], executors)
            fn = traces[-1].python_callable()
            if self.disable_torch_autograd:
                fn = torch.no_grad()(fn)
            self.last_backward_traces = []
        else:
            # torch.autograd drives the two halves: see transforms/forward_backward.py
            traces += [split.forward, *_execution_passes(split.forward, executors)]
            backward = [split.backward, *_execution_passes(split.backward, executors)]
            fn = CompiledSplit(split, traces[-1].python_callable(), backward[-1].python_callable())
            self.last_backward_traces = backward
        self.last_traces = traces
        positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor))
        return CacheEntry(guarded(fn, traces[0]), traces, positions)

    def call_slow(self, args, kwargs):
        if context.current_trace() is not None:
            # Called while an outer function is being traced: jit inside jit is the
            # function itself, traced into the outer trace (as jax.jit nests).
            return self.fn(*args, **kwargs)
        self.validate_static(args, kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        key = self.key(leaves, spec)
        entry = self.cache.get(key)
        # An entry whose trace read call-time state (.grad, an optimizer's hyperparameters) fits only while
        # that state is as it was traced (core/call_time.py); otherwise trace again.
        if entry is not None and isinstance(entry.fn, Guarded) and entry.fn.guard(
                [leaves[i] for i in entry.tensor_positions]) is not None:
            entry = None
        if entry is None:
            self.cache_misses += 1
            try:
                entry = self.cache[key] = self.compile(args, kwargs, leaves)
            except StepChangesOptimizerState:  # an optimizer's first step creates its state: run it as eager does
                return self.fn(*args, **kwargs)
        else:
            self.cache_hits += 1
        if not kwargs and not self.static_argnums and len(entry.tensor_positions) == len(args) and all(
                isinstance(a, Tensor) for a in args) and not isinstance(entry.fn, Guarded):
            self.fast_cache[_fast_key(args)] = entry.fn
        return entry.fn(*[leaves[i] for i in entry.tensor_positions])


def _execution_passes(trc: Trace, executors) -> list[Trace]:
    """The passes from a transformed trace to the one that runs: lower onto the
    executors, drop what lowering made unused, fuse, insert `del`s."""
    traces = [timed_pass("Transform for execution", lower_trace, trc, executors)]
    traces.append(timed_pass("Dead Code Elimination", dce, traces[-1]))
    for ex in executors:
        if isinstance(ex, FusionExecutor):
            traces.append(timed_pass(f"Fusion ({ex.name})", ex.fuse, traces[-1]))
    traces.append(timed_pass("Delete Last Used", del_last_used, traces[-1]))
    return traces


def _fast_key(args) -> tuple:
    key = [_is_grad_enabled(), _get_default_dtype()]
    for a in args:
        key += (a.shape, a.dtype, a.device, a.requires_grad)
    return tuple(key)


def _positional_arities(fn) -> tuple:
    """The numbers of positional arguments fn can be called with, when few and known."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return ()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    return tuple(range(required, len(positional) + 1))[-4:]


def _fast_dispatcher(arities, fast_cache, call_slow):
    """The jitted function. For each arity fn accepts, a branch builds the cache key
    inline as one flat tuple (no per-argument tuples, no comprehension): on a tiny
    function this is most of the overhead we have left. Other calls take a generic
    branch; anything that is not all-positional-tensors takes the slow path."""
    lines = ["def jitted(*args, **kwargs):", "    if not kwargs:", "        n = len(args)"]
    for n in arities:
        names = [f"a{i}" for i in range(n)]
        key = ", ".join(f"{a}.shape, {a}.dtype, {a}.device, {a}.requires_grad" for a in names)
        lines += [f"        if n == {n}:",
                  f"            {', '.join(names) + ',' if names else '_'} = args" if names else "            pass",
                  "            try:",
                  f"                compiled = fast_cache.get((is_grad_enabled(), get_default_dtype(), {key}))",
                  "            except (AttributeError, TypeError):",
                  "                compiled = None",
                  "            if compiled is not None and not tracing.stack:",
                  f"                return compiled({', '.join(names)})",
                  "            return call_slow(args, kwargs)"]
    lines += ["        try:",
              "            compiled = fast_cache.get(fast_key(args))",
              "        except (AttributeError, TypeError):",
              "            compiled = None",
              "        if compiled is not None and not tracing.stack:",
              "            return compiled(*args)",
              "    return call_slow(args, kwargs)"]
    namespace = {"fast_cache": fast_cache, "call_slow": call_slow, "is_grad_enabled": _is_grad_enabled,
                 "get_default_dtype": _get_default_dtype, "fast_key": _fast_key,
                 "tracing": context._local}
    exec(compile("\n".join(lines) + "\n", "<thunderfn jit dispatcher>", "exec"), namespace)
    return namespace["jitted"]


def _fn_name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def jit(fn: Callable, *, executors: Sequence | None = None, fallback: bool = True, static_argnums=(),
        static_argnames=(), disable_torch_autograd: bool = False):
    """Compile fn: trace it per input signature, lower it onto `executors` (priority
    order; None means the defaults; the torch executor is appended unless
    `fallback=False`), generate Python once and cache it.

    Non-tensor arguments are baked in and keyed by value, so every non-tensor argument
    already behaves like a JAX static argument. `static_argnums`/`static_argnames`
    check that those arguments hold no tensors (a tensor there would be baked in by
    value, which is never what the caller wants) and keep calls on the general path.
    """
    if isinstance(fn, torch.nn.Module):
        from thunderfn.module import jit_module

        return jit_module(fn, executors=executors, fallback=fallback, disable_torch_autograd=disable_torch_autograd)
    if not callable(fn):
        raise TypeError(f"jit expects a callable or an nn.Module, got {type(fn).__name__}")
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    state = JitState(fn, executors, fallback=fallback, static_argnums=static_argnums, static_argnames=static_argnames,
                     disable_torch_autograd=disable_torch_autograd)
    fast_cache, call_slow = state.fast_cache, state.call_slow
    use_fast_path = not static_argnums and not static_argnames

    if use_fast_path:
        jitted = _fast_dispatcher(_positional_arities(fn), fast_cache, call_slow)
    else:
        def jitted(*args, **kwargs):
            return call_slow(args, kwargs)

    functools.update_wrapper(jitted, fn)
    jitted._thunderfn_state = state
    return jitted


def _compiled_state(fn, what: str) -> JitState:
    state = getattr(fn, "_thunderfn_state", None)
    if state is None:
        raise TypeError(f"{what} expects a function returned by thunderfn.jit (or another thunderfn transform), "
                        f"got {_fn_name(fn)}")
    if not state.last_traces:
        raise RuntimeError(f"'{_fn_name(fn)}' has not been called yet, so it has no traces")
    return state


def last_traces(fn) -> list[Trace]:
    """Every stage of fn's most recent compile, the execution trace last."""
    return list(_compiled_state(fn, "last_traces").last_traces)


def last_backward_traces(fn) -> list[Trace]:
    """The backward traces of fn's most recent compile, the one torch.autograd runs last.
    A jitted function has a backward when it was called with an input that requires
    grad under grad mode (see docs/autodiff.md)."""
    state = _compiled_state(fn, "last_backward_traces")
    if not state.last_backward_traces:
        raise RuntimeError(f"'{_fn_name(fn)}' has no backward trace: {state.why_no_backward}")
    return list(state.last_backward_traces)


def cache_info(fn) -> dict:
    """Entries and slow-path hits/misses of a jitted function's cache (for a jitted
    module, summed over its train and eval functions)."""
    jitted = getattr(fn, "_thunderfn_jitted", None)
    states = [j._thunderfn_state for j in jitted.values()] if jitted is not None else [fn._thunderfn_state]
    return {"entries": sum(len(s.cache) for s in states), "hits": sum(s.cache_hits for s in states),
            "misses": sum(s.cache_misses for s in states)}
