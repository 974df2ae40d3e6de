"""Summing a cotangent back to a broadcast operand's shape is one helper, torch/reductions.py's
sum_to, which every part of reverse mode that needs it uses (the VJP rules, a user
autograd.Function's gradient, the attention mask's gradient in the sdpa executor)."""
from __future__ import annotations

import pytest
import torch

import thunderfn as tf
from thunderfn.executors import sdpa
from thunderfn.torch.reductions import sum_to
from thunderfn.transforms import user_functions
from thunderfn.transforms.rules import common, linalg, nn, reductions


@pytest.mark.parametrize("shape, to", [((2, 3, 4), (3, 4)), ((2, 3, 4), (3, 1)), ((2, 3, 4), ()), ((2, 3), (2, 3)),
                                       ((5, 1, 4), (1, 1))])
def test_sum_to_undoes_broadcasting(shape, to):
    x = torch.randn(shape, dtype=torch.float64)
    base = torch.zeros(to, dtype=torch.float64, requires_grad=True)
    (base.expand(shape) * x).sum().backward()  # torch's own reduction of a broadcast operand's gradient
    torch.testing.assert_close(tf.jit(lambda x: sum_to(x, to))(x), base.grad)


def test_one_helper_everywhere():
    assert common.sum_to is sum_to and user_functions.sum_to is sum_to and sdpa.sum_to is sum_to
    assert linalg.sum_to is sum_to and nn.sum_to is sum_to and reductions.sum_to is sum_to


def test_a_broadcast_zero_dim_operand_gets_its_cotangent_summed():
    x, s = torch.randn(3, 4, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)
    torch.testing.assert_close(tf.grad(lambda x, s: (x * s).sum(), argnums=1)(x, s), x.sum())
