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
