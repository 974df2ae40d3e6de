"""The batching rule table that tf.vmap reads (transforms/vmap.py), and its rule type.

Here, below both of the layers that write it: the transforms, which hold the prims' and
torch-language symbols' rules (transforms/batching_rules.py, which re-exports all of this), and
the executors, whose operators bring their own (`register_operator(..., batch_rule=)`,
executors/base.py). Neither of those layers imports the other, as core/lowering.py holds the
lowering rule types for the same reason. Imports only errors.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from thunderfn.errors import ArgumentTypeError


@dataclasses.dataclass(frozen=True)
class BatchRule:
    """How tf.vmap batches one symbol: `batch(args, dims, kwargs, out)` is `(batched output, its
    batch dim)` (a tuple of each for a multi-output symbol), with the conventions of
    transforms/batching_rules.py; or NotImplemented for a call the rule does not handle, whose
    decomposition is batched instead."""
    batch: Callable


batching_rules: dict = {}  # symbol id -> BatchRule; entered only through register_batch


def register_batch(symbol_id, rule: BatchRule) -> None:
    """The one way a rule enters batching_rules: @defbatch, the elementwise prims' rules and an
    executor's register_operator(batch_rule=) wrap it."""
    if not isinstance(rule, BatchRule):
        raise ArgumentTypeError(f"the batching rule for {symbol_id} must be a BatchRule, got {type(rule).__name__}")
    batching_rules[symbol_id] = rule


def unregister_batch(symbol_id) -> None:
    """Drop symbol_id's rule, if it has one."""
    batching_rules.pop(symbol_id, None)
