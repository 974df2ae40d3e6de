"""The control-flow primitives: cond and scan, whose bodies are core/bodies.py's Body objects.

`prims.cond(pred, true_body, false_body, operands, true_captured, false_captured, n_saved=0)` runs
one body on the operands (and the tensors it captured), by a one-element bool tensor (the last n_saved
outputs of both are values reverse mode saves for the backward, zeros from the branch not taken); `prims.scan(body,
init, xs, captured, length, reverse, n_saved=0)` runs the body `length` times, carrying its first
outputs from one step to the next, and stacks its other outputs along a new first dimension (the last
n_saved of them are the carries each step started from, made outputs by reverse mode);
`prims.while_loop(cond_body, body, init, cond_captured, body_captured)` runs the body on its carry
while cond_body says so, however many times that is; `prims.checkpoint(body, operands, captured, policy,
n_saved)` runs the body once, and marks it for reverse mode as a region to compute again in the
backward (all but the values `policy` saves; its last n_saved outputs are such values, made outputs by
reverse mode: transforms/rules/checkpoint.py). `prims.block(body, operands, captured, n_saved=0)` runs
the body once: one call of a repeated layer (blocks.py), whose body every call of the same layer shares, so
that reverse mode differentiates it and executor_lower lowers it once for them all (the last n_saved outputs
are the values its backward reads, made outputs by reverse mode). `prims.checkpoint_name(x, name)` is x,
named for a checkpoint policy. All take and return flat tuples of tensors:
torch/control_flow.py's tf.cond, tf.scan, tf.while_loop and tf.fori_loop, and torch/checkpoint.py's
tf.checkpoint, give them the user's pytrees. A body runs as generated code (its trace, lowered with
the jit's executors by transforms/executor_lower.py), never unrolled into the enclosing trace; a
checkpoint's body alone is inlined there, once reverse mode has decided what it computes again.

May import: core/, prims.py.
"""
from __future__ import annotations

import torch

from thunderfn.core import symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.rules import TAG_CHEAP
from thunderfn.prims import _out, check, make_prim


def _cond_meta(pred, true_body, false_body, operands, true_captured, false_captured, n_saved=0):
    check(isinstance(pred, TensorProxy) and pred.dtype is torch.bool and pred.numel() == 1,
          lambda: f"cond: the predicate must be a one-element bool tensor, got {pred!r}", TypeError)
    return tuple(_out(o) for o in true_body.outputs)


def _cond_impl(pred, true_body, false_body, operands, true_captured, false_captured, n_saved=0):
    if bool(pred):
        return true_body(*operands, *true_captured)
    return false_body(*operands, *false_captured)


make_prim("control_flow.cond", "cond", meta=_cond_meta, impl=_cond_impl)


def _scan_meta(body, init, xs, captured, length, reverse, n_saved=0):
    check(symbolic.is_int(length) and length >= 0, lambda: f"scan: length must be a non-negative int, got {length}")
    outs = body.outputs
    carry = tuple(_out(o) for o in outs[:len(init)])
    ys = tuple(_out(o, shape=(length, *o.shape)) for o in outs[len(init):])
    return carry + ys


def _scan_impl(body, init, xs, captured, length, reverse, n_saved=0):
    run, n_carry = body.runner(), len(init)
    carry, ys = tuple(init), []
    # each step's slices made up front, one unbind per leaf (indexing x[i] every step costs an op each)
    steps = list(zip(*(x.unbind(0) for x in xs))) if xs else [()] * length
    for i in (range(length - 1, -1, -1) if reverse else range(length)):
        out = run(*carry, *steps[i], *captured)
        carry = out[:n_carry]
        ys.append(out[n_carry:])
    if reverse:
        ys.reverse()
    if not ys:  # no step: empty stacks of the per-step shapes
        return tuple(carry) + tuple(torch.empty((0, *o.shape), dtype=o.dtype, device=o.device)
                                    for o in body.outputs[n_carry:])
    return tuple(carry) + tuple(torch.stack(y) for y in zip(*ys))


make_prim("control_flow.scan", "scan", meta=_scan_meta, impl=_scan_impl)


def _while_loop_meta(cond_body, body, init, cond_captured, body_captured):
    return tuple(_out(o) for o in body.outputs)


def _while_loop_impl(cond_body, body, init, cond_captured, body_captured):
    holds, step = cond_body.runner(), body.runner()
    carry = tuple(init)
    while bool(holds(*carry, *cond_captured)[0]):
        carry = step(*carry, *body_captured)
    return tuple(carry)


make_prim("control_flow.while_loop", "while_loop", meta=_while_loop_meta, impl=_while_loop_impl)


def _checkpoint_meta(body, operands, captured, policy, n_saved):
    check(isinstance(n_saved, int) and 0 <= n_saved <= len(body.outputs),
          lambda: f"checkpoint: n_saved must be an int between 0 and the body's outputs, got {n_saved}")
    return tuple(_out(o) for o in body.outputs)


def _checkpoint_impl(body, operands, captured, policy, n_saved):
    return body(*operands, *captured)


make_prim("control_flow.checkpoint", "checkpoint", meta=_checkpoint_meta, impl=_checkpoint_impl)


def _block_meta(body, operands, captured, n_saved=0):
    return tuple(_out(o) for o in body.outputs)


def _block_impl(body, operands, captured, n_saved=0):
    return body(*operands, *captured)


make_prim("control_flow.block", "block", meta=_block_meta, impl=_block_impl)


def _checkpoint_name_meta(x, name):
    check(isinstance(x, TensorProxy), lambda: f"checkpoint_name: expected a tensor, got {type(x).__name__}", TypeError)
    check(isinstance(name, str), lambda: f"checkpoint_name: the name must be a str, got {type(name).__name__}",
          TypeError)
    return _out(x)


def _checkpoint_name_impl(x, name):
    return x


make_prim("control_flow.checkpoint_name", "checkpoint_name", meta=_checkpoint_name_meta, impl=_checkpoint_name_impl,
          tags=(TAG_CHEAP,))
