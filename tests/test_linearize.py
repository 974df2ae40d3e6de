"""tf.linearize: its output and JVP agree with torch.func.linearize and tf.jvp, jvp_fn is linear in the
tangents and holds none of the forward's ops (its trace reads only residuals and tangents), fn runs once,
and bad tangents are refused in torch's words."""
import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.errors import ArgumentRuntimeError, ArgumentTypeError, SavedTensorModifiedError


def _f64(*shape):
    return torch.randn(*shape, dtype=torch.float64)


# (fn, primals): single tensors, several arguments, pytrees in and out
CASES = {
    "sin_exp": (lambda x: torch.sin(x) * torch.exp(x), (_f64(5),)),
    "matmul_tanh": (lambda x, w: torch.tanh(x @ w).sum(-1), (_f64(4, 3), _f64(3, 2))),
    "softmax": (lambda x: F.softmax(x, -1) * x, (_f64(3, 4),)),
    "pytree_in_out": (lambda d, y: {"a": d["u"] * y.cos(), "b": (d["v"] ** 3, d["u"].sum())},
                      ({"u": _f64(3), "v": _f64(2, 2)}, _f64(3))),
    "identity": (lambda x: x, (_f64(3),)),
}


def _tangents_like(primals):
    return torch.utils._pytree.tree_map(lambda p: torch.randn_like(p), primals)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_linearize_agrees_with_torch_func_linearize_and_jvp(case):
    fn, primals = case
    out, jvp_fn = tf.linearize(fn, *primals)
    expected_out, expected_jvp_fn = torch.func.linearize(fn, *primals)
    torch.testing.assert_close(out, expected_out)
    for _ in range(2):  # the same jvp_fn, for several tangents
        tangents = _tangents_like(primals)
        t = jvp_fn(*tangents)
        torch.testing.assert_close(t, expected_jvp_fn(*tangents))
        torch.testing.assert_close(t, tf.jvp(fn, primals, tangents)[1])


def _names(bsyms) -> set:
    names = set()
    for b in bsyms:
        names.add(b.sym.name)
        names |= _names(b.subsymbols)
    return names


def test_the_tangent_computation_holds_no_op_of_the_forward():
    x = _f64(4)
    out, jvp_fn = tf.linearize(lambda x: torch.sin(x) * torch.exp(x), x)
    t = _f64(4)
    torch.testing.assert_close(jvp_fn(t), t * (torch.cos(x) * torch.exp(x) + torch.sin(x) * torch.exp(x)))
    tangent_trace = tf.last_traces(jvp_fn)[0]
    assert {b.sym.name for b in tangent_trace.bound_symbols} == {"mul", "add"}
    assert not _names(tangent_trace.bound_symbols) & {"sin", "cos", "exp"}
    # its inputs: the saved primal values (cos x, exp x, sin x) and the one tangent
    assert len(tangent_trace.args) == 4
    assert not _names(tf.last_traces(jvp_fn)[-1].bound_symbols) & {"sin", "cos", "exp"}


def test_fn_runs_once_and_jvp_fn_never_calls_it_again():
    calls = []

    def fn(x):
        calls.append(1)
        return x.tanh() * x

    x = _f64(3)
    _, jvp_fn = tf.linearize(fn, x)
    assert len(calls) == 1
    t1, t2 = _f64(3), _f64(3)
    torch.testing.assert_close(jvp_fn(2 * t1 + t2), 2 * jvp_fn(t1) + jvp_fn(t2))  # linear in the tangent
    assert len(calls) == 1


def test_an_integer_primal_takes_a_tangent_of_its_dtype_and_gets_none_of_it():
    x, n = _f64(3), torch.tensor([1, 2, 3])
    fn = lambda x, n: x * n  # noqa: E731
    _, jvp_fn = tf.linearize(fn, x, n)
    t = _f64(3)
    torch.testing.assert_close(jvp_fn(t, torch.zeros(3, dtype=torch.long)), t * n)


def test_linearize_inside_a_jitted_function_matches_jvp():
    fn = lambda x: torch.sin(x) ** 2  # noqa: E731

    @tf.jit
    def jvp_of(x, t):
        out, jvp_fn = tf.linearize(fn, x)
        return out, jvp_fn(t)

    x, t = _f64(4), _f64(4)
    out, tangent = jvp_of(x, t)
    expected_out, expected_tangent = tf.jvp(fn, (x,), (t,))
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(tangent, expected_tangent)


def test_bad_tangents_are_refused_in_torchs_words():
    x = _f64(3)
    _, jvp_fn = tf.linearize(torch.sin, x)
    with pytest.raises(ArgumentRuntimeError, match="Expected the tangents .* to have the same argspec as the primals"):
        jvp_fn(x, x)
    with pytest.raises(RuntimeError, match=r"tangent:0 with shape \(4,\) in flattened pytree doesn't match the "
                                           r"shape \(3,\) of the corresponding primal"):
        jvp_fn(_f64(4))
    with pytest.raises(RuntimeError, match="tangent:0 with dtype torch.float32 .* doesn't match the dtype "
                                           "torch.float64"):
        jvp_fn(torch.ones(3))
    with pytest.raises(ArgumentTypeError, match="linearize: expected the primals to be tensors"):
        tf.linearize(lambda a: a * 2, 1.0)


def test_a_saved_value_modified_in_place_after_linearize_is_refused():
    x = _f64(3)
    _, jvp_fn = tf.linearize(lambda x: x * x, x)  # the JVP reads x itself
    x.add_(1)
    with pytest.raises(SavedTensorModifiedError, match="modified by an in-place operation after tf.linearize"):
        jvp_fn(_f64(3))


def test_jvp_fn_composes_vmap_over_the_basis_is_the_jacobian_and_grad_its_transpose():
    fn = lambda x: torch.sin(x) * x.sum()  # noqa: E731
    x = _f64(4)
    _, jvp_fn = tf.linearize(fn, x)
    jacobian = torch.func.jacfwd(fn)(x)
    torch.testing.assert_close(tf.vmap(jvp_fn)(torch.eye(4, dtype=torch.float64)).T, jacobian)
    torch.testing.assert_close(tf.grad(lambda t: jvp_fn(t).sum())(_f64(4)), jacobian.sum(0))  # <1, J t> = (J^T 1) . t
