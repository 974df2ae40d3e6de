"""The law of dynamic shapes: a jitted program equals the program, in shape and value, forward and backward, at
every length and after any lengths before it, under every `dynamic` option.

A trace may read a size as a Python value in many ways (`int(x.shape[1])`, `x.size(1)`, `len(x)`, `range(T)`, a
slice bound, `torch.arange(T)`, `torch.ones(T, T)`, a reshape to computed sizes, arithmetic on sizes, a branch on
0 or 1, a comparison with another input's size). Each either stays symbolic or pins the size with a guard that
every call checks, the call that triggered the compile included (cache_entry.py); the programs are
testing/strategies.py's SIZE_READING_PROGRAMS.
"""
import pytest
import torch
from hypothesis import given, settings

import thunderfn as tf
from thunderfn.testing import strategies as tst

D = 4


def _inputs(length: int, other_length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, length, D, dtype=torch.float64, generator=g, requires_grad=True)
    other = torch.randn(other_length, D, dtype=torch.float64, generator=g, requires_grad=True)
    return x, other


def _run(fn, x, other):
    """(output, gradients of x and other) or the exception eager raised."""
    x, other = x.detach().requires_grad_(), other.detach().requires_grad_()
    try:
        out = fn(x, other)
    except (RuntimeError, IndexError, ValueError) as e:
        return e
    grads = torch.autograd.grad(out.sum(), [x, other], allow_unused=True)
    return out, [torch.zeros_like(t) if g is None else g for g, t in zip(grads, (x, other))]


def _check(jitted, program, lengths):
    for n, length in enumerate(lengths):
        x, other = _inputs(length, lengths[n - 1] if n else length, seed=n)
        expected = _run(program, x, other)
        if isinstance(expected, Exception):
            with pytest.raises(type(expected)):
                _run(jitted, x, other)
            continue
        got = _run(jitted, x, other)
        assert not isinstance(got, Exception), f"call {n} (lengths {lengths[:n + 1]}): {got!r}"
        assert got[0].shape == expected[0].shape, \
            f"call {n} of lengths {lengths}: {got[0].shape} != {expected[0].shape}"
        torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m: f"call {n} of lengths {lengths}: {m}")


@pytest.mark.parametrize("dynamic", [None, True, False])
@settings(max_examples=25)
@given(tst.size_reading_programs(), tst.call_lengths())
def test_jit_equals_eager_at_every_length_after_any_lengths(dynamic, named_program, lengths):
    """jit(f, dynamic=d)(x) == f(x) in shape and value, forward and backward, for every call of a sequence."""
    _, program = named_program
    _check(tf.jit(program, dynamic=dynamic), program, lengths)


@pytest.mark.parametrize("name", sorted(tst.SIZE_READING_PROGRAMS))
@pytest.mark.parametrize("dynamic", [None, True])
def test_each_size_read_after_a_long_call_then_length_one(name, dynamic):
    """The sequence that returned a length-5 shape for a length-1 call (a trace at 5 pinned to 5 served the 1)."""
    program = tst.SIZE_READING_PROGRAMS[name]
    _check(tf.jit(program, dynamic=dynamic), program, [5, 1, 1, 3, 0, 1, 7])


def test_int_of_a_size_then_length_one_returns_length_one():
    """int(x.shape[1]) read in a position-embedding slice: a length-1 call after a length-5 call once
    returned a length-5 result."""
    pos, emb = torch.randn(128, 4), torch.randn(50, 4)

    def g(idx):
        T = int(idx.shape[1])
        return emb[idx] + pos[:T]

    jitted = tf.jit(g)
    jitted(torch.randint(0, 50, (2, 5)))
    x = torch.randint(0, 50, (2, 1))
    assert jitted(x).shape == g(x).shape == (2, 1, 4)
    torch.testing.assert_close(jitted(x), g(x))
    info = tf.cache_info(jitted)
    # the trace at length 5 pinned the length it was traced at: that entry serves 5, and 1 compiled its own
    assert any("== 5" in p for p in info["pinned"]), info
