"""Executors: tables of lowering rules keyed by symbol.

A lowering rule (`Lowering`) has a `checker(*args, **kwargs) -> bool`, called with
proxies at compile time, and an action saying how the claimed bound symbol runs:
`TraceInPlace(fn)` traces fn in its place (fn may call this executor's operators and
any torch ops around them), `RunAsOperator(op)` runs it as one of the executor's
operators, `RunAsItself()` keeps an operator's own call, `RunWithTorch()` is the torch
executor's one torch call. Executors are tried in priority order; see
transforms/executor_lower.py.
"""
from __future__ import annotations

import dataclasses
import keyword
from typing import Any, Callable

from thunderfn.core import context

# the rule types live in core: executor_lower (a transform) reads them, and transforms do not import executors
from thunderfn.core.lowering import Lowering, LoweringAction, RunAsItself, RunAsOperator, RunWithTorch, TraceInPlace  # noqa: F401
from thunderfn.core.rules import BatchRule, as_batch_rule, drop_rule, set_rule
from thunderfn.core.symbol import Symbol
from thunderfn.errors import ArgumentTypeError, ArgumentValueError, ExecutorError


def check_identifier(kind: str, name) -> str:
    if not context.is_safe_name(name):
        raise ArgumentValueError(f"{kind} name must be a Python identifier that thunderfn does not "
                                 f"reserve, got {name!r}")
    return name


class Executor:
    """Base class. `name` identifies the executor in `jit(executors=[...])`."""

    def __init__(self, name: str, version=None):
        if not (isinstance(name, str) and name.isidentifier() and name.isascii() and not keyword.iskeyword(name)):
            raise ArgumentValueError("an executor's name must be an ASCII Python identifier (not a "
                                     f"keyword), got {name!r}")
        self.name = name
        self.version = version

    def lowering_for(self, bsym) -> Lowering | None:
        return None

    def availability(self) -> tuple[bool, str]:
        """(can this executor run here, why not)."""
        return True, ""

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"


class OperatorExecutor(Executor):
    """An executor built from operators (callables on real tensors) and lowering rules.

    `name`: an identifier, how jit's `executors=` and traces name it; `version`: any label.
    `ex.register_operator(name, like=..., meta=..., fn=...)` makes an operator, a symbol that
    runs `fn` on real tensors, which traced code can call directly; `like` (the same
    computation in torch) gives its output metadata and its derivative. `ex.register_lowering(
    symbol, checker=..., lower=...)` (and the tutorials' `register_implementation`) claims an
    existing prim or torch symbol wherever `checker` says yes, running `lower` in its place.
    Pass the executor to `tf.jit(fn, executors=[ex])`, or register it (register_executor) and
    name it; jit asks executors in priority order and torch runs what none claims.

        >>> import torch, thunderfn as tf
        >>> ex = tf.executors.OperatorExecutor("docs_mul_ex")
        >>> my_mul = ex.register_operator("my_mul", like=lambda a, b: a * b, fn=torch.mul)
        >>> f = tf.jit(lambda x: my_mul(x, x) + 1, executors=[ex])
        >>> x = torch.tensor([1.0, 2.0])
        >>> f(x)
        tensor([2., 5.])
        >>> [b.sym.name for b in tf.last_traces(f)[-1].bound_symbols if b.sym.name != "del"]
        ['my_mul', 'torch.add']
        >>> tf.grad(lambda x: my_mul(x, x).sum())(x)  # differentiated as `like`
        tensor([2., 4.])
        >>> ex.register_lowering(tf.torch.mul, lower=my_mul)  # claim every torch.mul
        >>> g = tf.jit(lambda a, b: a * b, executors=[ex])
        >>> torch.testing.assert_close(g(x, x), x * x)
        >>> [b.sym.name for b in tf.last_traces(g)[-1].bound_symbols if b.sym.name != "del"]
        ['my_mul']
    """

    def __init__(self, name: str, version=None):
        super().__init__(name, version)
        self.operators: dict[str, Symbol] = {}
        self.lowerings: dict[Any, Lowering] = {}

    def register_operator(self, name: str, *, like: Callable | None = None, meta: Callable | None = None,
                          fn: Callable, replace: bool = False, batch_rule: Callable | BatchRule | None = None,
                          traceable: bool = False) -> Symbol:
        """A symbol that runs `fn` on real tensors. `like`, `meta` or both say what it returns:
        `like` is a function in torch or thunderfn's languages computing the same thing,
        differentiated in the operator's place (reverse and forward mode) and, without `meta`,
        traced for output metadata; `meta` alone (proxies in, output proxies out) makes a new
        primitive, differentiable once a vjp is registered for it (`register_lowering(operator,
        vjp=(fwd, bwd))`). Given both, `meta` says the outputs (no tracing of `like` per call),
        and `like` may give None for an output that carries no derivative. `batch_rule(call,
        dims) -> (output, out dims)`, with the conventions of thunderfn/transforms/rules/define.py
        (the older form `batch_rule(args, dims, kwargs, out)` is still taken), is how tf.vmap
        batches the operator (it may return NotImplemented for a call it does not handle); it
        becomes the batching rule of the operator's symbol (core/rules.py). `traceable`: fn is torch code
        without side effects that a tracing compiler can follow (torch operators, no data-dependent
        Python), so a fusion executor that calls such operators (Inductor) may run it inside a
        region instead of ending the region at it."""
        check_identifier("an operator's", name)
        if like is None and meta is None:
            raise ArgumentTypeError(f"register_operator('{name}'): give like= or meta= (or both)")
        if name in self.operators and not replace:
            raise ArgumentValueError(f"executor '{self.name}' already has an operator '{name}' (pass "
                                     "replace=True to replace it)")
        if meta is None:
            meta = _meta_from_like(like)
        replacing = name in self.operators
        sym = Symbol(name, f"{self.name}.{name}", meta=meta, is_prim=True, print_name=name, namespace={name: fn},
                     eager=fn, executor=self, like=like, tags=frozenset({"traceable"} if traceable else ()))
        self.operators[name] = sym
        if batch_rule is not None:
            set_rule(sym.id, "batch", as_batch_rule(batch_rule))
        elif not replacing:  # a rule left under this id by an earlier executor of the same name is not this operator's
            drop_rule(sym.id, "batch")
        return sym

    def register_lowering(self, symbol_or_id, *, checker: Callable | None = None, lower: Callable | None = None,
                          vjp=None, replace: bool = False) -> None:
        """Claim `symbol_or_id` (a Symbol or its id) wherever `checker(*args, **kwargs)` says yes.

        `lower` is traced in place of the bound symbol; None means the symbol is one of this
        executor's operators and runs as itself. `vjp`, a `(fwd, bwd)` pair with custom_vjp's
        conventions or a `tf.custom_vjp` function, is how reverse mode differentiates the
        symbol wherever this executor claims it."""
        if checker is not None and not callable(checker):
            raise ArgumentTypeError(f"executor '{self.name}': the checker for "
                                    f"{_symbol_name(symbol_or_id)} must be callable")
        action = self._action(symbol_or_id, lower)
        self.add_lowering(symbol_or_id, Lowering(checker, action, _as_custom_vjp(self, symbol_or_id, vjp)),
                          replace=replace)

    def add_lowering(self, symbol_or_id, lowering: Lowering, *, replace: bool = False) -> None:
        """The one way a rule enters this executor's table: register_lowering, register_implementation
        and executors.add_operator_executor wrap it."""
        if not isinstance(lowering, Lowering):
            raise ArgumentTypeError(f"executor '{self.name}': the rule for {_symbol_name(symbol_or_id)} "
                                    f"must be a Lowering, got {type(lowering).__name__}")
        if _key(symbol_or_id) in self.lowerings and not replace:
            raise ArgumentValueError(f"executor '{self.name}' already has a lowering for {_symbol_name(symbol_or_id)} "
                             f"(pass replace=True to replace it)")
        self.lowerings[_key(symbol_or_id)] = lowering

    def _action(self, symbol_or_id, lower) -> LoweringAction:
        """register_lowering's `lower` as a LoweringAction: one of this executor's operators runs as
        that operator (None: the symbol is itself one of them), anything else is traced in place."""
        if isinstance(lower, Symbol) and lower.executor is self:
            return RunAsOperator(lower)
        if lower is not None:
            return TraceInPlace(lower)
        own = next((op for op in self.operators.values() if op.id == _key(symbol_or_id)), None)
        if own is None:
            raise ArgumentTypeError(f"executor '{self.name}': give lower= for "
                                    f"{_symbol_name(symbol_or_id)} (a function traced in its place, or one of this "
                                    f"executor's operators); only the executor's own operators run as themselves")
        return RunAsOperator(own)

    def register_implementation(self, symbol_or_id, op: Symbol | None = None, *, checker: Callable | None = None,
                                execution_transform: Callable | None = None, grad_transform=None,
                                replace: bool = False) -> None:
        """The seed tutorials' spelling of register_lowering: `op` alone means the symbol
        runs as that operator with the same arguments; `grad_transform` is the vjp."""
        lower = execution_transform if execution_transform is not None else op
        self.register_lowering(symbol_or_id, checker=checker, lower=lower, vjp=grad_transform, replace=replace)

    def lowering_for(self, bsym) -> Lowering | None:
        rule = self.lowerings.get(bsym.sym.id)
        if bsym.sym.executor is self:  # one of our operators, called directly in traced code: it runs as itself
            return _as_itself if rule is None else dataclasses.replace(rule, action=RunAsItself())
        return rule


_as_itself = Lowering(checker=None, action=RunAsItself())


def _key(symbol_or_id):
    return symbol_or_id.id if isinstance(symbol_or_id, Symbol) else symbol_or_id


def _symbol_name(symbol_or_id) -> str:
    return symbol_or_id.print_name if isinstance(symbol_or_id, Symbol) else repr(symbol_or_id)


def _as_custom_vjp(ex: Executor, symbol_or_id, vjp):
    """vjp= as a custom_vjp function: the same mechanism users differentiate with, so the
    forward runs `fwd` (recording its residuals) and the backward runs `bwd`."""
    custom_vjp = context.custom_vjp()  # tf.custom_vjp, a transform: executors do not import transforms
    if vjp is None or isinstance(vjp, custom_vjp):
        if vjp is not None and vjp.fwd is None:
            raise ArgumentTypeError(f"executor '{ex.name}': the custom_vjp function given as vjp for "
                            f"{_symbol_name(symbol_or_id)} has no rule yet; call its defvjp(fwd, bwd) first")
        return vjp
    if callable(vjp):
        raise ArgumentTypeError(
            f"executor '{ex.name}': the grad_transform/vjp for {_symbol_name(symbol_or_id)} is one function; thunderfn "
            f"takes the forward and the backward separately, as a (fwd, bwd) pair: fwd(*args) -> (output, residuals) "
            f"and bwd(residuals, grad_output) -> one gradient per argument (None for zero), or a tf.custom_vjp "
            f"function. A Thunder grad_transform's get_grad(out) is bwd's grad_output and its put_grads(args, grads) "
            f"is bwd's return value: see docs/porting-from-thunder.md.")
    if not (isinstance(vjp, tuple) and len(vjp) == 2 and all(callable(f) for f in vjp)):
        raise ArgumentTypeError(f"executor '{ex.name}': vjp for {_symbol_name(symbol_or_id)} must be "
                                f"a (fwd, bwd) pair of functions or a tf.custom_vjp function, got {type(vjp).__name__}")
    name = symbol_or_id.name if isinstance(symbol_or_id, Symbol) else str(symbol_or_id)

    def primal(*args, **kwargs):  # only ever called while tracing, where custom_vjp records fwd instead
        raise ExecutorError(f"the vjp executor '{ex.name}' registered for {name} is used only while differentiating")

    primal.__name__ = f"{ex.name}_{name}"
    made = custom_vjp(primal).defvjp(*vjp)
    # fwd computes the symbol itself (the executor's kernel), no user rule: forward mode may differentiate
    # fwd's body rather than refuse the function as it refuses a user's custom_vjp (transforms/forward_mode.py)
    made.fwd_is_primal = True
    return made


def _meta_from_like(like: Callable) -> Callable:
    def meta(*args, **kwargs):
        with context.current_tracer().scope():
            return like(*args, **kwargs)

    return meta
