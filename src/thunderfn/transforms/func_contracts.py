"""What torch.func checks of what a transform is given and of what the transformed function returns,
refused with the builtin torch.func raises and its sentence (tests/test_torch_func_wording.py runs each
call through both). Where JAX takes what torch.func refuses (a Python float to differentiate, anything
in has_aux's aux, an integer output or primal of vjp, any output of vjp and jvp), thunderfn takes it as
JAX does: a JAX program keeps working, and a torch.func program that ran keeps its result
(docs/porting-from-torch-func.md lists these)."""
from __future__ import annotations

from typing import Callable

import torch

from thunderfn.core import dtypes
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves
from thunderfn.errors import OutputError, TransformArgumentError, TransformInputError

# how torch.func's messages name each transform's call
TORCH_CALL = {"grad": "grad_and_value(f)(*args)", "vjp": "vjp(f, *primals)", "jvp": "jvp(f, primals, tangents)"}


def _name(fn) -> str:
    return getattr(fn, "__name__", repr(fn))


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)  # (a proxy is one)


def check_reverse_inputs(leaves, transform: str, fn, *, integer_tensors: bool) -> None:
    """What reverse mode (grad, vjp, jacrev) differentiates: tensors (a Python float became a 0-d tensor
    before this). Any other leaf (a str, a Python int) is torch.func's ValueError, which JAX raises as a
    TypeError. An integer tensor is torch's RuntimeError for requires_grad (JAX's TypeError) unless
    `integer_tensors`: vjp takes one, as jax.vjp does, and gives it no cotangent."""
    for leaf in leaves:
        if not _is_tensor(leaf):
            raise TransformInputError(
                f"Thing passed to transform API must be Tensor, got {type(leaf)} ({transform} of '{_name(fn)}' "
                f"differentiates tensors and Python floats, got {leaf!r}. Pass a float (2.0) or a floating tensor, "
                f"or leave it out of argnums.)")
        if not integer_tensors and not dtypes.is_inexact(leaf.dtype):
            raise TransformArgumentError(f"only Tensors of floating point dtype can require gradients ({transform} of "
                                         f"'{_name(fn)}' got a {leaf.dtype} tensor to differentiate). Pass it as an "
                                         f"argument you do not differentiate with respect to (argnums), or convert "
                                         f"it with .float().")


def check_forward_primal(leaf) -> None:
    """A primal of forward mode (jvp, jacfwd, hessian): a tensor must be floating or complex, as torch's
    make_dual requires (ValueError; JAX's TypeError for an integer primal with a tangent). tf.linearize
    takes one, as jax.linearize does, and its jvp_fn gives it no tangent."""
    if _is_tensor(leaf) and not dtypes.is_inexact(leaf.dtype):
        raise TransformInputError(f"Expected primal to be floating point or complex, but got: {leaf.dtype} "
                                  f"(forward mode pushes a tangent through each primal; pass the integer tensor "
                                  f"to the function another way, a closure or a keyword argument, or convert it "
                                  f"with .float())")


def check_jvp_arguments(primals: tuple, tangents: tuple) -> None:
    """jvp's primals and tangents (already tuples of one structure): at least one leaf; each primal leaf a
    tensor (or a Python float, as JAX takes it) and each tangent of a tensor a tensor; torch.func's order."""
    flat_primals, flat_tangents = tree_leaves(primals), tree_leaves(tangents)
    call = TORCH_CALL["jvp"]
    if not flat_primals:
        raise TransformArgumentError(f"{call}: Expected primals to contain at least one Tensor.")
    for p in flat_primals:
        if not _is_tensor(p) and type(p) is not float:
            raise TransformArgumentError(f"{call}: Expected primals to only contain Tensors, got {type(p)}")
    for p, t in zip(flat_primals, flat_tangents):
        if _is_tensor(p) and not _is_tensor(t):
            raise TransformArgumentError(f"{call}: Expected tangents to only contain Tensors, got {type(t)} (a "
                                         f"tensor primal takes a tangent tensor of its shape)")
    for p in flat_primals:
        check_forward_primal(p)


def check_tensor_output(value, transform: str) -> None:
    """What jacrev and jacfwd differentiate: an output with at least one leaf, every leaf a tensor
    (tf.vjp and tf.jvp take any output, as JAX's do)."""
    leaves = tree_leaves(value)
    if value is None or not leaves:
        raise OutputError(f"{TORCH_CALL[transform]}: Expected f to be a function that has non-empty output (got "
                          f"output = {[None] if value is None else leaves})")
    for leaf in leaves:
        if not _is_tensor(leaf):
            raise OutputError(f"{TORCH_CALL[transform]}: expected f(*primals) to return only tensors, got "
                              f"unsupported type {type(leaf)}")


def check_jacrev_output(value) -> None:
    """jacrev's output: tensors (check_tensor_output), each floating or complex: an integer output has no
    derivative (torch.func's RuntimeError, JAX's TypeError; tf.vjp takes one, as jax.vjp does)."""
    check_tensor_output(value, "vjp")
    for leaf in tree_leaves(value):
        if not dtypes.is_inexact(leaf.dtype):
            raise OutputError(f"vjp(f, ...): All outputs of f must be floating-point or complex Tensors, got Tensor "
                              f"with dtype {leaf.dtype} (jacrev: return the integer result as aux, with "
                              f"has_aux=True)")


def output_and_aux(result, fn, transform: str) -> tuple:
    """(output, aux) of what fn returned under has_aux=True, which must be a pair. aux may hold anything,
    as JAX's may (torch.func refuses a leaf that is not a tensor): it is returned as is."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        if isinstance(result, TensorProxy):
            got = f"one tensor of shape {tuple(result.shape)}"
        elif isinstance(result, (tuple, list)):
            got = f"a {type(result).__name__} of {len(result)}"
        else:
            got = f"a {type(result).__name__}"
        raise OutputError(f"{TORCH_CALL.get(transform, transform)}: output of function f should be a tuple: "
                          f"(output, aux) if has_aux is True. ({transform}(has_aux=True) of '{_name(fn)}': the "
                          f"function must return a pair (output, aux), but it returned {got}. Return "
                          f"(output, aux), or leave out has_aux=True.)")
    return result[0], result[1]


def value_without_aux(fn: Callable, has_aux: bool, transform: str = "vjp"):
    """(a function returning only fn's value, a list that receives its aux when called)."""
    aux_box: list = []

    def value_only(*args):
        result = fn(*args)
        if has_aux:
            value, aux = output_and_aux(result, fn, transform)
            aux_box.append(aux)
            return value
        return result

    return value_only, aux_box
