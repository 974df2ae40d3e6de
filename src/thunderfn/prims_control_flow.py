"""The control-flow primitives: cond and scan, whose bodies are core/bodies.py's Body objects.

`prims.cond(pred, true_body, false_body, operands, true_captured, false_captured)` runs one body
on the operands (and the tensors it captured), by a one-element bool tensor; `prims.scan(body,
init, xs, captured, length, reverse)` runs the body `length` times, carrying its first outputs
from one step to the next, and stacks its other outputs along a new first dimension;
`prims.while_loop(cond_body, body, init, cond_captured, body_captured)` runs the body on its carry
while cond_body says so, however many times that is. All take and return flat tuples of tensors:
torch/control_flow.py's tf.cond, tf.scan, tf.while_loop and tf.fori_loop give them the user's
pytrees. A body runs as generated code (its trace, lowered with the jit's executors by
transforms/executor_lower.py), never unrolled into the enclosing trace.

May import: core/, prims.py.
"""
from __future__ import annotations

import torch

from thunderfn.core import symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.prims import _out, check, make_prim


def _cond_meta(pred, true_body, false_body, operands, true_captured, false_captured):
    check(isinstance(pred, TensorProxy) and pred.dtype is torch.bool and pred.numel() == 1,
          lambda: f"cond: the predicate must be a one-element bool tensor, got {pred!r}", TypeError)
    return tuple(_out(o) for o in true_body.outputs)


def _cond_impl(pred, true_body, false_body, operands, true_captured, false_captured):
    if bool(pred):
        return true_body(*operands, *true_captured)
    return false_body(*operands, *false_captured)


make_prim("control_flow.cond", "cond", meta=_cond_meta, impl=_cond_impl)


def _scan_meta(body, init, xs, captured, length, reverse):
    check(symbolic.is_int(length) and length >= 0, lambda: f"scan: length must be a non-negative int, got {length}")
    outs = body.outputs
    carry = tuple(_out(o) for o in outs[:len(init)])
    ys = tuple(_out(o, shape=(length, *o.shape)) for o in outs[len(init):])
    return carry + ys


def _scan_impl(body, init, xs, captured, length, reverse):
    carry, ys = tuple(init), []
    for i in (range(length - 1, -1, -1) if reverse else range(length)):
        out = body(*carry, *(x[i] for x in xs), *captured)
        carry, y = out[:len(init)], out[len(init):]
        ys.append(y)
    if reverse:
        ys.reverse()
    n_ys = len(body.outputs) - len(init)
    if not ys:  # no step: empty stacks of the per-step shapes
        return carry + tuple(torch.empty((0, *o.shape), dtype=o.dtype, device=o.device)
                             for o in body.outputs[len(init):])
    return carry + tuple(torch.stack([y[j] for y in ys]) for j in range(n_ys))


make_prim("control_flow.scan", "scan", meta=_scan_meta, impl=_scan_impl)


def _while_loop_meta(cond_body, body, init, cond_captured, body_captured):
    return tuple(_out(o) for o in body.outputs)


def _while_loop_impl(cond_body, body, init, cond_captured, body_captured):
    carry = tuple(init)
    while bool(cond_body(*carry, *cond_captured)[0]):
        carry = body(*carry, *body_captured)
    return carry


make_prim("control_flow.while_loop", "while_loop", meta=_while_loop_meta, impl=_while_loop_impl)
