"""Pytrees through optree, in thunderfn's own namespace.

None is a node with no children (as in JAX), so `None` in an argument or output
structure round-trips without being treated as a value.

Containers registered with torch's own pytree (`torch.utils._pytree.register_pytree_node`:
Hugging Face's ModelOutput, torch.fx's immutable collections, ...) are containers here
too, flattened and rebuilt by the functions torch was given: library code registers
with torch, not with us, and its outputs must come back as the same types holding real
tensors. They are adopted lazily, whenever torch's registry has grown since we last looked.
"""
from __future__ import annotations

import collections
import sys

import optree
import torch
from torch.utils import _pytree as torch_pytree

NAMESPACE = "thunderfn"

_adopted_count = 0  # len(torch's registry) when we last adopted from it
_adopted: set = set()  # the classes registered here on torch's behalf (a user's own registration replaces them)


def adopt_torch_registrations() -> None:
    """Register with optree (thunderfn's namespace) every type registered with torch's pytree
    since the last call. One len() when nothing changed: cheap enough for every flatten."""
    global _adopted_count
    nodes = torch_pytree.SUPPORTED_NODES
    if len(nodes) == _adopted_count:
        return
    for cls, node in list(nodes.items()):
        if not isinstance(cls, type) or cls in _NATIVE or optree.is_structseq_class(cls):
            continue
        try:
            optree.register_pytree_node(cls, node.flatten_fn, _torch_unflatten(node.unflatten_fn),
                                        namespace=NAMESPACE)
            _adopted.add(cls)
        except ValueError:  # registered already (by us, or by the user through tf.register_pytree_node)
            pass
    _adopted_count = len(nodes)
    _adopt_transformers_caches()


def _adopt_transformers_caches() -> None:
    """Hugging Face's key/value caches (DynamicCache and its layers) are plain objects that models
    create, fill and return; transformers registers them with torch's pytree only for torch.export,
    and with a flatten that cannot see thunderfn's proxies. Here each one is a container of its
    attributes. (Models that define ModelOutputs grow torch's registry on import, which brings us here.)"""
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None:
        return
    for base in (getattr(cache_utils, "Cache", None), getattr(cache_utils, "CacheLayerMixin", None)):
        for cls in _subclasses(base) if base is not None else ():
            if cls not in _by_attributes:
                register_by_attributes(cls)


def _subclasses(cls: type) -> list[type]:
    found = [cls]
    for sub in cls.__subclasses__():
        found += _subclasses(sub)
    return found


_by_attributes: set[type] = set()


def attribute_container_types() -> set[type]:
    """The classes whose instances are containers of their attributes (register_by_attributes):
    state-holding objects such as key/value caches, which code they are passed to may change.
    Adopts torch's registrations first, which registers transformers' caches once imported."""
    adopt_torch_registrations()
    return _by_attributes


def register_by_attributes(cls: type) -> type:
    """Make instances of cls containers of their attributes (`vars(obj)`): flattened into the
    attribute values, rebuilt without calling __init__. For plain state-holding objects (caches)."""
    def flatten(obj):
        names = tuple(sorted(vars(obj)))
        return [getattr(obj, n) for n in names], names, names

    def unflatten(names, values):
        obj = cls.__new__(cls)
        obj.__dict__.update(zip(names, values))
        return obj

    _by_attributes.add(cls)
    try:
        optree.register_pytree_node(cls, flatten, unflatten, namespace=NAMESPACE)
        _adopted.add(cls)
    except ValueError:  # the user registered it their own way
        pass
    return cls


def _torch_unflatten(unflatten_fn):
    # torch's is unflatten(children, context); optree's is unflatten(context, children)
    return lambda context, children: unflatten_fn(list(children), context)


# optree's own containers, which torch lists too (with the namedtuple factory, not a type); and
# torch.Size, which torch flattens into ints but thunderfn keeps whole: a shape is one static value.
_NATIVE = frozenset({tuple, list, dict, type(None), collections.OrderedDict, collections.defaultdict, collections.deque,
                     torch.Size})


def tree_flatten(tree):
    adopt_torch_registrations()
    return optree.tree_flatten(tree, namespace=NAMESPACE)


def tree_flatten_with_path(tree):
    adopt_torch_registrations()
    return optree.tree_flatten_with_path(tree, namespace=NAMESPACE)


def tree_unflatten(spec, leaves):
    return optree.tree_unflatten(spec, leaves)


def tree_map(fn, tree, *rest):
    return optree.tree_map(fn, tree, *rest, namespace=NAMESPACE)


def tree_leaves(tree):
    return optree.tree_leaves(tree, namespace=NAMESPACE)


def of_positions(fn, args, positions, kwargs=None):
    """fn(*args, **kwargs) as a function of the positional arguments at `positions` only, the
    others held fixed at args (and kwargs passed as they are): what a transform differentiates or
    batches when it varies some arguments (argnums; an opaque op's tensors). It keeps fn's name,
    so that errors name the user's function."""
    kwargs = {} if kwargs is None else kwargs

    def call(*varying):
        current = list(args)
        for i, x in zip(positions, varying):
            current[i] = x
        return fn(*current, **kwargs)

    call.__name__ = getattr(fn, "__name__", "fn")
    return call


def of_leaves(fn, leaves, spec, positions):
    """fn(*args, **kwargs), where (args, kwargs) flatten to `leaves` and `spec`, as a function of
    the leaves at `positions` (the rest fixed): what torch.func's transforms are handed to vary
    only those (an opaque op's tensors)."""
    def of_all_leaves(*current):
        a, k = tree_unflatten(spec, list(current))
        return fn(*a, **k)

    of_all_leaves.__name__ = getattr(fn, "__name__", "fn")
    return of_positions(of_all_leaves, leaves, positions)


def output_leaves(fn):
    """(leaves_of, rebuild): leaves_of(*args, **kwargs) is the tuple of fn's output's leaves, None left
    out (torch.func's transforms take tensors only, and an op may return None: convolution_backward for
    a gradient it was not asked for); rebuild(leaves) puts leaves, one per leaf of the last output,
    back into that output's structure."""
    specs = []

    def leaves_of(*args, **kwargs):
        leaves, spec = tree_flatten(fn(*args, **kwargs))
        specs[:] = [spec]
        return tuple(leaves)

    return leaves_of, lambda leaves: tree_unflatten(specs[0], list(leaves))


def register_pytree_node(cls, flatten, unflatten):
    """Make instances of cls traversable: `flatten(obj) -> (children, aux)`,
    `unflatten(aux, children) -> obj`."""
    if cls in _adopted:  # registered with torch's pytree too: the registration made for thunderfn wins
        optree.unregister_pytree_node(cls, namespace=NAMESPACE)
        _adopted.discard(cls)
    optree.register_pytree_node(cls, flatten, unflatten, namespace=NAMESPACE)
    return cls
