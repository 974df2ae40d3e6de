"""Data-dependent sizes: nonzero, argwhere, torch.where(mask), masked_select, boolean-mask indexing and
unique give their output a size known only at run time (u0, core/symbolic.py), which later ops compute
with. Under tf.jit each matches eager over calls whose masks select different numbers of elements, from
one cache entry; grad matches torch.autograd; a branch on such a size is a ConcretizationError naming
it; vmap batches them where torch.func can and refuses in its words where it cannot; a mixture of
experts (litgpt's) trains as in eager."""
from __future__ import annotations

import copy

import optree
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import thunderfn as tf
from thunderfn.testing import strategies as tst
from thunderfn.testing.optional_libraries import why_unavailable

# Each takes x of shape (6, 4); which elements it selects depends on x's values.
W = torch.randn(4, 3)
OPS = {
    "nonzero": lambda x: torch.nonzero(x > 0),
    "nonzero-as-tuple": lambda x: torch.nonzero(x > 0, as_tuple=True),
    "Tensor.nonzero": lambda x: (x > 0).nonzero(),
    "argwhere": lambda x: torch.argwhere(x[:, 0] > 0),
    "where-condition": lambda x: torch.where(x > 0.5),
    "masked_select": lambda x: torch.masked_select(x, x > 0),
    "masked_select-broadcast": lambda x: torch.masked_select(x, x[0] > 0),
    "mask-index": lambda x: x[x > 0] * 2,
    "mask-rows": lambda x: x[x[:, 0] > 0] @ W,
    "mask-columns": lambda x: x[:, x[0] > 0].sum(0),
    "mask-write": lambda x: x.masked_fill(x > 1, 0).index_put((x < -1,), (x[x < -1] * 3)),
    "mask-setitem": lambda x: _setitem(x),
    "computing-with-the-size": lambda x: torch.arange(x[x > 0].shape[0]) * 2 + torch.zeros(x[x > 0].shape[0], 2).sum(1),
    "reshape": lambda x: x[x[:, 1] > 0].reshape(-1, 2).sum(0),
    "unique": lambda x: torch.unique((x * 2).round()),
    "unique-with-counts": lambda x: torch.unique((x * 2).round(), return_inverse=True, return_counts=True),
    "bincount": lambda x: torch.bincount((x.abs() * 2).long().flatten()),
}


def _setitem(x):
    y = x.clone()
    mask = x > 0
    y[mask] = x[mask].exp()  # as many values as the mask selects
    y[x < -1] = 0.0  # one value: a where
    return y


def _assert_equal(actual, expected):
    if isinstance(expected, tuple):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _assert_equal(a, e)
        return
    torch.testing.assert_close(actual, expected)


def _masks_of_different_sizes():
    """Inputs whose masks select different numbers of elements (none at all, for the last)."""
    torch.manual_seed(0)
    xs = [torch.randn(6, 4) for _ in range(3)]
    return xs + [-xs[0].abs() - 2]


@pytest.mark.parametrize("name", OPS)
def test_each_op_matches_eager_for_every_selection_from_one_cache_entry(name):
    fn = OPS[name]
    jitted = tf.jit(fn)
    for x in _masks_of_different_sizes():
        _assert_equal(jitted(x), fn(x))
    assert tf.cache_info(jitted)["entries"] == 1, tf.cache_info(jitted)


def test_the_size_is_bound_from_the_ops_output_and_no_guard_reads_it():
    jitted = tf.jit(lambda x: torch.zeros(x[x > 0].shape[0], 3))
    for x in _masks_of_different_sizes():
        assert jitted(x).shape == ((x > 0).sum(), 3)
    source = str(tf.last_traces(jitted)[-1])
    assert "u0 = " in source and ".shape[0]" in source
    info = tf.cache_info(jitted)
    assert (info["entries"], info["symbolic"], info["size_guards"]) == (1, [], []), info


def test_with_symbolic_input_sizes_too_one_entry_serves_every_size_and_selection():
    fn = lambda x: (x[x[:, 0] > 0] * 2).sum(0)  # noqa: E731
    jitted = tf.jit(fn, dynamic=True)
    for n in (3, 5, 8):
        x = torch.randn(n, 4)
        torch.testing.assert_close(jitted(x), fn(x))
    assert tf.cache_info(jitted)["entries"] == 1


GRAD_OPS = {
    "mask-index": lambda x: (x[x > 0] ** 2).sum(),
    "mask-rows": lambda x: (x[x[:, 0] > 0] @ W).tanh().sum(),
    "masked_select": lambda x: torch.masked_select(x, x > 0).sin().sum(),
    "where-condition-index": lambda x: x[torch.where(x > 0)].exp().sum(),
    "nonzero-index": lambda x: x[torch.nonzero(x[:, 0] > 0)[:, 0]].sum(),
    "mask-setitem": lambda x: _setitem(x).sum(),
    "unused-output-size": lambda x: torch.unique(x.detach().round()).shape[0] * x.sum(),
}


@pytest.mark.parametrize("name", GRAD_OPS)
def test_grad_matches_torch_autograd(name):
    fn = GRAD_OPS[name]
    jitted, grad = tf.jit(fn), tf.grad(fn)
    for x in _masks_of_different_sizes():
        x = x.requires_grad_()
        expected = torch.autograd.grad(fn(x), x)[0]
        torch.testing.assert_close(torch.autograd.grad(jitted(x), x)[0], expected)
        torch.testing.assert_close(grad(x.detach()), expected)


def test_the_backward_keeps_a_value_holding_a_size_it_computes_with():
    """The gradient of unique(...).sum() needs unique's length in the backward, which saves nothing else of it;
    torch has no derivative for unique: the same error as eager's, when the backward runs."""
    fn = lambda x: torch.unique(x).sum()  # noqa: E731
    x = torch.randn(5, requires_grad=True)
    with pytest.raises(NotImplementedError, match="the derivative for '_unique2' is not implemented"):
        torch.autograd.grad(fn(x), x)
    with pytest.raises(NotImplementedError, match="the derivative for '_unique2' is not implemented"):
        torch.autograd.grad(tf.jit(fn)(x), x)


def test_eager_vjp_refuses_a_pullback_over_a_data_dependent_size_by_name():
    with pytest.raises(tf.UnsupportedOpError, match="size known only at run time"):
        tf.vjp(lambda x: x[x > 0], torch.randn(5))


def _branches(x):
    picked = x[x > 0]
    if picked.shape[0] > 0:
        return picked.mean()
    return x.sum()


@pytest.mark.parametrize("fn, asks", [
    (_branches, "'_branches' asks whether u0 > 0"),
    (lambda x: torch.ones(int(torch.nonzero(x).shape[0])), "asks the value of u0"),
    (lambda x: torch.ones(len(x[x > 0])), "asks the value of u0"),  # len() must return an int
    (lambda x: x[x > 0].view(-1, 2), "ltorch.view asks whether (u0 % 2) == 0"),
    (lambda x: x[x > 0] + x[x < 0], "asks whether u0 == u1"),  # two selections: their lengths may differ
], ids=["if", "int", "len", "view", "broadcast"])
def test_a_question_of_a_data_dependent_size_is_a_concretization_error_naming_it(fn, asks):
    with pytest.raises(tf.ConcretizationError) as info:
        tf.jit(fn)(torch.randn(6))
    message = str(info.value)
    assert asks in message and "the number of nonzero elements of" in message and "torch._check" in message, message


def test_torch_check_states_a_fact_the_compiled_function_checks_on_every_call():
    def fn(x):
        picked = x[x > 0]
        torch._check(picked.shape[0] > 0)
        return picked.sum() / picked.shape[0] if picked.shape[0] > 0 else x.sum()

    jitted = tf.jit(fn)
    x = torch.tensor([1.0, -2.0, 3.0])
    torch.testing.assert_close(jitted(x), fn(x))
    with pytest.raises(RuntimeError, match="Expected 0 < u0 to be True"):
        jitted(torch.tensor([-1.0, -2.0]))
    with pytest.raises(RuntimeError):  # eager raises too
        fn(torch.tensor([-1.0, -2.0]))


def test_a_torch_check_about_a_size_nothing_else_uses_is_still_checked():
    """The op whose size a torch._check reads is kept by dead-code elimination (it was dropped with its check, so
    the compiled function returned where eager raised)."""
    def fn(x):
        torch._check(x[x > 0].shape[0] > 0)
        return x * 2

    jitted = tf.jit(fn)
    torch.testing.assert_close(jitted(torch.ones(3)), fn(torch.ones(3)))
    with pytest.raises(RuntimeError):  # eager raises
        fn(-torch.ones(3))
    with pytest.raises(RuntimeError, match="Expected 0 < u0 to be True"):
        jitted(-torch.ones(3))


def _router(x, gate, experts):
    """A mixture of experts' routing: top-k experts per token, each expert takes the tokens routed to it
    (torch.where(mask)) and adds its weighted output back into theirs (index_add)."""
    probs, indices = torch.topk(x @ gate, 2)
    probs = probs.softmax(-1)
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = torch.where(indices == e)
        y = y.index_add(0, token, probs[token, slot, None] * torch.tanh(x[token] @ expert))
    return y


def test_the_mixture_of_experts_router_matches_eager_with_its_gradients_from_one_entry():
    torch.manual_seed(0)
    gate = torch.randn(4, 3, requires_grad=True)
    experts = [torch.randn(4, 4, requires_grad=True) for _ in range(3)]
    jitted = tf.jit(_router)
    for _ in range(3):
        x = torch.randn(8, 4, requires_grad=True)
        out, expected = jitted(x, gate, experts), _router(x, gate, experts)
        torch.testing.assert_close(out, expected)
        grads = torch.autograd.grad(out.square().sum(), [x, gate, *experts])
        expected_grads = torch.autograd.grad(expected.square().sum(), [x, gate, *experts])
        for g, e in zip(grads, expected_grads):
            torch.testing.assert_close(g, e)
    assert tf.cache_info(jitted)["entries"] == 1


def test_fusion_leaves_ops_with_data_dependent_sizes_to_torch_and_matches_eager():
    """(Inductor compiles the region before the mask: seconds, the first time in a process.)"""
    fn = lambda x: (torch.tanh(x) * 2)[x[:, 0] > 0].exp().mul(3).sum()  # noqa: E731
    jitted = tf.jit(fn, fusion=True)
    for x in _masks_of_different_sizes():
        torch.testing.assert_close(jitted(x), fn(x))
    lines = str(tf.last_traces(jitted)[-1]).splitlines()
    calls = [line.split("=")[1].split("(")[0].strip() for line in lines if " = " in line and "u0 =" not in line]
    assert any("fusion" in c for c in calls), calls  # the tanh * 2 before the mask is fused
    fused_after = [line for line in lines if "fusion" in line and "u0" in line]
    assert not fused_after, fused_after  # nothing with the size u0 is


BATCHED_MASKS = {  # each a function of x whose mask (x > 0) is batched with x
    "nonzero": torch.nonzero,
    "argwhere": torch.argwhere,
    "mask-index": lambda x: x[x > 0] * 2,
    "masked_select": lambda x: torch.masked_select(x, x > 0),
    "where-condition": lambda x: torch.where(x > 0),
    "mask-write": lambda x: x.clone().index_put_((x > 0,), x.new_zeros(())),
}


# ops whose output size is counted from values, which torch.func.vmap has no batched form of: under tf.vmap they run
# once per example (vmap.py's _stacked_examples), the examples' outputs stacked where their shapes agree
SIZES_FROM_VALUES = {
    **BATCHED_MASKS,
    "unique": lambda x: torch.unique(x, return_counts=True),
    "unique-dim": lambda x: torch.unique(torch.stack([x, x.flip(0)]), dim=1) * 2,
}


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(sorted(SIZES_FROM_VALUES)), tst.tensors(shape=(6,), dtypes=(torch.float64,)),
       st.lists(st.permutations(range(6)), min_size=1, max_size=3))
def test_vmap_of_a_batched_mask_with_one_count_per_example_is_each_examples_result(name, row, orders):
    """vmap(f)(xs)[i] == f(xs[i]) where every example's mask has as many True elements, and as many distinct values
    (its rows are permutations of one row): the batched nonzero positions, stacked (torch.func.vmap refuses any
    batched mask, and unique)."""
    fn = SIZES_FROM_VALUES[name]
    xs = torch.stack([row[list(order)] for order in orders])
    out = tf.vmap(fn)(xs)
    for i in range(len(orders)):
        torch.testing.assert_close(optree.tree_map(lambda t: t[i], out), fn(xs[i]))


def test_vmap_of_an_op_whose_examples_give_different_sizes_is_refused_naming_the_shapes():
    with pytest.raises(tf.errors.BatchingError, match=r"unique gives outputs of shapes \[\(2,\), \(3,\)\]"):
        tf.vmap(torch.unique)(torch.tensor([[1.0, 1.0, 2.0], [1.0, 2.0, 3.0]]))


def test_vmap_of_vmap_of_a_batched_mask_counts_every_inner_example():
    x = torch.ones(2, 3, 4)
    x[..., 0] = 0
    fn = lambda x: x[x > 0] * 2  # noqa: E731
    torch.testing.assert_close(tf.vmap(tf.vmap(fn))(x), torch.stack([torch.stack([fn(r) for r in m]) for m in x]))
    x[1, 2, 1] = 0
    with pytest.raises(tf.errors.BatchingError, match=r"found \[3, 3, 3, 3, 3, 2\] nonzero elements"):
        tf.vmap(tf.vmap(fn))(x)


@pytest.mark.parametrize("name", [n for n in BATCHED_MASKS if n != "mask-write"])
def test_vmap_of_a_batched_mask_with_counts_that_differ_is_refused_naming_them(name):
    """A batch whose examples have different numbers of True elements would be ragged: refused when it runs.
    (A write through a mask is a where, of x's shape whatever the count.)"""
    xs = torch.tensor([[1.0, 0.0, 2.0], [1.0, 2.0, 3.0]])
    with pytest.raises(tf.errors.BatchingError, match=r"found \[2, 3\] nonzero elements in the examples"):
        tf.vmap(BATCHED_MASKS[name])(xs)
    write = BATCHED_MASKS["mask-write"]
    torch.testing.assert_close(tf.vmap(write)(xs), torch.stack([write(x) for x in xs]))


@pytest.mark.parametrize("fn", [
    lambda x, m: x[m],
    lambda x, m: torch.masked_select(x, m),
    lambda x, m: x[torch.nonzero(m)[:, 0]] * 2,
], ids=["mask-index", "masked_select", "nonzero-index"])
def test_vmap_with_the_mask_the_same_for_every_example_matches_torch_func(fn):
    x, m = torch.randn(3, 5), torch.tensor([True, False, True, True, False])
    expected = torch.func.vmap(fn, in_dims=(0, None))(x, m)
    torch.testing.assert_close(tf.vmap(fn, in_axes=(0, None))(x, m), expected)
    torch.testing.assert_close(tf.jit(tf.vmap(fn, in_axes=(0, None)))(x, m), expected)


_NO_LITGPT = why_unavailable("litgpt")


@pytest.mark.skipif(_NO_LITGPT is not None, reason=f"litgpt is not installed ({_NO_LITGPT})")
def test_litgpts_mixture_of_experts_llama_trains_under_jit_exactly_as_in_eager():
    """Each expert of litgpt's LLaMAMoE takes the tokens torch.where(mask) routes to it and adds into
    y[token_idx] += ...: three SGD steps under tf.jit give eager's losses and parameters."""
    from litgpt import GPT, Config  # (an optional library)

    torch.manual_seed(0)
    config = Config(n_layer=2, n_embd=32, n_head=4, n_query_groups=2, block_size=32, vocab_size=64,
                    padded_vocab_size=64, mlp_class_name="LLaMAMoE", n_expert=4, n_expert_per_token=2,
                    intermediate_size=64, moe_intermediate_size=32, bias=False, norm_class_name="RMSNorm")
    eager = GPT(config)
    traced = copy.deepcopy(eager)
    jitted = tf.jit(traced)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, traced)]
    for _ in range(3):
        ids = torch.randint(0, 64, (2, 17))
        losses = []
        for model, optimizer in zip((eager, jitted), optimizers):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-6)
    for (name, p), q in zip(eager.named_parameters(), traced.parameters()):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert tf.cache_info(jitted)["entries"] == 1
