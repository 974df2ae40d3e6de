"""What library code learns about the values it is handed while thunderfn traces it.

- **"Am I being compiled?"** Libraries ask before code that needs tensor values: Hugging
  Face's masking utilities skip `if (mask == 1).all()` shortcuts, torch.optim keeps step
  counters as tensors instead of calling `.item()`. Those are the trace-friendly paths, and
  tracing takes them: while this thread traces a function for thunderfn,
  `torch.compiler.is_compiling()` answers True, as under torch.compile (the older spellings,
  `torch._dynamo.is_compiling()` and `torch._utils.is_compiling()`, call it).
  `torch.compiler.is_exporting()` stays False: thunderfn compiles, it does not export.
  Outside a trace, and on other threads, torch's own answer is returned.
- **"Is this a tensor?"** needs no answer here: a proxy is a `torch.Tensor` (core/proxies.py).
"""
from __future__ import annotations

import torch

from thunderfn.core import context
from thunderfn.torch.base import stand_in_front


def _is_compiling(original) -> bool:
    # Dynamo answers True for torch.compiler.is_compiling by identity, from two tables it fills at different
    # times: with torch._dynamo imported before thunderfn, one holds torch's function and one this stand-in,
    # so Dynamo traces into this function and neither `original` nor the thread-local read folds to a constant
    # (a graph break, after which Hugging Face's is_tracing() probes CUDA stream capture and fails on CPU).
    # is_dynamo_compiling, which thunderfn leaves alone, Dynamo folds to True; outside Dynamo it is False.
    return torch.compiler.is_dynamo_compiling() or original() or context.current_trace() is not None


stand_in_front(torch.compiler, "is_compiling", _is_compiling)
