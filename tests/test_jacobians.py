"""tf.jacrev, tf.jacfwd and tf.hessian (transforms/jacobians.py) against torch.func, and the laws
tying them together."""
from __future__ import annotations

import optree
import pytest
import torch
from hypothesis import given, settings

import thunderfn as tf
from thunderfn.testing import strategies as tst


def assert_trees_close(got, expected, **kwargs):
    got_leaves, got_spec = optree.tree_flatten(got)
    expected_leaves, expected_spec = optree.tree_flatten(expected)
    assert got_spec == expected_spec, f"{got_spec} != {expected_spec}"
    for g, e in zip(got_leaves, expected_leaves):
        torch.testing.assert_close(g, e, **kwargs)


def f_matrix(x):
    return torch.sin(x) * x.sum()


def f_pytrees(params, x):
    h = torch.tanh(x @ params["w"] + params["b"])
    return h.sum(), {"h": h * 2}


@pytest.mark.parametrize("transform, reference", [(tf.jacrev, torch.func.jacrev), (tf.jacfwd, torch.func.jacfwd)],
                         ids=["jacrev", "jacfwd"])
def test_jacobian_of_a_matrix_function_matches_torch_func(transform, reference):
    x = torch.randn(3, 4, dtype=torch.float64)
    got = transform(f_matrix)(x)
    assert got.shape == (3, 4, 3, 4)
    torch.testing.assert_close(got, reference(f_matrix)(x))


@pytest.mark.parametrize("transform, reference", [(tf.jacrev, torch.func.jacrev), (tf.jacfwd, torch.func.jacfwd)],
                         ids=["jacrev", "jacfwd"])
@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_pytrees_in_and_out_take_jaxs_structure(transform, reference, argnums):
    params = {"w": torch.randn(4, 3, dtype=torch.float64), "b": torch.randn(3, dtype=torch.float64)}
    x = torch.randn(2, 4, dtype=torch.float64)
    assert_trees_close(transform(f_pytrees, argnums=argnums)(params, x),
                       reference(f_pytrees, argnums=argnums)(params, x))


@pytest.mark.parametrize("transform", [tf.jacrev, tf.jacfwd], ids=["jacrev", "jacfwd"])
def test_has_aux_returns_the_aux_of_one_evaluation(transform):
    def f(x):
        return x.exp(), {"norm": x.norm()}

    x = torch.randn(5, dtype=torch.float64)
    jac, aux = transform(f, has_aux=True)(x)
    torch.testing.assert_close(jac, torch.diag(x.exp()))
    torch.testing.assert_close(aux["norm"], x.norm())


def test_an_input_the_output_does_not_depend_on_has_a_zero_block():
    x, y = torch.randn(3, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
    jx, jy = tf.jacrev(lambda x, y: x * 2, argnums=(0, 1))(x, y)
    torch.testing.assert_close(jx, 2 * torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(jy, torch.zeros(3, 2, dtype=torch.float64))


def test_chunked_jacrev_equals_unchunked():
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(tf.jacrev(f_matrix, chunk_size=5)(x), tf.jacrev(f_matrix)(x))


def test_hessian_is_symmetric_equals_forward_over_reverse_and_torch_func():
    def f(x):
        return (x.sin() * x.roll(1)).sum() + (x ** 3).sum()

    x = torch.randn(6, dtype=torch.float64)
    h = tf.hessian(f)(x)
    torch.testing.assert_close(h, h.T)
    torch.testing.assert_close(h, tf.jacfwd(tf.jacrev(f))(x))
    torch.testing.assert_close(h, torch.func.hessian(f)(x))


def test_jit_of_jacrev_matches_jacrev():
    x = torch.randn(3, 4, dtype=torch.float64)
    jitted = tf.jit(tf.jacrev(f_matrix))
    torch.testing.assert_close(jitted(x), tf.jacrev(f_matrix)(x))
    torch.testing.assert_close(jitted(x + 1), tf.jacrev(f_matrix)(x + 1))


@settings(deadline=None)
@given(tst.programs(n_inputs=1, max_steps=4), tst.program_inputs(n_inputs=1, dtypes=(torch.float64,)))
def test_law_jacrev_equals_jacfwd(program, inputs):
    """law: jacrev(f)(x) == jacfwd(f)(x) (two ways to the same Jacobian)"""
    (x,) = inputs
    try:
        program(x)
    except RuntimeError:  # a drawn program that does not fit its shapes raises in eager too
        return
    torch.testing.assert_close(tf.jacrev(program)(x), tf.jacfwd(program)(x), equal_nan=True)


# -- where torch.func answers, so does thunderfn (the cases that crashed) -------------------------
_JACOBIAN_TRANSFORMS = {"jacrev": (tf.jacrev, torch.func.jacrev), "jacfwd": (tf.jacfwd, torch.func.jacfwd),
                        "hessian": (tf.hessian, torch.func.hessian)}


@pytest.mark.parametrize("name", _JACOBIAN_TRANSFORMS)
def test_jacobians_of_a_zero_dim_input_match_torch_func(name):
    ours, theirs = _JACOBIAN_TRANSFORMS[name]
    x = torch.tensor(0.5, dtype=torch.float64)
    torch.testing.assert_close(ours(torch.sin)(x), theirs(torch.sin)(x))
    f = lambda a, b: a * b.sum() ** 2  # noqa: E731  (0-d and 1-d arguments together)
    y = torch.tensor([0.5, 2.0], dtype=torch.float64)
    torch.testing.assert_close(ours(f, argnums=(0, 1))(x, y), theirs(f, argnums=(0, 1))(x, y))


@pytest.mark.parametrize("constant", [lambda t: torch.ones(2), lambda t: torch.tensor(2.0)], ids=["ones", "tensor"])
@pytest.mark.parametrize("name", ["jacrev", "jacfwd"])
def test_jacobian_of_an_output_that_ignores_the_input_is_zeros(name, constant):
    ours, theirs = _JACOBIAN_TRANSFORMS[name]
    for x in (torch.ones(3), torch.tensor(0.5)):
        torch.testing.assert_close(ours(constant)(x), theirs(constant)(x))


@pytest.mark.parametrize("name", _JACOBIAN_TRANSFORMS)
def test_complex_input_to_a_jacobian_is_refused_by_name_as_torch_func(name):
    ours, theirs = _JACOBIAN_TRANSFORMS[name]
    z = torch.tensor([1 + 2j, 3j])
    with pytest.raises(RuntimeError, match="Expected all inputs to be real"):
        theirs(lambda t: t.abs().sum())(z)
    with pytest.raises(tf.errors.TransformArgumentError, match="Expected all inputs to be real .* idx: 0"):
        ours(lambda t: t.abs().sum())(z)


@pytest.mark.parametrize("name", _JACOBIAN_TRANSFORMS)
def test_argnums_out_of_range_is_a_named_error_and_negative_argnums_count_from_the_end(name):
    ours, theirs = _JACOBIAN_TRANSFORMS[name]
    f = lambda a, b: (a * b).sum()  # noqa: E731
    x, y = torch.tensor([0.5, 1.0], dtype=torch.float64), torch.tensor([2.0, 3.0], dtype=torch.float64)
    with pytest.raises(tf.errors.TransformArgumentError, match="Got argnum=-3, but only 2 positional inputs") as e:
        ours(f, argnums=-3)(x, y)
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, TypeError)
    # (torch.func.jacfwd with argnums=-1 gives zeros on torch 2.13: compared with argnums=1, its meaning)
    torch.testing.assert_close(ours(f, argnums=-1)(x, y), theirs(f, argnums=1)(x, y))
