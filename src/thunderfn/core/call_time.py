"""State a compiled function reads when it is called, not when it was traced.

A tensor's `.grad` is not a value the trace can bake in: `zero_grad()` and the next
`backward()` replace it between calls, and an optimizer step reads it on every call.
So reading `.grad` while tracing (of a captured parameter, of an input, of either
after an in-place update) gives a proxy that is an extra input of the trace, and the
compiled function is called with the tensor's current `.grad` in its place. Whether
each `.grad` was None, and its shape, dtype and device, shaped the trace (an optimizer
skips parameters without a gradient), so they are guarded: a call where any of them
differs traces again.

`Guarded` is what jit caches for such a trace: `guard(tensors)` says why the entry
does not fit this call (or None), and calling it reads the extra inputs. Other
modules add guards of their own to `Trace.guards` (see torch/optim.py). Both stay with the computation
trace (Trace.grad_reads, Trace.guards): the generated code takes the `.grad`s as inputs.
"""
from __future__ import annotations

import torch

from thunderfn.core import context
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import UnsupportedOpError


def _grad_signature(grad):
    if grad is None:
        return None
    return grad.shape, grad.dtype, grad.device, grad.layout, grad.requires_grad


def _describe(signature) -> str:
    if signature is None:
        return "None"
    shape, dtype, device, layout, requires_grad = signature
    return f"a {dtype} tensor of shape {tuple(shape)} on {device}"


class GradRead:
    """One `.grad` read by the trace: of a captured tensor (`tensor`) or of the compiled
    function's input number `position`; `signature` is what it was while tracing."""

    __slots__ = ("tensor", "position", "signature", "proxy", "name")

    def __init__(self, tensor, position, signature, proxy, name):
        self.tensor, self.position, self.signature, self.proxy, self.name = tensor, position, signature, proxy, name

    def current(self, tensors):
        return (self.tensor if self.position is None else tensors[self.position]).grad

    def why_stale(self, tensors) -> str | None:
        now = _grad_signature(self.current(tensors))
        if now != self.signature:
            return f"{self.name} was {_describe(self.signature)} when traced and is {_describe(now)} now"
        return None


def read_grad(t):
    """`t.grad` while tracing (the handler of torch.Tensor.grad's getter)."""
    tracer = context.current_tracer()
    if tracer is None:
        return t.grad if isinstance(t, torch.Tensor) else None
    trc = tracer.trace
    if isinstance(t, TensorProxy):
        frozen = tracer.mutated.get(id(t), (t,))[0]  # after x.add_(...), x.grad is still the caller's x's
        if frozen.constant is not None:
            t = frozen.constant
        else:
            position = next((i for i, a in enumerate(trc.args) if a is frozen), None)
            if position is None or frozen.name not in tracer.input_tensors:
                # computed inside the function: a non-leaf, or a leaf made here; eager's .grad is None
                return None
            return _record(trc, tracer.input_tensors[frozen.name], position, f"the .grad of {frozen.origin[0]}")
    return _record(trc, t, None, f"the .grad of a captured {TensorProxy.type_string(t)} tensor")


def _record(trc, tensor: torch.Tensor, position, name: str):
    if len(context.tracer_stack()) > 1:
        raise UnsupportedOpError(
            f"{name} is read inside a thunderfn transform (tf.grad, tf.vmap, ...) applied within another traced "
            f"function; thunderfn reads .grad at call time only at the outermost level. Read it in the jitted "
            f"function itself and pass it in as an argument.")
    key = id(tensor) if position is None else ("input", position)
    known = trc.grad_reads.get(key)
    if known is not None:
        return known.proxy
    grad = tensor.grad
    proxy = None
    if grad is not None:
        base = trc.args[position].name if position is not None else "c"
        proxy = TensorProxy(trc.names.take(f"{base}_grad", prefix="g"), shape=grad.shape, dtype=grad.dtype,
                            device=grad.device, requires_grad=grad.requires_grad, origin=name)
        trc.args.append(proxy)  # the compiled function takes it after the inputs (Guarded passes it)
    trc.grad_reads[key] = GradRead(tensor if position is None else None, position, _grad_signature(grad), proxy, name)
    return proxy


class Guarded:
    """A compiled function whose trace read state at call time: the current `.grad`s are
    passed after the inputs, and `guard` says when the trace no longer fits."""

    def __init__(self, fn, grad_reads, guards):
        self.fn = fn
        self.passed = tuple(r for r in grad_reads if r.proxy is not None)
        self.grad_reads = tuple(grad_reads)
        self.guards = tuple(guards)

    def guard(self, tensors) -> str | None:
        for r in self.grad_reads:
            why = r.why_stale(tensors)
            if why is not None:
                return why
        for g in self.guards:
            why = g()
            if why is not None:
                return why
        return None

    def __call__(self, *tensors):
        return self.fn(*tensors, *[r.current(tensors) for r in self.passed])


def guarded(fn, trc):
    """fn itself, or a Guarded wrapper when trc (the computation trace) read call-time state."""
    if not trc.grad_reads and not trc.guards:
        return fn
    return Guarded(fn, trc.grad_reads.values(), trc.guards)
