"""In-place operations, functionalized.

The IR is functional, so `x.add_(y)` is traced as `t = add(x, y)` and the proxy
object `x` is *rebound* to `t`: every Python reference to that object now denotes
the new value, as every reference to the tensor sees the mutation in eager.
Earlier recorded uses keep the old value (Trace.rebind freezes them).

Mutating an input or a captured tensor is visible to the caller, as in eager: the
compiled function ends with `x.copy_(<final value>)` and returns the caller's
tensor where the traced function returned it.

Views are where functional and eager semantics part, so they are tracked: a view
made by basic indexing (`x[:, 0]`) can be mutated in place, which also writes into
its base (`x[..., 0] += 1` works); any other view mutated in place is refused; and
a view whose base was mutated after the view was made is refused when it is next
used (in eager it would show the new values). Never a silently different answer.
"""
from __future__ import annotations

import dataclasses

import torch

from thunderfn import clang, prims
from thunderfn.core import context, interception
from thunderfn.core.interception import handlers, torch_name
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves
from thunderfn.errors import ArgumentRuntimeError, UnsupportedOpError
from thunderfn.torch.base import torchsymbol
from thunderfn.torch.indexing import index_put_key
from thunderfn.torch.opaque import opaque_symbol, run_opaque

T = torch.Tensor
__all__ = ["setitem"]

_IN_PLACE_DUNDERS = {
    "__iadd__": "__add__", "__isub__": "__sub__", "__imul__": "__mul__", "__itruediv__": "__truediv__",
    "__idiv__": "__truediv__",  # torch.Tensor.__itruediv__ is __idiv__: `x /= y` reaches tracing by that name
    "__ifloordiv__": "__floordiv__", "__imod__": "__mod__", "__ipow__": "__pow__", "__iand__": "__and__",
    "__ior__": "__or__", "__ixor__": "__xor__", "__ilshift__": "__lshift__", "__irshift__": "__rshift__",
    "__imatmul__": "__matmul__",
}
# Draws into the tensor: the functional form draws into a fresh tensor of the same
# shape, which consumes the generator exactly as eager's in-place draw does.
_RANDOM_FILLS = {"normal_", "uniform_", "bernoulli_", "exponential_", "cauchy_", "log_normal_", "geometric_",
                 "random_"}
# Operations whose result shares storage with their first argument in eager.
_VIEW_NAMES = {"view", "reshape", "view_as", "reshape_as", "transpose", "swapaxes", "swapdims", "permute", "t",
               "squeeze", "unsqueeze", "expand", "expand_as", "broadcast_to", "narrow", "split", "chunk", "unbind",
               "flatten", "unflatten", "movedim", "moveaxis", "diagonal", "select", "detach", "as_strided", "unfold",
               "__getitem__", "real", "imag", "T", "mT", "H", "mH", "split_with_sizes", "tensor_split", "hsplit",
               "vsplit", "dsplit", "view_as_real", "view_as_complex", "alias"}
# Operations that return their input itself in eager when they have nothing to do, whatever
# its layout (x.to(x.dtype), x.float() on a float x, dropout outside training).
_RETURN_INPUT = {"to", "type_as", "float", "double", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool",
                 "cfloat", "cdouble", "cpu", "cuda", "type", "dropout", "alpha_dropout", "feature_alpha_dropout",
                 "dropout1d", "dropout2d", "dropout3d"}
_EXPANDING = {"expand", "expand_as", "broadcast_to"}
# torch's own message for an in-place write into an expanded tensor
_OVERLAP_MESSAGE = ("unsupported operation: more than one element of the written-to tensor refers to a single memory "
                    "location. Please clone() the tensor before performing the operation.")
# Operations that copy in eager even when the result equals the input (torch.cat([x])).
_ALWAYS_COPY = {"cat", "concat", "concatenate", "stack", "hstack", "vstack", "flip", "clone", "logcumsumexp",
                "cumsum", "cumprod", "rot90", "roll", "tile", "repeat", "pad", "tril", "triu"}


@dataclasses.dataclass
class Alias:
    """Storage sharing of a proxy: the base it views (with the basic-indexing key that
    made it, when known), the views made of it, and whether it went stale."""
    base: TensorProxy | None = None
    key: object = None
    views: list = dataclasses.field(default_factory=list)
    stale_because: str | None = None
    # made by an op that returns its input or a copy depending on the input's memory layout at
    # run time (x.contiguous()), which traces do not know: an in-place write through it is only
    # safe when nothing reads the input afterwards
    layout_dependent: bool = False
    stale_message: str | None = None  # why reading this tensor is refused, when not as a stale view
    # expanded (x.expand(3, 4) of a (4,) x): several elements share one memory location, and
    # torch refuses to write into it in place
    overlapping: bool = False


def _alias(p: TensorProxy) -> Alias:
    if p.alias is None:
        p.alias = Alias()
    return p.alias


_is_view_cache: dict = {}


def is_view_op(func) -> bool:
    answer = _is_view_cache.get(func)
    if answer is None:
        name = torch_name(func)
        answer = _is_view_cache[func] = name.startswith("torch.") and name.rsplit(".", 1)[-1] in _VIEW_NAMES
    return answer


def track_views(func, args, kwargs, out) -> None:
    """After a view op, or an op that returned its input unchanged while tracing: remember
    which outputs share storage with which input."""
    identities = context.current_trace().identities
    tracked = set()
    if identities:
        for o in tree_leaves(out):
            entry = identities.pop(id(o), None) if isinstance(o, TensorProxy) else None
            if entry is not None and entry[0] is o:
                _track_identity(func, kwargs, o, entry[1])
                tracked.add(id(o))
    source = args[0] if args else None
    if not is_view_op(func) or not isinstance(source, TensorProxy):
        return
    short = torch_name(func).rsplit(".", 1)[-1]
    root = source.alias.base if source.alias is not None and source.alias.base is not None else source
    key = None
    if torch_name(func) == "torch.Tensor.__getitem__" and root is source and _is_basic_key(args[1]):
        key = args[1]
    for o in tree_leaves(out):
        if isinstance(o, TensorProxy) and o is not source and o is not root and id(o) not in tracked:
            o.alias = Alias(base=root, key=key, overlapping=short in _EXPANDING and o.numel() > source.numel())
            _alias(root).views.append(o)


def _track_identity(func, kwargs, out: TensorProxy, source: TensorProxy) -> None:
    """out has source's value: in eager it is source itself or a view of all of it (so an
    in-place write through it writes all of source), a copy, or one of the two depending on
    source's layout at run time (any op not known to be one of the others)."""
    short = torch_name(func).rsplit(".", 1)[-1]
    if short in _ALWAYS_COPY:
        return
    if source.alias is not None and source.alias.base is not None:
        root, key = source.alias.base, source.alias.key
    else:
        root, key = source, Ellipsis
    exact = (short in _VIEW_NAMES or short in _RETURN_INPUT) and kwargs.get("memory_format") in (
        None, torch.preserve_format)
    out.alias = Alias(base=root, key=key, layout_dependent=not exact)
    _alias(root).views.append(out)


def check_fresh(args, kwargs) -> None:
    """Refuse to read a view whose base was mutated after the view was made, and a tensor requiring
    grad under grad mode after it was written under no_grad."""
    trc = context.current_trace()
    grad_enabled = torch.is_grad_enabled()
    for a in tree_leaves((args, kwargs)):
        if not isinstance(a, TensorProxy):
            continue
        if a.alias is not None and a.alias.stale_message:
            raise UnsupportedOpError(a.alias.stale_message)
        if a.alias is not None and a.alias.stale_because:
            raise UnsupportedOpError(
                f"tensor {a.name} is a view of another tensor that was modified in place ({a.alias.stale_because}) "
                f"after the view was made; in eager the view would show the new values, which thunderfn does not "
                f"track yet. Take the view again after the in-place operation, or clone() it before.")
        if grad_enabled and trc.written_without_grad(a):
            # In eager the tensor is still a leaf that requires grad, now holding the new value; in the trace its
            # new value was computed under no_grad, so autograd would not reach the tensor through this use.
            raise UnsupportedOpError(
                f"'{trc.fn_name}' reads {a.origin[0] if a.origin else a.name}, which requires grad, under grad mode "
                f"after writing into it in place under torch.no_grad() (an optimizer step, say). thunderfn cannot "
                f"differentiate through the updated tensor in the same function: end the jitted function after the "
                f"update, and use the tensor in the next call.")


def _is_basic_key(key) -> bool:
    items = key if isinstance(key, tuple) else (key,)
    return all(k is None or k is Ellipsis or isinstance(k, (int, slice)) and not isinstance(k, bool) for k in items)


# -- functional forms ------------------------------------------------------------------------
def copy_into(dst, src):
    """What dst holds after dst.copy_(src): src broadcast to dst's shape, in dst's dtype and device."""
    if not isinstance(src, TensorProxy):
        return clang.full(dst.shape, src, device=dst.device, dtype=dst.dtype)
    value = clang.maybe_convert_to_dtype(src, dst.dtype)
    if value.device != dst.device:
        value = prims.device_put(value, dst.device)
    return clang.expand_to(value, dst.shape)


def fresh_random_like(like: torch.Tensor, method: str, /, *args, **kwargs) -> torch.Tensor:
    """`like.<method>(...)` drawn into a new tensor: the functional form of a random fill."""
    return getattr(torch.empty_like(like), method)(*args, **kwargs)


def setitem_copy(a: torch.Tensor, key, value) -> torch.Tensor:
    """What `a[key] = value` leaves in a, as a new tensor (the torch executor runs this)."""
    out = a.clone()
    out[key] = value
    return out


@torchsymbol(setitem_copy, name="setitem")
def setitem(a, key, value):
    """Functional `a[key] = value` (the torch executor runs setitem_copy; this is its decomposition)."""
    return index_put_key(a, key, value)


# In-place ops that change the tensor's shape, storage or autograd identity rather than its values.
_REFUSED = {"resize_", "resize_as_", "set_", "requires_grad_", "share_memory_", "detach_", "as_strided_", "t_",
            "transpose_", "squeeze_", "unsqueeze_", "swapdims_", "swapaxes_", "retain_grad_"}


def _overwriting(target, value):
    """value, as what an in-place overwrite (copy_, fill_, zero_, uniform_, ...) leaves in target:
    in eager the tensor stays in autograd's graph, its old value getting a zero gradient (not None)."""
    if not torch.is_grad_enabled() or not (target.dtype.is_floating_point or target.dtype.is_complex):
        return value
    return clang.in_place_of(target, value)


def _functional(func, short: str, args, kwargs):
    """The value the in-place call leaves in its target, computed out of place."""
    target = args[0]
    if short in _REFUSED:
        raise UnsupportedOpError(f"{torch_name(func)} changes the tensor's shape, storage or autograd state in place, "
                                 f"which thunderfn does not trace; use the out-of-place form ({short[:-1]}) and its result")
    if short == "__setitem__":
        return setitem(target, args[1], args[2])
    if short == "copy_":
        return _overwriting(target, copy_into(target, args[1]))
    if short == "zero_":
        return _overwriting(target, clang.full(target.shape, 0, device=target.device, dtype=target.dtype))
    if short == "fill_":
        return _overwriting(target, copy_into(target, args[1]))
    if short in _RANDOM_FILLS:
        return _overwriting(target, opaque_symbol(fresh_random_like)(target, short, *args[1:], **kwargs))
    out_of_place = _IN_PLACE_DUNDERS.get(short, short[:-1])
    candidates = [getattr(torch.Tensor, out_of_place, None)]
    if not torch_name(func).startswith("torch.Tensor."):
        candidates.insert(0, getattr(torch, out_of_place, None))
    for candidate in candidates:
        if candidate is not None:
            return interception.dispatch(candidate, args, kwargs)
    raise UnsupportedOpError(f"{torch_name(func)} mutates its input in place and has no out-of-place form "
                             f"thunderfn could trace; call it outside the jitted function")


def _cast_like_target(value, target, what: str):
    if not isinstance(value, TensorProxy):
        raise UnsupportedOpError(f"{what} did not produce a tensor")
    if not torch.can_cast(value.dtype, target.dtype):
        raise ArgumentRuntimeError(f"result type {prims.scalar_type_name(value.dtype)} can't be cast to the desired output "
                           f"type {prims.scalar_type_name(target.dtype)}")
    if tuple(value.shape) != tuple(target.shape):
        try:
            value = clang.expand_to(value, target.shape)
        except RuntimeError:
            raise ArgumentRuntimeError(f"output with shape {list(target.shape)} doesn't match the broadcast shape "
                               f"{list(value.shape)}") from None
    return clang.maybe_convert_to_dtype(value, target.dtype)


def run_in_place(func, args, kwargs):
    """Trace an in-place torch call on a proxy (or a call with out=/inplace=True)."""
    trc = context.current_trace()
    name = torch_name(func)
    short = name.rsplit(".", 1)[-1]
    if short.startswith("_foreach_"):  # one in-place op per tensor of the lists (torch/foreach.py)
        return interception.handlers[func](*args, **kwargs)
    target = args[0]
    if not isinstance(target, TensorProxy):
        raise UnsupportedOpError(f"{name} mutates {type(target).__name__}, not a tensor")
    check_fresh(args, kwargs)
    info = target.alias
    if info is not None and info.overlapping and short != "__setitem__":
        raise ArgumentRuntimeError(_OVERLAP_MESSAGE)
    if short == "__setitem__" and isinstance(args[2], TensorProxy) and args[2].alias is not None and (
            args[2].alias.base is target and args[2].alias.key == args[1]):
        return None  # x[k] = v where v is x[k], already written back when v was mutated: nothing to do
    if info is not None and info.layout_dependent:
        return _write_layout_dependent(trc, func, name, short, args, kwargs)
    if info is not None and info.base is not None:
        if info.key is None:
            raise UnsupportedOpError(
                f"{name} mutates {target.name}, a view of {info.base.name} not made by basic indexing; writing the "
                f"change back into {info.base.name} is not supported yet. Clone the view, or mutate "
                f"{info.base.name} through indexing (x[..., 0] += 1).")
        new_value = _cast_like_target(_functional(func, short, args, kwargs), target, name)
        base = info.base
        rebind(base, setitem(base, info.key, new_value), because=f"{name} on its view {target.name}", keep=target)
        rebind(target, new_value, because=name)
        return target if short != "__setitem__" else None
    new_value = _cast_like_target(_functional(func, short, args, kwargs), target, name)
    rebind(target, new_value, because=name)
    return target if short != "__setitem__" else None


def _write_layout_dependent(trc, func, name, short, args, kwargs):
    """An in-place write into x.contiguous() (or the like), which in eager writes into x or
    into a copy depending on x's layout at run time. Into a copy of an input the caller would
    see no change, into x itself they would: refused. For a tensor made inside the function,
    the write goes to the result, and x may not be read afterwards."""
    target = args[0]
    root = target.alias.base
    if any(a is root for a in trc.args) or root.constant is not None:
        raise UnsupportedOpError(
            f"{name} mutates {target.name}, which in eager is {root.name} itself or a copy of it depending on "
            f"{root.name}'s memory layout at run time (x.contiguous(), x.reshape(...)); {root.name} is an input of "
            f"the traced function, so whether the caller sees the change cannot be known while tracing. Mutate "
            f"{root.name}.clone() (or {root.name} itself) instead.")
    new_value = _cast_like_target(_functional(func, short, args, kwargs), target, name)
    rebind(target, new_value, because=name)
    _alias(root).stale_message = (
        f"{root.name} is read after {name} mutated {target.name}, which in eager is {root.name} itself or a copy of it "
        f"depending on {root.name}'s memory layout at run time (x.contiguous(), x.reshape(...)), so whether "
        f"{root.name} changed cannot be known while tracing. Mutate {root.name}.clone() instead, or read "
        f"{target.name}.")
    return target if short != "__setitem__" else None


def run_with_output_argument(handler, func, args, kwargs, out):
    """`torch.add(a, b, out=c)`: compute, then write into c as c.copy_ would (same dtype rules)."""
    if not isinstance(out, TensorProxy):
        raise UnsupportedOpError(f"{torch_name(func)}(out=...) with a non-tensor out")
    kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    result = handler(*args, **kwargs) if handler is not None else None
    if result is None:
        result = run_opaque(func, args, kwargs)
    if not isinstance(result, TensorProxy):
        raise UnsupportedOpError(f"{torch_name(func)}(out=...) with several outputs is not supported; use the result")
    check_fresh((out,), {})
    if out.alias is not None and out.alias.overlapping:
        raise ArgumentRuntimeError(_OVERLAP_MESSAGE)
    rebind(out, _cast_like_target(result, out, torch_name(func)), because=f"{torch_name(func)}(out=...)")
    return out


def run_with_inplace_flag(handler, func, args, kwargs):
    """`F.relu(x, inplace=True)`: the out-of-place op, then x rebound to its result."""
    kwargs = dict(kwargs, inplace=False)
    target = args[0]
    check_fresh(args, kwargs)
    result = handler(*args, **kwargs)
    if target.alias is not None and target.alias.base is not None:
        raise UnsupportedOpError(f"{torch_name(func)}(inplace=True) on {target.name}, a view of another tensor, is "
                                 f"not supported yet; use inplace=False")
    rebind(target, _cast_like_target(result, target, torch_name(func)), because=f"{torch_name(func)}(inplace=True)")
    return target


def is_in_place(func) -> bool:
    short = torch_name(func).rsplit(".", 1)[-1]
    return (short.endswith("_") and not short.startswith("__")) or short in _IN_PLACE_DUNDERS or short == "__setitem__"


def rebind(proxy: TensorProxy, value: TensorProxy, *, because: str, keep=None) -> None:
    """An in-place write into proxy, traced: it denotes value from now on (Trace.rebind), and
    the views made of it before (except `keep`, the view written through) go stale."""
    context.current_trace().rebind(proxy, value, because=because)
    mark_stale_views(proxy, because, keep)


def mark_stale_views(proxy: TensorProxy, because: str, keep=None) -> None:
    if proxy.alias is None:
        return
    for view in proxy.alias.views:
        if view is not keep:
            _alias(view).stale_because = because
    proxy.alias.views = [keep] if keep is not None else []


del handlers
