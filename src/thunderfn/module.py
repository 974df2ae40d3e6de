"""jit of an nn.Module: a module whose forward runs the original one's through jit.

Parameters and buffers are inputs on every call (a dict of each, as in
torch.func.functional_call), so optimizer steps, `load_state_dict` and dtype or
device changes are all seen, the last by retracing. train()/eval() picks one of two
jitted functions, since the mode changes what forward traces. Everything else
(parameters(), state_dict(), attribute access) is the original module's, unprefixed.
"""
from __future__ import annotations

import contextlib
import inspect

import torch


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


def _signature_with_state(module: torch.nn.Module) -> inspect.Signature:
    """(params, buffers, <forward's own parameters>)."""
    state = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in ("params", "buffers")]
    try:
        own = [p for p in inspect.signature(module.forward).parameters.values() if p.name not in ("params", "buffers")]
    except (TypeError, ValueError):
        own = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
               inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    try:
        return inspect.Signature(state + own)
    except ValueError:  # forward's own parameters cannot follow positional-only ones (never for plain forwards)
        return inspect.Signature(state + [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)])


class ThunderModule(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, **jit_options):
        super().__init__()
        # Held outside _modules so names and state_dict keys are the original module's.
        object.__setattr__(self, "_thunderfn_module", module)
        self._thunderfn_options = jit_options
        self._thunderfn_jitted = {}  # training flag -> jitted forward
        self._thunderfn_state = None  # the most recently used jitted forward's state (for last_traces)

    @property
    def module(self) -> torch.nn.Module:
        return self._thunderfn_module

    def _jitted(self, training: bool):
        jitted = self._thunderfn_jitted.get(training)
        if jitted is None:
            from thunderfn.jit import jit

            module = self.module

            def forward(params, buffers, *args, **kwargs):
                with _substituted(module, params, buffers):
                    return module(*args, **kwargs)

            forward.__name__ = forward.__qualname__ = f"{type(module).__name__}.forward"  # named in error messages
            forward.__signature__ = _signature_with_state(module)  # so traces name inputs as forward does
            jitted = self._thunderfn_jitted[training] = jit(forward, **self._thunderfn_options)
        return jitted

    def forward(self, *args, **kwargs):
        module = self.module
        jitted = self._jitted(module.training)
        self._thunderfn_state = jitted._thunderfn_state
        return jitted(dict(module.named_parameters()), dict(module.named_buffers()), *args, **kwargs)

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
