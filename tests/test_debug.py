"""tf.debug.print and tf.debug.breakpoint: run-time values from traced code, on every call."""
import sys

import pytest
import torch

import thunderfn as tf
from test_nvfuser import standin_frontend  # fusion regions without compiling any
from thunderfn.executors.nvfuser import NvFuserExecutor


def f(x):
    y = x.sin()
    tf.debug.print("y = {} total={total}", y, total=y.sum())
    return (y * 2).sum()


def printed(x) -> str:
    y = x.sin()
    return f"y = {y} total={y.sum()}\n"


def test_prints_values_on_every_call_of_a_jitted_function(capsys):
    jitted = tf.jit(f)
    for x in (torch.arange(3.0), torch.arange(3.0) + 1, torch.arange(3.0) + 2):
        jitted(x)
        assert capsys.readouterr().out == printed(x)
    assert tf.cache_info(jitted)["misses"] == 1  # one compile; the values are the call's own
    assert "debug_print('y = {} total={total}'" in str(tf.last_traces(jitted)[-1])


@pytest.mark.parametrize("transform", ["grad", "jit(grad)", "vjp", "jvp"])
def test_prints_under_transforms(transform, capsys):
    x = torch.arange(3.0) + 0.5
    run = {"grad": lambda: tf.grad(f)(x), "jit(grad)": lambda: tf.jit(tf.grad(f))(x),
           "vjp": lambda: tf.vjp(f, x)[1](torch.tensor(1.0)),
           "jvp": lambda: tf.jvp(f, (x,), (torch.ones(3),))}[transform]
    run()
    assert capsys.readouterr().out == printed(x)


@pytest.mark.parametrize("in_axis", [0, 1])
def test_under_vmap_it_prints_the_batched_values_with_the_batch_first(in_axis, capsys):
    xs = torch.arange(6.0).reshape(2, 3)
    tf.vmap(f, in_axes=in_axis)(xs if in_axis == 0 else xs.T.contiguous())
    ys = xs.sin()
    assert capsys.readouterr().out == f"y = {ys} total={ys.sum(1)}\n"  # one print for the batch, as jax's
    tf.jit(tf.vmap(tf.grad(f)))(xs)
    assert capsys.readouterr().out == f"y = {ys} total={ys.sum(1)}\n"


def test_prints_once_per_call_when_torch_autograd_runs_the_backward(capsys):
    x = (torch.arange(3.0) + 0.5).requires_grad_()
    tf.jit(f)(x).backward()
    assert capsys.readouterr().out == printed(x.detach())
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())


def test_a_print_in_a_custom_vjp_backward_prints_the_cotangent_when_the_backward_runs(capsys):
    @tf.custom_vjp
    def scale(x):
        return x * 3

    def bwd(_, g):
        tf.debug.print("g = {}", g)
        return (g * 3,)

    scale.defvjp(lambda x: (x * 3, None), bwd)
    x = torch.ones(2, requires_grad=True)
    out = tf.jit(lambda x: scale(x).sum())(x)
    assert capsys.readouterr().out == ""  # the forward prints nothing
    out.backward()
    assert capsys.readouterr().out == f"g = {torch.ones(2)}\n"


def test_values_computed_inside_a_fusion_region_print_after_it(capsys):
    ex = NvFuserExecutor(frontend=standin_frontend(), device_type="cpu")
    jitted = tf.jit(f, executors=[ex, *tf.executors.get_default_executors()])
    x = torch.arange(3.0)
    jitted(x)
    assert any(b.sym.name.startswith("nvfuser_fusion_") for b in tf.last_traces(jitted)[-1].bound_symbols)
    assert capsys.readouterr().out == printed(x)


def test_outside_tracing_it_prints_at_once(capsys):
    tf.debug.print("{a} and {}", torch.tensor(1.0), a=[1, 2])
    assert capsys.readouterr().out == "[1, 2] and 1.0\n"  # str.format's meaning: a 0-dim tensor formats as its number


def test_breakpoint_stops_on_every_call_with_the_values(monkeypatch):
    stops = []
    # Python's breakpoint() calls sys.breakpointhook from the frame that holds `values`
    monkeypatch.setattr(sys, "breakpointhook", lambda *a, **k: stops.append(sys._getframe(1).f_locals["values"]))

    def g(x):
        y = x.exp()
        tf.debug.breakpoint(y)
        return y + 1

    jitted = tf.jit(g)
    for x in (torch.zeros(2), torch.ones(2)):
        jitted(x)
    assert len(stops) == 2
    torch.testing.assert_close(stops[1][0], torch.ones(2).exp())


def test_a_format_that_is_not_a_string_is_named():
    with pytest.raises(TypeError, match="fmt must be a format string"):
        tf.debug.print(3, torch.ones(1))
