"""JAX's stages (stages.py): tf.jit(f).lower(*args) compiles one signature without running it, .compile() runs
that program only, .cost_analysis() counts what it computes and moves."""
import pytest
import torch

import thunderfn as tf


def _step(x, w):
    x.add_(1)  # (a write into an input: tells whether the program ran)
    return torch.tanh(x @ w).sum()


def test_lower_compiles_without_running_and_compile_runs_that_program():
    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    jitted = tf.jit(_step)
    before = x.clone()
    lowered = jitted.lower(x, w)
    assert torch.equal(x, before)  # traced and lowered, not run
    assert lowered.traces and lowered.backward_traces  # w requires grad: the backward is compiled too
    assert "def computation(x, w)" in lowered.as_text() and "def backward" in lowered.as_text()
    compiled = lowered.compile()
    expected = _step(before.clone(), w)
    got = compiled(x, w)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, before + 1)
    got.backward()
    assert w.grad is not None
    assert tf.cache_info(jitted)["entries"] == 1  # the jitted function's own entry: calling it now hits


def test_compiled_refuses_another_signature_by_name():
    compiled = tf.jit(lambda x, w: torch.tanh(x @ w)).lower(torch.randn(4, 3), torch.randn(3, 5)).compile()
    with pytest.raises(tf.errors.SignatureMismatchError, match=r"shape \(4, 3\) -> \(5, 3\)") as info:
        compiled(torch.randn(5, 3), torch.randn(3, 5))
    assert isinstance(info.value, TypeError)  # (JAX's type for the same mistake)
    with pytest.raises(tf.errors.SignatureMismatchError, match="structure of the arguments"):
        compiled(torch.randn(4, 3))


def test_a_symbolic_signature_serves_every_size_it_admits():
    compiled = tf.jit(lambda x: x.sin() * 2, dynamic=True).lower(torch.randn(4)).compile()
    for n in (2, 7):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), x.sin() * 2)


def test_a_lowered_module_reads_its_parameters_when_called():
    model = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    compiled = tf.jit(model).lower(x).compile()
    torch.testing.assert_close(compiled(x), model(x))
    with torch.no_grad():
        model.weight.mul_(2)  # an optimizer step: the compiled forward sees it, as the jitted module does
    torch.testing.assert_close(compiled(x), model(x))


def test_cost_analysis_counts_a_matrix_products_flops_and_every_ops_bytes():
    cost = tf.jit(lambda x, w: torch.tanh(x @ w)).lower(torch.randn(4, 3), torch.randn(3, 5)).cost_analysis()
    matmul = next(r for r in cost["by_op"] if r["op"].endswith("matmul"))
    assert matmul["flops"] == 2 * 4 * 5 * 3 and matmul["executor"] == "torch"
    assert matmul["bytes accessed"] == (4 * 3 + 3 * 5 + 4 * 5) * 4
    assert cost["flops"] == sum(r["flops"] for r in cost["by_op"]) >= 2 * 4 * 5 * 3 + 4 * 5
    assert cost["bytes accessed"] == sum(r["bytes accessed"] for r in cost["by_op"])
