"""Checks every fusion executor's tests make (tests/test_fusion.py for Inductor and the stand-in,
tests/test_nvfuser.py for nvFuser's stand-in frontend)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

from thunderfn.executors import inductor

INDUCTOR_OK, INDUCTOR_WHY = inductor.inductor_ex.availability()
# Tests that compile real Inductor kernels: skipped where Inductor cannot compile (no C++ compiler, ...)
needs_inductor = pytest.mark.skipif(
    not INDUCTOR_OK, reason=f"Inductor cannot compile on this machine ({INDUCTOR_WHY}); these tests run its kernels")


def assert_training_step_matches_eager(model: torch.nn.Module, jitted, x, y) -> None:
    """One mse-loss step of `jitted` (tf.jit of `model`, run first) gives the loss and parameter
    gradients of an eager step of a copy of model taken before it."""
    reference = copy.deepcopy(model)
    loss = torch.nn.functional.mse_loss(jitted(x), y)
    loss.backward()
    expected = torch.nn.functional.mse_loss(reference(x), y)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def assert_falls_back_once(jitted, fn, x, warning: str) -> None:
    """jitted(x) (a jitted fn whose region the compiler refuses) warns `warning` (a regex) once and
    gives fn(x): the region's ops ran unfused; a second call runs them unfused without warning."""
    with pytest.warns(UserWarning, match=warning):
        torch.testing.assert_close(jitted(x), fn(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per region and layout
        torch.testing.assert_close(jitted(x), fn(x))
