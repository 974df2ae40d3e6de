"""Executor registry: which executors exist, which are the defaults, which can run here.

Executors know what transforms produce (traces of symbols), never transforms themselves:
they may import core/, prims, clang and the torch language (docs/architecture.md).
"""
from __future__ import annotations

from thunderfn import prims
from thunderfn import torch as ltorch
from thunderfn.core.symbol import Symbol
from thunderfn.errors import ArgumentTypeError, ArgumentValueError, ExecutorError
from thunderfn.executors.base import (
    Executor,
    Lowering,
    OperatorExecutor,
    RunAsItself,
    RunAsOperator,
    RunWithTorch,
    TraceInPlace,
)
from thunderfn.executors.fusion import FusionExecutor, Region
from thunderfn.executors.torch_executor import torch_ex, torch_prims_ex

__all__ = ["Executor", "OperatorExecutor", "FusionExecutor", "Region", "Lowering", "TraceInPlace",
           "RunAsOperator", "RunAsItself", "RunWithTorch", "register_executor", "get_executor", "get_default_executors",
           "set_default_executors", "add_operator_executor", "add_default_executor", "remove_default_executor",
           "get_all_executors", "deregister_executor", "available", "resolve", "with_fusion", "torch_ex",
           "torch_prims_ex"]

_registry: dict[str, Executor] = {}
_defaults: list[Executor] = []


def register_executor(ex: Executor, *, replace: bool = False) -> Executor:
    """Make `ex` known by its name, so that `tf.jit(fn, executors=["name"])`, get_executor and
    available find it; returns ex.

    Registering does not make it a default (set_default_executors, add_default_executor do),
    and tf.jit also takes an unregistered Executor object in its executors list. Another
    executor already registered under the same name is an ArgumentValueError unless
    `replace=True`. deregister_executor(ex) forgets it again.

        >>> import thunderfn as tf
        >>> ex = tf.executors.register_executor(tf.executors.OperatorExecutor("docs_example_ex"))
        >>> tf.executors.get_executor("docs_example_ex") is ex
        True
        >>> tf.executors.register_executor(tf.executors.OperatorExecutor("docs_example_ex"))
        Traceback (most recent call last):
        ...
        thunderfn.errors.ArgumentValueError: an executor named 'docs_example_ex' is already registered
        (pass replace=True to replace it)
        >>> tf.executors.deregister_executor(ex)
    """
    if ex.name in _registry and _registry[ex.name] is not ex and not replace:
        raise ArgumentValueError(f"an executor named '{ex.name}' is already registered (pass "
                                 "replace=True to replace it)")
    _registry[ex.name] = ex
    return ex


def get_executor(name: str) -> Executor:
    """The registered executor named `name`; an unknown name is an ArgumentValueError listing
    the registered ones (tf.executors.available() says which can run here).

        >>> import thunderfn as tf
        >>> tf.executors.get_executor("torch")
        <TorchExecutor 'torch'>
        >>> tf.executors.get_executor("no_such_executor")
        Traceback (most recent call last):
        ...
        thunderfn.errors.ArgumentValueError: no executor named 'no_such_executor'; registered: [...]
    """
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
    """The executors tf.jit uses when it is given none, in priority order (a new list: editing
    it changes nothing; set_default_executors does).

    The torch executor is not among them: jit appends it as the fallback that runs whatever
    the others do not claim. Out of the box the list holds the fused-attention executor
    ("sdpa") where it can run.

        >>> import thunderfn as tf
        >>> defaults = tf.executors.get_default_executors()
        >>> tf.executors.torch_ex in defaults
        False
        >>> [ex.name for ex in defaults]  # doctest: +SKIP
        ['sdpa']
    """
    return list(_defaults)


def set_default_executors(executors) -> None:
    """Make `executors` (one executor or a list, each a registered name or an Executor, in
    priority order) the ones tf.jit uses when given none, for every later compile.

    The whole list is replaced: keep get_default_executors()'s result to restore it (to add
    one in front, add_default_executor(ex)). The torch fallback is appended by jit and need
    not be listed. An unknown name is an ArgumentValueError.

        >>> import torch, thunderfn as tf
        >>> saved = tf.executors.get_default_executors()
        >>> tf.executors.set_default_executors(["torch_prims"])
        >>> [ex.name for ex in tf.executors.get_default_executors()]
        ['torch_prims']
        >>> tf.executors.set_default_executors(saved)  # restore them
    """
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
    The executor is registered and, by default, put first among the default executors.

    `symbol_id`: a prim's id (tf.prims.PrimIDs.ADD) or a torch-language symbol's ("torch.add"),
    or the Symbol itself; `checker(*args, **kwargs) -> bool` sees the call's proxies and
    values; `impl` receives real tensors. Returns the OperatorExecutor. An id no symbol has is
    an ArgumentValueError. Undo it with deregister_executor(ex) (which also removes it from the
    defaults).

        >>> import torch, thunderfn as tf
        >>> def two_row_float32(a, b):
        ...     return all(isinstance(t, tf.TensorProxy) and t.dtype == torch.float32 and t.ndim == 2
        ...                and t.shape[0] == 2 for t in (a, b))
        >>> ex = tf.executors.add_operator_executor(
        ...     "docs_add_ex", {tf.prims.PrimIDs.ADD: ("docs_add", two_row_float32, torch.add)})
        >>> tf.executors.get_default_executors()[0] is ex
        True
        >>> add = tf.jit(lambda x, y: x + y)
        >>> x = torch.ones(2, 3)
        >>> torch.testing.assert_close(add(x, x), x + x)
        >>> [b.sym.name for b in tf.last_traces(add)[-1].bound_symbols if b.sym.name != "del"]
        ['docs_add']
        >>> tf.executors.deregister_executor(ex)  # undo: no longer registered nor a default
    """
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
        raise ArgumentValueError("fusion= takes True or a fusion executor (inductor, nvfuser, ...), got "
                                 f"'{fusion_ex.name}', which is not one; list it in executors= instead")
    return [*(e for e in chosen if e is not fusion_ex), fusion_ex]


def available() -> dict[str, str]:
    """Every registered executor: 'available', or why it cannot run here.

    Returns {name: "available" or "unavailable: <reason>"}, sorted by name: a library that is
    not installed, no CUDA device, and what to install. jit refuses an unavailable executor
    with an ExecutorError giving the same reason.

        >>> import thunderfn as tf
        >>> tf.executors.available()["torch"]
        'available'
        >>> tf.executors.available()  # doctest: +SKIP
        {..., 'inductor': 'available', ..., 'nvfuser': 'unavailable: nvFuser is not installed ...', ...}
    """
    out = {}
    for name, ex in sorted(_registry.items()):
        ok, why = ex.availability()
        out[name] = "available" if ok else f"unavailable: {why}"
    return out


register_executor(torch_ex)
register_executor(torch_prims_ex)

# (grouped by kind, kernels then fusion, rather than in isort's order)
# isort: off
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
# isort: on

for _kernel_ex in (sdpa_ex, cudnn_sdpa_ex, transformer_engine_ex, triton_crossentropy_ex,
                   apex_crossentropy_ex, inductor_ex, inductor_background_ex, nvfuser_ex):
    register_executor(_kernel_ex)
# The defaults ahead of the torch fallback: fused attention wherever it can run.
set_default_executors([ex for ex in (sdpa_ex,) if ex.availability()[0]])
