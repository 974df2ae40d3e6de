"""Reverse mode: vjp, grad and value_and_grad.

The driver is small. The function is traced straight into the trace being built
(so the forward is ordinary recorded ops), then its recorded region is walked
backwards: a bound symbol with a VJP rule (its record in core/rules.py, written in its op
family's module under transforms/rules/) maps its output cotangent to input cotangents; a symbol without one is
differentiated through its subsymbols (its decomposition); an opaque torch op is differentiated
when the compiled function runs, by torch.func.vjp (transforms/resolve.py gives
the order, the same in every transform). The rules are written in
traceable ops, so the backward is recorded too and can itself be differentiated:
grad(grad(f)) is grad applied to a function that happens to contain a backward.

Called with real tensors, a transformed function jits its traced form (one trace
per input signature, cached); called while an outer trace is being built, it
emits into that trace, which is why transforms compose: jit(grad(f)), grad(jit(f)),
grad(grad(f)).

A transform: may import core/, prims, clang, the torch language and the other
transforms; never executors or jit (it compiles through core/context.py's jit, which
jit registers, and reads the executors it differentiates for from its caller).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Sequence

import optree
import torch

import thunderfn.torch as ltorch
from thunderfn.core import context, dtypes, symbolic
from thunderfn.core.decorators import takes_arguments_of, with_options_form
from thunderfn.core.interception import tensors_by_position
from thunderfn.core.proxies import TensorProxy, is_real_tensor
from thunderfn.core.pytree import of_positions, tree_flatten, tree_leaves, tree_map, tree_unflatten
from thunderfn.core.rules import TAG_MOVES_DATA_ONLY, TAG_NOT_DIFFERENTIABLE, RecordedCall, VJPRule, rules_of
from thunderfn.core.statements import set_grad_enabled
from thunderfn.core.trace import up_to_date
from thunderfn.errors import (
    CotangentError,
    InternalError,
    OutputError,
    SavedTensorModifiedError,
    UnsupportedOpError,
)
from thunderfn.prims import PrimIDs
from thunderfn.torch.opaque import autograd_connections, may_draw, torch_vjp_op
from thunderfn.torch.random import get_rng_state_op
from thunderfn.transforms import rules as _rules  # noqa: F401  (every op family's rules join the table)
from thunderfn.transforms.argnums import argnums_as_tuple, positional_argnums
from thunderfn.transforms.executor_lower import claiming_rule, claims_whole, trace_in_place_of
from thunderfn.transforms.func_contracts import (
    check_reverse_inputs,
    output_and_aux,
    value_without_aux,
)
from thunderfn.transforms.resolve import Transform, Way, resolve
from thunderfn.transforms.rules.common import zeros_like
from thunderfn.transforms.rules.define import backwards, register_trace_vjp, vjp_rule_for


def _carries_gradient(x) -> bool:
    """A traced tensor of a floating or complex dtype: a value the driver tracks a cotangent for."""
    return isinstance(x, TensorProxy) and dtypes.is_inexact(x.dtype)


# -- the driver -------------------------------------------------------------------------------
class _Zero:
    """A cotangent known to be zero: all that reached a value through tensors without elements
    (x[..., n:] of an x of n, as rotary embeddings' cat takes). It costs nothing while nothing else
    reaches that value, and becomes zeros only where the backward returns it (an input gets zeros
    there, as in eager, not None)."""
    __slots__ = ()


_ZERO = _Zero()


def _accumulate(cts: dict, proxy: TensorProxy, ct) -> None:
    if ct is None or not _carries_gradient(proxy):
        return
    previous = cts.get(proxy.name)
    # (an empty cotangent only where known empty: a symbolic count is not guarded to be nonzero for a shortcut)
    if ct is _ZERO or (isinstance(ct, TensorProxy) and symbolic.known_equal(ct.numel(), 0)):
        if previous is None:
            cts[proxy.name] = _ZERO
        return
    if previous is _ZERO:
        previous = None
    if isinstance(ct, TensorProxy) and ct.dtype != proxy.dtype:
        ct = ltorch.to(ct, proxy.dtype)
    # the caller's cotangents are checked in trace_vjp's backward; a rule's, at this call's sizes (an internal
    # check must not guard symbolic sizes the rule computed another way equal)
    if not symbolic.same_shape(ct.shape, proxy.shape) and symbolic.hints(ct.shape) != symbolic.hints(proxy.shape):
        raise InternalError(f"a VJP rule gave {proxy.name} a cotangent of shape {tuple(ct.shape)}, but it has shape "
                            f"{tuple(proxy.shape)}")
    cts[proxy.name] = ct if previous is None else ltorch.add(previous, ct)


def _materialized(ct, proxy):
    """A cotangent as the backward returns it: a known zero made zeros of proxy's shape."""
    return zeros_like(proxy) if ct is _ZERO else ct


def _grad_modes(region: list, enabled: bool) -> list:
    """Whether each recorded symbol ran with grad enabled (`with torch.no_grad()` blocks
    were recorded as set_grad_enabled statements): gradients do not flow through the rest."""
    modes = []
    for bsym in region:
        if bsym.sym is set_grad_enabled:
            enabled = bool(bsym.args[0])
        modes.append(enabled)
    return modes


def _inert(bsym) -> bool:
    """No derivative flows through it: a statement, or an op whose outputs never carry gradient."""
    return bsym.sym.printer is not None or TAG_NOT_DIFFERENTIABLE in bsym.sym.tags


def _refusal(bsym) -> UnsupportedOpError:
    ex = bsym.sym.executor
    if callable(getattr(ex, "register_lowering", None)):  # an OperatorExecutor's, where a vjp can be registered
        return UnsupportedOpError(
            f"thunderfn cannot differentiate {bsym.sym.print_name}, an operator of executor '{ex.name}' defined with "
            f"meta=: register a vjp for it, {ex.name}.register_lowering({bsym.sym.print_name}, vjp=(fwd, bwd)), or "
            f"define it with like= to differentiate it through that function.")
    name = bsym.sym.print_name
    why = rules_of(bsym.sym.id).underivable or "it has no VJP rule and no decomposition"
    return UnsupportedOpError(
        f"thunderfn cannot differentiate {name}: {why}. Give it a VJP rule, @tf.extend.defvjp({name}.id) on "
        f"a function vjp(call, g) (tf.extend.primitive's vjp=), or compute this part outside the differentiated "
        f"function.")


# reverse mode as transforms/resolve.py sees it: a VJP rule where it applies (custom_vjp functions and
# user autograd.Functions enter the rule table too), else an operator's like= function, else the decomposition
REVERSE = Transform("reverse mode", "vjp", _refusal, applies=VJPRule.applies_to, inert=_inert, follows_like=True)


def _backprop(bsym, cts: dict, tape: "_Tape") -> None:
    outs = bsym.flat_outs()
    out_cts = [cts.get(o.name) if isinstance(o, TensorProxy) else None for o in outs]
    if all(c is None for c in out_cts):
        return
    way = resolve(bsym, REVERSE)
    if way is Way.INERT:
        return
    if all(c is None or c is _ZERO for c in out_cts):
        if all(a.numel() for a in bsym.proxy_args() if _carries_gradient(a)):
            for a in bsym.proxy_args():  # its inputs' cotangents are zeros too
                _accumulate(cts, a, _ZERO)
            return
        # an input without elements: whether it gets a cotangent (eager: an empty tensor) or None
        # (view_as's `other`) is the rule's to say, given the cotangents as tensors
        out_cts = [_materialized(c, o) for c, o in zip(out_cts, outs)]
    out_cts = [None if c is _ZERO else c for c in out_cts]
    if way is Way.RULE:
        _backprop_rule(bsym, out_cts, cts)
        return
    recompute = _recomputed_function(bsym, way, tape.executors)
    if recompute is not None:
        _backprop_recomputed(bsym, recompute, out_cts, cts, tape.executors)
    elif way is Way.DECOMPOSITION:
        for sub in reversed(bsym.subsymbols):
            _backprop(sub, cts, tape)
    elif way is Way.OPAQUE:
        _backprop_opaque(bsym, out_cts, cts, tape)
    else:
        raise REVERSE.refusal(bsym)


def _backprop_rule(bsym, out_cts: list, cts: dict) -> None:
    """Accumulates the inputs' cotangents bsym's VJP rule gives."""
    g = out_cts[0] if isinstance(bsym.output, TensorProxy) else tuple(out_cts)
    args, kwargs = bsym.args, bsym.kwargs
    if kwargs and bsym.sym.fn is not None:  # rules give cotangents by position: no tensor by keyword
        args, kwargs = tensors_by_position(bsym.sym, args, kwargs)
    in_cts = rules_of(bsym.sym.id).vjp.bwd(RecordedCall(bsym.sym, args, kwargs, bsym.output), g)
    for arg, ct in zip(args, in_cts):
        if ct is None:
            continue
        # a tensor, or a pytree of them (cat's list, a custom_vjp's dict), None entries meaning zero
        arg_leaves = tree_leaves(arg) if not isinstance(arg, TensorProxy) else [arg]
        ct_leaves = (optree.tree_leaves(ct, none_is_leaf=True, namespace="thunderfn")
                     if not isinstance(ct, TensorProxy) else [ct])
        for a, c in zip(arg_leaves, ct_leaves):
            if isinstance(a, TensorProxy):
                _accumulate(cts, a, c)


def _recomputed_function(bsym, way: Way, executors) -> Callable | None:
    """The function the backward recomputes and differentiates for bsym, if any: an executor's operator
    defined like= a function, or a composite an executor claims whole (_with_residuals kept it so)."""
    if way is Way.LIKE:
        return bsym.sym.like
    if way is Way.DECOMPOSITION and bsym.sym.fn is not None and claims_whole(claiming_rule(bsym, executors)):
        return bsym.sym.fn
    return None


def _backprop_recomputed(bsym, recompute: Callable, out_cts: list, cts: dict, executors) -> None:
    """Accumulates the inputs' cotangents of bsym computed by differentiating `recompute` on its arguments."""
    wanted = [i for i, c in enumerate(out_cts) if c is not None]

    def recomputed_outputs(args, kwargs):
        leaves = optree.tree_leaves(recompute(*args, **kwargs), none_is_leaf=True, namespace="thunderfn")
        return tuple(leaves[i] for i in wanted)

    _, backward = trace_vjp(recomputed_outputs, (bsym.args, bsym.kwargs), executors)
    in_cts = backward(tuple(out_cts[i] for i in wanted))  # a tensor passed twice gets its total twice
    totals = {leaf.name: (leaf, ct) for leaf, ct in zip(tree_leaves((bsym.args, bsym.kwargs)), in_cts)
              if isinstance(leaf, TensorProxy)}
    for leaf, ct in totals.values():
        _accumulate(cts, leaf, ct)


def _moves_data_only(bsym) -> bool:
    """A composite made only of views, reshapes, copies and conversions (x.contiguous(), x.view(...),
    x.to(...), torch.cat([x])). It runs whole in the forward, so torch's own op decides view or
    copy (and checks x.view's strides) as in eager; its backward still differentiates the
    decomposition, which needs no residual from it."""
    return bool(bsym.subsymbols) and all(
        TAG_MOVES_DATA_ONLY in sub.sym.tags if sub.sym.is_prim else vjp_rule_for(sub) is None and _moves_data_only(sub)
        for sub in bsym.subsymbols)


def _passes_an_input_through(bsym) -> bool:
    """Whether every differentiable output of a composite is, in its decomposition, an input
    reshaped to its own shape (torch.cummax of a 0-D tensor, index_put with no indices): eager's
    op returns a new tensor or a view there, the decomposition the input itself, so the forward
    runs the op whole; gradients flow through that reshape alone, which needs no residual."""
    inputs = {p.name for p in bsym.proxy_args()}
    made = {sub.output.name: sub for sub in bsym.subsymbols if isinstance(sub.output, TensorProxy)}
    outs = [o for o in bsym.flat_outs() if isinstance(o, TensorProxy) and _carries_gradient(o)]
    return bool(outs) and all(
        o.name in made and made[o.name].sym.id is PrimIDs.RESHAPE and made[o.name].args[0].name in inputs
        and tuple(made[o.name].args[0].shape) == tuple(o.shape) for o in outs)


def _reads_only_its_own_values(bsym) -> bool:
    """Whether every value the VJP rules of a composite's decomposition can read is an input or
    an output of the composite itself (ltorch.mul of two float32 tensors is one prims.mul of the
    same values). Then the forward runs the torch symbol whole, one torch call in the vocabulary
    a torch-level executor claims, and its backward differentiates the decomposition, whose
    residuals the forward computes anyway."""
    own = {p.name for p in bsym.proxy_args()} | {p.name for p in bsym.proxy_outs()}

    def differentiated(bsyms):  # the bound symbols whose rules the backward applies
        for b in bsyms:
            if b.sym.is_prim or not b.subsymbols or vjp_rule_for(b) is not None:
                yield b
            else:
                yield from differentiated(b.subsymbols)

    subs = list(differentiated(bsym.subsymbols))
    return bool(subs) and all(p.name in own for b in subs for p in b.proxy_args() + b.proxy_outs())


def _with_residuals(bsyms: list, executors) -> list:
    """The forward as it must run for the backward to find its residuals: a composite without
    a VJP rule is replaced by its decomposition (whose intermediates the rules read), unless
    no gradient can flow through it (no floating input or output). A symbol an executor other
    than torch claims (executors/base.py) is kept whole, so the executor runs it, and its
    backward recomputes what it needs; where that executor gives a vjp, the vjp's forward
    replaces it. executors: the priority list the trace will be lowered onto."""
    flat = []
    for bsym in bsyms:
        inert = (_inert(bsym) or not any(_carries_gradient(a) for a in bsym.flat_args())
                 or not any(_carries_gradient(o) for o in bsym.flat_outs()))
        rule = None if inert else claiming_rule(bsym, executors)
        own = None if inert else vjp_rule_for(bsym)
        if own is not None and own.residuals is not None:  # the call made to return what its rule reads
            flat.append(own.residuals(bsym))
            continue
        if rule is not None and rule.vjp is not None:
            flat.extend(trace_in_place_of(bsym, rule.vjp, "the executor's vjp"))
            continue
        keep = (inert or vjp_rule_for(bsym) is not None or not bsym.subsymbols or claims_whole(rule)
                or _moves_data_only(bsym) or _passes_an_input_through(bsym) or _reads_only_its_own_values(bsym))
        flat.extend([bsym] if keep else _with_residuals(list(bsym.subsymbols), executors))
    return flat


class _Tape:
    """What the backward needs besides the recorded ops: which values depend on the
    differentiated inputs (only those get cotangents); for each opaque op, the generator
    state just before it ran (its backward re-runs it, and must draw the same); and the
    executors the trace will be lowered onto (what they claim whole is recomputed)."""

    def __init__(self, executors):
        self.executors = executors
        self.active: set = set()
        self.seen: set = set()  # every value of the region (read or made at its top level)
        self.rng_state: dict = {}  # id(bound symbol) -> proxy of torch.get_rng_state() before it


def _record_forward(region: list, primal_names: list, tape: _Tape) -> list:
    """The forward as emitted: for each opaque op that depends on the inputs and may draw random
    numbers, the generator state is read just before it."""
    tape.active = {name for name in primal_names if name is not None}
    tape.seen = set(tape.active)
    for bsym in region:
        tape.seen.update(p.name for p in bsym.proxies())
    emitted, tape.rng_state = with_generator_states(region, tape.active)
    return emitted


def with_generator_states(region: list, active: set) -> tuple[list, dict]:
    """(region as it is to be emitted, {id(bound symbol): proxy of the generator state}): a read of
    torch's generator state just before each opaque op that reads a value of `active` (the names of
    what is differentiated, which grows here by what depends on it) and may draw random numbers.
    Both modes differentiate such an op by running it again under torch.func, from that state, so
    that it draws what it first drew (torch/opaque.py: torch_vjp, torch_jvp)."""
    tracer = context.current_tracer()
    emitted, states = [], {}
    for bsym in region:
        if any(isinstance(a, TensorProxy) and a.name in active for a in bsym.flat_args()):
            active.update(o.name for o in bsym.proxy_outs())
            if "opaque" in bsym.sym.tags and bsym.sym.torch_fn is not None and may_draw(bsym.sym.torch_fn):
                with tracer.scope() as state_read:
                    states[id(bsym)] = get_rng_state_op()
                emitted.extend(state_read)
        emitted.append(bsym)
    return emitted, states


@contextlib.contextmanager
def differentiating(tracer):
    """tracer.scope(), with torch's grad mode on while the transform traces the function it
    differentiates: a functional transform computes its derivative whatever the mode outside it
    (torch.func and JAX do), so `with torch.no_grad(): tf.grad(f)(x)` is f's gradient. The switch is
    the transform's, not the compiled function's: nothing is recorded for it, so a region under
    an outer no_grad stays one for an enclosing transform (as torch.func's levels see it). A
    `torch.no_grad()` block inside the function still stops gradients there (recorded as switches,
    see _grad_modes); the caller's mode comes back when the block ends, also on an error."""
    tracer.sync_grad_mode()  # a no_grad block just entered by the caller, recorded before the region
    outside = tracer.grad_enabled
    with tracer.scope() as recorded, torch.enable_grad():
        tracer.grad_enabled = True
        try:
            yield recorded
        finally:
            switches = [b for b in recorded if b.sym is set_grad_enabled]
            if (bool(switches[-1].args[0]) if switches else outside) != outside:  # the compiled function's mode back
                recorded.append(set_grad_enabled.bind(outside, output=None))
            tracer.grad_enabled = outside


def as_trace_constants(tree):
    """tree with each real tensor (one a traced function captured) as the trace's proxy for it."""
    tracer = context.current_tracer()
    return tree_map(lambda x: tracer.constant(x) if is_real_tensor(x) else x, tree)


def as_trace_values(primals):
    """primals with each real tensor (one the traced function captured and differentiates with
    respect to, `tf.grad(f)(w)` inside a jitted function) replaced by a copy made in the trace:
    the tensor itself would be a captured constant, which no derivative reaches."""
    tracer = context.current_tracer()
    return tree_map(lambda x: ltorch.clone(tracer.constant(x)) if is_real_tensor(x) else x, primals)


def trace_vjp(fn: Callable, primals: Sequence, executors=None):
    """While a trace is being built: trace fn(*primals) into it and return (out, backward), where
    backward(cotangents for out's leaves, as a pytree like out) -> one cotangent per primal leaf.

    executors: the priority list the trace will be lowered onto; a symbol one of them claims
    whole stays whole, differentiated by the vjp that executor registered or by recomputing it."""
    if executors is None:
        # tf.grad(f) called while a function is being jitted: the executors are that jit's argument,
        # which f's caller cannot hand to tf.grad, so jit announces them for the trace it builds.
        executors = context.current_executors()
    tracer = context.current_tracer()
    primals = as_trace_values(up_to_date(primals))
    # the primals' names before fn runs: fn may write into a primal in place, after which the same proxy
    # object names its new value (torch/inplace.py); the derivative is with respect to the value passed in
    primal_names = [p.name if isinstance(p, TensorProxy) else None for p in tree_leaves(primals)]
    primal_proxies = [p if isinstance(p, TensorProxy) else None for p in tree_leaves(primals)]
    with differentiating(tracer) as recorded:
        # a tensor made outside torch's hooks (torch.tensor(1.)): a constant
        out = as_trace_constants(up_to_date(fn(*primals)))
    tape = _Tape(executors)
    # (a rule that differentiates a body of its own, a block's or a scan's, does so for the same executors)
    with context.active_executors(executors):
        region = _record_forward(_with_residuals(recorded, executors), primal_names, tape)
    for bsym in region:
        tracer.emit(bsym)
    modes = _grad_modes(region, True)

    def backward(cotangents):
        """cotangents: a pytree with out's structure; None (or anything, for an integer or boolean
        output) where an output gets no cotangent. Every output keeps its position."""
        out_leaves, out_spec = tree_flatten(out)
        ct_leaves = cotangent_leaves(out_spec, cotangents, [_carries_gradient(o) for o in out_leaves])
        cts: dict = {}
        for i, (o, c) in enumerate(zip(out_leaves, ct_leaves)):
            if isinstance(o, TensorProxy) and c is not None:
                check_cotangent(c, tuple(o.shape), i, len(out_leaves))
                _accumulate(cts, o, c)
        backwards.tapes.append(tape)
        try:
            with context.active_executors(executors):
                for bsym, enabled in zip(reversed(region), reversed(modes)):
                    if enabled:
                        _backprop(bsym, cts, tape)
        finally:
            backwards.tapes.pop()
        return [_materialized(cts.get(name), proxy) if name is not None else None
                for name, proxy in zip(primal_names, primal_proxies)]

    return out, backward


register_trace_vjp(trace_vjp)


def cotangent_leaves(out_spec, cotangents, differentiable) -> list:
    """The caller's cotangents, one leaf per output leaf (None where an output gets none). `differentiable`:
    whether each output leaf takes a cotangent (a floating tensor)."""
    if cotangents is None and out_spec.num_leaves == 1 and out_spec.is_leaf() and differentiable[0]:
        # torch.func hands None to torch.autograd, which makes it ones for a one-element output (and refuses it
        # for any other); JAX refuses it. Zeros, this convention's answer, would differ silently from torch.func's.
        raise CotangentError(
            "vjp_fn(None) for a function with one tensor output: torch.func takes None as ones for a one-element "
            "output (torch.autograd's implicit gradient) and JAX refuses it, so thunderfn does not guess. Pass "
            "torch.ones_like(out) for the gradient of out (torch.func's None), or torch.zeros_like(out).")
    try:
        return out_spec.flatten_up_to(cotangents)
    except (ValueError, TypeError) as e:
        raise CotangentError(f"Expected pytree structure of cotangents to be the same as pytree structure of outputs "
                             f"to the function. cotangents: {tree_flatten(cotangents)[1]}, primal output: {out_spec} "
                             f"(give None for outputs that get no cotangent; {e})") from None


def check_cotangent(ct, shape: tuple, position: int, n_outputs: int) -> None:
    """A caller's cotangent for one output: a tensor (traced or real) of that output's shape
    (torch.autograd's 'Mismatch in shape' is a RuntimeError; CotangentError is one, and a TypeError)."""
    which = "the output" if n_outputs == 1 else f"output {position} (counting the output's tensors in order)"
    if not isinstance(ct, torch.Tensor):
        raise CotangentError(f"vjp: the cotangent for {which} must be a tensor of its shape {shape}, "
                             f"got {type(ct).__name__}. Pass None where an output gets no cotangent.")
    if tuple(ct.shape) != tuple(shape):
        raise CotangentError(f"Mismatch in shape: grad_output[{position}] has a shape of torch.Size("
                             f"{list(ct.shape)}) and output[{position}] has a shape of torch.Size({list(shape)}). "
                             f"(vjp: give {which} a cotangent of its own shape; for the gradient of out.sum(), "
                             f"torch.ones_like(out).)")


# -- opaque torch ops: differentiated by torch when the compiled function runs ------------------
def _backprop_opaque(bsym, out_cts, cts, tape: _Tape) -> None:
    floating = [(o, c) for o, c in zip(bsym.flat_outs(), out_cts) if _carries_gradient(o)]
    cotangents = tuple(c if c is not None else ltorch.full(tuple(o.shape), 0, device=o.device, dtype=o.dtype)
                       for o, c in floating)
    leaves = tree_leaves((bsym.args, bsym.kwargs))
    wrt = tuple(i for i, x in enumerate(leaves) if _carries_gradient(x) and x.name in tape.active)
    if not wrt:
        return
    connections = autograd_connections(bsym)  # inputs torch's formula ignores get None, as in eager
    if connections is not None:
        wrt = tuple(i for i in wrt if i in connections[0])
        if not wrt:
            return
    in_cts = torch_vjp_op(bsym.sym.torch_fn, bsym.args, bsym.kwargs, cotangents, wrt, tape.rng_state.get(id(bsym)))
    for i, ct in zip(wrt, in_cts):
        _accumulate(cts, leaves[i], ct)


# -- function transforms --------------------------------------------------------------------------
def _compiled(transformed, prepare=None):
    """Run `transformed` (which needs a trace) through jit when called with real tensors.
    `prepare(args) -> args` runs first on every call (value_and_grad's Python floats)."""
    jitted = None

    @functools.wraps(transformed)
    def wrapper(*args, **kwargs):
        nonlocal jitted
        if prepare is not None:
            args = prepare(args)
        if context.current_trace() is not None:
            return transformed(*args, **kwargs)
        if jitted is None:
            jitted = context.jit_evicting(transformed)
            wrapper._thunderfn_state = jitted._thunderfn_state
        return jitted(*args, **kwargs)

    return wrapper


def _float_as_tensor(x):
    """A Python float differentiated with respect to becomes a 0-d tensor of the default dtype
    (torch promotes the two alike), so its derivative is one too, as JAX returns a 0-d array;
    outside a trace it is a real tensor, an input of the compiled function, so a new value
    does not retrace."""
    if type(x) is not float:
        return x
    if context.current_trace() is not None:
        return ltorch.full((), x, device=torch.get_default_device(), dtype=torch.get_default_dtype())
    return torch.tensor(x, dtype=torch.get_default_dtype())


def _floats_as_tensors(args, nums):
    n = len(args)
    return tuple(tree_map(_float_as_tensor, a) if i in nums or i - n in nums else a for i, a in enumerate(args))


def _zeros_for_none(cts, primal_leaves):
    return [c if c is not None else (ltorch.full(tuple(p.shape), 0, device=p.device, dtype=p.dtype)
                                     if isinstance(p, TensorProxy) else None)
            for c, p in zip(cts, primal_leaves)]


@with_options_form
def value_and_grad(fn: Callable, argnums=0, has_aux: bool = False):
    """A function returning (value, gradient) of a scalar-output fn, from one forward and backward.

    `argnums`: which positional arguments to differentiate with respect to: an int (the gradient
    is shaped like that argument) or a tuple of ints (a tuple of gradients); negative ints count
    from the end. Each such argument may be a pytree of floating tensors (the gradient is the same
    pytree) or a Python float (differentiated as a 0-d tensor of the default dtype). Keyword
    arguments are passed through and never differentiated. With `has_aux`, fn returns
    (value, aux) and this returns ((value, aux), gradient); aux is not differentiated.

    As in JAX (unlike torch.autograd.grad), an input the value does not depend on gets a
    gradient of zeros, not None. fn must return a 0-d tensor (OutputError otherwise: use
    tf.vjp or tf.jacrev for other outputs, as torch.func and JAX do); an int, bool or str
    argument in argnums is a TransformInputError (torch.func's ValueError, JAX's TypeError).
    Called with real tensors, the transformed function is traced once per input signature and
    cached, as tf.jit is; it composes with every other transform.

        >>> import torch, thunderfn as tf
        >>> def loss(w, x):
        ...     return ((x @ w) ** 2).mean(), w.norm()
        >>> w, x = torch.ones(3, 2), torch.ones(4, 3)
        >>> (value, w_norm), (gw, gx) = tf.value_and_grad(loss, argnums=(0, 1), has_aux=True)(w, x)
        >>> value
        tensor(9.)
        >>> gw.shape, gx.shape
        (torch.Size([3, 2]), torch.Size([4, 3]))
        >>> torch.testing.assert_close(gw, torch.full((3, 2), 3.0))
    """
    single = isinstance(argnums, int)
    nums = argnums_as_tuple(argnums)

    def transformed(*args, **kwargs):
        nums_here = positional_argnums(fn, nums, len(args))
        diff = [args[i] for i in nums_here]
        check_reverse_inputs(tree_leaves(diff), "grad", fn, integer_tensors=False)
        out, backward = trace_vjp(of_positions(fn, args, nums_here, kwargs), diff)
        value, aux = output_and_aux(out, fn, "grad") if has_aux else (out, None)
        advice = (f"(grad of '{getattr(fn, '__name__', fn)}' requires a scalar output: reduce it first (out.sum()), "
                  "or use tf.vjp / tf.jacrev for non-scalar outputs)")
        if not isinstance(value, TensorProxy):
            raise OutputError(f"grad_and_value(f)(*args): Expected f(*args) to return a Tensor, got {type(value)} "
                              f"{advice}")
        if value.ndim != 0:  # a 0-d tensor, as torch.func and JAX require (a one-element (1,) one is refused by both)
            raise OutputError(f"grad_and_value(f)(*args): Expected f(*args) to return a scalar Tensor, got tensor "
                              f"with {value.ndim} dims. Maybe you wanted to use the vjp or jacrev APIs instead? "
                              f"{advice}")
        ones = ltorch.full(tuple(value.shape), 1, device=value.device, dtype=value.dtype)
        flat_cts = backward((ones, tree_map(lambda _: None, aux)) if has_aux else ones)
        flat_cts = _zeros_for_none(flat_cts, tree_leaves(diff))
        grads, offset = [], 0
        for d in diff:
            leaves, spec = tree_flatten(d)
            grads.append(tree_unflatten(spec, flat_cts[offset:offset + len(leaves)]))
            offset += len(leaves)
        g = grads[0] if single else tuple(grads)
        return ((value, aux) if has_aux else value), g

    transformed.__name__ = f"value_and_grad_{getattr(fn, '__name__', 'fn')}"
    return _compiled(takes_arguments_of(transformed, fn), prepare=lambda args: _floats_as_tensors(args, nums))


@with_options_form
def grad(fn: Callable, argnums=0, has_aux: bool = False):
    """A function returning the gradient of a scalar-output fn, as jax.grad and torch.func.grad.

    `argnums`: an int (one gradient, shaped like that argument) or a tuple of ints (a tuple of
    gradients); each differentiated argument may be a pytree of floating tensors or a Python
    float. With `has_aux`, fn returns (value, aux) and this returns (gradient, aux). The rules
    are value_and_grad's: fn must return a 0-d tensor, an input it does not depend on
    gets zeros (not None), and the result is compiled and cached per input signature. Nest it
    for higher derivatives, and wrap it in tf.vmap for per-example gradients.

        >>> import torch, thunderfn as tf
        >>> x = torch.tensor([0.0, 1.0, 2.0])
        >>> torch.testing.assert_close(tf.grad(lambda x: torch.sin(x).sum())(x), torch.cos(x))
        >>> tf.grad(lambda a: a ** 3)(3.0)  # a Python float is differentiated as a 0-d tensor
        tensor(27.)
        >>> tf.grad(tf.grad(lambda a: a ** 3))(3.0)
        tensor(18.)
    """
    both = value_and_grad(fn, argnums, has_aux)

    def transformed(*args, **kwargs):
        (value_or_pair, g) = both(*args, **kwargs)
        return (g, value_or_pair[1]) if has_aux else g

    transformed.__name__ = f"grad_{getattr(fn, '__name__', 'fn')}"
    nums = argnums_as_tuple(argnums)
    return _compiled(takes_arguments_of(transformed, fn), prepare=lambda args: _floats_as_tensors(args, nums))


def vjp(fn: Callable, *primals, has_aux: bool = False):
    """fn's output at `primals` and its pullback: (out, vjp_fn), or (out, vjp_fn, aux) with has_aux.

    `primals`: fn's positional arguments, each a pytree of floating tensors or a Python float
    (differentiated as a 0-d tensor). `vjp_fn(cotangents)`, with cotangents a pytree shaped like
    `out`, returns a tuple with one cotangent per primal (each a pytree like its primal; zeros
    for a primal `out` does not depend on), as jax.vjp and torch.func.vjp do. With `has_aux`, fn
    returns (out, aux) and aux is returned as is, not differentiated.

    Called with real tensors, fn runs once, compiled, and saves what its backward needs:
    calling vjp_fn runs only the backward, as often as you like, and never calls fn again.
    vjp_fn is an ordinary function of its cotangents, which tf.jit, tf.grad and tf.vjp can trace.
    (torch.func's vjp_fn options are accepted and change nothing: `retain_graph`, since every vjp_fn
    may be called again, and `create_graph`, since its result is connected to torch.autograd
    whenever a primal requires grad.)

        >>> import torch, thunderfn as tf
        >>> x = torch.tensor([0.0, 1.0, 2.0])
        >>> out, vjp_fn = tf.vjp(torch.sin, x)
        >>> (x_ct,) = vjp_fn(torch.ones(3))
        >>> torch.testing.assert_close(x_ct, torch.cos(x))
        >>> (x_ct,) = vjp_fn(torch.tensor([2.0, 0.0, 0.0]))  # again, without re-running sin
        >>> torch.testing.assert_close(x_ct, torch.tensor([2.0, 0.0, 0.0]))
    """
    primals = _floats_as_tensors(primals, range(len(primals)))
    check_reverse_inputs(tree_leaves(primals), "vjp", fn, integer_tensors=True)

    def split(primals):
        """trace fn: (value, aux, backward); only value is differentiated."""
        value_only, aux_box = value_without_aux(fn, has_aux)
        value, backward = trace_vjp(value_only, primals)
        return value, (aux_box[0] if aux_box else None), backward

    def cotangents_for(backward, cotangents, primals):
        cotangents = as_trace_constants(cotangents)  # a real tensor passed while tracing: captured
        flat_cts = _zeros_for_none(backward(cotangents), tree_leaves(primals))
        grads, offset = [], 0
        for p in primals:
            p_leaves, spec = tree_flatten(p)
            grads.append(tree_unflatten(spec, flat_cts[offset:offset + len(p_leaves)]))
            offset += len(p_leaves)
        return tuple(grads)

    if context.current_trace() is not None:
        value, aux, backward = split(primals)

        def vjp_fn(cotangents, retain_graph: bool = True, create_graph: bool | None = None):
            return cotangents_for(backward, cotangents, primals)
    else:
        pullback = _Pullback()

        def forward(primals):
            value, aux, backward = split(primals)
            return value, aux, pullback.build(value, lambda cts: cotangents_for(backward, cts, primals))

        value, aux, residuals = context.jit_evicting(forward)(primals)
        vjp_fn = pullback.bind(residuals)
    return (value, vjp_fn, aux) if has_aux else (value, vjp_fn)


# -- the pullback of an eager vjp: residuals computed by the forward, no re-run of fn ------------
def replay_unless_modified(proxies: list, computed, run, transform: str, consequence: str) -> Callable:
    """`lambda x: run(values, x)`, where values are the residuals `proxies` stand for (each a captured constant,
    else the next of `computed`), refused as torch.autograd refuses it (SavedTensorModifiedError) once one of
    them was written in place after it was computed: what tf.vjp's vjp_fn and tf.linearize's jvp_fn call.
    `consequence`: what such a write would make of the result."""
    computed = iter(computed)
    values = [p.constant if p.constant is not None else next(computed) for p in proxies]
    versions = [v._version if isinstance(v, torch.Tensor) else None for v in values]

    def replay(x):
        for p, v, version in zip(proxies, values, versions):
            if version is not None and v._version != version:
                raise SavedTensorModifiedError(
                    f"one of the values {transform}_fn needs ({p.origin[0] if p.origin else 'an intermediate'}, "
                    f"{TensorProxy.type_string(v)}) was modified by an in-place operation after tf.{transform} ran, "
                    f"so {consequence}. Call tf.{transform} again after the change, or clone the tensor before "
                    f"modifying it.")
        return run(values, x)

    replay._thunderfn_state = run._thunderfn_state
    return replay


class _Pullback:
    """What tf.vjp's vjp_fn runs when tf.vjp was called with real tensors, JAX's way: the forward
    (compiled) returns, besides the output, the residuals its backward reads; vjp_fn runs the
    recorded backward on those residuals and the cotangents. So the pullback is the derivative
    of the forward that ran when tf.vjp was called: the user's function is not called again (a
    closure changed in between, or a random op, changes nothing), and a vjp_fn is itself an
    ordinary function of its cotangents that every transform (tf.vjp, tf.grad, jit) can trace."""

    def build(self, value, backward) -> tuple:
        """While the forward is traced: record backward(stand-in cotangents) aside, and return the
        values it reads from the forward (the residuals, the forward's extra outputs)."""
        tracer = context.current_tracer()
        out_leaves, self.out_spec = tree_flatten(value)
        self.outputs = [(tuple(o.shape), o.dtype, o.device) if _carries_gradient(o) else None for o in out_leaves]
        self.cotangents = [TensorProxy(shape=m[0], dtype=m[1], device=m[2]) if m is not None else None
                           for m in self.outputs]
        with tracer.scope() as recorded:
            self.grads = backward(tree_unflatten(self.out_spec, self.cotangents))
        self.bsyms = recorded
        defined = {c.name for c in self.cotangents if c is not None}
        defined |= {o.name for b in recorded for o in b.proxy_outs()}
        read = [p for b in recorded for p in b.proxy_args()] + [p for p in tree_leaves(self.grads)
                                                                  if isinstance(p, TensorProxy)]
        self.residuals = list({p.name: p for p in read if p.name not in defined}.values())
        if symbolic.has_unbacked([tuple(p.shape) for p in [*self.residuals, *out_leaves]
                                  if isinstance(p, TensorProxy)]):
            # (its replay would compute with sizes of the forward's trace that the backward's call cannot bind)
            raise UnsupportedOpError(
                "tf.vjp called with real tensors cannot keep the pullback of a function whose output or saved "
                "values have a size known only at run time (a boolean mask's selection, nonzero, unique): "
                "differentiate it with tf.grad or tf.value_and_grad, through torch.autograd on tf.jit(fn), or "
                "call tf.vjp inside a jitted function")
        # a captured tensor is read as it is now (as torch.autograd saves it); the rest, as computed
        return tuple(p for p in self.residuals if p.constant is None)

    def bind(self, computed) -> Callable:
        # kept as they are (an input that requires grad stays connected, so vjp_fn's result is differentiable
        # by torch.autograd as torch.func's is)
        run = replay_unless_modified(self.residuals, computed, context.jit_evicting(self._replay), "vjp",
                                     "the gradient would not be the forward's")

        def vjp_fn(cotangents, retain_graph: bool = True, create_graph: bool | None = None):
            return run(self._checked(cotangents))  # (torch.func's two options change nothing here: see vjp)

        vjp_fn._thunderfn_state = run._thunderfn_state
        return vjp_fn

    def _checked(self, cotangents) -> list:
        """One cotangent per differentiable output (zeros for None), of its shape and dtype."""
        leaves = cotangent_leaves(self.out_spec, cotangents, [m is not None for m in self.outputs])
        cts = []
        for i, (c, meta) in enumerate(zip(leaves, self.outputs)):
            if meta is None:
                continue
            shape, dtype, device = meta
            if c is None:
                c = torch.zeros(shape, dtype=dtype, device=device)
            check_cotangent(c, shape, i, len(leaves))
            cts.append(c if c.dtype == dtype else c.to(dtype))
        return cts

    def _replay(self, residuals, cotangents):
        """The recorded backward again, on these residuals and cotangents, into the trace being
        built: each bound symbol called anew (fresh names; an enclosing transform sees its ops)."""
        tracer = context.current_tracer()
        env = {p.name: v for p, v in zip(self.residuals, as_trace_constants(list(residuals)))}
        env.update((p.name, c) for p, c in zip((c for c in self.cotangents if c is not None), cotangents))

        with torch.set_grad_enabled(torch.is_grad_enabled()):  # the caller's mode back after replayed switches
            replay_into(tracer, self.bsyms, env)
        return optree.tree_map(lambda x: env.get(x.name, x) if isinstance(x, TensorProxy) else x, self.grads,
                               none_is_leaf=True, namespace="thunderfn")


def replay_into(tracer, bsyms: list, env: dict) -> None:
    """Recorded bound symbols called anew into the trace being built (fresh names: an enclosing transform
    sees their ops), reading each proxy through env {recorded name: value now}, which gains their outputs."""

    def value(x):
        return env.get(x.name, x) if isinstance(x, TensorProxy) else x

    for bsym in bsyms:
        args, kwargs = optree.tree_map(value, (bsym.args, bsym.kwargs), none_is_leaf=True, namespace="thunderfn")
        if bsym.sym is set_grad_enabled:  # a no_grad block in a recomputed forward: switched, and so recorded
            torch._C._set_grad_enabled(bool(args[0]))
            continue
        if bsym.sym.printer is not None:
            tracer.emit(bsym.sym.bind(*args, output=bsym.output, **kwargs))
            continue
        out = bsym.sym(*args, **kwargs)
        for o, r in zip(optree.tree_leaves(bsym.output, none_is_leaf=True, namespace="thunderfn"),
                        optree.tree_leaves(out, none_is_leaf=True, namespace="thunderfn")):
            if isinstance(o, TensorProxy):
                env[o.name] = r
