"""Lowering rules as data: what an executor's rule for one symbol says, read by
transforms/executor_lower.py and written by executors (executors/base.py). Here, below both,
because neither of those layers imports the other. Imports only core.symbol.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from thunderfn.core.symbol import Symbol
from thunderfn.errors import ArgumentTypeError


@dataclasses.dataclass(frozen=True)
class TraceInPlace:
    """fn(*args, **kwargs) is traced in place of the bound symbol, and what it records is lowered in turn."""
    fn: Callable


@dataclasses.dataclass(frozen=True)
class RunAsOperator:
    """The bound symbol runs as `operator`, one of the claiming executor's operators, with its arguments."""
    operator: Symbol


@dataclasses.dataclass(frozen=True)
class RunAsItself:
    """The bound symbol already calls an executor's operator: it stays as recorded."""


@dataclasses.dataclass(frozen=True)
class RunWithTorch:
    """The torch executor's lowering: one call of the torch function the symbol mirrors (or of a
    prim's torch implementation). Reverse mode still differentiates the symbol's decomposition."""


LoweringAction = TraceInPlace | RunAsOperator | RunAsItself | RunWithTorch


@dataclasses.dataclass(frozen=True)
class Lowering:
    """An executor's rule for one symbol: where it claims (`checker`, None = everywhere) and what it does."""
    checker: Callable | None
    action: LoweringAction
    vjp: Any = None  # a tf.custom_vjp function: how reverse mode differentiates what this rule claims

    def __post_init__(self):
        if not isinstance(self.action, LoweringAction):
            raise ArgumentTypeError("a Lowering's action is TraceInPlace, RunAsOperator, RunAsItself "
                                    f"or RunWithTorch, got {type(self.action).__name__}")
