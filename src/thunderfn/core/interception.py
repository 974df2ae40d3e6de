"""How torch calls made by user code reach thunderfn while a trace is being built.

Two doors lead to `dispatch`: `TensorProxy.__torch_function__` (any torch call with a
proxy among its arguments) and `TracingMode`, a TorchFunctionMode active during
tracing, which also sees calls with no proxy at all (`torch.ones(3)`,
`torch.arange(T)`, methods on captured weights). `handlers` maps each torch
callable (function, method, operator) to the thunderfn callable that traces it.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import warnings

import torch
from torch.overrides import TorchFunctionMode

from thunderfn.core import context, dtypes
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.symbol import Symbol

# torch callable -> callable taking the same arguments with proxies in place of tensors
handlers: dict = {}


def register_handler(torch_fn, handler) -> None:
    handlers[torch_fn] = handler


# Metadata functions called on a proxy: answered from its metadata at trace time.
handlers.update({
    torch.numel: lambda a: a.numel(),
    torch.is_floating_point: lambda a: a.is_floating_point(),
    torch.is_complex: lambda a: a.is_complex(),
    torch.Tensor.is_same_size: lambda a, b: a.shape == b.shape,
    torch.result_type: lambda a, b: dtypes.result_type(a, b),
})


_PUBLIC_HOMES = (("torch", torch), ("torch.nn.functional", torch.nn.functional), ("torch.Tensor", torch.Tensor),
                 ("torch.special", torch.special), ("torch.linalg", torch.linalg), ("torch.fft", torch.fft))


@functools.lru_cache(maxsize=None)
def _public_names() -> dict:
    """Every callable in torch's public homes -> its public spelling (first home wins)."""
    names = {}
    with warnings.catch_warnings():  # some public names are deprecated aliases that warn when read
        warnings.simplefilter("ignore")
        for home_name, home in _PUBLIC_HOMES:
            for attr in dir(home):
                if attr.startswith("_"):
                    continue
                try:
                    obj = getattr(home, attr)
                    if callable(obj) and obj not in names:
                        names[obj] = f"{home_name}.{attr}"
                except Exception:  # attributes that raise when read, unhashable objects
                    continue
    return names


def torch_name(func) -> str:
    """`torch.nn.functional.gelu`, `torch.Tensor.view`: how a user would spell func."""
    self_ = getattr(func, "__self__", None)
    if getattr(func, "__name__", "") == "__get__" and self_ is not None:
        return f"torch.Tensor.{getattr(self_, '__name__', self_)}"
    name = getattr(func, "__name__", None)
    if name:
        for home_name, home in _PUBLIC_HOMES:
            if getattr(home, name, None) is func:
                return f"{home_name}.{name}"
    try:  # torch.linalg.svd is torch._C._linalg.linalg_svd: its __name__ is not its public name
        public = _public_names().get(func)
    except TypeError:  # unhashable
        public = None
    if public is not None:
        return public
    qualname = getattr(func, "__qualname__", name or repr(func))
    module = getattr(func, "__module__", None) or "torch"
    return f"{module}.{qualname}"


# Metadata questions about real tensors are answered eagerly while tracing: they do
# not depend on values that change between calls.
_metadata_getters = {
    getattr(torch.Tensor, name).__get__
    for name in ("shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_cpu", "is_meta",
                 "layout", "is_leaf", "grad_fn", "names", "is_sparse", "is_quantized", "is_nested", "grad",
                 "data", "_version", "is_mkldnn", "output_nr", "_base")
    if isinstance(getattr(torch.Tensor, name, None), type(torch.Tensor.shape))
}
_metadata_methods = {
    getattr(torch.Tensor, name)
    for name in ("size", "dim", "ndimension", "numel", "nelement", "is_floating_point", "is_complex",
                 "element_size", "stride", "is_contiguous", "data_ptr", "__len__", "__repr__",
                 "__format__", "__hash__", "get_device", "storage_offset", "untyped_storage", "__reduce_ex__",
                 "__deepcopy__", "is_signed", "has_names", "__dlpack_device__", "dim_order")
    if hasattr(torch.Tensor, name)
}


def _contains_tensor(tree) -> bool:
    if isinstance(tree, (torch.Tensor, TensorProxy)):
        return True
    if isinstance(tree, (list, tuple)):
        return any(_contains_tensor(x) for x in tree)
    if isinstance(tree, dict):
        return any(_contains_tensor(x) for x in tree.values())
    return False


def lift_constants(tree):
    """Real tensors met while tracing become constant proxies, read by reference."""
    if isinstance(tree, torch.Tensor):
        return context.current_trace().constant(tree)
    if type(tree) in (list, tuple):
        return type(tree)(lift_constants(x) for x in tree)
    if type(tree) is dict:
        return {k: lift_constants(v) for k, v in tree.items()}
    return tree


_TORCH_KEYWORDS = {"input": 0, "self": 0, "other": 1}  # torch's names for the first two operands


@functools.lru_cache(maxsize=None)
def _positional_parameters(fn) -> tuple:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(itertools.takewhile(lambda p: p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD), params))


def tensors_by_position(symbol, args, kwargs):
    """(args, kwargs) for symbol with every tensor passed by keyword moved to its position
    (the parameters it skips take their defaults), and torch's `input=`/`other=` names
    mapped onto the symbol's. VJP rules return one cotangent per positional argument, and
    torch code passes tensors by keyword (F.layer_norm its weight and bias)."""
    params = _positional_parameters(symbol.fn)
    names = [p.name for p in params]
    for torch_name_, position in _TORCH_KEYWORDS.items():
        if torch_name_ in kwargs and torch_name_ not in names and position < len(names) and names[position] not in kwargs:
            kwargs = dict(kwargs)
            kwargs[names[position]] = kwargs.pop(torch_name_)
    named = [i for i, p in enumerate(params) if i >= len(args) and _contains_tensor(kwargs.get(p.name))]
    if not named:
        return args, kwargs
    moved = params[len(args):named[-1] + 1]
    if any(p.name not in kwargs and p.default is p.empty for p in moved):
        return args, kwargs  # a required argument is missing: let the call raise as it would
    kwargs = dict(kwargs)
    return tuple(args) + tuple(kwargs.pop(p.name, p.default) for p in moved), kwargs


def dispatch(func, args, kwargs):
    """Trace one torch call. Called only while a trace is being built."""
    handler = handlers.get(func)
    trc = context.current_trace()
    if trc is None:
        raise RuntimeError(f"{torch_name(func)} was called on a thunderfn proxy outside of tracing")
    if handler is None:
        if func in _metadata_getters or func in _metadata_methods:
            if not any(isinstance(a, TensorProxy) for a in args):
                return func(*args, **kwargs)
        from thunderfn.torch.opaque import is_random

        has_tensor = _contains_tensor(args) or _contains_tensor(kwargs)

        # No handler and no tensor argument: run it now and bake the result in (right for
        # torch.tensor([...]) or torch.eye(3)), unless it is random, which would freeze one draw.
        if not has_tensor and not is_random(func):
            with torch._C.DisableTorchFunction():
                result = func(*args, **kwargs)
            if isinstance(result, torch.Tensor):  # a fresh tensor on every eager call: see trace()
                trc.created[id(result)] = result
            return result
    from thunderfn.torch import inplace
    from thunderfn.torch.opaque import run_opaque

    args, kwargs = lift_constants(args), lift_constants(kwargs)
    if trc.mutated or trc.rebinds:
        inplace.check_fresh(args, kwargs)
    # Writes into an argument: functionalized (torch/inplace.py).
    if inplace.is_in_place(func):
        return inplace.run_in_place(func, args, kwargs)
    if isinstance(kwargs.get("out"), TensorProxy):
        return inplace.run_with_output_argument(handler, func, args, kwargs, kwargs["out"])
    if handler is not None and kwargs.get("inplace") is True and args and isinstance(args[0], TensorProxy):
        return inplace.run_with_inplace_flag(handler, func, args, kwargs)
    if kwargs and isinstance(handler, Symbol) and handler.fn is not None:
        args, kwargs = tensors_by_position(handler, args, kwargs)
    # A symbol, or the fallback ladder's second rung: torch runs it, meta tensors give its shapes.
    result = handler(*args, **kwargs) if handler is not None else run_opaque(func, args, kwargs)
    if trc.identities or inplace.is_view_op(func):
        inplace.track_views(func, args, kwargs, result)
    return result


def method(proxy: TensorProxy, name: str):
    """`proxy.name` for a Tensor method: a callable that traces the method."""
    torch_fn = getattr(torch.Tensor, name, None)
    if torch_fn is None:
        raise AttributeError(f"'Tensor' object has no attribute '{name}'")
    if isinstance(torch_fn, property) or type(torch_fn) is type(torch.Tensor.shape):
        return dispatch(torch_fn.__get__, (proxy,), {})

    def bound(*args, **kwargs):
        return dispatch(torch_fn, (proxy, *args), kwargs)

    bound.__name__ = name
    return bound


class TracingMode(TorchFunctionMode):
    """Active while a trace is built, so torch calls without a proxy argument (factory
    functions, methods on captured tensors) are traced too. Inside a symbol's own
    body the mode stands aside: thunderfn's languages call torch only for metadata."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        trc = context.current_trace()
        if trc is None or trc.symbol_depth:
            return func(*args, **kwargs)
        return dispatch(func, args, kwargs)
