"""`check_grads`: JAX's check of a function's derivatives against finite differences.

Forward mode is checked directly: `tf.jvp(f, args, t)`'s tangent against the central
difference `(f(args + eps t) - f(args - eps t)) / 2 eps` along a random tangent `t`. Reverse
mode is checked through the identity that defines a VJP, `<vjp(ct), t> == <ct, jvp(t)>`,
with a random cotangent `ct` and the same central difference for `jvp(t)`, so a wrong
backward rule (a custom_vjp, an autograd.Function, a lowering's vjp) is caught whichever
input it gets wrong. `order=2` checks the derivatives of the derivatives the same way
(the JVP as a function of primals and tangents, the VJP as a function of the primals), as
`jax.test_util.check_grads` does.

Only floating-point leaves are perturbed; integer and boolean leaves (indices, masks) are
held fixed (closed over: forward mode takes floating primals only). Finite differences are computed in each input's own
dtype, so the step and the tolerances depend on it (`STEP` and `TOLERANCE` below).
"""
from __future__ import annotations

import functools

import optree
import torch

import thunderfn as tf
from thunderfn.core import pytree
from thunderfn.errors import ArgumentTypeError, ArgumentValueError

# The finite-difference step by dtype: large enough that rounding (machine epsilon / step)
# stays below the tolerance, small enough that the truncation error (step squared) does too.
STEP = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 1e-1, torch.bfloat16: 1e-1}
# (atol, rtol) by dtype, as JAX's default_gradient_tolerance, a little wider for half types
TOLERANCE = {torch.float64: (1e-5, 1e-5), torch.float32: (2e-3, 2e-3),
             torch.float16: (5e-2, 5e-2), torch.bfloat16: (1e-1, 1e-1)}


def check_grads(f, args, order: int = 1, modes=("fwd", "rev"), atol=None, rtol=None, eps=None, seed: int = 0):
    """Check f's derivatives at `args` (a tuple of positional arguments, each a pytree of tensors)
    against finite differences, in forward mode ("fwd"), reverse mode ("rev") or both, up to `order`.

    Raises AssertionError naming the mode (e.g. "VJP of JVP") and the mismatch. `atol`, `rtol` and
    `eps` override the defaults by dtype (`TOLERANCE`, `STEP`); `seed` picks the random directions.

        >>> import torch, thunderfn as tf
        >>> tf.testing.check_grads(torch.sin, (torch.randn(3, dtype=torch.float64),), order=2)
    """
    if not isinstance(args, (tuple, list)):
        raise ArgumentTypeError(f"check_grads: args must be a tuple of positional arguments, got {type(args).__name__}")
    if not (isinstance(order, int) and order >= 1):
        raise ArgumentValueError(f"check_grads: order must be a positive integer, got {order!r}")
    unknown = set(modes) - {"fwd", "rev"}
    if unknown or not modes:
        raise ArgumentValueError(f"check_grads: modes must name 'fwd' and/or 'rev', got {tuple(modes)!r}")
    options = _Options(atol, rtol, eps, torch.Generator().manual_seed(seed))
    g, floats = _of_float_leaves(f, tuple(args))
    _check(g, floats, order, tuple(modes), options, "")


def _of_float_leaves(f, args):
    """(g, floats): g(*floats) is f(*args) with args' floating-point leaves given, every other leaf (an index, a
    mask, a number) held fixed inside g, since forward mode, as torch.func's, takes floating primals only."""
    leaves, spec = optree.tree_flatten(args, none_is_leaf=True, namespace=pytree.NAMESPACE)
    where = [i for i, x in enumerate(leaves) if _is_float(x)]

    def g(*floats):
        merged = list(leaves)
        for i, x in zip(where, floats):
            merged[i] = x
        return f(*optree.tree_unflatten(spec, merged))

    return g, tuple(leaves[i] for i in where)


class _Options:
    def __init__(self, atol, rtol, eps, generator):
        self.atol, self.rtol, self.eps, self.generator = atol, rtol, eps, generator

    def step(self, dtype):
        return self.eps if self.eps is not None else STEP.get(dtype, 1e-3)

    def tolerance(self, dtype):
        atol, rtol = TOLERANCE.get(dtype, (2e-3, 2e-3))
        return (self.atol if self.atol is not None else atol), (self.rtol if self.rtol is not None else rtol)


def _check(f, args, order, modes, options, what):
    if "fwd" in modes:
        name = f"JVP of {what}" if what else "JVP"
        _check_jvp(f, args, options, name)
        if order > 1:
            _check(functools.partial(tf.jvp, f), (args, _random_like(args, options)), order - 1, modes, options, name)
    if "rev" in modes:
        name = f"VJP of {what}" if what else "VJP"
        _check_vjp(f, args, options, name)
        if order > 1:
            def f_vjp(*primals):  # the VJP as a function of the primals, the output as its own cotangent
                out, pullback = tf.vjp(f, *primals)
                return pullback(out)

            _check(f_vjp, args, order - 1, modes, options, name)


def _check_jvp(f, args, options, name):
    tangents = _random_like(args, options)
    _, got = tf.jvp(f, args, tangents)
    expected = _numerical_jvp(f, args, tangents, options)
    for g, e in zip(pytree.tree_leaves(got), expected):
        if e is not None:
            _assert_close(g, e, options, f"{name}: the tangent of f's output differs from finite differences")


def _check_vjp(f, args, options, name):
    out, pullback = tf.vjp(f, *args)
    cotangent = _random_like(out, options)
    tangents = _random_like(args, options)
    expected_tangent_out = _numerical_jvp(f, args, tangents, options)
    got = _inner(pytree.tree_leaves(tangents), _leaves_with_none(pullback(cotangent)))
    expected = _inner(expected_tangent_out, pytree.tree_leaves(cotangent))
    _assert_close(got, expected, options,
                  f"{name}: <vjp(ct), t> differs from <ct, jvp(t)> by finite differences (a wrong backward rule)",
                  dtype=_narrowest_float(args))


def _numerical_jvp(f, args, tangents, options):
    """The central difference of f along tangents: one entry per leaf of f's output, None for a
    leaf that is not a float tensor."""
    step = options.step(_narrowest_float(args))  # one step for all inputs: the least precise one's

    def shifted(sign):
        return pytree.tree_map(lambda a, t: a + sign * step * t if _is_float(a) else a, args, tangents)

    plus, minus = pytree.tree_leaves(f(*shifted(1))), pytree.tree_leaves(f(*shifted(-1)))
    return [(p - m) / (2 * step) if _is_float(m) else None for p, m in zip(plus, minus)]


def _leaves_with_none(tree):
    return optree.tree_leaves(tree, none_is_leaf=True, namespace=pytree.NAMESPACE)


def _random_like(tree, options):
    """Random directions for tree's float leaves; zeros (held fixed) for the other tensors."""
    def draw(x):
        if _is_float(x):
            return torch.randn(x.shape, generator=options.generator, dtype=torch.float64).to(x.dtype).to(x.device)
        return torch.zeros_like(x) if isinstance(x, torch.Tensor) else x

    return pytree.tree_map(draw, tree)


def _inner(xs, ys):
    """The sum of elementwise products of two lists of leaves over the float ones, in float64;
    None stands for zero."""
    total = torch.zeros((), dtype=torch.float64)
    for x, y in zip(xs, ys):
        if _is_float(x) and _is_float(y):
            total = total + (x.to(torch.float64) * y.to(torch.float64)).sum().cpu()
    return total


def _narrowest_float(tree):
    floats = [x.dtype for x in pytree.tree_leaves(tree) if _is_float(x)]
    return max(floats, key=lambda d: torch.finfo(d).eps) if floats else torch.float64


def _is_float(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype.is_floating_point


def _assert_close(got, expected, options, message, dtype=None):
    atol, rtol = options.tolerance(dtype if dtype is not None else expected.dtype)
    torch.testing.assert_close(got.to(expected.dtype) if got is not None else torch.zeros_like(expected), expected,
                               atol=atol, rtol=rtol, msg=lambda default: f"check_grads: {message}\n{default}")
