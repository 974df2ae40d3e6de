"""TensorProxy: what traced code holds in place of a tensor.

A proxy is a torch.Tensor (a wrapper subclass without storage), so code that asks
`isinstance(x, torch.Tensor)` takes the path it takes in eager and torch's methods called
through the class (`torch.Tensor.contiguous(x)`) reach thunderfn. It carries metadata only
(shapes are concrete, as in JAX, or symbolic where jit opened a dimension:
core/symbolic.py), kept in Python attributes that answer `x.shape`, `x.dtype`, ... without
asking torch. Every torch call made on it, as a function (`torch.add(p, q)`), a method
(`p.view(2, 3)`, `torch.Tensor.view(p, 2, 3)`) or an operator (`p @ q`), is traced by the
symbol registered for that torch callable: core/interception.py, which imports this module,
gives TensorProxy those entry points (`__torch_function__`, the operators, `.grad`). A call
that reaches torch's dispatcher with a proxy (torch functions turned off, a C++ path that
skips `__torch_function__`) would compute nothing real: `__torch_dispatch__` refuses it by
name. Asking for a value (`bool(p)`, `p.item()`) raises ConcretizationError, which says what
to do instead.

May import: core/context.py, core/dtypes.py, core/symbolic.py, errors.py.
"""
from __future__ import annotations

import torch

from thunderfn.core import context, dtypes, symbolic
from thunderfn.errors import (
    ArgumentIndexError,
    ArgumentTypeError,
    BatchedValueError,
    ConcretizationError,
    UnsupportedOpError,
)


def _device_str(device: torch.device) -> str:
    return device.type if device.index is None else f"{device.type}:{device.index}"


# The origin of a proxy for a tensor the traced function captured (a module's parameter, a global)
CAPTURED = "a tensor captured by the traced function"

_make_wrapper = torch.Tensor._make_wrapper_subclass

# torch.func's vmap's sentences for a value asked of a tensor (torch/_functorch/vmap.py's and C++'s)
_VMAP_ITEM = ("vmap: It looks like you're calling .item() on a Tensor. We don't support vmap over calling .item() on "
              "a Tensor, please try to rewrite what you're doing with other operations.")
_VMAP_CONTROL_FLOW = ("vmap: It looks like you're attempting to use a Tensor in some data-dependent control flow. We "
                      "don't support that yet.")


class DerivedOrigin:
    """Where a computed value came from: its inputs' origins, united (in order, each once) only when
    something reads them, an error message. Uniting them at every op would copy, for a deep layer's
    values, every parameter before it: tracing would grow quadratically with depth."""

    __slots__ = ("_parents", "_united")

    def __init__(self, parents):
        self._parents = tuple(parents)  # origin tuples and DerivedOrigins, non-empty
        self._united = None

    def _origins(self) -> tuple:
        if self._united is None:
            seen: dict = {}
            done: set = set()
            stack = list(reversed(self._parents))
            while stack:  # depth-first, in order: each origin where it first appears, as a union op by op would
                o = stack.pop()
                if not isinstance(o, DerivedOrigin):
                    seen.update(dict.fromkeys(o))
                elif o._united is not None:
                    seen.update(dict.fromkeys(o._united))
                elif id(o) not in done:
                    done.add(id(o))
                    stack.extend(reversed(o._parents))
            self._united, self._parents = tuple(seen), ()
        return self._united

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._origins())

    def __iter__(self):
        return iter(self._origins())

    def __getitem__(self, index):
        return self._origins()[index]

    def __eq__(self, other):
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, DerivedOrigin)) else other)

    __hash__ = None


class TensorProxy(torch.Tensor):
    """Stand-in for a tensor while tracing: name, shape, dtype, device, requires_grad.

    ``constant`` holds the real tensor when the proxy stands for a tensor the traced
    function closed over (a captured weight): generated code reads it by reference,
    so in-place updates to it (optimizer steps) are seen on every call.

    While tf.jit, tf.trace or a transform traces a function, the function receives
    TensorProxy objects in place of its tensors: they support the torch operations and tensor
    methods thunderfn knows (each records a statement) and answer metadata questions
    (`.shape`, `.dtype`, `.ndim`, `.numel()`), but hold no values, so anything that needs a value
    (`if x.sum() > 0`, `x.item()`) raises ConcretizationError saying what to do instead. They
    are torch.Tensor instances without storage, so library code testing `isinstance(x, torch.Tensor)`
    takes its tensor path, as in eager. A prim's meta function receives proxies and returns new
    ones for its outputs (`TensorProxy(shape=..., dtype=..., device=...)` or
    `TensorProxy.like(x)`); a proxy without a given name can only be made while a trace is being
    built.

        >>> import torch, thunderfn as tf
        >>> def f(x):
        ...     print(x, x.shape, x.dtype, isinstance(x, torch.Tensor))
        ...     return x * 2
        >>> _ = tf.trace(f, torch.ones(2, 3))
        <TensorProxy name=x "cpu f32[2, 3]"> torch.Size([2, 3]) torch.float32 True
    """

    # Python attributes shadowing torch's: reading them asks neither torch nor __torch_function__
    __slots__ = ("name", "shape", "dtype", "device", "requires_grad", "constant", "origin", "alias")
    # as torch.Tensor's: `np.float32(2.5) * proxy` defers to the proxy's __rmul__
    __array_priority__ = 1000

    def __new__(cls, name=None, *, shape, dtype, device, requires_grad=False, constant=None, origin=None):
        shape = torch.Size(shape)
        device = device if isinstance(device, torch.device) else torch.device(device)
        # torch's own view of the wrapper (what C++ reading it without asking Python sees): the shape where it is
        # concrete; a symbolic one stays in Python, so torch computes no strides of it (which could guard a size).
        self = _make_wrapper(cls, shape if all(type(s) is int for s in shape) else (), dtype=dtype, device=device)
        self.name = name if name is not None else context.new_name()
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.requires_grad = bool(requires_grad)
        self.constant = constant
        # Human descriptions of where the value came from (("argument 'x'",)),
        # inherited by every value computed from it; ConcretizationError names them.
        self.origin = (origin,) if isinstance(origin, str) else origin if isinstance(origin, DerivedOrigin) else \
            tuple(origin or ())
        self.alias = None  # storage sharing with other proxies (views), see torch/inplace.py
        return self

    def __init__(self, *args, **kwargs):
        pass  # (made by __new__: torch.Tensor's __init__ takes no metadata)

    @classmethod
    def like(cls, t, *, name=None, **overrides) -> "TensorProxy":
        meta = dict(shape=t.shape, dtype=t.dtype, device=t.device, requires_grad=t.requires_grad)
        meta.update(overrides)
        return cls(name, **meta)

    # -- metadata, answered without tracing anything ------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    ndimension = dim

    def size(self, dim=None):
        if dim is None:
            return self.shape
        return self.shape[_wrap_dim(dim, self.ndim)]

    def numel(self) -> int:
        return symbolic.product(self.shape)  # (torch.Size.numel would specialize a symbolic size)

    nelement = numel

    def element_size(self) -> int:
        return self.dtype.itemsize

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def is_complex(self) -> bool:
        return self.dtype.is_complex

    def __len__(self) -> int:
        if not self.shape:
            raise ArgumentTypeError("len() of a 0-d tensor")
        return self.shape[0]

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self.device.type == "cpu"

    @property
    def is_meta(self) -> bool:
        return self.device.type == "meta"

    @property
    def layout(self):
        return torch.strided

    # A proxy stands for a dense, strided tensor: torch's layout questions answer no
    # (nn.MultiheadAttention asks is_nested before its fast path, an optimizer p.grad.is_sparse).
    is_nested = is_sparse = is_sparse_csr = is_quantized = is_mkldnn = property(lambda self: False)

    @property
    def is_leaf(self) -> bool:
        return True

    @property
    def grad_fn(self):
        return None  # nothing is recorded by torch.autograd while tracing

    def get_device(self) -> int:
        return -1 if self.device.type == "cpu" else (self.device.index or 0)

    def type_string(self) -> str:
        dims = ", ".join(symbolic.python(s) if isinstance(s, torch.SymInt) else str(s) for s in self.shape)
        return f'"{_device_str(self.device)} {dtypes.short_names.get(self.dtype, str(self.dtype))}[{dims}]"'

    def __repr__(self) -> str:
        return f"<TensorProxy name={self.name} {self.type_string()}>"

    __hash__ = object.__hash__
    __format__ = object.__format__  # (torch.Tensor's formats values)

    def __copy__(self):
        return self  # copy.copy of a tensor shares its storage: the same value, written through either

    def __deepcopy__(self, memo):
        copied = memo[id(self)] = self.clone()  # as a tensor's: new storage holding the same values
        return copied

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Reached only by a call that skipped __torch_function__: running it would compute on no data.
        raise UnsupportedOpError(
            f"{func} reached a traced tensor without being traced (torch's function overrides were turned off, "
            f"or C++ code called it directly), so thunderfn cannot record it. Call the torch function itself "
            f"inside the traced function, or give the operation a symbol of its own (docs/extending.md).")

    # -- values are not known while tracing -------------------------------------------
    def _described(self) -> str:
        """`tensor t3 (a value computed from argument 'x') while tracing 'f'`, for error messages."""
        trc = context.current_trace()
        fn = f" while tracing '{trc.fn_name}'" if trc is not None else ""
        origin = f" (a value computed from {_describe_origin(self.origin)})" if self.origin else ""
        return f"tensor {self.name}{origin}{fn}"

    def _concretize(self, what: str, instead: str, vmap_sentence: str = _VMAP_CONTROL_FLOW):
        message = (f"{what} needs the value of {self._described()}, but thunderfn traces "
                   f"with shapes only: tensor values are unknown until the compiled function runs. {instead}")
        if context._local.vmap_bodies:  # torch.func's vmap raises a RuntimeError in its own words
            raise BatchedValueError(f"{vmap_sentence} ({message})")
        raise ConcretizationError(message)

    def __bool__(self):
        self._concretize(
            "bool(tensor) (an `if`, `while`, `and`/`or` or `assert` on a tensor)",
            "Use torch.where(cond, a, b) to select values, or compute the condition "
            "outside the jitted function and pass it as a static argument (static_argnums).",
        )

    def item(self):
        self._concretize("tensor.item()", "Keep the value as a 0-dim tensor, or return it and call .item() outside.",
                         _VMAP_ITEM)

    def tolist(self):
        self._concretize("tensor.tolist()", "Return the tensor and convert it outside the jitted function.")

    def numpy(self, *args, **kwargs):
        self._concretize("tensor.numpy()", "Return the tensor and convert it outside the jitted function.")

    def __int__(self):
        self._concretize("int(tensor)", "Use tensor ops (.to(torch.int64)) or pass the number as a static argument.")

    def __float__(self):
        self._concretize("float(tensor)", "Use tensor ops or pass the number as a static argument.")

    def __complex__(self):
        self._concretize("complex(tensor)", "Use tensor ops or pass the number as a static argument.")

    def __index__(self):
        self._concretize("using a tensor as a Python index",
                         "Index with a tensor (x[idx]) or pass the index as a static argument.")

    def __iter__(self):
        if not self.shape:
            raise ConcretizationError(
                f"iteration over a 0-d tensor: {self._described()} has no dimension to iterate over. "
                "Iterate over a tensor with at least one dimension (x.reshape(1)), or unpack outside "
                "the jitted function."
            )
        return iter(self.unbind(0))

    def __array__(self, *args, **kwargs):
        self._concretize("converting a tensor to a NumPy array",
                         "Return the tensor and convert it outside the jitted function.")

    # Everything else (methods, operators, torch functions, .grad) is a torch call, routed by
    # core/interception.py.


def _describe_origin(origin: tuple) -> str:
    if len(origin) > 3:
        return f"{', '.join(origin[:3])} and {len(origin) - 3} more"
    return " and ".join(origin)


def _wrap_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise ArgumentIndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def is_proxy(x) -> bool:
    return isinstance(x, TensorProxy)


def is_real_tensor(x) -> bool:
    """A torch.Tensor holding data: not a proxy (which is a torch.Tensor too)."""
    return isinstance(x, torch.Tensor) and not isinstance(x, TensorProxy)


def entry_by_name(x, table: dict):
    """What `table` (keyed by proxy name: a tangent, a batch dim) holds for an argument x: its entry for
    a proxy, a tuple of entries for a list of proxies (prims.cat's operand), None where it holds none."""
    if isinstance(x, TensorProxy):
        return table.get(x.name)
    if isinstance(x, (list, tuple)) and any(isinstance(v, TensorProxy) for v in x):
        entries = tuple(table.get(v.name) if isinstance(v, TensorProxy) else None for v in x)
        return entries if any(e is not None for e in entries) else None
    return None
