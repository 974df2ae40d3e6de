"""clang, the core language: prims plus broadcasting and torch's type promotion.

Clang functions are plain Python over prims (not symbols of their own), so a torch
symbol's recorded decomposition is its prims, one level deep. Python numbers stay
numbers: after promotion a number never raises a tensor's dtype category, so a prim
can take it as is.

"clang" is Thunder's name for this level, kept because its tutorials use `tf.clang`.
May import: core/ and prims.
"""
from __future__ import annotations

import math
import numbers
import sys
from typing import Sequence

import torch

from thunderfn import prims
from thunderfn.core import dtypes, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import ArgumentRuntimeError, ArgumentTypeError
from thunderfn.prims import Promotion, canonical_dim, canonical_dims, check  # noqa: F401  (Promotion: clang.Promotion too)

_this_module = sys.modules[__name__]


def is_tensor(x) -> bool:
    return isinstance(x, TensorProxy)


def promoted_dtypes(*args, kind: Promotion = Promotion.DEFAULT):
    """(dtype the inputs are converted to, dtype of the result)."""
    common = dtypes.result_type(*args)
    if kind is Promotion.INT_TO_FLOAT and not dtypes.is_inexact(common):
        common = torch.get_default_dtype()
    if kind is Promotion.ALWAYS_BOOL:
        return common, torch.bool
    if kind is Promotion.COMPLEX_TO_FLOAT and common.is_complex:
        return common, dtypes.to_real(common)
    if kind is Promotion.BOOL_TO_LONG and common is torch.bool:
        return torch.int64, torch.int64
    return common, common


def maybe_convert_to_dtype(a, dtype: torch.dtype):
    if is_tensor(a):
        return a if a.dtype == dtype else prims.convert_element_type(a, dtype)
    if isinstance(a, symbolic.NUMBER_TYPES):
        if dtype is torch.bool:
            return bool(a)
        if dtypes.is_integer(dtype) and not isinstance(a, bool) and isinstance(a, numbers.Integral):
            return int(a)
        if dtype.is_floating_point and isinstance(a, numbers.Real) and not isinstance(a, numbers.Integral):
            return float(a)
    return a


# -- broadcasting ----------------------------------------------------------------------
def broadcast_shapes(*shapes) -> tuple:
    """torch.broadcast_shapes, with torch's message naming the mismatched sizes."""
    # torch folds the shapes pairwise and compares each pair from the last dimension, so
    # its message names the trailing mismatch; we do the same to say the same thing
    out: tuple = ()
    for s in (tuple(s) for s in shapes if s is not None):
        ndim = max(len(out), len(s))
        a, b = (1,) * (ndim - len(out)) + out, (1,) * (ndim - len(s)) + s
        for j in reversed(range(ndim)):
            # (a symbolic size is asked only what the answer needs: broadcast against a bias, it is not
            # guarded to differ from 1)
            if not symbolic.broadcastable(a[j], b[j]):
                raise ArgumentRuntimeError(f"The size of tensor a ({a[j]}) must match the size of tensor b ({b[j]}) "
                                           f"at non-singleton dimension {j}")
        out = tuple(symbolic.broadcast_size(x, y) for x, y in zip(a, b))
    return out


LEGACY_TYPE_NAMES = {
    torch.float32: "FloatTensor", torch.float64: "DoubleTensor", torch.float16: "HalfTensor",
    torch.bfloat16: "BFloat16Tensor", torch.int64: "LongTensor", torch.int32: "IntTensor", torch.int16: "ShortTensor",
    torch.int8: "CharTensor", torch.uint8: "ByteTensor", torch.bool: "BoolTensor",
    torch.complex64: "ComplexFloatTensor", torch.complex128: "ComplexDoubleTensor",
}


# how torch's C++ kernels name dtypes in their messages ("expected m1 and m2 to have the same dtype, but got: float !=
# int")
CPP_TYPE_NAMES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
    torch.uint8: "unsigned char", torch.bool: "bool", torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


def scalar_type_name(dtype: torch.dtype) -> str:
    """Float, Long, BFloat16: torch's ScalarType name, as in "expected scalar type Float but found Half"."""
    return LEGACY_TYPE_NAMES.get(dtype, str(dtype))[:-len("Tensor")] if dtype in LEGACY_TYPE_NAMES else str(dtype)


def legacy_type_name(a: TensorProxy, dtype: torch.dtype | None = None) -> str:
    """What `a.type()` says (torch.FloatTensor, torch.cuda.LongTensor), as torch's messages name tensors."""
    dtype = a.dtype if dtype is None else dtype
    home = "torch" if a.device.type == "cpu" else f"torch.{a.device.type}"
    return f"{home}.{LEGACY_TYPE_NAMES.get(dtype, str(dtype))}"


def expand_to(a: TensorProxy, shape: Sequence[int]) -> TensorProxy:
    """Broadcast a to shape (torch's expand semantics for leading dims)."""
    shape = tuple(shape)
    if symbolic.same_shape(a.shape, shape):
        return a
    check(len(shape) >= a.ndim,
          lambda: f"expand({legacy_type_name(a)}{{{list(a.shape)}}}, size={list(shape)}): the number of sizes provided "
                  f"({len(shape)}) must be greater or equal to the number of dimensions in the tensor ({a.ndim})")
    offset = len(shape) - a.ndim
    return prims.broadcast_in_dim(a, shape, tuple(range(offset, len(shape))))


def broadcast(*args):
    """Broadcast the tensor args to a common shape; 0-dim tensors and numbers stay as
    they are (prims take them with any shape, as torch does CPU scalars)."""
    shape = broadcast_shapes(*(a.shape for a in args if is_tensor(a)))
    return tuple(expand_to(a, shape) if is_tensor(a) and a.ndim > 0 else a for a in args)


# -- elementwise -----------------------------------------------------------------------
def _elementwise(prim, *args, kind: Promotion = Promotion.DEFAULT, **kwargs):
    compute, result = promoted_dtypes(*args, kind=kind)
    args = broadcast(*(maybe_convert_to_dtype(a, compute) for a in args))
    if not any(is_tensor(a) for a in args):
        raise ArgumentTypeError(f"{prim.name}: expected at least one tensor argument")
    out = prim(*args, **kwargs)
    if kind is not Promotion.ALWAYS_BOOL:
        out = maybe_convert_to_dtype(out, result)
    return out


def elementwise_function(op: prims.ElementwiseOp):
    """clang's function of an elementwise table entry (prims.py): promote by op.promotion,
    broadcast, call the prim."""
    prim, kind = op.prim, op.promotion
    if op.arity == 1:
        def fn(a):
            return _elementwise(prim, a, kind=kind)
    else:
        def fn(a, b):
            return _elementwise(prim, a, b, kind=kind)

    fn.__name__ = fn.__qualname__ = prim.name
    return fn


def define(op: prims.ElementwiseOp) -> None:
    """Make op's clang function `clang.<name>` (prims' elementwise table: every entry but div's)."""
    if op.clang:
        setattr(_this_module, op.name, elementwise_function(op))


# clang.exp, clang.add, ...: one function per line of prims.py's elementwise table
for _op in prims.elementwise_ops.values():
    define(_op)


def true_divide(a, b):
    return _elementwise(prims.div, a, b, kind=Promotion.INT_TO_FLOAT)


def div(a, b, rounding_mode=None):
    if rounding_mode is None:
        return true_divide(a, b)
    return _elementwise(prims.div, a, b, kind=Promotion.DEFAULT, rounding_mode=rounding_mode)


def in_place_of(old, new):
    """new, as a function of old whose gradient for old is zero: where torch's autograd keeps a
    tensor in the graph with a zero gradient though its value is gone (x.zero_(), x.copy_(y),
    addmm's input at beta=0). where(False, old, new) computes exactly new, NaNs of old ignored."""
    never = full((), False, device=old.device, dtype=torch.bool)
    return where(never, old, new)


def where(pred, a, b):
    check(is_tensor(pred), lambda: "where(): argument 'condition' must be Tensor", TypeError)
    compute, _ = promoted_dtypes(a, b)
    a, b = maybe_convert_to_dtype(a, compute), maybe_convert_to_dtype(b, compute)
    pred = maybe_convert_to_dtype(pred, torch.bool)
    if not is_tensor(a) and not is_tensor(b):
        a = full((), a, device=pred.device, dtype=compute)
    pred, a, b = broadcast(pred, a, b)
    if pred.ndim == 0 and any(is_tensor(x) and x.ndim > 0 for x in (a, b)):
        pred = expand_to(pred, next(x.shape for x in (a, b) if is_tensor(x) and x.ndim > 0))
    return prims.where(pred, a, b)


# -- shapes ----------------------------------------------------------------------------
def reshape(a, shape):
    shape = infer_shape(shape, a.numel())
    return a if symbolic.same_shape(a.shape, shape) else prims.reshape(a, shape)


def infer_shape(shape, numel: int) -> tuple:
    """Resolve one -1 in shape, with torch's messages."""
    shape = tuple(shape)
    unknown = [i for i, s in enumerate(shape) if symbolic.is_minus_one(s)]
    check(len(unknown) <= 1, lambda: "only one dimension can be inferred")
    for i, s in enumerate(shape):
        check(symbolic.is_size(s) or s >= -1,
              lambda: f"invalid shape dimension {s} at index {i} of shape {list(shape)}")
    if unknown:
        known = 1
        for i, s in enumerate(shape):
            if i not in unknown:
                known *= s
        check(known != 0 or numel != 0,
              lambda: f"cannot reshape tensor of 0 elements into shape {list(shape)} because the unspecified "
                      f"dimension size -1 can be any value and is ambiguous")
        check(known != 0 and numel % known == 0, lambda: f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape = tuple(numel // known if i in unknown else s for i, s in enumerate(shape))
    check(symbolic.product(shape) == numel, lambda: f"shape '{list(shape)}' is invalid for input of size {numel}")
    return shape


def transpose(a, dim0: int, dim1: int):
    if a.ndim < 2:
        canonical_dim(dim0, a.ndim), canonical_dim(dim1, a.ndim)
        return a
    d0, d1 = canonical_dim(dim0, a.ndim), canonical_dim(dim1, a.ndim)
    if d0 == d1:
        return a
    perm = list(range(a.ndim))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return prims.transpose(a, tuple(perm))


def permute(a, dims):
    dims = tuple(dims)
    check(len(dims) == a.ndim,
          lambda: f"permute(sparse_coo): number of dimensions in the tensor input does not match the length of the "
                  f"desired ordering of dimensions i.e. input.dim() = {a.ndim} is not equal to len(dims) = {len(dims)}")
    perm = tuple(canonical_dim(d, a.ndim) for d in dims)
    check(len(set(perm)) == len(perm), lambda: "permute(): duplicate dims are not allowed.")
    return a if perm == tuple(range(a.ndim)) else prims.transpose(a, perm)


def move_dim(a, source: int, destination: int):
    """a with dimension `source` moved to `destination` (both non-negative), the others in order."""
    if source == destination:
        return a
    order = [i for i in range(a.ndim) if i != source]
    order.insert(destination, source)
    return prims.transpose(a, tuple(order))


def unsqueeze(a, dim: int):
    d = canonical_dim(dim, a.ndim + 1)
    shape = list(a.shape)
    shape.insert(d, 1)
    return prims.broadcast_in_dim(a, tuple(shape), tuple(i for i in range(a.ndim + 1) if i != d))


def squeeze(a, dims=None):
    if dims is None:
        dims = tuple(i for i, s in enumerate(a.shape) if s == 1)
    else:
        dims = tuple(d for d in canonical_dims(dims, a.ndim) if a.ndim and a.shape[d] == 1)
    return prims.squeeze(a, dims) if dims else a


def slice_in_dim(a, start: int, stop: int, step: int = 1, dim: int = 0):
    d = canonical_dim(dim, a.ndim)
    starts, stops, steps = [0] * a.ndim, list(a.shape), [1] * a.ndim
    starts[d], stops[d], steps[d] = start, stop, step
    # (a no-op asked without guarding: a symbolic stop equal to the size only where known to be)
    if symbolic.known_equal(start, 0) and symbolic.known_equal(stop, a.shape[d]) and symbolic.known_equal(step, 1):
        return a
    return prims.slice(a, tuple(starts), tuple(stops), tuple(steps))


def flatten(a, start_dim: int = 0, end_dim: int = -1):
    s, e = canonical_dim(start_dim, a.ndim), canonical_dim(end_dim, a.ndim)
    if a.ndim == 0:
        return reshape(a, (1,))
    check(s <= e, lambda: "flatten() has invalid args: start_dim cannot come after end_dim")
    shape = tuple(a.shape[:s]) + (symbolic.product(a.shape[s:e + 1]),) + tuple(a.shape[e + 1:])
    return reshape(a, shape)


def nonzero_columns(a) -> list:
    """The positions of a's nonzero elements as one index tensor per dimension (a 0-dim a read as 1-dim), each
    of the data-dependent length prims.nonzero gives: torch.nonzero(a, as_tuple=True), and how torch reads a
    boolean mask as an index."""
    positions = prims.nonzero(a if a.ndim else reshape(a, (1,)))
    n = positions.shape[0]
    return [reshape(prims.slice(positions, (0, d), (n, d + 1), (1, 1)), (n,)) for d in range(positions.shape[1])]


def cat(tensors, dim: int = 0):
    # torch.cat skips legacy empty 1-D tensors when other inputs have more dims (among 1-D ones they
    # are ordinary pieces, and get their empty gradient)
    if any(t.ndim > 1 for t in tensors):
        tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors[:1])
    dtype = dtypes.result_type(*tensors)
    tensors = [maybe_convert_to_dtype(t, dtype) for t in tensors]
    return tensors[0] if len(tensors) == 1 else prims.cat(tensors, dim)


# -- reductions ------------------------------------------------------------------------
def reduction_dims(a, dim) -> tuple:
    """The sorted dims a reduction over `dim` (None, an int or a sequence; () means all)
    reduces. A 0-dim tensor takes dim 0 or -1, but has no dims to reduce."""
    if dim is None:
        return tuple(range(a.ndim))
    if isinstance(dim, int):
        dim = (dim,)
    if len(dim) == 0:
        return tuple(range(a.ndim))
    dims = canonical_dims(dim, a.ndim)
    return dims if a.ndim else ()


def keepdim_reshape(out, a, dims):
    shape = tuple(1 if i in dims else s for i, s in enumerate(a.shape))
    return reshape(out, shape)


def sum(a, dims):
    return prims.sum(a, dims)


def amax(a, dims):
    return prims.amax(a, dims)


# -- factories and conversions ---------------------------------------------------------
def full(shape, fill_value, *, device, dtype):
    return prims.full(tuple(shape), fill_value, device=torch.device(device), dtype=dtype)


def full_like(a, fill_value, *, device=None, dtype=None):
    return full(a.shape, fill_value, device=device or a.device, dtype=dtype or a.dtype)


def arange(start, end, step, *, device, dtype):
    check(step != 0, lambda: "step must be nonzero")
    integral = all(symbolic.is_int(v) for v in (start, end, step))
    # (in integers where they are: a symbolic bound is asked end >= start, not a float quotient's sign)
    check((end >= start if step > 0 else end <= start) if integral else (end - start) / step >= 0 or start == end,
          lambda: "upper bound and lower bound inconsistent with step sign")
    if integral:  # exact in integers, and symbolic where a bound is
        length = -((start - end) // step)
    else:
        length = max(0, math.ceil((end - start) / step))
    return prims.iota(length, start=start, step=step, device=torch.device(device), dtype=dtype)


def matmul(a, b):
    check(a.dtype == b.dtype, lambda: f"expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}")
    return prims.matmul(a, b)
