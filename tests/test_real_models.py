"""Models people load train under tf.jit exactly as in eager: Hugging Face GPT-2 and Llama
(tiny random configs, built offline), torch.nn modules whose forward reads tensor values
or tests isinstance(x, torch.Tensor), and what library code is told while it is traced."""

import copy
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.core.pytree import tree_flatten
from thunderfn.testing.op_counts import kernel_counts
from thunderfn.testing.optional_libraries import why_unavailable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import nanogpt  # noqa: E402  (karpathy/nanoGPT's model.py, a script beside the benchmarks)

# the Hugging Face tests skip without it; the rest of this file runs
_NO_TRANSFORMERS = why_unavailable("transformers")
if _NO_TRANSFORMERS is None:
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()

needs_transformers = pytest.mark.skipif(
    _NO_TRANSFORMERS is not None, reason=f"{_NO_TRANSFORMERS} (pip install transformers; .ci/run installs it)")


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


@pytest.fixture
def llama_for_inference():
    """A tiny Llama in eval mode, and it jitted."""
    torch.manual_seed(0)
    model = _llama().eval()
    return model, tf.jit(model)


def _assert_outputs_equal(got, want):
    """Same pytree (ModelOutput fields, cache layers) and equal tensors, requires_grad included."""
    (got_leaves, got_spec), (want_leaves, want_spec) = tree_flatten(got), tree_flatten(want)
    assert type(got) is type(want) and got_spec == want_spec
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, torch.Tensor):
            assert type(g) is torch.Tensor and g.requires_grad == w.requires_grad
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
        else:
            assert g == w


@needs_transformers
@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("options", [{}, {"attention_mask": True, "return_dict": False}],
                         ids=["defaults", "mask-tuple"])
def test_hugging_face_causal_lm_trains_under_jit_like_eager(make, options):
    torch.manual_seed(0)
    eager = make()
    jitted_model = make()
    jitted_model.load_state_dict(eager.state_dict())
    jitted = tf.jit(jitted_model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, jitted_model)]
    ids = torch.randint(0, 128, (2, 12))
    kwargs = dict(options)
    if kwargs.pop("attention_mask", False):
        mask = torch.ones_like(ids)
        mask[1, :4] = 0  # left padding
        kwargs["attention_mask"] = mask
    for step in range(3):
        outs = []
        for model, opt in zip((eager, jitted), opts):
            torch.manual_seed(step)  # GPT-2's dropout draws the same numbers in both
            out = model(ids, labels=ids, **kwargs)
            (out[0] if isinstance(out, tuple) else out.loss).backward()
            outs.append(out)
        _assert_outputs_equal(outs[1], outs[0])
        for (name, p), q in zip(eager.named_parameters(), jitted_model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    assert tf.cache_info(jitted)["misses"] == 1


@needs_transformers
def test_a_hugging_face_cache_comes_back_as_a_cache_and_grows_in_the_callers_object_as_in_eager(llama_for_inference):
    model, jitted = llama_for_inference
    ids = torch.randint(0, 128, (2, 6))
    with torch.no_grad():
        want, got = model(ids, use_cache=True), jitted(ids, use_cache=True)
        _assert_outputs_equal(got, want)
        assert type(got.past_key_values) is transformers.DynamicCache and got.past_key_values.get_seq_length() == 6
        # the next step appends to the cache it is given: eager grows the caller's object (its layers,
        # the same objects) and returns it; so does the jitted model
        cache, layers = got.past_key_values, list(got.past_key_values.layers)
        want_next = model(ids[:, :1], past_key_values=want.past_key_values, use_cache=True)
        got_next = jitted(ids[:, :1], past_key_values=cache, use_cache=True)
        assert got_next.past_key_values is cache and cache.layers == layers and cache.get_seq_length() == 7
        _assert_outputs_equal(got_next, want_next)


def test_torch_compiler_is_compiling_is_true_while_traced_and_false_outside():
    seen = []

    def f(x):
        seen.append(torch.compiler.is_compiling())
        return x if torch.compiler.is_compiling() else x.nonzero()  # the trace-friendly branch is taken

    out = tf.jit(f)(torch.ones(3))
    assert seen == [True] and out.shape == (3,)
    assert torch.compiler.is_compiling() is False and torch.compiler.is_exporting() is False


@pytest.mark.parametrize("mask", ["float", "bool", "key_padding"])
def test_multihead_attention_with_masks_matches_eager(mask):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, dtype=torch.float64)
    q = torch.randn(3, 4, 8, dtype=torch.float64, requires_grad=True)
    kwargs = {"float": {"attn_mask": torch.randn(3, 3, dtype=torch.float64)},
              "bool": {"attn_mask": torch.tensor([[False, True, True], [False, False, True], [False, False, False]])},
              "key_padding": {"key_padding_mask": torch.tensor([[False] * 3] * 3 + [[False, False, True]])}}[mask]
    got, want = tf.jit(mha)(q, q, q, **kwargs), mha(q, q, q, **kwargs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    (gq,), (wq,) = (torch.autograd.grad(o[0].sum(), q) for o in (got, want))
    torch.testing.assert_close(gq, wq)


MHA_CASES = {  # nn.MultiheadAttention options, call options
    "self_attention_no_weights": ({}, {"need_weights": False}),
    "weights_averaged": ({}, {}),
    "weights_per_head": ({}, {"average_attn_weights": False}),
    "batch_first": ({"batch_first": True}, {"need_weights": False}),
    "causal": ({}, {"need_weights": False, "is_causal": True, "attn_mask": "causal"}),
    "float_mask_3d": ({}, {"need_weights": False, "attn_mask": "float_3d"}),
    "key_padding_and_bool_mask": ({}, {"need_weights": False, "attn_mask": "bool", "key_padding_mask": True}),
    "separate_kv_dims": ({"kdim": 6, "vdim": 5}, {"need_weights": False}),
    "bias_kv_and_zero_attn": ({"add_bias_kv": True, "add_zero_attn": True}, {"attn_mask": "bool"}),
    "unbatched": ({}, {"need_weights": False, "unbatched": True}),
}


@pytest.mark.parametrize("case", MHA_CASES)
def test_multihead_attention_is_traced_through_and_trains_like_eager(case):
    """torch's F.multi_head_attention_forward is traced through (its linears and attention are thunderfn's),
    not run as one opaque op: outputs, attention weights and every gradient are eager's."""
    module_options, call = MHA_CASES[case]
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, dtype=torch.float64, **module_options)
    L, S, N = 3, 4, 2
    kv_len = L if call.get("attn_mask") == "causal" else S

    def sequence(length, dim):
        if call.get("unbatched"):
            return torch.randn(length, dim, dtype=torch.float64)
        return torch.randn(*((N, length) if module_options.get("batch_first") else (length, N)), dim,
                           dtype=torch.float64)

    q = sequence(L, 8).requires_grad_()
    k, v = sequence(kv_len, module_options.get("kdim", 8)), sequence(kv_len, module_options.get("vdim", 8))
    kwargs = {key: value for key, value in call.items() if key not in ("unbatched", "attn_mask", "key_padding_mask")}
    masks = {"causal": torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64),
             "float_3d": torch.randn(N * 2, L, S, dtype=torch.float64),
             "bool": torch.tensor([[False, True, False, False], [False, False, True, False],
                                   [False, False, False, True]])}
    if "attn_mask" in call:
        kwargs["attn_mask"] = masks[call["attn_mask"]]
    if call.get("key_padding_mask"):
        kwargs["key_padding_mask"] = torch.tensor([[False, False, False, True], [False, False, False, False]])
    jitted = tf.jit(mha)
    got, want = jitted(q, k, v, **kwargs), mha(q, k, v, **kwargs)
    assert (got[1] is None) == (want[1] is None)
    for g, w in zip(got, want):
        if w is not None:
            torch.testing.assert_close(g, w)
    assert "multi_head_attention_forward" not in str(tf.last_traces(jitted)[-1])
    params = [q] + list(mha.parameters())
    weights = torch.linspace(-1, 1, got[0].numel(), dtype=torch.float64).reshape(got[0].shape)
    got_grads = torch.autograd.grad((got[0] * weights).sum(), params)
    want_grads = torch.autograd.grad((want[0] * weights).sum(), params)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w)


def test_multihead_attention_training_step_runs_attention_once_as_eager_does():
    """As one opaque op torch.func ran F.multi_head_attention_forward again to differentiate it: attention,
    the projections and all, twice per step. Traced through, the step runs eager's aten calls."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 16)
    jitted = tf.jit(layer)

    def step(module):
        module.zero_grad(set_to_none=True)
        module(x).square().sum().backward()

    def counts(module):
        step(module)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(module)
        names = [e.name for e in prof.events() if e.name.startswith("aten::")]
        return {n: names.count(n) for n in ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                            "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                                            "aten::linear", "aten::addmm")}

    eager_counts, jit_counts = counts(layer), counts(jitted)
    assert jit_counts["aten::_scaled_dot_product_flash_attention_for_cpu"] == 1, jit_counts
    assert jit_counts["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] == 1, jit_counts
    assert jit_counts["aten::linear"] <= eager_counts["aten::linear"], (jit_counts, eager_counts)


def test_a_nanogpt_step_runs_no_more_matmuls_or_copies_than_eager_with_eagers_gradients():
    """nanoGPT (plain PyTorch: fused c_attn split into heads by view/transpose, SDPA, heads put back by
    transpose(1, 2).contiguous(), tied embedding and head): the default step keeps eager's operand layouts,
    so it runs eager's matrix multiplies and no copy eager does not (the CPU attention backward once made
    its incoming gradient contiguous in the other order, and the kernel copied it back: two per layer)."""
    model, idx, targets = nanogpt.tiny(n_layer=2)
    jitted = tf.jit(copy.deepcopy(model))

    def step(module):
        module.zero_grad(set_to_none=True)
        module(idx, targets)[1].backward()

    step(jitted)  # compiled here, so the step counted below runs the cached program
    eager_counts, jit_counts = kernel_counts(lambda: step(model)), kernel_counts(lambda: step(jitted))
    assert jit_counts["matmul"] <= eager_counts["matmul"] and jit_counts["copy"] <= eager_counts["copy"], \
        (jit_counts, eager_counts)
    for (name, p), q in zip(model.named_parameters(), jitted.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_batch_norm_cumulative_average_momentum_none_matches_eager_over_steps():
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm2d(3, momentum=None)
    jitted_bn = torch.nn.BatchNorm2d(3, momentum=None)
    jitted = tf.jit(jitted_bn)
    for _ in range(3):
        x = torch.randn(4, 3, 2, 2)
        torch.testing.assert_close(jitted(x), eager(x))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(jitted_bn, name), getattr(eager, name), msg=name)
    assert tf.cache_info(jitted)["misses"] == 1  # the count is a tensor in the trace, not a baked number
    assert "float64" in str(tf.last_traces(jitted)[0])


@pytest.mark.parametrize("lengths", ["tuples", "tensors"])
def test_ctc_loss_and_its_gradient_match_eager(lengths):
    torch.manual_seed(0)
    log_probs = torch.randn(12, 2, 5, dtype=torch.float64).log_softmax(2).requires_grad_()
    targets = torch.randint(1, 5, (2, 4))
    input_lengths, target_lengths = (12, 10), (4, 3)
    if lengths == "tensors":
        input_lengths, target_lengths = torch.tensor(input_lengths), torch.tensor(target_lengths)
    args = (targets, input_lengths, target_lengths)
    got = tf.jit(torch.nn.CTCLoss(reduction="none"))(log_probs, *args)
    want = F.ctc_loss(log_probs, *args, reduction="none")
    torch.testing.assert_close(got, want)
    (g,), (w,) = (torch.autograd.grad(o.sum(), log_probs) for o in (got, want))
    torch.testing.assert_close(g, w)


@needs_transformers
@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_training_on_batches_of_varying_length_compiles_twice(make):
    """Variable-length batches: the second length compiles the sequence dimension symbolic, and that entry
    trains every later length exactly like eager (loss and every parameter's gradient)."""
    torch.manual_seed(0)
    model = make().eval()  # (dropout off: eager and jit draw alike anyway, but the comparison is then exact)
    jitted = tf.jit(model)
    for length in [7, 12, 3, 29, 16, 64]:
        ids = torch.randint(0, 128, (2, length))
        loss = jitted(input_ids=ids, labels=ids).loss
        want = model(input_ids=ids, labels=ids).loss
        torch.testing.assert_close(loss, want)
        got = torch.autograd.grad(loss, list(model.parameters()))
        expected = torch.autograd.grad(want, list(model.parameters()))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    info = tf.cache_info(jitted)
    assert info["misses"] == 2, info["recompiles"]
    # (input_ids's and labels's lengths: a symbol each, one after the loss guarded them equal)
    assert set(info["symbolic"][-1].values()) <= {"argument 'input_ids'.shape[1]", "argument 'labels'.shape[1]"}
