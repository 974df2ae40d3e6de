"""OpInfos for thunderfn.torch.indexing: `x[key]`, index_select, gather, take_along_dim, and the
positions of a mask (nonzero, argwhere, masked_select, torch.where(condition)), whose length is a
data-dependent size (core/symbolic.py).

Index tensors are drawn in range; out-of-range index *values* are only known when the
function runs, so those error inputs accept torch's message and the take kernel's.
"""
from __future__ import annotations

import operator

import torch

from thunderfn.testing.opinfo import ALL, OpInfo, SampleInput, make_tensor
from thunderfn.testing.opinfos.shape import SOME, err, function_and_method, maker, method, x234
from thunderfn.torch.indexing import index_put_key

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
        # boolean masks: the index tensors of their True positions, of a length known only at run time
        idx(True, False, True, dtype=torch.bool),
        (ALL_SLICE, make_tensor((4, 5), dtype=torch.bool)),  # a mask over two dims
        (idx(False, False, False, dtype=torch.bool), None),  # none selected: an empty result
        (ALL_SLICE, 1, idx(True, True, False, True, False, dtype=torch.bool)),  # after an int
        [True, False, True],  # a list of bools is a mask
        torch.tensor(True),  # a 0-dim mask: a new dim of length 1 or 0
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
    yield err((x, 1.5), IndexError,
              r"only integers, slices \(`:`\), ellipsis \(`...`\), None and long or byte Variables are valid indices")
    yield err((x, idx(1, dtype=torch.int8)), IndexError,
              "tensors used as indices must be long, int, byte or bool tensors")
    yield err((x, idx(1.0, dtype=torch.float32)), IndexError,
              "tensors used as indices must be long, int, byte or bool tensors")
    yield err((x, slice(None, None, 0)), ValueError, "slice step cannot be zero")
    yield err((x, slice(None, None, -1)), ValueError, "step must be greater than zero")
    yield err((x, (idx(0, 1), ALL_SLICE, idx(0, 1, 2))), IndexError,
              r"shape mismatch: indexing tensors could not be broadcast together with shapes \[2\], \[3\]")
    # the index values are only known at run time: torch raises, and so does the decomposition's take
    yield err((x, idx(0, 3)), IndexError, OUT_OF_RANGE_VALUE)
    yield err((x, (idx(0, 1), idx(1, 4))), IndexError, OUT_OF_RANGE_VALUE)
    yield err((x, (ALL_SLICE, idx(0, 1), idx(-6, 0))), IndexError, OUT_OF_RANGE_VALUE)
    yield err((x, idx(True, False, dtype=torch.bool)), IndexError,
              r"The shape of the mask \[2\] at index 0 does not match the shape of the indexed tensor "
              r"\[3, 4, 5\] at index 0")
    yield err((x, (ALL_SLICE, make_tensor((4, 4), dtype=torch.bool))), IndexError,
              r"The shape of the mask \[4, 4\] at index 1 does not match the shape of the indexed tensor "
              r"\[3, 4, 5\] at index 2")
    # torch accepts several ellipses with results no rule explains; thunderfn refuses
    yield err((x, (Ellipsis, Ellipsis)), IndexError, r"an index can only have a single ellipsis \('...'\)",
              torch_raises=False)


def nonzero_samples(device, dtype):
    mk = maker(device, dtype)
    for shape in ((3, 4), (5,), (), (2, 0), (2, 3, 2)):
        yield SampleInput((mk(*shape),))
        yield SampleInput((mk(*shape),), {"as_tuple": True})
    yield SampleInput((torch.zeros(4, 2, dtype=dtype, device=device),))  # no nonzero element: 0 rows


def argwhere_samples(device, dtype):
    for sample in nonzero_samples(device, dtype):
        if not sample.kwargs:
            yield sample


def masked_select_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), make_tensor((3, 4), dtype=torch.bool)))
    yield SampleInput((mk(3, 4), make_tensor((4,), dtype=torch.bool)))  # the mask broadcasts to the input
    yield SampleInput((mk(4), make_tensor((3, 4), dtype=torch.bool)))  # and the input to the mask
    yield SampleInput((mk(3, 4, noncontiguous=True), torch.zeros(3, 4, dtype=torch.bool)))  # none selected
    yield SampleInput((mk(), torch.tensor(True)))


def masked_select_errors(device):
    yield err((x234(), make_tensor((3, 4, 5))), RuntimeError, "masked_select: expected BoolTensor for mask")
    yield err((x234(), make_tensor((2, 4, 5), dtype=torch.bool)), RuntimeError, "The size of tensor a")


def where_condition_samples(device, dtype):
    for sample in argwhere_samples(device, dtype):
        yield SampleInput((sample.args[0] != 0,))


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
    yield err((x, 1, idx(1.0, dtype=torch.float32)), RuntimeError,
              r"index_select\(\): Expected dtype int32 or int64 for index")
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
    yield SampleInput((mk(5), 0, torch.zeros(0, dtype=torch.uint8)))  # an empty index's dtype is not checked
    yield SampleInput((mk(), 0, torch.tensor(0)))
    yield SampleInput((mk(), 0, idx(0, 0)))  # torch reads a 0-dim input as 1-dim
    yield SampleInput((mk(3, 4), 1, randidx((3, 2), 4, low=0)), {"sparse_grad": False})


def gather_errors(device):
    x = x234()
    yield err((x, 1, torch.zeros(2, 2, dtype=torch.int64)), RuntimeError,
              "Index tensor must have the same number of dimensions as input tensor")
    yield err((x, 1, torch.zeros(3, 2, 4, dtype=torch.int64)), RuntimeError,
              r"Size does not match at dimension 0 expected index \[3, 2, 4\] to be no larger than self \[2, 3, 4\] "
              r"apart from dimension 1")
    yield err((x, 1, torch.zeros(2, 2, 4)), RuntimeError, r"gather\(\): Expected dtype int32/int64 for index")
    yield err((x, 3, torch.zeros(2, 2, 4, dtype=torch.int64)), IndexError,
              r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    yield err((x, 1, torch.full((2, 2, 4), 3)), RuntimeError, "index 3 is out of bounds for dimension 1 with size 3")


def take_along_dim_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4, 5), randidx((7,), 60, low=0)))
    yield SampleInput((mk(3, 4, 5), randidx((2, 3), 60, low=0)))
    yield SampleInput((mk(3, 4, 5), randidx((3, 2, 5), 4, low=0), 1))
    # along a dim, negative indices count from the end
    yield SampleInput((mk(3, 4, 5), randidx((3, 2, 5), 4, low=-4), 1))
    yield SampleInput((mk(3, 4, 5), randidx((1, 6, 1), 4, low=0), 1))  # index broadcasts over the other dims
    yield SampleInput((mk(1, 4, 1), randidx((3, 2, 5), 4, low=0), 1))  # input broadcasts over the other dims
    yield SampleInput((mk(3, 4, 5, noncontiguous=True), randidx((3, 4, 2), 5, low=0), -1))
    yield SampleInput((mk(3, 4), torch.zeros(3, 0, dtype=torch.int64), 1))
    yield SampleInput((mk(), torch.tensor(0)))


def take_along_dim_errors(device):
    x = x234()
    yield err((x, torch.zeros(2, 2, dtype=torch.int64), 1), RuntimeError,
              r"torch.take_along_dim\(\): input and indices should have the same number of dimensions, but got 3 "
              r"dimensions for input, and 2 dimensions for indices")
    yield err((x, torch.zeros(2, 2, 4, dtype=torch.int32), 1), RuntimeError,
              r"torch.take_along_dim\(\): dtype of indices should be Long but got Int")
    yield err((x, torch.zeros(2, 2, 4), 1), RuntimeError,
              r"torch.take_along_dim\(\): dtype of indices should be Long but got Float")
    yield err((x, torch.zeros(3, 2, 4, dtype=torch.int64), 1), RuntimeError,
              r"The size of tensor a \(2\) must match the size of tensor b \(3\) at non-singleton dimension 0")
    yield err((make_tensor(()), torch.tensor(0), 0), IndexError,
              "Dimension specified as 0 but tensor has no dimensions")


opinfos: list[OpInfo] = [
    OpInfo("getitem", operator.getitem, getitem_samples, ALL, getitem_errors),
    *function_and_method("nonzero", nonzero_samples),
    *function_and_method("argwhere", argwhere_samples),
    *function_and_method("masked_select", masked_select_samples, masked_select_errors),
    OpInfo("where.condition", torch.where, where_condition_samples, (torch.bool,)),
    *function_and_method("index_select", index_select_samples, index_select_errors),
    *function_and_method("gather", gather_samples, gather_errors),
    *function_and_method("take_along_dim", take_along_dim_samples, take_along_dim_errors),
]


# -- functional writes ---------------------------------------------------------------------
# Overwriting writes (scatter, index_copy, index_put, put) sample unique positions only: with
# duplicates torch leaves which value wins unspecified. Out-of-range index *values* raise when
# the function runs: torch's scatter and the decomposition's scatter raise alike, so those are
# error inputs; index_put/index_copy/put raise IndexError eagerly and RuntimeError through the
# scatter prim, so their value checks are not sampled.
def unique_index(shape, dim, size, dtype=torch.int64):
    """An index of `shape` whose entries along dim are distinct positions in [0, size)."""
    shape = list(shape)
    full = list(shape)
    full[dim] = size
    return torch.rand(full).argsort(dim).narrow(dim, 0, shape[dim]).to(dtype)


def scatter_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4, 5), 0, unique_index((2, 4, 5), 0, 3), mk(2, 4, 5)))
    yield SampleInput((mk(3, 4, 5), 1, unique_index((3, 2, 5), 1, 4), mk(3, 3, 6)))  # src larger than index
    # index smaller than self
    yield SampleInput((mk(3, 4, 5), -1, unique_index((2, 3, 4), 2, 5, torch.int32), mk(2, 3, 4)))
    yield SampleInput((mk(3, 4, 5, noncontiguous=True), 2, unique_index((3, 4, 5), 2, 5),
                       mk(3, 4, 5, noncontiguous=True)))
    yield SampleInput((mk(3, 4), 0, torch.zeros(0, 4, dtype=torch.int64), mk(2, 4)))
    yield SampleInput((mk(0, 4), 1, torch.zeros(0, 2, dtype=torch.int64), mk(0, 2)))
    yield SampleInput((mk(), 0, torch.tensor(0), mk()))
    yield SampleInput((mk(), 0, idx(0), mk(1)))
    yield SampleInput((mk(4), 0, torch.tensor(2), mk()))


def scatter_value_samples(device, dtype):
    mk = maker(device, dtype)
    fill = True if dtype is torch.bool else 3 if not dtype.is_floating_point else 2.5
    yield SampleInput((mk(3, 4), 0, unique_index((2, 4), 0, 3), fill))
    yield SampleInput((mk(3, 4), -1, unique_index((3, 2), 1, 4)), {"value": fill})
    yield SampleInput((mk(3, 4, noncontiguous=True), 1, unique_index((2, 3), 1, 4), True))
    if dtype is not torch.bool:
        yield SampleInput((mk(3, 4), 0, unique_index((3, 1), 0, 3), 7.9))  # truncated into integer dtypes
    yield SampleInput((mk(), 0, torch.tensor(0), fill))


def scatter_reduce_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), 0, randidx((5, 4), 3, low=0), mk(5, 4)), {"reduce": "add"})  # duplicates sum
    yield SampleInput((mk(3, 4), 1, randidx((3, 6), 4, low=0), 2), {"reduce": "add"})
    # no decomposition (deprecated in torch, no scatter_mul prim): runs as an opaque torch op
    yield SampleInput((mk(3, 4), 0, randidx((5, 4), 3, low=0), mk(5, 4)), {"reduce": "multiply"})


def scatter_errors(device):
    x = make_tensor((3, 4))
    i = idx(0, 1, 2, 0).reshape(1, 4)
    yield err((x, 0, i.float(), make_tensor((1, 4))), RuntimeError,
              r"scatter\(\): Expected dtype int32/int64 for index")
    yield err((x, 0, i, make_tensor((1, 4), dtype=torch.float64)), RuntimeError,
              r"scatter\(\): Expected self.dtype to be equal to src.dtype")
    yield err((x, 2, i, 1.0), IndexError, r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)")
    yield err((x, 0, torch.zeros(1, 1, 1, dtype=torch.int64), 1.0), RuntimeError,
              "Index tensor must have the same number of dimensions as self tensor")
    yield err((x, 0, torch.zeros(4, 5, dtype=torch.int64), 1.0), RuntimeError,
              r"Expected index \[4, 5\] to be no larger than self \[3, 4\] apart from dimension 0")
    yield err((x, 0, torch.zeros(1, 5, dtype=torch.int64), make_tensor((1, 4))), RuntimeError,
              r"Expected index \[1, 5\] to be no larger than self \[3, 4\] apart from dimension 0 and to be no larger "
              r"size than src \[1, 4\]")
    yield err((x, 0, i, make_tensor(())), RuntimeError,
              "Index tensor must have the same number of dimensions as src tensor")
    yield err((x, 0, i, make_tensor((1, 4))), RuntimeError, "reduce argument must be either add or multiply.",
              {"reduce": "max"})
    yield err((x, 0, idx(3).reshape(1, 1), 1.0), RuntimeError, "index 3 is out of bounds for dimension 0 with size 3")


def scatter_add_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4, 5), 0, randidx((6, 4, 5), 3, low=0), mk(6, 4, 5)))  # duplicates sum
    yield SampleInput((mk(3, 4, 5), 1, randidx((3, 2, 5), 4, low=0), mk(3, 3, 6)))
    yield SampleInput((mk(3, 4, 5), -1, randidx((2, 3, 7), 5, low=0, dtype=torch.int32), mk(2, 3, 7)))
    yield SampleInput((mk(3, 4, noncontiguous=True), 1, randidx((3, 4), 4, low=0), mk(3, 4, noncontiguous=True)))
    yield SampleInput((mk(3, 4), 0, torch.zeros(0, 4, dtype=torch.int64), mk(0, 4)))
    yield SampleInput((mk(), 0, torch.tensor(0), mk()))


def scatter_add_errors(device):
    x = make_tensor((3, 4))
    yield err((x, 0, idx(0, 1, 2, 0).reshape(1, 4), make_tensor((1, 4), dtype=torch.float64)), RuntimeError,
              r"scatter_add\(\): Expected self.dtype to be equal to src.dtype")
    yield err((x, 0, idx(0, 1, 2, 0).reshape(1, 4), make_tensor((1, 3))), RuntimeError,
              r"Expected index \[1, 4\] to be no larger than self \[3, 4\] apart from dimension 0 and to be no larger "
              r"size than src \[1, 3\]")
    yield err((x, 0, idx(0, 5).reshape(1, 2), make_tensor((1, 2))), RuntimeError,
              "index 5 is out of bounds for dimension 0 with size 3")


def index_add_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), 0, idx(0, 2, 0, 1), mk(4, 4)))  # duplicates sum
    yield SampleInput((mk(3, 4), 1, idx(3, 0, dtype=torch.int32), mk(3, 2)),
                      {"alpha": True if dtype is torch.bool else 2})
    yield SampleInput((mk(3, 4, 5), -1, randidx((6,), 5, low=0), mk(3, 4, 6, noncontiguous=True)))
    yield SampleInput((mk(3, 4), 0, torch.zeros(0, dtype=torch.int64), mk(0, 4)))
    yield SampleInput((mk(), 0, idx(0), mk()))
    yield SampleInput((mk(), 0, torch.tensor(0), mk()))
    if dtype.is_floating_point:
        yield SampleInput((mk(3, 4), 0, idx(2, 1), mk(2, 4)), {"alpha": 0.5})


def index_add_errors(device):
    x = make_tensor((3, 4))
    i = idx(0, 2)
    yield err((x, 0, i, make_tensor((2, 4), dtype=torch.float64)), RuntimeError,
              r"index_add_\(\): self \(Float\) and source \(Double\) must have the same scalar type")
    yield err((x, 0, i, make_tensor((3, 4))), RuntimeError,
              r"index_add_\(\): Number of indices \(2\) should be equal to source.size\(dim\): \(3\), for dim: 0")
    yield err((x, 0, i.reshape(1, 2), make_tensor((2, 4))), IndexError,
              r"index_add_\(\): Index is supposed to be a vector, but got dim: 2 with type: Long and size: \[1, 2\]")
    yield err((x, 0, i.float(), make_tensor((2, 4))), RuntimeError,
              r"index_add_\(\): Expected dtype int32/int64 for index but got: Float")
    yield err((x, 0, i, make_tensor((2, 5))), RuntimeError,
              r"source tensor shape must match self tensor shape, excluding the specified dimension. Got self.shape = "
              r"\[3, 4\] source.shape = \[2, 5\]")
    yield err((x, 2, i, make_tensor((2, 4))), IndexError,
              r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)")


def index_copy_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), 0, idx(2, 0), mk(2, 4)))
    yield SampleInput((mk(3, 4, 5), -1, torch.randperm(5)[:3], mk(3, 4, 3, noncontiguous=True)))
    yield SampleInput((mk(3, 4), 1, torch.zeros(0, dtype=torch.int64), mk(3, 0)))
    yield SampleInput((mk(), 0, idx(0), mk()))
    yield SampleInput((mk(3), 0, torch.tensor(1), mk(1)))


def index_copy_errors(device):
    x = make_tensor((3, 4))
    i = idx(0, 2)
    yield err((x, 0, i, make_tensor((2, 4), dtype=torch.float64)), RuntimeError,
              r"index_copy_\(\): self and source expected to have the same dtype, but got \(self\) Float "
              r"and \(source\) Double")
    yield err((x, 0, i, make_tensor((3, 4))), IndexError,
              r"index_copy_\(\): Number of indices \(2\) should be equal to source.size\(dim\) \(3\)")
    yield err((x, 0, i.int(), make_tensor((2, 4))), RuntimeError,
              r"index_copy_\(\): Expected a long tensor for index, but got Int")
    yield err((x, 1, i, make_tensor((2, 4))), RuntimeError,
              r"index_copy_\(\): Source/destination tensor must have same slice shapes. Destination slice shape: 3 at "
              r"dimension 0 and source slice shape: 2 at dimension 0.")
    yield err((x, 0, i.reshape(1, 2), make_tensor((2, 4))), IndexError,
              r"index_copy_\(\): Index should have dimension 1 or 0 \(got 2\)")


def index_fill_samples(device, dtype):
    mk = maker(device, dtype)
    fill = True if dtype is torch.bool else 3 if not dtype.is_floating_point else 2.5
    yield SampleInput((mk(3, 4), 0, idx(0, 2, 0), fill))  # repeated positions fill once
    yield SampleInput((mk(3, 4), 1, idx(-1, 1), torch.tensor(fill, dtype=dtype)))
    # converted
    yield SampleInput((mk(3, 4, 5, noncontiguous=True), -1, torch.tensor(4), torch.tensor(1, dtype=torch.float64)))
    yield SampleInput((mk(3, 4), 0, torch.zeros(0, dtype=torch.int64), fill))
    yield SampleInput((mk(), 0, idx(0), fill))
    yield SampleInput((mk(0, 3), 1, idx(2), fill))
    if dtype is not torch.bool:
        yield SampleInput((mk(3, 4), 0, idx(1), 7.9))


def index_fill_errors(device):
    x = make_tensor((3, 4))
    yield err((x, 0, idx(0, 2), make_tensor((1,))), RuntimeError,
              r"index_fill_ only supports a 0-dimensional value tensor, but got tensor with 1 dimension\(s\).")
    yield err((x, 0, idx(0, 2).reshape(1, 2), 1.0), RuntimeError, "Index has to be a vector/scalar")
    yield err((x, 0, idx(0, 2, dtype=torch.int32), 1.0), IndexError,
              r"index_fill_\(\): Expected dtype int64 for index.")
    yield err((x, 2, idx(0), 1.0), IndexError,
              r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)")


def masked_fill_samples(device, dtype):
    mk = maker(device, dtype)
    fill = True if dtype is torch.bool else 3 if not dtype.is_floating_point else 2.5
    mask = lambda *shape: make_tensor(shape, dtype=torch.bool)  # noqa: E731
    yield SampleInput((mk(3, 4), mask(3, 4), fill))
    yield SampleInput((mk(3, 4), mask(4), torch.tensor(fill, dtype=dtype)))  # the mask broadcasts
    yield SampleInput((mk(4), mask(3, 4), fill))  # so does the input, out of place
    yield SampleInput((mk(3, 4, noncontiguous=True), mask(3, 1), torch.tensor(1, dtype=torch.float64)))
    yield SampleInput((mk(), mask(), fill))
    yield SampleInput((mk(0, 4), mask(4), fill))
    if dtype is not torch.bool:
        yield SampleInput((mk(3, 4), mask(3, 4), 7.9))
        yield SampleInput((mk(3, 4), mask(3, 4), True))


def masked_fill_errors(device):
    x = make_tensor((3, 4))
    yield err((x, make_tensor((3, 4)), 1.0), RuntimeError,
              "masked_fill_ only supports boolean masks, but got mask with dtype float")
    yield err((x, make_tensor((3, 4), dtype=torch.uint8), 1.0), RuntimeError,
              "masked_fill_ only supports boolean masks, but got mask with dtype unsigned char")
    yield err((x, make_tensor((2, 4), dtype=torch.bool), 1.0), RuntimeError,
              r"The size of tensor a \(2\) must match the size of tensor b \(3\) at non-singleton dimension 0")
    yield err((x, make_tensor((3, 4), dtype=torch.bool), make_tensor((1,))), RuntimeError,
              r"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with 1 dimension\(s\).")


def index_put_samples(device, dtype):
    mk = maker(device, dtype)
    for accumulate in (False, True):
        kw = {"accumulate": accumulate} if accumulate else {}
        rows = randidx((5,), 3) if accumulate else torch.randperm(3)[:2] - 1  # negative entries count from the end
        yield SampleInput((mk(3, 4), (rows,), mk(rows.numel(), 4)), kw)
        yield SampleInput((mk(3, 4), (rows,), mk(4)), kw)  # values broadcast
        yield SampleInput((mk(3, 4), [idx(0, 2), idx(3, -4)], mk()), kw)  # a list of indices, one value
        yield SampleInput((mk(3, 4, 5), (idx(0, 1).reshape(2, 1), idx(1, 3, 2)), mk(2, 3, 5)), kw)  # broadcast indices
        yield SampleInput((mk(3, 4, 5, noncontiguous=True), (idx(2, 0), idx(1, 0), idx(4, 4)), mk(2)), kw)
        yield SampleInput((mk(3, 4), (torch.zeros(0, dtype=torch.int64),), mk(0, 4)), kw)
        # one mask, one value: a where
        yield SampleInput((mk(3, 4), (make_tensor((3, 4), dtype=torch.bool),), mk()), kw)
        yield SampleInput((mk(3, 4), (idx(True, False, True, dtype=torch.bool),), mk(1)), kw)
    yield SampleInput((mk(3, 4), (idx(2, 1, dtype=torch.int32),), mk(2, 1)))
    # as many values as the mask has True entries: no decomposition, torch runs it (the shape is a's)
    yield SampleInput((mk(3, 4), (idx(True, False, True, dtype=torch.bool),), mk(2, 4)))


def index_put_errors(device):
    x = make_tensor((3, 4))
    yield err((x, (idx(0, 2),), make_tensor((2, 4), dtype=torch.float64)), RuntimeError,
              "Index put requires the source and destination dtypes match, got Float for the destination and "
              "Double for the source.")
    yield err((x, (idx(0, 2),), make_tensor((3, 4))), RuntimeError,
              r"shape mismatch: value tensor of shape \[3, 4\] cannot be broadcast to indexing "
              r"result of shape \[2, 4\]")
    # (torch's argument parser counts from self in the method, x.index_put, where self is not an argument)
    yield err((x, (None, idx(0, 2)), make_tensor((3, 2))), TypeError,
              "expected Tensor as element 0 in argument [01], but got NoneType")
    yield err((x, (idx(0, 2), idx(0, 2), idx(0)), make_tensor((2,))), IndexError,
              r"too many indices for tensor of dimension 2 \(got 3\)")
    yield err((x, (idx(0.0, 2.0, dtype=torch.float32),), make_tensor((2, 4))), IndexError,
              "tensors used as indices must be long, int, byte or bool tensors")
    yield err((x, (idx(0, 2), idx(0, 1, 2)), make_tensor((2,))), IndexError,
              r"shape mismatch: indexing tensors could not be broadcast together with shapes \[2\], \[3\]")
    yield err((x, (idx(True, False, dtype=torch.bool),), make_tensor(())), IndexError,
              r"The shape of the mask \[2\] at index 0 does not match the shape of the indexed "
              r"tensor \[3, 4\] at index 0")
    yield err((make_tensor(()), (torch.tensor(0),), make_tensor(())), IndexError,
              r"too many indices for tensor of dimension 0 \(got 1\)")


def take_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), randidx((5,), 12)))  # negative entries count from the end
    yield SampleInput((mk(3, 4, noncontiguous=True), randidx((2, 3), 12)))
    yield SampleInput((mk(3, 4), torch.tensor(-12)))
    yield SampleInput((mk(), idx(0, -1)))
    yield SampleInput((mk(0, 3), torch.zeros(0, 2, dtype=torch.int64)))


def take_errors(device):
    x = make_tensor((3, 4))
    yield err((x, idx(1, dtype=torch.int32)), RuntimeError, r"take\(\): Expected a long tensor for index, but got Int")
    yield err((x, idx(1.0, dtype=torch.float32)), RuntimeError,
              r"take\(\): Expected a long tensor for index, but got Float")
    yield err((make_tensor((0,)), idx(0)), IndexError, r"take\(\): tried to take from an empty tensor")
    # value checks, when the function runs: torch's take and the decomposition's index_select word them differently
    yield err((x, idx(12)), IndexError, "out of range")
    yield err((x, idx(-13)), IndexError, "out of range")


def put_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), torch.randperm(12)[:5] - 6, mk(5)))  # negative entries count from the end
    # duplicates sum; shapes may differ
    yield SampleInput((mk(3, 4), randidx((2, 3), 12), mk(3, 2)), {"accumulate": True})
    yield SampleInput((mk(3, 4, noncontiguous=True), torch.randperm(12)[:4].reshape(2, 2), mk(4, noncontiguous=True)))
    yield SampleInput((mk(), idx(0), mk()))
    yield SampleInput((mk(3, 4), torch.zeros(0, dtype=torch.int64), mk(0)))


def put_errors(device):
    x = make_tensor((3, 4))
    yield err((x, idx(0, -1), make_tensor((3,))), IndexError,
              r"put_\(\): Expected source and index to have the same number of elements, but got source.numel\(\) = "
              r"3, index.numel\(\) = 2")
    yield err((x, idx(0, -1), make_tensor((2,), dtype=torch.int64)), RuntimeError,
              r"put_\(\): self and source expected to have the same dtype, but got self.dtype = Float "
              r"and source.dtype = Long")
    yield err((x, idx(0, 1, dtype=torch.int32), make_tensor((2,))), RuntimeError,
              r"put_\(\): Expected a long tensor for index, but got Int")
    yield err((make_tensor((0,)), idx(0), make_tensor((1,))), IndexError,
              r"put_\(\): Tried to put elements into an empty tensor")


def functional_setitem(a, key, value):
    """`a[key] = value` on a copy: torch's setitem on tensors, index_put_key on proxies."""
    if isinstance(a, torch.Tensor):
        a = a.clone()
        a[key] = value
        return a
    return index_put_key(a, key, value)


def index_put_key_samples(device, dtype):
    """`a[key] = value` keys: basic, advanced and mixed (unique positions), values broadcast."""
    mk = maker(device, dtype)
    x = lambda: mk(3, 4, 5)  # noqa: E731
    fill = True if dtype is torch.bool else 3 if not dtype.is_floating_point else 2.5
    yield SampleInput((x(), 1, mk(4, 5)))
    yield SampleInput((x(), (ALL_SLICE, 2), fill))
    yield SampleInput((x(), (0, slice(1, 4, 2)), mk(2, 5)))
    yield SampleInput((x(), (idx(0, 2), ALL_SLICE, idx(1, -1)), mk(2, 4)))  # separated: the index shape moves first
    yield SampleInput((x(), (ALL_SLICE, idx(0, 2), idx(1, -1)), mk(1, 3, 2)))  # leading 1s of value are dropped
    yield SampleInput((x(), (Ellipsis, None, 2), mk(3, 4, 1)))
    yield SampleInput((x(), (idx(0, 2).reshape(2, 1), idx(1, 3)), mk(5)))
    yield SampleInput((x(), [0, 2], fill))
    yield SampleInput((x(), (1, 2), torch.tensor(1.5)))  # basic indices convert the value
    yield SampleInput((x(), make_tensor((3, 4, 5), dtype=torch.bool), fill))  # a mask and one value: a where
    yield SampleInput((mk(3, 4, noncontiguous=True), (slice(1, None), idx(3, 0)), mk(2, 2)))
    yield SampleInput((mk(), Ellipsis, mk()))
    yield SampleInput((mk(0, 3), (ALL_SLICE, 1), fill))


def index_put_key_errors(device):
    x = make_tensor((3, 4))
    yield err((x, idx(0, 2), make_tensor((4,), dtype=torch.float64)), RuntimeError,
              "Index put requires the source and destination dtypes match, got Float for the destination and "
              "Double for the source.")
    # a basic key: torch copies into the view, so its copy_ wording
    yield err((x, 0, make_tensor((3,))), RuntimeError,
              r"The expanded size of the tensor \(4\) must match the existing size \(3\)")
    yield err((x, 3, 1.0), IndexError, "index 3 is out of bounds for dimension 0 with size 3")


# torch's index_put(accumulate=True) rounds after every add in half types; scatter_add accumulates
# duplicates in float32 and rounds once: a few ulps apart where duplicates sum, the sum nearer exact
HALF_ACCUMULATION = {torch.bfloat16: (6e-2, 1.6e-2), torch.float16: (8e-3, 2e-3)}

opinfos += [
    OpInfo("scatter", torch.scatter, scatter_samples, ALL, scatter_errors),
    OpInfo("scatter.value", torch.scatter, scatter_value_samples, ALL),
    OpInfo("scatter.reduce", torch.scatter, scatter_reduce_samples, (torch.float32, torch.float64, torch.int64)),
    OpInfo("scatter.method", method("scatter"), scatter_samples, SOME, scatter_errors),
    *function_and_method("scatter_add", scatter_add_samples, scatter_add_errors),
    *function_and_method("index_add", index_add_samples, index_add_errors),
    *function_and_method("index_copy", index_copy_samples, index_copy_errors),
    *function_and_method("index_fill", index_fill_samples, index_fill_errors),
    *function_and_method("masked_fill", masked_fill_samples, masked_fill_errors),
    OpInfo("index_put", torch.index_put, index_put_samples, ALL, index_put_errors, dtype_tolerances=HALF_ACCUMULATION),
    OpInfo("index_put.method", method("index_put"), index_put_samples, SOME, index_put_errors),
    # a[key] = value, functionally: the write in-place indexing assignment is built on
    OpInfo("index_put_key", functional_setitem, index_put_key_samples, ALL, index_put_key_errors),
    *function_and_method("take", take_samples, take_errors),
    *function_and_method("put", put_samples, put_errors),
]


# -- view scatters -------------------------------------------------------------------------
def slice_scatter_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), mk(3, 2), 1, 1, 3))
    yield SampleInput((mk(3, 4), mk(3, 2), 1, 1, 4, 2))
    yield SampleInput((mk(3, 4), mk(3, 2), -1, -3, -1))
    yield SampleInput((mk(3, 4), mk(3, 4)), {"dim": 1})
    yield SampleInput((mk(3, 4), mk(2, 4)), {"start": 1})
    yield SampleInput((mk(3, 4), mk(3, 0), 1, 5, 9))
    yield SampleInput((mk(3, 4, 5, noncontiguous=True), mk(3, 2, 5, noncontiguous=True), 1, None, None, 2))
    yield SampleInput((mk(3, 4), make_tensor((3, 2), dtype=torch.float64), 1, 1, 3))  # src is converted


def slice_scatter_errors(device):
    x = make_tensor((3, 4))
    yield err((x, make_tensor((3, 3)), 1, 1, 3), RuntimeError,
              r"expected src to have a size equal to the slice of self. src size = \[3, 3\], slice size = \[3, 2\]")
    yield err((x, make_tensor((3, 4)), 2), IndexError,
              r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)")
    yield err((x, make_tensor((3, 2)), 1, 1, 3, 0), RuntimeError, "slice step must be positive")


def select_scatter_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), mk(4), 0, 1))
    yield SampleInput((mk(3, 4), mk(3), 1, -1))
    yield SampleInput((mk(3, 4, 5, noncontiguous=True), mk(3, 4), -1, 2))
    yield SampleInput((mk(3), mk(), 0, 2))
    yield SampleInput((mk(3, 0), mk(0), 0, 1))
    yield SampleInput((mk(3, 4), make_tensor((4,), dtype=torch.int64), 0, 1))


def select_scatter_errors(device):
    x = make_tensor((3, 4))
    yield err((x, make_tensor((4,)), 0, 3), IndexError,
              r"select\(\): index 3 out of range for tensor of size \[3, 4\] at dimension 0")
    yield err((x, make_tensor((3,)), 0, 1), RuntimeError,
              r"expected src to have a size equal to the slice of self. src size = \[3\], slice size = \[4\]")


def diagonal_scatter_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), mk(3)))
    yield SampleInput((mk(3, 4), mk(3), 1))
    yield SampleInput((mk(3, 4), mk(2), -1))
    yield SampleInput((mk(2, 3, 4, noncontiguous=True), mk(3, 2), 0, 0, 2))
    yield SampleInput((mk(3, 4), mk(0), 5))
    yield SampleInput((mk(3, 4), make_tensor((3,), dtype=torch.float64)))


def diagonal_scatter_errors(device):
    x = make_tensor((3, 4))
    yield err((x, make_tensor((2,)), 1), RuntimeError,
              r"expected src to have a size equal to the slice of self. src size = \[2\], slice size = \[3\]")
    yield err((x, make_tensor((3,)), 0, 0, 0), RuntimeError, "diagonal dimensions cannot be identical 0, 0")


opinfos += [
    *function_and_method("slice_scatter", slice_scatter_samples, slice_scatter_errors),
    OpInfo("select_scatter", torch.select_scatter, select_scatter_samples, ALL, select_scatter_errors),
    OpInfo("diagonal_scatter", torch.diagonal_scatter, diagonal_scatter_samples, ALL, diagonal_scatter_errors),
]


def scatter_reduce_samples(device, dtype):
    mk = maker(device, dtype)
    reductions = ("sum", "amax") if dtype is torch.bool else ("sum", "mean", "prod", "amax", "amin")
    for reduce in reductions:  # prod, amax and amin run as opaque torch ops (no prims for them)
        for include_self in (True, False):
            yield SampleInput((mk(3, 4), 0, randidx((5, 4), 3, low=0), mk(5, 4), reduce),
                              {"include_self": include_self})
    yield SampleInput((mk(3, 4, 5, noncontiguous=True), -1, randidx((3, 2, 6), 5, low=0), mk(3, 4, 7), "sum"))
    yield SampleInput((mk(3, 4), 1, torch.zeros(3, 0, dtype=torch.int64), mk(3, 0), "sum"))
    yield SampleInput((mk(), 0, torch.tensor(0), mk(), "sum"))


def scatter_reduce_errors(device):
    x = make_tensor((3, 4))
    i = idx(0, 1, 2, 0).reshape(1, 4)
    yield err((x, 0, i, make_tensor((1, 4)), "foo"), RuntimeError,
              "reduce argument must be either sum, prod, mean, amax or amin, got foo")
    yield err((x, 0, i, make_tensor((1, 4), dtype=torch.float64), "sum"), RuntimeError,
              r"scatter\(\): Expected self.dtype to be equal to src.dtype")
    yield err((make_tensor((3, 4), dtype=torch.bool), 0, i, make_tensor((1, 4), dtype=torch.bool), "mean"),
              NotImplementedError, "\"scatter_gather_tensor_cpu_reduce_mean\" not implemented for 'Bool'")


opinfos += [
    *function_and_method("scatter_reduce", scatter_reduce_samples, scatter_reduce_errors),
]


# -- combinations ------------------------------------------------------------------------------
def combinations_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(4),))
    yield SampleInput((mk(4),), {"r": 3, "with_replacement": True})
    yield SampleInput((mk(5, noncontiguous=True),), {"r": 1})
    yield SampleInput((mk(1),), {"r": 2}, name="fewer elements than r: empty")
    yield SampleInput((mk(0),))
    yield SampleInput((mk(4),), {"r": 0})


def combinations_errors(device):
    yield err((make_tensor((2, 2)),), RuntimeError, r"Expect a 1D vector, but got shape \[2, 2\]")
    yield err((make_tensor((3,)), -1), RuntimeError, "Expect a non-negative number, but got -1")


opinfos.append(OpInfo("combinations", torch.combinations, combinations_samples, ALL, combinations_errors))
