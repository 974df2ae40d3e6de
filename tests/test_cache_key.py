"""jit's cache key (thunderfn/cache_key.py) read by field, and the explanations of misses built from it
(thunderfn/cache_misses.py): the same words for every kind of change."""
from __future__ import annotations

import numpy as np
import torch

import thunderfn as tf
from thunderfn.cache_key import CacheKey, TensorPart, ValuePart, named
from thunderfn.fast_path import fast_key


def f(x, a, b=None):
    return x * 2 if b is None else x * 3


def test_a_calls_key_names_its_structure_modes_and_one_part_per_argument():
    jitted = tf.jit(f)
    x = torch.randn(3)
    jitted(x, 2.0)
    ((key, (entry,)),) = jitted._thunderfn_state.cache.items()
    assert entry.key is key  # the stored key is named
    assert type(key) is CacheKey and key.grad_enabled is True and key.default_dtype is torch.float32
    assert key.autocast == ()
    assert key.leaves == (TensorPart(x.shape, x.dtype, x.device, False), ValuePart(float, (2.0).hex()))
    assert key.tensor_parts() == [key.leaves[0]] and key.head() == key[:4]
    # the fast path's flat key holds the same fields, in TensorPart's order (fast_path.py generates it)
    assert fast_key((x,)) == (True, torch.float32, *key.leaves[0])


def test_a_symbolic_entrys_pattern_is_a_key_with_its_symbolic_sizes_free():
    jitted = tf.jit(lambda x: x * 2, dynamic=True)
    jitted(torch.randn(3, 4))
    (entry,) = jitted._thunderfn_state.symbolic_entries
    assert type(entry.sizes.pattern) is CacheKey and entry.sizes.pattern.leaves[0].shape == (None, None)
    leaves = [torch.randn(5, 6)]
    key = jitted._thunderfn_state.key(leaves, entry.sizes.pattern.structure)  # (its parts plain tuples)
    assert entry.sizes.matches(key) and entry.sizes.matches(named(key, leaves))
    assert key == named(key, leaves) and hash(key) == hash(named(key, leaves))
    assert type(named(key, leaves).leaves[0]) is TensorPart and named(key, leaves).leaves[0].shape == (5, 6)
    key = named(key, leaves)
    assert not entry.sizes.matches(key._replace(leaves=(key.leaves[0]._replace(dtype=torch.float64),)))
    assert not entry.sizes.matches(key._replace(grad_enabled=False))


def test_every_kind_of_change_is_explained_in_the_same_words():
    calls = [((torch.randn(3), 2.0), {}), ((torch.randn(3), 3.0), {}), ((torch.randn(3), -0.0), {}),
             ((torch.randn(3), complex(1, 2)), {}), ((torch.randn(3), slice(1, None, 2)), {}),
             ((torch.randn(3), np.float32(2.5)), {}), ((torch.randn(3), "s"), {}),
             ((torch.randn(3), torch.randn(2)), {}), ((torch.randn(3), 2.0), {"b": 1}),
             ((torch.randn(3, dtype=torch.float64), 2.0), {}), ((torch.randn(3, requires_grad=True), 2.0), {}),
             ((torch.randn(4), 2.0), {})]
    jitted = tf.jit(f, cache_size_limit=100, dynamic=False)
    for args, kwargs in calls:
        jitted(*args, **kwargs)
    with torch.no_grad():
        jitted(torch.randn(3), 2.0)
    jitted(torch.randn(3), 1.5)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        jitted(torch.randn(3), 2.0)
    finally:
        torch.set_default_dtype(previous)
    a_tensor = "(torch.Size([2]), torch.float32, device(type='cpu'), False)"
    assert tf.cache_info(jitted)["recompiles"] == [
        "argument 1 changed from 2.0 to 3.0",
        "argument 1 changed from 3.0 to -0.0",
        "argument 1 changed from -0.0 to (1+2j)",
        "argument 1 changed from (1+2j) to slice(1, None, 2)",
        "argument 1 changed from slice(1, None, 2) to np.float32(2.5)",
        "argument 1 changed from np.float32(2.5) to 's'",
        f"argument 1 changed from 's' to {a_tensor}",
        "the structure of the arguments changed (pytree, number of arguments or keywords)",
        "tensor argument 0 changed: dtype torch.float32 -> torch.float64",
        "tensor argument 0 changed: requires_grad False -> True",
        "tensor argument 0 changed: shape (3,) -> (4,)",
        "torch's grad mode changed (is_grad_enabled() was True, now False)",
        f"argument 1 changed from {a_tensor} to 1.5",
        "torch's default dtype changed from torch.float32 to torch.float64",
    ]
