"""jit's donate_argnums (JAX's): a donated tensor's memory holds an output of its shape and dtype, and the
results are eager's; what autograd needs, what other inputs or captured tensors see, is never written."""
from __future__ import annotations

import warnings

import pytest
import torch

import thunderfn as tf


def _update(x, y):
    return torch.sin(x * 2) + y


def test_an_output_of_the_donated_shape_is_written_into_the_donated_tensor():
    jitted = tf.jit(_update, donate_argnums=0)
    x, y = torch.randn(64), torch.randn(64)
    expected, memory = _update(x, y), x.data_ptr()
    out = jitted(x, y)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert out.data_ptr() == memory  # no new allocation for the output
    x2 = torch.randn(64)
    expected, memory = _update(x2, y), x2.data_ptr()
    out = jitted(x2, y)  # the cached entry donates each call's tensor
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert out.data_ptr() == memory


def test_without_donation_the_output_is_new_memory_and_the_argument_is_kept():
    x, y = torch.randn(64), torch.randn(64)
    before = x.clone()
    out = tf.jit(_update)(x, y)
    assert out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(x, before, rtol=0, atol=0)


def test_a_pytree_of_parameters_is_donated_leaf_by_leaf_under_no_grad():
    # an optimizer-like update: the new parameters take the old ones' memory
    params = [torch.randn(5, requires_grad=True), torch.randn(3, 2, requires_grad=True)]
    grads = [torch.randn(5), torch.randn(3, 2)]
    step = tf.jit(lambda ps, gs, lr: [p - lr * g for p, g in zip(ps, gs)], donate_argnums=0)
    with torch.no_grad():
        expected = [p - 0.1 * g for p, g in zip(params, grads)]
        memory = [p.data_ptr() for p in params]
        new = step(params, grads, 0.1)
    assert [p.data_ptr() for p in new] == memory
    for a, b in zip(new, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_donated_tensor_that_autograd_differentiates_is_not_donated_and_the_gradient_is_right():
    jitted = tf.jit(_update, donate_argnums=0)
    x, y = torch.randn(8, requires_grad=True), torch.randn(8)
    before = x.detach().clone()
    with pytest.warns(UserWarning, match=r"'_update' donates nothing in this compile \(donate_argnums\): "
                                         r"torch.autograd differentiates it"):
        out = jitted(x, y)
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2 * torch.cos(2 * before))
    torch.testing.assert_close(x.detach(), before, rtol=0, atol=0)


@pytest.mark.parametrize("how", ["the same tensor twice", "a view of another input", "not contiguous",
                                 "a captured tensor"])
def test_a_donated_tensor_whose_memory_something_else_reads_runs_on_a_copy(how):
    base = torch.randn(4, 4)
    if how == "a captured tensor":
        jitted = tf.jit(lambda x, y: x * 2 + base + y, donate_argnums=0)
        x, y = base, torch.ones(4, 4)
        expected = base * 2 + base + y
    else:
        jitted = tf.jit(lambda x, y: x * 2 + y, donate_argnums=0)
        x, y = {"the same tensor twice": (base, base), "a view of another input": (base[0], base[1]),
                "not contiguous": (base.t(), torch.ones(4, 4))}[how]
        expected = x * 2 + y
    kept = x.clone()
    out = jitted(x, y)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(x, kept, rtol=0, atol=0)  # the call ran on a copy: nothing was donated


def test_a_donated_tensor_with_no_output_of_its_shape_holds_no_result_but_the_result_is_right():
    # (its contents afterwards are unspecified, as a deleted buffer's: here an intermediate was written there)
    jitted = tf.jit(lambda x: (x * 2).sum(), donate_argnums=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jitted(torch.ones(10)).item() == 20.0


@pytest.mark.parametrize("bad, error, words", [
    ("a", TypeError, "donate_argnums must be an int or a sequence of ints, got 'a'"),
    ((0, 1.5), TypeError, r"donate_argnums must be an int or a sequence of ints, got \(0, 1.5\)"),
    (2, ValueError, r"jitted function '_update' has donate_argnums=\(2,\), but only accepts 2 positional arguments; "
                    r"its parameters: \(x, y\)"),
])
def test_bad_donate_argnums_are_refused_when_jit_is_called(bad, error, words):
    with pytest.raises(error, match=words):
        tf.jit(_update, donate_argnums=bad)


def test_an_argument_both_static_and_donated_is_refused():
    with pytest.raises(ValueError, match=r"donate_argnums=\(1,\) and static_argnums=\(1,\): argument 1 cannot be both"):
        tf.jit(_update, donate_argnums=-1, static_argnums=1)


def test_donate_argnums_on_a_module_is_refused():
    with pytest.raises(ValueError, match="donate_argnums is not supported for an nn.Module"):
        tf.jit(torch.nn.Linear(2, 2), donate_argnums=0)


def test_profile_refuses_a_donating_function():
    # (profile calls it many times with the same arguments: donation would consume them on the first)
    with pytest.raises(ValueError, match="donate_argnums consumes the donated ones"):
        tf.profile(tf.jit(_update, donate_argnums=0), torch.randn(3), torch.randn(3))
