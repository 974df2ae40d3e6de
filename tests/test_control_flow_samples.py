"""Every transform on every control-flow primitive's samples (thunderfn/testing/control_flow_samples.py),
against torch's eager reference of the plain Python each stands for: jit, reverse mode (torch.autograd),
forward mode (torch.func.jvp), vmap (the examples one by one)."""
import pytest
import torch

import thunderfn as tf
from thunderfn.core.bodies import Body
from thunderfn.core.rules import rules
from thunderfn.testing.control_flow_samples import SAMPLES

BATCH = 3


def test_every_control_flow_primitive_with_a_rule_has_a_sample():
    with_rules = {k for k in rules if isinstance(k, str) and k.startswith("control_flow.")}
    assert with_rules and with_rules <= {s.primitive for s in SAMPLES}


def _sum_of_leaves(out):
    return sum(o.sum() for o in torch.utils._pytree.tree_leaves(out))


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name)
def test_jit_and_the_trace_hold_the_primitive(sample):
    torch.testing.assert_close(tf.jit(sample.fn)(*sample.args), sample.reference(*sample.args))
    assert sample.primitive in _symbols(tf.trace(sample.fn, *sample.args).bound_symbols)


def _symbols(bsyms) -> set:
    """The ids of the symbols called, in decompositions and bodies too."""
    found = set()
    for b in bsyms:
        found |= {b.sym.id} | _symbols(b.subsymbols)
        for body in (a for a in b.args if isinstance(a, Body)):
            found |= _symbols(body.trace.bound_symbols)
    return found


@pytest.mark.parametrize("sample", [s for s in SAMPLES if s.reverse], ids=lambda s: s.name)
def test_reverse_mode_is_torch_autograds(sample):
    argnums = tuple(range(len(sample.args)))
    got = tf.grad(lambda *a: _sum_of_leaves(sample.fn(*a)), argnums=argnums)(*sample.args)
    leaves = [a.clone().requires_grad_() for a in sample.args]
    expected = torch.autograd.grad(_sum_of_leaves(sample.reference(*leaves)), leaves)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(tf.jit(tf.grad(lambda *a: _sum_of_leaves(sample.fn(*a)), argnums=argnums))(
        *sample.args), expected)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name)
def test_forward_mode_is_torch_funcs(sample):
    tangents = tuple(torch.randn_like(a) for a in sample.args)
    got = tf.jvp(sample.fn, sample.args, tangents)
    expected = torch.func.jvp(sample.reference, sample.args, tangents)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name)
def test_vmap_is_each_example_in_turn(sample):
    batched = tuple(torch.stack([a * (1 + 0.25 * i) for i in range(BATCH)]) for a in sample.args)
    got = tf.vmap(sample.fn)(*batched)
    for i in range(BATCH):
        expected = sample.reference(*(b[i] for b in batched))
        torch.testing.assert_close(torch.utils._pytree.tree_map(lambda t: t[i], got), expected)
