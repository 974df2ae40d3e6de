"""The torch language's own machinery: `torchsymbol`, which makes a Python function the
symbol for torch callables, and the table of every torch-language symbol.

Every family module (elementwise.py, reductions.py, ...) defines its symbols with
`torchsymbol`; the package (thunderfn/torch/__init__.py) imports them all. A symbol is
also an attribute of the package (`tf.torch.mul`), which generated code calls as
`ltorch.<name>`.

May import: core/, prims, torch/opaque.py.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable

from thunderfn import prims
from thunderfn.core import context
from thunderfn.core.interception import register_handler
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves, tree_map
from thunderfn.core.symbol import Symbol
from thunderfn.errors import ArgumentValueError
from thunderfn.torch.opaque import opaque_symbol

# The package, thunderfn.torch, which is importing this module: symbols are its attributes.
_package = sys.modules[__name__.rpartition(".")[0]]
symbols: dict[str, Symbol] = {}  # name -> symbol, every torch-language symbol


def torchsymbol(*torch_fns: Callable, name: str | None = None, id=None, tags=()):
    """Decorator: make fn the thunderfn symbol for the given torch callables.

    The symbol prints as ``ltorch.<name>``; its body (written with thunderfn.clang,
    thunderfn.prims or other torch-language symbols) is recorded as its decomposition.

    `torch_fns`: the torch callables (torch.foo, torch.Tensor.foo, torch.nn.functional.foo)
    that, called while tracing, record this symbol; none makes a symbol only called directly.
    `name` (default: fn's name) must be an identifier; `id` (default "torch.<name>") is the key
    of its rules (VJP, batching, executors' lowerings); `tags` as make_prim's. The decorator
    returns the Symbol (fn's docstring is kept), also set as `thunderfn.torch.<name>`. Transforms
    differentiate and batch the decomposition unless the symbol has rules of its own; the torch
    executor runs the whole symbol as the one torch call it mirrors. The body may raise
    thunderfn.core.symbol.DecompositionUnavailable for a variant it does not decompose: that
    call is then recorded as an opaque torch op.

        >>> import math, torch, thunderfn as tf
        >>> from thunderfn.testing.registries import RegistrySnapshot
        >>> snapshot = RegistrySnapshot()  # to undo this example's registrations at its end
        >>> @tf.torch.torchsymbol(torch.sinc, torch.Tensor.sinc)
        ... def sinc(a):
        ...     zero = a == 0
        ...     x = tf.torch.where(zero, 1.0, a * math.pi)
        ...     return tf.torch.where(zero, 1.0, tf.torch.sin(x) / x)
        >>> t = torch.tensor([-1.5, 0.0, 0.25, 2.0], dtype=torch.float64)
        >>> [bsym.sym for bsym in tf.trace(torch.sinc, t).bound_symbols]
        [[Symbol name=ltorch.sinc]]
        >>> torch.testing.assert_close(tf.grad(lambda t: torch.sinc(t).sum())(t),
        ...                            torch.func.grad(lambda t: torch.sinc(t).sum())(t))
        >>> snapshot.restore()
    """

    def decorator(fn: Callable) -> Symbol:
        sym_name = name or fn.__name__
        if not sym_name.isidentifier():
            raise ArgumentValueError(f"a torch symbol's name must be a Python identifier, got {sym_name!r}")
        torch_fn = torch_fns[0] if torch_fns else None
        sym = Symbol(sym_name, id if id is not None else f"torch.{sym_name}", fn=_fresh_outputs(fn),
                     print_name=f"ltorch.{sym_name}",
                     namespace={"ltorch": _package}, torch_fn=torch_fn, tags=frozenset(tags),
                     fallback=None if torch_fn is None else functools.partial(_as_opaque_op, torch_fn))
        sym.__doc__ = fn.__doc__
        for torch_fn in torch_fns:
            register_handler(torch_fn, sym)
        symbols[sym_name] = sym
        if not hasattr(_package, sym_name) or isinstance(getattr(_package, sym_name), Symbol):
            setattr(_package, sym_name, sym)
        return sym

    return decorator


def _fresh_outputs(fn: Callable) -> Callable:
    """fn, except that an input it returns unchanged comes back as a new proxy (a reshape to
    its own shape), noted in `Tracer.identities`, when called at the top level of a trace.

    Eager torch returns such an input itself (`x.to(x.dtype)`), a view of it (`x.reshape(x.shape)`,
    `x[...]`), a copy (`torch.cat([x])`) or, depending on x's layout at run time, either
    (`x.contiguous()`). Recording the call lets the torch executor run torch's own op, so a
    jitted function aliases its inputs exactly as eager does; torch/inplace.py reads the note to
    decide what an in-place update of the result writes into."""

    @functools.wraps(fn)
    def body(*args, **kwargs):
        out = fn(*args, **kwargs)
        tracer = context.current_tracer()
        if tracer is None or tracer.symbol_depth != 1:  # inside a decomposition nothing is visible to the user
            return out
        # (no any()/all() here: this module's namespace holds torch.any and torch.all's symbols)
        outs = {id(o) for o in tree_leaves(out) if isinstance(o, TensorProxy)}
        inputs = {id(x) for x in tree_leaves((args, kwargs)) if isinstance(x, TensorProxy)}
        if not outs & inputs:
            return out

        def fresh(o):
            if not isinstance(o, TensorProxy) or id(o) not in inputs:
                return o
            new = prims.reshape(o, tuple(o.shape))
            tracer.identities[id(new)] = (new, o)
            return new

        return tree_map(fresh, out)

    return body


def _as_opaque_op(torch_fn, /, *args, **kwargs):
    """A torch symbol's fallback where its body has no decomposition (DecompositionUnavailable):
    the torch function it mirrors, recorded as an opaque op that torch runs."""
    return opaque_symbol(torch_fn)(*args, **kwargs)


def register_alias(torch_fn: Callable, fn: Callable) -> None:
    """Route a torch callable to a Python function of torch-language symbols
    (reflected operators, methods whose semantics are another op's)."""
    register_handler(torch_fn, fn)


def stand_in_front(owner, name: str, rewrite: Callable) -> None:
    """Replace torch's `owner.name` (a module's function, or a class's method) by one that calls
    `rewrite(original, *args, **kwargs)`, once: a second call leaves it. For torch Python code that
    tracing must see differently (each rewrite falls back to `original` outside its case)."""
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    if getattr(original, "__thunderfn_original__", None) is not None:
        return

    @functools.wraps(original)
    def in_front(*args, **kwargs):
        return rewrite(original, *args, **kwargs)

    in_front.__thunderfn_original__ = original
    setattr(owner, name, in_front)
