"""Forward mode: jvp.

The function is traced into the trace being built, composites without a JVP rule
(core/rules.py's record) are replaced by their decomposition, and the
recorded region is walked forward: each bound symbol maps its inputs' tangents to
its output's, by its rule, its like= function (an executor's operator) or, for an
opaque torch op, torch.func.jvp when the compiled function runs, from the generator state
the op ran from, so a random op's tangent is taken with its draws (transforms/resolve.py
gives the order, the same in every transform). Inside `with torch.no_grad():` no
tangent flows, the same stop that reverse mode makes, so <vjp(ct), t> == <ct, jvp(t)>
holds everywhere.
"""
from __future__ import annotations

from typing import Callable

import optree

from thunderfn import clang
from thunderfn.core import context
from thunderfn.core.interception import lift_constants, tensors_by_position
from thunderfn.core.proxies import TensorProxy, entry_by_name
from thunderfn.core.pytree import of_leaves, tree_flatten, tree_leaves, tree_unflatten
from thunderfn.core.rules import TAG_NOT_DIFFERENTIABLE, RecordedCall, rules_of
from thunderfn.core.trace import up_to_date
from thunderfn.errors import ArgumentRuntimeError, ForwardModeError, TransformArgumentError, UnsupportedOpError
from thunderfn.torch.opaque import torch_jvp_op
from thunderfn.transforms.autodiff import (
    _carries_gradient,
    _compiled,
    _grad_modes,
    as_trace_constants,
    as_trace_values,
    differentiating,
    with_generator_states,
)
from thunderfn.transforms.custom_vjp import custom_vjp
from thunderfn.transforms.func_contracts import check_jvp_arguments, value_without_aux
from thunderfn.transforms.resolve import Transform, Way, resolve
from thunderfn.transforms.rules.define import register_trace_jvp


def _is_custom_vjp(bsym) -> bool:
    """A user's tf.custom_vjp function (an executor's vjp= pair, whose fwd is the symbol's own kernel, is
    differentiated through fwd instead)."""
    owner = getattr(bsym.sym.fn, "__self__", None)
    return isinstance(owner, custom_vjp) and not getattr(owner, "fwd_is_primal", False)


def _keep_whole(bsym) -> bool:
    return (rules_of(bsym.sym.id).jvp is not None or _is_custom_vjp(bsym) or TAG_NOT_DIFFERENTIABLE in bsym.sym.tags
            or bsym.sym.printer is not None
            or not bsym.subsymbols or not any(_carries_gradient(a) for a in bsym.flat_args())
            or not any(_carries_gradient(o) for o in bsym.flat_outs()))


def _flattened(bsyms: list) -> list:
    out = []
    for bsym in bsyms:
        out.extend([bsym] if _keep_whole(bsym) else _flattened(list(bsym.subsymbols)))
    return out


def _inert(bsym) -> bool:
    """No tangent flows through it: a statement, or an op whose outputs never carry one (comparisons, argmax)."""
    return (bsym.sym.printer is not None or TAG_NOT_DIFFERENTIABLE in bsym.sym.tags
            or not any(_carries_gradient(o) for o in bsym.flat_outs()))


def _refusal(bsym) -> Exception:
    # a custom_vjp with no tangent rule of its own (a user Function's jvp staticmethod is one): its fwd's
    # derivative is not the rule, a silent wrong tangent, so refused
    if _is_custom_vjp(bsym):
        name = bsym.sym.fn.__self__._name
        return ForwardModeError(
            f"forward mode (tf.jvp, tf.jacfwd, tf.hessian) reached '{name}', a tf.custom_vjp function: its rule is "
            f"reverse-mode only, and differentiating its body instead would ignore it. Define it with tf.custom_jvp "
            f"(whose rule both modes use), or use reverse mode (tf.jacrev, tf.jacrev(tf.jacrev(f)) for a Hessian).")
    name, record = bsym.sym.print_name, rules_of(bsym.sym.id)
    why = record.underivable or "it has no JVP rule and no decomposition"
    reverse = "; reverse mode (tf.grad, tf.vjp, tf.jacrev) differentiates it by its VJP rule" if record.vjp else ""
    return UnsupportedOpError(
        f"thunderfn cannot differentiate {name} in forward mode: {why}. Give it a JVP rule, "
        f"@tf.extend.defjvp({name}.id) on a function jvp(call, tangents) (tf.extend.primitive's jvp=){reverse}.")


# forward mode as transforms/resolve.py sees it: _flattened inlined every decomposition without a rule
# before the walk (a custom_vjp's it keeps whole, so that, without a JVP rule, it is refused)
FORWARD = Transform("forward mode", "jvp", _refusal, inert=_inert, follows_like=True, decomposes=False)


def _push_forward(bsym, tangents: dict, rng_states: dict) -> None:
    arg_tangents = tuple(entry_by_name(a, tangents) for a in bsym.args)
    kwarg_tangents = [tangents.get(v.name) for v in tree_leaves(bsym.kwargs) if isinstance(v, TensorProxy)]
    if all(t is None for t in arg_tangents) and all(t is None for t in kwarg_tangents):
        return
    way = resolve(bsym, FORWARD)
    if way is Way.INERT:
        return
    if way is Way.RULE:
        args, kwargs = bsym.args, bsym.kwargs
        if kwarg_tangents and bsym.sym.fn is not None:  # rules take tangents by position: no tensor by keyword
            args, kwargs = tensors_by_position(bsym.sym, args, kwargs)
            arg_tangents = tuple(entry_by_name(a, tangents) for a in args)
        out_tangent = rules_of(bsym.sym.id).jvp.fwd(RecordedCall(bsym.sym, args, kwargs, bsym.output), arg_tangents)
    elif way is Way.LIKE:  # an executor's operator defined like= a function: that function's tangent
        out_tangent = _like_tangent(bsym, tangents)
    elif way is Way.OPAQUE:
        out_tangent = _opaque_tangent(bsym, tangents, rng_states.get(id(bsym)))
    else:
        raise FORWARD.refusal(bsym)
    outs = bsym.flat_outs()
    out_tangents = [out_tangent] if isinstance(bsym.output, TensorProxy) else list(
        optree.tree_leaves(out_tangent, none_is_leaf=True, namespace="thunderfn")
        if out_tangent is not None else [None] * len(outs))
    for o, t in zip(outs, out_tangents):
        if isinstance(o, TensorProxy) and t is not None and _carries_gradient(o):
            tangents[o.name] = clang.maybe_convert_to_dtype(t, o.dtype)


def _like_tangent(bsym, tangents):
    """The tangent of the operator's like= function at its arguments (which it recomputes, as reverse mode does)."""
    leaves, spec = tree_flatten((bsym.args, bsym.kwargs))
    moving = [i for i, x in enumerate(leaves) if isinstance(x, TensorProxy) and tangents.get(x.name) is not None]
    return trace_jvp(of_leaves(bsym.sym.like, leaves, spec, moving), tuple(leaves[i] for i in moving),
                     tuple(tangents[leaves[i].name] for i in moving))[1]


# -- opaque torch ops: torch computes their tangent when the compiled function runs -------------
def _opaque_tangent(bsym, tangents, rng_state):
    """torch.func.jvp of the op, run again from `rng_state` (the generator state it ran from, read
    before it by with_generator_states; None where it cannot draw), so a random op's tangent uses its draws."""
    leaves = tree_leaves((bsym.args, bsym.kwargs))
    # only the arguments with a tangent move: a zero one would be a dual input all the same, which torch
    # refuses where its formula does not differentiate (batch norm's running statistics)
    wrt = tuple(i for i, x in enumerate(leaves) if _carries_gradient(x) and tangents.get(x.name) is not None)
    return torch_jvp_op(bsym.sym.torch_fn, bsym.args, bsym.kwargs, tuple(tangents[leaves[i].name] for i in wrt), wrt,
                        rng_state)


# -- the driver and the function transform ------------------------------------------------------
def trace_jvp(fn: Callable, primals, tangents, strict: bool = False):
    """While a trace is being built: fn(*primals) traced into it, and the tangent of its output
    for these tangents of the primals' leaves (a pytree like the output): zeros for an output that does
    not depend on them, or with `strict`, torch.func's RuntimeError."""
    tracer = context.current_tracer()
    primals = as_trace_values(up_to_date(primals))
    tangents = lift_constants(tangents)  # real tensors (tf.jvp called inside a traced function) read as constants
    env: dict = {}
    for p, t in zip(tree_leaves(primals), tree_leaves(tangents)):
        if _carries_gradient(p) and t is not None:
            if tuple(t.shape) != tuple(p.shape):
                raise ArgumentRuntimeError(f"Trying to set a forward gradient that has a different size than that "
                                           f"of the original Tensor, this is not supported. Tensor is of size "
                                           f"{list(p.shape)} while the given forward gradient is of size "
                                           f"{list(t.shape)}. (jvp: give each primal a tangent of its shape)")
            # keyed by the name the primal has now: fn may write into it in place, after which the same
            # proxy object names its new value (torch/inplace.py), whose tangent the rules compute
            env[p.name] = clang.maybe_convert_to_dtype(t, p.dtype)
    with differentiating(tracer) as recorded:  # whatever the grad mode outside, as reverse mode
        out = as_trace_constants(up_to_date(fn(*primals)))  # a constant output gets a zero tangent
    region = _flattened(recorded)
    emitted, rng_states = with_generator_states(region, set(env))
    for bsym in emitted:
        tracer.emit(bsym)
    for bsym, enabled in zip(region, _grad_modes(region, True)):
        if enabled:
            _push_forward(bsym, env, rng_states)
    out_leaves, out_spec = tree_flatten(out)
    tangent_leaves = [env.get(o.name) if isinstance(o, TensorProxy) else None for o in out_leaves]
    if strict and any(isinstance(o, TensorProxy) and t is None for o, t in zip(out_leaves, tangent_leaves)):
        raise ArgumentRuntimeError("jvp(f, primals, tangents, strict=True): The output of f is independent of the "
                                   "inputs. This is not allowed with strict=True.")
    tangent_leaves = [t if t is not None or not isinstance(o, TensorProxy)
                      else clang.full(o.shape, 0, device=o.device, dtype=o.dtype)
                      for o, t in zip(out_leaves, tangent_leaves)]
    return out, tree_unflatten(out_spec, tangent_leaves)


register_trace_jvp(trace_jvp)


def jvp(fn: Callable, primals, tangents, has_aux: bool = False, *, strict: bool = False):
    """The Jacobian-vector product of fn at `primals` along `tangents`: (out, tangent_out), or
    (out, tangent_out, aux) with has_aux. With `strict` (torch.func's), an output that does not depend
    on the primals is a RuntimeError instead of a zero tangent.

    `primals`: a tuple (or, as JAX takes it, a list) of fn's positional arguments (pytrees of
    tensors, or Python floats as JAX takes them); `tangents`: a tuple of the same structure, one
    tangent per primal leaf with its shape and dtype. `tangent_out` is shaped like `out`: the
    directional derivative, computed in forward mode alongside the output (one pass, no
    backward), as jax.jvp and torch.func.jvp. Unlike tf.vjp it evaluates at once and returns
    values, not a function. primals that are not a tuple or list, or tangents of
    another structure, are a TransformArgumentError (a RuntimeError, as torch.func raises, and a
    TypeError); a tangent of another shape, torch's RuntimeError. With `has_aux`, fn
    returns (out, aux) and aux is returned undifferentiated.

        >>> import torch, thunderfn as tf
        >>> x = torch.tensor([0.0, 1.0, 2.0])
        >>> out, tangent_out = tf.jvp(torch.sin, (x,), (torch.ones(3),))
        >>> torch.testing.assert_close(tangent_out, torch.cos(x))
        >>> _, t = tf.jvp(lambda a, b: a * b, (x, x), (torch.ones(3), torch.zeros(3)))
        >>> torch.testing.assert_close(t, x)  # d(a*b) along (1, 0) is b
    """
    # a list is jax.jvp's too ("a tuple or a list of arguments"); torch.func takes only a tuple
    primals, tangents = (tuple(p) if isinstance(p, list) else p for p in (primals, tangents))
    if not isinstance(primals, tuple):
        raise TransformArgumentError(f"jvp(f, primals, tangents): Expected primals to be a tuple. E.g. it should be "
                                     f"valid to call f(*primals). (got {type(primals).__name__})")
    if not isinstance(tangents, tuple) or tree_flatten(primals)[1] != tree_flatten(tangents)[1]:
        raise TransformArgumentError(
            f"jvp(f, primals, tangents): Expected primals and tangents to have the same python structure. For "
            f"example, if primals is a tuple of 3 tensors, tangents also must be. Got primals with structure "
            f"{tree_flatten(primals)[1]} and tangents with structure {tree_flatten(tangents)[1]}")
    check_jvp_arguments(primals, tangents)

    def transformed(primals, tangents):
        value_only, aux_box = value_without_aux(fn, has_aux, "jvp")
        out, tangent_out = trace_jvp(value_only, primals, tangents, strict)
        return (out, tangent_out, aux_box[0]) if has_aux else (out, tangent_out)

    return _compiled(transformed)(primals, tangents)
