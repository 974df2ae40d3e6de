"""The sdpa executor: scaled_dot_product_attention on torch's fused attention kernels.

It claims `scaled_dot_product_attention` only where a fused kernel takes the call as
is; anything else falls to the next executor (torch runs it, or its decomposition).
- CPU: aten's flash kernel (`_scaled_dot_product_flash_attention_for_cpu`), which
  returns the output and the row logsumexp; its backward
  (`..._for_cpu_backward`) needs only those two besides the inputs, so
  differentiating saves out + logsumexp instead of the L x S attention matrix. Claimed
  exactly where torch's CPU dispatch picks flash (sdpa_choice.cpu_choice: its gate and the
  `sdpa_kernel` switches, which guard the trace); elsewhere math attention runs, as in eager.
- CUDA: `F.scaled_dot_product_attention`, which picks flash, memory-efficient or
  cuDNN itself. When thunderfn differentiates, the kernel pair of the backend torch
  would pick for the call (executors/sdpa_choice.py applies copies of torch's gates,
  no wider than torch's, for the GPU's compute capability, under the user's
  `sdpa_kernel` context and `enable_*_sdp` switches): flash
  (`_scaled_dot_product_flash_attention` and its backward), cuDNN
  (`_scaled_dot_product_cudnn_attention` and its backward, without a mask) or
  memory-efficient (`_scaled_dot_product_efficient_attention` and its backward).
  Each saves out + its logsumexp (+ the kernel's dropout seed/offset tensors, unused
  without dropout but part of the backward's signature), never the L x S matrix. Where
  torch would run math attention (only math enabled, or no fused gate passes) the call
  is not claimed: torch runs it. The pair is chosen while lowering, so traces of CUDA
  attention retrace when the switches change (thunderfn/torch/sdp_state.py).
The gates mirror torch's own (aten/src/ATen/native/transformers/sdp_utils_cpp.h):
4-d inputs, equal batch sizes (the CPU kernel reads out of bounds when key/value
broadcast over the batch), equal head dims, non-empty sequences, no dropout, a 2-d
or 4-d mask that does not require grad, grouped-query heads only with enable_gqa.

No kernel here has a derivative of its own (eager raises for a second derivative through
them): each operator is registered like= the kernel's formula in clang and prims, which a
second derivative (grad of grad, jvp of grad) differentiates; the first stays the kernels'.
"""
from __future__ import annotations

import inspect
import math

import torch

from thunderfn import clang, prims
from thunderfn.core import dtypes
from thunderfn.core.proxies import TensorProxy
from thunderfn.executors import cudnn_sdpa, sdpa_choice
from thunderfn.executors.base import OperatorExecutor
from thunderfn.torch import nn as tnn
from thunderfn.torch import sdp_state
from thunderfn.torch.reductions import sum_to

aten = torch.ops.aten
_CPU_OPS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")
_CUDA_OPS = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward")
_FLASH_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward")
_CUDA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CUDA_ALIGNMENT = 16  # the memory-efficient kernel wants the bias's rows 16-element aligned


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()  # every fused kernel needs stride 1 in the head dim


# -- CPU: the flash kernel ------------------------------------------------------------------
def sdpa_flash_cpu_fwd(query, key, value, attn_mask, is_causal, scale):
    q, k, v = map(_last_dim_contiguous, (query, key, value))
    return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)


def sdpa_flash_cpu(query, key, value, attn_mask, is_causal, scale):
    # torch autograd differentiates the aten op with its fused backward, so a jitted
    # function's loss.backward() also saves only out + logsumexp
    return sdpa_flash_cpu_fwd(query, key, value, attn_mask, is_causal, scale)[0]


def sdpa_flash_cpu_bwd(grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, scale):
    # grad_out as it comes, as eager's autograd passes it: the kernel makes it contiguous in its own
    # (B, L, heads, E) order, which the usual grad_out (heads put back by transpose(1, 2)) already is;
    # a .contiguous() here copied it into (B, heads, L, E) and the kernel copied it back
    return tuple(aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, *map(_last_dim_contiguous, (query, key, value)), out, logsumexp, 0.0, is_causal,
        attn_mask=attn_mask, scale=scale))


# -- CUDA: torch's dispatcher forward; the memory-efficient pair for thunderfn's vjp ------------
def sdpa_fused_cuda(query, key, value, attn_mask, is_causal, scale):
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                                            is_causal=is_causal, scale=scale)


def _cuda_bias(attn_mask, query, key):
    """The mask as the memory-efficient kernel takes it: expanded to (B, H, L, S), rows
    padded to the kernel's alignment and sliced back (what torch's sdpa does before
    calling it)."""
    if attn_mask is None:
        return None
    b, h, L = query.shape[:3]
    bias = attn_mask.to(query.dtype).expand(b, h, L, key.shape[-2])
    pad = (-bias.shape[-1]) % _CUDA_ALIGNMENT
    return bias if pad == 0 else torch.nn.functional.pad(bias, (0, pad))[..., :bias.shape[-1]]


def sdpa_efficient_cuda_fwd(query, key, value, attn_mask, is_causal, scale):
    out, lse, _seed, _offset = aten._scaled_dot_product_efficient_attention(
        query, key, value, _cuda_bias(attn_mask, query, key), True, 0.0, is_causal, scale=scale)
    return out, lse


def sdpa_efficient_cuda_bwd(grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, scale):
    bias = _cuda_bias(attn_mask, query, key)
    no_rng = torch.zeros((), dtype=torch.int64, device=query.device)  # dropout is refused: seed/offset unused
    dq, dk, dv, _dbias = aten._scaled_dot_product_efficient_attention_backward(
        grad_out.contiguous(), query, key, value, bias, out, logsumexp, no_rng, no_rng, 0.0,
        [True, True, True, False], is_causal, scale=scale)
    return dq, dk, dv


def sdpa_flash_cuda_fwd(query, key, value, attn_mask, is_causal, scale):
    """(out, logsumexp (B, H, L) float32, and the two rng-state tensors the backward takes)."""
    q, k, v = map(_last_dim_contiguous, (query, key, value))
    out, lse, _cum_q, _cum_k, _max_q, _max_k, rng_a, rng_b, _debug = aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, is_causal, False, scale=scale)
    return out, lse, rng_a, rng_b


def sdpa_flash_cuda_bwd(grad_out, query, key, value, out, logsumexp, rng_a, rng_b, attn_mask, is_causal, scale):
    # dense inputs: no cumulative sequence lengths (None, as the forward returned them), max lengths L and S
    q, k, v = map(_last_dim_contiguous, (query, key, value))
    return tuple(aten._scaled_dot_product_flash_attention_backward(  # it makes grad_out contiguous itself
        grad_out, q, k, v, out, logsumexp, None, None, q.shape[2], k.shape[2], 0.0, is_causal,
        rng_a, rng_b, scale=scale))


def sdpa_cudnn_cuda_fwd(query, key, value, attn_mask, is_causal, scale):
    return cudnn_sdpa.cudnn_sdpa_fwd(*map(_last_dim_contiguous, (query, key, value)), is_causal, scale)


def sdpa_cudnn_cuda_bwd(grad_out, query, key, value, out, logsumexp, seed, offset, attn_mask, is_causal, scale):
    return cudnn_sdpa.cudnn_sdpa_bwd(grad_out, *map(_last_dim_contiguous, (query, key, value)), out, logsumexp,
                                     seed, offset, is_causal, scale)


# -- metadata for the operators ------------------------------------------------------------------
def _out_meta(query, key, value, attn_mask, is_causal, scale):
    return TensorProxy.like(query, shape=(*query.shape[:-1], value.shape[-1]), requires_grad=False)


def _fwd_meta(query, key, value, attn_mask, is_causal, scale):
    """(out, logsumexp) of the CPU flash kernel: the logsumexp (B, H, L) in the kernel's accumulation type."""
    out = _out_meta(query, key, value, attn_mask, is_causal, scale)
    lse_dtype = torch.float64 if query.dtype is torch.float64 else torch.float32
    return out, TensorProxy.like(query, shape=tuple(query.shape[:3]), dtype=lse_dtype, requires_grad=False)


def _lse(query, shape):
    return TensorProxy.like(query, shape=shape, dtype=torch.float32, requires_grad=False)


def _efficient_fwd_meta(query, key, value, attn_mask, is_causal, scale):
    b, h, L = query.shape[:3]  # the memory-efficient kernel pads its logsumexp rows to 32
    return _out_meta(query, key, value, attn_mask, is_causal, scale), _lse(query, (b, h, math.ceil(L / 32) * 32))


def _on_meta(t):
    return torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")


def _flash_fwd_meta(query, key, value, attn_mask, is_causal, scale):
    # the rng-state tensors' shape and dtype changed across torch versions: torch's own meta kernel says
    with torch._C.DisableTorchFunction():  # a torch call of our own, not one for tracing to record
        rng = aten._scaled_dot_product_flash_attention(*map(_on_meta, (query, key, value)), 0.0, is_causal, False,
                                                       scale=scale)[6:8]
    return (_out_meta(query, key, value, attn_mask, is_causal, scale), _lse(query, tuple(query.shape[:3])),
            *(TensorProxy(shape=tuple(r.shape), dtype=r.dtype, device=query.device) for r in rng))


def _cudnn_fwd_meta(query, key, value, attn_mask, is_causal, scale):
    return cudnn_sdpa._fwd_meta(query, key, value, is_causal, scale)


def _bwd_meta(grad_out, query, key, value, out, logsumexp, *rng_mask_is_causal_scale):
    return tuple(TensorProxy.like(t, requires_grad=False) for t in (query, key, value))


# -- under tf.vmap: the vmapped batch folded into the kernels' own batch dim ------------------------
def _front(t, dim, batch: int):
    """t with the vmapped batch dim first; an unbatched tensor expanded along it."""
    return clang.move_dim(t, dim, 0) if dim is not None else clang.expand_to(t, (batch, *t.shape))


def _fold(t, dim, batch: int):
    t = _front(t, dim, batch)
    return prims.reshape(t, (batch * t.shape[1], *t.shape[2:]))


def _fold_mask(mask, dim, batch: int, heads_batch: int):
    """The mask for the folded call: one the same for every example that is 2-d, or 4-d with a
    leading 1, broadcasts over the folded batch as it is; any other is brought to
    (batch, heads_batch, h or 1, L, S) and folded like the tensors."""
    if mask is None or dim is None and (mask.ndim == 2 or mask.shape[0] == 1):
        return mask
    m = _front(mask, dim, batch)
    if m.ndim == 3:  # (batch, L, S)
        m = prims.broadcast_in_dim(m, (batch, 1, 1, *m.shape[1:]), (0, 3, 4))
    m = prims.broadcast_in_dim(m, (batch, heads_batch, *m.shape[2:]), tuple(range(5)))
    return prims.reshape(m, (batch * heads_batch, *m.shape[2:]))


def _batch_folded(operators: dict, operator: str, n_tensors: int, n_rng: int = 0, n_batched_out: int | None = None):
    """The batch rule of the operator named `operator` (in `operators`, an executor's), whose first n_tensors arguments
    are (batch, heads, ...) tensors (the logsumexp (batch, heads, L) too), then n_rng rng-state tensors,
    then (attn_mask, is_causal, scale): one call on the vmapped batch times the kernel's batch. Its
    first n_batched_out results (all if None) are per example; the rest (rng state) are shared."""
    def rule(args, dims, kwargs, out):
        tensors, tensor_dims = args[:n_tensors], dims[:n_tensors]
        batch = next(t.shape[d] for t, d in zip(args, dims) if d is not None)
        if any((t.ndim - (d is not None)) < 3 for t, d in zip(tensors, tensor_dims)):  # (b, h, L[, E]) each
            return NotImplemented
        if any(d is not None for d in dims[n_tensors:n_tensors + n_rng]):
            return NotImplemented  # a batch of rng states: not what one kernel call takes
        rng = args[n_tensors:n_tensors + n_rng]
        mask, is_causal, scale = args[n_tensors + n_rng:]
        folded = [_fold(t, d, batch) for t, d in zip(tensors, tensor_dims)]
        mask = _fold_mask(mask, dims[n_tensors + n_rng], batch, folded[0].shape[0] // batch)
        results = operators[operator](*folded, *rng, mask, is_causal, scale)
        n = len(results) if n_batched_out is None else n_batched_out
        unfolded = tuple(prims.reshape(r, (batch, r.shape[0] // batch, *r.shape[1:])) for r in results[:n])
        return unfolded + tuple(results[n:]), (0,) * n + (None,) * (len(results) - n)

    return rule


# -- the checker: exactly what the fused kernels accept --------------------------------------------
def _mask_ok(attn_mask, query, key) -> bool:
    if attn_mask is None:
        return True
    if attn_mask.requires_grad or attn_mask.ndim not in (2, 4):  # neither kernel gives a mask gradient
        return False
    if not (attn_mask.dtype is torch.bool or attn_mask.dtype in (query.dtype, torch.float32)):
        return False
    b, h, L, S = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    wanted = (b, h, L, S) if attn_mask.ndim == 4 else (L, S)
    return all(m in (1, w) for m, w in zip(attn_mask.shape, wanted))


def sdpa_checker(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    qkv = (query, key, value)
    if not all(isinstance(t, TensorProxy) for t in qkv) or dropout_p != 0.0:
        return False  # dropout draws random numbers: the torch executor keeps eager's draws
    device = query.device.type
    if device not in ("cpu", "cuda") or any(t.device != query.device for t in qkv):
        return False
    if any(0 in t.shape for t in qkv):
        return False  # eager answers empty inputs itself, before it chooses a kernel
    if device == "cpu":  # the flash kernel exactly where torch's CPU dispatch picks it, math attention elsewhere
        return sdpa_choice.cpu_choice(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) == sdp_state.FLASH
    if not all(hasattr(aten, n) for n in _CUDA_OPS):
        return False
    if (any(t.ndim != 4 for t in qkv) or not (query.dtype == key.dtype == value.dtype)
            or query.dtype not in _CUDA_DTYPES):
        return False
    (B, H, _, E), (Bk, Hk, S, Ek), (Bv, Hv, Sv, Ev) = query.shape, key.shape, value.shape
    if not (B == Bk == Bv) or S != Sv or E != Ek or H != Hk or Hk != Hv:
        return False  # (grouped-query heads: the efficient CUDA kernel takes none)
    if attn_mask is not None and is_causal:
        return False  # the CUDA kernels' gates refuse the pair; the decomposition defines it, so it runs there
    if E % 8 or Ev % 8:
        return False  # the efficient kernel's alignment (torch pads otherwise; we let torch do that)
    if not _mask_ok(attn_mask, query, key):
        return False
    return cuda_kernel(query, key, value, attn_mask, is_causal) is not None


def cuda_kernel(query, key, value, attn_mask=None, is_causal=False) -> str | None:
    """The kernel pair ("flash", "cudnn", "efficient") that differentiates this CUDA call: the one of
    the backend torch would pick under the current switches; None where torch would run math attention."""
    requires_grad = any(t.requires_grad for t in (query, key, value))
    choice = sdpa_choice.torch_choice(query, key, value, attn_mask, is_causal, requires_grad)
    # (the flash and cuDNN gates take no mask; an older torch may lack the kernels' aten ops)
    if choice == sdp_state.FLASH and all(hasattr(aten, n) for n in _FLASH_OPS):
        return "flash"
    if choice == sdp_state.CUDNN and all(hasattr(aten, n) for n in cudnn_sdpa._OPS):
        return "cudnn"
    if choice == sdp_state.EFFICIENT:
        return "efficient"
    return None  # math, or no backend: torch runs the call


# -- the kernels' formulas in clang and prims: the mask's gradient, which no kernel returns, and what a
#    second derivative differentiates in each kernel's place (the aten kernels have no derivative) -------
def _scores(query, key, mask, is_causal, scale):
    """(q k^T * scale + mask in the computation dtype, where a position is ruled out by the mask or
    causality, as a bool tensor), with key's heads repeated for grouped-query attention."""
    compute = dtypes.computation_dtype(query.dtype)
    q, k = (clang.maybe_convert_to_dtype(t, compute) for t in (query, key))
    k = tnn._repeat_heads(k, q.shape[-3] // k.shape[-3])
    scale = 1 / torch.sym_sqrt(q.shape[-1]) if scale is None else scale  # (math.sqrt would pin a symbolic size)
    scores = clang.mul(prims.matmul(q, clang.transpose(k, -2, -1)), scale)
    if mask is not None:
        scores = clang.add(scores, clang.maybe_convert_to_dtype(mask, compute))
    ruled_out = clang.eq(scores, -float("inf"))
    if is_causal:  # torch's causal mask: row i sees columns 0..i
        rows = clang.unsqueeze(clang.arange(0, q.shape[-2], 1, device=q.device, dtype=torch.int64), 1)
        cols = clang.unsqueeze(clang.arange(0, k.shape[-2], 1, device=q.device, dtype=torch.int64), 0)
        ruled_out = clang.bitwise_or(ruled_out, clang.lt(rows, cols))
        scores = clang.where(ruled_out, -float("inf"), scores)
    return scores, ruled_out


def _logsumexp(scores):
    """Per row, -inf on a row ruled out entirely; written so that its derivative there is 0, not nan."""
    last = (scores.ndim - 1,)
    top = prims.amax(scores, last)
    top = clang.where(clang.eq(top, -float("inf")), 0.0, top)
    total = prims.sum(clang.exp(clang.sub(scores, clang.unsqueeze(top, -1))), last)
    empty = clang.eq(total, 0.0)
    return clang.where(empty, -float("inf"), clang.add(clang.log(clang.where(empty, 1.0, total)), top))


def _lse_rows(lse, query):
    """A kernel's logsumexp as (B, H, L): cuDNN's has a trailing 1, the memory-efficient kernel's rows padded to 32."""
    if lse.ndim == 4:
        lse = clang.reshape(lse, tuple(lse.shape[:3]))
    return clang.slice_in_dim(lse, 0, query.shape[-2], dim=2) if lse.shape[-1] != query.shape[-2] else lse


def _kernel_grads(g, query, key, value, out, lse, mask, is_causal, scale):
    """The flash backward, op by op: P = exp(S - lse) (0 where ruled out), dS = P * (g v^T - rowsum(g * out)),
    dq = scale dS k, dk = scale dS^T q, dv = P^T g (summed per group of grouped-query heads). Returns
    (dq, dk, dv) in the inputs' dtypes and dS in the computation dtype, repeated heads unsummed."""
    compute = dtypes.computation_dtype(query.dtype)
    scores, ruled_out = _scores(query, key, mask, is_causal, scale)
    q, k, v, g, out = (clang.maybe_convert_to_dtype(t, compute) for t in (query, key, value, g, out))
    reps = q.shape[-3] // k.shape[-3]
    k, v = tnn._repeat_heads(k, reps), tnn._repeat_heads(v, reps)
    lse = clang.unsqueeze(clang.maybe_convert_to_dtype(_lse_rows(lse, query), compute), -1)
    # exp of -inf, not of scores - lse, where a row is all ruled out (lse -inf): no nan for a second derivative
    probs = clang.exp(clang.where(ruled_out, -float("inf"), clang.sub(scores, lse)))
    row_dot = clang.unsqueeze(prims.sum(clang.mul(g, out), (g.ndim - 1,)), -1)
    d_scores = clang.mul(probs, clang.sub(prims.matmul(g, clang.transpose(v, -2, -1)), row_dot))
    scale = 1 / torch.sym_sqrt(q.shape[-1]) if scale is None else scale  # (math.sqrt would pin a symbolic size)
    dq = clang.mul(prims.matmul(d_scores, k), scale)
    dk = clang.mul(prims.matmul(clang.transpose(d_scores, -2, -1), q), scale)
    dv = prims.matmul(clang.transpose(probs, -2, -1), g)

    def per_group(d, like):  # the repeated heads' gradients summed back onto the shared one
        if reps == 1:
            return clang.maybe_convert_to_dtype(d, like.dtype)
        shape = tuple(d.shape)
        grouped = prims.reshape(d, shape[:1] + (like.shape[1], reps) + shape[2:])
        return clang.maybe_convert_to_dtype(prims.sum(grouped, (2,)), like.dtype)

    return (clang.maybe_convert_to_dtype(dq, query.dtype), per_group(dk, key), per_group(dv, value)), d_scores


def _mask_grad(g, query, key, value, out, lse, mask, is_causal, scale):
    """d loss / d mask for an additive mask: the backward's dS summed to the mask's shape. It is L x S,
    but only computed when something reads it: differentiating with respect to the mask is rare, and
    otherwise dead code elimination drops these ops and the backward stays free of L x S tensors."""
    d_scores = _kernel_grads(g, query, key, value, out, lse, mask, is_causal, scale)[1]
    return clang.maybe_convert_to_dtype(sum_to(d_scores, mask.shape), mask.dtype)


def _fwd_like(fwd_meta):
    """What a forward kernel computes, as a function thunderfn differentiates: math attention's output and
    the row logsumexp in the kernel's layout; the rng-state outputs (integers) carry no derivative."""
    def like(query, key, value, attn_mask, is_causal, scale):
        metas = fwd_meta(query, key, value, attn_mask, is_causal, scale)
        out = tnn.scaled_dot_product_attention(query, key, value, attn_mask, 0.0, is_causal, scale,
                                               enable_gqa=query.shape[1] != key.shape[1])
        lse = clang.maybe_convert_to_dtype(_logsumexp(_scores(query, key, attn_mask, is_causal, scale)[0]),
                                           metas[1].dtype)
        if metas[1].ndim == 4:  # cuDNN's (B, H, L, 1)
            lse = clang.unsqueeze(lse, -1)
        elif metas[1].shape[-1] != lse.shape[-1]:  # the memory-efficient kernel's padded rows (never read)
            pad = (*lse.shape[:-1], metas[1].shape[-1] - lse.shape[-1])
            lse = clang.cat([lse, clang.full(pad, 0.0, device=lse.device, dtype=lse.dtype)], -1)
        return (out, lse) + (None,) * (len(metas) - 2)

    return like


def _bwd_like(grad_out, query, key, value, out, logsumexp, *rng_mask_is_causal_scale):
    """What a backward kernel computes, as a function thunderfn differentiates."""
    mask, is_causal, scale = rng_mask_is_causal_scale[-3:]
    return _kernel_grads(grad_out, query, key, value, out, logsumexp, mask, is_causal, scale)[0]


# -- the lowering -----------------------------------------------------------------------------------
def _float_mask(attn_mask, query):
    """Bool masks become additive ones in the query's dtype, as torch's sdpa converts them."""
    if attn_mask is None or attn_mask.dtype is not torch.bool:
        return attn_mask
    return clang.where(attn_mask, 0.0, clang.full(attn_mask.shape, -float("inf"), device=query.device,
                                                   dtype=query.dtype))


class SDPAExecutor(OperatorExecutor):
    """See the module docstring."""

    def __init__(self):
        super().__init__("sdpa", torch.__version__)
        self.cpu = self.register_operator("sdpa_flash_cpu", meta=_out_meta, fn=sdpa_flash_cpu, traceable=True)
        self.cuda = self.register_operator("sdpa_fused_cuda", meta=_out_meta, fn=sdpa_fused_cuda)
        # the forward and backward of thunderfn's vjp, per kernel: vmap(grad(f)) folds the batch into their calls
        self.pairs = {}
        for kernel, fwd_meta, fwd, bwd, n_rng in (
                ("flash_cpu", _fwd_meta, sdpa_flash_cpu_fwd, sdpa_flash_cpu_bwd, 0),
                ("efficient_cuda", _efficient_fwd_meta, sdpa_efficient_cuda_fwd, sdpa_efficient_cuda_bwd, 0),
                ("flash_cuda", _flash_fwd_meta, sdpa_flash_cuda_fwd, sdpa_flash_cuda_bwd, 2),
                ("cudnn_cuda", _cudnn_fwd_meta, sdpa_cudnn_cuda_fwd, sdpa_cudnn_cuda_bwd, 2)):
            names = f"sdpa_{kernel}_fwd", f"sdpa_{kernel}_bwd"
            # like=: a second derivative (grad of grad, jvp of grad) differentiates the kernels' formulas;
            # traceable: aten calls only, so Inductor regions call them as extern kernels (executors/fusion.py)
            self.register_operator(names[0], meta=fwd_meta, like=_fwd_like(fwd_meta), fn=fwd, traceable=True,
                                   batch_rule=_batch_folded(self.operators, names[0], 3, 0, 2))
            self.register_operator(names[1], meta=_bwd_meta, like=_bwd_like, fn=bwd, traceable=True,
                                   batch_rule=_batch_folded(self.operators, names[1], 6, n_rng))
            self.pairs[kernel] = tuple(self.operators[n] for n in names)
        self.register_lowering(tnn.scaled_dot_product_attention, checker=sdpa_checker, lower=self.lower,
                               vjp=(self.vjp_fwd, self.vjp_bwd))

    def availability(self) -> tuple[bool, str]:
        missing = [n for n in _CPU_OPS if not hasattr(aten, n)]
        if missing:
            return False, f"torch {torch.__version__} has no aten.{missing[0]} (needs torch >= 2.3)"
        return True, ""

    def lower(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        op = self.cpu if query.device.type == "cpu" else self.cuda  # on CUDA torch picks the kernel at run time
        return op(query, key, value, _float_mask(attn_mask, query), is_causal, scale)

    def _pair(self, query, key, value, attn_mask, is_causal, scale, enable_gqa):
        if query.device.type == "cpu":
            return self.pairs["flash_cpu"]
        kernel = cuda_kernel(query, key, value, attn_mask, is_causal)
        # None only where the checker saw inputs not requiring grad and torch would differentiate with
        # math attention; the memory-efficient pair takes every call the checker accepts on CUDA
        return self.pairs[f"{kernel or 'efficient'}_cuda"]

    # custom_vjp's conventions: fwd(*args, **kwargs) -> (out, residuals); bwd(residuals, g) -> one
    # cotangent per positional argument the symbol was called with (so fwd records how many)
    def vjp_fwd(self, *args, **kwargs):
        a = inspect.signature(sdpa_checker).bind(*args, **kwargs).arguments
        query, key, value = a["query"], a["key"], a["value"]
        mask = _float_mask(a.get("attn_mask"), query)
        is_causal, scale = a.get("is_causal", False), a.get("scale")
        fwd, bwd = self._pair(query, key, value, a.get("attn_mask"), is_causal, scale, a.get("enable_gqa", False))
        out, lse, *rng = fwd(query, key, value, mask, is_causal, scale)
        float_mask = mask is not None and mask is a.get("attn_mask")  # a bool mask has no gradient
        return out, (bwd, query, key, value, mask, float_mask, is_causal, scale, out, lse, tuple(rng), len(args))

    def vjp_bwd(self, residuals, g):
        bwd, query, key, value, mask, float_mask, is_causal, scale, out, lse, rng, n_positional = residuals
        dq, dk, dv = bwd(g, query, key, value, out, lse, *rng, mask, is_causal, scale)
        d_mask = _mask_grad(g, query, key, value, out, lse, mask, is_causal, scale) if float_mask else None
        return ((dq, dk, dv, d_mask) + (None,) * n_positional)[:n_positional]


sdpa_ex = SDPAExecutor()
