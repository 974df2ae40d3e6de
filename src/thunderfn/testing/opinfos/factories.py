"""OpInfos for thunderfn.torch.factories.

Factories are traced, not run at trace time: called with no tensor argument at all
(`torch.zeros(2, 3)` is the whole function), next to a tensor input (`x + torch.ones(3)`,
`torch.arange(x.shape[0])`), and as *_like / new_* methods of one. `empty*`'s values are
unspecified, so their OpInfos compare what they are made of through `zeros_like`.
"""
from __future__ import annotations

import torch

from thunderfn.errors import UnsupportedOpError
from thunderfn.testing.opinfo import ALL, FLOATS, INTS, OpInfo, SampleInput, make_tensor
from thunderfn.testing.opinfos.shape import CPU, SOME, err, maker, method

SIZES = [(2, 3), (), (0,), (1, 0, 2)]


def constant_factory_samples(device, dtype):
    for size in SIZES:
        yield SampleInput(size if size else (size,), {"dtype": dtype, "device": device})
    yield SampleInput(((2, 3),), {"dtype": dtype})
    yield SampleInput(([4],), {"dtype": dtype, "device": "cpu"})
    yield SampleInput((torch.Size([3, 1]),), {"dtype": dtype})
    if dtype is torch.float32:  # the default dtype
        yield SampleInput((2, 2))


def constant_factory_errors(name):
    def errors(device):
        negative = ("zeros: Dimension size must be non-negative." if name == "zeros"
                    else "Trying to create tensor with negative dimension")
        yield err((-1,), RuntimeError, negative + ("" if name == "zeros" else r" -1: \[-1\]"))
        yield err(((2, -3),), RuntimeError, negative + ("" if name == "zeros" else r" -3: \[2, -3\]"))
        yield err((2, 3.0), TypeError, "must be tuple of ints")
        if name != "ones":  # (torch has no sparse ones either)
            yield err((2, 3), UnsupportedOpError, "thunderfn supports strided tensors only",
                      {"layout": torch.sparse_coo}, torch_raises=False)
    return errors


def full_samples(device, dtype):
    fill = {torch.bool: True}.get(dtype, 3 if not dtype.is_floating_point else -2.5)
    for size in SIZES:
        yield SampleInput((size, fill), {"dtype": dtype, "device": device})
    yield SampleInput(([2, 2], 1), {"dtype": dtype})
    if dtype is torch.float32:  # the dtype comes from the fill value
        for fill in (3, 2.5, True, float("inf"), float("nan")):
            yield SampleInput(((2,), fill))


def full_errors(device):
    yield err(((-1, 2), 1.0), RuntimeError, r"Trying to create tensor with negative dimension -1: \[-1, 2\]")
    yield err(((2,), make_tensor((2,))), TypeError,
              r"full\(\): argument 'fill_value' \(position 2\) must be Number, not Tensor")
    # the fill value is checked where it is written, when the function runs
    yield err(((2,), 300), RuntimeError, "value cannot be converted to type uint8_t without overflow",
              {"dtype": torch.uint8})


def full_with_tensor_fill_samples(device, dtype):
    """torch.full reads a 0-dim tensor fill value as a number; thunderfn expands it."""
    mk = maker(device, dtype)
    yield SampleInput((mk(),))
    yield SampleInput((mk(), torch.float64))
    yield SampleInput((mk(), torch.int32))


def like_samples(device, dtype):
    mk = maker(device, dtype)
    for shape in [(2, 3), (), (0, 2)]:
        yield SampleInput((mk(*shape),))
    yield SampleInput((mk(2, 3, noncontiguous=True),), {"memory_format": torch.preserve_format})
    yield SampleInput((mk(2, 3),), {"dtype": torch.float64})
    yield SampleInput((mk(2, 3),), {"dtype": torch.int32, "device": "cpu"})
    yield SampleInput((mk(2, 3),), {"device": CPU})


def full_like_samples(device, dtype):
    mk = maker(device, dtype)
    for fill in (2, True, 1.5) if dtype.is_floating_point else (2, True):
        yield SampleInput((mk(2, 3), fill))
    yield SampleInput((mk(), 7))
    yield SampleInput((mk(0, 3, noncontiguous=True), 7))
    yield SampleInput((mk(2, 3), 2.5), {"dtype": torch.float64})
    yield SampleInput((mk(2, 3), make_tensor((), dtype=torch.float32, low=0, high=5)))  # a 0-dim tensor fill value


def new_factory_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3), 4, 1))
    yield SampleInput((mk(), (2, 3)))
    yield SampleInput((mk(0, 3), []))
    yield SampleInput((mk(2, 3, noncontiguous=True), [0, 2]))
    yield SampleInput((mk(2), 3), {"dtype": torch.float64})
    yield SampleInput((mk(2), (2, 2)), {"dtype": torch.int8, "device": "cpu"})


def new_factory_errors(device):
    yield err((make_tensor((2,)), -1), RuntimeError, r"Trying to create tensor with negative dimension -1: \[-1\]")
    yield err((make_tensor((2,)), 2, -1), RuntimeError,
              r"Trying to create tensor with negative dimension -1: \[2, -1\]")


def new_full_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3), (4, 1), 2))
    yield SampleInput((mk(), [2, 3], True))
    yield SampleInput((mk(0, 3), (), 1))
    yield SampleInput((mk(2), (3,), 1.5), {"dtype": torch.float64})


def new_full_errors(device):
    yield err((make_tensor((2,)), (-1,), 1), RuntimeError,
              r"Trying to create tensor with negative dimension -1: \[-1\]")


def scalar_tensor_samples(device, dtype):
    value = {torch.bool: True}.get(dtype, 3 if not dtype.is_floating_point else -2.5)
    yield SampleInput((value,), {"dtype": dtype})
    yield SampleInput((1,), {"dtype": dtype, "device": device})
    if dtype is torch.float32:  # scalar_tensor defaults to the default dtype whatever the value
        for value in (2, True, 0.5, float("-inf")):
            yield SampleInput((value,))


def arange_samples(device, dtype):
    if dtype.is_floating_point:
        for args in [(5,), (1, 5), (0, 10, 3), (5, 0, -1), (0, 1, 0.25), (0.5, 3), (-1.5, 2.0, 0.5), (3, 3),
                     (4.0, 1, -0.75)]:
            yield SampleInput(args, {"dtype": dtype, "device": device})
    else:
        for args in [(5,), (1, 5), (0, 10, 3), (5, 0, -1), (-3, 4, 2), (3, 3), (0,)]:
            yield SampleInput(args, {"dtype": dtype})
    if dtype is torch.float32:  # dtype from the arguments: int64 for ints, else the default dtype
        for args in [(4,), (1, 7, 2), (0.5, 3), (0, 2, 0.5), (-2, 2)]:
            yield SampleInput(args)
        yield SampleInput((3,), {"device": "cpu"})
        yield SampleInput((), {"start": 1, "end": 4})


def arange_errors(device):
    yield err((0, 5, 0), RuntimeError, "step must be nonzero")
    yield err((5, 0, 1), RuntimeError, "upper bound and lower bound inconsistent with step sign")
    yield err((0, 5, -1), RuntimeError, "upper bound and lower bound inconsistent with step sign")
    yield err((float("inf"),), RuntimeError, "unsupported range: 0 -> inf")
    yield err((float("nan"),), RuntimeError, "unsupported range: 0 -> nan")
    yield err((10,), NotImplementedError, "\"arange_cpu\" not implemented for 'Bool'", {"dtype": torch.bool})
    # thunderfn-only refusals
    yield err((torch.tensor(5),), UnsupportedOpError,
              "arange\\(\\) with tensor bounds has a length that depends on their values", torch_raises=False)
    yield err((0, 5, 1.5), UnsupportedOpError, "fractional start, end or step", {"dtype": torch.int32},
              torch_raises=False)


# -- factories next to tensor inputs -------------------------------------------------------
def tensor_input_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3),))
    yield SampleInput((mk(4),))
    yield SampleInput((mk(3, 0),))
    yield SampleInput((mk(3, 2, noncontiguous=True),))


def ones_next_to(x):
    return x + torch.ones(x.shape[-1])  # float32 ones: promotes integer x


def zeros_next_to(x):
    return torch.cat([x, torch.zeros(1, *x.shape[1:], dtype=x.dtype)])


def full_next_to(x):
    return torch.full(x.shape, 2, dtype=x.dtype) * x


def arange_next_to(x):
    return x * torch.arange(x.shape[0]).reshape(-1, *([1] * (x.ndim - 1)))


def arange_float_next_to(x):
    return x - torch.arange(0, x.shape[-1] / 2, 0.5, device=x.device)


def empty_next_to(x):
    return torch.zeros_like(torch.empty(x.shape[::-1], dtype=x.dtype))


def empty_via_zeros_like(*args, **kwargs):
    return torch.zeros_like(torch.empty(*args, **kwargs))


def empty_like_via_zeros_like(*args, **kwargs):
    return torch.zeros_like(torch.empty_like(*args, **kwargs))


def new_empty_via_zeros_like(a, *args, **kwargs):
    return torch.zeros_like(a.new_empty(*args, **kwargs))


def full_with_tensor_fill(fill, dtype=None):
    return torch.full((2, 3), fill, dtype=dtype)


NUMERIC = FLOATS + INTS  # torch.arange has no bool kernel

opinfos: list[OpInfo] = [
    OpInfo("zeros", torch.zeros, constant_factory_samples, ALL, constant_factory_errors("zeros")),
    OpInfo("ones", torch.ones, constant_factory_samples, ALL, constant_factory_errors("ones")),
    OpInfo("empty", empty_via_zeros_like, constant_factory_samples, ALL, constant_factory_errors("empty")),
    OpInfo("full", torch.full, full_samples, ALL, full_errors),
    OpInfo("full.tensor_fill", full_with_tensor_fill, full_with_tensor_fill_samples, SOME),
    OpInfo("zeros_like", torch.zeros_like, like_samples, ALL),
    OpInfo("ones_like", torch.ones_like, like_samples, ALL),
    OpInfo("empty_like", empty_like_via_zeros_like, like_samples, ALL),
    OpInfo("full_like", torch.full_like, full_like_samples, ALL),
    OpInfo("new_zeros", method("new_zeros"), new_factory_samples, ALL, new_factory_errors),
    OpInfo("new_ones", method("new_ones"), new_factory_samples, ALL, new_factory_errors),
    OpInfo("new_empty", new_empty_via_zeros_like, new_factory_samples, ALL, new_factory_errors),
    OpInfo("new_full", method("new_full"), new_full_samples, ALL, new_full_errors),
    OpInfo("scalar_tensor", torch.scalar_tensor, scalar_tensor_samples, ALL),
    OpInfo("arange", torch.arange, arange_samples, NUMERIC, arange_errors),
    OpInfo("ones.next_to_tensor", ones_next_to, tensor_input_samples, ALL),
    OpInfo("zeros.next_to_tensor", zeros_next_to, tensor_input_samples, ALL),
    OpInfo("full.next_to_tensor", full_next_to, tensor_input_samples, NUMERIC),
    OpInfo("empty.next_to_tensor", empty_next_to, tensor_input_samples, SOME),
    OpInfo("arange.next_to_tensor", arange_next_to, tensor_input_samples, NUMERIC),
    OpInfo("arange.float_next_to_tensor", arange_float_next_to, tensor_input_samples, FLOATS),
]
