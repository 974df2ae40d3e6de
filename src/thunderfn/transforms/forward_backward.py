"""The forward/backward split: how a jitted function joins torch.autograd.

When an input requires grad and grad mode is on, jit differentiates the computation
trace with the VJP transform (transforms/autodiff.py) and cuts the result in two:

- a *forward* trace that computes the outputs and returns, besides them, the
  residuals: the values the backward reads (inputs, intermediates, the generator
  state an opaque random op started from);
- a *backward* trace whose inputs are those residuals and one cotangent per
  differentiable output, and whose outputs are the gradients of the inputs that
  require grad.

Both are lowered and compiled like any trace, and a torch.autograd.Function runs
them: torch keeps only the residuals alive between the two, and calls the
backward trace from `loss.backward()`.

A captured tensor that requires grad (a parameter of a module the function calls)
becomes an extra input of both traces, so its gradient reaches it.

Some functions keep the older wiring (autograd through the torch ops the compiled
function runs, which is correct but saves what torch's ops save): those that write
into an input that requires grad, and those with an op thunderfn cannot differentiate
but torch can. `try_split` says which (tf.last_backward_traces repeats it).
"""
from __future__ import annotations

import dataclasses
import time

import optree
import torch

from thunderfn.core import dtypes
from thunderfn.core.passes import dce
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_unflatten
from thunderfn.core.statements import set_grad_enabled, write_back
from thunderfn.core.trace import Trace, tracing
from thunderfn.errors import UnsupportedOpError


@dataclasses.dataclass
class Split:
    forward: Trace  # (inputs) -> ((outputs...), (residuals...))
    backward: Trace  # (residuals..., cotangents...) -> [gradient or None per input]
    differentiable: list  # per output: does a gradient flow back through it
    leaf_plan: list  # per leaf of the user's output: ("out", i) | ("input", i) | ("value", v)
    out_spec: object
    captured: tuple  # captured tensors requiring grad, passed after the inputs (see _lift_captured)
    constants: tuple  # captured tensors that did not require grad


def _provenance(trc: Trace, name: str, start: int) -> Trace:
    trc.provenance = f"Constructed by {name} (took {(time.perf_counter_ns() - start) / 1e6:.2f} milliseconds)"
    return trc


def why_not_split(computation: Trace) -> str | None:
    """Why this computation keeps autograd through torch's ops, or None if it can be split."""
    # Writing into a tensor that requires grad would need its old value's gradient too; writing into
    # others (batch norm's running statistics) is a statement the forward runs.
    if any(b.sym is write_back and b.args[0].requires_grad for b in computation.bound_symbols):
        return "it writes into an input or captured tensor that requires grad"
    if not any(p.requires_grad for p in computation.args + _captured(computation)):
        return "no input (or captured tensor) requires grad"
    return None


def _captured(computation: Trace) -> list:
    """The proxies of the tensors the function captured (module parameters it reads, say), once each."""
    found = {}
    for b in computation.bound_symbols:
        for p in b.proxy_args():
            if p.constant is not None:
                found.setdefault(p.name, p)
    return list(found.values())


def _lift_captured(computation: Trace, captured: list) -> Trace:
    """computation with the captured tensors `captured` as extra inputs: torch.autograd then passes
    through them (the compiled function receives the very tensors the trace captured)."""
    lifted = {p.name: TensorProxy(p.name, shape=p.shape, dtype=p.dtype, device=p.device, requires_grad=True,
                                  origin=p.origin) for p in captured}
    new = computation.derive(computation.provenance, [b.swap(lifted) for b in computation.bound_symbols])
    new.args = list(computation.args) + list(lifted.values())
    new.output = optree.tree_map(lambda x: lifted.get(x.name, x) if isinstance(x, TensorProxy) else x,
                                 computation.output, none_is_leaf=True, namespace="thunderfn")
    return new


def _depends_on_inputs(bsyms: list, names: set) -> set:
    """The names of values a gradient can reach from the inputs `names`: not through
    ops recorded under torch.no_grad(), nor into integer or boolean values. (jit splits
    only under grad mode, part of its cache key, so the function starts with grad enabled.)"""
    reached, grad_enabled = set(names), True
    for bsym in bsyms:
        if bsym.sym is set_grad_enabled:
            grad_enabled = bool(bsym.args[0])
        elif grad_enabled and any(p.name in reached for p in bsym.proxy_args()):
            reached.update(o.name for o in bsym.proxy_outs() if dtypes.is_inexact(o.dtype))
    return reached


def split_forward_backward(computation: Trace) -> Split:
    """Differentiate `computation` with respect to its inputs that require grad and cut
    the joint trace into a forward and a backward trace (see the module docstring).
    Raises UnsupportedOpError where thunderfn cannot differentiate an op."""
    from thunderfn.transforms.autodiff import trace_vjp

    start = time.perf_counter_ns()
    all_captured = _captured(computation)
    # Captured tensors not requiring grad stay constants, which would be silently wrong once one of them
    # requires grad: CompiledSplit checks them on every call.
    constants = tuple(p.constant for p in all_captured if not p.requires_grad and dtypes.is_inexact(p.dtype))
    captured = [p for p in all_captured if p.requires_grad]
    if captured:
        computation = _lift_captured(computation, captured)
    inputs = list(computation.args)
    input_names = {p.name: i for i, p in enumerate(inputs)}
    wrt = [p for p in inputs if p.requires_grad and dtypes.is_inexact(p.dtype)]

    out_leaves, out_spec = tree_flatten(computation.output)
    outputs, leaf_plan, position = [], [], {}
    for leaf in out_leaves:
        if not isinstance(leaf, TensorProxy):
            leaf_plan.append(("value", leaf))
        elif leaf.name in input_names:  # eager returns the caller's tensor itself
            leaf_plan.append(("input", input_names[leaf.name]))
        elif leaf.constant is not None:
            leaf_plan.append(("value", leaf.constant))
        else:
            if leaf.name not in position:
                position[leaf.name] = len(outputs)
                outputs.append(leaf)
            leaf_plan.append(("out", position[leaf.name]))
    reached = _depends_on_inputs(computation.bound_symbols, {p.name for p in wrt})
    differentiable = [o.name in reached for o in outputs]

    joint = Trace(computation.fn_name, names=computation.names)
    with tracing(joint):
        def replay(*_):
            for bsym in computation.bound_symbols:
                joint.emit(bsym)
            return outputs

        _, backward = trace_vjp(replay, wrt)
        n_forward = len(joint.bound_symbols)
        cotangents = [TensorProxy(joint.names.take(prefix="g"), shape=o.shape, dtype=o.dtype, device=o.device)
                      for o, d in zip(outputs, differentiable) if d]
        it = iter(cotangents)
        grads = backward([next(it) if d else None for d in differentiable])
    grad_of = {p.name: g for p, g in zip(wrt, grads)}

    bwd = Trace(computation.fn_name, names=computation.names)
    bwd.def_name = "backward"
    bwd.bound_symbols = joint.bound_symbols[n_forward:]
    bwd.output = [grad_of.get(p.name) for p in inputs]
    bwd = dce(bwd)
    defined = {o.name for b in bwd.bound_symbols for o in b.proxy_outs()} | {c.name for c in cotangents}
    residuals, seen = [], set()
    used = [p for b in bwd.bound_symbols for p in b.proxy_args()] + [g for g in bwd.output if g is not None]
    for p in used:
        if p.name not in defined and p.name not in seen and p.constant is None:
            seen.add(p.name)
            residuals.append(p)
    bwd.args = residuals + cotangents

    fwd = computation.derive("", [b for b in joint.bound_symbols[:n_forward] if b.sym is not set_grad_enabled])
    fwd.output = (tuple(outputs), tuple(residuals))
    fwd = dce(fwd)
    _provenance(fwd, "Forward and backward split", start)
    _provenance(bwd, "Forward and backward split", start)
    return Split(fwd, bwd, differentiable, leaf_plan, out_spec, tuple(p.constant for p in captured), constants)


class ThunderFunction(torch.autograd.Function):
    """Runs a compiled forward, saves its residuals, and runs the compiled backward
    from torch's backward pass. torch does not record the backward's own ops, so
    create_graph=True (torch differentiating the backward) is refused rather than
    answered with a gradient that stops at the residuals: higher derivatives go
    through thunderfn (tf.grad of tf.grad)."""

    @staticmethod
    def forward(ctx, compiled, *inputs):
        outputs, residuals = compiled.forward(*inputs)
        ctx.compiled = compiled
        ctx.save_for_backward(*residuals)
        ctx.mark_non_differentiable(*(o for o, d in zip(outputs, compiled.differentiable) if not d))
        return outputs

    @staticmethod
    def backward(ctx, *cotangents):
        compiled = ctx.compiled
        if torch.is_grad_enabled():
            raise UnsupportedOpError(
                f"torch.autograd was asked to differentiate the backward of the jitted '{compiled.fn_name}' "
                f"(create_graph=True), which runs as thunderfn's backward trace and is not recorded by torch. "
                f"For higher derivatives use thunderfn's transforms: tf.grad(tf.grad(f)), tf.jvp(tf.grad(f), ...).")
        residuals = ctx.saved_tensors
        grads = compiled.backward(*residuals, *(c for c, d in zip(cotangents, compiled.differentiable) if d))
        return (None, *grads)


class CompiledSplit:
    """A split, compiled: call it with the input tensors to get the user's output structure."""

    def __init__(self, split: Split, forward, backward):
        self.forward, self.backward = forward, backward
        self.fn_name = split.forward.fn_name
        self.differentiable = split.differentiable
        self.leaf_plan, self.out_spec, self.captured = split.leaf_plan, split.out_spec, split.captured
        self.constants = split.constants

    def __call__(self, *inputs):
        for t in self.constants:
            if t.requires_grad:
                raise RuntimeError(
                    f"a tensor captured by the jitted '{self.fn_name}' ({TensorProxy.type_string(t)}) requires grad now "
                    f"but did not when the function was compiled, so the compiled backward treats it as a constant. "
                    f"jit the function again after changing requires_grad, or pass the tensor as an argument.")
        if self.captured:
            inputs = inputs + self.captured
        outs = ThunderFunction.apply(self, *inputs)
        leaves = [outs[i] if kind == "out" else inputs[i] if kind == "input" else i for kind, i in self.leaf_plan]
        return tree_unflatten(self.out_spec, leaves)


def try_split(computation: Trace):
    """(split, None), or (None, why there is no split: nothing requires grad, or the computation
    keeps torch's autograd wiring)."""
    why = why_not_split(computation)
    if why is not None:
        return None, why
    try:
        split = split_forward_backward(computation)
    except (UnsupportedOpError, NotImplementedError) as e:  # torch may still differentiate it: keep its wiring
        return None, f"thunderfn cannot differentiate it ({e})"
    if not any(split.differentiable):
        return None, "no output depends on an input that requires grad"
    return split, None

