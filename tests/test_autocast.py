"""torch.autocast traced as explicit casts (torch/autocast.py): inside a jitted function or
around a call, outputs, dtypes and gradients are eager's; the trace shows each cast; the
autocast state at the call is part of the cache key."""
import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.torch import autocast as tf_autocast

BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


class Block(torch.nn.Module):
    """Ops from each of CPU autocast's lists: linear and matmul (to bfloat16), cross_entropy (to
    float32), layer_norm and softmax (not listed: they run in what they are given), cat (promote)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x, target):
        h = self.norm(self.fc(x))
        attn = (h @ h.T).softmax(-1) @ h
        logits = self.head(torch.cat([attn, x.to(attn.dtype)], 0)[: x.shape[0]])
        return F.cross_entropy(logits, target), logits


def _close_with_dtypes(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)


def test_autocast_around_a_jitted_module_gives_eagers_outputs_dtypes_and_gradients():
    torch.manual_seed(0)
    eager = Block()
    jitted_block = Block()
    jitted_block.load_state_dict(eager.state_dict())
    jitted = tf.jit(jitted_block)
    x, target = torch.randn(4, 8), torch.randint(0, 5, (4,))
    with torch.autocast(**BF16):
        got, want = jitted(x, target), eager(x, target)
    assert [t.dtype for t in want] == [torch.float32, torch.bfloat16]
    _close_with_dtypes(got, want)
    got[0].backward()
    want[0].backward()
    for (name, p), q in zip(eager.named_parameters(), jitted_block.parameters()):
        assert q.grad.dtype == p.grad.dtype == torch.float32
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_autocast_inside_the_function_is_recorded_as_explicit_casts():
    w = torch.randn(8, 8)

    def f(x):
        with torch.autocast(**BF16):
            y = x @ w  # cast to bfloat16
            loss = F.mse_loss(y, torch.zeros_like(y))  # cast back to float32
        return y, loss, y.sum()  # outside the region: as given (bfloat16)

    x = torch.randn(3, 8, requires_grad=True)
    jf = tf.jit(f)
    got, want = jf(x), f(x)
    _close_with_dtypes(got, want)
    printed = str(tf.last_traces(jf)[0])
    assert printed.count("prims.convert_element_type(x, torch.bfloat16)") == 1
    assert "convert_element_type(t" in printed and "torch.float32)" in printed
    (gx,), (wx,) = (torch.autograd.grad(o[1], x) for o in (got, want))
    assert gx.dtype == wx.dtype == torch.float32
    torch.testing.assert_close(gx, wx)
    assert not torch.is_autocast_enabled("cpu")


def test_the_autocast_state_at_the_call_is_part_of_the_cache_key():
    w = torch.randn(4, 4)
    jf = tf.jit(lambda x: x @ w)
    x = torch.randn(2, 4)
    assert jf(x).dtype == torch.float32
    with torch.autocast(**BF16):
        assert jf(x).dtype == torch.bfloat16  # not the float32 entry
        assert jf(x).dtype == torch.bfloat16
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        assert jf(x).dtype == torch.float16
    assert jf(x).dtype == torch.float32  # the first entry, through the fast path, is right again
    info = tf.cache_info(jf)
    assert info["misses"] == 3 and info["hits"] == 2
    assert "the autocast state changed from no autocast to autocast('cpu', torch.bfloat16)" in info["recompiles"][0]


def test_an_entry_traced_under_autocast_runs_with_autocast_off_so_nothing_is_cast_twice():
    # addcmul is not on CPU autocast's lists: under autocast, eager computes it in float32; the
    # entry must too, although its inputs went through a matmul cast to bfloat16 first
    w = torch.randn(4, 4)

    def f(x):
        y = x @ w
        return torch.addcmul(x, y.float(), y.float()), y

    x = torch.randn(2, 4)
    jf = tf.jit(f)
    with torch.autocast(**BF16):
        for _ in range(2):  # the compiling call and a cached one
            _close_with_dtypes(jf(x), f(x))
            assert torch.is_autocast_enabled("cpu")


def test_multihead_attention_under_autocast_traces_torchs_python_op_by_op():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2)
    q = torch.randn(3, 2, 8)
    with torch.autocast(**BF16):
        got, want = tf.jit(mha)(q, q, q), mha(q, q, q)
    assert want[0].dtype == torch.bfloat16
    _close_with_dtypes(got, want)


@pytest.mark.parametrize("func, device, expected", [
    (F.linear, "cpu", torch.bfloat16), (torch.matmul, "cpu", torch.bfloat16), (F.cross_entropy, "cpu", torch.float32),
    (F.softmax, "cpu", None), (F.softmax, "cuda", torch.float32), (F.layer_norm, "cuda", torch.float32),
    (torch.cat, "cpu", "promote"), (torch.add, "cpu", None)],
    ids=["linear", "matmul", "cross_entropy", "softmax-cpu", "softmax-cuda", "layer_norm-cuda", "cat", "add"])
def test_the_policy_table_follows_torchs_lists(func, device, expected):
    # (the cuda rows only read the table: no GPU is needed)
    assert tf_autocast.policy(func, (), {}, device) == expected


def test_backward_called_inside_an_autocast_region_casts_as_eagers_backward_does():
    # eager's backward ops are autocast too when backward() runs inside a region (here the forward ran
    # outside it: its matmul was float32, the backward's are bfloat16); the compiled backward's torch
    # ops meet the same autocast, so the gradients are eager's, not those of a backward run outside
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    f = lambda x, w: (x @ w).sin().sum()  # noqa: E731
    eager_loss, jit_loss = f(x, w), tf.jit(f)(x, w)
    with torch.autocast(**BF16):
        (want,), (got,) = torch.autograd.grad(eager_loss, w), torch.autograd.grad(jit_loss, w)
    outside, = torch.autograd.grad(f(x, w), w)
    assert (want - outside).abs().max() > 1e-3  # the region changed eager's gradient
    torch.testing.assert_close(got, want)
