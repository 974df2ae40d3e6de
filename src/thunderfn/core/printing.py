"""Traces as Python source, and that source compiled into the function we run.

Every statement is annotated with its output's metadata; a composite's
decomposition follows it as nested comments. Values that have no literal form
(captured tensors, executor callables, enum members) are bound by name in the
namespace the source is executed in, so no value's repr ever becomes code.
"""
from __future__ import annotations

import builtins
import itertools
import linecache
import math
import re
import weakref

import optree
import torch

from thunderfn.core import artifacts, symbolic
from thunderfn.core.proxies import CAPTURED, TensorProxy
from thunderfn.core.pytree import NAMESPACE
from thunderfn.errors import ArgumentRuntimeError, ArgumentValueError, InternalError

ARGS_LIST = "args_list"  # the one parameter of a function whose trace has args_in_list (a reserved name)

_MODULE_IMPORTS = {
    "torch": "import torch",
    "prims": "from thunderfn import prims",
    "clang": "from thunderfn import clang",
    "ltorch": "import thunderfn.torch as ltorch",
}
_generated = itertools.count()


class Namespace(dict):
    """Names the printed code refers to, besides its own locals; `origins` says where each
    constant tensor came from, when not from the traced function's captures."""

    def __init__(self):
        super().__init__()
        self.origins: dict[str, str] = {}
        self.symbols: set[str] = set()  # the symbolic sizes the code computes with (core/symbolic.py)
        # data-dependent sizes the code has bound so far (from the inputs, or from an op's output right after it),
        # and the torch._check facts about them it has checked (see _bind_data_dependent_sizes)
        self.bound: set[str] = set()
        self.checked: set = set()
        self.bodies_printed: set[str] = set()  # a body shared by many calls (a repeated layer) prints once
        # whether each statement's decomposition and the bodies it calls follow it as comments: in what prints,
        # not in the source compiled (most of its text: rendering them was a sixth of a long program's compile)
        self.decompositions = True

    def bind_object(self, obj, prefix: str = "_obj") -> str:
        for name, value in self.items():
            if value is obj and name.startswith(prefix):
                return name
        name = f"{prefix}{sum(1 for k in self if k.startswith(prefix))}"
        self[name] = obj
        return name


def format_value(x, ns: Namespace) -> str:
    """x as a Python expression: a proxy by its name, a literal as itself, anything else by a name bound in ns."""
    if isinstance(x, TensorProxy):
        return _format_proxy(x, ns)
    format_literal = _LITERAL_FORMATS.get(type(x))  # exact types: a subclass (an IntEnum) is bound by name
    if format_literal is not None:
        return format_literal(x, ns)
    if isinstance(x, (torch.SymInt, torch.SymFloat)):  # a number computed from symbolic sizes: its expression
        ns.symbols |= symbolic.symbols_in(x)
        return symbolic.python(x)
    if type(x) is dict and all(type(k) in (str, int, bool) for k in x):
        return "{" + ", ".join(f"{k!r}: {format_value(v, ns)}" for k, v in x.items()) + "}"
    name = getattr(x, "__name__", None)
    if callable(getattr(x, "nested_lines", None)):  # a body (core/bodies.py), printed below by its own unique name
        ns[name] = x
        return name
    if callable(x) and isinstance(name, str) and name.isidentifier():  # a function an op calls: by its name
        return ns.bind_object(x, f"_{name}_")
    return ns.bind_object(x)


def _format_proxy(x: TensorProxy, ns: Namespace) -> str:
    if x.constant is not None:
        ns[x.name] = x.constant
        if x.origin and x.origin != (CAPTURED,):
            ns.origins[x.name] = "; ".join(x.origin)
    return x.name


def _format_float(x: float, ns: Namespace) -> str:
    if math.isnan(x):
        return "float('nan')"
    if math.isinf(x):
        return "float('inf')" if x > 0 else "-float('inf')"
    return repr(x)


def _format_tuple(x: tuple, ns: Namespace) -> str:
    inner = ", ".join(format_value(v, ns) for v in x)
    return f"({inner},)" if len(x) == 1 else f"({inner})"


def _format_repr(x, ns: Namespace) -> str:
    return repr(x)


def _format_str(x, ns: Namespace) -> str:
    return str(x)


# The values with a literal form, by exact type.
_LITERAL_FORMATS = {
    type(None): _format_repr, bool: _format_repr, int: _format_repr, str: _format_repr,
    float: _format_float,
    complex: lambda x, ns: f"complex({format_value(x.real, ns)}, {format_value(x.imag, ns)})",
    torch.dtype: _format_str, torch.memory_format: _format_str, torch.layout: _format_str,
    torch.device: lambda x, ns: f"torch.device({str(x)!r})",
    torch.Size: lambda x, ns: f"torch.Size([{', '.join(format_value(v, ns) for v in x)}])",
    tuple: _format_tuple,
    list: lambda x, ns: "[" + ", ".join(format_value(v, ns) for v in x) + "]",
    slice: lambda x, ns: f"slice({format_value(x.start, ns)}, {format_value(x.stop, ns)}, {format_value(x.step, ns)})",
    type(Ellipsis): lambda x, ns: "...",
}


def format_call(bsym, ns: Namespace) -> str:
    parts = [format_value(a, ns) for a in bsym.args]
    for k in bsym.kwargs:
        if not (isinstance(k, str) and k.isidentifier()):
            raise ArgumentValueError(f"keyword argument name {k!r} of {bsym.sym.print_name} is not an identifier")
    parts += [f"{k}={format_value(v, ns)}" for k, v in bsym.kwargs.items()]
    if not all(part.isidentifier() for part in bsym.sym.print_name.split(".")):
        # generated code is compiled: a name that is not a dotted identifier would be code, not a name
        raise ArgumentValueError(f"{bsym.sym.name!r} prints as {bsym.sym.print_name!r}, which is not a "
                                 "(dotted) Python name")
    for name, value in bsym.sym.namespace.items():  # an executor's operator named like a helper must not replace it
        if ns.setdefault(name, value) is not value:
            raise ArgumentValueError(f"generated code would bind '{name}' to two different objects "
                                     f"({bsym.sym.print_name} and an earlier name); rename the operator "
                                     "(register_operator's name)")
    return f"{bsym.sym.print_name}({', '.join(parts)})"


def format_target(out) -> str | None:
    """The assignment target for a bound symbol's output; `_` marks unused slots."""
    if out is None:
        return None
    if isinstance(out, TensorProxy):
        return out.name
    if isinstance(out, (tuple, list)):  # namedtuples and torch.return_types unpack like tuples
        inner = [format_target(o) or "_" for o in out]
        return f"({inner[0]},)" if len(inner) == 1 else f"({', '.join(inner)})"
    return "_"


def _unpackable(out) -> bool:
    """Can an assignment target bind every proxy in out (dicts cannot be unpacked)?"""
    if isinstance(out, (tuple, list)):
        return all(_unpackable(o) for o in out)
    return isinstance(out, TensorProxy) or not any(
        isinstance(o, TensorProxy) for o in optree.tree_leaves(out, none_is_leaf=True, namespace=NAMESPACE))


def _tree_leaves(tree) -> list:
    return optree.tree_leaves(tree, none_is_leaf=True, namespace=NAMESPACE)


def _annotation(out) -> str:
    proxies = [o for o in optree.tree_leaves(out, none_is_leaf=True, namespace=NAMESPACE) if isinstance(o, TensorProxy)]
    return ", ".join(f"{p.name}: {p.type_string()}" for p in proxies)


def format_bsym(bsym, indent: int = 0, ns: Namespace | None = None, comment: bool = False,
                bodies_shown: bool = False) -> list[str]:
    ns = Namespace() if ns is None else ns
    pad = "  " * indent
    if bsym.sym.printer is not None:
        line = bsym.sym.printer(bsym, ns)
    else:
        target = format_target(bsym.output)
        call = format_call(bsym, ns)
        if not _unpackable(bsym.output):  # e.g. a dict of tensors: bind its leaves
            ns["tree_leaves"] = _tree_leaves
            target, call = format_target(_tree_leaves(bsym.output)), f"tree_leaves({call})"
        line = f"{target} = {call}" if target is not None else call
    note = _annotation(bsym.output)
    if note:
        line = f"{line}  # {note}"
    lines = [f"{pad}# {line}" if comment else f"{pad}{line}"]
    if not ns.decompositions:
        return lines if comment else lines + _bind_data_dependent_sizes(bsym.output, ns, pad)
    bodies = [] if bodies_shown else _bodies(bsym)
    for body in bodies:  # a control-flow primitive's bodies (core/bodies.py), shown as a decomposition is
        if body.__name__ in ns.bodies_printed:
            lines.append(f"{pad}  # ({body.__name__}: printed above, where it is first called)")
            continue
        ns.bodies_printed.add(body.__name__)
        lines += [f"{pad}  # {body_line}" for body_line in body.nested_lines()]
    for sub in bsym.subsymbols:  # (a lowered primitive's subsymbol calls the bodies shown above)
        lines += format_bsym(sub, indent + 1, Namespace(), comment=True, bodies_shown=bool(bodies) or bodies_shown)
    if not comment:
        lines += _bind_data_dependent_sizes(bsym.output, ns, pad)
    return lines


def _bodies(bsym) -> list:
    """The bodies among bsym's arguments: objects that can print their statements (core/bodies.py's Body,
    which this module cannot import: bodies.py imports trace.py, which imports this)."""
    return [a for a in bsym.args if callable(getattr(a, "nested_lines", None))]


def _bind_data_dependent_sizes(out, ns: Namespace, pad: str) -> list[str]:
    """`u0 = t5.shape[0]` for each data-dependent size an op's output has as a dimension that the code has not
    bound yet (the op just made it: core/symbolic.py), then a check of each torch._check fact about the sizes
    bound so far that reads one of these, raising RuntimeError as torch._check does where it does not hold."""
    lines, new, inputs = [], set(), None
    for p in _tree_leaves(out):
        for d, n in enumerate(p.shape if isinstance(p, TensorProxy) else ()):
            name = symbolic.bare_symbol(n)
            if name is not None and name not in ns.bound and symbolic.is_unbacked(n):
                ns.bound.add(name)
                new.add(name)
                lines.append(f"{pad}{name} = {p.name}.shape[{d}]")
                inputs = symbolic.inputs_of(n)
    for names, source in (inputs.runtime_checks() if inputs is not None else ()):
        if names & new and names <= ns.bound and source not in ns.checked:
            ns.checked.add(source)
            message = f"Expected {source} to be True, but got False (a torch._check of a data-dependent size)"
            ns["ArgumentRuntimeError"] = ArgumentRuntimeError  # (a RuntimeError, as torch._check raises)
            lines += [f"{pad}if not ({source}):", f"{pad}  raise ArgumentRuntimeError({message!r})"]
    return lines


def format_output(out, ns: Namespace) -> str:
    """A Python expression that rebuilds the traced function's output structure."""
    def literal(x) -> bool:
        if type(x) in (tuple, list):
            return all(literal(v) for v in x)
        if type(x) is dict:
            return all(type(k) in (str, int, bool) for k in x) and all(literal(v) for v in x.values())
        leaves, _ = optree.tree_flatten(x, none_is_leaf=True, namespace=NAMESPACE)
        return len(leaves) == 1 and leaves[0] is x

    if literal(out):
        return format_value(out, ns)
    leaves, spec = optree.tree_flatten(out, none_is_leaf=False, namespace=NAMESPACE)
    ns["tree_unflatten"] = optree.tree_unflatten
    return f"tree_unflatten({ns.bind_object(spec, '_out_spec')}, {format_value(list(leaves), ns)})"


# Statements that switch a global mode: symbol id -> reads (mode kind, new value, value before)
# off the bound symbol. Grad mode is boolean and recorded only where it changed; a default-dtype
# switch carries the dtype it replaced (core/statements.py).
_MODE_SWITCHES = {
    "python.set_grad_enabled": lambda b: ("grad", bool(b.args[0]), not b.args[0]),
    "python.set_default_dtype": lambda b: ("dtype", b.args[0], b.args[1]),
}


def _switch(bsym):
    """(mode kind, value switched to, value before) for a mode-switching statement, else None."""
    read = _MODE_SWITCHES.get(bsym.sym.id) if not isinstance(bsym, tuple) else None
    return read(bsym) if read is not None else None


def _nest_restores(bsyms: list) -> list:
    """The statements as a tree: a statement tagged `restores_state` (torch.set_rng_state(t3))
    whose state was read earlier in the same list (t3 = torch.get_rng_state()) encloses what
    runs in between, printed as try/finally: the traced code's fork_rng/freeze_rng_state
    restored the state on the way out even when an op raised, so the compiled code must too.
    Items are bound symbols or (body items, restoring bound symbols)."""
    produced = {o.name: i for i, b in enumerate(bsyms) for o in b.proxy_outs()}
    spans: list[list[int]] = []  # [read, first restore, last restore]
    for j, b in enumerate(bsyms):
        if "restores_state" in b.sym.tags and b.args and isinstance(b.args[0], TensorProxy):
            i = produced.get(b.args[0].name)
            if i is None or i >= j:
                continue
            last = spans[-1] if spans else None
            if last is not None and i == last[0] + 1 and all(b.sym.id == "python.del" for b in bsyms[last[2] + 1:j]):
                last[0], last[2] = i, j  # fork_rng reads CPU then CUDA state, restores both in one finally
            elif all(j < a or i > c or (a < i and j < b_) or (i < a and c < j) for a, b_, c in spans):
                spans.append([i, j, j])  # only blocks that nest: a crossing one stays a plain statement
    block = {i + 1: (j, c) for i, j, c in spans}  # the try starts right after the (last) read

    def build(lo: int, hi: int) -> list:
        items, k = [], lo
        while k < hi:
            end = block.get(k) if k > lo else None  # build(k, ...) is that block itself
            if end is not None:
                items.append((build(k, end[0]), bsyms[end[0]:end[1] + 1]))
                k = end[1] + 1
            else:
                items.append(bsyms[k])
                k += 1
        return items

    return build(0, len(bsyms))


def _modes_after(items: list, modes: dict) -> dict:
    modes = dict(modes)
    for item in items:
        if isinstance(item, tuple):
            modes = _modes_after(item[0], modes)
        elif _switch(item) is not None:
            kind, value, _ = _switch(item)
            modes[kind] = value
    return modes


def _format_block(items: list, ns: Namespace, indent: int, modes: dict) -> tuple[list[str], dict]:
    """Lines for items at this indent, and the modes after them. A mode switch that a later
    switch at the same level undoes (a `with torch.no_grad():` block in the traced code, a
    default dtype set and set back) encloses what runs in between in try/finally, the switch
    back in the `finally`, so an exception raised there leaves the caller's mode as eager's
    `with` block or try/finally would. (A `with` statement would read better but costs a
    microsecond per call; two C calls and a `try` cost a tenth of that.) A switch that is
    never undone, or whose block would cross another, stays a plain statement."""
    lines, k, pad, modes = [], 0, "  " * indent, dict(modes)
    while k < len(items):
        item = items[k]
        if isinstance(item, tuple):
            body, restores = item
            inner, modes = _format_block(body, ns, indent + 1, modes)
            lines += [f"{pad}try:", *(inner or [f"{pad}  pass"]), f"{pad}finally:"]
            for restore in restores:
                lines += format_bsym(restore, indent + 1, ns)
            k += 1
            continue
        switch = _switch(item)
        if switch is None:
            lines += format_bsym(item, indent, ns)
            k += 1
            continue
        kind, value, _ = switch
        before = modes.get(kind)
        end = next((m for m in range(k + 1, len(items)) if _switch(items[m]) is not None
                    and _switch(items[m])[0] == kind), None)
        if (before is not None and value != before and end is not None and _switch(items[end])[1] == before
                and _modes_after(items[k + 1:end], {kind: value})[kind] == value):
            inner, _ = _format_block(items[k + 1:end], ns, indent + 1, {**modes, kind: value})
            if inner:  # an empty block switches nothing
                lines += [*format_bsym(item, indent, ns), f"{pad}try:", *inner, f"{pad}finally:",
                          *format_bsym(items[end], indent + 1, ns)]
            k = end + 1
            continue
        lines += format_bsym(item, indent, ns)
        modes[kind], k = value, k + 1
    return lines, modes


def format_body(bsyms: list, ns: Namespace, indent: int = 1) -> list[str]:
    """The statements of a function body, with the traced code's scoped changes of global
    state (grad mode, default dtype, RNG state) printed as try/finally blocks that undo them
    on the way out. Statements tagged `on_exit` run on the way out whatever happens: a
    `finally` enclosing the statements after the first one (which sets up what they read)."""
    on_exit = [b for b in bsyms if "on_exit" in b.sym.tags]
    if on_exit:
        first, rest = bsyms[0], [b for b in bsyms[1:] if "on_exit" not in b.sym.tags]
        pad = "  " * indent
        return [*format_bsym(first, indent, ns), f"{pad}try:", *(format_body(rest, ns, indent + 1) or [f"{pad}  pass"]),
                f"{pad}finally:", *(line for b in on_exit for line in format_bsym(b, indent + 1, ns))]
    entry = {}  # each mode's value when the function starts: what its first switch replaced
    for b in bsyms:
        switch = _switch(b)
        if switch is not None:
            entry.setdefault(switch[0], switch[2])
    return _format_block(_nest_restores(bsyms), ns, indent, entry)[0]


def render(trc, decompositions: bool = True) -> tuple[str, Namespace]:
    """(trc's Python source, the namespace it runs in); `decompositions`: whether each statement's decomposition
    follows it as comments (Namespace.decompositions)."""
    ns = Namespace()
    ns.decompositions = decompositions
    ns.bound = _held(trc)
    body = [f"  # {a.name}: {a.type_string()}" for a in trc.args]
    body += format_body(trc.bound_symbols, ns)
    body.append(f"  return {format_output(trc.output, ns)}")
    clash = _local_names(trc) & ns.keys()
    if clash:  # a parameter named `_out_spec0` or like an executor operator would shadow that global
        return render(_renamed(trc, clash), decompositions)
    # one comment line whatever a pass (or an executor's name in it) says: the source is compiled
    header = [f"# {' '.join(trc.provenance.splitlines())}"] if trc.provenance else []
    header += [line for name, line in _MODULE_IMPORTS.items() if _uses(body, name)]
    header += [f"# {name}: {_describe(value)} ({ns.origins.get(name, 'captured by the traced function')})"
               for name, value in ns.items() if isinstance(value, torch.Tensor)]
    # after the inputs' comments (what the body bound right after an op is not bound again)
    body[len(trc.args):len(trc.args)] = _symbol_bindings(trc, ns.symbols - (ns.bound - _held(trc)))
    params = ", ".join([*(a.name for a in trc.args), *trc.size_args])
    if trc.args_in_list:  # the caller's list is its only reference to each tensor: emptied, each dies at its del
        n_params = len(trc.args) + len(trc.size_args)
        unpack = ([f"  {params}{',' if n_params == 1 else ''} = {ARGS_LIST}", f"  {ARGS_LIST}.clear()"]
                  if n_params else [])
        body, params = unpack + body, ARGS_LIST
    source = "\n".join(header + ["", f"def {trc.def_name}({params}):", *body]) + "\n"
    return source, ns


def _symbol_bindings(trc, needed: set) -> list[str]:
    """`s0 = x.shape[1]` for each symbolic size the code uses, from the first input holding it as a
    dimension (the line says where the size comes from); the others are the trace's size parameters."""
    lines, bound = [], set(trc.size_args)
    for a in trc.args:
        for d, n in enumerate(a.shape):
            name = symbolic.bare_symbol(n)
            if name in needed and name not in bound:
                bound.add(name)
                lines.append(f"  {name} = {a.name}.shape[{d}]")
    if needed - bound:
        raise InternalError(f"the trace of '{trc.fn_name}' computes with the symbolic sizes {sorted(needed - bound)}, "
                            f"which none of its inputs holds as a dimension and it is not given")
    return lines


def _held(trc) -> set:
    """The symbols an input holds as a dimension, and the size parameters."""
    return {symbolic.bare_symbol(n) for a in trc.args for n in a.shape} - {None} | set(trc.size_args)


def _local_names(trc) -> set:
    return {a.name for a in trc.args} | {o.name for b in trc.bound_symbols for o in b.proxy_outs()
                                         if o.constant is None}


def _renamed(trc, names: set):
    """trc with the proxies called `names` renamed, so they stop shadowing globals."""
    mapping = {}
    for p in [*trc.args, *(o for b in trc.bound_symbols for o in b.proxy_outs())]:
        if p.name in names and p.name not in mapping:
            mapping[p.name] = TensorProxy(trc.names.take(prefix=f"{p.name}_"), shape=p.shape, dtype=p.dtype,
                                          device=p.device, requires_grad=p.requires_grad, origin=p.origin)
    swap = lambda x: mapping.get(x.name, x) if isinstance(x, TensorProxy) else x  # noqa: E731
    new = trc.derive(trc.provenance, [b.swap(mapping) for b in trc.bound_symbols])
    new.args = [swap(a) for a in trc.args]
    new.output = optree.tree_map(swap, trc.output, none_is_leaf=True, namespace=NAMESPACE)
    return new


def _describe(t: torch.Tensor) -> str:
    return TensorProxy.type_string(t)  # same "device dtype[shape]" form as proxies


def _uses(lines, module: str) -> bool:
    pattern = re.compile(rf"(?<![\w.]){module}\.")
    return any(pattern.search(line) for line in lines if not line.lstrip().startswith("#"))


def format_trace(trc) -> str:
    return render(trc)[0]


def compile_trace(trc):
    source, ns = render(trc, decompositions=False)
    # a file of its own where a cache directory is configured (core/artifacts.py), else a name for linecache
    fn = compile_source(source, trc.def_name, ns, artifacts.write_source(trc.def_name, source))
    fn.__thunderfn_namespace__ = ns  # what its globals are (a compiled entry written to disk says: disk_cache.py)
    return fn


def compile_source(source: str, def_name: str, ns: dict, filename: str | None = None):
    """The function `def_name` that source (generated code) defines, run with the globals in ns."""
    filename = filename or f"<thunderfn generated {next(_generated)}>"
    # Registering the source lets tracebacks and debuggers show generated lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    globals_ = {"__builtins__": builtins, "__name__": "thunderfn_generated", **ns}
    exec(compile(source, filename, "exec"), globals_)
    fn = globals_[def_name]
    fn.__thunderfn_source__ = source
    weakref.finalize(fn, linecache.cache.pop, filename, None)  # a dropped cache entry takes its source along
    return fn
