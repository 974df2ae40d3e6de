"""tf.checkpoint, its policies and tf.checkpoint_name, and torch.utils.checkpoint inside traced code:
gradients against eager's (torch.autograd, without checkpointing), what the forward keeps for the
backward (the backward trace's inputs, and bytes packed under torch.autograd.graph.saved_tensors_hooks
against eager torch.utils.checkpoint's), and every transform through a checkpoint."""
import copy
import functools
import re

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint

import thunderfn as tf
from thunderfn.errors import ArgumentTypeError
from thunderfn.testing.training import saved_bytes

P = tf.checkpoint_policies

POLICIES = {
    "nothing_saveable": P.nothing_saveable,
    "everything_saveable": P.everything_saveable,
    "dots_saveable": P.dots_saveable,
    "dots_with_no_batch_dims_saveable": P.dots_with_no_batch_dims_saveable,
    "save_only_these_names": P.save_only_these_names("hidden"),
    "save_any_names_but_these": P.save_any_names_but_these("other"),
    "save_from_both_policies": P.save_from_both_policies(P.dots_saveable, P.save_only_these_names("hidden")),
}


def layer(x, w):
    h = tf.checkpoint_name(torch.sin(x @ w), "hidden")
    return torch.tanh(torch.cos(h) @ w)


def eager_grads(x, w):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    layer(x, w).square().sum().backward()
    return x.grad, w.grad


@pytest.fixture
def xw():
    torch.manual_seed(0)
    return torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
def test_gradients_are_eagers_under_every_policy(policy, xw):
    x, w = xw
    expected = eager_grads(x, w)

    def loss(x, w):
        return tf.checkpoint(layer, policy=policy)(x, w).square().sum()

    torch.testing.assert_close(tf.grad(loss, argnums=(0, 1))(x, w), expected)
    torch.testing.assert_close(tf.jit(tf.grad(loss, argnums=(0, 1)))(x, w), expected)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    tf.jit(loss)(xg, wg).backward()  # torch.autograd through the forward/backward split
    torch.testing.assert_close((xg.grad, wg.grad), expected)


def _backward_inputs(policy, x, w) -> list:
    """The shapes of what the jitted function's forward keeps for its backward (cotangents left out)."""
    f = tf.jit(lambda x, w: tf.checkpoint(layer, policy=policy)(x, w).sum())  # (sum's backward reads nothing)
    f(x.clone().requires_grad_(), w.clone().requires_grad_()).backward()
    return [p for p in tf.last_backward_traces(f)[0].args if not p.name.startswith("g")]


def test_nothing_saveable_keeps_only_the_inputs(xw):
    x, w = xw
    kept = _backward_inputs(P.nothing_saveable, x, w)
    assert sorted(p.name for p in kept) == ["w", "x"]


def test_a_named_value_is_kept_where_the_policy_saves_it(xw):
    x, w = xw
    names_kept = _backward_inputs(P.save_only_these_names("hidden"), x, w)
    assert len(names_kept) == 3  # x, w, and the value named "hidden"
    assert len(_backward_inputs(P.save_only_these_names("other"), x, w)) == 2


def test_the_backward_computes_the_forward_again(xw):
    x, w = xw
    f = tf.jit(lambda x, w: tf.checkpoint(layer)(x, w).square().sum())
    f(x.clone().requires_grad_(), w.clone().requires_grad_()).backward()
    backward = str(tf.last_backward_traces(f)[-1])
    assert "torch.sin" in backward and "torch.cos" in backward


def test_the_trace_prints_the_checkpointed_function_nested(xw):
    x, w = xw
    trc = tf.trace(lambda x, w: tf.checkpoint(layer)(x, w), x, w)
    text = str(trc)
    assert "prims.checkpoint(" in text and "def checkpoint_" in text and "checkpoint_name" in text


def test_higher_derivatives_jvp_and_per_example_gradients(xw):
    x, w = xw

    def checkpointed(x, w):
        return tf.checkpoint(layer)(x, w).square().sum()

    def plain(x, w):
        return layer(x, w).square().sum()

    def second(f):
        return tf.grad(lambda w: tf.grad(f, argnums=1)(x, w).sum())(w)

    torch.testing.assert_close(second(checkpointed), second(plain))
    t = torch.randn_like(w)
    torch.testing.assert_close(tf.jvp(lambda w: checkpointed(x, w), (w,), (t,)),
                               tf.jvp(lambda w: plain(x, w), (w,), (t,)))
    xs = torch.randn(5, 4, 3, dtype=torch.float64)
    per_example = tf.vmap(tf.grad(checkpointed, argnums=1), in_axes=(0, None))(xs, w)
    torch.testing.assert_close(per_example, torch.stack([tf.grad(plain, argnums=1)(xi, w) for xi in xs]))


def test_random_draws_are_saved_not_drawn_again():
    torch.manual_seed(0)
    x, w = torch.randn(8, 6), torch.randn(6, 6)

    def dropped(x, w):
        return torch.nn.functional.dropout(torch.tanh(x @ w), 0.5) @ w

    f = tf.jit(lambda x, w: tf.checkpoint(dropped)(x, w))
    results = []
    for fn in (f, dropped):
        wg = w.clone().requires_grad_()
        torch.manual_seed(1)
        out = fn(x, wg)
        out.sum().backward()
        results.append((out, wg.grad, torch.rand(1)))  # the generator afterwards too
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize("reentrant", [False, True])
def test_torch_utils_checkpoint_is_a_region_saving_nothing(reentrant, xw):
    x, w = xw
    f = tf.jit(lambda x, w: torch_checkpoint.checkpoint(layer, x, w, use_reentrant=reentrant).sum())
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    f(xg, wg).backward()
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    layer(xe, we).sum().backward()
    torch.testing.assert_close((xg.grad, wg.grad), (xe.grad, we.grad))
    assert [b.sym.name for b in tf.last_traces(f)[0].bound_symbols][0] == "checkpoint"
    assert sorted(p.name for p in tf.last_backward_traces(f)[0].args if not p.name.startswith("g")) == ["w", "x"]


def test_torch_utils_checkpoint_held_from_before_is_honoured_too(xw):
    # Hugging Face models keep functools.partial(checkpoint, **kwargs), made from torch's function itself
    x, w = xw
    held = functools.partial(torch_checkpoint.checkpoint, use_reentrant=False)
    f = tf.jit(lambda x, w: held(layer, x, w).square().sum())
    f(x.clone().requires_grad_(), w.clone().requires_grad_()).backward()
    assert [b.sym.name for b in tf.last_traces(f)[0].bound_symbols][0] == "checkpoint"


def test_an_mlp_saves_what_eager_checkpointing_saves():
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(64, 64) for _ in range(8)])
    x = torch.randn(32, 64)
    excluded = {p.data_ptr() for p in layers.parameters()} | {x.data_ptr()}

    def block(lin, h):
        return torch.nn.functional.gelu(lin(h))

    def torch_checkpointed(h):
        for lin in layers:
            h = torch_checkpoint.checkpoint(block, lin, h, use_reentrant=False)
        return h.square().mean()

    def tf_checkpointed(h):
        for lin in layers:
            h = tf.checkpoint(block)(lin, h)
        return h.square().mean()

    def grads_of(fn):
        layers.zero_grad()
        fn(x).backward()
        return [p.grad.clone() for p in layers.parameters()]

    eager = saved_bytes(torch_checkpointed, x, excluded=excluded)
    expected = grads_of(torch_checkpointed)
    for fn in (tf.jit(torch_checkpointed), tf.jit(tf_checkpointed)):
        assert saved_bytes(fn, x, excluded=excluded) <= 1.5 * eager
        torch.testing.assert_close(grads_of(fn), expected)


def test_a_checkpointed_scan_body():
    torch.manual_seed(0)
    w = torch.randn(4, 4, dtype=torch.float64)
    xs = torch.randn(6, 4, dtype=torch.float64)

    def cell(h, x):
        h = torch.tanh(h @ w + x)
        return h, h.sum()

    def loss(w_, checkpointed):
        step = tf.checkpoint(lambda h, x: (torch.tanh(h @ w_ + x),) * 2) if checkpointed else (
            lambda h, x: (torch.tanh(h @ w_ + x),) * 2)
        _, ys = tf.scan(step, torch.zeros(4, dtype=torch.float64), xs)
        return ys.sum()

    torch.testing.assert_close(tf.jit(tf.grad(lambda w: loss(w, True)))(w), tf.grad(lambda w: loss(w, False))(w))


def test_eagerly_it_runs_under_torch_utils_checkpoint(xw):
    x, w = xw
    wg = w.clone().requires_grad_()
    out = tf.checkpoint(layer)(x, wg)
    out.square().sum().backward()
    torch.testing.assert_close(out, layer(x, w))
    torch.testing.assert_close(wg.grad, eager_grads(x, w)[1])


def test_bad_arguments_are_named_errors():
    with pytest.raises(ArgumentTypeError, match="policy must be a callable"):
        tf.checkpoint(layer, policy="nothing")
    with pytest.raises(ArgumentTypeError, match="the name must be a str"):
        tf.checkpoint_name(torch.ones(2), 3)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):  # torch's own words
        tf.jit(lambda x: torch_checkpoint.checkpoint(lambda x, scale: x * scale, x, scale=2, use_reentrant=True))(
            torch.ones(2))


def test_hugging_face_gradient_checkpointing_under_jit_saves_what_eagers_saves():
    transformers = pytest.importorskip("transformers",
                                       reason="transformers is not installed: this test trains a Hugging Face GPT-2")
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=64, n_positions=32, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 64, (2, 16))
    excluded = {p.data_ptr() for p in model.parameters()}

    def grads_and_bytes(fn):
        model.zero_grad()
        nbytes = saved_bytes(fn, ids, excluded=excluded)
        return nbytes, [p.grad.clone() for p in model.parameters()]

    def loss(ids):
        return model(ids, labels=ids).loss

    eager_bytes, eager_grads = grads_and_bytes(loss)
    jitted = tf.jit(loss)
    jit_bytes, jit_grads = grads_and_bytes(jitted)
    torch.testing.assert_close(jit_grads, eager_grads)
    assert jit_bytes <= 1.5 * eager_bytes
    assert [b.sym.name for b in tf.last_traces(jitted)[0].bound_symbols].count("checkpoint") == 3


def test_a_checkpointed_block_with_batch_norm_updates_its_statistics_once():
    # eager torch.utils.checkpoint runs BatchNorm's update again in its recomputation (num_batches_tracked
    # counts 2 per step); without checkpointing, and under torch.compile, it counts 1, as here
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    plain = copy.deepcopy(block)
    x = torch.randn(8, 4)
    jitted = tf.jit(lambda x: torch_checkpoint.checkpoint(block, x, use_reentrant=False).square().sum())
    for _ in range(2):
        jitted(x).backward()
        plain(x).square().sum().backward()
    torch.testing.assert_close(block[1].running_mean, plain[1].running_mean)
    assert int(block[1].num_batches_tracked) == int(plain[1].num_batches_tracked) == 2
    torch.testing.assert_close([p.grad for p in block.parameters()], [p.grad for p in plain.parameters()])


def test_the_visualized_forward_keeps_fewer_bytes_when_checkpointed(tmp_path):
    torch.manual_seed(0)
    x, w = torch.randn(16, 8), torch.randn(8, 8)

    def model(x, w, wrap):
        for _ in range(4):
            x = wrap(lambda x, w: torch.tanh(torch.sin(x @ w) @ w))(x, w)
        return x.sum()

    kept = {}
    for name, wrap in (("plain", lambda f: f), ("checkpointed", tf.checkpoint)):
        f = tf.jit(lambda x, w: model(x, w, wrap))
        f(x, w.clone().requires_grad_()).backward()
        page = open(tf.visualize(f, tmp_path / f"{name}.html")).read()
        kept[name] = float(re.search(r"\d+ tensors, ([\d.]+) KiB", page).group(1))
    assert kept["checkpointed"] < kept["plain"]
