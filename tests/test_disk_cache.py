"""Warm starts: compiled entries written to cache_dir and loaded by a new process (disk_cache.py).

A function's second jit in the same process has an empty cache in memory, so it looks on disk as a new
process would; one test runs real new processes, training a Hugging Face GPT-2 across them.
"""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import thunderfn as tf

SCALE = 2.0


def scaled_tanh(x, w):
    return torch.tanh(x @ w) * SCALE


@tf.jit
def decorated(x):
    return torch.cos(x) * SCALE


def _inputs():
    torch.manual_seed(0)
    return torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)


def _value_and_grads(fn, x, w):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    out = fn(x, w)
    out.sum().backward()
    return out.detach(), x.grad, w.grad


def test_a_second_jit_loads_the_entry_the_first_wrote_and_computes_as_eager(tmp_path):
    x, w = _inputs()
    first = tf.jit(scaled_tanh, cache_dir=tmp_path)
    cold = _value_and_grads(first, x, w)
    assert tf.cache_info(first)["disk"] is None  # written
    assert list((tmp_path / "entries").iterdir())
    second = tf.jit(scaled_tanh, cache_dir=tmp_path)
    warm = _value_and_grads(second, x, w)
    assert tf.cache_info(second)["disk"] == "loaded from cache_dir"
    for a, b, c in zip(cold, warm, _value_and_grads(scaled_tanh, x, w)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(b, c)
    # what it runs is the source it was written with: printed by tf.last_traces, its statements not kept
    assert "def " in str(tf.last_traces(second)[-1])
    with pytest.raises(AttributeError, match="loaded from cache_dir"):
        tf.last_traces(second)[-1].bound_symbols


def test_an_entry_whose_guarded_global_changed_is_compiled_again(tmp_path, monkeypatch):
    x, w = _inputs()
    tf.jit(scaled_tanh, cache_dir=tmp_path)(x, w)
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 3.0)
    again = tf.jit(scaled_tanh, cache_dir=tmp_path)
    torch.testing.assert_close(again(x, w), scaled_tanh(x, w))
    assert "SCALE" in tf.cache_info(again)["disk"] and "skipped" in tf.cache_info(again)["disk"]
    # the compile with the new value is written too, and loaded by the next jit
    third = tf.jit(scaled_tanh, cache_dir=tmp_path)
    torch.testing.assert_close(third(x, w), scaled_tanh(x, w))
    assert tf.cache_info(third)["disk"] == "loaded from cache_dir"


def test_a_function_jitted_where_it_is_defined_is_written_too(tmp_path, monkeypatch):
    monkeypatch.setenv("THUNDERFN_CACHE_DIR", str(tmp_path))
    x = torch.randn(3)
    fresh = tf.jit(decorated._thunderfn_state.fn)  # what the name holds in a new process: compiled anew
    torch.testing.assert_close(fresh(x), torch.cos(x) * SCALE)
    assert tf.cache_info(fresh)["disk"] is None and (tmp_path / "entries").exists()
    again = tf.jit(decorated._thunderfn_state.fn)
    torch.testing.assert_close(again(x), torch.cos(x) * SCALE)
    assert tf.cache_info(again)["disk"] == "loaded from cache_dir"


def test_another_signature_is_another_entry(tmp_path):
    x, w = _inputs()
    tf.jit(scaled_tanh, cache_dir=tmp_path)(x, w)
    wide = tf.jit(scaled_tanh, cache_dir=tmp_path)
    torch.testing.assert_close(wide(torch.ones(5, 4), w), scaled_tanh(torch.ones(5, 4), w))
    assert tf.cache_info(wide)["disk"] is None  # compiled (nothing to load for this shape) and written
    assert len(list((tmp_path / "entries").iterdir())) == 2


def test_a_lambda_is_compiled_but_not_written_and_cache_info_says_why(tmp_path):
    fn = tf.jit(lambda x: x + 1, cache_dir=tmp_path)
    fn(torch.ones(2))
    assert "not found by its name" in tf.cache_info(fn)["disk"]
    assert not (tmp_path / "entries").exists()


def test_a_damaged_entry_is_skipped_and_compiled_again(tmp_path):
    x, w = _inputs()
    tf.jit(scaled_tanh, cache_dir=tmp_path)(x, w)
    (entry,) = [f for folder in (tmp_path / "entries").iterdir() for f in folder.iterdir()]
    entry.write_text(entry.read_text()[:-100])
    again = tf.jit(scaled_tanh, cache_dir=tmp_path)
    torch.testing.assert_close(again(x, w), scaled_tanh(x, w))
    assert "skipped" in tf.cache_info(again)["disk"]


def test_entries_others_could_have_written_are_not_loaded(tmp_path):
    x, w = _inputs()
    tf.jit(scaled_tanh, cache_dir=tmp_path)(x, w)
    (folder,) = (tmp_path / "entries").iterdir()
    os.chmod(folder, 0o777)
    again = tf.jit(scaled_tanh, cache_dir=tmp_path)
    with pytest.warns(UserWarning, match="not loading compiled entries.*writable by group and others"):
        torch.testing.assert_close(again(x, w), scaled_tanh(x, w))
    assert tf.cache_info(again)["disk"] != "loaded from cache_dir"


def test_without_cache_dir_nothing_is_written_or_read(tmp_path, monkeypatch):
    monkeypatch.delenv("THUNDERFN_CACHE_DIR", raising=False)
    x, w = _inputs()
    fn = tf.jit(scaled_tanh)
    fn(x, w)
    assert tf.cache_info(fn)["disk"] is None


_TRAINING = textwrap.dedent("""
    import json, sys, warnings
    import torch, transformers
    import thunderfn as tf
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                     use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).train()
    eager = transformers.GPT2LMHeadModel(config).train()
    eager.load_state_dict(model.state_dict())
    jitted = tf.jit(model, cache_dir=sys.argv[1])
    losses = []
    for m, fn in ((eager, eager), (model, jitted)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        steps = []
        for step in range(3):
            ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(step))
            loss = fn(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps.append(loss.item())
        losses.append(steps)
    split = [e for es in jitted._thunderfn_state.cache.values() for e in es][0].fn.fn
    print(json.dumps({"eager": losses[0], "jit": losses[1], "disk": tf.cache_info(jitted)["disk"],
                      "without": len(split.backward_by_absent),
                      "params": max((p - q).abs().max().item() for p, q in zip(model.parameters(),
                                                                                eager.parameters()))}))
""")


def test_a_new_process_trains_a_gpt2_from_the_entry_an_earlier_one_wrote_as_eager(tmp_path):
    pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[test]' installs it): "
                                              "this test trains a Hugging Face GPT-2 across two processes")
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _TRAINING, str(tmp_path)], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "THUNDERFN_PROGRESS": "0"})
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["disk"] is None and warm["disk"] == "loaded from cache_dir"
    for run in runs:
        torch.testing.assert_close(run["jit"], run["eager"], rtol=1e-5, atol=1e-6)
        assert run["params"] < 1e-5
    assert warm["jit"] == cold["jit"]  # the same code, bit for bit
    # the backward without the logits' gradient (the loss alone is differentiated) came along: no zeros
    assert warm["without"] == cold["without"] == 1
    with warnings.catch_warnings():  # (one file: written again in place, with that backward)
        assert len([f for d in (tmp_path / "entries").iterdir() for f in d.iterdir()]) == 1
