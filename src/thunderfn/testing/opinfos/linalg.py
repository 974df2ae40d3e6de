"""OpInfos for thunderfn.torch.linalg: addmm, baddbmm, addbmm, addmv, mv, dot, vdot, outer,
einsum, tensordot and kron."""
from __future__ import annotations

import torch

from thunderfn.testing.opinfo import OpInfo, SampleInput, make_tensor
from thunderfn.testing.opinfos.nn import MATMUL_DTYPES, mk_fn
from thunderfn.testing.opinfos.shape import err

# half-precision products: torch's kernels and the decompositions (float32, rounded once)
# may round the sum of products and the added input differently
HALF_TOLERANCES = {torch.float16: (1e-3, 1e-2), torch.bfloat16: (1e-2, 5e-2)}


def addmm_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 4), mk(2, 3), mk(3, 4)))
    yield SampleInput((mk(4), mk(2, 3), mk(3, 4)), name="broadcast input")
    yield SampleInput((mk(), mk(2, 3), mk(3, 4)), name="0-dim input")
    yield SampleInput((mk(2, 4), mk(2, 3), mk(3, 4)), {"beta": 2, "alpha": 3})
    yield SampleInput((mk(2, 4), mk(2, 3), mk(3, 4)), {"beta": 0}, "beta=0")
    yield SampleInput((mk(0, 4), mk(0, 3), mk(3, 4)), name="empty")
    yield SampleInput((mk(2, 4), mk(2, 0), mk(0, 4)), name="empty inner dim")
    yield SampleInput((mk(4, 2).T, mk(3, 2).T, mk(3, 4, noncontiguous=True)), name="noncontiguous")
    if dtype.is_floating_point:
        yield SampleInput((mk(2, 4), mk(2, 3), mk(3, 4)), {"beta": 0.5, "alpha": -1.5})
        yield SampleInput((torch.full((2, 4), float("nan"), device=device, dtype=dtype), mk(2, 3), mk(3, 4)),
                          {"beta": 0}, "beta=0 ignores NaN input")


def addmm_errors(device):
    r = make_tensor
    yield err((r((2, 4)), r((3,)), r((3, 4))), RuntimeError, "mat1 must be a matrix, got 1-D tensor")
    yield err((r((2, 4)), r((2, 3)), r((3,))), RuntimeError, "mat2 must be a matrix, got 1-D tensor")
    yield err((r((2, 4)), r((2, 3)), r((5, 4))), RuntimeError,
              r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 5x4\)")
    yield err((r((3, 4)), r((2, 3)), r((3, 4))), RuntimeError,
              r"The expanded size of the tensor \(2\) must match the existing size \(3\) at non-singleton dimension 0")
    yield err((r((2, 4)), r((2, 3)), r((3, 4), dtype=torch.float64)), RuntimeError,
              "self and mat2 must have the same dtype, but got Float and Double")
    yield err((r((2, 4), dtype=torch.float64), r((2, 3)), r((3, 4))), RuntimeError,
              "self and mat2 must have the same dtype, but got Double and Float")


def baddbmm_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 2, 4), mk(2, 2, 3), mk(2, 3, 4)))
    yield SampleInput((mk(4), mk(2, 2, 3), mk(2, 3, 4)), {"beta": 2, "alpha": 3}, "broadcast input")
    yield SampleInput((mk(2, 2, 4), mk(2, 2, 3), mk(2, 3, 4)), {"beta": 0})
    yield SampleInput((mk(0, 2, 4), mk(0, 2, 3), mk(0, 3, 4)), name="empty")
    yield SampleInput((mk(2, 2, 4), mk(2, 3, 2).mT, mk(2, 3, 4, noncontiguous=True)), name="noncontiguous")


def baddbmm_errors(device):
    r = make_tensor
    yield err((r((2, 2, 4)), r((2, 3)), r((2, 3, 4))), RuntimeError, "batch1 must be a 3D tensor")
    yield err((r((2, 2, 4)), r((2, 2, 3)), r((2, 5, 4))), RuntimeError,
              r"Expected size for first two dimensions of batch2 tensor to be: \[2, 3\] but got: \[2, 5\].")
    yield err((r((2, 2, 4)), r((2, 2, 3)), r((3, 3, 4))), RuntimeError,
              r"Expected size for first two dimensions of batch2 tensor to be: \[2, 3\] but got: \[3, 3\].")
    yield err((r((2, 2, 4)), r((2, 2, 3)), r((2, 3, 4), dtype=torch.float64)), RuntimeError,
              "expected scalar type Float but found Double")


def addbmm_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 4), mk(5, 2, 3), mk(5, 3, 4)))
    yield SampleInput((mk(4), mk(5, 2, 3), mk(5, 3, 4)), {"beta": 2, "alpha": 3}, "broadcast input")
    yield SampleInput((mk(2, 4), mk(0, 2, 3), mk(0, 3, 4)), name="no batches")
    yield SampleInput((mk(2, 4), mk(5, 3, 2).mT, mk(5, 3, 4, noncontiguous=True)), name="noncontiguous")


def addbmm_errors(device):
    r = make_tensor
    yield err((r((2, 4)), r((2, 2, 3)), r((3, 3, 4))), RuntimeError,
              "batch1 and batch2 must have same number of batches, got 2 and 3")
    yield err((r((2, 4)), r((2, 2, 3)), r((2, 5, 4))), RuntimeError,
              r"Incompatible matrix sizes for bmm \(2x3 and 5x4\)")
    yield err((r((3, 4)), r((2, 2, 3)), r((2, 3, 4))), RuntimeError,
              r"The expanded size of the tensor \(2\) must match")


def addmv_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2), mk(2, 3), mk(3)))
    yield SampleInput((mk(), mk(2, 3), mk(3)), {"beta": 2, "alpha": 3}, "0-dim input")
    yield SampleInput((mk(1), mk(2, 3), mk(3)), {"beta": 0}, "broadcast input")
    yield SampleInput((mk(0), mk(0, 3), mk(3)), name="empty")
    yield SampleInput((mk(2), mk(2, 0), mk(0)), name="empty inner dim")
    yield SampleInput((mk(2), mk(3, 2).T, mk(3, noncontiguous=True)), name="noncontiguous")


def addmv_errors(device):
    r = make_tensor
    yield err((r((2,)), r((3,)), r((3,))), RuntimeError, "vector \\+ matrix @ vector expected, got 1, 1, 1")
    yield err((r((2,)), r((2, 3)), r((3, 1))), RuntimeError, "vector \\+ matrix @ vector expected, got 1, 2, 2")
    yield err((r((2,)), r((2, 3)), r((4,))), RuntimeError, r"size mismatch, got input \(2\), mat \(2x3\), vec \(4\)")
    yield err((r((3,)), r((2, 3)), r((3,))), RuntimeError, r"size mismatch, got input \(3\), mat \(2x3\), vec \(3\)")


def mv_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 3), mk(3)))
    yield SampleInput((mk(0, 3), mk(3)), name="empty")
    yield SampleInput((mk(2, 0), mk(0)), name="empty inner dim")
    yield SampleInput((mk(3, 2).T, mk(3, noncontiguous=True)), name="noncontiguous")


def mv_errors(device):
    r = make_tensor
    yield err((r((2, 3)), r((4,))), RuntimeError, r"size mismatch, got input \(2\), mat \(2x3\), vec \(4\)")
    yield err((r((3,)), r((3,))), RuntimeError, "vector \\+ matrix @ vector expected, got 1, 1, 1")
    yield err((r((2, 3)), r((3, 1))), RuntimeError, "vector \\+ matrix @ vector expected, got 1, 2, 2")
    yield err((r((2, 3)), r((3,), dtype=torch.float64)), RuntimeError,
              "addmv input tensors must have the same dtype, but got Double, Float, and Double")


def dot_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(5), mk(5)))
    yield SampleInput((mk(0), mk(0)), name="empty")
    yield SampleInput((mk(4, noncontiguous=True), mk(3, 4)[1]), name="noncontiguous")


def dot_errors(name):
    def errors(device):
        r = make_tensor
        yield err((r((2, 3)), r((3,))), RuntimeError, "1D tensors expected, but got 2D and 1D tensors")
        yield err((r((3,)), r((4,))), RuntimeError,
                  r"inconsistent tensor size, expected tensor \[3\] and src \[4\] to have the same number of elements")
        yield err((r((3,)), r((3,), dtype=torch.float64)), RuntimeError,
                  f"{name} : expected both vectors to have same dtype, but found Float and Double")
        if name == "dot":
            yield err((r((3,), dtype=torch.bool), r((3,), dtype=torch.bool)), NotImplementedError,
                      "\"dot\" not implemented for 'Bool'")
    return errors


def outer_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(3), mk(4)))
    yield SampleInput((mk(0), mk(4)), name="empty")
    yield SampleInput((mk(3, noncontiguous=True), mk(4)), name="noncontiguous")
    yield SampleInput((mk(3), mk(4, dtype=torch.float64)), name="type promotion")


def outer_errors(device):
    r = make_tensor
    yield err((r((2, 3)), r((3,))), RuntimeError, "outer: Expected 1-D argument self, but got 2-D")
    yield err((r(()), r((3,))), RuntimeError, "outer: Expected 1-D argument self, but got 0-D")
    yield err((r((3,)), r((3, 1))), RuntimeError, "outer: Expected 1-D argument vec2, but got 2-D")


EINSUM_CASES = [
    ("ij,jk->ik", (2, 3), (3, 4)),
    ("ij,jk", (2, 3), (3, 4)),
    ("bij,bjk->bik", (5, 2, 3), (5, 3, 4)),
    ("...ij,...jk", (5, 2, 3), (3, 4)),
    ("...ij,...jk->...ik", (2, 1, 2, 3), (5, 3, 4)),
    ("i,j->ij", (2,), (3,)),
    ("i,i->", (4,), (4,)),
    ("ij,ij->i", (2, 3), (2, 3)),
    ("ij->ji", (2, 3)),
    ("ij->", (2, 3)),
    ("ij", (2, 3)),
    ("ba", (2, 3)),
    ("Ab,ba", (2, 3), (3, 2)),
    ("ii", (3, 3)),
    ("ii->i", (3, 3)),
    ("iji->j", (3, 2, 3)),
    ("ij,jk,kl->li", (2, 3), (3, 4), (4, 5)),
    ("ij,jk->ik", (2, 1), (3, 5)),
    ("...ij->ij", (5, 2, 3)),
    ("...->...", ()),
    (" i j , j k -> i k ", (2, 3), (3, 4)),
    ("ij,jk->ik", (0, 3), (3, 4)),
    ("ij,jk->ik", (2, 0), (0, 4)),
    ("bn,anm,bm->ba", (2, 3), (4, 3, 5), (2, 5)),
]


def einsum_samples(device, dtype):
    mk = mk_fn(device, dtype)
    for equation, *shapes in EINSUM_CASES:
        yield SampleInput((equation, *(mk(*s) for s in shapes)), name=equation)
    yield SampleInput(("ij,jk->ik", [mk(2, 3), mk(3, 4)]), name="operands as a list")
    yield SampleInput(("ij,jk->ik", mk(3, 2).T, mk(3, 4, noncontiguous=True)), name="noncontiguous")


def einsum_errors(device):
    r = lambda *s: make_tensor(s)
    yield err(("ij,jk", r(2, 3)), RuntimeError,
              r"einsum\(\): fewer operands were provided than specified in the equation")
    yield err(("ij", r(2, 3), r(3, 4)), RuntimeError,
              r"einsum\(\): more operands were provided than specified in the equation")
    yield err(("ij->i", r(2, 3, 4)), RuntimeError,
              r"einsum\(\): the number of subscripts in the equation \(2\) does not match the number of dimensions "
              r"\(3\) for operand 0 and no ellipsis was given")
    yield err(("ij->ii", r(2, 3)), RuntimeError, r"einsum\(\): output subscript i appears more than once in the output")
    yield err(("ij->k", r(2, 3)), RuntimeError,
              r"einsum\(\): output subscript k does not appear in the equation for any input operand")
    yield err(("i1->i", r(2, 3)), RuntimeError,
              r"einsum\(\): invalid subscript given at index 1 in the equation string, subscripts "
              r"must be in \[a-zA-Z\]")
    yield err(("ij,jk->ik", r(2, 3), r(4, 5)), RuntimeError,
              r"einsum\(\): subscript j has size 4 for operand 1 which does not broadcast with previously seen size 3")
    yield err(("ii->i", r(2, 3)), RuntimeError,
              r"einsum\(\): subscript i is repeated for operand 0 but the sizes don't match, 3 != 2")
    yield err(("ij,jk->ik", r(2, 3), make_tensor((3, 5), dtype=torch.float64)), RuntimeError,
              "expected scalar type Float but found Double")


def tensordot_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 3, 4), mk(3, 4, 5)))
    yield SampleInput((mk(2, 3, 4), mk(4, 5), 1))
    yield SampleInput((mk(2, 3), mk(4,), 0), name="outer product")
    yield SampleInput((mk(2, 3, 4), mk(4, 5, 2), ([0, 2], [2, 0])), name="dim lists")
    yield SampleInput((mk(2, 3, 4), mk(4, 5, 3)), {"dims": ([-1, 1], [0, -1])}, "negative dims")
    yield SampleInput((mk(2, 0), mk(0, 5), 1), name="empty contraction")
    yield SampleInput((mk(4, 3).T, mk(4, 5, noncontiguous=True), 1), name="noncontiguous")


def tensordot_errors(device):
    r = lambda *s: make_tensor(s)
    yield err((r(2, 3), r(4, 5), 1), RuntimeError,
              "contracted dimensions need to match, but first has size 3 in dim -1 and second has size 4 in dim 0")
    yield err((r(2, 3), r(3, 5), -1), RuntimeError, "tensordot expects dims >= 0, but got dims=-1")
    yield err((r(2, 3), r(3, 5), ([1], [1])), RuntimeError,
              "contracted dimensions need to match, but first has size 3 in dim 1 and second has size 5 in dim 1")
    yield err((r(2, 3), make_tensor((3, 5), dtype=torch.float64), 1), RuntimeError,
              "both inputs should have same dtype")


def kron_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 3), mk(4, 5)))
    yield SampleInput((mk(3), mk(2, 2)), name="different ranks")
    yield SampleInput((mk(), mk(3, 2)), name="0-dim")
    yield SampleInput((mk(), mk()), name="both 0-dim")
    yield SampleInput((mk(2, 0), mk(3, 2)), name="empty")
    # (eager torch.kron refuses a transposed input: "view size is not compatible")
    yield SampleInput((mk(3, 2, noncontiguous=True), mk(2, 3)), name="noncontiguous")
    yield SampleInput((mk(2), mk(2, dtype=torch.float64)), name="type promotion")


def vdot_complex_samples(device, dtype):
    yield SampleInput((make_tensor((4,), device=device, dtype=dtype), make_tensor((4,), device=device, dtype=dtype)))


opinfos: list[OpInfo] = [
    OpInfo("addmm", torch.addmm, addmm_samples, dtypes=MATMUL_DTYPES, dtype_tolerances=HALF_TOLERANCES,
           error_inputs=addmm_errors),
    OpInfo("Tensor.addmm", lambda a, *args, **kw: a.addmm(*args, **kw), addmm_samples, dtypes=(torch.float32,)),
    OpInfo("baddbmm", torch.baddbmm, baddbmm_samples, dtypes=MATMUL_DTYPES, dtype_tolerances=HALF_TOLERANCES,
           error_inputs=baddbmm_errors),
    OpInfo("addbmm", torch.addbmm, addbmm_samples, dtypes=MATMUL_DTYPES, dtype_tolerances=HALF_TOLERANCES,
           error_inputs=addbmm_errors),
    OpInfo("addmv", torch.addmv, addmv_samples, dtypes=MATMUL_DTYPES, dtype_tolerances=HALF_TOLERANCES,
           error_inputs=addmv_errors),
    OpInfo("mv", torch.mv, mv_samples, dtypes=MATMUL_DTYPES, dtype_tolerances=HALF_TOLERANCES, error_inputs=mv_errors),
    OpInfo("dot", torch.dot, dot_samples, dtypes=MATMUL_DTYPES, dtype_tolerances=HALF_TOLERANCES,
           error_inputs=dot_errors("dot")),
    OpInfo("vdot", torch.vdot, dot_samples, dtypes=MATMUL_DTYPES, dtype_tolerances=HALF_TOLERANCES,
           error_inputs=dot_errors("vdot")),
    OpInfo("vdot_complex", torch.vdot, vdot_complex_samples, dtypes=(torch.complex64,)),
    OpInfo("outer", torch.outer, outer_samples, dtypes=MATMUL_DTYPES + (torch.bool,), error_inputs=outer_errors),
    OpInfo("einsum", torch.einsum, einsum_samples, dtypes=MATMUL_DTYPES, dtype_tolerances=HALF_TOLERANCES,
           error_inputs=einsum_errors),
    OpInfo("tensordot", torch.tensordot, tensordot_samples, dtypes=MATMUL_DTYPES, dtype_tolerances=HALF_TOLERANCES,
           error_inputs=tensordot_errors),
    OpInfo("kron", torch.kron, kron_samples, dtypes=MATMUL_DTYPES + (torch.bool,), error_inputs=None),
]
