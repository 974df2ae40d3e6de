"""Guards: the Python state a trace read, checked before every call of its compiled code.

Tracing runs the user's Python once and bakes in every Python value it reads: a
module's `training` flag and attributes (`self.temperature`), a closed-over or global
number, a tensor held by a plain object passed as an argument (`box.t`), which hooks
are registered. A compiled entry is valid only while those stay the same, so while a
function is traced, a `GuardRecorder` watches the Python frames of the user's code run
(`sys.settrace`, this thread only: 'call' events, no line events) and records, for
each frame:

- the globals its code reads (its global loads found in its globals);
- the closure cells of the functions it can reach (jit's function, and the functions
  that function's closure and globals hold);
- for each argument that is an `nn.Module` or a plain object: the attributes its code
  names (`self.temperature`, `box.t`), one object deeper for plain objects
  (`self.config.scale`); for a module also its `training` flag and its hooks, and the
  global hook tables.

What is recorded: numbers, strings, dtypes and small containers of them by value;
tensors, modules, functions and other objects by identity; hook tables by the handles
they hold. Code of torch (except the layers in torch.nn.modules), of thunderfn and of
Python's standard library is not watched: its state is either keyed (grad mode,
default dtype) or deliberately not guarded (see docs/sharp_bits.md).

A `GuardSet` compiles to one function called on every call of the entry it guards: the
common kinds of guard (empty hook tables, a dict slot holding the same object, an int or
str) checked in bulk, each one C loop over its slots, the rest as generated comparisons.
"""
from __future__ import annotations

import dis
import enum
import functools
import itertools
import operator
import os
import sys
import sysconfig
import threading
import types

import torch

from thunderfn.core import context, portable
from thunderfn.core.portable import NotPortable
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import UnsupportedOpError

_MISSING = object()
_generated = itertools.count()
_recording = threading.local()  # .stack: this thread's GuardRecorders, innermost last

_THUNDERFN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_TORCH_LAYERS_DIR = os.path.join(_TORCH_DIR, "nn", "modules") + os.sep
_TORCH_MODULE_MACHINERY = os.path.join(_TORCH_LAYERS_DIR, "module.py")
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
_SITE_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib")})
# sympy, mpmath, networkx, filelock, triton: what torch's ShapeEnv, partitioner and Inductor run (often
# imported for the first time) while a trace is built; their state is never a model's, and a symbolic trace
# runs thousands of their functions, each of which would add guards checked on every call
_UNWATCHED_PACKAGES = tuple(os.sep + name + os.sep for name in ("optree", "numpy", "_pytest", "pluggy", "hypothesis",
                                                                "sympy", "mpmath", "networkx", "filelock", "triton"))

# Scalars whose value a trace bakes in: compared by value.
_VALUE_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size,
                torch.memory_format, torch.layout, enum.Enum, range, slice)
# Objects that do not change underneath a program: not guarded at all.
_STABLE_TYPES = (types.ModuleType, types.BuiltinFunctionType, types.BuiltinMethodType, type(len.__call__),
                 type(torch.Tensor.add), type(torch.Tensor.shape), type)
_STABLE_MODULES = ("torch", "thunderfn", "builtins", "math", "operator", "functools", "typing", "numpy", "optree",
                   "collections", "itertools", "dataclasses", "contextlib", "warnings", "abc", "enum")

# The tables nn.Module consults on every call; registering a hook must retrace.
MODULE_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                       "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")
GLOBAL_HOOK_TABLES = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                       "_global_backward_pre_hooks", "_global_forward_hooks_with_kwargs",
                       "_global_forward_hooks_always_called")


def is_watched(filename: str) -> bool:
    """Whether a frame of code in this file can read state a trace bakes in."""
    if filename.startswith("<"):
        return not filename.startswith(("<thunderfn", "<frozen"))
    path = os.path.abspath(filename)
    if path.startswith(_TORCH_DIR):
        return path.startswith(_TORCH_LAYERS_DIR) and path != _TORCH_MODULE_MACHINERY
    if path.startswith(_THUNDERFN_DIR) or any(p in path for p in _UNWATCHED_PACKAGES):
        return False
    return not (path.startswith(_STDLIB_DIRS) and not path.startswith(_SITE_DIRS))


@functools.lru_cache(maxsize=4096)
def _global_names(code) -> tuple:
    """The names code reads as globals: co_names holds attribute names too, and an attribute sharing a global's
    name (`x.shape` in a module with a global `shape`) guarded that global, recompiling when it changed."""
    loads = ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS")
    return tuple(dict.fromkeys(i.argval for i in dis.get_instructions(code) if i.opname in loads))


def _is_stable(value) -> bool:
    if isinstance(value, _STABLE_TYPES):
        return True
    if callable(value) and not isinstance(value, (torch.nn.Module, types.FunctionType, types.MethodType)):
        module = getattr(value, "__module__", None) or ""
        return module.split(".")[0] in _STABLE_MODULES
    if isinstance(value, types.FunctionType):
        return (value.__module__ or "").split(".")[0] in _STABLE_MODULES
    return False


def _by_value(value, budget: int = 64) -> bool:
    """Values compared by equality: scalars, and small containers of them."""
    if isinstance(value, _VALUE_TYPES):
        return True
    if type(value) in (tuple, list, frozenset, set) and len(value) <= budget:
        return all(_by_value(v, budget // 4) for v in value)
    if type(value) is dict and len(value) <= budget:
        return all(_by_value(k, 0) and _by_value(v, budget // 4) for k, v in value.items())
    return False


def _copy(value):
    """What a value guard compares against: a copy, so a later in-place change to a list is seen."""
    if type(value) in (list, set, dict):
        return type(value)(value)
    return value


def _same(a, b) -> bool:
    """Equality that also tells types apart (1 vs 1.0 vs True) and treats nan as itself."""
    if type(a) is not type(b):
        return False
    if type(a) is float and a != a:
        return b != b
    try:
        return bool(a == b)
    except Exception:  # a container whose elements refuse ==
        return False


class GuardSet:
    """Guards of one compiled entry: (holder, key, expected, how, what) records."""

    def __init__(self):
        self.records: dict = {}  # (id(holder), key) -> record, so each slot is guarded once
        self._holders: list = []  # keeps holders alive while their ids are keys
        # slot -> where its holder is found from the jitted function (a Path), where known: what a warm start in
        # another process looks the slot up by (disk_cache.py)
        self.paths: dict = {}
        # the source files of the code the trace ran through (watched frames, and functions guarded by identity)
        self.files: set = set()

    def __len__(self) -> int:
        return len(self.records)

    def add(self, holder, key, expected, how: str, what: str, path: tuple | None = None) -> None:
        """Guard `holder[key]` (a dict entry; for a cell, key is None and the cell's contents).
        how: 'value' (equal, same type), 'id' (the same object), 'keys' (a table holding the same
        handles), 'absent' (the key stays missing). path: where holder is found (see `Path`), if known."""
        slot = (id(holder), key)
        if slot not in self.records:
            self._holders.append(holder)
            self.records[slot] = (holder, key, expected, how, what)
            self.paths[slot] = path

    def watch(self, holder, key, what: str, path: tuple | None = None) -> None:
        """Guard whatever `holder[key]` holds when tracing ends (see `settle`)."""
        value = read_slot(holder, key)
        self.add(holder, key, _copy(value) if _by_value(value) else value, "pending", what, path)

    def settle(self) -> None:
        """Fix the expected value of every watched slot: its value now, after tracing. A slot
        the traced code wrote (`self.calls += 1` runs once, at trace time) is not guarded."""
        for slot, (holder, key, first_read, how, what) in list(self.records.items()):
            if how == "pending keys":
                self.records[slot] = (holder, key, tuple(holder), "keys", what)
            if how != "pending":
                continue
            value = read_slot(holder, key)
            if not (value is first_read or _same(value, first_read)):
                # Written by the traced code itself (a counter, a log): a side effect that happened
                # once, at trace time. Guarding it would retrace on every call; docs/sharp_bits.md.
                del self.records[slot]
            elif value is _MISSING:
                self.records[slot] = (holder, key, None, "absent", what)
            elif _by_value(value):
                self.records[slot] = (holder, key, _copy(value), "value", what)
            else:
                self.records[slot] = (holder, key, value, "id", what)

    def failure(self) -> str | None:
        """Why the guards do not hold now (the first that fails, in words), or None."""
        for holder, key, expected, how, what in self.records.values():
            current = holder if how == "keys" else read_slot(holder, key)
            if holds(current, expected, how):
                continue
            if how == "keys":
                return f"{what} changed (a hook was registered or removed)"
            if how == "absent" or current is _MISSING:
                return f"{what} was {'added' if how == 'absent' else 'removed'}"
            if how == "value":
                return f"{what} changed from {expected!r} to {current!r}"
            return f"{what} is a different object now"
        return None

    def compile(self):
        """A function of no arguments that says whether every guard holds, or None when there are none. It runs
        before every call of the entry, and a deep model has thousands of guards (seven hook tables, the flags and
        sizes of every module), so the common kinds are checked in bulk, each one loop in C over all its slots:

        - the hook tables that must stay empty: `not any(tables)`;
        - dict slots expected to hold the very object (an `id` guard, or a value that is a bool, None or an
          enum member): every `holder.get(key, MISSING) is expected`;
        - dict slots expected to hold an int, str or float (not NaN): first their types, then `==`;

        and the rest (cells, absent keys, other values) as generated straight-line terms."""
        if not self.records:
            return None
        empty, same_object, equal, rest = [], [], [], []
        for record in self.records.values():
            holder, key, expected, how, _ = record
            if how == "keys" and not expected:
                empty.append(holder)
            elif key is None or type(holder) is not dict or how not in ("id", "value"):
                rest.append(record)
            elif how == "id" or type(expected) in (bool, type(None)) or isinstance(expected, enum.Enum):
                same_object.append(record)
            elif type(expected) in (int, str) or type(expected) is float and expected == expected:
                equal.append(record)
            else:
                rest.append(record)
        checks = []
        if empty:
            checks.append(functools.partial(_all_empty, tuple(empty)))
        if same_object:
            checks.append(functools.partial(_all_same_objects, *_columns(same_object)))
        if equal:
            holders, keys, expected = _columns(equal)
            checks.append(functools.partial(_all_equal, holders, keys, expected, [type(v) for v in expected]))
        if rest:
            checks.append(_generated_check(rest))
        if len(checks) == 1:
            return checks[0]
        return functools.partial(_all_hold, tuple(checks))

    # -- in another process: a warm start (disk_cache.py) --------------------------------------------------
    def portable(self) -> dict:
        """These guards as JSON, for another process to look each slot up again by its path: {"paths": the
        distinct paths and their beginnings, each [index of the path it extends (-1: a root), its last step],
        "guards": [path index, key, how, expected, what] each}. A deep model's guards share most of their
        paths' beginnings (every layer's begins at the model), so each is stored, and followed, once. A value is
        compared by its exact JSON form (core/portable.py), an object by identity by its type (and a function by
        its name and where its code is), since identity itself does not cross processes. NotPortable where a
        guard cannot be so: its holder was reached only as an argument at trace time, its value has no exact
        form, or a hook is registered."""
        paths, index = [], {}

        def numbered(path: tuple) -> int:
            if path not in index:
                parent = numbered(path[:-1]) if len(path) > 1 else -1
                index[path] = len(paths)
                paths.append([parent, list(path[-1])])
            return index[path]

        records = []
        for slot, (holder, key, expected, how, what) in self.records.items():
            path = self.paths.get(slot)
            if path is None:
                raise NotPortable(f"{what} is held by an object the trace reached only as an argument")
            if how == "value":
                expected = portable.encode(expected)
            elif how == "id":
                expected = _identity(expected)
            elif how == "keys":
                if expected:
                    raise NotPortable(f"{what} holds hooks (functions of this process)")
                expected = []
            elif how != "absent":
                raise NotPortable(f"{what} is guarded as {how!r}")
            records.append([numbered(path), portable.encode(key), how, expected, what])
        return {"paths": paths, "guards": records}

    @classmethod
    def restored(cls, form: dict, fn) -> "GuardSet":
        """The guards `portable()` wrote, on this process's objects (fn: the jitted function, the root of the
        paths): each identity guard re-established on the object now at its path where that object is of the
        recorded type (a function: the same name and code location). NotPortable where a path leads nowhere
        or to another kind of object; whether the values hold is the caller's question (`failure`)."""
        objects, paths = [], []
        for parent, step in form["paths"]:
            step = tuple(step)
            if parent < 0:
                obj = fn if step[0] == "fn" else _module_namespace(step[1])
                path = (step,)
            else:
                obj = objects[parent]
                obj = _MISSING if obj is _MISSING else _stepped(obj, step)
                path = paths[parent] + (step,)
            objects.append(obj)
            paths.append(path)
        guards = cls()
        for at, key, how, expected, what in form["guards"]:
            holder = objects[at]
            if holder is _MISSING:
                raise NotPortable(f"{what}: nothing at {paths[at]}")
            key = portable.decode(key)
            if how == "value":
                expected = portable.decode(expected)
            elif how == "id":
                value = read_slot(holder, key)
                if value is _MISSING or _identity(value, strict=False) != expected:
                    raise NotPortable(f"{what} is another kind of object here")
                expected = value
            elif how == "keys":
                expected = ()
            guards.add(holder, key, expected, how, what, paths[at])
        return guards


def _identity(obj, strict: bool = True) -> list | None:
    """What stands for an object compared by identity in another process: its type's location, and for a
    function its qualified name and its code's file and first line. None (or, strict, NotPortable) where
    its type is not found by name."""
    if isinstance(obj, types.FunctionType):
        return ["function", obj.__qualname__, obj.__code__.co_filename, obj.__code__.co_firstlineno]
    kind = portable.where(type(obj))
    if kind is None:
        if strict:
            raise NotPortable(f"a {type(obj).__name__} (a type defined where it cannot be found again)")
        return None
    return list(kind)


def _columns(records: list) -> tuple:
    """(holders, keys, expected values) of guard records on dict slots, as the lists bulk checks loop over."""
    return [r[0] for r in records], [r[1] for r in records], [r[2] for r in records]


def _all_empty(tables: tuple) -> bool:
    return not any(tables)


def _all_same_objects(holders: list, keys: list, expected: list) -> bool:
    return all(map(operator.is_, map(dict.get, holders, keys, itertools.repeat(_MISSING)), expected))


def _all_equal(holders: list, keys: list, expected: list, types_expected: list) -> bool:
    current = list(map(dict.get, holders, keys, itertools.repeat(_MISSING)))
    # the types first: == between an int and another type's value (a tensor) could raise, or be true
    return list(map(type, current)) == types_expected and current == expected


def _all_hold(checks: tuple) -> bool:
    for check in checks:
        if not check():
            return False
    return True


def _generated_check(records: list):
    """One generated function of straight-line terms for the guard records the bulk checks do not take."""
    ns = {"MISSING": _MISSING, "same": _same, "cell_contents": _cell_contents}
    terms = []
    for i, (holder, key, expected, how, _) in enumerate(records):
        ns[f"h{i}"], ns[f"k{i}"], ns[f"v{i}"] = holder, key, expected
        read = f"cell_contents(h{i})" if key is None else f"h{i}.get(k{i}, MISSING)"
        if how == "id":
            terms.append(f"{read} is v{i}")
        elif how == "absent":
            terms.append(f"k{i} not in h{i}")
        elif how == "keys":
            terms.append(f"tuple(h{i}) == v{i}")
        elif type(expected) in (bool, type(None)) or isinstance(expected, enum.Enum):
            terms.append(f"{read} is v{i}")
        elif type(expected) in (int, str) or type(expected) is float and expected == expected:
            terms.append(f"type(x{i} := {read}) is {type(expected).__name__} and x{i} == v{i}")
        else:
            terms.append(f"same({read}, v{i})")
    source = "def guards_hold():\n    return (" + "\n            and ".join(terms) + ")\n"
    exec(compile(source, f"<thunderfn guards {next(_generated)}>", "exec"), ns)
    return ns["guards_hold"]


def current_recorder() -> GuardRecorder | None:
    """The innermost GuardRecorder recording in this thread, or None."""
    stack = getattr(_recording, "stack", None)
    return stack[-1] if stack else None


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING


def read_slot(holder, key):
    """What a guard record reads: holder[key], or a cell's contents where key is None; MISSING if absent."""
    return _cell_contents(holder) if key is None else holder.get(key, _MISSING)


def holds(current, expected, how: str) -> bool:
    """Whether a slot's current value satisfies a guard record's expectation (GuardSet.add's `how`)."""
    if how == "id":
        return current is expected
    if how == "absent":
        return current is _MISSING
    if how == "keys":
        return tuple(current) == expected
    return _same(current, expected)


class GuardRecorder:
    """Records the Python state read while a function is traced in this thread (see the
    module docstring). Use as a context manager around tracing; `guards` is the result."""

    def __init__(self, fn):
        self.guards = GuardSet()
        self._closures: dict = {}  # code object -> function, for reading closure cells again
        self._watched: dict = {}  # code object -> its source file where watched, else ""
        self._seen: set = set()  # (code, id(argument)) pairs already recorded
        self._module_names: dict = {}  # id(submodule) -> "GPT.transformer.h.0", for readable reasons
        self._examined: dict = {}  # id -> (module, its attributes when first seen): checked for stored proxies
        # id -> (object, its Path from the jitted function) for the objects reached along a known way: the holders
        # of guarded slots are located by these in another process (a warm start, disk_cache.py)
        self._paths: dict = {}
        self._index_functions(fn, depth=3, path=(("fn",),))
        self._previous = None

    def __enter__(self):
        self._previous = sys.gettrace()
        sys.settrace(self._on_event)
        _recording.__dict__.setdefault("stack", []).append(self)
        return self

    def __exit__(self, exc_type, *exc):
        sys.settrace(self._previous)
        _recording.stack.pop()
        self._refuse_stored_proxies(raise_error=exc_type is None)
        self.guards.settle()
        return False

    def _refuse_stored_proxies(self, raise_error: bool) -> None:
        """A traced tensor the code stored on a module (`self.last_attn = attn`) would be a proxy
        left in the user's module, and the compiled code would not store anything on later
        calls: put the old value back and refuse by name."""
        for obj, before in self._examined.values():
            for name, value in list(obj.__dict__.items()):
                if not _holds_proxy(value):
                    continue
                if name in before:
                    obj.__dict__[name] = before[name]
                else:
                    del obj.__dict__[name]
                if raise_error:
                    owner = self._module_names.get(id(obj), type(obj).__name__)
                    raise UnsupportedOpError(
                        f"the traced code stored a tensor it computed in '{owner}.{name}'. Tracing runs the Python "
                        f"once, so the compiled function would not store it on later calls. Return the tensor "
                        f"instead (or compute it outside the jitted function).")

    def _on_event(self, frame, event, arg):
        if event == "call":
            try:
                self._record_frame(frame)
            except Exception:  # reading user objects must never break tracing; the guard is lost
                pass
        previous = self._previous
        return previous(frame, event, arg) if previous is not None else None

    # -- what can be reached -----------------------------------------------------------------
    def _index_functions(self, fn, depth: int, visited=None, path: tuple | None = None) -> None:
        """Map the code of fn, and of functions its closure and globals hold, to the function,
        so a frame of that code can have its closure cells guarded. thunderfn's own wrappers
        (tf.grad's, jit's) are walked through without counting as a level. path: fn's (see `Path`)."""
        visited = set() if visited is None else visited
        if path is not None and hasattr(fn, "__func__"):
            path = path + (("attr", "__func__"),)
        fn = getattr(fn, "__func__", fn)
        if id(fn) in visited or depth < 0:
            return
        visited.add(id(fn))
        self._locate(fn, path)
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            self._index_functions(wrapped, depth, visited, _step(path, ("attr", "__wrapped__")))
        if isinstance(fn, torch.nn.Module):
            self._name_modules(fn)
        if not isinstance(fn, types.FunctionType):
            return
        ours = _is_stable(fn)
        if not ours:
            self._closures[fn.__code__] = fn
        below = depth if ours else depth - 1
        for i, cell in enumerate(fn.__closure__ or ()):
            self._index_functions(_cell_contents(cell), below, visited, _step(path, ("closure", i), ("contents",)))
        if not ours:
            for name in fn.__code__.co_names:
                value = fn.__globals__.get(name)
                if isinstance(value, (types.FunctionType, types.MethodType, torch.nn.Module)):
                    self._index_functions(value, below, visited, _step(_globals_path(fn.__globals__), ("item", name)))

    def _name_modules(self, root: torch.nn.Module) -> None:
        root_path = self._paths.get(id(root), (None, None))[1]
        for name, module in root.named_modules():
            self._module_names.setdefault(id(module), ".".join(filter(None, (type(root).__name__, name))))
            if name:
                self._locate(module, _step(root_path, ("submodule", name)))

    def _locate(self, obj, path: tuple | None) -> None:
        """Remember where obj is found (the first way it was reached), where that is known."""
        if path is not None and id(obj) not in self._paths:
            self._paths[id(obj)] = (obj, path)

    def path_of(self, obj) -> tuple | None:
        """Where obj was found from the jitted function (a Path), if it was reached along a known way."""
        return self._paths.get(id(obj), (None, None))[1]

    # -- recording ---------------------------------------------------------------------------
    def _record_frame(self, frame) -> None:
        code = frame.f_code
        source = self._watched.get(code)
        if source is None:
            # its source file, or "" where it is not watched (a dataclass's generated __init__ is its class's
            # code: thunderfn's own, a BoundSymbol made per statement traced, is not watched)
            source = _source_file(code, frame)
            source = self._watched[code] = source if is_watched(source) else ""
        if not source:
            return
        names = code.co_names
        where = code.co_qualname if hasattr(code, "co_qualname") else code.co_name
        if (code, None) not in self._seen:
            self._seen.add((code, None))
            self.guards.files.add(source)
            f_globals = frame.f_globals
            for name in _global_names(code):
                if name in f_globals:
                    self._guard(f_globals, name, f"global '{name}' (read by {where})", names, depth=1,
                                holder_path=_globals_path(f_globals))
            fn = self._closures.get(code)
            if fn is not None and fn.__closure__:
                for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__)):
                    self._guard(cell, None, f"closed-over variable '{name}' of {where}", names, depth=1,
                                holder_path=_step(self.path_of(fn), ("closure", i)))
        n_args = code.co_argcount + code.co_kwonlyargcount
        f_locals = frame.f_locals
        for name in code.co_varnames[:n_args]:
            value = f_locals.get(name)
            if value is None or (code, id(value)) in self._seen or not _has_attributes(value):
                continue
            self._seen.add((code, id(value)))
            self._guard_attributes(value, names, f"{name}", depth=2)

    def _guard_attributes(self, obj, names, what: str, depth: int) -> None:
        """Guard the attributes of obj that the code names (the names it may read)."""
        path = self.path_of(obj)
        if isinstance(obj, torch.nn.Module) and id(obj) not in self._examined:
            self._examined[id(obj)] = (obj, dict(obj.__dict__))
        if isinstance(obj, torch.nn.Module):
            what = self._module_names.get(id(obj), what)
            self._guard_module(obj, what, path)
            tables = ("__dict__", "_parameters", "_buffers", "_modules")
        else:
            tables = ("__dict__",)
        for name in names:
            for table in tables:
                holder = getattr(obj, table)
                if name in holder:
                    self._guard(holder, name, f"attribute '{what}.{name}'", names, depth - 1,
                                holder_path=_step(path, ("attr", table)))
                    break

    def _guard_module(self, module: torch.nn.Module, what: str, path: tuple | None) -> None:
        owner = f"{type(module).__name__} '{what}'" if what == "self" else f"'{what}'"
        self.guards.watch(module.__dict__, "training", f"{owner}.training", _step(path, ("attr", "__dict__")))
        for table in MODULE_HOOK_TABLES:
            hooks = module.__dict__.get(table)
            if hooks is not None:
                self.guards.add(hooks, "", None, "pending keys",
                                f"the {table.lstrip('_').replace('_', ' ')} of {owner}", _step(path, ("attr", table)))
        globals_ = sys.modules["torch.nn.modules.module"].__dict__
        for table in GLOBAL_HOOK_TABLES:
            hooks = globals_.get(table)
            if hooks is not None:
                self.guards.add(hooks, "", None, "pending keys", f"torch's {table.lstrip('_').replace('_', ' ')}",
                                (("globals", "torch.nn.modules.module"), ("item", table)))

    def _guard(self, holder, key, what: str, names, depth: int, holder_path: tuple | None = None) -> None:
        value = read_slot(holder, key)
        if value is _MISSING or isinstance(value, TensorProxy) or _is_stable(value):
            return
        if isinstance(value, torch.Tensor):
            if context.stand_in(value) is None:  # a tensor some proxy stands in for is an input
                self.guards.watch(holder, key, what, holder_path)
            return
        self.guards.watch(holder, key, what, holder_path)
        self._locate(value, _step(holder_path, ("contents",) if key is None else ("item", key)))
        if isinstance(value, types.FunctionType):
            self.guards.files.add(value.__code__.co_filename)
        if depth > 0 and _has_attributes(value):
            self._guard_attributes(value, names, what.split("'")[1] if "'" in what else what, depth)


# -- paths: where a guarded slot's holder is found, in this process or in another -----------------------------
# A Path is a tuple of steps from a root: ("fn",), the jitted function (a jitted module's forward, whose closure
# holds the module), or ("globals", module name), that module's namespace; then ("attr", name) reads an attribute,
# ("item", key) a dict entry, ("submodule", name) nn.Module.get_submodule, ("closure", i) a function's i-th
# closure cell and ("contents",) a cell's contents.
def _step(path: tuple | None, *steps) -> tuple | None:
    return None if path is None else path + steps


def _globals_path(namespace: dict) -> tuple | None:
    """The path of a module's namespace (a frame's globals), where it is an imported module's."""
    name = namespace.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    return (("globals", name),) if module is not None and getattr(module, "__dict__", None) is namespace else None


def _source_file(code, frame) -> str:
    """The file whose source made code: its own, or for a dataclass's generated method (code compiled from a
    string) the file of its instance's class, which that method is made from."""
    if code.co_filename == "<string>" and code.co_qualname.startswith("__create_fn__."):
        instance = frame.f_locals.get("self")
        module = sys.modules.get(type(instance).__module__) if instance is not None else None
        if getattr(module, "__file__", None):
            return module.__file__
    return code.co_filename


def _module_namespace(name: str):
    module = sys.modules.get(name)
    return _MISSING if module is None else module.__dict__


_STEPS = {"attr": getattr, "item": lambda obj, key: obj[key],
          "submodule": lambda obj, name: obj.get_submodule(name),
          "closure": lambda fn, i: fn.__closure__[i], "contents": _cell_contents}


def _stepped(obj, step: tuple):
    """What one step of a path finds from obj; _MISSING where it finds nothing."""
    try:
        return _STEPS[step[0]](obj, *step[1:])
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return _MISSING


def _holds_proxy(value) -> bool:
    if isinstance(value, TensorProxy):
        return True
    if type(value) in (list, tuple):
        return any(isinstance(v, TensorProxy) for v in value)
    if type(value) is dict:
        return any(isinstance(v, TensorProxy) for v in value.values())
    return False


def _has_attributes(value) -> bool:
    """Objects whose attributes user code reads and a trace may bake in: modules and plain objects."""
    if isinstance(value, torch.nn.Module):
        return True
    if isinstance(value, (torch.Tensor, TensorProxy, type, types.ModuleType, types.FunctionType,
                          types.MethodType)) or _by_value(value):
        return False
    if (type(value).__module__ or "").split(".")[0] in ("thunderfn", "torch"):
        return False  # our own objects (a BoundSymbol built by a dataclass __init__) and torch's
    return isinstance(getattr(value, "__dict__", None), dict)
