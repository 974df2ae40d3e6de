"""Which trace is being built right now, and by which Tracer (core/tracer.py: the state of a trace
while it is built, gone when it is done).

Traces nest: a transform called while an outer trace is being built traces its own
function into an inner trace and then emits the transformed result into the outer
one. Nested traces share one name pool, so a proxy's name is unique across all of
them and an inner trace's proxies can be emitted into the outer trace unchanged.
"""
from __future__ import annotations

import contextlib
import keyword
import re
import threading
import unicodedata

import torch

from thunderfn.errors import InternalError


class _TracingState(threading.local):
    def __init__(self):
        self.stack: list = []  # the Tracers of the traces being built, innermost last
        self.executors: tuple = ()  # the priority list the function being traced will be lowered onto
        self.stand_ins: list = []  # {id(tensor): (tensor, proxy)} scopes, innermost last (see `standing_in`)
        self.vmap_bodies = 0  # functions tf.vmap is tracing now (a value asked there is torch.func's vmap error)


_local = _TracingState()


@contextlib.contextmanager
def tracing_vmap_body():
    """Around the call of the function tf.vmap traces for one example."""
    _local.vmap_bodies += 1
    try:
        yield
    finally:
        _local.vmap_bodies -= 1

# Names generated code must never bind to a proxy: the modules the printed code
# refers to, and Python's keywords and builtins that generated code uses.
RESERVED_NAMES = frozenset(
    {"torch", "prims", "clang", "ltorch", "thunderfn", "operator", "builtins",
     "float", "int", "bool", "complex", "slice", "Ellipsis", "None", "True", "False",
     "tree_unflatten", "computation", "print", "len", "tuple", "list", "dict", "range", "args_list"}
) | frozenset(keyword.kwlist)


_rng_reseeds = 0  # seeding calls made through torch's functions by code that is not being traced


def note_rng_reseed() -> None:
    """Called by torch.manual_seed & co. outside tracing (torch/random.py), in any thread."""
    global _rng_reseeds
    _rng_reseeds += 1  # a lost update under a race still changes the count, all a reader asks


def rng_reseeds() -> int:
    return _rng_reseeds


# whether torch.func's transforms (vmap, grad, jvp) are active on this thread: the compiled function
# then runs the trace torch.func can see through (autograd_split.py, torch_rewrites.py)
functorch_active = torch._C._are_functorch_transforms_active


def tracer_stack() -> list:
    """The Tracers of the traces being built, outermost first (the outermost: the function jit compiles)."""
    return _local.stack


@contextlib.contextmanager
def active_executors(executors):
    """Tell transforms which executors the trace being built will run on: reverse mode
    called inside the traced function (tf.grad(f) in a jitted g) keeps whole what an
    executor claims and uses the VJP it registered for it (executors/base.py). Set by jit
    around tracing; read once, by transforms/autodiff.py's trace_vjp."""
    previous, _local.executors = _local.executors, tuple(executors)
    try:
        yield
    finally:
        _local.executors = previous


@contextlib.contextmanager
def standing_in(pairs):
    """While tracing, let each proxy stand in for its real tensor: traced code reads the
    module's own tensors (self.weight), and every torch call on one sees the proxy.
    This is the functional view of a module: nothing the user's module holds is ever
    replaced, so another thread using it eagerly during a compile sees its own tensors."""
    _local.stand_ins.append({id(t): (t, p) for t, p in pairs})
    try:
        yield
    finally:
        _local.stand_ins.pop()


def stand_in(tensor):
    """The proxy standing in for `tensor` (see `standing_in`), or None."""
    for scope in reversed(_local.stand_ins):
        entry = scope.get(id(tensor))
        if entry is not None and entry[0] is tensor:
            return entry[1]
    return None


def current_executors() -> tuple:
    """The executors set by `active_executors`; () outside it."""
    return _local.executors


def current_trace():
    """The innermost trace being built, or None when running eagerly."""
    stack = _local.stack
    return stack[-1].trace if stack else None


def current_tracer():
    """The Tracer building the innermost trace (core/tracer.py), or None when running eagerly."""
    stack = _local.stack
    return stack[-1] if stack else None


class NamePool:
    """Unique identifiers for proxies across a tracing session."""

    def __init__(self):
        self.used: set[str] = set()
        self.counters: dict[str, int] = {}

    def take(self, preferred: str | None = None, prefix: str = "t") -> str:
        if preferred is not None:
            preferred = to_identifier(preferred)
            if preferred not in self.used:
                self.used.add(preferred)
                return preferred
            prefix = preferred + "_"
        n = self.counters.get(prefix, 0)
        while f"{prefix}{n}" in self.used:
            n += 1
        self.counters[prefix] = n + 1
        name = f"{prefix}{n}"
        self.used.add(name)
        return name


def to_identifier(name: str) -> str:
    """A safe name (see is_safe_name) that reads like `name`: any name torch accepts for a
    parameter or buffer ("σ²", "lambda", "1x") must reach generated code. Accents are
    dropped, other letters spelled out ("σ²" -> "sigma_2"), keywords and reserved names get
    a trailing "_" ("lambda_"), names starting with a digit a leading "_" ("_1x")."""
    if is_safe_name(name):
        return name
    parts = []
    for c in unicodedata.normalize("NFKD", str(name)):  # "²" -> "2", "é" -> "e" + accent
        if c.isascii() and (c.isalnum() or c == "_"):
            parts.append(c)
        elif unicodedata.category(c).startswith("L"):  # a letter with no ASCII form: GREEK SMALL LETTER SIGMA
            parts.append("_" + re.sub(r"\W", "_", unicodedata.name(c, "x").split()[-1].lower()) + "_")
        elif not unicodedata.combining(c):
            parts.append("_")
    ident = re.sub(r"_+", "_", "".join(parts))
    ident = ident.strip("_") or "x"
    if ident[0].isdigit():
        ident = "_" + ident
    if ident in RESERVED_NAMES:
        ident += "_"
    return ident


def is_safe_name(name) -> bool:
    """A name may reach generated code only if it is a plain identifier we do not reserve."""
    return (isinstance(name, str) and name.isidentifier() and name.isascii()
            and name not in RESERVED_NAMES and not name.startswith("__"))


def new_name(preferred: str | None = None, prefix: str = "t") -> str:
    stack = _local.stack
    if not stack:
        raise InternalError("proxies can only be created while a trace is being built")
    return stack[-1].trace.names.take(preferred, prefix)


# -- jit, for transforms called with real tensors ----------------------------------------------
# A transformed function (tf.grad(f), tf.vjp, a custom_vjp that torch.autograd differentiates,
# tf.executor_lower) called with real tensors runs compiled: traced, lowered, cached, which is jit.
# jit sits above the transforms (docs/architecture.md), so thunderfn/jit.py
# registers it here when imported; importing any part of thunderfn imports the package, and with
# it jit.py.
_jit_functions: dict = {}


def register_jit(jit, jit_evicting) -> None:
    """Called once, by thunderfn/jit.py when it is imported."""
    _jit_functions.update(jit=jit, jit_evicting=jit_evicting)


def _registered(name: str):
    fn = _jit_functions.get(name)
    if fn is None:
        raise InternalError("a transformed function called with real tensors runs through thunderfn.jit, which is not "
                           "imported; import thunderfn")
    return fn


def jit(fn, **options):
    """thunderfn.jit(fn, **options), as registered by thunderfn/jit.py."""
    return _registered("jit")(fn, **options)


def jit_evicting(fn, **options):
    """thunderfn.jit's form for transforms (past the cache size limit the oldest entry goes,
    since a transform has no eager form), as registered by thunderfn/jit.py."""
    return _registered("jit_evicting")(fn, **options)


# -- custom_vjp, for executors -----------------------------------------------------------------
# An executor's register_lowering(..., vjp=(fwd, bwd)) makes a tf.custom_vjp function of the pair
# (executors/base.py). custom_vjp is a transform, and executors do not import transforms, so
# transforms/custom_vjp.py registers it here when imported; thunderfn/__init__.py imports the
# transforms before the executors, whose built-in kernels register their vjps on import.
_custom_vjp: list = []


def register_custom_vjp(custom_vjp) -> None:
    """Called once, by transforms/custom_vjp.py when it is imported."""
    _custom_vjp[:] = [custom_vjp]


def custom_vjp():
    """The tf.custom_vjp class, as registered by transforms/custom_vjp.py."""
    if not _custom_vjp:
        raise InternalError("an executor's vjp= becomes a tf.custom_vjp function, and transforms/custom_vjp.py is "
                           "not imported; import thunderfn")
    return _custom_vjp[0]
