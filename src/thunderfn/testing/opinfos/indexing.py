"""OpInfos for thunderfn.torch.indexing: `x[key]`, index_select, gather, take_along_dim.

Index tensors are drawn in range; out-of-range index *values* are only known when the
function runs, so those error inputs accept torch's message and the take kernel's.
"""
from __future__ import annotations

import operator

import torch

from thunderfn.errors import UnsupportedOpError
from thunderfn.testing.opinfo import ALL, OpInfo, SampleInput, make_tensor
from thunderfn.testing.opinfos.shape import SOME, err, maker, method, x234

ALL_SLICE = slice(None)
OUT_OF_RANGE_VALUE = r"index (-?\d+ is )?out of (bounds|range)"  # torch's gather/indexing or index_select's wording


def idx(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


def randidx(shape, high, dtype=torch.int64, low=None):
    """Indices in [low, high): negative lows exercise counting from the end."""
    return make_tensor(shape, dtype=dtype, low=-high if low is None else low, high=high)


def getitem_samples(device, dtype):
    mk = maker(device, dtype)
    x = mk(3, 4, 5)
    basic = [1, -1, (0, -2), (2, -4, 4), ALL_SLICE, slice(1, None), (ALL_SLICE, slice(None, None, 2)),
             (slice(-2, None), slice(-10, 10, 3)), slice(2, 1), slice(5, 10), None, (0, None, slice(1, 3)),
             Ellipsis, (Ellipsis, 1), (None, Ellipsis, None), (1, Ellipsis, slice(None, None, 2)), (Ellipsis, None, 2),
             True, False, (ALL_SLICE, True), (0, False)]
    for key in basic:
        yield SampleInput((x, key))
    advanced = [
        idx(0, 2, -1),  # one integer tensor, negative entries count from the end
        (ALL_SLICE, randidx((2, 3), 4)),  # a 2-D index tensor in the middle
        (ALL_SLICE, idx(0, 3, -1), idx(1, -5, 4)),  # two adjacent: the index shape stays in place
        (ALL_SLICE, idx(0, 1).reshape(2, 1), idx(1, 2, 3)),  # two adjacent, broadcast together
        (idx(0, 2, -1), ALL_SLICE, idx(0, 4, -2)),  # two separated: the index shape moves first
        (idx(1, 2), slice(1, 3), ALL_SLICE),
        (idx(1, 2), ALL_SLICE, 2),  # an int after a tensor: select first, then index
        (1, idx(3, 0)),
        (None, idx(1, 0)),
        (idx(2, 1), None, idx(0, 3)),  # separated by None
        (Ellipsis, idx(4, 4, 0)),
        (0, slice(0, 2), idx(1, 2), None),
        (idx(0, 1), True),  # a bool takes part as an index tensor on a new dim
        torch.tensor(1),  # a 0-dim index tensor
        torch.tensor(-1),
        idx(2, 0, dtype=torch.int32),
        torch.zeros(0, dtype=torch.int64),
        [0, 2],  # lists index like tensors (a list holding sequences or slices is read as a tuple,
        [-1, 0, -3],  # which torch deprecates, so it is not sampled)
        ([0, 2], ALL_SLICE, [-1, 1]),
    ]
    for key in advanced:
        yield SampleInput((x, key))
    yield SampleInput((mk(3, 4, 5, noncontiguous=True), (idx(1, 2), Ellipsis, slice(1, 4, 2))))
    yield SampleInput((mk(5, 4).T, (ALL_SLICE, idx(4, 0))))
    yield SampleInput((mk(), Ellipsis))
    yield SampleInput((mk(), None))
    yield SampleInput((mk(), True))
    yield SampleInput((mk(), (None, False)))
    yield SampleInput((mk(0, 3), (ALL_SLICE, 1)))
    yield SampleInput((mk(0, 3), (ALL_SLICE, idx(0, 2))))
    yield SampleInput((mk(2, 0), (idx(1, 0), ALL_SLICE)))


def getitem_errors(device):
    x = make_tensor((3, 4, 5))
    yield err((x, 3), IndexError, "index 3 is out of bounds for dimension 0 with size 3")
    yield err((x, (0, -5)), IndexError, "index -5 is out of bounds for dimension 1 with size 4")
    yield err((x, (0, 0, 0, 0)), IndexError, "too many indices for tensor of dimension 3")
    yield err((x, (None, 0, 0, 0, 0)), IndexError, "too many indices for tensor of dimension 3")
    yield err((make_tensor(()), 0), IndexError, r"invalid index of a 0-dim tensor. Use `tensor.item\(\)`")
    yield err((x, 1.5), IndexError, r"only integers, slices \(`:`\), ellipsis \(`...`\), None and long or byte Variables are valid indices")
    yield err((x, idx(1, dtype=torch.int8)), IndexError, "tensors used as indices must be long, int, byte or bool tensors")
    yield err((x, idx(1.0, dtype=torch.float32)), IndexError, "tensors used as indices must be long, int, byte or bool tensors")
    yield err((x, slice(None, None, 0)), ValueError, "slice step cannot be zero")
    yield err((x, slice(None, None, -1)), ValueError, "step must be greater than zero")
    yield err((x, (idx(0, 1), ALL_SLICE, idx(0, 1, 2))), IndexError,
              r"shape mismatch: indexing tensors could not be broadcast together with shapes \[2\], \[3\]")
    # the index values are only known at run time: torch raises, and so does the decomposition's take
    yield err((x, idx(0, 3)), IndexError, OUT_OF_RANGE_VALUE)
    yield err((x, (idx(0, 1), idx(1, 4))), IndexError, OUT_OF_RANGE_VALUE)
    yield err((x, (ALL_SLICE, idx(0, 1), idx(-6, 0))), IndexError, OUT_OF_RANGE_VALUE)
    # thunderfn-only refusals: the result's shape depends on the mask's values
    mask_message = "indexing with a boolean mask gives a shape that depends on the mask's values"
    yield err((x, idx(True, False, True, dtype=torch.bool)), UnsupportedOpError, mask_message, torch_raises=False)
    yield err((x, (ALL_SLICE, make_tensor((4, 5), dtype=torch.bool))), UnsupportedOpError, mask_message, torch_raises=False)
    yield err((x, idx(1, 0, 1, dtype=torch.uint8)), UnsupportedOpError, mask_message, torch_raises=False)  # uint8 is a mask to torch
    yield err((x, [True, False, True]), UnsupportedOpError, mask_message, torch_raises=False)
    # torch accepts several ellipses with results no rule explains; thunderfn refuses
    yield err((x, (Ellipsis, Ellipsis)), IndexError, r"an index can only have a single ellipsis \('...'\)", torch_raises=False)


def index_select_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4, 5), 1, idx(0, 3, 3)))
    yield SampleInput((mk(3, 4, 5), -1, idx(4, 0, dtype=torch.int32)))
    yield SampleInput((mk(3, 4, 5), 0, torch.tensor(2)))
    yield SampleInput((mk(3, 4, 5), 2, torch.zeros(0, dtype=torch.int64)))
    yield SampleInput((mk(3, 4, noncontiguous=True), 1, randidx((6,), 4, low=0)))
    yield SampleInput((mk(), 0, idx(0)))
    yield SampleInput((mk(), 0, torch.tensor(0)))
    yield SampleInput((mk(0, 3), 1, idx(2, 1)))


def index_select_errors(device):
    x = x234()
    yield err((x, 1, idx(1.0, dtype=torch.float32)), RuntimeError, r"index_select\(\): Expected dtype int32 or int64 for index")
    yield err((x, 1, idx(1, 2).reshape(2, 1)), IndexError, r"index_select\(\): Index is supposed to be a vector")
    yield err((x, 3, idx(1)), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    # (torch's own kernel raises RuntimeError for these on a middle dim, IndexError on the first and last)
    yield err((x, 0, idx(2)), IndexError, "index out of range in self")
    yield err((x, -1, idx(-1)), IndexError, "index out of range in self")  # index_select does not count from the end


def gather_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4, 5), 1, randidx((3, 2, 5), 4, low=0)))
    yield SampleInput((mk(3, 4, 5), 2, randidx((2, 2, 2), 5, low=0)))  # index smaller than input apart from dim
    yield SampleInput((mk(3, 4, 5), -1, randidx((3, 4, 7), 5, low=0, dtype=torch.int32)))
    yield SampleInput((mk(3, 4, noncontiguous=True), 0, randidx((5, 4), 3, low=0)))
    yield SampleInput((mk(3, 4, 5), 1, torch.zeros(3, 0, 5, dtype=torch.int64)))
    yield SampleInput((mk(), 0, torch.tensor(0)))
    yield SampleInput((mk(), 0, idx(0, 0)))  # torch reads a 0-dim input as 1-dim
    yield SampleInput((mk(3, 4), 1, randidx((3, 2), 4, low=0)), {"sparse_grad": False})


def gather_errors(device):
    x = x234()
    yield err((x, 1, torch.zeros(2, 2, dtype=torch.int64)), RuntimeError, "Index tensor must have the same number of dimensions as input tensor")
    yield err((x, 1, torch.zeros(3, 2, 4, dtype=torch.int64)), RuntimeError,
              r"Size does not match at dimension 0 expected index \[3, 2, 4\] to be no larger than self \[2, 3, 4\] apart from dimension 1")
    yield err((x, 1, torch.zeros(2, 2, 4)), RuntimeError, r"gather\(\): Expected dtype int32/int64 for index")
    yield err((x, 3, torch.zeros(2, 2, 4, dtype=torch.int64)), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    yield err((x, 1, torch.full((2, 2, 4), 3)), RuntimeError, "index 3 is out of bounds for dimension 1 with size 3")


def take_along_dim_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4, 5), randidx((7,), 60, low=0)))
    yield SampleInput((mk(3, 4, 5), randidx((2, 3), 60, low=0)))
    yield SampleInput((mk(3, 4, 5), randidx((3, 2, 5), 4, low=0), 1))
    yield SampleInput((mk(3, 4, 5), randidx((1, 6, 1), 4, low=0), 1))  # index broadcasts over the other dims
    yield SampleInput((mk(1, 4, 1), randidx((3, 2, 5), 4, low=0), 1))  # input broadcasts over the other dims
    yield SampleInput((mk(3, 4, 5, noncontiguous=True), randidx((3, 4, 2), 5, low=0), -1))
    yield SampleInput((mk(3, 4), torch.zeros(3, 0, dtype=torch.int64), 1))
    yield SampleInput((mk(), torch.tensor(0)))


def take_along_dim_errors(device):
    x = x234()
    yield err((x, torch.zeros(2, 2, dtype=torch.int64), 1), RuntimeError,
              r"torch.take_along_dim\(\): input and indices should have the same number of dimensions, but got 3 dimensions for input, and 2 dimensions for indices")
    yield err((x, torch.zeros(2, 2, 4, dtype=torch.int32), 1), RuntimeError, r"torch.take_along_dim\(\): dtype of indices should be Long but got Int")
    yield err((x, torch.zeros(2, 2, 4), 1), RuntimeError, r"torch.take_along_dim\(\): dtype of indices should be Long but got Float")
    yield err((x, torch.zeros(3, 2, 4, dtype=torch.int64), 1), RuntimeError,
              r"The size of tensor a \(2\) must match the size of tensor b \(3\) at non-singleton dimension 0")
    yield err((make_tensor(()), torch.tensor(0), 0), IndexError, "Dimension specified as 0 but tensor has no dimensions")


opinfos: list[OpInfo] = [
    OpInfo("getitem", operator.getitem, getitem_samples, ALL, getitem_errors),
    OpInfo("index_select", torch.index_select, index_select_samples, ALL, index_select_errors),
    OpInfo("index_select.method", method("index_select"), index_select_samples, SOME, index_select_errors),
    OpInfo("gather", torch.gather, gather_samples, ALL, gather_errors),
    OpInfo("gather.method", method("gather"), gather_samples, SOME, gather_errors),
    OpInfo("take_along_dim", torch.take_along_dim, take_along_dim_samples, ALL, take_along_dim_errors),
    OpInfo("take_along_dim.method", method("take_along_dim"), take_along_dim_samples, SOME, take_along_dim_errors),
]
