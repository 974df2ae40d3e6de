"""A compiled entry of a jitted function, and the one decision whether it serves a call.

An entry serves a call when every fact its trace relied on holds for that call, checked in this order:

1. the key: the call's cache key equals the key the entry serves (`CacheEntry.key`). That is the key of
   the call it was traced for, except for the sizes the trace left symbolic (None: any size) and the
   sizes a symbolic trace pinned to a number (the number it was traced at, which need not be the
   compiling call's: a length-1 call is traced at another length, dynamic_shapes.open_dimensions);
2. the sizes: the relations the trace relied on between its symbolic sizes (`s0 == s1`, `s0 <= 128`),
   SymbolicSizes in dynamic_shapes.py;
3. the input layouts the trace read (a tensor's strides: Tracer.rely_on_layout);
4. the guards on Python state the trace read (core/guards.py: module flags, globals, closures);
5. the state it reads at call time (core/call_time.py: `.grad`, an optimizer's settings).

`admits` and `why_not` walk the same list (`_facts`), so a miss is explained by the fact that failed;
the fast path's generated check compares the same key, size guards, layouts and guards
(fast_path.hit_function, from `checked_key`). Every call is checked, the one that made the entry
included: jit runs a fresh entry only where it admits the call that compiled it (JitState.compile_serving).

The api layer: imported by jit.py.
"""
from __future__ import annotations

from thunderfn.cache_key import CacheKey
from thunderfn.core.call_time import Guarded
from thunderfn.dynamic_shapes import SymbolicSizes


class CacheEntry:
    __slots__ = ("key", "fn", "traces", "backward_traces", "tensor_positions", "number_positions", "call_positions",
                 "guards", "guards_hold", "fast_hit", "keyword_hit", "layout", "sizes", "facts")

    def __init__(self, key: CacheKey, fn, traces, backward_traces, tensor_positions, guards,
                 sizes: SymbolicSizes | None = None, number_positions: tuple = ()):
        self.key = key  # the (named) key it serves: a symbolic size None (sizes.pattern), a pinned one its number
        self.fn, self.traces, self.backward_traces = fn, traces, backward_traces
        self.tensor_positions = tensor_positions  # where the call's flattened arguments hold its tensors
        # where they hold the floats its trace took as values (core/symbolic.py's SymbolicInputs.number), passed
        # after the tensors: fn is called with the leaves at call_positions
        self.number_positions = number_positions
        self.call_positions = tensor_positions + number_positions
        self.guards = guards
        self.sizes = sizes  # SymbolicSizes where the trace has symbolic dimensions, else None
        self.guards_hold = guards.compile()  # None: nothing to check
        self.fast_hit = None  # its check-and-call function for the fast path (see JitState.fast_hit), once made
        self.keyword_hit = None  # the same for a call with keyword tensors (see JitState.keyword_hit)
        # (tensor number, what, get, value): layout facts the trace relies on (Tracer.rely_on_layout), part of
        # the signature of the inputs they are about (most traces have none)
        self.layout = tuple((position, what, get, value) for position, facts in traces[0].layout_reads.items()
                            for (what, get), value in facts.items())
        # what it checks besides the key (most entries: nothing, and JitState.lookup asks nothing)
        self.facts = self._facts()

    def fits(self, key: CacheKey) -> bool:
        """Whether a call's key is one this entry serves (its symbolic sizes free)."""
        return key == self.key if self.sizes is None else self.sizes.matches(key)

    def serves(self, key: CacheKey, leaves) -> bool:
        """Whether this call's sizes are ones the entry was traced for (the key and size facts): what a fresh
        entry is asked about the call that compiled it. Its guards on Python state are not: the trace read
        that state during this very call, which may change it (a counter the function increments)."""
        return self.fits(key) and (self.sizes is None or self.sizes.hold(self.tensors(leaves)))

    def admits(self, key: CacheKey, leaves) -> bool:
        """Whether this entry may run a call with this key and these flattened arguments: every fact holds."""
        return self.fits(key) and self.holds(leaves)

    def holds(self, leaves) -> bool:
        """Whether every fact besides the key holds for a call with these flattened arguments (its key fits)."""
        for holds, _ in self.facts:
            if not holds(leaves):
                return False
        return True

    def why_not(self, key: CacheKey, leaves) -> str | None:
        """The first fact that does not hold for this call, in words; None where the entry admits it."""
        if not self.fits(key):
            return self._key_differs(key)
        for holds, in_words in self.facts:
            if not holds(leaves):
                return in_words(leaves)
        return None

    def _facts(self) -> list:
        """(holds(leaves) -> bool, in_words(leaves) -> str) for each fact besides the key, in the order checked."""
        tensors, facts = self.tensors, []
        if self.sizes is not None:
            facts.append((lambda leaves: self.sizes.hold(tensors(leaves)),
                          lambda leaves: self.sizes.failure(tensors(leaves))))
        if self.layout:
            facts.append((lambda leaves: self.layout_changed(leaves) is None, self.layout_changed))
        if self.guards_hold is not None:
            facts.append((lambda leaves: self.guards_hold(), lambda leaves: self.guards.failure() or "a guard failed"))
        if isinstance(self.fn, Guarded):
            facts.append((lambda leaves: self.fn.guard(tensors(leaves)) is None,
                          lambda leaves: self.fn.guard(tensors(leaves))))
        return facts

    def tensors(self, leaves) -> list:
        return [leaves[i] for i in self.tensor_positions]

    def layout_changed(self, leaves) -> str | None:
        for position, what, get, value in self.layout:
            now = get(leaves[self.tensor_positions[position]])
            if now != value:
                return f"tensor argument {position}'s {what} changed: {value} -> {now}"
        return None

    def _key_differs(self, key: CacheKey) -> str:
        """How a key differs from the one this entry serves: for the sizes the entry pinned, which ones."""
        pinned = []
        for k, (mine, theirs) in enumerate(zip(self.key.tensor_parts(), key.tensor_parts())):
            if len(mine.shape) == len(theirs.shape):
                pinned += [f"tensor {k}'s dimension {d} is {n}, its entry was traced at {m}"
                           for d, (m, n) in enumerate(zip(mine.shape, theirs.shape)) if m is not None and m != n]
        return "; ".join(pinned) or "its signature differs"

    def checked_key(self) -> tuple:
        """(the key a check-and-call function compares a call with, the size guards it checks): an entry with
        symbolic dimensions compares its pattern (those sizes free) and checks its trace's guards on sizes."""
        return self.key, None if self.sizes is None else self.sizes.guard_code
