"""Batching: vmap.

The function is traced for one example (each batched input replaced by a proxy without its
batch dimension) into a scratch scope, and the recorded region is walked forward: every
value carries a batch dimension (an int) or None (the same for every example). A bound
symbol none of whose arguments is batched is kept as it is, once for the whole batch; one
with a batched argument is replaced by what its batching rule (core/rules.py's record, written in
its op family's module under transforms/rules/) emits; a tf.custom_vjp function becomes a custom_vjp of its
vmapped fwd and bwd, a tf.custom_jvp one a custom_jvp of its vmapped function and rule; a
symbol without a rule is batched through its decomposition (its subsymbols); an opaque torch
op through torch.func.vmap when the compiled function runs; any other raises BatchingError
(transforms/resolve.py gives the order, the same in every transform). So the batched program
is itself a trace, with no loop over the examples, and every other transform applies to it:
jit(vmap(f)), grad(vmap(f)), vmap(grad(f)), vmap(vmap(f)), jvp(vmap(f)).

Called with real tensors, the transformed function jits its traced form (one trace per input
signature, cached); called while an outer trace is being built, it emits into that trace.
"""
from __future__ import annotations

import functools
import weakref
from typing import Callable

import optree
import torch

from thunderfn import clang, prims
from thunderfn.core import context
from thunderfn.core.decorators import takes_arguments_of, with_options_form
from thunderfn.core.interception import tensors_by_position
from thunderfn.core.proxies import TensorProxy, entry_by_name, is_real_tensor
from thunderfn.core.pytree import (
    of_leaves,
    output_leaves,
    tree_flatten,
    tree_flatten_with_path,
    tree_leaves,
    tree_map,
    tree_unflatten,
)
from thunderfn.core.rules import RecordedCall, rules_of
from thunderfn.core.symbol import Symbol
from thunderfn.core.trace import up_to_date
from thunderfn.errors import (
    ArgumentIndexError,
    ArgumentRuntimeError,
    ArgumentTypeError,
    ArgumentValueError,
    BatchingError,
    TransformInputError,
)
from thunderfn.torch import inplace
from thunderfn.torch.opaque import _meta, is_random, named_functorch_refusal
from thunderfn.transforms.autodiff import _compiled, as_trace_constants
from thunderfn.transforms.custom_jvp import custom_jvp, primal_of, spec_of
from thunderfn.transforms.custom_vjp import custom_vjp
from thunderfn.transforms.resolve import Transform, Way, resolve, without_rule
from thunderfn.transforms.rules.common import move_batch_dim
from thunderfn.transforms.rules.define import register_vmap

RANDOMNESS = ("error", "different", "same")


# -- opaque torch ops: torch.func.vmap batches them when the compiled function runs ------------
def torch_vmap(fn, in_dims, args, kwargs, randomness="error", batch_size=None):
    """fn(*args, **kwargs) over the batch: torch.func.vmap with one in_dim per tensor leaf of
    (args, kwargs) (None for the rest), every output batched at 0. A random op with no batched
    input (randomness "different": a draw per example) is mapped over an empty batch_size x 0
    tensor it ignores, since torch.func.vmap needs one batched input to know the batch size."""
    leaves, spec = tree_flatten((args, kwargs))
    positions = [i for i, d in enumerate(in_dims) if d is not None]
    if not positions and randomness == "different":
        # shared tensor inputs, a draw per example: each is given to every example as a batched (expanded)
        # tensor, which its draws then fill per example (torch.func refuses an in-place draw into a shared
        # tensor, as F.dropout's mask, drawn into empty_like(x), would be)
        positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        in_dims = [0 if i in positions else None for i in range(len(leaves))]
        leaves = [x.expand(batch_size, *x.shape) if i in positions else x for i, x in enumerate(leaves)]
    call, rebuild = output_leaves(of_leaves(fn, leaves, spec, positions))
    try:
        if not positions:
            return rebuild(torch.func.vmap(lambda _: call(), randomness=randomness)(torch.empty(batch_size, 0)))
        return rebuild(torch.func.vmap(call, in_dims=tuple(in_dims[i] for i in positions), randomness=randomness)(
            *(leaves[i] for i in positions)))
    except RuntimeError as e:  # torch.func's own refusals, named as ours (an op drawing random numbers inside)
        named_functorch_refusal(fn, e)
        if any(w in str(e) for w in _NO_BATCHED_FORM) and positions and not is_random(fn):
            return rebuild(_stacked_examples(fn, call, [leaves[i] for i in positions], [in_dims[i] for i in positions]))
        if str(e).startswith("vmap:") or "atching rule" in str(e) or "batched tensor" in str(e) or (
                positions and not is_random(fn) and _runs_on_each_example(call, leaves, positions, in_dims)):
            raise BatchingError(f"vmap cannot batch {getattr(fn, '__name__', fn)} (an opaque torch op, batched by "
                                f"torch.func.vmap): {str(e).splitlines()[0]}") from None
        raise  # (the op itself rejects these inputs, as it would in a loop over the examples)


def _runs_on_each_example(call, leaves, positions, in_dims) -> bool:
    """Whether the op runs on every example of the batch: if so, an error torch.func.vmap raised is its own failure
    to batch the op (torch.linalg.lstsq with a vector right-hand side), not the inputs' fault. Where an example
    raises, that example's error is raised, as a loop over the examples would."""
    batch = leaves[positions[0]].shape[in_dims[positions[0]]]
    for k in range(batch):
        call(*(leaves[i].select(in_dims[i], k) for i in positions))
    return True


# torch.func.vmap's words for an op it has no batched form of at all, not even its fallback loop (an output whose
# size depends on values: unique; an op the fallback cannot run: histogramdd)
_NO_BATCHED_FORM = ("We could not generate a fallback", "can output dynamic shape")


def _stacked_examples(fn, call, batched: list, dims: list) -> list:
    """call's output leaves for each example (the batched leaves' `x.select(d, k)`), stacked at 0: torch.func's
    own fallback, a loop, for an op it cannot loop over. The examples' outputs must agree in shape (a size
    counted from values may differ): refused by name when they do not."""
    batch = batched[0].shape[dims[0]]
    outs = [call(*(x.select(d, k) for x, d in zip(batched, dims))) for k in range(batch)]
    if not outs:
        raise BatchingError(f"vmap cannot batch {getattr(fn, '__name__', fn)} over an empty batch: torch.func.vmap "
                            f"has no batched form of it, and an empty batch shows no example's output shape")
    stacked = []
    for j in range(len(outs[0])):
        shapes = [tuple(o[j].shape) for o in outs]
        if len(set(shapes)) > 1:
            raise BatchingError(f"vmap: {getattr(fn, '__name__', fn)} gives outputs of shapes {shapes} in the examples "
                                f"of the batch (a size that depends on their values), which a batched tensor cannot "
                                f"hold. Keep that size the same in every example, or loop over the examples.")
        stacked.append(torch.stack([o[j] for o in outs]))
    return stacked


def _torch_vmap_meta(fn, in_dims, args, kwargs, randomness="error", batch_size=None):
    batch = next((leaf.shape[d] for leaf, d in zip(tree_leaves((args, kwargs)), in_dims) if d is not None), batch_size)
    example = tree_unflatten(tree_flatten((args, kwargs))[1], [
        TensorProxy.like(leaf, shape=leaf.shape[:d] + leaf.shape[d + 1:]) if d is not None else leaf
        for leaf, d in zip(tree_leaves((args, kwargs)), in_dims)])
    # a vmap inside vmap batches the inner one's torch_vmap call, whose outputs its own meta knows
    out = _torch_vmap_meta(*example[0], **example[1]) if fn is torch_vmap else _meta(fn, example[0], example[1])
    return tree_unflatten(tree_flatten(out)[1],
                          [TensorProxy(shape=(batch,) + tuple(o.shape), dtype=o.dtype, device=o.device)
                           for o in tree_leaves(out)])


def _torch_vmap_symbol(name: str, tags: set) -> Symbol:
    return Symbol(name, f"vmap.{name}", meta=_torch_vmap_meta, is_prim=True, print_name="torch_vmap",
                  namespace={"torch_vmap": torch_vmap}, eager=torch_vmap, torch_fn=torch_vmap, tags=frozenset(tags))


torch_vmap_op = _torch_vmap_symbol("torch_vmap", {"opaque"})
# a random op batched: its draws are kept even when unused, as the op's own symbol keeps them
random_torch_vmap_op = _torch_vmap_symbol("random_torch_vmap", {"opaque", "random", "no_dce"})


# opaque ops whose meaning is a memory address: refused under vmap rather than given one of
# several possible meanings
_READS_MEMORY_LAYOUT = frozenset({"as_strided", "as_strided_copy", "as_strided_scatter"})


class BatchedValue:
    """A traced tensor of the batched program and where its batch dim is (None: the same for every
    example, so it has no batch dim). A leaf of trace_vmap's output (optree leaves unknown classes whole)."""
    __slots__ = ("value", "dim")

    def __init__(self, value: TensorProxy, dim):
        self.value, self.dim = value, dim


# -- the driver ---------------------------------------------------------------------------------


def _batched(x, values: dict):
    return optree.tree_map(lambda v: values.get(v.name, v) if isinstance(v, TensorProxy) else v, x,
                           none_is_leaf=True, namespace="thunderfn")


class _Batching:
    """The state of one vmap's walk: each per-example proxy's batched value and batch dim, by name."""

    def __init__(self, batch_size: int, randomness: str):
        self.batch_size, self.randomness = batch_size, randomness
        self.values: dict = {}
        self.dims: dict = {}
        # values drawn per example by a random op with shared inputs, or computed from such draws alone: one
        # written in place into a shared tensor is torch's "different inplace randomness on an unbatched tensor"
        self.drawn_per_example: set = set()

    def bind(self, per_example: TensorProxy, value: TensorProxy, dim: int) -> None:
        self.values[per_example.name], self.dims[per_example.name] = value, dim

    def is_batched(self, bsym) -> bool:
        return any(isinstance(a, TensorProxy) and a.name in self.dims for a in bsym.flat_args())

    def run(self, bsym) -> None:
        batched_args = [a.name for a in bsym.flat_args() if isinstance(a, TensorProxy) and a.name in self.dims]
        if batched_args and all(n in self.drawn_per_example for n in batched_args):  # (uniform_ scales its draw)
            self.drawn_per_example.update(o.name for o in bsym.flat_outs() if isinstance(o, TensorProxy))
        # a random op, or a composite that draws inside (F.dropout): the mode decides
        if _draws_random(bsym) and self._ran_by_randomness(bsym):
            return
        if not self.is_batched(bsym):  # the same for every example: computed once
            context.current_tracer().emit(bsym)
            return
        way = resolve(bsym, VMAP)
        if way is Way.CUSTOM:
            if _is_custom_vjp(bsym):
                self._custom_vjp(bsym)
            else:
                self._custom_jvp(bsym)
            return
        if way is Way.RULE:  # an executor's operator's rule too, entered by register_operator
            if self._apply(rules_of(bsym.sym.id).batch, bsym):
                return
            way = without_rule(bsym, VMAP)  # the rule declined this call
        if way is Way.DECOMPOSITION:
            for sub in bsym.subsymbols:
                self.run(sub)
        elif way is Way.OPAQUE:
            self._opaque(bsym)
        else:
            raise VMAP.refusal(bsym)

    def _ran_by_randomness(self, bsym) -> bool:
        """Refuses bsym, which draws random values, where the randomness mode forbids it, and runs it where the
        mode makes its draws per example; False where it is batched as any other op."""
        if self.randomness == "error":
            raise BatchingError(
                f"vmap: called random operation while in randomness error mode. Please either use the 'same' or "
                f"'different' randomness flags on vmap or perform the randomness operation out of vmap (the random "
                f"operation: {bsym.sym.print_name})")
        # "different": every draw is per example, even one whose inputs are shared; "same": a draw
        # with shared inputs is made once, one with batched inputs as torch.func.vmap makes it
        if "random" in bsym.sym.tags and (self.randomness == "different" or self.is_batched(bsym)):
            if not self.is_batched(bsym):
                self.drawn_per_example.update(o.name for o in bsym.flat_outs() if isinstance(o, TensorProxy))
            self._opaque(bsym)
            return True
        if "random" not in bsym.sym.tags and self.randomness == "different" and not self.is_batched(bsym):
            for sub in bsym.subsymbols:  # shared inputs, but its draws inside are per example
                self.run(sub)
            return True
        return False

    def _apply(self, rule, bsym) -> bool:
        """Batch bsym by its rule; False where the rule declines the call (NotImplemented)."""
        args, kwargs = bsym.args, bsym.kwargs
        if any(isinstance(v, TensorProxy) for v in tree_leaves(kwargs)) and bsym.sym.fn is not None:
            args, kwargs = tensors_by_position(bsym.sym, args, kwargs)  # rules take tensors by position
        dims = tuple(entry_by_name(a, self.dims) for a in args)
        result = rule.batch(RecordedCall(bsym.sym, _batched(args, self.values), kwargs, bsym.output), dims)
        if result is NotImplemented:
            return False
        out, out_dims = result
        if isinstance(bsym.output, TensorProxy):
            self.bind(bsym.output, out, out_dims)
        else:
            for o, v, d in zip(bsym.flat_outs(), tree_leaves(out), tree_leaves(out_dims)):
                if isinstance(o, TensorProxy):
                    self.bind(o, v, d)
        return True

    def _custom_vjp(self, bsym) -> None:
        """A tf.custom_vjp function batched as a custom_vjp whose fwd and bwd are vmapped (JAX's rule):
        batched through its decomposition, its hand-written VJP would be lost under grad(vmap(f))."""
        original = bsym.sym.fn.__self__
        if original.vmap_rule is not None:  # a user Function's vmap staticmethod, or its refusal
            original.vmap_rule(self, bsym)
            return
        if any(isinstance(v, TensorProxy) for v in tree_leaves(bsym.kwargs)):
            raise BatchingError(f"vmap cannot batch {bsym.sym.print_name}, a tf.custom_vjp function called with a "
                                f"tensor by keyword, yet; pass its tensors by position")
        leaves, spec = tree_flatten(bsym.args)
        arg_axes = tree_unflatten(spec, [entry_by_name(x, self.dims) for x in leaves])
        batched = _batched_custom_vjp(original, arg_axes, bsym.output)
        out = batched._symbol(*_batched(bsym.args, self.values), **bsym.kwargs)
        passed_through = {x.name for x in leaves if isinstance(x, TensorProxy) and x.name not in self.dims}
        for o, v in zip(tree_leaves(bsym.output), tree_leaves(out)):
            if isinstance(o, TensorProxy) and o.name not in passed_through:  # an unbatched input stays unbatched
                self.bind(o, v, 0)

    def _custom_jvp(self, bsym) -> None:
        """A tf.custom_jvp function batched as a custom_jvp of its vmapped function and vmapped rule
        (JAX's rule), so that its derivative stays the rule's under grad(vmap(f)) and jvp(vmap(f))."""
        axes = tuple(entry_by_name(x, self.dims) for x in bsym.args)  # its arguments are flat leaves
        batched = _batched_custom_jvp(primal_of(bsym.sym), spec_of(bsym.sym), axes, bsym.output)
        out = batched(*_batched(bsym.args, self.values))
        passed_through = {x.name for x in bsym.args if isinstance(x, TensorProxy) and x.name not in self.dims}
        for o, v in zip(tree_leaves(bsym.output), tree_leaves(out)):
            if isinstance(o, TensorProxy) and o.name not in passed_through:
                self.bind(o, v, 0)

    def _opaque(self, bsym) -> None:
        if bsym.sym.name in _READS_MEMORY_LAYOUT:
            raise BatchingError(
                f"vmap cannot batch {bsym.sym.print_name}: it addresses an example's memory by strides and a storage "
                f"offset, and an example of a batch has no memory of its own (its strides and offset are the batch's), "
                f"so no batched form means what the call means alone. Use view ops (reshape, narrow, unfold, "
                f"diagonal) inside vmap, or call it outside")
        in_dims = tuple(entry_by_name(x, self.dims) for x in tree_leaves((bsym.args, bsym.kwargs)))
        args, kwargs = _batched((bsym.args, bsym.kwargs), self.values)
        # the mode goes to every op: an opaque op may draw random numbers inside (a fractional max pool)
        op = random_torch_vmap_op if "random" in bsym.sym.tags else torch_vmap_op
        out = op(bsym.sym.torch_fn, in_dims, args, kwargs, self.randomness, self.batch_size)
        for o, v in zip(tree_leaves(bsym.output), tree_leaves(out)):  # (an output None has no leaf on either side)
            if isinstance(o, TensorProxy):
                self.bind(o, v, 0)


def _is_custom_vjp(bsym) -> bool:
    return isinstance(getattr(bsym.sym.fn, "__self__", None), custom_vjp)


def _is_custom(bsym) -> bool:
    """A tf.custom_vjp or tf.custom_jvp function (a user autograd.Function is a custom_vjp): batched as
    one of its vmapped parts, so that its rule still holds under grad(vmap(f)) and jvp(vmap(f))."""
    return _is_custom_vjp(bsym) or primal_of(bsym.sym) is not None


def _refusal(bsym) -> BatchingError:
    if bsym.sym.executor is not None:  # an executor's operator: its rule comes with its registration
        how = (f"register it with one: {bsym.sym.executor.name}.register_operator('{bsym.sym.name}', ..., "
               f"batch_rule=rule)")
    else:
        how = (f"@tf.extend.defbatch({bsym.sym.print_name}.id) on a function batch(call, dims) "
               f"(tf.extend.primitive's batch=)")
    return BatchingError(
        f"vmap cannot batch {bsym.sym.print_name}: it has no batching rule, no decomposition and no torch "
        f"function to batch with torch.func.vmap. Give it a rule (docs/vmap.md): {how}; or call it outside "
        f"the vmapped function.")


# vmap as transforms/resolve.py sees it: no symbol is inert (one with no batched input never gets here),
# an operator's like= function does not stand in for it (its batch_rule does)
VMAP = Transform("vmap", "batch", _refusal, custom=_is_custom)


def _draws_random(bsym) -> bool:
    """Whether bsym draws from torch's generator: a random op, or a composite with one in its decomposition."""
    return "random" in bsym.sym.tags or any(_draws_random(sub) for sub in bsym.subsymbols)


# Each custom_vjp's batched forms, by in_axes: kept alive with it, since the rule table holds a
# custom_vjp's rule only while the custom_vjp lives. A form reaches its original only weakly: held
# strongly, the dictionary's value would keep its own key, and the original, alive for good.
_batched_forms: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _batched_custom_vjp(original: custom_vjp, arg_axes, example_output) -> custom_vjp:
    out_axes = optree.tree_map(lambda o: 0 if isinstance(o, TensorProxy) else None, example_output,
                               none_is_leaf=True, namespace="thunderfn")
    key = repr((arg_axes, out_axes))
    forms = _batched_forms.setdefault(original, {})
    if key in forms:
        return forms[key]
    nondiff = original.nondiff_argnums
    diff_axes = [axes for i, axes in enumerate(arg_axes) if i not in nondiff]
    residual_axes = out_axes[1]
    owner = weakref.ref(original)

    # owner's run_fwd, not its fwd: inside, a call of original is its primal (batched as fn is),
    # where recorded as original's symbol again it would be batched by this form again, without end;
    # and it reads fwd when traced, as bwd reads bwd, so this cached form follows a later defvjp
    def fwd(*args, **kwargs):
        return owner().run_fwd(*args, **kwargs)

    def fn(*args, **kwargs):  # a user Function's fn holds the Function (transforms/user_functions.py)
        return owner().fn(*args, **kwargs)

    fn.__name__, fwd.__name__ = original._name, f"{original._name}_fwd"

    def bwd(*args):
        nondiff_args, residuals, g = args[:-2], args[-2], args[-1]
        cts = vmap(owner().bwd, in_axes=(None,) * len(nondiff_args) + (residual_axes, 0), out_axes=0)(
            *nondiff_args, residuals, g)
        # every cotangent came back batched at 0: a shared (unbatched) argument's is summed over the batch
        return tuple(optree.tree_map(_to_arg_axis, ct, _axes_like(axes, ct), namespace="thunderfn")
                     if ct is not None else None for ct, axes in zip(cts, diff_axes))

    batched = custom_vjp(vmap(fn, in_axes=arg_axes), nondiff_argnums=nondiff)
    batched.defvjp(vmap(fwd, in_axes=arg_axes, out_axes=out_axes), bwd)
    forms[key] = batched
    return batched


def _batched_custom_jvp(original: custom_jvp, spec, axes: tuple, example_output) -> custom_jvp:
    """original over the flat argument leaves (a call's arguments, structured by spec) batched at
    axes: its function and its rule vmapped (a tangent is batched where its primal is)."""
    out_axes = optree.tree_map(lambda o: 0 if isinstance(o, TensorProxy) else None, example_output,
                               none_is_leaf=True, namespace="thunderfn")
    key = repr((spec, axes, out_axes))
    forms = _batched_forms.setdefault(original, {})
    if key in forms:
        return forms[key]

    owner = weakref.ref(original)  # weakly, as a custom_vjp's forms

    def per_example(*leaves):
        return owner().fn(*tree_unflatten(spec, list(leaves)))

    def per_example_rule(primals, tangents):
        nondiff, diff_primals = owner().split_args(tree_unflatten(spec, list(primals)))
        _, diff_tangents = owner().split_args(tree_unflatten(spec, list(tangents)))
        return owner().jvp(*nondiff, diff_primals, diff_tangents)

    batched = custom_jvp(vmap(per_example, in_axes=axes))
    batched.defjvp(vmap(per_example_rule, in_axes=(axes, axes), out_axes=(out_axes, out_axes)))
    forms[key] = batched
    return batched


def _axes_like(axes, ct):
    """axes (a prefix) expanded to ct's structure."""
    return tree_unflatten(tree_flatten(ct)[1],
                          [axis for _, _, axis in _prefix_leaves(axes, ct, "cotangent", "in_axes")])


def _to_arg_axis(ct, axis):
    if not isinstance(ct, TensorProxy):
        return ct
    return prims.sum(ct, (0,)) if axis is None else move_batch_dim(ct, 0, axis)


def trace_vmap(fn: Callable, args: tuple, in_dims: list, batch_size: int, randomness: str):
    """While a trace is being built: fn traced for one example and batched into it. `in_dims` has
    one batch dim (or None) per leaf of args. Returns fn's output pytree, each tensor leaf as
    a BatchedValue (dim None for a value the same for every example), and the in-place
    updates of batched inputs: {leaf index: its new value} (for the caller to write back, as
    it knows whether args are the caller's tensors or one chunk's slices of them)."""
    tracer = context.current_tracer()
    batching = _Batching(batch_size, randomness)
    leaves, spec = tree_flatten(args)
    examples = []
    for leaf, d in zip(leaves, in_dims):
        if d is None:
            examples.append(leaf)
            continue
        example = TensorProxy(shape=tuple(leaf.shape[:d]) + tuple(leaf.shape[d + 1:]), dtype=leaf.dtype,
                              device=leaf.device, requires_grad=leaf.requires_grad)
        batching.bind(example, leaf, d)
        examples.append(example)
    names = [x.name if isinstance(x, TensorProxy) else None for x in examples]  # an in-place op renames
    with tracer.scope() as recorded, context.tracing_vmap_body():
        # a constant output: the same for every example
        out = as_trace_constants(up_to_date(fn(*tree_unflatten(spec, examples))))
    for bsym in recorded:
        batching.run(bsym)
    updates = _in_place_updates(tracer, batching, leaves, examples, names, in_dims)
    return optree.tree_map(
        lambda o: BatchedValue(batching.values.get(o.name, o), batching.dims.get(o.name))
        if isinstance(o, TensorProxy) else o, out, namespace="thunderfn"), updates


def _in_place_updates(tracer, batching: _Batching, leaves, examples, names, in_dims) -> dict:
    """An in-place op on an example (x.add_(y)) rebinds its proxy to the new value: the batched
    input's new value is the batched new value (at the input's batch dim), so the caller's
    tensor is written as torch.func.vmap writes it. A batched value written into a tensor that
    is the same for every example (an input with in_axes None, a captured tensor) has no place
    to go: torch.func refuses it too."""
    updates = {}
    for i, (leaf, example, name, d) in enumerate(zip(leaves, examples, names, in_dims)):
        if d is None or example.name == name:
            continue
        value, dim = batching.values.get(example.name, example), batching.dims.get(example.name)
        if dim is None:  # the same new value for every example
            value = prims.broadcast_in_dim(value, tuple(leaf.shape), tuple(i for i in range(leaf.ndim) if i != d))
        else:
            value = move_batch_dim(value, dim, d)
        updates[i] = value
    rebound = [live for _, live in tracer.mutated.values()] + [
        x for x, name, d in zip(leaves, names, in_dims) if d is None and isinstance(x, TensorProxy) and x.name != name]
    for live in rebound:
        if live.name in batching.drawn_per_example:
            raise BatchingError(
                "vmap: Cannot ask for different inplace randomness on an unbatched tensor. This will appear like "
                "same randomness. If this is necessary for your usage, please file an issue with functorch. "
                "(per-example draws are written in place into a tensor that is the same for every example, "
                "in_axes None or captured: batch it, or draw out of place)")
        if live.name in batching.dims:
            raise BatchingError(
                f"vmap: an in-place operation writes a batched value into {live.name}, a tensor that is the same for "
                f"every example (in_axes None, or captured). Batch it too (an in_axes entry), or use the op's "
                f"out-of-place form.")
    return updates


# -- in_axes and out_axes ------------------------------------------------------------------------
def _key(entry) -> str:
    return f"[{entry!r}]"


# torch.func's names for in_axes and out_axes, and for what they describe: its sentences use them
_TORCH_NAMES = {"in_axes": ("in_dims", "inputs"), "out_axes": ("out_dims", "outputs")}


def _not_compatible(what: str) -> str:
    dims, values = _TORCH_NAMES.get(what, (what, "values"))
    return f"vmap: {dims} is not compatible with the structure of `{values}`."


def _prefix_leaves(spec, tree, path: str, what: str) -> list:
    """(key path, leaf, axis) for every leaf of tree, the axis taken from `spec`, a pytree prefix
    of tree (an int or None covers everything below it)."""
    if spec is None or isinstance(spec, int) and not isinstance(spec, bool):
        return [(path + "".join(_key(k) for k in keys), leaf, spec)
                for keys, leaf in zip(*tree_flatten_with_path(tree)[:2])]
    if isinstance(spec, (tuple, list)) and not hasattr(spec, "_fields"):
        if not isinstance(tree, (tuple, list)) or len(tree) != len(spec):
            raise ArgumentValueError(f"{_not_compatible(what)} {what} at {path or 'the top level'} is a "
                                     f"{type(spec).__name__} of {len(spec)} entries, which does not "
                                     f"match the value there ({type(tree).__name__}"
                                     f"{f' of {len(tree)}' if isinstance(tree, (tuple, list)) else ''}); "
                                     f"give one entry per element, or one int/None for all of it")
        return [x for i, (s, t) in enumerate(zip(spec, tree)) for x in _prefix_leaves(s, t, f"{path}[{i}]", what)]
    if isinstance(spec, dict):
        if not isinstance(tree, dict) or set(tree) != set(spec):
            raise ArgumentValueError(f"{_not_compatible(what)} {what} at {path or 'the top level'} is a dict with keys "
                                     f"{sorted(map(repr, spec))}, which does not match the value there "
                                     f"({type(tree).__name__}"
                                     f"{f' with keys {sorted(map(repr, tree))}' if isinstance(tree, dict) else ''})")
        try:  # the order optree flattens a dict in
            keys = sorted(spec)
        except TypeError:
            keys = list(spec)
        return [x for k in keys for x in _prefix_leaves(spec[k], tree[k], f"{path}[{k!r}]", what)]
    if what == "out_axes":
        torch_says = ("vmap: `out_dims` must be an int, None or a python collection of ints representing where in the "
                      "outputs the vmapped dimension should appear.")
    else:
        torch_says = f"vmap: Got in_dim={spec} for an input but in_dim must be either an integer dimension or None."
    raise ArgumentValueError(f"{torch_says} ({what} at {path or 'the top level'} must be an int, None, or a "
                             f"tuple/list/dict of them matching the value's structure, got {spec!r})")


def _in_dims(in_axes, args: tuple) -> tuple[list, int]:
    """One batch dim (non-negative, or None) per leaf of args, and the batch size."""
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    if not (in_axes is None or isinstance(in_axes, (int, tuple, dict))) or isinstance(in_axes, bool):
        raise ArgumentValueError(f"vmap: expected `in_dims` to be int or a (potentially nested) tuple matching the "
                                 f"structure of inputs, got: {type(in_axes)}. (in_axes: an int, None, or a "
                                 f"tuple/list/dict of them)")
    if not args:
        raise ArgumentValueError("vmap: got no inputs. Maybe you forgot to add inputs, or you are trying to vmap over "
                                 "a function with no inputs. The latter is unsupported.")
    if isinstance(in_axes, tuple) and len(in_axes) != len(args):
        raise ArgumentValueError(f"{_not_compatible('in_axes')} in_axes is a tuple of {len(in_axes)} entries but the "
                                 f"function was called with {len(args)} positional arguments; give one entry per "
                                 "positional argument")
    spec = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    dims, sizes = [], []
    for path, leaf, axis in _prefix_leaves(spec, args, "args", "in_axes"):
        if axis is None:
            dims.append(None)
            continue
        if not isinstance(leaf, TensorProxy):
            raise ArgumentValueError(f"vmap: Got in_dim={axis} for an input but the input is of type {type(leaf)}. "
                                     f"We cannot vmap over non-Tensor arguments, please use None as the respective "
                                     f"in_dim ({path})")
        if not -leaf.ndim <= axis < leaf.ndim:
            raise ArgumentValueError(f"vmap: Got in_dim={axis} for some input, but that input is a Tensor of "
                                     f"dimensionality {leaf.ndim} so expected in_dim to satisfy -{leaf.ndim} <= "
                                     f"in_dim < {leaf.ndim}. ({path} has shape {tuple(leaf.shape)})")
        d = axis % leaf.ndim
        dims.append(d)
        sizes.append((path, leaf.shape[d]))
    if not sizes:
        raise ArgumentValueError("vmap: Expected at least one Tensor to vmap over (in_axes is None for every tensor, "
                                 "or there are no tensor inputs); give at least one tensor argument a batch dim")
    for path, size in sizes[1:]:
        if size != sizes[0][1]:
            raise ArgumentValueError(f"vmap: Expected all tensors to have the same size in the mapped dimension, got "
                                     f"sizes {[s for _, s in sizes]} for the mapped dimension ({sizes[0][0]} has "
                                     f"{sizes[0][1]} along its batch dim but {path} has {size})")
    return dims, sizes[0][1]


def _output(leaf, out_axis, path: str, batch_size: int, name: str):
    """A batched output leaf as the caller sees it: its batch dim moved to out_axis;
    an unbatched tensor is broadcast along out_axis (torch.func's behaviour). `name`: fn's."""
    if not isinstance(leaf, BatchedValue):
        if out_axis is None:
            return leaf
        raise ArgumentValueError(f"vmap({name}, ...): `{name}` must only return Tensors, got type {type(leaf)}. "
                                 f"Did you mean to set out_dims= to None for output? (out_axes gives {path} the "
                                 f"batch dim {out_axis})")
    value, dim = leaf.value, leaf.dim
    if out_axis is None:
        if dim is not None:
            raise ArgumentValueError(f"vmap({name}, ...): `{name}` can not return a BatchedTensor when out_dim is "
                                     f"None ({path} differs between examples; give it an int out_axes)")
        return value
    rank = value.ndim + (dim is None)
    if not -rank <= out_axis < rank:  # torch's IndexError for a dim out of range, in its words
        raise ArgumentIndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got "
                                 f"{out_axis}) (vmap: out_axes gives {path} the batch dim {out_axis}, counting "
                                 f"the batch dim)")
    axis = out_axis % rank
    if dim is None:  # the same for every example: repeated along the batch dim (an expand, no copy)
        shape = tuple(value.shape[:axis]) + (batch_size,) + tuple(value.shape[axis:])
        return prims.broadcast_in_dim(value, shape, tuple(i for i in range(rank) if i != axis))
    return move_batch_dim(value, dim, axis)


_UNSET = object()  # (in_dims=None means "not batched": an option not given needs its own mark)


def _one_of(jax_value, default, torch_value, jax_name: str, torch_name: str):
    """An option given by JAX's name or torch.func's, not both."""
    if torch_value is _UNSET:
        return jax_value
    if jax_value is not default and jax_value != default:
        raise ArgumentTypeError(f"vmap() got both {jax_name}= and {torch_name}=, JAX's and torch.func's names for one "
                                f"option; pass one of them")
    return torch_value


@with_options_form
def vmap(fn: Callable, in_axes=0, out_axes=0, randomness: str = "error", *, chunk_size=None, in_dims=_UNSET,
         out_dims=_UNSET):
    """fn mapped over a batch dimension of its inputs, as one batched computation (no loop).

    `in_axes`: an int, None, or a tuple with one pytree prefix per positional argument (ints
    and Nones; negative ints count from the end): where each input's batch dim is, None for an
    input shared by every example. `out_axes`: likewise, a pytree prefix of the output: where
    each output's batch dim goes. An output that is the same for every example is broadcast
    along out_axes, as torch.func.vmap does. `randomness`, as in torch.func: "error" (a random op raises),
    "different" (each example draws its own values), "same" (a draw whose inputs are shared is
    made once, for every example; one with batched inputs is made as torch.func.vmap makes it).
    Random ops are batched by torch.func.vmap with the same mode, so under a seed they draw
    what torch.func.vmap draws. `chunk_size`: None (the whole
    batch at once), or the number of examples batched together: the batch is split into chunks,
    each batched as one program, and the outputs concatenated, bounding peak memory. `in_dims` and
    `out_dims`, torch.func's names for in_axes and out_axes, are accepted too (one name for each).

    Returns a function taking fn's arguments with the batch dimensions added. Like
    torch.func.vmap (and unlike a Python loop) fn is traced once and each operation runs once
    on the whole batch. An operation with no batching rule is batched through its
    decomposition or, failing that, by torch.func.vmap of its torch function; one with none of
    these is a BatchingError naming it. Nest vmaps to map
    over several dimensions; compose with tf.grad for per-example gradients.

        >>> import torch, thunderfn as tf
        >>> w, xs = torch.randn(3, 2), torch.randn(5, 3)
        >>> ys = tf.vmap(lambda x, w: x @ w, in_axes=(0, None))(xs, w)  # w shared by every x
        >>> ys.shape
        torch.Size([5, 2])
        >>> torch.testing.assert_close(ys, xs @ w)
        >>> per_example = tf.vmap(tf.grad(lambda w, x: (x @ w).sum()), in_axes=(None, 0))(w, xs)
        >>> per_example.shape
        torch.Size([5, 3, 2])
    """
    in_axes = _one_of(in_axes, 0, in_dims, "in_axes", "in_dims")
    out_axes = _one_of(out_axes, 0, out_dims, "out_axes", "out_dims")
    if randomness not in RANDOMNESS:
        raise ArgumentRuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got "
                                   f"{randomness}")
    if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size > 0):
        raise (ArgumentValueError if isinstance(chunk_size, int) else TransformInputError)(
            f"vmap: chunk_size should be None or greater than 0. (got {chunk_size!r}; it is the number of examples "
            f"batched together)")
    name = getattr(fn, "__name__", "fn")

    def batched(fn, args, dims, batch_size):
        """fn's outputs for args (batch_size examples), flat, placed at out_axes; the output
        structure; and the in-place updates of batched inputs, by leaf index."""
        out, updates = trace_vmap(fn, args, dims, batch_size, randomness)
        leaves, spec = tree_flatten(out)
        structure = optree.tree_map(lambda _: _Leaf(), out, namespace="thunderfn")
        # torch.func reads out_dims=(d,) for a single output as d (JAX would refuse it: a program of either runs)
        single = isinstance(out_axes, tuple) and len(out_axes) == 1 and isinstance(structure, _Leaf)
        paths_axes = [(path, axis) for path, _, axis in _prefix_leaves(out_axes[0] if single else out_axes, structure,
                                                                       "output", "out_axes")]
        placed = [_output(leaf, axis, path, batch_size, name) for leaf, (path, axis) in zip(leaves, paths_axes)]
        return placed, [axis for _, axis in paths_axes], spec, updates

    def transformed(*args, **kwargs):
        # a real tensor passed in while tracing (one captured by the caller) is a constant
        tracer = context.current_tracer()
        args = up_to_date(tree_map(lambda x: tracer.constant(x) if is_real_tensor(x) else x, args))
        dims, batch_size = _in_dims(in_axes, args)
        body = functools.partial(fn, **kwargs) if kwargs else fn
        leaves, arg_spec = tree_flatten(args)
        if chunk_size is None or chunk_size >= batch_size:
            placed, _, spec, updates = batched(body, args, dims, batch_size)
            for i, value in updates.items():
                inplace.rebind(leaves[i], value, because="an in-place operation inside vmap")
            return optree.tree_unflatten(spec, placed)
        # Bounded memory: the batch in chunks of chunk_size examples, each one batched program over
        # its slice of the inputs, the outputs concatenated along their out_axes (no loop per example).
        # Every chunk reads the inputs as they were before the call; in-place updates of an input
        # are concatenated the same way and written back once, after the last chunk.
        bounds = [(start, min(start + chunk_size, batch_size)) for start in range(0, batch_size, chunk_size)]
        chunks = []
        # randomness="same": every chunk draws from the generator's state before the first, so that it draws
        # what the others draw, as torch.func's chunks do (torch.get_rng_state and set_rng_state, traced)
        state = torch.get_rng_state() if randomness == "same" else None
        for start, stop in bounds:
            if state is not None:
                torch.set_rng_state(state)
            sliced = [leaf if d is None else clang.slice_in_dim(leaf, start, stop, dim=d)
                      for leaf, d in zip(leaves, dims)]
            chunks.append(batched(body, tree_unflatten(arg_spec, sliced), dims, stop - start))
        for i in sorted(set().union(*(updates for *_, updates in chunks))):
            pieces = [updates[i] if i in updates else clang.slice_in_dim(leaves[i], start, stop, dim=dims[i])
                      for (*_, updates), (start, stop) in zip(chunks, bounds)]
            inplace.rebind(leaves[i], prims.cat(pieces, dims[i]), because="an in-place operation inside vmap")
        _, axes, spec, _ = chunks[0]
        joined = []
        for i, axis in enumerate(axes):
            pieces = [placed[i] for placed, *_ in chunks]
            if axis is None or not isinstance(pieces[0], TensorProxy):
                joined.append(pieces[0])  # the same for every example, so for every chunk
            else:
                joined.append(prims.cat(pieces, axis % pieces[0].ndim))
        return optree.tree_unflatten(spec, joined)

    transformed.__name__ = f"vmap_{name}"
    return _compiled(takes_arguments_of(transformed, fn))


class _Leaf:
    """A stand-in for an output leaf while out_axes is matched against the output's structure."""
    __slots__ = ()


register_vmap(vmap)
