"""Gradient checks against torch.autograd, shared by the rule tests (tests/test_vjp_*.py)."""
from __future__ import annotations

import torch

import thunderfn as tf


def torch_grads(fn, args, create_graph: bool = False):
    """(leaves, gradients of fn's scalar output w.r.t. them) by torch.autograd; None where unused."""
    leaves = [a.detach().clone().requires_grad_(True) for a in args]
    return leaves, torch.autograd.grad(fn(*leaves), leaves, create_graph=create_graph, allow_unused=True)


def assert_grads_close(got, expected) -> None:
    """thunderfn gives zeros where torch gives None (an unused input)."""
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, torch.zeros_like(g) if e is None else e, equal_nan=True)


def assert_second_derivative_matches_torch(fn, args, reference=None, seed: int = 7) -> None:
    """A Hessian-vector product, the gradient of <grad fn, v> for a fixed v, by thunderfn (grad of grad)
    and by torch.autograd (create_graph=True) of `reference` (fn itself unless torch needs it written
    another way)."""
    argnums = tuple(range(len(args)))
    vs = [torch.randn(a.shape, generator=torch.Generator().manual_seed(seed), dtype=a.dtype) for a in args]
    first = tf.grad(fn, argnums=argnums)

    def directional(*a):
        return sum((g * v).sum() for g, v in zip(first(*a), vs))

    got = tf.grad(directional, argnums=argnums)(*args)
    leaves, grads = torch_grads(reference or fn, args, create_graph=True)
    directional_torch = sum((g * v).sum() for g, v in zip(grads, vs) if g is not None)
    expected = (torch.autograd.grad(directional_torch, leaves, allow_unused=True)
                if isinstance(directional_torch, torch.Tensor) and directional_torch.requires_grad
                else [None] * len(leaves))  # the gradient does not depend on the inputs
    assert_grads_close(got, expected)


def assert_low_precision_as_accurate_as_torch(fn, args, dtype) -> None:
    """Against float64 `args`, thunderfn's gradient with the args cast to `dtype` has the args' dtypes and
    errs no more than about twice torch's own gradient in that dtype."""
    low = tuple(a.to(dtype) for a in args)
    got = tf.grad(fn, argnums=tuple(range(len(low))))(*low)
    _, torchs = torch_grads(fn, low)
    _, exact = torch_grads(fn, args)
    for g, t, e, a in zip(got, torchs, exact, low):
        assert g.dtype == a.dtype
        assert (g.double() - e).abs().max() <= 2 * (t.double() - e).abs().max() + 1e-6 * e.abs().max()

