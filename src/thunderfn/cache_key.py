"""The cache key of a jitted function's call: what a compiled entry was compiled for, field by field.

A call's key (`CacheKey`) is its pytree structure, the modes torch computes under (grad mode, default dtype,
autocast) and one part per flattened argument: a `TensorPart` for a tensor (its shape, dtype, device and
requires_grad), a `ValuePart` for anything else (its value, or a hashable stand-in for it). The key's layout
is stated here once; jit.py builds keys, fast_path.py generates its comparisons from these fields,
dynamic_shapes.py frees symbolic sizes in them and cache_misses.py explains how two differ.

They are named tuples, so hashing and comparing them costs what plain tuples cost. Building one does
not: a call that takes the general path builds its key on every call, so its parts are plain tuples in
the parts' field order (`tensor_fields` reads a tensor's), equal to the named ones and hashed the same,
and a key is `named` once a compile needs its fields. Every key stored in the cache is named. A symbolic
entry's key pattern is a CacheKey whose TensorParts hold None for each symbolic size.

The api layer: imported by jit.py, fast_path.py, dynamic_shapes.py and cache_misses.py.
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import torch


class TensorPart(NamedTuple):
    """A tensor argument's part of the key. The field names are the tensor's attribute names: the fast
    path generates `a0.shape, a0.dtype, ...` from them (fast_path.py)."""
    shape: torch.Size  # (a tuple with None for each symbolic size, in a symbolic entry's pattern)
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool


class ValuePart(NamedTuple):
    """A non-tensor argument's part of the key: its type and its value, or where the value would not
    key it well, a stand-in (JitState.key says which and why): a float's or complex's bits, a numpy
    scalar's bytes, a slice's bounds."""
    kind: type
    value: object


class CacheKey(NamedTuple):
    """A call's signature: what an entry is compiled for and looked up by."""
    structure: object  # the pytree spec of (args, kwargs)
    grad_enabled: bool  # torch.is_grad_enabled()
    default_dtype: torch.dtype  # torch.get_default_dtype()
    autocast: tuple  # torch/autocast.py's autocast_state(): () outside autocast
    leaves: tuple  # a TensorPart or ValuePart per flattened argument, in order

    def tensor_parts(self) -> list[TensorPart]:
        return [p for p in self.leaves if type(p) is TensorPart]

    def head(self) -> tuple:
        """Every field but the leaves."""
        return self[:LEAVES]


LEAVES = CacheKey._fields.index("leaves")
assert LEAVES == len(CacheKey._fields) - 1, "the leaves are the key's last field (CacheKey.head)"

# A tensor's part of a call's key as a plain tuple of its TensorPart fields, in order (the tensor's attributes
# of those names, read in C).
tensor_fields = operator.attrgetter(*TensorPart._fields)


def named(key: CacheKey, leaves) -> CacheKey:
    """A call's key (built by JitState.key, its parts plain tuples) with each part a TensorPart or a
    ValuePart, as the flattened arguments `leaves` say."""
    return key._replace(leaves=tuple(TensorPart._make(part) if isinstance(leaf, torch.Tensor) else ValuePart._make(part)
                                     for part, leaf in zip(key.leaves, leaves)))
