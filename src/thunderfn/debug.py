"""tf.debug: look at values while compiled code runs.

`print(x)` inside traced code prints a proxy, once, when the function is traced (the values do
not exist yet). `tf.debug.print("loss {}", loss)` records a statement instead: the compiled
function formats and prints the real values on every call, in program order, under jit, grad,
vjp, jvp and vmap (once for the batch, each value with its batch dimension first, as
jax.debug.print), and in a backward. Outside tracing it prints at once. `tf.debug.breakpoint()` likewise stops in pdb on
every call of the compiled function, in a frame whose `values` holds the tensors passed to it (`p values`).
"""
from __future__ import annotations

from thunderfn.core import context
from thunderfn.core.pytree import tree_flatten
from thunderfn.core.statements import break_into_debugger, debug_breakpoint, debug_print, format_and_print
from thunderfn.errors import ArgumentTypeError


def print(fmt: str, *args, **kwargs) -> None:  # noqa: A001 (jax.debug.print's name)
    """Print `fmt.format(*args, **kwargs)` with the values of args (pytrees of tensors and numbers)
    every time the compiled function runs; at once outside tracing.

        >>> import torch, thunderfn as tf
        >>> def f(x):
        ...     y = torch.tanh(x)
        ...     tf.debug.print("y sums to {:.2f}", y.sum())
        ...     return y * 2
        >>> jitted = tf.jit(f)
        >>> _ = jitted(torch.zeros(3))
        y sums to 0.00
        >>> _ = jitted(torch.ones(3))
        y sums to 2.28
    """
    if not isinstance(fmt, str):
        raise ArgumentTypeError(f"tf.debug.print: fmt must be a format string, got {type(fmt).__name__}")
    leaves, spec = tree_flatten((args, kwargs))
    tracer = context.current_tracer()
    if tracer is None:
        format_and_print(fmt, spec, *leaves)
        return
    tracer.emit(debug_print.bind(fmt, spec, *leaves, output=None))


def breakpoint(*values) -> None:  # noqa: A001 (Python's builtin's name, as jax.debug.breakpoint)
    """Stop in Python's debugger every time the compiled function runs (at once outside tracing), in
    a frame whose local `values` holds the given tensors' values on that call (Python's
    `breakpoint()`: pdb, or what PYTHONBREAKPOINT names; `PYTHONBREAKPOINT=0` turns it off).

        >>> import sys, torch, thunderfn as tf
        >>> seen = []
        >>> sys.breakpointhook = lambda: seen.append(sys._getframe(1).f_locals["values"])  # in place of pdb
        >>> jitted = tf.jit(lambda x: (tf.debug.breakpoint(x.exp()), x + 1)[1])
        >>> _ = jitted(torch.zeros(2)); _ = jitted(torch.ones(2))
        >>> [v[0][0].item() for v in seen]
        [1.0, 2.718281...]
        >>> sys.breakpointhook = sys.__breakpointhook__
    """
    tracer = context.current_tracer()
    if tracer is None:
        break_into_debugger(*values)
        return
    tracer.emit(debug_breakpoint.bind(*values, output=None))
