"""Attention on CPU (executors/sdpa.py, sdpa_choice.py's cpu_choice): thunderfn runs torch's CPU
flash kernel pair (forward saving the logsumexp, backward one `_scaled_dot_product_flash_attention_
for_cpu_backward`) exactly where torch's own CPU dispatch picks flash, and math attention elsewhere;
the gradients are eager's; a trace follows torch's `sdpa_kernel` switches; second derivatives (which
torch's flash backward does not have: eager raises) differentiate the kernels' formulas, giving math
attention's."""
import collections
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import thunderfn as tf
from thunderfn.core.proxies import TensorProxy
from thunderfn.executors import sdpa, sdpa_choice
from thunderfn.fast_path import MISS
from thunderfn.torch import sdp_state

FLASH_BACKWARD = "ScaledDotProductFlashAttentionForCpuBackward0"
_seeds = itertools.count()


def randn(*shape, dtype=torch.float32, requires_grad=False):
    g = torch.Generator().manual_seed(next(_seeds))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)


def qkv(b=2, h=3, L=5, S=6, E=4, dtype=torch.float32, hk=None, ek=None, ev=None, bk=None):
    return (randn(b, h, L, E, dtype=dtype), randn(bk or b, hk or h, S, ek or E, dtype=dtype),
            randn(bk or b, hk or h, S, ev or ek or E, dtype=dtype))


def bool_mask(*shape):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(next(_seeds))) > 0.3


def as_proxy(t):
    return TensorProxy(f"p{next(_seeds)}", shape=tuple(t.shape), dtype=t.dtype, device=t.device,
                       requires_grad=t.requires_grad)


# -- the choice: torch's, call by call -------------------------------------------------------------------
CHOICE_CASES = {  # (q, k, v), attn_mask, dropout_p, is_causal, enable_gqa
    "plain": (qkv(), None, 0.0, False, False),
    "causal_L_ne_S": (qkv(), None, 0.0, True, False),
    "float64": (qkv(dtype=torch.float64), None, 0.0, False, False),
    "bfloat16": (qkv(dtype=torch.bfloat16), None, 0.0, False, False),
    "float16": (qkv(dtype=torch.float16), None, 0.0, False, False),
    "mixed_dtypes": ((randn(2, 3, 5, 4), randn(2, 3, 6, 4, dtype=torch.float64), randn(2, 3, 6, 4)), None, 0.0, False,
                     False),
    "3d": (tuple(t[0] for t in qkv()), None, 0.0, False, False),
    "5d": (tuple(t[None] for t in qkv()), None, 0.0, False, False),
    "dropout": (qkv(), None, 0.3, False, False),
    "key_batch_broadcast": (qkv(bk=1), None, 0.0, False, False),
    "key_head_dim_differs": (qkv(ek=8), None, 0.0, False, False),
    "value_head_dim_differs": (qkv(ev=8), None, 0.0, False, False),
    "heads_differ": (qkv(h=4, hk=2), None, 0.0, False, False),
    "gqa": (qkv(h=4, hk=2), None, 0.0, False, True),
    "gqa_not_a_divisor": (qkv(h=3, hk=2), None, 0.0, False, True),
    "gqa_key_value_heads_differ": ((randn(2, 4, 5, 4), randn(2, 2, 6, 4), randn(2, 1, 6, 4)), None, 0.0, False, True),
    "gqa_flag_equal_heads": (qkv(), None, 0.0, False, True),
    "mask_2d": (qkv(), randn(5, 6), 0.0, False, False),
    "mask_2d_broadcast_rows": (qkv(), randn(1, 6), 0.0, False, False),
    "mask_2d_broadcast_columns": (qkv(), randn(5, 1), 0.0, False, False),
    "bool_mask_2d": (qkv(), bool_mask(5, 6), 0.0, False, False),
    "mask_4d_full": (qkv(), randn(2, 3, 5, 6), 0.0, False, False),
    "mask_4d_broadcast": (qkv(), randn(1, 1, 5, 6), 0.0, False, False),
    "mask_4d_wrong_heads": (qkv(), randn(2, 2, 5, 6), 0.0, False, False),
    "mask_3d": (qkv(), randn(3, 5, 6), 0.0, False, False),
    "mask_requires_grad": (qkv(), randn(5, 6, requires_grad=True), 0.0, False, False),
    "mask_and_causal": (qkv(), randn(5, 6), 0.0, True, False),
    "float32_mask_on_bfloat16": (qkv(dtype=torch.bfloat16), randn(5, 6), 0.0, False, False),
}
SWITCHES = {"default": None, "math_only": [SDPBackend.MATH], "flash_only": [SDPBackend.FLASH_ATTENTION],
            "flash_and_math": [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH],
            "efficient_only": [SDPBackend.EFFICIENT_ATTENTION]}


@pytest.mark.parametrize("switches", SWITCHES)
@pytest.mark.parametrize("case", CHOICE_CASES)
def test_cpu_choice_is_torchs_under_its_switches(case, switches):
    (q, k, v), mask, dropout_p, is_causal, enable_gqa = CHOICE_CASES[case]
    with sdpa_kernel(SWITCHES[switches]) if SWITCHES[switches] else _nothing():
        try:
            expected = torch._fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale=None, enable_gqa=enable_gqa)
        except RuntimeError:  # no backend enabled that takes the call
            expected = sdpa_choice.NONE
        assert sdpa_choice.cpu_choice(q, k, v, mask, dropout_p, is_causal, enable_gqa) == expected
        proxies = [as_proxy(t) if t is not None else None for t in (q, k, v, mask)]
        claimed = sdpa.sdpa_checker(*proxies[:3], proxies[3], dropout_p, is_causal, None, enable_gqa)
        assert claimed is (expected == sdp_state.FLASH)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("shape", [(0, 3, 5, 4), (2, 0, 5, 4), (2, 3, 5, 0)], ids=["batch", "heads", "head_dim"])
def test_empty_inputs_are_left_to_torch_which_answers_them_without_a_kernel(shape):
    q = torch.randn(*shape, requires_grad=True)
    assert torch._fused_sdp_choice(q, q, q) == sdp_state.FLASH  # torch's gate says flash ...
    assert F.scaled_dot_product_attention(q, q, q).grad_fn.name() != FLASH_BACKWARD  # ... but eager never calls it
    assert not sdpa.sdpa_checker(*[as_proxy(q)] * 3)


# -- gradients and op counts: eager's ------------------------------------------------------------------------
GRAD_CASES = {  # (q, k, v), kwargs
    "plain": (qkv(), {}),
    "causal": (qkv(L=7, S=7), {"is_causal": True}),
    "causal_L_ne_S": (qkv(L=4, S=7), {"is_causal": True}),
    "scale": (qkv(), {"scale": 0.3}),
    "head_dim_16": (qkv(E=16), {}),
    "head_dim_1": (qkv(E=1), {}),
    "batch_1_heads_1": (qkv(b=1, h=1), {}),
    "float_mask_2d": (qkv(), {"attn_mask": randn(5, 6)}),
    "float_mask_4d": (qkv(), {"attn_mask": randn(2, 1, 5, 6)}),
    "bool_mask": (qkv(), {"attn_mask": bool_mask(5, 6)}),
    "mask_and_causal": (qkv(L=6, S=6), {"attn_mask": randn(6, 6), "is_causal": True}),
    "fully_masked_row": (qkv(), {"attn_mask": torch.arange(5)[:, None] != torch.full((5, 6), 2)}),
    "gqa": (qkv(h=4, hk=2), {"enable_gqa": True}),
    "float64": (qkv(dtype=torch.float64), {"is_causal": True, "scale": 0.7}),
    "bfloat16": (qkv(dtype=torch.bfloat16), {"attn_mask": randn(5, 6)}),
    "float16": (qkv(dtype=torch.float16), {}),
}


def _aten_counts(fn) -> collections.Counter:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


@pytest.mark.parametrize("case", GRAD_CASES)
def test_training_step_runs_torchs_flash_pair_once_each_and_gives_eagers_gradients(case):
    (q, k, v), kwargs = GRAD_CASES[case]

    def loss(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, **kwargs) * torch.linspace(-1, 1, v.shape[-1])).sum()

    eager_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    eager_out = loss(*eager_leaves)
    eager_grads = torch.autograd.grad(eager_out, eager_leaves)
    jitted = tf.jit(loss)
    jitted(*[t.detach().clone().requires_grad_() for t in (q, k, v)])  # compile first: count one cached step
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    box = {}
    counts = _aten_counts(lambda: box.update(grads=torch.autograd.grad(jitted(*leaves), leaves)))
    assert counts["aten::_scaled_dot_product_flash_attention_for_cpu"] == 1, counts
    assert counts["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] == 1, counts
    assert counts["aten::scaled_dot_product_attention"] == 0 and counts["aten::softmax"] == 0, counts
    tol = {"atol": 2e-2, "rtol": 2e-2} if q.dtype in (torch.bfloat16, torch.float16) else {}
    for got, want in zip(box["grads"], eager_grads):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **tol)


def test_where_torch_runs_math_attention_so_does_thunderfn():
    q, k, v = qkv(dtype=torch.float64)
    loss = lambda q, k, v: F.scaled_dot_product_attention(q, k, v).sum()  # noqa: E731
    jitted = tf.jit(loss)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.MATH]):
        grads = torch.autograd.grad(jitted(*leaves), leaves)
        counts = _aten_counts(lambda: torch.autograd.grad(jitted(*leaves), leaves))
        eager = torch.autograd.grad(loss(*leaves), leaves)
    assert "sdpa_flash_cpu" not in str(tf.last_traces(jitted)[-1])
    assert counts["aten::_scaled_dot_product_flash_attention_for_cpu"] == 0, counts
    torch.testing.assert_close(grads, eager)


def test_a_trace_follows_the_sdpa_kernel_switches():
    q, k, v = qkv()
    jitted = tf.jit(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))
    jitted(q, k, v)
    assert "sdpa_flash_cpu(" in str(tf.last_traces(jitted)[-1])
    with sdpa_kernel([SDPBackend.MATH]):
        jitted(q, k, v)
        assert "sdpa_flash_cpu" not in str(tf.last_traces(jitted)[-1])
    jitted(q, k, v)
    assert "sdpa_flash_cpu(" in str(tf.last_traces(jitted)[-1])


def test_the_switch_guard_keeps_attention_on_the_fast_path():
    """The guard on the switches is the trace's own (Trace.guards); an entry with such guards and no
    call-time inputs is checked by the fast path's one generated function, not by the slow path's key."""
    q, k, v = qkv()
    jitted = tf.jit(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))
    jitted(q, k, v)
    state = jitted._thunderfn_state
    assert len(state.fast_cache) == 1
    hit = next(iter(state.fast_cache.values()))
    assert hit(q, k, v) is not MISS and tf.cache_info(jitted)["hits"] == 1
    with sdpa_kernel([SDPBackend.MATH]):
        assert hit(q, k, v) is MISS and tf.cache_info(jitted)["hits"] == 1  # the guard failed
        jitted(q, k, v)
    assert tf.cache_info(jitted)["misses"] == 2


# -- second derivatives: math attention's (eager has none through the flash kernels) ----------------------
SECOND_CASES = {  # float64 (q, k, v), kwargs
    "plain": (qkv(dtype=torch.float64), {}),
    "causal_scaled": (qkv(L=4, S=7, dtype=torch.float64), {"is_causal": True, "scale": 0.3}),
    "float_mask": (qkv(dtype=torch.float64), {"attn_mask": randn(1, 3, 5, 6, dtype=torch.float64)}),
    "bool_mask": (qkv(dtype=torch.float64), {"attn_mask": bool_mask(5, 6)}),
    "fully_masked_row": (qkv(dtype=torch.float64), {"attn_mask": torch.arange(5)[:, None] != torch.full((5, 6), 2)}),
    "gqa": (qkv(h=4, hk=2, dtype=torch.float64), {"enable_gqa": True}),
}


def _attention_loss(kwargs):
    def loss(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs).sin().square().sum()
    return loss


def test_eager_has_no_second_derivative_through_the_flash_kernels():
    q, k, v = (t.requires_grad_() for t in qkv(dtype=torch.float64))
    (dq,) = torch.autograd.grad(_attention_loss({})(q, k, v), q, create_graph=True)
    with pytest.raises(RuntimeError, match="_scaled_dot_product_flash_attention_for_cpu_backward is not implemented"):
        dq.sum().backward()


@pytest.mark.parametrize("case", SECOND_CASES)
def test_grad_of_grad_and_jvp_of_grad_are_math_attentions(case):
    (q, k, v), kwargs = SECOND_CASES[case]
    loss = _attention_loss(kwargs)
    grads = tf.grad(loss, argnums=(0, 1, 2))

    def grad_norm(q, k, v):
        return sum((g * g).sum() for g in grads(q, k, v))

    second = tf.jit(tf.grad(grad_norm, argnums=(0, 1, 2)))
    got = second(q, k, v)
    assert "sdpa_flash_cpu_bwd(" in str(tf.last_traces(second)[-1])  # the first derivative is still the kernel's
    tangents = tuple(randn(*t.shape, dtype=t.dtype) for t in (q, k, v))
    _, tangent = tf.jvp(grads, (q, k, v), tangents)
    with sdpa_kernel([SDPBackend.MATH]):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        first = torch.autograd.grad(loss(*leaves), leaves, create_graph=True)
        want = torch.autograd.grad(sum((g * g).sum() for g in first), leaves)
        _, want_tangent = torch.func.jvp(torch.func.grad(loss, argnums=(0, 1, 2)), (q, k, v), tangents)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(tangent, want_tangent)


@pytest.mark.parametrize("causal", [False, True], ids=["no_causal", "causal"])
def test_second_derivative_with_respect_to_a_float_mask(causal):
    q, k, v = qkv(L=6, S=6, dtype=torch.float64)
    mask = randn(6, 6, dtype=torch.float64)
    loss = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, is_causal=causal).sin().sum()  # noqa: E731
    grads = tf.grad(loss, argnums=(0, 3))

    def grad_norm(q, k, v, m):
        return sum((g * g).sum() for g in grads(q, k, v, m))

    got = tf.grad(grad_norm, argnums=(0, 1, 3))(q, k, v, mask)
    # the reference: thunderfn's math attention (the torch executor alone), as torch's math path refuses mask + causal
    want = tf.jit(tf.grad(grad_norm, argnums=(0, 1, 3)), executors=[])(q, k, v, mask)
    torch.testing.assert_close(got, want)
    first = tf.jit(grads)
    torch.testing.assert_close(first(q, k, v, mask), tf.jit(grads, executors=[])(q, k, v, mask))
    assert "sdpa_flash_cpu_bwd(" in str(tf.last_traces(first)[-1])
