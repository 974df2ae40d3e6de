"""Pytrees through optree, in thunderfn's own namespace.

None is a node with no children (as in JAX), so `None` in an argument or output
structure round-trips without being treated as a value.
"""
from __future__ import annotations

import optree

NAMESPACE = "thunderfn"


def tree_flatten(tree):
    return optree.tree_flatten(tree, namespace=NAMESPACE)


def tree_flatten_with_path(tree):
    return optree.tree_flatten_with_path(tree, namespace=NAMESPACE)


def tree_unflatten(spec, leaves):
    return optree.tree_unflatten(spec, leaves)


def tree_map(fn, tree, *rest):
    return optree.tree_map(fn, tree, *rest, namespace=NAMESPACE)


def tree_leaves(tree):
    return optree.tree_leaves(tree, namespace=NAMESPACE)


def of_leaves(fn, leaves, spec, positions):
    """fn(*args, **kwargs), where (args, kwargs) flatten to `leaves` and `spec`, as a function of
    the leaves at `positions` (the rest fixed): what torch.func's transforms are handed to vary
    only those (an opaque op's tensors)."""
    def call(*varying):
        current = list(leaves)
        for i, x in zip(positions, varying):
            current[i] = x
        a, k = tree_unflatten(spec, current)
        return fn(*a, **k)

    return call


def register_pytree_node(cls, flatten, unflatten):
    """Make instances of cls traversable: `flatten(obj) -> (children, aux)`,
    `unflatten(aux, children) -> obj`."""
    optree.register_pytree_node(cls, flatten, unflatten, namespace=NAMESPACE)
    return cls
