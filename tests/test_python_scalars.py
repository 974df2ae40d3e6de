"""A Python float argument that changes between calls is traced as a value (docs/jit.md, 'Python floats').

After a second value, jit compiles once more with the float a symbol of the trace (`f0`), which the compiled
function takes after its tensors, so one entry serves every float there; results equal eager's, with a
number's type promotion. A question of its value is a named error; static arguments, dynamic=False and
compiles that torch.autograd drives keep floats static.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import thunderfn as tf
from thunderfn.errors import ConcretizationError


def _calls(jitted, fn, values, *args):
    for v in values:
        got, expected = jitted(*args, v), fn(*args, v)
        for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple)
                        else (expected,)):
            assert g.dtype == e.dtype
            torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_a_changing_float_compiles_twice_then_serves_every_value():
    def step(x, lr):
        return x - lr * torch.tanh(x)

    jitted = tf.jit(step)
    x = torch.randn(5)
    _calls(jitted, step, [0.1 * k for k in range(1, 11)], x)
    info = tf.cache_info(jitted)
    assert (info["misses"], info["hits"]) == (2, 8)
    assert info["symbolic"] == [{"f0": "argument 'lr'"}]
    assert info["recompiles"] == ["argument 1 changed from 0.1 to 0.2: compiled with floats traced as values "
                                  "f0 = argument 'lr'"]
    assert "def computation(x, f0):" in str(tf.last_traces(jitted)[-1])  # a parameter, not a constant


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.float64])
def test_a_float_traced_as_a_value_promotes_as_a_python_number(dtype):
    # eager: float32 tensor * 0.5 stays float32, int64 tensor * 0.5 is the default dtype; a 0-d float64 tensor
    # would promote differently (an int64 tensor times it is float64)
    def scaled(x, s):
        return x * s, x.sum() * s, x - s

    x = torch.arange(1, 5).to(dtype)
    _calls(tf.jit(scaled), scaled, [0.5, 0.25, 3.0], x)


def test_floats_in_a_pytree_open_one_by_one():
    def update(x, hyper):
        return x * hyper["lr"] - hyper["wd"] * x

    jitted = tf.jit(update)
    x = torch.randn(3)
    for lr in (0.1, 0.2, 0.3):
        torch.testing.assert_close(jitted(x, {"lr": lr, "wd": 0.01}), update(x, {"lr": lr, "wd": 0.01}))
    assert tf.cache_info(jitted)["symbolic"] == [{"f0": "argument 'hyper_lr'"}]  # wd never changed: a constant
    torch.testing.assert_close(jitted(x, {"lr": 0.4, "wd": 0.02}), update(x, {"lr": 0.4, "wd": 0.02}))
    assert tf.cache_info(jitted)["symbolic"][-1] == {"f0": "argument 'hyper_lr'", "f1": "argument 'hyper_wd'"}


def test_signed_zeros_and_nan_run_as_eager_through_a_value():
    jitted = tf.jit(lambda a, s: a * s)
    one = torch.ones(1)
    jitted(one, 2.0)
    jitted(one, 3.0)  # now traced as a value
    assert torch.signbit(jitted(one, -0.0)).item() is True and torch.signbit(jitted(one, 0.0)).item() is False
    assert jitted(one, float("nan")).isnan().all()
    assert tf.cache_info(jitted)["entries"] == 2


def test_branching_on_a_float_traced_as_a_value_is_a_concretization_error_naming_static_argnums():
    def clipped(x, lr):
        return x * lr if lr < 1.0 else x

    jitted = tf.jit(clipped)
    x = torch.randn(3)
    jitted(x, 0.5)
    with pytest.raises(ConcretizationError, match=r"whether f0 < 1\.0.*f0 is argument 'lr'.*static_argnums"):
        jitted(x, 0.25)
    with pytest.raises(ConcretizationError, match="static_argnums"):
        jitted(x, math.pi)  # (refused each time, not compiled per value behind the user's back)


def test_formatting_a_float_traced_as_a_value_asks_its_value_not_its_symbols_name():
    """f"{lr}" gave the symbol's name ("zuf0") as the string, silently: now it asks the value, as float(lr) does."""
    jitted = tf.jit(lambda x, lr: (x * lr, f"{lr:.2f}"))
    x = torch.randn(3)
    assert jitted(x, 0.5)[1] == "0.50"
    with pytest.raises(ConcretizationError, match="f0 is argument 'lr'.*static_argnums"):
        jitted(x, 0.25)
    assert tf.jit(lambda x, lr: (x * lr, f"{lr}"), static_argnums=1)(x, 0.25)[1] == "0.25"


@pytest.mark.parametrize("static", [{"static_argnums": 1}, {"static_argnames": "lr"}, {"dynamic": False}])
def test_static_arguments_and_dynamic_false_keep_a_float_static(static):
    def clipped(x, lr):
        return x * lr if lr < 1.0 else x

    jitted = tf.jit(clipped, **static)
    x = torch.randn(3)
    for lr in (0.5, 0.25, 2.0):
        torch.testing.assert_close(jitted(x, lr), clipped(x, lr))
    assert tf.cache_info(jitted)["entries"] == 3 and tf.cache_info(jitted)["symbolic"] == []


def test_grad_with_a_changing_float_step_size_compiles_twice():
    def meta_loss(w, x, alpha):
        inner = tf.grad(lambda w: (torch.tanh(x @ w) ** 2).mean())
        return (torch.tanh(x @ (w - alpha * inner(w))) ** 2).mean()

    def eager_meta_loss(w, x, alpha):
        inner = torch.func.grad(lambda w: (torch.tanh(x @ w) ** 2).mean())
        return (torch.tanh(x @ (w - alpha * inner(w))) ** 2).mean()

    w, x = torch.randn(4, 3), torch.randn(6, 4)
    meta_grad = tf.grad(meta_loss)
    for k in range(12):
        alpha = 0.1 * 0.9 ** k
        torch.testing.assert_close(meta_grad(w, x, alpha), torch.func.grad(eager_meta_loss)(w, x, alpha))
    assert tf.cache_info(meta_grad)["misses"] == 2


def test_an_op_that_asks_the_value_keeps_the_floats_static():
    # dropout checks 0 <= p <= 1 while tracing: the compile falls back to the value, and later ones stay static
    def dropped(x, p):
        return torch.nn.functional.dropout(x, p, training=False) * p

    jitted = tf.jit(dropped)
    x = torch.randn(3)
    for p in (0.1, 0.2, 0.3):
        torch.testing.assert_close(jitted(x, p), dropped(x, p))
    info = tf.cache_info(jitted)
    assert info["entries"] == 3 and "ltorch.dropout asks whether f0 >= 0.0" in info["static_fallbacks"][0]


class _Tempered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, temperature):
        return (torch.tanh(self.linear(x) / temperature) * temperature).sum()


def test_torch_autograd_through_a_float_traced_as_a_value_gives_eager_gradients():
    # the backward takes the float too (d/dx of tanh(x / t) * t reads t), after its residuals and cotangents
    model = _Tempered()
    jitted = tf.jit(model)
    x = torch.randn(3, 4, requires_grad=True)
    for t in (1.0, 2.0, 0.5, 3.0):
        grads = []
        for fn in (jitted, model):
            model.zero_grad()
            x.grad = None
            fn(x, t).backward()
            grads.append([p.grad.clone() for p in model.parameters()] + [x.grad.clone()])
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b)
    info = tf.cache_info(jitted)
    assert info["entries"] == 2 and info["symbolic"] == [{"f0": "argument 'temperature'"}]


def test_torch_func_grad_over_a_float_traced_as_a_value():
    jitted = tf.jit(lambda w, s: (torch.sin(w) * s).sum())
    w = torch.randn(5)
    for s in (0.1, 0.2, 0.3):
        torch.testing.assert_close(torch.func.grad(jitted)(w, s), torch.cos(w) * s)
    assert tf.cache_info(jitted)["entries"] == 2


def test_a_differentiated_function_returning_a_number_computed_from_the_float_keeps_floats_static():
    # (torch.autograd's Function returns tensors: a number from the float would be the trace's symbol)
    w = torch.randn(4, requires_grad=True)
    jitted = tf.jit(lambda w, lr: ((w * lr).sum(), lr * 2))
    for lr in (0.1, 0.2, 0.3):
        w.grad = None
        loss, doubled = jitted(w, lr)
        loss.backward()
        assert doubled == lr * 2 and type(doubled) is float
        torch.testing.assert_close(w.grad, torch.full((4,), lr))
    info = tf.cache_info(jitted)
    assert info["entries"] == 3 and info["static_fallbacks"][0].startswith("FloatsStayStatic")


def test_sgd_like_update_with_alpha_stays_one_entry():
    def sgd(p, g, lr):
        return p.clone().add_(g, alpha=-lr)

    jitted = tf.jit(sgd)
    p, g = torch.randn(6), torch.randn(6)
    _calls(jitted, sgd, [0.1, 0.01, 1.0, 0.001], p, g)
    assert tf.cache_info(jitted)["entries"] == 2


def test_ints_stay_static():
    jitted = tf.jit(lambda x, n: x * n)
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in range(1, 5):
            torch.testing.assert_close(jitted(x, n), x * n)
    assert tf.cache_info(jitted)["entries"] == 4
