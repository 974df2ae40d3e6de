"""The sdpa executor on CUDA (executors/sdpa.py, sdpa_choice.py, torch/sdp_state.py): when thunderfn
differentiates attention it uses the kernel pair of the backend torch would pick under the user's
`sdpa_kernel` context and `enable_*_sdp` switches, and a trace of CUDA attention retraces when those
switches change. Without a GPU: the choice on CUDA proxies (torch's CUDA gate is emulated here), the
forward/backward wiring traced on CUDA proxies, and each kernel wrapper run on meta tensors against
the installed torch's aten schemas and meta kernels. benchmarks/gpu_check.py runs the real kernels."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import thunderfn as tf
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.trace import Trace
from thunderfn.core.tracer import tracing
from thunderfn.executors import sdpa, sdpa_choice
from thunderfn.executors.sdpa import sdpa_ex
from thunderfn.torch import nn as tnn
from thunderfn.torch import sdp_state

_names = itertools.count()

emulated = pytest.mark.skipif(torch.cuda.is_available(), reason="the copied gates for a GPU of capability 9.0, "
                                                                  "what a machine without one assumes")


def _cuda(*shape, dtype=torch.bfloat16, requires_grad=True):
    return TensorProxy(f"t{next(_names)}", shape=shape, dtype=dtype, device="cuda:0", requires_grad=requires_grad)


def _qkv(L=16, S=16, E=64, dtype=torch.bfloat16, heads=4, kv_heads=4):
    return (_cuda(2, heads, L, E, dtype=dtype), _cuda(2, kv_heads, S, E, dtype=dtype),
            _cuda(2, kv_heads, S, E, dtype=dtype))


@emulated
@pytest.mark.parametrize("backends, case, kernel", [
    (None, {}, "flash"),  # torch's default priority: flash first
    (None, {"is_causal": True}, "flash"),
    (None, {"dtype": torch.float32}, "efficient"),  # flash is fp16/bf16 only
    (None, {"mask": True}, "efficient"),  # flash takes no mask
    (None, {"E": 264}, "efficient"),  # over flash's 256 head dims
    (None, {"is_causal": True, "L": 8}, "efficient"),  # flash refuses causal with L != S
    ([SDPBackend.EFFICIENT_ATTENTION], {}, "efficient"),
    ([SDPBackend.CUDNN_ATTENTION], {}, "cudnn"),
    ([SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION], {"mask": True}, "efficient"),
    ([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH], {"dtype": torch.float32}, None),  # math: torch runs it
    ([SDPBackend.MATH], {}, None),
])
def test_cuda_kernel_is_the_one_torch_would_pick_under_its_switches(backends, case, kernel):
    q, k, v = _qkv(L=case.get("L", 16), E=case.get("E", 64), dtype=case.get("dtype", torch.bfloat16))
    mask = _cuda(16, 16, dtype=q.dtype, requires_grad=False) if case.get("mask") else None
    is_causal = case.get("is_causal", False)
    with sdpa_kernel(backends) if backends else _nothing():
        assert sdpa.cuda_kernel(q, k, v, mask, is_causal) == kernel
        assert sdpa.sdpa_checker(q, k, v, mask, 0.0, is_causal) is (kernel is not None)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@emulated
def test_priority_order_set_by_sdpa_kernel_is_followed():
    q, k, v = _qkv()
    if not hasattr(torch._C, "_set_sdp_priority_order"):
        pytest.skip("this torch has no SDPA priority order")
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
        assert sdpa.cuda_kernel(q, k, v) == "cudnn"
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION], set_priority=True):
        assert sdpa.cuda_kernel(q, k, v) == "flash"


@emulated
@pytest.mark.parametrize("backends, fwd, bwd", [
    (None, "sdpa_flash_cuda_fwd", "sdpa_flash_cuda_bwd"),
    ([SDPBackend.EFFICIENT_ATTENTION], "sdpa_efficient_cuda_fwd", "sdpa_efficient_cuda_bwd"),
    ([SDPBackend.CUDNN_ATTENTION], "sdpa_cudnn_cuda_fwd", "sdpa_cudnn_cuda_bwd"),
])
def test_vjp_on_cuda_runs_the_chosen_pair_and_saves_no_attention_matrix(backends, fwd, bwd):
    q, k, v = _qkv(L=16, S=16)
    trc = Trace("attention")
    with tracing(trc), sdpa_kernel(backends) if backends else _nothing():
        out, residuals = sdpa_ex.vjp_fwd(q, k, v, is_causal=True)
        grads = sdpa_ex.vjp_bwd(residuals, _cuda(*out.shape, requires_grad=False))
    names = [b.sym.name for b in trc.bound_symbols]
    assert fwd in names and bwd in names, names
    assert tuple(out.shape) == (2, 4, 16, 64) and len(grads) == 3
    assert [tuple(g.shape) for g in grads] == [(2, 4, 16, 64)] * 3
    shapes = {tuple(o.shape) for b in trc.bound_symbols for o in b.proxy_outs()}
    assert not any(len(s) == 4 and s[-2:] == (16, 16) for s in shapes), shapes


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("kernel, meta", [("flash", sdpa._flash_fwd_meta), ("efficient", sdpa._efficient_fwd_meta),
                                          ("cudnn", sdpa._cudnn_fwd_meta)])
def test_each_cuda_pair_calls_torchs_aten_ops_as_their_schemas_and_meta_kernels_say(kernel, meta):
    """The wrappers run on meta tensors: torch parses their arguments against the installed schemas and
    its meta kernels give the outputs, whose shapes and dtypes the operators' metas must declare."""
    fwd, bwd = {"flash": (sdpa.sdpa_flash_cuda_fwd, sdpa.sdpa_flash_cuda_bwd),
                "efficient": (sdpa.sdpa_efficient_cuda_fwd, sdpa.sdpa_efficient_cuda_bwd),
                "cudnn": (sdpa.sdpa_cudnn_cuda_fwd, sdpa.sdpa_cudnn_cuda_bwd)}[kernel]
    q, k, v = _meta(2, 4, 40, 64), _meta(2, 4, 48, 64), _meta(2, 4, 48, 64)
    results = fwd(q, k, v, None, False, 0.125)
    with tracing(Trace("metas")):
        declared = meta(*(TensorProxy.like(t, device="cuda:0") for t in (q, k, v)), None, False, 0.125)
    assert [(tuple(r.shape), r.dtype) for r in results] == [(tuple(d.shape), d.dtype) for d in declared]
    grads = bwd(_meta(2, 4, 40, 64), q, k, v, *results, None, False, 0.125)
    assert [tuple(g.shape) for g in grads] == [(2, 4, 40, 64), (2, 4, 48, 64), (2, 4, 48, 64)]


def test_tracing_cuda_attention_guards_the_trace_by_the_switches():
    q, k, v = _qkv()
    trc = Trace("attention")
    with tracing(trc):
        tnn.scaled_dot_product_attention(q, k, v)
        tnn.scaled_dot_product_attention(q, k, v, is_causal=True)
    guards = [g for g in trc.guards if getattr(g, "func", None) is sdp_state.why_changed]
    assert len(guards) == 1  # one per trace
    assert guards[0]() is None
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        assert "SDPA backend switches changed" in guards[0]()
    assert guards[0]() is None


def test_a_jitted_function_whose_trace_read_the_switches_retraces_when_they_change():
    def f(x):
        sdp_state.guard_trace()  # what tracing attention on CUDA does
        return x * 2

    jitted, x = tf.jit(f), torch.randn(3)
    jitted(x)
    jitted(x)
    with sdpa_kernel([SDPBackend.MATH]):
        jitted(x)
    info = tf.cache_info(jitted)
    assert info["entries"] == 2 and info["hits"] == 1
    assert "SDPA backend switches changed" in info["recompiles"][-1]


@emulated
def test_no_backend_is_none():
    # the choice module answers NONE where no enabled backend takes the call
    q, k, v = _qkv(dtype=torch.float32)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        assert sdpa_choice.emulated_choice(q, k, v) == sdpa_choice.NONE


@pytest.mark.parametrize("capability, backends, kernel", [
    ((9, 0), None, "flash"),
    ((8, 0), None, "flash"),
    ((7, 5), None, "efficient"),  # flash runs on sm80 and newer (float16 here; bfloat16 needs sm80 too)
    ((7, 5), [SDPBackend.EFFICIENT_ATTENTION], "efficient"),
    ((9, 0), [SDPBackend.CUDNN_ATTENTION], "cudnn"),
    ((8, 0), [SDPBackend.CUDNN_ATTENTION], None),  # cuDNN copied for Hopper only: torch runs the call
    ((10, 0), [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION], "efficient"),  # unknown GPU: no flash
])
def test_the_choice_on_a_gpu_machine_follows_that_gpus_capability(monkeypatch, capability, backends, kernel):
    """With a GPU present the copied gates decide for its compute capability (no fake-tensor probe, whose
    meta kernel answered math for every call, so attention was never claimed)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    q, k, v = _qkv(dtype=torch.float16)
    with sdpa_kernel(backends) if backends else _nothing():
        assert sdpa.cuda_kernel(q, k, v) == kernel
        assert sdpa.sdpa_checker(q, k, v) is (kernel is not None)
    if capability < (8, 0):  # no bfloat16 kernel before sm80: torch runs the call (as math attention)
        assert sdpa.cuda_kernel(*_qkv(dtype=torch.bfloat16)) is None


# -- on a GPU: the copied gates against torch's own, on real tensors ---------------------------------
_on_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="compares with torch's CUDA gate, which runs "
                                                                    "only where there is a GPU")
_CONTEXTS = {"default": None, "flash": [SDPBackend.FLASH_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
             "cudnn": [SDPBackend.CUDNN_ATTENTION], "math": [SDPBackend.MATH],
             "flash+efficient": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
             "cudnn+efficient": [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
             "flash+math": [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]}
_GPU_CASES = [(c, d, m, e) for c in _CONTEXTS for d in ("float16", "bfloat16", "float32")
              for m in ("none", "causal", "mask") for e in (64, 128, 72)]


def _real(dtype, mode, E):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, E, generator=g).to("cuda", getattr(torch, dtype)).requires_grad_()
               for _ in range(3))
    mask = torch.randn(64, 64, generator=g).to("cuda", getattr(torch, dtype)) if mode == "mask" else None
    return q, k, v, mask, mode == "causal"


def _torchs_pick(q, k, v, mask, is_causal) -> int:
    try:
        return int(torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal))
    except RuntimeError:  # "No available kernel": no enabled backend takes the call
        return sdpa_choice.NONE


_SDP_BACKEND = {sdp_state.FLASH: SDPBackend.FLASH_ATTENTION, sdp_state.EFFICIENT: SDPBackend.EFFICIENT_ATTENTION,
                sdp_state.CUDNN: SDPBackend.CUDNN_ATTENTION}


@_on_gpu
@pytest.mark.parametrize("context, dtype, mode, E", _GPU_CASES)
def test_on_a_gpu_the_copied_gates_pick_only_a_backend_torchs_own_gate_accepts(context, dtype, mode, E):
    """The executor calls the chosen kernels directly, past torch's gates: the backend the copy picks must
    be one torch's own gate takes for these inputs (torch alone under that backend picks it). The copy may
    differ from torch's preference: torch 2.11 on an H100 prefers cuDNN for some half-precision calls
    (float16 without a mask at head dim 64; masked ones) where the copy keeps flash or memory-efficient; it
    never goes to math or leaves the call to torch where torch has a fused kernel the copy allows."""
    q, k, v, mask, is_causal = _real(dtype, mode, E)
    with sdpa_kernel(_CONTEXTS[context]) if _CONTEXTS[context] else _nothing():
        ours = sdpa_choice.torch_choice(q, k, v, mask, is_causal, requires_grad=True)
        theirs = _torchs_pick(q, k, v, mask, is_causal)
    names = {**sdp_state.NAMES, sdpa_choice.NONE: "none"}
    if ours in _SDP_BACKEND:
        with sdpa_kernel([_SDP_BACKEND[ours]]):
            accepted = _torchs_pick(q, k, v, mask, is_causal) == ours
        assert accepted, f"the copied gates chose {names[ours]} (torch: {names[theirs]}), which torch's gate refuses"
    if theirs in (sdp_state.FLASH, sdp_state.EFFICIENT) and ours != theirs:
        # torch's flash and memory-efficient gates are copied in full for these inputs
        raise AssertionError(f"the copied gates chose {names[ours]} where torch runs {names[theirs]}")


@_on_gpu
@pytest.mark.parametrize("context, dtype, mode, E", _GPU_CASES)
def test_on_a_gpu_differentiated_attention_runs_the_chosen_kernels_and_matches_torch(context, dtype, mode, E):
    q, k, v, mask, is_causal = _real(dtype, mode, E)
    with sdpa_kernel(_CONTEXTS[context]) if _CONTEXTS[context] else _nothing():
        if _torchs_pick(q, k, v, mask, is_causal) == sdpa_choice.NONE:
            pytest.skip("torch has no kernel for this call under these switches")
        kernel = sdpa.cuda_kernel(q, k, v, mask, is_causal)
        f = tf.jit(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal),
                   executors=["sdpa"])
        out = f(q, k, v)
        got = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        want_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        want = torch.autograd.grad(want_out.float().square().sum(), (q, k, v))
    forward, backward = str(tf.last_traces(f)[-1]), str(tf.last_backward_traces(f)[-1])
    if kernel is None:  # not claimed: torch's own call in the forward (its backward is thunderfn's math rule)
        assert "sdpa_" not in forward and "scaled_dot_product_attention" in forward, forward
    else:
        assert f"sdpa_{kernel}_cuda_fwd(" in forward, forward
        assert f"sdpa_{kernel}_cuda_bwd(" in backward, backward
    # half precision: two different kernels' roundings (torch may run another backend than the one chosen)
    tol = 1e-4 if dtype == "float32" else 2e-2
    torch.testing.assert_close(out.float(), want_out.float(), atol=tol, rtol=tol)
    errors = [float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)) for a, b in zip(got, want)]
    assert max(errors) < (1e-4 if dtype == "float32" else 5e-2), errors
