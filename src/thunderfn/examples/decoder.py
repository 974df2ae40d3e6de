"""A small decoder written the everyday way, whose sequence length varies between calls: the dynamic-shape
checks' workload (tests/test_dynamic_shapes.py, benchmarks/bench_dynamic.py).

It reads the length T from its input's shape and uses it as users do: learned positions sliced `pos[:T]`, a
causal mask `torch.triu(torch.ones(T, T), 1)`, `nn.MultiheadAttention` with that mask, and cross-entropy over
the `B * T` rows. A jitted copy should compile a few entries for any number of lengths, as torch.compile does.

    from thunderfn.examples.decoder import Decoder, DECODER_LENGTHS
    model = Decoder()
    loss = model(idx, targets)        # idx, targets: (B, T) token ids
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# twelve lengths in an order that makes an automatic-dynamic compiler open the length on the second call and
# meet 1 (broadcasting's special size) early
DECODER_LENGTHS = (5, 1, 9, 17, 2, 33, 3, 64, 4, 6, 7, 8)


class Decoder(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 16, heads: int = 2, max_len: int = 128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(max_len, d) * 0.02)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        h = self.emb(idx) + self.pos[:T]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=idx.device), 1)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        logits = self.head(h + a)
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
