"""Symbols (operations) and bound symbols (their recorded calls).

Calling a Symbol while a trace is being built records a BoundSymbol in that trace.
A prim's meta function validates the inputs and makes the output proxies; a
composite symbol runs its Python body, and the prims (or other symbols) the body
calls become the bound symbol's `subsymbols`, its recorded decomposition.
Called with real tensors outside tracing, a symbol simply computes: prims through
their eager implementation, composites through their recorded prims (core/trace.py
runs them, see `set_eager_composite`).

May import: core/context.py, core/proxies.py, core/printing.py (not core/trace.py,
which imports this module).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

import optree

from thunderfn.core import context
from thunderfn.core.printing import format_bsym
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import InternalError


class DecompositionUnavailable(Exception):
    """Raised by a torch symbol's body for a variant it has no decomposition for (a
    rare mode, say): tracing then records the torch function as an opaque op instead,
    the fallback ladder's next rung, rather than refusing a call torch can run."""


@dataclasses.dataclass(eq=False)
class Symbol:
    """An operation. ``print_name`` is how generated code calls it (``prims.add``,
    ``torch.add``); ``namespace`` binds the names that expression needs.

    Every statement of a trace calls a Symbol: a prim (`is_prim`, made with
    tf.prims.make_prim: a `meta` function says its outputs' shapes and dtypes), a
    torch-language symbol (made with tf.torch.torchsymbol: its body `fn` is recorded as its
    decomposition, and `torch_fn` is the torch callable it mirrors), or an executor's
    operator. `id` (a PrimIDs member, "torch.sin", ...) is what the rule tables (VJP, JVP,
    batching, executors' lowerings) are keyed by. Called while tracing, a symbol records a
    BoundSymbol; called on real tensors, a prim runs its eager implementation and a composite
    runs its decomposition. Symbols are made by those functions, not by hand.

        >>> import torch, thunderfn as tf
        >>> tf.torch.sin, tf.torch.sin.id, tf.torch.sin.is_prim
        ([Symbol name=ltorch.sin], 'torch.sin', False)
        >>> tf.prims.sin, tf.prims.sin.is_prim
        ([Symbol name=prims.sin], True)
        >>> tf.torch.sin(torch.zeros(2))  # outside a trace: computes
        tensor([0., 0.])
    """

    name: str
    id: Any
    meta: Callable | None = None  # prims: validates inputs, returns output proxies
    fn: Callable | None = None  # composites: the body, written in thunderfn's languages
    is_prim: bool = False
    print_name: str | None = None
    namespace: dict = dataclasses.field(default_factory=dict)
    eager: Callable | None = None  # how a prim computes on real tensors outside tracing
    tags: frozenset = frozenset()
    executor: Any = None  # set on executor operators
    like: Callable | None = None  # an operator registered like= a function: differentiated as that function
    torch_fn: Callable | None = None  # torch-language symbols: the torch callable they mirror
    printer: Callable | None = None  # custom statement printer (del, alias)
    # traced in place of `fn` when fn raises DecompositionUnavailable (torch-language symbols: their opaque op)
    fallback: Callable | None = None

    def __post_init__(self):
        if self.print_name is None:
            self.print_name = self.name

    def __repr__(self):
        return f"[Symbol name={self.print_name}]"

    def __call__(self, /, *args, **kwargs):
        tracer = context.current_tracer()
        if tracer is None:
            if self.is_prim:
                if self.eager is None:
                    raise InternalError(f"{self.print_name} has no eager implementation")
                return self.eager(*args, **kwargs)
            return _eager_composite(self, args, kwargs)
        return tracer.record(self, args, kwargs)

    def bind(self, *args, output, subsymbols=(), **kwargs) -> "BoundSymbol":
        return BoundSymbol(self, args, kwargs, output, tuple(subsymbols))

    @functools.cached_property
    def parameters(self) -> dict:
        """{name: (position, default)} of the function the symbol is called as (a composite's body, a
        prim's meta): position None for a keyword-only parameter, default `inspect.Parameter.empty`
        for a required one. How a rule reads an argument by name (core/rules.py's
        RecordedCall.arg); inspected once per symbol, on first use, so tracing pays nothing for it."""
        fn = self.fn if self.fn is not None else self.meta
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # no signature to read (a builtin)
            return {}
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return {p.name: (i if p.kind in positional else None, p.default) for i, p in enumerate(params)
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _trace_missing(sym: Symbol, args, kwargs):
    raise InternalError(f"{sym.print_name} is a composite: running it on tensors traces it, and core/trace.py "
                       f"is not imported; import thunderfn")


# How a composite runs on real tensors: traced, then its recorded prims run one by one. Tracing is
# core/trace.py's, which imports this module, so trace.py hands the function over when imported.
_eager_composite = _trace_missing


def set_eager_composite(fn) -> None:
    """Called once, by core/trace.py when it is imported: fn(symbol, args, kwargs) runs a
    composite symbol on real tensors."""
    global _eager_composite
    _eager_composite = fn


@dataclasses.dataclass(eq=False)
class BoundSymbol:
    """One statement of a trace: a Symbol called on arguments, with its output.

    `sym`: the Symbol called; `args` and `kwargs`: its arguments as recorded (TensorProxy
    objects for tensors, Python values as given); `output`: a TensorProxy or a pytree of them;
    `subsymbols`: the BoundSymbols of its decomposition (empty for a prim), which print
    indented below it. `flat_args()`, `proxy_args()` and `proxy_outs()` list its leaves, its
    tensor inputs and its tensor outputs. `str(bsym)` is the statement as the trace prints it.
    Transforms and executors read and rewrite traces through these; they are made by tracing.

        >>> import torch, thunderfn as tf
        >>> mul = tf.trace(lambda x: torch.sin(x) * 2, torch.ones(3)).bound_symbols[1]
        >>> mul.sym, mul.args, mul.output
        ([Symbol name=ltorch.mul], (<TensorProxy name=t0 "cpu f32[3]">, 2), <TensorProxy name=t1 "cpu f32[3]">)
        >>> print(mul)
        t1 = ltorch.mul(t0, 2)  # t1: "cpu f32[3]"
          # t1 = prims.mul(t0, 2)  # t1: "cpu f32[3]"
        >>> [sub.sym for sub in mul.subsymbols]
        [[Symbol name=prims.mul]]
    """

    sym: Symbol
    args: tuple
    kwargs: dict
    output: Any
    subsymbols: tuple = ()

    def flat_args(self) -> list:
        return optree.tree_leaves((self.args, self.kwargs), none_is_leaf=True, namespace="thunderfn")

    def flat_outs(self) -> list:
        return optree.tree_leaves(self.output, none_is_leaf=True, namespace="thunderfn")

    # The passes ask a statement for its tensors many times (an unrolled loop's 14,000 statements: 136,000 times,
    # a fifth of its compile in flattening): each list is kept with the args/kwargs or output it was read from,
    # and read again where a field was assigned anew (tuples themselves do not change)
    def proxy_args(self) -> list:
        known = self.__dict__.get("_proxy_args")
        if known is None or known[0] is not self.args or known[1] is not self.kwargs:
            known = self._proxy_args = (self.args, self.kwargs,
                                        [a for a in self.flat_args() if isinstance(a, TensorProxy)])
        return list(known[2])

    def proxy_outs(self) -> list:
        known = self.__dict__.get("_proxy_outs")
        if known is None or known[0] is not self.output:
            known = self._proxy_outs = (self.output, [o for o in self.flat_outs() if isinstance(o, TensorProxy)])
        return list(known[1])

    def proxies(self) -> list:
        """The tensors it reads and those it makes."""
        return self.proxy_args() + self.proxy_outs()

    def swap(self, mapping: dict) -> "BoundSymbol":
        """The same call with proxies replaced by name (args, outputs and subsymbols)."""
        if not mapping:
            return self

        def sub(tree):
            return optree.tree_map(
                lambda x: mapping.get(x.name, x) if isinstance(x, TensorProxy) else x,
                tree, none_is_leaf=True, namespace="thunderfn",
            )

        return BoundSymbol(self.sym, sub(self.args), sub(self.kwargs), sub(self.output),
                           tuple(s.swap(mapping) for s in self.subsymbols))

    def __str__(self):
        return "\n".join(format_bsym(self, indent=0))
