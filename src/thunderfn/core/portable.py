"""Python values as JSON, exactly: what a compiled entry written to disk says about the values it relied on.

`encode(v)` gives a JSON-able form of v that `decode` turns back into an equal value of the same type; it
raises `NotPortable` for anything whose meaning would not survive a new process (an object compared by
identity, a function, a tensor): the caller then keeps that entry in memory only. Plain JSON values stand
for themselves (None, bool, int, str); everything else is a list whose first element says what it is:
["float", hex], ["tuple", [...]], ["dtype", "float32"], ["enum", module, qualname, member], ...

`locate(module, qualname)` finds a module-level object (a function, a class) by name, as `importlib` would,
without importing anything that is not imported already; `where(obj)` is the inverse, or None where obj is
not found again that way (a lambda, a nested function, an object made at run time).

May import: nothing of thunderfn's (errors.py).
"""
from __future__ import annotations

import enum
import sys

import torch

from thunderfn.errors import ThunderFnError


class NotPortable(ThunderFnError):
    """A value, or a compiled entry, that cannot be written for another process to read (the message says why)."""


_MISSING = object()


def where(obj) -> tuple[str, str] | None:
    """(module name, qualified name) that `locate` finds obj by again, or None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    return (module, qualname) if locate(module, qualname) is obj else None


def locate(module: str, qualname: str):
    """The object called qualname in the imported module `module`; _MISSING where there is none."""
    obj = sys.modules.get(module)
    if obj is None:
        return _MISSING
    for part in qualname.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def missing(value) -> bool:
    return value is _MISSING


_CONTAINERS = {"tuple": tuple, "list": list, "set": set, "frozenset": frozenset}
# exact type -> its form (the containers', dicts' and enums' are made in encode)
_ENCODERS = {
    float: lambda v: ["float", v.hex()],
    complex: lambda v: ["complex", v.real.hex(), v.imag.hex()],
    torch.dtype: lambda v: ["torch", str(v).removeprefix("torch.")],
    torch.memory_format: lambda v: ["torch", str(v).removeprefix("torch.")],
    torch.layout: lambda v: ["torch", str(v).removeprefix("torch.")],
    torch.device: lambda v: ["device", str(v)],
    torch.Size: lambda v: ["size", list(v)],
    slice: lambda v: ["slice", encode(v.start), encode(v.stop), encode(v.step)],
    range: lambda v: ["range", v.start, v.stop, v.step],
    bytes: lambda v: ["bytes", v.hex()],
}


def encode(v):
    """v's JSON form (module docstring); NotPortable where it has none."""
    t = type(v)
    if v is None or t in (bool, int, str):
        return v
    if t in _ENCODERS:
        return _ENCODERS[t](v)
    if t.__name__ in _CONTAINERS and _CONTAINERS[t.__name__] is t:
        items = [encode(x) for x in v]
        return [t.__name__, sorted(items, key=repr) if t in (set, frozenset) else items]
    if t is dict:
        return ["dict", [[encode(k), encode(x)] for k, x in v.items()]]
    if isinstance(v, enum.Enum) and where(t) is not None:
        return ["enum", *where(t), v.name]
    raise NotPortable(f"a {t.__name__} value")


def _torch_constant(name: str):
    value = getattr(torch, name, None)
    if type(value) not in (torch.dtype, torch.memory_format, torch.layout):
        raise NotPortable(f"torch has no {name}")
    return value


def _enum_member(module: str, qualname: str, name: str):
    cls = locate(module, qualname)
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)) or name not in cls.__members__:
        raise NotPortable(f"no enum member {module}.{qualname}.{name} here")
    return cls[name]


_DECODERS = {
    "float": lambda h: float.fromhex(h),
    "complex": lambda re, im: complex(float.fromhex(re), float.fromhex(im)),
    "dict": lambda items: {decode(k): decode(x) for k, x in items},
    "torch": _torch_constant,
    "device": lambda name: torch.device(name),
    "size": lambda sizes: torch.Size(sizes),
    "slice": lambda *bounds: slice(*(decode(b) for b in bounds)),
    "range": lambda *bounds: range(*bounds),
    "bytes": lambda h: bytes.fromhex(h),
    "enum": _enum_member,
}


def decode(form):
    """The value encode(value) gave form for; NotPortable where form names what this process cannot find."""
    if not isinstance(form, list):
        return form
    kind, *rest = form
    if kind in _CONTAINERS:
        return _CONTAINERS[kind](decode(x) for x in rest[0])
    if kind not in _DECODERS:
        raise NotPortable(f"an unknown value form {kind!r}")
    return _DECODERS[kind](*rest)
