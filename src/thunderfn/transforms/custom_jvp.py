"""custom_jvp: a user-supplied forward-mode derivative, which reverse mode uses too (JAX's API).

    @tf.custom_jvp
    def f(x, y): ...

    @f.defjvp
    def f_jvp(primals, tangents):          # with nondiff_argnums: f_jvp(*nondiff_args, primals, tangents)
        x, y = primals
        x_dot, y_dot = tangents            # zeros for a tensor without a tangent, None for other values
        return f(x, y), tangent_out        # tangent_out: the output's structure and shapes

Traced, a call records one symbol of its own (one per structure of the arguments, whose
tensors are its flat positional arguments) whose body is `fn`, so the forward is fn's ops.
Its JVP rule calls the rule. Its VJP rule differentiates the rule: the
tangent output is linear in the tangents, so the vector-Jacobian product of
`tangents -> rule(primals, tangents)[1]`, taken by the reverse-mode driver at zero tangents,
is the transpose the rule defines (JAX transposes the linear part; the same numbers). So
grad, vjp, jacrev, jvp, jacfwd and hessian all see the rule, never fn's own derivative, and
a second derivative differentiates the rule's ops as traced code. vmap batches it as a
custom_jvp of the vmapped fn and rule (transforms/vmap.py). The primal output under
forward mode is fn's; the rule's primal output is not used.

Called with real tensors outside any transform it is `fn`, unless torch.autograd will
differentiate the call: then it runs jitted, so `f(x).backward()` uses the rule too.
A transform: may import core/, prims, the torch language and the other transforms; never
executors or jit (core/context.py's jit is jit's).
"""
from __future__ import annotations

import functools
import inspect
import itertools
import weakref

import optree
import torch

import thunderfn.torch as ltorch
from thunderfn.core import context, dtypes
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_leaves, tree_unflatten
from thunderfn.core.rules import JVPRule, VJPRule, drop_rule, set_rule
from thunderfn.core.symbol import Symbol
from thunderfn.errors import ArgumentTypeError, ArgumentValueError
from thunderfn.transforms.autodiff import as_trace_constants, trace_vjp
from thunderfn.transforms.custom_vjp import refuse_traced_nondiff_args

_ids = itertools.count()


def _leaves_none(tree) -> list:
    return optree.tree_leaves(tree, none_is_leaf=True, namespace="thunderfn")


def _differentiable(x) -> bool:
    return isinstance(x, TensorProxy) and dtypes.is_inexact(x.dtype)


def _zeros_like(x):
    return ltorch.full(tuple(x.shape), 0, device=x.device, dtype=x.dtype)


class custom_jvp:
    """Give fn a hand-written Jacobian-vector product, which every transform uses, as jax.custom_jvp.

    Decorate fn, then decorate the rule with `@f.defjvp`: `rule(*nondiff_args, primals,
    tangents) -> (out, tangent_out)`, where primals and tangents are tuples of the
    differentiable arguments (pytrees allowed; a tensor argument without a tangent gets zeros,
    other values None) and tangent_out has the output's structure and shapes (None for a zero
    leaf). `nondiff_argnums`: positions of arguments no derivative flows to (Python values,
    functions), passed to the rule first; `@tf.custom_jvp(nondiff_argnums=(1,))` is the
    decorator form.

    Forward mode (jvp, jacfwd) calls the rule; reverse mode (grad, vjp, jacrev)
    differentiates it: the tangent output is linear in the tangents, so its transpose is the
    vector-Jacobian product, and fn's own derivative is never used. vmap batches fn and the rule
    together. The forward's primal output is fn's, not the rule's. Called with real tensors
    outside any transform it is fn, except that where torch.autograd will differentiate the
    call, it runs jitted so `.backward()` uses the rule too.

        >>> import torch, thunderfn as tf
        >>> @tf.custom_jvp
        ... def log1p_exp(x):
        ...     return torch.log1p(torch.exp(x))
        >>> @log1p_exp.defjvp
        ... def log1p_exp_jvp(primals, tangents):
        ...     (x,), (x_dot,) = primals, tangents
        ...     return log1p_exp(x), torch.sigmoid(x) * x_dot
        >>> x = torch.tensor([-50.0, 0.0, 100.0], dtype=torch.float64)
        >>> g = tf.grad(lambda t: log1p_exp(t).sum())(x)  # the rule's derivative
        >>> torch.testing.assert_close(g, torch.sigmoid(x))
        >>> torch.testing.assert_close(tf.jacfwd(log1p_exp)(x), torch.diag(torch.sigmoid(x)))
    """

    def __new__(cls, fn=None, nondiff_argnums=()):
        if fn is None:  # @tf.custom_jvp(nondiff_argnums=...) above a def: the decorator with these options
            return functools.partial(cls, nondiff_argnums=nondiff_argnums)
        return super().__new__(cls)

    def __init__(self, fn, nondiff_argnums=()):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.nondiff_argnums = tuple(sorted(nondiff_argnums))
        self.jvp = None
        self._symbols: dict = {}  # structure of the arguments -> its symbol
        self._jitted = None

    def defjvp(self, jvp):
        """Set the rule `jvp(*nondiff_args, primals, tangents) -> (out, tangent_out)`; returns it, so
        `@f.defjvp` can decorate the rule as in JAX."""
        self.jvp = jvp
        for symbol_id in [s.id for s in self._symbols.values()]:  # a new rule: new symbols, traced anew
            drop_rule(symbol_id, "jvp")
            drop_rule(symbol_id, "vjp")
        self._symbols = {}
        return jvp

    @property
    def _name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def _symbol_for(self, spec) -> Symbol:
        sym = self._symbols.get(spec)
        if sym is None:
            name = "".join(c if c.isalnum() else "_" for c in self._name)
            sym = Symbol(f"custom_jvp_{name}", ("custom_jvp", next(_ids)), fn=_Primal(self, spec),
                         print_name=f"custom_jvp_{name}", tags=frozenset({"always_record"}))
            # The tables hold the rules weakly: a custom_jvp made in a loop goes away with its last user.
            set_rule(sym.id, "jvp", JVPRule(_Weak(self, "_tangent_out", spec)))
            set_rule(sym.id, "vjp", VJPRule(_Weak(self, "_cotangents", spec)))
            weakref.finalize(self, _unregister, sym.id)
            self._symbols[spec] = sym
        return sym

    def __call__(self, *args, **kwargs):
        if kwargs:  # keyword arguments by position, as JAX resolves them
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
            if bound.kwargs:
                raise ArgumentTypeError(f"custom_jvp '{self._name}': keyword-only arguments "
                                        f"({sorted(bound.kwargs)}) have no tangent position; make them "
                                        "positional, or close over them")
            args = bound.args
        if context.current_trace() is None:
            if self.jvp is not None and torch.is_grad_enabled() and any(
                    isinstance(t, torch.Tensor) and t.requires_grad for t in tree_leaves(args)):
                if self._jitted is None:  # torch.autograd differentiates it: the rule must hold there too
                    self._jitted = context.jit(self)
                return self._jitted(*args)
            return self.fn(*args)
        if self.jvp is None:
            raise ArgumentTypeError(f"custom_jvp '{self._name}' has no rule yet: call {self._name}.defjvp(jvp) first")
        refuse_traced_nondiff_args("custom_jvp", self._name, self.nondiff_argnums, args,
                                   "pass tensors as ordinary arguments")
        # a captured tensor: a value the rule gets a zero tangent for
        leaves, spec = tree_flatten(as_trace_constants(args))
        return self._symbol_for(spec)(*leaves)

    # -- the rule, split into what the rule sees ----------------------------------------------------
    def split_args(self, args) -> tuple:
        """(the nondiff_argnums arguments, a tuple of the others): what the rule receives."""
        nondiff = [args[i] for i in self.nondiff_argnums]
        diff = tuple(a for i, a in enumerate(args) if i not in self.nondiff_argnums)
        return nondiff, diff

    def _rule(self, spec, leaves, tangent_leaves, out):
        """The rule's tangent output for these argument leaves and tangents (a full list, zeros
        filled in), checked against the output's structure and shapes."""
        nondiff, primals = self.split_args(tree_unflatten(spec, list(leaves)))
        _, tangents = self.split_args(tree_unflatten(spec, list(tangent_leaves)))
        result = self.jvp(*nondiff, primals, tangents)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise ArgumentTypeError(f"custom_jvp '{self._name}': the jvp rule must return a pair "
                                    f"(primal_out, tangent_out), got {type(result).__name__}")
        tangent_out = result[1]
        out_spec = optree.tree_structure(out, none_is_leaf=True, namespace="thunderfn")
        try:
            t_leaves = out_spec.flatten_up_to(tangent_out)
        except (ValueError, TypeError):
            raise ArgumentTypeError(f"custom_jvp '{self._name}': the jvp rule's tangent_out has structure "
                            f"{optree.tree_structure(tangent_out, none_is_leaf=True, namespace='thunderfn')}, but the "
                            f"function's output has {out_spec}") from None
        checked = []
        for o, t in zip(_leaves_none(out), t_leaves):
            if not _differentiable(o):
                checked.append(None)
                continue
            if t is None:
                t = _zeros_like(o)
            if tuple(t.shape) != tuple(o.shape):
                raise ArgumentValueError(f"custom_jvp '{self._name}': the jvp rule's tangent_out has a leaf of shape "
                                 f"{tuple(t.shape)} where the output has {tuple(o.shape)}")
            checked.append(t if t.dtype == o.dtype else ltorch.to(t, o.dtype))
        return checked

    def _tangent_out(self, spec, call, tangents):
        """Forward mode: the rule, with zeros for the differentiable arguments that have no tangent."""
        filled = [t if t is not None else (_zeros_like(x) if isinstance(x, TensorProxy) else None)
                  for x, t in zip(call.args, tangents)]
        checked = self._rule(spec, call.args, filled, call.out)
        return checked[0] if isinstance(call.out, TensorProxy) else tuple(checked)

    def _cotangents(self, spec, call, g):
        """Reverse mode: the transpose of the rule's (linear) tangent map, as the VJP of that map."""
        leaves = list(call.args)
        nondiff_leaves = {id(x) for i in self.nondiff_argnums if i < len(leaves)
                          for x in tree_leaves(tree_unflatten(spec, leaves)[i])}
        wrt = [i for i, x in enumerate(leaves) if _differentiable(x) and id(x) not in nondiff_leaves]
        if not wrt:
            return (None,) * len(leaves)

        def tangent_map(*tangents):
            full = [_zeros_like(x) if isinstance(x, TensorProxy) else None for x in leaves]
            for i, t in zip(wrt, tangents):
                full[i] = t
            return tuple(self._rule(spec, leaves, full, call.out))

        out_leaves = _leaves_none(call.out)
        flat_g = list(g) if isinstance(g, tuple) and not isinstance(call.out, TensorProxy) else [g]
        _, backward = trace_vjp(tangent_map, [_zeros_like(leaves[i]) for i in wrt])
        cts = backward(tuple(c if _differentiable(o) else None for o, c in zip(out_leaves, flat_g)))
        result = [None] * len(leaves)
        for i, ct in zip(wrt, cts):
            result[i] = ct
        return tuple(result)


class _Primal:
    """A custom_jvp symbol's body: fn of the arguments rebuilt from its flat leaves."""

    def __init__(self, owner: custom_jvp, spec):
        self.owner, self.spec = weakref.ref(owner), spec

    def __call__(self, *leaves):
        return self.owner().fn(*tree_unflatten(self.spec, list(leaves)))


class _Weak:
    """A custom_jvp's method in a rule table's entry, called while the custom_jvp is alive."""

    def __init__(self, owner: custom_jvp, method: str, spec):
        self._owner, self._method, self._spec = weakref.ref(owner), method, spec

    def __call__(self, call, cts_or_tangents):
        return getattr(self._owner(), self._method)(self._spec, call, cts_or_tangents)


def _unregister(symbol_id) -> None:
    drop_rule(symbol_id, "jvp")
    drop_rule(symbol_id, "vjp")


def primal_of(sym):
    """The custom_jvp a symbol is the call of, or None (vmap batches such a call as a custom_jvp)."""
    return sym.fn.owner() if isinstance(sym.fn, _Primal) else None


def spec_of(sym):
    return sym.fn.spec
