"""custom_vjp: a user-supplied gradient, the same mechanism the VJP rule table uses.

    @tf.custom_vjp
    def f(x, y): ...
    f.defvjp(fwd, bwd)   # fwd(*args) -> (out, residuals); bwd(*nondiff_args, residuals, g) -> one entry per arg

Traced, a call records one symbol of its own whose body is `fwd` and whose outputs are
(out, residuals); its VJP rule in the rule table calls `bwd`, after checking that bwd returned
one cotangent (or None) per differentiable argument with the argument's structure and
shapes. Called with real tensors outside any transform, it is `fn`, unless torch.autograd
will differentiate the call (grad mode on, a tensor requiring grad among its arguments):
then it runs jitted, so `f(x).backward()` uses the rule as `tf.grad(f)` does.

An executor's `register_lowering(..., vjp=(fwd, bwd))` becomes a custom_vjp function too
(executors/base.py; executors do not import transforms, so this module registers
custom_vjp for them in core/context.py). A transform: may import core/, prims, clang,
the torch language and the other transforms, never executors or jit (core/context.py's
jit is jit's, registered there).
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import weakref

import optree
import torch

import thunderfn.torch as ltorch
from thunderfn import prims
from thunderfn.core import context
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten
from thunderfn.core.rules import VJPRule, drop_rule, set_rule
from thunderfn.core.symbol import Symbol
from thunderfn.errors import ArgumentTypeError, ArgumentValueError
from thunderfn.transforms.autodiff import trace_vjp

_ids = itertools.count()


class _RunningFwd(threading.local):
    def __init__(self):
        self.ids: set = set()  # id() of each custom_vjp whose fwd this thread is running


_running_fwd = _RunningFwd()


def refuse_traced_nondiff_args(kind: str, name: str, nondiff_argnums, args, instead: str) -> None:
    """nondiff_argnums hold values no derivative flows to (Python numbers, functions): a traced
    tensor among them would silently get no gradient, so it is refused (custom_vjp, custom_jvp)."""
    for i in nondiff_argnums:
        if i < len(args) and any(isinstance(x, TensorProxy) for x in tree_leaves(args[i])):
            raise ArgumentTypeError(f"{kind} '{name}': argument {i} is in nondiff_argnums but holds a traced tensor. "
                                    f"nondiff_argnums are for values derivatives never flow to (Python numbers, "
                                    f"functions); {instead}.")


class custom_vjp:
    """Give fn a hand-written vector-Jacobian product (reverse-mode rule), as jax.custom_vjp.

    Decorate fn, then set the rule with `f.defvjp(fwd, bwd)`: `fwd(*args) -> (out, residuals)`
    computes the output and whatever the backward needs; `bwd(*nondiff_args, residuals, g)`,
    with g the cotangent of out, returns a tuple with one cotangent per differentiable argument
    (None for zeros). Use it where autodiff of fn's body is not what you want: numerical
    stability, a cheaper rule, gradient clipping. `nondiff_argnums`: positions of arguments
    no derivative flows to (Python numbers, functions; a tensor there is an ArgumentTypeError),
    passed to bwd first; `@tf.custom_vjp(nondiff_argnums=(1,))` is the decorator form.

    Every reverse-mode transform (grad, vjp, jacrev) and vmap use the rule, and bwd is traced
    like other code, so grad of grad differentiates it. Forward mode (jvp, jacfwd, hessian)
    refuses such a function with ForwardModeError: use tf.custom_jvp for a rule both modes
    use. Called with real tensors outside any transform it is fn, except that where
    torch.autograd will differentiate the call, it runs jitted so `.backward()` uses the rule
    too. A bwd returning the wrong number, structure or shapes of cotangents is reported
    naming the function.

        >>> import torch, thunderfn as tf
        >>> @tf.custom_vjp
        ... def clip_gradient(x, lo, hi):
        ...     return x * 1
        >>> def clip_fwd(x, lo, hi):
        ...     return x * 1, (lo, hi)
        >>> def clip_bwd(residuals, g):
        ...     lo, hi = residuals
        ...     return g.clamp(lo, hi), None, None
        >>> _ = clip_gradient.defvjp(clip_fwd, clip_bwd)
        >>> tf.grad(lambda x: (clip_gradient(x, -0.1, 0.1) * 5).sum())(torch.ones(3))
        tensor([0.1000, 0.1000, 0.1000])
    """

    def __new__(cls, fn=None, nondiff_argnums=()):
        if fn is None:  # @tf.custom_vjp(nondiff_argnums=...) above a def: the decorator with these options
            return functools.partial(cls, nondiff_argnums=nondiff_argnums)
        return super().__new__(cls)

    # How vmap batches a call: None vmaps fwd and bwd (JAX's rule); a user Function
    # (transforms/user_functions.py) sets its own, vmap_rule(batching, bsym)
    vmap_rule = None

    def __init__(self, fn, nondiff_argnums=()):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.nondiff_argnums = tuple(sorted(nondiff_argnums))
        self.fwd = self.bwd = None
        self._symbol = None
        self._jitted = None  # this function, jitted: how eager calls that torch differentiates run

    def defvjp(self, fwd, bwd):
        self.fwd, self.bwd = fwd, bwd
        name = "".join(c if c.isalnum() else "_" for c in getattr(self.fn, "__name__", "fn"))
        self._symbol = Symbol(f"custom_vjp_{name}", ("custom_vjp", next(_ids)), fn=self._forward,
                              print_name=f"custom_vjp_{name}", tags=frozenset({"always_record"}))
        # The table holds the rule weakly: a custom_vjp made in a loop (and the tensors its
        # functions close over) goes away with its last user, and its entry with it.
        set_rule(self._symbol.id, "vjp", VJPRule(_WeakBackward(self)))
        weakref.finalize(self, drop_rule, self._symbol.id, "vjp")
        return self

    @property
    def _name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    # -- forward: fwd, recorded as this function's symbol ------------------------------------------
    def _forward(self, /, *args, **kwargs):
        result = self.run_fwd(*args, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ArgumentTypeError(f"custom_vjp '{self._name}': fwd must return a pair (output, residuals), got "
                            f"{type(result).__name__}")
        out, residuals = result
        # An output that is an argument itself (fwd returns x: a straight-through or a gradient
        # clipping identity) becomes a new value: were it the argument, the gradient reaching the
        # output would also reach the argument directly, besides through the rule.
        inputs = {id(x) for x in tree_leaves((args, kwargs)) if isinstance(x, TensorProxy)}
        out = tree_map(lambda o: prims.reshape(o, tuple(o.shape)) if isinstance(o, TensorProxy) and id(o) in inputs
                       else o, out)
        return out, residuals

    def run_fwd(self, /, *args, **kwargs):
        """fwd(*args, **kwargs), in which a call of this function (JAX's common `def f_fwd(x): return
        f(x), x`) is its primal, fn: recorded as this symbol again, whose body is fwd, it would recurse
        without end. Whatever runs fwd goes through here: this symbol's body, the residuals' own
        derivative, vmap's batched fwd (transforms/vmap.py), which traces fwd under a batched
        custom_vjp of its own, so only this function's mark says that the call inside is the primal.
        Reads self.fwd when called, so a form built from this one follows a later defvjp."""
        with self._inside_fwd():
            return self.fwd(*args, **kwargs)

    @contextlib.contextmanager
    def _inside_fwd(self):
        nested = id(self) in _running_fwd.ids
        _running_fwd.ids.add(id(self))
        try:
            yield
        finally:
            if not nested:
                _running_fwd.ids.discard(id(self))

    def __call__(self, /, *args, **kwargs):
        if id(self) in _running_fwd.ids:  # inside our own fwd: the primal function (run_fwd)
            return self.fn(*args, **kwargs)
        if context.current_trace() is None:
            if self._symbol is not None and torch.is_grad_enabled() and any(
                    isinstance(t, torch.Tensor) and t.requires_grad for t in tree_leaves((args, kwargs))):
                # Differentiated by torch.autograd: the rule must hold here too (as a torch.autograd.Function
                # would), so the call runs jitted, whose backward is this rule.
                return self._with_rule()(*args, **kwargs)
            return self.fn(*args, **kwargs)
        if self._symbol is None:
            raise ArgumentTypeError(f"custom_vjp '{self._name}' has no rule yet: call "
                                    f"{self._name}.defvjp(fwd, bwd) first")
        refuse_traced_nondiff_args("custom_vjp", self._name, self.nondiff_argnums, args,
                                   "pass tensors as ordinary arguments (bwd may return None for them)")
        out, _residuals = self._symbol(*args, **kwargs)
        return out

    def _with_rule(self):
        if self._jitted is None:
            self._jitted = context.jit(self)
        return self._jitted

    # -- backward: bwd, called by the reverse-mode driver ------------------------------------------
    def _backward(self, call, g):
        args = call.args
        out, residuals = call.out
        n_out = len(tree_leaves(out))
        flat_g = list(g)[:n_out] if isinstance(g, tuple) else [g]
        _, out_spec = tree_flatten(out)
        leaves = tree_leaves(out)
        filled = [c if c is not None else _zeros_like(o) for c, o in zip(flat_g, leaves)]
        g_out = tree_unflatten(out_spec, filled)
        nondiff = [args[i] for i in self.nondiff_argnums]
        diff_positions = [i for i in range(len(args)) if i not in self.nondiff_argnums]
        cts = self.bwd(*nondiff, residuals, g_out)
        if not isinstance(cts, tuple):
            raise ArgumentTypeError(f"custom_vjp '{self._name}': bwd must return a tuple with one "
                                    f"entry per differentiable argument ({len(diff_positions)}), got "
                                    f"{type(cts).__name__}")
        if len(cts) != len(diff_positions):
            raise ArgumentTypeError(f"custom_vjp '{self._name}': bwd returned {len(cts)} cotangents, "
                                    f"but the function has {len(diff_positions)} differentiable arguments "
                                    f"(positions {diff_positions})")
        result = [None] * len(args)
        for position, ct in zip(diff_positions, cts):
            result[position] = self._checked(position, args[position], ct)
        through = self._through_residuals(call, g)
        if through:
            for position in diff_positions:
                result[position] = _plus(result[position], args[position], through)
        return tuple(result)

    def _through_residuals(self, call, g) -> dict:
        """{argument leaf's name: cotangent} that the residuals' own cotangents give. Only a derivative of
        bwd gives them one (grad of grad): bwd reads the residuals, which fwd computed from the arguments,
        so they flow back through fwd, recomputed (as JAX differentiates a custom_vjp's fwd). A residual
        that is an argument or an output itself gets its cotangent where that one does."""
        out, residuals = call.out
        flat_g = list(g) if isinstance(g, tuple) else [g]
        n_out = len(optree.tree_leaves(out, none_is_leaf=True, namespace="thunderfn"))
        res_leaves = optree.tree_leaves(residuals, none_is_leaf=True, namespace="thunderfn")
        own = {p.name for p in tree_leaves((call.args, out)) if isinstance(p, TensorProxy)}
        wanted, names = [], set()
        for i, (leaf, ct) in enumerate(zip(res_leaves, flat_g[n_out:])):
            if isinstance(leaf, TensorProxy) and ct is not None and leaf.name not in own | names:
                wanted.append(i)
                names.add(leaf.name)
        if not wanted:
            return {}

        def wanted_residuals(*args):
            leaves = optree.tree_leaves(self.run_fwd(*args, **call.kwargs)[1], none_is_leaf=True, namespace="thunderfn")
            return tuple(leaves[i] for i in wanted)

        _, backward = trace_vjp(wanted_residuals, call.args)
        arg_cts = backward(tuple(flat_g[n_out + i] for i in wanted))
        return {a.name: ct for a, ct in zip(tree_leaves(call.args), arg_cts) if isinstance(a, TensorProxy)
                and ct is not None}

    def _checked(self, position, arg, ct):
        if ct is None:
            return None
        arg_leaves, arg_spec = tree_flatten(arg)
        ct_leaves, ct_spec = tree_flatten(ct)
        if ct_spec != arg_spec:
            raise ArgumentTypeError(f"custom_vjp '{self._name}': the cotangent bwd returned for "
                                    f"argument {position} has structure {ct_spec}, but the argument has {arg_spec}")
        for a, c in zip(arg_leaves, ct_leaves):
            if isinstance(a, TensorProxy) and isinstance(c, TensorProxy) and tuple(a.shape) != tuple(c.shape):
                raise ArgumentValueError(f"custom_vjp '{self._name}': the cotangent bwd returned for "
                                         f"argument {position} has shape {tuple(c.shape)}, but the argument has "
                                         f"shape {tuple(a.shape)}")
        return ct


class _WeakBackward:
    """A custom_vjp's bwd as its VJP rule, called while the custom_vjp is alive."""

    def __init__(self, owner: custom_vjp):
        self._owner = weakref.ref(owner)

    def __call__(self, call, g):
        return self._owner()._backward(call, g)


# Executors make their vjp= pairs into custom_vjp functions (executors/base.py), through core.
context.register_custom_vjp(custom_vjp)


def _plus(ct, arg, extra: dict):
    """ct (an argument's cotangent: None, a tensor, or a pytree like the argument) plus extra's entries
    for the argument's tensors."""
    arg_leaves, spec = tree_flatten(arg)
    ct_leaves = [None] * len(arg_leaves) if ct is None else spec.flatten_up_to(ct)
    summed = []
    for a, c in zip(arg_leaves, ct_leaves):
        e = extra.get(a.name) if isinstance(a, TensorProxy) else None
        summed.append(c if e is None else e if c is None else ltorch.add(c, e))
    return tree_unflatten(spec, summed) if any(c is not None for c in summed) else None


def _zeros_like(p):
    return ltorch.full(tuple(p.shape), 0, device=p.device, dtype=p.dtype) if isinstance(p, TensorProxy) else p
