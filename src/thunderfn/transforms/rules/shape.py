"""Rules of the shape family: broadcast_in_dim, reshape, squeeze, transpose, flip, slice, pad and
cat, and the torch-language split.

Each of these prims is linear in its tensor: `deflinear` gives it both directions, its JVP the
prim applied to the tangent and its VJP the transpose written here (a strided slice transposes
to interior padding, pad to a slice). Batching moves the batch dimension to the front and shifts
the dimension arguments by one.
"""
from __future__ import annotations

import thunderfn.torch as ltorch
from thunderfn import prims
from thunderfn.core import symbolic
from thunderfn.prims import PrimIDs, canonical_dim
from thunderfn.transforms.rules.common import (
    batch_size_of,
    batched_front,
    inverse_permutation,
    is_float_tensor,
    move_to_front,
    operand_cotangent,
    or_zeros,
    shifted_dims,
    zeros_like,
)
from thunderfn.transforms.rules.define import defbatch, defjvp, deflinear, defvjp


# -- broadcast_in_dim ------------------------------------------------------------------------
def _broadcast_in_dim_transpose(call, g):
    a, shape, bdims = call.args
    if not is_float_tensor(a):
        return None, None, None
    summed = [d for d in range(len(shape)) if d not in bdims]
    summed += [d for i, d in enumerate(bdims) if symbolic.was_expanded(a.shape[i], shape[d])]
    s = ltorch.sum(g, tuple(sorted(summed))) if summed else g
    return (s if symbolic.same_shape(s.shape, a.shape) else ltorch.reshape(s, tuple(a.shape))), None, None


deflinear(prims.broadcast_in_dim, _broadcast_in_dim_transpose)


@defbatch(PrimIDs.BROADCAST_IN_DIM)
def _broadcast_in_dim_batch(call, dims):
    a = move_to_front(call.args[0], dims[0])
    shape, broadcast_dimensions = call.arg("shape"), call.arg("broadcast_dimensions")
    return prims.broadcast_in_dim(a, (a.shape[0],) + tuple(shape), (0,) + tuple(d + 1 for d in broadcast_dimensions)), 0


# -- reshape and squeeze ----------------------------------------------------------------------
def _back_to_input_shape(call, g):
    return operand_cotangent(ltorch.reshape(g, tuple(call.args[0].shape)), call.args[0]), None


deflinear(prims.reshape, _back_to_input_shape)


@defbatch(PrimIDs.RESHAPE)
def _reshape_batch(call, dims):
    a = move_to_front(call.args[0], dims[0])
    return prims.reshape(a, (a.shape[0],) + tuple(call.args[1])), 0


deflinear(prims.squeeze, _back_to_input_shape)


@defbatch(PrimIDs.SQUEEZE)
def _squeeze_batch(call, dims):
    a = move_to_front(call.args[0], dims[0])
    return prims.squeeze(a, shifted_dims(call.args[1], a.ndim - 1)), 0


# -- transpose and flip -----------------------------------------------------------------------
deflinear(prims.transpose, lambda call, g: (
    operand_cotangent(ltorch.permute(g, inverse_permutation(call.args[1])), call.args[0]), None))


@defbatch(PrimIDs.TRANSPOSE)
def _transpose_batch(call, dims):
    a = move_to_front(call.args[0], dims[0])
    return prims.transpose(a, (0,) + tuple(p + 1 for p in call.args[1])), 0


deflinear(prims.flip, lambda call, g: (operand_cotangent(ltorch.flip(g, call.args[1]), call.args[0]), None))


@defbatch(PrimIDs.FLIP)
def _flip_batch(call, dims):
    a = move_to_front(call.args[0], dims[0])
    return prims.flip(a, shifted_dims(call.args[1], a.ndim - 1)), 0


# -- slice and pad: each other's transpose ---------------------------------------------------
def _slice_transpose(call, g):
    """A strided slice transposes to interior padding."""
    a, starts, ends = call.args[:3]
    strides = call.args[3] if len(call.args) > 3 and call.args[3] is not None else (1,) * a.ndim
    if not is_float_tensor(a):
        return (None,) * len(call.args)
    config = []
    for n, s, st, m in zip(a.shape, starts, strides, g.shape):
        dilated = m + (m - 1) * (st - 1) if m else 0
        config.append((s, n - s - dilated, st - 1 if m else 0))
    return (prims.pad(g, 0.0, tuple(config)),) + (None,) * (len(call.args) - 1)


deflinear(prims.slice, _slice_transpose)


@defbatch(PrimIDs.SLICE)
def _slice_batch(call, dims):
    args = call.args
    a = move_to_front(args[0], dims[0])
    starts, ends = tuple(args[1]), tuple(args[2])
    strides = tuple(args[3]) if len(args) > 3 and args[3] is not None else (1,) * len(starts)
    return prims.slice(a, (0,) + starts, (a.shape[0],) + ends, (1,) + strides), 0


@defvjp(PrimIDs.PAD)
def _pad_vjp(call, g):
    """Undo low/high padding (negative pads crop, so their negation pads back), then take
    every (interior + 1)-th element."""
    a, _, config = call.args
    if not is_float_tensor(a):
        return None, None, None
    unpadded = prims.pad(g, 0.0, tuple((-lo, -hi, 0) for lo, hi, _ in config))
    if any(i for _, _, i in config):
        unpadded = prims.slice(unpadded, (0,) * a.ndim, tuple(unpadded.shape), tuple(i + 1 for _, _, i in config))
    return unpadded, None, None


# linear in the padded tensor; the padding value is a number, whose tangent is zero
defjvp(PrimIDs.PAD)(lambda call, t: prims.pad(t[0], 0.0, call.args[2]))


@defbatch(PrimIDs.PAD)
def _pad_batch(call, dims):
    a = move_to_front(call.args[0], dims[0])
    return prims.pad(a, call.args[1], ((0, 0, 0),) + tuple(tuple(c) for c in call.args[2])), 0


# -- cat ---------------------------------------------------------------------------------------
@defvjp(PrimIDs.CAT)
def _cat_vjp(call, g):
    tensors, dim = call.args
    d = canonical_dim(dim, tensors[0].ndim)
    cts, start = [], 0
    for t in tensors:
        stop = start + t.shape[d]
        cts.append(operand_cotangent(ltorch.narrow(g, d, start, stop - start), t))
        start = stop
    return tuple(cts), None


@defjvp(PrimIDs.CAT)
def _cat_jvp(call, t):
    tensors, dim = call.args
    if all(x is None for x in t[0]):
        return None
    return prims.cat([or_zeros(x, a) for x, a in zip(t[0], tensors)], dim)


@defbatch(PrimIDs.CAT)
def _cat_batch(call, dims):
    tensors, tensor_dims = call.args[0], dims[0]
    batch = batch_size_of(tensors, tensor_dims)
    fronted = [batched_front(t, d, batch) for t, d in zip(tensors, tensor_dims)]
    return prims.cat(fronted, shifted_dims((call.args[1],), tensors[0].ndim - (tensor_dims[0] is not None))[0]), 0


# -- torch-language split ------------------------------------------------------------------------
@defvjp(ltorch.split.id)
def _split_vjp(call, g):  # eager's: one cat of the pieces' cotangents (zeros for the unused), not a pad per piece
    a = call.args[0]
    dim = canonical_dim(call.arg("dim"), a.ndim)
    pieces = [c if c is not None else zeros_like(o) for c, o in zip(g, call.out)]
    return (ltorch.cat(pieces, dim),) + (None,) * (len(call.args) - 1)
