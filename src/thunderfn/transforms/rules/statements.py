"""Rules of the statements family: how vmap batches the statements traced code may hold
(core/statements.py). A value check holds for the batch when it holds for every example: one
check of their conjunction. tf.debug.print and tf.debug.breakpoint are one statement for the
batch, given each batched value with its batch dimension first, as jax.debug.print prints under
vmap. Statements carry no derivative (they have printers, which both modes pass over)."""
from __future__ import annotations

from thunderfn import torch as ltorch
from thunderfn.core import context
from thunderfn.core.statements import debug_breakpoint, debug_print, emit_runtime_check, runtime_check
from thunderfn.transforms.rules.common import move_to_front
from thunderfn.transforms.rules.define import defbatch


@defbatch(runtime_check.id)
def _check_value(call, dims):
    args = call.args
    condition, error, message = args
    emit_runtime_check(ltorch.all(condition), error, message)
    return None, None


def _batched_statement(statement):
    def batch(call, dims):
        args = call.args
        batched = [move_to_front(a, d) if d is not None else a for a, d in zip(args, dims)]
        context.current_tracer().emit(statement.bind(*batched, output=None))
        return None, None

    batch.__name__ = f"_{statement.name}"
    return batch


for _statement in (debug_print, debug_breakpoint):
    defbatch(_statement.id)(_batched_statement(_statement))
