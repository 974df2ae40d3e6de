"""Undo what extending thunderfn registers, so a test (or a documentation page run as
one) that adds executors, prims or torch-language symbols leaves the process as it found
it: the executor registry and defaults, the interception table, the torch language's
symbols, the prims and clang modules, the prims' torch implementations and elementwise table,
the rule table (core/rules.py) and nvFuser's translations.
Everything added in between is removed, including what a module first imported in between
registers at import time: import such modules before taking the snapshot."""
from __future__ import annotations

import contextlib

from thunderfn import clang, executors, prims
from thunderfn import torch as ltorch
from thunderfn.core.interception import handlers
from thunderfn.core.rules import rules
from thunderfn.executors import nvfuser
from thunderfn.torch import elementwise as ltorch_elementwise


def _tables():
    return ([executors._registry, executors._defaults, handlers, ltorch.symbols, prims.torch_impls, prims.number_impls,
             prims.elementwise_ops, rules, nvfuser.translations,
             ltorch_elementwise.plain, ltorch_elementwise.__all__], [ltorch, prims, clang, ltorch_elementwise])


class RegistrySnapshot:
    """What the registries hold now; `restore()` puts it back."""

    def __init__(self):
        self.tables, self.modules = _tables()
        self.saved = [table.copy() for table in self.tables]
        self.module_attrs = [dict(vars(module)) for module in self.modules]

    def restore(self) -> None:
        for table, saved in zip(self.tables, self.saved):
            table.clear()
            table.update(saved) if isinstance(table, dict) else table.extend(saved)
        for module, attrs in zip(self.modules, self.module_attrs):
            for name in set(vars(module)) - set(attrs):
                delattr(module, name)
            for name, value in attrs.items():
                if vars(module).get(name) is not value:
                    setattr(module, name, value)


@contextlib.contextmanager
def registries_restored():
    """Run the block, then undo every registration it made."""
    snapshot = RegistrySnapshot()
    try:
        yield
    finally:
        snapshot.restore()
