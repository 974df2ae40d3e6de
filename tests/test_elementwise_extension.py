"""Adding an elementwise op is one table line plus its OpInfo: from outside the library, one
call to `tf.extend.elementwise_op` (what a line of prims.py's elementwise table and its
`partials` entry give a library op) and the op traces, runs, differentiates in both
modes (against torch), batches and compiles. The op_db's own checks run on its OpInfo."""
from __future__ import annotations

import pytest
import torch
from torch.func import jvp as torch_jvp

import test_ops as forward_checks
import test_ops_autodiff as autodiff_checks
import thunderfn as tf
import thunderfn.torch as ltorch
from thunderfn import clang, prims
from thunderfn.core.rules import rules_of
from thunderfn.executors import nvfuser as nvfuser_executor
from thunderfn.testing.opinfo import OpInfo, SampleInput, make_tensor
from thunderfn.testing.registries import registries_restored


def _cube(x):
    return x * x * x


def _cube_partial(g, x, out):  # g * d(x^3)/dx, in the torch language as the library's partials are
    return ltorch.mul(g, ltorch.mul(ltorch.mul(x, x), 3.0))


def _scaled_sq(a, b):
    return a * b * b


@pytest.fixture
def ops():
    """my_cube (unary) and my_scaled_sq (a * b * b, binary), each added with one call, and
    removed again after the test."""
    with registries_restored():
        my_cube = tf.extend.elementwise_op("my_cube", (prims.FLOAT,), prims.Promotion.INT_TO_FLOAT, impl=_cube,
                                           partials=(_cube_partial,))
        my_scaled_sq = tf.extend.elementwise_op(
            "my_scaled_sq", (prims.FLOAT,), prims.Promotion.INT_TO_FLOAT, impl=_scaled_sq,
            partials=(lambda g, a, b, out: ltorch.mul(g, ltorch.mul(b, b)),
                      lambda g, a, b, out: ltorch.mul(g, ltorch.mul(ltorch.mul(a, b), 2.0))))
        yield my_cube, my_scaled_sq
    assert not hasattr(prims, "my_cube") and "my_cube" not in ltorch.symbols


def _samples(device, dtype):
    yield SampleInput((make_tensor((3, 4), device=device, dtype=dtype),))
    yield SampleInput((make_tensor((), device=device, dtype=dtype),))
    yield SampleInput((make_tensor((2, 3), device=device, dtype=dtype, noncontiguous=True),))


def _opinfo(my_cube):
    return OpInfo("my_cube", my_cube, _samples, dtypes=(torch.float32, torch.float64), reference=_cube)


def test_one_call_fills_every_layer(ops):
    my_cube, _ = ops
    pid = prims.my_cube.id
    assert ltorch.my_cube is my_cube and callable(clang.my_cube)
    assert prims.elementwise_ops["my_cube"].prim is prims.my_cube
    record = rules_of(pid)
    assert pid in prims.torch_impls and None not in (record.vjp, record.jvp, record.batch)
    # the torch language symbol decomposes into the prim, with clang's promotion of an integer input
    trc = tf.trace(lambda x: my_cube(x), torch.ones(3, dtype=torch.int64))
    (bsym,) = [b for b in trc.bound_symbols if b.sym is my_cube]
    assert [s.sym.name for s in bsym.subsymbols] == ["convert_element_type", "my_cube"]
    assert bsym.output.dtype is torch.get_default_dtype()


def test_runs_jits_and_differentiates_like_torch(ops):
    my_cube, my_scaled_sq = ops
    x = torch.randn(3, 4, dtype=torch.float64)
    b = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(my_cube(x), x ** 3)
    torch.testing.assert_close(tf.jit(lambda x: my_cube(x))(x), x ** 3)
    torch.testing.assert_close(tf.jit(lambda a, b: my_scaled_sq(a, b))(x, b), x * b * b)

    # reverse mode: tf.grad, and tf.jit's torch.autograd backward, against torch autograd
    def loss(a, b):
        return (my_scaled_sq(my_cube(a), b) * 0.5).sum()

    a_, b_ = x.clone().requires_grad_(), b.clone().requires_grad_()
    (_scaled_sq(_cube(a_), b_) * 0.5).sum().backward()
    grads = tf.grad(loss, argnums=(0, 1))(x, b)
    torch.testing.assert_close(grads, (a_.grad, b_.grad))
    a2, b2 = x.clone().requires_grad_(), b.clone().requires_grad_()
    tf.jit(loss)(a2, b2).backward()
    torch.testing.assert_close((a2.grad, b2.grad), (a_.grad, b_.grad))
    # a 0-dim operand's cotangent is summed back to ()
    s = torch.tensor(1.5, dtype=torch.float64)
    torch.testing.assert_close(tf.grad(lambda s, x: my_scaled_sq(x, s).sum())(s, x), (x * 2 * s).sum())

    # forward mode against torch.func.jvp
    t, tb = torch.randn_like(x), torch.randn_like(b)
    out, tangent = tf.jvp(lambda a, b: my_scaled_sq(my_cube(a), b), (x, b), (t, tb))
    expected = torch_jvp(lambda a, b: _scaled_sq(_cube(a), b), (x, b), (t, tb))
    torch.testing.assert_close((out, tangent), expected)

    # second order: grad of grad
    torch.testing.assert_close(tf.grad(lambda x: tf.grad(lambda x: my_cube(x).sum())(x).sum())(x), 6 * x)


def test_vmaps(ops):
    my_cube, my_scaled_sq = ops
    xs, b = torch.randn(5, 3), torch.randn(3)
    torch.testing.assert_close(tf.vmap(my_cube)(xs), xs ** 3)
    torch.testing.assert_close(tf.vmap(my_scaled_sq, in_axes=(0, None))(xs, b), xs * b * b)
    torch.testing.assert_close(tf.vmap(my_scaled_sq, in_axes=(None, 1))(xs[0], xs.T), xs[0] * xs * xs)


def test_its_opinfo_passes_the_op_db_checks(ops):
    op = _opinfo(ops[0])
    for dtype in op.dtypes:
        forward_checks._check_forward(op, dtype, forward_checks._jitted(op))
        forward_checks._check_forward(op, dtype, forward_checks._decomposed(op))
    autodiff_checks.test_vjp_matches_torch_autograd(op)
    autodiff_checks.test_vjp_jvp_inner_product_identity(op)


def test_an_nvfuser_name_gives_the_op_an_nvfuser_translation():
    with registries_restored():
        tf.extend.elementwise_op("my_exp", (prims.FLOAT,), prims.Promotion.INT_TO_FLOAT, impl=torch.exp,
                                 partials=(lambda g, x, out: ltorch.mul(g, out),), nvfuser="exp")
        pid = prims.my_exp.id
        assert nvfuser_executor.translations[pid].accepts is None  # every dtype the prim takes
    assert pid not in nvfuser_executor.translations and not hasattr(prims, "my_exp")


def test_an_operand_count_other_than_one_or_two_is_refused():
    with registries_restored():
        with pytest.raises(tf.errors.ArgumentValueError, match="one partial per operand"):
            tf.extend.elementwise_op("my_nothing", (prims.FLOAT,), prims.Promotion.DEFAULT, impl=_cube, partials=())
