"""The torch.compile backend: what thunderfn does with each graph Dynamo hands it.

Dynamo calls `backend(gm, example_inputs)` once per graph it captures, between graph breaks,
and calls what the backend returns every time its guards say that graph runs. For each graph:

1. thunderfn compiles the whole graph with tf.jit (graph_runner.graph_function, compiled
   with Dynamo's example inputs right away, so the first call runs compiled code);
2. where that fails, one checking trace finds every node thunderfn cannot take and why
   (splitting.py); the graph is cut around them, thunderfn compiles the pieces it can take,
   and the others run eagerly (or through Inductor, `unsupported="inductor"`);
3. what happened is recorded for `explain` (report.py): the graph, why Dynamo ended it, the
   pieces, the reasons.

Dynamo's guards decide when a graph is new; the jitted function of a graph keeps thunderfn's
cache only for what Dynamo passes as values (the sizes of a dynamic-shape graph: thunderfn
specializes on each until it has symbolic shapes) and for grad mode, which both key on.

The api layer. It never imports torch._dynamo: Dynamo imports it when it calls the backend.
"""
from __future__ import annotations

import inspect
import sys
import warnings

import torch
import torch.fx

from thunderfn.core.call_time import Guarded
from thunderfn.dynamo.graph_runner import graph_function
from thunderfn.dynamo.report import GraphRecord, Piece, Records
from thunderfn.dynamo.splitting import KnownOnlyAtRunTime, concrete, example_value, split_around, unsupported_nodes
from thunderfn.errors import ArgumentTypeError, ArgumentValueError
from thunderfn.jit import jit_with_options
from thunderfn.jit_options import NAMES as JIT_OPTIONS
from thunderfn.jit_options import JitOptions

UNSUPPORTED_RUNNERS = ("eager", "inductor")
_KNOWN_OPTIONS = frozenset(JIT_OPTIONS) - {"distributed"} | {"unsupported"}  # tf.jit's, but not distributed


def _known(options: dict, where: str) -> dict:
    """options, each a known option's (`where` they were given, for the message)."""
    unknown = sorted(set(options) - _KNOWN_OPTIONS)
    if unknown:
        raise ArgumentValueError(f"Unexpected optimization option {', '.join(map(repr, unknown))} for the thunderfn "
                                 f"backend ({where}); known options: {', '.join(sorted(_KNOWN_OPTIONS))}")
    return options


def _parsed(options: dict) -> tuple[JitOptions, str]:
    """(tf.jit's options among `options`, each value checked: jit_options.py; what runs the graph pieces
    thunderfn cannot take)."""
    runner = options.get("unsupported", "eager")
    if runner not in UNSUPPORTED_RUNNERS:
        raise ArgumentValueError(f"unsupported must be one of {UNSUPPORTED_RUNNERS} (what runs the graph pieces "
                                 f"thunderfn cannot take), got {runner!r}")
    return JitOptions(**{name: value for name, value in options.items() if name != "unsupported"}), runner


class Backend:
    """A torch.compile backend that compiles Dynamo's graphs with thunderfn (see module docstring).
    `options` are tf.jit's (executors, fusion, rematerialize, cache_dir, cache_size_limit, ...),
    plus `unsupported`: what runs graph pieces thunderfn cannot take, "eager" or "inductor"."""

    def __init__(self, **options):
        self.given = _known(options, "tf.dynamo.backend")
        self.options, self.runner = _parsed(options)  # checked once, here
        self.records = Records()
        self.__name__ = "thunderfn"

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.given.items())
        return f"thunderfn.dynamo.backend({shown})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, *, mode=None, options=None):
        if not isinstance(gm, torch.fx.GraphModule):
            raise ArgumentTypeError(f"the thunderfn backend expects a torch.fx.GraphModule (Dynamo's graph), got "
                                    f"{type(gm).__name__}")
        parsed, runner = self.options, self.runner
        if options:  # torch.compile(options=...)'s, over the backend's own
            parsed, runner = _parsed({**self.given, **_known(dict(options), "torch.compile(options=...)")})
        record = GraphRecord.of(gm, mode)
        self.records.add(_compiling_wrapper(), record)
        return compile_graph(gm, list(example_inputs), parsed, runner, record)

    def reset(self) -> None:  # torch._dynamo.reset() calls it: the graphs it forgets leave the report too
        self.records.clear()

    def __deepcopy__(self, memo):
        # One backend, as a function is one: Lightning (imported by litgpt) wraps torch.compile to deep-copy its
        # keyword arguments and replay them later, and the report's lock cannot be copied.
        return self


def _compiling_wrapper():
    """The torch.compile(...) call's backend wrapper calling this backend (torch's _TorchCompileWrapper):
    the report keeps each compiled object's graphs apart by it. None where torch calls us otherwise."""
    frame = sys._getframe(2)
    caller = frame.f_locals.get("self") if frame.f_code.co_name == "__call__" else None
    return caller if caller is not None and hasattr(caller, "compiler_fn") else None


def _compile_piece(gm: torch.fx.GraphModule, examples: list | None, options: JitOptions):
    """(gm compiled by tf.jit, what Dynamo calls). The entry for these inputs is compiled now, not
    at the first call (then, where an input's size is known only at run time).

    Dynamo calls a graph only where its guards hold: the same grad mode, autocast state and
    default dtype, and for a graph with static shapes each input's shape, strides, dtype, device
    and requires_grad. Such a graph's compiled entry is what Dynamo calls, without thunderfn's
    check of the same facts (about a microsecond per input: a model's parameters are inputs),
    unless the entry relies on more (guards on Python state, input layouts, state read per call).
    A graph with sizes among its inputs (Dynamo's dynamic shapes) is compiled with those dimensions
    symbolic, once for every size, where each size input is a dimension of a tensor input (see
    _sizes_read_from_tensors); otherwise it keeps tf.jit's cache, one entry per size."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sizes = _sizes_read_from_tensors(placeholders) if examples is not None else None
    if sizes:
        return _compile_symbolic_piece(gm, examples, [_recorded(n) for n in placeholders], options, sizes)
    jitted = jit_with_options(graph_function(gm), options)
    if examples is None:
        return jitted, jitted
    examples = tuple(concrete(x) for x in examples)
    entry = jitted._thunderfn_state.precompile(examples, {})
    static = all(isinstance(x, torch.Tensor) for x in examples)
    if entry is None or not static or entry.guards_hold is not None or entry.layout or isinstance(entry.fn, Guarded):
        return jitted, jitted
    return jitted, entry.fn


def _recorded(placeholder: torch.fx.Node):
    """What Dynamo recorded for a graph input: a fake tensor (its sizes symbolic where Dynamo made them so), a
    SymInt, or None."""
    return placeholder.meta.get("example_value", placeholder.meta.get("val"))


def _sizes_read_from_tensors(placeholders: list) -> dict | None:
    """{position of a size input: (position of a tensor input, dim)} where every size Dynamo passes (a SymInt
    input) is exactly a dimension of a tensor it passes too (`s0` and `x` of shape (s0, 8)), or unused by the
    graph (then None: Dynamo passes sizes a piece does not read); else None."""
    examples = [_recorded(n) for n in placeholders]
    if not any(isinstance(x, torch.SymInt) for x in examples):
        return None
    dims = {}
    for j, x in enumerate(examples):
        if isinstance(x, torch.Tensor):
            for d, n in enumerate(x.shape):
                if isinstance(n, torch.SymInt):
                    dims.setdefault(n.node.expr, (j, d))
    sizes = {}
    for i, (x, node) in enumerate(zip(examples, placeholders)):
        if isinstance(x, torch.SymInt) and not node.users:
            sizes[i] = None
        elif isinstance(x, torch.SymInt):
            if x.node.expr not in dims:
                return None  # a size no tensor holds (an unbacked one, say): passed as a value
            sizes[i] = dims[x.node.expr]
        elif isinstance(x, (torch.SymFloat, torch.SymBool)):
            return None
    return sizes


def _compile_symbolic_piece(gm: torch.fx.GraphModule, examples: list, recorded: list, options: JitOptions, sizes: dict):
    """(the jitted graph, what Dynamo calls) for a graph whose size inputs are dimensions of its tensor inputs:
    the jitted function takes the other inputs and reads each size from its tensor, and the dimensions Dynamo
    made symbolic are symbolic in thunderfn's trace (tf.jit's dynamic shapes), so one entry serves every size."""
    run_graph = graph_function(gm)
    kept = [i for i in range(len(examples)) if i not in sizes]
    at = {i: k for k, i in enumerate(kept)}

    def size(i, args):
        if sizes[i] is None:
            return 0  # (an input the graph does not read)
        j, d = sizes[i]
        return args[at[j]].shape[d]

    def with_sizes_from_tensors(*args):
        return run_graph(*[size(i, args) if i in sizes else args[at[i]] for i in range(len(examples))])

    with_sizes_from_tensors.__name__ = getattr(run_graph, "__name__", "graph")
    jitted = jit_with_options(with_sizes_from_tensors, options)
    tensors = [recorded[i] for i in kept if isinstance(recorded[i], torch.Tensor)]
    jitted._thunderfn_state.marked_dynamic = {
        k: frozenset(d for d, n in enumerate(t.shape) if isinstance(n, torch.SymInt)) for k, t in enumerate(tensors)}
    jitted._thunderfn_state.precompile(tuple(concrete(examples[i]) for i in kept), {})

    def call(*args):
        return jitted(*[args[i] for i in kept])

    return jitted, call


def _run_elsewhere(gm: torch.fx.GraphModule, examples: list | None, runner: str):
    if runner == "inductor" and examples is not None:
        from torch._inductor.compile_fx import compile_fx  # Inductor only when asked for: it costs seconds to import
        return compile_fx(gm, [concrete(x) for x in examples])
    return gm.forward


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, options: JitOptions, runner: str,
                  record: GraphRecord):
    """The callable Dynamo runs for gm (see module docstring)."""
    try:
        jitted, call = _compile_piece(gm, example_inputs, options)
    except Exception as whole_error:  # noqa: BLE001  (the check below says which nodes, or the graph runs elsewhere)
        error = whole_error  # the error reported if no node is to blame: the compile's, or the check's own
        try:
            unsupported = unsupported_nodes(gm, [concrete(x) for x in example_inputs])
        except Exception as check_error:  # noqa: BLE001
            unsupported = []
            error = check_error
        if not unsupported:
            record.pieces.append(Piece(runner, gm, error=f"{type(error).__name__}: {error}"))
            warnings.warn(f"thunderfn's torch.compile backend runs the graph ending at {record.where} "
                          f"{'eagerly' if runner == 'eager' else 'through Inductor'}: thunderfn could not compile it "
                          f"({type(error).__name__}: {error}). tf.dynamo.explain(compiled) lists it.",
                          stacklevel=2)
            return _run_elsewhere(gm, example_inputs, runner)
        return _compile_split(gm, example_inputs, options, runner, record, unsupported)
    record.pieces.append(Piece("thunderfn", gm, fn=jitted))
    return call


def _compile_split(gm, example_inputs, options, runner, record, unsupported):
    for u in unsupported:
        if u.higher_order_op is not None:
            warnings.warn(f"thunderfn's torch.compile backend runs torch.ops.higher_order.{u.higher_order_op} "
                          f"{'eagerly' if runner == 'eager' else 'through Inductor'} (node {u.node} of the graph "
                          f"ending at {record.where}): {u.reason}", stacklevel=3)
    split, takes = split_around(gm, {u.node for u in unsupported})
    originals = {n.name: n for n in gm.graph.nodes}
    inputs = {n.name: x for n, x in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs)}
    reasons = {u.node: u for u in unsupported}
    # Grad mode flows from piece to piece: split_module starts each piece of a no_grad region with
    # the switch but leaves the switch a piece makes for the next one, as eager code would (and
    # compiled code does). The mode each piece starts in is known here (Dynamo guards the mode the
    # graph is called in): each thunderfn piece is compiled for it, and is called in it.
    grad_mode = torch.is_grad_enabled()
    for node in list(split.graph.nodes):
        if node.op != "call_module":
            continue
        piece_gm = getattr(split, node.target)
        ours = takes[int(node.target.rpartition("_")[2])]
        try:
            examples = [inputs[p.target] if p.target in inputs
                        else example_value(originals[p.target].meta["example_value"])
                        for p in piece_gm.graph.nodes if p.op == "placeholder"]
        except KnownOnlyAtRunTime:  # a data-dependent size: compiled at the first call
            examples = None
        if ours:
            try:
                with torch.set_grad_enabled(grad_mode):
                    jitted, fn = _compile_piece(piece_gm, examples, options)
                record.pieces.append(Piece("thunderfn", piece_gm, fn=jitted))
            except Exception as e:  # noqa: BLE001
                fn = _run_elsewhere(piece_gm, examples, runner)
                record.pieces.append(Piece(runner, piece_gm, error=f"{type(e).__name__}: {e}"))
        else:
            fn = _run_elsewhere(piece_gm, examples, runner)
            why = [reasons[n.name] for n in piece_gm.graph.nodes if n.name in reasons]
            record.pieces.append(Piece(runner, piece_gm, unsupported=why))
        grad_mode = _mode_after(piece_gm, grad_mode)
        # the split graph calls `self.submod_k(...)`: a plain attribute now, the piece's callable
        del split._modules[node.target]
        object.__setattr__(split, node.target, fn)
    return split.forward


def _mode_after(gm: torch.fx.GraphModule, mode: bool) -> bool:
    """The grad mode gm leaves when called in `mode`: its last switch's."""
    switches = [n.args[0] for n in gm.graph.nodes if n.target is torch._C._set_grad_enabled]
    return bool(switches[-1]) if switches else mode


def find_backend(compiled) -> tuple[Backend | None, object]:
    """(the thunderfn Backend, the torch.compile wrapper) behind what torch.compile returned."""
    if isinstance(compiled, Backend):
        return compiled, None
    context = getattr(compiled, "dynamo_ctx", None)  # a compiled nn.Module
    if context is None and getattr(compiled, "__closure__", None):  # a compiled function: its wrapper's closure
        context = inspect.getclosurevars(compiled).nonlocals.get("self")
    # Dynamo's callback wraps the backend in debugging wrappers, around torch.compile's wrapper, around ours
    wrapper, obj = None, getattr(getattr(context, "callback", None), "_torchdynamo_orig_backend", None)
    for _ in range(8):
        if obj is None or isinstance(obj, Backend):
            break
        wrapper, obj = obj, getattr(obj, "_torchdynamo_orig_backend", None) or getattr(obj, "compiler_fn", None)
    return (obj if isinstance(obj, Backend) else None), wrapper

