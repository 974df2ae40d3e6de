"""Trace-to-trace passes: dead-code elimination and delete-last-used."""
from __future__ import annotations

from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves
from thunderfn.core.statements import python_del


def _output_names(trc) -> set:
    return {p.name for p in tree_leaves(trc.output) if isinstance(p, TensorProxy)}


def dce(trc):
    """Drop bound symbols none of whose outputs is used (side-effecting ones stay)."""
    needed = _output_names(trc)
    kept = []
    for bsym in reversed(trc.bound_symbols):
        outs = bsym.proxy_outs()
        if "no_dce" in bsym.sym.tags or any(o.name in needed for o in outs):
            kept.append(bsym)
            needed.update(a.name for a in bsym.proxy_args())
    return trc.derive("Dead Code Elimination", list(reversed(kept)))


def del_last_used(trc):
    """Insert `del` after the last use of every local that is not returned."""
    returned = _output_names(trc)
    seen = set(returned)
    out = []
    for bsym in reversed(trc.bound_symbols):
        dead = []
        # outputs nobody reads die at once; arguments die after their last reader
        for p in bsym.proxy_outs() + bsym.proxy_args():
            if p.name not in seen and p.constant is None:
                seen.add(p.name)
                dead.append(p)
        if dead:
            out.append(python_del.bind(*dead, output=None))
        out.append(bsym)
    unused_inputs = [a for a in trc.args if a.name not in seen]
    body = list(reversed(out))
    if unused_inputs:
        body.insert(0, python_del.bind(*unused_inputs, output=None))
    return trc.derive("Delete Last Used", body)
