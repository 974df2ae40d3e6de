"""The nvfuser fusion executor (executors/nvfuser.py), against a stand-in for nvFuser's frontend.

nvFuser needs CUDA and has no wheel for this torch (docs/executors.md), so the executor is
given thunderfn.testing.nvfuser_standin, a torch implementation of the frontend calls it
makes, and told to fuse CPU tensors (`device_type="cpu"`, meaningful only with a stand-in).
What is checked: the regions nvFuser gets and the definitions built for them (which ops,
built once per input layout), values, dtypes and gradients against eager, the split at an
op without translation, the fallback when a definition fails, and why the real executor
cannot load here. The OpInfo sweep at the end puts every op's decomposition through the
stand-in and compares it with the same decomposition unfused.
"""
from __future__ import annotations

import contextlib
import importlib.util
import types
import warnings
import zlib

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.executors import nvfuser
from thunderfn.executors.nvfuser import NvFuserExecutor
from thunderfn.testing import nvfuser_standin
from thunderfn.testing.fusion_checks import assert_falls_back_once, assert_training_step_matches_eager
from thunderfn.testing.opinfos import op_db

HAS_NVFUSER = any(importlib.util.find_spec(m) is not None for m in ("nvfuser_direct", "nvfuser"))


def standin_frontend(fusion_definition=nvfuser_standin.FusionDefinition):
    """The stand-in frontend as a module of its own, which records every FusionDefinition built."""
    module = types.ModuleType("nvfuser_standin_frontend")
    module.DataType = nvfuser_standin.DataType
    module.compute_tensor_descriptor = nvfuser_standin.compute_tensor_descriptor
    module.built = []

    class FusionDefinition(fusion_definition):
        def __init__(self):
            super().__init__()
            module.built.append(self)

    module.FusionDefinition = FusionDefinition
    return module


@pytest.fixture(autouse=True)
def fresh_definition_cache(monkeypatch):
    """Definitions are shared process-wide; each test counts the ones it builds itself."""
    monkeypatch.setattr(nvfuser, "_definitions", nvfuser.CompiledCache())


@pytest.fixture
def frontend():
    return standin_frontend()


@pytest.fixture
def ex(frontend):
    return NvFuserExecutor(frontend=frontend, device_type="cpu")


def fused_calls(trace) -> list:
    return [b for b in trace.bound_symbols if b.sym.name.startswith("nvfuser_fusion_")]


def short(bsym) -> str:
    """The op's name (`exp` also for `torch.Tensor.exp_`, the torch executor writing into a dead value)."""
    name = bsym.sym.name.rpartition(".")[2]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


@contextlib.contextmanager
def no_fallback():
    """The executor's fallback warning as an error: a test that expects nvFuser to run its
    regions fails if one ran unfused instead."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunderfn: nvFuser")
        yield


def norm_and_gate(x, w, b):
    """Elementwise ops, broadcasts (w and b over rows), reductions with keepdim, numbers."""
    h = x * w + b
    centered = h - h.mean(-1, keepdim=True)
    return F.gelu(centered) * torch.sigmoid(x) / (centered.abs().amax(-1, keepdim=True) + 1.5)


def test_a_region_of_elementwise_broadcast_and_reduction_ops_matches_eager_forward_and_backward(ex, frontend):
    torch.manual_seed(0)
    args = (torch.randn(5, 8, requires_grad=True), torch.randn(8, requires_grad=True), torch.randn(8))
    jf = tf.jit(norm_and_gate, executors=[ex])
    with no_fallback():
        out = jf(*args)
        out.square().sum().backward()
    grads = [a.grad for a in args[:2]]
    for a in args[:2]:
        a.grad = None
    expected = norm_and_gate(*args)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(grads, [a.grad for a in args[:2]])
    # forward and backward each ran as nvFuser definitions, and those hold the fused ops
    assert fused_calls(tf.last_traces(jf)[-1]) and fused_calls(tf.last_backward_traces(jf)[-1])
    ops = [name for fd in frontend.built for name in fd.op_names]
    for op in ("mul", "add", "sub", "erf", "sum", "max", "broadcast_in_dim", "div", "reciprocal", "exp"):
        assert op in ops, (op, ops)
    assert all(fd.executions == 1 for fd in frontend.built)


def test_the_execution_trace_shows_one_nvfuser_call_with_the_fused_ops(ex, frontend):
    f = lambda x, w: (torch.tanh(x * w) + 1).sum(0)  # noqa: E731
    jf = tf.jit(f, executors=[ex])
    x, w = torch.randn(4, 3), torch.randn(3)
    with no_fallback():
        torch.testing.assert_close(jf(x, w), f(x, w))
    execution = tf.last_traces(jf)[-1]
    assert [short(b) for b in execution.bound_symbols if b.sym.name != "del"] == ["nvfuser_fusion_0"]
    [call] = fused_calls(execution)
    assert [short(s) for s in call.subsymbols] == ["mul", "tanh", "add", "sum"]
    text = str(execution)
    assert "(t4,) = nvfuser_fusion_0(x, w)" in text
    assert "    # t2 = torch.tanh(t1)" in text  # the fused ops, as comments
    [fd] = frontend.built
    assert nvfuser.definitions(execution) == {"nvfuser_fusion_0": [fd]}
    # the prims of those ops: mul broadcasts w; the number 1 is an int64 scalar, its sum cast back to float
    assert fd.op_names == ["broadcast_in_dim", "mul", "tanh", "add", "cast", "sum"]
    assert "T2 = fd.ops.broadcast_in_dim(T1, [4, 3], [1])" in repr(fd)
    assert "T6 = fd.ops.cast(T5, DataType.Float)" in repr(fd) and "fd.add_output(T7)" in repr(fd)


def test_a_definition_is_built_once_per_input_layout(ex, frontend):
    f = lambda x, y: torch.exp(x) * y - x  # noqa: E731
    jf = tf.jit(f, executors=[ex])
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with no_fallback():
        torch.testing.assert_close(jf(x, y), f(x, y))
        x2, y2 = torch.randn(3, 4), torch.randn(3, 4)
        torch.testing.assert_close(jf(x2, y2), f(x2, y2))
        assert len(frontend.built) == 1 and frontend.built[0].executions == 2  # same layout: built once
        xt = torch.randn(4, 3).t()  # the same shape, the other stride order
        torch.testing.assert_close(jf(xt, y), f(xt, y))
    assert len(frontend.built) == 2
    first, second = (fd.inputs[0] for fd in frontend.built)  # x's define_tensor in each
    assert first[4] == (1, 0) and second[4] == (0, 1)  # stride_order, outermost first
    with no_fallback():
        torch.testing.assert_close(jf(xt, y), f(xt, y))
    assert len(frontend.built) == 2 and frontend.built[1].executions == 2


def test_an_expanded_input_is_defined_with_its_broadcast_dim(ex, frontend):
    """A stride-0 dim is no dim in memory: nvFuser is told (contiguity None) rather than handed a copy."""
    f = lambda x, y: torch.exp(x) * y  # noqa: E731
    jf = tf.jit(f, executors=[ex])
    x, y = torch.randn(3, 1).expand(3, 4), torch.randn(3, 4)
    with no_fallback():
        torch.testing.assert_close(jf(x, y), f(x, y))
    [fd] = frontend.built
    assert fd.inputs[0][1:3] == ((3, 4), (True, None))  # x's shape, contiguity


def test_a_definition_is_shared_by_regions_with_the_same_ops_and_layout(frontend):
    f = lambda x: torch.sin(x) * 2  # noqa: E731
    a = tf.jit(f, executors=[NvFuserExecutor(frontend=frontend, device_type="cpu")])
    b = tf.jit(lambda x: torch.sin(x) * 2, executors=[NvFuserExecutor(frontend=frontend, device_type="cpu")])
    x = torch.randn(6)
    with no_fallback():
        torch.testing.assert_close(a(x), f(x))
        torch.testing.assert_close(b(x), f(x))
    assert len(frontend.built) == 1


def test_a_training_step_of_a_jitted_module_matches_eager_gradients(ex):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    jitted = tf.jit(model, executors=[ex])
    with no_fallback():
        assert_training_step_matches_eager(model, jitted, torch.randn(5, 8), torch.randn(5, 4))
    assert fused_calls(tf.last_traces(jitted)[-1]) and fused_calls(tf.last_backward_traces(jitted)[-1])


def test_an_op_without_a_translation_splits_the_region(ex, frontend):
    """digamma's prim has no nvFuser rule and a matmul none either: each runs on torch between regions."""
    def f(x, w):
        a = torch.exp(x) * 2
        d = torch.digamma(a.abs() + 1)
        return (torch.sin(d) + a) @ w

    jf = tf.jit(f, executors=[ex])
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    with no_fallback():
        torch.testing.assert_close(jf(x, w), f(x, w))
    execution = tf.last_traces(jf)[-1]
    names = [short(b) for b in execution.bound_symbols if b.sym.name != "del"]
    assert names == ["nvfuser_fusion_0", "digamma", "nvfuser_fusion_1", "matmul"]
    fused = [short(s) for b in fused_calls(execution) for s in b.subsymbols]
    assert "digamma" not in fused and "matmul" not in fused
    assert not any("digamma" in fd.op_names for fd in frontend.built)


@pytest.mark.parametrize("f, x, outside", [
    (lambda x: (x * 2 + 1)[::2].exp().sin(), torch.randn(6), "__getitem__"),  # a strided slice
    (lambda x: tf.prims.sum((x * 2).exp(), (0,)) + 1, torch.randn(4, 3, dtype=torch.float16), "reduce_sum"),  # in half
    (lambda x: (x * 2).exp() + 1, torch.randn(4, dtype=torch.complex64), "exp"),  # complex
], ids=["strided_slice", "float16_sum", "complex"])
def test_calls_nvfuser_is_not_given_run_on_torch_between_regions(ex, f, x, outside):
    jf = tf.jit(f, executors=[ex])
    with no_fallback():
        torch.testing.assert_close(jf(x), f(x))
    execution = tf.last_traces(jf)[-1]
    assert outside in [short(b) for b in execution.bound_symbols]
    assert outside not in [short(s) for b in fused_calls(execution) for s in b.subsymbols]
    assert bool(fused_calls(execution)) == (not x.dtype.is_complex)


def test_a_region_of_views_alone_is_not_fused(ex, frontend):
    """Reshapes and transposes compute nothing: a definition would cost a compile and fuse nothing."""
    f = lambda x: x.reshape(3, 4).t().reshape(2, 6)  # noqa: E731
    jf = tf.jit(f, executors=[ex])
    x = torch.randn(12)
    torch.testing.assert_close(jf(x), f(x))
    assert not fused_calls(tf.last_traces(jf)[-1]) and not frontend.built


def test_dtypes_and_numbers_match_eager(ex):
    """Integer and bool reductions keep the prim's dtype (nvFuser would sum into int64), numbers
    take the tensor's dtype, true and truncating division, where with a number."""
    def f(i, m, x):
        s = (i * 3 - 1).sum(1)  # torch sums int32 into int64
        p = tf.prims.sum(i * 2, (1,))  # the prim keeps int32
        t = torch.div(i, 2, rounding_mode="trunc").amax(1) + (m & (i > 0)).sum(1)
        h = torch.where(m, x * 0.5, 2.0).to(torch.float64)
        return s, p, t, h.var(0), torch.cat([x, x.half().float()], 1).amin(1), (x / 3).pow(2)

    i = torch.randint(-5, 5, (3, 4), dtype=torch.int32)
    m, x = torch.rand(3, 4) > 0.5, torch.randn(3, 4)
    jf = tf.jit(f, executors=[ex])
    with no_fallback():
        got = jf(i, m, x)
    expected = f(i, m, x)
    torch.testing.assert_close(got, expected)
    assert [g.dtype for g in got] == [e.dtype for e in expected]
    assert fused_calls(tf.last_traces(jf)[-1])


def test_a_definition_that_fails_runs_unfused_after_one_warning():
    class Refuses(nvfuser_standin.FusionDefinition):
        def execute(self, inputs, **kwargs):
            raise RuntimeError("no kernel for this fusion\nsecond line")

    ex = NvFuserExecutor(frontend=standin_frontend(Refuses), device_type="cpu")
    bias = torch.randn(3)  # a captured tensor: an input of the region, and of its unfused function
    f = lambda x: torch.tanh(x) * torch.cos(x) + bias  # noqa: E731
    jf = tf.jit(f, executors=[ex])
    x = torch.randn(7, 3)
    assert_falls_back_once(jf, f, x, r"^thunderfn: nvFuser could not run nvfuser_fusion_0 \(RuntimeError: "
                                     r"no kernel for this fusion\); its 4 ops run unfused$")


def test_a_region_whose_definition_another_region_saw_fail_runs_unfused_too():
    """Failed definitions are cached by prims and layout, shared by regions: a second function
    with the same ops meets the failure in the cache and runs its own ops unfused."""
    class Refuses(nvfuser_standin.FusionDefinition):
        def execute(self, inputs, **kwargs):
            raise RuntimeError("no kernel for this fusion")

    ex = NvFuserExecutor(frontend=standin_frontend(Refuses), device_type="cpu")
    first, second = (lambda x: torch.tanh(x) * torch.cos(x)), (lambda y: torch.tanh(y) * torch.cos(y))
    x = torch.randn(5, 2)
    with pytest.warns(UserWarning, match="nvFuser could not run"):
        torch.testing.assert_close(tf.jit(first, executors=[ex])(x), first(x))
    torch.testing.assert_close(tf.jit(second, executors=[ex])(x), second(x))


def test_a_definition_that_fails_to_build_runs_unfused():
    """A frontend without an op the translation uses (an older nvFuser, say) fails while the
    definition is built, inside `with fd:`; the region still computes."""
    frontend = standin_frontend()

    class NoErf(nvfuser_standin.Operators):
        def __getattr__(self, name):
            if name == "erf":
                raise AttributeError("'Operators' object has no attribute 'erf'")
            return super().__getattr__(name)

    class FusionDefinition(frontend.FusionDefinition):
        def __init__(self):
            super().__init__()
            self.ops = NoErf(self)

    frontend.FusionDefinition = FusionDefinition
    jf = tf.jit(lambda x: F.gelu(x) * 2, executors=[NvFuserExecutor(frontend=frontend, device_type="cpu")])
    x = torch.randn(4)
    with pytest.warns(UserWarning, match=r"nvFuser could not run nvfuser_fusion_0 \(AttributeError: .*erf"):
        torch.testing.assert_close(jf(x), F.gelu(x) * 2)


def test_the_standin_refuses_inputs_unlike_their_definition():
    fe = nvfuser_standin
    with fe.FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[2, 3], contiguity=[True, True], dtype=fe.DataType.Float, stride_order=[1, 0])
        fd.add_output(fd.ops.exp(t0))
    x = torch.randn(2, 3)
    torch.testing.assert_close(fd.execute([x])[0], x.exp())
    wrong_dtype, wrong_rank = torch.randn(2, 3, dtype=torch.float64), torch.randn(6)
    transposed, strided = torch.randn(3, 2).t(), torch.randn(2, 6)[:, ::2]
    for bad in (wrong_dtype, wrong_rank, transposed, strided):
        with pytest.raises(RuntimeError, match="execute: input T0"):
            fd.execute([bad])
    with pytest.raises(RuntimeError, match="broadcast them first"):
        with fe.FusionDefinition() as fd2:
            a = fd2.define_tensor(shape=[2, 3], contiguity=[True, True], dtype=fe.DataType.Float)
            b = fd2.define_tensor(shape=[3], contiguity=[True], dtype=fe.DataType.Float)
            fd2.ops.add(a, b)


@pytest.mark.parametrize("sizes, strides, descriptor", [
    ((1, 2, 3), (6, 3, 1), ([None, True, True], [2, 1, 0])),  # the examples in Thunder's compute_contiguity
    ((2, 3, 4), (12, 1, 3), ([True, True, True], [2, 0, 1])),
    ((4, 3), (1, 4), ([True, True], [0, 1])),
    ((2, 3), (0, 1), ([None, True], [1, 0])),  # an expanded dim
    ((2, 6), (12, 2), ([True, False], [1, 0])),  # every other column
])
def test_the_standin_describes_layouts_as_nvfuser_does(sizes, strides, descriptor):
    assert nvfuser_standin.compute_tensor_descriptor(list(sizes), list(strides)) == descriptor


def test_availability_says_why_nvfuser_cannot_run_here(monkeypatch):
    status = tf.executors.available()["nvfuser"]
    if HAS_NVFUSER and torch.cuda.is_available():
        assert status == "available"
    elif HAS_NVFUSER:
        assert status == "unavailable: CUDA is not available (nvFuser runs on NVIDIA GPUs)"
    else:
        assert status.startswith("unavailable: nvFuser is not installed (neither nvfuser_direct nor nvfuser imports)")
        assert "pip install" in status
        with pytest.raises(RuntimeError, match="executor 'nvfuser' cannot run here: nvFuser is not installed"):
            tf.jit(lambda x: x.exp() * 2, executors=["nvfuser"])(torch.randn(2))
    # nvFuser found, but no GPU
    monkeypatch.setattr(nvfuser, "_frontend_name", lambda: "nvfuser_direct")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert nvfuser._availability() == (False, "CUDA is not available (nvFuser runs on NVIDIA GPUs)")
    # a stand-in fusing CUDA tensors still needs CUDA
    assert not NvFuserExecutor(frontend=nvfuser_standin).availability()[0]


def test_the_cuda_executor_takes_no_cpu_tensors(frontend, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # available, as on a GPU machine
    ex = NvFuserExecutor(frontend=frontend)  # device_type="cuda", as registered
    jf = tf.jit(lambda x: x.exp() * 2, executors=[ex])
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), x.exp() * 2)
    assert not fused_calls(tf.last_traces(jf)[-1]) and not frontend.built


# -- the OpInfo database through the stand-in ------------------------------------------------------
OPS_WITH_DECOMPOSITIONS = [pytest.param(op, id=op.name) for op in op_db if not op.skip_decomposition]


@pytest.mark.parametrize("op", OPS_WITH_DECOMPOSITIONS)
def test_every_op_decomposed_into_nvfuser_definitions_matches_its_unfused_trace(op, ex):
    """Each op's decomposition (prims, on the torch_prims executor) with nvFuser first gives what the
    same decomposition gives unfused, and no definition falls back: every translation the executor
    claims builds and runs on the stand-in, with the prims' dtypes."""
    torch.manual_seed(zlib.crc32(op.name.encode()))  # samples are random: a failure reproduces on rerun
    fused = tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs), executors=[ex, "torch_prims"])
    unfused = tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs), executors=["torch_prims"])
    for sample in list(op.sample_inputs("cpu", op.dtypes[0]))[:2]:
        with no_fallback():
            got = fused(*sample.args, **sample.kwargs)
        torch.testing.assert_close(got, unfused(*sample.args, **sample.kwargs), equal_nan=True,
                                   msg=lambda m, s=sample: f"{op.name} on {s}:\n{m}")


def test_symbolic_sizes_stay_with_torch_and_match_eager_at_every_size(ex, frontend):
    """A definition is built per concrete layout, so can_fuse refuses ops on symbolic sizes: under
    dynamic=True the function runs on torch, once compiled for every size, and nothing is defined."""
    jf = tf.jit(norm_and_gate, dynamic=True, executors=[ex])
    for n in (5, 9):
        args = (torch.randn(n, 8, requires_grad=True), torch.randn(8, requires_grad=True), torch.randn(8))
        out = jf(*args)
        torch.testing.assert_close(out, norm_and_gate(*args))
        torch.testing.assert_close(torch.autograd.grad(out.sum(), args[:2]),
                                   torch.autograd.grad(norm_and_gate(*args).sum(), args[:2]))
    assert tf.cache_info(jf)["misses"] == 1
    assert not fused_calls(tf.last_traces(jf)[-1]) and not frontend.built
