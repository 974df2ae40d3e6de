"""The cache-hit path of a jitted function: generated Python that checks a call against one cache entry
and calls it (`hit_function`), and the jitted function itself, which tries the entry that ran last
first (`fast_dispatcher`). jit.py (JitState.run) makes them; this module holds only how they are
generated, the hot path every cached call takes.

A check-and-call function compares a call with its entry's cache key field by field (grad mode,
default dtype, each tensor's dtype, shape, requires_grad and device; an entry with symbolic sizes
compares its key pattern and checks its size guards, dynamic_shapes.py), then the entry's guards,
and returns MISS for any other call. Comparing with constants costs less than building and hashing
a key; a repeated hit is one call that checks and runs.

The api layer: imported by jit.py only.
"""
from __future__ import annotations

import inspect

import torch

from thunderfn.cache_key import CacheKey, TensorPart, tensor_fields
from thunderfn.core import context, symbolic
from thunderfn.core.call_time import Guarded
from thunderfn.executors.torch_rewrites import UnlessFunctorch

_is_grad_enabled = torch.is_grad_enabled
_get_default_dtype = torch.get_default_dtype


# The fast path's key for a call with positional tensors only: the modes its entries differ in (an entry
# traced under autocast never takes this path), then each tensor's TensorPart fields, flat (no tuple per
# tensor): the dispatcher's inline key is generated from these, and `fast_key` computes the same.
_FAST_KEY_MODES = "is_grad_enabled(), get_default_dtype()"  # CacheKey.grad_enabled, CacheKey.default_dtype


def _tensor_part_source(a: str) -> str:
    """The TensorPart fields of the tensor named `a`, as a Python expression list (its attributes of those names)."""
    return ", ".join(f"{a}.{field}" for field in TensorPart._fields)


_UNPACKED_ARITY = 32  # the most arguments a dispatcher branch unpacks into locals of its own


def fast_key(args) -> tuple:
    """The key the dispatcher computes inline for these positional tensors (_FAST_KEY_MODES, then each
    tensor's TensorPart fields)."""
    key = [_is_grad_enabled(), _get_default_dtype()]
    for a in args:
        key += tensor_fields(a)
    return tuple(key)


def positional_arities(fn) -> tuple:
    """The numbers of positional arguments fn can be called with, when few and known."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return ()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    return tuple(range(required, len(positional) + 1))[-4:]


def _shape_check(a: str, i: int, shape, namespace: dict) -> list[str]:
    if None not in shape:
        namespace[f"shape{i}"] = shape
        return [f"{a}.shape == shape{i}"]
    return [f"len({a}.shape) == {len(shape)}",
            *(f"{a}.shape[{d}] == {n}" for d, n in enumerate(shape) if n is not None)]


MISS = object()  # what a check-and-call function returns when the call is not its entry's


def miss(*tensors):
    return MISS


def hit_function(key: CacheKey, size_guards, fn, guards_hold, stats, layout=(), keywords=()):
    """A check-and-call function for one cache entry (see JitState.fast_hit); key is the
    entry's cache key (or key pattern) for a call with tensors only, by position, then by the keywords
    given (sorted, as the key flattened them): then it is called with (args, kwargs)."""
    names = [f"a{i}" for i in range(len(key.leaves))]
    namespace = {"fn": fn, "guards_hold": guards_hold, "stats": stats, "MISS": MISS, "tracing": context._local,
                 "is_grad_enabled": _is_grad_enabled, "get_default_dtype": _get_default_dtype,
                 "default_dtype": key.default_dtype, "any_autocast": torch._C._is_any_autocast_enabled}
    checks = []
    for i, (a, part) in enumerate(zip(names, key.leaves)):  # (each a TensorPart: the call passes tensors only)
        namespace[f"dtype{i}"], namespace[f"device{i}"] = part.dtype, part.device
        # a CPU tensor's device is always torch.device("cpu"), without an index
        on_device = f"{a}.is_cpu" if part.device.type == "cpu" else f"{a}.device == device{i}"
        checks += [f"{a}.dtype is dtype{i}", *_shape_check(a, i, part.shape, namespace),
                   f"{a}.requires_grad is {part.requires_grad}", on_device]
    if size_guards is not None:  # the guards a trace with symbolic sizes recorded on them (dynamic_shapes.py)
        namespace.update(symbolic.evaluation_namespace())
        checks.append(f"({size_guards})")
    for k, (position, _, get, value) in enumerate(layout):  # the input layouts the trace relies on
        namespace[f"layout_get{k}"], namespace[f"layout_value{k}"] = get, value
        checks.append(f"layout_get{k}(a{position}) == layout_value{k}")
    # (entries traced under autocast never take this path: see call_slow)
    checks += [f"is_grad_enabled() is {key.grad_enabled}", "get_default_dtype() is default_dtype", "not tracing.stack",
               "not any_autocast()"]
    if isinstance(fn, Guarded):  # guards of the trace's own (torch's SDPA switches, an optimizer's settings)
        for k, guard in enumerate(fn.guards):
            namespace[f"trace_guard{k}"] = guard
            checks.append(f"trace_guard{k}() is None")
        fn = namespace["fn"] = fn.fn
    choose = []
    if isinstance(fn, UnlessFunctorch):  # its choice made here, not in one more call (a hit either way)
        namespace.update(fn=fn.rewritten, unless_functorch=fn, functorch_active=context.functorch_active)
        choose = ["    if functorch_active():", f"        return unless_functorch({', '.join(names)})"]
    if guards_hold is not None:
        checks.append("guards_hold()")
    args = ", ".join(names)
    if keywords:  # the tensors taken out of (args, kwargs), each where the cache key had it
        n_positional = len(names) - len(keywords)
        namespace.update({f"name{j}": k for j, k in enumerate(keywords)})
        unpack = [f"        if len(args) != {n_positional} or len(kwargs) != {len(keywords)}:",
                  "            return MISS",
                  *([f"        {', '.join(names[:n_positional])}, = args"] if n_positional else []),
                  *(f"        {a} = kwargs[name{j}]" for j, a in enumerate(names[n_positional:]))]
        header, missing = "def hit(args, kwargs):", "(AttributeError, KeyError)"
    else:
        unpack, header, missing = [], f"def hit({args}):", "AttributeError"
    # only the checks are in the try: an AttributeError raised by the user's function is the user's,
    # not a miss (which would run the function a second time, through the slow path)
    lines = [header,
             "    try:",
             *unpack,
             f"        ours = {' and '.join(checks)}",
             f"    except {missing}:  # not a tensor (or not this call's keywords)",
             "        return MISS",
             "    if not ours:",
             "        return MISS",
             "    stats[0] += 1",
             *choose,
             f"    return fn({args})"]
    exec(compile("\n".join(lines) + "\n", "<thunderfn jit cache entry>", "exec"), namespace)
    return namespace["hit"]


def fast_dispatcher(arities, fast_cache, keyword_cache, call_slow):
    """The jitted function, and its globals. For each arity fn accepts, a branch first calls
    that arity's hot entry (the last one that ran: a check-and-call function, see
    JitState.fast_hit), which is one call on a cache hit; otherwise it builds the cache key
    inline as one flat tuple (no per-argument tuples, no comprehension) and looks it up, and
    the entry found becomes hot. Other calls take a generic branch; a call with keywords tries
    the entry that last ran a call with those names (JitState.keyword_hit); anything else takes
    the slow path."""
    hot_names = [f"hot{n}" for n in arities]
    lines = ["def jitted(*args, **kwargs):"]
    if hot_names:
        lines.append(f"    global {', '.join(hot_names)}")
    lines += ["    if not kwargs:", "        n = len(args)"]
    for n in arities:
        if n > _UNPACKED_ARITY:
            # A jitted module's parameters are arguments: unpacked, hundreds of locals would make this frame
            # most of a 16 KiB block of CPython 3.11's frame stack, and a compile (which runs below it, from
            # call_slow) would cross into the next block and back on calls all the time, mapping and unmapping
            # it (GPT-2 at 64 layers: 300k page faults, a third of the compile). args stays one tuple here.
            unpack, call, key = [], "*args", "fast_key(args)"
        else:
            names = [f"a{i}" for i in range(n)]
            unpack = [f"            {', '.join(names) + ',' if names else '_'} = args" if names else "            pass"]
            call = ", ".join(names)
            key = f"({_FAST_KEY_MODES}, {', '.join(_tensor_part_source(a) for a in names)})"
        lines += [f"        if n == {n}:",
                  *unpack,
                  f"            out = hot{n}({call})",
                  "            if out is not MISS:",
                  "                return out",
                  "            try:",
                  f"                hit = fast_cache.get({key})",
                  "            except (AttributeError, TypeError):",
                  "                hit = None",
                  "            if hit is not None:",
                  f"                out = hit({call})",
                  "                if out is not MISS:",
                  f"                    hot{n} = hit",
                  "                    return out",
                  "            return call_slow(args, kwargs)"]
    lines += ["        try:",
              "            hit = fast_cache.get(fast_key(args))",
              "        except (AttributeError, TypeError):",
              "            hit = None",
              "        if hit is not None:",
              "            out = hit(*args)",
              "            if out is not MISS:",
              "                return out",
              "        return call_slow(args, kwargs)",
              "    hit = keyword_cache.get((len(args), *kwargs))",  # tensors by keyword: one entry per set of names
              "    if hit is not None:",
              "        out = hit(args, kwargs)",
              "        if out is not MISS:",
              "            return out",
              "    return call_slow(args, kwargs)"]
    namespace = {"fast_cache": fast_cache, "keyword_cache": keyword_cache, "call_slow": call_slow,
                 "is_grad_enabled": _is_grad_enabled,
                 "get_default_dtype": _get_default_dtype, "fast_key": fast_key, "MISS": MISS,
                 "hot_names": hot_names, **{name: miss for name in hot_names}}
    exec(compile("\n".join(lines) + "\n", "<thunderfn jit dispatcher>", "exec"), namespace)
    return namespace["jitted"], namespace
