"""jit: compile once per input signature and guards, cache, and run the cached code.

A jitted function's JitState keeps its options (a JitOptions, each value checked when
tf.jit is called: jit_options.py) and its cache. A call with a new
signature is compiled by the stages of compile_stages.py (trace, optimize, split,
rematerialize, distribute, lower, generate) into a cache entry.

The signature of a call is its pytree structure, each tensor's shape, dtype,
device and requires_grad, the value of every non-tensor argument, torch's grad
mode, default dtype and autocast state: the cache key (its fields: cache_key.py).
Besides it, an entry holds the guards its trace recorded (core/guards.py): the
Python state the traced code read (module flags and attributes, hooks, closed-over
and global values, tensors held by plain objects). A call runs the newest entry that
admits it: every fact of the entry holds for it (cache_entry.py decides, and says which
fact failed); otherwise the function is traced again, and the reason is kept
(`cache_info`; put in words by cache_misses.py). Past `cache_size_limit`
entries a function warns once and runs eagerly for new signatures, torch.compile's
meaning.

The cache-hit path is the hot path. A call with only positional tensors skips
pytree flattening entirely (optree alone costs more than our whole budget on a
tiny function), and the generated function returns the user's output structure
itself. Each entry has a generated check-and-call function that compares the call with
the entry's key field by field (and runs its guards), and the dispatcher calls the one
for the entry that ran last first, so a repeated hit is one call that checks and runs;
a call that alternates between entries adds building a tuple key and one dict lookup
(how they are generated: fast_path.py).
Compiling holds a per-function lock, so threads calling one jitted function for the
first time compile it once.

The api layer: may import every layer below it, and thunderfn/module.py (jit of an
nn.Module). Transforms called with real tensors compile through jit, which registers
itself for them in core/context.py (they sit below it and do not import it).
"""
from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Callable, Sequence

import torch

from thunderfn import cache_misses, compile_stages, disk_cache
from thunderfn.cache_entry import CacheEntry
from thunderfn.cache_key import CacheKey, named, tensor_fields
from thunderfn.compile_stages import FloatsStayStatic
from thunderfn.core import artifacts, context, progress
from thunderfn.core.call_time import Guarded
from thunderfn.core.decorators import with_options_form
from thunderfn.core.dynamo_opaque import opaque_to_dynamo
from thunderfn.core.interception import is_numpy_scalar
from thunderfn.core.pytree import tree_flatten
from thunderfn.core.trace import Trace
from thunderfn.core.tracer import FloatValueQuestion
from thunderfn.donation import check_apart, donated_tensor_numbers
from thunderfn.dynamic_shapes import SymbolicSizes, open_dimensions, served_key
from thunderfn.errors import ArgumentTypeError, NoTraceError
from thunderfn.fast_path import fast_dispatcher, fast_key, hit_function, miss, positional_arities
from thunderfn.jit_options import DEFAULT_CACHE_SIZE_LIMIT, JitOptions
from thunderfn.module import jit_module
from thunderfn.stages import Lowered, lower
from thunderfn.static_args import StaticArguments
from thunderfn.static_args import resolve as resolve_static
from thunderfn.torch.autocast import autocast_state
from thunderfn.torch.optim import StepChangesOptimizerState

Tensor = torch.Tensor
_is_grad_enabled = torch.is_grad_enabled
_get_default_dtype = torch.get_default_dtype
_new = tuple.__new__
_any_autocast = torch._C._is_any_autocast_enabled

_FAST_CACHE_LIMIT = 256  # concrete signatures the fast path keeps (see JitState.run)


class JitState:
    """What a jitted function keeps: its options, its caches, its statistics and its most recent compile's traces."""

    def __init__(self, fn, options: JitOptions, static: StaticArguments | None = None):
        self.fn = fn
        self.options = options  # checked when tf.jit was called (jit_options.py); a copy compiles alike: tf.profile
        # tensor number -> dimensions symbolic in every compile, as if marked with tf.mark_dynamic on every call
        # (set by the torch.compile backend for the dimensions Dynamo made symbolic)
        self.marked_dynamic: dict = {}
        # checked against fn's signature now (static_args.py); a jitted module's forward gets them resolved
        self.static = static if static is not None else resolve_static(fn, options.static_argnums,
                                                                        options.static_argnames)
        self.static_argnums, self.static_argnames = self.static.argnums, self.static.argnames
        # the arguments whose tensors the compiled code may write its results into (donation.py), or None
        self.donated = (resolve_static(fn, options.donate_argnums, (), option="donate") if options.donate_argnums
                        else None)
        if self.donated is not None:
            check_apart(self.donated, self.static)
        self.lock = threading.RLock()
        self.fast_cache: dict = {}  # fast key -> the entry's check-and-call function (see fast_hit)
        # (number of positional tensors, keyword names in the call's order) -> the check-and-call function
        # of the entry that last ran such a call (see keyword_hit)
        self.keyword_cache: dict = {}
        self.dispatcher_globals: dict | None = None  # the fast dispatcher's, which name each arity's hot entry
        self.cache: dict = {}  # key -> [CacheEntry], newest last
        self.symbolic_entries: list[CacheEntry] = []  # entries with symbolic dimensions, newest last
        self.stats = [0, 0]  # [hits, misses]; the fast path counts its hits too
        self.recompile_reasons: list[str] = []
        # why each compile asked for symbolic sizes compiled with static ones instead (compile_serving), and
        # the sizes symbolic compiles' traces pinned to a number (a guard `s0 == 3`): what cache_info reports
        self.static_fallbacks: list[str] = []
        self.pinned_sizes: list[str] = []
        self.warned_limit = False
        # why floats stay values of the cache key in this function's compiles (FloatsStayStatic), or None
        self.floats_static: str | None = None
        # tf.grad and the other transforms cannot run eagerly (they need a trace): past the
        # limit they warn as jit does and drop their oldest entry (see jit_evicting).
        self.evict_past_limit = False
        self.last_traces: list[Trace] = []
        self.last_backward_traces: list[Trace] = []
        self.why_no_backward = "it has not been called with an input that requires grad under grad mode"
        # what became of the last compiled entry with cache_dir set (disk_cache.py): loaded, or why not written
        self.disk: str | None = None

    @property
    def name(self) -> str:
        return _fn_name(self.fn)

    def lower(self, *args, **kwargs) -> Lowered:
        """tf.jit(f).lower(*args, **kwargs): the program for this signature, compiled and not run (stages.py)."""
        return lower(self, args, kwargs)

    @property
    def cache_size_limit(self) -> int:
        return self.options.cache_size_limit

    def key(self, leaves, spec) -> CacheKey:
        """The call's cache key, its parts plain tuples in the order of TensorPart's and ValuePart's fields
        (built on every call of the general path: see cache_key.py; `named` names them)."""
        parts = []
        for leaf in leaves:
            if isinstance(leaf, Tensor):
                parts.append(tensor_fields(leaf))
            elif type(leaf) is slice:  # slices are unhashable before Python 3.12; key on their bounds
                parts.append((slice, (leaf.start, leaf.stop, leaf.step)))
            elif type(leaf) is float:  # 0.0 == -0.0 but they compute differently; nan != nan would never hit
                parts.append((float, leaf.hex()))
            elif type(leaf) is complex:
                parts.append((complex, (leaf.real.hex(), leaf.imag.hex())))
            elif is_numpy_scalar(leaf):
                parts.append((type(leaf), leaf.tobytes()))  # numpy scalars: by bits, as floats above
            else:
                try:
                    hash(leaf)
                except TypeError:
                    raise ArgumentTypeError(
                        f"{type(leaf).__name__} argument to the jitted function '{_fn_name(self.fn)}' is not hashable. "
                        f"thunderfn bakes non-tensor arguments into the compiled function and keys its cache on their "
                        f"values: pass tensors, pytrees of tensors, or hashable values.") from None
                parts.append((type(leaf), leaf))
        # (tuple.__new__: without NamedTuple's Python-level __new__; autocast's state asked only when it is on)
        return _new(CacheKey, (spec, _is_grad_enabled(), _get_default_dtype(),
                               autocast_state() if _any_autocast() else (), tuple(parts)))

    def compile(self, args, kwargs, leaves, key, open_dims=None, hints=None, numbers=frozenset()) -> CacheEntry:
        """The entry for a call, compiled (compile_stages.py) with the dimensions in open_dims (tensor number
        -> dims) symbolic, traced at the sizes in hints ((tensor number, dim) -> size) where given, and the
        floats at the places `numbers` traced as values. Where a compile cannot take floats as values
        (FloatsStayStatic: a .grad read, a number computed from one returned through torch.autograd; or it fails
        with nothing else symbolic), this function's floats stay static from then on (`floats_static` says why),
        and this compile is made without them."""
        if numbers and self.floats_static is None:
            try:
                return self.compile_once(args, kwargs, leaves, key, open_dims, hints, numbers)
            except FloatsStayStatic as e:
                self.floats_static = f"{type(e).__name__}: {e}"
                self.static_fallbacks.append(self.floats_static)
            except FloatValueQuestion:
                raise
            except Exception as e:
                if not open_dims:
                    self.floats_static = f"{type(e).__name__}: {str(e).strip()[:200]}"
                raise
        return self.compile_once(args, kwargs, leaves, key, open_dims, hints)

    def compile_once(self, args, kwargs, leaves, key, open_dims=None, hints=None, numbers=frozenset()) -> CacheEntry:
        donated = donated_tensor_numbers(self.donated, args, kwargs, leaves) if self.donated else frozenset()
        c = compile_stages.begin(self.fn, _fn_name(self.fn), args, kwargs, self.options, open_dims, hints, numbers,
                                 donated)
        try:
            c = compile_stages.run(c)
        finally:  # (said by an error that a later stage raises, too)
            if c.tried_split:
                self.why_no_backward = c.why_no_backward
        positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor))
        served = served_key(key, c.sizes)
        symbolic_sizes = (SymbolicSizes(c.sizes, served) if c.sizes is not None
                          and (c.sizes.symbolic_dims or c.sizes.number_names) else None)
        if c.sizes is not None:
            self.pinned_sizes += c.sizes.pinned()
        return CacheEntry(served, c.compiled, c.traces, c.backward, positions, c.guards, symbolic_sizes,
                          tuple(sorted(numbers)))

    def compile_serving(self, args, kwargs, leaves, key, open_dims, hints, numbers=frozenset()) -> CacheEntry:
        """An entry that serves this call, compiled with open_dims symbolic where that serves it, else with
        this call's sizes (static_fallbacks says why: cache_info). Floats traced as values (`numbers`) are
        traced so in each attempt but the static one; where the compile cannot take them (FloatsStayStatic),
        they stay static in this function's later compiles too.

        A size-1 dimension traced at another size (hints) may not take this call's 1: where its trace relied
        on that size (pinned it, or told 1 apart: it broadcast against another size), or failed, the entry is
        kept for the sizes it serves and the compile is tried again with the size-1 dimensions static, then
        with every size static. Tracing symbolically may fail where a static trace does not (code that wants
        a Python int): the static compile is the answer then, and an error it raises names sizes as eager's
        does. Every entry is asked whether it serves this call before it runs it (CacheEntry.serves)."""
        attempts = [(open_dims, hints)] if open_dims or numbers else []
        narrowed = _without(open_dims, hints) if hints else None
        if narrowed:
            attempts.append((narrowed, {}))  # the size-1 dimensions static, the others symbolic
        failure, refusal = None, None  # the first exception; why the trace at other sizes could not take 1
        refused = self._refused_by_sizes(key, leaves, open_dims) if hints else None
        if refused is not None:  # a trace at other sizes would be that entry again, and refuse this call again
            refusal = refused.sizes.failure(refused.tensors(leaves))
            attempts = attempts[1:]
        for dims, at in attempts:
            try:
                entry = self.compile(args, kwargs, leaves, key, dims, at, numbers)
            # (the traced code branching on a float traced as a value is said, not hidden by a static compile)
            except (StepChangesOptimizerState, FloatValueQuestion):
                raise
            except Exception as e:  # noqa: BLE001 (compiled again below; the first failure is the one reported)
                failure = failure or e
                refusal = refusal or f"{type(e).__name__}: {str(e).strip()[:200]}"
                continue
            if entry.serves(key, leaves):
                if refusal is not None:
                    self.pinned_sizes += _size_ones(hints, refusal)
                return entry
            refusal = refusal or entry.why_not(key, leaves)
            if entry.sizes is not None or entry.key not in self.cache:
                self.keep(entry)  # it serves the sizes it was traced at, not this call's
        if hints and not narrowed:  # every open dimension had size 1: the static compile is the answer
            self.pinned_sizes += _size_ones(hints, refusal)
        elif failure is not None:
            text = str(failure).strip()
            self.static_fallbacks.append(f"{type(failure).__name__}: {text.splitlines()[0][:300]}" if text
                                         else type(failure).__name__)
        return self.compile(args, kwargs, leaves, key)

    def _refused_by_sizes(self, key, leaves, open_dims) -> CacheEntry | None:
        """A symbolic entry whose pattern this call fits, with every dimension of open_dims symbolic, that refuses
        the call only by its size guards: what a trace at other sizes would make again (and refuse again)."""
        for entry in reversed(self.symbolic_entries):
            if (entry.fits(key) and all(set(dims) <= set(entry.sizes.dims.get(k, ())) for k, dims in open_dims.items())
                    and not entry.sizes.hold(entry.tensors(leaves))):
                return entry
        return None

    def lookup(self, key, leaves) -> CacheEntry | None:
        """The newest entry that admits this call (CacheEntry.admits: every fact of it), or None."""
        for entry in reversed(self.cache.get(key, ())):  # (the key is theirs: the rest of their facts)
            if not entry.facts or entry.holds(leaves):
                return entry
        for entry in reversed(self.symbolic_entries):
            if entry.admits(key, leaves):
                return entry
        return None

    def call_slow(self, args, kwargs):
        if context.current_trace() is not None:
            # Called while an outer function is being traced: jit inside jit is the
            # function itself, traced into the outer trace (as jax.jit nests).
            return self.fn(*args, **kwargs)
        if self.static_argnums or self.static_argnames:
            self.static.check(args, kwargs)  # (a tensor or an unhashable value refused)
        leaves, spec = tree_flatten((args, kwargs))
        key = self.key(leaves, spec)
        entry = self.lookup(key, leaves)
        if entry is not None:
            self.stats[0] += 1
            return self.run(entry, args, kwargs, leaves)
        # told on stderr if it takes long (core/progress.py); artifacts written where configured (core/artifacts.py)
        with progress.compiling(_fn_name(self.fn)), artifacts.writing_to(self.options.cache_dir):
            entry = self.compiled_entry(key, args, kwargs, leaves)
            if entry is None:
                return self.fn(*args, **kwargs)
            progress.stage("first run (where fusion executors compile their regions)")
            return self.run(entry, args, kwargs, leaves)

    def compiled_entry(self, key, args, kwargs, leaves) -> CacheEntry | None:
        """The entry for this call, compiled and cached if there is none yet (counted as a miss);
        None where the call runs eagerly instead (past cache_size_limit, an optimizer's first step)."""
        with self.lock:  # one compile per signature, however many threads arrive at once
            entry = self.lookup(key, leaves)
            if entry is not None:
                self.stats[0] += 1
                return entry
            key = named(key, leaves)
            reason = self.why_miss(key, args, kwargs, leaves)
            tensors = [x for x in leaves if isinstance(x, Tensor)]
            static_leaves = self.static.leaf_positions(args, kwargs) if self.static else frozenset()
            open_dims, hints, numbers = open_dimensions(self.options.dynamic, key, tensors, self.compiled_keys(),
                                                        self.marked_dynamic, static_leaves)
            if self.floats_static is not None:
                numbers = frozenset()
            if self.n_entries >= self.cache_size_limit:
                self.warn_limit(reason)
                if not self.evict_past_limit:
                    self.stats[1] += 1
                    return None
                self.evict_oldest()
            self.stats[1] += 1
            if not open_dims and not numbers:  # a compile with this call's sizes: one written to disk may serve it
                with compile_stages.cyclic_gc_paused():  # (reading one builds many objects: as a compile does)
                    entry, self.disk = disk_cache.load(self, key, leaves)
                if entry is not None:
                    self.disk = "loaded from cache_dir"
                    self.keep(entry)
                    return entry
            try:
                entry = self.compile_serving(args, kwargs, leaves, key, open_dims, hints, numbers)
            except StepChangesOptimizerState:  # an optimizer's first step creates its state: run it as eager does
                return None
            with compile_stages.cyclic_gc_paused():
                self.disk = disk_cache.save(self, entry) or self.disk
            if entry.sizes is not None and reason is not None:
                values = entry.sizes.inputs.number_names
                sizes = ", ".join(f"{name} = {where}" for name, where in entry.sizes.described.items()
                                  if name not in values)
                floats = ", ".join(f"{name} = {where}" for name, where in values.items())
                opened = " and ".join(([f"symbolic sizes {sizes}"] if sizes else [])
                                      + ([f"floats traced as values {floats}"] if floats else []))
                reason = f"{reason}: compiled with {opened}"
            if reason is not None:
                self.recompile_reasons.append(reason)
            self.keep(entry)
            return entry

    def keep(self, entry: CacheEntry) -> None:
        """Cache an entry: with the others of the key it serves, or among the symbolic entries (matched by pattern)."""
        if entry.sizes is not None:
            self.symbolic_entries.append(entry)
        else:
            self.cache.setdefault(entry.key, []).append(entry)

    @property
    def n_entries(self) -> int:
        return sum(map(len, self.cache.values())) + len(self.symbolic_entries)

    def precompile(self, args, kwargs) -> CacheEntry | None:
        """Compile and cache the entry for a call like this one without running it (the torch.compile
        backend compiles each graph when Dynamo hands it over, with Dynamo's example inputs)."""
        leaves, spec = tree_flatten((args, kwargs))
        with progress.compiling(_fn_name(self.fn)), artifacts.writing_to(self.options.cache_dir):
            entry = self.compiled_entry(self.key(leaves, spec), args, kwargs, leaves)
        if entry is not None:  # (counted as the miss it is: the first call is then a hit)
            self.last_traces, self.last_backward_traces = entry.traces, entry.backward_traces
        return entry

    def run(self, entry: CacheEntry, args, kwargs, leaves):
        """Call a cache entry, and make it the fast path's for calls like this one."""
        self.last_traces, self.last_backward_traces = entry.traces, entry.backward_traces
        if (not self.static_argnums and not entry.key.autocast
                and len(entry.tensor_positions) == len(args) + len(kwargs)
                and all(isinstance(a, Tensor) for a in args) and all(isinstance(v, Tensor) for v in kwargs.values())
                and not (isinstance(entry.fn, Guarded) and entry.fn.grad_reads)):
            # (an entry reading .grad at call time takes extra inputs: it stays on this path)
            if kwargs:
                self.keyword_cache[(len(args), *kwargs)] = self.keyword_hit(entry, kwargs)
            else:
                if len(self.fast_cache) >= _FAST_CACHE_LIMIT:
                    # a symbolic entry serves every size, and each size is a key here: a generation of thousands
                    # of tokens would keep thousands; the hot entry stays (the dispatcher holds it)
                    self.fast_cache.clear()
                self.fast_cache[fast_key(args)] = self.fast_hit(entry)
        return entry.fn(*map(leaves.__getitem__, entry.call_positions))  # (no comprehension's frame per call)

    def evict_oldest(self) -> None:
        if self.cache:
            key = next(iter(self.cache))
            entries = self.cache[key]
            entries.pop(0)  # everything it owns (code, traces, captured tensors) goes with it
            if not entries:
                del self.cache[key]
        else:
            self.symbolic_entries.pop(0)
        self.fast_cache.clear()  # they may point at the evicted entry; refilled by the next calls
        self.keyword_cache.clear()
        if self.dispatcher_globals is not None:
            for name in self.dispatcher_globals["hot_names"]:
                self.dispatcher_globals[name] = miss

    def fast_hit(self, entry: CacheEntry):
        """The fast path's function for entry, called with the positional tensors: it checks the
        whole cache key (grad mode, default dtype, each tensor's dtype, shape, requires_grad and
        device), that no trace is being built and the entry's guards, then counts the hit and runs
        the entry; anything else returns MISS. Generated Python, made once per entry: comparing
        with constants costs less than building and hashing a key."""
        if entry.fast_hit is None:
            entry.fast_hit = hit_function(*entry.checked_key(), entry.fn, entry.guards_hold, self.stats,
                                           entry.layout)
        return entry.fast_hit

    def keyword_hit(self, entry: CacheEntry, kwargs: dict):
        """fast_hit's function for a call with tensors by keyword too (a Hugging Face model's
        `model(input_ids=..., labels=...)`), called with (args, kwargs): it finds each tensor by
        position or by name, in the order the cache key flattened them (keywords sorted)."""
        if entry.keyword_hit is None:
            entry.keyword_hit = hit_function(*entry.checked_key(), entry.fn, entry.guards_hold, self.stats,
                                              entry.layout, keywords=tuple(sorted(kwargs)))
        return entry.keyword_hit

    def why_miss(self, key, args, kwargs, leaves) -> str | None:
        """Why this call cannot use a cached entry, in words (None for the first compile): the fact that failed
        of the newest entry its key fits, or how its key differs from the closest one compiled."""
        fitting = self.cache.get(key) or [e for e in self.symbolic_entries if e.fits(key)]
        if fitting:
            return fitting[-1].why_not(key, leaves)
        return cache_misses.new_signature(key, self.compiled_keys(), args, kwargs)

    def compiled_keys(self) -> list[CacheKey]:
        """The keys compiled, and the symbolic entries' key patterns (a symbolic size: None)."""
        return [*self.cache, *(e.key for e in self.symbolic_entries)]

    def warn_limit(self, reason) -> None:
        if self.warned_limit:
            return
        self.warned_limit = True
        reasons = self.recompile_reasons[-3:] + ([reason] if reason else [])
        # (a transform has no eager form: it compiles such a call in place of its oldest entry)
        then = ("compiles each call that matches none of its compiled entries in place of its oldest entry (a "
                "transform cannot run eagerly)" if self.evict_past_limit else
                "runs eagerly for calls that match none of its compiled entries")
        warnings.warn(
            f"thunderfn.jit: '{_fn_name(self.fn)}' reached cache_size_limit ({self.cache_size_limit}) and now {then}. "
            f"Last recompiles: {'; '.join(reasons)}. "
            f"{cache_misses.limit_advice(reasons, self.options.dynamic, self.pinned_sizes)}", stacklevel=4)


def _without(open_dims: dict, dims) -> dict:
    """open_dims less the (tensor number, dim)s in dims."""
    kept = {k: frozenset(d for d in ds if (k, d) not in dims) for k, ds in open_dims.items()}
    return {k: ds for k, ds in kept.items() if ds}


def _size_ones(hints: dict, why: str | None) -> list[str]:
    """cache_info's pinned lines for size-1 dimensions a trace at other sizes could not take, and why."""
    return [f"tensor {k}'s dimension {d} == 1 (its trace at size {at} could not take 1" + (f": {why})" if why else ")")
            for (k, d), at in hints.items()]


def _fn_name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


@with_options_form
def jit(fn: Callable, *, executors: Sequence | None = None, fallback: bool = True, static_argnums=(),
        static_argnames=(), disable_torch_autograd: bool = False, cache_size_limit: int = DEFAULT_CACHE_SIZE_LIMIT,
        rematerialize: bool | None = None, cache_dir: str | os.PathLike | None = None, distributed=None,
        fusion: bool | str = False, dynamic: bool | None = None, donate_argnums=(), reuse_blocks: bool = True):
    """Compile fn: trace it per input signature, lower it onto `executors` (priority
    order; None means the defaults; the torch executor is appended unless
    `fallback=False`), generate Python once and cache it.

    `fn` is a function or an `nn.Module` (then a module comes back, whose parameters and
    buffers are inputs on every call, so optimizer steps are seen). Arguments and results
    may be any pytree of tensors and Python values. When an input requires grad, the
    result is wired into torch.autograd: `loss.backward()` runs the compiled backward.

        >>> import torch, thunderfn as tf
        >>> def mlp(x, w1, w2):
        ...     return torch.nn.functional.gelu(x @ w1) @ w2
        >>> fast = tf.jit(mlp)
        >>> x, w1, w2 = torch.randn(8, 16), torch.randn(16, 32, requires_grad=True), torch.randn(32, 4)
        >>> out = fast(x, w1, w2)                          # traced, lowered, compiled, run
        >>> torch.testing.assert_close(out, mlp(x, w1, w2))
        >>> out.sum().backward()                           # the compiled backward
        >>> w1.grad.shape
        torch.Size([16, 32])
        >>> model = tf.jit(torch.nn.Linear(4, 2))          # a module comes back
        >>> model(torch.randn(3, 4)).shape
        torch.Size([3, 2])

    Non-tensor arguments are baked in and keyed by value, so every non-tensor argument
    already behaves like a JAX static argument. `static_argnums`/`static_argnames` are
    checked against fn's signature here, by JAX's rules (static_args.py: each completes the
    other, a negative index counts from the end; for a module they name its forward's
    arguments after self), and each call's static arguments must be hashable and hold no
    tensor (a tensor there would be baked in by value, which is never what the caller wants).

    Each compiled entry is guarded by the Python state its trace read (globals, closed-over
    values, module attributes: docs/sharp_bits.md); past `cache_size_limit` entries, calls that
    match none run eagerly after one warning.

    `rematerialize`: when the function is differentiated through torch.autograd, recompute
    cheap forward values (elementwise and view ops) in the backward instead of saving them,
    where that saves memory (transforms/rematerialize.py). None (the default) turns it on
    where a fusion executor (Inductor, nvFuser) is among the executors, which fuses the recomputation.

    `cache_dir`: where compiled artifacts go (each compiled trace's Python source, and the
    fusion executors' kernel caches); None means $THUNDERFN_CACHE_DIR, or nowhere on disk
    for thunderfn's own code (core/artifacts.py).

    `fusion`: True adds the Inductor fusion executor after `executors` (the defaults when None), so it
    compiles the regions nothing before it claims; a fusion executor's name ("nvfuser") picks that one.

    `dynamic`: which sizes a compile leaves symbolic, torch.compile's meaning (dynamic_shapes.py,
    docs/jit.md): None compiles the first call static and, when a later call differs from a
    compiled signature only in some sizes, compiles once more with those dimensions symbolic; True
    makes every dimension symbolic from the start; False compiles every new size anew.
    `tf.mark_dynamic(t, dim)` and `tf.mark_static(t, dim)` decide for one tensor's dimension.

    A float argument (top-level or in a pytree) seen with a second value is traced as a value from then
    on, unless it is static or `dynamic=False`: the compiled function takes it after its tensors, so
    one entry serves every value, and branching on it is a ConcretizationError (docs/jit.md, "Python floats").

    `donate_argnums`: arguments whose tensors' memory the compiled code may reuse for a value of their
    shape and dtype (jax.jit's donation; donation.py): an output comes back in a donated tensor's memory,
    whose contents are unspecified after the call. Nothing is donated where torch.autograd differentiates
    the compile.

    `reuse_blocks`: for a module, its repeated layers (a transformer's ModuleList of blocks) are traced,
    differentiated and lowered once, and every layer that is the same block (the same classes, state shapes
    and guards, relative to the layer) calls that code (blocks.py); False traces every layer inline.

    `distributed`: set by tf.distributed.ddp and fsdp on the modules they prepare (how the
    module's gradients are synchronized: transforms/ddp.py, transforms/fsdp.py), not by users;
    an nn.Module given one is refused (write `tf.jit(tf.distributed.ddp(model))`).

    Every option's value is checked here, once, whatever fn is (a JitOptions: jit_options.py):
    a bad one is an ArgumentTypeError or ArgumentValueError naming the option.
    """
    options = JitOptions(executors=executors, fallback=fallback, static_argnums=static_argnums,
                         static_argnames=static_argnames, disable_torch_autograd=disable_torch_autograd,
                         cache_size_limit=cache_size_limit, rematerialize=rematerialize, cache_dir=cache_dir,
                         distributed=distributed, fusion=fusion, dynamic=dynamic, donate_argnums=donate_argnums,
                         reuse_blocks=reuse_blocks)
    return jit_with_options(fn, options)


def jit_with_options(fn: Callable, options: JitOptions, static: StaticArguments | None = None):
    """tf.jit with its options checked already (a JitOptions): what a jitted module compiles its forward
    with (`static` then its forward's static arguments, resolved), tf.profile's twin and the torch.compile
    backend."""
    if isinstance(fn, torch.nn.Module):
        return jit_module(fn, jit_with_options, options)
    if not callable(fn):
        raise ArgumentTypeError(f"jit expects a callable or an nn.Module, got {type(fn).__name__}")
    state = JitState(fn, options, static)
    fast_cache, call_slow = state.fast_cache, state.call_slow
    use_fast_path = not state.static

    if use_fast_path:
        jitted, state.dispatcher_globals = fast_dispatcher(positional_arities(fn), fast_cache, state.keyword_cache,
                                                            call_slow)
    else:
        def jitted(*args, **kwargs):
            return call_slow(args, kwargs)

    functools.update_wrapper(jitted, fn)
    jitted._thunderfn_state = state
    jitted.lower = state.lower  # JAX's stages: tf.jit(f).lower(*args).compile() (stages.py)
    return opaque_to_dynamo(jitted)  # torch.compile runs it as one call (core/dynamo_opaque.py)


def jit_evicting(fn: Callable, **options):
    """jit for the function transforms (tf.grad's compiled form, ...): past cache_size_limit it warns
    once, as jit does, and drops its oldest entry for each new one, since a transform has no eager form
    to fall back to."""
    jitted = jit(fn, **options)
    jitted._thunderfn_state.evict_past_limit = True
    return jitted


# Transforms below this layer compile with jit when called with real tensors (core/context.py).
context.register_jit(jit, jit_evicting)


def _compiled_state(fn, what: str) -> JitState:
    state = getattr(fn, "_thunderfn_state", None)
    if state is None:
        raise ArgumentTypeError(f"{what} expects a function returned by thunderfn.jit (or another "
                                f"thunderfn transform), got {_fn_name(fn)}")
    if not state.last_traces:
        raise NoTraceError(f"'{_fn_name(fn)}' has not been called yet, so it has no traces")
    return state


def last_traces(fn) -> list[Trace]:
    """Every stage of fn's most recent compile (a function from tf.jit or a transform), the
    execution trace, the Python that runs, last. Raises NoTraceError before the first call.

        >>> import torch, thunderfn as tf
        >>> fast = tf.jit(lambda x: torch.tanh(x) * 2)
        >>> _ = fast(torch.randn(3))
        >>> traces = tf.last_traces(fast)
        >>> [b.sym.name for b in traces[0].bound_symbols]      # the computation trace
        ['tanh', 'mul']
        >>> print(traces[-1])                                  # doctest: +ELLIPSIS
        # Constructed by Delete Last Used ...
        def computation(x):
        ...
    """
    return list(_compiled_state(fn, "last_traces").last_traces)


def last_backward_traces(fn) -> list[Trace]:
    """The backward traces of fn's most recent compile, the one torch.autograd runs last.
    A jitted function has a backward when it was called with an input that requires
    grad under grad mode (see docs/autodiff.md); else NoTraceError says why it has none.

        >>> import torch, thunderfn as tf
        >>> fast = tf.jit(lambda x: torch.tanh(x).sum())
        >>> fast(torch.randn(3, requires_grad=True)).backward()
        >>> backward = tf.last_backward_traces(fast)[-1]
        >>> backward.python_callable().__name__
        'backward'
    """
    state = _compiled_state(fn, "last_backward_traces")
    if not state.last_backward_traces:
        raise NoTraceError(f"'{_fn_name(fn)}' has no backward trace: {state.why_no_backward}")
    return list(state.last_backward_traces)


def cache_info(fn) -> dict:
    """A jitted function's cache: `entries` (compiled entries), `hits` and `misses` (calls
    that ran a compiled entry, and calls that did not: each compiled one, or ran eagerly
    past cache_size_limit), `cache_size_limit`, `recompiles`, the reason of each
    compile after the first in words (like jax_explain_cache_misses), and `symbolic`: per entry
    with symbolic dimensions, oldest first, each symbol's source (`{"s0": "argument 'x'.shape[1]"}`)
    and `size_guards`, the facts about them its trace relied on; `pinned`, the sizes a symbolic compile's trace
    relied on being one number (so its entry holds them static: "s1 = argument 'x'.shape[1] == 3"), and
    `static_fallbacks`, why each compile that asked for symbolic sizes compiled with static ones instead; `disk`,
    with cache_dir set, what became of the last compiled entry: None (written), "loaded from cache_dir" (a warm
    start, disk_cache.py), or why it was not written or an entry there was skipped.

        >>> import torch, thunderfn as tf
        >>> fast = tf.jit(lambda x: x * 2)
        >>> _ = fast(torch.ones(2)); _ = fast(torch.ones(2)); _ = fast(torch.ones(2, dtype=torch.float64))
        >>> info = tf.cache_info(fast)
        >>> info["entries"], info["hits"], info["misses"]
        (2, 1, 2)
        >>> info["recompiles"]                                 # doctest: +ELLIPSIS
        ['...dtype...']
    """
    state = getattr(fn, "_thunderfn_state", None)  # a jitted module's is its forward's
    if state is None:
        raise ArgumentTypeError(f"cache_info expects a function returned by thunderfn.jit, got {_fn_name(fn)}")
    return {"entries": state.n_entries, "hits": state.stats[0], "misses": state.stats[1],
            "cache_size_limit": state.cache_size_limit, "recompiles": list(state.recompile_reasons),
            "symbolic": [dict(e.sizes.described) for e in state.symbolic_entries],
            "size_guards": [list(e.sizes.facts) for e in state.symbolic_entries],
            "pinned": list(state.pinned_sizes), "static_fallbacks": list(state.static_fallbacks), "disk": state.disk}
