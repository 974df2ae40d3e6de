"""torch.nn modules whose forward reads a tensor's value in Python, traced with the same
computation kept in tensors.

- **BatchNorm with `momentum=None`** (a cumulative average of the batch statistics)
  computes `1.0 / float(self.num_batches_tracked)`: a Python number tracing cannot know.
  While traced, the factor stays a 0-dim float64 tensor (the double eager's float() gives),
  and the running statistics are updated with it as eager's kernel does.

Each rewrite applies only while this thread traces and the module is in the case it
covers; otherwise torch's forward runs.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from thunderfn.core import context


def _batch_norm_cumulative_average(original, self, input):
    if not (self.momentum is None and self.training and self.track_running_stats
            and self.num_batches_tracked is not None and context.current_trace() is not None):
        return original(self, input)
    self._check_input_dim(input)
    self.num_batches_tracked.add_(1)
    factor = 1.0 / self.num_batches_tracked.to(torch.float64)
    return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, True, factor, self.eps)


# (class, method name, rewrite taking torch's method first)
_REWRITES = [
    (_BatchNorm, "forward", _batch_norm_cumulative_average),
]


def install() -> None:
    """Route the methods above through their rewrites (idempotent)."""
    for cls, name, rewrite in _REWRITES:
        original = cls.__dict__[name]
        if getattr(original, "__thunderfn_original__", None) is None:
            setattr(cls, name, _method(original, rewrite))


def _method(original, rewrite):
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        return rewrite(original, self, *args, **kwargs)

    method.__thunderfn_original__ = original
    return method


install()
