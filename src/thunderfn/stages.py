"""JAX's ahead-of-time stages for a jitted function or module.

`tf.jit(f).lower(*args, **kwargs)` traces, differentiates and lowers f for the signature of those
arguments without running it (jax.jit(f).lower): a `Lowered`, whose `.traces` (and
`.backward_traces`, where an input requires grad under grad mode) are the program's, `.as_text()`
prints them and `.cost_analysis()` counts what its operations compute and move. `.compile()` binds
a callable to that one signature: it never traces again, and a call of another signature (shapes,
dtypes, static values, what the trace relied on) raises `SignatureMismatchError` saying what differs,
where the jitted function would compile anew.

The program is the jitted function's cache entry for the signature: lowering a signature the function
has compiled already reuses it, and calling the jitted function afterwards finds it.

The api layer: imported by jit.py and module.py, which give their functions `lower`.
"""
from __future__ import annotations

import torch

from thunderfn import cache_misses
from thunderfn.cache_key import named
from thunderfn.core import artifacts, progress, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten
from thunderfn.errors import SignatureMismatchError, UnsupportedOpError

# torch-language symbols and prims whose flops are a matrix product's: 2 * (output elements) * (inner size)
_MATRIX_PRODUCTS = frozenset({"matmul", "mm", "bmm", "linear", "addmm", "baddbmm", "addbmm", "mv", "dot"})


def lower(state, args: tuple, kwargs: dict, prefix=None) -> "Lowered":
    """The Lowered program of the jitted function whose JitState is `state`, for this call's signature.
    `prefix()`: tensors the call passes before the user's arguments (a jitted module's parameters)."""
    full = (*prefix(), *args) if prefix is not None else args
    leaves, spec = tree_flatten((full, kwargs))
    key = state.key(leaves, spec)
    entry = state.lookup(key, leaves)
    if entry is None:
        with progress.compiling(state.name), artifacts.writing_to(state.options.cache_dir):
            entry = state.compiled_entry(key, full, kwargs, leaves)
    if entry is None:
        raise UnsupportedOpError(
            f"'{state.name}' cannot be lowered for these arguments: it would run eagerly (past its cache_size_limit of "
            f"{state.cache_size_limit} compiled signatures, or an optimizer's first step, which creates its state). "
            f"Raise cache_size_limit, or lower after the first step.")
    return Lowered(state, entry, prefix)


class Lowered:
    """A jitted function's program for one signature, traced, differentiated and lowered, not run."""

    def __init__(self, state, entry, prefix=None):
        self._state, self._entry, self._prefix = state, entry, prefix

    @property
    def traces(self) -> list:
        """The forward's traces, from the first (as traced) to the last (what runs)."""
        return list(self._entry.traces)

    @property
    def backward_traces(self) -> list:
        """The backward's traces, where the signature differentiates (an input requires grad); else empty."""
        return list(self._entry.backward_traces)

    def as_text(self) -> str:
        """The Python that runs: the forward's last trace, and the backward's where there is one."""
        text = str(self._entry.traces[-1])
        if self._entry.backward_traces:
            text += "\n" + str(self._entry.backward_traces[-1])
        return text

    def compile(self) -> "Compiled":
        return Compiled(self._state, self._entry, self._prefix)

    def cost_analysis(self) -> dict:
        """What the program's operations compute and move, from their shapes: `flops` (a matrix product
        2 * output elements * inner size, any other op one per output element, where every size is known),
        `bytes accessed` (each operation's tensor inputs and outputs, once each), and `by_op`: one dict per
        operation of the forward (and backward) trace that runs, with its executor. A size that is symbolic
        counts at the size the program was lowered at."""
        rows = [_op_cost(bsym, "forward") for bsym in self._entry.traces[-1].bound_symbols]
        if self._entry.backward_traces:
            rows += [_op_cost(bsym, "backward") for bsym in self._entry.backward_traces[-1].bound_symbols]
        rows = [r for r in rows if r is not None]
        return {"flops": sum(r["flops"] for r in rows), "bytes accessed": sum(r["bytes accessed"] for r in rows),
                "by_op": rows}


class Compiled:
    """A callable bound to the one signature it was lowered for: it runs that program and never traces."""

    def __init__(self, state, entry, prefix=None):
        self._state, self._entry, self._prefix = state, entry, prefix

    def __call__(self, *args, **kwargs):
        full = (*self._prefix(), *args) if self._prefix is not None else args
        leaves, spec = tree_flatten((full, kwargs))
        key = self._state.key(leaves, spec)
        why = self._entry.why_not(key, leaves)
        if why is not None:
            if not self._entry.fits(key):  # the key's own words, as a recompile's reason says them
                why = cache_misses.new_signature(named(key, leaves), [self._entry.key], full, kwargs) or why
            raise SignatureMismatchError(
                f"this compiled '{self._state.name}' runs the signature it was lowered for only, and this call "
                f"differs: {why}. Lower it again for these arguments (tf.jit(f).lower(...).compile()), or call the "
                f"jitted function, which compiles each new signature.")
        return self._state.run(self._entry, full, kwargs, leaves)


def _op_cost(bsym, trace: str) -> dict | None:
    if bsym.sym.name in ("return", "unpack_trivial", "del", "python_del"):
        return None
    ins, outs = bsym.proxy_args(), bsym.proxy_outs()
    if not ins and not outs:
        return None
    seen: dict = {}
    for p in (*ins, *outs):
        seen.setdefault(p.name, _numel(p) * p.dtype.itemsize)
    out_elements = sum(_numel(o) for o in outs)
    name = bsym.sym.name.rsplit(".", 1)[-1]
    if name in _MATRIX_PRODUCTS and ins and ins[0].ndim:
        flops = 2 * out_elements * _size(ins[0].shape[-1])
    else:
        flops = out_elements
    return {"trace": trace, "op": bsym.sym.name, "executor": getattr(bsym.sym.executor, "name", None),
            "flops": flops, "bytes accessed": sum(seen.values())}


def _size(n) -> int:
    return symbolic.hint(n) if isinstance(n, torch.SymInt) else int(n)


def _numel(p: TensorProxy) -> int:
    total = 1
    for n in p.shape:
        total *= _size(n)
    return total
