"""torch.nn modules whose forward reads a tensor's value in Python, traced with the same
computation kept in tensors.

- **BatchNorm with `momentum=None`** (a cumulative average of the batch statistics)
  computes `1.0 / float(self.num_batches_tracked)`: a Python number tracing cannot know.
  While traced, the factor stays a 0-dim float64 tensor (the double eager's float() gives),
  and the running statistics are updated with it as eager's kernel does.

- **torch.func.functional_call** (and torch.nn.utils.stateless.functional_call) swaps tensors
  into a module's parameters with checks that refuse anything but a torch.Tensor, so a traced
  tensor (tf.grad of a function of the parameters) never gets in. While traced, the given
  values stand in for the module's own tensors for the call instead (core/context.py's
  standing_in), torch's semantics kept: tied weights take the value given for any of their
  names, unknown names are ignored unless strict=True.

Each rewrite applies only while this thread traces and the module is in the case it
covers; otherwise torch's forward runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from thunderfn.core import context
from thunderfn.core.proxies import is_real_tensor
from thunderfn.errors import ArgumentRuntimeError, UnsupportedOpError
from thunderfn.torch.base import stand_in_front


def _batch_norm_cumulative_average(original, self, input):
    if not (self.momentum is None and self.training and self.track_running_stats
            and self.num_batches_tracked is not None and context.current_trace() is not None):
        return original(self, input)
    self._check_input_dim(input)
    self.num_batches_tracked.add_(1)
    factor = 1.0 / self.num_batches_tracked.to(torch.float64)
    return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, True, factor, self.eps)


stand_in_front(_BatchNorm, "forward", _batch_norm_cumulative_average)


def _functional_call_traced(original, module, parameters_and_buffers, args=None, kwargs=None, *, tie_weights=True,
                            strict=False):
    tracer = context.current_tracer()
    if tracer is None:
        return original(module, parameters_and_buffers, args, kwargs, tie_weights=tie_weights, strict=strict)
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    if strict:
        missing, unexpected = (sorted(set(named) - set(parameters_and_buffers)),
                               sorted(set(parameters_and_buffers) - set(named)))
        if missing or unexpected:  # (torch's words)
            errors = ([f"Unexpected key(s): {', '.join(map(repr, unexpected))}."] if unexpected else []) + (
                [f"Missing key(s): {', '.join(map(repr, missing))}."] if missing else [])
            raise ArgumentRuntimeError(f"Error(s) in reparametrizing for {module._get_name()}:\n\t"
                                       + "\n\t".join(errors))
    given = {name: value for name, value in parameters_and_buffers.items() if name in named}
    if not tie_weights and any(named[a] is named[b] for a in given for b in named if a != b):
        raise UnsupportedOpError("functional_call(tie_weights=False) on a module with tied weights is not traced: "
                                 "the given tensor would stand in under every name of the tied weight. Pass the value "
                                 "for every name of it, or use tie_weights=True.")
    args = () if args is None else args if isinstance(args, tuple) else (args,)
    pairs = [(named[name], tracer.constant(value) if is_real_tensor(value) else value)
             for name, value in given.items()]
    with context.standing_in(pairs):
        return module(*args, **(kwargs or {}))


stand_in_front(torch.nn.utils.stateless, "_functional_call", _functional_call_traced)
