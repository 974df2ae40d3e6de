"""The apex_crossentropy executor: cross_entropy on NVIDIA Apex's fused softmax-xentropy kernels.

Written against `apex.contrib.xentropy` (apex built with `--xentropy`):
- `SoftmaxCrossEntropyLoss.apply(logits, labels, smoothing, padding_idx, half_to_float)`,
  an autograd Function returning one loss per row (rows whose label equals
  padding_idx are zeroed) for 2-d logits and 1-d int64 labels;
- the extension behind it, `xentropy_cuda.forward(logits, labels, smoothing,
  half_to_float) -> (losses, max_log_sum_exp)` and `xentropy_cuda.backward(grad_loss,
  logits, max_log_sum_exp, labels, smoothing) -> grad_logits`, which thunderfn's vjp
  calls directly so the backward keeps one float per row.
Apex's smoothing is torch's label_smoothing (lse - (1-s) x[y] - s mean(x)), so both
are claimed; the reduction, the ignore_index masking and the (N, C, d...) layout are
traced ops around the kernel. Refused: weight, probability targets, the legacy
size_average/reduce, dtypes other than float32/float16 (older apex builds have no
bfloat16 kernels).

Apex loads only where it is importable and CUDA is available; tests inject a
stand-in module through `ApexCrossEntropyExecutor(module=..., require_cuda=False)`.
"""
from __future__ import annotations

import importlib
import inspect
import sys

import torch

from thunderfn import clang, prims
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import ExecutorError
from thunderfn.executors.base import OperatorExecutor
from thunderfn.executors.triton_crossentropy import class_rows, per_positional, unrows
from thunderfn.torch import nn as tnn

_DTYPES = (torch.float32, torch.float16)
_MODULE = "apex.contrib.xentropy"


def _load_apex():
    """(apex.contrib.xentropy, None) or (None, why it cannot be used)."""
    try:
        importlib.import_module("apex")
    except ImportError:
        return None, "apex is not installed (NVIDIA Apex, built with --xentropy; not the PyPI 'apex' package)"
    try:
        module = importlib.import_module(_MODULE)
    except ImportError:
        return None, "the installed 'apex' has no apex.contrib.xentropy (is it NVIDIA Apex?)"
    if not hasattr(module, "SoftmaxCrossEntropyLoss"):  # apex's __init__ swallows the extension's ImportError
        return None, "apex was built without its xentropy extension (rebuild apex with --xentropy)"
    return module, None


def _extension(module):
    """xentropy_cuda, the extension SoftmaxCrossEntropyLoss calls (a module global of the
    file defining it, in every apex version; a stand-in may carry it directly)."""
    ext = getattr(module, "xentropy_cuda", None)
    if ext is None:
        ext = getattr(sys.modules.get(module.SoftmaxCrossEntropyLoss.__module__), "xentropy_cuda", None)
    if ext is None:
        raise ExecutorError("apex_crossentropy: cannot find apex's xentropy_cuda extension next to "
                           "SoftmaxCrossEntropyLoss")
    return ext


# -- metadata (losses and logsumexp are float32: half_to_float is always on) -------------------------
def _rows_meta(logits, *rest):
    return TensorProxy.like(logits, shape=(logits.shape[0],), dtype=torch.float32, requires_grad=False)


def _fwd_meta(logits, labels, smoothing):
    return _rows_meta(logits), _rows_meta(logits)


def _bwd_meta(grad_loss, logits, max_log_sum_exp, labels, smoothing):
    return TensorProxy.like(logits, requires_grad=False)


def cross_entropy_checker(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                          reduction="mean", label_smoothing=0.0, *, require_cuda=True):
    if not (isinstance(input, TensorProxy) and isinstance(target, TensorProxy)):
        return False
    if weight is not None or size_average is not None or reduce is not None or not 0.0 <= label_smoothing <= 1.0:
        return False
    if reduction not in ("mean", "sum", "none") or not isinstance(ignore_index, int):
        return False
    if input.dtype not in _DTYPES or target.dtype is not torch.int64 or input.ndim < 2 or input.shape[1] == 0:
        return False
    if tuple(target.shape) != (input.shape[0], *input.shape[2:]) or target.device != input.device:
        return False
    return input.device.type == "cuda" or not require_cuda


def _reduce(row_losses, valid, reduction, target, dtype):
    """Per-row float32 losses (ignored rows already zero) reduced as torch reduces them."""
    if reduction == "none":
        return clang.maybe_convert_to_dtype(clang.reshape(row_losses, tuple(target.shape)), dtype)
    total = prims.sum(row_losses, (0,))
    if reduction == "mean":  # over the rows not ignored; 0/0 = nan when all are, as torch
        total = clang.true_divide(total, prims.sum(clang.maybe_convert_to_dtype(valid, torch.float32), (0,)))
    return clang.maybe_convert_to_dtype(total, dtype)


class ApexCrossEntropyExecutor(OperatorExecutor):
    """See the module docstring. `module` replaces `apex.contrib.xentropy` (tests only);
    `require_cuda=False` lets it claim CPU tensors (only meaningful with such a module)."""

    def __init__(self, name: str = "apex_crossentropy", *, module=None, require_cuda: bool = True):
        super().__init__(name, None)
        self._module, self._why = (module, None) if module is not None else (None, None)
        self.require_cuda = require_cuda
        self.op = self.register_operator("apex_cross_entropy", meta=_rows_meta, fn=self._run_loss)
        self.fwd = self.register_operator("apex_xentropy_forward", meta=_fwd_meta, fn=self._run_forward)
        self.bwd = self.register_operator("apex_xentropy_backward", meta=_bwd_meta, fn=self._run_backward)
        self.register_lowering(tnn.cross_entropy, checker=self.checker, lower=self.lower,
                               vjp=(self.vjp_fwd, self.vjp_bwd))

    # -- apex, loaded on first need ------------------------------------------------------------
    @property
    def module(self):
        if self._module is None and self._why is None:
            self._module, self._why = _load_apex()
            if self._module is not None:
                self.version = getattr(_extension(self._module), "__version__", None) or None
        return self._module

    def availability(self) -> tuple[bool, str]:
        if self.module is None:
            return False, self._why
        if self.require_cuda and not torch.cuda.is_available():
            return False, "needs CUDA (apex's xentropy kernels are CUDA-only)"
        return True, ""

    def _run_loss(self, logits, labels, smoothing, padding_idx):
        # apex zeroes rows whose label is padding_idx; the lowering passes labels that never
        # equal it (ignored rows get class 0) and masks those rows itself, so any ignore_index works
        return self.module.SoftmaxCrossEntropyLoss.apply(logits.contiguous(), labels.contiguous(), smoothing,
                                                         padding_idx, True)

    def _run_forward(self, logits, labels, smoothing):
        losses, max_log_sum_exp = _extension(self.module).forward(logits.contiguous(), labels.contiguous(),
                                                                  smoothing, True)
        return losses.float(), max_log_sum_exp.float()

    def _run_backward(self, grad_loss, logits, max_log_sum_exp, labels, smoothing):
        return _extension(self.module).backward(grad_loss.float().contiguous(), logits.contiguous(),
                                                max_log_sum_exp, labels.contiguous(), smoothing)

    # -- checker, lowering, vjp -------------------------------------------------------------------
    def checker(self, *args, **kwargs):
        return cross_entropy_checker(*args, **kwargs, require_cuda=self.require_cuda)

    @staticmethod
    def _rows(input, target, ignore_index):
        rows, targets = class_rows(input, target)
        valid = clang.ne(targets, ignore_index)
        return rows, clang.where(valid, targets, 0), valid

    def lower(self, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
              label_smoothing=0.0):
        rows, labels, valid = self._rows(input, target, ignore_index)
        # padding_idx=-1 never matches the labels passed (all in [0, C)): ignored rows are masked here
        losses = clang.where(valid, self.op(rows, labels, float(label_smoothing), -1), 0.0)
        return _reduce(losses, valid, reduction, target, input.dtype)

    # custom_vjp's conventions: fwd(*args, **kwargs) -> (out, residuals); bwd(residuals, g) -> one
    # cotangent per positional argument the symbol was called with (so fwd records how many)
    def vjp_fwd(self, *args, **kwargs):
        a = inspect.signature(self.lower).bind(*args, **kwargs).arguments
        input, target = a["input"], a["target"]
        ignore_index, reduction = a.get("ignore_index", -100), a.get("reduction", "mean")
        smoothing = float(a.get("label_smoothing", 0.0))
        rows, labels, valid = self._rows(input, target, ignore_index)
        losses, max_log_sum_exp = self.fwd(rows, labels, smoothing)
        out = _reduce(clang.where(valid, losses, 0.0), valid, reduction, target, input.dtype)
        return out, (tuple(input.shape), rows, labels, valid, max_log_sum_exp, smoothing, reduction, len(args))

    def vjp_bwd(self, residuals, g):
        input_shape, rows, labels, valid, max_log_sum_exp, smoothing, reduction, n_positional = residuals
        g = clang.maybe_convert_to_dtype(g, torch.float32)
        if reduction == "none":
            per_row = clang.reshape(g, (-1,))
        else:
            if reduction == "mean":
                g = clang.true_divide(g, prims.sum(clang.maybe_convert_to_dtype(valid, torch.float32), (0,)))
            per_row = clang.expand_to(g, (rows.shape[0],))
        grad = self.bwd(clang.where(valid, per_row, 0.0), rows, max_log_sum_exp, labels, smoothing)
        return per_positional(unrows(grad, input_shape), n_positional)


apex_crossentropy_ex = ApexCrossEntropyExecutor()
