"""A small GPT-style model: the demo's and the benchmarks' workload.

Standard nanoGPT-shaped code, written the way a PyTorch user writes it, so that
jitting it exercises what real models call: token and position embeddings,
causal self-attention through ``F.scaled_dot_product_attention(is_causal=True)``,
pre-norm ``layer_norm``, a GELU MLP, a linear head and ``F.cross_entropy``.

    from thunderfn.examples.gpt import GPTConfig, make_example
    model, idx, targets = make_example(GPTConfig())
    logits, loss = model(idx, targets)

Sizes are small (vocab 64, 64 channels, 4 heads, 32 tokens, batch 4 by default)
so that one forward takes about a millisecond on a laptop CPU and per-call
overhead stays visible next to the compute.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 32  # longest sequence the position embedding covers
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 1
    batch_size: int = 4  # of the example inputs, not of the model


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd ({config.n_embd}) must be divisible by n_head ({config.n_head})")
        self.n_head = config.n_head
        # query, key and value in one matmul, without a bias: a key bias adds the same amount to every
        # score of a row, which softmax ignores, so its true gradient is 0 and it never learns
        # (and under AdamW its rounding-noise gradient would move it by lr per step)
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, heads, T, head size)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token ids (B, T) and optional targets (B, T) -> (logits (B, T, vocab), loss or None)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def make_example(config: GPTConfig = GPTConfig(), seed: int = 0):
    """(model in eval mode, idx, targets), the same for the same `seed`.

    The weights are initialized from the global RNG inside `fork_rng`, so callers'
    own random streams are unaffected; the inputs come from their own generator.
    """
    with torch.random.fork_rng(devices=[]):  # the example lives on the CPU: no accelerator RNG to save
        torch.manual_seed(seed)
        model = GPT(config).eval()
        generator = torch.Generator().manual_seed(seed)
        shape = (config.batch_size, config.block_size)
        idx = torch.randint(0, config.vocab_size, shape, generator=generator)
        targets = torch.randint(0, config.vocab_size, shape, generator=generator)
    return model, idx, targets
