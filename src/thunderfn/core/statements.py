"""Statements: bound symbols that are Python statements rather than operations.

They print themselves, pass through executor lowering untouched, and are kept
by dead-code elimination when they have an effect.
"""
from __future__ import annotations

import torch

from thunderfn.core.symbol import Symbol


def _print_del(bsym, ns) -> str:
    return "del " + ", ".join(p.name for p in bsym.args)


def _print_alias(bsym, ns) -> str:
    from thunderfn.core.printing import format_value

    return f"{bsym.output.name} = {format_value(bsym.args[0], ns)}"


def _print_set_grad_enabled(bsym, ns) -> str:
    ns["torch"] = torch
    return f"torch._C._set_grad_enabled({bool(bsym.args[0])})"


# `del a, b`: frees intermediates as soon as their last reader has run.
python_del = Symbol("del", "python.del", is_prim=True, printer=_print_del, tags=frozenset({"no_dce"}))
# `t1 = t0`: when a lowering returns one of its inputs as an output.
python_alias = Symbol("alias", "python.alias", is_prim=True, printer=_print_alias)
# `with torch.no_grad():` inside a traced function runs once, at trace time; recording the
# switch makes every call do what eager does (and tells transforms where gradients stop).
set_grad_enabled = Symbol("set_grad_enabled", "python.set_grad_enabled", is_prim=True,
                          printer=_print_set_grad_enabled, eager=torch._C._set_grad_enabled,
                          tags=frozenset({"no_dce"}))
