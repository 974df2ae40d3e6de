"""Why a jitted function compiled again, in words: what `tf.cache_info(fn)["recompiles"]` and the
cache_size_limit warning say (like jax_explain_cache_misses).

A call whose key matches an entry that cannot run it is explained by that entry (its guards: jit.py's
cache_entry.py: CacheEntry.why_not). A call with a new key is described against the compiled key closest to it
(fewest differing fields): the first field that differs, named as the user wrote it (`tensor argument 0
changed: dtype torch.float32 -> torch.float64`).

The api layer: imported by jit.py.
"""
from __future__ import annotations

import numpy as np
import torch

from thunderfn.cache_key import CacheKey, TensorPart
from thunderfn.core.pytree import tree_flatten_with_path


def new_signature(key: CacheKey, compiled: list[CacheKey], args, kwargs) -> str | None:
    """How a call's key differs from the closest of the compiled keys (or symbolic entries' patterns,
    a symbolic size None); None for the first compile."""
    if not compiled:
        return None
    # Described against the cached signature closest to this one (fewest differing fields; the newest of equals).
    old = min(reversed(compiled), key=lambda k: (len(k.leaves) != len(key.leaves), _distance(k, key)))
    if old.structure != key.structure:
        return "the structure of the arguments changed (pytree, number of arguments or keywords)"
    if old.grad_enabled != key.grad_enabled:
        return f"torch's grad mode changed (is_grad_enabled() was {old.grad_enabled}, now {key.grad_enabled})"
    if old.default_dtype != key.default_dtype:
        return f"torch's default dtype changed from {old.default_dtype} to {key.default_dtype}"
    if old.autocast != key.autocast:
        return f"the autocast state changed from {_show_autocast(old.autocast)} to {_show_autocast(key.autocast)}"
    paths = tree_flatten_with_path((args, kwargs))[0]
    for path, before, now in zip(paths, old.leaves, key.leaves):
        if before != now and _part_distance(before, now):  # (a symbolic size None fits every size)
            where = _describe_path(path)
            if type(now) is TensorPart and type(before) is TensorPart:
                changed = [f"{field} {_show(b)} -> {_show(n)}" for field, b, n in zip(TensorPart._fields, before, now)
                           if not _same_field(b, n)]
                return f"tensor {where} changed: {', '.join(changed)}"
            return f"{where} changed from {_show_part(before)} to {_show_part(now)}"
    return "the arguments changed"


def limit_advice(reasons: list, dynamic=None, pinned=()) -> str:
    """What to do about the recompiles that filled the cache, by what changed in them, the `dynamic` option in
    force and the sizes the traces pinned (with where: SymbolicInputs.pinned)."""
    advice = []
    if pinned:
        advice.append(f"The traces relied on these sizes being one number, so each size compiles anew: "
                      f"{'; '.join(pinned[-3:])}. Compute with the size instead (x.shape[1] as it is, torch ops on "
                      f"it) rather than int() or a branch on it, or pad or bucket inputs to a few sizes.")
    elif any(" shape " in r for r in reasons):
        if dynamic is False:
            advice.append("Each new input shape compiled anew, as dynamic=False asks: dynamic=None (the default) "
                          "compiles a changed dimension once more as symbolic, and tf.mark_dynamic(tensor, dim) makes "
                          "one symbolic from the first call (docs/jit.md, 'Dynamic shapes'); otherwise pad or bucket "
                          "inputs to a few sizes.")
        else:
            advice.append("Each new input shape compiled anew although sizes may be symbolic here: the reasons say "
                          "what each trace relied on; pad or bucket inputs to a few sizes (docs/jit.md, "
                          "'Dynamic shapes').")
    if any(" changed from " in r for r in reasons):
        advice.append("Each new value of a Python argument (an int, a string; a float only where it is static, "
                      "dynamic=False, or cache_info's static_fallbacks say its trace could not take it as a value) "
                      "compiles anew: pass a changing number as a tensor (torch.tensor(x)), which is an input and not "
                      "baked in.")
    if not advice:
        advice.append("Each change listed compiles anew: keep it the same between calls where you can.")
    return " ".join(advice) + " Or raise cache_size_limit (tf.jit(fn, cache_size_limit=n)) to keep more entries."


def _describe_path(path) -> str:
    if path and path[0] == 0 and len(path) > 1:
        rest = "".join(f"[{p!r}]" for p in path[2:])
        return f"argument {path[1]}{rest}"
    if path and path[0] == 1 and len(path) > 1:
        rest = "".join(f"[{p!r}]" for p in path[2:])
        return f"keyword argument '{path[1]}'{rest}"
    return "an argument"


def _distance(old: CacheKey, key: CacheKey) -> int:
    """How many fields of two keys differ (a tensor's shape, dtype, ... count one each)."""
    return (sum(a != b for a, b in zip(old.head(), key.head()))
            + sum(map(_part_distance, old.leaves, key.leaves)))


def _part_distance(a, b) -> int:
    if type(a) is TensorPart and type(b) is TensorPart:
        return sum(not _same_field(x, y) for x, y in zip(a, b))
    return int(a != b)


def _same_field(before, now) -> bool:
    """Whether a key field is the same; a symbolic entry's shape (None where a size is symbolic) is the same
    as every shape it fits."""
    if isinstance(before, tuple) and None in before:
        return len(before) == len(now) and all(n is None or n == m for n, m in zip(before, now))
    return before == now


def _show(value) -> str:
    if isinstance(value, tuple) and None in value:  # a symbolic entry's shape: its symbolic sizes are free
        return "(" + ", ".join("*" if n is None else str(n) for n in value) + ("," if len(value) == 1 else "") + ")"
    return str(tuple(value)) if isinstance(value, torch.Size) else repr(value)


def _show_part(part) -> str:
    """A key part, as the value it was (a tensor's, which a non-tensor argument replaced, as its fields)."""
    if type(part) is TensorPart:
        return repr(tuple(part))
    kind, value = part  # a ValuePart: its value, or the stand-in JitState.key made for it
    if kind is float:  # (None: an entry traced it as a value, any float)
        return "any float" if value is None else repr(float.fromhex(value))
    if kind is complex:
        return repr(complex(float.fromhex(value[0]), float.fromhex(value[1])))
    if kind is slice:
        return repr(slice(*value))
    if isinstance(value, bytes) and kind is not bytes:  # a numpy scalar, by its bits
        return repr(np.frombuffer(value, dtype=kind)[0])
    return repr(value)


def _show_autocast(state: tuple) -> str:
    return ", ".join(f"autocast('{d}', {dtype})" for d, dtype in state) or "no autocast"
