"""torch's multi-tensor (`torch._foreach_*`) operations, and the arithmetic optimizers do with
0-dim tensors where eager uses Python numbers.

`torch._foreach_add_(tensors, others, alpha=a)` is the per-tensor operation applied to
each position: element i of every list argument, the same value for every other
argument (a `scalars` tensor of addcmul/addcdiv gives element i). In-place forms go
through the ordinary in-place machinery one tensor at a time (torch/inplace.py), so
each tensor is written back as if updated on its own, as eager's slow path does.

While an optimizer step is traced, torch.optim keeps its step counters as tensors
(torch/optim.py reports "compiling"), so `param.addcdiv_(exp_avg, denom, value=-step_size)`
meets a 0-dim tensor `value`; it is computed with eager's kernel formula and order
(`self + value * t1 / t2`), in the parameter's dtype.
"""
from __future__ import annotations

import torch

from thunderfn.core import dtypes
from thunderfn.core.interception import dispatch, register_handler
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import ArgumentRuntimeError, UnsupportedOpError
from thunderfn.torch.opaque import run_opaque

__all__: list = []

# Foreach forms whose per-tensor function is not `torch.<name>`.
_PER_TENSOR = {
    "norm": lambda t, ord=2, dtype=None: torch.linalg.vector_norm(t, ord, dtype=dtype),
    "max": lambda t: torch.amax(t),
}
# Positional arguments the per-tensor method takes by keyword only.
_KEYWORD_ONLY = {"addcmul": ("value",), "addcdiv": ("value",)}


def _per_tensor_args(base: str, args: tuple, i: int, n: int) -> tuple:
    out = []
    for position, a in enumerate(args):
        if isinstance(a, (list, tuple)):
            if len(a) != n:
                raise ArgumentRuntimeError(f"Tensor lists must have the same number of tensors, got {n} and {len(a)}")
            out.append(a[i])
        elif position == 3 and base in _KEYWORD_ONLY and isinstance(a, torch.Tensor):
            out.append(a[i])  # the `scalars` tensor: one value per position
        else:
            out.append(a)
    return tuple(out)


def _split_keyword_only(base: str, args: tuple, kwargs: dict):
    names = _KEYWORD_ONLY.get(base, ())
    if not names or len(args) <= 3:
        return args, kwargs
    return args[:3], {**kwargs, **dict(zip(names, args[3:]))}


def _foreach_handler(name: str):
    in_place = name.endswith("_")
    base = name[len("_foreach_"):].rstrip("_")

    def handler(*args, **kwargs):
        lists = [a for a in args if isinstance(a, (list, tuple))]
        if not lists:
            raise UnsupportedOpError(f"torch.{name} without a list of tensors")
        n = len(lists[0])
        results = []
        for i in range(n):
            per_args, per_kwargs = _split_keyword_only(base, _per_tensor_args(base, args, i, n), kwargs)
            if in_place:
                method = getattr(torch.Tensor, base + "_", None)
                if method is not None:
                    dispatch(method, per_args, per_kwargs)
                else:  # e.g. maximum_: computed out of place, then written in
                    value = dispatch(getattr(torch, base), per_args, per_kwargs)
                    dispatch(torch.Tensor.copy_, (per_args[0], value), {})
            elif base in _PER_TENSOR:
                results.append(_PER_TENSOR[base](*per_args, **per_kwargs))
            else:
                fn = getattr(torch, base, None) or getattr(torch.Tensor, base, None)
                if fn is None:
                    raise UnsupportedOpError(f"torch.{name}: thunderfn knows no per-tensor form '{base}'")
                results.append(dispatch(fn, per_args, per_kwargs))
        return None if in_place else results

    handler.__name__ = name
    return handler


for _name in dir(torch):
    if _name.startswith("_foreach_"):
        register_handler(getattr(torch, _name), _foreach_handler(_name))


def _scaled_by_tensor(kind: str, torch_fn):
    """addcdiv/addcmul: torch runs it (opaque) unless `value` is a tensor, which eager refuses and
    only optimizers traced as compiling pass; then eager's kernel formula, in self's dtype."""
    combine = torch.div if kind == "addcdiv" else torch.mul

    def handler(self, tensor1, tensor2, *, value=1, out=None):
        if not isinstance(value, TensorProxy):
            kwargs = {"value": value} if out is None else {"value": value, "out": out}
            return run_opaque(torch_fn, (self, tensor1, tensor2), kwargs)
        dtype = dtypes.result_type(self, tensor1, tensor2)
        scaled = combine(torch.mul(value.to(dtype), tensor1), tensor2)  # kernel: self + value * t1 / t2
        return torch.add(self, scaled)

    return handler


for _kind in ("addcdiv", "addcmul"):
    register_handler(getattr(torch, _kind), _scaled_by_tensor(_kind, getattr(torch, _kind)))
    register_handler(getattr(torch.Tensor, _kind), _scaled_by_tensor(_kind, getattr(torch.Tensor, _kind)))
