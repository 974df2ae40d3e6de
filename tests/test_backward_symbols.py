"""aten's backward kernels as torch-language symbols (thunderfn/torch/aten_backward.py): under jit the torch
executor runs each as the aten op itself (bit for bit), its decomposition agrees with the aten op on the
prims-only executor, a trace shows it by name, and the decomposition differentiates like eager autograd
differentiates the aten op (a second derivative), in float64.

Each case is written once against `ops`: `EAGER` (the aten ops) or `ltorch` (the symbols)."""
import types

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
import thunderfn.torch as ltorch

aten = torch.ops.aten
EAGER = types.SimpleNamespace(
    gelu_backward=aten.gelu_backward.default, tanh_backward=aten.tanh_backward.default,
    sigmoid_backward=aten.sigmoid_backward.default, threshold_backward=aten.threshold_backward.default,
    softmax_backward_data=aten._softmax_backward_data.default,
    log_softmax_backward_data=aten._log_softmax_backward_data.default,
    native_layer_norm=aten.native_layer_norm.default,
    native_layer_norm_backward=aten.native_layer_norm_backward.default,
    native_batch_norm=aten.native_batch_norm.default,
    native_batch_norm_legit_functional=aten._native_batch_norm_legit_functional.default,
    native_batch_norm_backward=aten.native_batch_norm_backward.default,
    native_group_norm=aten.native_group_norm.default,
    native_group_norm_backward=aten.native_group_norm_backward.default, nll_loss_forward=aten.nll_loss_forward.default,
    nll_loss_backward=aten.nll_loss_backward.default, embedding_dense_backward=aten.embedding_dense_backward.default,
)
F32, F64 = torch.float32, torch.float64
NONE, MEAN, SUM = 0, 1, 2  # aten's reduction enum


def randn(*shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def wide(*shape, dtype, seed):
    """Normal samples spread out, with 0, ±8 and a tiny value among them (gelu's and relu's edges)."""
    x = randn(*shape, dtype=dtype, seed=seed) * 3
    x.view(-1)[:4] = torch.tensor([0.0, -8.0, 8.0, 1e-3], dtype=dtype)
    return x


def ln_stats(x, shape, w=None, b=None):
    return aten.native_layer_norm.default(x, shape, w, b, 1e-5)[1:]


TARGETS = torch.tensor([0, 4, -100, 2, 4, 1])
IGNORED = torch.full((6,), -100)


def logp(dtype, seed=3):
    return randn(6, 5, dtype=dtype, seed=seed).log_softmax(1)


def total_weight(x, target, weight, reduction, ignore_index=-100):
    return aten.nll_loss_forward.default(x, target, weight, reduction, ignore_index)[1]


# -- cases: id -> (symbol name, fn(ops, *args), make_args(dtype) -> args) ----------------------------------
CASES: dict = {}


def case(id, name, fn, make_args):
    CASES[id] = (name, fn, make_args)


case("gelu_backward", "gelu_backward", lambda ops, g, x: ops.gelu_backward(g, x),
     lambda d: (randn(4, 5, dtype=d, seed=0), wide(4, 5, dtype=d, seed=1)))
case("gelu_backward-tanh", "gelu_backward", lambda ops, g, x: ops.gelu_backward(g, x, approximate="tanh"),
     lambda d: (randn(4, 5, dtype=d, seed=0), wide(4, 5, dtype=d, seed=1)))
case("tanh_backward", "tanh_backward", lambda ops, g, y: ops.tanh_backward(g, y),
     lambda d: (randn(4, 5, dtype=d, seed=0), wide(4, 5, dtype=d, seed=1).tanh()))
case("sigmoid_backward", "sigmoid_backward", lambda ops, g, y: ops.sigmoid_backward(g, y),
     lambda d: (randn(4, 5, dtype=d, seed=0), wide(4, 5, dtype=d, seed=1).sigmoid()))
case("threshold_backward-relu", "threshold_backward", lambda ops, g, x: ops.threshold_backward(g, x, 0),
     lambda d: (randn(4, 5, dtype=d, seed=0), wide(4, 5, dtype=d, seed=1)))
case("threshold_backward-0.5", "threshold_backward", lambda ops, g, x: ops.threshold_backward(g, x, 0.5),
     lambda d: (randn(4, 5, dtype=d, seed=0), wide(4, 5, dtype=d, seed=1)))

case("softmax_backward_data-last-dim", "softmax_backward_data",
     lambda ops, g, y: ops.softmax_backward_data(g, y, -1, y.dtype),
     lambda d: (randn(3, 4, 5, dtype=d, seed=0), randn(3, 4, 5, dtype=d, seed=1).softmax(-1)))
case("softmax_backward_data-dim-1-of-3", "softmax_backward_data",
     lambda ops, g, y: ops.softmax_backward_data(g, y, 1, y.dtype),
     lambda d: (randn(3, 4, 5, dtype=d, seed=0), randn(3, 4, 5, dtype=d, seed=1).softmax(1)))
case("softmax_backward_data-0d", "softmax_backward_data",
     lambda ops, g, y: ops.softmax_backward_data(g, y, 0, y.dtype),
     lambda d: (randn(dtype=d, seed=0), torch.ones((), dtype=d)))
case("log_softmax_backward_data-last-dim", "log_softmax_backward_data",
     lambda ops, g, y: ops.log_softmax_backward_data(g, y, -1, y.dtype),
     lambda d: (randn(3, 4, 5, dtype=d, seed=0), randn(3, 4, 5, dtype=d, seed=1).log_softmax(-1)))
case("log_softmax_backward_data-dim-0", "log_softmax_backward_data",
     lambda ops, g, y: ops.log_softmax_backward_data(g, y, 0, y.dtype),
     lambda d: (randn(3, 4, 5, dtype=d, seed=0), randn(3, 4, 5, dtype=d, seed=1).log_softmax(0)))

case("native_layer_norm", "native_layer_norm", lambda ops, x, w, b: ops.native_layer_norm(x, [5], w, b, 1e-5),
     lambda d: (randn(3, 4, 5, dtype=d, seed=0) * 2 + 1, randn(5, dtype=d, seed=1), randn(5, dtype=d, seed=2)))
case("native_layer_norm-2-dims-no-weight-no-bias", "native_layer_norm",
     lambda ops, x: ops.native_layer_norm(x, [4, 5], None, None, 1e-5), lambda d: (randn(3, 4, 5, dtype=d, seed=0),))
case("native_layer_norm-weight-only", "native_layer_norm",
     lambda ops, x, w: ops.native_layer_norm(x, (5,), w, None, 1e-3),
     lambda d: (randn(2, 5, dtype=d, seed=0), randn(5, dtype=d, seed=1)))


def _ln_backward_args(d, shape=(5,), params=True):
    x = randn(3, 4, 5, dtype=d, seed=0) * 2 + 1
    w, b = (randn(*shape, dtype=d, seed=1), randn(*shape, dtype=d, seed=2)) if params else (None, None)
    return (randn(3, 4, 5, dtype=d, seed=3), x, *ln_stats(x, list(shape), w, b), w, b)


case("native_layer_norm_backward", "native_layer_norm_backward",
     lambda ops, g, x, m, r, w, b: ops.native_layer_norm_backward(g, x, [5], m, r, w, b, [True, True, True]),
     _ln_backward_args)
case("native_layer_norm_backward-no-weight-no-bias", "native_layer_norm_backward",
     lambda ops, g, x, m, r, w, b: ops.native_layer_norm_backward(g, x, [4, 5], m, r, w, b, [True, False, False]),
     lambda d: _ln_backward_args(d, (4, 5), params=False))
case("native_layer_norm_backward-parameters-only", "native_layer_norm_backward",
     lambda ops, g, x, m, r, w, b: ops.native_layer_norm_backward(g, x, [4, 5], m, r, w, b, [False, True, True]),
     lambda d: _ln_backward_args(d, (4, 5)))



def _bn_args(d, *shape, params=True):
    x = randn(*shape, dtype=d, seed=0) * 2 + 1
    c = shape[1]
    w, b = (randn(c, dtype=d, seed=1), randn(c, dtype=d, seed=2)) if params else (None, None)
    return x, w, b, randn(c, dtype=d, seed=3), randn(c, dtype=d, seed=4).abs() + 0.5


def bn_stats(x, w=None, b=None):
    return aten.native_batch_norm.default(x, w, b, None, None, True, 0.1, 1e-5)[1:]


case("native_batch_norm-training", "native_batch_norm",
     lambda ops, x, w, b, m, v: ops.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5),
     lambda d: _bn_args(d, 4, 3, 5))
case("native_batch_norm-training-4d-no-weight-no-bias", "native_batch_norm",
     lambda ops, x, w, b, m, v: ops.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-3),
     lambda d: _bn_args(d, 2, 3, 2, 4, params=False))
case("native_batch_norm-evaluation", "native_batch_norm",
     lambda ops, x, w, b, m, v: ops.native_batch_norm(x, w, b, m, v, False, 0.1, 1e-5), lambda d: _bn_args(d, 4, 3))
case("native_batch_norm_legit_functional-training", "native_batch_norm_legit_functional",
     lambda ops, x, w, b, m, v: ops.native_batch_norm_legit_functional(x, w, b, m, v, True, 0.1, 1e-5),
     lambda d: _bn_args(d, 4, 3, 5))
case("native_batch_norm_legit_functional-training-no-weight-momentum-1", "native_batch_norm_legit_functional",
     lambda ops, x, w, b, m, v: ops.native_batch_norm_legit_functional(x, None, b, m, v, True, 1.0, 1e-3),
     lambda d: _bn_args(d, 6, 3))
case("native_batch_norm_legit_functional-evaluation", "native_batch_norm_legit_functional",
     lambda ops, x, w, b, m, v: ops.native_batch_norm_legit_functional(x, w, b, m, v, False, 0.1, 1e-5),
     lambda d: _bn_args(d, 4, 3, 5))
case("native_batch_norm_backward-training", "native_batch_norm_backward",
     lambda ops, g, x, w, sm, si: ops.native_batch_norm_backward(g, x, w, None, None, sm, si, True, 1e-5,
                                                                 [True, True, True]),
     lambda d: (randn(4, 3, 5, dtype=d, seed=5), *_bn_args(d, 4, 3, 5)[:2], *bn_stats(*_bn_args(d, 4, 3, 5)[:3])))
case("native_batch_norm_backward-training-input-only-no-weight", "native_batch_norm_backward",
     lambda ops, g, x, sm, si: ops.native_batch_norm_backward(g, x, None, None, None, sm, si, True, 1e-5,
                                                              [True, False, False]),
     lambda d: (randn(2, 3, 2, 2, dtype=d, seed=5), _bn_args(d, 2, 3, 2, 2)[0], *bn_stats(_bn_args(d, 2, 3, 2, 2)[0])))
case("native_batch_norm_backward-training-parameters-only", "native_batch_norm_backward",
     lambda ops, g, x, w, sm, si: ops.native_batch_norm_backward(g, x, w, None, None, sm, si, True, 1e-5,
                                                                 [False, True, True]),
     lambda d: (randn(4, 3, 5, dtype=d, seed=5), *_bn_args(d, 4, 3, 5)[:2], *bn_stats(*_bn_args(d, 4, 3, 5)[:3])))
case("native_batch_norm_backward-evaluation", "native_batch_norm_backward",
     lambda ops, g, x, w, m, v: ops.native_batch_norm_backward(g, x, w, m, v, None, None, False, 1e-5,
                                                               [True, True, True]),
     lambda d: (randn(4, 3, dtype=d, seed=5), *_bn_args(d, 4, 3)[:2], *_bn_args(d, 4, 3)[3:]))



def _gn_args(d, params=True):
    x = randn(2, 6, 3, 2, dtype=d, seed=0) * 2 + 1
    return (x, randn(6, dtype=d, seed=1), randn(6, dtype=d, seed=2)) if params else (x, None, None)


def gn_stats(x, w=None, b=None, groups=3):
    return aten.native_group_norm.default(x, w, b, 2, 6, 6, groups, 1e-5)[1:]


case("native_group_norm", "native_group_norm", lambda ops, x, w, b: ops.native_group_norm(x, w, b, 2, 6, 6, 3, 1e-5),
     _gn_args)
case("native_group_norm-no-weight-no-bias-one-group", "native_group_norm",
     lambda ops, x, w, b: ops.native_group_norm(x, w, b, 2, 6, 6, 1, 1e-3), lambda d: _gn_args(d, params=False))
case("native_group_norm_backward", "native_group_norm_backward",
     lambda ops, g, x, w, m, r: ops.native_group_norm_backward(g, x, m, r, w, 2, 6, 6, 3, [True, True, True]),
     lambda d: (randn(2, 6, 3, 2, dtype=d, seed=5), *_gn_args(d)[:2], *gn_stats(*_gn_args(d))))
case("native_group_norm_backward-input-only-no-weight", "native_group_norm_backward",
     lambda ops, g, x, m, r: ops.native_group_norm_backward(g, x, m, r, None, 2, 6, 6, 3, [True, False, False]),
     lambda d: (randn(2, 6, 3, 2, dtype=d, seed=5), _gn_args(d)[0], *gn_stats(_gn_args(d)[0])))

for _reduction, _rname in ((NONE, "none"), (MEAN, "mean"), (SUM, "sum")):
    case(f"nll_loss_forward-{_rname}-ignored-rows", "nll_loss_forward",
         lambda ops, x, t, r=_reduction: ops.nll_loss_forward(x, t, None, r, -100), lambda d: (logp(d), TARGETS))
    case(f"nll_loss_forward-{_rname}-weight", "nll_loss_forward",
         lambda ops, x, t, w, r=_reduction: ops.nll_loss_forward(x, t, w, r, -100),
         lambda d: (logp(d), TARGETS, torch.rand(5, generator=torch.Generator().manual_seed(4), dtype=d)))
    case(f"nll_loss_forward-{_rname}-all-ignored", "nll_loss_forward",
         lambda ops, x, t, r=_reduction: ops.nll_loss_forward(x, t, None, r, -100), lambda d: (logp(d), IGNORED))
    case(f"nll_loss_forward-{_rname}-1d-input", "nll_loss_forward",
         lambda ops, x, t, r=_reduction: ops.nll_loss_forward(x, t, None, r, -100),
         lambda d: (logp(d)[0], torch.tensor(3)))
    case(f"nll_loss_backward-{_rname}-weight-ignored-rows", "nll_loss_backward",
         lambda ops, g, x, t, w, tw, r=_reduction: ops.nll_loss_backward(g, x, t, w, r, -100, tw),
         lambda d, r=_reduction: (randn(*((6,) if r == NONE else ()), dtype=d, seed=5), logp(d), TARGETS,
                                  torch.rand(5, generator=torch.Generator().manual_seed(4), dtype=d),
                                  total_weight(logp(d), TARGETS,
                                               torch.rand(5, generator=torch.Generator().manual_seed(4),
                                                          dtype=d), r)))
    case(f"nll_loss_backward-{_rname}-all-ignored", "nll_loss_backward",
         lambda ops, g, x, t, tw, r=_reduction: ops.nll_loss_backward(g, x, t, None, r, -100, tw),
         lambda d, r=_reduction: (randn(*((6,) if r == NONE else ()), dtype=d, seed=5), logp(d), IGNORED,
                                  total_weight(logp(d), IGNORED, None, r)))
    case(f"nll_loss_backward-{_rname}-1d-input", "nll_loss_backward",
         lambda ops, g, x, t, tw, r=_reduction: ops.nll_loss_backward(g, x, t, None, r, -100, tw),
         lambda d, r=_reduction: (randn(dtype=d, seed=5), logp(d)[0], torch.tensor(3),
                                  total_weight(logp(d)[0], torch.tensor(3), None, r)))
case("nll_loss_forward-ignore-index-is-a-class", "nll_loss_forward",
     lambda ops, x, t: ops.nll_loss_forward(x, t, None, MEAN, 4), lambda d: (logp(d), TARGETS.clamp(min=0)))
case("nll_loss_backward-ignore-index-is-a-class", "nll_loss_backward",
     lambda ops, g, x, t, tw: ops.nll_loss_backward(g, x, t, None, MEAN, 4, tw),
     lambda d: (randn(dtype=d, seed=5), logp(d), TARGETS.clamp(min=0),
                total_weight(logp(d), TARGETS.clamp(min=0), None, MEAN, 4)))

INDICES = torch.tensor([[1, 2, 1], [6, 1, 0]])
for _pad, _scale, _eid in ((-1, False, "plain"), (1, False, "padding"), (-1, True, "scale-by-freq"),
                           (1, True, "padding-scale-by-freq")):
    case(f"embedding_dense_backward-{_eid}", "embedding_dense_backward",
         lambda ops, g, i, p=_pad, s=_scale: ops.embedding_dense_backward(g, i, 7, p, s),
         lambda d: (randn(2, 3, 4, dtype=d, seed=0), INDICES))
case("embedding_dense_backward-int32-indices", "embedding_dense_backward",
     lambda ops, g, i: ops.embedding_dense_backward(g, i, 7, 2, False),
     lambda d: (randn(2, 3, 4, dtype=d, seed=0), INDICES.int()))

DTYPES = pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
ALL_CASES = pytest.mark.parametrize("id", list(CASES))


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


def _call(id, ops, dtype):
    name, fn, make_args = CASES[id]
    args = make_args(dtype)
    return (lambda *a: fn(ops, *a)), args


@ALL_CASES
@DTYPES
def test_symbol_under_jit_runs_the_aten_kernel_bit_for_bit(id, dtype):
    subject, args = _call(id, ltorch, dtype)
    reference, _ = _call(id, EAGER, dtype)
    jitted = tf.jit(subject)
    got, expected = _outputs(jitted(*args)), _outputs(reference(*args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if e is not None:  # equal bits, NaN where aten gives NaN (mean over no counted row)
            assert g.dtype == e.dtype and torch.equal(g.isnan(), e.isnan())
            assert torch.equal(g.nan_to_num(0.0), e.nan_to_num(0.0))
    assert f"aten_{CASES[id][0]}(" in str(tf.last_traces(jitted)[-1])


@ALL_CASES
@DTYPES
def test_decomposition_on_prims_matches_the_aten_kernel(id, dtype):
    subject, args = _call(id, ltorch, dtype)
    reference, _ = _call(id, EAGER, dtype)
    jitted = tf.jit(subject, executors=["torch_prims"], fallback=False)
    got, expected = _outputs(jitted(*args)), _outputs(reference(*args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(g, e, equal_nan=True, rtol=1e-5 if dtype is F32 else 1e-7,
                                       atol=1e-5 if dtype is F32 else 1e-7)
    assert "aten_" not in str(tf.last_traces(jitted)[-1])


@ALL_CASES
def test_trace_shows_the_symbol_by_name(id):
    subject, args = _call(id, ltorch, F32)
    assert f"ltorch.{CASES[id][0]}(" in str(tf.trace(subject, *args))


def test_aten_ops_called_while_tracing_are_the_symbols():
    g, x = randn(3, dtype=F32, seed=0), randn(3, dtype=F32, seed=1)
    trc = str(tf.trace(lambda g, x: aten.gelu_backward.default(g, x, approximate="tanh") * 2, g, x))
    assert "ltorch.gelu_backward(g, x, approximate='tanh')" in trc


def test_one_trace_runs_several_aten_kernels():
    g, x = randn(3, 4, dtype=F32, seed=0), randn(3, 4, dtype=F32, seed=1)
    fn = lambda g, x: ltorch.tanh_backward(g, x.tanh()) + ltorch.sigmoid_backward(g, x.sigmoid())  # noqa: E731
    jitted = tf.jit(fn)
    assert torch.equal(jitted(g, x), aten.tanh_backward(g, x.tanh()) + aten.sigmoid_backward(g, x.sigmoid()))
    assert "aten_tanh_backward(" in str(tf.last_traces(jitted)[-1])


# -- second derivatives: the decomposition differentiated vs eager autograd through the aten op ------------
_cotangents: dict = {}


def weighted_sum(outs):
    """A scalar from the outputs (None skipped) whose cotangent is not all ones: fixed random weights per shape,
    made the first time a shape is met, which must be outside tracing."""
    total = 0
    for out in _outputs(outs):
        if out is not None:
            key = tuple(out.shape)
            if key not in _cotangents:
                _cotangents[key] = torch.randn(key,
                                               generator=torch.Generator().manual_seed(len(_cotangents)), dtype=F64)
            total = total + (out * _cotangents[key]).sum()
    return total


# id -> (fn(ops, *args) -> outputs, make_args() -> args, argnums differentiated); float64
GRAD_CASES: dict = {
    "gelu_backward": (CASES["gelu_backward"][1], lambda: CASES["gelu_backward"][2](F64), (0, 1)),
    "gelu_backward-tanh": (CASES["gelu_backward-tanh"][1], lambda: CASES["gelu_backward-tanh"][2](F64), (0, 1)),
    "tanh_backward": (CASES["tanh_backward"][1], lambda: CASES["tanh_backward"][2](F64), (0, 1)),
    "sigmoid_backward": (CASES["sigmoid_backward"][1], lambda: CASES["sigmoid_backward"][2](F64), (0, 1)),
    "threshold_backward": (CASES["threshold_backward-relu"][1],
                           lambda: CASES["threshold_backward-relu"][2](F64), (0, 1)),
    "softmax_backward_data": (CASES["softmax_backward_data-dim-1-of-3"][1],
                              lambda: CASES["softmax_backward_data-dim-1-of-3"][2](F64), (0, 1)),
    "log_softmax_backward_data": (CASES["log_softmax_backward_data-dim-0"][1],
                                  lambda: CASES["log_softmax_backward_data-dim-0"][2](F64), (0, 1)),
    # torch treats mean and rstd as outputs without a gradient: only the output carries a cotangent
    "native_layer_norm": (lambda ops, x, w, b: ops.native_layer_norm(x, [5], w, b, 1e-5)[0],
                          lambda: CASES["native_layer_norm"][2](F64), (0, 1, 2)),
    # layer_norm's double backward: mean and rstd recomputed from the input, as autograd sees them
    "native_layer_norm_backward": (
        lambda ops, g, x, w, b: ops.native_layer_norm_backward(g, x, [5],
                                                               *ops.native_layer_norm(x, [5], w, b, 1e-5)[1:], w, b,
                                                               [True, True, True]),
        lambda: (randn(3, 4, 5, dtype=F64, seed=3), randn(3, 4, 5, dtype=F64, seed=0), randn(5, dtype=F64, seed=1),
                 randn(5, dtype=F64, seed=2)), (0, 1, 2)),
    "native_layer_norm_backward-no-weight": (
        lambda ops, g, x: ops.native_layer_norm_backward(
            g, x, [4, 5], *ops.native_layer_norm(x, [4, 5], None, None, 1e-5)[1:], None, None, [True, False, False]),
        lambda: (randn(3, 4, 5, dtype=F64, seed=3), randn(3, 4, 5, dtype=F64, seed=0)), (0, 1)),
    # torch treats save_mean and save_invstd as outputs without a gradient, and refuses to differentiate the running
    # statistics: evaluation mode differentiates input, weight and bias
    "native_batch_norm-training": (lambda ops, x, w, b: ops.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)[0],
                                   lambda: _bn_args(F64, 4, 3, 5)[:3], (0, 1, 2)),
    "native_batch_norm-evaluation": (
        lambda ops, x, w, b, m, v: ops.native_batch_norm(x, w, b, m, v, False, 0.1, 1e-5)[0],
        lambda: _bn_args(F64, 4, 3, 5), (0, 1, 2)),
    "native_batch_norm_legit_functional": (
        lambda ops, x, w, b, m, v: ops.native_batch_norm_legit_functional(x, w, b, m, v, True, 0.1, 1e-5)[0],
        lambda: _bn_args(F64, 4, 3, 5), (0, 1, 2)),
    # batch norm's double backward: the statistics recomputed from the input, as autograd sees them
    "native_batch_norm_backward-training": (
        lambda ops, g, x, w, b: ops.native_batch_norm_backward(
            g, x, w, None, None, *ops.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)[1:], True, 1e-5,
            [True, True, True]),
        lambda: (randn(4, 3, 5, dtype=F64, seed=5), *_bn_args(F64, 4, 3, 5)[:3]), (0, 1, 2)),
    "native_batch_norm_backward-training-no-weight": (
        lambda ops, g, x: ops.native_batch_norm_backward(
            g, x, None, None, None, *ops.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)[1:], True, 1e-5,
            [True, False, False]),
        lambda: (randn(2, 3, 2, 2, dtype=F64, seed=5), _bn_args(F64, 2, 3, 2, 2)[0]), (0, 1)),
    "native_batch_norm_backward-evaluation": (
        lambda ops, g, x, w, m, v: ops.native_batch_norm_backward(g, x, w, m, v, None, None, False, 1e-5,
                                                                  [True, True, True]),
        lambda: (randn(4, 3, 5, dtype=F64, seed=5), *_bn_args(F64, 4, 3, 5)[:2], *_bn_args(F64, 4, 3, 5)[3:]),
        (0, 1, 2)),
    "native_group_norm": (lambda ops, x, w, b: ops.native_group_norm(x, w, b, 2, 6, 6, 3, 1e-5)[0],
                          lambda: _gn_args(F64), (0, 1, 2)),
    "nll_loss_forward-mean-weight": (lambda ops, x, t, w: ops.nll_loss_forward(x, t, w, MEAN, -100)[0],
                                     lambda: CASES["nll_loss_forward-mean-weight"][2](F64), (0,)),
    "nll_loss_forward-none-ignored-rows": (lambda ops, x, t: ops.nll_loss_forward(x, t, None, NONE, -100)[0],
                                           lambda: CASES["nll_loss_forward-none-ignored-rows"][2](F64), (0,)),
    "nll_loss_forward-sum-all-ignored": (lambda ops, x, t: ops.nll_loss_forward(x, t, None, SUM, -100)[0],
                                         lambda: CASES["nll_loss_forward-sum-all-ignored"][2](F64), (0,)),
    "nll_loss_backward-mean-weight": (CASES["nll_loss_backward-mean-weight-ignored-rows"][1],
                                      lambda: CASES["nll_loss_backward-mean-weight-ignored-rows"][2](F64), (0, 1)),
    "nll_loss_backward-none-weight": (CASES["nll_loss_backward-none-weight-ignored-rows"][1],
                                      lambda: CASES["nll_loss_backward-none-weight-ignored-rows"][2](F64), (0, 1)),
    "embedding_dense_backward-padding": (CASES["embedding_dense_backward-padding"][1],
                                         lambda: CASES["embedding_dense_backward-padding"][2](F64), (0,)),
}


@pytest.mark.parametrize("id", list(GRAD_CASES))
def test_decomposition_differentiates_like_eager_autograd(id):
    fn, make_args, argnums = GRAD_CASES[id]
    args = make_args()
    leaves = [a.detach().requires_grad_(i in argnums) if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
    # eager first: it makes the cotangents (torch.randn while tracing would be traced)
    expected = torch.autograd.grad(weighted_sum(fn(EAGER, *leaves)), [leaves[i] for i in argnums])
    got = tf.grad(lambda *a: weighted_sum(fn(ltorch, *a)), argnums=argnums)(*args)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-7, atol=1e-7)


def test_embedding_dense_backward_scaled_by_frequency_differentiates_to_the_scaled_rows():
    """Eager's double backward of embedding_dense_backward ignores scale_grad_by_freq (torch 2.13), so the
    reference is the derivative itself: the op is linear in grad_output, each row scaled by 1 / its index's count
    and zeroed at padding_idx; its vjp gathers the cotangent's rows with the same scale."""
    g = randn(2, 3, 4, dtype=F64, seed=0)
    cot = randn(7, 4, dtype=F64, seed=1)
    got = tf.grad(lambda g, i: (ltorch.embedding_dense_backward(g, i, 7, 1, True) * cot).sum())(g, INDICES)
    counts = torch.bincount(INDICES.flatten(), minlength=7)[INDICES]
    expected = cot[INDICES] / counts.unsqueeze(-1) * (INDICES != 1).unsqueeze(-1)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)


def test_group_norm_second_derivative_is_that_of_its_formula():
    """Eager autograd has no double backward for native_group_norm_backward: the reference is group norm written
    with torch ops, differentiated twice by eager autograd."""
    def by_formula(x, w, b):
        rows = x.reshape(2, 3, -1)
        xhat = ((rows - rows.mean(2, keepdim=True)) / (rows.var(2, unbiased=False, keepdim=True) + 1e-5).sqrt())
        return xhat.reshape(x.shape) * w.reshape(6, 1, 1) + b.reshape(6, 1, 1)

    def first_derivative_weighted(norm, x, w, b, grad):
        g = grad(lambda x, w: (norm(x, w, b) * weights[0]).sum(), (x, w))
        return (g[0] * weights[1]).sum() + (g[1] * weights[2]).sum()

    x, w, b = _gn_args(F64)
    weights = [randn(*t.shape, dtype=F64, seed=10 + i) for i, t in enumerate((x, x, w))]

    def eager_grad(f, args):
        return torch.autograd.grad(f(*args), args, create_graph=True)

    leaves = [t.detach().requires_grad_() for t in (x, w)]
    expected = torch.autograd.grad(first_derivative_weighted(by_formula, *leaves, b, eager_grad), leaves)
    got = tf.grad(lambda x, w: first_derivative_weighted(
        lambda x, w, b: F.group_norm(x, 3, w, b), x, w, b, lambda f, args: tf.grad(f, argnums=(0, 1))(*args)),
        argnums=(0, 1))(x, w)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-7, atol=1e-7)
