"""Randomness: random ops draw from torch's generator when the compiled function runs,
so a seed reproduces eager's draws, each call draws afresh, and reseeding inside a
traced function is recorded and replayed on every call."""
import pytest
import torch
import torch.nn.functional as F
from torch.testing._utils import freeze_rng_state

import thunderfn as tf

RANDOM_FNS = {
    "randn": lambda x: x + torch.randn(2, 3),
    "rand": lambda x: x + torch.rand(3),
    "randn_like": lambda x: torch.randn_like(x),
    "randint": lambda x: x + torch.randint(0, 5, (3,)),
    "normal": lambda x: x + torch.normal(0.0, 1.0, (2, 3)),
    "randperm": lambda x: x[:, torch.randperm(3)],
    "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)),
    "dropout": lambda x: F.dropout(x, 0.4, training=True),
    "dropout_module": lambda x: torch.nn.Dropout(0.4).train()(x),
    "sdpa_dropout": lambda x: F.scaled_dot_product_attention(x[None], x[None], x[None], dropout_p=0.3),
    # stochastic depth as timm's DropPath writes it: a per-row mask drawn in place into new_empty
    "stochastic_depth": lambda x: x * x.new_empty((x.shape[0], 1)).bernoulli_(0.6).div_(0.6),
    "unused_draw_still_consumed": lambda x: (torch.rand(5), x + torch.rand(3))[1],
}


@pytest.fixture
def x():
    return torch.randn(2, 3)


@pytest.mark.parametrize("executors", [None, ["torch_prims"]], ids=["torch", "decomposed"])
@pytest.mark.parametrize("fn", RANDOM_FNS.values(), ids=RANDOM_FNS.keys())
def test_seeded_jitted_random_fn_draws_what_eager_draws(fn, x, executors):
    jf = tf.jit(fn, executors=executors, fallback=executors is None)
    torch.manual_seed(7)
    expected = fn(x)
    torch.manual_seed(7)
    torch.testing.assert_close(jf(x), expected)


@pytest.mark.parametrize("fn", [RANDOM_FNS["randn"], RANDOM_FNS["dropout"]], ids=["randn", "dropout"])
def test_each_call_draws_fresh_numbers(fn, x):
    jf = tf.jit(fn)
    assert not torch.equal(jf(x), jf(x))


def test_manual_seed_inside_the_function_is_replayed_on_every_call(x):
    def fn(a):
        torch.manual_seed(123)
        return a + torch.randn(3)

    jf = tf.jit(fn)
    first, second = jf(x), jf(x)
    torch.testing.assert_close(first, second)
    torch.testing.assert_close(first, fn(x))
    assert "torch.manual_seed(123)" in str(tf.last_traces(jf)[-1])


def test_freeze_rng_state_inside_the_function_behaves_as_in_eager(x):
    """get_rng_state / manual_seed / set_rng_state are recorded, so the caller's stream is restored."""
    def fn(a):
        with freeze_rng_state():
            torch.manual_seed(42)
            frozen = torch.randn_like(a)
        return frozen + torch.rand_like(a)  # drawn from the caller's stream

    jf = tf.jit(fn)
    torch.manual_seed(0)
    expected = fn(x)
    torch.manual_seed(0)
    torch.testing.assert_close(jf(x), expected)


def test_seeding_outside_tracing_is_unaffected():
    torch.manual_seed(5)
    a = torch.rand(2)
    torch.manual_seed(5)
    assert torch.equal(a, torch.rand(2))


# -- forward mode through random ops: the tangent is taken with the primal's draws --------------
def _alpha_dropout(x):
    return F.alpha_dropout(x, 0.5, training=True)


RANDOM_DIFFERENTIABLE = {  # x: (2, 3, 5, 5, 5), float64, no zeros
    "dropout2d": lambda x: F.dropout2d(x[0], 0.5, training=True),
    "dropout3d": lambda x: F.dropout3d(x, 0.5, training=True),
    "alpha_dropout": _alpha_dropout,
    "feature_alpha_dropout": lambda x: F.feature_alpha_dropout(x, 0.5, training=True),
    "rrelu": lambda x: F.rrelu(x, training=True),
    "fractional_max_pool3d": lambda x: F.fractional_max_pool3d(x, 2, output_size=(3, 3, 3)),
}


def _seeded_jvp(jvp, fn, x, t, seed=11):
    torch.manual_seed(seed)
    return jvp(fn, (x,), (t,))


@pytest.fixture
def x5():
    # away from 0 (rrelu's kink) and without ties (pooling's maxima), so the seeded function is smooth at x
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 5, 5, dtype=torch.float64, generator=g)
    return x + torch.where(x >= 0, 0.1, -0.1)


@pytest.mark.parametrize("fn", RANDOM_DIFFERENTIABLE.values(), ids=RANDOM_DIFFERENTIABLE.keys())
def test_jvp_of_a_random_op_matches_torch_func_jvp_under_the_same_seed(fn, x5):
    t = torch.randn_like(x5)
    out, tangent = _seeded_jvp(tf.jvp, fn, x5, t)
    expected_out, expected_tangent = _seeded_jvp(torch.func.jvp, fn, x5, t)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(tangent, expected_tangent)


@pytest.mark.parametrize("fn", RANDOM_DIFFERENTIABLE.values(), ids=RANDOM_DIFFERENTIABLE.keys())
def test_jvp_of_a_random_op_is_the_derivative_of_the_draws_its_primal_made(fn, x5):
    """Law: under one seed the op is one smooth function of x (its draws fixed), and the tangent is its
    derivative: linear in the input tangent, and the central difference of that seeded function."""
    t1, t2 = torch.randn_like(x5), torch.randn_like(x5)
    tangent = lambda t: _seeded_jvp(tf.jvp, fn, x5, t)[1]  # noqa: E731
    torch.testing.assert_close(tangent(2.5 * t1 + t2), 2.5 * tangent(t1) + tangent(t2))
    eps = 1e-6
    seeded = lambda a: (torch.manual_seed(11), fn(a))[1]  # noqa: E731
    difference = (seeded(x5 + eps * t1) - seeded(x5 - eps * t1)) / (2 * eps)
    torch.testing.assert_close(tangent(t1), difference, rtol=1e-6, atol=1e-6)


def test_dropout2d_tangent_is_the_input_tangent_under_the_primal_mask(x5):
    t = torch.randn_like(x5[0])
    out, tangent = _seeded_jvp(tf.jvp, lambda a: F.dropout2d(a, 0.5, training=True), x5[0], t)
    assert 0 < (out == 0).sum() < out.numel()  # some channels dropped, some kept
    torch.testing.assert_close(tangent, t * (out != 0) / 0.5)


def test_rrelu_tangent_is_the_input_tangent_times_the_primal_slope(x5):
    t = torch.randn_like(x5)
    out, tangent = _seeded_jvp(tf.jvp, lambda a: F.rrelu(a, training=True), x5, t)
    slope = out / x5  # 1 where x > 0, the drawn slope where x < 0
    assert len(slope[x5 < 0].unique()) > 1  # drawn per element
    torch.testing.assert_close(tangent, t * slope)


def test_fractional_max_pool3d_tangent_is_the_input_tangent_at_the_primal_maxima(x5):
    t = torch.randn_like(x5)
    (out, indices), (tangent, _) = _seeded_jvp(
        tf.jvp, lambda a: F.fractional_max_pool3d(a, 2, output_size=(3, 3, 3), return_indices=True), x5, t)
    torch.testing.assert_close(tangent, t.flatten(2).gather(2, indices.flatten(2)).view_as(out))
