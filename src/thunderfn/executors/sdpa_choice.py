"""Which CUDA attention backend torch would run a call on, asked at lowering time.

torch's `F.scaled_dot_product_attention` picks flash, memory-efficient, cuDNN or math
attention per call: by the backends enabled (`torch.backends.cuda.enable_*_sdp`, the
`torch.nn.attention.sdpa_kernel` context), their priority order, and each backend's gate
(dtype, head dim, mask, dropout, GPU generation, whether the inputs require grad). The
sdpa executor differentiates attention with the kernel pair of that backend, so it asks
torch: `torch._fused_sdp_choice` on fake CUDA tensors of the proxies' metadata (no memory,
no kernel; the meta kernel runs torch's real CUDA gate when a GPU is present).

Without a GPU (tests lowering CUDA proxies, `tf.trace` on a CPU machine) torch's CUDA gate
cannot run; `emulated_choice` then applies the gates below to the same switches, for a GPU
of compute capability 9.0. The choice is made while lowering, so traces of CUDA attention
are guarded by the switches (thunderfn/torch/sdp_state.py).
"""
from __future__ import annotations

import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode  # private, but in every torch with fused attention

from thunderfn.torch import sdp_state
from thunderfn.torch.sdp_state import CUDNN, EFFICIENT, FLASH, MATH

NONE = -1  # no backend takes the call (torch raises)
_HALF = (torch.float16, torch.bfloat16)
_EMULATED_CAPABILITY = (9, 0)


def torch_choice(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                 requires_grad=False) -> int:
    """The backend (sdp_state's values, NONE) torch would run this dropout-free call on."""
    if torch.cuda.is_available():
        try:
            return _ask_torch(query, key, value, attn_mask, is_causal, scale, enable_gqa, requires_grad)
        except Exception as e:  # noqa: BLE001 (a probe: any failure of it leaves the choice to the emulation)
            # a torch whose fake tensors cannot ask: the emulation decides with the same switches
            _warn_once(f"asking torch which attention backend it would pick failed ({type(e).__name__}: {e}); "
                       f"the sdpa executor follows its own copy of torch's gates instead")
            return emulated_choice(query, key, value, attn_mask, is_causal, enable_gqa,
                                   torch.cuda.get_device_capability(query.device))
    return emulated_choice(query, key, value, attn_mask, is_causal, enable_gqa)


_warned = False


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _ask_torch(query, key, value, attn_mask, is_causal, scale, enable_gqa, requires_grad) -> int:
    with torch._C.DisableTorchFunction(), FakeTensorMode():  # torch calls of our own, not for tracing to record
        q, k, v = (torch.empty(tuple(t.shape), dtype=t.dtype, device=t.device, requires_grad=requires_grad)
                   for t in (query, key, value))
        mask = None if attn_mask is None else torch.empty(tuple(attn_mask.shape), dtype=attn_mask.dtype,
                                                          device=attn_mask.device)
        kwargs = {"enable_gqa": True} if enable_gqa else {}
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal, scale=scale, **kwargs)
    return int(choice) if int(choice) in sdp_state.NAMES else NONE


# -- the gates, for emulation: torch's (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), kept to
#    the dense, dropout-free calls the sdpa executor claims ------------------------------------------
def _same_heads(query, key, value) -> bool:
    return query.shape[1] == key.shape[1] == value.shape[1]


def flash_gate(query, key, value, attn_mask, is_causal, capability) -> bool:
    E = query.shape[-1]
    return (attn_mask is None and query.dtype in _HALF and capability >= (8, 0) and _same_heads(query, key, value)
            and E == key.shape[-1] == value.shape[-1] and E % 8 == 0 and E <= 256
            and not (is_causal and query.shape[-2] != key.shape[-2]))  # torch's flash refuses causal L != S


def efficient_gate(query, key, value, attn_mask, is_causal, capability) -> bool:
    return (query.dtype in (torch.float32, *_HALF) and capability >= (5, 0) and _same_heads(query, key, value)
            and query.shape[-1] % 8 == 0 and value.shape[-1] % 8 == 0)


def cudnn_gate(query, key, value, attn_mask, is_causal, capability) -> bool:
    E = query.shape[-1]
    return (attn_mask is None and query.dtype in _HALF and capability >= (8, 0) and _same_heads(query, key, value)
            and E == key.shape[-1] == value.shape[-1] and E % 8 == 0 and E <= 128)


_GATES = {FLASH: flash_gate, EFFICIENT: efficient_gate, CUDNN: cudnn_gate, MATH: lambda *a: True}


def emulated_choice(query, key, value, attn_mask=None, is_causal=False, enable_gqa=False,
                    capability=_EMULATED_CAPABILITY) -> int:
    """torch's choice by the switches and the gates above: the first enabled backend in
    priority order whose gate passes."""
    on = sdp_state.enabled()
    for backend in sdp_state.priority():
        if on.get(backend) and _GATES[backend](query, key, value, attn_mask, is_causal, capability):
            return backend
    return NONE
