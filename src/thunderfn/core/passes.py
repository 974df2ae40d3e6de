"""Trace-to-trace passes: dead-code elimination, common-subexpression elimination, delete-last-used."""
from __future__ import annotations

import optree
import torch

from thunderfn.core import symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves
from thunderfn.core.statements import (
    check_inputs_do_not_alias,
    no_writes_yet,
    python_alias,
    python_del,
    runtime_check,
    write_back,
    write_back_on_failure,
    written,
)
from thunderfn.core.symbol import BoundSymbol


def output_names(trc) -> set:
    return {p.name for p in tree_leaves(trc.output) if isinstance(p, TensorProxy)}


def dce(trc):
    """Drop bound symbols none of whose outputs is used (side-effecting ones stay). A data-dependent size is
    used where code computes with it (`torch.zeros(u0)`): the op that made it stays (core/symbolic.py)."""
    needed = output_names(trc)
    sizes_needed = symbolic.unbacked_names(trc.output)
    makes = _data_dependent_sizes_made(trc)
    sizes_needed |= _sizes_checked(trc, makes)  # a torch._check about a size runs where it is made: that op stays
    kept = []
    for bsym in reversed(trc.bound_symbols):
        outs = bsym.proxy_outs()
        if ("no_dce" in bsym.sym.tags or any(o.name in needed for o in outs)
                or makes.get(id(bsym), set()) & sizes_needed):
            kept.append(bsym)
            needed.update(a.name for a in bsym.proxy_args())
            sizes_needed |= symbolic.unbacked_names((bsym.args, bsym.kwargs))
    return trc.derive("Dead Code Elimination", list(reversed(kept)))


def _sizes_checked(trc, makes: dict) -> set:
    """The data-dependent sizes a torch._check fact reads: eager raises where one does not hold, so the op making
    such a size is kept even where nothing else uses it."""
    for bsym in trc.bound_symbols:
        if id(bsym) in makes:
            inputs = symbolic.inputs_of(next(n for o in bsym.proxy_outs() for n in o.shape
                                             if isinstance(n, torch.SymInt)))
            return set().union(*(names for names, _ in inputs.runtime_checks())) if inputs is not None else set()
    return set()


def _data_dependent_sizes_made(trc) -> dict:
    """id(bound symbol) -> the data-dependent sizes it makes (the first to have each as a dimension of an output,
    where no input does): what generated code binds right after it."""
    seen = {name for a in trc.args for name in symbolic.unbacked_names(tuple(a.shape))}
    makes = {}
    for bsym in trc.bound_symbols:
        new = symbolic.unbacked_names([tuple(o.shape) for o in bsym.proxy_outs()]) - seen
        if new:
            makes[id(bsym)] = new
            seen |= new
    return makes


# Statements that only read: common subexpressions may be merged across them.
_READ_ONLY_STATEMENTS = frozenset({runtime_check, check_inputs_do_not_alias, python_alias})


def _walk(bsym):
    yield bsym
    for sub in bsym.subsymbols:
        yield from _walk(sub)


def _is_barrier(bsym) -> bool:
    """Whether bsym may change what a later identical call computes: a statement that writes
    (an input's write-back, `del`) or switches a mode (grad mode, default dtype, the random
    state), or an opaque op, which may write into its arguments for all thunderfn knows."""
    return any((b.sym.printer is not None and b.sym not in _READ_ONLY_STATEMENTS)
               or ("opaque" in b.sym.tags and "random" not in b.sym.tags) for b in _walk(bsym))


def _is_pure(bsym) -> bool:
    """Whether two calls of bsym with equal arguments compute equal values: not random, not
    opaque, not a statement, nothing kept for its effect (no_dce), throughout its decomposition."""
    return all(b.sym.printer is None and not b.sym.tags & {"no_dce", "opaque", "random"} for b in _walk(bsym))


def makes_new_memory(bsym) -> bool:
    """Whether bsym's outputs are fresh tensors, never views of (or its own) arguments: every
    primitive it decomposes into is elementwise or a reduction."""
    if bsym.subsymbols:
        return all(makes_new_memory(s) for s in bsym.subsymbols)
    return bsym.sym.is_prim and bool(bsym.sym.tags & {"elementwise", "reduction"})


def _visible_in_outputs(trc) -> set:
    """The names whose memory the caller may see in the outputs: the outputs, and what they
    may be views of."""
    visible = output_names(trc)
    for bsym in reversed(trc.bound_symbols):
        if not makes_new_memory(bsym) and any(o.name in visible for o in bsym.proxy_outs()):
            visible.update(a.name for a in bsym.proxy_args())
    return visible


def value_key(x):
    if isinstance(x, TensorProxy):
        return TensorProxy, x.name
    if type(x) is float:  # 0.0 == -0.0 and nan != nan, but each computes as itself
        return float, x.hex()
    if type(x) is complex:
        return complex, x.real.hex(), x.imag.hex()
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        # by its expression: hashing a symbolic number guards it equal to this call's value (pins the size)
        return type(x), x.node.expr
    hash(x)  # unhashable: TypeError, and the call is not merged
    return type(x), x  # 1, 1.0 and True are equal but compute differently


def _call_key(bsym):
    """What makes two calls the same computation: the symbol, the argument structure, and each
    argument (proxies by name, other values by type and value); None when not comparable."""
    leaves, spec = optree.tree_flatten((bsym.args, bsym.kwargs), none_is_leaf=True, namespace="thunderfn")
    try:
        return (bsym.sym, spec, *map(value_key, leaves))
    except TypeError:
        return None


def _rename_arguments(bsym, renamed: dict):
    """bsym reading the proxies renamed maps to by name, in its decomposition too (whose
    calls that read none of them stay as they are: this is most of them)."""
    if not any(isinstance(a, TensorProxy) and a.name in renamed for a in bsym.flat_args()):
        return bsym

    def sub(tree):
        return optree.tree_map(lambda x: renamed.get(x.name, x) if isinstance(x, TensorProxy) else x, tree,
                               none_is_leaf=True, namespace="thunderfn")

    return BoundSymbol(bsym.sym, sub(bsym.args), sub(bsym.kwargs), bsym.output,
                       tuple(_rename_arguments(s, renamed) for s in bsym.subsymbols))


def cse(trc):
    """Common-subexpression elimination: a call that repeats an earlier one (same symbol, equal
    arguments) is dropped and its outputs renamed to the earlier call's everywhere after it.

    Never merged: random ops and anything kept for its effect (no_dce), statements and opaque
    ops (`_is_pure`); calls separated by a statement that writes or switches a mode, or by an
    opaque op (`_is_barrier`: in the functional trace a value changes only there); and two calls
    whose results the caller would both see in the outputs, since eager returns two tensors
    there, and the caller may write into one of them (`_visible_in_outputs`)."""
    visible = _visible_in_outputs(trc)
    renamed: dict = {}  # name of a dropped output -> the earlier proxy that replaces it
    earlier_calls: dict = {}  # call key -> the first such call since the last barrier
    kept = []
    for bsym in trc.bound_symbols:
        if renamed:
            bsym = _rename_arguments(bsym, renamed)
        if _is_barrier(bsym):
            earlier_calls.clear()
        key = _call_key(bsym) if _is_pure(bsym) and bsym.proxy_outs() else None
        earlier = earlier_calls.get(key) if key is not None else None
        if earlier is None:
            if key is not None:
                earlier_calls[key] = bsym
            kept.append(bsym)
            continue
        outs, earlier_outs = bsym.flat_outs(), earlier.flat_outs()
        both_visible = (any(o.name in visible for o in bsym.proxy_outs())
                        and any(o.name in visible for o in earlier.proxy_outs()))
        if both_visible or len(outs) != len(earlier_outs) or any(
                isinstance(o, TensorProxy) != isinstance(e, TensorProxy) or (not isinstance(o, TensorProxy) and o != e)
                for o, e in zip(outs, earlier_outs)):
            kept.append(bsym)
            continue
        for o, e in zip(outs, earlier_outs):
            if isinstance(o, TensorProxy):
                renamed[o.name] = e
                if o.name in visible:
                    visible.add(e.name)
    new = trc.derive("Common Subexpression Elimination", kept)
    if renamed:
        new.output = optree.tree_map(lambda x: renamed.get(x.name, x) if isinstance(x, TensorProxy) else x,
                                     trc.output, none_is_leaf=True, namespace="thunderfn")
    return new


def del_last_used(trc):
    """Insert `del` after the last use of every local that is not returned."""
    returned = output_names(trc)
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
    # (an input that is a constant, a body's captured tensor, is read from where the code binds constants)
    unused_inputs = [a for a in trc.args if a.name not in seen and a.constant is None]
    body = list(reversed(out))
    if unused_inputs:
        body.insert(0, python_del.bind(*unused_inputs, output=None))
    return trc.derive("Delete Last Used", body)


def write_back_on_failure_pass(trc):
    """trc, made to leave its inputs as eager would when an op raises part way: eager has by then
    done the in-place writes before the op, so each input or captured tensor the trace writes back
    is written back on the way out too, with the value of its last write that completed (`written`
    after each value an input held; write_back's `versions` name them). A value computed inside a
    fusion region is there once the region ran (executors/fusion.py outputs what is needed)."""
    write_backs = [b for b in trc.bound_symbols if b.sym is write_back]
    if not write_backs:
        return trc
    slot_of = {}
    for slot, b in enumerate(write_backs):
        for name in (*b.kwargs.get("versions", ()), b.args[1].name):
            slot_of[name] = slot
    slot_of_write_back = {id(b): slot for slot, b in enumerate(write_backs)}
    body = [no_writes_yet.bind(len(write_backs), output=None)]
    for bsym in trc.bound_symbols:
        body.append(bsym)
        if bsym.sym is write_back:  # done: nothing left to write on the way out
            body.append(written.bind(slot_of_write_back[id(bsym)], None, output=None))
            continue
        for o in bsym.proxy_outs():
            if o.name in slot_of:
                body.append(written.bind(slot_of[o.name], o, output=None))
    body += [write_back_on_failure.bind(slot, b.args[0], b.args[2] if len(b.args) > 2 else None, output=None)
             for slot, b in enumerate(write_backs)]
    return trc.derive("Write back on failure", body)
