"""torch's OpInfo and ModuleInfo databases through `torch.compile(fn, backend="thunderfn")`: a sample
of op_db ops (float32 forward and gradients) and of module_db modules (training and eval mode:
outputs, gradients of inputs and parameters, buffers) matches eager, checked by the harnesses that
benchmarks/opdb_dynamo_coverage.py and benchmarks/moduledb_dynamo_coverage.py run over the whole
databases, and thunderfn runs every node Dynamo hands the backend (nothing split out to run eagerly,
which would match eager without testing thunderfn); then the backend's fixes those runs led to."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf

pytest.importorskip("expecttest", reason="torch's OpInfo test helpers import expecttest (the test extra installs it)")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_modules import module_db  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import moduledb_coverage  # noqa: E402  (a script directory, not a package)
from harness import ThunderfnBackend, entry_name  # noqa: E402
from opdb_dynamo_coverage import forward_entry, grad_entry  # noqa: E402

OPS = {entry_name(o): o for o in op_db}
MODULES = {m.name: m for m in module_db}

# Elementwise, reductions, views, indexing, matmuls, normalization, losses, convolution, and the ops that
# take lists of tensors (FX hands those over as its immutable lists).
SAMPLE_OPS = [
    "sin", "exp", "add", "mul", "div.no_rounding_mode", "pow", "where", "clamp", "sigmoid",
    "sum", "mean", "amax", "cumsum", "logcumsumexp", "var", "softmax", "log_softmax",
    "reshape", "transpose", "permute", "expand", "split", "index_select", "gather",
    "matmul", "addmm", "nn.functional.linear", "nn.functional.gelu", "nn.functional.layer_norm",
    "nn.functional.cross_entropy", "nn.functional.conv2d", "nn.functional.max_pool2d",
    "cat", "stack", "einsum", "meshgrid.list_of_tensors", "column_stack", "linalg.multi_dot",
]
SAMPLE_MODULES = ["nn.Linear", "nn.Conv2d", "nn.BatchNorm2d", "nn.LayerNorm", "nn.TransformerEncoderLayer",
                  "nn.CrossEntropyLoss", "nn.Embedding"]


@pytest.fixture
def backend():
    compiled = ThunderfnBackend()
    compiled.clear()
    yield compiled
    torch._dynamo.reset()


@pytest.mark.parametrize("name", SAMPLE_OPS)
def test_op_db_forward_and_gradients_through_the_backend_match_eager(name, backend):
    opinfo = OPS[name]
    status, detail = forward_entry(opinfo, 2, backend)
    assert status == "pass", detail
    if opinfo.supports_autograd:
        status, detail = grad_entry(opinfo, 2, backend)
        assert status == "pass", detail
    assert backend.ran_elsewhere() == []


@pytest.mark.parametrize("name", SAMPLE_MODULES)
def test_module_db_trains_through_the_backend_like_eager_in_training_and_eval_mode(name, backend):
    assert moduledb_coverage.run_entry(MODULES[name], 2, compile=backend.compile) == ("pass", "")
    assert backend.ran_elsewhere() == []


def test_batch_norm_of_an_empty_batch_through_the_backend_is_eagers(backend):
    """module_db's BatchNorm inputs include an empty batch (eager's batch_norm then computes no statistics)."""
    assert moduledb_coverage.run_entry(MODULES["nn.BatchNorm1d"], 100, compile=backend.compile) == ("pass", "")


def test_a_list_of_tensors_in_a_dynamo_graph_reaches_thunderfn_as_its_tensors():
    """FX passes torch.cat's list as an immutable_list: the trace must see the tensors in it, not keep the
    list as an opaque constant (which held the trace's stand-ins and failed when the graph ran)."""
    backend = tf.dynamo.backend()
    torch._dynamo.reset()
    compiled = torch.compile(lambda xs, w: F.linear(torch.cat(xs, 0), w) + torch.stack(xs).sum(0)[:1], backend=backend)
    xs = [torch.randn(2, 3, requires_grad=True) for _ in range(2)]
    w = torch.randn(3, 3, requires_grad=True)
    out = compiled(xs, w)
    expected = F.linear(torch.cat(xs, 0), w) + torch.stack(xs).sum(0)[:1]
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), [*xs, w])
    torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), [*xs, w]))
    explanation = tf.dynamo.explain(backend)
    assert explanation.splits == [] and len(explanation.thunderfn_functions) == 1
    torch._dynamo.reset()


def test_floats_dynamo_passes_as_tensors_are_read_in_one_eager_piece_before_thunderfns():
    """Under dynamic shapes Dynamo passes a Python float as a 0-dim tensor read back with .item() where it is
    used; thunderfn cannot read a value while tracing, so the reads run eagerly: all of them first, then one
    thunderfn piece (split where they stood, they cut the graph into a piece per use)."""
    backend = tf.dynamo.backend()
    torch._dynamo.reset()

    def f(x, a, b):
        return (x * a).sin() * b + a

    compiled = torch.compile(f, backend=backend, dynamic=True)
    for a, b in [(0.5, 2.0), (1.5, -3.0)]:
        x = torch.randn(4, 3, requires_grad=True)
        out, expected = compiled(x, a, b), f(x, a, b)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), x), torch.autograd.grad(expected.sum(), x))
    (graph,) = tf.dynamo.explain(backend).graphs
    assert [p.runner for p in graph.pieces] == ["eager", "thunderfn"]
    assert {u.target for u in graph.splits} == {"Tensor.item"}
    torch._dynamo.reset()
