"""A small GPT (2 blocks of causal attention + MLP with layer_norm, cross_entropy loss) trained
with AdamW for 10 steps matches eager step by step: through tf.jit(model) and loss.backward(),
and functionally through tf.value_and_grad over a parameter dict."""
import copy

import pytest
import torch

import thunderfn as tf
from thunderfn.examples.gpt import GPT, GPTConfig
from thunderfn.testing.training import adamw_losses, gpt_batches

CONFIG = GPTConfig(vocab_size=32, block_size=16, n_embd=32, n_head=4, n_layer=2, batch_size=4)
STEPS = 10


@pytest.fixture
def model_and_batches():
    torch.manual_seed(0)
    model = GPT(CONFIG).train()
    batches = gpt_batches(CONFIG, STEPS)
    return model, batches


def _assert_same_parameters(a, b):
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_jitted_module_trains_like_eager(model_and_batches):
    model, batches = model_and_batches
    reference = copy.deepcopy(model)
    expected_losses = adamw_losses(reference, batches)
    losses = adamw_losses(tf.jit(model), batches)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected_losses), atol=1e-5, rtol=1e-5)
    _assert_same_parameters(model, reference)


def test_functional_training_with_value_and_grad_matches_eager(model_and_batches):
    """In float64: the attention key bias has a true gradient of exactly 0 (softmax ignores a per-row
    shift), so both sides' gradients there are rounding noise, which AdamW's normalisation turns into
    steps of size lr in float32; in float64 that noise is far below Adam's eps."""
    model, batches = model_and_batches
    model = model.double()
    reference = copy.deepcopy(model)
    adamw_losses(reference, batches)

    def loss_fn(params, idx, targets):
        return tf.functional_call(model, params, (idx, targets))[1]

    step = tf.value_and_grad(loss_fn)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    leaves = list(params.values())
    optimizer = torch.optim.AdamW(leaves, lr=1e-2)
    for idx, targets in batches:
        _, grads = step(params, idx, targets)
        for p, name in zip(leaves, params):
            p.grad = grads[name]
        optimizer.step()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(params[name], p.detach(), atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_value_and_grad_over_parameters_matches_autograd_in_float32(model_and_batches):
    model, batches = model_and_batches
    idx, targets = batches[0]
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss, grads = tf.value_and_grad(lambda p: tf.functional_call(model, p, (idx, targets))[1])(params)
    _, expected_loss = model(idx, targets)
    expected = torch.autograd.grad(expected_loss, list(model.parameters()))
    torch.testing.assert_close(loss, expected_loss.detach())
    for (name, _), e in zip(model.named_parameters(), expected):
        torch.testing.assert_close(grads[name], e, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
