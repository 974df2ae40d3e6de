"""What library code learns about the values it is handed while thunderfn traces it.

- **"Am I being compiled?"** Libraries ask before code that needs tensor values: Hugging
  Face's masking utilities skip `if (mask == 1).all()` shortcuts, torch.optim keeps step
  counters as tensors instead of calling `.item()`. Those are the trace-friendly paths, and
  tracing takes them: while this thread traces a function for thunderfn,
  `torch.compiler.is_compiling()` answers True, as under torch.compile (the older spellings,
  `torch._dynamo.is_compiling()` and `torch._utils.is_compiling()`, call it).
  `torch.compiler.is_exporting()` stays False: thunderfn compiles, it does not export.
  Outside a trace, and on other threads, torch's own answer is returned.
- **"Is this a tensor?"** A proxy is not a `torch.Tensor` instance, so torch's Python helpers
  that test `isinstance(x, torch.Tensor)` before reading metadata would refuse it. Each one
  listed in `_PROXY_AWARE` answers for proxies from their metadata and calls torch's own
  otherwise.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from thunderfn.core import context
from thunderfn.core.proxies import TensorProxy

_original_is_compiling = torch.compiler.is_compiling


@functools.wraps(_original_is_compiling)
def is_compiling() -> bool:
    return context.current_trace() is not None or _original_is_compiling()


is_compiling.__thunderfn_original__ = _original_is_compiling


def _none_or_dtype(original, input):
    # nn.MultiheadAttention's mask canonicalization: the dtype of a mask, or None
    return input.dtype if isinstance(input, TensorProxy) else original(input)


# (module, function name, proxy-aware version taking torch's function first)
_PROXY_AWARE = [
    (F, "_none_or_dtype", _none_or_dtype),
]


def _wrap(original, aware):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return aware(original, *args, **kwargs)

    wrapper.__thunderfn_original__ = original
    return wrapper


def install() -> None:
    """Answer these questions for thunderfn's traces (idempotent)."""
    if getattr(torch.compiler.is_compiling, "__thunderfn_original__", None) is None:
        torch.compiler.is_compiling = is_compiling
    for module, name, aware in _PROXY_AWARE:
        original = getattr(module, name)
        if getattr(original, "__thunderfn_original__", None) is None:
            setattr(module, name, _wrap(original, aware))


install()
