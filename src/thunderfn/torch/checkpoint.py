"""Checkpointing, JAX's way and torch's: `tf.checkpoint(fn, policy=...)` (jax.checkpoint), `tf.checkpoint_name`,
and `torch.utils.checkpoint.checkpoint` inside traced code.

Inside traced code a checkpointed function is traced once into a body (core/bodies.py) that
`prims.checkpoint` calls. The forward runs it as if it were not there (lowering inlines it); reverse mode
saves for the backward only its inputs and what the policy (torch/checkpoint_policies.py) saves, and the
backward computes the rest again from them (transforms/rules/checkpoint.py). Values drawn at random are
saved whatever the policy: computed again they would be new draws.

torch.utils.checkpoint.checkpoint is honoured as a region saving nothing (eager's recomputation): the
statements the function records become one prims.checkpoint call. Code that holds torch's function from
before thunderfn was imported (Hugging Face models do) reaches the same region through torch's own
steps: with use_reentrant=False, the generator torch runs around the function; with use_reentrant=True,
its autograd.Function (transforms/user_functions.py makes that a tf.checkpoint of the function).
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Callable

import torch
import torch.utils.checkpoint as torch_checkpoint

from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.checkpoint)
from thunderfn.core import context
from thunderfn.core.bodies import body_of_region, trace_body
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten
from thunderfn.errors import ArgumentTypeError, ArgumentValueError
from thunderfn.torch import checkpoint_policies
from thunderfn.torch.base import stand_in_front

__all__ = ["checkpoint", "checkpoint_name"]


def checkpoint(fn: Callable | None = None, *, policy: Callable | None = None, prevent_cse: bool = True,
               static_argnums: tuple = ()):
    """jax.checkpoint (jax.remat): fn, whose intermediate values reverse mode computes again in the backward
    instead of keeping them from the forward, but for those `policy` saves (tf.checkpoint_policies; by
    default nothing_saveable: only fn's inputs are kept). The values are the same; the memory held between
    forward and backward is smaller, at the price of running fn's forward twice.

    Arguments that are not tensors are passed through as Python values (what JAX's static_argnums is for;
    `static_argnums` and `prevent_cse` are accepted for JAX's signature: the recomputation is never merged
    with the forward). Usable as a decorator, with or without arguments. Outside traced code, fn runs under
    torch.utils.checkpoint when torch.autograd differentiates the call.

        >>> import torch, thunderfn as tf
        >>> layer = tf.checkpoint(lambda x, w: torch.tanh(x @ w))
        >>> x, w = torch.randn(4, 3), torch.randn(3, 3)
        >>> g = tf.grad(lambda w: layer(x, w).sum())(w)
        >>> torch.testing.assert_close(g, tf.grad(lambda w: torch.tanh(x @ w).sum())(w))
    """
    if fn is None:
        return functools.partial(checkpoint, policy=policy, prevent_cse=prevent_cse, static_argnums=static_argnums)
    if not callable(fn):
        raise ArgumentTypeError(f"checkpoint: expected a function, got {type(fn).__name__}")
    policy = checkpoint_policies.nothing_saveable if policy is None else policy
    if not callable(policy):
        raise ArgumentTypeError(f"checkpoint: policy must be a callable (see tf.checkpoint_policies), got "
                                f"{type(policy).__name__}")

    @functools.wraps(fn)
    def checkpointed(*args, **kwargs):
        if context.current_trace() is None:
            return _eagerly(fn, policy, args, kwargs)
        if policy is checkpoint_policies.everything_saveable:
            return fn(*args, **kwargs)
        return _traced(fn, policy, args, kwargs)

    return checkpointed


def _traced(fn, policy, args, kwargs):
    leaves, tree = tree_flatten((args, kwargs))
    is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
    tracer = context.current_tracer()
    operands = tuple(x if isinstance(x, TensorProxy) else tracer.constant(x) for x, t in zip(leaves, is_tensor) if t)

    def region(*tensors):
        it = iter(tensors)
        a, k = tree_unflatten(tree, [next(it) if t else x for x, t in zip(leaves, is_tensor)])
        return fn(*a, **k)

    region.__name__ = getattr(fn, "__name__", type(fn).__name__)
    body = trace_body(region, operands, "checkpoint")
    out = prims.checkpoint(body, operands, body.captured, policy, 0)
    return tree_unflatten(body.out_tree, list(out))


# torch ops whose outputs dots_saveable saves when the function runs eagerly (torch's selective checkpointing)
_DOTS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
                   torch.ops.aten.baddbmm.default, torch.ops.aten.convolution.default})


def _eagerly(fn, policy, args, kwargs):
    needs_grad = torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                                 for x in tree_leaves((args, kwargs)))
    if not needs_grad or policy is checkpoint_policies.everything_saveable:
        return fn(*args, **kwargs)
    context_fn = torch_checkpoint.noop_context_fn
    if policy in (checkpoint_policies.dots_saveable, checkpoint_policies.dots_with_no_batch_dims_saveable):
        def save_dots(ctx, op, *a, **k):
            return (torch_checkpoint.CheckpointPolicy.MUST_SAVE if op in _DOTS
                    else torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE)

        context_fn = functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, save_dots)
    return torch_checkpoint.checkpoint(functools.partial(fn, **kwargs), *args, use_reentrant=False,
                                       context_fn=context_fn)


def checkpoint_name(x, name: str):
    """jax.ad_checkpoint.checkpoint_name: x (a tensor or a pytree of them) itself, named so that a checkpoint
    policy can save it (tf.checkpoint_policies.save_only_these_names).

        >>> import torch, thunderfn as tf
        >>> tf.checkpoint_name(torch.ones(2), "hidden")
        tensor([1., 1.])
    """
    if not isinstance(name, str):
        raise ArgumentTypeError(f"checkpoint_name: the name must be a str, got {type(name).__name__}")
    if context.current_trace() is None:
        return x
    return tree_map(lambda t: prims.checkpoint_name(t, name) if isinstance(t, TensorProxy) else t, x)


# -- torch.utils.checkpoint inside traced code ---------------------------------------------------------------
def _tracing_user_code(*trees) -> bool:
    tracer = context.current_tracer()
    return tracer is not None and (any(isinstance(x, TensorProxy) for x in tree_leaves(trees)) or (
        tracer.symbol_depth == 0 and torch._C._is_torch_function_enabled()))


def _warn_context_fn() -> None:
    warnings.warn("torch.utils.checkpoint: thunderfn computes the whole checkpointed function again in the "
                  "backward and does not run context_fn (selective checkpointing); for a policy, use "
                  "tf.checkpoint(fn, policy=...)", stacklevel=4)


@contextlib.contextmanager
def _region(fn):
    """The statements recorded inside the block become one prims.checkpoint call saving nothing."""
    tracer = context.current_tracer()
    with tracer.scope() as recorded:
        yield
    if not any(b.proxy_outs() for b in recorded):
        for bsym in recorded:
            tracer.emit(bsym)
        return
    body = body_of_region(recorded, getattr(fn, "__name__", type(fn).__name__), "checkpoint")
    tracer.emit(prims.checkpoint.bind(body, (), body.captured, checkpoint_policies.nothing_saveable, 0,
                                      output=tuple(body.outputs)))


def checkpoint_region(fn, *args, **kwargs):
    """fn(*args, **kwargs), traced into a checkpoint region saving nothing (torch.utils.checkpoint's meaning)."""
    with _region(fn):
        return fn(*args, **kwargs)


_OPTIONS = ("preserve_rng_state", "determinism_check", "debug", "early_stop")


def _torch_checkpoint(original, function, *args, use_reentrant=None, context_fn=torch_checkpoint.noop_context_fn,
                      **kwargs):
    """torch.utils.checkpoint.checkpoint, called as torch.utils.checkpoint.checkpoint(...): traced, a region
    (without torch's wrapper, whose first call imports torch._dynamo: seconds)."""
    if not _tracing_user_code(args, kwargs):
        return original(function, *args, use_reentrant=use_reentrant, context_fn=context_fn, **kwargs)
    for option in _OPTIONS:
        kwargs.pop(option, None)
    if use_reentrant and (kwargs or context_fn is not torch_checkpoint.noop_context_fn):
        raise ArgumentValueError("Unexpected keyword arguments: " + ",".join(kwargs) if kwargs else
                                 "Passing `context_fn` or `debug` is only supported when use_reentrant=False.")
    if context_fn is not torch_checkpoint.noop_context_fn:
        _warn_context_fn()
    return checkpoint_region(function, *args, **kwargs)


def _checkpoint_region(original, fn, *rest, **kwargs):
    """torch's non-reentrant checkpoint runs this generator's first step, then fn, then its second step
    (the way in for code holding torch's checkpoint from before thunderfn was imported): traced, the steps
    open and close a region."""
    if not _tracing_user_code(rest, kwargs):
        yield from original(fn, *rest, **kwargs)
        return
    if len(rest) > 1 and rest[1] is not torch_checkpoint.noop_context_fn:
        _warn_context_fn()
    with _region(fn):
        yield


stand_in_front(torch_checkpoint, "checkpoint", _torch_checkpoint)
stand_in_front(torch_checkpoint, "_checkpoint_without_reentrant_generator", _checkpoint_region)
