"""Shape and layout operations, and dtype/device conversions.

Views are values here: the IR is functional, so `view`, `reshape` and `contiguous`
all produce new values and strides never matter. (In-place writes through views are
refused until in-place support lands; see interception.dispatch.)
"""
from __future__ import annotations

import torch

from thunderfn import clang, prims
from thunderfn.clang import maybe_convert_to_dtype
from thunderfn.core import dtypes
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import canonical_dim, check
from thunderfn.torch import register_alias, torchsymbol

T = torch.Tensor
__all__ = ["reshape", "view", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand", "expand_as", "cat", "stack",
           "split", "chunk", "flatten", "unflatten", "contiguous", "unbind", "movedim", "to", "type_as", "clone",
           "broadcast_to", "view_as", "reshape_as", "narrow", "flip", "hstack", "vstack"]


def _shape_args(shape):
    """`x.view(2, 3)`, `x.view((2, 3))` and `x.view([2, 3])` all mean shape (2, 3)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    for s in shape:
        check(isinstance(s, int) and not isinstance(s, bool),
              lambda: f"reshape(): argument 'shape' must be tuple of ints, but found element of type {type(s).__name__}",
              TypeError)
    return tuple(shape)


@torchsymbol(T.reshape, torch.reshape)
def reshape(a, *shape):
    return clang.reshape(a, _shape_args(shape))


@torchsymbol(T.view)
def view(a, *shape):
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise UnsupportedOpError("view(dtype) reinterprets bits, which thunderfn does not trace yet; "
                                 "use .to(dtype) if a value conversion is what you need")
    return clang.reshape(a, _shape_args(shape))


@torchsymbol(T.view_as)
def view_as(a, other):
    return clang.reshape(a, tuple(other.shape))


# Traces do not track strides, and x.contiguous() is the value x itself, so at run time a view's
# input may be laid out so that torch cannot view it (x.mT.contiguous().view(-1)). The torch
# executor therefore runs views as reshapes: a view wherever torch can make one, a copy elsewhere.
view.torch_fn, view_as.torch_fn = T.reshape, T.reshape_as


@torchsymbol(T.reshape_as)
def reshape_as(a, other):
    return clang.reshape(a, tuple(other.shape))


@torchsymbol(T.permute, torch.permute)
def permute(a, *dims):
    check(len(dims) > 0, lambda: 'permute() missing 1 required positional arguments: "dims"', TypeError)
    return clang.permute(a, _shape_args(dims))


@torchsymbol(torch.transpose, T.transpose, torch.swapaxes, T.swapaxes, torch.swapdims, T.swapdims)
def transpose(a, dim0, dim1):
    return clang.transpose(a, dim0, dim1)


@torchsymbol(torch.t, T.t)
def t(a):
    check(a.ndim <= 2, lambda: f"t() expects a tensor with <= 2 dimensions, but self is {a.ndim}D")
    return clang.transpose(a, 0, 1) if a.ndim == 2 else a


register_alias(T.T.__get__, lambda a: clang.permute(a, tuple(reversed(range(a.ndim)))))
register_alias(T.mT.__get__, lambda a: _mT(a, "mT"))
register_alias(T.mH.__get__, lambda a: _mT(a, "mH"))  # conjugation is the identity on the real dtypes thunderfn traces
register_alias(T.H.__get__, lambda a: _H(a))


def _mT(a, attr):
    check(a.ndim != 1, lambda: f"tensor.{attr} is only supported on matrices or batches of matrices. Got {a.ndim}-D tensor.")
    _check_real(a, attr)
    return clang.transpose(a, -2, -1) if a.ndim else a  # the identity on 0-D tensors (deprecated in torch)


def _H(a):
    check(a.ndim == 2 or a.ndim == 0, lambda: f"tensor.H is only supported on matrices (2-D tensors). Got {a.ndim}-D tensor."
          + (" For batches of matrices, consider using tensor.mH" if a.ndim > 2 else ""))
    _check_real(a, "H")
    return clang.transpose(a, 0, 1) if a.ndim == 2 else a


def _check_real(a, attr):
    check(not a.dtype.is_complex, lambda: f"tensor.{attr} conjugates complex tensors, which thunderfn does not trace yet",
          UnsupportedOpError)


@torchsymbol(torch.movedim, T.movedim, torch.moveaxis, T.moveaxis)
def movedim(a, source, destination):
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    check(len(src) == len(dst), lambda: f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain the same number of dims as destination ({list(dst)} dims)")
    src = tuple(canonical_dim(d, a.ndim) for d in src)
    dst = tuple(canonical_dim(d, a.ndim) for d in dst)
    check(len(set(src)) == len(src), lambda: f"movedim: repeated dim in `source` ({list(source)})")
    check(len(set(dst)) == len(dst), lambda: f"movedim: repeated dim in `destination` ({list(destination)})")
    if a.ndim == 0:
        return a
    order = [None] * a.ndim
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(d for d in range(a.ndim) if d not in src)
    return clang.permute(a, tuple(o if o is not None else next(rest) for o in order))


@torchsymbol(torch.squeeze, T.squeeze)
def squeeze(a, dim=None):
    if dim is None:
        return clang.squeeze(a)
    return clang.squeeze(a, (dim,) if isinstance(dim, int) else tuple(dim))


@torchsymbol(torch.unsqueeze, T.unsqueeze)
def unsqueeze(a, dim):
    return clang.unsqueeze(a, dim)


@torchsymbol(T.expand)
def expand(a, *shape):
    shape = _shape_args(shape)
    check(len(shape) >= a.ndim,
          lambda: f"expand({clang.legacy_type_name(a)}{{[{', '.join(map(str, a.shape))}]}}, size=[{', '.join(map(str, shape))}]): the number of sizes "
                  f"provided ({len(shape)}) must be greater or equal to the number of dimensions in the tensor ({a.ndim})")
    offset = len(shape) - a.ndim
    resolved = tuple(a.shape[i - offset] if s == -1 and i >= offset else s for i, s in enumerate(shape))
    check(all(s >= 0 for s in resolved), lambda: f"The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension {shape.index(-1)}")
    return clang.expand_to(a, resolved)


@torchsymbol(T.expand_as)
def expand_as(a, other):
    return expand(a, tuple(other.shape))


@torchsymbol(torch.broadcast_to, T.broadcast_to)
def broadcast_to(a, size):
    return expand(a, *size)


def _check_tensor_list(tensors, name):
    check(isinstance(tensors, (list, tuple)), lambda: f"{name.split('.')[-1]}(): argument 'tensors' (position 1) must be tuple of Tensors, "
                                                      f"not {'Tensor' if isinstance(tensors, TensorProxy) else type(tensors).__name__}", TypeError)
    if name == "torch.cat":
        check(len(tensors) > 0, lambda: "torch.cat(): expected a non-empty list of Tensors", ValueError)
    check(len(tensors) > 0, lambda: f"{name} expects a non-empty TensorList")
    for i, t in enumerate(tensors):
        check(isinstance(t, TensorProxy), lambda: f"expected Tensor as element {i} in argument 0, but got {type(t).__name__}", TypeError)


@torchsymbol(torch.cat, torch.concat, torch.concatenate)
def cat(tensors, dim=0):
    _check_tensor_list(tensors, "torch.cat")
    if all(t.ndim == 1 and t.shape[0] == 0 for t in tensors):
        return clang.cat(tensors, 0)
    ref = next(t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0))
    check(ref.ndim > 0, lambda: "zero-dimensional tensor (at position 0) cannot be concatenated")
    canonical_dim(dim, ref.ndim)
    return clang.cat(tensors, dim)


@torchsymbol(torch.stack)
def stack(tensors, dim=0):
    _check_tensor_list(tensors, "stack")
    first = tensors[0]
    for i, t in enumerate(tensors):
        check(t.shape == first.shape, lambda: f"stack expects each tensor to be equal size, but got {list(first.shape)} at entry 0 and {list(t.shape)} at entry {i}")
    d = canonical_dim(dim, first.ndim + 1)
    return clang.cat([clang.unsqueeze(t, d) for t in tensors], d)


@torchsymbol(torch.hstack)
def hstack(tensors):
    _check_tensor_list(tensors, "hstack")
    tensors = [clang.reshape(t, (1,)) if t.ndim == 0 else t for t in tensors]
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


@torchsymbol(torch.vstack)
def vstack(tensors):
    _check_tensor_list(tensors, "vstack")
    return cat([clang.reshape(t, (1, -1)) if t.ndim < 2 else t for t in tensors], 0)


@torchsymbol(torch.split, T.split)
def split(a, split_size_or_sections, dim=0):
    check(a.ndim > 0, lambda: "split expects at least a 1-dimensional tensor")
    d = canonical_dim(dim, a.ndim)
    n = a.shape[d]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        check(size >= 0, lambda: f"split expects split_size be non-negative, but got split_size={size}")
        check(size > 0 or n == 0, lambda: f"split_size can only be 0 if dimension size is 0, but got dimension size of {n}")
        # an empty dimension still splits into one (empty) piece
        sizes = [size] * (n // size) + ([n % size] if n % size else []) if size and n else [0]
    else:
        sizes = list(split_size_or_sections)
        for s in sizes:
            check(isinstance(s, int) and not isinstance(s, bool),
                  lambda: f"split_with_sizes(): argument 'split_sizes' (position 2) must be tuple of ints, not {type(s).__name__}", TypeError)
        check(all(s >= 0 for s in sizes), lambda: f"split_with_sizes expects split_sizes have only non-negative entries, but got split_sizes={sizes}")
        check(sum(sizes) == n, lambda: f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at dimension {d}), but got split_sizes={sizes}")
    outs, start = [], 0
    for s in sizes:
        outs.append(clang.slice_in_dim(a, start, start + s, 1, d))
        start += s
    return tuple(outs)


@torchsymbol(torch.chunk, T.chunk)
def chunk(a, chunks, dim=0):
    check(a.ndim > 0, lambda: "chunk expects at least a 1-dimensional tensor")
    check(chunks > 0, lambda: f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = canonical_dim(dim, a.ndim)
    size = -(-a.shape[d] // chunks) if a.shape[d] else 0
    return split(a, size, d) if size else tuple(clang.slice_in_dim(a, 0, 0, 1, d) for _ in range(chunks))


@torchsymbol(torch.unbind, T.unbind)
def unbind(a, dim=0):
    check(a.ndim > 0, lambda: "Dimension specified as 0 but tensor has no dimensions", IndexError)
    d = canonical_dim(dim, a.ndim)
    return tuple(clang.squeeze(clang.slice_in_dim(a, i, i + 1, 1, d), (d,)) for i in range(a.shape[d]))


@torchsymbol(torch.narrow, T.narrow)
def narrow(a, dim, start, length):
    check(a.ndim > 0, lambda: "narrow() cannot be applied to a 0-dim tensor.")
    check(length >= 0, lambda: "narrow(): length must be non-negative.")
    d = canonical_dim(dim, a.ndim)
    n = a.shape[d]
    check(-n <= start <= n, lambda: f"start out of range (expected to be in range of [{-n}, {n}], but got {start})", IndexError)
    start = start + n if start < 0 else start
    check(0 <= start and start + length <= a.shape[d], lambda: f"start ({start}) + length ({length}) exceeds dimension size ({a.shape[d]}).")
    return clang.slice_in_dim(a, start, start + length, 1, d)


@torchsymbol(torch.flatten, T.flatten)
def flatten(a, start_dim=0, end_dim=-1):
    return clang.flatten(a, start_dim, end_dim)


@torchsymbol(torch.unflatten, T.unflatten)
def unflatten(a, dim, sizes):
    check(a.ndim > 0, lambda: "unflatten got an unexpected error:\nDimension specified as 0 but tensor has no dimensions")
    d = canonical_dim(dim, a.ndim)
    sizes = tuple(sizes)
    check(len(sizes) > 0, lambda: "unflatten: sizes must be non-empty")
    check(sizes.count(-1) <= 1, lambda: "unflatten got an unexpected error:\nonly one dimension can be inferred")
    n, known = a.shape[d], torch.Size(s for s in sizes if s != -1).numel()
    check(n % known == 0 if -1 in sizes and known else known == n,
          lambda: f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim {dim} ({n}) in the input tensor")
    sizes = clang.infer_shape(sizes, a.shape[d])
    return clang.reshape(a, tuple(a.shape[:d]) + sizes + tuple(a.shape[d + 1:]))


# Tensor.flip first: it takes every spelling torch.flip takes and also x.flip(0, 1) and x.flip(0)
@torchsymbol(T.flip, torch.flip)
def flip(a, *dims_args, dims=None):
    if dims is None:
        dims = dims_args[0] if len(dims_args) == 1 and not isinstance(dims_args[0], int) else dims_args
    dims = prims.canonical_dims((dims,) if isinstance(dims, int) else tuple(dims), a.ndim)
    return prims.flip(a, dims) if dims and a.ndim else a


@torchsymbol(T.contiguous)
def contiguous(a, memory_format=torch.contiguous_format):
    return a


@torchsymbol(torch.clone, T.clone)
def clone(a, *, memory_format=torch.preserve_format):
    # A functional IR has no aliasing to break; an identity keeps the output a new value.
    return clang.add(a, False) if a.dtype is torch.bool else clang.add(a, 0)


# -- conversions -----------------------------------------------------------------------
def _to_args(a, args, kwargs):
    """Parse Tensor.to's overloads into (device, dtype)."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None), kwargs.pop("copy", None), kwargs.pop("memory_format", None)
    check(not kwargs, lambda: f"to() received an invalid combination of arguments - got ({', '.join(f'{k}={type(v).__name__}' for k, v in kwargs.items())}, )", TypeError)
    for arg in args:
        if isinstance(arg, torch.dtype):
            dtype = arg
        elif isinstance(arg, (str, torch.device)):
            device = torch.device(arg)
        elif isinstance(arg, TensorProxy):
            device, dtype = arg.device, arg.dtype
        elif isinstance(arg, bool):
            continue  # non_blocking / copy positionals
        else:
            raise TypeError(f"to() received an invalid combination of arguments - got ({type(arg).__name__})")
    return device, dtype


@torchsymbol(T.to)
def to(a, *args, **kwargs):
    device, dtype = _to_args(a, args, dict(kwargs))
    out = a
    if dtype is not None:
        out = maybe_convert_to_dtype(out, dtype)
    if device is not None and torch.device(device) != a.device:
        target = torch.device(device)
        if target.type == "cuda" and target.index is None and a.device.type == "cuda":
            target = a.device
        if target != a.device:
            out = prims.device_put(out, target)
    return out


@torchsymbol(T.type_as)
def type_as(a, other):
    return maybe_convert_to_dtype(a, other.dtype)


for _method, _dtype in (("float", torch.float32), ("double", torch.float64), ("half", torch.float16),
                        ("bfloat16", torch.bfloat16), ("long", torch.int64), ("int", torch.int32), ("short", torch.int16),
                        ("char", torch.int8), ("byte", torch.uint8), ("bool", torch.bool), ("cfloat", torch.complex64),
                        ("cdouble", torch.complex128)):
    if hasattr(T, _method):
        register_alias(getattr(T, _method), lambda a, memory_format=None, _d=_dtype: to(a, _d))


register_alias(T.cpu, lambda a, memory_format=None: to(a, "cpu"))
register_alias(T.cuda, lambda a, device=None, non_blocking=False, memory_format=None: to(a, torch.device("cuda", device) if isinstance(device, int) else (device or "cuda")))
register_alias(T.type, lambda a, dtype=None, non_blocking=False, **kwargs: _type(a, dtype))


def _type(a, dtype):
    """x.type() names the legacy tensor type (metadata, known while tracing); x.type(t) converts."""
    if dtype is None:
        return clang.legacy_type_name(a)
    if isinstance(dtype, str):
        legacy = {clang.legacy_type_name(a, d): d for d in clang.LEGACY_TYPE_NAMES}
        check(dtype in legacy, lambda: f"invalid type: '{dtype}'", ValueError)
        dtype = legacy[dtype]
    return to(a, dtype)


del dtypes
