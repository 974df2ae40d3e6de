"""Shape and layout operations, and dtype/device conversions.

Views are values here: the IR is functional, so `view`, `reshape` and `contiguous`
all produce new values and traces carry no strides. Which of them share memory with
their input is decided at run time by torch itself (the torch executor runs each
one), exactly as in eager; torch/inplace.py says what an in-place write through one does.

Triangles, diagonals, rolls and repeats are slices, iotas, broadcasts and cats;
F.pad's constant mode is one prims.pad, its other modes slices, flips and a cat.
"""
from __future__ import annotations

import torch

from thunderfn import clang, prims
from thunderfn.clang import maybe_convert_to_dtype
from thunderfn.core import context, dtypes, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.rules import TAG_NOT_DIFFERENTIABLE
from thunderfn.core.symbol import DecompositionUnavailable
from thunderfn.errors import ArgumentTypeError, UnsupportedOpError
from thunderfn.prims import canonical_dim, check
from thunderfn.torch.base import register_alias, torchsymbol
from thunderfn.torch.opaque import shape_rule

T = torch.Tensor
__all__ = ["reshape", "view", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand",
           "expand_as", "cat", "stack", "split", "chunk", "flatten", "unflatten", "contiguous", "unbind", "movedim",
           "to", "type_as", "clone", "broadcast_to", "view_as", "reshape_as", "narrow", "flip", "hstack", "vstack",
           "column_stack", "tril", "triu", "diagonal", "diag_embed", "diag", "rot90", "roll", "repeat", "tile",
           "repeat_interleave", "pad"]


def _shape_args(shape):
    """`x.view(2, 3)`, `x.view((2, 3))` and `x.view([2, 3])` all mean shape (2, 3)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    for s in shape:
        check(symbolic.is_int(s),
              lambda: f"reshape(): argument 'shape' must be tuple of ints, but found element of type "
                      f"{type(s).__name__}", TypeError)
    return tuple(shape)


@torchsymbol(T.reshape, torch.reshape)
def reshape(a, *shape):
    # x.reshape() is torch's error, which the compiled call would raise (x.reshape(()) is the 0-dim shape)
    check(len(shape) > 0, lambda: 'reshape() missing 1 required positional arguments: "shape"', TypeError)
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


# The torch executor runs torch's own view, so a view of a tensor torch cannot view
# (x.t().view(-1)) raises torch's "view size is not compatible with input tensor's size
# and stride" as in eager: layouts at run time are eager's, since x.contiguous() and every
# other layout-changing op is run by torch too (see _fresh_outputs in torch/__init__.py).


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


# through the permute symbol, so x.T of a 0-D or 1-D x is a view of x as in eager, not x itself
register_alias(T.T.__get__, lambda a: transpose(a, 0, 1) if a.ndim == 2 else permute(a, tuple(reversed(range(a.ndim)))))
register_alias(T.mT.__get__, lambda a: _mT(a, "mT"))
register_alias(T.mH.__get__, lambda a: _mT(a, "mH"))  # conjugation is the identity on the real dtypes thunderfn traces
register_alias(T.H.__get__, lambda a: _H(a))
# what a graph of torch.compile's asks of a size known only at run time (nonzero's length): the size itself,
# and a check of a fact about it (generated code checks it where the size is bound: core/symbolic.py)
register_alias(torch.ops.aten.sym_size.int, lambda a, dim: a.shape[canonical_dim(dim, a.ndim)])
register_alias(torch.ops.aten.sym_numel.default, lambda a: a.numel())


def _mT(a, attr):
    check(a.ndim != 1,
          lambda: f"tensor.{attr} is only supported on matrices or batches of matrices. Got {a.ndim}-D tensor.")
    _check_real(a, attr)
    return transpose(a, -2, -1) if a.ndim else a  # the 0-D tensor itself, as in eager (deprecated in torch)


def _H(a):
    check(a.ndim == 2 or a.ndim == 0,
          lambda: f"tensor.H is only supported on matrices (2-D tensors). Got {a.ndim}-D tensor."
          + (" For batches of matrices, consider using tensor.mH" if a.ndim > 2 else ""))
    _check_real(a, "H")
    return transpose(a, 0, 1) if a.ndim == 2 else a  # the 0-D tensor itself, as in eager


def _check_real(a, attr):
    check(not a.dtype.is_complex,
          lambda: f"tensor.{attr} conjugates complex tensors, which thunderfn does not trace yet", UnsupportedOpError)


@torchsymbol(torch.movedim, T.movedim, torch.moveaxis, T.moveaxis)
def movedim(a, source, destination):
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    check(len(src) == len(dst), lambda: f"movedim: Invalid source or destination dims: source ({list(src)} dims) "
                                        f"should contain the same number of dims as destination ({list(dst)} dims)")
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
    check(len(shape) > 0, lambda: 'expand() missing 1 required positional arguments: "size"', TypeError)
    shape = _shape_args(shape)
    check(len(shape) >= a.ndim,
          lambda: f"expand({clang.legacy_type_name(a)}{{[{', '.join(map(str, a.shape))}]}}, "
                  f"size=[{', '.join(map(str, shape))}]): the number of sizes provided ({len(shape)}) must be greater "
                  f"or equal to the number of dimensions in the tensor ({a.ndim})")
    offset = len(shape) - a.ndim
    resolved = tuple(a.shape[i - offset] if s == -1 and i >= offset else s for i, s in enumerate(shape))
    check(all(s >= 0 for s in resolved), lambda: "The expanded size of the tensor (-1) isn't allowed in a leading, "
                                                 f"non-existing dimension {shape.index(-1)}")
    for i in reversed(range(offset, len(shape))):  # torch checks from the last dimension, and names the first it finds
        n = a.shape[i - offset]
        check(symbolic.expands_to(n, resolved[i]),
              lambda: f"The expanded size of the tensor ({resolved[i]}) must match the existing size "
                                             f"({n}) at non-singleton dimension {i}.  Target sizes: {list(shape)}.  "
                                             f"Tensor sizes: {list(a.shape)}")
    return clang.expand_to(a, resolved)


@torchsymbol(T.expand_as)
def expand_as(a, other):
    return expand(a, tuple(other.shape))


@torchsymbol(torch.broadcast_to, T.broadcast_to)
def broadcast_to(a, size):
    return expand(a, tuple(size))  # (one argument, so size () is a 0-dim target, not a missing size)


def _check_tensor_list(tensors, name):
    check(isinstance(tensors, (list, tuple)),
          lambda: f"{name.split('.')[-1]}(): argument 'tensors' (position 1) must be tuple of Tensors, not "
                  f"{'Tensor' if isinstance(tensors, TensorProxy) else type(tensors).__name__}", TypeError)
    if name == "torch.cat":
        check(len(tensors) > 0, lambda: "torch.cat(): expected a non-empty list of Tensors", ValueError)
    check(len(tensors) > 0, lambda: f"{name} expects a non-empty TensorList")
    for i, t in enumerate(tensors):
        check(isinstance(t, TensorProxy),
              lambda: f"expected Tensor as element {i} in argument 0, but got {type(t).__name__}", TypeError)


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
        check(t.shape == first.shape, lambda: "stack expects each tensor to be equal size, but got "
                                              f"{list(first.shape)} at entry 0 and {list(t.shape)} at entry {i}")
    d = canonical_dim(dim, first.ndim + 1)
    return clang.cat([clang.unsqueeze(t, d) for t in tensors], d)


@torchsymbol(torch.hstack)
def hstack(tensors):
    _check_tensor_list(tensors, "hstack")
    tensors = [clang.reshape(t, (1,)) if t.ndim == 0 else t for t in tensors]
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


@torchsymbol(torch.column_stack)
def column_stack(tensors):
    _check_tensor_list(tensors, "column_stack")
    # vectors (and 0-dim tensors) become columns, then everything is joined along dim 1
    return cat([clang.reshape(t, (t.numel(), 1)) if t.ndim < 2 else t for t in tensors], 1)


@torchsymbol(torch._chunk_cat)
def chunk_cat(tensors, dim, num_chunks):
    """Each tensor cut along dim into num_chunks equal chunks (zero-padded at the end to a multiple of num_chunks),
    each chunk flattened, and chunk k of every tensor joined: (*the leading dims, num_chunks, their sizes summed)."""
    _check_tensor_list(tensors, "_chunk_cat")
    check(num_chunks >= 1, lambda: "_chunk_cat expects positive num_chunks")
    for t in tensors:
        check(t.numel() > 0, lambda: "_chunk_cat expects non-empty tensor")
        check(t.dtype == tensors[0].dtype, lambda: "_chunk_cat expects all input tensors with the same dtype")
        check(t.device == tensors[0].device, lambda: "_chunk_cat expects all inputs tensors on the same device")
    if all(t.ndim == tensors[0].ndim for t in tensors):
        dim = canonical_dim(dim, tensors[0].ndim)
    else:
        check(dim >= 0, lambda: "_chunk_cat expects non-negative dim when input tensors have different ndims")
        check(all(dim < t.ndim for t in tensors), lambda: "_chunk_cat expects dim < ndim for all input tensors")
    check(all(tuple(t.shape[:dim]) == tuple(tensors[0].shape[:dim]) for t in tensors),
          lambda: "_chunk_cat expects same sizes of 0,...,dim-1 dimensions for all tensors")
    chunked = []
    for t in tensors:
        padding = -t.shape[dim] % num_chunks
        if padding:
            t = pad(t, (0, 0) * (t.ndim - dim - 1) + (0, padding))
        chunked.append(reshape(t, (*t.shape[:dim], num_chunks, -1)))
    return clang.cat(chunked, dim + 1)


@torchsymbol(torch.vstack)
def vstack(tensors):
    _check_tensor_list(tensors, "vstack")
    return cat([clang.reshape(t, (1, -1)) if t.ndim < 2 else t for t in tensors], 0)


@torchsymbol(torch.split, T.split)
def split(a, split_size_or_sections, dim=0):
    check(a.ndim > 0, lambda: "split expects at least a 1-dimensional tensor")
    d = canonical_dim(dim, a.ndim)
    n = a.shape[d]
    if symbolic.is_int(split_size_or_sections):
        size = split_size_or_sections
        check(size >= 0, lambda: f"split expects split_size be non-negative, but got split_size={size}")
        check(size > 0 or n == 0,
              lambda: f"split_size can only be 0 if dimension size is 0, but got dimension size of {n}")
        # an empty dimension still splits into one (empty) piece
        sizes = [size] * (n // size) + ([n % size] if n % size else []) if size and n else [0]
    else:
        sizes = list(split_size_or_sections)
        for s in sizes:
            check(symbolic.is_int(s),
                  lambda: "split_with_sizes(): argument 'split_sizes' (position 2) must be tuple of ints, "
                          f"not {type(s).__name__}", TypeError)
        check(all(s >= 0 for s in sizes), lambda: "split_with_sizes expects split_sizes have only non-negative "
                                                  f"entries, but got split_sizes={sizes}")
        check(sum(sizes) == n, lambda: f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's "
                                       f"size at dimension {d}), but got split_sizes={sizes}")
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
    if isinstance(start, TensorProxy):
        # where the window starts is a value, its length is not: gather the window's positions
        check(start.ndim == 0 and not start.dtype.is_floating_point,
              lambda: "start must be an 0-dim integral Tensor.", RuntimeError)
        n = a.shape[d]
        first = clang.where(clang.lt(start, 0), clang.add(start, n), start)
        positions = clang.add(clang.arange(0, length, 1, device=a.device, dtype=torch.int64),
                              maybe_convert_to_dtype(first, torch.int64))
        return prims.take(a, positions, d)
    n = a.shape[d]
    check(-n <= start <= n,
          lambda: f"start out of range (expected to be in range of [{-n}, {n}], but got {start})", IndexError)
    start = start + n if start < 0 else start
    check(0 <= start and start + length <= a.shape[d],
          lambda: f"start ({start}) + length ({length}) exceeds dimension size ({a.shape[d]}).")
    return clang.slice_in_dim(a, start, start + length, 1, d)


@torchsymbol(torch.flatten, T.flatten)
def flatten(a, start_dim=0, end_dim=-1):
    return clang.flatten(a, start_dim, end_dim)


@torchsymbol(torch.unflatten, T.unflatten)
def unflatten(a, dim, sizes):
    check(a.ndim > 0,
          lambda: "unflatten got an unexpected error:\nDimension specified as 0 but tensor has no dimensions")
    d = canonical_dim(dim, a.ndim)
    sizes = tuple(sizes)
    check(len(sizes) > 0, lambda: "unflatten: sizes must be non-empty")
    check(sizes.count(-1) <= 1, lambda: "unflatten got an unexpected error:\nonly one dimension can be inferred")
    n, known = a.shape[d], symbolic.product(s for s in sizes if s != -1)
    check(n % known == 0 if -1 in sizes and known else known == n,
          lambda: f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim {dim} "
                  f"({n}) in the input tensor")
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


# its output does not require grad, in reverse and forward mode
@torchsymbol(torch.detach, T.detach, tags=(TAG_NOT_DIFFERENTIABLE,))
def detach(a):
    # the value itself; differentiation stops here (its tag), and torch runs detach (a view). Inside a
    # decomposition (running statistics computed from a batch) it must be a value of its own, or the transforms
    # would follow the input's name through it: a reshape to its own shape.
    tracer = context.current_tracer()
    return a if tracer is None or tracer.symbol_depth <= 1 else prims.reshape(a, tuple(a.shape))


@torchsymbol(torch.clone, T.clone)
def clone(a, *, memory_format=torch.preserve_format):
    # A functional IR has no aliasing to break; an identity keeps the output a new value.
    return clang.add(a, False) if a.dtype is torch.bool else clang.add(a, 0)


# -- conversions -----------------------------------------------------------------------
def _to_args(a, args, kwargs):
    """Parse Tensor.to's overloads into (device, dtype, copy)."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    copy = kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None), kwargs.pop("memory_format", None)
    check(not kwargs, lambda: "to() received an invalid combination of arguments - got "
                              f"({', '.join(f'{k}={type(v).__name__}' for k, v in kwargs.items())}, )", TypeError)
    flags = [arg for arg in args if isinstance(arg, bool)]  # to(dtype, non_blocking, copy)
    copy = copy or (len(flags) >= 2 and flags[1])
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
            raise ArgumentTypeError(f"to() received an invalid combination of arguments - got ({type(arg).__name__})")
    return device, dtype, copy


@torchsymbol(T.to)
def to(a, *args, **kwargs):
    device, dtype, copy = _to_args(a, args, dict(kwargs))
    out = a
    if dtype is not None:
        out = maybe_convert_to_dtype(out, dtype)
    if device is not None and torch.device(device) != a.device:
        target = torch.device(device)
        if target.type == "cuda" and target.index is None and a.device.type == "cuda":
            target = a.device
        if target != a.device:
            out = prims.device_put(out, target)
    # copy=True makes a new tensor in eager even when nothing changes
    return clone(a) if copy and out is a else out


@torchsymbol(T.type_as)
def type_as(a, other):
    return maybe_convert_to_dtype(a, other.dtype)


for _method, _dtype in (("float", torch.float32), ("double", torch.float64), ("half", torch.float16),
                        ("bfloat16", torch.bfloat16), ("long", torch.int64), ("int", torch.int32),
                        ("short", torch.int16), ("char", torch.int8), ("byte", torch.uint8), ("bool", torch.bool),
                        ("cfloat", torch.complex64), ("cdouble", torch.complex128)):
    if hasattr(T, _method):
        register_alias(getattr(T, _method), lambda a, memory_format=None, _d=_dtype: to(a, _d))


register_alias(T.cpu, lambda a, memory_format=None: to(a, "cpu"))
register_alias(T.cuda, lambda a, device=None, non_blocking=False, memory_format=None:
               to(a, torch.device("cuda", device) if isinstance(device, int) else (device or "cuda")))
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


# -- triangles, diagonals, padding, rolling and repeating --------------------------------------
def _zero(dtype):
    return False if dtype is torch.bool else 0 if not (dtype.is_floating_point or dtype.is_complex) else 0.0


def _triangle(a, diagonal, name, lower):
    check(a.ndim >= 2, lambda: f"{name}: input tensor must have at least 2 dimensions")
    n, m = a.shape[-2], a.shape[-1]
    rows = prims.broadcast_in_dim(prims.iota(n, start=0, step=1, device=a.device, dtype=torch.int64), (n, m), (0,))
    cols = prims.broadcast_in_dim(prims.iota(m, start=0, step=1, device=a.device, dtype=torch.int64), (n, m), (1,))
    offset = clang.sub(cols, rows)
    keep = clang.le(offset, diagonal) if lower else clang.ge(offset, diagonal)
    zero = clang.full((), _zero(a.dtype), device=a.device, dtype=a.dtype)
    return clang.where(clang.expand_to(keep, a.shape), a, zero)


@torchsymbol(torch.tril, T.tril)
def tril(a, diagonal=0):
    return _triangle(a, diagonal, "tril", lower=True)


@torchsymbol(torch.triu, T.triu)
def triu(a, diagonal=0):
    return _triangle(a, diagonal, "triu", lower=False)


@torchsymbol(torch.diagonal, T.diagonal)
def diagonal(a, offset=0, dim1=0, dim2=1):
    d1, d2 = canonical_dim(dim1, a.ndim), canonical_dim(dim2, a.ndim)
    check(d1 != d2, lambda: f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    moved = movedim(a, (d1, d2), (-2, -1))
    n, m = moved.shape[-2], moved.shape[-1]
    batch = tuple(moved.shape[:-2])
    # (sym_min and sym_max: Python's min and max would guard which of the sizes is smaller)
    length = torch.sym_max(torch.sym_min(n, m - offset) if offset >= 0 else torch.sym_min(n + offset, m), 0)
    if not symbolic.is_symbolic(length) and length == 0:  # (the slices below take a symbolic length of 0 too)
        return clang.full(batch + (0,), _zero(a.dtype), device=a.device, dtype=a.dtype)
    row, col = (0, offset) if offset >= 0 else (-offset, 0)
    square = prims.slice(moved, (0,) * len(batch) + (row, col), batch + (row + length, col + length))
    flat = clang.reshape(square, batch + (length * length,))
    # the diagonal of a square is every (length + 1)-th element of it, flattened
    return prims.slice(flat, (0,) * (len(batch) + 1), tuple(flat.shape), (1,) * len(batch) + (length + 1,))


_diagonal = diagonal  # diag's argument `diagonal` shadows the symbol


@torchsymbol(torch.diag_embed, T.diag_embed)
def diag_embed(a, offset=0, dim1=-2, dim2=-1):
    d1, d2 = canonical_dim(dim1, a.ndim + 1), canonical_dim(dim2, a.ndim + 1)
    check(d1 != d2, lambda: f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    if a.ndim == 0:
        a = clang.reshape(a, (1,))
    batch, length = tuple(a.shape[:-1]), a.shape[-1]
    keep = ((0, 0, 0),) * len(batch)
    # interior padding of `length` puts the entries `length + 1` apart: a flattened diagonal matrix
    spread = prims.pad(a, _zero(a.dtype), keep + ((0, 0, length),))
    square = clang.reshape(spread, batch + (length, length))
    if offset:
        k = abs(offset)
        rows, cols = ((0, k, 0), (k, 0, 0)) if offset > 0 else ((k, 0, 0), (0, k, 0))
        square = prims.pad(square, _zero(a.dtype), keep + (rows, cols))
    return movedim(square, (-2, -1), (d1, d2))


@torchsymbol(torch.diag, T.diag)
def diag(a, diagonal=0):
    check(a.ndim in (1, 2), lambda: f"diag(): Supports 1D or 2D tensors. Got {a.ndim}D")
    return diag_embed(a, diagonal) if a.ndim == 1 else _diagonal(a, diagonal)


@torchsymbol(torch.rot90, T.rot90)
def rot90(a, k=1, dims=(0, 1)):
    dims = tuple(dims)
    check(len(dims) == 2, lambda: f"expected total rotation dims == 2, but got dims = {len(dims)}")
    check(a.ndim >= 2, lambda: f"expected total dims >= 2, but got total dims = {a.ndim}")
    d0, d1 = canonical_dim(dims[0], a.ndim), canonical_dim(dims[1], a.ndim)
    check(d0 != d1, lambda: f"expected rotation dims to be different, but got dim0 = {dims[0]} and dim1 = {dims[1]}")
    k %= 4
    if k == 1:
        return clang.transpose(prims.flip(a, (d1,)), d0, d1)
    if k == 2:
        return prims.flip(a, tuple(sorted((d0, d1))))
    if k == 3:
        return clang.transpose(prims.flip(a, (d0,)), d0, d1)
    return clone(a)


@torchsymbol(torch.roll, T.roll)
def roll(a, shifts, dims=()):
    shifts = (shifts,) if symbolic.is_int(shifts) else tuple(shifts)  # (a shift may be computed from a size)
    dims = () if dims is None else (dims,) if isinstance(dims, int) else tuple(dims)
    check(len(shifts) > 0, lambda: "`shifts` required")
    if not dims:
        check(len(shifts) == 1, lambda: f"shifts and dimensions must align. shifts: {len(shifts)}, dims:0")
        return clang.reshape(roll(clang.reshape(a, (a.numel(),)), shifts, 0), tuple(a.shape))
    check(len(shifts) == len(dims),
          lambda: f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    out = a
    for shift, dim in zip(shifts, dims):
        d = canonical_dim(dim, a.ndim)
        n = a.shape[d] if a.ndim else 1
        s = shift % n if n else 0
        if s and a.ndim:
            out = clang.cat([clang.slice_in_dim(out, n - s, n, 1, d), clang.slice_in_dim(out, 0, n - s, 1, d)], d)
    return out if out is not a else clone(a)


def _repeat(a, repeats):
    check(len(repeats) >= a.ndim,
          lambda: "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    shape = (1,) * (len(repeats) - a.ndim) + tuple(a.shape)
    out_shape = [r * s for r, s in zip(repeats, shape)]
    check(all(r >= 0 for r in repeats),
          lambda: f"Trying to create tensor with negative dimension {min(out_shape)}: {out_shape}")
    # each dim of size s becomes (r, s), broadcast from (1, s), then merged: whole copies, in order
    spread = tuple(x for r, s in zip(repeats, shape) for x in (r, s))
    expanded = prims.broadcast_in_dim(clang.reshape(a, shape), spread, tuple(range(1, 2 * len(shape), 2)))
    return clang.reshape(expanded, tuple(out_shape))


@torchsymbol(T.repeat)
def repeat(a, *repeats):
    check(len(repeats) > 0, lambda: 'repeat() missing 1 required positional arguments: "repeats"', TypeError)
    return _repeat(a, _shape_args(repeats))


@torchsymbol(torch.tile, T.tile)
def tile(a, dims):
    dims = tuple(dims)
    return _repeat(a, (1,) * (a.ndim - len(dims)) + dims)


@torchsymbol(torch.repeat_interleave, T.repeat_interleave)
def repeat_interleave(a, repeats=None, dim=None, *, output_size=None):
    if isinstance(repeats, TensorProxy) or repeats is None:
        # the output's length is the repeats' sum: torch runs it (without output_size, a data-dependent size)
        raise DecompositionUnavailable
    check(repeats >= 0, lambda: "Repeats must be non-negative")
    if dim is None:
        a, d = clang.reshape(a, (a.numel(),)), 0
    else:
        # torch reads a 0-dim input as 1-dim here and then rejects every dim, saying 1
        check(a.ndim > 0, lambda: "Dimension out of range (expected to be in range of [-1, 0], but got 1)", IndexError)
        d = canonical_dim(dim, a.ndim)
    n = a.shape[d]
    check(output_size is None or output_size == n * repeats,
          lambda: f"repeat_interleave: Invalid output_size, expected {n * repeats} but got {output_size}")
    shape = tuple(a.shape)
    spread = shape[:d + 1] + (repeats,) + shape[d + 1:]
    expanded = prims.broadcast_in_dim(a, spread, tuple(i for i in range(len(spread)) if i != d + 1))
    return clang.reshape(expanded, shape[:d] + (n * repeats,) + shape[d + 1:])


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


@torchsymbol(torch.nn.functional.pad)
def pad(a, pad, mode="constant", value=None):
    pad = tuple(pad)
    check(len(pad) % 2 == 0, lambda: "Padding length must be divisible by 2")
    check(len(pad) // 2 <= a.ndim,
          lambda: f"Padding length should be less than or equal to two times the input dimension "
                  f"but got padding length {len(pad)} and input of dimension {a.ndim}")
    check(mode in _PAD_MODES, lambda: f"Unrecognised padding mode {mode}", NotImplementedError)
    # pad lists (low, high) pairs from the last dim backwards
    pairs = {a.ndim - 1 - i: (pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)}
    if mode == "constant":
        for d, (lo, hi) in pairs.items():
            check(a.shape[d] - max(-lo, 0) - max(-hi, 0) >= 0, lambda: "narrow(): length must be non-negative.")
        fill = _zero(a.dtype) if value is None else _fill_number(value, a.dtype)
        config = tuple((*pairs.get(d, (0, 0)), 0) for d in range(a.ndim))
        return prims.pad(a, fill, config) if any(lo or hi for lo, hi, _ in config) else clone(a)
    check(value is None, lambda: f"Padding mode \"{mode}\" doesn't take in value argument")
    k = len(pad) // 2
    check(k <= 3 and a.ndim in (k + 1, k + 2),
          lambda: f"Padding size {len(pad)} is not supported for {a.ndim}D input tensor.\n"
                  "Supported combinations for non-constant padding:\n"
                  "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
                  "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
                  "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)", NotImplementedError)
    if mode in ("reflect", "replicate"):
        kernel = f"{'reflection' if mode == 'reflect' else 'replication'}_pad{k}d"
        prims.check_dtype_supported(a.dtype is not torch.bool, kernel, a.dtype)
        checked = range(a.ndim - k - 1 if a.ndim == k + 2 else 0, a.ndim) if mode == "reflect" else pairs
        check(all(a.shape[d] != 0 for d in checked),
              lambda: f"Expected {k + 1}D or {k + 2}D (batch mode) tensor with possibly 0 batch "
                      f"size and other non-zero dimensions for input, but got: {list(a.shape)}")
    out = a
    for d, (lo, hi) in sorted(pairs.items()):
        n = a.shape[d]
        if mode == "reflect":
            check(lo < n and hi < n,
                  lambda: f"Argument #{2 * k + 2}: Padding size should be less than the corresponding "
                          f"input dimension, but got: padding ({lo}, {hi}) at dimension {d} of "
                          f"input {list(a.shape)}")
        out = _pad_dim(out, d, lo, hi, mode)
    return out


def _fill_number(value, dtype):
    if dtype is torch.bool:
        return bool(value)
    return int(value) if not (dtype.is_floating_point or dtype.is_complex) else float(value)


def _pad_dim(a, d, lo, hi, mode):
    """Crop the negative side(s) of dim d, then pad the positive ones from what is left (torch's order);
    replicate reads each output position from the nearest input position, cropping included."""
    n = a.shape[d]
    if mode == "replicate":
        check(n + lo + hi >= 0, lambda: f"input (W: {n}) is too small. Calculated output W: {n + lo + hi}")
        positions = prims.iota(n + lo + hi, start=-lo, step=1, device=a.device, dtype=torch.int64)
        return prims.take(a, clang.minimum(clang.maximum(positions, 0), n - 1), d)
    start, stop = max(-lo, 0), n - max(-hi, 0)
    check(stop >= start, lambda: f"input (W: {n}) is too small. Calculated output W: {n + lo + hi}")
    a = clang.slice_in_dim(a, start, stop, 1, d)
    n, lo, hi = stop - start, max(lo, 0), max(hi, 0)
    if mode == "circular":
        check(lo <= n and hi <= n, lambda: "Padding value causes wrapping around more than once.")
        left, right = clang.slice_in_dim(a, n - lo, n, 1, d), clang.slice_in_dim(a, 0, hi, 1, d)
    else:
        check(lo < n and hi < n, lambda: f"input (W: {n}) is too small for reflection padding ({lo}, {hi})")
        left = prims.flip(clang.slice_in_dim(a, 1, lo + 1, 1, d), (d,))
        right = prims.flip(clang.slice_in_dim(a, n - 1 - hi, n - 1, 1, d), (d,))
    parts = [p for p, size in ((left, lo), (a, n), (right, hi)) if size or p is a]
    return clang.cat(parts, d) if len(parts) > 1 else a


del dtypes


@shape_rule(torch.tensor_split, T.tensor_split)
def _tensor_split_refusal(input, indices_or_sections=None, dim=0, **kwargs):
    # ints: torch's meta kernel; a tensor's values (also given as tensor_indices_or_sections=) decide how many pieces
    # there are (a 0-dim tensor of sections) or their sizes (a 1-D tensor of indices)
    if any(isinstance(v, TensorProxy) for v in (indices_or_sections, *kwargs.values())):
        raise UnsupportedOpError(
            "torch.tensor_split with a tensor of indices or sections: their values decide the pieces' sizes (and "
            "how many there are), which tracing does not know; pass a Python int or list of ints "
            "(indices.tolist() outside the jitted function), or call tensor_split outside it")
    return None
