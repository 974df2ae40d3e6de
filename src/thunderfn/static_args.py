"""static_argnums and static_argnames: which arguments of a jitted function are static, by JAX's rules.

`resolve` reads them against the function's signature once, when jit is called (for a module, against
its forward's, without self), each already a tuple of ints or of strs (JitOptions checked their types:
jit_options.py):

- each names the other where the signature can: an index whose parameter can be passed by keyword adds
  that name, and a name of a parameter that can be passed by position adds its index, so an argument is
  static however the caller passes it (JAX infers one from the other only when one is not given; here
  both are always completed, which marks no argument the caller did not name);
- a negative index counts from the end of the positional parameters;
- an index past the positional parameters, or a name that is not a parameter, is a ValueError naming
  the function and its parameters, unless the function takes `*args` (any index) or `**kwargs` (any
  name but a positional-only one's);
- with `*args` (or where Python has no signature for the function) a negative index counts from the end
  of each call's positional arguments instead, as JAX counts it.

At each call (`StaticArguments.check`) a static argument must hold no tensor (it is baked into the
compiled function by value) and must be hashable (JAX: "Non-hashable static arguments are not
supported"): the compiled entries are keyed on its value.

The api layer. May import: core/ and errors.
"""
from __future__ import annotations

import dataclasses
import inspect

import torch

from thunderfn.core.pytree import tree_flatten, tree_flatten_with_path
from thunderfn.errors import ArgumentTypeError, ArgumentValueError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_BY_POSITION_ONLY = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)


@dataclasses.dataclass(frozen=True)
class StaticArguments:
    """The static arguments of one function, resolved against its signature (see `resolve`)."""
    function: str  # its name, for messages
    argnums: tuple[int, ...] = ()  # sorted; a negative one only where positions vary per call (*args)
    argnames: tuple[str, ...] = ()
    # positional inputs before the ones argnums count (a jitted module's parameters and buffers)
    offset: int = 0
    option: str = "static"  # which option named them ("donate": donate_argnums), for messages

    def __bool__(self) -> bool:
        return bool(self.argnums or self.argnames)

    def after(self, n: int) -> StaticArguments:
        """The same arguments of a function called with n more positional inputs in front."""
        return dataclasses.replace(self, offset=self.offset + n)

    def passed(self, args, kwargs):
        """(how the argument is named in messages, its value) for each static argument this call passes."""
        for i in self.argnums:
            position = i + self.offset if i >= 0 else len(args) + i
            if position < self.offset:
                given = len(args) - self.offset
                raise ArgumentValueError(
                    f"jitted function '{self.function}' has {self.option}_argnums={self.argnums}, but was called with "
                    f"{given} positional argument{'' if given == 1 else 's'}: a negative index counts from the end "
                    f"of a call's positional arguments where the function takes *args")
            if position < len(args):
                yield f"(index {i})", args[position]
        for name in self.argnames:
            if name in kwargs:
                yield f"'{name}'", kwargs[name]

    def leaf_positions(self, args, kwargs) -> frozenset:
        """The places among the call's flattened arguments (tree_flatten((args, kwargs))) that its static
        arguments hold: what jit never traces as a value (a float there keys the cache by its value)."""
        positions = {i + self.offset if i >= 0 else len(args) + i for i in self.argnums}
        paths = tree_flatten_with_path((tuple(args), dict(kwargs)))[0]
        return frozenset(k for k, path in enumerate(paths)
                         if (path[0] == 0 and path[1] in positions) or (path[0] == 1 and path[1] in self.argnames))

    def check(self, args, kwargs) -> None:
        """Refuse a call whose static arguments hold a tensor or cannot be hashed."""
        for where, value in self.passed(args, kwargs):
            if any(isinstance(leaf, torch.Tensor) for leaf in tree_flatten(value)[0]):
                raise ArgumentTypeError(
                    f"static argument {where} of '{self.function}' holds a tensor; static arguments are baked into "
                    f"the compiled function, so they must not contain tensors (pass the tensor as an ordinary "
                    f"argument)")
            try:
                hash(value)
            except TypeError:
                raise ArgumentValueError(
                    f"Non-hashable static arguments are not supported: static argument {where} of "
                    f"'{self.function}' is a {type(value).__name__}, which is not hashable. Compiled entries are "
                    f"keyed on a static argument's value: pass a hashable one (a tuple instead of a list, a "
                    f"frozen dataclass)") from None


def resolve(fn, argnums: tuple[int, ...], argnames: tuple[str, ...], *, name: str | None = None,
            option: str = "static") -> StaticArguments:
    """fn's static arguments from jit's options (a tuple each, as JitOptions holds them: jit_options.py),
    checked against fn's signature (the module docstring's rules). `name` names fn in messages (default:
    its __name__). The donated arguments (`option="donate"`: donate_argnums) are resolved by the same rules
    and named so in messages."""
    name = name or getattr(fn, "__name__", type(fn).__name__)
    if not argnums and not argnames:
        return StaticArguments(name, option=option)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: nothing to check against, as in JAX
        return StaticArguments(name, tuple(sorted(set(argnums))), tuple(dict.fromkeys(argnames)), option=option)
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in _POSITIONAL]
    takes_args = any(p.kind is p.VAR_POSITIONAL for p in params)
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    n = len(positional)
    if not takes_args:
        if any(not -n <= i < n for i in argnums):
            raise ArgumentValueError(
                f"jitted function '{name}' has {option}_argnums={argnums}, but only accepts {n} positional "
                f"argument{'' if n == 1 else 's'}; its parameters: {_parameters(signature)}")
        argnums = tuple(i % n for i in argnums)
    kinds = {p.name: p.kind for p in params}
    not_by_keyword = [a for a in argnames if kinds.get(a) in _BY_POSITION_ONLY]
    if not_by_keyword:
        raise ArgumentValueError(
            f"jitted function '{name}' has {option}_argnames={argnames}, but {_listed(not_by_keyword)} cannot be "
            f"passed by keyword (positional-only or *args): name {'it' if len(not_by_keyword) == 1 else 'them'} "
            f"in {option}_argnums instead; its parameters: {_parameters(signature)}")
    unknown = [a for a in argnames if a not in kinds]
    if unknown and not takes_kwargs:
        raise ArgumentValueError(
            f"jitted function '{name}' has {option}_argnames={argnames}, but {_listed(unknown)} "
            f"{'is not one of its parameters' if len(unknown) == 1 else 'are not among its parameters'}; "
            f"its parameters: {_parameters(signature)}")
    index = {p.name: i for i, p in enumerate(positional)}
    both = [p for p in positional if p.kind is p.POSITIONAL_OR_KEYWORD]
    argnums = {*argnums, *(index[p.name] for p in both if p.name in argnames)}
    argnames = [*argnames, *(p.name for p in both if index[p.name] in argnums)]
    return StaticArguments(name, tuple(sorted(argnums)), tuple(dict.fromkeys(argnames)), option=option)


def _parameters(signature: inspect.Signature) -> str:
    """The signature's parameter list without defaults or annotations: `(x, /, n, *rest, mode, **kw)`."""
    bare = [p.replace(default=p.empty, annotation=p.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=inspect.Signature.empty))


def _listed(names) -> str:
    return ", ".join(repr(a) for a in names)
