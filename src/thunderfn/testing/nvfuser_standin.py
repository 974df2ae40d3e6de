"""A STAND-IN for nvFuser's Python frontend (`nvfuser_direct`), in torch, for testing the
nvfuser executor on machines without nvFuser or CUDA. It is not nvFuser and compiles nothing.

It offers the calls executors/nvfuser.py makes, with nvFuser's signatures: `DataType`,
`compute_tensor_descriptor(sizes, strides)`, and `FusionDefinition` used as

    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[2, 3], contiguity=[True, True], dtype=DataType.Float,
                              stride_order=[1, 0])
        fd.add_output(fd.ops.exp(t0))
    [out] = fd.execute([x])

Each `fd.ops.<name>` call is recorded (`fd.records`: one `(name, inputs, output)` per op,
which tests read to see what a definition holds) and checked when it is defined by
running it on `meta` tensors, so an op nvFuser would refuse for its shapes or dtypes
fails while the definition is built. Where nvFuser broadcasts operands of different
ranks implicitly, this stand-in is stricter: elementwise operands must have one shape,
or be 0-dim, or be scalars. `execute` checks its inputs against their `define_tensor`
(count, rank, sizes, dtype, contiguity and stride order, as nvFuser validates them),
replays the ops with torch on the inputs' device and returns one new tensor per output.
Sizes must be given (no symbolic -1).
"""
from __future__ import annotations

import builtins
import enum

import torch
import torch.nn.functional as F


class DataType(enum.Enum):
    Double = torch.float64
    Float = torch.float32
    Half = torch.float16
    BFloat16 = torch.bfloat16
    Int = torch.int64
    Int32 = torch.int32
    Bool = torch.bool
    ComplexFloat = torch.complex64
    ComplexDouble = torch.complex128
    Null = None

    def __repr__(self):
        return f"DataType.{self.name}"


def compute_tensor_descriptor(sizes, strides):
    """nvFuser's (contiguity, stride_order) for a tensor (python_common/python_utils.cpp's
    computeTensorDescriptor, line for line): dims sorted outermost first by stride, broadcast
    (size-1 or stride-0) dims kept in place with contiguity None; a dim is contiguous when its
    stride is the next inner non-broadcast dim's stride times size (1 for the innermost)."""
    if len(sizes) != len(strides):
        raise RuntimeError("compute_tensor_descriptor: Sizes and strides must have the same number of dimensions")
    dims = [{"index": i, "size": n, "stride": s, "order": -1, "contiguity": None}
            for i, (n, s) in enumerate(zip(sizes, strides))]
    if any(d["stride"] < 0 for d in dims):
        raise RuntimeError("negative stride on tensor is not supported")
    ordered = sorted((d for d in dims if d["stride"] != 0), key=lambda d: -d["stride"])  # stable, as std::stable_sort
    for d in dims:
        if d["stride"] == 0:
            ordered.insert(d["index"], d)

    def broadcast(d):
        return d["stride"] == 0 or d["size"] == 1

    n, i = len(sizes), 0
    while i < n:
        ordered[i]["order"] = n - 1 - i
        if not broadcast(ordered[i]):
            left, i, expected = i, i + 1, 1
            while i < n:
                ordered[i]["order"] = n - 1 - i
                if not broadcast(ordered[i]):
                    expected = ordered[i]["stride"] * ordered[i]["size"]
                    break
                i += 1
            ordered[left]["contiguity"] = ordered[left]["stride"] == expected
        else:
            i += 1
    stride_order = [-1] * n
    for d in ordered:
        stride_order[d["index"]] = d["order"]
    return [d["contiguity"] for d in ordered], stride_order


class Tensor:
    """A value of the definition: a defined input or an op's result."""

    def __init__(self, fd, index: int, meta: torch.Tensor):
        self.fd, self.index, self.meta = fd, index, meta

    @property
    def ndim(self):
        return self.meta.ndim

    def __repr__(self):
        return f"T{self.index}"


class Scalar:
    """A constant scalar (`define_scalar(value, dtype)`), its value cast to its dtype as nvFuser casts it."""

    def __init__(self, value, dtype: DataType):
        self.dtype = dtype
        self.value = {torch.bool: bool, torch.int64: int, torch.int32: int}.get(dtype.value, float)(value)

    def __repr__(self):
        return f"fd.define_scalar({self.value!r}, {self.dtype!r})"


def _value(x, env, device=None):
    """What x stands for in env (index -> tensor); a scalar is a Python number, or a 0-dim tensor
    of its dtype on `device` where given (torch's elementwise functions do not all take numbers)."""
    if isinstance(x, Tensor):
        return env[x.index]
    if isinstance(x, Scalar):
        return x.value if device is None else torch.tensor(x.value, dtype=x.dtype.value, device=device)
    if isinstance(x, DataType):
        return x.value
    if isinstance(x, (list, tuple)):
        return type(x)(_value(v, env, device) for v in x)
    return x


def _run(name, args, kwargs, env):
    """One recorded op on the tensors of env."""
    device = None
    if name in _ELEMENTWISE:
        device = next(env[a.index].device for a in args if isinstance(a, Tensor))
    return IMPLEMENTATIONS[name](*_value(args, env, device), **{k: _value(v, env) for k, v in kwargs.items()})


def _same_shape(name, *xs):
    shapes = {tuple(x.meta.shape) for x in xs if isinstance(x, Tensor) and x.ndim > 0}
    if len(shapes) > 1:
        raise RuntimeError(f"nvfuser stand-in: {name} of tensors with shapes {sorted(shapes)}: broadcast them first")


def _div(a, b):
    # integers truncate (C division), floats divide exactly
    ints = all(not (x.is_floating_point() if isinstance(x, torch.Tensor) else isinstance(x, float)) for x in (a, b))
    return torch.div(a, b, rounding_mode="trunc") if ints else torch.true_divide(a, b)


def _reduction(fn, integers_to_int64=False):
    def impl(arg, dims, keepdim=False, dtype=None):
        if dtype is None and integers_to_int64 and not arg.is_floating_point():
            dtype = torch.int64  # nvFuser's sum and prod of integers and bools (ops/arith.cpp)
        return fn(arg if dtype is None else arg.to(dtype), [d % arg.ndim for d in dims], keepdim)

    return impl


def _prod(a, dims, keepdim):
    for d in sorted(dims, reverse=True):
        a = torch.prod(a, d, keepdim=keepdim, dtype=a.dtype)
    return a


def _broadcast_in_dim(arg, shape, broadcast_dims):
    if len(broadcast_dims) != arg.ndim:
        raise RuntimeError(f"broadcast_in_dim: {len(broadcast_dims)} broadcast dims for a {arg.ndim}-d tensor")
    view = [1] * len(shape)
    for i, d in enumerate(broadcast_dims):
        view[d] = arg.shape[i]
    return arg.reshape(view).expand(shape)


def _squeeze(arg, dims):
    if any(arg.shape[d] != 1 for d in dims):
        raise RuntimeError(f"squeeze: dims {dims} of a tensor of shape {tuple(arg.shape)} are not all broadcast")
    return torch.squeeze(arg, tuple(dims))


def _take_along_axis(arg, index, dim):
    if arg.ndim != index.ndim:
        raise RuntimeError(f"Tensor arguments have different dimensions {arg.ndim} and {index.ndim}")
    return torch.take_along_dim(arg, index.long(), dim)


def _iota(length, start=None, step=None, dtype=torch.int64):
    start, step = 0 if start is None else start, 1 if step is None else step
    steps = torch.arange(length, dtype=torch.float64 if dtype.is_floating_point else torch.int64)
    return (steps * step + start).to(dtype)


_UNARY = ("abs acos acosh asin asinh atan atanh ceil cos cosh exp exp2 expm1 erf erfc erfinv floor lgamma log log10 "
          "log1p log2 neg reciprocal round rsqrt sign signbit sin sinh sqrt tan tanh trunc isfinite isnan "
          "bitwise_not").split()
_BINARY = {**{n: getattr(torch, n) for n in "add sub mul fmod remainder pow atan2 maximum minimum eq ne lt le gt ge "
                                           "bitwise_and bitwise_or bitwise_xor bitwise_left_shift "
                                           "bitwise_right_shift nextafter".split()},
           "div": _div}

# name -> torch implementation, with nvFuser's argument order
IMPLEMENTATIONS = {
    **{n: getattr(torch, n) for n in _UNARY},
    "set": lambda a: a.clone(),
    **_BINARY,
    "where": lambda pred, a, b: torch.where(pred, a, b),
    "sum": _reduction(lambda a, dims, keepdim: torch.sum(a, dims, keepdim=keepdim, dtype=a.dtype), True),
    "prod": _reduction(_prod, True),
    "max": _reduction(lambda a, dims, keepdim: torch.amax(a, dims, keepdim=keepdim)),
    "min": _reduction(lambda a, dims, keepdim: torch.amin(a, dims, keepdim=keepdim)),
    "var": lambda arg, dims, correction=1, keepdim=False: torch.var(arg, dims, correction=correction, keepdim=keepdim),
    "var_mean": lambda arg, dims, correction=1, keepdim=False: tuple(
        torch.var_mean(arg, dims, correction=correction, keepdim=keepdim)),
    "cast": lambda arg, dtype: arg.to(dtype),
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": lambda arg, new_shape: torch.reshape(arg, new_shape),
    "permute": lambda arg, dims: torch.permute(arg, dims),
    "slice": lambda arg, start_indices, end_indices, strides=None: arg[tuple(
        builtins.slice(s, e, st) for s, e, st in zip(start_indices, end_indices, strides or [1] * arg.ndim))],
    "squeeze": _squeeze,
    "cat": lambda tensors, dim=0: torch.cat(tensors, dim),
    "pad": lambda arg, pad_widths, value=None: F.pad(arg, pad_widths, value=0 if value is None else value),
    "index_select": lambda arg, index, dim: torch.index_select(arg, dim, index),
    "take_along_axis": _take_along_axis,
    "full": lambda shape, fill_value, dtype: torch.full(shape, fill_value, dtype=dtype),
    "iota": _iota,
}
_ELEMENTWISE = set(_UNARY) | set(_BINARY) | {"where"}
_FACTORIES = {"full", "iota"}


class Operators:
    """`fd.ops`: each call records one op of the definition and returns its result(s)."""

    def __init__(self, fd):
        self._fd = fd

    def __getattr__(self, name):
        if name not in IMPLEMENTATIONS:
            raise AttributeError(f"nvfuser stand-in: fd.ops has no '{name}' (the stand-in implements "
                                 f"{sorted(IMPLEMENTATIONS)})")
        return lambda *args, **kwargs: self._fd._record(name, args, kwargs)


class FusionDefinition:
    """See the module docstring."""

    def __init__(self):
        self.ops = Operators(self)
        self.inputs: list = []  # (Tensor, shape, contiguity, dtype, stride_order)
        self.records: list = []  # (op name, args, kwargs, outputs)
        self.outputs: list = []
        self.executions = 0
        self._defining = False
        self._metas: dict = {}  # value index -> its meta tensor: the shapes and dtypes defined so far

    def __enter__(self):
        self._defining = True
        return self

    def __exit__(self, *exc):
        self._defining = False
        return False

    def _check_defining(self):
        if not self._defining:
            raise RuntimeError("nvfuser stand-in: define inside `with FusionDefinition() as fd:`")

    def _new(self, meta):
        t = Tensor(self, len(self._metas), meta)
        self._metas[t.index] = meta
        return t

    def define_tensor(self, shape, contiguity, dtype=DataType.Float, is_cpu=False, stride_order=()):
        self._check_defining()
        if any(n < 0 for n in shape):
            raise RuntimeError("nvfuser stand-in: symbolic (-1) sizes are not supported; give the sizes")
        if len(contiguity) != len(shape) or (stride_order and sorted(stride_order) != list(range(len(shape)))):
            raise RuntimeError(f"define_tensor: contiguity {contiguity} / stride_order {stride_order} do not fit "
                               f"a {len(shape)}-d tensor")
        t = self._new(torch.empty(shape, dtype=dtype.value, device="meta"))
        self.inputs.append((t, tuple(shape), tuple(contiguity), dtype, tuple(stride_order)))
        return t

    def define_scalar(self, value, dtype=None):
        self._check_defining()
        if dtype is None:
            dtype = {bool: DataType.Bool, int: DataType.Int, float: DataType.Double}[type(value)]
        return Scalar(value, dtype)

    def _record(self, name, args, kwargs):
        self._check_defining()
        if name in _ELEMENTWISE:
            _same_shape(name, *args)
        if name in _ELEMENTWISE and not any(isinstance(a, Tensor) for a in args):
            raise RuntimeError(f"nvfuser stand-in: {name} of scalars only is not supported")
        result = _run(name, args, kwargs, self._metas)
        if name in _FACTORIES:
            result = result.to("meta")
        results = result if isinstance(result, tuple) else (result,)
        if not all(isinstance(r, torch.Tensor) for r in results):
            raise RuntimeError(f"nvfuser stand-in: {name} of scalars only is not supported")
        outs = tuple(self._new(r) for r in results)
        self.records.append((name, args, kwargs, outs))
        return outs if isinstance(result, tuple) else outs[0]

    def add_output(self, t):
        self._check_defining()
        if not isinstance(t, Tensor):
            raise TypeError(f"add_output: expected a tensor of this definition, got {t!r}")
        self.outputs.append(t)

    @property
    def op_names(self) -> list[str]:
        return [r[0] for r in self.records]

    def __repr__(self):
        lines = [f"T{t.index} = fd.define_tensor(shape={list(shape)}, contiguity={list(c)}, dtype={d}, "
                 f"stride_order={list(o)})" for t, shape, c, d, o in self.inputs]
        for name, args, kwargs, outs in self.records:
            lhs = ", ".join(map(repr, outs))
            rhs = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            lines.append(f"{lhs} = fd.ops.{name}({rhs})")
        lines += [f"fd.add_output({t!r})" for t in self.outputs]
        return "\n".join(lines)

    def execute(self, inputs, *, device=None):
        if self._defining or not self.outputs:
            raise RuntimeError("nvfuser stand-in: execute a finished definition with at least one output")
        if len(inputs) != len(self.inputs):
            raise ValueError(f"execute: the definition has {len(self.inputs)} inputs, got {len(inputs)}")
        env = {}
        for x, (t, shape, contiguity, dtype, stride_order) in zip(inputs, self.inputs):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"execute: input {t!r} must be a tensor, got {type(x).__name__}")
            if x.ndim != len(shape) or tuple(x.shape) != shape or x.dtype != dtype.value:
                raise RuntimeError(f"execute: input {t!r} was defined as {dtype.name}{list(shape)}, got "
                                   f"{x.dtype}{list(x.shape)}")
            actual_c, actual_order = compute_tensor_descriptor(list(x.shape), list(x.stride()))
            if (stride_order and tuple(actual_order) != stride_order) or any(
                    (c is None) != (a is None) or (c and not a) for c, a in zip(contiguity, actual_c)):
                raise RuntimeError(f"execute: input {t!r} has strides {x.stride()}, not the contiguity "
                                   f"{list(contiguity)} and stride order {list(stride_order)} it was defined with")
            env[t.index] = x
        on = inputs[0].device if inputs else torch.device("cpu" if device is None else device)
        with torch.no_grad():
            for name, args, kwargs, outs in self.records:
                result = _run(name, args, kwargs, env)
                if name in _FACTORIES:
                    result = result.to(on)
                for o, r in zip(outs, result if isinstance(result, tuple) else (result,)):
                    env[o.index] = r
        self.executions += 1
        # a fusion's outputs are new tensors, laid out contiguously
        return [env[t.index].clone(memory_format=torch.contiguous_format) for t in self.outputs]
