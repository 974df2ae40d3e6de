"""Executor registry: which executors exist, which are the defaults, which can run here.

Executors know what transforms produce (traces of symbols), never transforms themselves:
they may import core/, prims, clang and the torch language (docs/architecture.md).
"""
from __future__ import annotations

from thunderfn import prims
from thunderfn import torch as ltorch
from thunderfn.core.symbol import Symbol
from thunderfn.executors.base import (Executor, Lowering, OperatorExecutor, RunAsItself, RunAsOperator, RunWithTorch,
                                     TraceInPlace)
from thunderfn.executors.fusion import FusionExecutor, Region
from thunderfn.executors.torch_executor import torch_ex, torch_prims_ex
from thunderfn.errors import ArgumentTypeError, ArgumentValueError, ExecutorError

__all__ = ["Executor", "OperatorExecutor", "FusionExecutor", "Region", "Lowering", "TraceInPlace", "RunAsOperator", "RunAsItself",
           "RunWithTorch", "register_executor", "get_executor", "get_default_executors", "set_default_executors",
           "add_operator_executor", "add_default_executor", "remove_default_executor", "get_all_executors",
           "deregister_executor", "available", "resolve", "with_fusion", "torch_ex", "torch_prims_ex"]

_registry: dict[str, Executor] = {}
_defaults: list[Executor] = []


def register_executor(ex: Executor, *, replace: bool = False) -> Executor:
    if ex.name in _registry and _registry[ex.name] is not ex and not replace:
        raise ArgumentValueError(f"an executor named '{ex.name}' is already registered (pass replace=True to replace it)")
    _registry[ex.name] = ex
    return ex


def get_executor(name: str) -> Executor:
    try:
        return _registry[name]
    except KeyError:
        raise ArgumentValueError(f"no executor named '{name}'; registered: {sorted(_registry)}") from None


def deregister_executor(ex) -> None:
    """Forget an executor (by object or name); it stops being a default too."""
    ex = resolve_one(ex)
    _registry.pop(ex.name, None)
    remove_default_executor(ex)


def get_all_executors() -> list[Executor]:
    return list(_registry.values())


def get_default_executors() -> list[Executor]:
    return list(_defaults)


def set_default_executors(executors) -> None:
    _defaults[:] = [resolve_one(e) for e in as_priority_list(executors)]


def add_default_executor(ex) -> None:
    """Put an executor first among the defaults (jit's executors when none are given)."""
    ex = resolve_one(ex)
    set_default_executors([ex, *(e for e in _defaults if e is not ex)])


def remove_default_executor(ex) -> None:
    ex = resolve_one(ex)
    _defaults[:] = [e for e in _defaults if e is not ex]


def add_operator_executor(name: str, op_map: dict, *, add_to_default_executors: bool = True) -> OperatorExecutor:
    """An executor from a table `{symbol_id: (operator_name, checker, impl)}` (the seed
    tutorials' form): each symbol is claimed where its checker says yes and runs as an
    operator calling `impl` on real tensors, with the symbol's own metadata and gradient.
    The executor is registered and, by default, put first among the default executors."""
    ex = OperatorExecutor(name)
    for symbol_id, (op_name, checker, impl) in op_map.items():
        sym = _symbol_with_id(symbol_id)
        ex.register_lowering(sym, checker=checker, lower=ex.register_operator(op_name, like=sym, fn=impl))
    register_executor(ex)
    if add_to_default_executors:
        set_default_executors([ex, *get_default_executors()])
    return ex


def _symbol_with_id(symbol_id) -> Symbol:
    """The prim or torch-language symbol with this id (or the symbol itself)."""
    if isinstance(symbol_id, Symbol):
        return symbol_id
    for sym in (*vars(prims).values(), *ltorch.symbols.values()):
        if isinstance(sym, Symbol) and sym.id == symbol_id:
            return sym
    raise ArgumentValueError(f"no prim or torch-language symbol has the id {symbol_id!r}")


def resolve_one(ex) -> Executor:
    if isinstance(ex, Executor):
        return ex
    if isinstance(ex, str):
        return get_executor(ex)
    raise ArgumentTypeError(f"an executor is an Executor or a registered name, got {type(ex).__name__}")


def as_priority_list(executors) -> list:
    """`executors` as jit and executor_lower take it: a list of names or Executors, or one of
    them alone (executors="inductor" means ["inductor"], not one executor per letter)."""
    if isinstance(executors, (str, Executor)):
        return [executors]
    try:
        return list(executors)
    except TypeError:
        raise ArgumentTypeError(f"executors must be an executor (a registered name or an Executor) or a list of "
                                f"them in priority order, got {type(executors).__name__}") from None


def resolve(executors, *, fallback: bool = True) -> tuple[Executor, ...]:
    """The priority list a jitted function lowers onto: the given executors (one, or a list;
    None means the defaults), then the torch executor unless fallback is False."""
    chosen = get_default_executors() if executors is None else [resolve_one(e) for e in as_priority_list(executors)]
    for ex in chosen:
        ok, why = ex.availability()
        if not ok:
            raise ExecutorError(f"executor '{ex.name}' cannot run here: {why}")
    if fallback and torch_ex not in chosen:
        chosen.append(torch_ex)
    return tuple(chosen)


def with_fusion(executors, fusion) -> list:
    """jit's `fusion=` option: the priority list `executors` (None: the defaults) with a fusion executor
    last before the torch fallback. fusion=True picks Inductor, which runs on CPU and CUDA (nvFuser
    is named explicitly: fusion="nvfuser"); a name or an Executor picks that one."""
    if not isinstance(fusion, (bool, str, FusionExecutor)):
        raise ArgumentTypeError(f"fusion must be True, False or a fusion executor's name, got {type(fusion).__name__}")
    chosen = get_default_executors() if executors is None else [resolve_one(e) for e in as_priority_list(executors)]
    fusion_ex = resolve_one("inductor" if fusion is True else fusion)
    if not isinstance(fusion_ex, FusionExecutor):
        raise ArgumentValueError(f"fusion= takes True or a fusion executor (inductor, nvfuser, ...), got '{fusion_ex.name}', "
                                 f"which is not one; list it in executors= instead")
    return [*(e for e in chosen if e is not fusion_ex), fusion_ex]


def available() -> dict[str, str]:
    """Every registered executor: 'available', or why it cannot run here."""
    out = {}
    for name, ex in sorted(_registry.items()):
        ok, why = ex.availability()
        out[name] = "available" if ok else f"unavailable: {why}"
    return out


register_executor(torch_ex)
register_executor(torch_prims_ex)

# Kernel executors: each module imports its library (triton, apex) only when first used.
from thunderfn.executors.sdpa import sdpa_ex  # noqa: E402
from thunderfn.executors.cudnn_sdpa import cudnn_sdpa_ex  # noqa: E402
from thunderfn.executors.transformer_engine import transformer_engine_ex  # noqa: E402
from thunderfn.executors.triton_crossentropy import triton_crossentropy_ex  # noqa: E402
from thunderfn.executors.apex_crossentropy import apex_crossentropy_ex  # noqa: E402
# Fusion: Inductor's module imports torch._inductor only when a region first compiles, nvFuser's
# imports nvFuser only when a region first builds its definition.
from thunderfn.executors.inductor import inductor_background_ex, inductor_ex  # noqa: E402
from thunderfn.executors.nvfuser import nvfuser_ex  # noqa: E402

for _kernel_ex in (sdpa_ex, cudnn_sdpa_ex, transformer_engine_ex, triton_crossentropy_ex, apex_crossentropy_ex, inductor_ex,
                   inductor_background_ex, nvfuser_ex):
    register_executor(_kernel_ex)
# The defaults ahead of the torch fallback: fused attention wherever it can run.
set_default_executors([ex for ex in (sdpa_ex,) if ex.availability()[0]])
