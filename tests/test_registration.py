"""One registration style per table: every entry of vjp_rules, jvp_rules, batching_rules and an
executor's lowerings is one explicit rule type, entered through one function that the public
spellings (defvjp, custom_vjp.defvjp, defbatch, register_operator(batch_rule=), register_lowering,
register_implementation, add_operator_executor, register_prim) wrap."""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
import thunderfn.torch as ltorch
from thunderfn import executors
from thunderfn.executors import (Lowering, OperatorExecutor, RunAsItself, RunAsOperator, RunWithTorch, TraceInPlace,
                                 add_operator_executor)
from thunderfn.executors.torch_executor import prim_impls
from thunderfn.testing.registries import RegistrySnapshot
from thunderfn.transforms.batching_rules import BatchRule, batching_rules, defbatch, register_batch
from thunderfn.transforms.jvp_rules import JVPRule, jvp_rules, register_jvp
from thunderfn.transforms.vjp_rules import VJPRule, register_vjp, rule_for, vjp_rules


@pytest.fixture(autouse=True)
def _registrations_undone():
    snapshot = RegistrySnapshot()
    yield
    snapshot.restore()


def test_every_vjp_jvp_and_batching_table_entry_is_its_rule_type():
    assert vjp_rules and all(isinstance(rule, VJPRule) for rule in vjp_rules.values())
    assert jvp_rules and all(isinstance(rule, JVPRule) for rule in jvp_rules.values())
    assert batching_rules and all(isinstance(rule, BatchRule) for rule in batching_rules.values())


def test_the_tables_refuse_anything_but_their_rule_type():
    with pytest.raises(TypeError, match="must be a VJPRule"):
        register_vjp("some.symbol", lambda res, g: (g,))
    with pytest.raises(TypeError, match="must be a JVPRule"):
        register_jvp("some.symbol", lambda res, t: t[0])
    with pytest.raises(TypeError, match="must be a BatchRule"):
        register_batch("some.symbol", lambda args, dims, kwargs, out: (args[0], dims[0]))
    with pytest.raises(TypeError, match="action is"):
        Lowering(None, lambda a: a)
    with pytest.raises(TypeError, match="must be a Lowering"):
        OperatorExecutor("ex").add_lowering(ltorch.mul, lambda a, b: a * b)


def test_custom_vjp_enters_vjp_rules_as_a_vjp_rule_and_leaves_with_its_function():
    f = tf.custom_vjp(torch.sin)
    f.defvjp(lambda x: (torch.sin(x), x), lambda x, g: (g * torch.cos(x),))
    key = f._symbol.id
    assert isinstance(vjp_rules[key], VJPRule)
    del f
    gc.collect()
    assert key not in vjp_rules


def test_applies_restricts_a_vjp_rule_to_some_calls():
    q = torch.randn(1, 2, 3, 4)
    for dropout_p, has_rule in ((0.0, True), (0.5, False)):  # with dropout, the decomposition is differentiated
        (bsym,) = tf.trace(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=dropout_p), q).bound_symbols
        assert (rule_for(bsym) is vjp_rules[ltorch.scaled_dot_product_attention.id]) == has_rule
        assert has_rule or rule_for(bsym) is None


def test_each_public_lowering_spelling_makes_one_explicit_action():
    ex = OperatorExecutor("ex")
    op = ex.register_operator("np_mul", like=lambda a, b: a * b, fn=torch.mul)
    lower = lambda a, b: op(a, b)  # noqa: E731
    ex.register_lowering(ltorch.mul, lower=lower)
    assert ex.lowerings[ltorch.mul.id] == Lowering(None, TraceInPlace(lower))
    ex.register_lowering(ltorch.mul, lower=op, replace=True)
    assert ex.lowerings[ltorch.mul.id].action == RunAsOperator(op)
    ex.register_implementation(ltorch.mul, op, replace=True)
    assert ex.lowerings[ltorch.mul.id].action == RunAsOperator(op)
    ex.register_implementation(ltorch.mul, execution_transform=lower, replace=True)
    assert ex.lowerings[ltorch.mul.id].action == TraceInPlace(lower)
    ex.register_lowering(op, checker=lambda a, b: True)  # an operator without lower= runs as itself
    assert ex.lowerings[op.id].action == RunAsOperator(op)
    added = add_operator_executor("np_add_ex", {ltorch.add.id: ("np_add", None, torch.add)},
                                  add_to_default_executors=False)
    assert added.lowerings[ltorch.add.id].action == RunAsOperator(added.operators["np_add"])


def test_the_torch_executor_runs_symbols_with_torch_and_other_operators_as_themselves():
    ex = OperatorExecutor("ex")
    op = ex.register_operator("np_mul", like=lambda a, b: a * b, fn=torch.mul)
    mul, np_mul = tf.trace(lambda a, b: op(a * b, b), torch.ones(2), torch.ones(2)).bound_symbols
    assert executors.torch_ex.lowering_for(mul).action == RunWithTorch()
    assert executors.torch_ex.lowering_for(np_mul).action == RunAsItself()
    assert ex.lowering_for(np_mul).action == RunAsItself()


def test_register_prim_fills_the_shared_prim_table_and_the_eager_implementation():
    prim = tf.prims.make_prim("registration_test_double", "registration_test_double", meta=tf.TensorProxy.like)
    executors.torch_ex.register_prim(prim, lambda a: a * 2)
    assert prim_impls[prim.id](torch.ones(1)) == 2
    (bsym,) = tf.trace(prim, torch.ones(2)).bound_symbols
    assert executors.torch_prims_ex.lowering_for(bsym).action == RunWithTorch()
    torch.testing.assert_close(prim(torch.ones(2)), torch.full((2,), 2.0))  # eagerly
    torch.testing.assert_close(tf.jit(prim)(torch.ones(2)), torch.full((2,), 2.0))


def _doubling_operator(ex, **batch_rule):
    return ex.register_operator("double", meta=lambda a: tf.TensorProxy(shape=a.shape, dtype=a.dtype, device=a.device),
                                fn=lambda a: a * 2, **batch_rule)


def test_defbatch_and_an_operators_batch_rule_enter_the_batching_table_by_symbol_id():
    @defbatch("some.symbol", "other.symbol")
    def rule(args, dims, kwargs, out):
        return args[0], dims[0]

    assert batching_rules["some.symbol"] == batching_rules["other.symbol"] == BatchRule(rule)
    ex = OperatorExecutor("batched_ex")
    calls = []

    def batch_double(args, dims, kwargs, out):
        calls.append(dims)
        return op(args[0]), dims[0]

    op = _doubling_operator(ex, batch_rule=batch_double)
    assert batching_rules[op.id] == BatchRule(batch_double)
    x = torch.randn(4, 3)
    torch.testing.assert_close(tf.vmap(lambda a: op(a), in_axes=1)(x.T), x * 2)
    assert calls == [(1,)]


def test_a_new_executor_of_the_same_name_does_not_inherit_an_operators_batch_rule():
    first = _doubling_operator(OperatorExecutor("renewed_ex"), batch_rule=lambda args, dims, kwargs, out: (args[0], dims[0]))
    assert first.id in batching_rules
    again = _doubling_operator(OperatorExecutor("renewed_ex"))
    assert again.id == first.id and again.id not in batching_rules
    with pytest.raises(tf.errors.BatchingError, match="no batching rule"):
        tf.vmap(lambda a: again(a))(torch.ones(2, 3))
