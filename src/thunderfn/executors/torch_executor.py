"""The torch executor: always available, always last, runs everything.

It claims torch-language symbols whole, calling the torch function each one mirrors
(one torch call per torch op, the fastest way to run on eager torch), and it
lowers every prim to torch, so anything transforms or decompositions produce runs.
`prim_impls` is its lowering table for prims: the prims' own torch implementations
(prims.torch_impls), with which prims also compute eagerly.
"""
from __future__ import annotations

import torch

from thunderfn import prims, prims_eager
from thunderfn.core.interception import resolve_torch_name, torch_name
from thunderfn.core.symbol import BoundSymbol, Symbol
from thunderfn.executors.base import Executor, Lowering, OperatorExecutor, RunAsItself, RunWithTorch

# torch functions that take a Python number as their second argument as is
_SCALAR_SECOND = set("add sub mul div fmod remainder pow eq ne lt le gt ge bitwise_and bitwise_or bitwise_xor".split())

# The prims' torch implementations (prims.py), shared: a prim registered here computes eagerly too.
prim_impls = prims.torch_impls
_number_impls = prims.number_impls


def _operator_name(fn) -> str | None:
    """aten_sum_dim_IntList for torch.ops.aten.sum.dim_IntList (aten_mul for the packet torch.ops.aten.mul): a
    name per operator and overload, where their own (sum.dim_IntList) is no identifier and each would print as
    torch_op, two of them clashing in one trace."""
    if isinstance(fn, torch._ops.OpOverload):
        return f"{fn.namespace}_{fn._opname}_{fn._overloadname}"
    if isinstance(fn, torch._ops.OpOverloadPacket):
        return fn._qualified_op_name.replace("::", "_")
    return None


def _operator_for(fn, name: str | None = None) -> Symbol:
    """The executor operator that calls fn. A torch function prints under its torch
    name when that name resolves to it; anything else is bound under its own name."""
    printed = torch_name(fn) if name is None else name
    namespace = {"torch": torch}
    resolved = resolve_torch_name(printed)
    # torch.get_rng_state & co. are thunderfn's pass-through wrappers outside tracing (torch/random.py)
    if resolved is not fn and getattr(resolved, "__thunderfn_original__", None) is not fn:
        printed = name or _operator_name(fn) or getattr(fn, "__name__", "torch_op")
        if not printed.isidentifier() or printed in ("torch",):
            printed = "torch_op"
        namespace = {printed: fn}
    return Symbol(printed, f"torch_ex.{printed}", is_prim=True, print_name=printed, namespace=namespace, eager=fn)


class TorchExecutor(Executor):
    def __init__(self, name: str = "torch", *, claim_torch_symbols: bool = True):
        super().__init__(name, torch.__version__)
        self.claim_torch_symbols = claim_torch_symbols
        self._ops: dict = {}  # callable -> operator symbol, made once

    def op(self, fn, name: str | None = None, tags: frozenset = frozenset()) -> Symbol:
        """The operator that calls fn. `no_dce` carries over from what it lowers (random draws
        must run even when unused, so the generator advances as in eager), and so does
        `traceable` (an opaque op that fusion regions may call: torch/opaque.py's mark_traceable)."""
        kept = frozenset(tags & {"no_dce", "traceable"})
        sym = self._ops.get((fn, kept))
        if sym is None:
            sym = self._ops[(fn, kept)] = _operator_for(fn, name)
            sym.executor = self
            sym.tags = sym.tags | kept
        return sym

    def register_prim(self, prim: Symbol, fn) -> None:
        """Run `prim` (one made with prims.make_prim) as `fn` on real tensors, here and eagerly.
        The prim table is shared: every torch executor (torch, torch_prims) runs it."""
        prims.implement(prim, fn)

    def lowering_for(self, bsym) -> Lowering | None:
        sym = bsym.sym
        if sym.is_prim and sym.id in prim_impls:
            return _with_torch
        if sym.torch_fn is not None and (self.claim_torch_symbols or "opaque" in sym.tags):
            return _with_torch  # opaque ops have no decomposition: torch runs them either way
        if sym.executor is self or isinstance(sym.executor, OperatorExecutor):
            return _as_itself  # another executor's operator carries its callable: torch can run it as is
        return None

    def lower_direct(self, bsym) -> BoundSymbol:
        sym = bsym.sym
        if sym.is_prim and sym.id in prim_impls:
            fn = prim_impls[sym.id]
            if sym.id in _number_impls:
                a, b = bsym.args[:2]
                if (not isinstance(a, prims.TensorProxy)
                        or not (isinstance(b, prims.TensorProxy) or sym.name in _SCALAR_SECOND)):
                    fn = _number_impls[sym.id]
            name = _helper_names.get(fn)
        else:
            fn, name = sym.torch_fn, None
        shown = () if "opaque" in sym.tags else (bsym,)  # an opaque op's decomposition is itself
        return BoundSymbol(self.op(fn, name, sym.tags), bsym.args, bsym.kwargs, bsym.output, shown)


_helper_names = {impl: f"{impl.__name__}" for impl in set(prim_impls.values()) | set(_number_impls.values())
                 if getattr(impl, "__module__", None) == prims_eager.__name__ or impl in _number_impls.values()}
_with_torch = Lowering(checker=None, action=RunWithTorch())
_as_itself = Lowering(checker=None, action=RunAsItself())

torch_ex = TorchExecutor()
# Runs only prims: every torch symbol executes its decomposition. Tests use it to check
# decompositions against torch; transforms and fusion see the same prims.
torch_prims_ex = TorchExecutor("torch_prims", claim_torch_symbols=False)
