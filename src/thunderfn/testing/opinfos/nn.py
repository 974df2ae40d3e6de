"""OpInfos for thunderfn.torch.nn: the matmul family, linear, layer_norm, embedding, the losses,
scaled_dot_product_attention and dropout. (softmax and log_softmax live with the reductions.)"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from thunderfn.errors import UnsupportedOpError
from thunderfn.testing.opinfo import ALL, FLOATS, OpInfo, SampleInput, make_tensor
from thunderfn.testing.opinfos.shape import SOME, err, method
from thunderfn.torch.nn import instance_norm_running_update

MATMUL_DTYPES = FLOATS + (torch.int64, torch.int32)
HALF = (torch.bfloat16, torch.float16)
# torch's half-precision log_softmax and loss sums round along the way (log_softmax(bf16) of the
# largest logit can be 0 where the float32 value rounds to -5e-5); the decompositions compute in
# float32 and round once, so the two differ by a few half-precision ulps
HALF_LOSS_TOLERANCES = {torch.bfloat16: (1e-2, 2e-2), torch.float16: (1e-3, 5e-3)}


def mk_fn(device, dtype):
    """make_tensor with small values, so float16 sums and products stay well inside its range."""
    def mk(*shape, noncontiguous=False, dtype=dtype, low=None, high=None):
        if low is None and not dtype.is_floating_point and dtype is not torch.bool:
            low, high = -3, 4
        return make_tensor(shape, device=device, dtype=dtype, noncontiguous=noncontiguous, low=low, high=high)
    return mk


# -- matmul family ---------------------------------------------------------------------------
MATMUL_SHAPES = [
    ((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((4, 2, 3), (3,)), ((3,), (4, 3, 2)),
    ((4, 2, 3), (3, 5)), ((2, 3), (4, 3, 5)), ((2, 1, 2, 3), (5, 3, 4)), ((2, 4, 2, 3), (2, 4, 3, 2)),
    ((0, 3), (3, 4)), ((2, 0), (0, 4)), ((0,), (0,)), ((3, 2, 0), (0, 2)),
]


def matmul_samples(device, dtype):
    mk = mk_fn(device, dtype)
    for a, b in MATMUL_SHAPES:
        yield SampleInput((mk(*a), mk(*b)))
    yield SampleInput((mk(3, 4, noncontiguous=True), mk(5, 4).mT))


def matmul_errors(device):
    r = make_tensor
    yield err((r(()), r((3,))), RuntimeError, "both arguments to matmul need to be at least 1D, but they are 0D and 1D")
    yield err((r((3,)), r((4,))), RuntimeError,
              r"inconsistent tensor size, expected tensor \[3\] and src \[4\] to have the same number of elements")
    yield err((r((2, 3)), r((4, 2))), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x2\)")
    yield err((r((5, 2, 3)), r((4, 2))), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied \(10x3 and 4x2\)")
    yield err((r((3,)), r((4, 2))), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied \(1x3 and 4x2\)")
    yield err((r((5, 2, 3)), r((4,))), RuntimeError, r"size mismatch, got input \(10\), mat \(10x3\), vec \(4\)")
    yield err((r((5, 2, 3)), r((5, 4, 2))), RuntimeError,
              r"Expected size for first two dimensions of batch2 tensor to be: \[5, 3\] but got: \[5, 4\].")
    yield err((r((2, 2, 3)), r((3, 3, 2))), RuntimeError,
              r"The size of tensor a \(2\) must match the size of tensor b \(3\) at non-singleton dimension 0")
    yield err((r((2, 3)), r((3, 4), dtype=torch.float64)), RuntimeError,
              "expected m1 and m2 to have the same dtype, but got: float != double")
    yield err((r((3,)), r((3,), dtype=torch.int32)), RuntimeError,
              "dot : expected both vectors to have same dtype, but found Float and Int")


# a real tensor on the left of `@` with a traced one on the right: Python calls the proxy's __rmatmul__
_LEFT_OPERANDS = {dtype: make_tensor((3, 4), dtype=dtype, low=-3, high=4) for dtype in MATMUL_DTYPES}


def captured_left_matmul(b):
    return _LEFT_OPERANDS[b.dtype] @ b


def rmatmul_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(4, 2),))
    yield SampleInput((mk(4),))
    yield SampleInput((mk(5, 4, 2),))


def explicit_rmatmul(a, b):
    return b.__rmatmul__(a)


def mm_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 3), mk(3, 4)))
    yield SampleInput((mk(0, 3), mk(3, 4)))
    yield SampleInput((mk(2, 0), mk(0, 4)))
    yield SampleInput((mk(3, 2).T, mk(3, 4, noncontiguous=True)))


def mm_errors(device):
    r = make_tensor
    yield err((r((2, 2, 3)), r((3, 4))), RuntimeError, "self must be a matrix")
    yield err((r((2, 3)), r((3,))), RuntimeError, "mat2 must be a matrix")
    yield err((r((2, 3)), r((4, 5))), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x5\)")
    yield err((r((2, 3)), r((3, 4), dtype=torch.float64)), RuntimeError,
              "expected m1 and m2 to have the same dtype, but got: float != double")


def bmm_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 2, 3), mk(2, 3, 4)))
    yield SampleInput((mk(0, 2, 3), mk(0, 3, 4)))
    yield SampleInput((mk(2, 2, 0), mk(2, 0, 4)))
    yield SampleInput((mk(2, 3, 2).mT, mk(2, 3, 4, noncontiguous=True)))


def bmm_errors(device):
    r = make_tensor
    yield err((r((2, 3)), r((2, 3, 4))), RuntimeError, "batch1 must be a 3D tensor")
    yield err((r((2, 2, 3)), r((3, 4))), RuntimeError, "batch2 must be a 3D tensor")
    yield err((r((2, 2, 3)), r((3, 3, 4))), RuntimeError,
              r"Expected size for first two dimensions of batch2 tensor to be: \[2, 3\] but got: \[3, 3\].")
    yield err((r((2, 2, 3)), r((2, 4, 4))), RuntimeError,
              r"Expected size for first two dimensions of batch2 tensor to be: \[2, 3\] but got: \[2, 4\].")
    yield err((r((2, 2, 3)), r((2, 3, 4), dtype=torch.float16)), RuntimeError,
              "expected scalar type Float but found Half")


def linear_samples(device, dtype):
    mk = mk_fn(device, dtype)
    w, b = mk(4, 3), mk(4)
    yield SampleInput((mk(2, 3), w, b))
    yield SampleInput((mk(2, 3), w))
    yield SampleInput((mk(2, 3), w, None))
    yield SampleInput((mk(3), w, b))  # 1-D input
    yield SampleInput((mk(5, 2, 3), w, b))  # 3-D input
    yield SampleInput((mk(2, 2, 2, 3), w))
    yield SampleInput((mk(2, 3), mk(3)))  # 1-D weight: a dot product per row
    yield SampleInput((mk(2, 3), w, mk()))  # 0-dim bias
    yield SampleInput((mk(0, 3), w, b))
    yield SampleInput((mk(2, 3, noncontiguous=True), mk(3, 4).T, b))


def linear_errors(device):
    r = make_tensor
    x, w = r((2, 3)), r((4, 3))
    yield err((r(()), w), RuntimeError, "both arguments to linear need to be at least 1D, but they are 0D and 2D")
    yield err((x, r((2, 4, 3))), RuntimeError, r"t\(\) expects a tensor with <= 2 dimensions, but self is 3D")
    yield err((x, r((3,)), r(())), RuntimeError, "mat2 must be a matrix, got 1-D tensor")
    yield err((x, r((4, 5))), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 5x4\)")
    yield err((r((6, 2, 3)), r((4, 5))), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied \(12x3 and 5x4\)")
    yield err((x, r((4, 3), dtype=torch.float64)), RuntimeError,
              "expected m1 and m2 to have the same dtype, but got: float != double")
    yield err((x, w, r((4,), dtype=torch.float64)), RuntimeError,
              "self and mat2 must have the same dtype, but got Double and Float")
    yield err((x, w, r((5,))), RuntimeError,
              r"The expanded size of the tensor \(4\) must match the existing size \(5\) at non-singleton dimension "
              r"1.  Target sizes: \[2, 4\].  Tensor sizes: \[5\]")
    yield err((r((5, 2, 3)), w, r((5,))), RuntimeError,
              r"The expanded size of the tensor \(4\) must match the existing size \(5\) at non-singleton dimension "
              r"1.  Target sizes: \[10, 4\]")


# -- normalization and lookup --------------------------------------------------------------
def layer_norm_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 3, 4), (4,)))
    yield SampleInput((mk(2, 3, 4), [3, 4], mk(3, 4), mk(3, 4)))  # multi-dim normalized_shape
    yield SampleInput((mk(2, 3, 4), (4,), mk(4)))  # weight only
    yield SampleInput((mk(2, 3, 4), (4,), None, mk(4)))  # bias only
    yield SampleInput((mk(2, 3, 4), (4,)), {"eps": 0.1})
    yield SampleInput((mk(2, 3), torch.Size([2, 3]), mk(2, 3), mk(2, 3)))  # normalizes everything
    yield SampleInput((mk(5), (5,)))
    yield SampleInput((mk(0, 4), (4,), mk(4), mk(4)))
    yield SampleInput((mk(4, 3, noncontiguous=True).T, (4,)))
    if dtype in HALF:  # float32 parameters with a half-precision input
        yield SampleInput((mk(2, 4), (4,), mk(4, dtype=torch.float32), mk(4, dtype=torch.float32)))


def layer_norm_errors(device):
    r = make_tensor
    x = r((2, 3, 4))
    yield err((x, 4), TypeError,
              r"layer_norm\(\): argument 'normalized_shape' \(position 2\) must be tuple of ints, not int")
    yield err((x, ()), RuntimeError, r"Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                                     r"least one element, but got normalized_shape = \[\]")
    yield err((x, (3,)), RuntimeError,
              r"Given normalized_shape=\[3\], expected input with shape \[\*, 3\], but got input of size\[2, 3, 4\]")
    yield err((r((4,)), (2, 4)), RuntimeError,
              r"Given normalized_shape=\[2, 4\], expected input with shape \[\*, 2, 4\], but got input of size\[4\]")
    yield err((x, (4,), r((3,))), RuntimeError, r"Expected weight to be of same shape as normalized_shape, but got "
                                                r"weight of shape \[3\] and normalized_shape = \[4\]")
    yield err((x, (4,), r((4,)), r((5,))), RuntimeError, r"Expected bias to be of same shape as normalized_shape, but "
                                                         r"got bias of shape \[5\] and normalized_shape = \[4\]")
    yield err((r((2, 4), dtype=torch.int64), (4,)), NotImplementedError,
              "\"LayerNormKernelImpl\" not implemented for 'Long'")
    yield err((r((2, 4)), (4,), r((4,), dtype=torch.float64)), RuntimeError,
              r"mixed dtype \(CPU\): expect parameter to have scalar type of Float")


def embedding_samples(device, dtype):
    mk = mk_fn(device, dtype)
    weight = mk(4, 5)
    index = lambda *shape, dtype=torch.int64: make_tensor(shape, dtype=dtype, low=0, high=4)
    yield SampleInput((index(2, 3), weight))
    yield SampleInput((index(6, dtype=torch.int32), weight))
    yield SampleInput((torch.tensor(2), weight))
    yield SampleInput((index(0), weight))
    yield SampleInput((index(2, 2), mk(4, 5, noncontiguous=True)))
    yield SampleInput((index(6), weight), {"padding_idx": 1})
    yield SampleInput((index(6), weight), {"padding_idx": -1, "scale_grad_by_freq": True})


def embedding_errors(device):
    w = make_tensor((4, 5))
    yield err((make_tensor((3,)), w), RuntimeError,
              r"Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but "
              r"got torch.FloatTensor instead")
    yield err((torch.tensor([1]), make_tensor((4,))), RuntimeError, "'weight' must be 2-D")
    yield err((torch.tensor([1]), w), AssertionError, "Padding_idx must be within num_embeddings", {"padding_idx": 4})
    yield err((torch.tensor([1]), w), AssertionError, "Padding_idx must be within num_embeddings", {"padding_idx": -5})
    yield err((torch.tensor([4]), w), IndexError, "index out of range in self")  # known when the function runs
    yield err((torch.tensor([1]), w), UnsupportedOpError, r"embedding\(max_norm=...\) renormalizes the weight in place",
              {"max_norm": 1.0}, torch_raises=False)


# -- losses ----------------------------------------------------------------------------------
def class_targets(*shape, classes=5, ignored=()):
    t = make_tensor(shape, dtype=torch.int64, low=0, high=classes)
    for i in ignored:  # flat positions set to ignore_index
        t.view(-1)[i] = -100
    return t


def probabilities(*shape, dim=1):
    return make_tensor(shape, dtype=torch.float32).softmax(dim)


def cross_entropy_samples(device, dtype):
    mk = mk_fn(device, dtype)
    w = make_tensor((5,), dtype=dtype, low=0.1, high=2)
    yield SampleInput((mk(4, 5), class_targets(4)))
    yield SampleInput((mk(4, 5), class_targets(4), w))
    yield SampleInput((mk(4, 5), class_targets(4, ignored=(1,))))
    yield SampleInput((mk(4, 5), class_targets(4, ignored=(0, 2)), w), {"reduction": "sum"})
    yield SampleInput((mk(4, 5), class_targets(4, ignored=(3,)), w), {"reduction": "none"})
    yield SampleInput((mk(4, 5), torch.tensor([2, 0, 2, 4])), {"ignore_index": 2})
    yield SampleInput((mk(4, 5), class_targets(4)), {"label_smoothing": 0.1})
    yield SampleInput((mk(4, 5), class_targets(4, ignored=(1,)), w), {"label_smoothing": 0.2})
    yield SampleInput((mk(4, 5), class_targets(4, ignored=(1,)), w), {"label_smoothing": 0.2, "reduction": "none"})
    yield SampleInput((mk(4, 5), class_targets(4, ignored=(1,))), {"label_smoothing": 0.3, "reduction": "sum"})
    yield SampleInput((mk(4, 5), class_targets(4).to(torch.uint8)))
    yield SampleInput((mk(5), torch.tensor(3)))  # 1-D input: one sample
    yield SampleInput((mk(5), torch.tensor(3)), {"label_smoothing": 0.1, "reduction": "none"})
    yield SampleInput((mk(2, 5, 3), class_targets(2, 3)))  # (N, C, d1)
    yield SampleInput((mk(2, 5, 3, 2), class_targets(2, 3, 2, ignored=(4,)), w), {"reduction": "none"})
    yield SampleInput((mk(2, 5, 3), class_targets(2, 3, ignored=(0,)), w), {"label_smoothing": 0.1})
    yield SampleInput((mk(2, 5), torch.tensor([-100, -100])))  # everything ignored: 0/0
    yield SampleInput((mk(0, 5), class_targets(0)))
    yield SampleInput((mk(4, 5), class_targets(4)), {"size_average": False})
    yield SampleInput((mk(5, 4, noncontiguous=True).T, class_targets(4)))
    probs = lambda *shape, dim=1: probabilities(*shape, dim=dim).to(dtype)
    yield SampleInput((mk(4, 5), probs(4, 5)))  # class probabilities
    yield SampleInput((mk(4, 5), probs(4, 5), w), {"reduction": "sum"})
    yield SampleInput((mk(4, 5), probs(4, 5)), {"label_smoothing": 0.3, "reduction": "none"})
    yield SampleInput((mk(2, 5, 3), probs(2, 5, 3), w))
    yield SampleInput((mk(5), probs(5, dim=0)))


def cross_entropy_errors(device):
    r = make_tensor
    x = r((4, 5))
    t = class_targets(4)
    yield err((x, t), ValueError, "avg is not a valid value for reduction", {"reduction": "avg"})
    yield err((x, t), RuntimeError, r"label_smoothing must be between 0.0 and 1.0. Got: 1.5", {"label_smoothing": 1.5})
    yield err((x, class_targets(3)), ValueError, r"Expected input batch_size \(4\) to match target batch_size \(3\).")
    yield err((r((2, 5, 3)), class_targets(2, 4)), RuntimeError, r"Expected target size \[2, 3\], got \[2, 4\]")
    yield err((x, r((4, 4))), RuntimeError, "0D or 1D target tensor expected, multi-target not supported")
    yield err((x, t.int()), RuntimeError, "expected target dtype to be Long or Byte, but got Int")
    yield err((x, t, r((4,))), RuntimeError, r"weight tensor should be defined either for all 5 classes or no classes "
                                             r"but got weight tensor of shape: \[4\]")
    yield err((x, probabilities(4, 5), r((4,))), RuntimeError,
              r"cross_entropy: weight tensor should be defined either for all 5 classes")
    yield err((x, probabilities(4, 5)), RuntimeError, "ignore_index is not supported for floating point target",
              {"ignore_index": 1})
    yield err((r(()), torch.tensor(0)), RuntimeError,
              "Expected floating point type for target with class probabilities, got Long")
    yield err((r((4, 5), dtype=torch.int64), t), NotImplementedError, "not implemented for 'Long'")
    yield err((r((5,)), class_targets(2)), ValueError,
              "For 1D input, 1D target must have size 1, but got target size: 2")


def nll_loss_samples(device, dtype):
    mk = mk_fn(device, dtype)
    w = make_tensor((5,), dtype=dtype, low=0.1, high=2)
    yield SampleInput((mk(4, 5), class_targets(4)))
    yield SampleInput((mk(4, 5), torch.tensor([2, 0, 2, 4]), w), {"ignore_index": 2, "reduction": "none"})
    yield SampleInput((mk(4, 5), class_targets(4, ignored=(2,)), w), {"reduction": "sum"})
    yield SampleInput((mk(4, 5), class_targets(4, ignored=(2,)), w))
    yield SampleInput((mk(5), torch.tensor(2)))
    yield SampleInput((mk(5), torch.tensor([2])), {"reduction": "none"})  # a 1-element target goes with a 1-D input
    yield SampleInput((mk(2, 5, 3), class_targets(2, 3), w))
    yield SampleInput((mk(2, 5), torch.tensor([-100, -100])))
    yield SampleInput((mk(0, 5), class_targets(0)), {"reduction": "sum"})
    yield SampleInput((mk(4, 5), class_targets(4)), {"reduce": False})


def nll_loss_errors(device):
    r = make_tensor
    x, t = r((4, 5)), class_targets(4)
    yield err((x, t), ValueError, "bad is not a valid value for reduction", {"reduction": "bad"})
    yield err((r(()), torch.tensor(0)), ValueError, r"Expected 1 or more dimensions \(got 0\)")
    yield err((x, r((4,))), RuntimeError, "expected target dtype to be Long or Byte, but got Float")
    yield err((x, class_targets(3)), ValueError, r"Expected input batch_size \(4\) to match target batch_size \(3\).")
    yield err((r((2, 5, 3)), class_targets(2, 4)), RuntimeError, r"Expected target size \[2, 3\], got \[2, 4\]")
    yield err((x, t, r((4,))), RuntimeError, "weight tensor should be defined either for all 5 classes or no classes")
    yield err((x, t, r((5,), dtype=torch.float64)), RuntimeError, "expected scalar type Float but found Double")
    yield err((r((4, 5), dtype=torch.int64), t), NotImplementedError,
              "\"nll_loss_out_frame\" not implemented for 'Long'")


def mse_loss_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 3), mk(2, 3)))
    yield SampleInput((mk(2, 3), mk(2, 3)), {"reduction": "none"})
    yield SampleInput((mk(2, 3), mk(2, 3)), {"reduction": "sum"})
    yield SampleInput((mk(), mk()))
    yield SampleInput((mk(0, 3), mk(0, 3)))  # mean of nothing: nan
    yield SampleInput((mk(0, 3), mk(0, 3)), {"reduction": "sum"})
    yield SampleInput((mk(2, 3, noncontiguous=True), mk(3, 2).T), {"size_average": False})
    yield SampleInput((mk(2, 3), mk(2, 3), None, None, "mean", make_tensor((2, 3), dtype=dtype, low=0, high=2)))
    yield SampleInput((mk(2, 3), mk(2, 3)),
                      {"weight": make_tensor((2, 3), dtype=dtype, low=0.5, high=2), "reduction": "sum"})


def mse_loss_errors(device):
    r = make_tensor
    x = r((2, 3))
    yield err((x, x), ValueError, "avg is not a valid value for reduction", {"reduction": "avg"})
    yield err((x, x), ValueError, "Weights and input must have the same size.", {"weight": r((3,))})
    yield err((x, x), ValueError, "Invalid reduction mode: avg. Expected one of 'none', 'mean', 'sum'.",
              {"weight": x, "reduction": "avg"})
    yield err((r((2, 3), dtype=torch.int64), r((2, 3), dtype=torch.int64)), NotImplementedError,
              "\"mse_cpu\" not implemented for 'Long'")
    yield err((x, r((4, 3))), RuntimeError,
              r"The size of tensor a \(3\) must match the size of tensor b \(4\) at non-singleton dimension 0|The size "
              r"of tensor a \(2\) must match the size of tensor b \(4\) at non-singleton dimension 0")


# -- attention -------------------------------------------------------------------------------
def sdpa_samples(device, dtype):
    mk = mk_fn(device, dtype)
    q, k, v = mk(2, 3, 4, 8), mk(2, 3, 4, 8), mk(2, 3, 4, 8)
    bool_mask = make_tensor((4, 4), dtype=torch.bool)
    bool_mask[:, 0] = True  # every query sees something ...
    yield SampleInput((q, k, v))
    yield SampleInput((mk(3, 4, 8), mk(3, 6, 8), mk(3, 6, 5)))  # L != S, value's own embedding size
    yield SampleInput((mk(4, 8), mk(4, 8), mk(4, 8)))
    yield SampleInput((q, k, v, bool_mask))
    yield SampleInput((q, k, v, make_tensor((2, 1, 4, 4), dtype=torch.bool)))  # ... or, here, maybe nothing: zeros
    yield SampleInput((q, k, v, mk(4, 4)))  # float mask, added to the scores
    yield SampleInput((q, k, v), {"attn_mask": torch.full((4, 4), float("-inf")).triu(1).to(dtype)})
    yield SampleInput((q, k, v), {"is_causal": True})
    yield SampleInput((mk(1, 2, 3, 8), mk(1, 2, 5, 8), mk(1, 2, 5, 8)), {"is_causal": True})  # L < S
    yield SampleInput((mk(1, 2, 5, 8), mk(1, 2, 3, 8), mk(1, 2, 3, 8)), {"is_causal": True})  # L > S
    yield SampleInput((q, k, v, bool_mask), {"is_causal": True})  # both: torch combines them
    yield SampleInput((q, k, v), {"scale": 0.3})
    yield SampleInput((mk(2, 6, 4, 8), mk(2, 2, 4, 8), mk(2, 3, 4, 8)), {"enable_gqa": True})
    yield SampleInput((mk(2, 6, 4, 8), mk(2, 3, 4, 8), mk(2, 3, 4, 8)), {"enable_gqa": True, "is_causal": True})
    yield SampleInput((q, k, v), {"enable_gqa": True})
    yield SampleInput((mk(2, 0, 8), mk(2, 4, 8), mk(2, 4, 8)))
    yield SampleInput((mk(2, 4, 8), mk(2, 0, 8), mk(2, 0, 8)))  # nothing to attend to: zeros
    yield SampleInput((mk(2, 4, 3, 8).transpose(1, 2), k, v, None, 0.0))
    if dtype is not torch.float32:
        yield SampleInput((q, k, v, mk(4, 4, dtype=torch.float32)))  # a float32 mask goes with any query dtype


def sdpa_errors(device):
    r = make_tensor
    q = r((2, 4, 8))
    yield err((r((8,)), r((8,)), r((8,))), RuntimeError,
              "Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: 1 key.dim: 1 and "
              "value.dim: 1 instead.")
    yield err((q, r((2, 4, 8), dtype=torch.float64), q), RuntimeError,
              "Expected query, key, and value to have the same dtype, but got query.dtype: float key.dtype: double and "
              "value.dtype: float instead.")
    yield err((r((2, 4, 8), dtype=torch.int64),) * 3, RuntimeError, "expected scalar type Float but found Long")
    yield err((q, q, q, r((4, 4), dtype=torch.float16)), RuntimeError,
              "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
              "c10::Half and  query.dtype: float instead.")
    yield err((r((2, 6, 4, 8)), r((2, 4, 4, 8)), r((2, 4, 4, 8))), RuntimeError,
              "Number of heads in key and value must divide the number of heads in", {"enable_gqa": True})
    yield err((r((2, 6, 4, 8)), r((2, 4, 4, 8)), r((2, 4, 4, 8))), RuntimeError,
              r"The size of tensor a \(6\) must match the size of tensor b \(4\) at non-singleton dimension 1")
    yield err((q, r((2, 4, 7)), q), RuntimeError,
              r"Expected size for first two dimensions of batch2 tensor to be: \[2, 8\] but got: \[2, 7\].")


# -- dropout ---------------------------------------------------------------------------------
def dropout_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(2, 3),), {"training": False})
    yield SampleInput((mk(2, 3), 1.0, False))
    yield SampleInput((mk(2, 3), 0.0))  # p=0 in training mode keeps everything
    yield SampleInput((mk(2, 3), 1.0, True))  # p=1 in training mode drops everything: deterministic
    yield SampleInput((mk(),), {"p": 0.2, "training": False})
    yield SampleInput((mk(0, 3, noncontiguous=True),), {"training": False})


def dropout_errors(device):
    x = make_tensor((2, 3))
    yield err((x, 1.5), ValueError, "dropout probability has to be between 0 and 1, but got 1.5")
    yield err((x, -0.1, False), ValueError, "dropout probability has to be between 0 and 1, but got -0.1")



# -- more normalizations ---------------------------------------------------------------------
# torch's batch statistics of half-precision inputs are rounded to half (see batch_norm's decomposition); the
# float32 mean can still land on the other side of a half-precision rounding boundary than torch's
# float32 mean can still land on the other side of a half-precision rounding boundary than torch's, and torch's
# kernels for non-contiguous half-precision inputs round elsewhere than its contiguous ones. Samples keep values
# in [-2, 2], so a half-precision ulp of the statistics stays small.
HALF_NORM_TOLERANCES = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 5e-3)}


def norm_mk_fn(device, dtype):
    mk = mk_fn(device, dtype)
    return lambda *shape, dtype=dtype, **kwargs: mk(*shape, dtype=dtype, **({"low": -2, "high": 2} | kwargs))


def rms_norm_samples(device, dtype):
    mk = norm_mk_fn(device, dtype)
    yield SampleInput((mk(2, 3, 4), (4,)))
    yield SampleInput((mk(2, 3, 4), [3, 4], mk(3, 4)))
    yield SampleInput((mk(2, 3, 4), (4,), mk(4), 0.1))
    yield SampleInput((mk(2, 3), torch.Size([2, 3])), {"eps": 1e-3})
    yield SampleInput((mk(5), (5,), mk(5)))
    yield SampleInput((mk(0, 4), (4,), mk(4)))
    yield SampleInput((mk(4, 3, noncontiguous=True).T, (4,)))
    yield SampleInput((torch.zeros(2, 3, device=device, dtype=dtype), (3,)), name="zeros: divided by sqrt(eps)")
    if dtype in HALF:  # float32 weight with a half-precision input
        yield SampleInput((mk(2, 4), (4,), mk(4, dtype=torch.float32)))


def rms_norm_errors(device):
    r = make_tensor
    x = r((2, 3, 4))
    yield err((x, 4), TypeError,
              r"rms_norm\(\): argument 'normalized_shape' \(position 2\) must be tuple of ints, not int")
    yield err((x, ()), RuntimeError, r"Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                                     r"least one element, but got normalized_shape = \[\]")
    yield err((x, (3,)), RuntimeError,
              r"Given normalized_shape=\[3\], expected input with shape \[\*3\], but got input of size\[2, 3, 4\]")
    yield err((x, (2, 4)), RuntimeError, r"Given normalized_shape=\[2, 4\], expected input with shape \[\*2, 4\], but "
                                         r"got input of size\[2, 3, 4\]")
    yield err((x, (4,), r((3,))), RuntimeError, r"Expected weight to be of same shape as normalized_shape, but got "
                                                r"weight of shape \[3\] and normalized_shape = \[4\]")
    yield err((r((2, 4), dtype=torch.int64), (4,)), NotImplementedError, "\"rms_norm\" not implemented for 'Long'")
    yield err((r(()), (1,)), ValueError, "Input tensor must have at least 1 dimensions, but got 0")


def _stats(c, dtype):
    return make_tensor((c,), dtype=dtype), make_tensor((c,), dtype=dtype, low=0.5, high=2)


def gaussian_nll_loss_samples(device, dtype):
    def mk(*shape, **kw):
        return make_tensor(shape, device=device, dtype=dtype, **kw)

    yield SampleInput((mk(4, 3), mk(4, 3), mk(4, 3, low=0.1, high=2)))
    yield SampleInput((mk(4, 3), mk(4, 3), mk(4, low=0.1, high=2)), {"full": True}, name="one variance per row")
    yield SampleInput((mk(2, 3, 4), mk(2, 3, 4), mk(2, 1, 4, low=0.1, high=2)), {"reduction": "sum"})
    yield SampleInput((mk(4, 3, noncontiguous=True), mk(4, 3), 0.5), {"reduction": "none"}, name="float variance")
    yield SampleInput((mk(3), mk(3), mk(3, low=0, high=1e-8)), {"eps": 1e-3}, name="variances clamped to eps")


def gaussian_nll_loss_errors(device):
    x = make_tensor((4, 3), device=device)
    yield err((x, x, -torch.ones(4, 3, device=device)), ValueError, "var has negative entry/entries")
    yield err((x, x, -1.0), ValueError, "var has negative entry/entries")
    yield err((x, x, make_tensor((2, 2), device=device, low=0.1, high=1)), ValueError, "var is of incorrect size")
    yield err((x, x, make_tensor((4, 3), device=device, low=0.1, high=1)), ValueError, "max is not valid",
              {"reduction": "max"})


def batch_norm_running_update(input, running_mean, running_var, weight, bias, momentum, eps):
    """Training-mode batch norm with running statistics as a function (aten's functional form, which tracing
    records as ltorch.native_batch_norm_legit_functional): the output and both new statistics."""
    out, _, _, new_mean, new_var = torch.ops.aten._native_batch_norm_legit_functional.default(
        input, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, new_mean, new_var


def batch_norm_running_update_samples(device, dtype):
    """Training-mode batch norm with running statistics: the output and both updated statistics."""
    mk = norm_mk_fn(device, dtype)
    mean, var = _stats(3, dtype)
    yield SampleInput((mk(4, 3), mean.clone(), var.clone(), None, None, 0.1, 1e-5))
    yield SampleInput((mk(2, 3, 5), mean.clone(), var.clone(), mk(3), mk(3), 0.3, 1e-3))
    yield SampleInput((mk(2, 3, 2, 2, noncontiguous=True), mean.clone(), var.clone(), mk(3), None, 1.0, 1e-5))


def instance_norm_running_update_samples(device, dtype):
    """Instance norm with input statistics and running statistics: the output and both updated statistics."""
    mk = norm_mk_fn(device, dtype)
    mean, var = _stats(3, dtype)
    yield SampleInput((mk(4, 3, 5), mean.clone(), var.clone(), None, None, 0.1, 1e-5))
    yield SampleInput((mk(2, 3, 2, 3, noncontiguous=True), mean.clone(), var.clone(), mk(3), mk(3), 0.5, 1e-3))


def batch_norm_samples(device, dtype):
    mk = norm_mk_fn(device, dtype)
    mean, var = _stats(3, dtype)
    w, b = mk(3), mk(3)
    yield SampleInput((mk(2, 3, 4), mean, var), name="eval")
    yield SampleInput((mk(2, 3, 4), mean, var, w, b), name="eval, affine")
    yield SampleInput((mk(5, 3), mean, var, w, None, False, 0.1, 0.1), name="eval, 2-D")
    yield SampleInput((mk(2, 3, 2, 2), mean, var, None, b), name="eval, 4-D")
    yield SampleInput((mk(0, 3), mean, var, w, b), name="eval, empty batch")
    yield SampleInput((mk(2, 3, 4, noncontiguous=True), mean, var, w, b), name="eval, noncontiguous")
    yield SampleInput((mk(4, 3, 5), None, None), {"training": True}, "batch statistics")
    yield SampleInput((mk(6, 3), None, None, w, b, True), name="batch statistics, 2-D, affine")
    yield SampleInput((mk(2, 3, 2, 2), None, None, w, None, True, 0.1, 0.01), name="batch statistics, 4-D")
    yield SampleInput((mk(0, 3, 2), None, None), {"training": True}, "batch statistics, empty batch")
    # aten checks nothing
    yield SampleInput((mk(0), None, None), {"training": True}, "batch statistics, empty 1-D input")
    yield SampleInput((mk(0), mk(0), mk(0)), name="eval, empty 1-D input")
    yield SampleInput((mk(4, 2, 3).transpose(1, 2), None, None, w, b, True), name="batch statistics, transposed")
    if dtype in HALF:  # float32 statistics and parameters with a half-precision input
        f32_mean, f32_var = _stats(3, torch.float32)
        yield SampleInput((mk(2, 3, 4), f32_mean, f32_var, mk(3, dtype=torch.float32), mk(3, dtype=torch.float32)))
        yield SampleInput((mk(4, 3, 5), None, None, mk(3, dtype=torch.float32), mk(3, dtype=torch.float32), True))


def batch_norm_errors(device):
    r = make_tensor
    x = r((2, 3, 4))
    mean, var = _stats(3, torch.float32)
    yield err((x, None, None), RuntimeError, "running_mean must be defined in evaluation mode")
    yield err((x, mean, None), RuntimeError, "running_var must be defined in evaluation mode")
    yield err((r((1, 3)), None, None), ValueError, r"Expected more than 1 value per channel when training, got input "
                                                   r"size torch.Size\(\[1, 3\]\)", {"training": True})
    yield err((r((1, 3, 1)), None, None), ValueError, r"Expected more than 1 value per channel when training, got "
                                                      r"input size torch.Size\(\[1, 3, 1\]\)", {"training": True})
    yield err((x, r((4,)), var), RuntimeError, "running_mean should contain 3 elements not 4")
    yield err((x, mean, var, r((4,))), RuntimeError, "weight should contain 3 elements not 4")
    yield err((x, mean, var, None, r((4,))), RuntimeError, "bias should contain 3 elements not 4")
    yield err((x, None, None, r((4,))), RuntimeError, "weight should contain 3 elements not 4", {"training": True})
    yield err((r((3,)), mean, var), RuntimeError, "running_mean should contain 0 elements not 3")
    yield err((r((2, 3, 4), dtype=torch.int64), mean, var), NotImplementedError,
              "\"batch_norm\" not implemented for 'Long'")
    yield err((x, mean.double(), var.double()), RuntimeError,
              r"mixed dtype \(CPU\): expect parameter to have scalar type of Float")
    yield err((x, None, None, r((3,), dtype=torch.float64)), RuntimeError,
              r"mixed dtype \(CPU\): expect parameter to have scalar type of Float", {"training": True})


def instance_norm_samples(device, dtype):
    mk = norm_mk_fn(device, dtype)
    mean, var = _stats(3, dtype)
    yield SampleInput((mk(2, 3, 4),))
    yield SampleInput((mk(2, 3, 2, 2), None, None, mk(3), mk(3)), name="affine")
    yield SampleInput((mk(1, 3, 5),), {"eps": 0.1})
    yield SampleInput((mk(2, 3, 4), mean, var), {"use_input_stats": False}, "running statistics")
    yield SampleInput((mk(0, 3, 4),), name="empty batch")
    yield SampleInput((mk(2, 4, 3).transpose(1, 2),), name="transposed")


def instance_norm_errors(device):
    r = make_tensor
    x = r((2, 3, 4))
    mean, var = _stats(3, torch.float32)
    yield err((r((2, 3)),), ValueError,
              r"Expected more than 1 spatial element when training, got input size torch.Size\(\[2, 3\]\)")
    yield err((r((2, 3, 1)),), ValueError,
              r"Expected more than 1 spatial element when training, got input size torch.Size\(\[2, 3, 1\]\)")
    yield err((x,), RuntimeError, "Expected running_mean and running_var to be defined when use_input_stats is false",
              {"use_input_stats": False})
    yield err((x,), RuntimeError, "weight should contain 6 elements not 8", {"weight": r((4,))})
    yield err((r((2, 3, 4), dtype=torch.int64),), NotImplementedError, "\"batch_norm\" not implemented for 'Long'")


def group_norm_samples(device, dtype):
    mk = norm_mk_fn(device, dtype)
    yield SampleInput((mk(2, 6, 3), 3))
    yield SampleInput((mk(2, 6, 3, 2), 2, mk(6), mk(6)))
    yield SampleInput((mk(2, 6, 3), 1, mk(6)), {"eps": 0.1})
    yield SampleInput((mk(3, 8), 2, None, mk(8)), name="2-D")
    yield SampleInput((mk(2, 6, 3), 6), name="a group per channel")
    yield SampleInput((mk(0, 6, 3), 3), name="empty batch")
    yield SampleInput((mk(2, 6, 0), 3), name="empty spatial")
    yield SampleInput((mk(2, 3, 6).transpose(1, 2), 2, mk(6), mk(6)), name="transposed")
    if dtype in HALF:
        yield SampleInput((mk(2, 4, 3), 2, mk(4, dtype=torch.float32), mk(4, dtype=torch.float32)))


def group_norm_errors(device):
    r = make_tensor
    x = r((2, 6, 3))
    yield err((x, 4), RuntimeError, r"Expected number of channels in input to be divisible by num_groups, but got "
                                    r"input of shape \[2, 6, 3\] and num_groups=4")
    yield err((r((6,)), 3), RuntimeError, "Expected at least 2 dimensions for input tensor but received 1")
    yield err((x, 0), ZeroDivisionError, "integer division or modulo by zero")
    yield err((r((1, 2)), 2), ValueError,
              r"Expected more than 1 value per channel when training, got input size \[1, 2\]")
    yield err((x, 3, r((5,))), RuntimeError, r"Expected weight to be a vector of size equal to the number of channels "
                                             r"in input, but got weight of shape \[5\] and input of shape \[2, 6, 3\]")
    yield err((x, 3, None, r((5,))), RuntimeError,
              "Expected bias to be a vector of size equal to the number of channels in input")
    yield err((r((2, 6, 3), dtype=torch.int64), 3), NotImplementedError,
              "\"GroupNormKernelImpl\" not implemented for 'Long'")
    yield err((x, 3, r((6,), dtype=torch.float64)), RuntimeError,
              r"mixed dtype \(CPU\): expect parameter to have scalar type of Float")


# -- more losses -----------------------------------------------------------------------------
def _pair_loss_samples(extra=({},), *, legacy=True):
    """input/target pairs for an elementwise loss, every reduction, with each extra kwargs variant."""
    def sample_inputs(device, dtype):
        mk = mk_fn(device, dtype)
        for kwargs in extra:
            for reduction in ("mean", "sum", "none"):
                yield SampleInput((mk(2, 3), mk(2, 3)), {**kwargs, "reduction": reduction})
        yield SampleInput((mk(), mk()), name="0-dim")
        yield SampleInput((mk(0, 3), mk(0, 3)), name="empty: mean is nan")
        yield SampleInput((mk(0, 3), mk(0, 3)), {"reduction": "sum"}, "empty")
        yield SampleInput((mk(3, 4, noncontiguous=True), mk(4, 3).T), {"reduction": "none"}, "noncontiguous")
        yield SampleInput((mk(2, 3), mk(3)), name="broadcast target")
        if legacy:
            yield SampleInput((mk(2, 3), mk(2, 3), False), name="size_average=False")
            yield SampleInput((mk(2, 3), mk(2, 3)), {"reduce": False}, "reduce=False")
        if dtype.is_floating_point:
            x = torch.tensor((*EXTREMAL_VALUES, 2.0), device=device, dtype=dtype)
            yield SampleInput((x, x.flip(0)), {"reduction": "none"}, "extremal values")
    return sample_inputs


EXTREMAL_VALUES = (float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1.0, -1.0)


def _reduction_errors(*extra):
    def error_inputs(device):
        x = make_tensor((2, 3))
        yield err((x, x), ValueError, "avg is not a valid value for reduction", {"reduction": "avg"})
        yield err((x, make_tensor((4,))), RuntimeError,
                  r"The size of tensor a \(3\) must match the size of tensor b \(4\) at non-singleton dimension 1")
        for e in extra:
            yield e(device)
    return error_inputs


def _int_loss_error(kernel):
    i = torch.ones(2, 3, dtype=torch.int64)
    return lambda device: err((i, i), NotImplementedError, f"\"{kernel}\" not implemented for 'Long'")


def huber_weighted_samples(device, dtype):
    mk = mk_fn(device, dtype)
    w = make_tensor((2, 3), device=device, dtype=dtype, low=0, high=2)
    for reduction in ("mean", "sum", "none"):
        yield SampleInput((mk(2, 3), mk(2, 3)), {"reduction": reduction, "weight": w})
    yield SampleInput((mk(2, 3), mk(2, 3), "mean", 0.5, w), name="positional weight")


def bce_samples(device, dtype):
    p = lambda *shape, **kw: make_tensor(shape, device=device, dtype=dtype, low=0.01, high=0.99, **kw)
    for reduction in ("mean", "sum", "none"):
        yield SampleInput((p(2, 3), p(2, 3)), {"reduction": reduction})
        yield SampleInput((p(2, 3), p(2, 3), p(3)), {"reduction": reduction}, "broadcast weight")
    yield SampleInput((p(2, 3), p(2, 3), p(2, 3)), name="weight")
    yield SampleInput((p(), p()), name="0-dim")
    yield SampleInput((p(0, 3), p(0, 3)), name="empty")
    yield SampleInput((p(3, 4, noncontiguous=True), p(4, 3).T), {"reduction": "none"}, "noncontiguous")
    yield SampleInput((p(2, 3), p(2, 3)), {"size_average": False})
    # log clamped at -100: a certain wrong prediction costs 100, not inf
    edges = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.5], device=device, dtype=dtype)
    yield SampleInput((edges, torch.tensor([0.0, 1.0, 1.0, 0.0, 0.3], device=device, dtype=dtype)),
                      {"reduction": "none"}, "0 and 1")


def bce_errors(device):
    r = make_tensor
    x = r((2, 3), low=0, high=1)
    yield err((x, x), ValueError, "avg is not a valid value for reduction", {"reduction": "avg"})
    yield err((x, r((3,), low=0, high=1)), ValueError,
              r"Using a target size \(torch.Size\(\[3\]\)\) that is different to the input size \(torch.Size\(\[2, "
              r"3\]\)\) is deprecated. Please ensure they have the same size.")
    yield err((x, x, r((4,))), RuntimeError,
              r"Attempting to broadcast a dimension of length 4 at -1! Mismatching argument at index 1 had "
              r"torch.Size\(\[4\]\); but expected shape should be broadcastable to \[2, 3\]")
    yield err((r((2, 3), dtype=torch.int64),) * 2, NotImplementedError,
              "\"binary_cross_entropy\" not implemented for 'Long'")
    yield err((x, x.double()), RuntimeError, "Found dtype Double but expected Float")
    # checked when the compiled function runs
    yield err((torch.tensor([0.5, 1.5]), torch.tensor([0.0, 1.0])), RuntimeError,
              "all elements of input should be between 0 and 1")
    yield err((torch.tensor([float("nan")]), torch.tensor([1.0])), RuntimeError,
              "all elements of input should be between 0 and 1")


def bce_logits_samples(device, dtype):
    mk = mk_fn(device, dtype)
    p = lambda *shape: make_tensor(shape, device=device, dtype=dtype, low=0, high=1)
    pw = lambda *shape: make_tensor(shape, device=device, dtype=dtype, low=0.1, high=3)
    for reduction in ("mean", "sum", "none"):
        yield SampleInput((mk(2, 3), p(2, 3)), {"reduction": reduction})
        yield SampleInput((mk(2, 3), p(2, 3), pw(3)), {"reduction": reduction, "pos_weight": pw(3)},
                          "weight and pos_weight")
    yield SampleInput((mk(2, 3), p(2, 3), pw(2, 3)), name="weight")
    yield SampleInput((mk(2, 3), p(2, 3)), {"pos_weight": pw(2, 3)}, "pos_weight")
    yield SampleInput((mk(2, 3), p(2, 3)), {"pos_weight": pw(1)}, "one pos_weight")
    yield SampleInput((mk(), p()), name="0-dim")
    yield SampleInput((mk(0, 3), p(0, 3)), name="empty")
    yield SampleInput((mk(3, 4, noncontiguous=True), p(4, 3).T), {"reduction": "none"}, "noncontiguous")
    yield SampleInput((mk(2, 3), p(2, 3)), {"reduce": False})
    big = torch.tensor([-100.0, 100.0, 0.0, 30.0, -30.0], device=device, dtype=dtype)
    yield SampleInput((big, torch.tensor([0.0, 1.0, 0.3, 0.0, 1.0], device=device, dtype=dtype)), {"reduction": "none"},
                      "large logits: no overflow")


def bce_logits_errors(device):
    r = make_tensor
    x = r((2, 3))
    yield err((x, x), ValueError, "avg is not a valid value for reduction", {"reduction": "avg"})
    yield err((x, r((3,))), ValueError,
              r"Target size \(torch.Size\(\[3\]\)\) must be the same as input size \(torch.Size\(\[2, 3\]\)\)")
    yield err((x, x), RuntimeError, r"The size of tensor a \(4\) must match the size of tensor b \(3\) at "
                                    r"non-singleton dimension 1", {"pos_weight": r((4,))})
    yield err((x, x, r((4,))), RuntimeError,
              r"The size of tensor a \(3\) must match the size of tensor b \(4\) at non-singleton dimension 1")
    yield err((r((2, 3), dtype=torch.int64), x), NotImplementedError, "\"log_sigmoid_cpu\" not implemented for 'Long'")
    yield err((x, r((2, 3), dtype=torch.int64)), RuntimeError,
              "result type Float can't be cast to the desired output type Long")


def kl_div_samples(device, dtype):
    mk = mk_fn(device, dtype)
    p = lambda *shape: make_tensor(shape, device=device, dtype=dtype, low=0, high=1)
    for reduction in ("mean", "sum", "none", "batchmean"):
        yield SampleInput((mk(3, 4), p(3, 4)), {"reduction": reduction})
        yield SampleInput((mk(3, 4), mk(3, 4)), {"reduction": reduction, "log_target": True}, "log target")
    yield SampleInput((mk(), p()), {"reduction": "batchmean"}, "0-dim")
    yield SampleInput((mk(0, 4), p(0, 4)), {"reduction": "sum"}, "empty")
    yield SampleInput((mk(0, 4), p(0, 4)), {"reduction": "batchmean"}, "empty batch")
    yield SampleInput((mk(3, 4), p(4)), {"reduction": "none"}, "broadcast target")
    yield SampleInput((mk(4, 3, noncontiguous=True).T, p(3, 4)), {"reduction": "batchmean"}, "noncontiguous")
    yield SampleInput((mk(3, 4), p(3, 4), False), name="size_average=False")
    yield SampleInput((mk(3, 4), p(3, 4), None, True, "batchmean"), name="legacy reduce with batchmean")
    zeros = torch.tensor([0.0, 0.5, float("nan"), 1.0, 0.0], device=device, dtype=dtype)
    yield SampleInput((mk(5), zeros), {"reduction": "none"}, "zero and NaN targets")


def kl_div_errors(device):
    r = make_tensor
    x = r((2, 3))
    yield err((x, x), ValueError, "avg is not a valid value for reduction", {"reduction": "avg"})
    yield err((x, r((4,))), RuntimeError,
              r"The size of tensor a \(4\) must match the size of tensor b \(3\) at non-singleton dimension 1|The size "
              r"of tensor a \(3\) must match the size of tensor b \(4\) at non-singleton dimension 1")
    yield err((x, r((2, 3), dtype=torch.int64)), RuntimeError, "kl_div: Integral inputs not supported.")
    yield err((r((2, 3), dtype=torch.int64), x), RuntimeError, "kl_div: Integral inputs not supported.")


def soft_margin_samples(device, dtype):
    mk = mk_fn(device, dtype)
    sign = lambda *shape: (make_tensor(shape, dtype=torch.int64, low=0, high=2) * 2 - 1).to(device=device, dtype=dtype)
    for reduction in ("mean", "sum", "none"):
        yield SampleInput((mk(2, 3), sign(2, 3)), {"reduction": reduction})
    yield SampleInput((mk(), sign()), name="0-dim")
    yield SampleInput((mk(0, 3), sign(0, 3)), name="empty")
    yield SampleInput((mk(2, 3), sign(3)), {"reduction": "none"}, "broadcast target")
    yield SampleInput((mk(3, 4, noncontiguous=True), sign(4, 3).T), name="noncontiguous")
    yield SampleInput((mk(2, 3), sign(2, 3)), {"reduce": False})


def soft_margin_errors(device):
    r = make_tensor
    x = r((2, 3))
    yield err((x, x), ValueError, "avg is not a valid value for reduction", {"reduction": "avg"})
    yield err((x, r((4,))), RuntimeError,
              r"The size of tensor a \(3\) must match the size of tensor b \(4\) at non-singleton dimension 1")
    yield err((r((2, 3), dtype=torch.int64), x), RuntimeError,
              "result type Float can't be cast to the desired output type Long")


def softmin_samples(device, dtype):
    mk = mk_fn(device, dtype)
    yield SampleInput((mk(3, 4), 1))
    yield SampleInput((mk(3, 4), 0))
    yield SampleInput((mk(2, 3, 4),), {"dim": -1})
    yield SampleInput((mk(3, 4),), name="implicit dim")
    yield SampleInput((mk(), 0), name="0-dim")
    yield SampleInput((mk(0, 4), 1), name="empty")
    yield SampleInput((mk(3, 4, noncontiguous=True), 1), name="noncontiguous")
    yield SampleInput((mk(3, 4), 1), {"dtype": torch.float64}, "dtype")
    if dtype.is_floating_point:
        yield SampleInput((torch.tensor([EXTREMAL_VALUES[3:], EXTREMAL_VALUES[:4]], device=device, dtype=dtype), 1),
                          name="extremal values")


def softmin_errors(device):
    yield err((make_tensor((3, 4)), 2), IndexError,
              r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)")
    yield err((make_tensor((3, 4), dtype=torch.bool), 1), RuntimeError,
              "Negation, the `-` operator, on a bool tensor is not supported")

opinfos: list[OpInfo] = [
    OpInfo("matmul", torch.matmul, matmul_samples, MATMUL_DTYPES, matmul_errors),
    OpInfo("matmul.method", method("matmul"), matmul_samples, SOME[:2], matmul_errors),
    OpInfo("matmul.operator", operator.matmul, matmul_samples, SOME[:2], matmul_errors),
    OpInfo("Tensor.__rmatmul__.captured_left", captured_left_matmul, rmatmul_samples, MATMUL_DTYPES),
    OpInfo("Tensor.__rmatmul__", explicit_rmatmul, matmul_samples, SOME[:2]),
    OpInfo("mm", torch.mm, mm_samples, MATMUL_DTYPES, mm_errors),
    OpInfo("mm.method", method("mm"), mm_samples, SOME[:2], mm_errors),
    OpInfo("bmm", torch.bmm, bmm_samples, MATMUL_DTYPES, bmm_errors),
    OpInfo("bmm.method", method("bmm"), bmm_samples, SOME[:2], bmm_errors),
    OpInfo("linear", F.linear, linear_samples, MATMUL_DTYPES, linear_errors),
    OpInfo("layer_norm", F.layer_norm, layer_norm_samples, FLOATS, layer_norm_errors),
    OpInfo("embedding", F.embedding, embedding_samples, ALL, embedding_errors),
    OpInfo("cross_entropy", F.cross_entropy, cross_entropy_samples, FLOATS, cross_entropy_errors,
           dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("nll_loss", F.nll_loss, nll_loss_samples, FLOATS, nll_loss_errors, dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("mse_loss", F.mse_loss, mse_loss_samples, FLOATS, mse_loss_errors),
    # torch's CPU attention accumulates blockwise (flash-style), ours in one pass: equal up to rounding
    OpInfo("scaled_dot_product_attention", F.scaled_dot_product_attention, sdpa_samples, FLOATS, sdpa_errors,
           dtype_tolerances={torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-2, 2e-2)}),
    OpInfo("dropout", F.dropout, dropout_samples, ALL, dropout_errors),
    OpInfo("rms_norm", F.rms_norm, rms_norm_samples, FLOATS, rms_norm_errors),
    OpInfo("batch_norm", F.batch_norm, batch_norm_samples, FLOATS, batch_norm_errors,
           dtype_tolerances=HALF_NORM_TOLERANCES),
    OpInfo("gaussian_nll_loss", F.gaussian_nll_loss, gaussian_nll_loss_samples, FLOATS, gaussian_nll_loss_errors,
           dtype_tolerances=HALF_NORM_TOLERANCES),
    OpInfo("batch_norm_running_update", batch_norm_running_update, batch_norm_running_update_samples, FLOATS,
           dtype_tolerances=HALF_NORM_TOLERANCES),
    OpInfo("instance_norm_running_update", instance_norm_running_update, instance_norm_running_update_samples, FLOATS,
           dtype_tolerances=HALF_NORM_TOLERANCES),
    OpInfo("instance_norm", F.instance_norm, instance_norm_samples, FLOATS, instance_norm_errors,
           dtype_tolerances=HALF_NORM_TOLERANCES),
    OpInfo("group_norm", F.group_norm, group_norm_samples, FLOATS, group_norm_errors,
           dtype_tolerances=HALF_NORM_TOLERANCES),
    OpInfo("l1_loss", F.l1_loss, _pair_loss_samples(), FLOATS, _reduction_errors()),
    # torch's half-precision smooth_l1/huber kernels differ between float16 and bfloat16 in what they round
    # (|x - y|, beta) before computing in float32; the decompositions compute in float32 and round once
    OpInfo("smooth_l1_loss", F.smooth_l1_loss, _pair_loss_samples(({}, {"beta": 0.5}, {"beta": 0.0})), FLOATS,
           _reduction_errors(_int_loss_error("smooth_l1_cpu"),
                             lambda d: err((make_tensor((2,)),) * 2, RuntimeError,
                                           "smooth_l1_loss does not support negative values for beta.",
                                           {"beta": -1.0})),
           dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("huber_loss", F.huber_loss, _pair_loss_samples(({}, {"delta": 0.5}, {"delta": 2.0}), legacy=False), FLOATS,
           _reduction_errors(_int_loss_error("huber_cpu"),
                             lambda d: err((make_tensor((2,)),) * 2, RuntimeError,
                                           "huber_loss does not support non-positive values for delta.",
                                           {"delta": 0.0}),
                             lambda d: err((make_tensor((2, 3)),) * 2, ValueError,
                                           "Weights and input must have the same size.",
                                           {"weight": make_tensor((3,))})),
           dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("huber_loss.weighted", F.huber_loss, huber_weighted_samples, FLOATS, dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("binary_cross_entropy", F.binary_cross_entropy, bce_samples, FLOATS, bce_errors,
           dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits, bce_logits_samples, FLOATS,
           bce_logits_errors, dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("kl_div", F.kl_div, kl_div_samples, FLOATS, kl_div_errors, dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("soft_margin_loss", F.soft_margin_loss, soft_margin_samples, FLOATS, soft_margin_errors,
           dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("softmin", F.softmin, softmin_samples, FLOATS, softmin_errors),
]
