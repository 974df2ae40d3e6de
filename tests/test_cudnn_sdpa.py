"""The "cudnn_sdpa" executor (executors/cudnn_sdpa.py): cuDNN's fused attention through torch's
aten ops. Without a GPU its checker is tested on CUDA proxies (metadata only), and its wiring
(lowering, forward/backward split, residuals, gradients) on CPU with a stand-in for the two
cuDNN ops written in torch (thunderfn/testing/cudnn_standin.py). On a GPU,
benchmarks/gpu_check.py runs the real kernels."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.core.proxies import TensorProxy
from thunderfn.executors import cudnn_sdpa
from thunderfn.testing import cudnn_standin


def _cuda(*shape, dtype=torch.bfloat16):
    return TensorProxy(f"t{next(_names)}", shape=shape, dtype=dtype, device="cuda:0")


_names = itertools.count()


@pytest.mark.parametrize("case, claimed", [
    ({}, True),
    ({"is_causal": True}, True),
    ({"dtype": torch.float32}, False),  # cuDNN attention is fp16/bf16
    ({"head_dim": 12}, False),  # not a multiple of 8
    ({"head_dim": 256}, False),  # over 128
    ({"attn_mask": True}, False),  # an explicit mask: another executor
    ({"dropout_p": 0.1}, False),  # cuDNN's draws would not be eager's
    ({"kv_heads": 2}, False),  # grouped-query heads
    ({"device": "cpu"}, False),
])
def test_checker_takes_what_cudnn_attention_takes(case, claimed):
    dtype, e, kv_heads = case.get("dtype", torch.bfloat16), case.get("head_dim", 64), case.get("kv_heads", 4)
    q = _cuda(2, 4, 16, e, dtype=dtype)
    k = v = _cuda(2, kv_heads, 16, e, dtype=dtype)
    if case.get("device") == "cpu":
        q = k = v = TensorProxy("cpu_q", shape=(2, 4, 16, e), dtype=dtype, device="cpu")
    mask = _cuda(16, 16) if case.get("attn_mask") else None
    assert cudnn_sdpa.cudnn_sdpa_checker(q, k, v, mask, case.get("dropout_p", 0.0), case.get("is_causal", False)) \
        is claimed


def test_available_says_why_not_without_a_gpu():
    ok, why = tf.executors.get_executor("cudnn_sdpa").availability()
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: benchmarks/gpu_check.py runs the real kernels")
    assert not ok and why.startswith("no CUDA device")
    assert tf.executors.available()["cudnn_sdpa"].startswith("unavailable: no CUDA device")


@pytest.fixture
def standin(monkeypatch):
    """The executor wired to the stand-in kernels, on CPU."""
    monkeypatch.setattr(cudnn_sdpa, "kernels", cudnn_standin)
    monkeypatch.setattr(cudnn_sdpa, "DEVICE", "cpu")
    monkeypatch.setattr(type(cudnn_sdpa.cudnn_sdpa_ex), "availability", lambda self: (True, ""))
    return cudnn_sdpa.cudnn_sdpa_ex


@pytest.mark.parametrize("is_causal", [False, True])
def test_forward_and_backward_run_the_two_kernels_and_save_out_and_softmax_statistics(standin, is_causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 32, generator=g).to(torch.bfloat16) for _ in range(3))
    attention = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)  # noqa: E731
    jitted = tf.jit(attention, executors=[standin])
    torch.testing.assert_close(jitted(q, k, v), attention(q, k, v), atol=2e-2, rtol=2e-2)
    assert "cudnn_sdpa(" in str(tf.last_traces(jitted)[-1])

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = jitted(*leaves)
    forward, backward = str(tf.last_traces(jitted)[-1]), str(tf.last_backward_traces(jitted)[-1])
    assert "cudnn_sdpa_fwd(" in forward and "cudnn_sdpa_bwd(" in backward
    assert '"cpu f32[2, 4, 16, 1]"' in forward  # the softmax statistics are saved, no 16 x 16 matrix
    assert "16, 16]" not in backward
    got = torch.autograd.grad(out.float().square().sum(), leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(attention(*ref_leaves).float().square().sum(), ref_leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)
