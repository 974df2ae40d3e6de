"""The fallback ladder's second rung: torch functions without a symbol run as opaque torch ops."""
import optree
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import thunderfn as tf
from thunderfn.testing import strategies as tst

OPAQUE_CALLS = {
    "searchsorted": lambda x: torch.searchsorted(torch.sort(x, dim=-1).values, x),
    "bucketize": lambda x: torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0])),
    "interpolate": lambda x: F.interpolate(x.unsqueeze(0), scale_factor=2),
    "conv1d": lambda x: F.conv1d(x.unsqueeze(0), torch.ones(2, 3, 2)),
    "linalg_svd": lambda x: torch.linalg.svd(x @ x.mT)[1],
    "kthvalue_named_tuple": lambda x: torch.kthvalue(x, 2, dim=1).values,
    "histc": lambda x: torch.histc(x, bins=5),
    "method_on_proxy": lambda x: x.cummax(0)[0],
}


@pytest.mark.parametrize("fn", OPAQUE_CALLS.values(), ids=OPAQUE_CALLS.keys())
def test_opaque_op_matches_eager(fn):
    x = torch.randn(3, 4)
    torch.testing.assert_close(tf.jit(fn)(x), fn(x))


@pytest.mark.parametrize("executors", [None, ["torch_prims"]], ids=["torch", "torch_prims"])
def test_opaque_op_runs_on_every_executor_path(executors):
    """An opaque op has no decomposition, so even a prims-only run hands it to torch."""
    fn = lambda x: torch.histc(x, bins=3).sin()  # noqa: E731
    x = torch.randn(5)
    torch.testing.assert_close(tf.jit(fn, executors=executors, fallback=executors is None)(x), fn(x))


def test_opaque_op_is_shown_under_its_torch_name():
    jf = tf.jit(lambda x: torch.histc(x, bins=4))
    jf(torch.randn(4))
    computation, execution = str(tf.last_traces(jf)[0]), str(tf.last_traces(jf)[-1])
    assert "t0 = torch.histc(x, bins=4)" in computation and "t0 = torch.histc(x, bins=4)" in execution


def test_aten_operators_run_as_opaque_ops_are_named_by_operator_and_overload():
    """torch.ops.aten overloads (as a torch.compile graph may hold them) have no identifier of their own: each
    is named after its operator and overload, so two in one trace do not both print as torch_op and clash."""
    fn = lambda x: torch.ops.aten.sum.dim_IntList(x, [1], True) + torch.ops.aten.view.default(x, [-1]).sum()  # noqa: E731
    x = torch.randn(3, 4, requires_grad=True)
    jf = tf.jit(fn)
    out = jf(x)
    torch.testing.assert_close(out, fn(x))
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x), torch.autograd.grad(fn(x).sum(), x))
    execution = str(tf.last_traces(jf)[-1])
    assert "aten_sum_dim_IntList(" in execution and "aten_view_default(" in execution


def test_opaque_op_output_metadata_comes_from_meta_kernels():
    trc = tf.trace(lambda x: torch.sort(x.to(torch.float64), 0), torch.randn(3, 2))
    values, indices = trc.bound_symbols[-1].output
    assert (tuple(values.shape), values.dtype, indices.dtype) == ((3, 2), torch.float64, torch.int64)


def test_opaque_op_keeps_torch_named_tuples():
    out = tf.jit(lambda x: torch.kthvalue(x, 1, dim=0))(torch.randn(3, 2))
    assert type(out).__name__ == "kthvalue" and out.values.shape == (2,)


def test_opaque_op_output_feeds_decomposed_ops_and_composes_with_jit_inside_jit():
    inner = tf.jit(lambda x: torch.histc(x, bins=3))
    fn = lambda x: inner(x).softmax(0)  # noqa: E731
    x = torch.rand(6)
    torch.testing.assert_close(tf.jit(fn)(x), torch.histc(x, bins=3).softmax(0))


def test_opaque_op_returning_a_value_is_refused():
    with pytest.raises(tf.UnsupportedOpError, match="torch.equal"):
        tf.jit(lambda x: torch.equal(x, x))(torch.randn(2))


def test_opaque_op_with_out_argument_writes_into_it_as_eager_does():
    x, y_jit, y_eager = torch.randn(3), torch.empty(3), torch.empty(3)
    returned = tf.jit(lambda a, out: torch.histc(a, bins=3, out=out))(x, y_jit)
    torch.histc(x, bins=3, out=y_eager)
    torch.testing.assert_close(y_jit, y_eager)
    assert returned is y_jit


def test_symbol_without_a_decomposition_for_a_variant_falls_back_to_the_opaque_op():
    """A symbol raising DecompositionUnavailable is recorded as its torch function, run by torch."""
    import thunderfn.torch as ltorch
    from thunderfn.core.interception import handlers
    from thunderfn.core.symbol import DecompositionUnavailable

    @ltorch.torchsymbol(torch.trace, name="trace_for_test")
    def trace_for_test(a):
        if a.shape[0] != a.shape[1]:
            raise DecompositionUnavailable("only square matrices are decomposed here")
        return (a * torch.eye(a.shape[0])).sum()

    try:
        rectangular = torch.randn(2, 3)
        jf = tf.jit(lambda a: torch.trace(a) * 2)
        torch.testing.assert_close(jf(rectangular), torch.trace(rectangular) * 2)
        assert "t0 = torch.trace(a)" in str(tf.last_traces(jf)[0])
    finally:
        handlers.pop(torch.trace, None)
        ltorch.symbols.pop("trace_for_test", None)


def test_the_forward_reads_the_generator_state_only_before_opaque_ops_that_may_draw():
    # the backward runs an opaque op again (torch.func): only one that may draw needs the state it first ran
    # from; reading it before a convolution would cost every training step a copy of the generator state
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 8, 8)
    jitted = tf.jit(conv)
    jitted(x).sum().backward()
    assert "get_rng_state" not in str(tf.last_traces(jitted)[-1])
    expected = torch.autograd.grad(conv(x).sum(), conv.weight)[0]
    torch.testing.assert_close(conv.weight.grad, expected)


def test_an_opaque_op_that_draws_inside_gets_the_gradient_of_its_own_draw():
    def f(x):
        return (torch.nn.functional.gumbel_softmax(x, tau=0.5) * torch.arange(5.0)).sum()

    x = torch.randn(3, 5, requires_grad=True)
    torch.manual_seed(0)
    tf.jit(f)(x).backward()
    got, x.grad = x.grad, None
    torch.manual_seed(0)
    f(x).backward()
    torch.testing.assert_close(got, x.grad)


def test_an_opaque_op_returning_none_is_batched_and_differentiated_forward():
    """torch.func takes tensors only: the Nones an op returns (gradients not asked for) are set aside."""
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64)

    def weight_grad(g, x):
        mask = [False, True, False]  # (grad_input, grad_weight, grad_bias): two Nones around the weight's
        return torch.ops.aten.convolution_backward.default(g, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                           mask)[1]

    g, x = torch.randn(5, 2, 4, 6, 6, dtype=torch.float64), torch.randn(5, 2, 3, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(tf.vmap(weight_grad)(g, x), torch.func.vmap(weight_grad)(g, x))
    torch.testing.assert_close(tf.jvp(weight_grad, (g[0], x[0]), (g[1], x[1])),
                               torch.func.jvp(weight_grad, (g[0], x[0]), (g[1], x[1])))


# Ops torch gives no meta kernel, traced from a shape rule of their own (torch/opaque.py's _SHAPE_RULES): each
# output's shape and dtype as eager's, and under vmap batched by torch.func.vmap when the function runs.
# torch has no meta kernel for these: their shapes are ruled from the arguments' shapes (shape_rule), and torch
# computes the values when the compiled function runs
def _lstsq(driver):
    return lambda a, b: torch.linalg.lstsq(a, b, driver=driver)


SHAPE_RULE_CALLS = {
    "geqrf_tall": (torch.geqrf, [(5, 3)]),
    "geqrf_wide_batched": (torch.geqrf, [(2, 3, 5)]),
    "histogram_bin_count": (lambda x: torch.histogram(x, 4), [(7,)]),
    "histogram_edges": (lambda x, edges: torch.histogram(x, edges.sort().values), [(7,), (3,)]),
    "histogramdd": (lambda x: torch.histogramdd(x, [2, 3]), [(6, 2)]),  # (vmap: torch.func has no batched form)
    **{f"lstsq_{driver}_{m}x{n}": (_lstsq(driver), [(m, n), (m, 2)])
       for driver in ("gels", "gelsy", "gelsd", "gelss") for m, n in ((4, 3), (2, 3))
       if not (m > n and driver in ("gelsd", "gelss"))},
    "lstsq_vector_rhs": (_lstsq("gelsd"), [(3, 3), (3,)]),
    "istft": (lambda x: torch.istft(torch.complex(x[0], x[1]), 8, window=torch.hann_window(8, dtype=x.dtype)),
              [(2, 5, 4)]),
    "istft_length_complex": (lambda x: torch.istft(torch.complex(x[0], x[1]), 5, length=7, onesided=False,
                                                   return_complex=True), [(2, 5, 3)]),
}


@pytest.mark.parametrize("name", SHAPE_RULE_CALLS)
def test_an_op_without_a_meta_kernel_traces_from_its_shape_rule(name):
    fn, shapes = SHAPE_RULE_CALLS[name]
    xs = [torch.randn(s, dtype=torch.float64) for s in shapes]
    expected, got = fn(*xs), tf.jit(fn)(*xs)
    assert type(got) is type(expected)
    assert [(t.shape, t.dtype) for t in optree.tree_leaves(got)] == [(t.shape, t.dtype)
                                                                     for t in optree.tree_leaves(expected)]
    torch.testing.assert_close(got, expected)


def test_lstsq_whose_residuals_depend_on_the_rank_is_refused():
    """gelsd and gelss return residuals (m > n) only where every matrix has full rank: only values tell."""
    with pytest.raises(tf.errors.UnsupportedOpError, match="every matrix has full rank"):
        tf.jit(_lstsq("gelsd"))(torch.randn(4, 3), torch.randn(4, 2))


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([n for n in SHAPE_RULE_CALLS if n != "lstsq_vector_rhs"]), st.integers(1, 3),
       st.integers(0, 2**16))
def test_vmap_of_an_op_traced_from_its_shape_rule_is_the_op_on_each_example(name, batch, seed):
    """vmap(f)(xs)[i] == f(xs[i]) for every example i (torch.func.vmap cannot batch lstsq with a vector
    right-hand side: below)."""
    fn, shapes = SHAPE_RULE_CALLS[name]
    xs = [tst.make((batch, *s), torch.float64, seed + i) for i, s in enumerate(shapes)]
    out = tf.vmap(fn)(*xs)
    for i in range(batch):
        torch.testing.assert_close(optree.tree_map(lambda t: t[i], out), fn(*[x[i] for x in xs]))


def test_an_opaque_op_torch_func_fails_to_batch_is_a_batching_error_and_an_examples_own_error_is_torchs():
    """torch.func.vmap raises for lstsq with a vector right-hand side although every example runs: its failure,
    named. Where an example itself raises, that error is raised, as a loop over the examples would."""
    with pytest.raises(tf.errors.BatchingError, match="vmap cannot batch linalg_lstsq"):
        tf.vmap(_lstsq("gelsd"))(torch.randn(2, 3, 3), torch.randn(2, 3))
    sorted_by = torch.tensor([[0, 1, 2], [5, 5, 5]])
    with pytest.raises(RuntimeError, match="sorter index out of range") as info:
        tf.vmap(lambda x, s: torch.searchsorted(x, x, sorter=s))(torch.randn(2, 3), sorted_by)
    assert not isinstance(info.value, tf.errors.BatchingError)
RULED_SHAPES = {
    "geqrf_batched": (torch.geqrf, (torch.randn(2, 5, 3),)),
    "geqrf_wide_method": (lambda a: a.geqrf(), (torch.randn(3, 5),)),
    "histogram_count": (lambda a: torch.histogram(a, 4, density=True), (torch.randn(5, 3),)),
    "histogram_edges": (lambda a, e: a.histogram(e, weight=a.abs()), (torch.randn(6), torch.tensor([-1.0, 0.0, 2.0]))),
    "histogramdd_count": (lambda a: torch.histogramdd(a, 3), (torch.randn(5, 2),)),
    "histogramdd_counts": (lambda a: torch.histogramdd(a, [2, 3, 4], density=True), (torch.randn(7, 3),)),
    "histogramdd_edges": (lambda a, e: torch.histogramdd(a, [e, e[1:]]),
                          (torch.randn(5, 2), torch.tensor([-1.0, 0.0, 2.0]))),
    "lstsq_default_vector": (torch.linalg.lstsq, (torch.randn(4, 3), torch.randn(4))),
    "lstsq_gels_tall_batched": (_lstsq("gels"), (torch.randn(2, 4, 3), torch.randn(2, 4, 2))),
    "lstsq_gelsd_wide": (_lstsq("gelsd"), (torch.randn(2, 3), torch.randn(2, 2))),
    "lstsq_gelss_square_complex": (_lstsq("gelss"), (torch.randn(3, 3, dtype=torch.complex64),
                                                     torch.randn(3, 2, dtype=torch.complex64))),
    "lstsq_gelsy_tall": (_lstsq("gelsy"), (torch.randn(5, 3), torch.randn(5, 2))),
}


@pytest.mark.parametrize("fn, args", RULED_SHAPES.values(), ids=RULED_SHAPES.keys())
def test_ops_without_a_meta_kernel_run_as_opaque_ops_with_ruled_shapes(fn, args):
    expected = fn(*args)
    got = tf.jit(fn)(*args)
    assert type(got) is type(expected)  # torch.return_types.*, histogramdd's edges a tuple
    torch.testing.assert_close(got, expected)


def test_scaled_mm_runs_though_its_meta_kernel_asks_for_strides_proxies_do_not_carry():
    """torch._scaled_mm's meta kernel wants mat2 column-major: its shapes come from one that is, whatever the
    strides of the tensor torch gets when the compiled function runs (its CPU kernel takes either)."""
    a = torch.randn(15, 16).to(torch.float8_e4m3fn)
    b = torch.randn(32, 16).to(torch.float8_e4m3fn)
    scale = torch.tensor(1.0)
    given = lambda a, b, s: torch._scaled_mm(a, b, s, s, out_dtype=torch.bfloat16)  # noqa: E731
    made = lambda a, b, s: torch._scaled_mm(a, b.t(), s, s)  # noqa: E731
    for mat2 in (b.t(), b.t().contiguous()):
        torch.testing.assert_close(tf.jit(given)(a, mat2, scale), given(a, mat2, scale))
    torch.testing.assert_close(tf.jit(made)(a, b, scale), made(a, b, scale))


def test_lstsq_residuals_that_exist_only_at_full_rank_are_refused_with_the_drivers_that_work():
    a, b = torch.randn(5, 3), torch.randn(5, 2)
    with pytest.raises(tf.UnsupportedOpError, match="driver='gelsy' or 'gels'"):
        tf.jit(_lstsq("gelsd"))(a, b)
    with pytest.raises(RuntimeError, match="input.size\\(-2\\) should match other.size\\(-2\\)"):  # torch's words
        tf.jit(_lstsq("gels"))(a, b[:4])


@pytest.mark.parametrize("fn, advice", [
    (lambda x: torch.allclose(x, x + 1e-9), r"torch.isclose\(input, other, rtol, atol, equal_nan\).all\(\)"),
    (lambda x: x.equal(x), r"torch.eq\(input, other\).all\(\)"),
    (lambda x: torch.tensor_split(x, torch.tensor([1, 3])), "list of ints"),
    (lambda x: x.tensor_split(torch.tensor(2)), "list of ints"),
], ids=["allclose", "equal", "tensor_split_indices", "tensor_split_sections"])
def test_ops_whose_results_are_decided_by_values_are_refused_with_what_to_do_instead(fn, advice):
    with pytest.raises(tf.UnsupportedOpError, match=advice):
        tf.jit(fn)(torch.randn(5))


def test_tensor_split_with_python_ints_runs_as_an_opaque_op():
    x = torch.randn(5, 4)
    fn = lambda x: (torch.tensor_split(x, [1, 3]), x.tensor_split(3, dim=1))  # noqa: E731
    torch.testing.assert_close(tf.jit(fn)(x), fn(x))


@pytest.mark.parametrize("fn, args, says", [
    (lambda a: a.to_sparse(), (torch.randn(3, 3),), "makes a sparse tensor"),
    (lambda s, d: torch.sparse.mm(s, d, "sum"), (torch.eye(3).to_sparse_csr(), torch.randn(3, 2)),
     "takes a torch.sparse_csr tensor"),
], ids=["to_sparse", "sparse_mm_reduce"])
def test_sparse_tensors_where_an_op_without_a_symbol_meets_them_are_refused_as_sparse(fn, args, says):
    with pytest.raises(tf.UnsupportedOpError, match=f"{says}: thunderfn traces strided tensors only"):
        tf.jit(fn)(*args)
