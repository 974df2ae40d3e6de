"""The "transformer_engine" executor: `linear` on NVIDIA TransformerEngine's FP8 GEMMs.

Where `transformer_engine` imports and the GPU supports FP8 (compute capability 8.9 or
newer: Ada, Hopper, Blackwell), this executor claims `ltorch.linear` and runs it as
`te_linear`: a `transformer_engine.pytorch.Linear` that shares the call's weight and bias
(no copy), called under `te.fp8_autocast` with a delayed-scaling recipe (HYBRID: E4M3 in
the forward). The execution trace shows `te_linear(...)` in place of the linear. Each
weight (by its storage) gets one TE module, so its FP8 scaling history (amax) follows
that weight from call to call, as in a model built from `te.Linear` modules.

Limits, from TE's FP8 GEMMs:
- CUDA tensors of float32, float16 or bfloat16;
- in_features and out_features multiples of 16, and the number of rows (the product of
  the input's leading dims) a multiple of 16; anything else goes to the next executor;
- the backward is thunderfn's: `te_linear` is differentiated as the linear it computes
  (`like=`), so gradients are torch matmuls in the input's dtype, not FP8 ones. FP8 is a
  forward-speed (and activation-memory) trade here.

`recipe` may be replaced (`transformer_engine_ex.recipe = DelayedScaling(...)`). TE is
imported on first use through `library()`, which tests replace with a stand-in
implementing the same names in torch (thunderfn/testing/transformer_engine_standin.py).
"""
from __future__ import annotations

import importlib
import importlib.util

import torch

import thunderfn.torch as ltorch
from thunderfn.core import symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.executors.base import OperatorExecutor

DEVICE = "cuda"  # the device the checker takes (tests of the wiring with the stand-in set "cpu")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ALIGNMENT = 16


def library():
    """(transformer_engine.pytorch, transformer_engine.common.recipe), imported on first use."""
    return (importlib.import_module("transformer_engine.pytorch"),
            importlib.import_module("transformer_engine.common.recipe"))


class TransformerEngineExecutor(OperatorExecutor):
    """See the module docstring."""

    def __init__(self):
        super().__init__("transformer_engine")
        self.recipe = None  # made from the library on first use (a DelayedScaling, HYBRID format)
        self.layers: dict = {}  # (weight storage, shapes, dtype) -> the te.Linear sharing that weight
        self.linear = self.register_operator("te_linear", like=ltorch.linear, fn=self.te_linear)
        self.register_lowering(ltorch.linear, checker=te_linear_checker, lower=self.linear)

    def availability(self) -> tuple[bool, str]:
        if importlib.util.find_spec("transformer_engine") is None:
            return False, ("transformer_engine is not installed (pip install transformer_engine[pytorch]; it needs "
                           "CUDA and an NVIDIA GPU)")
        if not torch.cuda.is_available():
            return False, "no CUDA device: TransformerEngine's FP8 GEMMs run on NVIDIA GPUs"
        te, _ = library()
        supported, why = te.fp8.check_fp8_support()
        if not supported:
            return False, f"this GPU has no FP8 support ({why}); FP8 needs compute capability 8.9 or newer"
        return True, ""

    def te_linear(self, input, weight, bias=None):
        te, recipe = library()
        if self.recipe is None:
            self.recipe = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID)
        key = (weight.untyped_storage().data_ptr(), tuple(weight.shape), weight.dtype, bias is not None)
        layer = self.layers.get(key)
        if layer is None:
            layer = self.layers[key] = te.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                                                 params_dtype=weight.dtype, device=weight.device)
        with torch.no_grad():  # the call's own tensors, shared: TE reads them where they are
            layer.weight.data = weight
            if bias is not None:
                layer.bias.data = bias
        with te.fp8_autocast(enabled=True, fp8_recipe=self.recipe):
            return layer(input)


def te_linear_checker(input, weight, bias=None) -> bool:
    if not (isinstance(input, TensorProxy) and isinstance(weight, TensorProxy)) or input.ndim < 2 or weight.ndim != 2:
        return False
    tensors = (input, weight) if bias is None else (input, weight, bias)
    if any(not isinstance(t, TensorProxy) or t.device.type != DEVICE or t.dtype is not input.dtype for t in tensors):
        return False
    rows = symbolic.product(input.shape[:-1])
    return (input.dtype in _DTYPES and weight.shape[1] == input.shape[-1]
            and all(n % ALIGNMENT == 0 and n > 0 for n in (weight.shape[0], weight.shape[1], rows)))


transformer_engine_ex = TransformerEngineExecutor()
