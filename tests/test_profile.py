"""tf.profile: each operation's and fusion region's time, forward and backward, by executor, from a
compile of its own (the jitted function's cache and the parameters' .grad are left as they were)."""
import re

import pytest
import torch

import thunderfn as tf
from test_nvfuser import standin_frontend  # fusion regions without compiling any
from test_visualize import _groups, _node_id, _sections, _texts
from thunderfn.examples.gpt import make_example
from thunderfn.executors.nvfuser import NvFuserExecutor
from thunderfn.profile import Profile, Row


@pytest.fixture(scope="module")
def profiled():
    ex = NvFuserExecutor(frontend=standin_frontend(), device_type="cpu")
    model, x, y = make_example()
    jitted = tf.jit(model, executors=[ex, *tf.executors.get_default_executors()])
    jitted(x, y)
    before = tf.cache_info(jitted)
    report = tf.profile(jitted, x, y, calls=3, warmup=1)
    return jitted, model, before, report


def test_every_operation_and_region_of_both_traces_has_a_time(profiled):
    _, _, _, report = profiled
    for title in ("forward", "backward"):
        trc = report.traces[title]
        timed = {r.index: r for r in report.rows if r.trace == title}
        computing = [k for k, b in enumerate(trc.bound_symbols) if b.sym.id != "python.del"]
        assert sorted(timed) == computing
        for k in computing:
            b, row = trc.bound_symbols[k], timed[k]
            assert row.name == b.sym.name and row.ms >= 0
            if b.sym.name.startswith("nvfuser_fusion_"):
                assert row.executor == "nvfuser" and row.ops == len(b.subsymbols) > 1
    by_executor = report.by_executor()
    assert {"nvfuser", "torch"} <= set(by_executor)
    assert sum(f + b for f, b in by_executor.values()) == pytest.approx(sum(r.ms for r in report.rows))
    assert report.step_ms > 0 and report.eager_ms > 0
    assert "executor" in str(report) and "nvfuser_fusion_" in str(report)


def test_the_jitted_function_and_the_parameters_are_left_alone(profiled):
    jitted, model, before, _ = profiled
    after = tf.cache_info(jitted)
    assert after["entries"] == before["entries"] and after["misses"] == before["misses"]
    assert all(p.grad is None for p in model.parameters())
    assert "profile_tick" not in str(tf.last_traces(jitted)[-1])


def test_visualize_writes_the_times_into_the_picture(profiled, tmp_path):
    jitted, _, _, report = profiled
    page = open(tf.visualize(jitted, tmp_path / "p.html", layout="grandalf", profile=report)).read()
    sections = _sections(page)
    for title in ("forward", "backward"):
        clusters = [" ".join(_texts(g)) for g in _groups(sections[title], "cluster")]
        assert clusters and all(re.search(r"\(nvfuser\), \d+\.\d{3} ms$", c) for c in clusters)
        unfused = [_texts(g) for g in _groups(sections[title], "op") if "_" not in _node_id(g)]  # op{k}, not op{k}_{j}
        assert unfused and all(re.fullmatch(r"\d+\.\d{3} ms", texts[-1]) for texts in unfused)


def test_the_table_shows_long_names_whole_and_in_line():
    # a name cut to the column's width could read as another op (inductor_fusion_1 as ..._12)
    long_name, long_executor = "inductor_fusion_12_of_a_model_with_many_regions_and_a_long_name", "executor_" * 4
    rows = [Row("forward", 0, long_name, long_executor, 7, 2.5),
            Row("backward", 1, "ltorch.add", "torch", 1, 0.25)]
    table = str(Profile("f", 3, rows, 3.0, 4.0, {}))
    assert f" {long_name} " in table and f" {long_executor} " in table
    lines = table.splitlines()
    header = next(line for line in lines if "operation or region" in line)
    timed = [line for line in lines if line.startswith(("forward ", "backward "))]
    assert len(timed) == 2 and all(len(line) == len(header) for line in timed)  # the columns line up
    assert lines[0].endswith("(0.75x eager's time)")


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="a function or module returned by tf.jit"):
        tf.profile(torch.sin, torch.ones(2))
    with pytest.raises(ValueError, match="calls must be a positive int"):
        tf.profile(tf.jit(torch.sin), torch.ones(2), calls=0)
