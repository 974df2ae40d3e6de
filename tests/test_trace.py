"""Traces (core/trace.py, core/printing.py, core/passes.py): what `tf.trace` records,
that `str(trace)` is Python that runs, and what the passes do to it."""
import ast
import gc
import re
import weakref

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.core import context
from thunderfn.core.tracer import Tracer


@pytest.fixture
def x():
    return torch.randn(2, 2)


@pytest.fixture
def y():
    return torch.randn(2, 2)


def mlp_like(x, y):
    return F.gelu(x @ y).sum(0) + 1


def softmaxed(x, y):
    return torch.softmax(x * y, dim=-1), x.transpose(0, 1)


def with_structure(x, y):
    return {"sum": x + y, "pair": (x.exp(), None), "list": [y.sin()]}


FUNCTIONS = [mlp_like, softmaxed, with_structure]


def _compiles(trc) -> ast.Module:
    source = str(trc)
    compile(source, "<trace>", "exec")
    return ast.parse(source)


def _assert_same(actual, expected):
    flat_a, spec_a = _flatten(actual)
    flat_e, spec_e = _flatten(expected)
    assert spec_a == spec_e
    for a, e in zip(flat_a, flat_e):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e)
        else:
            assert a == e


def _flatten(tree):
    import optree

    return optree.tree_flatten(tree, none_is_leaf=True)


# -- what tf.trace records ------------------------------------------------------------------
def test_trace_records_torch_symbols_with_their_prim_decompositions(x, y):
    trc = tf.trace(mlp_like, x, y)
    assert [b.sym.name for b in trc.bound_symbols] == ["matmul", "gelu", "sum", "add"]
    assert all(not b.sym.is_prim for b in trc.bound_symbols)
    gelu = trc.bound_symbols[1]
    assert gelu.subsymbols, "a composite records its decomposition"
    assert all(s.sym.is_prim for s in gelu.subsymbols)
    assert "erf" in [s.sym.name for s in gelu.subsymbols]
    assert [s.sym.name for s in trc.bound_symbols[0].subsymbols] == ["matmul"]


def test_trace_inputs_are_named_after_parameters_and_outputs_are_proxies(x, y):
    trc = tf.trace(mlp_like, x, y)
    assert [a.name for a in trc.args] == ["x", "y"]
    assert isinstance(trc.output, tf.TensorProxy)
    assert trc.output is trc.bound_symbols[-1].output
    assert trc.output.shape == torch.Size([2]) and trc.output.dtype is torch.float32


def test_bound_symbol_args_are_the_proxies_the_function_passed(x, y):
    trc = tf.trace(mlp_like, x, y)
    matmul = trc.bound_symbols[0]
    assert [a.name for a in matmul.args] == ["x", "y"]
    assert trc.bound_symbols[1].args[0] is matmul.output


def test_a_bound_symbols_tensor_lists_follow_its_fields_when_they_are_assigned_anew(x, y):
    # (each statement keeps the lists it was asked for: a pass that rewrites a field in place must see new ones)
    trc = tf.trace(lambda a, b: torch.sin(a) * b, x, y)
    mul = trc.bound_symbols[1]
    sin_out, b = mul.proxy_args()
    assert mul.proxy_args() == [sin_out, b] and mul.proxy_args() is not mul.proxy_args()  # (a copy each time)
    mul.args = (b, sin_out)
    assert mul.proxy_args() == [b, sin_out]
    mul.output = sin_out
    assert mul.proxy_outs() == [sin_out]


def test_nested_composites_nest_their_subsymbols():
    # softmax decomposes through other torch-language or clang-level calls into prims
    trc = tf.trace(lambda a: torch.softmax(a, -1), torch.randn(3, 4))
    (bsym,) = trc.bound_symbols
    assert bsym.sym.name == "softmax"

    def leaves(b):
        return [b] if not b.subsymbols else [leaf for s in b.subsymbols for leaf in leaves(s)]

    assert all(leaf.sym.is_prim for leaf in leaves(bsym))
    assert {"exp", "sum"} <= {leaf.sym.name for leaf in leaves(bsym)}


def test_trace_of_pytree_arguments_names_inputs_by_path():
    t = torch.randn(2)
    trc = tf.trace(lambda pair, d: pair[0] + pair[1] + d["k"], (t, t), {"k": t})
    assert [a.name for a in trc.args] == ["pair_0", "pair_1", "d_k"]


def test_trace_inputs_from_var_positional_and_keyword_arguments_are_named_after_them():
    t = torch.randn(2)

    def fn(a, *rest, scale=1, **extra):
        return a * scale + sum(rest) + sum(extra.values())

    trc = tf.trace(fn, t, t, t, scale=2, z=t)
    assert [a.name for a in trc.args] == ["a", "rest_0", "rest_1", "z"]


def test_non_tensor_arguments_are_baked_into_the_trace(x):
    trc = tf.trace(lambda a, n: a * n, x, 3)
    assert len(trc.args) == 1
    assert trc.bound_symbols[0].args[1] == 3
    assert "ltorch.mul(a, 3)" in str(trc)


# -- str(trace) is Python ------------------------------------------------------------------
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_printed_trace_is_valid_python_with_provenance_header(fn, x, y):
    trc = tf.trace(fn, x, y)
    _compiles(trc)
    first = str(trc).splitlines()[0]
    assert re.fullmatch(r"# Constructed by Tracing \(took [0-9.]+ milliseconds\)", first)


def test_printed_trace_annotates_every_proxy_with_device_dtype_and_shape(x, y):
    source = str(tf.trace(mlp_like, x, y))
    assert '# x: "cpu f32[2, 2]"' in source
    assert '# t0: "cpu f32[2, 2]"' in source
    assert re.search(r'  # t\d+: "cpu f32\[2\]"', source)


def test_printed_trace_shows_decompositions_as_nested_comments(x, y):
    lines = str(tf.trace(mlp_like, x, y)).splitlines()
    i = next(i for i, line in enumerate(lines) if "ltorch.gelu" in line)
    assert not lines[i].lstrip().startswith("#")
    assert lines[i + 1].startswith("    # ") and "prims." in lines[i + 1]


def test_printed_trace_of_scalar_dtype_and_device_arguments_compiles():
    def fn(a):
        return a.to(torch.float64) + float("inf"), torch.full((2,), -float("inf"), device=a.device), a.reshape(a.shape)

    trc = tf.trace(fn, torch.randn(2))
    _compiles(trc)
    _assert_same(trc.python_callable()(torch.ones(2)), fn(torch.ones(2)))


# -- round trips ---------------------------------------------------------------------------
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_computation_trace_runs_ltorch_symbols_eagerly_like_the_function(fn, x, y):
    trc = tf.trace(fn, x, y)
    _assert_same(trc.python_callable()(x, y), fn(x, y))


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_execution_trace_runs_like_the_function(fn, x, y):
    jf = tf.jit(fn)
    _assert_same(jf(x, y), fn(x, y))
    execution = tf.last_traces(jf)[-1]
    _assert_same(execution.python_callable()(x, y), fn(x, y))


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_every_stage_of_last_traces_is_printable_and_compiles(fn, x, y):
    jf = tf.jit(fn)
    jf(x, y)
    traces = tf.last_traces(jf)
    assert len(traces) >= 3
    for trc in traces:
        _compiles(trc)
        assert str(trc).startswith("# Constructed by ")
    provenances = [str(t).splitlines()[0] for t in traces]
    assert "Tracing" in provenances[0] and "Delete Last Used" in provenances[-1]
    assert any("Dead Code Elimination" in p for p in provenances)


def test_ltorch_symbol_called_on_real_tensors_computes_through_its_decomposition(x):
    torch.testing.assert_close(tf.torch.gelu(x), F.gelu(x))
    torch.testing.assert_close(tf.torch.cat([x, x], 1), torch.cat([x, x], 1))
    torch.testing.assert_close(tf.prims.add(x, x), x + x)


# -- passes ---------------------------------------------------------------------------------
def _dels(module: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(module):
        if isinstance(node, ast.Delete):
            names += [t.id for t in node.targets]
    return names


def _assigned(module: ast.Module) -> set:
    out = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                out |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return out


def _returned(module: ast.Module) -> set:
    ret = next(n for n in ast.walk(module) if isinstance(n, ast.Return))
    return {n.id for n in ast.walk(ret) if isinstance(n, ast.Name)}


def test_del_last_used_deletes_each_intermediate_once_and_never_outputs_or_constants():
    w = torch.randn(3, 3)

    def fn(a, b, unused):
        h = a @ w
        g = h.relu() + b
        k = g.exp()
        return k, a, w, (g, None)

    jf = tf.jit(fn)
    args = (torch.randn(3, 3), torch.randn(3, 3), torch.randn(1))
    _assert_same(jf(*args), fn(*args))
    module = _compiles(tf.last_traces(jf)[-1])
    dels = _dels(module)
    assert len(dels) == len(set(dels)), f"deleted twice: {dels}"
    returned = _returned(module)
    assert not set(dels) & returned
    constants = {a.name for a in tf.last_traces(jf)[-1].bound_symbols for a in a.proxy_args() if a.constant is not None}
    assert constants and not set(dels) & constants
    params = {a.name for a in tf.last_traces(jf)[-1].args}
    # every intermediate that is not returned, and every unused input, is freed
    assert (_assigned(module) | params) - returned - constants == set(dels)
    assert "unused" in dels


def test_del_last_used_frees_a_value_right_after_its_last_reader():
    jf = tf.jit(lambda a: ((a + 1) * 2).sin())
    jf(torch.randn(3))
    lines = [ln.strip() for ln in str(tf.last_traces(jf)[-1]).splitlines() if not ln.strip().startswith("#")]
    first_use = next(i for i, ln in enumerate(lines) if "mul" in ln)  # torch.mul or, writing into a+1, its mul_
    assert lines[first_use + 1].startswith("del ")


def test_dce_removes_computation_whose_result_is_unused():
    def fn(a):
        unused = a.exp() * 3  # noqa: F841
        return a.sin()

    jf = tf.jit(fn)
    jf(torch.randn(3))
    computation, after_dce = tf.last_traces(jf)[:2]
    assert [b.sym.name for b in computation.bound_symbols] == ["exp", "mul", "sin"]
    assert [b.sym.name for b in after_dce.bound_symbols] == ["sin"]
    assert "exp" not in str(tf.last_traces(jf)[-1]).split("def ")[1].split("#")[0]


def test_dce_keeps_everything_an_output_needs():
    jf = tf.jit(lambda a: ((a + 1) * 2, (a + 1).cos()))
    jf(torch.randn(3))
    names = [b.sym.name for b in tf.last_traces(jf)[1].bound_symbols]
    assert names == ["add", "mul", "add", "cos"]


# -- captured tensors ---------------------------------------------------------------------
def test_captured_tensors_appear_as_constants_read_by_reference():
    w = torch.randn(3)
    trc = tf.trace(lambda a: a * w, torch.randn(3))
    (mul,) = trc.bound_symbols
    const = mul.args[1]
    assert isinstance(const, tf.TensorProxy) and const.constant is w
    assert len(trc.args) == 1
    assert f'# {const.name}: "cpu f32[3]" (captured by the traced function)' in str(trc)


def test_in_place_updates_to_captured_parameters_are_seen_by_later_calls():
    w = torch.nn.Parameter(torch.ones(3))
    count = []

    def fn(a):
        count.append(1)
        return a * w

    jf = tf.jit(fn)
    a = torch.ones(3)
    torch.testing.assert_close(jf(a), torch.ones(3))
    w.data.add_(1)  # an optimizer step
    torch.testing.assert_close(jf(a).detach(), torch.full((3,), 2.0))
    with torch.no_grad():
        w.mul_(3)
    torch.testing.assert_close(jf(a).detach(), torch.full((3,), 6.0))
    assert len(count) == 1, "updating a captured tensor in place must not retrace"


def test_same_captured_tensor_used_twice_is_one_constant():
    w = torch.randn(3)
    trc = tf.trace(lambda a: a * w + w, torch.randn(3))
    consts = {a.name for b in trc.bound_symbols for a in b.proxy_args() if a.constant is not None}
    assert len(consts) == 1


# -- symbols with structured outputs ------------------------------------------------------------
def _structured_symbols():
    import collections

    from thunderfn.core.symbol import Symbol

    Pair = collections.namedtuple("Pair", "a b")
    pair = Symbol("pairup", "test.pairup", fn=lambda a: Pair(tf.torch.add(a, 1), tf.torch.mul(a, 2)),
                  print_name="pairup")
    pair.namespace = {"pairup": pair}
    nested = Symbol("dictup", "test.dictup", print_name="dictup",
                    fn=lambda a: {"z": tf.torch.add(a, 1), "y": [None, tf.torch.mul(a, 2)]})
    nested.namespace = {"dictup": nested}
    return pair, nested


def test_symbol_returning_namedtuple_or_dict_binds_every_output_in_printed_code():
    pair, nested = _structured_symbols()

    def fn(a):
        return pair(a).b + nested(a)["y"][1] + nested(a)["z"]

    a = torch.randn(3)
    trc = tf.trace(fn, a)
    _compiles(trc)
    torch.testing.assert_close(trc.python_callable()(a), a * 2 + a * 2 + a + 1)
    jf = tf.jit(fn)
    torch.testing.assert_close(jf(a), a * 2 + a * 2 + a + 1)



# -- the IR apart from the tracer (core/tracer.py) ----------------------------------------------------------
# What a Trace holds: the program, what printing and code generation read, and the facts its calls are checked
# against (Trace.__init__ says which and why). The rest was its Tracer's, dropped when tracing ended.
TRACE_ATTRIBUTES = {"fn_name", "def_name", "args_in_list", "size_args", "args", "bound_symbols", "output",
                    "provenance", "names", "grad_reads", "guards", "layout_reads"}


def _keeps_tracing_state(tracers: list, w: torch.Tensor):
    """fn(x): in-place writes into the input and a view of it, a tensor made at trace time, a captured tensor
    (w) and its .grad, x.contiguous() (a layout fact): each is bookkeeping of the tracer while fn runs."""
    def fn(x):
        if context.current_tracer() is not None:  # (also run eagerly, as the reference)
            tracers.append(weakref.ref(context.current_tracer()))
        view = x[0]
        x.add_(1)
        made = torch.tensor([1.0, 2.0])
        g = w.grad
        return view * w + made + x.contiguous().sum() + (g if g is not None else 0)

    return fn


def _holds_only_the_program(trc) -> None:
    assert set(vars(trc)) <= TRACE_ATTRIBUTES, set(vars(trc)) - TRACE_ATTRIBUTES
    assert not any(isinstance(v, Tracer) for v in vars(trc).values())


def test_a_finished_trace_holds_only_the_program_and_its_tracer_is_gone():
    tracers, w = [], torch.randn(2)
    w.grad = torch.ones(2)
    x = torch.randn(3, 2)
    trc = tf.trace(_keeps_tracing_state(tracers, w), x)
    _holds_only_the_program(trc)
    assert trc.grad_reads and any(b.sym.name == "write_back" for b in trc.bound_symbols)  # (it did all that)
    assert context.current_tracer() is None and context.current_trace() is None
    gc.collect()
    assert len(tracers) == 1 and tracers[0]() is None  # nothing holds the tracer, so nothing through it
    x_alive = weakref.ref(x)
    del x
    gc.collect()
    assert x_alive() is None  # the trace keeps no reference to the caller's tensor


def test_every_trace_a_compile_makes_holds_only_the_program():
    tracers, w = [], torch.randn(2, requires_grad=True)
    w.grad = torch.ones(2)
    jitted = tf.jit(_keeps_tracing_state(tracers, w))
    x = torch.randn(3, 2)
    out = jitted(x.clone())
    torch.testing.assert_close(out, _keeps_tracing_state([], w)(x.clone()))
    out.sum().backward()
    traces = tf.last_traces(jitted) + tf.last_backward_traces(jitted)
    assert len(tf.last_backward_traces(jitted)) > 0
    for trc in traces:
        _holds_only_the_program(trc)
    gc.collect()
    assert tracers and all(t() is None for t in tracers)


# -- eval_shape: the output's shapes and dtypes, nothing computed ----------------------------------
def test_eval_shape_gives_the_outputs_shapes_and_dtypes_as_meta_tensors():
    def fn(x, w, n):
        return {"h": torch.tanh(x @ w).to(torch.float16), "idx": x.argmax(-1), "n": n, "pair": (x.sum(), None)}

    x, w = torch.randn(4, 3), torch.randn(3, 5)
    shapes, real = tf.eval_shape(fn, x, w, 7), fn(x, w, 7)
    assert shapes["n"] == 7 and shapes["pair"][1] is None
    for got, want in ((shapes["h"], real["h"]), (shapes["idx"], real["idx"]), (shapes["pair"][0], real["pair"][0])):
        assert got.device.type == "meta" and got.shape == want.shape and got.dtype == want.dtype


def test_eval_shape_runs_nothing():
    x = torch.ones(3)
    rng = torch.get_rng_state()
    out = tf.eval_shape(lambda x: x.add_(torch.rand(3)).mul(2), x)  # an in-place write and a draw, recorded only
    assert out.device.type == "meta" and out.shape == (3,)
    torch.testing.assert_close(x, torch.ones(3))
    assert torch.equal(torch.get_rng_state(), rng)
    huge = torch.empty(1 << 20, 1 << 20, device="meta")  # 4 TiB: only shapes can be computed on it
    assert tf.eval_shape(lambda a: (a @ a.T).sum(0), huge).shape == (1 << 20,)


def test_eval_shape_refuses_a_size_known_only_when_run():
    with pytest.raises(tf.UnsupportedOpError, match="eval_shape: .* known only when it runs"):
        tf.eval_shape(lambda x: x[x > 0], torch.randn(5))
