"""OpInfos for thunderfn.torch.shape: layout, joining and splitting, conversions, and the
Tensor properties and methods aliased to them (x.T, x.mT, x.float(), x.cpu(), ...).

An OpInfo is named after the torch-language symbol it covers; other spellings of the same
symbol are `<symbol>.<spelling>` (`transpose.swapaxes`); aliases without a symbol of
their own are named as a user writes them (`Tensor.T`, `Tensor.float`).
"""
from __future__ import annotations

import torch

from thunderfn.errors import UnsupportedOpError
from thunderfn.testing.opinfo import ALL, ErrorInput, OpInfo, SampleInput, make_tensor

CPU = torch.device("cpu")
SOME = (torch.float32, torch.int64, torch.bool)  # for extra spellings of an op already covered on ALL


def method(name):
    """`x.<name>(*args, **kwargs)`, as users call methods; `__wrapped__` names the Tensor method
    (inspect.unwrap finds it)."""
    def call(a, *args, **kwargs):
        return getattr(a, name)(*args, **kwargs)
    call.__name__ = f"Tensor_{name}"
    call.__wrapped__ = getattr(torch.Tensor, name)
    return call


def function_and_method(name, samples, errors=None):
    """The OpInfos of an op users call both ways, with the same samples: `torch.<name>` on
    ALL dtypes and `x.<name>(...)` on SOME (the method shares the function's kernel)."""
    return (OpInfo(name, getattr(torch, name), samples, ALL, errors),
            OpInfo(f"{name}.method", method(name), samples, SOME, errors))


def attribute(name):
    def get(a):
        return getattr(a, name)
    get.__name__ = f"Tensor_{name}"
    return get


def maker(device, dtype):
    def mk(*shape, noncontiguous=False, dtype=dtype):
        return make_tensor(shape, device=device, dtype=dtype, noncontiguous=noncontiguous)
    return mk


def err(args, exc, match, kwargs=None, torch_raises=True):
    return ErrorInput(SampleInput(tuple(args), kwargs or {}), exc, match, torch_raises)


def x234():
    return make_tensor((2, 3, 4))


# -- reshape family ------------------------------------------------------------------------
def reshape_samples(device, dtype):
    mk = maker(device, dtype)
    for shape, new in [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), (4, -1, 2)), ((2, 3, 4), (2, 3, 4)),
                       ((), (1, 1)), ((), ()), ((), (-1,)), ((1, 1), ()), ((0, 3), (3, 0)), ((0, 3), (-1, 3)),
                       ((5,), (5, 1))]:
        yield SampleInput((mk(*shape), new))
    yield SampleInput((mk(4, 6, noncontiguous=True), [2, 12]))
    yield SampleInput((mk(3, 4).T, (-1,)))  # a transpose cannot be viewed flat: reshape copies


def reshape_method_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4), 6, -1))
    yield SampleInput((mk(2, 3, 4), (3, 8)))
    yield SampleInput((mk(), ()))
    yield SampleInput((mk(3, 4).mT, 12))


def reshape_errors(device):
    x = x234()
    yield err((x, (5, 5)), RuntimeError, r"shape '\[5, 5\]' is invalid for input of size 24")
    yield err((x, (-1, -1)), RuntimeError, "only one dimension can be inferred")
    yield err((x, (-2, 12)), RuntimeError, r"invalid shape dimension -2 at index 0 of shape \[-2, 12\]")
    yield err((x, (2, -1, 0)), RuntimeError, r"shape '\[2, -1, 0\]' is invalid for input of size 24")
    yield err((make_tensor((0, 3)), (-1, 0)), RuntimeError,
              r"cannot reshape tensor of 0 elements into shape \[-1, 0\] because the unspecified dimension "
              r"size -1 can be any value")


def view_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4), 6, 4))
    yield SampleInput((mk(2, 3, 4), (-1,)))
    yield SampleInput((mk(2, 3, 4), [4, -1]))
    yield SampleInput((mk(), 1))
    yield SampleInput((mk(0, 4), 4, 0))
    yield SampleInput((mk(4, 6, noncontiguous=True), 2, 2, 6))  # splits the strided dim: a valid view


def view_errors(device):
    x = x234()
    yield err((x, 5, 5), RuntimeError, r"shape '\[5, 5\]' is invalid for input of size 24")
    yield err((x, torch.int32), UnsupportedOpError, r"view\(dtype\) reinterprets bits", torch_raises=False)


def view_as_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4), mk(6, 4)))
    yield SampleInput((mk(1), mk()))
    yield SampleInput((mk(0, 2), mk(2, 0, 3)))
    yield SampleInput((mk(2, 3), make_tensor((3, 2), dtype=torch.float64)))  # only other's shape matters


def reshape_as_samples(device, dtype):
    yield from view_as_samples(device, dtype)
    yield SampleInput((maker(device, dtype)(3, 4).T, make_tensor((12,))))


def as_errors(device):
    yield err((x234(), make_tensor((5,))), RuntimeError, r"shape '\[5\]' is invalid for input of size 24")


# -- permutations --------------------------------------------------------------------------
def permute_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4), (2, 0, 1)))
    yield SampleInput((mk(2, 3, 4), [-1, -3, 1]))
    yield SampleInput((mk(2, 3, 4, noncontiguous=True), (0, 1, 2)))
    yield SampleInput((mk(), ()))
    yield SampleInput((mk(0, 3), (1, 0)))


def permute_method_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4), 1, 2, 0))
    yield SampleInput((mk(2, 3, 4), (2, 1, 0)))
    yield SampleInput((mk(5), -1))


def permute_errors(device):
    x = x234()
    yield err((x, (0, 1)), RuntimeError,
              r"number of dimensions in the tensor input does not match the length of the desired ordering of "
              r"dimensions i.e. input.dim\(\) = 3 is not equal to len\(dims\) = 2")
    yield err((x, (0, 1, 1)), RuntimeError, r"permute\(\): duplicate dims are not allowed")
    yield err((x, (0, 1, -2)), RuntimeError, r"permute\(\): duplicate dims are not allowed")
    yield err((x, (0, 1, 3)), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")


def transpose_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4), 0, 2))
    yield SampleInput((mk(2, 3, 4), -1, 1))
    yield SampleInput((mk(2, 3, 4, noncontiguous=True), 1, 1))
    yield SampleInput((mk(3), 0, -1))
    yield SampleInput((mk(), 0, -1))
    yield SampleInput((mk(0, 2), 0, 1))


def transpose_errors(device):
    yield err((x234(), 0, 3), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    yield err((make_tensor(()), 0, 1), IndexError,
              r"Dimension out of range \(expected to be in range of \[-1, 0\], but got 1\)")


def t_samples(device, dtype):
    mk = maker(device, dtype)
    for shape in [(2, 3), (3,), (), (0, 4)]:
        yield SampleInput((mk(*shape),))
    yield SampleInput((mk(3, 2, noncontiguous=True),))


def t_errors(device):
    yield err((x234(),), RuntimeError, r"t\(\) expects a tensor with <= 2 dimensions, but self is 3D")


def T_samples(device, dtype):
    mk = maker(device, dtype)
    for shape in [(2, 3), (3,), (), (0, 4), (2, 3, 4)]:  # x.T of a 3-D tensor reverses its dims (deprecated, allowed)
        yield SampleInput((mk(*shape),))


def mT_samples(device, dtype):
    mk = maker(device, dtype)
    for shape in [(2, 3), (4, 2, 3), (2, 1, 0, 3), ()]:  # the identity on 0-D tensors
        yield SampleInput((mk(*shape),))
    yield SampleInput((mk(2, 3, 4, noncontiguous=True),))


def mT_errors(name):
    def errors(device):
        yield err((make_tensor((3,)),), RuntimeError,
                  rf"tensor.{name} is only supported on matrices or batches of matrices. Got 1-D tensor.")
    return errors


def conjugating_errors(device):
    yield from mT_errors("mH")(device)
    yield err((make_tensor((2, 2), dtype=torch.complex64),), UnsupportedOpError, "conjugates complex tensors",
              torch_raises=False)


def H_samples(device, dtype):
    mk = maker(device, dtype)
    for shape in [(2, 3), (0, 3), ()]:
        yield SampleInput((mk(*shape),))


def H_errors(device):
    yield err((x234(),), RuntimeError, r"tensor.H is only supported on matrices \(2-D tensors\). Got 3-D tensor. For "
                                       r"batches of matrices, consider using tensor.mH")
    yield err((make_tensor((3,)),), RuntimeError,
              r"tensor.H is only supported on matrices \(2-D tensors\). Got 1-D tensor.")
    yield err((make_tensor((2, 2), dtype=torch.complex64),), UnsupportedOpError, "conjugates complex tensors",
              torch_raises=False)


def movedim_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4), 0, 2))
    yield SampleInput((mk(2, 3, 4), -1, 0))
    yield SampleInput((mk(2, 3, 4), (0, 1), (2, 0)))
    yield SampleInput((mk(2, 3, 4, 5), [3, -4], [0, 1]))
    yield SampleInput((mk(2, 3, 4, noncontiguous=True), (), ()))
    yield SampleInput((mk(), 0, -1))
    yield SampleInput((mk(0, 3), 1, 0))


def movedim_errors(device):
    x = x234()
    yield err((x, (0, 1), (2,)), RuntimeError, r"movedim: Invalid source or destination dims: source \(\[0, 1\] dims\) "
                                               r"should contain the same number of dims as destination \(\[2\] dims\)")
    yield err((x, (0, 0), (1, 2)), RuntimeError, r"movedim: repeated dim in `source` \(\[0, 0\]\)")
    yield err((x, (0, 1), (2, -1)), RuntimeError, r"movedim: repeated dim in `destination` \(\[2, -1\]\)")
    yield err((x, 3, 0), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")


# -- adding and removing dims --------------------------------------------------------------
def squeeze_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(1, 3, 1, 2),))
    yield SampleInput((mk(1, 3, 1, 2), 2))
    yield SampleInput((mk(1, 3, 1, 2), -4))
    yield SampleInput((mk(1, 3, 1, 2), 1))  # not size 1: unchanged
    yield SampleInput((mk(1, 3, 1, 2), (0, -2, 1)))
    yield SampleInput((mk(1, 3, 1, 2), ()))  # torch: an empty dim list squeezes nothing
    yield SampleInput((mk(),))
    yield SampleInput((mk(), 0))
    yield SampleInput((mk(), -1))
    yield SampleInput((mk(0, 1, 2),))
    yield SampleInput((mk(2, 1, 3, noncontiguous=True), 1))


def squeeze_errors(device):
    x = x234()
    yield err((x, 3), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    yield err((x, (0, 0)), RuntimeError, "dim 0 appears multiple times in the list of dims")
    yield err((make_tensor(()), 1), IndexError,
              r"Dimension out of range \(expected to be in range of \[-1, 0\], but got 1\)")


def unsqueeze_samples(device, dtype):
    mk = maker(device, dtype)
    for d in (0, 2, 3, -1, -4):
        yield SampleInput((mk(2, 3, 4), d))
    yield SampleInput((mk(), 0))
    yield SampleInput((mk(), -1))
    yield SampleInput((mk(0, 3), 1))
    yield SampleInput((mk(3, 4, noncontiguous=True), 1))


def unsqueeze_errors(device):
    yield err((x234(), 4), IndexError, r"Dimension out of range \(expected to be in range of \[-4, 3\], but got 4\)")
    yield err((x234(), -5), IndexError, r"Dimension out of range \(expected to be in range of \[-4, 3\], but got -5\)")


def expand_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 1, 4), 2, 3, 4))
    yield SampleInput((mk(2, 1, 4), (5, -1, 3, -1)))
    yield SampleInput((mk(2, 1, 4), [2, 1, 4]))
    yield SampleInput((mk(), 3, 2))
    yield SampleInput((mk(), ()))
    yield SampleInput((mk(1, 3), 0, 3))  # a size-1 dim may expand to 0
    yield SampleInput((mk(3, 1, noncontiguous=True), 3, 5))


def expand_errors(device):
    x = x234()
    yield err((x, 3, 4), RuntimeError,
              r"expand\(torch.FloatTensor\{\[2, 3, 4\]\}, size=\[3, 4\]\): the number of sizes provided \(2\) must be "
              r"greater or equal to the number of dimensions in the tensor \(3\)")
    yield err((make_tensor((2, 3), dtype=torch.int64), 3), RuntimeError,
              r"expand\(torch.LongTensor\{\[2, 3\]\}, size=\[3\]\)")
    yield err((x, 2, 5, 4), RuntimeError,
              r"The expanded size of the tensor \(5\) must match the existing size \(3\) at non-singleton dimension "
              r"1.  Target sizes: \[2, 5, 4\].  Tensor sizes: \[2, 3, 4\]")
    yield err((x, -1, 2, 3, 4), RuntimeError,
              r"The expanded size of the tensor \(-1\) isn't allowed in a leading, non-existing dimension 0")


def expand_as_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 1, 4), mk(2, 3, 4)))
    yield SampleInput((mk(), make_tensor((2, 2), dtype=torch.float64)))
    yield SampleInput((mk(3, 1, noncontiguous=True), mk(2, 3, 0)))


def expand_as_errors(device):
    yield err((x234(), make_tensor((3, 4))), RuntimeError,
              r"expand\(torch.FloatTensor\{\[2, 3, 4\]\}, size=\[3, 4\]\): the number of sizes provided \(2\)")
    yield err((x234(), make_tensor((2, 5, 4))), RuntimeError,
              r"The expanded size of the tensor \(5\) must match the existing size \(3\)")


def broadcast_to_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 1), (2, 3, 4)))
    yield SampleInput((mk(3, 1), [-1, 5]))
    yield SampleInput((mk(), (2,)))
    yield SampleInput((mk(1, 0), (3, 0)))
    yield SampleInput((mk(), ()))


def broadcast_to_errors(device):
    yield err((x234(), (2, 5, 4)), RuntimeError,
              r"The expanded size of the tensor \(5\) must match the existing size \(3\) at non-singleton dimension 1")
    yield err((x234(), (3, 4)), RuntimeError, r"the number of sizes provided \(2\) must be greater or equal to the "
                                              r"number of dimensions in the tensor \(3\)")


# -- joining -------------------------------------------------------------------------------
def cat_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput(([mk(2, 3), mk(4, 3)],))
    yield SampleInput(((mk(2, 3), mk(2, 1), mk(2, 2, noncontiguous=True)), 1))
    yield SampleInput(([mk(2, 3, 4), mk(2, 3, 2)], -1))
    yield SampleInput(([mk(2, 3)], 0))
    yield SampleInput(([mk(0, 3), mk(2, 3), mk(0, 3)], 0))
    yield SampleInput(([mk(2, 3), mk(0)], 1))  # legacy: 1-D empty tensors are skipped whatever their shape
    yield SampleInput(([mk(0), mk(0)],))
    yield SampleInput(([mk(2, 2), make_tensor((2, 2), dtype=torch.int32)], 1))  # promotes
    yield SampleInput(([mk(2), make_tensor((3,), dtype=torch.float64)],))
    yield SampleInput(([mk(2, 3), mk(2, 3)],), {"dim": 1})


def cat_errors(device):
    x = x234()
    yield err(([x, make_tensor((2, 4, 4))],), RuntimeError,
              r"Sizes of tensors must match except in dimension 0. Expected size 3 but got size 4 for tensor "
              r"number 1 in the list.")
    yield err(([x, make_tensor((3, 4))],), RuntimeError, "Tensors must have same number of dimensions: got 3 and 2")
    yield err(([make_tensor(()), make_tensor(())],), RuntimeError,
              r"zero-dimensional tensor \(at position 0\) cannot be concatenated")
    yield err(([],), ValueError, r"torch.cat\(\): expected a non-empty list of Tensors")
    yield err(([x, x], 3), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    yield err(([x, 1],), TypeError, "expected Tensor as element 1 in argument 0, but got int")
    yield err((x,), TypeError, r"cat\(\): argument 'tensors' \(position 1\) must be tuple of Tensors, not Tensor")


def stack_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput(([mk(2, 3), mk(2, 3)],))
    yield SampleInput(((mk(2, 3), mk(2, 3, noncontiguous=True), mk(2, 3)), 2))
    yield SampleInput(([mk(2, 3), mk(2, 3)], -1))
    yield SampleInput(([mk(2, 3), mk(2, 3)], -3))
    yield SampleInput(([mk(), mk()],))
    yield SampleInput(([mk(0, 3)], 1))
    yield SampleInput(([mk(3), make_tensor((3,), dtype=torch.float64)],))


def stack_errors(device):
    yield err(([x234(), make_tensor((2, 3, 5))],), RuntimeError,
              r"stack expects each tensor to be equal size, but got \[2, 3, 4\] at entry 0 and \[2, 3, 5\] at entry 1")
    yield err(([],), RuntimeError, "stack expects a non-empty TensorList")
    yield err(([x234(), x234()], 4), IndexError,
              r"Dimension out of range \(expected to be in range of \[-4, 3\], but got 4\)")


def hstack_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput(([mk(), mk()],))
    yield SampleInput(([mk(), mk(3)],))
    yield SampleInput(([mk(2), mk(3), mk(0)],))
    yield SampleInput(([mk(2, 3), mk(2, 1, noncontiguous=True)],))
    yield SampleInput(((mk(2, 1, 3), mk(2, 2, 3)),))


def vstack_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput(([mk(), mk()],))
    yield SampleInput(([mk(3), mk(3)],))
    yield SampleInput(([mk(3), mk(2, 3, noncontiguous=True)],))
    yield SampleInput(((mk(1, 2, 3), mk(2, 2, 3)),))


def column_stack_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput(([mk(), mk(1)],))
    yield SampleInput(([mk(3), mk(3, 2, noncontiguous=True)],))
    yield SampleInput(((mk(2, 2), mk(2)),))


def chunk_cat_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput(([mk(2, 5, 3), mk(2, 4, noncontiguous=True)], 1, 3))  # padded to a multiple of 3
    yield SampleInput(([mk(4, 3), mk(4, 6)], -1, 2))
    yield SampleInput(([mk(7)], 0, 7))


def chunk_cat_errors(device):
    yield err(([make_tensor((2, 3))], 0, 0), RuntimeError, "_chunk_cat expects positive num_chunks")
    yield err(([make_tensor((2, 3)), make_tensor((3, 3))], 1, 2), RuntimeError,
              "_chunk_cat expects same sizes of 0,...,dim-1 dimensions for all tensors")
    yield err(([make_tensor((2, 3)), make_tensor((2,))], -1, 2), RuntimeError,
              "_chunk_cat expects non-negative dim when input tensors have different ndims")


def xstack_errors(name):
    def errors(device):
        yield err(([],), RuntimeError, f"{name} expects a non-empty TensorList")
        yield err(([make_tensor((2, 3)), make_tensor((3, 4))],), RuntimeError,
                  "Sizes of tensors must match except in dimension")
    return errors


# -- splitting -----------------------------------------------------------------------------
def split_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(5, 3), 2))
    yield SampleInput((mk(5, 3), 5))
    yield SampleInput((mk(5, 3), 10))
    yield SampleInput((mk(4, 6), [1, 0, 5], -1))
    yield SampleInput((mk(4, 6), (4,)))
    yield SampleInput((mk(0, 3), 2))
    yield SampleInput((mk(0, 3), 0))
    yield SampleInput((mk(0, 3), [0, 0]))
    yield SampleInput((mk(4, 6, noncontiguous=True), 4, 1))


def split_method_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(5, 3), 2))
    yield SampleInput((mk(5, 3), [2, 3]), {"dim": 0})
    yield SampleInput((mk(5, 3), 1, -1))


def split_errors(device):
    x = x234()
    yield err((x, -1), RuntimeError, "split expects split_size be non-negative, but got split_size=-1")
    yield err((x, 0), RuntimeError, "split_size can only be 0 if dimension size is 0, but got dimension size of 2")
    yield err((x, [1, 1], 1), RuntimeError, r"split_with_sizes expects split_sizes to sum exactly to 3 \(input "
                                            r"tensor's size at dimension 1\), but got split_sizes=\[1, 1\]")
    yield err((x, [1, -1, 4], -1), RuntimeError,
              r"split_with_sizes expects split_sizes have only non-negative entries, but got split_sizes=\[1, -1, 4\]")
    yield err((x, 1, 3), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    yield err((make_tensor(()), 1), RuntimeError, "split expects at least a 1-dimensional tensor")


def chunk_samples(device, dtype):
    mk = maker(device, dtype)
    for n, chunks in [(6, 4), (6, 5), (5, 3), (3, 10), (6, 1), (0, 3)]:
        yield SampleInput((mk(n, 2), chunks))
    yield SampleInput((mk(2, 7, noncontiguous=True), 3, -1))


def chunk_errors(device):
    yield err((x234(), 0), RuntimeError, "chunk expects `chunks` to be greater than 0, got: 0")
    yield err((x234(), 2, -4), IndexError,
              r"Dimension out of range \(expected to be in range of \[-3, 2\], but got -4\)")
    yield err((make_tensor(()), 1), RuntimeError, "chunk expects at least a 1-dimensional tensor")


def unbind_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 2),))
    yield SampleInput((mk(3, 2, 4), -1))
    yield SampleInput((mk(3, 2, noncontiguous=True), 1))
    yield SampleInput((mk(1),))
    yield SampleInput((mk(0, 2),))
    yield SampleInput((mk(2, 0), 0))


def unbind_errors(device):
    yield err((make_tensor(()),), IndexError, "Dimension specified as 0 but tensor has no dimensions")
    yield err((x234(), 3), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")


def narrow_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(4, 5), 0, 1, 2))
    yield SampleInput((mk(4, 5), -1, -3, 2))
    yield SampleInput((mk(4, 5), 1, 5, 0))
    yield SampleInput((mk(4, 5), 1, -5, 5))
    yield SampleInput((mk(0, 5), 1, 2, 3))
    yield SampleInput((mk(4, 5, noncontiguous=True), 1, 1, 3))
    yield SampleInput((mk(4, 5), 1, torch.tensor(2, device=device), 3), name="tensor start")
    yield SampleInput((mk(4, 5), 0, torch.tensor(-3, device=device), 2), name="negative tensor start")


def narrow_errors(device):
    x = x234()
    yield err((x, 1, 2, 2), RuntimeError, r"start \(2\) \+ length \(2\) exceeds dimension size \(3\).")
    yield err((x, 1, -4, 1), IndexError, r"start out of range \(expected to be in range of \[-3, 3\], but got -4\)")
    yield err((x, 1, 0, -1), RuntimeError, r"narrow\(\): length must be non-negative.")
    yield err((make_tensor(()), 0, 0, 1), RuntimeError, r"narrow\(\) cannot be applied to a 0-dim tensor.")
    yield err((x, 3, 0, 1), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    # a tensor start must be 0-dim and integral, as torch requires
    yield err((x, 0, torch.tensor(1.5), 1), RuntimeError, "start must be an 0-dim integral Tensor")


def flatten_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4),))
    yield SampleInput((mk(2, 3, 4), 1))
    yield SampleInput((mk(2, 3, 4, 5), 1, -2))
    yield SampleInput((mk(2, 3, 4), -1, -1))
    yield SampleInput((mk(),))
    yield SampleInput((mk(), 0, -1))
    yield SampleInput((mk(2, 0, 3), 0, 1))
    yield SampleInput((mk(3, 4).T,))


def flatten_errors(device):
    yield err((x234(), 2, 0), RuntimeError, r"flatten\(\) has invalid args: start_dim cannot come after end_dim")
    yield err((x234(), 0, 3), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    yield err((make_tensor(()), 1), IndexError,
              r"Dimension out of range \(expected to be in range of \[-1, 0\], but got 1\)")


def unflatten_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 12), 1, (3, 4)))
    yield SampleInput((mk(2, 12), -1, [2, -1, 2]))
    yield SampleInput((mk(6), 0, (6,)))
    yield SampleInput((mk(6, 2, noncontiguous=True), 0, (1, 6, 1)))
    yield SampleInput((mk(0, 4), 0, (0, 5)))


def unflatten_errors(device):
    x = x234()
    yield err((x, 1, (2, 2)), RuntimeError,
              r"unflatten: Provided sizes \[2, 2\] don't multiply up to the size of dim 1 \(3\) in the input tensor")
    yield err((x, 2, (-1, -1)), RuntimeError, "only one dimension can be inferred")
    yield err((x, 2, ()), RuntimeError, "unflatten: sizes must be non-empty")
    yield err((make_tensor(()), 0, (1,)), RuntimeError, "Dimension specified as 0 but tensor has no dimensions")


def flip_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4), (0,)))
    yield SampleInput((mk(2, 3, 4), [-1, 0]))
    yield SampleInput((mk(2, 3, 4), ()))
    yield SampleInput((mk(2, 3, 4, noncontiguous=True), (0, 1, 2)))
    yield SampleInput((mk(), (0,)))
    yield SampleInput((mk(0, 3), (0, 1)))


def flip_method_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3, 4), 0))
    yield SampleInput((mk(2, 3, 4), -1, 1))
    yield SampleInput((mk(2, 3), (1,)))
    yield SampleInput((mk(2, 3),), {"dims": [0, 1]})
    yield SampleInput((mk(), 0))


def flip_errors(device):
    yield err((x234(), (0, -3)), RuntimeError, "dim 0 appears multiple times in the list of dims")
    yield err((x234(), (3,)), IndexError, r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")


# -- identities ----------------------------------------------------------------------------
def identity_samples(device, dtype):
    mk = maker(device, dtype)
    for shape in [(2, 3), (), (0, 2)]:
        yield SampleInput((mk(*shape),))
    yield SampleInput((mk(2, 3, noncontiguous=True),))
    yield SampleInput((mk(3, 4).T,), {"memory_format": torch.contiguous_format})


def detach_samples(device, dtype):
    yield from (s for s in identity_samples(device, dtype) if not s.kwargs)


def contiguous_then_view(x):
    """The common `x.mT.contiguous().view(-1)`: thunderfn does not track strides, so the view
    must not assume what contiguous() made."""
    return x.mT.contiguous().view(-1)


def contiguous_then_view_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3),))
    yield SampleInput((mk(4, 2, 3, noncontiguous=True),))


# -- conversions ---------------------------------------------------------------------------
def to_samples(device, dtype):
    mk = maker(device, dtype)
    for target in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool, dtype):
        yield SampleInput((mk(2, 3), target))
    yield SampleInput((mk(), torch.float64))
    yield SampleInput((mk(0, 3), torch.int32))
    yield SampleInput((mk(2, 3, noncontiguous=True), "cpu"))
    yield SampleInput((mk(2, 3), torch.device("cpu"), torch.float64))
    yield SampleInput((mk(2, 3), "cpu"), {"dtype": torch.int32, "non_blocking": True})
    yield SampleInput((mk(2, 3),), {"dtype": torch.float64, "copy": True})
    yield SampleInput((mk(2, 3),), {"device": CPU})
    yield SampleInput((mk(2, 3), make_tensor((4,), dtype=torch.float64)))  # like another tensor
    yield SampleInput((mk(2, 3), torch.float32, False, True))  # positional non_blocking, copy


def to_errors(device):
    yield err((x234(),), TypeError,
              r"to\(\) received an invalid combination of arguments - got \(foo=int, \)", {"foo": 1})


def type_as_samples(device, dtype):
    mk = maker(device, dtype)
    for other in (torch.int64, torch.float32, torch.bool, torch.bfloat16, dtype):
        yield SampleInput((mk(2, 3), make_tensor((1,), dtype=other)))
    yield SampleInput((mk(), make_tensor((0,), dtype=torch.float64)))


def type_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3), torch.float64))
    yield SampleInput((mk(2, 3), torch.int8))
    yield SampleInput((mk(), "torch.IntTensor"))
    yield SampleInput((mk(0, 2), "torch.BoolTensor"))


def type_errors(device):
    yield err((x234(), "torch.NoSuchTensor"), ValueError, "invalid type: 'torch.NoSuchTensor'")


def type_of_other_samples(device, dtype):
    for other in (torch.float32, torch.float16, torch.int32, torch.bool):
        yield SampleInput((maker(device, dtype)(2, 3), make_tensor((2,), dtype=other)))


def conversion_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(2, 3),))
    yield SampleInput((mk(),))
    yield SampleInput((mk(0, 3),))
    yield SampleInput((mk(3, 4, noncontiguous=True),))


CONVERSIONS = ("float", "double", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool",
               "cfloat", "cdouble")

opinfos: list[OpInfo] = [
    OpInfo("reshape", torch.reshape, reshape_samples, ALL, reshape_errors),
    OpInfo("reshape.method", method("reshape"), reshape_method_samples, SOME, reshape_errors),
    OpInfo("view", method("view"), view_samples, ALL, view_errors),
    OpInfo("view_as", method("view_as"), view_as_samples, ALL, as_errors),
    OpInfo("reshape_as", method("reshape_as"), reshape_as_samples, ALL, as_errors),
    OpInfo("permute", torch.permute, permute_samples, ALL, permute_errors),
    OpInfo("permute.method", method("permute"), permute_method_samples, SOME, permute_errors),
    OpInfo("transpose", torch.transpose, transpose_samples, ALL, transpose_errors),
    *(OpInfo(f"transpose.{name}", fn, transpose_samples, SOME, transpose_errors)
      for name, fn in [("method", method("transpose")), ("swapaxes", torch.swapaxes),
                       ("swapdims", method("swapdims"))]),
    *function_and_method("t", t_samples, t_errors),
    OpInfo("Tensor.T", attribute("T"), T_samples, ALL),
    OpInfo("Tensor.mT", attribute("mT"), mT_samples, ALL, mT_errors("mT")),
    OpInfo("Tensor.mH", attribute("mH"), mT_samples, ALL, conjugating_errors),
    OpInfo("Tensor.H", attribute("H"), H_samples, ALL, H_errors),
    OpInfo("movedim", torch.movedim, movedim_samples, ALL, movedim_errors),
    OpInfo("movedim.moveaxis", method("moveaxis"), movedim_samples, SOME, movedim_errors),
    *function_and_method("squeeze", squeeze_samples, squeeze_errors),
    *function_and_method("unsqueeze", unsqueeze_samples, unsqueeze_errors),
    OpInfo("expand", method("expand"), expand_samples, ALL, expand_errors),
    OpInfo("expand_as", method("expand_as"), expand_as_samples, ALL, expand_as_errors),
    *function_and_method("broadcast_to", broadcast_to_samples, broadcast_to_errors),
    OpInfo("cat", torch.cat, cat_samples, ALL, cat_errors),
    OpInfo("cat.concat", torch.concat, cat_samples, SOME, cat_errors),
    OpInfo("cat.concatenate", torch.concatenate, cat_samples, SOME),
    OpInfo("stack", torch.stack, stack_samples, ALL, stack_errors),
    OpInfo("hstack", torch.hstack, hstack_samples, ALL, xstack_errors("hstack")),
    OpInfo("vstack", torch.vstack, vstack_samples, ALL, xstack_errors("vstack")),
    OpInfo("column_stack", torch.column_stack, column_stack_samples, ALL, xstack_errors("column_stack")),
    OpInfo("_chunk_cat", torch._chunk_cat, chunk_cat_samples, ALL, chunk_cat_errors),
    OpInfo("split", torch.split, split_samples, ALL, split_errors),
    OpInfo("split.method", method("split"), split_method_samples, SOME, split_errors),
    *function_and_method("chunk", chunk_samples, chunk_errors),
    *function_and_method("unbind", unbind_samples, unbind_errors),
    *function_and_method("narrow", narrow_samples, narrow_errors),
    *function_and_method("flatten", flatten_samples, flatten_errors),
    *function_and_method("unflatten", unflatten_samples, unflatten_errors),
    OpInfo("flip", torch.flip, flip_samples, ALL, flip_errors),
    OpInfo("flip.method", method("flip"), flip_method_samples, SOME, flip_errors),
    OpInfo("contiguous", method("contiguous"), identity_samples, ALL),
    OpInfo("view.after_contiguous", contiguous_then_view, contiguous_then_view_samples, SOME),
    *function_and_method("detach", detach_samples),
    *function_and_method("clone", identity_samples),
    OpInfo("to", method("to"), to_samples, ALL, to_errors),
    OpInfo("type_as", method("type_as"), type_as_samples, ALL),
    OpInfo("Tensor.type", method("type"), type_samples, ALL, type_errors),
    # x.type() with no argument names the tensor's type; converting another tensor to it round-trips the name
    OpInfo("Tensor.type.name", lambda a, other: a.type(other.type()), type_of_other_samples, SOME),
    OpInfo("Tensor.cpu", method("cpu"), conversion_samples, SOME),
    *(OpInfo(f"Tensor.{name}", method(name), conversion_samples, ALL) for name in CONVERSIONS),
]


# -- triangles, diagonals, padding, rolling and repeating ----------------------------------
def triangle_samples(device, dtype):
    mk = maker(device, dtype)
    for shape, diagonal in [((4, 5), 0), ((4, 5), 2), ((4, 5), -1), ((2, 3, 4), 1), ((5, 3), -10), ((5, 3), 10),
                            ((0, 3), 0), ((2, 0, 3), 1)]:
        yield SampleInput((mk(*shape), diagonal))
    yield SampleInput((mk(4, 5, noncontiguous=True),))
    yield SampleInput((mk(3, 4).T,), {"diagonal": -1})


def triangle_errors(name):
    def errors(device):
        yield err((make_tensor((3,)),), RuntimeError, f"{name}: input tensor must have at least 2 dimensions")
        yield err((make_tensor(()),), RuntimeError, f"{name}: input tensor must have at least 2 dimensions")
    return errors


def diagonal_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(4, 5),))
    yield SampleInput((mk(4, 5), 2))
    yield SampleInput((mk(4, 5), -3))
    yield SampleInput((mk(4, 5), 7))  # past the corner: empty
    yield SampleInput((mk(2, 3, 4), 1, 2, 0))
    yield SampleInput((mk(2, 3, 4), -1, -1, 1))
    yield SampleInput((mk(2, 3, 4, noncontiguous=True),), {"offset": 0, "dim1": 1, "dim2": 2})
    yield SampleInput((mk(0, 3),))
    yield SampleInput((mk(3, 1, 3), 0, 0, 2))


def diagonal_errors(device):
    yield err((x234(), 0, 0, 0), RuntimeError, "diagonal dimensions cannot be identical 0, 0")
    yield err((x234(), 0, 0, 3), IndexError,
              r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    yield err((make_tensor((3,)),), IndexError,
              r"Dimension out of range \(expected to be in range of \[-1, 0\], but got 1\)")


def diag_embed_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3),))
    yield SampleInput((mk(2, 3), 1))
    yield SampleInput((mk(2, 3), -2, 0, 2))
    yield SampleInput((mk(2, 3, noncontiguous=True), 0, 2, 0))
    yield SampleInput((mk(2, 0), 1))


def diag_embed_errors(device):
    yield err((make_tensor((2, 3)), 0, 0, 0), RuntimeError, "diagonal dimensions cannot be identical 0, 0")
    yield err((make_tensor((2, 3)), 0, 0, 3), IndexError,
              r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)")
    yield err((make_tensor(()),), IndexError,
              r"Dimension out of range \(expected to be in range of \[-1, 0\], but got -2\)")


def diag_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3),))
    yield SampleInput((mk(3), 2))
    yield SampleInput((mk(3), -1))
    yield SampleInput((mk(4, 5),))
    yield SampleInput((mk(4, 5), 1))
    yield SampleInput((mk(4, 5, noncontiguous=True), -2))
    yield SampleInput((mk(0),))
    yield SampleInput((mk(3, 4), 9))


def diag_errors(device):
    yield err((x234(),), RuntimeError, r"diag\(\): Supports 1D or 2D tensors. Got 3D")
    yield err((make_tensor(()),), RuntimeError, r"diag\(\): Supports 1D or 2D tensors. Got 0D")


def rot90_samples(device, dtype):
    mk = maker(device, dtype)
    for k in (0, 1, 2, 3, 4, -1, 5, -6):
        yield SampleInput((mk(3, 4), k))
    yield SampleInput((mk(2, 3, 4), 1, (0, 2)))
    yield SampleInput((mk(2, 3, 4), 3, [-1, 1]))
    yield SampleInput((mk(2, 3, 4, noncontiguous=True),), {"k": 2, "dims": (2, 0)})
    yield SampleInput((mk(0, 3),))


def rot90_errors(device):
    x = make_tensor((3, 4))
    yield err((x, 1, (0,)), RuntimeError, "expected total rotation dims == 2, but got dims = 1")
    yield err((make_tensor((3,)), 1, (0, 1)), RuntimeError, "expected total dims >= 2, but got total dims = 1")
    yield err((x, 1, (0, 0)), RuntimeError, "expected rotation dims to be different, but got dim0 = 0 and dim1 = 0")
    yield err((x, 1, (0, 2)), IndexError, r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)")


def roll_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), 1))
    yield SampleInput((mk(3, 4), -5))
    yield SampleInput((mk(3, 4), 2, 1))
    yield SampleInput((mk(3, 4), (1, -7), (0, 1)))
    yield SampleInput((mk(3, 4), (1, 2), (-1, -1)))  # the same dim twice rolls twice
    yield SampleInput((mk(3, 4, noncontiguous=True), 3, -1))
    yield SampleInput((mk(3, 4), 4, 1))
    yield SampleInput((mk(), 1))
    yield SampleInput((mk(0, 3), 1, 0))
    yield SampleInput((mk(2, 3),), {"shifts": [1], "dims": [0]})


def roll_errors(device):
    x = make_tensor((3, 4))
    yield err((x, 1, (0, 1)), RuntimeError, "shifts and dimensions must align. shifts: 1, dims:2")
    yield err((x, (1, 2), (0,)), RuntimeError, "shifts and dimensions must align. shifts: 2, dims:1")
    yield err((x, ()), RuntimeError, "`shifts` required")
    yield err((x, 1, 2), IndexError, r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)")


def repeat_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), 2, 1))
    yield SampleInput((mk(3, 4), (2, 1, 3)))
    yield SampleInput((mk(3, 4), [1, 0]))
    yield SampleInput((mk(3, 4, noncontiguous=True), 2, 3))
    yield SampleInput((mk(), 2, 3))
    yield SampleInput((mk(), ()))
    yield SampleInput((mk(0, 3), 2, 2))


def repeat_errors(device):
    x = make_tensor((3, 4))
    yield err((x, 2), RuntimeError,
              "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    yield err((x, 2, -1, 1), RuntimeError, r"Trying to create tensor with negative dimension -3: \[2, -3, 4\]")
    yield err((x,), TypeError, r'repeat\(\) missing 1 required positional arguments: "repeats"')


def tile_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), (2,)))
    yield SampleInput((mk(3, 4), (2, 1, 3)))
    yield SampleInput((mk(3, 4), [1, 0]))
    yield SampleInput((mk(3, 4, noncontiguous=True), (2, 3)))
    yield SampleInput((mk(3, 4), ()))
    yield SampleInput((mk(), (2,)))
    yield SampleInput((mk(0, 3), (2, 2)))


def tile_errors(device):
    yield err((make_tensor((3, 4)), (-1,)), RuntimeError,
              r"Trying to create tensor with negative dimension -4: \[3, -4\]")


def repeat_interleave_samples(device, dtype):
    mk = maker(device, dtype)
    yield SampleInput((mk(3, 4), 2))
    yield SampleInput((mk(3, 4), 3, 1))
    yield SampleInput((mk(3, 4), 2, -2), {"output_size": 6})
    yield SampleInput((mk(3, 4, noncontiguous=True), 0, 0))
    yield SampleInput((mk(), 3))
    yield SampleInput((mk(0, 3), 2, 1))
    yield SampleInput((mk(3, 4), torch.tensor([1, 0, 3]), 0), {"output_size": 4})
    yield SampleInput((mk(3, 4), torch.tensor([1, 0, 3]), 0))  # the length, the repeats' sum: a data-dependent size


def repeat_interleave_errors(device):
    x = make_tensor((3, 4))
    yield err((x, -1), RuntimeError, "Repeats must be non-negative")
    yield err((x, 2), RuntimeError, "repeat_interleave: Invalid output_size, expected 24 but got 3", {"output_size": 3})
    yield err((x, 2, 2), IndexError, r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)")
    yield err((make_tensor(()), 2, 0), IndexError,
              r"Dimension out of range \(expected to be in range of \[-1, 0\], but got 1\)")


def pad_samples(device, dtype):
    mk = maker(device, dtype)
    fill = True if dtype is torch.bool else 3 if not dtype.is_floating_point else 2.5
    yield SampleInput((mk(3, 4), (1, 2)))
    yield SampleInput((mk(3, 4), (1, 2, 0, 3)), {"value": fill})
    yield SampleInput((mk(2, 3, 4), [0, 1, 2, 0, 1, 1], "constant", fill))
    yield SampleInput((mk(3, 4), (-1, 2, 1, -3)))  # negative pads crop
    yield SampleInput((mk(3, 4), (-4, 1)))  # everything cropped, then padded
    yield SampleInput((mk(3, 4, noncontiguous=True), (0, 0)))
    yield SampleInput((mk(), ()))
    yield SampleInput((mk(0, 3), (1, 1, 2, 0)))
    if dtype is not torch.bool:
        yield SampleInput((mk(3, 4), (1, 1)), {"value": 7.9})  # truncated into integer dtypes
    for mode in ("reflect", "replicate", "circular"):
        if mode != "circular" and dtype is torch.bool:
            continue
        yield SampleInput((mk(2, 5), (2, 3), mode))
        yield SampleInput((mk(2, 3, 5), (1, -2), mode))  # crop, then pad from what is left
        yield SampleInput((mk(2, 3, 5, noncontiguous=True), (2, 1, 0, 2), mode))
        yield SampleInput((mk(1, 2, 3, 4, 5), (1, 2, 2, 0, 0, 1), mode))
        yield SampleInput((mk(3, 4, 5), [-1, 2, 2, -1]), {"mode": mode})
    if dtype is not torch.bool:
        yield SampleInput((mk(0, 3, 5), (2, 2), "replicate"))  # an empty batch
    yield SampleInput((mk(3, 0, 5), (2, 2), "circular"))


def pad_errors(device):
    x = make_tensor((3, 4))
    x3 = make_tensor((1, 3, 4))
    yield err((x, (1, 2, 3)), RuntimeError, "Padding length must be divisible by 2")
    yield err((x, (1, 2, 3, 4, 5, 6)), RuntimeError,
              "Padding length should be less than or equal to two times the input dimension but got padding length 6 "
              "and input of dimension 2")
    yield err((x, (-3, -2)), RuntimeError, r"narrow\(\): length must be non-negative.")
    yield err((x3, (1, 2), "foo"), NotImplementedError, "Unrecognised padding mode foo")
    yield err((x3, (1, 2), "reflect", 1.0), RuntimeError, "Padding mode \"reflect\" doesn't take in value argument")
    yield err((make_tensor((4,)), (1, 2), "reflect"), NotImplementedError,
              "Padding size 2 is not supported for 1D input tensor.")
    yield err((x3, (1, 2, 1, 1, 1, 1), "circular"), NotImplementedError,
              "Padding size 6 is not supported for 3D input tensor.")
    yield err((x3, (1, 4), "reflect"), RuntimeError,
              r"Argument #4: Padding size should be less than the corresponding input dimension, but got: padding \(1, "
              r"4\) at dimension 2 of input \[1, 3, 4\]")
    yield err((x3, (1, 5), "circular"), RuntimeError, "Padding value causes wrapping around more than once.")
    yield err((make_tensor((0, 4)), (1, 2), "reflect"), RuntimeError,
              r"Expected 2D or 3D \(batch mode\) tensor with possibly 0 batch size and other non-zero dimensions for "
              r"input, but got: \[0, 4\]")
    yield err((make_tensor((1, 2, 0)), (1, 1), "replicate"), RuntimeError,
              r"Expected 2D or 3D \(batch mode\) tensor with possibly 0 batch size and other non-zero dimensions for "
              r"input, but got: \[1, 2, 0\]")
    yield err((make_tensor((1, 3, 4), dtype=torch.bool), (1, 2), "reflect"), NotImplementedError,
              "\"reflection_pad1d\" not implemented for 'Bool'")
    yield err((make_tensor((1, 3, 4), dtype=torch.bool), (1, 2, 1, 1), "replicate"), NotImplementedError,
              "\"replication_pad2d\" not implemented for 'Bool'")


opinfos += [
    *function_and_method("tril", triangle_samples, triangle_errors("tril")),
    *function_and_method("triu", triangle_samples, triangle_errors("triu")),
    *function_and_method("diagonal", diagonal_samples, diagonal_errors),
    OpInfo("diag_embed", torch.diag_embed, diag_embed_samples, ALL, diag_embed_errors),
    *function_and_method("diag", diag_samples, diag_errors),
    *function_and_method("rot90", rot90_samples, rot90_errors),
    *function_and_method("roll", roll_samples, roll_errors),
    OpInfo("repeat", method("repeat"), repeat_samples, ALL, repeat_errors),
    *function_and_method("tile", tile_samples, tile_errors),
    *function_and_method("repeat_interleave", repeat_interleave_samples, repeat_interleave_errors),
    OpInfo("nn.functional.pad", torch.nn.functional.pad, pad_samples, ALL, pad_errors),
]
