"""Every symbol's rules, in one table: how reverse mode, forward mode and vmap treat it.

`rules[symbol id]` is a `Rules` record holding the symbol's VJP rule (reverse mode), JVP rule
(forward mode) and batching rule (tf.vmap), each None where it has none, and, where it has no
derivative on purpose, why. A symbol's facts that are not rules (its outputs never carry a
gradient, it only moves data, it is cheap to recompute, it is never batched) are tags, set on
the Symbol where it is made (the TAG_ constants below).

Every rule receives the same `call`, a RecordedCall: the symbol, the arguments it was called
with, and its output; `call.arg("dim")` reads an argument by its name in the symbol's signature.
- VJP: `bwd(call, g) -> one cotangent per positional argument` (None: no cotangent);
- JVP: `fwd(call, tangents) -> the output's tangent`, given one tangent per positional argument;
- batching: `batch(call, dims) -> (batched output, its batch dim)`, where call.args are the
  batched arguments and `dims` their batch dimensions (None: unbatched), call.out the output of
  one example; or NotImplemented for a call it does not handle.
transforms/rules/define.py has the conventions in full and the decorators that write rules
(defvjp, defjvp, defbatch, deflinear, defpartials); the op families' rules live beside it, one
module per family.

The table is here, in core, below both layers that write it: the transforms (the op families'
rules, custom_vjp, custom_jvp, a user's autograd.Function) and the executors (an operator's
`register_operator(batch_rule=)`). Imports only core/symbol.py and errors.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, NamedTuple

from thunderfn.core.symbol import Symbol
from thunderfn.errors import ArgumentTypeError, InternalError

# Tags: facts about a symbol that transforms and passes read, set where the symbol is made.
TAG_NOT_DIFFERENTIABLE = "not_differentiable"  # its outputs never carry a gradient (booleans, indices, constants)
TAG_MOVES_DATA_ONLY = "moves_data_only"  # its VJP reads only shapes and dtypes, never a value of the forward
TAG_CHEAP = "cheap_to_recompute"  # recomputing it in the backward costs less than saving its output
TAG_NOT_BATCHED = "not_batched"  # it takes no tensor, so no call of it is batched: its value is every example's


class RecordedCall(NamedTuple):
    """One call of a symbol as the trace recorded it, which its rule differentiates or batches.
    `call.arg("is_causal")` reads an argument by its name in the symbol's signature, wherever the
    call put it (by position or by keyword), and its default there where the call left it out."""
    symbol: Symbol
    args: tuple    # the positional args as called (proxies/tensors, numbers, tuples); every tensor is among them
    kwargs: dict
    out: object    # the output (a tensor, or a tuple for multi-output symbols)

    def arg(self, name: str):
        """The argument `name` of this call, or the signature's default for it."""
        found = self.symbol.parameters.get(name)
        if found is None:
            raise InternalError(f"a rule read argument {name!r} of {self.symbol.print_name}, whose signature has "
                                f"none: it has {', '.join(self.symbol.parameters) or 'no named parameters'}")
        position, default = found
        if position is not None and position < len(self.args):
            return self.args[position]
        value = self.kwargs.get(name, default)
        if value is inspect.Parameter.empty:
            raise InternalError(f"the recorded call of {self.symbol.print_name} lacks its required argument {name!r}")
        return value


@dataclasses.dataclass(frozen=True)
class VJPRule:
    """How reverse mode differentiates one symbol: `bwd(call, g)` is the cotangent of each
    positional argument. `applies(*args, **kwargs) -> bool`, when given, restricts the rule to
    some calls of a composite symbol: the others are differentiated through its decomposition.
    `residuals(bsym) -> bsym`, when given, is the call reverse mode runs in the forward in bsym's
    place: the same call made to also return values bwd then reads (a checkpoint's saved values)."""
    bwd: Callable
    applies: Callable | None = None
    residuals: Callable | None = None

    def applies_to(self, bsym) -> bool:
        return self.applies is None or bool(self.applies(*bsym.args, **bsym.kwargs))


@dataclasses.dataclass(frozen=True)
class JVPRule:
    """How forward mode differentiates one symbol: `fwd(call, tangents)` is the tangent of its
    output, given one tangent per positional argument."""
    fwd: Callable


@dataclasses.dataclass(frozen=True)
class BatchRule:
    """How tf.vmap batches one symbol: `batch(call, dims)` is `(batched output, its batch dim)`
    (a tuple of each for a multi-output symbol), or NotImplemented for a call the rule does not
    handle, whose decomposition is batched instead."""
    batch: Callable


@dataclasses.dataclass(frozen=True, slots=True)
class Rules:
    """One symbol's rules. `underivable`: why neither mode differentiates it although its outputs
    could carry a gradient (complex parts, a derivative with no prim to write it in)."""
    vjp: VJPRule | None = None
    jvp: JVPRule | None = None
    batch: BatchRule | None = None
    underivable: str | None = None


rules: dict = {}  # symbol id -> Rules; written only through set_rule, drop_rule and set_underivable

_RULE_TYPES = {"vjp": VJPRule, "jvp": JVPRule, "batch": BatchRule}
_NO_RULES = Rules()


def rules_of(symbol_id) -> Rules:
    """symbol_id's rules (an empty record where it has none). Records are frozen: the functions below
    replace a symbol's record, so a snapshot of the table (testing/registries.py) restores it whole."""
    return rules.get(symbol_id, _NO_RULES)


def set_rule(symbol_id, kind: str, rule) -> None:
    """Give symbol_id its `kind` rule ("vjp", "jvp" or "batch"), replacing the one it had."""
    expected = _RULE_TYPES[kind]
    if not isinstance(rule, expected):
        raise ArgumentTypeError(f"the {kind} rule for {symbol_name(symbol_id)} must be a {expected.__name__}, "
                                f"got {type(rule).__name__}")
    rules[symbol_id] = dataclasses.replace(rules_of(symbol_id), **{kind: rule})


def drop_rule(symbol_id, kind: str) -> None:
    """Take away symbol_id's `kind` rule, if it has one (a custom_vjp that went away)."""
    record = rules.get(symbol_id)
    if record is None:
        return
    record = dataclasses.replace(record, **{kind: None})
    if record == _NO_RULES:
        del rules[symbol_id]
    else:
        rules[symbol_id] = record


def set_underivable(symbol_id, why: str) -> None:
    """Say why symbol_id has no derivative rule: the transforms' refusal quotes it."""
    rules[symbol_id] = dataclasses.replace(rules_of(symbol_id), underivable=why)


def as_batch_rule(rule) -> BatchRule:
    """A batching rule given as a BatchRule or a function `batch(call, dims)`; a function of the older
    form `batch(args, dims, kwargs, out)` (four parameters) is adapted, so rules written for it keep working."""
    if isinstance(rule, BatchRule):
        return rule
    if not callable(rule):
        raise ArgumentTypeError(f"a batching rule must be a function batch(call, dims), got {type(rule).__name__}")
    try:
        n_params = len(inspect.signature(rule).parameters)
    except (TypeError, ValueError):  # no signature to read (a builtin): taken as the current form
        n_params = 2
    if n_params != 4:
        return BatchRule(rule)

    def batch(call, dims):
        return rule(call.args, dims, call.kwargs, call.out)

    batch.__name__ = batch.__qualname__ = getattr(rule, "__name__", "batch")
    return BatchRule(batch)


def symbol_name(symbol_id) -> str:
    """How an error names a symbol by its id: a prim by its PrimIDs member, another symbol by its id."""
    name = getattr(symbol_id, "name", None)
    return f"prims.{name.lower()}" if isinstance(name, str) and not isinstance(symbol_id, str) else str(symbol_id)
