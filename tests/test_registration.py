"""One registration style per table: every symbol's rules are one record of the rule table (its VJP,
JVP and batching rule, each one explicit rule type), and an executor's lowerings are explicit
Lowerings; each is entered through one function that the public spellings (defvjp,
custom_vjp.defvjp, defbatch, register_operator(batch_rule=), register_lowering,
register_implementation, add_operator_executor, register_prim) wrap."""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
import thunderfn.torch as ltorch
from thunderfn import executors
from thunderfn.core.rules import BatchRule, JVPRule, Rules, VJPRule, rules, rules_of, set_rule
from thunderfn.executors import (
    Lowering,
    OperatorExecutor,
    RunAsItself,
    RunAsOperator,
    RunWithTorch,
    TraceInPlace,
    add_operator_executor,
)
from thunderfn.executors.torch_executor import prim_impls
from thunderfn.testing.registries import RegistrySnapshot
from thunderfn.transforms.rules.define import defbatch, vjp_rule_for


@pytest.fixture(autouse=True)
def _registrations_undone():
    snapshot = RegistrySnapshot()
    yield
    snapshot.restore()


def test_every_rule_of_every_record_is_its_rule_type():
    assert rules and all(isinstance(record, Rules) for record in rules.values())
    for kind, rule_type in (("vjp", VJPRule), ("jvp", JVPRule), ("batch", BatchRule)):
        entered = [getattr(record, kind) for record in rules.values() if getattr(record, kind) is not None]
        assert entered and all(isinstance(rule, rule_type) for rule in entered)


def test_the_tables_refuse_anything_but_their_rule_type():
    with pytest.raises(TypeError, match="must be a VJPRule"):
        set_rule("some.symbol", "vjp", lambda res, g: (g,))
    with pytest.raises(TypeError, match="must be a JVPRule"):
        set_rule("some.symbol", "jvp", lambda res, t: t[0])
    with pytest.raises(TypeError, match="must be a BatchRule"):
        set_rule("some.symbol", "batch", lambda call, dims: (call.args[0], dims[0]))
    with pytest.raises(TypeError, match="action is"):
        Lowering(None, lambda a: a)
    with pytest.raises(TypeError, match="must be a Lowering"):
        OperatorExecutor("ex").add_lowering(ltorch.mul, lambda a, b: a * b)


def test_custom_vjp_enters_the_rule_table_as_a_vjp_rule_and_leaves_with_its_function():
    f = tf.custom_vjp(torch.sin)
    f.defvjp(lambda x: (torch.sin(x), x), lambda x, g: (g * torch.cos(x),))
    key = f._symbol.id
    assert isinstance(rules_of(key).vjp, VJPRule)
    del f
    gc.collect()
    assert key not in rules


def test_applies_restricts_a_vjp_rule_to_some_calls():
    q = torch.randn(1, 2, 3, 4)
    for dropout_p, has_rule in ((0.0, True), (0.5, False)):  # with dropout, the decomposition is differentiated
        (bsym,) = tf.trace(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=dropout_p), q).bound_symbols
        assert (vjp_rule_for(bsym) is rules_of(ltorch.scaled_dot_product_attention.id).vjp) == has_rule
        assert has_rule or vjp_rule_for(bsym) is None


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


def test_defbatch_and_an_operators_batch_rule_enter_the_rule_table_by_symbol_id():
    @defbatch("some.symbol", "other.symbol")
    def rule(call, dims):
        return call.args[0], dims[0]

    assert rules_of("some.symbol").batch == rules_of("other.symbol").batch == BatchRule(rule)
    ex = OperatorExecutor("batched_ex")
    calls = []

    def batch_double(call, dims):
        calls.append(dims)
        return op(call.args[0]), dims[0]

    op = _doubling_operator(ex, batch_rule=batch_double)
    assert rules_of(op.id).batch == BatchRule(batch_double)
    x = torch.randn(4, 3)
    torch.testing.assert_close(tf.vmap(lambda a: op(a), in_axes=1)(x.T), x * 2)
    assert calls == [(1,)]


def test_a_new_executor_of_the_same_name_does_not_inherit_an_operators_batch_rule():
    first = _doubling_operator(OperatorExecutor("renewed_ex"), batch_rule=lambda call, dims: (call.args[0], dims[0]))
    assert rules_of(first.id).batch is not None
    again = _doubling_operator(OperatorExecutor("renewed_ex"))
    assert again.id == first.id and rules_of(again.id).batch is None
    with pytest.raises(tf.errors.BatchingError, match="no batching rule"):
        tf.vmap(lambda a: again(a))(torch.ones(2, 3))


def test_an_operators_batch_rule_in_the_older_four_argument_form_still_batches():
    """register_operator(batch_rule=) takes batch(args, dims, kwargs, out) too, as before rules took a call."""
    ex = OperatorExecutor("older_form_ex")
    op = _doubling_operator(ex, batch_rule=lambda args, dims, kwargs, out: (op(args[0]), dims[0]))
    x = torch.randn(4, 3)
    torch.testing.assert_close(tf.vmap(lambda a: op(a), in_axes=1)(x.T), x * 2)


def test_a_rule_record_is_replaced_whole_so_a_snapshot_restores_it():
    before = rules_of(ltorch.mul.id)
    snapshot = RegistrySnapshot()
    set_rule(ltorch.mul.id, "batch", BatchRule(lambda call, dims: NotImplemented))
    assert rules_of(ltorch.mul.id) is not before and before.batch is None
    snapshot.restore()
    assert rules_of(ltorch.mul.id) is before
