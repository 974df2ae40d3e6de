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

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from thunderfn.core import context
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
