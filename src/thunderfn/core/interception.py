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
from thunderfn.core.call_time import read_grad
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.symbol import Symbol
from thunderfn.errors import UnsupportedOpError

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


def _refuse_grad_assignment(t, value):
    raise UnsupportedOpError(
        "assigning a tensor's .grad inside a traced function is not supported: the compiled function reads .grad "
        "when it is called (core/call_time.py) but does not replace it. Assign .grad (or call zero_grad()) outside "
        "the jitted function.")


def _refuse_torch_autograd(*args, **kwargs):
    raise UnsupportedOpError(
        "torch.autograd (loss.backward(), torch.autograd.grad) inside a traced function is not traced: nothing "
        "records torch's graph while tracing. Return the loss and call backward() outside (a jitted function's "
        "outputs are wired into torch.autograd), or differentiate inside with tf.grad / tf.value_and_grad.")


# A tensor's .grad changes between calls (backward(), zero_grad()): read when the compiled function is called.
handlers[torch.Tensor.grad.__get__] = read_grad
handlers[torch.Tensor.grad.__set__] = _refuse_grad_assignment
for _autograd_fn in (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad):
    handlers[_autograd_fn] = _refuse_torch_autograd


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


def resolve_torch_name(name: str):
    """The object a dotted `torch.…` name denotes, found by walking attributes from the torch
    module (never by evaluating the string), or None when there is no such attribute."""
    parts = name.split(".")
    if parts[0] != "torch" or not all(p.isidentifier() for p in parts):
        return None
    obj = torch
    with warnings.catch_warnings():  # some public names are deprecated aliases that warn when read
        warnings.simplefilter("ignore")
        for part in parts[1:]:
            try:
                obj = getattr(obj, part)
            except Exception:  # a missing attribute, or one that raises when read
                return None
    return obj


# Metadata questions about real tensors are answered eagerly while tracing: they do
# not depend on values that change between calls.
_metadata_getters = {
    getattr(torch.Tensor, name).__get__
    for name in ("shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_cpu", "is_meta",
                 "layout", "is_leaf", "grad_fn", "names", "is_sparse", "is_quantized", "is_nested",
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


def is_numpy_scalar(x) -> bool:
    """np.float32(2.5), np.int64(3), np.bool_(True), ...; not arrays, not even 0-d ones, which
    torch reads as tensors. (numpy is optional for torch, so it is not imported here.)"""
    return type(x).__module__ == "numpy" and type(x).__name__ != "ndarray" and getattr(x, "ndim", None) == 0


def python_scalar(x):
    """A numpy scalar as the Python number torch's argument parser reads it as when it is an
    operand or option (not tensor data): integers as int; floats, np.bool_ (!) and complex
    numbers (real part, with numpy's ComplexWarning) as float: `int32 * np.bool_(True)` is
    float32 in eager. Anything else unchanged."""
    kind = getattr(getattr(x, "dtype", None), "kind", None)
    if not is_numpy_scalar(x) or kind is None:
        return x
    if kind in "iu":
        return int(x)
    return float(x) if kind in "bfc" else x


def lift_constants(tree):
    """Real tensors met while tracing become constant proxies, read by reference; numpy
    scalars become the Python numbers torch takes them for."""
    if isinstance(tree, torch.Tensor):
        return context.current_trace().constant(tree)
    if type(tree).__module__ == "numpy":
        return python_scalar(tree)
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

    written = args[0] if args else None
    args, kwargs = lift_constants(args), lift_constants(kwargs)
    if trc.mutated or trc.rebinds:
        inplace.check_fresh(args, kwargs)
    # Writes into an argument: functionalized (torch/inplace.py).
    if inplace.is_in_place(func):
        result = inplace.run_in_place(func, args, kwargs)
        if isinstance(written, torch.Tensor) and result is args[0]:
            # Eager returns the tensor it wrote into: a module's own tensor stays the user's object
            # (`self.calls += 1` assigns it back to the module), and its proxy now holds the new value.
            return written
        return result
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
