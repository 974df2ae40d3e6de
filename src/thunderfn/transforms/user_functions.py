"""User gradients in traced code: torch.autograd.Function and torch.library custom ops.

A `MyFn.apply(...)` call made while tracing does not run torch's machinery (which would run
the forward with grad disabled and keep the backward in torch's graph, out of the trace's
sight). It becomes a tf.custom_vjp call, one per call site and trace (`UserFunction`):

- its fwd traces the user's forward with a `TracedCtx` as `ctx` (old style `forward(ctx,
  ...)`, or new style `forward(...)` then `setup_context(ctx, inputs, output)`). What ctx
  holds when the forward returns (save_for_backward's tensors, save_for_forward's, every
  attribute the user set) is the residual pytree; tensors in it are residual values;
- its bwd is the user's `backward(ctx, *grads)`, traced with a ctx rebuilt from the
  residuals, so the backward is recorded ops that grad(grad(f)) differentiates again. A
  backward marked @once_differentiable is recorded as a symbol whose VJP refuses;
- `needs_input_grad`, `mark_non_differentiable`, `set_materialize_grads` mean what they
  mean in eager; the gradients the backward returns are checked and summed to their input's
  shape as torch.autograd does;
- under vmap: the Function's `vmap` staticmethod, or with `generate_vmap_rule = True` its
  forward and backward vmapped (a custom_vjp's batching), else a BatchingError (torch.func
  refuses alike); under jvp/jacfwd: its `jvp` staticmethod, else a UserGradientError.

A torch.library operator with `register_autograd` (made by `torch.library.custom_op`, or
defined with `torch.library.define` and registered after thunderfn is imported) is the same
with the op (run by torch, shapes from its registered fake) as the forward, its setup_context
and its registered backward. Dispatch finds it through `register_handler_finder`.

Nothing is dropped silently: what cannot be transformed raises UserGradientError (or
BatchingError under vmap), a subclass of RuntimeError, naming the Function and why.

A transform: may import core/, prims, the torch language and the other transforms.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
import weakref

import optree
import torch
import torch._library.autograd
import torch.utils.checkpoint
from torch._library import custom_ops as _torch_custom_ops
from torch._library import utils as _torch_library_utils

import thunderfn.torch as ltorch
from thunderfn import prims
from thunderfn.core import context, dtypes
from thunderfn.core.interception import lift_constants, register_handler_finder
from thunderfn.core.proxies import TensorProxy, entry_by_name
from thunderfn.core.pytree import tree_leaves
from thunderfn.core.rules import JVPRule, drop_rule, set_rule
from thunderfn.errors import BatchingError, UserGradientError
from thunderfn.torch.checkpoint import checkpoint
from thunderfn.torch.opaque import run_opaque
from thunderfn.torch.reductions import sum_to
from thunderfn.transforms.custom_vjp import custom_vjp
from thunderfn.transforms.rules.define import wants_gradient

_NAMESPACE = "thunderfn"


def _leaves(tree) -> list:
    """Every leaf, None included (the reverse-mode driver gives a cotangent slot to each)."""
    return optree.tree_leaves(tree, none_is_leaf=True, namespace=_NAMESPACE)


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _differentiable(x) -> bool:
    return _is_tensor(x) and dtypes.is_inexact(x.dtype)


# -- what a user gradient is: a Function, or a custom op --------------------------------------
@dataclasses.dataclass
class Spec:
    """One kind of user gradient. `forward(ctx, args, kwargs) -> output` runs the forward and
    fills ctx; `backward(ctx, *grads)`; `jvp(ctx, *tangents)` or None; `vmap(info, in_dims, *args)`
    or None; `generate_vmap_rule`: batch forward and backward by vmapping them."""
    name: str  # how errors name it: "autograd.Function 'Sq'", "custom op 'mylib::cube'"
    label: str  # how the trace names its calls: user_function_<label>
    forward: object
    backward: object
    jvp: object = None
    vmap: object = None
    generate_vmap_rule: bool = False
    note: str = ""  # appended to refusals (torch.func's own requirement an old-style Function misses)


def _overrides(cls, name: str) -> bool:
    """Whether cls defines its own `name` staticmethod rather than torch's default (which raises)."""
    own = getattr(cls, name, None)
    base = getattr(torch.autograd.Function, name, None)
    return own is not None and getattr(own, "__func__", own) is not getattr(base, "__func__", base)


def _has_setup_context(cls) -> bool:
    return torch.autograd.function._is_setup_context_defined(cls.setup_context)


def function_spec(cls) -> Spec:
    if _has_setup_context(cls):
        def forward(ctx, args, kwargs):
            out = cls.forward(*args, **kwargs)
            cls.setup_context(ctx, args, out)
            return out
    else:
        def forward(ctx, args, kwargs):
            return cls.forward(ctx, *args, **kwargs)
    return Spec(f"autograd.Function '{cls.__qualname__}'", cls.__name__, forward, cls.backward,
                jvp=cls.jvp if _overrides(cls, "jvp") else None,
                vmap=cls.vmap if _overrides(cls, "vmap") else None,
                generate_vmap_rule=bool(getattr(cls, "generate_vmap_rule", False)),
                note="" if _has_setup_context(cls) else (
                    " (torch.func also requires the new style for this: forward without ctx, and a setup_context "
                    "staticmethod)"))


# -- ctx -----------------------------------------------------------------------------------------
_BOOKKEEPING = frozenset({"needs_input_grad", "_saved", "_saved_for_forward", "_non_differentiable",
                          "_materialize", "_name", "_in_jvp"})


class TracedCtx(torch.autograd.function.FunctionCtx):
    """The `ctx` a user's forward, setup_context, backward and jvp see while tracing."""

    def __init__(self, name: str, needs_input_grad: tuple):
        self._name = name
        self.needs_input_grad = needs_input_grad
        self._saved = ()
        self._saved_for_forward = ()
        self._non_differentiable: list = []
        self._materialize = True
        self._in_jvp = False

    def save_for_backward(self, *tensors):
        self._saved = tensors

    def save_for_forward(self, *tensors):
        self._saved_for_forward = tensors

    @property
    def saved_tensors(self):
        return tuple(self._saved_for_forward if self._in_jvp else self._saved)

    saved_variables = saved_tensors

    def mark_non_differentiable(self, *tensors):
        self._non_differentiable.extend(tensors)

    def set_materialize_grads(self, value: bool):
        self._materialize = bool(value)

    def mark_dirty(self, *tensors):
        raise UserGradientError(
            f"{self._name} modifies an input in place (ctx.mark_dirty), which thunderfn's transforms do not "
            f"trace inside a Function: return a new tensor from forward instead (x.clone().mul_(2), or x * 2), "
            f"and assign it where the caller needs it.")

    def attributes(self) -> dict:
        """What the user stored on ctx (ctx.scale = 2, ctx.shape = x.shape, ctx.w = w)."""
        return {k: v for k, v in vars(self).items() if k not in _BOOKKEEPING}


@dataclasses.dataclass
class CallInfo:
    """Python facts of one call that the backward needs (a residual leaf that is no tensor):
    per argument, (shape, dtype) for a tensor and None otherwise; per output position,
    (shape, dtype, device) for a tensor that gets a cotangent and None otherwise."""
    args: tuple
    outputs: tuple
    single: bool  # forward returned one value, not a tuple
    materialize: bool


def _residuals(ctx: TracedCtx, info: CallInfo):
    attributes = ctx.attributes()
    for leaf in tree_leaves(attributes):
        if not isinstance(leaf, TensorProxy) and _holds_proxy(leaf):
            raise UserGradientError(
                f"{ctx._name} stores a tensor on ctx inside a {type(leaf).__name__} object, which thunderfn cannot "
                f"look into to keep it for the backward: store the tensor itself (ctx.t = t), in a tuple, list or "
                f"dict, or save it with ctx.save_for_backward.")
    return (tuple(ctx._saved), tuple(ctx._saved_for_forward), attributes, info)


def _holds_proxy(obj, depth: int = 0) -> bool:
    """Whether a traced tensor hides in obj's attributes (a few levels deep)."""
    if isinstance(obj, TensorProxy):
        return True
    if depth > 3 or isinstance(obj, (type, torch.nn.Module)):
        return False
    attributes = getattr(obj, "__dict__", None)
    values = attributes.values() if isinstance(attributes, dict) else obj if isinstance(obj, (set, frozenset)) else ()
    return any(_holds_proxy(v, depth + 1) for v in values)


def _rebuilt_ctx(name: str, residuals, needs: tuple) -> TracedCtx:
    saved, saved_forward, attributes, info = residuals
    ctx = TracedCtx(name, needs)
    ctx._saved, ctx._saved_for_forward, ctx._materialize = saved, saved_forward, info.materialize
    for k, v in attributes.items():
        setattr(ctx, k, v)
    return ctx


@contextlib.contextmanager
def _as_user_code():
    """Run user code inside a symbol's body as if at the top of the trace: every torch call it
    makes is traced (a factory or random call without a traced argument too, which a symbol's
    body would otherwise run once, at trace time). It ends in the grad mode it began in, as a
    Function's forward and backward do in eager: a switch the user code made and did not undo
    (Dynamo's captured forward ends with one) is undone and recorded so, inside the body."""
    tracer = context.current_tracer()
    depth, tracer.symbol_depth = tracer.symbol_depth, 0
    mode = torch.is_grad_enabled()
    try:
        yield
    finally:
        torch._C._set_grad_enabled(mode)
        tracer.sync_grad_mode()
        tracer.symbol_depth = depth


def _fresh(x, inputs: set):
    """An output that is an input (`return x`) as a new value: eager returns a new tensor with
    the Function's backward, and the trace must tell the two apart to route gradients."""
    if isinstance(x, TensorProxy) and id(x) in inputs:
        return prims.reshape(x, tuple(x.shape))
    return x


# -- one call: a custom_vjp ----------------------------------------------------------------------
class UserFunction(custom_vjp):
    """One traced call of a user gradient (see the module docstring): a custom_vjp whose fwd
    runs the user's forward, whose bwd runs the user's backward."""

    def __init__(self, spec: Spec, n_args: int):
        self.spec, self.n_args = spec, n_args

        def forward_only(*args, **kwargs):
            return self.fwd(*args, **kwargs)[0]

        forward_only.__name__ = "".join(c if c.isalnum() else "_" for c in spec.label)
        super().__init__(forward_only)
        self.defvjp(self._fwd, self._bwd)
        self._symbol.name = self._symbol.print_name = f"user_function_{forward_only.__name__}"
        self._symbol.tags = self._symbol.tags | {"user_function"}
        set_rule(self._symbol.id, "jvp", JVPRule(_WeakJVP(self)))
        weakref.finalize(self, drop_rule, self._symbol.id, "jvp")
        # vmap (transforms/vmap.py) asks a custom_vjp for its own batching: None means vmap its fwd and bwd
        self.vmap_rule = None if spec.generate_vmap_rule and spec.vmap is None else self._batch

    # forward
    def _fwd(self, *args, **kwargs):
        with _as_user_code():
            # which inputs are differentiated is known only when the backward is traced (_backward):
            # here every floating tensor may be, so a forward saving only what some gradient needs saves enough
            needs = tuple(_differentiable(a) for a in args)
            ctx = TracedCtx(self.spec.name, needs)
            proxies = [(a, a.name) for a in tree_leaves((args, kwargs)) if isinstance(a, TensorProxy)]
            out = self.spec.forward(ctx, args, kwargs)
            if any(p.name != name for p, name in proxies):
                raise UserGradientError(
                    f"{self.spec.name} modifies an input in place in its forward, which thunderfn's transforms do not "
                    f"trace: return a new tensor instead (x.clone().mul_(2), or x * 2).")
            inputs = {id(p) for p, _ in proxies}
            single = not isinstance(out, tuple)
            non_diff = {id(t) for t in ctx._non_differentiable}
            outputs = (out,) if single else out
            info = CallInfo(
                args=tuple((tuple(a.shape), a.dtype) if _is_tensor(a) else None for a in args),
                outputs=tuple((tuple(o.shape), o.dtype, o.device)
                              if _differentiable(o) and id(o) not in non_diff else None for o in outputs),
                single=single, materialize=ctx._materialize)
            out = _fresh(out, inputs) if single else tuple(_fresh(o, inputs) for o in out)
        return out, _residuals(ctx, info)

    # backward
    def _backward(self, call, g):
        """The reverse-mode driver's call: g holds one cotangent per leaf of (output, residuals)."""
        out, residuals = call.out
        out_leaves = _leaves(out)
        flat = list(g)[:len(out_leaves)] if isinstance(g, tuple) else [g]
        g_out = optree.tree_unflatten(optree.tree_structure(out, none_is_leaf=True, namespace=_NAMESPACE), flat)
        needs = tuple(wants_gradient(a) for a in call.args) + (False,) * max(0, self.n_args - len(call.args))
        return self._bwd(residuals, g_out, needs=needs)

    def _bwd(self, residuals, g, needs=None):
        info = residuals[3]
        if needs is None:  # vmapped: which arguments the caller differentiates is not known here
            needs = tuple(a is not None and dtypes.is_inexact(a[1]) for a in info.args)
        grads = []
        g_outputs = (g,) if info.single else tuple(g)
        for o, ct in zip(info.outputs, g_outputs):
            if o is None or not isinstance(ct, TensorProxy):
                ct = None
            if ct is None and o is not None and info.materialize:
                ct = ltorch.full(o[0], 0, device=o[2], dtype=o[1])
            grads.append(ct)
        ctx = _rebuilt_ctx(self.spec.name, residuals, needs)
        backward = self.spec.backward
        once = _once_differentiable(backward)
        if once is not None:
            result = _run_once_differentiable(self.spec.name, once, ctx, grads)
        else:
            with _as_user_code():
                result = backward(ctx, *grads)
        return self._checked_gradients(result, info, needs)

    def _checked_gradients(self, result, info: CallInfo, needs) -> tuple:
        result = result if isinstance(result, tuple) else (result,)
        n = len(info.args)
        if len(result) < n or any(r is not None for r in result[n:]):
            raise UserGradientError(
                f"{self.spec.name}: backward returned {len(result)} gradients, but forward took {n} inputs: return "
                f"one per input of forward (None for inputs that get none)")
        cts = []
        result = lift_constants(tuple(result))  # a tensor the backward captured (returned as is) is a constant
        for i, (meta, ct) in enumerate(zip(info.args, result[:n])):
            if ct is None or meta is None:
                if ct is not None and _is_tensor(ct):
                    raise UserGradientError(
                        f"{self.spec.name}: backward returned a gradient for input {i}, which is not a tensor: "
                        f"return None at that position")
                cts.append(None)
                continue
            shape, dtype = meta
            if not needs[i] or not dtypes.is_inexact(dtype) or not isinstance(ct, TensorProxy):
                cts.append(None)
                continue
            if tuple(ct.shape) != shape:
                if not _expandable(shape, tuple(ct.shape)):
                    raise UserGradientError(
                        f"{self.spec.name}: backward returned a gradient of shape {tuple(ct.shape)} for input {i}, "
                        f"whose shape is {shape} (torch.autograd: 'invalid gradient at index {i}'); return a "
                        f"gradient of the input's shape")
                ct = sum_to(ct, shape)
            cts.append(ltorch.to(ct, dtype) if ct.dtype != dtype else ct)
        return tuple(cts)

    # forward mode
    def _tangent(self, call, tangents):
        out, residuals = call.out
        if self.spec.jvp is None:
            raise UserGradientError(
                f"tf.jvp / tf.jacfwd of {self.spec.name}: it defines no jvp staticmethod, and its backward does not "
                f"give forward-mode derivatives. Define `jvp(ctx, *input_tangents)` (save what it needs with "
                f"ctx.save_for_forward), or differentiate in reverse mode (tf.grad, tf.vjp, "
                f"tf.jacrev).{self.spec.note}")
        info = residuals[3]
        filled = tuple(t if t is not None else (ltorch.full(a[0], 0, device=arg.device, dtype=a[1])
                                                if a is not None and dtypes.is_inexact(a[1]) else None)
                       for t, a, arg in zip(tangents, info.args, call.args))
        ctx = _rebuilt_ctx(self.spec.name, residuals, tuple(t is not None for t in tangents))
        ctx._in_jvp = True
        with _as_user_code():
            result = self.spec.jvp(ctx, *filled)
        result = (result,) if info.single else tuple(result)
        outputs = (out,) if info.single else out
        flat = []
        for o, t, meta in zip(outputs, result, info.outputs):  # no tangent for a non-differentiable output
            leaves = _leaves(o)
            flat.extend([t] if isinstance(o, TensorProxy) and meta is not None else [None] * len(leaves))
        return tuple(flat) + (None,) * len(_leaves(residuals))

    # vmap
    def _batch(self, batching, bsym) -> None:
        """Batch one call of this Function (transforms/vmap.py): by its vmap staticmethod, or refuse."""
        if self.spec.vmap is None:
            raise BatchingError(
                f"vmap cannot batch {self.spec.name}: it defines no vmap staticmethod and does not set "
                f"generate_vmap_rule = True (torch.func.vmap refuses it too). Set `generate_vmap_rule = True` on the "
                f"class when its forward and backward are torch operations vmap can batch, or define "
                f"`vmap(info, in_dims, *args)`.{self.spec.note}")
        tracer = context.current_tracer()
        out, residuals = bsym.output
        if any(isinstance(r, TensorProxy) for r in tree_leaves(residuals)):
            # a backward recorded already (vmap of a gradient) reads the residuals: batch them through the
            # forward's recorded ops; the outputs come from the user's rule below
            values, dims = dict(batching.values), dict(batching.dims)
            with tracer.scope() as tried:
                try:
                    for sub in bsym.subsymbols:
                        batching.run(sub)
                except BatchingError:  # not batchable op by op (why the Function has a vmap rule): left out
                    tried.clear()
                    batching.values, batching.dims = values, dims
            for b in tried:
                tracer.emit(b)
        args = tuple(optree.tree_map(lambda v: batching.values.get(v.name, v) if isinstance(v, TensorProxy) else v,
                                     a, none_is_leaf=True, namespace=_NAMESPACE) for a in bsym.args)
        in_dims = tuple(entry_by_name(a, batching.dims) for a in bsym.args)
        info = torch._functorch.autograd_function.VmapInfo(batching.batch_size, batching.randomness)
        with _as_user_code():
            result = self.spec.vmap(info, in_dims, *args)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise BatchingError(f"{self.spec.name}.vmap must return (output, out_dims), got {type(result).__name__}")
        batched, out_dims = result
        example = bsym.output[0]
        outputs = (example,) if not isinstance(example, tuple) else example
        values = (batched,) if not isinstance(example, tuple) else tuple(batched)
        dims = out_dims if isinstance(out_dims, tuple) and isinstance(example, tuple) else (out_dims,) * len(outputs)
        for o, v, d in zip(outputs, values, dims):
            if not isinstance(o, TensorProxy):
                continue
            if d is None:
                batching.values[o.name] = v
                batching.dims.pop(o.name, None)
            else:
                batching.bind(o, v, d)


def differentiable_outputs(bsym) -> set:
    """The names of a recorded user gradient call's outputs that carry gradient (not marked
    non-differentiable, floating): what requires grad after it in eager."""
    out, residuals = bsym.output
    info = residuals[3]
    outputs = (out,) if info.single else out
    return {o.name for o, meta in zip(outputs, info.outputs) if isinstance(o, TensorProxy) and meta is not None}


class _WeakJVP:
    """A UserFunction's JVP rule, called while the UserFunction is alive."""

    def __init__(self, owner: UserFunction):
        self._owner = weakref.ref(owner)

    def __call__(self, call, tangents):
        return self._owner()._tangent(call, tangents)


def _expandable(shape: tuple, to: tuple) -> bool:
    """Whether a tensor of `shape` broadcasts to `to` (torch.autograd then sums a gradient of
    shape `to` back to `shape`)."""
    if len(shape) > len(to):
        return False
    return all(s == t or s == 1 for s, t in zip(reversed(shape), reversed(to)))


# -- @once_differentiable ------------------------------------------------------------------------
_ONCE_CODE = torch.autograd.function.once_differentiable(lambda ctx: None).__code__


def _once_differentiable(backward):
    """The function under @once_differentiable, or None when backward is not marked so."""
    fn = getattr(backward, "__func__", backward)
    if getattr(fn, "__code__", None) is _ONCE_CODE and hasattr(fn, "__wrapped__"):
        return fn.__wrapped__
    return None


def _run_once_differentiable(name: str, fn, ctx, grads):
    """The backward recorded as one symbol whose own VJP refuses: differentiating it again (grad
    of grad) raises, as eager's double backward does."""
    inputs = [x for x in tree_leaves((grads, ctx.saved_tensors, ctx.attributes())) if isinstance(x, TensorProxy)]

    def run(*_inputs):  # reads the same proxies through ctx and grads: they are its arguments
        with _as_user_code():
            return fn(ctx, *grads)

    def refuse(residuals, g):
        raise UserGradientError(
            f"{name}: its backward is marked @once_differentiable, so it cannot be differentiated again (grad of "
            f"grad, or create_graph): torch raises 'trying to differentiate twice a function that was marked with "
            f"@once_differentiable'. Remove the decorator if its backward is made of differentiable torch operations.")

    run.__name__ = "once_differentiable_backward"
    once = custom_vjp(run)
    once.defvjp(lambda *a: (run(*a), None), refuse)
    return once(*inputs)  # the recorded symbol holds `once` (and its rule) for as long as the trace lives


# -- the call ------------------------------------------------------------------------------------
def apply(spec: Spec, args: tuple, kwargs: dict):
    """A user gradient called while tracing: recorded as a UserFunction (see the module docstring)."""
    rule = UserFunction(spec, len(args))
    return rule(*args, **kwargs)


def _bound_positionally(cls, args, kwargs):
    """Keyword arguments of apply moved to their positions of forward (what torch does for a
    new-style Function; an old-style forward takes ctx first)."""
    if not kwargs:
        return tuple(args), {}
    ctx = () if _has_setup_context(cls) else (None,)  # a stand-in for an old-style forward's ctx
    bound = inspect.signature(cls.forward).bind(*ctx, *args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.args[len(ctx):]), dict(bound.kwargs)


# torch's Function.apply: a Python classmethod up to torch 2.13, a C one (a classmethod_descriptor, called with
# the class first) from 2.14
_installed = torch.autograd.Function.__dict__["apply"]
_installed = _installed.__func__ if isinstance(_installed, classmethod) else _installed
_original_apply = getattr(_installed, "__thunderfn_original__", _installed)  # torch's, even if this module reloads
_CheckpointFunction = torch.utils.checkpoint.CheckpointFunction
_watchers = threading.local()  # tf.examine's: called with each Function class applied outside tracing


@functools.wraps(_original_apply)
def _apply(cls, *args, **kwargs):
    tracer = context.current_tracer()
    # Traced: a call on traced tensors, or one user code makes on real tensors (captured ones) at the
    # top of the trace. Not a call thunderfn's own machinery makes on real or meta tensors while
    # tracing (an opaque op's shapes and autograd connections), which runs with torch functions off.
    if tracer is not None and (any(isinstance(x, TensorProxy) for x in tree_leaves((args, kwargs))) or (
            tracer.symbol_depth == 0 and torch._C._is_torch_function_enabled())):
        if cls is _CheckpointFunction:
            # torch.utils.checkpoint(use_reentrant=True): a region computed again in the backward, saving
            # nothing but its inputs, as eager's (torch/checkpoint.py)
            run_function, _preserve_rng_state, *rest = args
            return checkpoint(run_function)(*rest)
        args, kwargs = _bound_positionally(cls, args, kwargs)
        return apply(function_spec(cls), args, kwargs)
    for watch in getattr(_watchers, "stack", ()):
        watch(cls)
    return _original_apply(cls, *args, **kwargs)


# Function.apply is a classmethod torch calls without a torch-function hook: it is replaced, once,
# by one that traces the call when a trace is being built and is torch's own otherwise. (Dynamo
# recognizes a Function's `apply` by its name, which the wrapper keeps.)
_apply.__thunderfn_original__ = _original_apply
torch.autograd.Function.apply = classmethod(_apply)


@contextlib.contextmanager
def watching_functions(callback):
    """Call callback(cls) for each torch.autograd.Function applied eagerly inside the block (tf.examine)."""
    stack = getattr(_watchers, "stack", None)
    if stack is None:
        stack = _watchers.stack = []
    stack.append(callback)
    try:
        yield
    finally:
        stack.pop()


# -- custom ops ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RegisteredGradient:
    """The gradient torch.library.register_autograd gave an operator."""
    op: object  # the OpOverload
    name: str  # its qualified name, "mylib::cube"
    backward: object
    setup_context: object  # or None


# register_autograd on an operator that torch.library.custom_op did not make (one defined with
# torch.library.define) keeps its formula only inside the autograd kernel it registers: recorded here
# as torch makes that kernel, by op. (Formulas registered before thunderfn was imported are not seen;
# torch.func then refuses the op when it is differentiated, torch/opaque.py's torch_vjp.)
_library_gradients: dict = {}
_make_autograd_impl = torch._library.autograd.make_autograd_impl


@functools.wraps(_make_autograd_impl)
def _recording_make_autograd_impl(op, info):
    if not isinstance(info, _torch_custom_ops.CustomOpDef):
        _library_gradients[op] = info
    return _make_autograd_impl(op, info)


if getattr(_make_autograd_impl, "__wrapped__", None) is None:
    torch._library.autograd.make_autograd_impl = _recording_make_autograd_impl


def registered_gradient(func) -> RegisteredGradient | None:
    """The gradient registered with torch.library.register_autograd for an operator (an overload,
    or a packet's default), or None."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        func = getattr(func, "default", None)
    if not isinstance(func, torch._ops.OpOverload):
        return None
    opdef = _torch_custom_ops.OPDEFS.get(func._schema.name)
    if opdef is not None and opdef._opoverload is func and opdef._backward_fn is not None:
        return RegisteredGradient(func, opdef._qualname, opdef._backward_fn, opdef._setup_context_fn)
    info = _library_gradients.get(func)
    if info is not None and info._backward_fn is not None:
        return RegisteredGradient(func, func._schema.name, info._backward_fn, info._setup_context_fn)
    return None


def custom_op_spec(registered: RegisteredGradient) -> Spec:
    op, setup_context = registered.op, registered.setup_context
    kwarg_only = _torch_library_utils.has_kwarg_only_args(op._schema)

    def forward(ctx, args, kwargs):
        out = run_opaque(op, args, kwargs)
        if setup_context is not None:
            inputs, keyword_only = _torch_library_utils.fill_defaults(op._schema, args, kwargs)
            if kwarg_only:
                setup_context(ctx=ctx, inputs=inputs, keyword_only_inputs=keyword_only, output=out)
            else:
                setup_context(ctx=ctx, inputs=inputs, output=out)
        return out

    # a custom op's vmap is torch's (register_vmap), applied by torch.func.vmap to the batched forward
    return Spec(f"custom op '{registered.name}'", registered.name, forward, registered.backward,
                generate_vmap_rule=True)


def _custom_op_arguments(op, args, kwargs):
    """(args, kwargs) with every argument that is not keyword-only at its position, defaults filled
    in: setup_context reads its inputs by position, and the backward gives one gradient per position."""
    args, kwargs = list(args), dict(kwargs)
    for i, a in enumerate(op._schema.arguments):
        if a.kwarg_only or i < len(args):
            continue
        if a.name in kwargs:
            args.append(kwargs.pop(a.name))
        elif a.has_default_value():
            args.append(a.default_value)
        else:
            break  # a required argument is missing: the op's own check raises
    return tuple(args), kwargs


def _custom_op_handler(func):
    registered = registered_gradient(func)
    if registered is None:
        return None
    op = registered.op
    if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        return None  # an op that mutates its arguments stays opaque (its in-place write is traced as such)

    def handler(*args, **kwargs):
        args, kwargs = _custom_op_arguments(op, args, kwargs)
        return apply(custom_op_spec(registered), args, kwargs)

    return handler


register_handler_finder(_custom_op_handler)
