"""Linearize: fn's output at the primals, and its JVP there as a function of the tangents alone.

trace_jvp (forward_mode.py) records fn and its tangent computation together, on stand-in
tangents. The recorded bound symbols are then split by whether they read a tangent, directly
or through another such symbol: those that do not are the forward (fn's own ops, and the
primal-only factors the JVP rules compute, cos(x) for sin) and stay in the trace being built;
the others are the tangent computation, kept aside. The primal values it reads are its
residuals, which the forward returns: computed once, when linearize is called. jvp_fn replays
the tangent computation, compiled, on the residuals and the tangents it is given, so its trace
holds no op of the forward (torch.func.linearize gets there by constant-folding its graph).
"""
from __future__ import annotations

from typing import Callable

import optree
import torch

from thunderfn.core import context, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_unflatten
from thunderfn.errors import ArgumentRuntimeError, ArgumentTypeError, UnsupportedOpError
from thunderfn.transforms.autodiff import _carries_gradient, as_trace_constants, replay_into, replay_unless_modified
from thunderfn.transforms.forward_mode import trace_jvp


class _Linearized:
    """The tangent computation of fn at the primals, split from its forward while the forward is traced."""

    def build(self, fn: Callable, primals: tuple):
        """While a trace is being built: fn(*primals) into it, the tangent computation aside; fn's output."""
        tracer = context.current_tracer()
        leaves, self.primals_spec = tree_flatten(primals)
        self.primals_meta = [(tuple(p.shape), p.dtype, p.device) for p in leaves]
        # one stand-in per leaf (trace_jvp pairs tangents with primals by position); a leaf that carries no
        # tangent (an integer tensor) has its stand-in ignored
        stand_ins = [TensorProxy(shape=shape, dtype=dtype, device=device) for shape, dtype, device in self.primals_meta]
        self.moving = [_carries_gradient(s) for s in stand_ins]
        self.stand_ins = [s for s, m in zip(stand_ins, self.moving) if m]
        with tracer.scope() as recorded:
            out, self.tangent_out = trace_jvp(fn, primals, tree_unflatten(self.primals_spec, stand_ins))
        reads_tangent = {s.name for s in self.stand_ins}
        self.bsyms = []
        for bsym in recorded:
            if any(p.name in reads_tangent for p in bsym.proxy_args()):
                self.bsyms.append(bsym)
                reads_tangent.update(o.name for o in bsym.proxy_outs())
            else:
                tracer.emit(bsym)
        read = [p for b in self.bsyms for p in b.proxy_args()]
        read += [t for t in optree.tree_leaves(self.tangent_out, none_is_leaf=True, namespace="thunderfn")
                 if isinstance(t, TensorProxy)]
        self.residuals = list({p.name: p for p in read if p.name not in reads_tangent}.values())
        return out

    def computed_residuals(self) -> tuple:
        """The residuals the forward computes (a captured tensor is read as it is when jvp_fn is made)."""
        if symbolic.has_unbacked([tuple(p.shape) for p in self.residuals]):
            raise UnsupportedOpError(
                "tf.linearize called with real tensors cannot keep the tangent computation of a function whose saved "
                "values have a size known only at run time (a boolean mask's selection, nonzero, unique): use "
                "tf.jvp, or call tf.linearize inside a jitted function")
        return tuple(p for p in self.residuals if p.constant is None)

    def checked_tangents(self, tangents: tuple) -> list:
        """The tangents of the primal leaves that carry one, after torch.func.linearize's checks."""
        flat, spec = tree_flatten(tangents)
        if spec != self.primals_spec:
            raise ArgumentRuntimeError(
                f"Expected the tangents {spec} to have the same argspec as the primals {self.primals_spec}")
        for i, (t, (shape, dtype, device)) in enumerate(zip(flat, self.primals_meta)):
            for what, got, want in (("shape", tuple(t.shape), shape), ("device", t.device, device),
                                    ("dtype", t.dtype, dtype)):
                if got != want:
                    raise ArgumentRuntimeError(f"tangent:{i} with {what} {got} in flattened pytree doesn't match the "
                                               f"{what} {want} of the corresponding primal.")
        return [t for t, m in zip(flat, self.moving) if m]

    def replay(self, residuals, tangents):
        """The tangent computation again, into the trace being built, on these residuals and tangents."""
        env = {p.name: v for p, v in zip(self.residuals, as_trace_constants(list(residuals)))}
        env.update((s.name, t) for s, t in zip(self.stand_ins, as_trace_constants(list(tangents))))
        replay_into(context.current_tracer(), self.bsyms, env)
        return optree.tree_map(lambda x: env.get(x.name, x) if isinstance(x, TensorProxy) else x, self.tangent_out,
                               none_is_leaf=True, namespace="thunderfn")


def linearize(fn: Callable, *primals):
    """fn's output at `primals` and its linear approximation there: (out, jvp_fn), as
    torch.func.linearize and jax.linearize.

    `primals`: fn's positional arguments, each a tensor or a pytree of tensors. `jvp_fn(*tangents)`,
    with tangents structured like `primals` (each of its primal's shape, dtype and device, else a
    RuntimeError in torch's words), returns the Jacobian-vector product of fn at `primals`,
    shaped like `out`: what tf.jvp(fn, primals, tangents)[1] gives.

    fn runs once, when linearize is called, compiled; that run also computes the primal values
    the JVP needs (the residuals: cos(x) for sin(x)). jvp_fn is the tangent computation alone,
    compiled on first call: linear in the tangents, no op of fn's forward in it, so calling it
    for many tangents repeats no forward work (at the cost of keeping the residuals alive). The
    exception is an opaque torch op (one thunderfn runs through torch.func.jvp, see docs/ops.md):
    torch computes its tangent together with its output, so jvp_fn runs it again.
    tf.last_traces(jvp_fn) shows its traces, the first the tangent computation as traced.

        >>> import torch, thunderfn as tf
        >>> x = torch.tensor([0.0, 1.0, 2.0])
        >>> out, jvp_fn = tf.linearize(lambda x: torch.sin(x) * torch.exp(x), x)
        >>> t = jvp_fn(torch.ones(3))
        >>> torch.testing.assert_close(t, torch.exp(x) * (torch.cos(x) + torch.sin(x)))
        >>> ops = {b.sym.name for b in tf.last_traces(jvp_fn)[0].bound_symbols}
        >>> sorted(ops)                     # sin and exp ran once, in the forward: the JVP only multiplies and adds
        ['add', 'mul']
    """
    for leaf in tree_flatten(primals)[0]:
        if not isinstance(leaf, torch.Tensor):
            raise ArgumentTypeError(f"linearize: expected the primals to be tensors (or pytrees of tensors), got "
                                    f"{type(leaf).__name__}")
    linearized = _Linearized()
    if context.current_trace() is not None:  # inside a traced function: the forward is that trace's
        out = linearized.build(fn, primals)
        residuals = linearized.residuals

        def jvp_fn(*tangents):
            return linearized.replay(residuals, linearized.checked_tangents(tangents))

        return out, jvp_fn

    def forward(primals):
        out = linearized.build(fn, primals)
        return out, linearized.computed_residuals()

    out, computed = context.jit_evicting(forward)(primals)
    run = replay_unless_modified(linearized.residuals, computed, context.jit_evicting(linearized.replay),
                                 "linearize", "the JVP would not be at the primals")

    def jvp_fn(*tangents):
        return run(linearized.checked_tangents(tangents))

    jvp_fn._thunderfn_state = run._thunderfn_state
    return out, jvp_fn
