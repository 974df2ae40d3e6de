"""Transforms that take options are written two ways over a `def`, as in JAX:

    @tf.jit                            @tf.jit(static_argnums=1)
    def f(x, n): ...                   def f(x, n): ...

`with_options_form(transform)` gives `transform(fn, **options)` the second form: called with
options alone (no function), it returns the decorator that applies them. `takes_arguments_of`
presents a transform's result as taking its function's arguments.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Callable


def with_options_form(transform: Callable) -> Callable:
    @functools.wraps(transform)
    def either(*args, **options):
        if args or "fn" in options:
            return transform(*args, **options)
        return functools.partial(transform, **options)

    return either


def takes_arguments_of(transformed: Callable, fn: Callable) -> Callable:
    """transformed, presented as taking fn's arguments, as tf.grad(f) and tf.vmap(f) do: `inspect.signature` gives
    fn's and the docstring is fn's, as functools.wraps gives torch.func's and JAX's transforms (the name stays the
    transform's own, `grad_f`, which its traces are named by). Libraries read signatures to decide what to pass.
    No `__wrapped__`: tracing follows it to find torch's functions (core/interception.py), and a transform of
    torch.sum is not torch.sum."""
    with contextlib.suppress(TypeError, ValueError):
        transformed.__signature__ = inspect.signature(fn)
    transformed.__doc__ = getattr(fn, "__doc__", None)
    return transformed
