"""Executors: tables of lowering rules keyed by symbol.

A lowering rule has a `checker(*args, **kwargs) -> bool`, called with proxies at
compile time, and a `lower(*args, **kwargs)` that is traced and replaces the bound
symbol (it may call this executor's operators and any torch ops around them).
Executors are tried in priority order; see transforms/executor_lower.py.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from thunderfn.core import context
from thunderfn.core.symbol import Symbol


@dataclasses.dataclass
class Lowering:
    checker: Callable | None
    lower: Callable | None  # traced replacement; None means "run the symbol as this executor's operator"
    vjp: Any = None


def check_identifier(kind: str, name) -> str:
    if not context.is_safe_name(name):
        raise ValueError(f"{kind} name must be a Python identifier that thunderfn does not reserve, got {name!r}")
    return name


class Executor:
    """Base class. `name` identifies the executor in `jit(executors=[...])`."""

    def __init__(self, name: str, version=None):
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(f"an executor's name must be a Python identifier, got {name!r}")
        self.name = name
        self.version = version

    def lowering_for(self, bsym) -> Lowering | None:
        return None

    def availability(self) -> tuple[bool, str]:
        """(can this executor run here, why not)."""
        return True, ""

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"


class OperatorExecutor(Executor):
    """An executor built from operators (callables on real tensors) and lowering rules."""

    def __init__(self, name: str, version=None):
        super().__init__(name, version)
        self.operators: dict[str, Symbol] = {}
        self.lowerings: dict[Any, Lowering] = {}

    def register_operator(self, name: str, *, like: Callable | None = None, meta: Callable | None = None,
                          fn: Callable, replace: bool = False) -> Symbol:
        """A symbol that runs `fn` on real tensors. Exactly one of `like` (a function in
        thunderfn's languages or torch, traced to get output metadata) or `meta`
        (proxies in, output proxies out) says what it returns."""
        check_identifier("an operator's", name)
        if (like is None) == (meta is None):
            raise TypeError(f"register_operator('{name}'): give exactly one of like= or meta=")
        if name in self.operators and not replace:
            raise ValueError(f"executor '{self.name}' already has an operator '{name}' (pass replace=True to replace it)")
        if meta is None:
            meta = _meta_from_like(like)
        sym = Symbol(name, f"{self.name}.{name}", meta=meta, is_prim=True, print_name=name, namespace={name: fn},
                     eager=fn, executor=self)
        sym.like = like
        self.operators[name] = sym
        return sym

    def register_lowering(self, symbol_or_id, *, checker: Callable | None = None, lower: Callable | None = None,
                          vjp=None) -> None:
        key = symbol_or_id.id if isinstance(symbol_or_id, Symbol) else symbol_or_id
        self.lowerings[key] = Lowering(checker, lower, vjp)

    def register_implementation(self, symbol_or_id, op: Symbol | None = None, *, checker: Callable | None = None,
                                execution_transform: Callable | None = None, grad_transform: Callable | None = None) -> None:
        """The seed tutorials' spelling of register_lowering: `op` alone means the symbol
        runs as that operator with the same arguments."""
        lower = execution_transform if execution_transform is not None else op
        self.register_lowering(symbol_or_id, checker=checker, lower=lower, vjp=grad_transform)

    def lowering_for(self, bsym) -> Lowering | None:
        if bsym.sym.executor is self:  # one of our operators, called directly in traced code
            return _identity
        return self.lowerings.get(bsym.sym.id)


class FusionExecutor(Executor):
    """Base for executors that claim regions of fusible bound symbols rather than one
    symbol at a time. Subclasses implement `fuse(trace) -> trace`, applied after
    per-symbol lowering."""

    def fuse(self, trace):
        raise NotImplementedError(f"{type(self).__name__}.fuse")


_identity = Lowering(checker=None, lower="identity")


def _meta_from_like(like: Callable) -> Callable:
    def meta(*args, **kwargs):
        trc = context.current_trace()
        with trc.scope():
            return like(*args, **kwargs)

    return meta
