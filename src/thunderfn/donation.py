"""donate_argnums: arguments whose tensors' memory a jitted function may reuse for its results (JAX's donation).

`tf.jit(fn, donate_argnums=i)` gives the compiled code the memory of the tensors in argument i (each tensor of
that pytree): a computation that reads such a tensor for the last time and makes a value of its shape, dtype
and device writes that value into it (executors/torch_rewrites.py's reuse_dead_buffers, which treats a donated
input as a dead intermediate), so an output of that shape comes back in the donated tensor's memory and no new
allocation is made for it. JAX deletes a donated buffer; torch cannot delete a tensor the caller holds, so after
the call a donated tensor's contents are unspecified: the output written into it, or a value computed on the
way. Treat it as consumed, as in JAX.

What is never donated, so a result is never wrong:
- a tensor torch.autograd needs: a compile that torch.autograd drives (an input requires grad under grad mode)
  donates nothing, and says so with a warning (DonationSkipped); under torch.no_grad() (an optimizer's step)
  a parameter is donated like any tensor;
- a tensor that shares memory with another input of the call, or is not contiguous: that call runs on a copy
  of it (`donating`), so the caller's tensor is left as it was (and no memory is saved on that call);
- a tensor the traced code views (a reshape of it, a slice) or returns as it is: its memory is read through the
  view or is the output itself (the rewrite's own rules).

The api layer: imported by jit.py and compile_stages.py. May import: core and errors.
"""
from __future__ import annotations

import torch

from thunderfn.errors import ArgumentValueError
from thunderfn.static_args import StaticArguments


class DonationSkipped(UserWarning):
    """A compile whose donated tensors are not donated (torch.autograd drives it)."""


def check_apart(donated: StaticArguments, static: StaticArguments) -> None:
    """Refuse an argument both donated and static (resolved against the function's signature: jit's options)."""
    clash = set(donated.argnums) & set(static.argnums)
    if clash:
        raise ArgumentValueError(
            f"jitted function '{donated.function}' has donate_argnums={donated.argnums} and static_argnums="
            f"{static.argnums}: argument {sorted(clash)[0]} cannot be both. A static argument is baked into the "
            f"compiled function and holds no tensor to donate")


def donated_tensor_numbers(donated: StaticArguments, args, kwargs, leaves) -> frozenset:
    """The numbers (places among the call's tensors, in flattened order) of the tensors the call donates."""
    positions = donated.leaf_positions(args, kwargs)
    numbers, k = set(), 0
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            if i in positions:
                numbers.add(k)
            k += 1
    return frozenset(numbers)


def donating(fn, numbers: frozenset, captured=()):
    """fn (a compiled function written to reuse the memory of its tensor inputs at `numbers`), called so that a
    donated tensor that shares memory with another input or a tensor the code captured (`captured`: read by
    reference), or is not contiguous, is replaced by a copy first: the code writes into a donated tensor as if
    nothing else it reads saw that memory, with the strides it was traced at."""
    numbers = tuple(sorted(numbers))

    def run(*inputs):
        for k in numbers:
            t = inputs[k]
            if not t.is_contiguous() or _shares_memory(t, k, inputs, captured):
                inputs = (*inputs[:k], t.clone(memory_format=torch.contiguous_format), *inputs[k + 1:])
        return fn(*inputs)

    return run


def _shares_memory(t: torch.Tensor, k: int, inputs, captured) -> bool:
    storage = t.untyped_storage().data_ptr()
    others = [x for j, x in enumerate(inputs) if j != k and isinstance(x, torch.Tensor)] + list(captured)
    return any(x.untyped_storage().data_ptr() == storage for x in others)
