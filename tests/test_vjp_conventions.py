"""torch's gradient at edge points (the torch-language rules in transforms/rules/): where torch's backward formula picks
a value the decomposition's derivative does not give (logsigmoid at 0, the norm of a zero vector, the std of a constant
tensor, a loss at an infinite difference, binary_cross_entropy at 0 or 1, gaussian_nll_loss's clamped var,
torch.max(x, dim) at a tie), thunderfn's gradient is torch.autograd's, in float64; at ordinary points the second
derivative (a Hessian-vector product through the rule's backward) is torch's too."""
import math

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.testing.gradients import (
    assert_grads_close,
    assert_low_precision_as_accurate_as_torch,
    assert_second_derivative_matches_torch,
    torch_grads,
)

F64 = torch.float64
INF, NAN = math.inf, math.nan
_gen = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(shape, generator=_gen, dtype=F64)


def t(*values):
    return torch.tensor(values, dtype=F64)


_cotangents: dict = {}


def weighted(out):
    """A scalar from out whose cotangent is not all ones: a fixed random tensor per shape, made when the case is
    defined (torch.randn while tracing would be traced)."""
    shape = tuple(out.shape)
    if shape not in _cotangents:
        _cotangents[shape] = torch.randn(shape, generator=torch.Generator().manual_seed(len(_cotangents)), dtype=F64)
    return (out * _cotangents[shape]).sum()


# -- cases: id -> (scalar function, differentiated args); constants are captured --------------------------
EDGE: dict = {}      # torch picks a value there: first derivatives
ORDINARY: dict = {}  # first and second derivatives


def edge(id, fn, *args):
    fn(*args)  # eagerly once: makes its cotangents
    EDGE[id] = (fn, args)


def ordinary(id, fn, *args):
    fn(*args)
    ORDINARY[id] = (fn, args)


x34, y34 = randn(3, 4), randn(3, 4)
wide = t(-30.0, -2.5, -0.3, 0.4, 1.7, 25.0)

# logsigmoid, silu, elu, selu, celu
edge("logsigmoid-at-0-and-overflow", lambda x: weighted(F.logsigmoid(x)), t(0.0, -0.0, 1e3, -1e3, INF, -INF, NAN))
edge("bce_with_logits-at-0", lambda x, y: F.binary_cross_entropy_with_logits(x, y), t(0.0, 0.0, 2.0), t(0.3, 1.0, 0.0))
edge("bce_with_logits-pos_weight-weight-at-0", lambda x, y: weighted(F.binary_cross_entropy_with_logits(
    x, y, weight=t(0.5, 2.0, 1.0), pos_weight=t(3.0, 3.0, 0.5), reduction="none")), t(0.0, -0.0, 1.5), t(0.3, 1.0, 0.0))
edge("silu-overflow", lambda x: weighted(F.silu(x)), t(-1e3, 1e3, 0.0, -INF, INF))
edge("elu-overflow-and-0", lambda x: weighted(F.elu(x)), t(1e3, 0.0, -1e3, INF, -INF))
edge("elu-alpha", lambda x: weighted(F.elu(x, alpha=0.5)), t(1e3, 0.0, -2.0))
edge("selu-overflow", lambda x: weighted(F.selu(x)), t(1e3, 0.0, -1e3))
edge("celu-overflow", lambda x: weighted(F.celu(x, alpha=2.0)), t(1e4, 0.0, -3.0))
for name, f in (("logsigmoid", F.logsigmoid), ("silu", F.silu), ("elu", F.elu), ("selu", F.selu), ("mish", F.mish)):
    ordinary(name, lambda x, f=f: weighted(f(x)), wide)
ordinary("elu-alpha", lambda x: weighted(F.elu(x, 0.7)), wide)
ordinary("celu-alpha", lambda x: weighted(F.celu(x, 1.5)), wide)
ordinary("bce_with_logits-pos_weight",
         lambda x, y: F.binary_cross_entropy_with_logits(x, y, pos_weight=t(2.0, 0.5, 1.0, 3.0)), x34,
         torch.rand(3, 4, generator=_gen, dtype=F64))

# vector norms: a zero vector (the whole tensor, or one row); ties and NaN for ord inf
zero_row = torch.cat([torch.zeros(1, 4, dtype=F64), randn(2, 4)])
ties = t(3.0, -3.0, 1.0, 2.0)
for ord in (2, 1, 3, 1.5, 0.5, -1, INF, -INF, 0):
    edge(f"vector_norm-zero-vector-ord{ord}", lambda x, ord=ord: torch.linalg.vector_norm(x, ord) * 1.5,
         torch.zeros(4, dtype=F64))
    edge(f"vector_norm-zero-row-ord{ord}",
         lambda x, ord=ord: weighted(torch.linalg.vector_norm(x, ord, dim=1)), zero_row)
    if ord != 0:  # a count: no gradient to differentiate again
        ordinary(f"vector_norm-ord{ord}", lambda x, ord=ord: weighted(torch.linalg.vector_norm(x, ord, dim=-1)), x34)
edge("vector_norm-keepdim-dims", lambda x: weighted(torch.linalg.vector_norm(x, 3, dim=(0, 2), keepdim=True)),
     torch.cat([torch.zeros(2, 1, 3, dtype=F64), randn(2, 1, 3)], 1))
edge("vector_norm-inf-ties", lambda x: torch.linalg.vector_norm(x, INF) * 2.0, ties)
edge("vector_norm-inf-nan", lambda x: torch.linalg.vector_norm(x, INF) * 2.0, t(3.0, NAN, 1.0, NAN))
edge("vector_norm-zero-0d", lambda x: torch.linalg.vector_norm(x) * 2.0, torch.tensor(0.0, dtype=F64))
edge("vector_norm-dtype", lambda x: weighted(torch.linalg.vector_norm(x, dim=1, dtype=F64)), zero_row.float())
edge("torch.norm-zero", lambda x: torch.norm(x), torch.zeros(2, 3, dtype=F64))
edge("torch.norm-p3-dim", lambda x: weighted(torch.norm(x, p=3, dim=1)), zero_row)
edge("Tensor.norm-zero-row", lambda x: weighted(x.norm(dim=1)), zero_row)
edge("linalg.norm-zero", lambda x: torch.linalg.norm(x), torch.zeros(4, dtype=F64))
edge("dist-equal", lambda x, y: torch.dist(x, y), t(1.0, 2.0), t(1.0, 2.0))
for p in (2.0, 1.0, 3.0, INF):
    edge(f"normalize-zero-row-p{p}", lambda x, p=p: weighted(F.normalize(x, p=p, dim=1)), zero_row)
    ordinary(f"normalize-p{p}", lambda x, p=p: weighted(F.normalize(x, p=p, dim=0)), x34)
edge("normalize-tiny-row-eps", lambda x: weighted(F.normalize(x, dim=-1, eps=1e-3)),
     torch.cat([torch.full((1, 4), 1e-5, dtype=F64), randn(2, 4)]))
edge("normalize-dims-tuple", lambda x: weighted(F.normalize(x, dim=(0, 1))), torch.zeros(2, 3, dtype=F64))
ordinary("normalize-default", lambda x: weighted(F.normalize(x)), x34)

# std, std_mean (and var, var_mean, which had no issue): a constant tensor, or a constant row
const_row = torch.cat([torch.full((1, 4), 2.5, dtype=F64), randn(2, 4)])
edge("std-constant", lambda x: torch.std(x) * 2.0, torch.full((5,), 3.0, dtype=F64))
edge("std-constant-row-dim", lambda x: weighted(torch.std(x, 1)), const_row)
edge("std-constant-row-keepdim-correction0",
     lambda x: weighted(torch.std(x, dim=-1, keepdim=True, correction=0)), const_row)
edge("std-constant-unbiased-positional", lambda x: torch.std(x, False) * 2.0, const_row[:1])
edge("std-one-element", lambda x: torch.std(x) * 2.0, t(1.5))
edge("std-one-element-dim", lambda x: weighted(torch.std(x, 1)), randn(3, 1))
edge("std-0d", lambda x: torch.std(x, correction=0) * 2.0, torch.tensor(1.5, dtype=F64))
edge("std_mean-constant", lambda x: (lambda s, m: s * 2.0 + m * 3.0)(*torch.std_mean(x)),
     torch.full((5,), 3.0, dtype=F64))
edge("std_mean-constant-row-std-only", lambda x: weighted(torch.std_mean(x, 1)[0]), const_row)
edge("std_mean-mean-only", lambda x: weighted(torch.std_mean(x, 1, keepdim=True)[1]), const_row)
edge("var-constant", lambda x: weighted(torch.var(x, 1)), const_row)
edge("var_mean-constant", lambda x: (lambda v, m: weighted(v) + weighted(m * 2))(*torch.var_mean(x, 1)), const_row)
ordinary("std-all", lambda x: torch.std(x) * 2.0, x34)
ordinary("std-dim-keepdim", lambda x: weighted(torch.std(x, 0, keepdim=True)), x34)
ordinary("std-correction2", lambda x: weighted(torch.std(x, dim=(0, 1), correction=2)), randn(3, 4, 2))
ordinary("Tensor.std", lambda x: weighted(x.std(1, unbiased=False)), x34)
ordinary("std_mean", lambda x: (lambda s, m: weighted(s) + weighted(m * 2))(*torch.std_mean(x, 1)), x34)

# smooth_l1_loss, huber_loss: an infinite (or NaN) difference
inf_diff = t(INF, -INF, 0.0, 0.3, -2.0, NAN)
target6 = torch.zeros(6, dtype=F64)
for reduction in ("mean", "sum", "none"):
    for beta in (1.0, 0.5, 0.0):
        edge(f"smooth_l1-inf-{reduction}-beta{beta}",
             lambda x, y, r=reduction, b=beta: weighted(F.smooth_l1_loss(x, y, reduction=r, beta=b)), inf_diff, target6)
    edge(f"huber-inf-{reduction}", lambda x, y, r=reduction: weighted(F.huber_loss(x, y, reduction=r, delta=0.7)),
         inf_diff, target6)
    edge(f"huber-inf-weight-{reduction}",
         lambda x, y, w, r=reduction: weighted(F.huber_loss(x, y, reduction=r, weight=w)), inf_diff, target6,
         torch.rand(6, generator=_gen, dtype=F64))
    ordinary(f"smooth_l1-{reduction}",
             lambda x, y, r=reduction: weighted(F.smooth_l1_loss(x, y, reduction=r, beta=0.8)), x34, y34)
    ordinary(f"huber-weight-{reduction}",
             lambda x, y, w, r=reduction: weighted(F.huber_loss(x, y, reduction=r, weight=w)), x34, y34,
             torch.rand(3, 4, generator=_gen, dtype=F64))
edge("smooth_l1-legacy-reduce", lambda x, y: weighted(F.smooth_l1_loss(x, y, reduce=False)), inf_diff, target6)
edge("smooth_l1-broadcast-target", lambda x, y: F.smooth_l1_loss(x, y), t(INF, 0.5, -3.0).expand(2, 3).clone(),
     t(0.0, 0.0, 1.0))
edge("huber-broadcast-input", lambda x, y: F.huber_loss(x, y), t(INF, 0.5, -3.0), torch.zeros(2, 3, dtype=F64))
ordinary("huber-delta", lambda x, y: F.huber_loss(x, y, delta=0.3), x34, y34)

# binary_cross_entropy: an input of 0 or 1
bce_x, bce_y = t(0.0, 1.0, 0.0, 1.0, 0.5, 0.25), t(0.3, 0.5, 0.0, 1.0, 1.0, 0.6)
for reduction in ("mean", "sum", "none"):
    edge(f"bce-0-and-1-{reduction}", lambda x, y, r=reduction: weighted(F.binary_cross_entropy(x, y, reduction=r)),
         bce_x, bce_y)
    edge(f"bce-0-and-1-weight-{reduction}", lambda x, y, r=reduction: weighted(F.binary_cross_entropy(
        x, y, weight=t(0.5, 2.0, 1.0, 1.5, 0.1, 3.0), reduction=r)), bce_x, bce_y)
    ordinary(f"bce-{reduction}", lambda x, y, r=reduction: weighted(F.binary_cross_entropy(x, y, reduction=r)),
             torch.rand(3, 4, generator=_gen, dtype=F64) * 0.9 + 0.05, torch.rand(3, 4, generator=_gen, dtype=F64))
edge("bce-broadcast-weight", lambda x, y: F.binary_cross_entropy(x, y, weight=t(2.0, 0.5)),
     t(0.0, 1.0, 0.3, 0.9).reshape(2, 2), t(0.2, 0.7, 1.0, 0.0).reshape(2, 2))
edge("bce-legacy-size_average", lambda x, y: F.binary_cross_entropy(x, y, size_average=False), bce_x, bce_y)
ordinary("bce-weight", lambda x, y: F.binary_cross_entropy(x, y, weight=t(2.0, 0.5, 1.0, 0.7)),
         torch.rand(3, 4, generator=_gen, dtype=F64) * 0.9 + 0.05, torch.rand(3, 4, generator=_gen, dtype=F64))

# gaussian_nll_loss: var below eps (clamped, straight through)
small_var = t(1e-9, 0.0, 2.0, 1e-7, 0.5)
gx, gy = t(0.5, 0.2, -1.0, 0.0, 3.0), t(0.0, 1.0, 0.5, 0.0, 2.0)
for reduction in ("mean", "sum", "none"):
    edge(f"gaussian_nll-small-var-{reduction}",
         lambda x, y, v, r=reduction: weighted(F.gaussian_nll_loss(x, y, v, reduction=r)), gx, gy, small_var)
    ordinary(f"gaussian_nll-{reduction}",
             lambda x, y, v, r=reduction: weighted(F.gaussian_nll_loss(x, y, v, reduction=r)), x34, y34,
             torch.rand(3, 4, generator=_gen, dtype=F64) + 0.2)
edge("gaussian_nll-full-eps", lambda x, y, v: F.gaussian_nll_loss(x, y, v, full=True, eps=0.1), gx, gy, small_var)
edge("gaussian_nll-homoscedastic", lambda x, y, v: F.gaussian_nll_loss(x, y, v), x34, y34, t(1e-8, 0.4, 2.0))
edge("gaussian_nll-size1-var-dim", lambda x, y, v: F.gaussian_nll_loss(x, y, v), x34, y34,
     t(1e-8, 0.4, 2.0).reshape(3, 1))
edge("gaussian_nll-number-var", lambda x, y: F.gaussian_nll_loss(x, y, 1e-9), gx, gy)
ordinary("gaussian_nll-homoscedastic", lambda x, y, v: F.gaussian_nll_loss(x, y, v, full=True), x34, y34,
         t(0.3, 0.4, 2.0))

# max, min: ties and NaN
tied = t(1.0, 3.0, 3.0, 0.0, 3.0, -1.0, -1.0, 2.0).reshape(2, 4)
with_nan = t(1.0, NAN, 3.0, NAN, 0.0, 2.0, 2.0, -1.0).reshape(2, 4)
for name, f in (("max", torch.max), ("min", torch.min)):
    for xname, x in (("ties", tied), ("nan", with_nan)):
        edge(f"{name}-dim-{xname}", lambda x, f=f: weighted(f(x, 1).values), x)
        edge(f"{name}-dim0-keepdim-{xname}", lambda x, f=f: weighted(f(x, 0, keepdim=True).values), x)
        edge(f"{name}-negative-dim-by-keyword-{xname}", lambda x, f=f: weighted(f(x, dim=-1).values), x)
        edge(f"{name}-all-{xname}", lambda x, f=f: f(x) * 2.0, x)
        edge(f"{name}-binary-{xname}", lambda x, y, f=f: weighted(f(x, y)), x, tied.flip(1))
    edge(f"{name}-all-ties-min", lambda x, f=f: f(x) * 2.0, t(-1.0, -1.0, 5.0, 5.0))
    edge(f"{name}-binary-broadcast", lambda x, y, f=f: weighted(f(x, y)), tied, t(3.0, 0.0, 3.0, 2.0))
    edge(f"{name}-binary-0d-other", lambda x, y, f=f: weighted(f(x, y)), tied, torch.tensor(3.0, dtype=F64))
    edge(f"{name}-0d-dim", lambda x, f=f: f(x, 0).values * 2.0, torch.tensor(1.5, dtype=F64))
    edge(f"{name}-method-indices-used",
         lambda x, name=name: weighted(getattr(x, name)(1)[0] * getattr(x, name)(1).indices), tied)
    ordinary(f"{name}-dim", lambda x, f=f: weighted(f(x, 1).values ** 2), x34)
    ordinary(f"{name}-binary", lambda x, y, f=f: weighted(f(x, y) ** 2), x34, y34)
    ordinary(f"{name}-all", lambda x, f=f: f(x) ** 3, x34)


def _argnums(args):
    return tuple(range(len(args)))


@pytest.mark.parametrize("fn, args", EDGE.values(), ids=EDGE.keys())
def test_gradient_at_edge_points_matches_torch(fn, args):
    assert_grads_close(tf.grad(fn, argnums=_argnums(args))(*args), torch_grads(fn, args)[1])


@pytest.mark.parametrize("fn, args", ORDINARY.values(), ids=ORDINARY.keys())
def test_gradient_at_ordinary_points_matches_torch(fn, args):
    assert_grads_close(tf.grad(fn, argnums=_argnums(args))(*args), torch_grads(fn, args)[1])


@pytest.mark.parametrize("fn, args", ORDINARY.values(), ids=ORDINARY.keys())
def test_second_derivative_at_ordinary_points_matches_torch(fn, args):
    """A Hessian-vector product, through the rule's backward."""
    assert_second_derivative_matches_torch(fn, args)


def test_second_derivative_of_logsigmoid_at_0_matches_torch():
    """Where the first derivative needed the rule, the second is torch's too (-1/4), not the decomposition's 0."""
    x = t(0.0, -0.0, 1e3, -1e3)
    got = tf.grad(lambda x: tf.grad(lambda x: F.logsigmoid(x).sum())(x).sum())(x)
    leaf = x.clone().requires_grad_(True)
    (first,) = torch.autograd.grad(F.logsigmoid(leaf).sum(), leaf, create_graph=True)
    torch.testing.assert_close(got, torch.autograd.grad(first.sum(), leaf)[0])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_weight_gets_the_unweighted_loss_gradient(reduction):
    """torch refuses to differentiate the weight; thunderfn gives it the loss's derivative, the unweighted loss
    (each log clamped at -100) times g, checked against the weighting written out."""
    x, y, w = t(0.0, 1.0, 0.3, 0.8), t(0.2, 1.0, 0.5, 0.0), t(0.5, 2.0, 1.0, 1.5)
    fn = lambda w: weighted(F.binary_cross_entropy(x, y, weight=w, reduction=reduction))  # noqa: E731
    fn(w)

    def written_out(w):
        loss = w * F.binary_cross_entropy(x, y, reduction="none")
        return weighted({"mean": loss.mean(), "sum": loss.sum(), "none": loss}[reduction])

    assert_grads_close(tf.grad(fn, argnums=(0,))(w), torch_grads(written_out, (w,))[1])


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_and_min_keep_torchs_output_structure(name):
    """With dim, a named tuple (values, indices); without, a tensor; with a tensor second argument, the
    elementwise tensor; the gradient flows through each."""
    f = getattr(torch, name)
    calls = {"dim": lambda x, y: f(x, 1), "all": lambda x, y: f(x), "binary": lambda x, y: f(x, y),
             "keepdim": lambda x, y: f(x, dim=0, keepdim=True)}
    for call in calls.values():
        got, expected = tf.jit(call)(tied, tied.flip(1)), call(tied, tied.flip(1))
        assert type(got) is type(expected)
        if isinstance(expected, tuple):
            assert got.values.dtype == expected.values.dtype and got.indices.dtype == expected.indices.dtype
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_and_bool_max_and_min_are_not_differentiated(name, dtype):
    """An integer or bool max carries no gradient: the function differentiates through the float path alone."""
    f = getattr(torch, name)
    ints = torch.tensor([[1, 0, 1], [0, 0, 1]]).to(dtype)
    def fn(x):
        return ((x * f(ints, 1).values.to(F64)[:, None]).sum() + (x * f(ints).to(F64)).sum()
                + (f(x, ints.to(F64)) * x).sum())

    x = randn(2, 3)
    assert_grads_close(tf.grad(fn, argnums=(0,))(x), torch_grads(fn, (x,))[1])


LOW_PRECISION = ["logsigmoid", "silu", "elu", "vector_norm-ord2", "vector_norm-ord3", "normalize-p2.0",
                 "std-dim-keepdim", "smooth_l1-mean", "huber-weight-mean", "bce-mean", "gaussian_nll-mean",
                 "max-dim", "min-binary"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", LOW_PRECISION)
def test_low_precision_gradient_has_the_arguments_dtype_and_torchs_accuracy(name, dtype):
    """Against float64, thunderfn's gradient in float32 / bfloat16 errs no more than about torch's own."""
    assert_low_precision_as_accurate_as_torch(*ORDINARY[name], dtype)


_x34 = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
# a layer whose calls share one traced body (prims.block: blocks.py), called twice
_shared_sin_layer = tf.nested_compile_region(lambda x: x.sin() * x)

FORWARD_MODE = {  # torch-level functions whose forward rule is derived from their VJP rule (transforms/rules/)
    "logsigmoid": (F.logsigmoid, t(0.0, 1.0, -1e3, 1e3)),
    "silu-overflow": (F.silu, t(-1e3, 1e3, 0.5)),
    "sigmoid-overflow": (torch.sigmoid, t(-1e3, 1e3)),
    "hardtanh-bounds": (F.hardtanh, t(-1.0, 1.0, 0.0)),
    "bce_with_logits-at-0": (lambda x: F.binary_cross_entropy_with_logits(x, torch.full_like(x, 0.5)), t(0.0, 1.0)),
    "gelu": (F.gelu, t(-3.0, 0.0, 0.5)),
    # the running statistics' in-place update (updated_running_stats), which keeps their tangent
    "batch_norm-running-stats": (lambda x: F.batch_norm(x, torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64),
                                                        training=True), t(0.5, -1.0, 2.0, 3.0, 0.0, 1.5).view(2, 3)),
    "gelu-tanh": (lambda x: F.gelu(x, approximate="tanh"), t(-3.0, 0.0, 0.5)),
    "tanh": (torch.tanh, t(-30.0, 0.0, 0.5)),
    "relu-at-0": (torch.relu, t(-1.0, 0.0, 0.5)),
    "elu-overflow": (F.elu, t(-1.0, 1e3, 0.5)),
    "selu": (F.selu, t(-1.0, 1e3, 0.0)),
    "celu": (lambda x: F.celu(x, 2.0), t(-1.0, 1e4, 0.0)),
    "relu6-bounds": (F.relu6, t(0.0, 6.0, 3.0)),
    "hardsigmoid-bounds": (F.hardsigmoid, t(-3.0, 3.0, 0.5)),
    "hardswish-bounds": (F.hardswish, t(-3.0, 3.0, 0.5)),
    "softplus-threshold": (lambda x: F.softplus(x, 2.0, 5.0), t(-1e3, 2.5, 30.0)),
    "norm-of-zero": (torch.norm, t(0.0, 0.0)),
    "vector_norm-ord3-dim": (lambda x: torch.linalg.vector_norm(x, 3, dim=1, keepdim=True), _x34),
    "vector_norm-inf": (lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1), _x34),
    "std-of-constant": (torch.std, t(1.0, 1.0)),
    "std-dim-correction0": (lambda x: x.std(dim=0, correction=0), _x34),
    "normalize": (F.normalize, _x34),
    # the control-flow primitives (transforms/rules/control_flow.py), against torch.func over the Python they stand for
    "cond": (lambda x: tf.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x * 2, x), t(0.5, -1.0)),
    "scan": (lambda x: tf.scan(lambda c, xi: (c * xi + 1, c.sin()), x[0], x)[1], t(0.5, -1.0, 2.0)),
    "while_loop": (lambda x: tf.while_loop(lambda x: x.sum() > 1, lambda x: x * 0.5, x), t(3.0, 1.0)),
    "checkpoint": (lambda x: tf.checkpoint(lambda x: tf.checkpoint_name(x.sin(), "s") * x,
                                           policy=tf.checkpoint_policies.save_only_these_names("s"))(x), t(0.5, -1.0)),
    "checkpoint_name": (lambda x: tf.checkpoint_name(x.sin(), "s") * x, t(0.5, -1.0)),
    "block": (lambda x: _shared_sin_layer(_shared_sin_layer(x) * 2), t(0.5, -1.0)),
}


@pytest.mark.parametrize("name", sorted(FORWARD_MODE))
def test_forward_mode_tangent_matches_torch_func_jvp(name):
    fn, x = FORWARD_MODE[name]
    tangent = torch.full_like(x, 0.7)
    torch.testing.assert_close(tf.jvp(fn, (x,), (tangent,))[1], torch.func.jvp(fn, (x,), (tangent,))[1], equal_nan=True)


def test_every_torch_level_forward_rule_has_a_case():
    from thunderfn.core.rules import rules
    from thunderfn.prims import PrimIDs

    # (user rules enter the table too: tf.custom_jvp functions under ("custom_jvp", n), a torch.autograd.Function's
    # jvp staticmethod under its call's ("custom_vjp", n); they are not torch-level rules)
    torch_level = {k for k, r in rules.items() if r.jvp is not None
                   and not isinstance(k, PrimIDs)
                   and not (isinstance(k, tuple) and k[0] in ("custom_jvp", "custom_vjp"))}
    reached = set()
    for fn, x in FORWARD_MODE.values():
        trc = tf.trace(fn, x)
        reached.update(b.sym.id for b in trc.bound_symbols)
        reached.update(s.sym.id for b in trc.bound_symbols for s in b.subsymbols)
    assert torch_level <= reached, f"forward rules without a case: {torch_level - reached}"
