"""How one torch call made by traced code is traced: the torch language's dispatcher.

Core routes every torch call it intercepts while a trace is being built (a call on a
proxy, or any call under tracing's TorchFunctionMode: core/interception.py) to
`dispatch`; thunderfn/torch/__init__.py installs it there. A call goes to the symbol
registered for its torch callable; a write into an argument is functionalized
(torch/inplace.py); a view is tracked; a callable with no symbol runs as an opaque op
(torch/opaque.py), or, with no tensor argument, runs now and is baked in.

May import: core/, prims, clang and the rest of the torch language.
"""
from __future__ import annotations

import torch

from thunderfn.core import context, symbolic
from thunderfn.core.interception import (
    contains_tensor,
    find_handler,
    is_metadata_query,
    lift_constants,
    stand_in_metadata,
    tensors_by_position,
    torch_name,
)
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.symbol import Symbol
from thunderfn.errors import ProxyOutsideTraceError
from thunderfn.torch import autocast, inplace
from thunderfn.torch.opaque import is_random, run_opaque

_any_autocast = torch._C._is_any_autocast_enabled


def _sizes_math(func) -> bool:
    """torch.sym_float, torch.sym_max, torch._sym_sqrt, ...: functions of Python numbers and sizes."""
    return getattr(func, "__module__", None) == "torch" and getattr(func, "__name__", "").lstrip("_").startswith("sym_")


_NOT_RUN = object()  # what a step of dispatch returns when the call is not its to run


def dispatch(func, args, kwargs):
    """Trace one torch call. Called only while a trace is being built."""
    handler = find_handler(func)
    tracer = context.current_tracer()
    if tracer is None:
        raise ProxyOutsideTraceError(
            f"{torch_name(func)} was called on a thunderfn proxy outside of tracing: a traced tensor was kept past its "
            f"trace (in a global, a closure, an attribute, or a Trace's .output) and used later. Only real tensors "
            f"live outside a trace: return what you need from the traced function instead.")
    if handler is None:
        result = _run_now(func, args, kwargs, tracer)
        if result is not _NOT_RUN:
            return result
    written = args[0] if args else None
    args, kwargs = lift_constants(args), lift_constants(kwargs)
    if tracer.mutated or tracer.rebinds:
        inplace.check_fresh(args, kwargs)
    result = _run_functionalized(func, handler, args, kwargs, written)
    if result is not _NOT_RUN:
        return result
    return _run_recorded(func, handler, args, kwargs, tracer)


def _run_now(func, args, kwargs, tracer):
    """A call with no symbol that reads no proxy runs now, its result baked in: a metadata query on real
    tensors (answered by a stand-in's metadata where one is installed), or a call with no tensor argument
    (right for torch.tensor([...]) or torch.eye(3)), unless it is random, which would freeze one draw, or
    makes a tensor of a symbolic size (torch.eye(x.shape[0])), which baking would pin: those run as
    opaque ops (torch's arithmetic on sizes, torch.sym_float and the like, runs now: its result stays
    symbolic). _NOT_RUN for any other call."""
    if is_metadata_query(func) and not any(isinstance(a, TensorProxy) for a in args):
        if context._local.stand_ins:
            answer = stand_in_metadata(func, args, kwargs)
            if answer is not NotImplemented:
                return answer
        return func(*args, **kwargs)
    if contains_tensor(args) or contains_tensor(kwargs) or is_random(func):
        return _NOT_RUN
    if symbolic.has_symbols((args, kwargs)) and not _sizes_math(func):
        return _NOT_RUN
    with torch._C.DisableTorchFunction():
        result = func(*args, **kwargs)
    if isinstance(result, torch.Tensor):  # a fresh tensor on every eager call: see core/trace.py's trace()
        tracer.created[id(result)] = result
    return result


def _run_functionalized(func, handler, args, kwargs, written):
    """A call that writes into an argument (in place, out=, inplace=True), functionalized (torch/inplace.py);
    _NOT_RUN for any other call."""
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
    return _NOT_RUN


def _run_recorded(func, handler, args, kwargs, tracer):
    """A call that computes new values: recorded as its symbol's call, or as an opaque op, with the casts
    autocast makes around it and the views it makes tracked."""
    if kwargs and isinstance(handler, Symbol) and handler.fn is not None:
        args, kwargs = tensors_by_position(handler, args, kwargs)
    finish = None
    # torch's Python composites: traced through under autocast, and some always (torch/autocast.py)
    if handler is None and (func in autocast.ALWAYS_TRACED or _any_autocast()):
        body = autocast.python_body(func)
        if body is not None:
            return autocast.run_python_body(func, body, args, kwargs)
    if _any_autocast():  # the casts eager's autocast makes around this op, recorded (torch/autocast.py)
        args, kwargs, finish = autocast.cast_arguments(func, args, kwargs)
    # A symbol, or the fallback ladder's second rung: torch runs it, meta tensors give its shapes.
    result = handler(*args, **kwargs) if handler is not None else run_opaque(func, args, kwargs)
    if finish is not None:
        result = finish(result)
    if tracer.identities or inplace.is_view_op(func):
        inplace.track_views(func, args, kwargs, result)
    return result
