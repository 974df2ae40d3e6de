"""OpInfos for the functional forms behind in-place operations (thunderfn.torch.inplace)."""
import torch

from thunderfn.testing.opinfo import ALL, ErrorInput, OpInfo, SampleInput, make_tensor
from thunderfn.torch.inplace import setitem_copy


def setitem_samples(device, dtype):
    def mk(*shape, **kw):
        return make_tensor(shape, device=device, dtype=dtype, **kw)

    index = torch.tensor([2, 0], device=device)
    yield SampleInput((mk(3, 4), 0, mk(4)), name="int key")
    yield SampleInput((mk(3, 4), -1, mk(1)), name="negative int, broadcast value")
    yield SampleInput((mk(3, 4), (slice(None), slice(1, None, 2)), mk(3, 2)), name="strided slice")
    yield SampleInput((mk(3, 4, noncontiguous=True), (Ellipsis, 0), mk(3)), name="ellipsis")
    yield SampleInput((mk(3, 4), (slice(0, 0),), mk(0, 4)), name="empty region")
    yield SampleInput((mk(3, 4), index, mk(2, 4)), name="tensor index")
    yield SampleInput((mk(3, 4), (index, 1), mk(2)), name="tensor and int")
    yield SampleInput((mk(3, 4), (slice(None), index), mk(3, 2)), name="tensor after slice")
    yield SampleInput((mk(), (), mk()), name="0-dim")
    if dtype.is_floating_point:
        yield SampleInput((mk(3, 4), 1, 2.5), name="python scalar value")


def setitem_errors(device):
    x = make_tensor((3, 4), device=device)
    yield ErrorInput(SampleInput((x, 5, make_tensor((4,), device=device))), IndexError,
                     "index 5 is out of bounds for dimension 0 with size 3")
    yield ErrorInput(SampleInput((x, 0, make_tensor((3,), device=device))), RuntimeError,
                     r"The expanded size of the tensor \(4\) must match the existing size \(3\)")


opinfos: list[OpInfo] = [
    OpInfo("setitem", setitem_copy, setitem_samples, ALL, setitem_errors),
]
