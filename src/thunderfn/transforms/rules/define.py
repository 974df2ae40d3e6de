"""How a symbol's rules are written and entered: the conventions, and the decorators.

A symbol's rules (core/rules.py's record: VJP, JVP, batching) are written in its op family's
module beside this one, each primitive's three next to each other, as JAX's lax.py keeps a
primitive's rules in one block. Every rule receives `call`, a RecordedCall (the symbol, the
arguments as called, the output), and reads arguments by name with `call.arg(name)`.

VJP rules, `bwd(call, g)`, are written in the torch language (`ltorch.mul`, `ltorch.sum`), the
vocabulary of the forward trace, so an executor that claims a torch symbol (a lowering on
`tf.torch.mul`) or a fusion executor sees the same ops in the backward as in the forward.
Prims appear only where torch has no operation of the same meaning (`prims.pad` with interior
padding, a strided `prims.slice`). Conventions (reverse mode relies on them):
- a rule returns one entry per positional argument; None means "no cotangent": the argument is
  not a tensor, is not floating point, or gets zero gradient;
- a cotangent has its argument's shape and dtype: an operand that a binary prim broadcast (a
  0-dim tensor beside a bigger one) gets its cotangent summed to ();
- a multi-output prim (var_mean, sort, topk) gets a tuple `g` with None for an output that
  has no cotangent; prims.cat takes a list of tensors: its first entry is a tuple of cotangents.

JVP rules, `fwd(call, tangents)`, are written in prims. `tangents` has one entry per positional
argument (None: zero, not a tensor, or not floating point; prims.cat's first entry a tuple); a
rule is called only when some tangent is not None, and returns the output's tangent (None when
it is zero; a tuple for a multi-output prim); a 0-dim operand that a binary prim broadcast has
a 0-dim tangent, broadcast by the rule.

Batching rules, `batch(call, dims)`, are written in prims. call.args are the arguments with
every batched tensor replaced by its batched value (one more dimension, at the position `dims`
gives: one entry per positional argument, None for an unbatched tensor or a non-tensor, a tuple
for prims.cat's list); call.out is the output of one example as traced. A rule returns
`(batched output, batch dim)` (tuples of each for several outputs), or NotImplemented for a call
it does not handle; it is called only when some argument is batched, with every tensor argument
passed by position.

Rules are for real floating dtypes: defvjp and defjvp refuse complex arguments with a named
error. Rules trace like any other function, so a derivative can be differentiated again; on real
tensors they compute eagerly, which is how the rule tests check each one against torch.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

from thunderfn.core import dtypes
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.rules import BatchRule, JVPRule, RecordedCall, VJPRule, rules_of, set_rule, symbol_name
from thunderfn.errors import UnsupportedOpError


def _tensors_in(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _tensors_in(a)
        elif isinstance(a, torch.Tensor):
            yield a


def refuse_complex(mode: str, symbol_id, args) -> None:
    """Complex autodiff needs a conjugate prim we do not have: refused, naming the symbol."""
    for a in _tensors_in(args):
        if a.dtype.is_complex:
            raise UnsupportedOpError(
                f"{mode} of {symbol_name(symbol_id)}: complex tensors are not supported "
                f"(got an argument of dtype {a.dtype}); differentiate real and imaginary parts separately")


def _named_like(wrapper, rule):
    wrapper.__name__ = wrapper.__qualname__ = rule.__name__
    wrapper.__doc__ = rule.__doc__
    return wrapper


def defvjp(*symbol_ids, applies=None, residuals=None):
    """Enter the decorated `bwd(call, g)` as the VJP rule of each symbol id, refusing complex
    arguments; `applies(*args, **kwargs)`, when given, restricts it to the calls it says yes to;
    `residuals(bsym)`, when given, is the forward call that returns what bwd reads (VJPRule)."""
    def register(bwd):
        def checked(call: RecordedCall, g):
            refuse_complex("vjp", symbol_ids[0], call.args)
            if g is None or (isinstance(g, tuple) and all(x is None for x in g)):
                return (None,) * len(call.args)  # nothing flows back (an integer output, say)
            return bwd(call, g)

        for sid in symbol_ids:
            set_rule(sid, "vjp", VJPRule(_named_like(checked, bwd), applies, residuals))
        return bwd

    return register


def defjvp(*symbol_ids):
    """Enter the decorated `fwd(call, tangents)` as the JVP rule of each symbol id, refusing
    complex arguments."""
    def register(fwd):
        def checked(call: RecordedCall, tangents):
            refuse_complex("jvp", symbol_ids[0], call.args)
            return fwd(call, tuple(tangents))

        for sid in symbol_ids:
            set_rule(sid, "jvp", JVPRule(_named_like(checked, fwd)))
        return fwd

    return register


def defbatch(*symbol_ids):
    """Enter the decorated `batch(call, dims)` as the batching rule of each symbol id."""
    def register(batch: Callable):
        for sid in symbol_ids:
            set_rule(sid, "batch", BatchRule(batch))
        return batch

    return register


def deflinear(prim, transpose: Callable) -> None:
    """Both directions of a primitive linear in its first argument (the others static): its
    tangent is the primitive applied to the first argument's tangent, and its VJP is
    `transpose(call, g)`, one cotangent per positional argument, as a VJP rule's."""
    def fwd(call, tangents):
        return prim(tangents[0], *call.args[1:], **call.kwargs)

    fwd.__name__ = fwd.__qualname__ = f"{prim.name}_jvp"
    defjvp(prim.id)(fwd)
    defvjp(prim.id)(transpose)


# Reverse mode's trace_vjp (transforms/autodiff.py), for rules that differentiate a function of their
# own (a control-flow primitive's body): the drivers import the rule modules, so each hands itself down
# when imported rather than be imported by them.
_trace_vjp = None


def register_trace_vjp(fn) -> None:
    """Called once, by transforms/autodiff.py when it is imported."""
    global _trace_vjp
    _trace_vjp = fn


def trace_vjp(fn, primals):
    """autodiff.trace_vjp(fn, primals): trace fn(*primals) into the trace being built and return (out,
    backward), backward(cotangents) giving one cotangent per primal leaf."""
    return _trace_vjp(fn, primals)


# Forward mode's trace_jvp (transforms/forward_mode.py), handed down likewise.
_trace_jvp = None


def register_trace_jvp(fn) -> None:
    """Called once, by transforms/forward_mode.py when it is imported."""
    global _trace_jvp
    _trace_jvp = fn


def trace_jvp(fn, primals, tangents):
    """forward_mode.trace_jvp(fn, primals, tangents): trace fn(*primals) into the trace being built and
    return (out, the tangent of out), zeros where an output gets none."""
    return _trace_jvp(fn, primals, tangents)


# tf.vmap (transforms/vmap.py), handed down likewise, for batching rules that batch a function of their own.
_vmap = None


def register_vmap(fn) -> None:
    """Called once, by transforms/vmap.py when it is imported."""
    global _vmap
    _vmap = fn


def vmap(fn, in_axes=0, out_axes=0):
    """tf.vmap(fn, in_axes, out_axes), called while a trace is being built: fn batched into it."""
    return _vmap(fn, in_axes=in_axes, out_axes=out_axes)


def vjp_rule_for(bsym) -> VJPRule | None:
    """The VJP rule that differentiates this bound symbol, or None (then its decomposition does)."""
    rule = rules_of(bsym.sym.id).vjp
    return rule if rule is not None and rule.applies_to(bsym) else None


class _Backwards(threading.local):
    def __init__(self):
        self.tapes: list = []  # the tapes (transforms/autodiff.py) whose backward is being traced, innermost last


backwards = _Backwards()


def wants_gradient(x) -> bool:
    """Whether the backward being traced needs a cotangent for x: it depends on a differentiated
    input (a user Function's ctx.needs_input_grad, an aten backward kernel's output_mask). True
    where that is not known (x made inside a symbol's decomposition, or no backward running)."""
    if not (isinstance(x, TensorProxy) and dtypes.is_inexact(x.dtype)):
        return False
    tapes = backwards.tapes
    if not tapes:
        return True
    return x.name in tapes[-1].active or x.name not in tapes[-1].seen
