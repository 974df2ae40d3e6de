"""Bodies: functions traced once into traces of their own, which control-flow primitives call.

`trace_body(fn, operands, name)` traces fn once on stand-ins for its operands (a pytree of
tensors) into a Trace of its own, sharing the enclosing trace's names. Tensors of the enclosing
trace that fn reads without taking them as operands (a closure over a weight) become inputs of
the body after its operands, its `captured` proxies, which the primitive passes to it; so do the
enclosing trace's proxies of real tensors fn closes over (a module's weights), as the enclosing
trace's constants.

A Body is called with flat tensors (its operands' leaves, then its captured tensors) and returns
the flat leaves of fn's output. It runs its trace as generated code: the trace it was traced into
or, once lowered onto executors (transforms/executor_lower.py), the execution trace, compiled
once. Printed, a bound symbol that calls bodies shows each body's statements below it, as a
decomposition's are shown.

May import: the rest of core/ (trace.py, tracer.py and below), errors.py.
"""
from __future__ import annotations

import itertools

import optree

from thunderfn.core import context
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_unflatten
from thunderfn.core.symbol import BoundSymbol
from thunderfn.core.trace import Trace
from thunderfn.core.tracer import tracing
from thunderfn.errors import ArgumentTypeError, UnsupportedOpError

_ids = itertools.count()


class Body:
    """A function traced once (see the module docstring). `trace`: its trace, whose inputs are its
    operands' leaves then `captured`'s stand-ins; `out_tree`: the structure of fn's output, whose
    leaves `outputs` (the trace's output proxies) are; `fn_name`: fn's name, for errors."""

    def __init__(self, name: str, fn_name: str, trace: Trace, n_operands: int, captured: tuple, out_tree):
        self.__name__ = name  # how generated code names it: a callable bound by name (core/printing.py)
        self.fn_name = fn_name
        self.trace = trace
        self.n_operands = n_operands
        self.captured = captured
        self.out_tree = out_tree
        self._run = None
        self._derived: dict = {}  # see once()

    @property
    def outputs(self) -> list:
        return list(self.trace.output)

    def once(self, key, make):
        """make(), computed once per key for this body: what every call of a shared body (a repeated layer's
        block) reuses, such as its derivative or its lowering. `forget(key)` drops it."""
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def forget(self, key) -> None:
        self._derived.pop(key, None)

    def lowered(self, lower) -> "Body":
        """This body with its trace replaced by lower(trace) (an execution trace)."""
        return Body(self.__name__, self.fn_name, lower(self.trace), self.n_operands, self.captured, self.out_tree)

    def nested_lines(self) -> list[str]:
        """Its trace's statements, for printing below the bound symbol that calls it."""
        params = ", ".join(p.name for p in self.trace.args)
        return [f"def {self.__name__}({params}):"] + ["  " + line for line in _statements(self.trace)]

    def inline(self, *flat, env: dict | None = None):
        """Record the body's statements into the trace being built, on these inputs (its operands' leaves
        then its captured tensors): what a rule that differentiates or batches the body starts from (the
        drivers transform what is recorded). Each statement is recorded as it is, under fresh names, not
        traced again (no decomposition made anew). Returns the flat outputs; `env`, when given, is filled with
        each of the body's values (by name) as recorded here."""
        tracer = context.current_tracer()
        names = {p.name: v for p, v in zip(self.trace.args, flat)}
        for bsym in self.trace.bound_symbols:
            for p in _made(bsym):
                if p.name not in names:
                    names[p.name] = TensorProxy.like(p)
            tracer.emit(renamed(bsym, names))
        if env is not None:
            env.update(names)
        return tuple(names.get(o.name, o) if isinstance(o, TensorProxy) else o for o in self.trace.output)

    def statements_as(self, flat: tuple, outputs: tuple) -> list | None:
        """The body's statements with its inputs renamed to `flat` and its outputs to `outputs` (a call's
        output proxies): the call inlined into the trace that makes it, each value inside keeping its name
        (unique: every trace shares its enclosing trace's names). None where that cannot be done by renaming:
        an output that is an input, or the same value twice."""
        made = {o.name for b in self.trace.bound_symbols for o in b.proxy_outs()}
        own = [o.name for o in self.trace.output]
        if len(set(own)) != len(own) or not set(own) <= made:
            return None
        names = {p.name: v for p, v in zip(self.trace.args, flat)}
        names.update({o.name: new for o, new in zip(self.trace.output, outputs)})
        return [renamed(b, names) for b in self.trace.bound_symbols]

    def runner(self):
        """The body's generated function, compiled once: flat tensors in, the tuple of its flat outputs out
        (what a loop calls each step, without __call__'s checks)."""
        if self._run is None:
            self._run = self.trace.python_callable()
        return self._run

    def __call__(self, *flat):
        out = self.runner()(*flat)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def __repr__(self) -> str:
        return f"<body {self.__name__} of {self.fn_name}>"


def renamed(bsym, names: dict):
    """bsym with the proxies named in `names` replaced by their entries, in its arguments, outputs and
    decomposition."""
    def sub(tree):
        return optree.tree_map(lambda x: names.get(x.name, x) if isinstance(x, TensorProxy) else x, tree,
                               none_is_leaf=True, namespace="thunderfn")

    return BoundSymbol(bsym.sym, sub(bsym.args), sub(bsym.kwargs), sub(bsym.output),
                       tuple(renamed(s, names) for s in bsym.subsymbols))


def _made(bsym):
    """The proxies bsym makes: its outputs, and its decomposition's values."""
    yield from bsym.proxy_outs()
    for sub in bsym.subsymbols:
        yield from _made(sub)


def _statements(trc: Trace) -> list[str]:
    lines = str(trc).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def "))
    return [line.strip("\n")[2:] if line.startswith("  ") else line for line in lines[start + 1:]]


def trace_body(fn, operands, kind: str) -> Body:
    """Trace fn(*operands) once into a Body (the module docstring). `operands`: a tuple of pytrees
    of tensors (TensorProxy objects of the enclosing trace, or tensors), each leaf a stand-in's
    example; `kind` names the body in generated code (cond_true, scan_body, ...)."""
    outer = context.current_trace()
    if outer is None:
        raise UnsupportedOpError(f"{kind}: bodies are traced inside a trace being built")
    leaves, in_tree = tree_flatten(operands)
    for leaf in leaves:
        if not isinstance(leaf, TensorProxy):
            raise ArgumentTypeError(f"{kind}: every operand must be a tensor, got {type(leaf).__name__} (pass Python "
                                    f"values by closing over them)")
    fn_name = getattr(fn, "__name__", type(fn).__name__)
    trc = Trace(fn_name, names=outer.names)
    with tracing(trc) as tracer:
        inputs = [TensorProxy.like(leaf) for leaf in leaves]
        trc.args = list(inputs)
        out = fn(*tree_unflatten(in_tree, inputs))
        out_leaves, out_tree = tree_flatten(out)
        for leaf in out_leaves:
            if not isinstance(leaf, TensorProxy):
                raise ArgumentTypeError(f"{kind} '{fn_name}': every output must be a tensor, got "
                                        f"{type(leaf).__name__}")
        # (a tensor of the enclosing trace written in place: the body's inputs, or what it captures, whose
        # proxy objects the write has renamed; the error ends the enclosing trace, now inconsistent, too)
        own = {p.name for p in inputs} | {o.name for b in trc.bound_symbols for o in b.proxy_outs()}
        if tracer.mutated or tracer.written_names - own:
            raise UnsupportedOpError(f"{kind} '{fn_name}' writes in place into a tensor it did not make; return the "
                                     f"new value instead")
    captured = _captured(trc)
    trc.args = inputs + captured
    trc.output = tuple(out_leaves)
    return Body(f"{kind}_{next(_ids)}", fn_name, trc, len(inputs), tuple(captured), out_tree)


def body_of_region(bsyms: list, fn_name: str, kind: str) -> Body:
    """A Body of statements already recorded in the trace being built (a region of it): its inputs the
    values they read from outside, its outputs every tensor they make, under the same names, so that the
    primitive calling it can stand in their place."""
    outer = context.current_trace()
    trc = Trace(fn_name, names=outer.names)
    trc.bound_symbols = list(bsyms)
    captured = _captured(trc)
    outputs = list({o.name: o for b in bsyms for o in b.proxy_outs()}.values())
    trc.args, trc.output = list(captured), tuple(outputs)
    return Body(f"{kind}_{next(_ids)}", fn_name, trc, 0, tuple(captured), tree_flatten(tuple(outputs))[1])


def _captured(trc: Trace) -> list:
    """Proxies the body reads that neither its inputs nor its own statements make: the enclosing trace's,
    its captured tensors among them (a module's weights), so that the enclosing trace sees them read by the
    call and differentiates with respect to those that require grad."""
    known = {p.name for p in trc.args}
    captured, seen = [], set()

    def visit(bsyms):
        for bsym in bsyms:
            for p in bsym.proxy_args():
                if p.name not in known and p.name not in seen:
                    seen.add(p.name)
                    captured.append(p)
            known.update(o.name for o in bsym.proxy_outs())

    visit(trc.bound_symbols)
    for p in trc.output if isinstance(trc.output, (tuple, list)) else ():
        if isinstance(p, TensorProxy) and p.name not in known and p.name not in seen:
            seen.add(p.name)
            captured.append(p)
    return captured
