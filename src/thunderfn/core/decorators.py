"""Transforms that take options are written two ways over a `def`, as in JAX:

    @tf.jit                            @tf.jit(static_argnums=1)
    def f(x, n): ...                   def f(x, n): ...

`with_options_form(transform)` gives `transform(fn, **options)` the second form: called with
options alone (no function), it returns the decorator that applies them.
"""
from __future__ import annotations

import functools
from typing import Callable


def with_options_form(transform: Callable) -> Callable:
    @functools.wraps(transform)
    def either(*args, **options):
        if args or "fn" in options:
            return transform(*args, **options)
        return functools.partial(transform, **options)

    return either
