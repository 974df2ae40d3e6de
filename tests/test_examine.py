"""tf.examine classifies every torch call a function makes, as tracing would treat it."""
import torch
import torch.nn.functional as F

import thunderfn as tf


def _program(x, w):
    h = F.gelu(x @ w)
    h += 1
    same = torch.allclose(h, h.T.T)
    counts = torch.histc(h, bins=4)
    if h.sum().item() > 0:
        h = h * 2
    return h, same, counts


def test_examine_classifies_symbol_opaque_in_place_unsupported_and_value_reads(capsys):
    report = tf.examine(_program, torch.randn(4, 3), torch.randn(3, 5))
    status = {c.name: c.status for c in report.calls}
    assert status["torch.nn.functional.gelu"] == "symbol"
    assert status["torch.histc"] == "opaque"
    assert status["torch.allclose"] == "unsupported"
    assert status["torch.Tensor.item"] == "needs a value"
    assert "in-place" in status.values()
    assert not report.jit_ready
    assert "torch.allclose" in str(report) and "not ready for tf.jit" in str(report)
    assert capsys.readouterr().out == ""  # examine prints nothing itself: print(report) shows it once
    print(report)
    assert capsys.readouterr().out.count("distinct torch calls") == 1
    assert repr(report) == str(report)  # what a prompt or notebook shows


def test_examine_agrees_with_jit_on_a_ready_function():
    fn = lambda x: torch.cumsum(F.softmax(x, -1), 0).sort(-1).values  # noqa: E731
    report = tf.examine(fn, torch.randn(3, 4))
    assert report.jit_ready
    torch.testing.assert_close(tf.jit(fn)(torch.ones(3, 4)), fn(torch.ones(3, 4)))


def test_examine_counts_repeated_calls_and_skips_metadata():
    def fn(x):
        for _ in range(3):
            x = torch.sin(x)
        return x.shape[0] * x
    report = tf.examine(fn, torch.randn(2))
    sin = next(c for c in report.calls if c.name == "torch.sin")
    assert sin.count == 3
    assert not any("shape" in c.name for c in report.calls)


def _stores_into_its_argument(xs):
    xs.append(torch.sin(xs[0]))  # every call is a symbol, but jit refuses the append
    return xs[0] * 2


def test_the_verdict_is_what_tracing_does_not_what_the_table_guesses():
    report = tf.examine(_stores_into_its_argument, [torch.randn(3)])
    assert not report.by_status("unsupported") and not report.by_status("needs a value")
    assert not report.jit_ready and report.trace_error.startswith("UnsupportedOpError: '_stores_into_its_argument' "
                                                                  "changed a container it was passed")


def test_examine_predicts_jit_for_modules_that_jit_traces():
    mha = torch.nn.MultiheadAttention(8, 2)
    q, mask = torch.randn(3, 2, 8), torch.zeros(3, 3)
    assert tf.examine(mha, q, q, q, attn_mask=mask).jit_ready
    torch.testing.assert_close(tf.jit(mha)(q, q, q, attn_mask=mask), mha(q, q, q, attn_mask=mask))
    lstm = torch.nn.LSTM(4, 4)
    x = torch.randn(3, 2, 4)
    assert tf.examine(lstm, x).jit_ready
    torch.testing.assert_close(tf.jit(lstm)(x), lstm(x))
