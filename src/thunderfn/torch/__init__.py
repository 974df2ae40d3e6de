"""The torch language: one symbol per torch operation, mirroring torch's semantics
and signature, decomposed into clang and prims.

`@torchsymbol(torch.add, torch.Tensor.add, ...)` makes a Python function a symbol
and routes every listed torch callable to it while tracing. The first callable is
the one the symbol mirrors exactly: the torch executor runs the symbol by calling
it with the recorded arguments, and forward-consistency tests compare against it.
"""
from __future__ import annotations

import sys
from typing import Callable

from thunderfn.core.interception import register_handler
from thunderfn.core.symbol import Symbol

_this_module = sys.modules[__name__]
symbols: dict[str, Symbol] = {}  # name -> symbol, every torch-language symbol


def torchsymbol(*torch_fns: Callable, name: str | None = None, id=None, tags=()):
    """Decorator: make fn the thunderfn symbol for the given torch callables.

    The symbol prints as ``ltorch.<name>``; its body (written with thunderfn.clang,
    thunderfn.prims or other torch-language symbols) is recorded as its decomposition.
    """

    def decorator(fn: Callable) -> Symbol:
        sym_name = name or fn.__name__
        if not sym_name.isidentifier():
            raise ValueError(f"a torch symbol's name must be a Python identifier, got {sym_name!r}")
        sym = Symbol(sym_name, id if id is not None else f"torch.{sym_name}", fn=fn, print_name=f"ltorch.{sym_name}",
                     namespace={"ltorch": _this_module}, torch_fn=torch_fns[0] if torch_fns else None,
                     tags=frozenset(tags))
        sym.__doc__ = fn.__doc__
        for torch_fn in torch_fns:
            register_handler(torch_fn, sym)
        symbols[sym_name] = sym
        if not hasattr(_this_module, sym_name) or isinstance(getattr(_this_module, sym_name), Symbol):
            setattr(_this_module, sym_name, sym)
        return sym

    return decorator


def register_alias(torch_fn: Callable, fn: Callable) -> None:
    """Route a torch callable to a Python function of torch-language symbols
    (reflected operators, methods whose semantics are another op's)."""
    register_handler(torch_fn, fn)


from thunderfn.torch.elementwise import *  # noqa: E402,F401,F403
from thunderfn.torch.reductions import *  # noqa: E402,F401,F403
from thunderfn.torch.shape import *  # noqa: E402,F401,F403
from thunderfn.torch.factories import *  # noqa: E402,F401,F403
from thunderfn.torch.nn import *  # noqa: E402,F401,F403
from thunderfn.torch.indexing import *  # noqa: E402,F401,F403
from thunderfn.torch.linalg import *  # noqa: E402,F401,F403
from thunderfn.torch import random as _random_effects  # noqa: E402,F401  (records manual_seed & co.)
from thunderfn.torch.inplace import *  # noqa: E402,F401,F403
from thunderfn.torch import foreach as _foreach  # noqa: E402,F401  (torch._foreach_* and tensor-valued addcdiv)
from thunderfn.torch import optim as _optim  # noqa: E402,F401  (optimizer steps inside traced functions)
from thunderfn.torch.statistics import *  # noqa: E402,F401,F403
from thunderfn.torch.backward import *  # noqa: E402,F401,F403
