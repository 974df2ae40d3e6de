"""argnums, as torch.func reads and checks it: an int or a tuple of distinct ints, negative ones
counting from the end of the call's positional arguments. Every refusal is torch.func's
RuntimeError in its words (TransformArgumentError, also a TypeError)."""
from __future__ import annotations

from thunderfn.errors import TransformArgumentError


def argnums_as_tuple(argnums) -> tuple:
    """argnums (an int, or a tuple or list of ints) as a tuple; anything else is torch.func's RuntimeError."""
    if isinstance(argnums, int) and not isinstance(argnums, bool):
        return (argnums,)
    if not isinstance(argnums, (tuple, list)):
        raise TransformArgumentError(f"argnums must be int or Tuple[int, ...], got: {type(argnums)}")
    for i in argnums:
        if not isinstance(i, int) or isinstance(i, bool):
            raise TransformArgumentError(f"argnum must be int, got: {type(i)}")
    if not argnums:
        raise TransformArgumentError("argnums must be non-empty")
    return tuple(argnums)


def positional_argnums(fn, nums: tuple, n_args: int) -> tuple:
    """nums (argnums as a tuple; negative counts from the end, as torch.func and JAX read it) as
    positions among n_args positional arguments, or TransformArgumentError naming the bad one."""
    for i in nums:
        if not -n_args <= i < n_args:
            raise TransformArgumentError(
                f"Got argnum={i}, but only {n_args} positional inputs: differentiating '{getattr(fn, '__name__', fn)}' "
                f"with respect to argument {i}, but it was called with {n_args} positional arguments. Pass that "
                f"argument by position, or change argnums.")
    positions = tuple(i % n_args for i in nums)
    if len(set(positions)) != len(positions):  # torch.func checks after wrapping, as here: (0, -1) of 1 repeats
        raise TransformArgumentError(f"argnums elements must be unique, got {positions}")
    return positions
