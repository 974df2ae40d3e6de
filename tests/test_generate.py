"""Hugging Face's generate on a jitted model: its own loop, each forward through the jitted one.
Greedy tokens are eager's, from prompts of several lengths, in no more compiled entries than
torch.compile's graphs for the same calls (the growing cache length and the prompt length are
symbolic after one recompile each), and what cannot compile says so by name. Tiny random
configs, built offline, on CPU."""
import copy
import threading
import warnings

import pytest
import torch
import torch._dynamo

import thunderfn as tf
from thunderfn.testing.optional_libraries import import_torchvision, why_unavailable

_NO_TRANSFORMERS = why_unavailable("transformers")
if _NO_TRANSFORMERS is None:
    import_torchvision()  # made importable first: transformers imports it where installed
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()

pytestmark = pytest.mark.skipif(_NO_TRANSFORMERS is not None,
                                reason=f"{_NO_TRANSFORMERS} (pip install transformers; .ci/run installs it)")


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100,
                                                                n_positions=128))


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=2,
                                                                  num_key_value_heads=1, hidden_size=32,
                                                                  intermediate_size=64, vocab_size=100))


MODELS = pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
GREEDY = dict(max_new_tokens=32, do_sample=False, pad_token_id=0)
PROMPT_LENGTHS = (7, 1, 12)


def _model(make):
    torch.manual_seed(0)
    return make().eval()


def _dynamo_graphs(model, prompts, options) -> tuple[int, list]:
    """torch.compile's graphs for the same generate calls, on a copy of the model: its forward compiled with the
    default automatic dynamic (dynamic=None), Hugging Face's default DynamicCache. A counting backend that
    runs each graph as Dynamo captured it (the "eager" backend's work): Dynamo's graph count is what is
    compared, and Inductor's compile would only add time."""
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = copy.deepcopy(model)
    compiled.forward = torch.compile(compiled.forward, backend=counting_backend, dynamic=None)
    torch._dynamo.reset()
    try:
        outs = [compiled.generate(ids, **options) for ids in prompts]
    finally:
        torch._dynamo.reset()
    return len(graphs), outs


@MODELS
def test_greedy_generate_from_several_prompt_lengths_gives_eagers_tokens_in_no_more_entries_than_torch_compiles_graphs(
        make):
    """100 new tokens from prompts of 7, 1 and 12 tokens, one after another on one jitted model: the first
    prompt's prefill, its first decode step and the decode step with the cache length symbolic (3 entries); the
    prompt of 1 token makes the prefill symbolic and compiles an entry of its own (attention is causal only for
    a query longer than 1: transformers' sdpa_attention_forward; torch.compile specializes 1 as well), and the
    prompt of 12 compiles nothing. torch.compile's graphs for the same calls are counted in this test."""
    model = _model(make)
    prompts = [torch.randint(3, 100, (1, n)) for n in PROMPT_LENGTHS]
    options = dict(GREEDY, max_new_tokens=100, eos_token_id=None)  # (no early stop: each prompt gets its 100)
    want = [model.generate(ids, **options) for ids in prompts]
    jitted = tf.jit(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, entries = [], []
        for ids in prompts:
            got.append(jitted.generate(ids, **options))
            entries.append(tf.cache_info(jitted)["entries"])
    assert not [w for w in caught if "eager" in str(w.message)], [str(w.message) for w in caught]
    for g, w, ids in zip(got, want, prompts, strict=True):
        assert g.shape == (1, ids.shape[1] + 100) and torch.equal(g, w), ids.shape
    info = tf.cache_info(jitted)
    assert entries[0] <= 3 and entries[2] == entries[1], (entries, info)
    assert info["hits"] + info["misses"] == 100 * len(prompts), info  # each forward ran jitted
    assert "forward" not in model.__dict__  # the route through the jitted forward is gone
    graphs, dynamo_outs = _dynamo_graphs(model, prompts, options)
    for g, w in zip(dynamo_outs, want, strict=True):
        assert torch.equal(g, w)
    assert info["entries"] <= graphs, (info, graphs)


@MODELS
def test_generate_of_a_left_padded_batch_gives_eagers_tokens_logits_and_cache(make):
    """A padding mask makes generate pass position_ids, which it decides from forward's signature."""
    model = _model(make)
    ids = torch.randint(3, 100, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    ids[0, :2], mask[0, :2] = 0, 0
    options = dict(GREEDY, max_new_tokens=12, attention_mask=mask, return_dict_in_generate=True, output_logits=True)
    want = model.generate(ids, **options)
    jitted = tf.jit(model)
    got = jitted.generate(ids, **options)
    assert torch.equal(got.sequences, want.sequences)
    for g, w in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(g, w)
    assert type(got.past_key_values) is transformers.DynamicCache
    for g, w in zip(got.past_key_values.layers, want.past_key_values.layers, strict=True):
        torch.testing.assert_close(g.keys, w.keys)
        torch.testing.assert_close(g.values, w.values)
    assert tf.cache_info(jitted)["entries"] <= 3


def test_generate_with_a_static_cache_gives_eagers_tokens_and_leaves_the_module_as_it_was():
    """generate then hands forward a prepared 4D mask, which the model recognizes by isinstance(mask, torch.Tensor):
    true for a traced tensor too."""
    model = _model(_llama)
    ids = torch.randint(3, 100, (1, 5))
    want = model.generate(ids, cache_implementation="static", **GREEDY)
    jitted = tf.jit(model)
    got = jitted.generate(ids, cache_implementation="static", **GREEDY)
    assert torch.equal(got, want)
    assert tf.cache_info(jitted)["entries"] <= 2
    assert "forward" not in model.__dict__


def test_generate_of_a_module_with_a_forward_hook_runs_eagerly_and_says_why():
    """nn.Module.__call__ runs the module's own hooks around forward; through the jitted forward
    they would run twice."""
    model = _model(_gpt2)
    ids = torch.randint(3, 100, (1, 5))
    want = model.generate(ids, **dict(GREEDY, max_new_tokens=3))
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    jitted = tf.jit(model)
    with pytest.warns(UserWarning, match=r"GPT2LMHeadModel.generate runs eagerly: the module has forward hooks"):
        got = jitted.generate(ids, **dict(GREEDY, max_new_tokens=3))
    assert torch.equal(got, want) and len(calls) == 3
    assert tf.cache_info(jitted)["misses"] == 0


class _CallsTheModelFromAnotherThread(transformers.LogitsProcessor if _NO_TRANSFORMERS is None else object):
    """At the first step, calls the original module from another thread, which must run eagerly."""

    def __init__(self, model, ids):
        self.model, self.ids, self.done = model, ids, False

    def __call__(self, input_ids, scores):
        if not self.done:
            self.done = True
            results = []
            thread = threading.Thread(target=lambda: results.append(self.model(self.ids).logits))
            thread.start()
            thread.join()
            torch.testing.assert_close(results[0], type(self.model).forward(self.model, self.ids).logits)
        return scores


def test_the_module_called_from_another_thread_during_generate_runs_eagerly():
    model = _model(_llama)
    ids = torch.randint(3, 100, (1, 5))
    jitted = tf.jit(model)
    processor = _CallsTheModelFromAnotherThread(model, ids)
    got = jitted.generate(ids, logits_processor=transformers.LogitsProcessorList([processor]),
                          **dict(GREEDY, max_new_tokens=4))
    assert processor.done and torch.equal(got, model.generate(ids, **dict(GREEDY, max_new_tokens=4)))
    info = tf.cache_info(jitted)
    assert info["hits"] + info["misses"] == 4, info  # the other thread's call did not go through jit


class _Fails(transformers.StoppingCriteria if _NO_TRANSFORMERS is None else object):
    def __call__(self, input_ids, scores, **kwargs):
        raise RuntimeError("stopped by the test")


def test_an_error_inside_generate_removes_the_route_through_the_jitted_forward():
    model = _model(_gpt2)
    ids = torch.randint(3, 100, (1, 5))
    jitted = tf.jit(model)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        jitted.generate(ids, stopping_criteria=transformers.StoppingCriteriaList([_Fails()]), **GREEDY)
    assert "forward" not in model.__dict__
    torch.testing.assert_close(model(ids).logits, jitted(ids).logits)  # both still work, eagerly and jitted


def test_generate_is_the_original_modules_only_where_it_has_one():
    jitted = tf.jit(torch.nn.Linear(2, 2))
    with pytest.raises(AttributeError, match="generate"):
        jitted.generate
