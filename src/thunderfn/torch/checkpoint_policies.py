"""Checkpoint policies, JAX's `jax.checkpoint_policies`: which values a `tf.checkpoint` saves for the
backward rather than compute again there.

A policy is a callable `policy(bsym) -> bool`, given each bound symbol of the checkpointed function as
reverse mode runs it (torch-language symbols, or the primitives they decompose into): True saves the
outputs of that call which the backward reads, False computes them again in the backward from the
function's inputs and the values saved. Whatever the policy, values drawn at random are saved (so that
the backward sees the draws the forward made), and a value the backward does not read is never saved.

    >>> import torch, thunderfn as tf
    >>> policy = tf.checkpoint_policies.save_only_these_names("hidden")
    >>> def layer(x, w):
    ...     h = tf.checkpoint_name(torch.tanh(x @ w), "hidden")
    ...     return torch.sin(h) @ w
    >>> x, w = torch.randn(4, 3), torch.randn(3, 3)
    >>> g = tf.grad(lambda x, w: tf.checkpoint(layer, policy=policy)(x, w).sum(), argnums=1)(x, w)
    >>> torch.testing.assert_close(g, tf.grad(lambda x, w: layer(x, w).sum(), argnums=1)(x, w))

May import: prims, the rest of the torch language.
"""
from __future__ import annotations

from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.checkpoint_name)
from thunderfn.torch.conv_pool import convolutions, transposed_convolutions

__all__ = ["checkpoint_dots", "dots_saveable", "dots_with_no_batch_dims_saveable", "everything_saveable",
           "nothing_saveable", "save_any_names_but_these", "save_from_both_policies", "save_only_these_names"]


class Policy:
    """A named policy: `saves(bsym) -> bool`, printed by its name in traces and reprs."""

    def __init__(self, name: str, saves):
        self.__name__ = self.__qualname__ = name
        self._saves = saves

    def __call__(self, bsym) -> bool:
        return bool(self._saves(bsym))

    def __repr__(self) -> str:
        return f"checkpoint_policies.{self.__name__}"


def _calls(bsym):
    yield bsym
    for sub in bsym.subsymbols:
        yield from _calls(sub)


_CONVOLUTIONS = frozenset((*convolutions.values(), *transposed_convolutions.values()))


def _is_dot(bsym) -> bool:
    """A matrix product, or a call made of one (linear, einsum, attention): JAX's dot_general."""
    return any(b.sym.id is prims.PrimIDs.MATMUL or b.sym in _CONVOLUTIONS for b in _calls(bsym))


def _no_batch_dims(bsym) -> bool:
    return all(a.ndim <= 2 for a in bsym.proxy_args()) and _is_dot(bsym)


def _name_of(bsym) -> str | None:
    return bsym.args[1] if bsym.sym.id == prims.checkpoint_name.id else None


everything_saveable = Policy("everything_saveable", lambda bsym: True)
nothing_saveable = Policy("nothing_saveable", lambda bsym: False)
dots_saveable = Policy("dots_saveable", _is_dot)
checkpoint_dots = dots_saveable  # (JAX's older name)
dots_with_no_batch_dims_saveable = Policy("dots_with_no_batch_dims_saveable", _no_batch_dims)


def save_only_these_names(*names: str) -> Policy:
    """Save the values named by `tf.checkpoint_name(x, name)` with one of these names, nothing else."""
    wanted = frozenset(names)
    return Policy("save_only_these_names", lambda bsym: _name_of(bsym) in wanted)


def save_any_names_but_these(*names: str) -> Policy:
    """Save every value named by `tf.checkpoint_name`, except those with one of these names."""
    unwanted = frozenset(names)
    return Policy("save_any_names_but_these",
                  lambda bsym: _name_of(bsym) is not None and _name_of(bsym) not in unwanted)


def save_from_both_policies(first, second) -> Policy:
    """Save what either policy saves."""
    return Policy("save_from_both_policies", lambda bsym: first(bsym) or second(bsym))
