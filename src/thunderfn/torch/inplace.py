"""In-place operations, functionalized.

The IR is functional, so `x.add_(y)` is traced as `t = add(x, y)` and the proxy
object `x` is *rebound* to `t`: every Python reference to that object now denotes
the new value, as every reference to the tensor sees the mutation in eager.
Earlier recorded uses keep the old value (Tracer.rebind freezes them).

Mutating an input or a captured tensor is visible to the caller, as in eager: the
compiled function ends with `x.copy_(<final value>)` and returns the caller's
tensor where the traced function returned it.

Views are where functional and eager semantics part, so they are tracked: each view
remembers its base (the tensor that owns the memory) and the view ops that lead from
the base to it (`ViewStep`s). A write through a view is written into the base (each
step's inverse: a setitem, a reshape, a permute, or a scatter into the positions the
view picks); a write into the base, directly or through any view, makes every other
view of it out of date, and such a view is recomputed from the base's new value
when it is next read (as an argument, or as an output of the traced function), so
it shows what eager's view shows. The few views that cannot be replayed or written
through (`as_strided`, a tensor index, `detach()`, reinterpretations such as
`view(dtype)` and `view_as_real`) are refused by name. Never a silently different answer.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from thunderfn import clang, prims
from thunderfn.core import context, dtypes, interception, symbolic
from thunderfn.core.interception import find_handler, torch_name
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves
from thunderfn.errors import ArgumentRuntimeError, UnsupportedOpError
from thunderfn.torch.base import torchsymbol
from thunderfn.torch.indexing import index_put_key, scatter_into_view
from thunderfn.torch.opaque import opaque_symbol, run_opaque
from thunderfn.torch.shape import permute, reshape

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


@dataclasses.dataclass(frozen=True)
class ViewStep:
    """One view op between a tensor and its view: `func(parent, *args, **kwargs)`, the leaf
    `index` of its tensor outputs (split, unbind and chunk return several views); func None
    is the tensor itself (x.to(x.dtype), x[...])."""
    func: object
    args: tuple = ()
    kwargs: tuple = ()  # (name, value) pairs
    index: int = 0


_SAME = ViewStep(None)


@dataclasses.dataclass
class Alias:
    """Storage sharing of a proxy. On a view: its base and the steps that make it from the
    base (None: a view that cannot be replayed, refused when written through or read after
    the base changed), and the base's version its value was computed from. On a base: its
    version, counting the writes into it."""
    base: TensorProxy | None = None
    steps: tuple | None = None
    made_by: str | None = None  # what made a view that cannot be replayed (as_strided, a tensor index)
    seen: int = 0
    version: int = 0
    # the basic-indexing key when the view is base[key] (x[k] += 1 writes back through it)
    key: object = None
    # made by an op that returns its input or a copy depending on the input's memory layout at
    # run time (x.contiguous()), which traces do not know: an in-place write through it is only
    # safe when nothing reads the input afterwards
    layout_dependent: bool = False
    stale_message: str | None = None  # why reading this tensor is refused
    # Layout facts about inputs (root, what, get, value; see _view_in_eager) that decided whether this
    # tensor, or one it was made from, is a view or a copy: relied on (Tracer.rely_on_layout) once the
    # answer matters, when it is written or read after its base changed; and, for a copy, its source
    copy_of: TensorProxy | None = None
    facts: tuple = ()
    # expanded (x.expand(3, 4) of a (4,) x): several elements share one memory location, and
    # torch refuses to write into it in place
    overlapping: bool = False

    def refresh(self, proxy: TensorProxy) -> None:
        """Called by core (core/trace.py's `up_to_date`) on what traced code returns."""
        refresh(proxy)


def _alias(p: TensorProxy) -> Alias:
    if p.alias is None:
        p.alias = Alias()
    return p.alias


# View ops whose inverse is a reshape of the written value (same elements in the same order),
# and those that only reorder dimensions (inverse: the inverse permutation)
_RESHAPING = {"view", "reshape", "view_as", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze"}
# View ops that copy instead when their input's strides do not allow a view (x.t().reshape(-1))
_VIEW_OR_COPY = {"reshape", "reshape_as", "flatten"}
# (H and mH conjugate only complex tensors, which the torch language refuses there)
_PERMUTING = {"transpose", "swapaxes", "swapdims", "permute", "t", "T", "mT", "H", "mH", "movedim", "moveaxis"}
# Views whose elements are not the base's elements, one for one: writing through them is refused
_NOT_WRITABLE = {"as_strided": "picks storage positions by stride", "real": "reinterprets a complex tensor",
                 "imag": "reinterprets a complex tensor", "view_as_real": "reinterprets a complex tensor",
                 "view_as_complex": "reinterprets a real tensor"}
_NOT_REPLAYABLE = {"as_strided"}  # its strides are the storage's, which traces do not know


_is_view_cache: dict = {}


def is_view_op(func) -> bool:
    answer = _is_view_cache.get(func)
    if answer is None:
        name = torch_name(func)
        answer = _is_view_cache[func] = name.startswith("torch.") and name.rsplit(".", 1)[-1] in _VIEW_NAMES
    return answer


def track_views(func, args, kwargs, out) -> None:
    """After a view op, or an op that returned its input unchanged while tracing: remember
    which outputs share storage with which input, and how to make them again. Until the traced
    code first writes in place nothing can tell a view from a copy, so the calls are kept and
    tracked then (`settle_views`): a function without in-place writes pays nothing for views."""
    tracer = context.current_tracer()
    identities = {}
    for o in tree_leaves(out):
        entry = tracer.identities.pop(id(o), None) if tracer.identities and isinstance(o, TensorProxy) else None
        if entry is not None and entry[0] is o:
            identities[id(o)] = entry
    if tracer.views_to_track is not None:
        tracer.views_to_track.append((func, args, kwargs, out, identities))
        return
    _track_views(func, args, kwargs, out, identities)


def settle_views() -> None:
    """Track the views made before the traced code's first in-place write (called before each
    write; from then on views are tracked as they are made)."""
    tracer = context.current_tracer()
    made, tracer.views_to_track = tracer.views_to_track, None
    for call in made or ():
        _track_views(*call)


def _track_views(func, args, kwargs, out, identities: dict) -> None:
    tracked = _track_identities(func, args, kwargs, out, identities)
    source = args[0] if args else None
    if not is_view_op(func) or not isinstance(source, TensorProxy):
        return
    short = torch_name(func).rsplit(".", 1)[-1]
    key = args[1] if short == "__getitem__" else None
    if key is not None and _is_advanced_key(key):
        return  # x[[0, 2]], x[True], x[idx], x[mask]: eager copies
    root, steps = _root_and_steps(source)
    outs = [o for o in tree_leaves(out) if isinstance(o, TensorProxy)]
    facts = source.alias.facts if source.alias is not None else ()
    if short in _VIEW_OR_COPY:
        is_view, layout_facts = _view_in_eager(func, args, kwargs, root, steps)
        if is_view is None:  # an intermediate's layout, which tracing does not know
            _mark_layout_dependent(func, source, root, outs, tracked)
            return
        facts += layout_facts
        if not is_view:  # eager copies
            _mark_copies(root, outs, tracked, facts)
            return
    for index, o in enumerate(outs):
        if o is source or o is root or id(o) in tracked:
            continue
        step = ViewStep(func, tuple(args[1:]), tuple(kwargs.items()), index)
        made_by = (source.alias.made_by if steps is None else torch_name(func) if short in _NOT_REPLAYABLE
                   else "a tensor index" if key is not None and not _is_basic_key(key) else None)
        o.alias = Alias(base=root, steps=steps + (step,) if made_by is None else None, made_by=made_by,
                        seen=_alias(root).version,
                        key=key if root is source and key is not None and _is_basic_key(key) else None,
                        overlapping=_overlapping(short, source, o, args, kwargs), facts=facts)


def _track_identities(func, args, kwargs, out, identities: dict) -> set:
    """Tracks the outputs that are an input given back unchanged (identities: id -> (output, input));
    the ids of those outputs."""
    tracked = set()
    for o in tree_leaves(out):
        entry = identities.get(id(o)) if isinstance(o, TensorProxy) else None
        if entry is not None:
            _track_identity(func, args, kwargs, o, entry[1])
            tracked.add(id(o))
    return tracked


def _mark_layout_dependent(func, source, root, outs: list, tracked: set) -> None:
    """The outputs of a view-or-copy op on a value whose layout tracing does not know: views of root or copies,
    as its layout at run time decides."""
    for o in outs:
        if o is not source and o is not root and id(o) not in tracked:
            o.alias = Alias(base=root, made_by=torch_name(func), seen=_alias(root).version, layout_dependent=True)


def _mark_copies(root, outs: list, tracked: set, facts: tuple) -> None:
    """The outputs of a view-or-copy op that copies in eager: copies of root."""
    for o in outs:
        if id(o) not in tracked:
            o.alias = Alias(copy_of=root, seen=_alias(root).version, facts=facts)


def _overlapping(short, source, view, args, kwargs) -> bool:
    if short in _EXPANDING:
        return view.numel() > source.numel()
    if short == "unfold":  # windows overlap when they are longer than their step
        size, step = (tuple(args[2:4]) + (kwargs.get("size"), kwargs.get("step")))[:2]
        return view.numel() > source.numel() or (size is not None and step is not None and size > step)
    return False


def _root_and_steps(source: TensorProxy):
    """(the tensor that owns source's memory, the view steps from it to source; None when they
    cannot be replayed)."""
    info = source.alias
    if info is None or info.base is None:
        return source, ()
    return info.base, None if info.layout_dependent else info.steps


def _view_in_eager(func, args, kwargs, root, steps) -> tuple:
    """(whether func(*args), a view op that copies when strides forbid a view or x.contiguous(),
    returns in eager a view of root or root itself; the layout facts that say so). Decided on a
    meta tensor laid out as the input or captured tensor root stands for, replaying the view steps
    to args[0]; the fact is relied on (`_rely`) only where the answer changes a result. (None, None)
    when root is a value the traced code computed, whose layout tracing does not know."""
    tracer = context.current_tracer()
    facts: list = []
    probe = _eager_layout(tracer, root, facts) if steps is not None else None
    if probe is None:
        return None, None
    try:
        with torch._C.DisableTorchFunction(), _symbolic_probes(probe, args, kwargs):  # meta tensors, not traced
            value = probe
            for step in steps:
                if step.func is not None:
                    out = step.func(value, *_meta_args(step.args), **dict(_meta_args(step.kwargs)))
                    value = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)][step.index]
            result = func(value, *_meta_args(tuple(args[1:])), **_meta_kwargs(kwargs))
        result = [o for o in tree_leaves(result) if isinstance(o, torch.Tensor)][0]
    except Exception:  # noqa: BLE001 (an op meta tensors do not support: the layout stays unknown)
        return None, None
    if short_name(func) == "contiguous" and not steps and len(facts) == 1 and facts[0][0] is root:  # an input's
        fmt = kwargs.get("memory_format", torch.contiguous_format)
        facts = [(root, f"is_contiguous(memory_format={fmt})", _is_contiguous_as[fmt],
                  probe.is_contiguous(memory_format=fmt))]
    return result is probe or result._base is probe, tuple(facts)


_LAYOUT_DEPTH = 8  # how many ops back a computed tensor's layout is worked out from its inputs'


def _eager_layout(tracer, proxy, facts: list, depth: int = 0):
    """A meta tensor laid out as the tensor proxy denotes is in eager, or None when unknown: an
    input's or captured tensor's own layout (its strides join `facts`), or, for a value the traced
    code computed with a torch op (not written in place since), that op's meta kernel applied to its
    inputs' layouts (x.clone() keeps x's strides, torch.zeros(...) is contiguous)."""
    known = tracer.layouts.get(id(proxy))
    if known is None or known[2] is not proxy:
        own: list = []
        known = tracer.layouts[id(proxy)] = (_work_out_layout(tracer, proxy, own, depth), tuple(own), proxy)
    facts.extend(known[1])
    return known[0]


def _work_out_layout(tracer, proxy, facts: list, depth: int):
    tensor = tracer.real_tensor(proxy)
    if tensor is not None:
        if symbolic.has_symbols(tuple(proxy.shape)):
            # strides change with a symbolic size: a contiguous input is probed as contiguous in its symbolic
            # shape (the fact relied on: it is contiguous), any other layout stays unknown
            if not tensor.is_contiguous():
                return None
            facts.append((proxy, "is_contiguous()", torch.Tensor.is_contiguous, True))
            with torch._C.DisableTorchFunction(), _symbolic_probes(proxy.shape):
                return torch.empty(tuple(proxy.shape), dtype=tensor.dtype, device="meta")
        facts.append((proxy, "stride()", torch.Tensor.stride, tensor.stride()))
        with torch._C.DisableTorchFunction():
            return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
    if depth >= _LAYOUT_DEPTH or id(proxy) in tracer.rebound:
        return None
    producer = tracer.producer(proxy)
    if producer is None or producer.sym.torch_fn is None or "opaque" in producer.sym.tags:
        return None
    ok = True

    def meta(x):
        nonlocal ok
        if isinstance(x, TensorProxy):
            probe = _eager_layout(tracer, x, facts, depth + 1)
            ok = ok and probe is not None
            return probe
        if isinstance(x, (tuple, list)):
            return type(x)(meta(v) for v in x)
        return x

    args, kwargs = meta(producer.args), {k: meta(v) for k, v in producer.kwargs.items()}
    if not ok:
        return None
    if not any(isinstance(a, torch.Tensor) for a in tree_leaves((args, kwargs))):
        kwargs["device"] = "meta"  # a factory: made where the probes live
    try:
        with torch._C.DisableTorchFunction(), _symbolic_probes(args, kwargs):
            out = producer.sym.torch_fn(*args, **kwargs)
        outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        index = next(i for i, o in enumerate(producer.proxy_outs()) if o is proxy)
        return outs[index] if outs[index].device.type == "meta" else None
    except Exception:  # noqa: BLE001 (an op or arguments meta tensors do not take: the layout stays unknown)
        return None


def _rely(info: Alias) -> None:
    """The tensor's view-or-copy answer now changes a result: the layout facts it came from join
    the trace's signature (once)."""
    if info is not None and info.facts:
        tracer = context.current_tracer()
        for fact in info.facts:
            tracer.rely_on_layout(*fact)
        info.facts = ()


def _contiguous_as(fmt):
    def is_contiguous(t):
        return t.is_contiguous(memory_format=fmt)

    is_contiguous.__name__ = f"is_contiguous_{fmt}"
    return is_contiguous


# one function per memory format (jit's cache compares facts by function)
_is_contiguous_as = {fmt: (torch.Tensor.is_contiguous if fmt is torch.contiguous_format else _contiguous_as(fmt))
                     for fmt in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d,
                                 torch.preserve_format)}


def _symbolic_probes(*values):
    """Where sizes are symbolic, the fake-tensor mode of their ShapeEnv, so a probe's meta kernels compute with the
    symbols and guard only what their answer needs (a plain meta op would pin each size it is given); else nothing."""
    leaves = []
    for v in tree_leaves(values):
        if isinstance(v, slice):  # (x[:T]: a bound may be a symbolic size)
            leaves += symbolic.symbolic_leaves((v.start, v.stop, v.step))
        elif isinstance(v, torch.Tensor):
            leaves += [n for n in v.shape if isinstance(n, torch.SymInt)]
        else:
            leaves += symbolic.symbolic_leaves(v)
    mode = symbolic.fake_tensor_mode(leaves) if leaves else None
    return mode if mode is not None else contextlib.nullcontext()


def _meta_args(values):
    """values with each proxy replaced by an empty meta tensor of its metadata (view_as(other) reads its shape)."""
    def meta(x):
        if isinstance(x, TensorProxy):
            return torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
        if isinstance(x, (tuple, list)):
            return type(x)(meta(v) for v in x)
        return x

    return meta(values)


def _meta_kwargs(kwargs) -> dict:
    return {k: _meta_args(v) for k, v in kwargs.items()}


def short_name(func) -> str:
    return torch_name(func).rsplit(".", 1)[-1]


def _is_advanced_key(key) -> bool:
    """Whether x[key] is advanced indexing, which copies in eager: a list, a bool, or a tensor other than a 0-dim
    integer one (which eager reads as an int: x[torch.tensor(1)] is a view, tracked as one made by a tensor index)."""
    return any(isinstance(k, (list, bool)) or isinstance(k, TensorProxy) and (k.ndim > 0 or k.dtype is torch.bool
                                                                              or k.dtype is torch.uint8)
               for k in (key if isinstance(key, tuple) else (key,)))


def _track_identity(func, args, kwargs, out: TensorProxy, source: TensorProxy) -> None:
    """out has source's value: in eager it is source itself or a view of all of it (so an
    in-place write through it writes all of source), a copy, or one of the two depending on
    source's layout at run time (any op not known to be one of the others)."""
    short = torch_name(func).rsplit(".", 1)[-1]
    if short in _ALWAYS_COPY:
        return
    root, steps = _root_and_steps(source)
    key = source.alias.key if source.alias is not None and source.alias.base is not None else Ellipsis
    exact = (short in _VIEW_NAMES or short in _RETURN_INPUT) and kwargs.get("memory_format") in (
        None, torch.preserve_format)
    facts = source.alias.facts if source.alias is not None else ()
    if not exact and args and args[0] is source:  # x.contiguous(): x itself or a copy, as x's layout says
        is_view, layout_facts = _view_in_eager(func, args, kwargs, root, steps)
        if is_view is not None:
            facts += layout_facts
            if not is_view:
                out.alias = Alias(copy_of=root, seen=_alias(root).version, facts=facts)
                return
            exact = True
    made_by = None if steps is not None else source.alias.made_by
    out.alias = Alias(base=root, steps=steps + (_SAME,) if steps is not None and exact else None,
                      made_by=made_by if exact else torch_name(func), seen=_alias(root).version, key=key,
                      layout_dependent=not exact, facts=facts)


def _replayable_base(info: Alias, cannot_replay) -> TensorProxy:
    """The base a view is replayed from (to refresh it, or to write through it), refusing a base
    whose value cannot be known and a view whose steps are not recorded: `cannot_replay(base)`
    says why, in the words of the operation that needed the replay."""
    base = info.base
    if base.alias.stale_message:
        raise UnsupportedOpError(base.alias.stale_message)
    if info.steps is None:
        raise UnsupportedOpError(cannot_replay(base))
    return base


def refresh(view: TensorProxy) -> None:
    """Bring a view up to date with its base: recomputed from the base's current value when the
    base was written (directly or through another view) since the view's value was computed.
    Called for every tensor traced code reads after some in-place write, and for its outputs."""
    info = view.alias
    if info is not None and info.stale_message:  # whether it changed cannot be known (_write_layout_dependent)
        raise UnsupportedOpError(info.stale_message)
    if info is not None and info.copy_of is not None:  # a copy of a tensor written since: its value would differ
        if info.seen != _alias(info.copy_of).version:  # if it were a view, so the layout that said so matters
            _rely(info)
            info.seen = _alias(info.copy_of).version
        return
    if info is None or info.base is None or info.seen == _alias(info.base).version:
        return
    _rely(info)
    base = _replayable_base(info, lambda base: (
        f"tensor {view.name} is a view of {base.name}, which was modified in place after the view was made; in "
        f"eager the view would show the new values, and this view (made by {info.made_by}) cannot be "
        f"recomputed from them. Take the view again after the in-place operation, or clone() it before."))
    value = base
    for step in info.steps:
        value = _replay(step, value)
    context.current_tracer().rebind(view, value, because=f"a write into {base.name}")
    info.seen = _alias(base).version


def _replay(step: ViewStep, parent):
    """step's view of parent, traced (parent is a new value: the view's base after a write)."""
    if step.func is None:
        return parent
    tracer = context.current_tracer()
    handler = find_handler(step.func)
    args, kwargs = (parent, *step.args), dict(step.kwargs)
    out = handler(*args, **kwargs) if handler is not None else run_opaque(step.func, args, kwargs)
    value = [o for o in tree_leaves(out) if isinstance(o, TensorProxy)][step.index]
    tracer.identities.pop(id(value), None)  # a replay is not the user's call: torch/base.py's note is not wanted
    return value


def check_fresh(args, kwargs) -> None:
    """Bring views whose base was written since up to date (`refresh`); refuse a tensor requiring
    grad read under grad mode after it was written under no_grad."""
    tracer = context.current_tracer()
    grad_enabled = torch.is_grad_enabled()
    for a in tree_leaves((args, kwargs)):
        if not isinstance(a, TensorProxy):
            continue
        if a.alias is not None and a.alias.stale_message:
            raise UnsupportedOpError(a.alias.stale_message)
        refresh(a)
        if grad_enabled and tracer.written_without_grad(a):
            # In eager the tensor is still a leaf that requires grad, now holding the new value; in the trace its
            # new value was computed under no_grad, so autograd would not reach the tensor through this use.
            raise UnsupportedOpError(
                f"'{tracer.trace.fn_name}' reads {a.origin[0] if a.origin else a.name}, which requires grad, under "
                f"grad mode after writing into it in place under torch.no_grad() (an optimizer step, say). thunderfn "
                f"cannot differentiate through the updated tensor in the same function: end the jitted function after "
                f"the update, and use the tensor in the next call.")


def _is_basic_key(key) -> bool:
    items = key if isinstance(key, tuple) else (key,)
    return all(k is None or k is Ellipsis or isinstance(k, (int, torch.SymInt, slice))
               and not isinstance(k, bool) for k in items)


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
_REFUSED = {"set_", "requires_grad_", "share_memory_", "detach_", "as_strided_", "t_",
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
                                 "which thunderfn does not trace; use the out-of-place form "
                                 f"({short[:-1]}) and its result")
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
        raise ArgumentRuntimeError(f"result type {prims.scalar_type_name(value.dtype)} can't be cast "
                                   f"to the desired output type {prims.scalar_type_name(target.dtype)}")
    if tuple(value.shape) != tuple(target.shape):
        try:
            value = clang.expand_to(value, target.shape)
        except RuntimeError:
            raise ArgumentRuntimeError(f"output with shape {list(target.shape)} doesn't match the broadcast shape "
                               f"{list(value.shape)}") from None
    return clang.maybe_convert_to_dtype(value, target.dtype)


def _changes_no_gradient(tracer, target, requires_grad=True) -> bool:
    """Whether x.requires_grad_(requires_grad) changes no gradient the function computes: x is a value it
    computed (not the caller's tensor), and it asks for gradients. In eager, where x already requires grad
    the call does nothing; where it does not, x becomes a leaf nothing flows into, whose own gradient the
    caller cannot see."""
    return bool(requires_grad) and tracer.real_tensor(target) is None


def run_in_place(func, args, kwargs):
    """Trace an in-place torch call on a proxy (or a call with out=/inplace=True)."""
    settle_views()
    tracer = context.current_tracer()
    name = torch_name(func)
    short = name.rsplit(".", 1)[-1]
    if short.startswith("_foreach_"):  # one in-place op per tensor of the lists (torch/foreach.py)
        return find_handler(func)(*args, **kwargs)
    target = args[0]
    if not isinstance(target, TensorProxy):
        raise UnsupportedOpError(f"{name} mutates {type(target).__name__}, not a tensor")
    if short == "requires_grad_" and _changes_no_gradient(tracer, target, *args[1:], **kwargs):
        return target  # (a forward hook of Hugging Face's gradient checkpointing does this to embeddings' outputs)
    check_fresh(args, kwargs)
    if short in ("resize_", "resize_as_"):
        return _resize_in_place(name, target, *args[1:], **kwargs)
    info = target.alias
    if info is not None and info.overlapping and short != "__setitem__":
        raise ArgumentRuntimeError(_OVERLAP_MESSAGE)
    if short == "__setitem__" and isinstance(args[2], TensorProxy) and args[2].alias is not None and (
            args[2].alias.base is target and args[2].alias.key == args[1]):
        return None  # x[k] = v where v is x[k], already written back when v was mutated: nothing to do
    if info is not None and info.layout_dependent:
        return _write_layout_dependent(tracer, func, name, short, args, kwargs)
    if info is not None and info.base is not None:
        check_writable(target, name)
    new_value = _cast_like_target(_functional(func, short, args, kwargs), target, name)
    rebind(target, new_value, because=name)
    return target if short != "__setitem__" else None


def _resize_in_place(name: str, target, *size, memory_format=None):
    """x.resize_(size) or x.resize_as_(other): in eager x becomes a tensor of that size over its storage. To its own
    size, without a memory format, x stays as it is; to another size the tensor's shape changes in place, which
    thunderfn does not trace (the new shape's elements are x's storage read in memory order)."""
    if len(size) == 1 and isinstance(size[0], (TensorProxy, tuple, list)):  # resize_as_(other), resize_((sizes))
        size = tuple(size[0].shape if isinstance(size[0], TensorProxy) else size[0])
    if target.requires_grad:
        raise ArgumentRuntimeError("cannot resize variables that require grad")
    tracer = context.current_tracer()
    if torch.is_grad_enabled() and dtypes.is_inexact(target.dtype) and any(p.requires_grad for p in tracer.trace.args):
        # a value computed from them requires grad in eager, and eager refuses to resize it; the trace does not
        # say which values those are
        raise UnsupportedOpError(
            f"{name} on {target.name}, a value computed while inputs require grad: eager refuses to resize a tensor "
            f"that requires grad, and tracing does not know whether {target.name} does. Resize a detached tensor, "
            f"or under torch.no_grad()")
    if tuple(size) == tuple(target.shape) and memory_format is None:
        return target
    raise UnsupportedOpError(
        f"{name} changes {target.name}'s shape in place (from {list(target.shape)} to {list(size)}"
        f"{'' if memory_format is None else f', memory format {memory_format}'}), which thunderfn does not trace; "
        f"use the out-of-place {target.name}.reshape(...) (or a new tensor) and its result, or call it outside the "
        f"jitted function")


def _write_layout_dependent(tracer, func, name, short, args, kwargs):
    """An in-place write into x.contiguous() (or x.reshape(...), ...) where x is a tensor the
    function computed, whose layout tracing does not know: in eager the write goes into x or into
    a copy. The write goes to the result, and neither x nor its views may be read afterwards. (For
    an input or a captured tensor the layout is known, and relied on: see _view_in_eager; this
    refuses only where that probe could not run.)"""
    target = args[0]
    root = target.alias.base
    if tracer.real_tensor(root) is not None:
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
    _alias(root).version += 1  # its views are out of date too, and refuse to be read (refresh); not target
    target.alias.seen = root.alias.version
    return target if short != "__setitem__" else None


def run_with_output_argument(handler, func, args, kwargs, out):
    """`torch.add(a, b, out=c)`: compute, then write into c as c.copy_ would (same dtype rules)."""
    settle_views()
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
    if out.alias is not None and out.alias.base is not None:
        check_writable(out, f"{torch_name(func)}(out=...)")
    rebind(out, _cast_like_target(result, out, torch_name(func)), because=f"{torch_name(func)}(out=...)")
    return out


def run_with_inplace_flag(handler, func, args, kwargs):
    """`F.relu(x, inplace=True)`: the out-of-place op, then x rebound to its result."""
    settle_views()
    kwargs = dict(kwargs, inplace=False)
    target = args[0]
    check_fresh(args, kwargs)
    if target.alias is not None and target.alias.base is not None:
        check_writable(target, f"{torch_name(func)}(inplace=True)")
    result = handler(*args, **kwargs)
    rebind(target, _cast_like_target(result, target, torch_name(func)), because=f"{torch_name(func)}(inplace=True)")
    return target


def is_in_place(func) -> bool:
    short = torch_name(func).rsplit(".", 1)[-1]
    return (short.endswith("_") and not short.startswith("__")) or short in _IN_PLACE_DUNDERS or short == "__setitem__"


def check_writable(view: TensorProxy, what: str) -> None:
    """Refuse, before anything is written, a write through a view that cannot be written back
    into its base (layout-dependent views are _write_layout_dependent's)."""
    info = view.alias
    if info.layout_dependent:
        return
    base = _replayable_base(info, lambda base: (
        f"{what} mutates {view.name}, a view of {base.name} made by {info.made_by}, which "
        f"{_NOT_WRITABLE.get(info.made_by.rpartition('.')[2], 'tracing cannot replay')}; writing the change back "
        f"into {base.name} is not supported. Write into {base.name} itself, or into a clone() of the view."))
    for step in info.steps:
        short = torch_name(step.func).rsplit(".", 1)[-1] if step.func is not None else ""
        if short in _NOT_WRITABLE or (short == "view" and any(isinstance(a, torch.dtype) for a in step.args)):
            why = _NOT_WRITABLE.get(short, "reinterprets the bits")
            raise UnsupportedOpError(
                f"{what} mutates {view.name}, a view of {base.name} made by {torch_name(step.func)}, which {why}; "
                f"writing the change back into {base.name} is not supported. Write into {base.name} itself, or "
                f"into a clone() of the view.")


def _written_back(parent, step: ViewStep, value):
    """parent with value written over the elements step's view of it picks."""
    if step.func is None:
        return value
    short = torch_name(step.func).rsplit(".", 1)[-1]
    if short == "__getitem__" and _is_basic_key(step.args[0]):
        return setitem(parent, step.args[0], value)
    if short in _RESHAPING:
        return reshape(value, tuple(parent.shape))
    if short in _PERMUTING:
        order = _permutation(step, parent)
        return permute(value, tuple(order.index(d) for d in range(len(order))))
    return scatter_into_view(parent, lambda positions: _replay(step, positions), value)


def _permutation(step: ViewStep, parent) -> list:
    """The dimension order a dimension-permuting view op makes: read off its strides on a meta
    tensor whose dimensions all have different strides."""
    with torch._C.DisableTorchFunction():  # a real (meta) tensor, not traced
        probe = torch.empty(tuple(range(2, parent.ndim + 2)), device="meta")
        out = step.func(probe, *step.args, **dict(step.kwargs))
    strides = probe.stride()
    return [strides.index(s) for s in out.stride()]


def rebind(proxy: TensorProxy, value: TensorProxy, *, because: str) -> None:
    """An in-place write into proxy, traced: it denotes value from now on (Tracer.rebind). A view
    written into writes its base (step by step back from the view), whose other views are then
    out of date until read (`refresh`)."""
    settle_views()
    tracer = context.current_tracer()
    info = proxy.alias
    _rely(info)  # written: whether it is a view (of an input) or a copy now changes what the caller sees
    if info is not None and info.base is not None and not info.layout_dependent:
        check_writable(proxy, because)
        base = info.base
        parents = [base]
        for step in info.steps[:-1]:
            parents.append(_replay(step, parents[-1]))
        new_base = value
        for step, parent in zip(reversed(info.steps), reversed(parents)):
            new_base = _written_back(parent, step, new_base)
        rebind(base, new_base, because=f"{because} on its view {proxy.name}")
        tracer.rebind(proxy, value, because=because)
        info.seen = _alias(base).version
        return
    tracer.rebind(proxy, value, because=because)
    if info is not None:
        info.version += 1
