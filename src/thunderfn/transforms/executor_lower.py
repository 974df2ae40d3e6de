"""executor_lower: rewrite a trace onto executors, by priority.

For each bound symbol the first executor whose rule for that symbol accepts
(its checker, called with the symbol's proxies) claims it whole, unless an
executor listed before that one accepts a symbol of its decomposition: priority
beats granularity. When no executor claims it, the symbol's decomposition
(subsymbols) is lowered instead; an unclaimed prim is an error that prints the
bound symbol and the executors tried.

The executors are always passed in (`lower_trace(trc, executors)`, `claiming_rule(bsym,
executors)`). A transform: it knows executors by what they answer (`lowering_for`, a
rule's `checker`, `lower`, `vjp`), never imports executors/ or jit (`executor_lower`
compiles through core/context.py's jit, which jit registers).
"""
from __future__ import annotations

import torch

from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.checkpoint)
from thunderfn.core import context
from thunderfn.core.bodies import Body
from thunderfn.core.interception import handled_by
from thunderfn.core.lowering import RunAsItself, RunAsOperator, RunWithTorch, TraceInPlace
from thunderfn.core.passes import dce
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten
from thunderfn.core.statements import python_alias
from thunderfn.core.symbol import BoundSymbol, Symbol
from thunderfn.core.tracer import tracing
from thunderfn.errors import ExecutorError


def _accepts(ex, bsym):
    """ex's rule for bsym if it has one and its checker accepts this call site, else None."""
    rule = ex.lowering_for(bsym)
    if rule is None or rule.checker is None:
        return rule
    try:
        ok = rule.checker(*bsym.args, **bsym.kwargs)
    except Exception as e:
        raise ExecutorError(f"the checker executor '{ex.name}' registered for {bsym.sym.print_name} raised "
                           f"{type(e).__name__}: {e}") from e
    return rule if ok else None


def _claimed_inside(bsyms, executors) -> bool:
    """Whether one of `executors` accepts a symbol anywhere in these bound symbols' decompositions."""
    return any(any(_accepts(ex, b) is not None for ex in executors) or
               (b.subsymbols and _claimed_inside(b.subsymbols, executors)) for b in bsyms)


def _claim(bsym, executors):
    """(executor, rule) that claims bsym whole, or (None, None): then its decomposition is lowered.
    Priority beats granularity: the first executor that accepts bsym claims it, unless an executor
    listed before it accepts a symbol of bsym's decomposition (an executor of prims.add listed
    before torch runs inside torch.add)."""
    for position, ex in enumerate(executors):
        rule = _accepts(ex, bsym)
        if rule is None:
            continue
        if position and bsym.subsymbols and _claimed_inside(bsym.subsymbols, executors[:position]):
            return None, None
        return ex, rule
    return None, None


def claiming_rule(bsym, executors):
    """The rule that will claim bsym when it is lowered onto executors (a priority list), as
    reverse mode needs to know it: the first executor's that accepts it or, for an executor's
    operator, its own executor's, which is where its vjp can be registered."""
    own = bsym.sym.executor
    return _claim(bsym, (own,) if own is not None else executors)[1]


def claims_whole(rule) -> bool:
    """Whether a rule (of claiming_rule) runs a composite symbol as one call rather than as the
    torch executor runs it: reverse mode then keeps the symbol whole in the forward, so the
    executor's kernel runs, and recomputes its decomposition in the backward."""
    return rule is not None and not isinstance(rule.action, RunWithTorch)


def trace_in_place_of(bsym, fn, who: str) -> list:
    """Trace fn(*bsym.args, **bsym.kwargs) and rename its outputs to bsym's, so the rest of
    the trace is untouched: the bound symbols that replace bsym."""
    with context.current_tracer().scope() as emitted:
        result = fn(*bsym.args, **bsym.kwargs)
    new_leaves, _ = tree_flatten(result)
    old_leaves, _ = tree_flatten(bsym.output)
    if len(new_leaves) != len(old_leaves):
        raise ExecutorError(f"{who} for {bsym.sym.print_name} returned {len(new_leaves)} values where the symbol has "
                           f"{len(old_leaves)}")
    inputs = {p.name for p in bsym.proxy_args()}
    mapping, aliases = {}, []
    for new, old in zip(new_leaves, old_leaves):
        if isinstance(new, TensorProxy) and isinstance(old, TensorProxy) and new.name != old.name:
            if new.name in inputs or new.constant is not None or new.name in mapping:
                aliases.append(python_alias.bind(new, output=old))
            else:
                mapping[new.name] = old
    return [b.swap(mapping) for b in emitted] + aliases


# Traces carry no strides, so while user code is traced x.contiguous() is x itself. In a
# lowering it is a copy, run as torch runs it: an executor's kernel sees real memory layouts.
contiguous = Symbol("contiguous", "executor_lower.contiguous", meta=lambda a, memory_format=None: TensorProxy.like(a),
                    is_prim=True, print_name="torch.Tensor.contiguous", namespace={"torch": torch},
                    eager=torch.Tensor.contiguous)


def _lowered_body(trc, executors):
    """A body's execution trace: lowered onto the executors, then fused by those that fuse (a fusion
    executor's `fuse`), so that a loop's step runs its fused kernels each time."""
    lowered = dce(lower_trace(trc, executors))
    for ex in executors:
        if callable(getattr(ex, "fuse", None)):
            lowered = ex.fuse(lowered)
    return lowered


def _lowered_once(body: Body, executors) -> Body:
    """The body lowered onto the executors, once however many calls share it (a repeated layer's block)."""
    # (the executors kept with it: their ids are the key)
    return body.once(("lowered", tuple(map(id, executors))),
                     lambda: (body.lowered(lambda trc: _lowered_body(trc, executors)), executors))[0]


def _with_lowered_bodies(bsym, executors):
    """bsym, its bodies (a control-flow primitive's: core/bodies.py) lowered onto the same executors, so
    that they run as execution traces: executors claim the ops inside a body, and fuse them, as anywhere
    else."""
    if not any(isinstance(a, Body) for a in bsym.args):
        return bsym
    args = tuple(_lowered_once(a, executors) if isinstance(a, Body) else a for a in bsym.args)
    return BoundSymbol(bsym.sym, args, bsym.kwargs, bsym.output, bsym.subsymbols)


def _inlined_checkpoint(bsym) -> list | None:
    """A checkpoint's statements in place of its call (None for any other bound symbol): what to compute
    again was reverse mode's business, done by now; inlined, the body's ops fuse with those around it."""
    if bsym.sym.id != prims.checkpoint.id:
        return None
    body, operands, captured, _policy, _n_saved = bsym.args
    return body.statements_as(tuple(operands) + tuple(captured), tuple(bsym.output))


def lower_bsyms(bsyms, executors) -> list:
    out = []
    for bsym in bsyms:
        if bsym.sym.printer is not None or bsym.sym is contiguous:  # del / alias statements, a lowering's copies
            out.append(bsym)
            continue
        inlined = _inlined_checkpoint(bsym)
        if inlined is not None:
            out.extend(lower_bsyms(inlined, executors))
            continue
        bsym = _with_lowered_bodies(bsym, executors)
        ex, rule = _claim(bsym, executors)
        if rule is not None:
            match rule.action:
                case RunWithTorch():
                    out.append(ex.lower_direct(bsym))
                case RunAsItself():
                    out.append(bsym)
                case RunAsOperator(operator):
                    out.append(BoundSymbol(operator, bsym.args, bsym.kwargs, bsym.output, (bsym,)))
                case TraceInPlace(fn):
                    with handled_by(torch.Tensor.contiguous, contiguous):  # (this thread's tracing only)
                        lowered = trace_in_place_of(bsym, fn, f"executor '{ex.name}': the lowering")
                    out.extend(lower_bsyms(lowered, executors))
            continue
        if bsym.subsymbols:
            out.extend(lower_bsyms(bsym.subsymbols, executors))
            continue
        tried = ", ".join(ex.name for ex in executors) or "none"
        raise ExecutorError(f"Could not find executor for bound symbol:\n  {bsym}\nExecutors tried "
                            f"(in priority order): {tried}. Add an executor that implements "
                            f"{bsym.sym.print_name}, or keep the torch executor as the fallback (fallback=True).")
    return out


def lower_trace(trc, executors):
    """The execution trace of trc on these executors (a trace-to-trace pass)."""
    with tracing(type(trc)(trc.fn_name, names=trc.names)):
        bsyms = lower_bsyms(trc.bound_symbols, executors)
    return trc.derive("Transform for execution", bsyms)


def executor_lower(fn, executors):
    """The lowering transform on its own: fn, run on exactly these executors (in
    priority order, no torch fallback), jitted; past the cache size limit it drops its
    oldest entry rather than run anywhere else. `executors`: one executor (a name or an Executor)
    or a list of them, as jit's.

    Returns the jitted function (tf.last_traces works on it). Use it to test an executor: an
    operation none of `executors` claims is an ExecutorError naming it, where tf.jit would
    quietly run it on torch.

        >>> import torch, thunderfn as tf
        >>> x = torch.ones(2)
        >>> f = tf.executor_lower(lambda x: torch.sin(x) * 2, "torch")
        >>> torch.testing.assert_close(f(x), torch.sin(x) * 2)
        >>> tf.executor_lower(torch.sin, [tf.executors.OperatorExecutor("claims_nothing")])(x)
        Traceback (most recent call last):
        ...
        thunderfn.errors.ExecutorError: Could not find executor for bound symbol: ...
    """
    executors = list(executors) if isinstance(executors, (list, tuple)) else executors  # a copy: later edits not seen
    return context.jit_evicting(fn, executors=executors, fallback=False)
