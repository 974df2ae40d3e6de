"""Which attention backend torch would run a call on, decided at lowering time.

On CPU torch has one fused kernel, flash attention, behind one gate (`cpu_choice`, a copy of
aten/src/ATen/native/transformers/sdp_utils_cpp.{h,cpp}'s `use_flash_attention_cpp`, asked
of proxies); every other call runs math attention. On CUDA:

torch's `F.scaled_dot_product_attention` picks flash, memory-efficient, cuDNN or math
attention per call: by the backends enabled (`torch.backends.cuda.enable_*_sdp`, the
`torch.nn.attention.sdpa_kernel` context), their priority order, and each backend's gate
(dtype, head dim, mask, dropout, GPU generation, whether the inputs require grad). The
sdpa executor differentiates attention with the kernel pair of that backend, calling the
kernels directly (no gate of torch's runs then), so the choice here applies copies of
torch's gates to the switches, for the compute capability of the query's GPU (9.0 on a
machine without one: tests lowering CUDA proxies, `tf.trace` on a CPU machine).

torch cannot be asked instead: `torch._fused_sdp_choice` needs real CUDA tensors, and
under fake tensors its meta kernel runs the CUDA gate on meta tensors, which every fused
backend refuses ("All tensors need to be on cuda device"), so it answers math for every
call. The gates below are kept no wider than torch's: where one is unsure it refuses,
and the call falls to the memory-efficient pair or is left to torch, never to a kernel
that would refuse the inputs. The choice is made while lowering, so traces of CUDA
attention are guarded by the switches (thunderfn/torch/sdp_state.py).
"""
from __future__ import annotations

import torch

from thunderfn.torch import sdp_state
from thunderfn.torch.sdp_state import CUDNN, EFFICIENT, FLASH, MATH

NONE = -1  # no backend takes the call (torch raises)
_HALF = (torch.float16, torch.bfloat16)
_EMULATED_CAPABILITY = (9, 0)


# -- CPU: torch's select_sdp_backend_cpp --------------------------------------------------------------
_CPU_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def cpu_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False) -> int:
    """FLASH, MATH or NONE, as torch picks for these CPU tensors (or proxies) under the switches now:
    flash where it is enabled and its gate passes, else math where enabled. (is_causal does not enter.)"""
    on = sdp_state.enabled()
    if on[FLASH] and cpu_flash_gate(query, key, value, attn_mask, dropout_p, enable_gqa):
        return FLASH
    return MATH if on[MATH] else NONE


def cpu_flash_gate(query, key, value, attn_mask=None, dropout_p=0.0, enable_gqa=False) -> bool:
    """torch's use_flash_attention_cpp, but for the stride of the head dim, which torch wants to be 1 and
    proxies do not carry (the executor makes it 1; eager would run math attention on such an input)."""
    if not (query.ndim == key.ndim == value.ndim == 4) or dropout_p > 0.0:
        return False
    (B, H, L, E), (Bk, Hk, S, Ek), (Bv, Hv, _, Ev) = query.shape, key.shape, value.shape
    if not B == Bk == Bv:
        return False
    if enable_gqa:  # grouped-query heads: key and value alike, a divisor of the query's
        if not (Hk == Hv and Hk != 0 and H % Hk == 0):
            return False
    elif not H == Hk == Hv:
        return False
    return (_cpu_mask_ok(attn_mask, B, H, L, S) and E == Ek == Ev and L != 0 and S != 0
            and query.dtype == key.dtype == value.dtype and query.dtype in _CPU_FLASH_DTYPES)


def _cpu_mask_ok(mask, B, H, L, S) -> bool:
    """torch's check_attn_mask_shape: no gradient, 2-d (L or 1, S or 1) or 4-d with batch and heads 1 or full."""
    if mask is None:
        return True
    if mask.requires_grad or mask.ndim not in (2, 4):
        return False
    wanted = (L, S) if mask.ndim == 2 else (B, H, L, S)
    return all(m in (1, w) for m, w in zip(mask.shape, wanted))


# -- CUDA ------------------------------------------------------------------------------------------------
def torch_choice(query, key, value, attn_mask=None, is_causal=False, requires_grad=False) -> int:
    """The backend (sdp_state's values, NONE) torch would run this dropout-free call on, by the gates
    below for the GPU the query is on (a CUDA proxy on a machine without one: capability 9.0)."""
    return emulated_choice(query, key, value, attn_mask, is_causal, device_capability(query.device), requires_grad)


def device_capability(device) -> tuple:
    if not torch.cuda.is_available():
        return _EMULATED_CAPABILITY
    index = getattr(torch.device(str(device)), "index", None)
    if index is not None and index >= torch.cuda.device_count():
        return _EMULATED_CAPABILITY  # a proxy naming a GPU this machine lacks (a trace made elsewhere)
    return tuple(torch.cuda.get_device_capability(index))


# -- the gates, for emulation: torch's (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), kept to
#    the dense, dropout-free calls the sdpa executor claims ------------------------------------------
def _same_heads(query, key, value) -> bool:
    return query.shape[1] == key.shape[1] == value.shape[1]


def flash_gate(query, key, value, attn_mask, is_causal, capability, requires_grad=False) -> bool:
    E = query.shape[-1]
    return (attn_mask is None and query.dtype in _HALF and capability[0] in (8, 9)  # sm80..sm90: the GPUs torch's
            and _same_heads(query, key, value)                                    # flash has run on for years
            and E == key.shape[-1] == value.shape[-1] and E % 8 == 0 and E <= 256
            and not (is_causal and query.shape[-2] != key.shape[-2])  # torch's flash refuses causal L != S
            # torch: no flash backward for head dims over 192 on sm86/sm89 (too little shared memory)
            and not (requires_grad and E > 192 and (8, 6) <= tuple(capability) <= (8, 9)))


def efficient_gate(query, key, value, attn_mask, is_causal, capability, requires_grad=False) -> bool:
    dtype_ok = query.dtype in (torch.float32, torch.float16) or query.dtype is torch.bfloat16 and capability >= (8, 0)
    return (dtype_ok and capability >= (5, 0) and _same_heads(query, key, value)
            and query.shape[-1] == key.shape[-1] and query.shape[-1] % 8 == 0 and value.shape[-1] % 8 == 0)


def cudnn_gate(query, key, value, attn_mask, is_causal, capability, requires_grad=False) -> bool:
    # narrower than torch's (which moves with each cuDNN release): Hopper only, no mask, one head dim
    # up to 128, causal only when square; elsewhere the call falls to the next backend or to torch
    E = query.shape[-1]
    return (attn_mask is None and query.dtype in _HALF and capability[0] == 9 and _same_heads(query, key, value)
            and E == key.shape[-1] == value.shape[-1] and E % 8 == 0 and E <= 128
            and not (is_causal and query.shape[-2] != key.shape[-2]))


_GATES = {FLASH: flash_gate, EFFICIENT: efficient_gate, CUDNN: cudnn_gate, MATH: lambda *a: True}


def emulated_choice(query, key, value, attn_mask=None, is_causal=False, capability=_EMULATED_CAPABILITY,
                    requires_grad=False) -> int:
    """torch's choice by the switches and the gates above: the first enabled backend in
    priority order whose gate passes. (Grouped-query calls never pass: every gate wants equal heads.)"""
    on = sdp_state.enabled()
    capability = tuple(capability)
    for backend in sdp_state.priority():
        if on.get(backend) and _GATES[backend](query, key, value, attn_mask, is_causal, capability, requires_grad):
            return backend
    return NONE
