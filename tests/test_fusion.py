"""Fusion executors (executors/fusion.py) and the Inductor executor (executors/inductor.py).

Region formation is tested without compiling anything: `RunsRegionsWithTorch` is a
FusionExecutor whose compile_region runs the region's ops one by one with torch, so a
test sees exactly the regions the shared logic forms. Only the few tests at the end
compile with Inductor (seconds each), sharing their compiled functions through
module-scoped fixtures.
"""
import multiprocessing
import re
import threading
import warnings
import zlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import thunderfn as tf
import thunderfn.torch as ltorch
from thunderfn.examples.gpt import Block, GPTConfig
from thunderfn.executors import FusionExecutor, OperatorExecutor, inductor
from thunderfn.executors.fusion import CompiledCache
from thunderfn.testing.fusion_checks import (
    INDUCTOR_OK,
    INDUCTOR_WHY,
    assert_falls_back_once,
    assert_training_step_matches_eager,
    needs_inductor,
)


class RunsRegionsWithTorch(FusionExecutor):
    """A stand-in fusion executor: fuses every candidate but matmuls, and 'compiles' a region
    into a function that runs its ops unfused, with torch."""

    def __init__(self, name="torchregions"):
        super().__init__(name)
        self.regions = []

    def can_fuse(self, bsym):
        return "matmul" not in bsym.sym.name

    def compile_region(self, region):
        self.regions.append(region)
        return region.unfused


def regions_of(trace, prefix="torchregions_fusion_"):
    """{region name: [names of the fused ops' outputs]} of an execution trace."""
    return {b.sym.name: [o.name for s in b.subsymbols for o in s.proxy_outs()]
            for b in trace.bound_symbols if b.sym.name.startswith(prefix)}


def short(bsym) -> str:
    """A bound symbol's name without its module: `gelu` for torch.nn.functional.gelu."""
    return bsym.sym.name.rpartition(".")[2]


def ops(trace) -> list[str]:
    """The short names of what an execution trace runs, `del` statements left out."""
    return [short(b) for b in trace.bound_symbols if b.sym.name != "del"]


def run(fn, *args, executors=None, **kwargs):
    jf = tf.jit(fn, executors=executors or [RunsRegionsWithTorch()], **kwargs)
    torch.testing.assert_close(jf(*args), fn(*args))
    return jf, tf.last_traces(jf)[-1]


def test_a_chain_along_dataflow_is_one_region_printed_with_its_ops():
    def f(x, w, b):
        return F.gelu(x * w + b) * torch.sigmoid(x)

    jf, execution = run(f, torch.randn(4, 4), torch.randn(4), torch.randn(4))
    assert list(regions_of(execution)) == ["torchregions_fusion_0"]
    [region] = [b for b in execution.bound_symbols if b.sym.name.startswith("torchregions")]
    assert [short(s) for s in region.subsymbols] == ["mul", "add", "gelu", "sigmoid", "mul"]
    text = str(execution)
    assert "(t13,) = torchregions_fusion_0(x, w, b)" in text
    assert "    # t8 = torch.nn.functional.gelu(t3)" in text  # the fused ops, as comments
    stages = [t.provenance.split(" (took")[0] for t in tf.last_traces(jf)]
    assert stages[-2:] == ["Constructed by Fusion (torchregions)", "Constructed by Delete Last Used"]
    assert "torchregions_fusion" not in str(tf.last_traces(jf)[-3])  # the trace before fusion


def test_independent_siblings_merge_into_one_region():
    def f(x, y):
        return torch.sin(x).exp(), torch.cos(y) * 2

    _, execution = run(f, torch.randn(3), torch.randn(5))
    assert regions_of(execution) == {"torchregions_fusion_0": ["t0", "t1", "t2", "t3"]}


def test_ops_on_different_devices_never_share_a_region():
    """One compiled kernel runs on one device: siblings on the CPU and on `meta` (a second device
    every machine has) stay apart."""
    def f(x, m):
        return torch.sin(x).exp(), torch.cos(m) * 2

    jf = tf.jit(f, executors=[RunsRegionsWithTorch()])
    out = jf(torch.randn(3), torch.randn(5, device="meta"))
    assert out[0].device.type == "cpu" and out[1].device.type == "meta"
    regions = regions_of(tf.last_traces(jf)[-1])
    assert sorted(regions.values()) == [["t0", "t1"], ["t2", "t3"]]


def test_a_region_never_both_feeds_and_reads_an_op_outside_it():
    """exp(cos(x)) feeds the matmul, which feeds sin(m + e): merging the two elementwise groups
    (producer into consumer) would make the region run both before and after the matmul."""
    def f(x, w):
        e = torch.exp(torch.cos(x))
        m = e @ w
        return torch.sin(m + e)

    _, execution = run(f, torch.randn(4, 4), torch.randn(4, 4))
    names = ops(execution)
    assert names == ["torchregions_fusion_0", "matmul", "torchregions_fusion_1"]


def test_merging_siblings_does_not_route_around_an_op_outside():
    """a = exp(x) and c = cos(x) are siblings, but c also reads the matmul of a: one region would
    have to run both before and after it, so only what can merge does."""
    def f(x, w):
        a = torch.exp(x).abs()
        m = a @ w
        c = torch.cos(x) * m
        return c.tanh()

    _, execution = run(f, torch.randn(4, 4), torch.randn(4, 4))
    regions = regions_of(execution)
    assert len(regions) == 2
    order = ops(execution)
    assert order.index("matmul") == 1


def test_an_operator_executor_claim_splits_a_region():
    ex = OperatorExecutor("mul_kernel_ex")
    mul_kernel = ex.register_operator("mul_kernel", like=lambda a, b: a * b, fn=lambda a, b: a * b)
    ex.register_lowering(ltorch.mul, lower=mul_kernel)

    def f(x, y):
        u = torch.cos(torch.exp(x))
        return torch.tanh(torch.sin(u * y))

    _, execution = run(f, torch.randn(3), torch.randn(3), executors=[ex, RunsRegionsWithTorch()])
    names = ops(execution)
    assert names == ["torchregions_fusion_0", "mul_kernel", "torchregions_fusion_1"]


class AbsorbsTraceableOperators(RunsRegionsWithTorch):
    absorbs_traceable_operators = True


def _mul_kernel_executor(*, traceable):
    ex = OperatorExecutor("mul_kernel_ex")
    mul_kernel = ex.register_operator("mul_kernel", like=lambda a, b: a * b, fn=lambda a, b: a * b,
                                      traceable=traceable)
    ex.register_lowering(ltorch.mul, lower=mul_kernel)
    return ex


@pytest.mark.parametrize("traceable", [True, False])
def test_a_traceable_operator_joins_a_region_only_where_the_fusion_executor_absorbs_them(traceable):
    def f(x, y):
        u = torch.cos(torch.exp(x))
        return torch.tanh(torch.sin(u * y))

    _, execution = run(f, torch.randn(3), torch.randn(3),
                       executors=[_mul_kernel_executor(traceable=traceable), AbsorbsTraceableOperators()])
    if traceable:  # the kernel is still the operator executor's: the region calls it
        assert ops(execution) == ["torchregions_fusion_0"]
        assert "mul_kernel" in regions_of_ops(execution)["torchregions_fusion_0"]
    else:
        assert ops(execution) == ["torchregions_fusion_0", "mul_kernel", "torchregions_fusion_1"]
    _, execution = run(f, torch.randn(3), torch.randn(3),
                       executors=[_mul_kernel_executor(traceable=True), RunsRegionsWithTorch()])
    assert ops(execution) == ["torchregions_fusion_0", "mul_kernel", "torchregions_fusion_1"]


def regions_of_ops(trace) -> dict:
    """{region name: [short names of its fused ops]}."""
    return {b.sym.name: [short(s) for s in b.subsymbols] for b in trace.bound_symbols if "_fusion_" in b.sym.name}


def test_statements_random_draws_and_opaque_ops_stay_outside_regions():
    def f(x, y):
        a = torch.exp(x) * 2
        with torch.no_grad():
            b = torch.sin(a) + 1
        d = F.dropout(b, 0.5)  # random
        h = torch.histc(a, bins=4)  # opaque: no decomposition
        y.mul_(2)  # an in-place write into an input: written back at the end
        return d.cos() * 3, h.exp() + 1

    x = torch.randn(8)
    torch.manual_seed(0)
    expected = f(x, y_eager := torch.ones(8))
    jf = tf.jit(f, executors=[RunsRegionsWithTorch()])
    torch.manual_seed(0)
    out = jf(x, y := torch.ones(8))
    torch.testing.assert_close((out, y), (expected, y_eager))
    execution = tf.last_traces(jf)[-1]
    fused = [s for b in execution.bound_symbols if b.sym.name.startswith("torchregions") for s in b.subsymbols]
    assert fused and not any(short(s) in ("dropout", "histc") for s in fused)
    names = ops(execution)
    for outside in ("set_grad_enabled", "dropout", "histc", "write_back"):
        assert outside in names
    grad_switches = [i for i, n in enumerate(names) if n == "set_grad_enabled"]
    sin_region = next(i for i, b in enumerate(b for b in execution.bound_symbols if b.sym.name != "del")
                      if any(short(s) == "sin" for s in b.subsymbols))
    assert grad_switches[0] < sin_region < grad_switches[1]  # no region crosses a grad-mode switch


def test_one_op_alone_and_an_unfusible_trace_stay_as_they_were():
    def f(x, w):
        return torch.exp(x @ w) @ w

    jf = tf.jit(f, executors=[RunsRegionsWithTorch()])
    jf(torch.randn(3, 3), torch.randn(3, 3))
    traces = tf.last_traces(jf)
    fusion = next(i for i, t in enumerate(traces) if "Fusion" in t.provenance)
    before, after = traces[fusion - 1], traces[fusion]
    assert [short(b) for b in after.bound_symbols] == [short(b) for b in before.bound_symbols]


def test_regions_form_in_the_backward_trace_too():
    x = torch.randn(6, requires_grad=True)
    w = torch.randn(6)
    jf = tf.jit(lambda x, w: (torch.tanh(x * w) * x).sin().sum(), executors=[RunsRegionsWithTorch()])
    jf(x, w).backward()
    expected = torch.autograd.grad((torch.tanh(x * w) * x).sin().sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)
    backward = tf.last_backward_traces(jf)[-1]
    assert regions_of(backward)
    assert re.search(r"= torchregions_fusion_\d+\(", str(backward))


# Random dataflow graphs: elementwise ops (fused), matmuls and an opaque op (not fused) reading
# any earlier values. Whatever regions form, the trace must still run in a valid order (a cycle
# between regions, or a region placed before a value it reads, fails to run) and match eager.
_UNARY = {"sin": torch.sin, "exp_neg": lambda a: torch.exp(-a.abs()),
          "histc_sum": lambda a: torch.histc(a, 4).sum() + a}
_BINARY = {"add": torch.add, "mul": torch.mul, "matmul": torch.matmul}


@st.composite
def dataflow_programs(draw):
    program = []
    for i in range(draw(st.integers(1, 12))):
        values = 2 + i  # the two inputs, then one value per step
        if draw(st.booleans()):
            program.append((draw(st.sampled_from(sorted(_UNARY))), draw(st.integers(0, values - 1))))
        else:
            program.append((draw(st.sampled_from(sorted(_BINARY))), draw(st.integers(0, values - 1)),
                            draw(st.integers(0, values - 1))))
    outputs = draw(st.lists(st.integers(0, len(program) + 1), min_size=1, max_size=3))
    return program, outputs


def run_program(program, outputs, x, y):
    values = [x, y]
    for op, *operands in program:
        fn = _UNARY.get(op) or _BINARY[op]
        values.append(fn(*(values[k] for k in operands)))
    return [values[k] for k in outputs]


@given(dataflow_programs())
def test_regions_of_any_dataflow_graph_run_in_a_valid_order_and_match_eager(program_and_outputs):
    program, outputs = program_and_outputs
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    f = lambda x, y: run_program(program, outputs, x, y)  # noqa: E731
    torch.testing.assert_close(tf.jit(f, executors=[RunsRegionsWithTorch()])(x, y), f(x, y), equal_nan=True)


# -- Inductor -----------------------------------------------------------------------------------
# Each compile takes seconds (a cold one ~10 s on 2 cores): few tests, compiled functions shared.



def gelu_chain(x, w, b):
    return F.gelu(x * w + b) * torch.sigmoid(x)


@pytest.fixture(scope="module")
def fused_gelu_chain():
    jf = tf.jit(gelu_chain, executors=["inductor"])
    args = (torch.randn(32, 16), torch.randn(16), torch.randn(16))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunderfn")  # no fallback
        out = jf(*args)
    return jf, args, out


def test_inductor_availability_is_reported_honestly(monkeypatch):
    status = tf.executors.available()["inductor"]
    assert status == "available" if INDUCTOR_OK else status == f"unavailable: {INDUCTOR_WHY}"
    monkeypatch.setattr(inductor.shutil, "which", lambda name: None)
    ok, why = inductor._availability()
    assert not ok and "no C++ compiler" in why


@needs_inductor
def test_inductor_fuses_an_elementwise_chain_into_one_region_matching_eager(fused_gelu_chain):
    jf, args, out = fused_gelu_chain
    torch.testing.assert_close(out, gelu_chain(*args))
    execution = tf.last_traces(jf)[-1]
    assert ops(execution) == ["inductor_fusion_0"]
    assert "(t13,) = inductor_fusion_0(x, w, b)" in str(execution)
    compiled = len(inductor._compiled)
    new = [torch.randn_like(a) for a in args]
    torch.testing.assert_close(jf(*new), gelu_chain(*new))
    assert len(inductor._compiled) == compiled  # same layout: the compiled function is reused
    x_t = torch.randn(16, 32).t()  # other strides: compiled again for them, not run on the wrong layout
    torch.testing.assert_close(jf(x_t, *args[1:]), gelu_chain(x_t, *args[1:]))


@needs_inductor
def test_a_region_compiled_again_is_served_by_inductors_cache_of_compiled_graphs(fused_gelu_chain, monkeypatch):
    # what a new process does for a region an earlier one compiled (a fused warm start): Inductor's FX graph
    # cache serves only compiles in a tracing context whose fake mode has a ShapeEnv, which it once bypassed
    from torch._dynamo.utils import counters
    jf, args, _ = fused_gelu_chain
    monkeypatch.setattr(inductor, "_compiled", CompiledCache())  # this process's compiled regions forgotten
    hits, bypasses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_bypass"]
    again = tf.jit(gelu_chain, fusion=True)
    torch.testing.assert_close(again(*args), gelu_chain(*args))
    assert counters["inductor"]["fxgraph_cache_bypass"] == bypasses
    assert counters["inductor"]["fxgraph_cache_hit"] == hits + 1


@needs_inductor
def test_a_training_step_of_a_jitted_module_on_inductor_matches_eager_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    jitted = tf.jit(model, executors=["inductor"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunderfn")
        assert_training_step_matches_eager(model, jitted, torch.randn(5, 8), torch.randn(5, 4))
    assert "inductor_fusion_" in str(tf.last_traces(jitted)[-1])
    assert "inductor_fusion_" in str(tf.last_backward_traces(jitted)[-1])


@needs_inductor
def test_fusion_true_adds_inductor_after_the_defaults_and_attention_joins_its_regions():
    """tf.jit(model, fusion=True): Inductor after the default executors (sdpa), whose attention kernels
    its regions call, so a transformer block's forward and backward are one region each."""
    torch.manual_seed(0)
    model = Block(GPTConfig(n_embd=32, n_head=2, block_size=16))
    jitted = tf.jit(model, fusion=True)
    assert_training_step_matches_eager(model, jitted, torch.randn(2, 16, 32), torch.randn(2, 16, 32))
    for trace in (tf.last_traces(jitted)[-1], tf.last_backward_traces(jitted)[-1]):
        assert [b.sym.name for b in trace.bound_symbols if "_fusion_" in b.sym.name or "sdpa" in b.sym.name] == \
            [next(b.sym.name for b in trace.bound_symbols if "inductor_fusion_" in b.sym.name)]
        assert any("sdpa_flash_cpu" in short(s) for b in trace.bound_symbols if "_fusion_" in b.sym.name
                   for s in b.subsymbols)


def test_fusion_option_checks_its_value():
    with pytest.raises(ValueError, match="not one"):
        tf.jit(lambda x: x, fusion="sdpa")
    with pytest.raises(TypeError, match="fusion must be"):
        tf.jit(lambda x: x, fusion=1.5)


def test_a_region_inductor_fails_on_runs_unfused_after_one_warning(monkeypatch):
    def refuse(gm, example_inputs):
        raise RuntimeError("cannot lower this graph\nsecond line")

    monkeypatch.setattr(inductor, "compile_graph", refuse)
    bias = torch.randn(3)  # a captured tensor: an input of the region, and of its unfused function
    f = lambda x: torch.tanh(x) * torch.cos(x) + bias  # noqa: E731
    jf = tf.jit(f, executors=["inductor"])
    x = torch.randn(7, 3)
    assert_falls_back_once(jf, f, x, r"^thunderfn: Inductor could not compile inductor_fusion_0 \(RuntimeError: "
                                     r"cannot lower this graph\); its 4 ops run unfused$")


def test_the_process_wide_compile_cache_keeps_only_the_most_recent_regions(monkeypatch):
    monkeypatch.setattr(inductor, "compile_graph", lambda gm, example_inputs: gm)  # the graph runs as itself
    monkeypatch.setattr(inductor, "_compiled", CompiledCache(size=2))
    x = torch.randn(4)
    for k in range(4):  # four different regions (the constant differs): four compiles, two kept
        f = lambda t, k=k: torch.sin(t) * (k + 2) + 1  # noqa: E731
        torch.testing.assert_close(tf.jit(f, executors=["inductor"])(x), f(x))
    assert len(inductor._compiled) == 2
    assert all(f"{k + 2}" in sig for (sig, _), k in zip(inductor._compiled, (2, 3)))  # the last two regions


def test_background_compilation_runs_unfused_until_the_compiled_region_lands(monkeypatch):
    compiled_under = []
    release = threading.Event()

    def slow_compile(gm, example_inputs):
        release.wait(10)  # the compile is still running while the calls below are made
        compiled_under.append(torch.is_grad_enabled())
        calls = []

        def run(*tensors):
            calls.append(1)
            return gm(*tensors)

        run.calls = calls
        return run

    monkeypatch.setattr(inductor, "compile_graph", slow_compile)
    monkeypatch.setattr(inductor, "_compiled", CompiledCache())
    f = lambda x: torch.sin(x) * 3 + 1  # noqa: E731
    jf = tf.jit(f, executors=["inductor_background"])
    x = torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(jf(x), f(x))  # returns before the compile finishes
        torch.testing.assert_close(jf(x), f(x))
        region = next(b.sym.eager for b in tf.last_traces(jf)[-1].bound_symbols if "fusion" in b.sym.name)
        assert not hasattr(next(iter(region.by_layout.values())), "calls")  # still the unfused function
        release.set()
        inductor.wait_for_background_compiles()
        compiled = next(iter(region.by_layout.values()))
        torch.testing.assert_close(jf(x), f(x))
    assert compiled.calls == [1] and compiled_under == [False]  # compiled under the call's grad mode


def test_a_background_compile_that_fails_leaves_the_region_unfused_with_one_warning(monkeypatch):
    def refuse(gm, example_inputs):
        raise RuntimeError("cannot lower this graph")

    monkeypatch.setattr(inductor, "compile_graph", refuse)
    monkeypatch.setattr(inductor, "_compiled", CompiledCache())
    f = lambda x: torch.cos(x) * 2 - 1  # noqa: E731
    jf = tf.jit(f, executors=["inductor_background"])
    x = torch.randn(4)
    with pytest.warns(UserWarning, match="Inductor could not compile inductor_background_fusion_0"):
        torch.testing.assert_close(jf(x), f(x))
        inductor.wait_for_background_compiles()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(jf(x), f(x))


def _child_compiles_in_background(queue_out):
    f = lambda x: torch.sin(x) + 2  # noqa: E731
    jf = tf.jit(f, executors=["inductor_background"])
    x = torch.randn(6)
    ok = torch.allclose(jf(x), f(x))
    inductor.wait_for_background_compiles()  # the child's own thread: returns rather than hanging
    queue_out.put(ok and torch.allclose(jf(x), f(x)))


def test_a_forked_child_compiles_in_background_on_its_own_thread(monkeypatch):
    monkeypatch.setattr(inductor, "compile_graph", lambda gm, example_inputs: gm)
    jf = tf.jit(lambda x: torch.cos(x) * 2, executors=["inductor_background"])
    jf(torch.randn(3))  # the parent's compile thread exists before the fork
    inductor.wait_for_background_compiles()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_child_compiles_in_background, args=(results,))
    child.start()
    try:
        child.join(30)
        assert child.exitcode == 0 and results.get(timeout=5) is True
    finally:
        child.kill()


# Representative ops of each kind Inductor fuses, all in one jitted function (sibling regions merge, so
# one compile covers them): a failure anywhere is a fallback warning, which this test makes an error.
INDUCTOR_OPS = ["exp", "sin", "sigmoid", "nn.functional.gelu", "add", "mul", "div", "pow", "where", "clamp",
                "sum", "amax", "mean", "softmax", "log_softmax", "transpose", "reshape", "expand", "unsqueeze",
                "cat", "Tensor.float"]


@needs_inductor
def test_representative_op_db_ops_through_inductor_match_eager():
    by_name = {op.name: op for op in op_db}  # (imported below, with the op_db tests)
    torch.manual_seed(0)
    calls = []
    for name in INDUCTOR_OPS:
        op = by_name[name]
        sample = next(iter(op.sample_inputs("cpu", torch.float32)))
        calls.append((op, sample.args, sample.kwargs))

    def all_ops(calls, buffer):
        # each result times one, so a view op's output is computed, not an alias Inductor may lay out differently
        outs = [op.op(*args, **kwargs) * 1 for op, args, kwargs in calls]
        # in place: into an intermediate (row and whole), and into an input (written back after the region)
        t = torch.exp(buffer) * 2
        t[0] = 1.0
        t.mul_(outs[0].sum())
        buffer.add_(t.sigmoid())
        return outs + [t]

    flat, unflatten = _flatten_calls(calls)
    jf = tf.jit(lambda *args: all_ops(unflatten(args[:-1]), args[-1]), executors=["inductor"])
    buffer = torch.randn(3, 4)
    buffer_eager = buffer.clone()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunderfn")  # no region fell back
        got = jf(*flat, buffer)
    expected = all_ops(calls, buffer_eager)
    for name, g, e in zip([op.name for op, _, _ in calls] + ["in-place"], got, expected):
        torch.testing.assert_close(g, e, equal_nan=True, msg=lambda m, name=name: f"{name}: {m}")
    torch.testing.assert_close(buffer, buffer_eager)
    assert "inductor_fusion_" in str(tf.last_traces(jf)[-1])


def _flatten_calls(calls):
    """The calls' tensors as one flat argument list, and how to put them back."""
    leaves, spec = torch.utils._pytree.tree_flatten([(args, kwargs) for _, args, kwargs in calls])
    tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def unflatten(flat):
        filled = list(leaves)
        for i, t in zip(tensors, flat):
            filled[i] = t
        rebuilt = torch.utils._pytree.tree_unflatten(filled, spec)
        return [(op, a, k) for (op, _, _), (a, k) in zip(calls, rebuilt)]

    return [leaves[i] for i in tensors], unflatten


# -- the OpInfo database through fusion regions -------------------------------------------------
from thunderfn.testing.opinfos import op_db  # noqa: E402

OPS_WITH_DECOMPOSITIONS = [pytest.param(op, id=op.name) for op in op_db if not op.skip_decomposition]


@pytest.mark.parametrize("op", OPS_WITH_DECOMPOSITIONS)
def test_every_op_decomposed_into_fusion_regions_matches_its_unfused_trace(op):
    """Each op's decomposition (prims, on the torch_prims executor) with the stand-in fusion executor
    first gives what the same decomposition gives unfused: whatever regions form, in whatever order
    they are scheduled, a fused region computes what its unfused ops compute."""
    torch.manual_seed(zlib.crc32(op.name.encode()))  # samples are random: a failure reproduces on rerun
    fused = tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs), executors=[RunsRegionsWithTorch(), "torch_prims"])
    unfused = tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs), executors=["torch_prims"])
    dtype = op.dtypes[0]
    for sample in list(op.sample_inputs("cpu", dtype))[:3]:
        torch.testing.assert_close(fused(*sample.args, **sample.kwargs), unfused(*sample.args, **sample.kwargs),
                                   equal_nan=True, msg=lambda m, s=sample: f"{op.name} on {s}:\n{m}")


# -- fusion never loses: a compiled region slower than its unfused ops runs unfused --------------------------
def _region_program(x):
    return (torch.sin(x) * 3.5 + 0.25).cos().sum()


def _choices_after_a_call(monkeypatch, slow: bool):
    """tf.profile of _region_program under inductor, whose 'compiled' region (no Inductor compile: the choice
    between compiled and unfused is what is tested) is its FX graph run as is after sleeping 10 ms, or, not
    `slow`, its outputs on the first call's tensors handed back at once (the test calls it with those alone)."""
    import time

    def compile_graph(gm, example_inputs):
        outputs = gm(*example_inputs)

        def run(*tensors):
            if slow:
                time.sleep(0.01)
                return gm(*tensors)
            return outputs
        return run

    monkeypatch.setattr(inductor, "compile_graph", compile_graph)
    monkeypatch.setattr(inductor, "_compiled", CompiledCache())
    monkeypatch.setattr(inductor, "_choices", {})
    jitted = tf.jit(_region_program, executors=["inductor"])
    x = torch.randn(64)
    torch.testing.assert_close(jitted(x), _region_program(x))
    return tf.profile(jitted, x, calls=3)


@needs_inductor
def test_a_region_slower_compiled_than_its_unfused_ops_runs_unfused_and_the_profile_says_so(monkeypatch):
    profile = _choices_after_a_call(monkeypatch, slow=True)
    (row,) = [r for r in profile.rows if r.choices]
    assert not row.choices[0].fused and row.choices[0].fused_ms > 10 > row.choices[0].unfused_ms
    assert row.ms < 5  # the region's calls after the first run its unfused ops
    assert "0 run compiled, 1 unfused (slower compiled)" in str(profile)


@needs_inductor
def test_a_region_faster_compiled_keeps_its_compiled_code(monkeypatch):
    profile = _choices_after_a_call(monkeypatch, slow=False)
    (row,) = [r for r in profile.rows if r.choices]
    assert row.choices[0].fused and row.choices[0].fused_ms < row.choices[0].unfused_ms
    assert "1 run compiled, 0 unfused" in str(profile)


@needs_inductor
@pytest.mark.parametrize("slow", [True, False], ids=["slower-compiled", "faster-compiled"])
def test_a_later_process_takes_a_regions_choice_from_cache_dir_instead_of_timing_or_compiling_again(
        monkeypatch, tmp_path, slow):
    monkeypatch.setenv("THUNDERFN_CACHE_DIR", str(tmp_path))
    first = _choices_after_a_call(monkeypatch, slow=slow)
    (row,) = [r for r in first.rows if r.choices]
    assert row.choices[0].fused is not slow and not row.choices[0].remembered

    # a new process: nothing compiled or timed in it yet, and a compiler that counts its compiles
    compiles, timings = [], []
    monkeypatch.setattr(inductor, "_compiled", CompiledCache())
    monkeypatch.setattr(inductor, "_choices", {})
    monkeypatch.setattr(inductor, "compile_graph", lambda gm, examples: compiles.append(gm) or gm)
    monkeypatch.setattr(inductor.CompiledRegion, "faster", lambda *a: timings.append(a))
    jitted = tf.jit(_region_program, executors=["inductor"])
    x = torch.randn(64)
    torch.testing.assert_close(jitted(x), _region_program(x))
    later = tf.profile(jitted, x, calls=1)
    (row,) = [r for r in later.rows if r.choices]
    assert row.choices[0].remembered and row.choices[0].fused is not slow
    assert timings == [] and len(compiles) == (0 if slow else 1)  # an unfused choice is not compiled again
    if slow:
        assert "as timed by an earlier process, from cache_dir" in str(later)
