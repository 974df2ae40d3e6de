"""Training loops the tests compare eager and jitted models with (tests/test_training.py,
tests/test_remat.py), and what a step keeps for its backward (tests/test_checkpoint.py,
benchmarks/bench_control_flow.py)."""
from __future__ import annotations

import torch


def gpt_batches(config, steps: int, seed: int = 1) -> list[tuple]:
    """`steps` random (idx, targets) batches for a GPT of `config` (thunderfn.examples.gpt)."""
    g = torch.Generator().manual_seed(seed)
    shape = (config.batch_size, config.block_size)
    return [(torch.randint(0, config.vocab_size, shape, generator=g),
             torch.randint(0, config.vocab_size, shape, generator=g))
            for _ in range(steps)]


def adamw_losses(model, batches, lr: float = 1e-2) -> list[float]:
    """Train `model` (a GPT: model(idx, targets) -> (logits, loss)) one AdamW step per
    (idx, targets) batch; the loss of each step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for idx, targets in batches:
        optimizer.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def saved_bytes(loss_fn, *args, excluded=frozenset()) -> int:
    """Bytes of the distinct tensors torch.autograd keeps for the backward of `loss_fn(*args)` (a scalar,
    whose backward this runs), as torch.autograd.graph.saved_tensors_hooks sees them packed, leaving out
    those whose memory is at an address in `excluded` (parameters and inputs: alive anyway)."""
    kept = {}

    def pack(t):
        if t.data_ptr() not in excluded:
            kept[(t.data_ptr(), tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(*args)
    loss.backward()
    return sum(kept.values())
