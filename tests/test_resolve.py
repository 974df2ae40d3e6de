"""One resolver for every transform (transforms/resolve.py): reverse mode, forward mode and vmap
ask the same question of each bound symbol, "its rule, its like= function, its decomposition,
the opaque op, or refuse", and differ only in the data each brings (its Transform)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn import prims
from thunderfn.errors import BatchingError, ForwardModeError, UnsupportedOpError
from thunderfn.executors import OperatorExecutor
from thunderfn.testing.registries import RegistrySnapshot
from thunderfn.transforms.autodiff import REVERSE
from thunderfn.transforms.forward_mode import FORWARD
from thunderfn.transforms.resolve import Way, resolve, without_rule
from thunderfn.transforms.vmap import VMAP


@pytest.fixture(autouse=True)
def _registrations_undone():
    snapshot = RegistrySnapshot()
    yield
    snapshot.restore()


def _bsym(fn, *args):
    """The last top-level bound symbol fn records (its output's)."""
    return [b for b in tf.trace(fn, *args).bound_symbols if b.sym.name != "return"][-1]


def _operators():
    ex = OperatorExecutor("resolved_ex")
    meta = lambda a: tf.TensorProxy(shape=a.shape, dtype=a.dtype, device=a.device)  # noqa: E731
    like_op = ex.register_operator("like_double", like=lambda a: a * 2, fn=lambda a: a * 2)
    meta_op = ex.register_operator("meta_double", meta=meta, fn=lambda a: a * 2)
    batched_op = ex.register_operator("batched_double", meta=meta, fn=lambda a: a * 2,
                                      batch_rule=lambda args, dims, kwargs, out: (batched_op(args[0]), dims[0]))
    return like_op, meta_op, batched_op


def _custom_vjp_sin():
    f = tf.custom_vjp(torch.sin)
    f.defvjp(lambda x: (torch.sin(x), x), lambda x, g: (g * torch.cos(x),))
    return f


X = torch.randn(2, 3, 4, 5)


def test_each_transform_treats_each_kind_of_symbol_as_its_table_and_inputs_say():
    like_op, meta_op, batched_op = _operators()
    custom = _custom_vjp_sin()
    cases = {  # symbol: (reverse, forward, vmap)
        "a prim with rules": (lambda x: prims.sin(x), Way.RULE, Way.RULE, Way.RULE),
        "a comparison": (lambda x: prims.gt(x, 0.0), Way.INERT, Way.INERT, Way.RULE),
        "a composite without rules": (lambda x: torch.outer(x[0, 0, 0], x[0, 0, 1]), Way.DECOMPOSITION, Way.REFUSE,
                                      Way.DECOMPOSITION),
        "an opaque torch op": (lambda x: F.interpolate(x[0], scale_factor=2), Way.OPAQUE, Way.OPAQUE, Way.OPAQUE),
        "an operator defined like=": (lambda x: like_op(x), Way.LIKE, Way.LIKE, Way.REFUSE),
        "an operator defined meta=": (lambda x: meta_op(x), Way.REFUSE, Way.REFUSE, Way.REFUSE),
        "an operator with a batch rule": (lambda x: batched_op(x), Way.REFUSE, Way.REFUSE, Way.RULE),
        "a custom_vjp function": (lambda x: custom(x), Way.RULE, Way.REFUSE, Way.CUSTOM),
    }
    for what, (fn, *expected) in cases.items():
        bsym = _bsym(fn, X)
        got = [resolve(bsym, t) for t in (REVERSE, FORWARD, VMAP)]
        assert got == expected, f"{what} ({bsym.sym.name}): {got}"


def test_a_vjp_rule_that_does_not_apply_leaves_the_decomposition():
    q = torch.randn(1, 2, 3, 4)
    for dropout_p, way in ((0.0, Way.RULE), (0.5, Way.DECOMPOSITION)):
        bsym = _bsym(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=dropout_p), q)
        assert resolve(bsym, REVERSE) is way
        assert without_rule(bsym, REVERSE) is Way.DECOMPOSITION


def test_each_transform_refuses_with_its_own_named_error():
    _, meta_op, _ = _operators()
    bsym = _bsym(lambda x: meta_op(x), X)
    assert isinstance(REVERSE.refusal(bsym), UnsupportedOpError) and "register_lowering" in str(REVERSE.refusal(bsym))
    assert isinstance(FORWARD.refusal(bsym), UnsupportedOpError) and "in forward mode" in str(FORWARD.refusal(bsym))
    assert isinstance(VMAP.refusal(bsym), BatchingError) and "batch_rule=rule" in str(VMAP.refusal(bsym))
    assert isinstance(FORWARD.refusal(_bsym(lambda x: _custom_vjp_sin()(x), X)), ForwardModeError)
    x = torch.randn(3)
    with pytest.raises(UnsupportedOpError, match="register_lowering"):
        tf.grad(lambda x: meta_op(x).sum())(x)
    with pytest.raises(UnsupportedOpError, match="in forward mode"):
        tf.jvp(lambda x: meta_op(x), (x,), (x,))
    with pytest.raises(BatchingError, match="batch_rule=rule"):
        tf.vmap(lambda x: meta_op(x))(X)


def test_operators_are_differentiated_and_batched_the_way_the_resolver_says():
    like_op, _, batched_op = _operators()
    x, t = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(tf.grad(lambda x: like_op(x).sin().sum())(x), 2 * torch.cos(2 * x))
    torch.testing.assert_close(tf.jvp(lambda x: like_op(x), (x,), (t,))[1], 2 * t)
    torch.testing.assert_close(tf.vmap(lambda x: batched_op(x))(x), 2 * x)
