"""`thunderfn.extend`: adding to thunderfn from outside it.

- Primitives with their rules, in one call: `primitive` (any operation) and `elementwise_op`
  (an elementwise one, whose rules come from its partial derivatives). `defvjp`, `defjvp`,
  `defbatch` give an existing symbol a rule; every rule receives a `RecordedCall`.
- The executor API under the name Thunder's tutorials import it by:
  `from thunderfn.extend import OperatorExecutor, register_executor` is
  `from thunderfn.executors import ...`: the same objects. Thunder names with no counterpart
  here raise an AttributeError that says what to use instead (docs/porting-from-thunder.md has
  the whole table).
"""
from __future__ import annotations

import dis
import sys
from typing import Callable, Sequence

from thunderfn import clang, prims
from thunderfn.core.rules import RecordedCall
from thunderfn.errors import ArgumentTypeError, ArgumentValueError
from thunderfn.executors import (  # noqa: F401
    Executor,
    FusionExecutor,
    OperatorExecutor,
    add_default_executor,
    add_operator_executor,
    available,
    deregister_executor,
    get_all_executors,
    get_default_executors,
    get_executor,
    register_executor,
    remove_default_executor,
    set_default_executors,
)
from thunderfn.executors import nvfuser as nvfuser_executor
from thunderfn.torch import elementwise as ltorch_elementwise
from thunderfn.transforms.rules import elementwise as elementwise_rules
from thunderfn.transforms.rules.define import defbatch, defjvp, defvjp

__all__ = ["Executor", "FusionExecutor", "OperatorExecutor", "add_default_executor", "add_operator_executor",
           "available", "deregister_executor", "get_all_executors", "get_default_executors", "get_executor",
           "register_executor", "remove_default_executor", "set_default_executors", "elementwise_op", "primitive",
           "defvjp", "defjvp", "defbatch", "RecordedCall"]


def primitive(name: str, *, meta: Callable, impl: Callable, vjp: Callable | None = None, jvp: Callable | None = None,
              batch: Callable | None = None, tags: Sequence[str] = ()):
    """Add a primitive from outside the library, with its rules, in one call: what a prims.py entry
    and its op family's rules give a library prim. Returns the prim, also `tf.prims.<name>`, usable in
    traced code (`jit`, `grad`, `jvp`, `vmap`) and on real tensors.

    - `meta(*args, **kwargs)`: proxies (and Python values) in, output proxies out (a tuple for several
      outputs); it checks its inputs as torch would. Sizes are symbolic where the call has them (a
      dynamic dimension): compute with them, do not convert them to int.
    - `impl(*args, **kwargs)`: the same on real tensors, in torch (how it runs eagerly and on the torch
      executor).
    - `vjp(call, g)`: reverse mode, in the torch language (torch functions on the proxies): one
      cotangent per positional argument (None: none), given `call` (a RecordedCall: `call.args`,
      `call.kwargs`, `call.out`, and `call.arg(name)` by the name in meta's signature) and `g`, the
      output's cotangent (a tuple for several outputs, None where an output has none).
    - `jvp(call, tangents)`: forward mode, the output's tangent (a tuple for several outputs, None for
      a zero one), given one tangent per positional argument (None: zero).
    - `batch(call, dims)`: vmap, `(batched output, its batch dim)`, where call.args hold the batched
      arguments, `dims` their batch dimensions (None: unbatched) and call.out one example's output.
    - `tags`: facts transforms read (core/rules.py's TAG_ names: "not_differentiable", ...).
    A rule left None is one the transform that needs it (tf.grad, tf.jvp, tf.vmap) refuses with a
    named error naming the primitive and the missing rule. (A jitted function whose inputs require
    grad and which calls a primitive without a VJP rule runs `impl` under torch.autograd instead, as
    calling it eagerly would: right where impl is differentiable torch code.) A name already taken is
    refused here.

        >>> import torch, thunderfn as tf
        >>> from thunderfn.testing.registries import RegistrySnapshot
        >>> snapshot = RegistrySnapshot()  # to undo this example's registrations at its end
        >>> def cube_meta(x):
        ...     return tf.TensorProxy(shape=x.shape, dtype=x.dtype, device=x.device)
        >>> cube = tf.extend.primitive("docs_cube", meta=cube_meta, impl=lambda x: x ** 3,
        ...                            vjp=lambda call, g: (g * 3 * call.args[0] ** 2,))
        >>> x = torch.tensor([1.0, 2.0])
        >>> tf.jit(cube)(x), tf.grad(lambda x: cube(x).sum())(x)
        (tensor([1., 8.]), tensor([ 3., 12.]))
        >>> snapshot.restore()
    """
    if not (isinstance(name, str) and name.isidentifier()):
        raise ArgumentValueError(f"tf.extend.primitive: a primitive's name must be a Python identifier, got {name!r}")
    if hasattr(prims, name):
        raise ArgumentValueError(f"tf.extend.primitive: the name {name!r} is taken (prims.{name} exists); "
                                 f"choose another")
    for role, fn in (("meta", meta), ("impl", impl), ("vjp", vjp), ("jvp", jvp), ("batch", batch)):
        if fn is not None and not callable(fn):
            raise ArgumentTypeError(f"tf.extend.primitive {name!r}: {role} must be a function, got {type(fn).__name__}")
    if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags):
        raise ArgumentTypeError(f"tf.extend.primitive {name!r}: tags must be a sequence of strings, got {tags!r}")
    prim = prims.make_prim(f"extend.{name}", name, meta=meta, impl=impl, tags=tuple(tags))
    for define, rule in ((defvjp, vjp), (defjvp, jvp), (defbatch, batch)):
        if rule is not None:
            define(prim.id)(rule)
    return prim


def elementwise_op(name: str, kinds: Sequence[str], promotion: prims.Promotion, *, impl: Callable,
                   partials: Sequence[Callable], ltorch: prims.TorchSymbol | None = prims.SYMBOL,
                   nvfuser: str | None = None):
    """Add an elementwise op from outside the library, with one call: what a line of prims.py's
    elementwise table and its `partials` entry (transforms/rules/elementwise.py) give a library op. Makes the prim
    `prims.<name>` (taking tensors of the dtype `kinds`, prims.FLOAT and friends) computing `impl`
    on real tensors; clang's `clang.<name>` (promoting by `promotion`, broadcasting); its VJP and JVP
    rules from `partials`, one per operand (`partial(g, *operands, out)` is g times d(out)/d(operand),
    in the torch language, as the library's partials are written); its batching rule; nvFuser's op
    `nvfuser` where named; and, unless `ltorch` is None, the torch-language symbol `ltorch.<name>`
    (standing for the callables `ltorch.also` names), which it returns (the prim otherwise).
    The number of partials says how many operands it takes (1 or 2)."""
    make = {1: prims.unary_op, 2: prims.binary_op}.get(len(partials))
    if make is None:
        raise ArgumentValueError(f"elementwise_op {name!r}: give one partial per operand (1 or 2), got {len(partials)}")
    prim = make(name, kinds, promotion, name=name, impl=impl, ltorch=ltorch, nvfuser=nvfuser)
    op = prims.elementwise_ops[name]
    clang.define(op)
    elementwise_rules.defpartials(prim, *partials)
    if op.nvfuser is not None:
        nvfuser_executor.translations[prim.id] = nvfuser_executor.elementwise_rule(op)
    return prim if ltorch is None else ltorch_elementwise.plain_symbol(op)


# Thunder's names that thunderfn spells differently, or does without: what to write instead.
_INSTEAD = {
    "TemporaryExecutor": "an OperatorExecutor you do not register (pass it to tf.jit(executors=[ex]))",
    "get_always_executors": "tf.executors.get_default_executors() (the torch executor is always appended as the "
                            "fallback, unless tf.jit(fallback=False))",
    "add_always_executor": "tf.executors.add_default_executor(ex)",
    "remove_always_executor": "tf.executors.remove_default_executor(ex)",
    "set_always_executors": "tf.executors.set_default_executors([...])",
    "get_grad": "tf.custom_vjp: a rule's bwd(residuals, g) receives the output's gradient g",
    "put_grad": "tf.custom_vjp: a rule's bwd returns one gradient per argument",
    "put_grads": "tf.custom_vjp: a rule's bwd returns one gradient per argument",
    "DeviceType": "torch.device: a proxy's .device is one (x.device.type == 'cuda')",
}


def _called_by_from_import() -> bool:
    """Whether the code that asked for the attribute is a `from thunderfn.extend import name`.
    CPython's IMPORT_FROM looks the name up with an AttributeError-swallowing lookup and then
    raises its own bare "cannot import name" ImportError, so an AttributeError's hint never
    reaches a from-import. Only there is an ImportError raised instead (hasattr and getattr with
    a default need the AttributeError)."""
    try:
        caller = sys._getframe(2)  # 0: this function, 1: __getattr__, 2: the code that imports
        return dis.opname[caller.f_code.co_code[caller.f_lasti]] == "IMPORT_FROM"
    except (AttributeError, IndexError, ValueError):  # another Python implementation: the AttributeError
        return False


def __getattr__(name: str):
    if name in _INSTEAD:
        hint = (f"thunderfn.extend has no {name}, Thunder's name; use {_INSTEAD[name]}. "
                f"docs/porting-from-thunder.md lists every Thunder name and its thunderfn equivalent.")
        if _called_by_from_import():
            raise ImportError(hint, name=__name__, path=__file__)
        raise AttributeError(hint)
    raise AttributeError(f"module 'thunderfn.extend' has no attribute '{name}'")
