"""What a user sees of a compile: progress on stderr when it runs long (core/progress.py),
and where its artifacts go (core/artifacts.py; whether that is safe: tests/test_artifacts.py)."""
import os
import time

import pytest
import torch

import thunderfn as tf
from thunderfn.core import progress


def _slow_to_trace(x):
    time.sleep(0.3)  # runs while tracing: a compile that takes long
    return x.sin() * 2


def test_a_long_compile_reports_its_stages_and_their_times_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(progress, "THRESHOLD_S", 0.1)
    tf.jit(_slow_to_trace)(torch.randn(3))
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("thunderfn: compiling '_slow_to_trace' (0.1 s so far): tracing")
    assert any("lowering onto executors, code generation" in line for line in err)
    assert err[-1].startswith("thunderfn: compiled '_slow_to_trace' in ") and "tracing 0.3 s" in err[-1]


def test_a_short_compile_prints_nothing_and_progress_can_be_silenced(monkeypatch, capsys):
    tf.jit(lambda x: x + 1)(torch.randn(3))
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "THRESHOLD_S", 0.1)
    monkeypatch.setenv("THUNDERFN_PROGRESS", "0")
    tf.jit(_slow_to_trace)(torch.randn(3))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("how", ["option", "environment"])
def test_cache_dir_holds_each_compiled_traces_source_and_tracebacks_point_there(tmp_path, monkeypatch, how):
    def divides(x, y):
        return torch.div(x, y, rounding_mode="floor")

    if how == "environment":
        monkeypatch.setenv("THUNDERFN_CACHE_DIR", str(tmp_path))
        jf = tf.jit(divides)
    else:
        jf = tf.jit(divides, cache_dir=tmp_path)
    jf(torch.ones(3), torch.full((3,), 2.0))
    (private,) = [p for p in tmp_path.iterdir() if p.name.startswith("thunderfn-")]
    written = sorted(os.listdir(private))
    assert len(written) == 1 and written[0].startswith("computation_")
    source = (private / written[0]).read_text()
    assert source == tf.last_traces(jf)[-1].python_callable().__thunderfn_source__
    with pytest.raises(RuntimeError) as caught:  # integer division by zero, raised by the (second) compiled code
        jf(torch.ones(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    files = [str(entry.path) for entry in caught.traceback]
    assert any(f.startswith(str(private)) for f in files)
