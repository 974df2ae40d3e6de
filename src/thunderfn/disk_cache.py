"""Compiled entries on disk: a new process calling the same program on the same signature starts warm.

With `cache_dir` set (`tf.jit(fn, cache_dir=...)` or `$THUNDERFN_CACHE_DIR`), each compiled entry that can be
described without this process's objects is written to `<cache_dir>/entries/<lookup>/`, one JSON file per
entry, and a call that misses jit's cache in memory looks there before it traces. What a file holds:

- the generated Python source of each function the entry runs (the forward and backward of a split, the bodies
  its repeated layers share), and for every global name that source uses, how to find its value again: a
  module or a module-level function by its import name (executors' operators, torch's functions), a constant
  tensor thunderfn made (a lifted number) by its values, an output structure by its node types;
- how the entry calls them: torch.autograd's split (which outputs are differentiable, what is saved, how the
  user's output structure is rebuilt), and the call-time checks its trace asked for (torch's SDPA switches);
- its guards (core/guards.py), each slot by its path from the jitted function or from a module's globals: a
  value by its exact JSON form, an object compared by identity by its type (identity does not cross processes:
  the guard is re-established on the object now at that path, where it is of the recorded type);
- the source files of all the code the trace ran through, by content hash.

`<lookup>` hashes what is known before tracing: thunderfn's own source, torch's and Python's versions, the
executors and options, the jitted module's class or function, and the call's cache key (structure, each
tensor's shape, dtype, device and requires_grad, every other argument's value, grad mode, default dtype). An
entry found there is used only where every file it ran through is unchanged, every guard path leads to what
it recorded and every guard holds for this call; otherwise it is skipped (and the compile that follows writes
a new one). Nothing is unpickled: the only code loaded is the generated source, compiled as it is when made,
and only from a tree that passes the check the kernel caches pass (core/artifacts.py: every folder and file
this user's own, none a symlink, none writable by others).

Not written (the entry stays in memory; `tf.cache_info(fn)["disk"]` says why): entries with symbolic sizes,
with fusion regions (Inductor's kernels have their own cache under cache_dir), with captured tensors, with
`.grad` reads or an optimizer's state read at call time, with donated inputs, under autocast or a distribution,
and functions that are not found by name (a lambda, a nested function: their code is not keyed by a file
alone). A loaded entry's traces are its source only (`tf.last_traces` prints it).

The api layer: imported by jit.py.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import types

import optree
import torch
from torch.utils import _pytree as torch_pytree

from thunderfn import executors as _executors
from thunderfn.cache_entry import CacheEntry
from thunderfn.cache_key import CacheKey, TensorPart
from thunderfn.compile_stages import cyclic_gc_paused
from thunderfn.core import artifacts, portable, pytree
from thunderfn.core.call_time import Guarded
from thunderfn.core.guards import GuardSet
from thunderfn.core.portable import NotPortable
from thunderfn.core.printing import compile_source
from thunderfn.executors.torch_rewrites import UnlessFunctorch
from thunderfn.torch.opaque import aten_call_named
from thunderfn.transforms.autograd_split import CompiledSplit

FORMAT = 2
# how objects that generated code calls and that are made at run time (one per operator) are found again: their
# `__thunderfn_found_by__` is (a key here, its arguments)
FINDERS = {"aten_call": aten_call_named}
_KEY_VALUE_TYPES = (type(None), bool, int, str, float, complex, slice, torch.dtype, torch.device)


# -- what keys an entry ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _thunderfn_fingerprint() -> str:
    """A hash of thunderfn's own source: an entry made by other code of ours is never loaded."""
    root = os.path.dirname(os.path.abspath(__file__))  # (the package: this module is at its top)
    digest = hashlib.sha256()
    for folder, subfolders, files in sorted(os.walk(root)):
        subfolders.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


_file_hashes: dict = {}  # path -> ((mtime_ns, size), sha256)


def file_hash(path: str) -> str | None:
    """The sha256 of a file's contents (read again only when its modification time or size changed), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    known = _file_hashes.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
    _file_hashes[path] = (stamp, digest)
    return digest


def _program(fn) -> list:
    """What the jitted function is, by name: a jitted module's class, or a module-level function."""
    module = getattr(fn, "__thunderfn_module__", None)
    if module is not None:
        found = portable.where(type(module))
        if found is None:
            raise NotPortable(f"the module's class {type(module).__qualname__} is not found by name")
        return ["module", *found]
    found = portable.where(fn)
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if found is None and isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        named = portable.locate(module, qualname)  # a function jitted where it is defined (@tf.jit): the name holds
        if getattr(getattr(named, "_thunderfn_state", None), "fn", None) is fn:  # its jitted form
            found = (module, qualname)
    if found is None:
        raise NotPortable(f"'{getattr(fn, '__qualname__', fn)}' is not found by its name (a lambda or a function "
                          f"defined inside another)")
    return ["function", *found]


def _key_form(key: CacheKey) -> list:
    if key.autocast:
        raise NotPortable("it was compiled under autocast")
    leaves = []
    for part in key.leaves:
        if type(part) is TensorPart:
            leaves.append(["tensor", list(part.shape), portable.encode(part.dtype), str(part.device),
                           part.requires_grad])
        elif part.kind in _KEY_VALUE_TYPES:
            leaves.append(["value", part.kind.__name__, portable.encode(part.value)])
        else:
            raise NotPortable(f"an argument of type {part.kind.__name__} is in its cache key")
    return [str(key.structure), key.grad_enabled, portable.encode(key.default_dtype), leaves]


def _options_form(state) -> list:
    options = state.options
    if options.distributed is not None or options.donate_argnums or state.marked_dynamic:
        raise NotPortable("it is distributed, donates inputs or has dimensions marked dynamic")
    executors = _executors.resolve(options.executors, fallback=options.fallback)
    fusion = options.fusion if isinstance(options.fusion, (bool, str)) else getattr(options.fusion, "name", None)
    return [[[ex.name, type(ex).__module__, type(ex).__qualname__] for ex in executors], options.fallback,
            list(options.static_argnums), list(options.static_argnames), options.disable_torch_autograd,
            options.rematerialize, fusion, options.dynamic, options.reuse_blocks]


def lookup(state, key: CacheKey) -> str:
    """The folder name of the entries for this jitted function's call with this (named) key; NotPortable where
    the call cannot be looked up on disk."""
    text = json.dumps([FORMAT, _thunderfn_fingerprint(), torch.__version__, sys.version, platform.machine(),
                       _program(state.fn), _options_form(state), _key_form(key)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# -- generated functions and what their globals are ---------------------------------------------------------
class _Writing:
    """What writing one entry collects besides its functions: the bodies they call (name -> form), and the files
    of the user's functions they call by name (their code is not traced through, but the trace relied on it)."""

    def __init__(self):
        self.bodies: dict = {}
        self.files: set = set()


def _function_form(f, writing: _Writing) -> dict:
    if isinstance(f, UnlessFunctorch):
        if f.plain is None:
            f.plain = f.make_plain()
        return {"unless_functorch": [_function_form(f.rewritten, writing), _function_form(f.plain, writing)]}
    if getattr(f, "__thunderfn_no_grad__", None) is not None:
        return {"no_grad": _function_form(f.__thunderfn_no_grad__, writing)}
    source = getattr(f, "__thunderfn_source__", None)
    if source is None:
        raise NotPortable(f"it runs a {type(f).__name__}, not generated code")
    known = getattr(f, "__thunderfn_form__", None)  # (an entry written again: its functions' forms are the same)
    if known is not None:
        form, bodies, files = known
        writing.bodies.update(bodies)
        writing.files |= files
        return form
    inner = _Writing()
    namespace = f.__thunderfn_namespace__
    refs = {}
    for name, value in f.__globals__.items():
        if name in ("__builtins__", "__name__") or value is f:
            continue
        refs[name] = _reference(name, value, namespace, inner)
    form = {"source": source, "name": f.__name__, "globals": refs}
    f.__thunderfn_form__ = (form, inner.bodies, inner.files)
    writing.bodies.update(inner.bodies)
    writing.files |= inner.files
    return form


def _reference(name: str, value, namespace, writing: _Writing) -> list:
    """How the value a generated function's global `name` holds is found again (the module docstring)."""
    if isinstance(value, types.ModuleType):
        if sys.modules.get(value.__name__) is not value:
            raise NotPortable(f"the generated code's {name} is a module not imported by its name")
        return ["module", value.__name__]
    if callable(getattr(value, "nested_lines", None)) and callable(getattr(value, "runner", None)):  # a Body
        if value.__name__ not in writing.bodies:
            writing.bodies[value.__name__] = None  # (a body that calls itself is written once)
            writing.bodies[value.__name__] = _function_form(value.runner(), writing)
        return ["body", value.__name__]
    found_by = getattr(value, "__thunderfn_found_by__", None)  # an object of ours made per operator (a FINDERS key)
    if found_by is not None:
        return ["found", *found_by]
    if isinstance(value, torch.Tensor):
        return ["tensor", *_tensor_form(name, value, namespace)]
    if isinstance(value, optree.PyTreeSpec):
        return ["spec", _spec_form(value)]
    found = portable.where(value) if callable(value) or isinstance(value, type) else None
    if found is not None:
        if isinstance(value, types.FunctionType) and found[0].split(".")[0] not in ("torch", "thunderfn"):
            writing.files.add(value.__code__.co_filename)
        return ["object", *found]
    try:
        return ["value", portable.encode(value)]
    except NotPortable:
        raise NotPortable(f"the generated code's {name} is a {type(value).__name__} made in this process, not found "
                          f"again by name (a fusion region, an executor's closure)") from None


def _tensor_form(name: str, t: torch.Tensor, namespace) -> list:
    # (thunderfn's own constants are numbers made tensors, 0-dimensional: a captured tensor is the user's, whose
    # values another process may not share)
    if name not in namespace.origins or type(t) is not torch.Tensor or t.requires_grad or t.dim() != 0 \
            or t.is_complex():
        raise NotPortable(f"the generated code's {name} is a tensor the function captured")
    values = t.detach().cpu().flatten().tolist()
    if t.is_floating_point():
        values = [v.hex() for v in values]
    return [portable.encode(t.dtype), list(t.shape), str(t.device), values]


def _tensor(dtype, shape, device, values) -> torch.Tensor:
    dtype = portable.decode(dtype)
    if dtype.is_floating_point:
        values = [float.fromhex(v) for v in values]
    return torch.tensor(values, dtype=dtype, device=device).reshape(shape)


class _LoadedBody:
    """A body (core/bodies.py) loaded from disk: called as a Body is, with its generated function."""

    def __init__(self, name: str):
        self.__name__ = name
        self.fn = None

    def runner(self):
        return self.fn

    def __call__(self, *flat):
        out = self.fn(*flat)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class _OnFirstCall:
    """A loaded function compiled when first called: one a warm start may never run (the full backward, where
    the first process ran the backward for outputs without gradients; the variant for torch.func's transforms)."""

    def __init__(self, load):
        self.load, self.fn = load, None

    def __call__(self, *args):
        if self.fn is None:
            self.fn = self.load()
        return self.fn(*args)


def _loaded_function(form: dict, bodies: dict, path: str, lazily: bool = False):
    if lazily:
        return _OnFirstCall(lambda: _loaded_function(form, bodies, path))
    if "unless_functorch" in form:
        rewritten_form, plain_form = form["unless_functorch"]
        return UnlessFunctorch(_loaded_function(rewritten_form, bodies, path),
                               lambda: _loaded_function(plain_form, bodies, path))
    if "no_grad" in form:
        return torch.no_grad()(_loaded_function(form["no_grad"], bodies, path))
    namespace = {name: _resolved(ref, bodies) for name, ref in form["globals"].items()}
    # compiled without its comment lines (each statement's decomposition: most of the text, and of the time
    # compiling it takes); tf.last_traces prints it whole (LoadedTrace)
    code = "\n".join(line for line in form["source"].splitlines() if not line.lstrip().startswith("#")) + "\n"
    return compile_source(code, form["name"], namespace, f"<thunderfn {form['name']} from {path}>")


def _resolved(ref: list, bodies: dict):
    kind, *rest = ref
    if kind == "module":
        module = sys.modules.get(rest[0])
        if module is None:
            raise NotPortable(f"module {rest[0]} is not imported")
        return module
    if kind == "body":
        return bodies[rest[0]]
    if kind == "tensor":
        return _tensor(*rest)
    if kind == "spec":
        return _spec(rest[0])
    if kind == "object":
        value = portable.locate(*rest)
        if portable.missing(value):
            raise NotPortable(f"{rest[0]}.{rest[1]} is not found")
        return value
    if kind == "value":
        return portable.decode(rest[0])
    if kind == "found" and rest[0] in FINDERS:
        return FINDERS[rest[0]](*rest[1:])
    raise NotPortable(f"an unknown reference {kind!r}")


# -- output structures (optree specs) by their node types -----------------------------------------------------
def _spec_form(spec) -> list:
    example = optree.tree_unflatten(spec, list(range(spec.num_leaves)))
    return [str(spec), spec.none_is_leaf, _tree_form(example)]


def _tree_form(x) -> list:
    t = type(x)
    if t is int:
        return ["leaf", x]
    if x is None:
        return ["none"]
    if t in (tuple, list):
        return [t.__name__, [_tree_form(c) for c in x]]
    if t is dict:
        return ["dict", [[portable.encode(k), _tree_form(c)] for k, c in x.items()]]
    found = portable.where(t)
    if found is not None and optree.is_namedtuple(x):
        return ["namedtuple", *found, [_tree_form(c) for c in x]]
    node = torch_pytree.SUPPORTED_NODES.get(t)
    if found is not None and node is not None:
        children, context = node.flatten_fn(x)
        return ["torch_node", *found, portable.encode(context), [_tree_form(c) for c in children]]
    raise NotPortable(f"an output structure holds a {t.__name__}")


def _tree(form):
    kind, *rest = form
    if kind == "leaf":
        return rest[0]
    if kind == "none":
        return None
    if kind in ("tuple", "list"):
        return (tuple if kind == "tuple" else list)(_tree(c) for c in rest[0])
    if kind == "dict":
        return {portable.decode(k): _tree(c) for k, c in rest[0]}
    cls = portable.locate(rest[0], rest[1])
    if kind == "namedtuple" and isinstance(cls, type):
        return cls(*(_tree(c) for c in rest[2]))
    node = torch_pytree.SUPPORTED_NODES.get(cls) if isinstance(cls, type) else None
    if kind == "torch_node" and node is not None:
        return node.unflatten_fn([_tree(c) for c in rest[3]], portable.decode(rest[2]))
    raise NotPortable(f"an output structure's {kind} {rest[:2]} is not found")


def _spec(form):
    text, none_is_leaf, tree = form
    pytree.adopt_torch_registrations()
    spec = optree.tree_structure(_tree(tree), none_is_leaf=none_is_leaf, namespace=pytree.NAMESPACE)
    if str(spec) != text:
        raise NotPortable(f"the output structure {text} is rebuilt as {spec}")
    return spec


# -- how an entry calls its functions -----------------------------------------------------------------------
def _runner_form(fn, writing: _Writing) -> dict:
    call_time = []
    if isinstance(fn, Guarded):
        if fn.grad_reads:
            raise NotPortable("its trace reads a .grad at call time")
        for guard in fn.guards:
            found = portable.where(getattr(guard, "func", None)) if isinstance(guard, functools.partial) else None
            if found is None or guard.keywords:
                raise NotPortable("its trace checks state of this process at call time (an optimizer's)")
            call_time.append([*found, [portable.encode(a) for a in guard.args]])
        fn = fn.fn
    if isinstance(fn, CompiledSplit):
        if fn.captured or fn.constants or fn.modified_residuals or fn.size_plan or fn.n_numbers:
            raise NotPortable("its split captures tensors or takes sizes or numbers")
        plan = {name: portable.encode(getattr(fn, name)) for name in CompiledSplit.PLAN}
        without = [[sorted(absent), _function_form(backward, writing)]
                   for absent, backward in fn.backward_by_absent.items() if backward is not None]
        return {"call_time": call_time, "split": plan, "out_spec": _spec_form(fn.out_spec),
                "forward": _function_form(fn.forward, writing), "backward": _function_form(fn.backward, writing),
                "without": without}
    return {"call_time": call_time, "plain": _function_form(fn, writing)}


def _loaded_runner(form: dict, bodies: dict, path: str):
    if "split" in form:
        plan = {name: portable.decode(value) for name, value in form["split"].items()}
        without = {frozenset(absent): _loaded_function(f, bodies, path) for absent, f in form["without"]}
        fn = CompiledSplit.restored(plan, _spec(form["out_spec"]), _loaded_function(form["forward"], bodies, path),
                                    _loaded_function(form["backward"], bodies, path, lazily=bool(without)), without)
    else:
        fn = _loaded_function(form["plain"], bodies, path)
    guards = []
    for module, qualname, args in form["call_time"]:
        check = portable.locate(module, qualname)
        if portable.missing(check):
            raise NotPortable(f"{module}.{qualname} is not found")
        guards.append(functools.partial(check, *(portable.decode(a) for a in args)))
    if guards:
        fn = Guarded(fn, (), guards)
        if fn.guard(()) is not None:
            raise NotPortable(fn.guard(()))
    return fn


class LoadedTrace:
    """A trace of an entry loaded from disk: only its generated source is here."""

    layout_reads: dict = {}  # (CacheEntry reads its first trace's: an entry written relies on none)

    def __init__(self, name: str, source: str):
        self.fn_name, self.source = name, source

    def __str__(self) -> str:
        return self.source

    __repr__ = __str__

    def __getattr__(self, name):
        raise AttributeError(f"this trace of '{self.fn_name}' was loaded from cache_dir (a warm start): only its "
                             f"source is here (print it). Its statements ({name}) are in a compile made without "
                             f"cache_dir, or after tf.jit(..., cache_dir=None).")


def _sources(form: dict) -> list:
    if "unless_functorch" in form:
        return _sources(form["unless_functorch"][0])
    if "no_grad" in form:
        return _sources(form["no_grad"])
    return [LoadedTrace(form["name"], form["source"])]


# -- writing and reading ------------------------------------------------------------------------------------
def save(state, entry: CacheEntry) -> str | None:
    """Write entry where the jitted function's cache_dir says; None, or why it was not written. Written again
    when its split makes a backward for outputs without gradients (on its first such backward), with it."""
    root = artifacts.directory()
    if root is None:
        return None
    try:
        if entry.sizes is not None or entry.layout or entry.number_positions:
            raise NotPortable("its trace has symbolic sizes, takes floats as values or relies on input layouts")
        folder_name = lookup(state, entry.key)
        text = _entry_text(entry, folder_name)
    except NotPortable as e:
        return f"not written to cache_dir: {e}"
    except Exception as e:  # noqa: BLE001 (writing an entry never fails the compile it follows)
        return f"not written to cache_dir: {type(e).__name__}: {e}"
    written = _write(folder_name, text)
    if written is None:
        return "not written to cache_dir: it cannot be written there"
    split = entry.fn.fn if isinstance(entry.fn, Guarded) else entry.fn
    if isinstance(split, CompiledSplit) and split.backward_without is not None:
        split.backward_without = _writing_again(split, split.backward_without, entry, folder_name, root, written)
    return None


def _entry_text(entry: CacheEntry, folder_name: str) -> str:
    writing = _Writing()
    runner = _runner_form(entry.fn, writing)
    files = {}
    for path in sorted(entry.guards.files | writing.files):
        digest = file_hash(path)
        if digest is None:
            raise NotPortable(f"its code in {path} is in no file")
        files[path] = digest
    record = {"format": FORMAT, "lookup": folder_name, "torch": torch.__version__,
              "files": files, "guards": entry.guards.portable(),
              "tensor_positions": list(entry.tensor_positions), "runner": runner, "bodies": writing.bodies}
    return json.dumps(record, sort_keys=True)


def _write(folder_name: str, text: str) -> str | None:
    name = hashlib.sha256(text.encode()).hexdigest()[:32] + ".json"
    return name if artifacts.write_entry(folder_name, name, text) else None


def _writing_again(split: CompiledSplit, make, entry: CacheEntry, folder_name: str, root: str, written: str):
    """split's backward_without, which writes the entry again (in place of the file `written`) with each
    backward it makes: a warm start then runs the backward the first process ran."""
    def backward_without(absent):
        nonlocal written
        backward = make(absent)
        split.backward_by_absent[absent] = backward
        if backward is not None:
            with artifacts.writing_to(root), cyclic_gc_paused():
                try:
                    rewritten = _write(folder_name, _entry_text(entry, folder_name))
                except Exception:  # noqa: BLE001 (the first file stays: the full backward then runs with zeros)
                    rewritten = None
                if rewritten is not None and rewritten != written:
                    artifacts.remove_entry(folder_name, written)
                    written = rewritten
        return backward

    return backward_without


def load(state, key: CacheKey, leaves) -> tuple[CacheEntry | None, str | None]:
    """(an entry from cache_dir that serves this call, None) or (None, why none does: None where there is nothing
    to look for). key: the call's, named."""
    if artifacts.directory() is None:
        return None, None
    try:
        folder_name = lookup(state, key)
    except NotPortable as e:
        return None, f"not looked up in cache_dir: {e}"
    why = None
    for path, text in artifacts.read_entries(folder_name):
        try:
            return _entry(state, key, leaves, json.loads(text), path, folder_name), None
        except Exception as e:  # noqa: BLE001 (a damaged, stale or foreign entry: compiled again instead)
            why = f"{os.path.basename(path)} in cache_dir skipped: {type(e).__name__}: {e}"
    return None, why


def _entry(state, key: CacheKey, leaves, record: dict, path: str, folder_name: str) -> CacheEntry:
    if record.get("format") != FORMAT or record.get("lookup") != folder_name:
        raise NotPortable("another format, or another call's")
    for file, digest in record["files"].items():
        if file_hash(file) != digest:
            raise NotPortable(f"{file} changed since it was written")
    guards = GuardSet.restored(record["guards"], state.fn)
    failed = guards.failure()
    if failed is not None:
        raise NotPortable(f"a guard does not hold: {failed}")
    guards.files = set(record["files"])
    bodies = {name: _LoadedBody(name) for name in record["bodies"]}
    for name, form in record["bodies"].items():
        bodies[name].fn = _loaded_function(form, bodies, path)
    runner = record["runner"]
    fn = _loaded_runner(runner, bodies, path)
    traces = _sources(runner["forward"] if "split" in runner else runner["plain"])
    backward = _sources(runner["backward"]) if "split" in runner else []
    entry = CacheEntry(key, fn, traces, backward, tuple(record["tensor_positions"]), guards)
    if not entry.admits(key, leaves):
        raise NotPortable(entry.why_not(key, leaves) or "it does not admit the call")
    return entry
