"""tf.jit's options as one record: each value checked once, when tf.jit is called.

`JitOptions` holds every option of tf.jit with its default; building one checks each value and
refuses a bad one with an ArgumentTypeError or ArgumentValueError naming the option (JAX parses
jax.jit's options once into a record the same way). tf.jit builds it from its keyword arguments,
and everything that compiles as tf.jit does takes the record whole: the module path (module.py),
the compile stages (compile_stages.py), tf.profile's twin and the torch.compile backend
(dynamo/compiler.py), which adds no option of its own to tf.jit's but `unsupported`.

What needs the jitted function is checked later, once too: static_argnums, static_argnames and
donate_argnums against its signature when tf.jit is called (static_args.py), and whether each executor can run here when
it first compiles (executors.resolve).

The api layer. May import: executors, transforms (the distributed configurations), core and errors.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import os

from thunderfn import executors as _executors
from thunderfn.errors import ArgumentTypeError, ArgumentValueError
from thunderfn.executors.base import Executor
from thunderfn.transforms.ddp import DataParallel
from thunderfn.transforms.fsdp import Sharded

DEFAULT_CACHE_SIZE_LIMIT = 8  # torch.compile's recompile_limit


@dataclasses.dataclass(frozen=True)
class JitOptions:
    """tf.jit's options (their meaning: tf.jit's docstring and docs/jit.md), checked and put in one form:
    `executors` a tuple (one executor alone is a tuple of one; with `fusion`, the fusion executor is last
    in it), `static_argnums` and `donate_argnums` tuples of ints and `static_argnames` a tuple of strs."""
    executors: tuple | None = None  # names or Executors in priority order; None: the defaults at compile time
    fallback: bool = True
    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()
    disable_torch_autograd: bool = False
    cache_size_limit: int = DEFAULT_CACHE_SIZE_LIMIT
    rematerialize: bool | None = None  # None: where a fusion executor is used (compile_stages._rematerializes)
    cache_dir: str | os.PathLike | None = None  # None: $THUNDERFN_CACHE_DIR, or nowhere (core/artifacts.py)
    distributed: DataParallel | Sharded | None = None  # set by tf.distributed's modules, not by users
    fusion: bool | str | Executor = False
    dynamic: bool | None = None  # None (automatic), True or False: see dynamic_shapes.py
    donate_argnums: tuple[int, ...] = ()  # arguments whose tensors' memory the compiled code may reuse (donation.py)
    reuse_blocks: bool = True  # a module's repeated layers traced, differentiated and lowered once (blocks.py)

    def __post_init__(self):
        put = functools.partial(object.__setattr__, self)  # (a frozen record: each value stored in its checked form)
        put("executors", _priority_list(self.executors, self.fusion))
        put("fallback", _flag("fallback", self.fallback))
        put("static_argnums", _as_indices(self.static_argnums))
        put("donate_argnums", _as_indices(self.donate_argnums, "donate_argnums"))
        put("static_argnames", _as_names(self.static_argnames))
        put("disable_torch_autograd", _flag("disable_torch_autograd", self.disable_torch_autograd))
        put("reuse_blocks", _flag("reuse_blocks", self.reuse_blocks))
        if not (isinstance(self.cache_size_limit, int) and self.cache_size_limit >= 1):
            raise ArgumentValueError(f"cache_size_limit must be a positive int, got {self.cache_size_limit!r}")
        if not (self.rematerialize is None or isinstance(self.rematerialize, bool)):
            raise ArgumentValueError(f"rematerialize must be None (on where a fusion executor is used), True or "
                                     f"False, got {self.rematerialize!r}")
        if not (self.cache_dir is None or isinstance(self.cache_dir, (str, os.PathLike))):
            raise ArgumentTypeError(f"cache_dir must be a path (a str or an os.PathLike) or None, got "
                                    f"{type(self.cache_dir).__name__}")
        if not (self.distributed is None or isinstance(self.distributed, (DataParallel, Sharded))):
            raise ArgumentTypeError(f"distributed must be None, a DataParallel or a Sharded (set by tf.distributed.ddp "
                                    f"and fsdp on the modules they prepare), got {type(self.distributed).__name__}")
        if self.dynamic not in (None, True, False):
            raise ArgumentValueError(f"dynamic must be None (automatic), True or False, got {self.dynamic!r}")


NAMES = tuple(field.name for field in dataclasses.fields(JitOptions))  # in tf.jit's signature's order


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r}")
    return value


def _priority_list(executors, fusion) -> tuple | None:
    """executors as a tuple (None: the defaults, read at compile time), each a registered name or an
    Executor; with fusion (True or a fusion executor), that fusion executor last."""
    chosen = None if executors is None else tuple(_executors.as_priority_list(executors))
    for ex in chosen or ():
        if not isinstance(ex, (str, Executor)):
            raise ArgumentTypeError(f"executors must be an executor (a registered name or an Executor) or a list "
                                    f"of them in priority order, got {ex!r} among them")
        if isinstance(ex, str):
            try:
                _executors.get_executor(ex)
            except ArgumentValueError as e:  # (it lists the registered names)
                raise ArgumentValueError(f"executors: {e}") from None
    if fusion is not False:  # (with_fusion checks fusion, and reads the defaults now to put it after them)
        return tuple(_executors.with_fusion(chosen, fusion))
    return chosen


def _as_indices(argnums, option: str = "static_argnums") -> tuple[int, ...]:
    if argnums is None:
        return ()
    try:
        return (operator.index(argnums),)
    except TypeError:
        pass
    try:
        return tuple(operator.index(i) for i in argnums)
    except TypeError:
        raise ArgumentTypeError(f"{option} must be an int or a sequence of ints, got {argnums!r}") from None


def _as_names(argnames) -> tuple[str, ...]:
    if argnames is None:
        return ()
    if isinstance(argnames, str):
        return (argnames,)
    try:
        names = tuple(argnames)
    except TypeError:
        names = None
    if names is None or not all(isinstance(a, str) for a in names):
        raise ArgumentTypeError(f"static_argnames must be a str or a sequence of strs, got {argnames!r}")
    return names
