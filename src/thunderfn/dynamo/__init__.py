"""tf.dynamo: thunderfn as a torch.compile backend (docs/torch_compile.md).

    torch.compile(model, backend="thunderfn")                      # found through the entry point
    torch.compile(model, backend=tf.dynamo.backend(fusion=True))   # with tf.jit's options
    print(tf.dynamo.explain(compiled))                             # graphs, graph breaks, splits

Dynamo captures graphs from the bytecode, breaks them around what it cannot capture and
guards the Python state; thunderfn compiles each graph (dynamo/compiler.py), cutting it around
nodes it cannot take (dynamo/splitting.py). Nothing here imports torch._dynamo.

The api layer.
"""
from __future__ import annotations

from thunderfn.dynamo.compiler import Backend, find_backend
from thunderfn.dynamo.report import Explanation
from thunderfn.errors import ArgumentTypeError


def backend(**options) -> Backend:
    """A torch.compile backend with tf.jit's options (executors, fusion, rematerialize, cache_dir,
    cache_size_limit) and `unsupported="eager"|"inductor"`: what runs the graph pieces thunderfn
    cannot take.

        >>> import torch, thunderfn as tf
        >>> compiled = torch.compile(lambda x: torch.sin(x) * 2, backend=tf.dynamo.backend(fusion=False))
        >>> torch.testing.assert_close(compiled(torch.ones(3)), torch.sin(torch.ones(3)) * 2)
    """
    return Backend(**options)


# What torch.compile(backend="thunderfn") finds through the `torch_dynamo_backends` entry point
# (pyproject.toml); torch.compile(..., options={...}) passes tf.jit's options to it per call.
default_backend = Backend()


def explain(compiled) -> Explanation:
    """What the thunderfn backend did for `compiled` (what torch.compile returned, or a backend
    made by tf.dynamo.backend): its graphs, Dynamo's graph breaks and their reasons, the nodes
    thunderfn did not take and why, and each thunderfn piece's jitted function.

        >>> import torch, thunderfn as tf
        >>> compiled = torch.compile(lambda x: torch.cos(x) + 1, backend="thunderfn")
        >>> _ = compiled(torch.ones(3))
        >>> report = tf.dynamo.explain(compiled)
        >>> len(report.graphs), report.graph_breaks, len(report.thunderfn_functions)
        (1, [], 1)
    """
    found, wrapper = find_backend(compiled)
    if found is None:
        raise ArgumentTypeError(f"tf.dynamo.explain expects what torch.compile(..., backend='thunderfn') (or "
                                f"backend=tf.dynamo.backend(...)) returned, or such a backend; got "
                                f"{type(compiled).__name__}")
    return Explanation(found.records.of(wrapper))


__all__ = ["Backend", "Explanation", "backend", "default_backend", "explain"]
