"""The OpInfo framework: per torch-language op, sample inputs, error inputs with
the expected exception and message, and a torch reference.

An OpInfo names the torch callable a user writes (`op`, e.g. torch.add or
torch.Tensor.view). Tests run it three ways on every sample: eagerly (the
reference), under `tf.jit` (torch executor: the symbol's torch mapping) and under
`tf.jit(executors=["torch_prims"], fallback=False)` (the decomposition into prims).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

import torch


@dataclasses.dataclass
class SampleInput:
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    name: str = ""

    def __repr__(self):
        def show(x):
            if isinstance(x, torch.Tensor):
                return f"Tensor{tuple(x.shape)}:{str(x.dtype)[6:]}{'' if x.is_contiguous() else ':noncontig'}"
            if isinstance(x, (list, tuple)):
                return type(x)(show(v) for v in x)
            return x
        return f"SampleInput({self.name or ''} args={show(self.args)}, kwargs={show(self.kwargs)})"


@dataclasses.dataclass
class ErrorInput:
    sample: SampleInput
    exc_type: type
    match: str  # a regex the message must contain (re.search)
    # False for thunderfn-only refusals (e.g. UnsupportedOpError for data-dependent shapes):
    # the op runs fine eagerly, so only the jitted call is expected to raise.
    torch_raises: bool = True


@dataclasses.dataclass
class OpInfo:
    name: str  # unique id, used in test ids
    op: Callable  # what a user calls: torch.add, torch.Tensor.view, torch.nn.functional.gelu, ...
    sample_inputs: Callable[[torch.device, torch.dtype], Iterable[SampleInput]]
    dtypes: Sequence[torch.dtype] = (torch.float32,)
    error_inputs: Callable[[torch.device], Iterable[ErrorInput]] | None = None
    reference: Callable | None = None  # defaults to op run eagerly
    atol: float | None = None
    rtol: float | None = None
    # (atol, rtol) for particular dtypes, in place of atol/rtol: a decomposition computing
    # half types in float32 and rounding once may differ from torch's kernel by an ulp
    dtype_tolerances: dict = dataclasses.field(default_factory=dict)
    # Why the decomposition check is skipped, if it is (a reason a user would accept).
    skip_decomposition: str | None = None

    def ref(self, *args, **kwargs):
        return (self.reference or self.op)(*args, **kwargs)


# -- sample helpers shared by the op modules ----------------------------------------------
def make_tensor(shape, *, device="cpu", dtype=torch.float32, low=None, high=None, noncontiguous=False,
                exclude_zero=False):
    """torch.testing.make_tensor with thunderfn's defaults."""
    return torch.testing.make_tensor(tuple(shape), device=device, dtype=dtype, low=low, high=high,
                                     noncontiguous=noncontiguous, exclude_zero=exclude_zero)


FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INTS = (torch.int64, torch.int32, torch.uint8, torch.int8)
ALL = FLOATS + INTS + (torch.bool,)
