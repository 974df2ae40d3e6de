"""Opaque torch ops: the fallback for a torch function that has no thunderfn symbol.

The function runs on `meta` tensors to learn its outputs' shapes and dtypes, is
recorded under its torch name, and the torch executor calls it at run time with
the real tensors. The bound symbol keeps the torch callable and its arguments, so
autodiff can differentiate it at run time through torch.func.

Refused, with the reason, when even that cannot be right: no meta kernel, an output
shape that depends on values (nonzero, unique, masked_select), a non-tensor
output (a value), or a write into an argument (in-place and out= forms).
"""
from __future__ import annotations

import numbers

import torch

from thunderfn.core.interception import torch_name
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_unflatten
from thunderfn.core.symbol import Symbol
from thunderfn.core.trace import check_rng_untouched
from thunderfn.errors import UnsupportedOpError

_symbols: dict = {}  # torch callable -> its opaque symbol, made once

# Draws from torch's generator: kept even when unused, so a jitted function consumes
# random numbers exactly as eager does and a seed reproduces the same draws.
_RANDOM_WORDS = ("rand", "normal", "bernoulli", "multinomial", "poisson", "dropout", "uniform", "exponential",
                 "cauchy", "geometric", "log_normal", "rrelu")


def _printed(fn) -> str:
    """The torch name when evaluating it gives back fn (so generated code can call it)."""
    name = torch_name(fn)
    try:
        return name if eval(name, {"torch": torch}) is fn else None  # noqa: S307 (our own dotted names)
    except Exception:
        return None


def opaque_symbol(fn) -> Symbol:
    sym = _symbols.get(fn)
    if sym is None:
        name = torch_name(fn)
        short = name.rsplit(".", 1)[-1]
        tags = {"opaque"} | ({"no_dce", "random"} if any(w in short for w in _RANDOM_WORDS) else set())
        printed = _printed(fn)
        if printed is None:
            printed = "opaque_" + "".join(c if c.isalnum() else "_" for c in short).strip("_")
        sym = Symbol(short, ("opaque", name), meta=lambda *a, **k: _meta(fn, a, k), is_prim=True, print_name=printed,
                     namespace={"torch": torch} if printed.startswith("torch.") else {printed: fn}, eager=fn,
                     torch_fn=fn, tags=frozenset(tags))
        _symbols[fn] = sym
    return sym


def _to_meta(x):
    if isinstance(x, TensorProxy):
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    return x


def _device_of(leaves, kwargs) -> torch.device:
    for leaf in leaves:
        if isinstance(leaf, TensorProxy):
            return leaf.device
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    return torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")


def _meta(fn, args, kwargs):
    name = torch_name(fn)
    if "random" in opaque_symbol(fn).tags:
        check_rng_untouched(name)
    leaves, spec = tree_flatten((args, kwargs))
    meta_args, meta_kwargs = tree_unflatten(spec, [_to_meta(x) for x in leaves])
    if kwargs.get("device") is not None or not any(isinstance(x, TensorProxy) for x in leaves):
        # a factory: it must build on meta too, or shape inference would draw real random numbers
        meta_kwargs = dict(meta_kwargs, device="meta")
    try:
        with torch._C.DisableTorchFunction():
            out = fn(*meta_args, **meta_kwargs)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        data_dependent = any(w in reason for w in ("data-dependent", "data dependent", "data-independent", "item()", "no data",
                                                   "without output_size", "Meta tensors"))
        # Proxies carry no strides (meta tensors here are contiguous): a complaint about layout is ours, not the input's.
        meta_specific = data_dependent or isinstance(e, NotImplementedError) or any(
            w in reason.lower() for w in ("meta", "stride", "contiguous", "major", "layout"))
        if not meta_specific and isinstance(e, (IndexError, ValueError, TypeError, RuntimeError)):
            raise  # the op rejects these inputs: the same error eager would raise, torch's own words
        why = ("its output shape or value depends on tensor values, which tracing does not know"
               if data_dependent else f"running it on shapes alone failed ({type(e).__name__}: {reason[:200]})")
        raise UnsupportedOpError(f"{name} has no thunderfn symbol and cannot run as an opaque torch op: {why}. "
                                 f"Call it outside the jitted function.") from None
    device = _device_of(leaves, kwargs)
    out_leaves, out_spec = tree_flatten(out)
    proxies = []
    for leaf in out_leaves:
        if isinstance(leaf, torch.Tensor):
            proxies.append(TensorProxy(shape=leaf.shape, dtype=leaf.dtype, device=device))
        elif leaf is None:
            proxies.append(leaf)
        else:
            kind = type(leaf).__name__ if not isinstance(leaf, numbers.Number) else "a Python number"
            raise UnsupportedOpError(f"{name} returns {kind}, a value tracing cannot know; call it outside the "
                                     f"jitted function or keep the result as a tensor")
    return tree_unflatten(out_spec, proxies)  # keeps torch.return_types.* (values, indices)


def run_opaque(fn, args, kwargs):
    """Trace fn as an opaque op (called while tracing, for a torch callable with no symbol)."""
    if kwargs.get("out") is not None:
        raise UnsupportedOpError(f"{torch_name(fn)}(out=...) writes into an argument, which thunderfn does not trace; "
                                 f"use the result instead")
    return opaque_symbol(fn)(*args, **kwargs)
