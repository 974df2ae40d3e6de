"""Which tensors get a gradient, against eager, over the OpInfo database.

In eager, an op's output requires grad when autograd recorded it, and after
`backward()` each input that requires grad has a `.grad` that is None (no path from
the loss, or a backward formula that gives none) or a tensor (possibly all zeros:
`ceil`'s derivative is zero, not absent). Training code depends on the difference:
AdamW decays only parameters whose `.grad` is not None. `grad_presence_mismatches`
runs each sample eagerly and through `tf.jit`, with every floating tensor argument
requiring grad, and lists where the two differ: an output's `requires_grad`, an
input's `.grad` being None, or the gradients' values.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import thunderfn as tf
from thunderfn.core.pytree import tree_leaves
from thunderfn.testing.opinfo import SampleInput


def _is_float(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _run(call, sample: SampleInput):
    """(requires_grad of each tensor output, .grad of each floating argument after backward of
    the sum of the outputs that require grad) for one run of call on fresh leaves."""
    flat, spec = tree_flatten((sample.args, sample.kwargs))
    leaves = [x.detach().clone().requires_grad_() if _is_float(x) else
              x.clone() if isinstance(x, torch.Tensor) else x for x in flat]
    args, kwargs = tree_unflatten(leaves, spec)
    torch.manual_seed(0)
    outputs = [o for o in tree_leaves(call(*args, **kwargs)) if isinstance(o, torch.Tensor)]
    requires = [o.requires_grad for o in outputs]
    total = sum((o.sum() for o in outputs if o.requires_grad and o.is_floating_point()), torch.zeros(()))
    if total.requires_grad:
        total.backward()
    return requires, [x.grad for x in leaves if _is_float(x)]


def grad_presence_mismatches(op, samples) -> list[str]:
    """What differs between eager and tf.jit for op on each sample (an empty list when nothing)."""
    found = []
    jitted = tf.jit(lambda *a, **k: op.op(*a, **k))
    for sample in samples:
        if not any(_is_float(x) for x in tree_flatten((sample.args, sample.kwargs))[0]):
            continue
        try:
            expected = _run(op.op, sample)
        except Exception:  # eager refuses (an op without a derivative, say): nothing to match
            continue
        try:
            got = _run(jitted, sample)
        except Exception as e:
            found.append(f"{op.name}: jit raised {type(e).__name__}: {str(e).splitlines()[0][:150]}, on {sample}")
            continue
        if got[0] != expected[0]:
            found.append(f"{op.name} {sample}: outputs' requires_grad {got[0]} under jit, {expected[0]} eager")
        for i, (g, e) in enumerate(zip(got[1], expected[1])):
            if (g is None) != (e is None):
                found.append(f"{op.name} {sample}: argument {i}'s .grad is {'None' if g is None else 'a tensor'} "
                             f"under jit, {'None' if e is None else 'a tensor'} eager")
            elif g is not None:
                try:
                    torch.testing.assert_close(g, e, equal_nan=True)
                except AssertionError:
                    found.append(f"{op.name} {sample}: argument {i}'s .grad differs from eager's")
    return found
