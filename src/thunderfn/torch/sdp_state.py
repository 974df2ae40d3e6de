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


# torch's getters, called directly: a jitted function with attention reads them on every call (its guard)
_cuda = torch.backends.cuda
_flash = getattr(torch._C, "_get_flash_sdp_enabled", _cuda.flash_sdp_enabled)
_efficient = getattr(torch._C, "_get_mem_efficient_sdp_enabled", _cuda.mem_efficient_sdp_enabled)
_cudnn = getattr(torch._C, "_get_cudnn_sdp_enabled", _cuda.cudnn_sdp_enabled)
_math = getattr(torch._C, "_get_math_sdp_enabled", _cuda.math_sdp_enabled)
_order = getattr(torch._C, "_get_sdp_priority_order", lambda: _DEFAULT_PRIORITY)


def enabled() -> dict:
    """{backend: whether torch may use it}, read from torch's switches now."""
    return {FLASH: _flash(), EFFICIENT: _efficient(), CUDNN: _cudnn(), MATH: _math()}


def priority() -> tuple:
    """The order in which torch tries the backends (torch >= 2.5 lets sdpa_kernel change it)."""
    return tuple(b for b in _order() if b in NAMES)


def snapshot() -> tuple:
    return ((MATH, _math()), (FLASH, _flash()), (EFFICIENT, _efficient()), (CUDNN, _cudnn())), tuple(_order())


def why_changed(before: tuple) -> str | None:
    now = snapshot()
    if now == before:
        return None
    return f"torch's SDPA backend switches changed from {_show(before)} to {_show(now)}"


def _show(snap: tuple) -> str:
    on, order = snap
    return f"enabled {[NAMES[b] for b, ok in on if ok]}, priority {[NAMES[b] for b in order if b in NAMES]}"


def guard_trace() -> None:
    """While tracing: make the outermost trace's compiled function retrace when the switches change."""
    if context.current_trace() is None:
        return
    root = context.tracer_stack()[0].trace
    if not any(getattr(g, "func", None) is why_changed for g in root.guards):
        root.guards.append(functools.partial(why_changed, snapshot()))
