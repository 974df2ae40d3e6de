"""Jacobians and Hessians, by composing vjp/jvp with vmap (as JAX and torch.func build them).

- `jacrev(fn)`: reverse mode, one vector-Jacobian product per output element. vmap runs
  them as one batched backward over the rows of an identity matrix (the one-hot
  cotangents), so the cost is one forward and one batched backward; `chunk_size` bounds
  how many rows go through at once.
- `jacfwd(fn)`: forward mode, one Jacobian-vector product per input element, batched the
  same way over one-hot tangents.
- `hessian(fn) = jacfwd(jacrev(fn))`, forward-over-reverse.

Pytrees in and out as in JAX: the Jacobian has the output's structure, each output leaf
replaced by the structure of the differentiated argument (a tuple of them for a tuple
`argnums`), whose leaves have shape `out_leaf.shape + in_leaf.shape`.
"""
from __future__ import annotations

import functools
from typing import Callable

import optree
import torch

from thunderfn.core import symbolic
from thunderfn.core.decorators import takes_arguments_of, with_options_form
from thunderfn.core.pytree import NAMESPACE, of_positions, tree_flatten, tree_leaves, tree_unflatten
from thunderfn.errors import ArgumentValueError, OutputError, TransformArgumentError, TransformInputError
from thunderfn.transforms.argnums import argnums_as_tuple, positional_argnums
from thunderfn.transforms.autodiff import _compiled, _floats_as_tensors, vjp
from thunderfn.transforms.forward_mode import jvp
from thunderfn.transforms.func_contracts import check_jacrev_output, check_reverse_inputs, check_tensor_output
from thunderfn.transforms.vmap import vmap


def _argnums(fn, argnums, args, transform: str) -> tuple[tuple, bool]:
    single = isinstance(argnums, int)
    nums = positional_argnums(fn, argnums_as_tuple(argnums), len(args))
    for k, leaf in enumerate(tree_flatten(tuple(args[i] for i in nums))[0]):
        if getattr(leaf, "dtype", None) is not None and leaf.dtype.is_complex:
            raise TransformArgumentError(
                f"{transform}: Expected all inputs to be real but received complex tensor at flattened input idx: {k} "
                f"(as torch.func). Differentiate with respect to its real and imaginary parts as two real tensors "
                f"(torch.view_as_real), or use tf.vjp with a cotangent you choose.")
    return nums, single


def _check_tensor_outputs(out, transform: str) -> None:
    """A Jacobian has a real block per output tensor: no output, any other output leaf, or a complex one
    (whose Jacobian is not one real matrix), or for jacrev an integer one, is torch.func's RuntimeError."""
    if transform == "jacrev":
        check_jacrev_output(out)
    else:
        check_tensor_output(out, "jvp")
    for k, leaf in enumerate(tree_flatten(out)[0]):
        if leaf.dtype.is_complex:  # torch's sentence says "input idx" for an output too
            raise OutputError(f"{transform}: Expected all outputs to be real but received complex tensor at "
                              f"flattened input idx: {k} (output {k}). Take its real and imaginary parts as two "
                              f"real outputs (torch.view_as_real).")


def _one_hot_rows(leaves) -> list:
    """For tensors of n1, n2, ... elements: the rows of the identity of size n1 + n2 + ..., cut
    into one batch per tensor ([n, *leaf.shape] each), the batch dimension first."""
    sizes = [leaf.numel() for leaf in leaves]
    total, offset, rows, eyes = sum(sizes), 0, [], {}
    for leaf, n in zip(leaves, sizes):
        key = (leaf.dtype, leaf.device)
        if key not in eyes:  # one identity per dtype and device, sliced for each leaf
            eyes[key] = _identity(total, leaf.dtype, leaf.device)
        rows.append(eyes[key][:, offset:offset + n].reshape(total, *leaf.shape))
        offset += n
    return rows


def _identity(n, dtype, device):
    """torch.eye(n); of a symbolic n, computed (torch.eye, a constant made at trace time, would pin n)."""
    if not symbolic.is_symbolic(n):
        return torch.eye(n, dtype=dtype, device=device)
    index = torch.arange(n, device=device)
    return (index.unsqueeze(1) == index).to(dtype)


def _blocks(batched, sizes):
    """batched ([n1 + n2 + ..., *shape]) cut along its first dimension into [n1, ...], [n2, ...], ..."""
    out, offset = [], 0
    for n in sizes:
        out.append(batched[offset:offset + n])
        offset += n
    return out


@with_options_form
def jacrev(fn: Callable, argnums=0, has_aux: bool = False, *, chunk_size: int | None = None,
           _preallocate_and_copy: bool = False):
    """A function returning the Jacobian of fn with respect to the positional args in argnums,
    by reverse mode (one vjp per output element, batched with tf.vmap), as torch.func.jacrev.

    For an output of shape O and an input of shape I, the Jacobian has shape (*O, *I). `argnums`:
    an int, or a tuple of ints giving a tuple of Jacobians; outputs and inputs may be pytrees
    (the result nests output structure outside input structure). With `has_aux`, fn returns
    (out, aux) and this returns (jacobian, aux). `chunk_size` bounds how many output elements are
    pulled back at once (less memory, more steps). (`_preallocate_and_copy`, torch.func's way of
    assembling chunks, is accepted and changes nothing: the result is the same.) Reverse mode suits fewer outputs than
    inputs; tf.jacfwd suits the opposite. An input the output does not depend on gets a block of
    zeros.

        >>> import torch, thunderfn as tf
        >>> x = torch.tensor([0.0, 1.0, 2.0])
        >>> J = tf.jacrev(torch.sin)(x)
        >>> J.shape
        torch.Size([3, 3])
        >>> torch.testing.assert_close(J, torch.diag(torch.cos(x)))
    """
    if not (chunk_size is None or isinstance(chunk_size, int) and chunk_size > 0):
        raise (ArgumentValueError if isinstance(chunk_size, int) else TransformInputError)(
            f"jacrev: `chunk_size` should be greater than 0. (got {chunk_size!r})")

    def jacobian(*args, **kwargs):
        nums, single = _argnums(fn, argnums, args, "jacrev")
        args = _floats_as_tensors(args, nums)  # a Python float: a 0-d tensor, as JAX differentiates it
        primals = tuple(args[i] for i in nums)
        check_reverse_inputs(tree_leaves(primals), "jacrev", fn, integer_tensors=False)  # (tf.vjp takes them)
        # keyword arguments are passed through and never differentiated, as in JAX
        result = vjp(of_positions(fn, args, nums, kwargs), *primals, has_aux=has_aux)
        out, vjp_fn = result[0], result[1]
        _check_tensor_outputs(out, "jacrev")
        out_leaves, out_spec = tree_flatten(out)
        sizes = [o.numel() for o in out_leaves]
        primal_leaves = [tree_flatten(p) for p in primals]

        def pull_back(*cotangent_leaves):
            cotangents = vjp_fn(tree_unflatten(out_spec, list(cotangent_leaves)))
            # a primal leaf the output does not depend on: zeros, which is what its Jacobian block holds
            return tuple(tuple(optree.tree_leaves(optree.tree_map(
                lambda c, p: torch.zeros_like(p) if c is None else c, ct, primal, none_is_leaf=True,
                namespace=NAMESPACE), namespace=NAMESPACE)) for ct, primal in zip(cotangents, primals))

        pulled = vmap(pull_back, chunk_size=chunk_size)(*_one_hot_rows(out_leaves))
        blocks = [[_blocks(g, sizes) for g in grads] for grads in pulled]  # [primal][its leaf][output leaf]
        per_out = []
        for k, o in enumerate(out_leaves):
            per_primal = [tree_unflatten(spec, [leaf_blocks[k].reshape((*o.shape, *p.shape))
                                                for leaf_blocks, p in zip(primal_blocks, leaves)])
                          for (leaves, spec), primal_blocks in zip(primal_leaves, blocks)]
            per_out.append(per_primal[0] if single else tuple(per_primal))
        jac = tree_unflatten(out_spec, per_out)
        return (jac, result[2]) if has_aux else jac

    jacobian.__name__ = f"jacrev_{getattr(fn, '__name__', 'fn')}"
    # called with tensors: traced once per signature and cached, as grad is
    return _compiled(takes_arguments_of(jacobian, fn))


@with_options_form
def jacfwd(fn: Callable, argnums=0, has_aux: bool = False, *, randomness: str = "error"):
    """A function returning the Jacobian of fn with respect to the positional args in argnums,
    by forward mode (one jvp per input element, batched with tf.vmap), as torch.func.jacfwd.

    Same shapes and arguments as tf.jacrev: for an output of shape O and an input of shape I,
    a (*O, *I) tensor; `argnums` an int or a tuple; with `has_aux`, (jacobian, aux). Forward
    mode suits fewer inputs than outputs. `randomness` is tf.vmap's, over the input elements
    ("error", "different" or "same"), as torch.func.jacfwd's.

        >>> import torch, thunderfn as tf
        >>> x = torch.tensor([0.0, 1.0, 2.0])
        >>> J = tf.jacfwd(lambda x: torch.stack([x.sum(), (x ** 2).sum()]))(x)
        >>> J.shape
        torch.Size([2, 3])
        >>> torch.testing.assert_close(J, torch.stack([torch.ones(3), 2 * x]))
    """
    def jacobian(*args, **kwargs):
        nums, single = _argnums(fn, argnums, args, "jacfwd")
        args = _floats_as_tensors(args, nums)
        primals = tuple(args[i] for i in nums)
        flat, spec = tree_flatten(primals)
        sizes = [p.numel() for p in flat]
        of_primals = of_positions(fn, args, nums, kwargs)

        @functools.wraps(of_primals)  # (errors name the user's function)
        def checked(*primals):  # (as traced, before forward mode pushes a tangent through a complex op)
            out = of_primals(*primals)
            _check_tensor_outputs(out[0] if has_aux and isinstance(out, tuple) else out, "jacfwd")
            return out

        def push_forward(*tangent_leaves):
            return jvp(checked, primals, tree_unflatten(spec, list(tangent_leaves)), has_aux=has_aux)

        # the output and aux are the same for every one-hot tangent: unbatched, computed once with them
        result = vmap(push_forward, out_axes=(None, 0, None) if has_aux else (None, 0),
                      randomness=randomness)(*_one_hot_rows(flat))
        out_leaves, out_spec = tree_flatten(result[0])
        pushed_leaves = tree_flatten(result[1])[0]
        aux = result[2] if has_aux else None
        per_out = []
        for o, t in zip(out_leaves, pushed_leaves):
            blocks = [b.movedim(0, -1).reshape((*o.shape, *p.shape)) for b, p in zip(_blocks(t, sizes), flat)]
            per_primal = tree_unflatten(spec, blocks)  # a tuple over argnums
            per_out.append(per_primal[0] if single else per_primal)
        jac = tree_unflatten(out_spec, per_out)
        return (jac, aux) if has_aux else jac

    jacobian.__name__ = f"jacfwd_{getattr(fn, '__name__', 'fn')}"
    return _compiled(takes_arguments_of(jacobian, fn))


@with_options_form
def hessian(fn: Callable, argnums=0):
    """A function returning the Hessian of a scalar-output fn: jacfwd of jacrev
    (forward-over-reverse), as torch.func.hessian.

    For an input of shape I the Hessian has shape (*I, *I); `argnums` as in tf.jacrev (a tuple
    gives the nested tuple of blocks).

        >>> import torch, thunderfn as tf
        >>> x = torch.tensor([0.0, 1.0, 2.0])
        >>> H = tf.hessian(lambda x: (x ** 3).sum())(x)
        >>> torch.testing.assert_close(H, torch.diag(6 * x))
    """
    return jacfwd(jacrev(fn, argnums), argnums)
