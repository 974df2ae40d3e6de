"""Repeated blocks: the layers of a model traced, differentiated and lowered once, for every layer alike.

A transformer is a ModuleList of layers of one class, each called in turn. Traced naively, every layer's
Python runs again and every layer's statements are differentiated and lowered again, so the compile grows
with depth however alike the layers are. While `tf.jit(model)` traces forward (module.py), the layers of
each ModuleList or Sequential whose class repeats there (and that have submodules of their own: a block,
not a lone Linear) are called through `_call_layer`: the first call of a layer traces it into a Body
(core/bodies.py) whose captured tensors are the layer's parameters and buffers, and records a
`prims.block(body, operands, captured)`; a later layer that is the same block calls that body, on its own
parameters, without running its Python. Reverse mode differentiates the body once and executor_lower
lowers it once (transforms/rules/control_flow.py, transforms/executor_lower.py), for every call.

Two layers are the same block when:
- their classes, and the classes of their submodules at every relative path, are the same, and so are the
  names, shapes, dtypes, devices and requires_grad of their parameters and buffers;
- the call passes the same structure, the same non-tensor values, and tensors of the same shapes, dtypes,
  devices and requires_grad, under the same grad mode and autocast;
- every guard the first layer's trace recorded (core/guards.py: everything its code read: attributes such
  as GPT-2's `layer_idx`, `training` flags, hooks, attention choices) holds for the other layer, each
  addressed relative to the layer (`attn.layer_idx` of this layer, not of layer 0); what the trace read
  outside the layer (globals, a shared config) is the same object for both. Those guards, for every layer,
  join the compiled entry's guards, as if each layer had been traced.
A layer that differs is traced as a block of its own, which later layers may match. A call passing a list, a
dict or another object (a KV cache) is traced inline; a layer that cannot be traced as a body (it writes in
place into a tensor it did not make, as BatchNorm's running statistics, or returns an object) makes the whole
trace start again with its class traced inline (RetraceInline), as without reuse.

The trace prints each call of a block as `block(block_3, ...)`, the body's statements printed below its
first call only. `tf.jit(model, reuse_blocks=False)` traces every layer inline.

The api layer, below module.py. May import: core/, prims, the torch language.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
import weakref

import torch

from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.block)
from thunderfn.core import context, pytree, symbolic
from thunderfn.core.bodies import Body, trace_body
from thunderfn.core.guards import MODULE_HOOK_TABLES, GuardRecorder, current_recorder, holds, is_watched, read_slot
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import ArgumentTypeError, UnsupportedOpError
from thunderfn.torch.autocast import autocast_state

_STATE_TABLES = ("__dict__", "_parameters", "_buffers", "_modules") + MODULE_HOOK_TABLES
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)
_TENSOR = object()  # in a block's out_values: the place of one of the body's outputs


@dataclasses.dataclass(frozen=True)
class _Relative:
    """A guard's expected object that is a submodule of the block: the same relative path in another layer."""
    path: str


@dataclasses.dataclass
class _Block:
    """One traced layer, which other layers may call: its body; the relative guards (path, table, key,
    expected, how, what) its trace recorded; for each of the body's captured tensors, the relative name of
    the layer's parameter or buffer it is (None: a tensor every layer shares); the structure of the layer's
    output (its tensor leaves are the body's outputs, its other leaves `out_values`)."""
    body: Body
    layer: torch.nn.Module
    guards: list
    captured_names: list
    out_tree: object
    out_values: list  # _TENSOR where the output leaf is a tensor
    operands: tuple  # the first call's operand proxies, for matching shapes
    structure: tuple = ()  # the layer's _structure

    def arguments_for(self, layer: torch.nn.Module, operands: list, structure: tuple, guards,
                      name: str, where: tuple | None = None) -> tuple | None:
        """The captured tensors to call the body with for `layer` (its own parameters and buffers, the shared
        tensors), or None where `layer` is not this block; the translated guards are added to `guards`, with
        their holders' paths from `where`, the layer's (core/guards.py's Path), where known."""
        if structure != self.structure:
            return None
        if not all(_same_value(a, b) for a, b in zip(operands, self.operands)):
            return None
        modules = dict(layer.named_modules())
        translated = []
        for path, table, key, expected, how, what in self.guards:
            holder = _table(modules.get(path), table)
            if holder is None:
                return None
            if isinstance(expected, _Relative):
                expected = modules.get(expected.path)
            if not holds(holder if how == "keys" else read_slot(holder, key), expected, how):
                return None
            holder_path = (None if where is None else
                           where + ((("submodule", path),) if path else ()) + (("attr", table),))
            translated.append((holder, key, expected, how, what.replace(f"'{type(layer).__name__}", f"'{name}", 1),
                               holder_path))
        tensors = _state_tensors(layer)
        captured = []
        for proxy, state_name in zip(self.body.captured, self.captured_names):
            if state_name is None:
                captured.append(proxy)
                continue
            stood = context.stand_in(tensors.get(state_name))
            if stood is None:
                return None
            captured.append(stood)
        if guards is not None:
            for record in translated:
                guards.add(*record)
        return tuple(captured)


class RetraceInline(BaseException):
    """A layer could not be traced as a body (it writes into a tensor it did not make, or returns an object):
    having begun, its trace may have changed the enclosing trace's values, so the whole trace starts again with
    that layer's class traced inline (compile_stages.trace). A BaseException: user code's `except Exception`
    must not swallow it."""


# root module -> the layer classes traced inline in it, learnt by a RetraceInline
_inline_classes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Reuse:
    """The blocks of one trace of a module's forward, by (layer class, call structure, non-tensor values)."""

    def __init__(self, root: torch.nn.Module):
        self.root = root
        self.thread = threading.get_ident()
        self.blocks: dict = {}
        self.names = {id(m): name or type(root).__name__ for name, m in root.named_modules()}


_reuses = threading.local()  # .active: the _Reuse of the trace this thread is building, if any


def _table(module, table: str):
    if module is None:
        return None
    return module.__dict__ if table == "__dict__" else module.__dict__.get(table)


def _state_tensors(layer: torch.nn.Module) -> dict:
    return {**dict(layer.named_parameters(remove_duplicate=False)), **dict(layer.named_buffers(remove_duplicate=False))}


def _structure(layer: torch.nn.Module) -> tuple:
    """What two layers must share to be one block, besides guards: submodule classes, state tensors' metadata."""
    return (tuple((path, type(m)) for path, m in layer.named_modules(remove_duplicate=False)),
            tuple((name, t.shape, t.dtype, t.device, t.requires_grad) for name, t in _state_tensors(layer).items()))


def _same_value(a: TensorProxy, b: TensorProxy) -> bool:
    return (a.dtype == b.dtype and a.device == b.device and a.requires_grad == b.requires_grad
            and symbolic.same_shape(a.shape, b.shape))


# -- what a layer's trace read of its own modules -----------------------------------------------------------
# The guard recorder guards every attribute a frame's code *names* (core/guards.py), which is right for an
# entry (a name in an untaken branch costs nothing) but would make every GPT-2 layer a block of its own: its
# attention names `self.layer_idx` (for a KV cache it is not given). What tells two layers apart is what the
# first one's trace actually read; while it is traced, the layer's modules are of a subclass of their class that
# logs each attribute read, and only the guards on attributes read (or on a module whose __dict__ the code
# read whole) are checked for other layers.
_reads = threading.local()  # .log: the set of (id(module), attribute name) read while a block is traced
_logging_classes: dict = {}


def _logging_class(cls: type) -> type:
    sub = _logging_classes.get(cls)
    if sub is None:
        def __getattribute__(self, name):
            log = getattr(_reads, "log", None)
            # (the module's whole __dict__ read by its own code; nn.Module's machinery and thunderfn read it too)
            if log is not None and (name != "__dict__" or is_watched(sys._getframe(1).f_code.co_filename)):
                log.add((id(self), name))
            return cls.__getattribute__(self, name)

        sub = _logging_classes[cls] = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__,
                                                                   "__qualname__": cls.__qualname__,
                                                                   "__module__": cls.__module__})
    return sub


@contextlib.contextmanager
def _logging_reads(layer: torch.nn.Module):
    """The set of (id(module), attribute) the code reads of the layer's modules while this is open."""
    modules = list({id(m): m for m in layer.modules()}.values())
    classes = [type(m) for m in modules]
    log = set()
    for m, cls in zip(modules, classes):
        m.__class__ = _logging_class(cls)
    _reads.log = log
    try:
        yield log
    finally:
        _reads.log = None
        for m, cls in zip(modules, classes):
            m.__class__ = cls


def _relative_guards(layer: torch.nn.Module, recorded, read: set) -> list:
    """The guards `recorded` (a GuardSet) whose slots belong to the layer or its submodules and that its trace
    `read` (see above), addressed by relative path; the others (globals, closures, objects the layer shares)
    hold for every layer alike."""
    where, paths = {}, {}
    for path, module in layer.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), path)
        for table in _STATE_TABLES:
            holder = _table(module, table)
            if holder is not None:
                where.setdefault(id(holder), (path, table))
    relative = []
    read_by_path = {}
    for module_id, name in read:
        read_by_path.setdefault(paths.get(module_id), set()).add(name)
    for holder, key, expected, how, what in recorded.records.values():
        slot = where.get(id(holder))
        if slot is None:
            continue
        names = read_by_path.get(slot[0], ())
        if slot[1] in ("__dict__", "_parameters", "_buffers", "_modules") and key not in names \
                and "__dict__" not in names:
            continue
        if how == "id" and id(expected) in paths and isinstance(expected, torch.nn.Module):
            expected = _Relative(paths[id(expected)])
        relative.append((*slot, key, expected, how, what))
    return relative


def _only_tuples(value) -> bool:
    """Whether value holds its tensors in tuples alone: a list, a dict or a cache object passed to a layer may be
    changed by it (a KV cache's update), which a body could not do to the caller's object."""
    if type(value) is tuple:
        return all(_only_tuples(v) for v in value)
    return isinstance(value, TensorProxy) or type(value) in _PLAIN


def _flatten_call(args, kwargs):
    """(tensor leaves, the call's structure with the other leaves' values), or None where a leaf is neither a
    traced tensor nor a plain value, or sits in a container other than a tuple (such a call is traced inline)."""
    if not (_only_tuples(args) and all(_only_tuples(v) for v in kwargs.values())):
        return None
    leaves, tree = pytree.tree_flatten((args, kwargs))
    operands, values = [], []
    for leaf in leaves:
        if isinstance(leaf, TensorProxy):
            operands.append(leaf)
            values.append(None)
        elif type(leaf) in _PLAIN:
            values.append((type(leaf), leaf))
        else:
            return None
    return operands, (tree, tuple(values))


def _trace_call(fn, args, kwargs, operands: list, recorder: GuardRecorder, layer=None) -> tuple:
    """(the Body fn(*args, **kwargs) traces into, its operands the call's tensors; the output's structure;
    its non-tensor leaves, _TENSOR at the body's outputs; what the code read of the layer's modules), recording
    with `recorder` the state fn read."""
    leaves, tree = pytree.tree_flatten((args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, TensorProxy)]
    made = {"read": set()}

    def run(*tensors):
        given = list(leaves)
        for i, t in zip(positions, tensors):
            given[i] = t
        a, k = pytree.tree_unflatten(tree, given)
        with recorder, (_logging_reads(layer) if layer is not None else contextlib.nullcontext(set())) as log:
            out = fn(*a, **k)
        made["read"] = log
        out_leaves, made["tree"] = pytree.tree_flatten(out)
        made["values"] = [_TENSOR if isinstance(leaf, TensorProxy) else leaf for leaf in out_leaves]
        if any(v is not _TENSOR and type(v) not in _PLAIN for v in made["values"]):
            raise ArgumentTypeError("a block's output leaves must be tensors or plain values")
        return tuple(leaf for leaf in out_leaves if isinstance(leaf, TensorProxy))

    run.__name__ = getattr(fn, "__name__", type(fn).__name__) if layer is None else type(layer).__name__
    body = trace_body(run, tuple(operands), "block")
    return body, made["tree"], made["values"], made["read"]


def _trace_block(layer, forward, args, kwargs, operands: list) -> _Block:
    recorder = GuardRecorder(layer)
    body, out_tree, out_values, read = _trace_call(forward, args, kwargs, operands, recorder, layer)
    names = {}
    for name, t in _state_tensors(layer).items():
        stood = context.stand_in(t)
        if stood is not None:
            names.setdefault(stood.name, name)
    return _Block(body, layer, _relative_guards(layer, recorder.guards, read),
                  [names.get(p.name) for p in body.captured], out_tree, out_values, tuple(operands), _structure(layer))


def _called(block_body: Body, operands: list, captured: tuple, out_tree, out_values):
    outputs = iter(prims.block(block_body, tuple(operands), captured))
    return pytree.tree_unflatten(out_tree, [next(outputs) if v is _TENSOR else v for v in out_values])


def _call_layer(layer: torch.nn.Module, forward, *args, **kwargs):
    """The layer's forward, while a trace with reuse is built in this thread: a call of its block."""
    reuse = getattr(_reuses, "active", None)
    if reuse is None or reuse.thread != threading.get_ident() or context.current_trace() is None:
        return forward(*args, **kwargs)
    flat = _flatten_call(args, kwargs)
    if flat is None:
        return forward(*args, **kwargs)
    operands, call = flat
    # (grad mode and autocast change what a layer's trace records: a layer called under torch.no_grad() is
    # another block than one called with grad on)
    key = (type(layer), call, torch.is_grad_enabled(), autocast_state())
    recorder = current_recorder()
    guards, where = (recorder.guards, recorder.path_of(layer)) if recorder is not None else (None, None)
    structure = _structure(layer)
    captured = None
    for block in reuse.blocks.get(key, ()):
        captured = block.arguments_for(layer, operands, structure, guards, reuse.names.get(id(layer), "layer"),
                                       where)
        if captured is not None:
            break
    else:
        try:
            block = _trace_block(layer, forward, args, kwargs, operands)
        except (UnsupportedOpError, ArgumentTypeError) as e:
            _inline_classes.setdefault(reuse.root, set()).add(type(layer))
            raise RetraceInline(f"{type(layer).__name__}: {e}") from e
        reuse.blocks.setdefault(key, []).append(block)
        captured = tuple(block.body.captured)
    return _called(block.body, operands, captured, block.out_tree, block.out_values)


def repeated_layers(root: torch.nn.Module) -> list:
    """The layers reuse applies to: children of a ModuleList or Sequential whose class appears there more than
    once, that have submodules of their own and no hooks, and no `forward` of their own instance (and whose
    class has not been found to need tracing inline: RetraceInline)."""
    found, inline = [], _inline_classes.get(root, ())
    for container in root.modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = [m for m in container.children()]
        counts = {}
        for m in children:
            counts[type(m)] = counts.get(type(m), 0) + 1
        for m in children:
            if (counts[type(m)] > 1 and type(m) not in inline and next(m.children(), None) is not None
                    and "forward" not in m.__dict__
                    and not any(m.__dict__.get(t) for t in MODULE_HOOK_TABLES)):
                found.append(m)
    return found


@contextlib.contextmanager
def reusing_blocks(root: torch.nn.Module):
    """While forward of `root` is traced in this thread, its repeated layers are called as blocks (the module
    docstring). Each layer's class forward is reached through an instance attribute, removed afterwards; other
    threads calling the layers meanwhile run their own forward."""
    layers = repeated_layers(root)
    if not layers or getattr(_reuses, "active", None) is not None:
        yield
        return
    for layer in layers:
        layer.__dict__["forward"] = functools.partial(_call_layer, layer, type(layer).forward.__get__(layer))
    _reuses.active = _Reuse(root)
    try:
        yield
    finally:
        _reuses.active = None
        for layer in layers:
            layer.__dict__.pop("forward", None)



# -- on request, for a function: torch.compiler.nested_compile_region --------------------------------------------
@dataclasses.dataclass
class _Region:
    """One trace of a region function: its body, the state its code read (a GuardSet), its output's form."""
    body: Body
    guards: object
    out_tree: object
    out_values: list
    operands: tuple

    def holds_for(self, operands: list) -> bool:
        return (not self.body.captured and all(_same_value(a, b) for a, b in zip(operands, self.operands))
                and self.guards.failure() is None)


def nested_compile_region(fn):
    """fn, whose calls inside a traced function are traced, differentiated and lowered once per signature and
    share that code (torch.compiler.nested_compile_region; a layer called many times). A later call reuses the
    first one's code where its tensors have the same shapes, dtypes, devices and requires_grad, its other
    arguments are equal, and everything fn's code read (globals, closed-over values, as jit's guards) is
    unchanged. Tensors fn reads other than its arguments (a weight it closes over) are traced into each call
    anew: pass them as arguments to share the code. Arguments in lists, dicts or other objects are traced inline.
    Called outside a trace, it is fn. (A module's repeated layers need nothing: tf.jit(model) reuses them.)

        >>> import torch, thunderfn as tf
        >>> @tf.nested_compile_region
        ... def layer(x, w):
        ...     return torch.tanh(x @ w)
        >>> def net(x, ws):
        ...     for w in ws:
        ...         x = layer(x, w)
        ...     return x.sum()
        >>> ws = [torch.randn(4, 4) for _ in range(3)]
        >>> trace = tf.trace(net, torch.randn(2, 4), ws)
        >>> sum(b.sym.name == "block" for b in trace.bound_symbols)
        3
    """
    if not callable(fn):
        raise ArgumentTypeError(f"nested_compile_region expects a callable, got {type(fn).__name__}")

    @functools.wraps(fn)
    def region(*args, **kwargs):
        trc = context.current_trace()
        flat = _flatten_call(args, kwargs) if trc is not None else None
        if flat is None:
            return fn(*args, **kwargs)
        operands, call = flat
        key = (id(region), call, torch.is_grad_enabled(), autocast_state())
        regions = trc.__dict__.setdefault("_regions", {}).setdefault(key, [])
        found = next((r for r in regions if r.holds_for(operands)), None)
        if found is None:
            recorder = GuardRecorder(fn)
            body, out_tree, out_values, _ = _trace_call(fn, args, kwargs, operands, recorder)
            found = _Region(body, recorder.guards, out_tree, out_values, tuple(operands))
            regions.append(found)
        return _called(found.body, operands, tuple(found.body.captured), found.out_tree, found.out_values)

    return region
