"""Structured control flow, JAX's way: `tf.cond`, `tf.scan`, `tf.while_loop` and `tf.fori_loop`, with
pytrees in and out.

Inside traced code each body is traced once (core/bodies.py) and called by a control-flow primitive
(prims_control_flow.py), so a branch on a tensor's value, or a loop of a thousand steps, is one
statement of the trace rather than a `ConcretizationError` or a thousand unrolled copies. Called
on real tensors outside any trace, each runs as the Python it stands for (an `if`, a `for` loop).

Both branches of a cond, and a loop body's carry in and out, must agree in structure, shape and
dtype: a mismatch is an ArgumentTypeError naming the function and the leaf.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch._higher_order_ops as higher_order_ops

from thunderfn import (
    prims,
    prims_control_flow,  # noqa: F401  (makes prims.cond and prims.scan)
)
from thunderfn.core import context
from thunderfn.core.bodies import Body, trace_body
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_flatten_with_path, tree_map, tree_unflatten
from thunderfn.errors import ArgumentTypeError, ArgumentValueError
from thunderfn.torch.base import stand_in_front

__all__ = ["cond", "fori_loop", "scan", "while_loop"]


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _leaf_path(path) -> str:
    return "".join(f"[{k!r}]" for k in path) or "the output"


def _check_agree(what: str, fn_name: str, other_name: str, got, expected) -> None:
    """got and expected (pytrees of proxies) agree in structure, shapes and dtypes, else a named error."""
    got_paths, got_leaves, got_tree = tree_flatten_with_path(got)
    _, expected_leaves, expected_tree = tree_flatten_with_path(expected)
    if got_tree != expected_tree:
        raise ArgumentTypeError(f"{what}: '{fn_name}' returns {got_tree}, where {other_name} is {expected_tree}: "
                                f"they must have the same structure")
    for path, g, e in zip(got_paths, got_leaves, expected_leaves):
        if tuple(g.shape) != tuple(e.shape) or g.dtype != e.dtype:
            raise ArgumentTypeError(f"{what}: '{fn_name}' returns {_leaf_path(path)} of shape {tuple(g.shape)} and "
                                    f"dtype {g.dtype}, where {other_name} has shape {tuple(e.shape)} and dtype "
                                    f"{e.dtype}: they must agree")


def _structure(body: Body):
    return tree_unflatten(body.out_tree, body.outputs)


def cond(pred, true_fn: Callable, false_fn: Callable, *operands):
    """`true_fn(*operands)` if pred else `false_fn(*operands)`, as jax.lax.cond: inside traced code
    both branches are traced once and the branch runs by the predicate's value when the compiled
    function runs. `pred` is a Python bool or a one-element bool tensor; both branches return the
    same structure of tensors with the same shapes and dtypes.

        >>> import torch, thunderfn as tf
        >>> f = tf.jit(lambda x: tf.cond(x.sum() > 0, lambda x: x * 2, lambda x: -x, x))
        >>> f(torch.tensor([1.0, 2.0])), f(torch.tensor([-1.0, -2.0]))
        (tensor([2., 4.]), tensor([1., 2.]))
    """
    if isinstance(pred, bool) or context.current_trace() is None or not isinstance(pred, TensorProxy):
        return true_fn(*operands) if _concrete(pred) else false_fn(*operands)
    if pred.dtype is not torch.bool or pred.numel() != 1:
        raise ArgumentTypeError(f"cond: the predicate must be a Python bool or a one-element bool tensor, got a "
                                f"tensor of dtype {pred.dtype} and shape {tuple(pred.shape)}")
    pred = prims.reshape(pred, ()) if pred.ndim else pred
    operands = tree_map(lambda x: _as_proxy(x) if isinstance(x, torch.Tensor) else x, operands)
    true_body = trace_body(true_fn, operands, "cond_true")
    false_body = trace_body(false_fn, operands, "cond_false")
    _check_agree("cond", false_body.fn_name, f"true_fn '{true_body.fn_name}'s", _structure(false_body),
                 _structure(true_body))
    leaves, _ = tree_flatten(operands)
    out = prims.cond(pred, true_body, false_body, tuple(leaves), true_body.captured, false_body.captured)
    return tree_unflatten(true_body.out_tree, list(out))


def _concrete(pred) -> bool:
    if isinstance(pred, torch.Tensor):
        if pred.numel() != 1:
            raise ArgumentTypeError(f"cond: the predicate must be a Python bool or a one-element bool tensor, got a "
                                    f"tensor of shape {tuple(pred.shape)}")
        return bool(pred.item())
    return bool(pred)


def scan(f: Callable, init, xs=None, length: int | None = None, reverse: bool = False):
    """jax.lax.scan: `f(carry, x) -> (carry, y)` over the leading dimension of xs (a pytree of tensors,
    or None with `length` steps), returning the final carry and the ys stacked along a new leading
    dimension. Inside traced code f is traced once and the loop runs as compiled code, whatever its
    length; the carry f returns has init's structure, shapes and dtypes. `reverse` scans from the end
    (the ys still stacked in xs's order).

        >>> import torch, thunderfn as tf
        >>> def cumulative(total, x):
        ...     return total + x, total + x
        >>> tf.jit(lambda xs: tf.scan(cumulative, torch.zeros(2), xs))(torch.ones(3, 2))
        (tensor([3., 3.]), tensor([[1., 1.],
                [2., 2.],
                [3., 3.]]))
    """
    x_leaves, x_tree = tree_flatten(xs)
    steps = _length(x_leaves, length)
    if context.current_trace() is None:
        return _scan_eagerly(f, init, xs, x_leaves, x_tree, steps, reverse)
    init_leaves, init_tree = tree_flatten(init)
    init = tree_unflatten(init_tree, [_as_proxy(x) for x in init_leaves])
    slices = tree_unflatten(x_tree, [TensorProxy.like(x, shape=tuple(x.shape[1:])) for x in x_leaves])
    body = trace_body(lambda carry, x: _pair(f, f(carry, x)), (init, slices), "scan_body")
    carry_out, _ = tree_unflatten(body.out_tree, body.outputs)
    _check_agree("scan", body.fn_name, "init", carry_out, init)
    carry_tree = tree_flatten(init)[1]
    out = prims.scan(body, tuple(tree_flatten(init)[0]), tuple(_as_proxy(x) for x in x_leaves), body.captured, steps,
                     reverse)
    n_carry = len(tree_flatten(init)[0])
    y_tree = tree_flatten(tree_unflatten(body.out_tree, body.outputs)[1])[1]
    return tree_unflatten(carry_tree, list(out[:n_carry])), tree_unflatten(y_tree, list(out[n_carry:]))


def _as_proxy(x):
    return x if isinstance(x, TensorProxy) else context.current_tracer().constant(x)


def _pair(f, result):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ArgumentTypeError(f"scan: '{_name(f)}' must return a pair (carry, y), got {type(result).__name__}")
    return result


def _length(x_leaves, length) -> int:
    lengths = {x.shape[0] if x.ndim else None for x in x_leaves}
    if None in lengths:
        raise ArgumentValueError("scan: every leaf of xs needs a leading dimension to scan over; got a 0-dim tensor")
    if len(lengths) > 1:
        raise ArgumentValueError(f"scan: the leaves of xs have different leading dimensions {sorted(lengths)}")
    if length is not None and lengths and length not in lengths:
        raise ArgumentValueError(f"scan: length={length} but xs has a leading dimension of {lengths.pop()}")
    if length is None and not lengths:
        raise ArgumentValueError("scan: with xs None, give length")
    return length if length is not None else lengths.pop()


def _scan_eagerly(f, carry, xs, x_leaves, x_tree, steps, reverse):
    ys = []
    for i in (range(steps - 1, -1, -1) if reverse else range(steps)):
        carry, y = _pair(f, f(carry, tree_unflatten(x_tree, [x[i] for x in x_leaves]) if xs is not None else None))
        ys.append(y)
    if reverse:
        ys.reverse()
    if not ys:
        raise ArgumentValueError("scan: run on tensors with no step, the ys' shapes are unknown; jit it, or take "
                                 "at least one step")
    y_leaves = [tree_flatten(y)[0] for y in ys]
    y_tree = tree_flatten(ys[0])[1]
    return carry, tree_unflatten(y_tree, [torch.stack([y[j] for y in y_leaves]) for j in range(len(y_leaves[0]))])


def while_loop(cond_fn: Callable, body_fn: Callable, init):
    """jax.lax.while_loop: `carry = body_fn(carry)` while `cond_fn(carry)`, returning the last carry.
    Inside traced code both functions are traced once and the loop runs as compiled code, however many
    steps the values make it take (one compile for every trip count). `cond_fn` returns a Python bool or
    a one-element bool tensor; `body_fn` returns init's structure, shapes and dtypes.

        >>> import torch, thunderfn as tf
        >>> halve = tf.jit(lambda x: tf.while_loop(lambda x: x.sum() > 1, lambda x: x / 2, x))
        >>> halve(torch.tensor([4.0, 4.0])), halve(torch.tensor([40.0, 40.0]))
        (tensor([0.5000, 0.5000]), tensor([0.3125, 0.3125]))
    """
    if context.current_trace() is None:
        carry = init
        while _concrete(cond_fn(carry)):
            carry = body_fn(carry)
        return carry
    init_leaves, init_tree = tree_flatten(init)
    init = tree_unflatten(init_tree, [_as_proxy(x) for x in init_leaves])
    cond_body = trace_body(lambda carry: _predicate(cond_fn, cond_fn(carry)), (init,), "while_cond")
    body = trace_body(body_fn, (init,), "while_body")
    _check_agree("while_loop", body.fn_name, "init", _structure(body), init)
    out = prims.while_loop(cond_body, body, tuple(tree_flatten(init)[0]), cond_body.captured, body.captured)
    return tree_unflatten(init_tree, list(out))


def _predicate(cond_fn, pred):
    if isinstance(pred, bool):
        return prims.full((), pred, device="cpu", dtype=torch.bool)
    if not (isinstance(pred, TensorProxy) and pred.dtype is torch.bool and pred.numel() == 1):
        raise ArgumentTypeError(f"while_loop: '{_name(cond_fn)}' must return a Python bool or a one-element bool "
                                f"tensor, got {pred!r}")
    return prims.reshape(pred, ()) if pred.ndim else pred


def fori_loop(lower: int, upper: int, body_fn: Callable, init):
    """jax.lax.fori_loop: `carry = body_fn(i, carry)` for i from lower to upper - 1, returning the last
    carry; `i` is a 0-dim int64 tensor. With Python-int bounds (the only kind taken here) it is a
    tf.scan of upper - lower steps.

        >>> import torch, thunderfn as tf
        >>> tf.jit(lambda x: tf.fori_loop(0, 4, lambda i, c: c + i, x))(torch.zeros(2))
        tensor([6., 6.])
    """
    if not (isinstance(lower, int) and isinstance(upper, int)):
        raise ArgumentTypeError(f"fori_loop: the bounds must be Python ints, got {type(lower).__name__} and "
                                f"{type(upper).__name__}; for bounds that are tensors, use tf.while_loop")
    if context.current_trace() is None:
        carry = init
        for i in range(lower, upper):
            carry = body_fn(torch.tensor(i), carry)
        return carry

    def step(state, _):
        i, carry = state
        return (i + 1, body_fn(i, carry)), None

    start = prims.full((), lower, device="cpu", dtype=torch.int64)
    (_, carry), _ = scan(step, (start, init), None, length=max(upper - lower, 0))
    return carry


# -- torch's own control-flow operators, inside traced code: the same primitives ------------------------------
# torch.cond and torch._higher_order_ops' while_loop, scan and map are Python functions that check their
# arguments before any torch op runs, so they never reach thunderfn's interception: they are rewritten here
# (torch/base.py's stand_in_front) to run as tf.cond, tf.while_loop and tf.scan when they are handed a traced
# tensor, and as torch's own otherwise. (Code that imported them before thunderfn holds torch's functions.)
def _traced(*trees) -> bool:
    return context.current_trace() is not None and any(
        isinstance(x, TensorProxy) for x in tree_flatten(trees)[0])


def _torch_cond(original, pred, true_fn, false_fn, operands=(), *args, **kwargs):
    if args or kwargs or not _traced(pred, operands):
        return original(pred, true_fn, false_fn, operands, *args, **kwargs)
    return cond(pred, true_fn, false_fn, *operands)


def _torch_while_loop(original, cond_fn, body_fn, carried_inputs, *args, **kwargs):
    if args or kwargs or not _traced(carried_inputs):
        return original(cond_fn, body_fn, carried_inputs, *args, **kwargs)
    return while_loop(lambda carry: cond_fn(*carry), lambda carry: tuple(body_fn(*carry)), tuple(carried_inputs))


def _moved(tree, source: int, destination: int):
    leaves, spec = tree_flatten(tree)
    return tree_unflatten(spec, [torch.movedim(x, source, destination) for x in leaves])


def _torch_scan(original, combine_fn, init, xs, *, dim: int = 0, reverse: bool = False, **kwargs):
    if kwargs or not _traced(init, xs):
        return original(combine_fn, init, xs, dim=dim, reverse=reverse, **kwargs)
    carry, ys = scan(combine_fn, init, _moved(xs, dim, 0), reverse=reverse)
    return carry, _moved(ys, 0, dim)  # torch stacks the ys along dim too


def _torch_map(original, f, xs, *args):
    if not _traced(xs, args):
        return original(f, xs, *args)
    return scan(lambda carry, x: (carry, f(x, *args)), (), xs)[1]


def _install_torch_operators() -> None:
    stand_in_front(torch, "cond", _torch_cond)
    stand_in_front(higher_order_ops, "cond", _torch_cond)
    stand_in_front(higher_order_ops, "while_loop", _torch_while_loop)
    stand_in_front(higher_order_ops, "scan", _torch_scan)
    stand_in_front(higher_order_ops, "map", _torch_map)


_install_torch_operators()
