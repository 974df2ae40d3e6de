"""How torch calls made by user code reach thunderfn while a trace is being built.

Two doors lead to `dispatch`: TensorProxy's own entry points, defined here (its
`__torch_function__` for any torch call with a proxy among its arguments, its
methods, operators and `.grad`), and `TracingMode`, a TorchFunctionMode active
during tracing, which also sees calls with no proxy at all (`torch.ones(3)`,
`torch.arange(T)`, methods on captured weights). `handlers` maps each torch
callable (function, method, operator) to the thunderfn callable that traces it.

What `dispatch` does with a call (a symbol, an in-place write, a view, the opaque
fallback) is the torch language's business: thunderfn/torch/dispatch.py, which the
torch language hands to `set_dispatcher` when it is imported, since core sits below
the languages and never imports them.

May import: the rest of core/ (not core/trace.py, which imports this module), errors.py.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import threading
import warnings

import torch
from torch.overrides import TorchFunctionMode

from thunderfn.core import context, dtypes, symbolic
from thunderfn.core.call_time import read_grad
from thunderfn.core.proxies import TensorProxy, is_real_tensor
from thunderfn.errors import InternalError, UnsupportedOpError

# torch callable -> callable taking the same arguments with proxies in place of tensors
handlers: dict = {}


def unwrapped(fn) -> list:
    """fn, then each function it wraps (functools.wraps's `__wrapped__`), outermost first.

    torch's callables are not always the objects thunderfn saw when it registered them: importing
    torch._dynamo (torch.testing, many libraries do) replaces torch.manual_seed by a wrapper that
    turns Dynamo off, deprecation decorators wrap functions, and thunderfn's own stand_in_front
    (torch/base.py) puts a function in front of F.l1_loss, whose handle_torch_function then names
    the wrapper. Every table keyed by torch callables is entered and read through this chain, so
    the import order and such wrappers never change which handler a call reaches."""
    chain = [fn]
    while len(chain) < 16:  # a cycle of __wrapped__ (never seen) must not hang tracing
        try:
            inner = getattr(chain[-1], "__wrapped__", None)
        except Exception:  # objects whose attribute access raises
            inner = None
        if inner is None or not callable(inner) or any(inner is c for c in chain):
            break
        chain.append(inner)
    return chain


def lookup(table, fn):
    """table[fn], or the entry of the nearest function fn wraps; None if none has one."""
    try:
        found = table.get(fn)
    except TypeError:  # unhashable
        return None
    if found is None and hasattr(fn, "__wrapped__"):
        for inner in unwrapped(fn)[1:]:
            found = table.get(inner)
            if found is not None:
                break
    return found


def register_handler(torch_fn, handler) -> None:
    """handler traces torch_fn, and every function torch_fn wraps that has no handler of its own
    (torch's handle_torch_function may name the inner one: see `unwrapped`)."""
    handlers[torch_fn] = handler
    for inner in unwrapped(torch_fn)[1:]:
        handlers.setdefault(inner, handler)


# Callables that are made at run time and cannot be listed in `handlers` beforehand (a user's
# torch.library custom op): finder(func) -> a handler for func, or None (transforms/user_functions.py)
handler_finders: list = []


def register_handler_finder(finder) -> None:
    handler_finders.append(finder)


class _Overrides(threading.local):
    def __init__(self):
        self.table: dict = {}  # torch callable -> the handler this thread traces it with for now


_overrides = _Overrides()


@contextlib.contextmanager
def handled_by(torch_fn, handler):
    """Trace torch_fn with handler instead of its usual one, on this thread only and inside the block (a
    lowering traces x.contiguous() as a copy): `handlers` itself is never changed, so another thread
    tracing at the same time keeps the usual meaning."""
    table = _overrides.table
    previous = table.get(torch_fn, _NONE)
    table[torch_fn] = handler
    try:
        yield
    finally:
        if previous is _NONE:
            del table[torch_fn]
        else:
            table[torch_fn] = previous


_NONE = object()


def find_handler(func):
    """The handler tracing uses for func: this thread's override (handled_by), its entry in `handlers`
    (through wrappers), or what a finder gives."""
    overrides = _overrides.table
    handler = overrides.get(func) if overrides else None
    if handler is None:
        handler = lookup(handlers, func)
    if handler is None:
        for finder in handler_finders:
            handler = finder(func)
            if handler is not None:
                break
    return handler


# Metadata functions called on a proxy: answered from its metadata at trace time.
handlers.update({
    torch.numel: lambda a: a.numel(),
    torch.is_floating_point: lambda a: a.is_floating_point(),
    torch.is_complex: lambda a: a.is_complex(),
    torch.is_signed: lambda a: a.dtype.is_signed,
    torch.Tensor.is_signed: lambda a: a.dtype.is_signed,
    torch.Tensor.is_same_size: lambda a, b: a.shape == b.shape,
    torch.result_type: lambda a, b: dtypes.result_type(a, b),
})


def _refuse_grad_assignment(t, value):
    raise UnsupportedOpError(
        "assigning a tensor's .grad inside a traced function is not supported: the compiled function reads .grad "
        "when it is called (core/call_time.py) but does not replace it. Assign .grad (or call zero_grad()) outside "
        "the jitted function.")


def _refuse_torch_autograd(*args, **kwargs):
    raise UnsupportedOpError(
        "torch.autograd (loss.backward(), torch.autograd.grad) inside a traced function is not traced: nothing "
        "records torch's graph while tracing. Return the loss and call backward() outside (a jitted function's "
        "outputs are wired into torch.autograd), or differentiate inside with tf.grad / tf.value_and_grad.")


# A tensor's .grad changes between calls (backward(), zero_grad()): read when the compiled function is called.
handlers[torch.Tensor.grad.__get__] = read_grad
handlers[torch.Tensor.grad.__set__] = _refuse_grad_assignment
for _autograd_fn in (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad):
    handlers[_autograd_fn] = _refuse_torch_autograd


_PUBLIC_HOMES = (("torch", torch), ("torch.nn.functional", torch.nn.functional), ("torch.Tensor", torch.Tensor),
                 ("torch.special", torch.special), ("torch.linalg", torch.linalg), ("torch.fft", torch.fft))


@functools.lru_cache(maxsize=None)
def _public_names() -> dict:
    """Every callable in torch's public homes -> its public spelling (first home wins)."""
    names = {}
    with warnings.catch_warnings():  # some public names are deprecated aliases that warn when read
        warnings.simplefilter("ignore")
        for home_name, home in _PUBLIC_HOMES:
            for attr in dir(home):
                if attr.startswith("_"):
                    continue
                try:
                    obj = getattr(home, attr)
                    if callable(obj) and obj not in names:
                        names[obj] = f"{home_name}.{attr}"
                except Exception:  # attributes that raise when read, unhashable objects
                    continue
    return names


def torch_name(func) -> str:
    """`torch.nn.functional.gelu`, `torch.Tensor.view`: how a user would spell func."""
    self_ = getattr(func, "__self__", None)
    if getattr(func, "__name__", "") == "__get__" and self_ is not None:
        return f"torch.Tensor.{getattr(self_, '__name__', self_)}"
    name = getattr(func, "__name__", None)
    if name:
        for home_name, home in _PUBLIC_HOMES:
            if getattr(home, name, None) is func:
                return f"{home_name}.{name}"
    try:  # torch.linalg.svd is torch._C._linalg.linalg_svd: its __name__ is not its public name
        public = _public_names().get(func)
    except TypeError:  # unhashable
        public = None
    if public is not None:
        return public
    qualname = getattr(func, "__qualname__", name or repr(func))
    module = getattr(func, "__module__", None) or "torch"
    return f"{module}.{qualname}"


symbolic.name_ops_with(torch_name)  # (a size's guard names the op that asked it: core/symbolic.py)


def resolve_torch_name(name: str):
    """The object a dotted `torch.…` name denotes, found by walking attributes from the torch
    module (never by evaluating the string), or None when there is no such attribute."""
    parts = name.split(".")
    if parts[0] != "torch" or not all(p.isidentifier() for p in parts):
        return None
    obj = torch
    with warnings.catch_warnings():  # some public names are deprecated aliases that warn when read
        warnings.simplefilter("ignore")
        for part in parts[1:]:
            try:
                obj = getattr(obj, part)
            except Exception:  # a missing attribute, or one that raises when read
                return None
    return obj


# Metadata questions about real tensors are answered eagerly while tracing: they do
# not depend on values that change between calls.
_metadata_getters = {
    getattr(torch.Tensor, name).__get__
    for name in ("shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_cpu", "is_meta",
                 "layout", "is_leaf", "grad_fn", "names", "is_sparse", "is_quantized", "is_nested",
                 "data", "_version", "is_mkldnn", "output_nr", "_base")
    if isinstance(getattr(torch.Tensor, name, None), type(torch.Tensor.shape))
}
_metadata_methods = {
    getattr(torch.Tensor, name)
    for name in ("size", "dim", "ndimension", "numel", "nelement", "is_floating_point", "is_complex",
                 "element_size", "stride", "is_contiguous", "data_ptr", "__len__", "__repr__",
                 "__format__", "__hash__", "get_device", "storage_offset", "untyped_storage", "__reduce_ex__",
                 "__deepcopy__", "is_signed", "has_names", "__dlpack_device__", "dim_order")
    if hasattr(torch.Tensor, name)
}
_METADATA_QUERIES = dict.fromkeys(_metadata_getters | _metadata_methods, True)  # read through `lookup`


# Of those, the ones a stand-in proxy answers for the tensor it stands for (core/context.py's
# standing_in): its shape and kind, which may differ from the real tensor's (tf.distributed.fsdp's
# parameters are shards; the proxy is the gathered whole). Identity, storage and version stay the tensor's.
_SHAPE_QUERIES = {torch.Tensor.shape.__get__: ("shape", False), torch.Tensor.ndim.__get__: ("ndim", False),
                  torch.Tensor.dtype.__get__: ("dtype", False), torch.Tensor.size: ("size", True),
                  torch.Tensor.dim: ("dim", True), torch.Tensor.ndimension: ("dim", True),
                  torch.Tensor.numel: ("numel", True), torch.Tensor.nelement: ("numel", True),
                  torch.Tensor.__len__: ("__len__", True)}


def stand_in_metadata(func, args, kwargs):
    """The answer to a shape query about a real tensor some proxy stands in for, from the proxy;
    NotImplemented when func is not such a query or args[0] has no stand-in."""
    query = lookup(_SHAPE_QUERIES, func)
    stood = context.stand_in(args[0]) if query is not None and args and is_real_tensor(args[0]) else None
    if stood is None:
        return NotImplemented
    name, is_method = query
    if name == "__len__":
        return stood.shape[0]
    answer = getattr(stood, name)
    return answer(*args[1:], **kwargs) if is_method else answer


def is_metadata_query(func) -> bool:
    """A question about a tensor's metadata (x.shape, x.size(), x.is_contiguous()), answered
    eagerly for a real tensor while tracing: it does not depend on values that change between calls."""
    return lookup(_METADATA_QUERIES, func) is not None


def contains_tensor(tree) -> bool:
    if isinstance(tree, torch.Tensor):  # (a proxy is one)
        return True
    if isinstance(tree, (list, tuple)):
        return any(contains_tensor(x) for x in tree)
    if isinstance(tree, dict):
        return any(contains_tensor(x) for x in tree.values())
    return False


def is_numpy_scalar(x) -> bool:
    """np.float32(2.5), np.int64(3), np.bool_(True), ...; not arrays, not even 0-d ones, which
    torch reads as tensors. (numpy is optional for torch, so it is not imported here.)"""
    return type(x).__module__ == "numpy" and type(x).__name__ != "ndarray" and getattr(x, "ndim", None) == 0


def python_scalar(x):
    """A numpy scalar as the Python number torch's argument parser reads it as when it is an
    operand or option (not tensor data): integers as int; floats, np.bool_ (!) and complex
    numbers (real part, with numpy's ComplexWarning) as float: `int32 * np.bool_(True)` is
    float32 in eager. Anything else unchanged."""
    kind = getattr(getattr(x, "dtype", None), "kind", None)
    if not is_numpy_scalar(x) or kind is None:
        return x
    if kind in "iu":
        return int(x)
    return float(x) if kind in "bfc" else x


def lift_constants(tree):
    """Real tensors met while tracing become constant proxies, read by reference; numpy
    scalars become the Python numbers torch takes them for."""
    if isinstance(tree, torch.Tensor):
        return tree if type(tree) is TensorProxy else context.current_tracer().constant(tree)
    if type(tree).__module__ == "numpy":
        return python_scalar(tree)
    if type(tree) in (list, tuple):
        return type(tree)(lift_constants(x) for x in tree)
    if type(tree) is dict:
        return {k: lift_constants(v) for k, v in tree.items()}
    return tree


_TORCH_KEYWORDS = {"input": 0, "self": 0, "other": 1}  # torch's names for the first two operands


@functools.lru_cache(maxsize=None)
def _positional_parameters(fn) -> tuple:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(itertools.takewhile(lambda p: p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD), params))


def tensors_by_position(symbol, args, kwargs):
    """(args, kwargs) for symbol with every tensor passed by keyword moved to its position
    (the parameters it skips take their defaults), and torch's `input=`/`other=` names
    mapped onto the symbol's. VJP rules return one cotangent per positional argument, and
    torch code passes tensors by keyword (F.layer_norm its weight and bias)."""
    params = _positional_parameters(symbol.fn)
    names = [p.name for p in params]
    for torch_name_, position in _TORCH_KEYWORDS.items():
        if (torch_name_ in kwargs and torch_name_ not in names and position < len(names)
                and names[position] not in kwargs):
            kwargs = dict(kwargs)
            kwargs[names[position]] = kwargs.pop(torch_name_)
    named = [i for i, p in enumerate(params) if i >= len(args) and contains_tensor(kwargs.get(p.name))]
    if not named:
        return args, kwargs
    moved = params[len(args):named[-1] + 1]
    if any(p.name not in kwargs and p.default is p.empty for p in moved):
        return args, kwargs  # a required argument is missing: let the call raise as it would
    kwargs = dict(kwargs)
    return tuple(args) + tuple(kwargs.pop(p.name, p.default) for p in moved), kwargs


# -- dispatch: the torch language's -------------------------------------------------------
def _torch_language_missing(func, args, kwargs):
    raise InternalError(f"{torch_name(func)} was called while tracing, but the torch language (thunderfn.torch), "
                       f"which traces torch calls, is not imported; import thunderfn")


_dispatcher = _torch_language_missing


def set_dispatcher(fn) -> None:
    """Called once, by thunderfn/torch/__init__.py when it is imported: fn(func, args, kwargs)
    traces one torch call (thunderfn/torch/dispatch.py). Importing any part of thunderfn
    imports the package, and with it the torch language, before a trace can be built."""
    global _dispatcher
    _dispatcher = fn


def dispatch(func, args, kwargs):
    """Trace one torch call (called only while a trace is being built)."""
    if args and type(args[0]) is TensorProxy:
        try:
            answer = _ANSWERED_BY_PROXY.get(func)
        except TypeError:  # unhashable
            answer = None
        if answer is not None:
            return answer(*args, **kwargs)
    return _dispatcher(func, args, kwargs)


class TracingMode(TorchFunctionMode):
    """Active while a trace is built, so torch calls without a proxy argument (factory
    functions, methods on captured tensors) are traced too. Inside a symbol's own
    body the mode stands aside: thunderfn's languages call torch only for metadata."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tracer = context.current_tracer()
        if tracer is None or tracer.symbol_depth:
            return func(*args, **kwargs)
        return dispatch(func, args, kwargs)


# -- TensorProxy's torch calls ---------------------------------------------------------------
# Defined here, next to dispatch, rather than in core/proxies.py: this module needs TensorProxy,
# so proxies.py cannot import it.
def _proxy_torch_function(cls, func, types, args=(), kwargs=None):
    return dispatch(func, args, kwargs or {})


def _proxy_getattr(self, name):
    # only names torch.Tensor does not have reach here (its methods are found on the class)
    raise AttributeError(f"'Tensor' object has no attribute '{name}'")


def _proxy_grad(self):
    """The .grad of the tensor this proxy stands for, read when the compiled function is called
    (core/call_time.py); None for values computed inside the traced function, as in eager."""
    if context.current_trace() is None:
        return None
    return dispatch(torch.Tensor.grad.__get__, (self,), {})


def _operator(name):
    torch_fn = getattr(torch.Tensor, name)

    def op(self, /, *args, **kwargs):
        return dispatch(torch_fn, (self, *args), kwargs)

    op.__name__ = name
    return op


TensorProxy.__torch_function__ = classmethod(_proxy_torch_function)
TensorProxy.__getattr__ = _proxy_getattr
TensorProxy.grad = property(_proxy_grad)
# Python looks operators up on the type, so they must be set on the class.
_OPERATORS = (
    "__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __floordiv__ "
    "__rfloordiv__ __mod__ __rmod__ __pow__ __rpow__ __matmul__ __rmatmul__ __neg__ __pos__ __abs__ "
    "__invert__ __and__ __rand__ __or__ __ror__ __xor__ __rxor__ __lshift__ __rlshift__ __rshift__ "
    "__rrshift__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __getitem__ __setitem__ "
    "__iadd__ __isub__ __imul__ __itruediv__"
).split()
for _name in _OPERATORS:
    if hasattr(torch.Tensor, _name):
        setattr(TensorProxy, _name, _operator(_name))
# Comparisons return tensors, so keep identity hashing (proxies are dict keys).
TensorProxy.__hash__ = object.__hash__


def _answered_by_proxy() -> dict:
    """torch.Tensor's metadata questions and value requests that TensorProxy answers itself in Python
    (x.shape, x.dim(), x.item()), keyed by torch's callable: what a call through the class
    (`torch.Tensor.dim(x)`, `torch.Tensor.shape.__get__(x)`) or a torch function mode receives."""
    table = {}
    for name, own in vars(TensorProxy).items():
        theirs = getattr(torch.Tensor, name, None)
        if theirs is None or name in ("grad", "__torch_function__", "__torch_dispatch__", "__init__", "__new__",
                                      "__slots__", "__module__", "__doc__", "__hash__", "__format__") \
                or name in _OPERATORS:
            continue
        if type(theirs) is type(torch.Tensor.shape) or isinstance(theirs, property):  # an attribute
            table[theirs.__get__] = (lambda attr: lambda x: getattr(x, attr))(name)
        elif callable(theirs):
            table[theirs] = getattr(TensorProxy, name)
    return table


_ANSWERED_BY_PROXY = _answered_by_proxy()
