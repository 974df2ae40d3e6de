"""A stand-in for torch's two cuDNN attention ops, in torch math, so the "cudnn_sdpa"
executor's wiring (claiming, lowering, the forward/backward split, its residuals) is
tested on machines without a GPU. It is not cuDNN: same schemas and output shapes
(softmax statistics (B, H, L, 1) in float32, dropout seed and offset), ordinary torch ops
inside. tests/test_kernel_executors.py puts it where the executor looks its kernels up."""
from __future__ import annotations

import math

import torch


def _attention(query, key, value, is_causal, scale):
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query.float() @ key.float().transpose(-2, -1)) * scale
    if is_causal:
        L, S = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=scores.device).tril(), -float("inf"))
    lse = torch.logsumexp(scores, -1, keepdim=True)
    return (torch.exp(scores - lse) @ value.float()).to(query.dtype), lse


def _scaled_dot_product_cudnn_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                                        is_causal=False, return_debug_mask=False, *, scale=None):
    assert attn_bias is None and dropout_p == 0.0, "the stand-in covers what the executor's checker accepts"
    out, lse = _attention(query, key, value, is_causal, scale)
    zero = torch.zeros((), dtype=torch.int64, device=query.device)
    return out, lse, None, None, query.shape[2], key.shape[2], zero, zero.clone(), None


def _scaled_dot_product_cudnn_attention_backward(grad_out, query, key, value, out, logsumexp, philox_seed,
                                                 philox_offset, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k,
                                                 dropout_p, is_causal, *, scale=None):
    assert logsumexp.shape == (*query.shape[:3], 1) and max_q == query.shape[2] and max_k == key.shape[2]
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
        recomputed, _ = _attention(q, k, v, is_causal, scale)
        return torch.autograd.grad(recomputed, (q, k, v), grad_out)
