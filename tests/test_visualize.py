"""tf.visualize: the page of a compile shows every op that runs, coloured by its executor,
fusion regions as groups, and what the forward saves for the backward."""
import re
import shutil
import sys
import xml.etree.ElementTree as ET

import pytest
import torch

import thunderfn as tf
from test_nvfuser import standin_frontend  # the nvFuser stand-in: fusion regions without compiling any
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves
from thunderfn.examples.gpt import make_example
from thunderfn.executors.nvfuser import NvFuserExecutor
from thunderfn.visualize import EXECUTOR_COLORS, tensor_bytes

SVG = "{http://www.w3.org/2000/svg}"
LAYOUTS = ["grandalf", pytest.param("graphviz", marks=pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)"))]


def _sections(page: str) -> dict:
    """{section title: the parsed <svg> of its graph}"""
    found = re.findall(r'<section id="(\w+)">.*?(<svg.*?</svg>)', page, re.S)
    return {title: ET.fromstring(svg) for title, svg in found}


def _groups(svg, kind: str) -> list:
    return [g for g in svg.iter(f"{SVG}g") if kind in g.get("class", "").split()]


def _texts(g) -> list:
    return [t.text for t in g.iter(f"{SVG}text")]


def _node_id(g) -> str:
    title = g.find(f"{SVG}title")  # Graphviz names a node in its <title>; our grandalf drawing in its id
    return title.text if title is not None and g.get("id", "").startswith("node") else g.get("id")


def _fill(g) -> str:
    return next(e.get("fill") for e in g.iter() if e.get("fill") not in (None, "none"))


@pytest.fixture(scope="module")
def trained_gpt():
    """The demo's GPT block, one training step, with the nvFuser stand-in claiming regions."""
    ex = NvFuserExecutor(frontend=standin_frontend(), device_type="cpu")
    model, x, y = make_example()
    jitted = tf.jit(model, executors=[ex, *tf.executors.get_default_executors()])
    _, loss = jitted(x, y)
    loss.backward()
    return jitted


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_demo_gpt_page_shows_ops_executors_regions_and_saved_tensors(trained_gpt, layout, tmp_path):
    path = tf.visualize(trained_gpt, tmp_path / "gpt.html", layout=layout)
    sections = _sections(open(path).read())
    assert set(sections) == {"forward", "backward"}
    traces = {"forward": tf.last_traces(trained_gpt)[-1], "backward": tf.last_backward_traces(trained_gpt)[-1]}
    for title, trc in traces.items():
        svg = sections[title]
        drawn = {_node_id(g): (_texts(g)[0], _fill(g)) for g in _groups(svg, "op")}
        regions = [b for b in trc.bound_symbols if b.sym.name.startswith("nvfuser_fusion_")]
        assert regions, "the stand-in claimed no region: nothing to check"
        # one group per region, labelled with its executor
        clusters = [" ".join(_texts(g)) for g in _groups(svg, "cluster")]
        assert sorted(clusters) == sorted(f"{b.sym.name} (nvfuser)" for b in regions)
        # every op that runs is drawn once, in its executor's colour; a fused op in its region's
        expected = {}
        for k, b in enumerate(trc.bound_symbols):
            if b in regions:
                expected.update({f"op{k}_{j}": (op.sym.name, EXECUTOR_COLORS["nvfuser"])
                                 for j, op in enumerate(b.subsymbols)})
            elif b.sym.id != "python.del":
                expected[f"op{k}"] = (b.sym.name, EXECUTOR_COLORS[b.sym.executor.name])
        assert drawn == expected
    # the forward's saved tensors (what the backward reads, inputs aside) with their bytes
    fwd, bwd = traces["forward"], traces["backward"]
    inputs = {a.name for a in fwd.args}
    saved = [p for p in tree_leaves(fwd.output[1]) if isinstance(p, TensorProxy)
             and p.name in {a.name for a in bwd.args} and p.name not in inputs]
    page = open(path).read()
    table = re.search(r'<table class="saved">(.*?)</table>', page, re.S).group(1)
    assert sorted(re.findall(r"<tr><td>(t\d+)</td>", table)) == sorted(p.name for p in saved)
    total = sum(tensor_bytes(p) for p in saved)
    assert f"{len(saved)} tensors, {total / 1024:.1f} KiB" in page


def test_a_trace_is_drawn_alone(tmp_path):
    trc = tf.trace(lambda x: torch.tanh(x) * 2, torch.randn(3))
    page = open(tf.visualize(trc, tmp_path / "t.html", layout="grandalf")).read()
    svg = _sections(page)["trace"]
    assert [_texts(g)[0] for g in _groups(svg, "op")] == [b.sym.name for b in trc.bound_symbols]


def test_errors_say_what_to_do(tmp_path):
    f = tf.jit(torch.sin)
    with pytest.raises(tf.errors.NoTraceError, match="has not been called yet"):
        tf.visualize(f, tmp_path / "f.html")
    f(torch.randn(2))
    with pytest.raises(ValueError, match="layout must be"):
        tf.visualize(f, tmp_path / "f.html", layout="neato")
    with pytest.raises(TypeError, match="a function from tf.jit or a Trace"):
        tf.visualize(3, tmp_path / "f.html")


def test_without_a_layout_engine_the_error_names_what_to_install(monkeypatch, tmp_path):
    # the README's install (`pip install -e .`) has neither engine; the error must say how to get one
    # the module by its name: the attribute thunderfn.visualize is the function tf.visualize
    monkeypatch.setattr(sys.modules["thunderfn.visualize"], "_Sugiyama", None)  # grandalf not installed
    monkeypatch.setattr(shutil, "which", lambda name: None)  # nor Graphviz's dot
    f = tf.jit(lambda x: torch.tanh(x) * 2)
    f(torch.randn(3))
    with pytest.raises(tf.errors.UnsupportedOpError, match=r"needs a layout engine") as raised:
        tf.visualize(f, tmp_path / "f.html")
    assert "pip install -e '.[visualize]'" in str(raised.value) and "apt-get install graphviz" in str(raised.value)
    with pytest.raises(tf.errors.UnsupportedOpError, match=r"layout='grandalf' needs grandalf.*\.\[visualize\]"):
        tf.visualize(f, tmp_path / "f.html", layout="grandalf")
    with pytest.raises(tf.errors.UnsupportedOpError, match="layout='graphviz' needs Graphviz's `dot`.*apt-get"):
        tf.visualize(f, tmp_path / "f.html", layout="graphviz")
    assert not (tmp_path / "f.html").exists()
