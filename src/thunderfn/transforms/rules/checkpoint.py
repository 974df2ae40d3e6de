"""Rules of the family of bodies run once: prims.checkpoint (tf.checkpoint, torch.utils.checkpoint),
prims.checkpoint_name, and prims.block (a repeated layer: blocks.py).

Reverse mode through a checkpoint keeps from the forward only the body's inputs and the values its policy
saves, and computes the rest again in the backward (transforms/rules/residuals.py builds both bodies):
- the forward (`_saving_residuals`, the rule's `residuals`): where the policy may save something, or the
  body draws random numbers, reverse mode runs in the call's place a checkpoint of the body as
  differentiated, returning besides its outputs the values the backward reads that the policy saves, and
  every random draw the backward reads;
- the backward (`_checkpoint_vjp`): a checkpoint, saving nothing, of a body that runs the forward again on
  the inputs it reads, takes the saved values from the forward instead of computing them, and runs the
  body's VJP.
Forward mode and vmap give a checkpoint, with the same policy, of the body's tangent or batched form.

A block is a checkpoint that saves everything, and whose body many calls share (every layer of a model that is
the same block): reverse mode builds its saving forward, and its backward for each set of wanted cotangents,
once per body, and every call runs them as blocks, so that executor_lower lowers each once too. Forward mode and
vmap treat it as the checkpoint it is.
"""
from __future__ import annotations

from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.checkpoint, checkpoint_name)
from thunderfn.core.bodies import Body
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten
from thunderfn.torch import checkpoint_policies
from thunderfn.torch.checkpoint import checkpoint
from thunderfn.transforms.rules.common import (
    float_tangents,
    full_tangents,
    is_float_tensor,
    output_tangents,
    per_leaf,
)
from thunderfn.transforms.rules.define import defbatch, defjvp, deflinear, defvjp, trace_jvp, vmap
from thunderfn.transforms.rules.residuals import backward_body, draws, saving_forward


def _saving_residuals(bsym):
    """The checkpoint call as reverse mode runs it in the forward (see the module docstring): bsym itself
    where nothing is to be saved."""
    body, operands, captured, policy, n_saved = bsym.args
    if policy is checkpoint_policies.nothing_saveable and not any(draws(b) for b in body.trace.bound_symbols):
        return bsym
    found = saving_forward(body, list(operands) + list(captured), lambda b: draws(b) or policy(b), "checkpoint")
    if found is None:
        return bsym
    saving, saved = found
    outputs = tuple(bsym.output) + tuple(TensorProxy.like(p) for p in saved)
    return prims.checkpoint.bind(saving, operands, captured, policy, n_saved + len(saved), output=outputs)


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
    saved = tuple(outs[len(outs) - n_saved:])
    operands_of_backward = (tuple(flat), saved, tuple(g[i] for i in wanted))
    backward, float_in = backward_body(body, n_saved, operands_of_backward, wanted, "checkpoint_backward")
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


# -- block: a checkpoint that saves everything, differentiated once for all its calls ------------------------
def _block_saving_residuals(bsym):
    body, operands, captured = bsym.args
    if bsym.kwargs.get("n_saved", 0):
        return bsym
    found = body.once("saving", lambda: saving_forward(body, list(operands) + list(captured), lambda b: True,
                                                          "forward"))
    if found is None:
        return bsym
    saving, saved = found
    outputs = tuple(bsym.output) + tuple(TensorProxy.like(p) for p in saved)
    return prims.block.bind(saving, operands, captured, n_saved=len(saved), output=outputs)


@defvjp(prims.block.id, residuals=_block_saving_residuals)
def _block_vjp(call, g):
    """A block of the body's backward (made once per body and wanted cotangents), reading what the forward
    saved."""
    body, operands, captured = call.args
    n_saved = call.kwargs.get("n_saved", 0)
    flat = list(operands) + list(captured)
    outs = list(call.out)
    wanted = [i for i, (o, c) in enumerate(zip(outs, g)) if c is not None and is_float_tensor(o)]
    operands_of_backward = (tuple(flat), tuple(outs[len(outs) - n_saved:]), tuple(g[i] for i in wanted))

    def make():
        backward, float_in = backward_body(body, n_saved, operands_of_backward, wanted, "block_backward")
        # the inputs the backward reads, by position among its operands' leaves (the others dropped once)
        kept = _read_only(backward, list(range(len(tree_flatten(operands_of_backward)[0]))))
        return backward, float_in, kept

    backward, float_in, kept = body.once(("backward", tuple(wanted)), make)
    if backward.captured:  # it reads a value of the call it was made for: that call's alone
        body.forget(("backward", tuple(wanted)))
        backward, float_in, kept = make()
    leaves = tree_flatten(operands_of_backward)[0]
    grads = prims.block(backward, tuple(leaves[i] for i in kept), backward.captured)
    by_position = dict(zip(float_in, grads))
    cts = [by_position.get(i) for i in range(len(flat))]
    return None, tuple(cts[:len(operands)]), tuple(cts[len(operands):])


def _as_checkpoint(call):
    """The block call as the checkpoint it is, for forward mode and vmap."""
    body, operands, captured = call.args
    return call._replace(symbol=prims.checkpoint, kwargs={}, args=(
        body, operands, captured, checkpoint_policies.everything_saveable, call.kwargs.get("n_saved", 0)))


@defjvp(prims.block.id)
def _block_jvp(call, tangents):
    return _checkpoint_jvp(_as_checkpoint(call), (None, tangents[1], tangents[2], None, None))


@defbatch(prims.block.id)
def _block_batch(call, dims):
    return _checkpoint_batch(_as_checkpoint(call), (None, dims[1], dims[2], None, None))


# checkpoint_name(x, name) is x: linear, its own transpose
deflinear(prims.checkpoint_name, lambda call, g: (g, None))


@defbatch(prims.checkpoint_name.id)
def _checkpoint_name_batch(call, dims):
    x, name = call.args
    return prims.checkpoint_name(x, name), dims[0]
