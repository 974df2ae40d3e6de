"""The built-in kernel executors (sdpa, triton_crossentropy, apex_crossentropy): each says
whether it can run here and why not; where it claims a symbol the execution trace calls
its operator and the result matches torch; what its kernels cannot take falls back; when
thunderfn differentiates a claimed symbol, the executor's vjp puts its forward kernel in
the forward trace and its backward kernel in the backward trace, with torch's gradients.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.executors import register_executor
from thunderfn.executors.apex_crossentropy import ApexCrossEntropyExecutor, apex_crossentropy_ex
from thunderfn.executors.sdpa import sdpa_ex
from thunderfn.executors.triton_crossentropy import launch_config, triton_crossentropy_ex

for _ex in (sdpa_ex, triton_crossentropy_ex, apex_crossentropy_ex):
    register_executor(_ex, replace=True)  # until executors/__init__.py registers them itself

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_APEX = importlib.util.find_spec("apex") is not None


def execution(jitted) -> str:
    return str(tf.last_traces(jitted)[-1])


def backward_of(jitted, args, *, forward_op, backward_op, n_diff=None):
    """Gradients of jitted(*args).sum() through torch.autograd, checking that the forward trace
    runs forward_op and the backward trace backward_op."""
    n_diff = len(args) if n_diff is None else n_diff
    leaves = [a.detach().clone().requires_grad_(i < n_diff) for i, a in enumerate(args)]
    grads = torch.autograd.grad(jitted(*leaves).sum(), leaves[:n_diff])
    assert forward_op in execution(jitted), execution(jitted)
    assert backward_op in str(tf.last_backward_traces(jitted)[-1])
    return grads


def torch_grads(fn, args, n_diff=None):
    n_diff = len(args) if n_diff is None else n_diff
    leaves = [a.detach().clone().requires_grad_(i < n_diff) for i, a in enumerate(args)]
    return torch.autograd.grad(fn(*leaves).sum(), leaves[:n_diff])


# -- tf.executors.available() ----------------------------------------------------------------------
def test_available_lists_every_kernel_executor_with_a_reason_when_it_cannot_run():
    listed = tf.executors.available()
    for name in ("sdpa", "triton_crossentropy", "apex_crossentropy"):
        assert listed[name] == "available" or listed[name].startswith("unavailable: "), listed[name]
    assert listed["sdpa"] == "available"  # the aten flash ops exist in every torch we support
    if not HAS_APEX:
        assert listed["apex_crossentropy"].startswith("unavailable: apex is not installed")


def test_requesting_an_unavailable_executor_says_which_and_why():
    ok, why = apex_crossentropy_ex.availability()
    if ok:
        pytest.skip("apex can run on this machine, so there is no unavailable executor to request")
    with pytest.raises(RuntimeError, match=f"executor 'apex_crossentropy' cannot run here: {why[:20]}"):
        tf.jit(lambda x, t: F.cross_entropy(x, t), executors=["apex_crossentropy"])(torch.randn(2, 3),
                                                                                  torch.tensor([0, 1]))


# -- sdpa ---------------------------------------------------------------------------------------------
def qkv(b=2, h=3, L=5, S=6, E=4, dtype=torch.float32, hk=None, ev=None):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, L, E, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(b, hk or h, S, E, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(b, hk or h, S, ev or E, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def bool_mask(seed, L=5, S=6):
    return torch.rand(L, S, generator=torch.Generator().manual_seed(seed)) > 0.4


SDPA_CLAIMED = {
    "plain": (qkv(), {}),
    "causal": (qkv(L=7), {"is_causal": True}),
    "scale": (qkv(), {"scale": 0.3}),
    "bool_mask_2d": (qkv(), {"attn_mask": bool_mask(seed=1)}),
    "float_mask_4d_broadcast": (qkv(), {"attn_mask": torch.randn(1, 3, 1, 6)}),
    "fully_masked_row": (qkv(), {"attn_mask": torch.arange(5)[:, None] != torch.full((5, 6), 2)}),
    "gqa": (qkv(h=4, hk=2), {"enable_gqa": True}),
    "float64": (qkv(dtype=torch.float64), {"is_causal": True}),
    "bfloat16": (qkv(dtype=torch.bfloat16), {"attn_mask": torch.randn(5, 6)}),
    "float16": (qkv(dtype=torch.float16), {"is_causal": True}),
    "mask_and_causal": (qkv(), {"attn_mask": torch.randn(5, 6), "is_causal": True}),  # torch's CPU flash takes both
    "bool_mask_and_causal": (qkv(L=7, S=7), {"attn_mask": bool_mask(seed=3, L=7, S=7), "is_causal": True}),
}


@pytest.mark.parametrize("case", SDPA_CLAIMED)
def test_sdpa_claims_attention_the_cpu_flash_kernel_takes_and_matches_torch(case):
    (q, k, v), kwargs = SDPA_CLAIMED[case]
    jitted = tf.jit(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), executors=["sdpa"])
    out = jitted(q, k, v)
    assert "sdpa_flash_cpu(" in execution(jitted)
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    tol = 2e-2 if q.dtype in (torch.bfloat16, torch.float16) else 1e-6
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


SDPA_REFUSED = {
    "3d_inputs": (tuple(t[0] for t in qkv()), {}),
    "dropout": (qkv(), {"dropout_p": 0.5}),
    "key_value_broadcast_over_batch": ((qkv()[0], qkv(b=1)[1], qkv(b=1)[2]), {}),
    "value_head_dim_differs": (qkv(ev=7), {}),
    "3d_mask": (qkv(), {"attn_mask": torch.randn(3, 5, 6)}),
    "heads_differ_without_enable_gqa": (qkv(h=4, hk=2), {}),
    "empty_sequence": (qkv(S=0), {}),
    "integer_mask": (qkv(), {"attn_mask": torch.ones(5, 6, dtype=torch.int64)}),
}


@pytest.mark.parametrize("case", SDPA_REFUSED)
def test_sdpa_leaves_what_the_fused_kernel_cannot_take_to_the_fallback(case):
    (q, k, v), kwargs = SDPA_REFUSED[case]

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    jitted = tf.jit(attention, executors=["sdpa"])
    try:
        out = jitted(q, k, v)
    except Exception as e:  # torch rejects some of these itself: so must thunderfn, with torch's builtin
        builtin = next(c for c in type(e).__mro__ if c.__module__ == "builtins")
        with pytest.raises(builtin):
            attention(q, k, v)
        return
    assert "sdpa_flash_cpu" not in execution(jitted)
    if not kwargs.get("dropout_p"):
        torch.testing.assert_close(out, attention(q, k, v))


def test_sdpa_mask_that_requires_grad_falls_back():
    q, k, v = qkv()
    mask = torch.randn(5, 6, requires_grad=True)
    with torch.no_grad():  # the checker looks at requires_grad on the proxy, not at grad mode
        jitted = tf.jit(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), executors=["sdpa"])
        jitted(q, k, v, mask)
    assert "sdpa_flash_cpu" not in execution(jitted)


SDPA_VJP = {  # (q, k, v) requiring grad, kwargs
    "plain": (qkv(dtype=torch.float64), {}),
    "causal_scaled": (qkv(L=7, dtype=torch.float64), {"is_causal": True, "scale": 0.4}),
    "masked": (qkv(dtype=torch.float64), {"attn_mask": torch.randn(2, 1, 5, 6, dtype=torch.float64)}),
    "bool_mask": (qkv(dtype=torch.float64), {"attn_mask": bool_mask(seed=2)}),
    "gqa": (qkv(h=4, hk=2, dtype=torch.float64), {"enable_gqa": True}),
    "fully_masked_row": (qkv(dtype=torch.float64), {"attn_mask": torch.arange(5)[:, None] != torch.full((5, 6), 2)}),
}


@pytest.mark.parametrize("case", SDPA_VJP)
def test_sdpa_backward_runs_the_fused_backward_kernel_and_gives_torchs_gradients(case):
    (q, k, v), kwargs = SDPA_VJP[case]

    def loss(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, **kwargs) ** 2).sum()

    got = backward_of(tf.jit(loss, executors=["sdpa"]), (q, k, v), forward_op="sdpa_flash_cpu_fwd(",
                      backward_op="sdpa_flash_cpu_bwd(")
    torch.testing.assert_close(got, torch_grads(loss, (q, k, v)))


def test_sdpa_grad_transform_runs_the_fused_kernels():
    q, k, v = qkv(dtype=torch.float64)
    loss = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()  # noqa: E731
    grads = tf.jit(tf.grad(loss, argnums=(0, 1, 2)), executors=["sdpa"])
    torch.testing.assert_close(grads(q, k, v), torch_grads(loss, (q, k, v)))
    assert "sdpa_flash_cpu_fwd(" in execution(grads) and "sdpa_flash_cpu_bwd(" in execution(grads)


@pytest.mark.parametrize("mask", [None, torch.randn(5, 6)], ids=["no_mask", "float_mask"])
def test_sdpa_backward_saves_out_and_logsumexp_not_the_attention_matrix(mask):
    q, k, v = qkv(L=5, S=6)
    jitted = tf.jit(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask).sum(), executors=["sdpa"])
    backward_of(jitted, (q, k, v), forward_op="sdpa_flash_cpu_fwd(", backward_op="sdpa_flash_cpu_bwd(")
    traces = (tf.last_traces(jitted)[-1], tf.last_backward_traces(jitted)[-1])
    shapes = {tuple(o.shape) for trc in traces for b in trc.bound_symbols for o in b.proxy_outs()}
    assert not any(s[-2:] == (5, 6) and len(s) == 4 for s in shapes), shapes  # out (.., L, E), logsumexp (.., L)


@pytest.mark.parametrize("hk, mask_shape", [(2, (5, 6)), (1, (2, 1, 5, 6)), (2, (1, 6))])
def test_sdpa_gives_the_gradient_of_a_float_mask_which_no_kernel_returns(hk, mask_shape):
    q, k, v = qkv(h=2, hk=hk, dtype=torch.float64)
    mask = torch.randn(mask_shape, dtype=torch.float64)
    mask[..., 0, 1] = -float("inf")

    def loss(q, k, v, m):
        return (F.scaled_dot_product_attention(q, k, v, m, enable_gqa=hk != 2) ** 2).sum()

    grads = tf.jit(tf.grad(loss, argnums=(0, 1, 2, 3)), executors=["sdpa"])
    got = grads(q, k, v, mask)
    assert "sdpa_flash_cpu_bwd(" in execution(grads)
    torch.testing.assert_close(got, torch_grads(loss, (q, k, v, mask)))


# -- triton_crossentropy ----------------------------------------------------------------------------
def test_triton_crossentropy_availability_says_why_not(monkeypatch):
    import thunderfn.executors.triton_crossentropy as mod

    monkeypatch.setattr(mod, "triton_installed", lambda: False)
    assert mod.triton_crossentropy_ex.availability() == (False, "triton is not installed")
    monkeypatch.undo()
    if not HAS_TRITON or torch.cuda.is_available():
        return
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ok, why = mod.triton_crossentropy_ex.availability()
    assert not ok and why.startswith("no CUDA device, and TRITON_INTERPRET=1 is not set")


# Runs in a fresh interpreter: TRITON_INTERPRET must be set before triton builds the kernels,
# and must not leak into other tests (inductor, for one, may use triton).
TRITON_CHECKS = r'''
import torch, torch.nn.functional as F
import triton.runtime.interpreter as interpreter
import thunderfn as tf

# Triton's interpreter before 3.9 turned a runtime scalar used as an index (a loop bound) into an int with
# int() of a shape-(1,) array, which NumPy >= 2.4 refuses: the kernels must not need that, so it is
# restored here whatever the installed Triton does.
if hasattr(interpreter, "_patch_lang_tensor"):
    _patch = interpreter._patch_lang_tensor

    def _patch_as_before_3_9(tensor, scope):
        _patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    interpreter._patch_lang_tensor = _patch_as_before_3_9
from thunderfn.executors.triton_crossentropy import triton_crossentropy_ex as ex, triton_cross_entropy

def execution(j):
    return str(tf.last_traces(j)[-1])

assert ex.availability() == (True, ""), ex.availability()
g = torch.Generator().manual_seed(0)
cases = [  # (logits, targets, kwargs): tiny shapes, the interpreter runs ~1 ms per program
    (torch.randn(4, 8, generator=g), torch.tensor([1, 7, -100, 3]), {}),
    (torch.randn(4, 8, generator=g), torch.tensor([1, 7, 2, 3]), {"reduction": "sum"}),
    (torch.randn(4, 8, generator=g), torch.tensor([1, 2, 2, 0]), {"reduction": "none", "ignore_index": 2}),
    (torch.randn(2, 5, 3, generator=g), torch.tensor([[0, 4, 1], [2, -100, 3]]), {"reduction": "none"}),
    (torch.randn(2, 5, 3, generator=g), torch.tensor([[0, 4, 1], [2, 3, 3]]), {}),
    (torch.randn(3, 40, generator=g).to(torch.bfloat16), torch.tensor([0, 39, 5]), {}),
    (torch.randn(3, 40, generator=g).to(torch.float16), torch.tensor([0, 39, -100]), {"reduction": "sum"}),
    (torch.randn(2, 5000, generator=g), torch.tensor([4999, 3]), {}),  # one column block, partly masked
    (torch.randn(3, 20000, generator=g).to(torch.bfloat16), torch.tensor([19999, -100, 8192]), {}),  # 3 blocks
    (torch.randn(3, 20000, generator=g), torch.tensor([0, 16383, 5]), {"reduction": "none"}),
]
for x, t, kw in cases:
    name = f"{tuple(x.shape)} {x.dtype} {kw}"
    tol = dict(atol=2e-2, rtol=2e-2) if x.dtype in (torch.bfloat16, torch.float16) else {}
    expected = F.cross_entropy(x.float(), t, **kw).to(x.dtype)  # the kernel computes in float32
    jitted = tf.jit(lambda x, t: F.cross_entropy(x, t, **kw), executors=[ex])
    torch.testing.assert_close(jitted(x, t), expected, **tol, msg=name)
    assert "triton_cross_entropy(" in execution(jitted), name

    # differentiated by thunderfn: the forward saves the per-row logsumexp, the backward kernel runs
    jitted = tf.jit(lambda x, t: (F.cross_entropy(x, t, **kw) * 1.5).sum(), executors=[ex])
    xr = x.detach().clone().requires_grad_()
    got, = torch.autograd.grad(jitted(xr, t), xr)
    assert "triton_cross_entropy_fwd(" in execution(jitted), name
    assert "triton_cross_entropy_bwd(" in str(tf.last_backward_traces(jitted)[-1]), name
    xr = x.detach().clone().requires_grad_()
    ref, = torch.autograd.grad((F.cross_entropy(xr.float(), t, **kw) * 1.5).sum(), xr)
    torch.testing.assert_close(got, ref.to(x.dtype), **tol, msg=name)

    # the operator as torch.autograd differentiates it (the backward kernel too)
    if x.ndim == 2:
        xr = x.detach().clone().requires_grad_()
        loss = triton_cross_entropy(xr, t, kw.get("ignore_index", -100), kw.get("reduction", "mean"))
        got, = torch.autograd.grad((loss * 1.5).sum(), xr)
        torch.testing.assert_close(got, ref.to(x.dtype), **tol, msg=name)

# refused: the torch executor runs them
x, t = torch.randn(4, 8, generator=g), torch.tensor([1, 7, 0, 3])
for kw in ({"label_smoothing": 0.1}, {"weight": torch.rand(8)}):
    jitted = tf.jit(lambda x, t: F.cross_entropy(x, t, **kw), executors=[ex])
    torch.testing.assert_close(jitted(x, t), F.cross_entropy(x, t, **kw))
    assert "triton_cross_entropy" not in execution(jitted), kw
probs = torch.softmax(torch.randn(4, 8, generator=g), 1)
jitted = tf.jit(lambda x, p: F.cross_entropy(x, p), executors=[ex])
torch.testing.assert_close(jitted(x, probs), F.cross_entropy(x, probs))
assert "triton_cross_entropy" not in execution(jitted)
jitted = tf.jit(lambda x, t: F.cross_entropy(x, t), executors=[ex])
try:
    jitted(x.double(), t)
except Exception as e:
    raise AssertionError(f"float64 should fall back, got {e}")
assert "triton_cross_entropy" not in execution(jitted)

# an out-of-range class is an error, as in torch, not a read past the row
try:
    tf.jit(lambda x, t: F.cross_entropy(x, t), executors=[ex])(x, torch.tensor([1, 8, 0, 0]))
except RuntimeError as e:
    assert "Target out of bounds" in str(e), e
else:
    raise AssertionError("no error for target 8 of 8 classes")
print("all triton checks passed")
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton; on CPU it runs under "
                                           "TRITON_INTERPRET=1)")
def test_triton_crossentropy_matches_torch_values_and_gradients_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(TRITON_CHECKS)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all triton checks passed" in done.stdout


# Rows of several blocks (a 50k vocabulary is 7): odd lengths, so rows start at every misalignment, and
# targets in the first block, the full blocks and the masked tail. One kernel, a plain masked loop.
TRITON_MULTI_BLOCK_CHECKS = r'''
import torch, torch.nn.functional as F
import thunderfn.executors.triton_crossentropy as mod

g = torch.Generator().manual_seed(0)
for dtype, n_cols in ((torch.float32, 20001), (torch.bfloat16, 16389)):
    x = torch.randn(9, n_cols, generator=g).to(dtype)
    t = torch.tensor([0, 1, 7, n_cols - 1, 8192, -100, 3, n_cols - 2, 16385])
    for reduction in ("mean", "none"):
        xr = x.detach().clone().requires_grad_()
        loss = mod.triton_cross_entropy(xr, t, -100, reduction)
        got, = torch.autograd.grad((loss.float() * 1.5).sum(), xr)
        xe = x.detach().clone().requires_grad_()
        want_loss = F.cross_entropy(xe.float(), t, reduction=reduction)
        want, = torch.autograd.grad((want_loss * 1.5).sum(), xe)
        tol = dict(atol=2e-2, rtol=2e-2) if dtype is torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loss.float(), want_loss, **tol)
        torch.testing.assert_close(got.float(), want.to(dtype).float(), **tol)
print("multi-block triton checks passed")
'''


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_crossentropy_rows_of_several_blocks_match_torch_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(TRITON_MULTI_BLOCK_CHECKS)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "multi-block triton checks passed" in done.stdout


def test_triton_crossentropy_loops_over_large_rows_in_blocks_of_8192_on_16_warps():
    assert launch_config(50257) == {"BLOCK": 8192, "num_warps": 16}  # 7 steps a row, 16 values a thread
    assert launch_config(8) == {"BLOCK": 16, "num_warps": 4}
    assert launch_config(3000) == {"BLOCK": 4096, "num_warps": 8}


# -- apex_crossentropy, against a stand-in for apex.contrib.xentropy ------------------------------------
class _StandinXentropyCuda:
    """A STAND-IN for apex's `xentropy_cuda` extension, in torch, with its semantics: per-row
    losses and max_log_sum_exp (float32 when half_to_float), smoothing as apex applies it."""

    calls = 0

    @staticmethod
    def forward(logits, labels, smoothing, half_to_float):
        _StandinXentropyCuda.calls += 1
        x = logits.float()
        lse = torch.logsumexp(x, 1)
        losses = lse - (1 - smoothing) * x.gather(1, labels[:, None])[:, 0] - smoothing * x.mean(1)
        out_dtype = torch.float32 if half_to_float else logits.dtype
        return losses.to(out_dtype), lse.to(out_dtype)

    @staticmethod
    def backward(grad_loss, logits, max_log_sum_exp, labels, smoothing):
        _StandinXentropyCuda.calls += 1
        probs = torch.exp(logits.float() - max_log_sum_exp.float()[:, None])
        target = torch.full_like(probs, smoothing / logits.shape[1])
        target.scatter_add_(1, labels[:, None], torch.full_like(probs[:, :1], 1 - smoothing))
        return ((probs - target) * grad_loss.float()[:, None]).to(logits.dtype)


class _StandinSoftmaxCrossEntropyLoss(torch.autograd.Function):
    """apex.contrib.xentropy.SoftmaxCrossEntropyLoss, as apex writes it, over the stand-in extension."""

    @staticmethod
    def forward(ctx, logits, labels, smoothing=0.0, padding_idx=0, half_to_float=False):
        losses, max_log_sum_exp = _StandinXentropyCuda.forward(logits, labels, smoothing, half_to_float)
        losses.masked_fill_(labels == padding_idx, 0)
        ctx.save_for_backward(logits, max_log_sum_exp, labels)
        ctx.smoothing, ctx.padding_idx = smoothing, padding_idx
        return losses

    @staticmethod
    def backward(ctx, grad_loss):
        logits, max_log_sum_exp, labels = ctx.saved_tensors
        grad_loss = grad_loss.contiguous().masked_fill(labels == ctx.padding_idx, 0)
        return _StandinXentropyCuda.backward(grad_loss, logits, max_log_sum_exp, labels, ctx.smoothing), None, None, \
            None, None


@pytest.fixture
def apex_standin():
    module = types.ModuleType("apex_xentropy_standin")
    module.SoftmaxCrossEntropyLoss = _StandinSoftmaxCrossEntropyLoss
    module.xentropy_cuda = _StandinXentropyCuda
    return module


@pytest.fixture
def apex_ex(apex_standin):
    return ApexCrossEntropyExecutor(module=apex_standin, require_cuda=False)


CE_CASES = {
    "mean_ignore_default": (torch.randn(4, 8), torch.tensor([1, 7, -100, 3]), {}),
    "sum": (torch.randn(4, 8), torch.tensor([1, 7, 0, 3]), {"reduction": "sum"}),
    "none_ignore_a_class": (torch.randn(4, 8), torch.tensor([1, 2, 2, 0]), {"reduction": "none", "ignore_index": 2}),
    "label_smoothing": (torch.randn(4, 8), torch.tensor([1, 7, -100, 3]), {"label_smoothing": 0.2}),
    "spatial": (torch.randn(2, 5, 3), torch.tensor([[0, 4, 1], [2, -100, 3]]), {"label_smoothing": 0.1}),
    "spatial_none": (torch.randn(2, 5, 3), torch.tensor([[0, 4, 1], [2, -100, 3]]), {"reduction": "none"}),
    "float16": (torch.randn(3, 6).half(), torch.tensor([0, 5, 2]), {}),
}


@pytest.mark.parametrize("case", CE_CASES)
def test_apex_crossentropy_calls_apex_and_matches_torch(apex_ex, case):
    x, t, kw = CE_CASES[case]
    jitted = tf.jit(lambda x, t: F.cross_entropy(x, t, **kw), executors=[apex_ex])
    before = _StandinXentropyCuda.calls
    out = jitted(x, t)
    assert "apex_cross_entropy(" in execution(jitted) and _StandinXentropyCuda.calls > before
    tol = dict(atol=1e-2, rtol=1e-2) if x.dtype is torch.float16 else {}
    torch.testing.assert_close(out, F.cross_entropy(x.float(), t, **kw).to(x.dtype), **tol)


@pytest.mark.parametrize("case", CE_CASES)
def test_apex_crossentropy_backward_runs_apex_backward_and_gives_torchs_gradient(apex_ex, case):
    x, t, kw = CE_CASES[case]
    got, = backward_of(tf.jit(lambda x, t: F.cross_entropy(x, t, **kw) * 1.5, executors=[apex_ex]), (x, t),
                       forward_op="apex_xentropy_forward(", backward_op="apex_xentropy_backward(", n_diff=1)
    expected, = torch_grads(lambda x, t: F.cross_entropy(x.float(), t, **kw) * 1.5, (x, t), 1)
    tol = dict(atol=1e-2, rtol=1e-2) if x.dtype is torch.float16 else {}
    torch.testing.assert_close(got, expected.to(x.dtype), **tol)


def test_apex_crossentropy_refuses_weight_probabilities_and_bfloat16(apex_ex):
    x, t = torch.randn(4, 8), torch.tensor([1, 7, 0, 3])
    for args, kw in (((x, t), {"weight": torch.rand(8)}), ((x, torch.softmax(torch.randn(4, 8), 1)), {}),
                     ((x.bfloat16(), t), {})):
        jitted = tf.jit(lambda x, t: F.cross_entropy(x, t, **kw), executors=[apex_ex])
        torch.testing.assert_close(jitted(*args), F.cross_entropy(*args, **kw))
        assert "apex_cross_entropy" not in execution(jitted)


def test_apex_crossentropy_needs_cuda_even_when_apex_imports(apex_standin, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, so apex's no-CUDA refusal cannot happen here")
    apex, contrib = types.ModuleType("apex"), types.ModuleType("apex.contrib")
    apex.contrib, contrib.xentropy = contrib, apex_standin
    for name, module in (("apex", apex), ("apex.contrib", contrib), ("apex.contrib.xentropy", apex_standin)):
        monkeypatch.setitem(sys.modules, name, module)
    assert ApexCrossEntropyExecutor().availability() == (False, "needs CUDA (apex's xentropy kernels are CUDA-only)")
    assert ApexCrossEntropyExecutor(require_cuda=False).availability() == (True, "")


def test_apex_crossentropy_tells_apart_missing_apex_and_the_unrelated_pypi_apex(monkeypatch):
    monkeypatch.setitem(sys.modules, "apex", None)  # import apex raises ImportError
    ok, why = ApexCrossEntropyExecutor().availability()
    assert not ok and why.startswith("apex is not installed")
    monkeypatch.setitem(sys.modules, "apex", types.ModuleType("apex"))  # the PyPI web toolkit: no apex.contrib
    monkeypatch.setitem(sys.modules, "apex.contrib", None)
    ok, why = ApexCrossEntropyExecutor().availability()
    assert not ok and "has no apex.contrib.xentropy" in why


def test_gpu_check_dry_run_imports_and_traces_every_gpu_path():
    """benchmarks/gpu_check.py runs every GPU path on a CUDA machine; here (or anywhere) its dry run
    checks that each path imports and traces, and it exits 0."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_check.py")
    done = subprocess.run([sys.executable, script, "--dry-run"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for path in ("triton cross-entropy", "cudnn_sdpa vs torch cuDNN attention", "inductor fusion", "GPT block"):
        assert path in done.stdout
    assert "FAILED" not in done.stdout


def test_apex_crossentropy_claims_cross_entropy_with_symbolic_sizes(apex_ex):
    """The checker's questions on symbolic sizes (target's shape is the input's rows) become guards: one
    compiled entry for every batch size, each call running apex and matching torch."""
    jitted = tf.jit(lambda x, t: F.cross_entropy(x, t) * 1.5, dynamic=True, executors=[apex_ex])
    for n in (4, 7):
        x, t = torch.randn(n, 8), torch.randint(0, 8, (n,))
        got, = backward_of(jitted, (x, t), forward_op="apex_xentropy_forward(", backward_op="apex_xentropy_backward(",
                           n_diff=1)
        expected, = torch_grads(lambda x, t: F.cross_entropy(x, t) * 1.5, (x, t), 1)
        torch.testing.assert_close(got, expected)
    assert tf.cache_info(jitted)["misses"] == 1
