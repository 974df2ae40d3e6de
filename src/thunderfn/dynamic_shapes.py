"""Dynamic shapes for jit: which dimensions a compile leaves symbolic, and what its entry checks.

`tf.jit(fn, dynamic=...)` has torch.compile's meaning:
- None (the default): the first call compiles with every size as it is. A later call that
  differs from a compiled signature only in some sizes compiles once more with those
  dimensions symbolic (torch.compile's "automatic dynamic"); the dimensions seen changing are
  remembered, so each is opened once.
- True: every dimension of every tensor input is symbolic from the first compile, but a parameter's
  (torch.compile's force_parameter_static_shapes): a weight's sizes do not change between calls, and
  as symbols each matmul would guard an input's size equal to one.
- False: every size is static; each new size compiles anew.
`mark_dynamic(t, dim)` opens a dimension from the first compile whatever `dynamic` says, and
`mark_static(t, dim)` keeps one static whatever it says (torch._dynamo's functions).

An entry with symbolic dimensions (`SymbolicSizes`) matches a call by a pattern of its cache
key, where each symbolic dimension is free, and then checks the guards its trace recorded on
the sizes (core/symbolic.py): relations between dimensions, divisibility, the ranges a branch
needed. A call that breaks one compiles anew. Python numbers stay static: they are values in the
cache key (docs/sharp_bits.md), until a float is seen with a second value: then it is traced as a value,
one symbol `f0` of the compile's ShapeEnv that the generated function takes after its tensors
(core/symbolic.py's SymbolicInputs.number), and its entry serves every float there.
"""
from __future__ import annotations

import functools
import itertools

import torch

from thunderfn.cache_key import LEAVES, CacheKey, TensorPart
from thunderfn.core import symbolic
from thunderfn.errors import ArgumentIndexError, ArgumentTypeError

_generated = itertools.count()
# a TensorPart's shape comes first: a key pattern compares the fields after it as one slice (SymbolicSizes.matches)
_SHAPE = TensorPart._fields.index("shape")
assert _SHAPE == 0
DYNAMIC_DIMS = "_thunderfn_dynamic_dims"
STATIC_DIMS = "_thunderfn_static_dims"


def mark_dynamic(t: torch.Tensor, dim) -> None:
    """Compile every jitted function `t` is passed to with dimension `dim` (an int or a list of them)
    symbolic from the first call, as torch._dynamo.mark_dynamic does.

        >>> import torch, thunderfn as tf
        >>> fast = tf.jit(lambda x: x.sum(1))
        >>> x = torch.randn(4, 8)
        >>> tf.mark_dynamic(x, 1)
        >>> _ = fast(x)
        >>> tf.cache_info(fast)["symbolic"]                    # dimension 1 is the symbol s0
        [{'s0': "argument 'x'.shape[1]"}]
        >>> _ = fast(torch.randn(4, 5))                        # another length: the same entry
        >>> tf.cache_info(fast)["entries"]
        1
    """
    _mark(t, dim, DYNAMIC_DIMS, "mark_dynamic")


def mark_static(t: torch.Tensor, dim) -> None:
    """Keep dimension `dim` (an int or a list) of `t` static in every jitted function it is passed to,
    even with dynamic=True or after its size changed (torch._dynamo.mark_static).

        >>> import torch, thunderfn as tf
        >>> fast = tf.jit(lambda x: x.sum(1), dynamic=True)
        >>> x = torch.randn(4, 8)
        >>> tf.mark_static(x, 0)
        >>> _ = fast(x)
        >>> tf.cache_info(fast)["symbolic"]                    # only dimension 1 is symbolic
        [{'s0': "argument 'x'.shape[1]"}]
    """
    _mark(t, dim, STATIC_DIMS, "mark_static")


def _mark(t, dim, attribute: str, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{what}() expects a tensor, got {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    marked = set(getattr(t, attribute, ()))
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise ArgumentTypeError(f"{what}() expects dim to be an int or a list of ints, got {type(d).__name__}")
        if not -max(t.ndim, 1) <= d < max(t.ndim, 1):
            raise ArgumentIndexError(f"Dimension out of range (expected to be in range of [{-max(t.ndim, 1)}, "
                                     f"{max(t.ndim, 1) - 1}], but got {d})")
        marked.add(d % max(t.ndim, 1))
    setattr(t, attribute, marked)


def open_dimensions(dynamic, key: CacheKey, tensors: list, compiled_keys,
                    marked: dict | None = None, static_leaves=frozenset()) -> tuple[dict, dict, frozenset]:
    """(tensor number -> the dimensions a compile for this call leaves symbolic (empty: a static compile),
    (tensor number, dim) -> the size to trace an open dimension of size 1 with, the places among the call's
    flattened arguments of the Python floats traced as values).

    key is the call's cache key, compiled_keys the keys (or patterns) compiled
    so far: with dynamic=None, a dimension is opened when some compiled signature differs from this
    call's in that dimension's size and nowhere but in sizes and floats. `marked` (tensor number -> dims) opens
    dimensions as tf.mark_dynamic does, for every call (the torch.compile backend: the dims Dynamo made symbolic).

    A float is opened the same way, unless dynamic=False or it is (in) a static argument (`static_leaves`):
    when a compiled signature differs from this call's in its value and nowhere but in sizes and floats (a
    learning rate that changes every step compiles twice, then never again: torch.compile's automatic
    dynamic). An entry that traced it as a value serves every float there.

    A size of 1 is where broadcasting and many library branches (`if seq_len == 1`) decide differently: a
    trace made at 1 would be guarded to 1 and serve no other size. An open dimension of size 1 is traced at
    the size it had in the signature compiled before (at least 2); its entry runs the call at 1 only where
    none of its guards distinguishes 1, and otherwise 1 compiles an entry of its own."""
    parts = key.tensor_parts()
    opened: dict = {}
    numbers: set = set()
    seen: dict = {}  # (tensor number, dim) -> a size it had in a compiled signature
    if dynamic is True:  # (a module's parameters stay static, as torch.compile keeps them: see the docstring)
        opened = {k: set(range(len(p.shape))) for k, p in enumerate(parts)
                  if not isinstance(tensors[k], torch.nn.Parameter)}
    if dynamic is not False:
        for old in compiled_keys:
            changed = _changed_sizes(old, key)
            if changed is None:
                continue
            sizes, floats = changed
            numbers |= floats - set(static_leaves)
            if dynamic is None:
                for k, dims in sizes.items():
                    opened.setdefault(k, set()).update(dims)
                    olds = old.tensor_parts()[k].shape
                    seen.update({(k, d): olds[d] for d in dims if olds[d] is not None and olds[d] >= 2})
    for k, dims in (marked or {}).items():
        opened.setdefault(k, set()).update(dims)
    for k, t in enumerate(tensors):
        opened.setdefault(k, set()).update(getattr(t, DYNAMIC_DIMS, ()))
        opened[k] -= set(getattr(t, STATIC_DIMS, ()))
    opened = {k: frozenset(dims) for k, dims in opened.items() if dims}
    hints = {(k, d): seen.get((k, d), 2) for k, dims in opened.items() for d in dims if parts[k].shape[d] == 1}
    return opened, hints, frozenset(numbers)


def _changed_sizes(old: CacheKey, key: CacheKey) -> tuple[dict, set] | None:
    """(tensor number -> the dimensions whose size differs between two keys, the places of the Python floats
    whose values differ) when they differ in those only (the same structure, modes, dtypes, devices, ranks and
    other arguments); else None. A float an entry traced as a value (its pattern's value None) differs."""
    if len(old.leaves) != len(key.leaves) or old.head() != key.head():
        return None
    changed, floats, k = {}, set(), 0
    for i, (a, b) in enumerate(zip(old.leaves, key.leaves)):
        if (type(a) is TensorPart) != (type(b) is TensorPart):
            return None
        if type(a) is not TensorPart:
            if a != b:
                if a.kind is float and b.kind is float:
                    floats.add(i)
                    continue
                return None
            continue
        if a._replace(shape=None) != b._replace(shape=None) or len(a.shape) != len(b.shape):
            return None
        dims = {d for d, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y}
        if dims:
            changed[k] = dims
        k += 1
    return changed, floats


def served_key(key: CacheKey, inputs: symbolic.SymbolicInputs | None) -> CacheKey:
    """The key an entry compiled for `key` serves: each size its trace left symbolic None (free), each size it
    pinned the number it was traced at, each float it traced as a value ValuePart(float, None) (any float).
    The number a size is pinned at is not the call's where the call's size 1 was traced at
    another (open_dimensions' hints): such an entry serves that other size, and the call compiles again."""
    if inputs is None:
        return key
    traced = inputs.traced_shapes()  # tensor number -> its shape as traced: an int, or None where symbolic
    leaves, k = [], 0
    for i, part in enumerate(key.leaves):
        if type(part) is TensorPart:
            leaves.append(part._replace(shape=traced[k]))
            k += 1
        elif i in inputs.numbers:
            leaves.append(part._replace(value=None))
        else:
            leaves.append(part)
    return key._replace(leaves=tuple(leaves))
class SymbolicSizes:
    """What an entry compiled with symbolic dimensions checks besides the rest of its key: its key pattern
    (served_key: each symbolic size free) and the guards its trace recorded on the sizes."""

    def __init__(self, inputs: symbolic.SymbolicInputs, pattern: CacheKey):
        self.inputs = inputs  # (kept to say which guard a call breaks, and where it was asked: broken_by)
        self.dims = inputs.symbolic_dims  # tensor number -> its symbolic dimensions
        self.described = inputs.still_symbolic()  # "s0" -> "argument 'x'.shape[1]"
        self.facts = inputs.guards_in_words()
        self.pattern = pattern
        n_tensors = len(pattern.tensor_parts())
        # tensors are named a0, a1, ... in the order of the call's tensors, as jit's check-and-call functions name them
        names = [f"a{i}" for i in range(n_tensors)]
        self.guard_code = self.check_code(names, inputs.guard_code(names))
        source = (f"def hold(tensors):\n    {', '.join(names)}{',' if n_tensors == 1 else ''} = tensors\n"
                  f"    return {self.guard_code}\n")
        namespace = symbolic.evaluation_namespace()
        exec(compile(source, f"<thunderfn size guards {next(_generated)}>", "exec"), namespace)
        self.hold = namespace["hold"]

    def check_code(self, names: list[str], guards: str | None = None) -> str:
        """A Python expression over the tensors (named `names`) that holds when the symbolic sizes fit: each
        at least 1 (an empty tensor compiles its own entry) and the trace's guards."""
        terms = [f"{names[k]}.shape[{d}] >= 1" for k, dims in self.dims.items() for d in dims]
        terms += [f"({guards})"] if guards else []
        return " and ".join(terms) or "True"

    @functools.cached_property
    def matches(self):
        """A function of a call's cache key: whether it fits the pattern (everything equal but the symbolic
        sizes). Generated straight-line comparisons: a call whose arguments hold more than tensors (a key/value
        cache object) asks it on every call."""
        pattern = self.pattern
        # (positions of the key's fields, from their names: this runs on every call of such a function)
        namespace = {"head": pattern.head(), "pattern": pattern.leaves}
        terms = [f"len(leaves) == {len(pattern.leaves)}", f"key[:{LEAVES}] == head"]
        for i, p in enumerate(pattern.leaves):
            if type(p) is not TensorPart:
                # (a float traced as a value: any float)
                terms.append(f"leaves[{i}][0] is float" if p.kind is float and p.value is None
                             else f"leaves[{i}] == pattern[{i}]")
                continue
            # (a tensor's part against a non-tensor's: the comparisons below are False, or fail as caught below)
            terms += [f"leaves[{i}][{_SHAPE + 1}:] == pattern[{i}][{_SHAPE + 1}:]",
                      f"len(leaves[{i}][{_SHAPE}]) == {len(p.shape)}"]
            terms += [f"leaves[{i}][{_SHAPE}][{d}] == {n}" for d, n in enumerate(p.shape) if n is not None]
        source = f"def matches(key):\n    leaves = key[{LEAVES}]\n    try:\n        return (" + \
                 "\n                and ".join(terms) + ")\n    except (TypeError, IndexError):\n        return False\n"
        exec(compile(source, f"<thunderfn key pattern {next(_generated)}>", "exec"), namespace)
        return namespace["matches"]

    def failure(self, tensors) -> str | None:
        if self.hold(tensors):
            return None
        broken = self.inputs.broken_by([t.shape for t in tensors])
        if not broken and any(tensors[k].shape[d] == 0 for k, dims in self.dims.items() for d in dims):
            broken = ["a symbolic size is 0: an empty tensor compiles an entry of its own"]
        facts = "; ".join(broken or self.facts) or "every symbolic size is at least 1"
        return f"the sizes of this call break what the trace relied on ({facts}; {self.in_words()})"

    def in_words(self) -> str:
        return ", ".join(f"{name} = {where}" for name, where in self.described.items())
