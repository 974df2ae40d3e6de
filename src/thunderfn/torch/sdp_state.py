"""torch's scaled-dot-product-attention backend switches, as a trace depends on them.

Which fused attention kernel torch runs depends on global state: the
`torch.backends.cuda.enable_{flash,mem_efficient,cudnn,math}_sdp` flags (what the
`torch.nn.attention.sdpa_kernel` context sets; despite the name, the flash and math
flags decide CPU attention too) and torch's priority order among the backends. An
executor that picks one kernel pair when it lowers attention (the sdpa executor does, to
differentiate with the kernel torch would use) bakes that state into the compiled
function, so a trace of attention is guarded by it: a call under other switches traces
again (the guard says which changed).
"""
from __future__ import annotations

import functools

import torch

from thunderfn.core import context

# torch.nn.attention.SDPBackend's values (an int enum in every torch with fused attention)
MATH, FLASH, EFFICIENT, CUDNN = 0, 1, 2, 3
NAMES = {MATH: "math", FLASH: "flash", EFFICIENT: "memory-efficient", CUDNN: "cuDNN"}
_DEFAULT_PRIORITY = (FLASH, EFFICIENT, MATH, CUDNN)


def enabled() -> dict:
    """{backend: whether torch may use it}, read from torch's switches now."""
    cuda = torch.backends.cuda
    return {FLASH: cuda.flash_sdp_enabled(), EFFICIENT: cuda.mem_efficient_sdp_enabled(),
            CUDNN: cuda.cudnn_sdp_enabled(), MATH: cuda.math_sdp_enabled()}


def priority() -> tuple:
    """The order in which torch tries the backends (torch >= 2.5 lets sdpa_kernel change it)."""
    get = getattr(torch._C, "_get_sdp_priority_order", None)
    order = tuple(get()) if get is not None else _DEFAULT_PRIORITY
    return tuple(b for b in order if b in NAMES)


def snapshot() -> tuple:
    return tuple(sorted(enabled().items())), priority()


def why_changed(before: tuple) -> str | None:
    now = snapshot()
    if now == before:
        return None
    return f"torch's SDPA backend switches changed from {_show(before)} to {_show(now)}"


def _show(snap: tuple) -> str:
    on, order = snap
    return (f"enabled {[NAMES[b] for b, ok in on if ok]}, priority {[NAMES[b] for b in order]}")


def guard_trace() -> None:
    """While tracing: make the outermost trace's compiled function retrace when the switches change."""
    if context.current_trace() is None:
        return
    root = context.trace_stack()[0]
    if not any(getattr(g, "func", None) is why_changed for g in root.guards):
        root.guards.append(functools.partial(why_changed, snapshot()))
