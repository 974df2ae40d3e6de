"""Real models train through torch.compile(model, backend="thunderfn") exactly as eager: the same loss and
every parameter's gradient (and batch norm's running statistics) over two SGD steps, for a transformer,
a CNN and two mixtures of experts, whose routers index by torch.where(mask), which tf.jit alone cannot
trace: there Dynamo ends the graph, or, with capture_dynamic_output_shape_ops, thunderfn splits it and
runs those nodes eagerly. The models are benchmarks/bench_models.py's, skipped only where their library
is not installed."""
import copy
import os
import sys

import pytest
import torch
import torch._dynamo

import thunderfn as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import bench_models  # noqa: E402  (a script directory, not a package)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo's caches and automatic-dynamic records are per code object: models that share library code
    (Hugging Face's forward decorators) would otherwise see each other's shapes and recompile dynamically."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _build(name):
    why = bench_models.why_unavailable(bench_models.MODELS[name][0])  # imports torchvision as the benchmark does
    if why is not None:
        pytest.skip(why)
    torch.manual_seed(bench_models.SEED)
    model, loss_of = bench_models.MODELS[name][1]()
    return model.train(), loss_of


def _trains_as_eager(name, steps=2, backend="thunderfn"):
    """Two SGD steps, eager and compiled from the same weights: equal losses, gradients, buffers. Returns
    the compiled model."""
    base, loss_of = _build(name)
    eager, compiled = copy.deepcopy(base), torch.compile(copy.deepcopy(base), backend=backend)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled)]
    for _ in range(steps):
        losses = [bench_models.step(m, loss_of) for m in (eager, compiled)]
        torch.testing.assert_close(losses[1], losses[0])
        for (where, want), got in zip(eager.named_parameters(), compiled.parameters()):
            assert (got.grad is None) == (want.grad is None), where
            if want.grad is not None:
                torch.testing.assert_close(got.grad, want.grad, atol=1e-5, rtol=1e-4, msg=where)
        for (where, want), got in zip(eager.named_buffers(), compiled.buffers()):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=where)
        for o in optimizers:
            o.step()
    return compiled


def test_a_graph_that_concatenates_onto_a_tensor_it_creates_stays_whole():
    """FX passes a node's list argument as its immutable_list: the real tensor in torch.cat([torch.tensor([]),
    x]) (Hugging Face's key/value cache, on its first layer) is read as a constant, not refused."""
    def grow(x):
        return torch.cat([torch.tensor([], dtype=x.dtype, device=x.device), x], dim=-2) * 2

    x = torch.randn(2, 3, 4, requires_grad=True)
    compiled = torch.compile(grow, backend="thunderfn")
    torch.testing.assert_close(compiled(x), grow(x))
    assert tf.dynamo.explain(compiled).splits == []


def test_a_configured_backend_is_deep_copied_as_itself():
    """Lightning (which litgpt imports) replaces torch.compile by a wrapper that deep-copies its keyword
    arguments: a backend made by tf.dynamo.backend is copied as the same object, its report shared."""
    backend = tf.dynamo.backend(fusion=True)
    assert copy.deepcopy({"backend": backend})["backend"] is backend


def test_gpt2_trains_through_the_backend_as_eager_with_every_node_taken():
    explanation = tf.dynamo.explain(_trains_as_eager("hf-gpt2"))
    assert explanation.splits == [], str(explanation)
    assert explanation.thunderfn_functions


def test_a_timm_resnet_trains_through_the_backend_as_eager_in_one_graph():
    explanation = tf.dynamo.explain(_trains_as_eager("timm-resnet18"))
    assert (len(explanation.graphs), explanation.graph_breaks, explanation.splits) == (1, [], []), str(explanation)


@pytest.mark.parametrize("name", ["litgpt-llama-moe", "hf-mixtral"])
def test_a_mixture_of_experts_trains_through_the_backend_as_eager_with_a_graph_break_at_its_router(name):
    """Dynamo ends a graph at the data-dependent indexing and thunderfn compiles the graphs around it. (tf.jit
    alone refuses Mixtral, whose Python loops over the experts hit: bench_models.JIT_REFUSES; litgpt's
    trains under tf.jit: tests/test_data_dependent.py.)"""
    if name in bench_models.JIT_REFUSES:
        with pytest.raises(getattr(tf, bench_models.JIT_REFUSES[name])):
            base, loss_of = _build(name)
            bench_models.step(tf.jit(base), loss_of)
    explanation = tf.dynamo.explain(_trains_as_eager(name))
    assert any("Dynamic shape operator" in b for b in explanation.graph_breaks), str(explanation)
    assert explanation.splits == [] and explanation.thunderfn_functions, str(explanation)


def test_a_mixture_of_experts_captured_whole_is_one_thunderfn_piece_and_trains_as_eager():
    """With capture_dynamic_output_shape_ops Dynamo keeps torch.where(mask) in the graph, its lengths unbacked
    sizes; thunderfn traces them as data-dependent sizes of its own (core/symbolic.py), so the whole graph,
    each expert's output added into y[token_idx] in place, is one thunderfn piece."""
    # (config.patch, not monkeypatch: undoing a setattr on Dynamo's config module deletes the option)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        explanation = tf.dynamo.explain(_trains_as_eager("litgpt-llama-moe"))
    assert (len(explanation.graphs), explanation.graph_breaks, explanation.splits) == (1, [], []), str(explanation)
