"""The "transformer_engine" executor (executors/transformer_engine.py): linear on TE's FP8 GEMMs.
TransformerEngine cannot be installed here and needs an FP8 GPU: the checker is tested on CUDA
proxies (metadata only), and the wiring on CPU with a stand-in for TE's API written in torch
(thunderfn/testing/transformer_engine_standin.py), which records what the executor did."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.core.proxies import TensorProxy
from thunderfn.executors import transformer_engine as te_executor
from thunderfn.testing import transformer_engine_standin as standin_te

_names = itertools.count()


def _proxy(*shape, dtype=torch.bfloat16, device="cuda:0"):
    return TensorProxy(f"t{next(_names)}", shape=shape, dtype=dtype, device=device)


@pytest.mark.parametrize("rows, in_features, out_features, dtype, bias, claimed", [
    ((32,), 64, 128, torch.bfloat16, True, True),
    ((2, 16), 64, 48, torch.float16, False, True),
    ((32,), 64, 128, torch.float32, True, True),
    ((30,), 64, 128, torch.bfloat16, True, False),  # rows not a multiple of 16
    ((32,), 60, 128, torch.bfloat16, True, False),  # in_features
    ((32,), 64, 100, torch.bfloat16, True, False),  # out_features
    ((32,), 64, 128, torch.float64, True, False),
])
def test_checker_takes_what_te_fp8_gemms_take(rows, in_features, out_features, dtype, bias, claimed):
    x = _proxy(*rows, in_features, dtype=dtype)
    w = _proxy(out_features, in_features, dtype=dtype)
    b = _proxy(out_features, dtype=dtype) if bias else None
    assert te_executor.te_linear_checker(x, w, b) is claimed


def test_checker_refuses_cpu_tensors():
    x, w = _proxy(32, 64, device="cpu"), _proxy(64, 64, device="cpu")
    assert not te_executor.te_linear_checker(x, w)


def test_available_says_why_not():
    ok, why = tf.executors.get_executor("transformer_engine").availability()
    assert not ok and ("transformer_engine is not installed" in why or "no CUDA device" in why or "FP8" in why)


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setattr(te_executor, "library", standin_te.library)
    monkeypatch.setattr(te_executor, "DEVICE", "cpu")
    ex = te_executor.transformer_engine_ex
    monkeypatch.setattr(type(ex), "availability", lambda self: (True, ""))
    monkeypatch.setattr(ex, "layers", {})
    monkeypatch.setattr(ex, "recipe", None)
    standin_te.calls.clear()
    return ex


def test_linears_run_as_te_modules_under_fp8_autocast_sharing_the_weights(standin):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16),
                                torch.nn.Linear(16, 8))  # the last: out_features 8, not claimed
    jitted = tf.jit(model, executors=[standin])
    x = torch.randn(2, 16, 32)
    torch.testing.assert_close(jitted(x), model(x))
    execution = str(tf.last_traces(jitted)[-1])
    assert execution.count("te_linear(") == 2 and "torch.nn.functional.linear(" in execution
    assert len(standin.layers) == 2 and all(recipe is standin.recipe for _, recipe in standin_te.calls)
    # the TE modules read the model's own weights: an optimizer step is seen on the next call
    with torch.no_grad():
        model[0].weight.mul_(2)
    torch.testing.assert_close(jitted(x), model(x))
    assert len(standin.layers) == 2  # the same modules (one per weight), called again


def test_gradients_flow_through_te_linear_as_through_linear(standin):
    torch.manual_seed(0)
    w, b = torch.randn(16, 32, requires_grad=True), torch.randn(16, requires_grad=True)
    x = torch.randn(16, 32, requires_grad=True)
    loss = tf.jit(lambda x, w, b: F.linear(x, w, b).square().sum(), executors=[standin])
    got = torch.autograd.grad(loss(x, w, b), (x, w, b))
    want = torch.autograd.grad(F.linear(x, w, b).square().sum(), (x, w, b))
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


def test_te_linear_claims_linears_with_symbolic_rows(standin):
    """The checker asks whether the rows are a multiple of 16 (TE's FP8 GEMMs need it): with symbolic rows
    that is a guard, so calls of 16 and 32 rows share one compiled entry running te_linear."""
    torch.manual_seed(0)
    w, b = torch.randn(16, 32), torch.randn(16)
    jitted = tf.jit(lambda x: F.linear(x, w, b), dynamic=True, executors=[standin])
    for rows in (16, 32):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(jitted(x), F.linear(x, w, b))
    assert tf.cache_info(jitted)["misses"] == 1
    assert "te_linear(" in str(tf.last_traces(jitted)[-1])
