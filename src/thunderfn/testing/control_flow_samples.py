"""Samples of the control-flow primitives, as OpInfo samples are of torch's ops: for each, a function that
uses the primitive, the plain Python it stands for (an `if`, a `for` or `while` loop, the function itself),
and float64 arguments. tests/test_control_flow_samples.py runs every transform on each against torch's
eager reference of the plain function, and checks that every control-flow primitive with a rule has one.

    >>> from thunderfn.testing.control_flow_samples import SAMPLES
    >>> sorted({s.primitive for s in SAMPLES})[:2]
    ['control_flow.checkpoint', 'control_flow.checkpoint_name']
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from thunderfn.blocks import nested_compile_region
from thunderfn.torch import checkpoint_policies
from thunderfn.torch.checkpoint import checkpoint, checkpoint_name
from thunderfn.torch.control_flow import cond, fori_loop, scan, while_loop


@dataclasses.dataclass(frozen=True)
class ControlFlowSample:
    """`fn` uses `primitive` (its symbol id); `reference` is the same computation in plain Python; `args`
    are float64 tensors. `reverse`: whether reverse mode goes through it (not a while_loop, as in JAX)."""
    name: str
    primitive: str
    fn: Callable
    reference: Callable
    args: tuple
    reverse: bool = True


def _tensor(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _branches(x, w):
    return cond(x.sum() > 0, lambda x, w: torch.sin(x @ w), lambda x, w: torch.tanh(x) * w.sum(), x, w)


def _python_if(pred, true_fn, false_fn, *operands):
    return true_fn(*operands) if pred else false_fn(*operands)


def _cell(h, x, w):
    h = torch.tanh(h @ w + x)
    return h, h.sum(-1)


def _scanned(h, xs, w):
    return scan(lambda h, x: _cell(h, x, w), h, xs)


def _looped(h, xs, w):
    ys = []
    for x in xs:
        h, y = _cell(h, x, w)
        ys.append(y)
    return h, torch.stack(ys)


def _halved(x):
    return while_loop(lambda x: x.abs().sum() > 1, lambda x: x * 0.5, x)


def _halved_in_python(x):
    while x.abs().sum() > 1:
        x = x * 0.5
    return x


def _counted(x, w):
    return fori_loop(0, 3, lambda i, x: torch.sin(x @ w) + i, x)


def _counted_in_python(x, w):
    for i in range(3):
        x = torch.sin(x @ w) + i
    return x


def _layer(x, w):
    h = checkpoint_name(torch.sin(x @ w), "hidden")
    return torch.tanh(h @ w)


def _checkpointed(policy):
    return lambda x, w: checkpoint(_layer, policy=policy)(x, w)


def _named(x, w):
    return checkpoint_name(torch.sin(x @ w), "hidden") * w.sum()


_shared_layer = nested_compile_region(_layer)


def _stacked(x, w):
    return _shared_layer(_shared_layer(x, w), w * 0.5)


SAMPLES = (
    ControlFlowSample("cond-true", "control_flow.cond", lambda x, w: _branches(x, w),
                      lambda x, w: _python_if(x.sum() > 0, lambda x, w: torch.sin(x @ w),
                                              lambda x, w: torch.tanh(x) * w.sum(), x, w),
                      (_tensor(3, 3).abs(), _tensor(3, 3, seed=1))),
    ControlFlowSample("cond-false", "control_flow.cond", lambda x, w: _branches(x, w),
                      lambda x, w: _python_if(x.sum() > 0, lambda x, w: torch.sin(x @ w),
                                              lambda x, w: torch.tanh(x) * w.sum(), x, w),
                      (-_tensor(3, 3).abs(), _tensor(3, 3, seed=1))),
    ControlFlowSample("scan", "control_flow.scan", _scanned, _looped,
                      (_tensor(2, 3), _tensor(4, 2, 3, seed=1), _tensor(3, 3, seed=2) * 0.5)),
    ControlFlowSample("fori_loop", "control_flow.scan", _counted, _counted_in_python,
                      (_tensor(2, 3), _tensor(3, 3, seed=1) * 0.5)),
    ControlFlowSample("while_loop", "control_flow.while_loop", _halved, _halved_in_python, (_tensor(4) * 3,),
                      reverse=False),
    ControlFlowSample("checkpoint-nothing_saveable", "control_flow.checkpoint",
                      _checkpointed(checkpoint_policies.nothing_saveable), _layer,
                      (_tensor(2, 3), _tensor(3, 3, seed=1))),
    ControlFlowSample("checkpoint-save_only_these_names", "control_flow.checkpoint",
                      _checkpointed(checkpoint_policies.save_only_these_names("hidden")), _layer,
                      (_tensor(2, 3), _tensor(3, 3, seed=1))),
    ControlFlowSample("checkpoint-dots_saveable", "control_flow.checkpoint",
                      _checkpointed(checkpoint_policies.dots_saveable), _layer,
                      (_tensor(2, 3), _tensor(3, 3, seed=1))),
    ControlFlowSample("nested_compile_region", "control_flow.block", _stacked,
                      lambda x, w: _layer(_layer(x, w), w * 0.5), (_tensor(2, 3), _tensor(3, 3, seed=1))),
    ControlFlowSample("checkpoint_name", "control_flow.checkpoint_name", _named,
                      lambda x, w: torch.sin(x @ w) * w.sum(), (_tensor(2, 3), _tensor(3, 3, seed=1))),
)
