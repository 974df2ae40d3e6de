"""Opaque torch ops: the fallback for a torch function that has no thunderfn symbol.

The function runs on `meta` tensors to learn its outputs' shapes and dtypes, is
recorded under its torch name, and the torch executor calls it at run time with
the real tensors. The bound symbol keeps the torch callable and its arguments, so
autodiff can differentiate it at run time through torch.func (`torch_vjp_op`, below).

An op whose output shape depends on values (unique, bincount, repeat_interleave with a
tensor of repeats) runs on fake tensors instead, where torch's kernel gives that size a
data-dependent symbol (core/symbolic.py) that generated code binds from the op's output.

Where torch has no meta kernel (or one that reads values or strides proxies lack) but the
outputs' shapes follow from the arguments' shapes, the op's family module registers a rule
(`shape_rule`: torch/linalg.py's geqrf and lstsq, torch/statistics.py's histogram).

Refused, with the reason, when even that cannot be right: no meta or fake kernel and no rule,
a non-tensor output (a value), a sparse tensor, or a write into an argument (in-place and out=
forms).

May import: core/.
"""
from __future__ import annotations

import contextlib
import numbers
from typing import Callable

import torch

from thunderfn.core import context, dtypes, symbolic
from thunderfn.core.interception import resolve_torch_name, torch_name
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import of_leaves, output_leaves, tree_flatten, tree_leaves, tree_unflatten
from thunderfn.core.symbol import Symbol
from thunderfn.core.trace import check_rng_untouched, symbolic_sizes, trace
from thunderfn.errors import ArgumentRuntimeError, ArgumentValueError, UnsupportedOpError, UserGradientError

_symbols: dict = {}  # torch callable -> its opaque symbol, made once

# Draws from torch's generator: kept even when unused, so a jitted function consumes
# random numbers exactly as eager does and a seed reproduces the same draws.
_RANDOM_WORDS = ("rand", "normal", "bernoulli", "multinomial", "poisson", "dropout", "uniform", "exponential",
                 "cauchy", "geometric", "log_normal", "rrelu", "seed", "shuffle", "fractional", "lowrank")
# ...whose names have one of those words but draw nothing: a fixed permutation, a loss of a
# Poisson rate, the backward of dropout given its mask
_DETERMINISTIC = ("pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle", "poisson_nll_loss",
                  "native_dropout_backward")


def _aten_seeded(short: str) -> bool:
    """Whether torch tags the aten operator of this name as drawing from a generator
    (torch._standard_gamma, torch.binomial, torch._sample_dirichlet: no telling word in their names),
    other than through a dropout argument (lstm, gru, the attention kernels draw only when it is
    nonzero, which a name cannot tell; under vmap, torch.func.vmap checks those calls itself)."""
    overloads = _aten_overloads(short) or []
    return any(torch.Tag.nondeterministic_seeded in o.tags for o in overloads) and not any(
        a.name in ("dropout", "dropout_p") for o in overloads for a in o._schema.arguments)


def _aten_overloads(short: str) -> list | None:
    """The overloads of the aten operator named `short` (None: there is none)."""
    packet = getattr(torch.ops.aten, short, None) if short.isidentifier() else None
    return [getattr(packet, o) for o in packet.overloads()] if isinstance(packet, torch._ops.OpOverloadPacket) else None


def _short_name(fn) -> str:
    return torch_name(fn).rsplit(".", 1)[-1].rsplit("::", 1)[-1]  # torch.nn.functional.x, torch._ops.aten.aten::x


def is_random(fn) -> bool:
    """Whether fn draws from (or reseeds) torch's generator: its name says so, or torch's
    aten operator of that name is tagged nondeterministic_seeded."""
    short = _short_name(fn)
    return short not in _DETERMINISTIC and (any(w in short for w in _RANDOM_WORDS) or _aten_seeded(short))


_may_draw: dict = {}


def may_draw(fn) -> bool:
    """Whether running fn again could draw other random numbers than its first run drew, so an
    opaque op's backward (which runs it again under torch.func) must restore the generator state
    first. Random by is_random, or an aten operator that may draw through a dropout argument (lstm,
    the attention kernels); a function with no aten operator of its name (a Python composite such as
    F.gumbel_softmax, which draws inside) may draw. Only an aten operator that neither is seeded nor
    takes a dropout argument (convolution, embedding, the norms) is known not to."""
    known = _may_draw.get(fn)
    if known is None:
        overloads = _aten_overloads(_short_name(fn))
        known = is_random(fn) or overloads is None or any(
            torch.Tag.nondeterministic_seeded in o.tags or any("dropout" in a.name for a in o._schema.arguments)
            for o in overloads)
        _may_draw[fn] = known
    return known


def _printed(fn) -> str | None:
    """The torch name when it resolves back to fn (so generated code can call it by that name)."""
    name = torch_name(fn)
    return name if resolve_torch_name(name) is fn else None


def opaque_symbol(fn) -> Symbol:
    sym = _symbols.get(fn)
    if sym is None:
        name = torch_name(fn)
        short = name.rsplit(".", 1)[-1]
        tags = {"opaque"} | ({"no_dce", "random"} if is_random(fn) else set())
        printed = _printed(fn)
        if printed is None:
            printed = "opaque_" + "".join(c if c.isalnum() else "_" for c in short).strip("_")
        sym = Symbol(short, ("opaque", name), meta=lambda *a, **k: _meta(fn, a, k), is_prim=True, print_name=printed,
                     namespace={"torch": torch} if printed.startswith("torch.") else {printed: fn}, eager=fn,
                     torch_fn=fn, tags=frozenset(tags))
        _symbols[fn] = sym
    return sym


def aten_call(op) -> Callable:
    """A plain function that calls the aten operator op (an OpOverload), named aten_<op>
    (aten_convolution_backward): the torch executor names an operator after its callable, and an
    OpOverload's own name (convolution_backward.default) is no identifier, so two of them in one
    execution trace would both print as torch_op and clash. One per operator; generated code written
    to disk finds it again by the operator's name (`aten_call_named`, disk_cache.py)."""
    run = _aten_calls.get(op)
    if run is not None:
        return run

    def run(*args, **kwargs):
        return op(*args, **kwargs)

    run.__name__ = run.__qualname__ = "aten_" + op.__name__.split(".")[0].lstrip("_")
    run.__doc__ = f"torch.ops.aten.{op.__name__}"
    run.__thunderfn_found_by__ = ("aten_call", op.__name__)
    _aten_calls[op] = run
    return run


_aten_calls: dict = {}


def aten_call_named(name: str) -> Callable:
    """aten_call of the aten operator called name ("native_layer_norm.default")."""
    packet, _, overload = name.partition(".")
    return aten_call(getattr(getattr(torch.ops.aten, packet), overload or "default"))


def aten_kernel(op) -> Symbol:
    """The aten operator op as an opaque op, called through aten_call(op): a kernel that reverse-mode
    rules call (convolution_backward) and that has no decomposition. Whether it may draw is op's
    answer, not the plain function's (which has no aten operator of its name)."""
    run = aten_call(op)
    _may_draw[run] = may_draw(op)
    return opaque_symbol(run)


def mark_traceable(sym: Symbol) -> None:
    """Say that an opaque op is one torch call without effects that a tracing compiler can call inside
    a compiled graph: fusion executors that call such ops (Inductor) take it into their regions."""
    sym.tags = sym.tags | {"traceable"}


def _to_meta(x, sizes=tuple):
    """A meta tensor for a proxy (its sizes made by `sizes` from the proxy's shape); other values as they are."""
    if isinstance(x, TensorProxy):
        return torch.empty(sizes(x.shape), dtype=x.dtype, device="meta")
    return x


def _device_of(leaves, kwargs) -> torch.device:
    for leaf in leaves:
        if isinstance(leaf, TensorProxy):
            return leaf.device
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    return torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")


class _ValuesDecideShape(Exception):
    """A meta kernel's refusal: the op's output shape depends on its inputs' values (retried on fake tensors)."""


def _run_on_meta(fn, name: str, meta_args, meta_kwargs, *, retried: bool = True):
    """fn's outputs on meta tensors, or UnsupportedOpError saying why it cannot run on shapes;
    an error that is the inputs' fault is re-raised as torch raised it. Where the output shape depends on
    values and `retried` is False, _ValuesDecideShape (the caller runs it on fake tensors)."""
    try:
        with torch._C.DisableTorchFunction():
            return fn(*meta_args, **meta_kwargs)
    except Exception as e:
        if symbolic.is_data_dependent_question(e):  # (asked of a data-dependent size: the trace says which)
            raise
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fake_refusals = (torch._subclasses.fake_tensor.DynamicOutputShapeException,
                         torch._subclasses.fake_tensor.DataDependentOutputException)
        data_dependent = isinstance(e, fake_refusals) or any(
            w in reason for w in ("data-dependent", "data dependent", "data-independent", "item()", "no data",
                                  "without output_size", "Meta tensors"))
        if data_dependent and not retried:
            raise _ValuesDecideShape from None
        # Proxies carry no strides (meta tensors here are contiguous): a complaint about layout is ours, not the
        # input's.
        meta_specific = data_dependent or isinstance(e, NotImplementedError) or any(
            w in reason.lower() for w in ("meta", "stride", "contiguous", "major", "layout", "data pointer", "storage"))
        if not meta_specific and isinstance(e, (IndexError, ValueError, TypeError, RuntimeError)):
            raise  # the op rejects these inputs: the same error eager would raise, torch's own words
        why = ("its output shape or value depends on tensor values, which tracing does not know"
               if data_dependent else f"running it on shapes alone failed ({type(e).__name__}: {reason[:200]})")
        raise UnsupportedOpError(f"{name} has no thunderfn symbol and cannot run as an opaque torch op: {why}. "
                                 f"Call it outside the jitted function.") from None


def _refuse_sparse(fn, name: str, leaves) -> None:
    """Where sparse tensors are why fn could not run on meta tensors (which are strided, as proxies are), say so."""
    tracer = context.current_tracer()
    real = [tracer.real_tensor(x) if tracer is not None and isinstance(x, TensorProxy) else None for x in leaves]
    layouts = {t.layout for t in real if t is not None and t.layout != torch.strided}
    if layouts or _short_name(fn).startswith("to_sparse"):
        what = f"takes a {'/'.join(sorted(map(str, layouts)))} tensor" if layouts else "makes a sparse tensor"
        raise UnsupportedOpError(f"{name} {what}: thunderfn traces strided tensors only (an op without a symbol runs "
                                 f"on strided meta tensors to learn its shapes). Call it outside the jitted function "
                                 f"(or pass x.to_dense())") from None


def _check_outputs(name: str, out) -> None:
    for leaf in tree_flatten(out)[0]:
        if not isinstance(leaf, torch.Tensor) and leaf is not None:
            kind = type(leaf).__name__ if not isinstance(leaf, numbers.Number) else "a Python number"
            raise UnsupportedOpError(f"{name} returns {kind}, a value tracing cannot know; call it outside the "
                                     f"jitted function or keep the result as a tensor")


def _like(x, shape, dtype=None):
    """An output of a shape rule: a proxy while tracing, a meta tensor for a meta tensor (tf.examine's probe)."""
    if isinstance(x, TensorProxy):
        return TensorProxy(shape=tuple(shape), dtype=dtype or x.dtype, device=x.device)
    return torch.empty(tuple(shape), dtype=dtype or x.dtype, device="meta")


def _ctc_loss_shape(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
                    zero_infinity=False):
    # one loss per sequence (none of it unbatched) or their reduction: only the lengths' values are data
    if reduction not in ("none", "mean", "sum"):
        raise ArgumentValueError(f"{reduction} is not a valid value for reduction")
    batched = log_probs.ndim == 3
    shape = (log_probs.shape[1],) if reduction == "none" and batched else ()
    return _like(log_probs, shape)


def _binomial_shape(count, prob, generator=None):
    # no meta kernel: one draw per element of count and prob broadcast, in count's dtype
    shape = torch.broadcast_shapes(tuple(count.shape), tuple(prob.shape))
    return _like(count, shape)


def _like_first_shape(x, *args, **kwargs):
    # no meta kernel: a draw of x's shape and dtype (torch._sample_dirichlet: one simplex per row)
    return _like(x, x.shape)


def _istft_shape(a, n_fft, hop_length=None, win_length=None, window=None, center=True, normalized=False,
                 onesided=None, length=None, return_complex=False):
    # its meta kernel asks whether the window's envelope is nonzero (a value, checked when it runs); the length
    # is the frames' overlap-add, less n_fft // 2 at each end when centered, or `length`
    if not a.dtype.is_complex:
        raise ArgumentRuntimeError("istft requires a complex-valued input tensor matching the output from stft with "
                                   "return_complex=True.")
    if not 2 <= a.ndim <= 3:
        raise ArgumentRuntimeError(f"istft expected a tensor with 2 or 3 dimensions of complex dtype, but got {a.ndim}")
    hop = n_fft // 4 if hop_length is None else hop_length
    overlap_added = n_fft + hop * (a.shape[-1] - 1)
    samples = length if length is not None else overlap_added - (2 * (n_fft // 2) if center else 0)
    return _like(a, (*a.shape[:-2], samples), a.dtype if return_complex else dtypes.to_real(a.dtype))


# Ops whose meta kernel reads tensor values (lengths) although their outputs' shapes do not
# depend on them, or that have no meta kernel at all: the shapes, from the arguments' shapes.
# The op family's module that knows an op registers its rule with shape_rule (torch/linalg.py: geqrf, lstsq).
_SHAPE_RULES = {
    torch.nn.functional.ctc_loss: _ctc_loss_shape,
    torch.binomial: _binomial_shape,
    torch._sample_dirichlet: _like_first_shape,
    torch.istft: _istft_shape,
    torch.Tensor.istft: _istft_shape,
}


def shape_rule(*fns):
    """Decorator: `rule(*args, **kwargs)` gives the outputs (proxies) of the opaque ops fns from their
    arguments' shapes, where torch has no meta kernel or its kernel reads values. A rule may raise a
    named refusal for the arguments whose outputs depend on values, and returns None where torch's meta
    kernel decides after all."""
    def register(rule):
        for fn in fns:
            _SHAPE_RULES[fn] = rule
        return rule
    return register


def _meta(fn, args, kwargs):
    name = torch_name(fn)
    if "random" in opaque_symbol(fn).tags:
        check_rng_untouched(name)
    if fn in _SHAPE_RULES:
        out = _SHAPE_RULES[fn](*args, **kwargs)
        if out is not None:
            return out
    return meta_outputs(fn, args, kwargs)


def meta_outputs(fn, args, kwargs):
    """fn's outputs as proxies, found by running torch's meta kernel on tensors standing for args and kwargs
    (the proxies among them; a meta tensor among them stands for itself: a rule's strides)."""
    name = torch_name(fn)
    leaves, spec = tree_flatten((args, kwargs))
    # symbolic sizes: the meta tensors are fake tensors of the trace's ShapeEnv, where torch's kernels can run
    fake = symbolic.fake_tensor_mode(n for x in leaves for n in (x.shape if isinstance(x, TensorProxy) else (x,)))
    try:
        try:
            out = _run_on_shapes(fn, name, leaves, spec, kwargs, fake, retried=fake is not None)
        except _ValuesDecideShape:  # on fake tensors, where its output sizes become data-dependent sizes
            fake = symbolic_sizes().fake()
            out = _run_on_shapes(fn, name, leaves, spec, kwargs, fake)
    except UnsupportedOpError:
        _refuse_sparse(fn, name, leaves)
        raise
    if fake is not None:
        symbolic_sizes().adopt_fresh([x.shape for x in tree_leaves(out) if isinstance(x, torch.Tensor)],
                                     f"a size of the output of {name} (decided by its input's values)")
    _check_outputs(name, out)
    device = _device_of(leaves, kwargs)
    out_leaves, out_spec = tree_flatten(out)
    proxies = [TensorProxy(shape=x.shape, dtype=x.dtype, device=device) if isinstance(x, torch.Tensor) else x
               for x in out_leaves]
    return tree_unflatten(out_spec, proxies)  # keeps torch.return_types.* (values, indices)


def _run_on_shapes(fn, name: str, leaves, spec, kwargs, fake, *, retried: bool = True):
    """fn's outputs on meta tensors standing for the proxies among leaves (fake ones under `fake`)."""
    with fake if fake is not None else contextlib.nullcontext():
        meta_args, meta_kwargs = tree_unflatten(spec, [_to_meta(x) for x in leaves])
        if kwargs.get("device") is not None or not any(isinstance(x, TensorProxy) for x in leaves):
            # a factory: it must build on meta too, or shape inference would draw real random numbers
            meta_kwargs = dict(meta_kwargs, device="meta")
        return _run_on_meta(fn, name, meta_args, meta_kwargs, retried=retried)


def autograd_connections(bsym):
    """Which of an opaque op's floating inputs torch.autograd connects to which of its outputs,
    as eager records them: (positions among the flattened (args, kwargs) leaves that get a
    gradient, positions among the flattened outputs that require grad). Found by running the
    op and its backward on meta tensors; None when that fails (then every floating input and
    output is taken as connected). An input torch's formula ignores (a loss's target) gets None
    in eager, not zeros; an output torch does not record (x.detach()) does not require grad."""
    leaves, spec = tree_flatten((bsym.args, bsym.kwargs))
    floating = [i for i, x in enumerate(leaves) if isinstance(x, TensorProxy) and (
        x.dtype.is_floating_point or x.dtype.is_complex)]
    if not floating:  # nothing to connect (and a factory must not run here: it would draw real numbers)
        return frozenset(), frozenset()
    try:
        # (called while a trace is built: thunderfn's torch-function mode must not see these calls)
        with torch.enable_grad(), torch._C.DisableTorchFunction():
            # at this call's sizes: which inputs reach which outputs does not depend on the sizes, and torch's
            # backward kernels asking about symbolic ones would guard the trace on them
            meta = [_to_meta(x, symbolic.hints) for x in leaves]
            for i in floating:
                meta[i].requires_grad_()
            args, kwargs = tree_unflatten(spec, meta)
            outs = tree_flatten(bsym.sym.torch_fn(*args, **kwargs))[0]
            recorded = [j for j, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad]
            if not recorded:
                return frozenset(), frozenset()
            grads = torch.autograd.grad([outs[j] for j in recorded], [meta[i] for i in floating],
                                        [torch.ones_like(outs[j]) for j in recorded], allow_unused=True)
    except Exception:  # no meta kernel for the op or its backward: assume everything is connected
        return None
    return frozenset(i for i, g in zip(floating, grads) if g is not None), frozenset(recorded)


def _to_meta_tensor_tree(args, kwargs):
    """(args, kwargs) with real tensors replaced by meta tensors of the same shape and dtype."""
    leaves, spec = tree_flatten((args, kwargs))
    meta = [torch.empty(x.shape, dtype=x.dtype, device="meta") if isinstance(x, torch.Tensor) else x for x in leaves]
    meta_args, meta_kwargs = tree_unflatten(spec, meta)
    if not any(isinstance(x, torch.Tensor) for x in leaves):
        meta_kwargs = dict(meta_kwargs, device="meta")
    return meta_args, meta_kwargs


def probe_opaque(fn, meta_args, meta_kwargs) -> str | None:
    """Why fn cannot run as an opaque op on these (meta) arguments, or None if it can."""
    name = torch_name(fn)
    try:
        if fn in _SHAPE_RULES:  # a rule makes proxies, so it answers inside a trace
            trace(lambda *a, **k: fn(*a, **k), *meta_args, **meta_kwargs)
            return None
        _check_outputs(name, _run_on_meta(fn, name, meta_args, meta_kwargs))
    except UnsupportedOpError as e:
        return str(e).split(": ", 1)[-1]
    except Exception as e:
        return f"torch rejects these inputs ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
    return None


def run_opaque(fn, args, kwargs):
    """Trace fn as an opaque op (called while tracing, for a torch callable with no symbol)."""
    if kwargs.get("out") is not None:
        raise UnsupportedOpError(f"{torch_name(fn)}(out=...) writes into an argument, which thunderfn does not trace; "
                                 f"use the result instead")
    return opaque_symbol(fn)(*args, **kwargs)


# -- differentiating an opaque op: torch.func, when the compiled function runs ----------------
# (reverse mode, transforms/autodiff.py, records torch_vjp_op in a backward where it meets an opaque op;
# forward mode, transforms/forward_mode.py, torch_jvp_op beside the op)
@contextlib.contextmanager
def _drawing_again(rng_state):
    """Around a second run of an opaque op (under torch.func, for its derivative): torch's generator
    set to `rng_state`, the state the op first ran from (None: the op cannot draw), so a random op
    draws what its first run drew and its derivative is the derivative of that run; afterwards the
    generator is back where the first run left it, so what follows draws as in eager."""
    with torch.random.fork_rng(devices=[]):
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        yield


def torch_vjp(fn, args, kwargs, cotangents, wrt, rng_state):
    """Cotangents of the flat argument leaves at positions `wrt` of fn(*args, **kwargs), given
    cotangents of its floating outputs (in order), by torch.func. fn is run again from the
    generator state it first ran with, so random ops draw what the forward drew."""
    leaves, spec = tree_flatten((args, kwargs))
    of_wrt = of_leaves(fn, leaves, spec, wrt)

    def call(*diff):
        outs = tree_flatten(of_wrt(*diff))[0]
        return tuple(o for o in outs if isinstance(o, torch.Tensor) and dtypes.is_inexact(o.dtype))

    with _drawing_again(rng_state):
        try:
            _, pullback = torch.func.vjp(call, *[leaves[i] for i in wrt])
        except RuntimeError as e:
            named_functorch_refusal(fn, e)
            if "storage" not in str(e):
                raise
            # a kernel that reads its inputs' memory directly (CPU ctc_loss) cannot see through
            # torch.func's wrappers: differentiate it with torch.autograd (no higher orders; nor has eager)
            if rng_state is not None:
                torch.set_rng_state(rng_state)
            return _autograd_vjp(call, [leaves[i] for i in wrt], cotangents)
    return pullback(tuple(cotangents))


def named_functorch_refusal(fn, e: RuntimeError) -> None:
    """Raise a UserGradientError for torch.func's refusal of a Python autograd formula inside an
    opaque op (a torch.autograd.Function without setup_context: what torch.library.register_autograd
    registers); return for any other error."""
    if "must override the setup_context staticmethod" not in str(e):
        return
    raise UserGradientError(
        f"thunderfn runs {torch_name(fn)} as an opaque op, transformed by torch.func, which refuses the Python "
        f"autograd formula inside it (a torch.autograd.Function without setup_context, as "
        f"torch.library.register_autograd makes). Import thunderfn before registering the formula (thunderfn then "
        f"uses the registered backward), define the op with torch.library.custom_op, or call it outside the "
        f"transformed function.") from None


def _autograd_vjp(call, primals, cotangents):
    with torch.enable_grad():
        inputs = [p.detach().requires_grad_() for p in primals]
        outs = call(*inputs)
        grads = torch.autograd.grad(outs, inputs, tuple(cotangents), allow_unused=True)
    return tuple(torch.zeros_like(p) if g is None else g for p, g in zip(primals, grads))


def _torch_vjp_meta(fn, args, kwargs, cotangents, wrt, rng_state):
    leaves = tree_leaves((args, kwargs))
    return tuple(TensorProxy.like(leaves[i], requires_grad=False) for i in wrt)


torch_vjp_op = Symbol("torch_vjp", "autodiff.torch_vjp", meta=_torch_vjp_meta, is_prim=True, print_name="torch_vjp",
                      namespace={"torch_vjp": torch_vjp}, eager=torch_vjp, torch_fn=torch_vjp,
                      tags=frozenset({"opaque"}))


def torch_jvp(fn, args, kwargs, tangents, wrt, rng_state):
    """The output tangent(s) of fn(*args, **kwargs) for `tangents` of the flat argument leaves at
    positions `wrt` (the others are constants: torch refuses a tangent on some inputs, batch norm's
    running statistics, even a zero one), by torch.func. As in torch_vjp, fn is run again from the
    generator state it first ran with: a random op's tangent is taken with the primal's draws
    (dropout's mask, rrelu's slopes, fractional max pooling's windows), not with draws of its own."""
    leaves, spec = tree_flatten((args, kwargs))
    call, rebuild = output_leaves(of_leaves(fn, leaves, spec, wrt))
    with _drawing_again(rng_state):
        try:
            _, out_tangent = torch.func.jvp(call, tuple(leaves[i] for i in wrt), tuple(tangents))
        except RuntimeError as e:
            named_functorch_refusal(fn, e)
            raise
    return rebuild(out_tangent)


def _torch_jvp_meta(fn, args, kwargs, tangents, wrt, rng_state):
    out = _meta(fn, args, kwargs)
    return tree_unflatten(tree_flatten(out)[1], [TensorProxy.like(o) for o in tree_leaves(out)])


torch_jvp_op = Symbol("torch_jvp", "forward_mode.torch_jvp", meta=_torch_jvp_meta, is_prim=True, print_name="torch_jvp",
                      namespace={"torch_jvp": torch_jvp}, eager=torch_jvp, torch_fn=torch_jvp,
                      tags=frozenset({"opaque"}))
