"""A stand-in for TransformerEngine's PyTorch API, in torch, so the "transformer_engine"
executor's wiring (claiming linears, the operator in the trace, one TE module per weight,
fp8_autocast around each call, gradients through `like=`) is tested without TE or a GPU.
It is not TransformerEngine: `Linear` is torch's linear and nothing is cast to FP8; it
records what the executor did (calls made under fp8_autocast, the recipe used)."""
from __future__ import annotations

import contextlib
import enum
import types

import torch

calls: list = []  # (layer, recipe) per call made under fp8_autocast
_active: list = []  # the recipes of the fp8_autocast blocks we are in


class Format(enum.Enum):
    E4M3 = "E4M3"
    HYBRID = "HYBRID"


class DelayedScaling:
    def __init__(self, fp8_format=Format.HYBRID, margin=0, amax_history_len=1024, amax_compute_algo="max"):
        self.fp8_format = fp8_format


@contextlib.contextmanager
def fp8_autocast(enabled=True, fp8_recipe=None):
    _active.append(fp8_recipe if enabled else None)
    try:
        yield
    finally:
        _active.pop()


class Linear(torch.nn.Linear):
    def __init__(self, in_features, out_features, bias=True, params_dtype=torch.float32, device="cuda"):
        super().__init__(in_features, out_features, bias=bias, dtype=params_dtype, device=device)

    def forward(self, input):
        calls.append((self, _active[-1] if _active else None))
        return super().forward(input)


fp8 = types.SimpleNamespace(check_fp8_support=lambda: (True, ""))
pytorch = types.SimpleNamespace(Linear=Linear, fp8_autocast=fp8_autocast, fp8=fp8)
recipe = types.SimpleNamespace(DelayedScaling=DelayedScaling, Format=Format)


def library():
    """What the executor's `library()` returns: (transformer_engine.pytorch, ...common.recipe)."""
    return pytorch, recipe
