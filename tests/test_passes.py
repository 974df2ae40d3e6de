"""Common-subexpression elimination (core/passes.py `cse`): what it merges, what it never
merges, and that a jitted function computes what eager does either way."""
import pytest
import torch

import thunderfn as tf
from thunderfn.core.passes import cse

CSE = "Common Subexpression Elimination"


def _stage(traces, name):
    return next(t for t in traces if t.provenance.startswith(f"Constructed by {name}"))


def _calls(trc, name):
    return [b for b in trc.bound_symbols if b.sym.name == name]


def test_a_repeated_call_is_computed_once_and_the_trace_gets_shorter():
    def fn(x):
        return x.cos().exp() + x.cos().exp()

    jitted = tf.jit(fn)
    x = torch.randn(5)
    torch.testing.assert_close(jitted(x), fn(x))
    traces = tf.last_traces(jitted)
    before, after = _stage(traces, "Dead Code Elimination"), _stage(traces, CSE)
    assert len(after.bound_symbols) == len(before.bound_symbols) - 2
    assert len(_calls(after, "cos")) == len(_calls(after, "exp")) == 1
    (add,) = _calls(after, "add")
    assert add.args[0].name == add.args[1].name
    code = [line for line in str(traces[-1]).splitlines() if not line.strip().startswith("#")]
    assert sum("torch.cos(" in line for line in code) == 1


def test_cse_is_a_pass_of_the_computation_and_of_both_halves_of_a_split():
    jitted = tf.jit(lambda x: x * x)
    x = torch.randn(3, requires_grad=True)
    jitted(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    assert sum(t.provenance.startswith(f"Constructed by {CSE}") for t in tf.last_traces(jitted)) == 2
    # x * x's derivative g * x + g * x: the backward computes g * x once
    backward = _stage(tf.last_backward_traces(jitted), CSE)
    assert len(_calls(backward, "mul")) == 1


def test_random_draws_are_never_merged():
    def fn(x):
        return torch.rand(3) + x, torch.rand(3) + x, torch.randn_like(x) * torch.randn_like(x)

    jitted = tf.jit(fn)
    x = torch.zeros(3)
    torch.manual_seed(0)
    a, b, c = jitted(x)
    torch.manual_seed(0)
    expected = fn(x)
    assert not torch.equal(a, b)
    for got, want in zip((a, b, c), expected):
        torch.testing.assert_close(got, want)
    after = _stage(tf.last_traces(jitted), CSE)
    assert len(_calls(after, "rand")) == 2 and len(_calls(after, "add")) == 2


def test_reads_on_either_side_of_an_in_place_write_are_not_merged():
    def fn(x, y):
        before = x.sin()
        x.add_(1)
        after = x.sin()
        t = y * 2
        first = t.exp()
        t.mul_(3)
        second = t.exp()
        return before + after, first + second

    jitted = tf.jit(fn)
    x, y = torch.randn(4), torch.randn(4)
    x_eager = x.clone()
    got = jitted(x, y)
    expected = fn(x_eager, y)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, x_eager)
    after = _stage(tf.last_traces(jitted), CSE)
    assert len(_calls(after, "sin")) == 2 and len(_calls(after, "exp")) == 2


def test_equal_python_values_of_different_types_are_different_arguments():
    def fn(x):
        return (x + 1) * (x + True) * (x + 1.0) * (x * 0.0) * (x * -0.0)

    x = torch.arange(3)
    trc = cse(tf.trace(fn, x))
    assert len(_calls(trc, "add")) == 3 and len(_calls(trc, "mul")) == 6
    jitted = tf.jit(fn)
    got, expected = jitted(-x - 1), fn(-x - 1)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)
    assert torch.equal(torch.signbit(got), torch.signbit(expected))


def test_calls_under_different_grad_modes_are_not_merged():
    def fn(x):
        tracked = x * 2
        with torch.no_grad():
            untracked = x * 2
        return tracked + untracked

    x = torch.randn(3, requires_grad=True)
    tf.jit(fn)(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_two_returned_results_of_one_computation_stay_distinct_tensors(requires_grad):
    def fn(x):
        return x + 1, x + 1, (x + 1).reshape(2, 2), (x * 2).sum()

    x = torch.randn(4, requires_grad=requires_grad)
    with torch.no_grad():
        expected = fn(x)
    first, second, reshaped, _ = tf.jit(fn)(x)
    assert first is not second
    with torch.no_grad():
        first.add_(1)
    torch.testing.assert_close(second, expected[1])
    torch.testing.assert_close(reshaped, expected[2])


def test_a_repeat_of_a_returned_result_that_is_not_returned_itself_is_merged():
    def fn(x):
        y = x + 1
        return y, (x + 1).sum()

    jitted = tf.jit(fn)
    x = torch.randn(3)
    got, expected = jitted(x), fn(x)
    torch.testing.assert_close(got, expected)
    assert len(_calls(_stage(tf.last_traces(jitted), CSE), "add")) == 1
