"""tf.examine classifies every torch call a function makes, as tracing would treat it."""
import torch
import torch.nn.functional as F

import thunderfn as tf


def _program(x, w):
    h = F.gelu(x @ w)
    h += 1
    positive = torch.nonzero(h > 0)
    counts = torch.histc(h, bins=4)
    if h.sum().item() > 0:
        h = h * 2
    return h, positive, counts


def test_examine_classifies_symbol_opaque_in_place_unsupported_and_value_reads(capsys):
    report = tf.examine(_program, torch.randn(4, 3), torch.randn(3, 5))
    status = {c.name: c.status for c in report.calls}
    assert status["torch.nn.functional.gelu"] == "symbol"
    assert status["torch.histc"] == "opaque"
    assert status["torch.nonzero"] == "unsupported"
    assert status["torch.Tensor.item"] == "needs a value"
    assert "in-place" in status.values()
    assert not report.jit_ready
    printed = capsys.readouterr().out
    assert "torch.nonzero" in printed and "not ready for tf.jit" in printed


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
