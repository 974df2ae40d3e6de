"""Batching rules for torch-language symbols, where one rule does better than batching the
symbol's decomposition prim by prim (transforms/batching_rules.py has the prims' rules, in the
same table). A rule here may return NotImplemented for a call it does not handle; the driver
then batches the decomposition instead.

- scaled_dot_product_attention: the vmapped batch is folded into the call's own leading batch
  dimension, so the batched program is one attention call (which the sdpa executor's fused
  kernels can claim) rather than its math decomposition.
- check_value (eager's check on values, made at run time): the condition holds for the batch
  when it holds for every example, so one check of their conjunction.
- tf.debug.print and tf.debug.breakpoint: one statement for the batch, given each batched value
  with its batch dimension first, as jax.debug.print prints under vmap.
- indexing with a boolean mask, masked_select and torch.where(condition) of a batched mask: each
  example would have its own number of positions (a data-dependent size), refused in torch.func's
  words; with the mask the same for every example they batch through their decompositions.
"""
from __future__ import annotations

import inspect

import torch

from thunderfn import torch as ltorch
from thunderfn.core import context
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.statements import debug_breakpoint, debug_print, emit_runtime_check, runtime_check
from thunderfn.errors import BatchingError
from thunderfn.transforms.batching_rules import DYNAMIC_SHAPE_REFUSAL, defbatch, move_to_front

_SDPA_PARAMETERS = inspect.signature(ltorch.scaled_dot_product_attention.fn).parameters


@defbatch(ltorch.scaled_dot_product_attention.id)
def _scaled_dot_product_attention(args, dims, kwargs, out):
    call = dict(zip(_SDPA_PARAMETERS, args), **kwargs)
    query, key, value = call.pop("query"), call.pop("key"), call.pop("value")
    q_dim, k_dim, v_dim = dims[:3]
    mask = call.get("attn_mask")
    # folded into the first of the call's own batch dims: q, k and v batched alike, per example at least
    # 3-d with equal leading dims, and nothing that would need the batch too (a batched or full-rank mask,
    # dropout's random draws)
    if (None in (q_dim, k_dim, v_dim) or any(d is not None for d in dims[3:]) or call.get("dropout_p", 0.0) != 0.0
            or (mask is not None and mask.ndim > 2)):
        return NotImplemented
    query, key, value = (move_to_front(t, d) for t, d in ((query, q_dim), (key, k_dim), (value, v_dim)))
    if query.ndim < 4 or not (query.shape[1:-2] == key.shape[1:-2] == value.shape[1:-2]):
        return NotImplemented
    n, lead = query.shape[0], query.shape[1]

    def folded(t):
        return ltorch.reshape(t, (n * lead, *t.shape[2:]))

    result = ltorch.scaled_dot_product_attention(folded(query), folded(key), folded(value), **call)
    return ltorch.reshape(result, (n, lead, *result.shape[1:])), 0


@defbatch(runtime_check.id)
def _check_value(args, dims, kwargs, out):
    condition, error, message = args
    emit_runtime_check(ltorch.all(condition), error, message)
    return None, None


def _batched_statement(statement):
    def batch(args, dims, kwargs, out):
        batched = [move_to_front(a, d) if d is not None else a for a, d in zip(args, dims)]
        context.current_tracer().emit(statement.bind(*batched, output=None))
        return None, None

    batch.__name__ = f"_{statement.name}"
    return batch


for _statement in (debug_print, debug_breakpoint):
    defbatch(_statement.id)(_batched_statement(_statement))


def _is_mask(x) -> bool:
    return isinstance(x, TensorProxy) and x.dtype in (torch.bool, torch.uint8)


@defbatch(ltorch.getitem.id)
def _getitem(args, dims, kwargs, out):
    key, key_dims = args[1], dims[1]
    keys, key_dims = (key, key_dims) if isinstance(key, (tuple, list)) else ((key,), (key_dims,))
    if any(_is_mask(k) and d is not None for k, d in zip(keys, key_dims or (None,) * len(keys))):
        raise BatchingError("vmap: We do not support batching operators that can support dynamic shape. Attempting to "
                            "batch over indexing with a boolean mask.")
    return NotImplemented


@defbatch(ltorch.masked_select.id)
def _masked_select(args, dims, kwargs, out):
    if dims[1] is not None:
        raise BatchingError("vmap: Attempted to vmap over `mask` in torch.masked_select(self, mask) We cannot support "
                            "this because for each batch this would return a differently shaped Tensor. Please file an "
                            "issue at https://github.com/pytorch/pytorch/issues if you need this feature.")
    return NotImplemented


@defbatch(ltorch.where.id)
def _where(args, dims, kwargs, out):
    if len(args) == 1 and not kwargs:  # torch.where(condition): its nonzero positions
        raise BatchingError(DYNAMIC_SHAPE_REFUSAL.format(op="where"))
    return NotImplemented
