"""What a user sees of a compile: progress on stderr when it runs long (core/progress.py),
and where its artifacts go (core/artifacts.py; whether that is safe: tests/test_artifacts.py)."""
import os
import re
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
    monkeypatch.delenv("THUNDERFN_PROGRESS", raising=False)  # (reported even where the run silences it)
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


class _CompilesOnFirstCall(tf.executors.FusionExecutor):
    """Inductor's way, without Inductor's seconds: each region compiles (sleeps) on its first call, reported as
    Inductor reports it, and records how long that took (seconds, in `spent`, in the order they ran)."""

    def __init__(self):
        super().__init__("compiles_on_first_call")
        self.spent: list[float] = []

    def can_fuse(self, bsym):
        return True

    def compile_region(self, region):
        compiled = []

        def call(*args):
            if not compiled:
                start = time.perf_counter()
                with progress.compiling_region(region.name, f"compiling {region.name}"):
                    time.sleep(0.2)
                compiled.append(True)
                self.spent.append(time.perf_counter() - start)
            return region.unfused(*args)
        return call


def _figure(x: float) -> float:
    return float(f"{x:.1f}")  # as the lines print it (rounding keeps a >= between two figures)


def test_a_training_steps_line_counts_its_backwards_first_run_where_its_regions_compile(monkeypatch, capsys):
    monkeypatch.setattr(progress, "THRESHOLD_S", 0.1)
    monkeypatch.delenv("THUNDERFN_PROGRESS", raising=False)  # (reported even where the run silences it)
    ex = _CompilesOnFirstCall()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    jm = tf.jit(model, executors=[ex])
    loss = jm(torch.randn(2, 4)).sum()
    n_forward = len(ex.spent)
    forward = capsys.readouterr().err.splitlines()
    loss.backward()
    backward = capsys.readouterr().err.splitlines()
    compiled_in_backward = sum(ex.spent[n_forward:])
    assert n_forward >= 1 and len(ex.spent) > n_forward  # (the backward has regions of its own, compiled now)
    assert forward[-1].startswith("thunderfn: compiled 'Sequential.forward' in ")
    assert forward[-1].endswith("; the backward's first run is reported when it comes")
    forward_total = float(re.match(r"thunderfn: compiled 'Sequential.forward' in ([\d.]+) s", forward[-1])[1])
    assert backward[0].startswith("thunderfn: compiling the backward of 'Sequential.forward' (")
    done = re.fullmatch(r"thunderfn: compiled the backward of 'Sequential.forward' in ([\d.]+) s: (.*) "
                        r"\(first step ([\d.]+) s since 'Sequential.forward' began compiling\)", backward[-1])
    assert done is not None, backward[-1]
    total, stages, first_step = float(done[1]), done[2], float(done[3])
    assert stages.startswith("the backward's first run ") and "compiling compiles_on_first_call_fusion" in stages
    assert total >= _figure(compiled_in_backward)
    assert first_step >= max(forward_total, total)
    n_compiled = len(ex.spent)
    jm(torch.randn(2, 4)).sum().backward()  # all compiled: the next step compiles nothing and says nothing
    assert capsys.readouterr().err == "" and len(ex.spent) == n_compiled


def test_a_backward_made_later_for_outputs_without_gradients_reports_its_compile(monkeypatch, capsys):
    def two(x):
        return x.sin() * 2, x.cos() * 3

    monkeypatch.setattr(progress, "THRESHOLD_S", 0.1)
    monkeypatch.delenv("THUNDERFN_PROGRESS", raising=False)  # (reported even where the run silences it)
    jf = tf.jit(two, executors=[_CompilesOnFirstCall()])
    x = torch.randn(3, requires_grad=True)
    a, b = jf(x)
    (a.sum() + b.sum()).backward()
    capsys.readouterr()
    a, b = jf(x)
    a.sum().backward()  # b gets no gradient: a backward without its part, made and run (its regions compiled) now
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("thunderfn: compiled the backward of 'two' for outputs without gradients in ")
    assert "compiling compiles_on_first_call_fusion" in err[-1] and "first step" not in err[-1]


def test_a_short_training_step_prints_nothing(monkeypatch, capsys):
    monkeypatch.delenv("THUNDERFN_PROGRESS", raising=False)
    x = torch.randn(3, requires_grad=True)
    tf.jit(lambda x: x.sin() * 2)(x).sum().backward()
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
