"""The fallback ladder's second rung: torch functions without a symbol run as opaque torch ops."""
import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf

OPAQUE_CALLS = {
    "cumsum": lambda x: torch.cumsum(x, 1) * 2,
    "sort": lambda x: torch.sort(x, dim=-1).values + 1,
    "topk_indices": lambda x: torch.topk(x, 2).indices,
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
    fn = lambda x: torch.cumsum(x, 0).sin()  # noqa: E731
    x = torch.randn(5)
    torch.testing.assert_close(tf.jit(fn, executors=executors, fallback=executors is None)(x), fn(x))


def test_opaque_op_is_shown_under_its_torch_name():
    jf = tf.jit(lambda x: torch.cumsum(x, 0))
    jf(torch.randn(4))
    computation, execution = str(tf.last_traces(jf)[0]), str(tf.last_traces(jf)[-1])
    assert "t0 = torch.cumsum(x, 0)" in computation and "t0 = torch.cumsum(x, 0)" in execution


def test_opaque_op_output_metadata_comes_from_meta_kernels():
    trc = tf.trace(lambda x: torch.sort(x.to(torch.float64), 0), torch.randn(3, 2))
    values, indices = trc.bound_symbols[-1].output
    assert (tuple(values.shape), values.dtype, indices.dtype) == ((3, 2), torch.float64, torch.int64)


def test_opaque_op_keeps_torch_named_tuples():
    out = tf.jit(lambda x: torch.kthvalue(x, 1, dim=0))(torch.randn(3, 2))
    assert type(out).__name__ == "kthvalue" and out.values.shape == (2,)


def test_opaque_op_output_feeds_decomposed_ops_and_composes_with_jit_inside_jit():
    inner = tf.jit(lambda x: torch.cumprod(x, 0))
    fn = lambda x: inner(x).softmax(0)  # noqa: E731
    x = torch.rand(6)
    torch.testing.assert_close(tf.jit(fn)(x), torch.cumprod(x, 0).softmax(0))


def test_opaque_op_returning_a_value_is_refused():
    with pytest.raises(tf.UnsupportedOpError, match="torch.equal"):
        tf.jit(lambda x: torch.equal(x, x))(torch.randn(2))


def test_opaque_op_with_out_argument_is_refused():
    with pytest.raises(tf.UnsupportedOpError, match="out="):
        tf.jit(lambda x, y: torch.cumsum(x, 0, out=y))(torch.randn(2), torch.empty(2))
