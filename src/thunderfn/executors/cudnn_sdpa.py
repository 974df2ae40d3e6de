"""The "cudnn_sdpa" executor: scaled_dot_product_attention on cuDNN's fused attention.

torch ships cuDNN's attention as one of its SDPA backends (`SDPBackend.CUDNN_ATTENTION`,
the aten ops `_scaled_dot_product_cudnn_attention` and its backward). This executor
claims `scaled_dot_product_attention` where that backend takes the call as it is, and
runs it there, forward and backward: differentiating saves the output and cuDNN's
softmax statistics (B, H, L, 1), not the L x S attention matrix.

The checker accepts what torch's own gate for the backend accepts
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, `can_use_cudnn_attention`),
kept to the cases this executor was written for:
- CUDA tensors, float16 or bfloat16, all three of one dtype, 4-d (batch, heads, seq, dim);
- one batch size and one head count for query, key and value (no grouped-query heads);
- one head dim for the three, a multiple of 8 and at most 128;
- non-empty sequences;
- no mask, or is_causal=True (an explicit attn_mask goes to another executor);
- no dropout (its random numbers would be cuDNN's, not eager's: the torch executor keeps eager's).

Availability needs a CUDA device of compute capability 8.0 or newer, cuDNN, and torch's
cuDNN SDPA backend enabled; `tf.executors.available()` says which is missing. It is not
a default executor: ask for it with `tf.jit(fn, executors=["cudnn_sdpa"])`.

The kernels are called through `kernels` (torch.ops.aten), so tests run the wiring on CPU
with a stand-in implementing the two ops in torch (thunderfn/testing/cudnn_standin.py).
"""
from __future__ import annotations

import inspect

import torch

from thunderfn.core.proxies import TensorProxy
from thunderfn.executors.base import OperatorExecutor
from thunderfn.torch import nn as tnn

kernels = torch.ops.aten  # where the two cuDNN ops are looked up (tests put a stand-in here)
DEVICE = "cuda"  # the device the checker takes (tests of the wiring with the stand-in set "cpu")
_OPS = ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward")
_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128


def cudnn_sdpa_fwd(query, key, value, is_causal, scale):
    """(out, softmax statistics, dropout seed, dropout offset): what the backward needs."""
    out, lse, _cum_q, _cum_k, _max_q, _max_k, seed, offset, _debug = kernels._scaled_dot_product_cudnn_attention(
        query, key, value, None, True, 0.0, is_causal, False, scale=scale)
    return out, lse, seed, offset


def cudnn_sdpa(query, key, value, is_causal, scale):
    return kernels._scaled_dot_product_cudnn_attention(query, key, value, None, False, 0.0, is_causal, False,
                                                       scale=scale)[0]


def cudnn_sdpa_bwd(grad_out, query, key, value, out, lse, seed, offset, is_causal, scale):
    # dense inputs: no cumulative sequence lengths, max lengths the sequences' own
    return tuple(kernels._scaled_dot_product_cudnn_attention_backward(
        grad_out.contiguous(), query, key, value, out, lse, seed, offset, None, None, None, query.shape[2],
        key.shape[2], 0.0, is_causal, scale=scale))


def _out_meta(query, key, value, is_causal, scale):
    return TensorProxy.like(query, requires_grad=False)


def _fwd_meta(query, key, value, is_causal, scale):
    b, h, L, _ = query.shape
    rng = TensorProxy(shape=(), dtype=torch.int64, device=query.device)
    return (TensorProxy.like(query, requires_grad=False),
            TensorProxy(shape=(b, h, L, 1), dtype=torch.float32, device=query.device), rng,
            TensorProxy(shape=(), dtype=torch.int64, device=query.device))


def _bwd_meta(grad_out, query, key, value, out, lse, seed, offset, is_causal, scale):
    return tuple(TensorProxy.like(t, requires_grad=False) for t in (query, key, value))


def cudnn_sdpa_checker(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False) -> bool:
    qkv = (query, key, value)
    if not all(isinstance(t, TensorProxy) for t in qkv) or attn_mask is not None or dropout_p != 0.0:
        return False
    if any(t.device.type != DEVICE or t.device != query.device for t in qkv):
        return False
    if any(t.ndim != 4 for t in qkv) or not (query.dtype == key.dtype == value.dtype) or query.dtype not in _DTYPES:
        return False
    (B, H, L, E), (Bk, Hk, S, Ek), (Bv, Hv, Sv, Ev) = query.shape, key.shape, value.shape
    if not (B == Bk == Bv and H == Hk == Hv and S == Sv and E == Ek == Ev) or 0 in (B, H, L, S, E):
        return False
    return E % 8 == 0 and E <= MAX_HEAD_DIM


class CuDNNSDPAExecutor(OperatorExecutor):
    """See the module docstring."""

    def __init__(self):
        super().__init__("cudnn_sdpa", torch.__version__)
        self.attention = self.register_operator("cudnn_sdpa", meta=_out_meta, fn=cudnn_sdpa)
        self.fwd = self.register_operator("cudnn_sdpa_fwd", meta=_fwd_meta, fn=cudnn_sdpa_fwd)
        self.bwd = self.register_operator("cudnn_sdpa_bwd", meta=_bwd_meta, fn=cudnn_sdpa_bwd)
        self.register_lowering(tnn.scaled_dot_product_attention, checker=cudnn_sdpa_checker, lower=self.lower,
                               vjp=(self.vjp_fwd, self.vjp_bwd))

    def availability(self) -> tuple[bool, str]:
        missing = [n for n in _OPS if not hasattr(torch.ops.aten, n)]
        if missing:
            return False, f"torch {torch.__version__} has no aten.{missing[0]} (cuDNN attention needs torch >= 2.5)"
        if not torch.cuda.is_available():
            return False, "no CUDA device: cuDNN attention runs on NVIDIA GPUs of compute capability 8.0 or newer"
        if not torch.backends.cudnn.is_available():
            return False, "torch was built without cuDNN"
        if torch.cuda.get_device_capability() < (8, 0):
            major, minor = torch.cuda.get_device_capability()
            return False, f"the GPU has compute capability {major}.{minor}; cuDNN attention needs 8.0 or newer"
        if not torch.backends.cuda.cudnn_sdp_enabled():
            return False, "torch's cuDNN SDPA backend is disabled (torch.backends.cuda.enable_cudnn_sdp(True))"
        return True, ""

    def lower(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
        return self.attention(query, key, value, is_causal, scale)

    # custom_vjp's conventions: fwd(*args, **kwargs) -> (out, residuals); bwd(residuals, g) -> one
    # cotangent per positional argument the symbol was called with (so fwd records how many)
    def vjp_fwd(self, *args, **kwargs):
        a = inspect.signature(cudnn_sdpa_checker).bind(*args, **kwargs).arguments
        query, key, value, is_causal, scale = (a["query"], a["key"], a["value"],
                                               a.get("is_causal", False), a.get("scale"))
        out, lse, seed, offset = self.fwd(query, key, value, is_causal, scale)
        return out, (query, key, value, out, lse, seed, offset, is_causal, scale, len(args))

    def vjp_bwd(self, residuals, g):
        query, key, value, out, lse, seed, offset, is_causal, scale, n_positional = residuals
        dq, dk, dv = self.bwd(g, query, key, value, out, lse, seed, offset, is_causal, scale)
        return ((dq, dk, dv) + (None,) * n_positional)[:n_positional]


cudnn_sdpa_ex = CuDNNSDPAExecutor()
