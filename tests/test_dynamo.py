"""thunderfn as a torch.compile backend (docs/torch_compile.md): Dynamo captures graphs and breaks
them around what it cannot capture; thunderfn compiles each graph, splitting it around nodes it
cannot take. The law for every test: the compiled function gives eager's outputs and gradients
(presence included), and the report says what ran where and why. A jitted function inside torch.compile
runs as one call, with this backend or torch's default (Inductor)."""
import copy
import subprocess
import sys
import warnings

import pytest
import torch
import torch._dynamo
import torch.utils.checkpoint
from torch._higher_order_ops.map import map as map_over_leading_dim

import thunderfn as tf
from thunderfn.dynamo import graph_runner
from thunderfn.testing.fusion_checks import needs_inductor


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def assert_like_eager(fn, *shapes, backend="thunderfn", **compile_options):
    """fn compiled with the backend gives eager's outputs and gradients; returns the compiled fn."""
    compiled = torch.compile(fn, backend=backend, **compile_options)
    args, expected_args = _inputs(*shapes), _inputs(*shapes)
    got, expected = compiled(*args), fn(*expected_args)
    torch.testing.assert_close(got, expected)
    sum(o.float().sum() for o in torch.utils._pytree.tree_leaves(got) if o.requires_grad).backward()
    sum(o.float().sum() for o in torch.utils._pytree.tree_leaves(expected) if o.requires_grad).backward()
    for a, e in zip(args, expected_args):
        torch.testing.assert_close(a.grad, e.grad)
    return compiled


def test_the_backend_is_found_by_name_through_the_entry_point_without_thunderfn_importing_dynamo():
    code = ("import sys, torch, thunderfn; assert 'torch._dynamo' not in sys.modules; "
            "f = torch.compile(lambda x: x.sin() * 2, backend='thunderfn'); x = torch.randn(3); "
            "torch.testing.assert_close(f(x), x.sin() * 2); "
            "assert 'thunderfn runs 2 of 2 nodes' in str(thunderfn.dynamo.explain(f))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_model_trains_like_eager_and_its_graph_runs_on_thunderfn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="thunderfn")
    x = torch.randn(5, 4)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), reference(x))
        compiled(x).square().sum().backward()
        reference(x).square().sum().backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, r.grad)
    report = tf.dynamo.explain(compiled)
    assert len(report.graphs) == 1 and not report.splits and not report.graph_breaks
    (fn,) = report.thunderfn_functions
    assert "torch.nn.functional.gelu" in str(tf.last_traces(fn)[-1]) or "gelu" in str(tf.last_traces(fn)[-1])
    assert tf.last_backward_traces(fn)  # joined torch.autograd through thunderfn's backward
    assert tf.cache_info(fn)["entries"] == 1  # compiled once, when Dynamo handed the graph over


def test_graph_breaks_at_item_nonzero_and_print_are_reported_with_dynamos_reasons(capsys):
    def f(x, w):
        y = (x @ w).tanh()
        scale = y.sum().item()  # a graph break (capture_scalar_outputs is off)
        picked = y[y.nonzero(as_tuple=True)]  # data-dependent: a graph break
        print("between")  # a graph break
        return picked * scale + y.mean()

    compiled = assert_like_eager(f, (3, 4), (4, 4))
    assert "between" in capsys.readouterr().out
    report = tf.dynamo.explain(compiled)
    assert len(report.graph_breaks) >= 2, str(report)
    assert any("item" in b for b in report.graph_breaks), report.graph_breaks
    assert all(p.runner == "thunderfn" for g in report.graphs for p in g.pieces)


def test_a_data_dependent_node_inside_a_graph_is_traced_with_its_size_known_only_at_run_time():
    """Dynamo captures nonzero with an unbacked length and asserts on it; thunderfn's trace gives the length a
    data-dependent size of its own (core/symbolic.py), so the whole graph is one thunderfn piece."""
    def f(x):
        y = x.sin() * 2
        nz = y.nonzero()  # captured: Dynamo gives its length an unbacked size
        return y.cos() + nz.shape[0], nz

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(f, backend="thunderfn")
        x = torch.randn(6, requires_grad=True)
        out, nz = compiled(x)
        ex = x.detach().clone().requires_grad_()
        out_e, nz_e = f(ex)
    torch.testing.assert_close(out, out_e)
    torch.testing.assert_close(nz, nz_e)
    out.sum().backward()
    out_e.sum().backward()
    torch.testing.assert_close(x.grad, ex.grad)
    report = tf.dynamo.explain(compiled)
    assert report.splits == [], str(report)
    assert [p.runner for p in report.graphs[0].pieces] == ["thunderfn"], str(report)


class ScaledGradient(torch.autograd.Function):
    """x * w forward; a backward that is deliberately not the derivative (3x the true gradient for x)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return 3 * g * w, g * x


def test_a_user_autograd_function_keeps_its_own_backward():
    def f(x, w):
        y = ScaledGradient.apply(x, w)
        with torch.no_grad():
            z = y * 2  # a no_grad region right after the Function: no gradient through z
        return (y.sin() + z).sum()

    compiled = assert_like_eager(f, (3, 3), (3, 3))
    (fn,) = tf.dynamo.explain(compiled).thunderfn_functions
    assert "user_function" in str(tf.last_traces(fn)[0])  # the Function is one call with its own rule


def test_activation_checkpointing_is_a_checkpoint_region_and_gradients_are_exact():
    def block(x, w):
        return (x @ w).relu().sin()

    def f(x, w):
        y = torch.utils.checkpoint.checkpoint(block, x, w, use_reentrant=False)
        return torch.utils.checkpoint.checkpoint(block, y, w, use_reentrant=False).sum()

    compiled = assert_like_eager(f, (4, 4), (4, 4))
    report = tf.dynamo.explain(compiled)
    assert "tag_activation_checkpoint" in report.graphs[0].graph.code  # Dynamo's op, which thunderfn took
    assert not report.splits
    (fn,) = report.thunderfn_functions
    assert [b.sym.name for b in tf.last_traces(fn)[0].bound_symbols].count("checkpoint") == 2


def test_dynamic_shapes_from_dynamo_are_symbolic_in_thunderfn_too_and_exact():
    def f(x):
        return x.view(x.shape[0], -1).softmax(-1) * x.shape[1]

    compiled = torch.compile(f, backend="thunderfn", dynamic=True)
    for rows in (3, 5, 7):
        x = torch.randn(rows, 4, 2)
        torch.testing.assert_close(compiled(x), f(x))
    report = tf.dynamo.explain(compiled)
    (record,) = report.graphs  # one Dynamo graph for every size: its sizes are inputs (SymInts)
    assert any(isinstance(n.meta.get("example_value"), torch.SymInt) for n in record.graph.graph.nodes
               if n.op == "placeholder")
    (fn,) = report.thunderfn_functions
    info = tf.cache_info(fn)
    # the sizes Dynamo passes are the tensor's dimensions: read from it, symbolic, one entry for every size
    assert info["entries"] == 1 and "s0" in info["symbolic"][0]
    x = torch.randn(4, 3, 2)  # another size of the second dimension too: still the same entry
    torch.testing.assert_close(compiled(x), f(x))
    assert tf.cache_info(fn)["entries"] == 1


def test_a_size_dynamo_passes_that_no_tensor_holds_stays_a_value_per_call():
    def f(x):
        n = int(x.sum().item() > 0) + x.shape[0]  # (a graph break: the size after it is a value)
        return torch.ones(n) * x.shape[0]

    compiled = torch.compile(f, backend="thunderfn", dynamic=True)
    for rows in (3, 5):
        x = torch.ones(rows)
        torch.testing.assert_close(compiled(x), f(x))


def _without_a_rule_for_cond(monkeypatch):
    """A higher-order operator thunderfn does not take, for the tests of what the splitter does with one (every
    operator Dynamo makes on CPU has a rule)."""
    monkeypatch.delitem(graph_runner.HIGHER_ORDER_RULES, "cond")


def test_a_higher_order_op_without_a_rule_runs_eagerly_with_a_warning_naming_it(monkeypatch):
    _without_a_rule_for_cond(monkeypatch)

    def f(x):
        y = x.sin()
        return torch.cond(y.sum() > 0, lambda a: a.cos(), lambda a: a.exp(), (y,)) * 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = assert_like_eager(f, (5,))
    assert any("torch.ops.higher_order.cond" in str(w.message) for w in caught), [str(w.message) for w in caught]
    report = tf.dynamo.explain(compiled)
    assert [u.higher_order_op for u in report.splits] == ["cond"]
    assert [p.runner for p in report.graphs[0].pieces] == ["thunderfn", "eager", "thunderfn"]


def test_torchs_control_flow_operators_are_thunderfns_primitives_not_split_out():
    from torch._higher_order_ops import scan, while_loop

    def branch(x):
        y = x.sin()
        return torch.cond(y.sum() > 0, lambda a: a.cos(), lambda a: a.exp(), (y,)) * 2

    def loop(x):  # (at least one step: torch 2.13's eager while_loop gives a wrong gradient for none, 0.5 for 1)
        return while_loop(lambda x, n: x.sum() > 1, lambda x, n: (x / 2, n + 1), (x.abs() + 1, torch.tensor(0)))[0]

    def scanned(x):
        return scan(lambda c, x: (c + x, (c * x).sin()), torch.zeros(3), x)[1].sum(0)

    for fn, shape, primitive in ((branch, (5,), "cond"), (loop, (3,), "while_loop"), (scanned, (4, 3), "scan")):
        compiled = assert_like_eager(fn, shape)
        report = tf.dynamo.explain(compiled)
        assert not report.splits, fn.__name__
        (thunderfn_fn,) = report.thunderfn_functions
        assert primitive in [b.sym.name for b in tf.last_traces(thunderfn_fn)[0].bound_symbols]
    compiled = torch.compile(loop, backend="thunderfn")
    for scale in (10.0, 1000.0):  # a trip count the values decide: the graph compiled once
        torch.testing.assert_close(compiled(torch.full((3,), scale)), loop(torch.full((3,), scale)))
    assert len(tf.dynamo.explain(compiled).graphs) == 1


@needs_inductor
def test_pieces_thunderfn_cannot_take_run_through_inductor_when_asked(monkeypatch):
    _without_a_rule_for_cond(monkeypatch)
    def f(x):
        y = x.sin()
        return torch.cond(y.sum() > 0, lambda a: a.cos(), lambda a: a.exp(), (y,)) * 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning naming cond: tested above
        compiled = assert_like_eager(f, (5,), backend=tf.dynamo.backend(unsupported="inductor"))
    assert [p.runner for p in tf.dynamo.explain(compiled).graphs[0].pieces] == ["thunderfn", "inductor", "thunderfn"]


def test_backend_options_reach_tf_jit_and_unknown_ones_are_refused():
    compiled = torch.compile(lambda x: x.exp() + 1, backend=tf.dynamo.backend(executors=["torch"],
                                                                                cache_size_limit=3))
    compiled(torch.randn(3))
    (fn,) = tf.dynamo.explain(compiled).thunderfn_functions
    assert tf.cache_info(fn)["cache_size_limit"] == 3
    with pytest.raises(tf.errors.ArgumentValueError, match="Unexpected optimization option 'fusoin'"):
        tf.dynamo.backend(fusoin=True)
    with pytest.raises(Exception, match="Unexpected optimization option 'fusoin'"):
        torch.compile(lambda x: x + 1, backend="thunderfn", options={"fusoin": True})(torch.randn(2))
    with pytest.raises(tf.errors.ArgumentValueError, match="unsupported must be one of"):
        tf.dynamo.backend(unsupported="cpu")
    # a bad value is refused naming the option (it used to run each graph eagerly after a warning)
    with pytest.raises(tf.errors.ArgumentValueError, match="cache_size_limit must be a positive int"):
        tf.dynamo.backend(cache_size_limit=0)
    with pytest.raises(Exception, match="cache_size_limit must be a positive int"):
        torch.compile(lambda x: x + 2, backend="thunderfn", options={"cache_size_limit": 0})(torch.randn(2))


def test_explain_refuses_what_the_backend_did_not_compile():
    with pytest.raises(tf.errors.ArgumentTypeError, match="tf.dynamo.explain expects"):
        tf.dynamo.explain(torch.compile(lambda x: x, backend="eager"))


def test_torch_compile_of_a_jitted_function_runs_it_as_one_call():
    def f(x):
        return x.sin().cos()

    jitted = tf.jit(f)
    compiled = torch.compile(lambda x: jitted(x) * 2, backend="thunderfn")
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), f(x) * 2)


@needs_inductor
def test_torch_compile_with_inductor_of_a_jitted_function_gives_eager_values_and_gradients():
    """torch.compile's default backend (Inductor) compiles its kernels: seconds, a minute with a cold cache."""
    def f(a):
        return a.sin() * 2

    a = torch.randn(3, requires_grad=True)
    out = torch.compile(tf.jit(f))(a)
    torch.testing.assert_close(out, f(a))
    out.sum().backward()
    torch.testing.assert_close(a.grad, 2 * a.detach().cos())
    model = torch.nn.Linear(3, 2)
    jitted = tf.jit(model)
    calls_it = torch.compile(lambda x: jitted(x).relu() + 1)  # a graph break around the jitted call
    torch.testing.assert_close(calls_it(a.detach()), model(a.detach()).relu() + 1)


def test_map_is_a_scan_and_a_nested_compile_region_inlined():
    def f(xs, y):
        return map_over_leading_dim(lambda x, y: (x * y).sin(), xs, y).sum(0) * 2

    compiled = assert_like_eager(f, (3, 4), (4,))
    report = tf.dynamo.explain(compiled)
    assert "map_impl" in report.graphs[0].graph.code and not report.splits
    assert "scan" in [b.sym.name for b in tf.last_traces(report.thunderfn_functions[0])[0].bound_symbols]

    @torch.compiler.nested_compile_region
    def region(x):
        return x.cos() * 3

    compiled = assert_like_eager(lambda x: region(x) + region(x * 2), (4,))
    assert "invoke_subgraph" in tf.dynamo.explain(compiled).graphs[0].graph.code
    assert not tf.dynamo.explain(compiled).splits


def test_a_graph_split_inside_no_grad_and_autocast_regions_keeps_eagers_modes_and_gradients(monkeypatch):
    _without_a_rule_for_cond(monkeypatch)
    def f(x):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x.t()
            z = torch.cond(y.sum() > 0, lambda a: a.cos(), lambda a: a.exp(), (y,))  # fails to trace here
        return z.float() * x.sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = assert_like_eager(f, (3, 3))  # (the gradient through x.sum(), after the no_grad region)
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    assert [p.runner for p in tf.dynamo.explain(compiled).graphs[0].pieces] == ["thunderfn", "eager", "thunderfn"]


def test_the_report_forgets_what_dynamo_forgets():
    backend = tf.dynamo.backend()
    compiled = torch.compile(lambda x: x.sin() + 1, backend=backend)
    compiled(torch.randn(3))
    assert len(tf.dynamo.explain(backend).graphs) == 1 == len(tf.dynamo.explain(compiled).graphs)
    torch._dynamo.reset()  # Dynamo drops its compiled graphs; the report drops their records
    assert tf.dynamo.explain(backend).graphs == [] == tf.dynamo.explain(compiled).graphs
