"""How a transform treats one bound symbol: one answer for reverse mode, forward mode and vmap.

Each of the three walks a recorded region and asks `resolve(bsym, transform)` for every bound
symbol it has to transform. The answer is a `Way`, tried in this order:

- INERT: nothing to do for it here (reverse and forward mode: a symbol no derivative flows
  through, such as a comparison or a statement);
- CUSTOM: a function with a user's rule of its own, which the transform treats its own way
  (vmap: a tf.custom_vjp or tf.custom_jvp function, batched as one of its batched parts);
- RULE: its rule of the transform's kind (core/rules.py's record), where the rule takes this call;
- LIKE: an executor's operator defined like= a function, which stands in for it;
- DECOMPOSITION: its subsymbols, a composite's body, each resolved in turn;
- OPAQUE: an opaque torch op, transformed by torch.func when the compiled function runs;
- REFUSE: none of those; the transform raises its named error, `transform.refusal(bsym)`.

What differs between transforms is data, a `Transform`: which rule of a symbol's record it
reads, when a rule takes a call, which symbols are inert or custom, whether like= stands in,
whether decompositions are left to it (forward mode inlines them before its walk), and its
error. `without_rule` is the same
answer once the rule is out of the question: vmap asks it when a rule declines a call.

The answer is asked once per bound symbol while a transform traces, so it allocates nothing:
the Transforms are made once, at import, and a Way is an enum member.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable

from thunderfn.core.rules import rules


class Way(enum.Enum):
    INERT = "inert"
    CUSTOM = "custom"
    RULE = "rule"
    LIKE = "like"
    DECOMPOSITION = "decomposition"
    OPAQUE = "opaque"
    REFUSE = "refuse"


@dataclasses.dataclass(frozen=True, slots=True)
class Transform:
    """What one transform brings to resolve().

    `kind`: which rule of a symbol's record it reads ("vjp", "jvp" or "batch"). `refusal(bsym)`: its
    named error, for REFUSE.
    `applies(rule, bsym)`: whether the rule takes this call (None: always). `inert(bsym)`,
    `custom(bsym)`: whether bsym is INERT or CUSTOM here (None: never). `follows_like`: an
    executor's operator defined like= a function is transformed through that function.
    `decomposes`: a composite's subsymbols are walked here (False where the transform
    inlined every decomposition it needs before its walk)."""
    name: str
    kind: str
    refusal: Callable
    applies: Callable | None = None
    inert: Callable | None = None
    custom: Callable | None = None
    follows_like: bool = False
    decomposes: bool = True


def resolve(bsym, transform: Transform) -> Way:
    """How `transform` treats bsym (the module docstring has the order)."""
    if transform.inert is not None and transform.inert(bsym):
        return Way.INERT
    if transform.custom is not None and transform.custom(bsym):
        return Way.CUSTOM
    record = rules.get(bsym.sym.id)
    rule = getattr(record, transform.kind) if record is not None else None
    if rule is not None and (transform.applies is None or transform.applies(rule, bsym)):
        return Way.RULE
    return without_rule(bsym, transform)


def without_rule(bsym, transform: Transform) -> Way:
    """How `transform` treats bsym where no rule of its table takes it: it has none, the rule
    does not apply to this call, or the rule declined it."""
    sym = bsym.sym
    if transform.follows_like and sym.like is not None:
        return Way.LIKE
    if transform.decomposes and bsym.subsymbols and sym.printer is None:
        return Way.DECOMPOSITION
    if "opaque" in sym.tags and sym.torch_fn is not None:
        return Way.OPAQUE
    return Way.REFUSE
