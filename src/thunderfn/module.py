"""jit of an nn.Module: a module that runs the original one's forward through jit.

Parameters and buffers are read by reference on every call (they reach the trace
as captured tensors), so optimizer steps and `load_state_dict` are seen without
retracing. Everything else (parameters(), state_dict(), train()/eval(), attribute
access) is the original module's, unprefixed.
"""
from __future__ import annotations

import torch


class ThunderModule(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, **jit_options):
        from thunderfn.jit import jit

        super().__init__()
        # Held outside _modules so names and state_dict keys are the original module's.
        object.__setattr__(self, "_thunderfn_module", module)
        # train()/eval() changes what forward traces (dropout, batch norm), so it is static.
        self._thunderfn_forward = jit(lambda training, *args, **kwargs: module(*args, **kwargs), **jit_options)

    @property
    def module(self) -> torch.nn.Module:
        return self._thunderfn_module

    def forward(self, *args, **kwargs):
        return self._thunderfn_forward(self._thunderfn_module.training, *args, **kwargs)

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

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._thunderfn_module, name)


def jit_module(module: torch.nn.Module, **jit_options) -> ThunderModule:
    return ThunderModule(module, **jit_options)
