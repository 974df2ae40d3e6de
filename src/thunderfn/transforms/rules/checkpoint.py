"""Rules of the checkpoint family: prims.checkpoint (tf.checkpoint, torch.utils.checkpoint) and
prims.checkpoint_name.

Reverse mode through a checkpoint keeps from the forward only the body's inputs and the values its policy
saves, and computes the rest again in the backward:
- the forward (`_saving_residuals`, the rule's `residuals`): where the policy may save something, or the
  body draws random numbers, reverse mode runs in the call's place a checkpoint of the body as
  differentiated (its decomposition as the backward reads it), returning besides its outputs the values
  the backward reads that the policy saves, and every random draw the backward reads;
- the backward (`_checkpoint_vjp`): a checkpoint, saving nothing, of a body that runs the forward again
  on the inputs, takes the saved values from the forward instead of computing them (their statements
  dropped, random draws among them never drawn again), and runs the body's VJP.
Forward mode and vmap give a checkpoint, with the same policy, of the body's JVP or batched form.
"""
from __future__ import annotations

from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.checkpoint, checkpoint_name)
from thunderfn.core import context
from thunderfn.core.bodies import Body, renamed, trace_body
from thunderfn.core.passes import dce
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten
from thunderfn.core.trace import Trace
from thunderfn.core.tracer import tracing
from thunderfn.torch import checkpoint_policies
from thunderfn.torch.checkpoint import checkpoint
from thunderfn.transforms.rules.common import (
    float_tangents,
    full_tangents,
    is_float_tensor,
    output_tangents,
    per_leaf,
    zeros_like,
)
from thunderfn.transforms.rules.define import defbatch, defjvp, deflinear, defvjp, trace_jvp, trace_vjp, vmap


def _calls(bsym):
    yield bsym
    for sub in bsym.subsymbols:
        yield from _calls(sub)


def _draws(bsym) -> bool:
    """Whether computing bsym again could give another value: a random draw, a read of the generator's
    state, anything kept for its effect."""
    return any(b.sym.tags & {"random", "no_dce"} for b in _calls(bsym))


def _joint(body: Body, flat: list):
    """(forward statements, backward statements, forward outputs) of the body differentiated on fresh
    stand-ins for its inputs (the stand-ins are the scratch trace's args), every float output given a
    cotangent."""
    outer = context.current_trace()
    scratch = Trace(body.fn_name, names=outer.names)
    with tracing(scratch):
        scratch.args = [TensorProxy.like(x) for x in flat]
        out, backward = trace_vjp(lambda *xs: body.inline(*xs), scratch.args)
        n_forward = len(scratch.bound_symbols)
        backward(tuple(TensorProxy.like(o) if is_float_tensor(o) else None for o in out))
    return scratch, n_forward, out


def _saving_residuals(bsym):
    """The checkpoint call as reverse mode runs it in the forward (see the module docstring): bsym itself
    where nothing is to be saved."""
    body, operands, captured, policy, n_saved = bsym.args
    if policy is checkpoint_policies.nothing_saveable and not any(
            _draws(b) for b in body.trace.bound_symbols):
        return bsym
    flat = list(operands) + list(captured)
    scratch, n_forward, out = _joint(body, flat)
    forward, backward = scratch.bound_symbols[:n_forward], scratch.bound_symbols[n_forward:]
    made = {o.name: b for b in forward for o in b.proxy_outs()}
    read = {p.name: p for b in backward for p in b.proxy_args() if p.name in made}
    saved = [p for name, p in read.items() if _draws(made[name]) or policy(made[name])]
    if not saved:
        return bsym
    scratch.bound_symbols = forward
    scratch.output = tuple(out) + tuple(saved)
    saving = Body(f"checkpoint_{body.__name__}", body.fn_name, dce(scratch), len(operands), tuple(captured),
                  tree_flatten(scratch.output)[1])
    outputs = tuple(bsym.output) + tuple(TensorProxy.like(p) for p in saved)
    return prims.checkpoint.bind(saving, operands, captured, policy, n_saved + len(saved), output=outputs)


def _recomputing_backward(body: Body, n_saved: int, flat: list, wanted: list):
    """The backward's body: (inputs, saved values, the wanted outputs' cotangents) -> the float inputs'
    cotangents; the forward computed again but for the saved values (module docstring)."""
    n_out = len(body.outputs)
    float_in = [i for i, x in enumerate(flat) if is_float_tensor(x)]
    env, made = {}, {}

    def recompute_and_backward(inputs, saved, cts):
        tracer = context.current_tracer()
        out, backward = trace_vjp(lambda *xs: body.inline(*xs, env=env), tuple(inputs))
        made["forward"] = list(tracer.trace.bound_symbols)
        made["saved"] = {env[s.name].name: given for s, given in zip(body.outputs[n_out - n_saved:], saved)}
        full = [None] * n_out
        for i, c in zip(wanted, cts):
            full[i] = c
        grads = backward(tuple(full))
        return tuple(grads[i] if grads[i] is not None else zeros_like(inputs[i]) for i in float_in)

    recompute_and_backward.__name__ = f"{body.fn_name}_backward"
    return recompute_and_backward, made, float_in


def _taking_saved(backward: Body, made: dict) -> None:
    """backward's trace reading the saved values it was given where it computed them again: their
    statements (and every random draw of the forward it ran again) dropped."""
    saved, forward = made["saved"], {id(b) for b in made["forward"]}
    trc = backward.trace
    kept = []
    for bsym in trc.bound_symbols:
        outs = bsym.proxy_outs()
        if id(bsym) in forward and ((outs and all(o.name in saved for o in outs)) or _draws(bsym)):
            continue
        kept.append(renamed(bsym, saved) if any(p.name in saved for p in bsym.proxy_args()) else bsym)
    trc.bound_symbols = kept
    trc.output = tuple(saved.get(o.name, o) if isinstance(o, TensorProxy) else o for o in trc.output)
    backward.trace = dce(trc)


def _read_only(backward: Body, leaves: list) -> list:
    """The operands the backward's trace still reads, the others dropped from its inputs (a captured counter
    that the forward only updated, BatchNorm's num_batches_tracked, and that the caller's code writes after the
    forward, must not be kept for the backward)."""
    trc = backward.trace
    read = {p.name for b in trc.bound_symbols for p in b.proxy_args()}
    read |= {p.name for p in trc.output if isinstance(p, TensorProxy)}
    n = len(leaves)
    kept = [i for i, p in enumerate(trc.args[:n]) if p.name in read]
    trc.args = [trc.args[i] for i in kept] + list(trc.args[n:])
    backward.n_operands = len(kept)
    return [leaves[i] for i in kept]


@defvjp(prims.checkpoint.id, residuals=_saving_residuals)
def _checkpoint_vjp(call, g):
    body, operands, captured, policy, n_saved = call.args
    flat = list(operands) + list(captured)
    outs = list(call.out)
    wanted = [i for i, (o, c) in enumerate(zip(outs, g)) if c is not None and is_float_tensor(o)]
    fn, made, float_in = _recomputing_backward(body, n_saved, flat, wanted)
    saved = tuple(outs[len(outs) - n_saved:])
    operands_of_backward = (tuple(flat), saved, tuple(g[i] for i in wanted))
    backward = trace_body(fn, operands_of_backward, "checkpoint_backward")
    _taking_saved(backward, made)
    leaves = _read_only(backward, tree_flatten(operands_of_backward)[0])
    grads = prims.checkpoint(backward, tuple(leaves), backward.captured, checkpoint_policies.nothing_saveable, 0)
    by_position = dict(zip(float_in, grads))
    cts = [by_position.get(i) for i in range(len(flat))]
    return None, tuple(cts[:len(operands)]), tuple(cts[len(operands):]), None, None


@defjvp(prims.checkpoint.id)
def _checkpoint_jvp(call, tangents):
    """A checkpoint, with the same policy, of the body's tangent."""
    body, operands, captured, policy, n_saved = call.args
    flat = tuple(operands) + tuple(captured)
    t_flat = float_tangents(flat, per_leaf(tangents[1], operands) + per_leaf(tangents[2], captured))

    def jvp(primals, t_float):
        out, t_out = trace_jvp(lambda *xs: body.inline(*xs), primals, full_tangents(primals, t_float))
        return float_tangents(out, t_out)

    jvp.__name__ = f"{body.fn_name}_jvp"
    t_out = checkpoint(jvp, policy=policy)(flat, t_flat)
    return output_tangents(call.out, full_tangents(call.out, t_out))


@defbatch(prims.checkpoint.id)
def _checkpoint_batch(call, dims):
    """A checkpoint, with the same policy, of the batched body, every output batched at dim 0."""
    body, operands, captured, policy, n_saved = call.args
    in_axes = (per_leaf(dims[1], operands), per_leaf(dims[2], captured))

    def batched(ops, cap):
        return tuple(vmap(lambda o, c: body.inline(*o, *c), in_axes=in_axes)(ops, cap))

    batched.__name__ = f"{body.fn_name}_batched"
    out = checkpoint(batched, policy=policy)(tuple(operands), tuple(captured))
    return tuple(out), (0,) * len(out)


# checkpoint_name(x, name) is x: linear, its own transpose
deflinear(prims.checkpoint_name, lambda call, g: (g, None))


@defbatch(prims.checkpoint_name.id)
def _checkpoint_name_batch(call, dims):
    x, name = call.args
    return prims.checkpoint_name(x, name), dims[0]
