"""The triton_crossentropy executor: cross_entropy with class-index targets as two Triton kernels.

The forward kernel reads each row of logits once, in chunks of BLOCK columns with an
online max and logsumexp, picks the target's logit with one scalar load, and writes
the row's loss, whether it counts (not ignore_index) and whether its target is out of
range, into one (3, N) float32 buffer; one `sum(1)` of that buffer gives the total loss,
the number of counted rows (mean's divisor) and the number of bad targets (an error,
as in torch), so the forward is one kernel and three small torch ops. The backward
kernel reads the logits once more and writes `(softmax(x) - onehot(target)) * g` in
one pass, with g scaled by 1 / counted rows (for mean) in the kernel. Differentiating
keeps one float per row (the logsumexp) and the counted rows, not the N x C
log-probabilities. Both compute in float32 whatever the logits' dtype. Three passes
over N x C in all (read, read, write): the bandwidth floor benchmarks/gpu_check.py
measures against.

Not fused Liger-style (the gradient written by the forward, then scaled by the
backward): that writes N x C in the forward and, unless grad_output is known to be 1
(a device-to-host sync to find out), reads and writes it again in the backward: five
passes, not three.

BLOCK is 8192 columns (fewer for smaller rows) with 16 warps, so a row of a 50k
vocabulary is 7 chunks and no program holds a whole row in registers. The number of
columns is a compile-time constant of the kernels (one compile per vocabulary size):
a loop bound that is a runtime argument makes Triton's interpreter before 3.9 convert
a shape-(1,) array to an int, which NumPy >= 2.4 refuses.

Claimed: class-index targets (int64), reduction mean/sum/none, any ignore_index,
logits float32/float16/bfloat16 with the class dim at 1 (2-d or more; extra dims are
moved next to the batch dim by the lowering). Refused, so the next executor runs
them: label_smoothing, weight, probability targets, float64 logits (the kernels
compute in float32), the legacy size_average/reduce arguments.

Triton runs on CUDA; on CPU only under its interpreter (TRITON_INTERPRET=1, read
when the kernels are first built, so set it before the first call; ~1 ms per
program). The kernels are built on first use, so importing thunderfn never imports
triton.
"""
from __future__ import annotations

import importlib.util
import inspect
import os

import torch

from thunderfn import clang
from thunderfn.core.proxies import TensorProxy
from thunderfn.executors.base import OperatorExecutor
from thunderfn.torch import nn as tnn

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_BLOCK = 8192  # columns per step of a row's loop: large vocabularies loop, small ones take one step
_kernels = None


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _build_kernels():
    """Define the kernels (first use only: triton reads TRITON_INTERPRET when it wraps them)."""
    global _kernels, triton, tl
    if _kernels is not None:
        return _kernels
    import triton
    import triton.language as tl

    @triton.jit
    def cross_entropy_fwd_kernel(logits_ptr, target_ptr, stats_ptr, lse_ptr, row_stride, ignore_index, n_rows,
                                 N_COLS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        row_ptr = logits_ptr + row * row_stride
        target = tl.load(target_ptr + row)
        ignored = target == ignore_index
        in_range = (target >= 0) & (target < N_COLS)
        running_max = tl.full((), -float("inf"), tl.float32)  # loop-carried values keep one type: float32
        running_sum = tl.full((), 0.0, tl.float32)
        for start in range(0, N_COLS, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + cols, mask=cols < N_COLS, other=-float("inf")).to(tl.float32)
            new_max = tl.maximum(running_max, tl.max(x, 0))
            running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), 0)
            running_max = new_max
        lse = running_max + tl.log(running_sum)
        picked = tl.load(row_ptr + target, mask=in_range, other=0.0).to(tl.float32)  # never read past the row
        counted = in_range & (target != ignore_index)
        tl.store(lse_ptr + row, lse)
        tl.store(stats_ptr + row, tl.where(counted, lse - picked, 0.0))
        tl.store(stats_ptr + n_rows + row, tl.where(counted, 1.0, 0.0))
        tl.store(stats_ptr + 2 * n_rows + row, tl.where(in_range | ignored, 0.0, 1.0))

    @triton.jit
    def cross_entropy_bwd_kernel(logits_ptr, target_ptr, lse_ptr, grad_loss_ptr, grad_loss_stride, counted_ptr,
                                 grad_ptr, row_stride, ignore_index, N_COLS: tl.constexpr, MEAN: tl.constexpr,
                                 BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        row_ptr = logits_ptr + row * row_stride
        grad_row_ptr = grad_ptr + row * N_COLS
        target = tl.load(target_ptr + row)
        lse = tl.load(lse_ptr + row)
        g = tl.load(grad_loss_ptr + row * grad_loss_stride).to(tl.float32)
        if MEAN:
            g = g / tl.load(counted_ptr)
        g = tl.where(target == ignore_index, 0.0, g)
        for start in range(0, N_COLS, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            in_row = cols < N_COLS
            x = tl.load(row_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
            d = (tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)) * g
            tl.store(grad_row_ptr + cols, d.to(grad_ptr.dtype.element_ty), mask=in_row)

    _kernels = (cross_entropy_fwd_kernel, cross_entropy_bwd_kernel)
    return _kernels


def launch_config(n_cols: int) -> dict:
    """BLOCK (columns per step) and num_warps: a 50k-class row is 7 steps of 8192 on 16 warps
    (16 float32 values per thread per step), a small row one step on fewer warps."""
    block = min(max(16, 1 << (max(n_cols, 1) - 1).bit_length()), _MAX_BLOCK)
    return {"BLOCK": block, "num_warps": 16 if block >= 8192 else 8 if block >= 2048 else 4}


# -- operators on real tensors: logits (N, C), target (N,) -----------------------------------
def cross_entropy_fwd(logits, target, ignore_index, reduction):
    """(loss reduced as asked, per-row logsumexp in float32, the number of rows counted (float32, 0-d))."""
    fwd, _ = _build_kernels()
    n_rows, n_cols = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    target = target.contiguous()
    stats = torch.empty((3, n_rows), dtype=torch.float32, device=logits.device)  # loss, counted, bad target
    lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    if n_rows:
        fwd[(n_rows,)](logits, target, stats, lse, logits.stride(0), ignore_index, n_rows,
                       N_COLS=n_cols, **launch_config(n_cols))
    total, counted, bad = stats.sum(1).unbind()
    # torch raises on an out-of-range class; _assert_async does not wait for the GPU (a device-side
    # assert there; an immediate error on CPU)
    torch._assert_async(bad == 0, "cross_entropy: Target out of bounds")
    if reduction == "none":
        return stats[0].to(logits.dtype), lse, counted
    if reduction == "mean":
        total = total / counted  # 0/0 = nan when every row is ignored, as torch
    return total.to(logits.dtype), lse, counted


def cross_entropy_bwd(grad_loss, logits, target, lse, counted, ignore_index, reduction):
    """d loss / d logits, from the logits, the forward's logsumexp and its number of counted rows."""
    _, bwd = _build_kernels()
    n_rows, n_cols = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    grad = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device)
    if n_rows:
        g_stride = grad_loss.stride(0) if reduction == "none" else 0
        bwd[(n_rows,)](logits, target.contiguous(), lse, grad_loss, g_stride, counted, grad, logits.stride(0),
                       ignore_index, N_COLS=n_cols, MEAN=reduction == "mean", **launch_config(n_cols))
    return grad


class _CrossEntropy(torch.autograd.Function):
    """So that torch.autograd, when it differentiates a compiled function through the ops
    it ran, uses the backward kernel too."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction):
        loss, lse, counted = cross_entropy_fwd(logits, target, ignore_index, reduction)
        ctx.save_for_backward(logits, target, lse, counted)
        ctx.ignore_index, ctx.reduction = ignore_index, reduction
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        logits, target, lse, counted = ctx.saved_tensors
        grad = cross_entropy_bwd(grad_loss, logits, target, lse, counted, ctx.ignore_index, ctx.reduction)
        return grad, None, None, None


def triton_cross_entropy(logits, target, ignore_index, reduction):
    return _CrossEntropy.apply(logits, target, ignore_index, reduction)


# -- metadata ---------------------------------------------------------------------------------------
def _loss_meta(logits, target, ignore_index, reduction):
    shape = (logits.shape[0],) if reduction == "none" else ()
    return TensorProxy.like(logits, shape=shape, requires_grad=False)


def _fwd_meta(logits, target, ignore_index, reduction):
    lse = TensorProxy.like(logits, shape=(logits.shape[0],), dtype=torch.float32, requires_grad=False)
    counted = TensorProxy.like(logits, shape=(), dtype=torch.float32, requires_grad=False)
    return _loss_meta(logits, target, ignore_index, reduction), lse, counted


def _bwd_meta(grad_loss, logits, target, lse, counted, ignore_index, reduction):
    return TensorProxy.like(logits, requires_grad=False)


# -- checker and lowering ------------------------------------------------------------------------
def cross_entropy_checker(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                          reduction="mean", label_smoothing=0.0):
    if not (isinstance(input, TensorProxy) and isinstance(target, TensorProxy)):
        return False
    if weight is not None or label_smoothing != 0.0 or size_average is not None or reduce is not None:
        return False
    if reduction not in ("mean", "sum", "none") or not isinstance(ignore_index, int):
        return False
    if input.dtype not in _DTYPES or target.dtype is not torch.int64 or input.ndim < 2 or input.shape[1] == 0:
        return False  # float targets are class probabilities; 1-d input is one unbatched sample
    if tuple(target.shape) != (input.shape[0], *input.shape[2:]) or target.device != input.device:
        return False
    if input.device.type == "cuda":
        return True
    return input.device.type == "cpu" and _interpreting()


def class_rows(input, target):
    """(N, C, d1, ...) logits as (N*d1*..., C) rows, and targets to match."""
    if input.ndim > 2:
        input = clang.permute(input, (0, *range(2, input.ndim), 1))
    return clang.reshape(input, (-1, input.shape[-1])), clang.reshape(target, (-1,))


class TritonCrossEntropyExecutor(OperatorExecutor):
    """See the module docstring."""

    def __init__(self):
        version = None
        if triton_installed():
            from importlib.metadata import PackageNotFoundError
            from importlib.metadata import version as dist_version

            try:
                version = dist_version("triton")
            except PackageNotFoundError:
                pass
        super().__init__("triton_crossentropy", version)
        self.op = self.register_operator("triton_cross_entropy", meta=_loss_meta, fn=triton_cross_entropy)
        self.fwd = self.register_operator("triton_cross_entropy_fwd", meta=_fwd_meta, fn=cross_entropy_fwd)
        self.bwd = self.register_operator("triton_cross_entropy_bwd", meta=_bwd_meta, fn=cross_entropy_bwd)
        self.register_lowering(tnn.cross_entropy, checker=cross_entropy_checker, lower=self.lower,
                               vjp=(self.vjp_fwd, self.vjp_bwd))

    def availability(self) -> tuple[bool, str]:
        if not triton_installed():
            return False, "triton is not installed"
        if not torch.cuda.is_available() and not _interpreting():
            return False, ("no CUDA device, and TRITON_INTERPRET=1 is not set (Triton's interpreter runs the kernels "
                           "on CPU, slowly)")
        return True, ""

    def lower(self, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
              label_smoothing=0.0):
        rows, targets = class_rows(input, target)
        loss = self.op(rows, targets, ignore_index, reduction)
        return clang.reshape(loss, tuple(target.shape)) if reduction == "none" else loss

    # custom_vjp's conventions: fwd(*args, **kwargs) -> (out, residuals); bwd(residuals, g) -> one
    # cotangent per positional argument the symbol was called with (so fwd records how many)
    def vjp_fwd(self, *args, **kwargs):
        a = inspect.signature(cross_entropy_checker).bind(*args, **kwargs).arguments
        input, target = a["input"], a["target"]
        ignore_index, reduction = a.get("ignore_index", -100), a.get("reduction", "mean")
        rows, targets = class_rows(input, target)
        loss, lse, counted = self.fwd(rows, targets, ignore_index, reduction)
        out = clang.reshape(loss, tuple(target.shape)) if reduction == "none" else loss
        # the logits' shape, not the logits: for (N, C, d...) input the residual rows are the copy the kernel read
        return out, (tuple(input.shape), rows, targets, lse, counted, ignore_index, reduction, len(args))

    def vjp_bwd(self, residuals, g):
        input_shape, rows, targets, lse, counted, ignore_index, reduction, n_positional = residuals
        grad = self.bwd(clang.reshape(g, (-1,)) if reduction == "none" else g, rows, targets, lse, counted,
                        ignore_index, reduction)
        return per_positional(unrows(grad, input_shape), n_positional)


def unrows(grad, shape):
    """Row gradients (N*d1*..., C) back in the logits' layout (N, C, d1, ...)."""
    if len(shape) == 2:
        return grad
    moved = (shape[0], *shape[2:], shape[1])
    return clang.permute(clang.reshape(grad, moved), (0, len(shape) - 1, *range(1, len(shape) - 1)))


def per_positional(grad_input, n_positional: int) -> tuple:
    """cross_entropy's cotangents: the logits' gradient, None for every other positional argument."""
    return ((grad_input,) + (None,) * n_positional)[:n_positional]


triton_crossentropy_ex = TritonCrossEntropyExecutor()
