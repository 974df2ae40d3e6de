"""The cache key of a jitted function's call: what a compiled entry was compiled for, field by field.

A call's key (`CacheKey`) is its pytree structure, the modes torch computes under (grad mode, default dtype,
autocast) and one part per flattened argument: a `TensorPart` for a tensor (its shape, dtype, device and
requires_grad), a `ValuePart` for anything else (its value, or a hashable stand-in for it). The key's layout
is stated here once; jit.py builds keys, fast_path.py generates its comparisons from these fields,
dynamic_shapes.py frees symbolic sizes in them and cache_misses.py explains how two differ.

They are named tuples, so hashing and comparing them costs what plain tuples cost. A symbolic entry's
key pattern is a CacheKey whose TensorParts hold None for each symbolic size.

The api layer: imported by jit.py, fast_path.py, dynamic_shapes.py and cache_misses.py.
"""
from __future__ import annotations

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
