"""`thunderfn.extend`: the executor API under the name Thunder's tutorials import it by.

`from thunderfn.extend import OperatorExecutor, register_executor` is
`from thunderfn.executors import ...`: the same objects. Thunder names with no
counterpart here raise an AttributeError that says what to use instead
(docs/porting-from-thunder.md has the whole table).
"""
from __future__ import annotations

import dis
import sys

from thunderfn.executors import (Executor, FusionExecutor, OperatorExecutor, add_default_executor,  # noqa: F401
                                 add_operator_executor, available, deregister_executor, get_all_executors,
                                 get_default_executors, get_executor, register_executor, remove_default_executor,
                                 set_default_executors)

__all__ = ["Executor", "FusionExecutor", "OperatorExecutor", "add_default_executor", "add_operator_executor",
           "available", "deregister_executor", "get_all_executors", "get_default_executors", "get_executor",
           "register_executor", "remove_default_executor", "set_default_executors"]

# Thunder's names that thunderfn spells differently, or does without: what to write instead.
_INSTEAD = {
    "TemporaryExecutor": "an OperatorExecutor you do not register (pass it to tf.jit(executors=[ex]))",
    "get_always_executors": "tf.executors.get_default_executors() (the torch executor is always appended as the "
                            "fallback, unless tf.jit(fallback=False))",
    "add_always_executor": "tf.executors.add_default_executor(ex)",
    "remove_always_executor": "tf.executors.remove_default_executor(ex)",
    "set_always_executors": "tf.executors.set_default_executors([...])",
    "get_grad": "tf.custom_vjp: a rule's bwd(residuals, g) receives the output's gradient g",
    "put_grad": "tf.custom_vjp: a rule's bwd returns one gradient per argument",
    "put_grads": "tf.custom_vjp: a rule's bwd returns one gradient per argument",
    "DeviceType": "torch.device: a proxy's .device is one (x.device.type == 'cuda')",
}


def _called_by_from_import() -> bool:
    """Whether the code that asked for the attribute is a `from thunderfn.extend import name`.
    CPython's IMPORT_FROM looks the name up with an AttributeError-swallowing lookup and then
    raises its own bare "cannot import name" ImportError, so an AttributeError's hint never
    reaches a from-import. Only there is an ImportError raised instead (hasattr and getattr with
    a default need the AttributeError)."""
    try:
        caller = sys._getframe(2)  # 0: this function, 1: __getattr__, 2: the code that imports
        return dis.opname[caller.f_code.co_code[caller.f_lasti]] == "IMPORT_FROM"
    except (AttributeError, IndexError, ValueError):  # another Python implementation: the AttributeError
        return False


def __getattr__(name: str):
    if name in _INSTEAD:
        hint = (f"thunderfn.extend has no {name}, Thunder's name; use {_INSTEAD[name]}. "
                f"docs/porting-from-thunder.md lists every Thunder name and its thunderfn equivalent.")
        if _called_by_from_import():
            raise ImportError(hint, name=__name__, path=__file__)
        raise AttributeError(hint)
    raise AttributeError(f"module 'thunderfn.extend' has no attribute '{name}'")
