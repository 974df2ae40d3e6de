"""jit of an nn.Module: a module whose forward runs the original one's through jit.

Parameters and buffers are inputs on every call (passed positionally, one input
each, named after them in traces), so optimizer steps, `load_state_dict`, a new
Parameter assigned to an attribute and dtype or device changes are all seen, the
last two by retracing. train()/eval() picks one of two
jitted functions, since the mode changes what forward traces. Everything else
(parameters(), state_dict(), attribute access) is the original module's, unprefixed.
"""
from __future__ import annotations

import contextlib
import inspect

import torch

from thunderfn.core.context import to_identifier


@contextlib.contextmanager
def _substituted(module: torch.nn.Module, params: dict, buffers: dict):
    """Put params/buffers (proxies while tracing) in place of the module's own.

    `module.weight = proxy` is refused by nn.Module, so we swap the entries of
    `_parameters`/`_buffers` directly and always restore them. Tied weights (one
    tensor under several names) all receive the value given for its first name."""
    by_tensor = {}
    for table_name, values, named in (("_parameters", params, module.named_parameters),
                                      ("_buffers", buffers, module.named_buffers)):
        for name, tensor in named():
            by_tensor[id(tensor)] = values[name]
    saved = []
    try:
        for owner in module.modules():
            for table_name in ("_parameters", "_buffers"):
                table = getattr(owner, table_name)
                for attr, tensor in list(table.items()):
                    if tensor is not None and id(tensor) in by_tensor:
                        saved.append((table, attr, tensor))
                        table[attr] = by_tensor[id(tensor)]
        yield
    finally:
        for table, attr, tensor in reversed(saved):
            table[attr] = tensor


def _state_slots(module: torch.nn.Module, named) -> list:
    """(table, key) for each of the module's parameters or buffers, in named order, so a
    call reads the current tensors with one dict lookup each (a Parameter replaced by
    assignment is seen; adding parameters or submodules after jit needs a new jit)."""
    slots = []
    for name, _ in named():
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        slots.append((owner._parameters if attr in owner._parameters else owner._buffers, attr))
    return slots


def _identifier(name: str, taken: set) -> str:
    # any name torch accepts: "σ²" -> sigma_2, "lambda" -> lambda_, "0.weight" (nn.Sequential) -> p_0_weight
    base = to_identifier(("p_" if name[:1].isdigit() else "") + name.replace(".", "_"))
    unique, n = base, 0
    while unique in taken:
        n += 1
        unique = f"{base}_{n}"
    taken.add(unique)
    return unique


def _forward_signature(module: torch.nn.Module, state_names: list) -> inspect.Signature:
    """(<one positional parameter per parameter/buffer>, <forward's own parameters>), so
    traces name inputs `wte_weight`, `idx` and calls of all tensors take jit's fast path."""
    try:
        own = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        own = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
               inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    taken = {p.name for p in own}
    state = [inspect.Parameter(_identifier(n, taken), inspect.Parameter.POSITIONAL_ONLY) for n in state_names]
    own = [p.replace(kind=inspect.Parameter.POSITIONAL_ONLY) if p.kind is p.POSITIONAL_OR_KEYWORD else p for p in own]
    try:
        return inspect.Signature(state + own)
    except ValueError:  # e.g. keyword-only parameters before defaults: fall back to the generic form
        return inspect.Signature(state + [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                                          inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])


class ThunderModule(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, **jit_options):
        super().__init__()
        # Held outside _modules so names and state_dict keys are the original module's.
        object.__setattr__(self, "_thunderfn_module", module)
        self._thunderfn_options = jit_options
        self._thunderfn_jitted = {}  # training flag -> jitted forward
        self._thunderfn_state = None  # the most recently used jitted forward's state (for last_traces)
        self._thunderfn_slots = None

    @property
    def module(self) -> torch.nn.Module:
        return self._thunderfn_module

    def _jitted(self, training: bool):
        jitted = self._thunderfn_jitted.get(training)
        if jitted is None:
            from thunderfn.jit import jit

            module = self.module
            param_names = [n for n, _ in module.named_parameters()]
            buffer_names = [n for n, _ in module.named_buffers()]
            n_params, n_state = len(param_names), len(param_names) + len(buffer_names)

            def forward(*state_and_args, **kwargs):
                params = dict(zip(param_names, state_and_args[:n_params]))
                buffers = dict(zip(buffer_names, state_and_args[n_params:n_state]))
                with _substituted(module, params, buffers):
                    return module(*state_and_args[n_state:], **kwargs)

            forward.__name__ = forward.__qualname__ = f"{type(module).__name__}.forward"  # named in error messages
            forward.__signature__ = _forward_signature(module, param_names + buffer_names)
            jitted = self._thunderfn_jitted[training] = jit(forward, **self._thunderfn_options)
        return jitted

    def forward(self, *args, **kwargs):
        module = self.module
        if self._thunderfn_slots is None:
            self._thunderfn_slots = (_state_slots(module, module.named_parameters) +
                                     _state_slots(module, module.named_buffers))
        jitted = self._jitted(module.training)
        self._thunderfn_state = jitted._thunderfn_state
        return jitted(*[table[key] for table, key in self._thunderfn_slots], *args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self.module.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self.module.named_buffers(*args, **kwargs)

    def named_children(self):
        return self.module.named_children()

    def named_modules(self, *args, **kwargs):
        return self.module.named_modules(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self.module.load_state_dict(*args, **kwargs)

    def train(self, mode: bool = True):
        self.module.train(mode)
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .double() / .cuda(): the original module's own parameters are not in our children
        self.module._apply(fn, *args, **kwargs)
        return self

    def __repr__(self):
        return f"ThunderModule({self.module!r})"

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._thunderfn_module, name)


def jit_module(module: torch.nn.Module, **jit_options) -> ThunderModule:
    return ThunderModule(module, **jit_options)


def functional_call(module: torch.nn.Module, parameters_and_buffers: dict, args=(), kwargs=None):
    """`module(*args, **kwargs)` with the given tensors in place of its parameters and buffers
    (by name; the rest are the module's own), as torch.func.functional_call, which refuses
    thunderfn's proxies: use this one inside functions you trace, grad or vmap."""
    from thunderfn.core import context

    args = args if isinstance(args, tuple) else (args,)
    kwargs = kwargs or {}
    if context.current_trace() is None:
        return torch.func.functional_call(module, parameters_and_buffers, args, kwargs)
    params = {n: parameters_and_buffers.get(n, p) for n, p in module.named_parameters()}
    buffers = {n: parameters_and_buffers.get(n, b) for n, b in module.named_buffers()}
    unknown = set(parameters_and_buffers) - set(params) - set(buffers)
    if unknown:
        raise ValueError(f"functional_call: {type(module).__name__} has no parameters or buffers named {sorted(unknown)}")
    with _substituted(module, params, buffers):
        return module(*args, **kwargs)
