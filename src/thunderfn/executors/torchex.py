"""The torch executor: always available, always last, runs everything.

It claims torch-language symbols whole, calling the torch function each one mirrors
(one torch call per torch op, the fastest way to run on eager torch), and it
lowers every prim to torch, so anything transforms or decompositions produce runs.
`prim_impls` is its lowering table for prims (`implement_prim` fills it); it is also how
prims compute eagerly.
"""
from __future__ import annotations

import builtins
import numbers
import operator

import torch

from thunderfn import prims
from thunderfn.core.interception import resolve_torch_name, torch_name
from thunderfn.core.symbol import BoundSymbol, Symbol
from thunderfn.executors.base import Executor, Lowering, OperatorExecutor, RunAsItself, RunWithTorch
from thunderfn.prims import PrimIDs

Tensor = torch.Tensor


# -- implementations of prims that are not one torch call ----------------------------------
def broadcast_in_dim(a, shape, broadcast_dimensions):
    view = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        view[d] = a.shape[i]
    return a.reshape(view).expand(shape)


def slice_prim(a, start_indices, end_indices, strides=None):
    strides = strides or (1,) * len(start_indices)
    return a[tuple(builtins.slice(s, e, st) for s, e, st in zip(start_indices, end_indices, strides))]


# A reduction over no dims is the input's value; a new tensor, as every torch reduction returns,
# so a jitted function's output never aliases its input where eager's does not.
def reduce_sum(a, dims):
    return torch.sum(a, dims, dtype=a.dtype) if dims else a.clone()


def reduce_prod(a, dims):
    if not dims:
        return a.clone()
    for d in sorted(dims, reverse=True):
        a = torch.prod(a, d, dtype=a.dtype)
    return a


def reduce_amax(a, dims):
    return torch.amax(a, dims) if dims else a.clone()


def reduce_amin(a, dims):
    return torch.amin(a, dims) if dims else a.clone()


def reduce_var(a, dims, *, correction):
    return torch.var(a, dims, correction=correction) if dims else torch.var(a.unsqueeze(-1), -1, correction=correction)


def reduce_var_mean(a, dims, *, correction):
    if not dims:
        return torch.var_mean(a.unsqueeze(-1), -1, correction=correction)
    return torch.var_mean(a, dims, correction=correction)


def iota(length, *, start, step, device, dtype):
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.arange(length, device=device, dtype=torch.float64) * step + start).to(dtype)
    return torch.arange(start, start + length * step, step, device=device, dtype=dtype)


def convert_element_type(a, dtype):
    return a.to(dtype)


def device_put(a, device):
    return a.to(device)


def take(a, index, dim):
    try:
        return torch.index_select(a, dim, index.reshape(-1) if index.ndim == 0 else index)
    except RuntimeError as e:
        # index_select reports an index out of range as IndexError on some dims and RuntimeError on
        # others; take always raises IndexError, as torch's indexing does
        if "out of DATA bounds" in str(e):
            raise IndexError(f"index out of range in self ({e})") from None
        raise


def take_along_axis(a, index, dim):
    # torch 2.13's gather reads a broadcast (stride-0) int32 index wrongly; int64 is read right
    return torch.gather(a, dim, index if index.dtype is torch.int64 else index.long())


def where(pred, a, b):
    return torch.where(pred, a, b)


def _with_tensor_operands(torch_fn):
    """Binary prims may take a Python number on either side; torch functions want a
    tensor first (and some want two), so the number becomes a 0-dim tensor of the
    other operand's dtype, which is how clang already promoted it."""

    def impl(a, b, **kwargs):
        like = a if isinstance(a, Tensor) else b
        if not isinstance(a, Tensor):
            a = torch.scalar_tensor(a, dtype=like.dtype, device=like.device)
        if not isinstance(b, Tensor):
            b = torch.scalar_tensor(b, dtype=like.dtype, device=like.device)
        return torch_fn(a, b, **kwargs)

    impl.__name__ = f"{torch_fn.__name__}_with_number"
    return impl


_UNARY = ("abs neg exp exp2 expm1 log log1p log2 log10 sqrt rsqrt reciprocal sin cos tan asin acos atan sinh cosh tanh "
          "asinh acosh atanh erf erfc erfinv lgamma digamma floor ceil round trunc sign signbit bitwise_not isfinite "
          "isnan real imag").split()
_BINARY = ("add sub mul div fmod remainder pow atan2 maximum minimum eq ne lt le gt ge bitwise_and bitwise_or "
           "bitwise_xor bitwise_left_shift bitwise_right_shift copysign nextafter").split()
# torch functions that take a Python number as their second argument as is
_SCALAR_SECOND = set("add sub mul div fmod remainder pow eq ne lt le gt ge bitwise_and bitwise_or bitwise_xor".split())

# the torch implementations of the built-in prims, entered into prim_impls below
_builtin_impls = {PrimIDs[n.upper()]: getattr(torch, n) for n in _UNARY + _BINARY}
_builtin_impls.update({
    PrimIDs.WHERE: torch.where, PrimIDs.SUM: reduce_sum, PrimIDs.PROD: reduce_prod, PrimIDs.AMAX: reduce_amax,
    PrimIDs.AMIN: reduce_amin, PrimIDs.VAR: reduce_var, PrimIDs.VAR_MEAN: reduce_var_mean,
    PrimIDs.ARGMAX: torch.argmax, PrimIDs.ARGMIN: torch.argmin, PrimIDs.BROADCAST_IN_DIM: broadcast_in_dim,
    PrimIDs.RESHAPE: torch.reshape, PrimIDs.TRANSPOSE: torch.permute, PrimIDs.SLICE: slice_prim,
    PrimIDs.SQUEEZE: torch.squeeze, PrimIDs.CAT: torch.cat, PrimIDs.FLIP: torch.flip, PrimIDs.TAKE: take,
    PrimIDs.TAKE_ALONG_AXIS: take_along_axis, PrimIDs.CONVERT_ELEMENT_TYPE: convert_element_type,
    PrimIDs.DEVICE_PUT: device_put, PrimIDs.MATMUL: torch.matmul, PrimIDs.FULL: torch.full, PrimIDs.IOTA: iota,
})


# -- scans and sorting ---------------------------------------------------------------------
def cumsum(a, dim):
    return torch.cumsum(a, dim, dtype=a.dtype)  # torch would promote integers to int64; the prim keeps a's dtype


def cumprod(a, dim):
    return torch.cumprod(a, dim, dtype=a.dtype)


def sort_prim(a, dim, descending, stable):
    return tuple(torch.sort(a, dim=dim, descending=descending, stable=stable))


def topk_prim(a, k, dim, largest, sorted):
    return tuple(torch.topk(a, k, dim=dim, largest=largest, sorted=sorted))


_builtin_impls.update({
    PrimIDs.CUMSUM: cumsum, PrimIDs.CUMPROD: cumprod, PrimIDs.SORT: sort_prim, PrimIDs.TOPK: topk_prim,
})

# -- scattering and padding ----------------------------------------------------------------
def scatter_prim(a, index, value, dim):
    return torch.scatter(a, dim, index, value)


def scatter_add_prim(a, index, value, dim):
    return torch.scatter_add(a, dim, index, value)


def pad_prim(a, padding_value, padding_config):
    """jax.lax.pad: interior padding by writing a into a strided view of a filled tensor,
    then negative low/high crop and positive ones pad."""
    if any(interior for _, _, interior in padding_config):
        dilated = torch.full([n + max(n - 1, 0) * i for n, (_, _, i) in zip(a.shape, padding_config)], padding_value,
                             dtype=a.dtype, device=a.device)
        dilated[tuple(builtins.slice(None, None, i + 1) for _, _, i in padding_config)] = a
        a = dilated
    a = a[tuple(builtins.slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi, _) in zip(a.shape, padding_config))]
    pads = [p for lo, hi, _ in reversed(padding_config) for p in (max(lo, 0), max(hi, 0))]
    return torch.constant_pad_nd(a, pads, padding_value) if any(pads) else a.clone()


_builtin_impls.update({PrimIDs.SCATTER: scatter_prim, PrimIDs.SCATTER_ADD: scatter_add_prim, PrimIDs.PAD: pad_prim})

_number_impls = {PrimIDs[n.upper()]: _with_tensor_operands(getattr(torch, n)) for n in _BINARY}

prim_impls: dict = {}  # prim id -> its torch implementation; entered only through implement_prim


def implement_prim(prim: Symbol, fn) -> None:
    """The one way a prim gets its torch implementation (TorchExecutor.register_prim wraps it):
    how every torch executor runs it (the table is shared) and how it computes eagerly, so prims
    work on real tensors too. A binary prim computes a Python number operand as _number_impls does."""
    prim_impls[prim.id] = fn
    prim.eager = fn if prim.id not in _number_impls else (
        lambda a, b, _f=fn, _g=_number_impls[prim.id], **kw: _f(a, b, **kw)
        if isinstance(a, Tensor) and isinstance(b, Tensor) else _g(a, b, **kw))


def _operator_for(fn, name: str | None = None) -> Symbol:
    """The executor operator that calls fn. A torch function prints under its torch
    name when that name resolves to it; anything else is bound under its own name."""
    printed = torch_name(fn) if name is None else name
    namespace = {"torch": torch}
    resolved = resolve_torch_name(printed)
    # torch.get_rng_state & co. are thunderfn's pass-through wrappers outside tracing (torch/random.py)
    if resolved is not fn and getattr(resolved, "__thunderfn_original__", None) is not fn:
        printed = name or getattr(fn, "__name__", "torch_op")
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
        """The operator that calls fn; `no_dce` carries over from what it lowers (random draws
        must run even when unused, so the generator advances as in eager)."""
        keep = "no_dce" in tags
        sym = self._ops.get((fn, keep))
        if sym is None:
            sym = self._ops[(fn, keep)] = _operator_for(fn, name)
            sym.executor = self
            if keep:
                sym.tags = frozenset({"no_dce"})
        return sym

    def register_prim(self, prim: Symbol, fn) -> None:
        """Run `prim` (one made with prims.make_prim) as `fn` on real tensors, here and eagerly.
        The prim table is shared: every torch executor (torch, torch_prims) runs it."""
        implement_prim(prim, fn)

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
                if not isinstance(a, prims.TensorProxy) or not (isinstance(b, prims.TensorProxy) or sym.name in _SCALAR_SECOND):
                    fn = _number_impls[sym.id]
            name = _helper_names.get(fn)
        else:
            fn, name = sym.torch_fn, None
        shown = () if "opaque" in sym.tags else (bsym,)  # an opaque op's decomposition is itself
        return BoundSymbol(self.op(fn, name, sym.tags), bsym.args, bsym.kwargs, bsym.output, shown)


_helper_names = {impl: f"{impl.__name__}" for impl in set(_builtin_impls.values()) | set(_number_impls.values())
                 if getattr(impl, "__module__", None) == __name__ or impl in _number_impls.values()}
_helper_names[slice_prim] = "slice_prim"
_with_torch = Lowering(checker=None, action=RunWithTorch())
_as_itself = Lowering(checker=None, action=RunAsItself())

torch_ex = TorchExecutor()
# Runs only prims: every torch symbol executes its decomposition. Tests use it to check
# decompositions against torch; transforms and fusion see the same prims.
torch_prims_ex = TorchExecutor("torch_prims", claim_torch_symbols=False)

for _pid, _impl in _builtin_impls.items():
    implement_prim(getattr(prims, _pid.name.lower()), _impl)

del numbers, operator
