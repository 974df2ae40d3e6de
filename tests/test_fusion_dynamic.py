"""Fusion and kernel executors under dynamic shapes (tf.jit(..., dynamic=True), core/symbolic.py).

Inductor compiles a region with symbolic sizes once for every size (executors/inductor.py), its
ops' symbolic arguments (a reshape to (2*s0, -1)) included; a region compiles for at most
inductor.LAYOUT_LIMIT layouts, then runs unfused after one warning. Most tests replace Inductor's
compile by a counting stand-in that runs the graph as it is (`compile_graph`), so they see what
is compiled and how often without paying seconds per compile; one compiles for real.
"""
from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.executors import inductor
from thunderfn.executors.fusion import CompiledCache
from thunderfn.testing.fusion_checks import needs_inductor


def reshaping(x, w):
    """Elementwise ops, a reshape to a size computed from a symbolic one, a reduction."""
    y = torch.sin(x) * w + 1
    return torch.tanh(y.reshape(x.shape[0] * 2, -1)).sum(0) * 2


class _Compiles(list):
    """The example inputs of each compile, and (`graphs`) each compiled graph."""

    def __init__(self):
        super().__init__()
        self.graphs = []


@pytest.fixture
def compiles(monkeypatch):
    """Inductor's compile replaced by one that records its example inputs and graph and returns the graph itself."""
    calls = _Compiles()

    def compile_graph(gm, example_inputs):
        calls.append(example_inputs)
        calls.graphs.append(gm)
        return gm

    monkeypatch.setattr(inductor, "compile_graph", compile_graph)
    monkeypatch.setattr(inductor, "_compiled", CompiledCache())
    return calls


def forward_and_backward_match_eager(jitted, fn, *args):
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    expected_leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    out, expected = jitted(*leaves), fn(*expected_leaves)
    torch.testing.assert_close(out, expected)
    diff = [a for a in leaves if a.requires_grad]
    torch.testing.assert_close(torch.autograd.grad(out.sum(), diff),
                               torch.autograd.grad(expected.sum(), [a for a in expected_leaves if a.requires_grad]))


def fused_calls(trace, prefix="inductor_fusion_") -> list:
    return [b for b in trace.bound_symbols if b.sym.name.startswith(prefix)]


def test_a_region_with_a_symbolic_reshape_compiles_once_for_every_length(compiles):
    jitted = tf.jit(reshaping, fusion=True, dynamic=True)
    w = torch.randn(8)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunderfn")
        for n in (3, 5, 7):
            forward_and_backward_match_eager(jitted, reshaping, torch.randn(n, 8), w)
    assert tf.cache_info(jitted)["misses"] == 1
    assert len(compiles) == 2  # the forward's region and the backward's, each once
    forward = tf.last_traces(jitted)[-1]
    (region,) = fused_calls(forward)
    assert [b.sym.name for b in forward.bound_symbols if b.sym.name not in ("del", "python_return")] == \
        [region.sym.name]  # the reshape is inside the region, which takes the symbols it uses
    # (x's second size and w's are one after broadcasting guarded them equal: printed as one symbol)
    assert re.search(r"inductor_fusion_0\(x, w, s\d, s\d\)", str(forward)), str(forward)
    # the compile saw symbolic sizes: fake tensors whose sizes are symbols, then the symbols as ints
    assert all(isinstance(n, torch.SymInt) for n in compiles[0][0].shape)
    assert isinstance(compiles[0][-1], torch.SymInt)


def test_a_call_breaking_the_compiled_guards_compiles_again(compiles):
    """The compiled code assumes what its guards say (here: the input starts at offset 0 of its storage,
    which the jit entry does not fix): a call breaking them compiles anew rather than running it."""
    f = lambda x: (torch.cos(x) * 2).sum(-1)  # noqa: E731
    jitted = tf.jit(f, fusion=True, dynamic=True)
    for x in (torch.randn(2, 3), torch.randn(2, 5), torch.randn(3, 4)[1:], torch.randn(2, 6)):
        torch.testing.assert_close(jitted(x), f(x))
    assert tf.cache_info(jitted)["misses"] == 1
    assert len(compiles) == 2


def test_a_symbolic_region_runs_unfused_after_one_warning_past_the_layout_limit(compiles, monkeypatch):
    monkeypatch.setattr(inductor, "LAYOUT_LIMIT", 2)
    f = lambda x: torch.sin(x) * 3 + 1  # noqa: E731
    jitted = tf.jit(f, fusion=True, dynamic=True)
    layouts = [torch.randn(4, 6), torch.randn(6, 4).t(), torch.randn(4, 12)[:, ::2]]  # other strides each
    for x in layouts[:2]:
        torch.testing.assert_close(jitted(x), f(x))
    with pytest.warns(UserWarning, match=r"Inductor compiled inductor_fusion_0 for 2 input layouts already .*"
                                         r"its 3 ops run unfused for new ones"):
        torch.testing.assert_close(jitted(layouts[2]), f(layouts[2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per region
        torch.testing.assert_close(jitted(layouts[2]), f(layouts[2]))
        torch.testing.assert_close(jitted(layouts[0]), f(layouts[0]))  # (still compiled)
    assert len(compiles) == 2


def test_a_static_region_runs_unfused_after_one_warning_past_the_layout_limit(compiles, monkeypatch):
    monkeypatch.setattr(inductor, "LAYOUT_LIMIT", 2)
    f = lambda x: torch.sin(x) * 3 + 1  # noqa: E731
    jitted = tf.jit(f, executors=["inductor"], dynamic=False)
    layouts = [torch.randn(4, 4), torch.randn(4, 4).t(), torch.randn(4, 8)[:, ::2]]
    for x in layouts[:2]:
        torch.testing.assert_close(jitted(x), f(x))
    with pytest.warns(UserWarning, match=r"Inductor compiled inductor_fusion_0 for 2 input layouts already"):
        torch.testing.assert_close(jitted(layouts[2]), f(layouts[2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(jitted(layouts[2]), f(layouts[2]))
    assert len(compiles) == 2 and all(not isinstance(n, torch.SymInt) for n in compiles[0][0].shape)


@needs_inductor
def test_inductor_compiles_a_symbolic_region_once_and_matches_eager_at_every_length(monkeypatch):
    monkeypatch.setattr(inductor, "_compiled", CompiledCache())
    calls = []
    compile_graph = inductor.compile_graph
    monkeypatch.setattr(inductor, "compile_graph", lambda gm, inputs: calls.append(1) or compile_graph(gm, inputs))
    jitted = tf.jit(reshaping, fusion=True, dynamic=True)
    w = torch.randn(8)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunderfn")  # no region fell back to unfused
        for n in (3, 5, 7):
            forward_and_backward_match_eager(jitted, reshaping, torch.randn(n, 8), w)
    assert tf.cache_info(jitted)["misses"] == 1 and len(calls) == 2
    assert len(fused_calls(tf.last_traces(jitted)[-1])) == 1


# -- kernel executors: refuse or work with symbolic sizes, never crash on one --------------------------
def test_sdpa_claims_attention_with_symbolic_lengths(compiles):
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    jitted = tf.jit(attention, dynamic=True, executors=["sdpa"])
    for L in (5, 7):
        q, k, v = (torch.randn(2, 3, L, 4) for _ in range(3))
        forward_and_backward_match_eager(jitted, attention, q, k, v)
    assert tf.cache_info(jitted)["misses"] == 1
    assert "sdpa_flash_cpu_fwd(" in str(tf.last_traces(jitted)[-1])
    assert "sdpa_flash_cpu_bwd(" in str(tf.last_backward_traces(jitted)[-1])


def test_a_region_graph_holds_no_symbolic_number_of_the_trace(compiles):
    """A torch.Size argument (a view to x's shape) and a number computed from sizes (a float count) reach the
    region's graph as nodes computed from its size inputs, never as the trace's own SymInts, which Inductor's
    shape environment does not know (it failed on them: "vr must not be None")."""
    def fn(x):
        y = (x.sin() * 2).view(x.shape)
        return y / (x.shape[0] * 2.0) + y.reshape(torch.Size([x.shape[1], x.shape[0]])).t()

    jitted = tf.jit(fn, fusion=True, dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, 4)
        torch.testing.assert_close(jitted(x), fn(x))
    assert compiles.graphs
    for gm in compiles.graphs:
        for node in gm.graph.nodes:
            leaves = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
            assert not any(isinstance(v, (torch.SymInt, torch.SymFloat)) for v in leaves), node.format_node()
