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
from torch._functorch.utils import unwrap_dead_wrappers as _unwrap_dead_wrappers

from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.checkpoint)
from thunderfn.core import context, dtypes, progress, symbolic
from thunderfn.core.passes import dce
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_unflatten
from thunderfn.core.rules import TAG_NOT_DIFFERENTIABLE
from thunderfn.core.statements import set_grad_enabled, write_back
from thunderfn.core.trace import Trace, stamp_provenance
from thunderfn.core.tracer import tracing
from thunderfn.errors import ArgumentRuntimeError, InternalError, SavedTensorModifiedError, UnsupportedOpError
from thunderfn.torch.opaque import autograd_connections
from thunderfn.transforms.autodiff import trace_vjp
from thunderfn.transforms.rules.define import vjp_rule_for
from thunderfn.transforms.user_functions import differentiable_outputs


@dataclasses.dataclass
class Split:
    forward: Trace  # (inputs) -> ((outputs...), (residuals...))
    backward: Trace  # (residuals..., cotangents...) -> [gradient or None per input]
    differentiable: list  # per output: does a gradient flow back through it
    leaf_plan: list  # per leaf of the user's output: ("out", i) | ("input", i) | ("value", v)
    out_spec: object
    captured: tuple  # captured tensors requiring grad, passed after the inputs (see _lift_captured)
    constants: tuple  # captured tensors that did not require grad
    # backward_without(absent) -> the backward trace for calls where the differentiable outputs at these
    # positions get no gradient (torch passes None: the user did not use them), with the same arguments (those
    # cotangents unread); None where that backward would read a value the forward does not save
    backward_without: object = None
    # (input number, dim) of each symbolic size the backward takes after its tensors (Trace.size_args): the
    # sizes of the forward's inputs no tensor the backward gets holds as a dimension (core/symbolic.py)
    size_plan: tuple = ()


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
    """The names of values a gradient can reach from the inputs `names`, as torch.autograd
    records them: not through ops recorded under torch.no_grad(), nor into integer or boolean
    values, nor through a composite whose decomposition does not use them for a floating
    value (zeros_like(x), x.new_ones(...): factories, whose outputs do not require grad in
    eager). (jit splits only under grad mode, part of its cache key, so the function starts
    with grad enabled.)"""
    reached, grad_enabled = set(names), True
    for bsym in bsyms:
        if bsym.sym is set_grad_enabled:
            grad_enabled = bool(bsym.args[0])
        elif (grad_enabled and TAG_NOT_DIFFERENTIABLE not in bsym.sym.tags
                  and any(p.name in reached for p in bsym.proxy_args())):
            # a symbol with a VJP rule follows torch's formula (which may give zeros); others, their decomposition
            if "user_function" in bsym.sym.tags:  # a Function's outputs marked non-differentiable do not require grad
                through = differentiable_outputs(bsym)
            else:
                through = _depends_on_inputs(list(bsym.subsymbols), reached) if (
                    bsym.subsymbols and vjp_rule_for(bsym) is None) else _opaque_reach(bsym, reached)
            reached.update(o.name for o in bsym.proxy_outs()
                           if dtypes.is_inexact(o.dtype) and (through is None or o.name in through))
    return reached


def _opaque_reach(bsym, reached: set) -> set | None:
    """The outputs of an opaque torch op that a gradient reaches from `reached`, as torch records
    them (torch/opaque.py autograd_connections); None for other symbols, or when unknown."""
    if "opaque" not in bsym.sym.tags or bsym.sym.torch_fn is None:
        return None
    connections = autograd_connections(bsym)
    if connections is None:
        return None
    inputs, outputs = connections
    leaves = tree_flatten((bsym.args, bsym.kwargs))[0]
    if not any(isinstance(leaves[i], TensorProxy) and leaves[i].name in reached for i in inputs):
        return set()
    outs = bsym.flat_outs()
    return {outs[j].name for j in outputs if isinstance(outs[j], TensorProxy)}


def split_forward_backward(computation: Trace, executors) -> Split:
    """Differentiate `computation` with respect to its inputs that require grad and cut
    the joint trace into a forward and a backward trace (see the module docstring), for
    the priority list of executors both will be lowered onto (transforms/autodiff.py's
    trace_vjp). Raises UnsupportedOpError where thunderfn cannot differentiate an op."""
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
    outputs, leaf_plan = _outputs_and_leaf_plan(out_leaves, input_names)
    reached = _depends_on_inputs(computation.bound_symbols, {p.name for p in wrt})
    differentiable = [o.name in reached for o in outputs]

    joint = Trace(computation.fn_name, names=computation.names)
    with tracing(joint) as joint_tracer:
        def replay(*_):
            for bsym in computation.bound_symbols:
                joint_tracer.emit(bsym)
            return outputs

        _, backward = trace_vjp(replay, wrt, executors)
        n_forward = len(joint.bound_symbols)
        cotangents = [TensorProxy(joint.names.take(prefix="g"), shape=o.shape, dtype=o.dtype, device=o.device)
                      for o, d in zip(outputs, differentiable) if d]
        it = iter(cotangents)
        grads = backward([next(it) if d else None for d in differentiable])
    grad_of = {p.name: g for p, g in zip(wrt, grads)}

    def backward_trace(bsyms, grad_of):
        trc = Trace(computation.fn_name, names=computation.names)
        trc.def_name = "backward"
        trc.bound_symbols = bsyms
        trc.output = [grad_of.get(p.name) for p in inputs]
        return dce(trc)

    def reads(trc):
        defined = {o.name for b in trc.bound_symbols for o in b.proxy_outs()} | {c.name for c in cotangents}
        used = [p for b in trc.bound_symbols for p in b.proxy_args()] + [g for g in trc.output if g is not None]
        return [p for p in used if p.name not in defined and p.constant is None]

    bwd = backward_trace(joint.bound_symbols[n_forward:], grad_of)
    residuals = list({p.name: p for p in reads(bwd)}.values())
    residuals += _holders_of_data_dependent_sizes(joint.bound_symbols[:n_forward], bwd, residuals + cotangents)
    bwd.args = residuals + cotangents
    bwd.args_in_list = True  # ThunderFunction.backward hands over its only references: residuals die as they are used
    size_plan = _sizes_for_backward(computation.args, bwd, computation.size_args)

    def backward_without(absent: frozenset):
        """The backward differentiated again with no cotangent at the absent positions (of the differentiable
        outputs), which the VJP rules then skip: eager's autograd does no work for an output nobody used."""
        began = time.perf_counter_ns()
        with tracing(joint, joint_tracer):  # (built on from where the first backward left it: its grad mode too)
            start_at = len(joint.bound_symbols)
            it = iter(c if i not in absent else None for i, c in enumerate(cotangents))
            grads_now = backward([next(it) if d else None for d in differentiable])
            bsyms = joint.bound_symbols[start_at:]
            del joint.bound_symbols[start_at:]
        trc = backward_trace(bsyms, {p.name: g for p, g in zip(wrt, grads_now)})
        if not {p.name for p in reads(trc)} <= {p.name for p in residuals}:
            return None
        trc.args, trc.args_in_list, trc.size_args = residuals + cotangents, True, bwd.size_args
        stamp_provenance(trc, "Backward without the gradients of unused outputs", began)
        return trc

    fwd = computation.derive("", [b for b in joint.bound_symbols[:n_forward] if b.sym is not set_grad_enabled])
    fwd.output = (tuple(outputs), tuple(residuals))
    fwd = dce(fwd)
    stamp_provenance(fwd, "Forward and backward split", start)
    stamp_provenance(bwd, "Forward and backward split", start)
    return Split(fwd, bwd, differentiable, leaf_plan, out_spec, tuple(p.constant for p in captured), constants,
                 backward_without, size_plan)


def _outputs_and_leaf_plan(out_leaves: list, input_names: dict) -> tuple[list, list]:
    """The forward's tensor outputs (each computed tensor once), and how each output leaf is given back:
    ("value", v) as a value of its own, ("input", i) as the caller's i-th input itself (as eager returns
    it), ("out", j) as the forward's j-th output."""
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
    return outputs, leaf_plan


def _holders_of_data_dependent_sizes(forward: list, bwd: Trace, args: list) -> list:
    """Forward values to save for the backward only for a data-dependent size they hold as a dimension, which
    the backward computes with and none of its arguments holds (sum's VJP expands to a masked tensor's u0):
    its code binds the size from their shapes (core/printing.py)."""
    held = {symbolic.bare_symbol(n) for p in args for n in p.shape}
    missing = set().union(*(symbolic.unbacked_names((b.args, b.kwargs)) for b in bwd.bound_symbols)) - held
    holders = {}
    for b in forward:
        for p in b.proxy_outs():
            for n in p.shape:
                name = symbolic.bare_symbol(n)
                if name in missing and name not in holders:
                    holders[name] = p
    if missing - holders.keys():
        raise InternalError(f"the backward of '{bwd.fn_name}' computes with the data-dependent sizes "
                            f"{sorted(missing - holders.keys())}, which no value of the forward holds as a dimension")
    return list({p.name: p for p in holders.values()}.values())


def _sizes_for_backward(inputs: list, bwd: Trace, numbers=()) -> tuple:
    """Make the backward take, after its tensors, each symbolic size of the inputs that none of its own
    tensors holds as a dimension (its code computes with the forward's sizes: expand's VJP sums to an input's
    shape), and each float the forward takes as a value (`numbers`: its size parameters, after its tensor
    inputs); the (input number, dim) each is read from at call time, in that order (dim None: the input is
    that number)."""
    held = {symbolic.bare_symbol(n) for p in bwd.args for n in p.shape}
    plan = {}
    for i, p in enumerate(inputs):
        for d, n in enumerate(p.shape):
            name = symbolic.bare_symbol(n)
            if name is not None and name not in held and name not in plan:
                plan[name] = (i, d)
    plan.update({name: (len(inputs) + k, None) for k, name in enumerate(numbers)})
    bwd.size_args = list(plan)
    return tuple(plan.values())


def _fresh(tensors, inputs) -> list:
    """tensors, each a new object: torch's own ops return their input itself at run time where eager
    does (x.float() of a float x); an autograd.Function returns a view of it instead, and each object once."""
    seen = set(map(id, inputs))  # (a number among them is never one of the tensors)
    fresh = []
    for t in tensors:
        if isinstance(t, torch.Tensor):
            if id(t) in seen:
                t = t.view_as(t)
            seen.add(id(t))
        fresh.append(t)
    return fresh


def _keep_for_backward(ctx, compiled, inputs, outputs, new_residuals, *, anchor_saved: bool) -> None:
    """What both Functions below keep for the backward: the residuals (each an input, an output or a
    new tensor, per compiled.saved_from), and what the backward needs to know of the outputs."""
    ctx.compiled = compiled
    # the backward's size parameters (only a trace with symbolic sizes has any)
    ctx.sizes = ([inputs[i] if d is None else inputs[i].shape[d] for i, d in compiled.size_plan]
                 if compiled.size_plan else ())
    ctx.output_meta = [(o.shape, o.dtype, o.device) for o in outputs]  # for zero cotangents (not the tensors)
    source = (*inputs[:len(inputs) - compiled.n_numbers], *outputs, *new_residuals)
    saved = [source[i] for i in compiled.saved_from]
    # A backward taken with create_graph=True ties its gradients through _NoSecondDerivative to an input
    # that requires grad: a saved input if there is one (most often a weight), else one kept for that
    ctx.anchor_at = next((k for k in compiled.saved_inputs if saved[k].requires_grad), None)
    ctx.anchor = None
    if ctx.anchor_at is None:
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        anchor = next((t for t in tensors if t.requires_grad), tensors[0])  # (torch.func passes unwrapped inputs)
        if anchor_saved:  # torch.func unwraps saved tensors to the level the backward runs at: saved it must be
            saved.append(anchor)
        else:
            # Its value is never read, only its place in the graph: not saved, so an in-place write into it
            # after this call (y[i] = v on a y this call only indexed), which eager allows since its backward
            # does not need y, does not fail the backward's version check.
            ctx.anchor = anchor
    ctx.save_for_backward(*saved)
    # torch would hand backward a tensor of zeros for every output without a gradient, the residuals
    # included (as big as the activations); backward makes zeros only where the compiled backward reads one
    ctx.set_materialize_grads(False)


def _backward(ctx, *cotangents):
    """Both Functions' backward: the compiled backward trace, on the residuals and the cotangents."""
    compiled = ctx.compiled
    if compiled.modified_residuals:
        p = compiled.modified_residuals[0]
        raise SavedTensorModifiedError(
            f"one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"[{p.type_string()}] ({p.origin[0] if p.origin else p.name}) was written in place by the jitted "
            f"'{compiled.fn_name}' after a differentiable operation used it, as eager's autograd reports.")
    residuals = list(ctx.saved_tensors)
    # torch's own nodes free what they saved once their backward has run; ours go as the backward uses
    # them: ctx lets go of them here (unless retain_graph=True), and the compiled backward empties the
    # list it is given, so its `del`s free each residual after its last use
    ctx.maybe_clear_saved_tensors()
    if ctx.anchor_at is not None:
        anchor = residuals[ctx.anchor_at]
    elif ctx.anchor is not None:
        anchor = ctx.anchor
        if not torch._C._autograd._get_current_graph_task_keep_graph():
            ctx.anchor = None  # let go of it as of the saved tensors (unless retain_graph=True)
    else:
        anchor = residuals.pop()
    cotangents = [c for c, d in zip(cotangents, compiled.differentiable) if d]
    first_run = compiled.first_run_of(cotangents)
    if first_run is None:
        return _run_backward(ctx, compiled, cotangents, residuals, anchor)
    with first_run:
        return _run_backward(ctx, compiled, cotangents, residuals, anchor)


def _run_backward(ctx, compiled, cotangents, residuals, anchor) -> tuple:
    """_backward's rest: the backward for these cotangents run on the residuals."""
    backward, given = compiled.backward_for(cotangents,
                                            [m for m, d in zip(ctx.output_meta, compiled.differentiable) if d])
    residuals += given
    residuals += ctx.sizes
    numbers = (None,) * compiled.n_numbers  # (the floats the forward took as values get no gradient)
    if not torch.is_grad_enabled():
        return (None, *backward(residuals), *numbers)
    # create_graph=True (torch.func.grad and vjp always ask for it, so that they nest): give the first
    # derivative, and make differentiating it again raise instead of silently stopping at the residuals.
    with torch.no_grad():
        grads = backward(residuals)
    present = [g for g in grads if g is not None]
    it = iter(_NoSecondDerivative.apply(compiled.fn_name, anchor, *present) if present else ())
    return (None, *(next(it) if g is not None else None for g in grads), *numbers)


class ThunderFunction(torch.autograd.Function):
    """Runs a compiled forward, saves its residuals, and runs the compiled backward
    from torch's backward pass.

    It has torch.func's form (forward without ctx, setup_context, a generated vmap rule:
    the compiled traces are torch ops that vmap batches), so torch.func.grad, vjp,
    jacrev and vmap over a jitted function work. The residuals travel as extra outputs
    marked non-differentiable, the way torch.func's autograd.Function docs pass
    intermediates to setup_context. Outside torch.func, `_PlainThunderFunction` runs
    instead: the same forward and backward, the residuals saved in forward itself, so
    torch wraps only the outputs (each returned tensor costs torch.autograd ~0.3 us).

    torch does not see the backward's own ops as a function of the inputs (the residuals
    were computed without autograd), so a second derivative through torch (plain
    torch.autograd with create_graph=True, or torch.func.grad of torch.func.grad) is
    refused rather than answered with a gradient that stops at the residuals: higher
    derivatives go through thunderfn (tf.grad of tf.grad)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(compiled, *inputs):
        outputs, residuals = compiled.forward(*inputs)
        # a residual that is an input or an output is saved as that (torch refuses a tensor returned twice)
        return tuple(_fresh((*outputs, *(residuals[k] for k in compiled.new_residuals)), inputs))

    @staticmethod
    def setup_context(ctx, inputs, output):
        compiled = inputs[0]
        n = len(compiled.differentiable)
        _keep_for_backward(ctx, compiled, inputs[1:], output[:n], output[n:], anchor_saved=True)
        ctx.mark_non_differentiable(*(o for o, d in zip(output[:n], compiled.differentiable) if not d),
                                    *output[n:])

    @staticmethod
    def jvp(ctx, *tangents):
        raise UnsupportedOpError(
            f"torch's forward-mode AD (torch.func.jvp, jacfwd, hessian) reached the jitted '{ctx.compiled.fn_name}' "
            f"while it was also being differentiated in reverse mode; thunderfn's compiled function has no "
            f"forward-mode rule for torch. Use thunderfn's transforms (tf.jvp(tf.grad(f), ...)), or torch.func on "
            f"the function without tf.jit.")

    backward = staticmethod(_backward)


class _PlainThunderFunction(torch.autograd.Function):
    """ThunderFunction for plain torch.autograd (no torch.func transform active): forward saves the
    residuals itself, and returns only the outputs."""

    @staticmethod
    def forward(ctx, compiled, *inputs):
        outputs, residuals = compiled.forward(*inputs)
        outputs = _fresh(outputs, inputs)
        _keep_for_backward(ctx, compiled, inputs, outputs, [residuals[k] for k in compiled.new_residuals],
                           anchor_saved=False)
        ctx.mark_non_differentiable(*(o for o, d in zip(outputs, compiled.differentiable) if not d))
        return tuple(outputs)

    backward = staticmethod(_backward)


class _NoSecondDerivative(torch.autograd.Function):
    """The identity on a backward's gradients, tied to an input that requires grad, whose own
    backward refuses: a gradient of ThunderFunction's gradient is never silently zero."""

    generate_vmap_rule = True

    @staticmethod
    def forward(fn_name, anchor, *grads):
        return tuple(g.view_as(g) for g in grads)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.fn_name = inputs[0]

    @staticmethod
    def backward(ctx, *cotangents):
        raise UnsupportedOpError(_second_derivative_message(ctx.fn_name))


def _second_derivative_message(fn_name: str) -> str:
    return (f"torch was asked to differentiate the backward of the jitted '{fn_name}' (torch.autograd with "
            f"create_graph=True, or torch.func.grad of torch.func.grad), which runs as thunderfn's backward trace "
            f"and is not recorded by torch. For higher derivatives use thunderfn's transforms: tf.grad(tf.grad(f)), "
            f"tf.jvp(tf.grad(f), ...).")


def _read_as_saved(bsym) -> list:
    """What a bound symbol of the backward reads as the forward left it: all it reads, but the captured tensors
    a checkpoint's backward computes again from, which it reads as they are when the backward runs, as eager's
    recomputation does (BatchNorm's running statistics, which the forward updated, in a checkpointed block)."""
    if bsym.sym.id == prims.checkpoint.id:
        return [p for p in bsym.proxy_args() if p.constant is None]
    return bsym.proxy_args()


class CompiledSplit:
    """A split, compiled: call it with the input tensors to get the user's output structure."""

    # what it knows of its split besides the compiled halves and the output structure, all of it plain values: what
    # a compiled entry written to disk keeps (disk_cache.py), and `restored` is made from
    PLAN = ("fn_name", "differentiable", "leaf_plan", "n_numbers", "size_plan", "new_residuals", "saved_inputs",
            "saved_from")

    def __init__(self, split: Split, forward, backward, backward_without=None, first_run=None):
        self.forward, self.backward = forward, backward
        # what reports the first backward's run, the rest of the compile (core/progress.py's `later`), until it runs
        self.first_run = first_run
        # absent -> the backward for calls whose differentiable outputs at those positions get no gradient
        # (None: the full backward, with zeros for them), made by backward_without(absent) on first use
        self.backward_without = backward_without
        self.backward_by_absent: dict = {}
        self.fn_name = split.forward.fn_name
        self.differentiable = split.differentiable
        self.leaf_plan, self.out_spec, self.captured = split.leaf_plan, split.out_spec, split.captured
        self.size_plan = split.size_plan
        # floats the forward takes as values (core/symbolic.py's SymbolicInputs.number): the last of its inputs,
        # after the captured tensors, where jit passes them after the tensors
        self.n_numbers = len(split.forward.size_args)
        self.constants = split.constants
        # per residual: ("input", i) / ("output", i) when it is one of those, else ("new", None)
        inputs = {p.name: i for i, p in enumerate(split.forward.args)}
        outputs = {p.name: i for i, p in enumerate(split.forward.output[0])}
        # Tensors the forward writes back into whose old values the backward reads: eager's autograd saved them
        # before the in-place write, and its version check makes backward() raise; so does ours.
        written = {b.args[0].name: b.args[0] for b in split.forward.bound_symbols if b.sym is write_back}
        read = [*split.forward.output[1], *(p for b in split.backward.bound_symbols for p in _read_as_saved(b))]
        self.modified_residuals = list({p.name: written[p.name] for p in read if p.name in written}.values())
        residual_plan = [("input", inputs[r.name]) if r.name in inputs else
                         ("output", outputs[r.name]) if r.name in outputs else ("new", None)
                         for r in split.forward.output[1]]
        # what the Functions save, as positions in (*inputs, *outputs, *new residuals): an input or an output
        # is saved as that (torch refuses a tensor returned twice), a new residual as itself
        self.new_residuals = [k for k, (kind, _) in enumerate(residual_plan) if kind == "new"]
        self.saved_inputs = [k for k, (kind, _) in enumerate(residual_plan) if kind == "input"]
        n_in, n_out = len(split.forward.args), len(split.forward.output[0])
        at_new = {k: n_in + n_out + j for j, k in enumerate(self.new_residuals)}
        self.saved_from = [i if kind == "input" else n_in + i if kind == "output" else at_new[k]
                           for k, (kind, i) in enumerate(residual_plan)]

    @classmethod
    def restored(cls, plan: dict, out_spec, forward, backward, backward_by_absent: dict) -> "CompiledSplit":
        """A split compiled in another process, from its PLAN's values (one that captures no tensors and writes
        into no saved input), with the backwards for outputs without gradients that process made: for other
        outputs without gradients, the full backward gets zeros for them."""
        compiled = cls.__new__(cls)
        compiled.forward, compiled.backward, compiled.out_spec = forward, backward, out_spec
        compiled.first_run, compiled.backward_without, compiled.backward_by_absent = None, None, backward_by_absent
        compiled.captured, compiled.constants, compiled.modified_residuals = (), (), []
        for name in cls.PLAN:
            setattr(compiled, name, plan[name])
        return compiled

    def first_run_of(self, cotangents):
        """A context reporting this backward's run as a compile (core/progress.py) where it is a first: the first
        backward of all (the compile's continuation), or one for outputs without gradients that backward_for makes
        now; its fusion regions compile in it. None for the calls after."""
        if self.first_run is not None:
            first_run, self.first_run = self.first_run, None
            return first_run.running()
        if self.backward_without is not None and any(c is None for c in cotangents):
            absent = frozenset(i for i, c in enumerate(cotangents) if c is None)
            if absent not in self.backward_by_absent:
                return progress.compiling(f"the backward of '{self.fn_name}' for outputs without gradients",
                                          quoted=False, stage_name="lowering it, its first run")
        return None

    def backward_for(self, cotangents, metas) -> tuple:
        """(the backward to run, the cotangents to give it), for the differentiable outputs' cotangents and
        (shape, dtype, device)s: where outputs got no gradient, the backward that skips them if it can be
        made (those cotangents unread), else the full one with zeros there."""
        absent = frozenset(i for i, c in enumerate(cotangents) if c is None)
        backward = self.backward
        if absent:
            if absent not in self.backward_by_absent and self.backward_without is not None:
                self.backward_by_absent[absent] = self.backward_without(absent)
            backward = self.backward_by_absent.get(absent) or self.backward
        if backward is self.backward:
            cotangents = [c if c is not None else torch.zeros(shape, dtype=dtype, device=device)
                          for c, (shape, dtype, device) in zip(cotangents, metas)]
        return backward, cotangents

    def __call__(self, *inputs):
        for t in self.constants:
            if t.requires_grad:
                raise ArgumentRuntimeError(
                    f"a tensor captured by the jitted '{self.fn_name}' "
                    f"({TensorProxy.type_string(t)}) requires grad now but did not when the function was compiled, so "
                    "the compiled backward treats it as a constant. jit the function again after changing "
                    "requires_grad, or pass the tensor as an argument.")
        if self.captured:
            n = len(inputs) - self.n_numbers
            inputs = inputs[:n] + self.captured + inputs[n:]
        if context.functorch_active():  # torch.func over the jitted function: torch's own way in
            outs = ThunderFunction.apply(self, *inputs)
        else:
            # what Function.apply does here, less binding the arguments to forward's signature
            # with inspect on every call (forward has no defaults): most of a small call's cost
            outs = _apply_thunder_function(self, *_unwrapped_if_dead(inputs))
        outs = outs[:len(self.differentiable)]  # (ThunderFunction's rest are residuals)
        leaves = [outs[i] if kind == "out" else inputs[i] if kind == "input" else i for kind, i in self.leaf_plan]
        return tree_unflatten(self.out_spec, leaves)


_apply_thunder_function = super(torch.autograd.Function, _PlainThunderFunction).apply
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _unwrapped_if_dead(inputs) -> tuple:
    """torch's unwrap_dead_wrappers (what Function.apply does first: a tensor left over from a finished
    torch.func transform becomes the tensor it wrapped), one C call per tensor."""
    try:
        return tuple(map(_unwrap_if_dead, inputs))
    except TypeError:  # something not a tensor among them
        return _unwrap_dead_wrappers(inputs)


def try_split(computation: Trace, executors):
    """(split, None), or (None, why there is no split: nothing requires grad, or the computation
    keeps torch's autograd wiring). executors: as split_forward_backward's."""
    why = why_not_split(computation)
    if why is not None:
        return None, why
    try:
        split = split_forward_backward(computation, executors)
    except (UnsupportedOpError, NotImplementedError) as e:  # torch may still differentiate it: keep its wiring
        return None, f"thunderfn cannot differentiate it ({e})"
    if not any(split.differentiable):
        return None, "no output depends on an input that requires grad"
    return split, None

