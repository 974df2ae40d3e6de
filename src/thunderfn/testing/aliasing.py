"""Aliasing against eager, over the OpInfo database.

Eager torch decides per call whether an output shares memory with an input: views
always do, copies never do, and some ops (`contiguous`, `reshape`, `flatten`, ...)
decide at run time from the input's layout. A jitted function must make the same
choice, or an in-place update of the result reaches (or fails to reach) the caller's
tensor differently from eager. `alias_mismatches` runs an op eagerly and jitted on
each sample, as given and with every tensor made non-contiguous, and lists every
(output, input) pair whose relation differs.
"""
from __future__ import annotations

import torch

from thunderfn.core.pytree import tree_leaves, tree_map
from thunderfn.testing.opinfo import SampleInput


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    # the StorageImpl, not data_ptr(): two empty tensors both have data_ptr() 0
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def relations(inputs, outputs) -> dict:
    """(output index, input index) -> how the output relates to the input:
    'same object', 'view' (its `_base` is the input's base), 'shares storage' or None."""
    found = {}
    for i, out in enumerate(outputs):
        for j, inp in enumerate(inputs):
            if out is inp:
                rel = "same object"
            elif not _same_storage(out, inp):
                rel = None
            elif out._base is not None and out._base is (inp._base if inp._base is not None else inp):
                rel = "view"
            else:
                rel = "shares storage"
            found[(i, j)] = rel
    return found


def _noncontiguous(t: torch.Tensor) -> torch.Tensor:
    """t's values in a layout with a gap between neighbouring elements of the last dim."""
    if t.ndim == 0 or t.numel() <= 1:
        return t.clone()
    wide = torch.empty((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
    out = wide[..., ::2]
    out.copy_(t)
    return out


def fresh(sample: SampleInput, noncontiguous: bool, requires_grad: bool = False) -> SampleInput:
    """A copy of sample with new tensors (in-place ops mutate them), all laid out
    non-contiguously when asked, otherwise as given where torch can keep the strides; the
    first one requiring grad when asked and floating-point (the op's input: a class weight
    or running statistics requiring grad is a different question)."""
    def copy(x):
        if not isinstance(x, torch.Tensor):
            return x
        return _noncontiguous(x) if noncontiguous else x.clone(memory_format=torch.preserve_format)

    args, kwargs = tree_map(copy, sample.args), tree_map(copy, sample.kwargs)
    first = next(iter(_tensor_leaves((args, kwargs))), None)
    if requires_grad and first is not None and first.is_floating_point():
        first.requires_grad_()
    return SampleInput(args, kwargs, sample.name)


def _tensor_leaves(tree) -> list:
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _run(fn, sample: SampleInput):
    """(tensor inputs, tensor outputs) of fn on sample, or None where fn raises."""
    inputs = _tensor_leaves((sample.args, sample.kwargs))
    try:
        out = fn(*sample.args, **sample.kwargs)
    except Exception:  # noqa: BLE001 (whether it raises is what the caller compares)
        return None
    return inputs, _tensor_leaves(out)


def alias_mismatches(op, dtype, jitted, device="cpu", *, requires_grad=False) -> list[str]:
    """Every (sample, layout, output, input) whose storage relation differs between eager and jitted.
    With requires_grad, jitted outputs come from a torch.autograd.Function, which returns a view
    where the function returned an input itself: only sharing storage or not is compared."""
    problems = []
    for sample in op.sample_inputs(device, dtype):
        for noncontiguous in (False, True):
            eager = _run(op.op, fresh(sample, noncontiguous, requires_grad))
            jit_sample = fresh(sample, noncontiguous, requires_grad)
            got = _run(jitted, jit_sample)
            if eager is None or got is None:
                # a check eager makes on the layout (view of a non-viewable tensor) must hold under jit too
                if (eager is None) != (got is None):
                    problems.append(f"{op.name} on {jit_sample}: {'jit' if got is None else 'eager'} raised, "
                                    f"{'eager' if got is None else 'jit'} did not")
                continue
            expected, actual = relations(*eager), relations(*got)
            if requires_grad:
                # an empty output (x.diagonal() of an empty x) has no element to write through: where
                # the split returns a new empty tensor for eager's empty view, nothing can differ
                nonempty = [i for i, o in enumerate(eager[1]) if o.numel()]
                expected = {(i, j): v is not None for (i, j), v in expected.items() if i in nonempty}
                actual = {(i, j): v is not None for (i, j), v in actual.items() if i in nonempty}
            if len(eager[1]) != len(got[1]):
                problems.append(f"{op.name} on {jit_sample}: {len(got[1])} tensor outputs, eager has {len(eager[1])}")
                continue
            for (i, j), rel in expected.items():
                if actual[(i, j)] != rel:
                    problems.append(f"{op.name} on {jit_sample}: output {i} vs input {j}: jit {actual[(i, j)]}, "
                                    f"eager {rel}")
    return problems
