"""executor_lower: rewrite a trace onto executors, by priority.

For each bound symbol the first executor whose rule for that symbol accepts
(its checker, called with the symbol's proxies) claims it; when none does, the
symbol's decomposition (subsymbols) is lowered instead; an unclaimed prim is an
error that prints the bound symbol and the executors tried.
"""
from __future__ import annotations

from thunderfn.core import context
from thunderfn.core.pytree import tree_flatten
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.statements import python_alias
from thunderfn.core.symbol import BoundSymbol, Symbol



def _claim(bsym, executors):
    for ex in executors:
        rule = ex.lowering_for(bsym)
        if rule is None:
            continue
        if rule.checker is not None:
            try:
                ok = rule.checker(*bsym.args, **bsym.kwargs)
            except Exception as e:
                raise RuntimeError(f"the checker executor '{ex.name}' registered for {bsym.sym.print_name} raised "
                                   f"{type(e).__name__}: {e}") from e
            if not ok:
                continue
        return ex, rule
    return None, None


def _traced_lowering(bsym, lower, ex):
    """Trace `lower` on the bound symbol's arguments; rename its outputs to the
    original outputs so the rest of the trace is untouched."""
    trc = context.current_trace()
    with trc.scope() as emitted:
        result = lower(*bsym.args, **bsym.kwargs)
    new_leaves, _ = tree_flatten(result)
    old_leaves, _ = tree_flatten(bsym.output)
    if len(new_leaves) != len(old_leaves):
        raise RuntimeError(f"executor '{ex.name}': the lowering for {bsym.sym.print_name} returned {len(new_leaves)} "
                           f"values where the symbol has {len(old_leaves)}")
    inputs = {p.name for p in bsym.proxy_args()}
    mapping, aliases = {}, []
    for new, old in zip(new_leaves, old_leaves):
        if isinstance(new, TensorProxy) and isinstance(old, TensorProxy) and new.name != old.name:
            if new.name in inputs or new.constant is not None:
                aliases.append(python_alias.bind(new, output=old))
            else:
                mapping[new.name] = old
    return [b.swap(mapping) for b in emitted] + aliases


def lower_bsyms(bsyms, executors) -> list:
    out = []
    for bsym in bsyms:
        if bsym.sym.printer is not None:  # del / alias statements
            out.append(bsym)
            continue
        ex, rule = _claim(bsym, executors)
        if rule is not None:
            if rule.lower == "direct":
                out.append(ex.lower_direct(bsym))
            elif rule.lower == "identity":
                out.append(bsym)
            elif rule.lower is None:
                raise RuntimeError(f"executor '{ex.name}' claims {bsym.sym.print_name} but gave no lowering")
            elif isinstance(rule.lower, Symbol) and rule.lower.executor is ex:
                out.append(BoundSymbol(rule.lower, bsym.args, bsym.kwargs, bsym.output, (bsym,)))
            else:
                out.extend(lower_bsyms(_traced_lowering(bsym, rule.lower, ex), executors))
            continue
        if bsym.subsymbols:
            out.extend(lower_bsyms(bsym.subsymbols, executors))
            continue
        tried = ", ".join(ex.name for ex in executors) or "none"
        raise RuntimeError(f"Could not find executor for bound symbol:\n  {bsym}\nExecutors tried (in priority order): "
                           f"{tried}. Add an executor that implements {bsym.sym.print_name}, or keep the torch "
                           f"executor as the fallback (fallback=True).")
    return out


def lower_trace(trc, executors):
    """The execution trace of trc on these executors (a trace-to-trace pass)."""
    from thunderfn.core.trace import tracing

    with tracing(type(trc)(trc.fn_name, names=trc.names)):
        bsyms = lower_bsyms(trc.bound_symbols, executors)
    return trc.derive("Transform for execution", bsyms)


def executor_lower(fn, executors):
    """The lowering transform on its own: fn, run on exactly these executors (in
    priority order, no torch fallback), jitted."""
    from thunderfn.jit import jit

    return jit(fn, executors=list(executors), fallback=False)
