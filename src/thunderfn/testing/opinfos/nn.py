"""OpInfos for thunderfn.torch.nn: the matmul family, linear, layer_norm, embedding, the losses,
scaled_dot_product_attention and dropout. (softmax and log_softmax live with the reductions.)"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from thunderfn.errors import UnsupportedOpError
from thunderfn.testing.opinfo import ALL, FLOATS, OpInfo, SampleInput, make_tensor
from thunderfn.testing.opinfos.shape import SOME, err, method

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
    yield err((r((3,)), r((4,))), RuntimeError, r"inconsistent tensor size, expected tensor \[3\] and src \[4\] to have the same number of elements")
    yield err((r((2, 3)), r((4, 2))), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x2\)")
    yield err((r((5, 2, 3)), r((4, 2))), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied \(10x3 and 4x2\)")
    yield err((r((3,)), r((4, 2))), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied \(1x3 and 4x2\)")
    yield err((r((5, 2, 3)), r((4,))), RuntimeError, r"size mismatch, got input \(10\), mat \(10x3\), vec \(4\)")
    yield err((r((5, 2, 3)), r((5, 4, 2))), RuntimeError, r"Expected size for first two dimensions of batch2 tensor to be: \[5, 3\] but got: \[5, 4\].")
    yield err((r((2, 2, 3)), r((3, 3, 2))), RuntimeError, r"The size of tensor a \(2\) must match the size of tensor b \(3\) at non-singleton dimension 0")
    yield err((r((2, 3)), r((3, 4), dtype=torch.float64)), RuntimeError, "expected m1 and m2 to have the same dtype, but got: float != double")
    yield err((r((3,)), r((3,), dtype=torch.int32)), RuntimeError, "dot : expected both vectors to have same dtype, but found Float and Int")


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
    yield err((r((2, 3)), r((3, 4), dtype=torch.float64)), RuntimeError, "expected m1 and m2 to have the same dtype, but got: float != double")


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
    yield err((r((2, 2, 3)), r((3, 3, 4))), RuntimeError, r"Expected size for first two dimensions of batch2 tensor to be: \[2, 3\] but got: \[3, 3\].")
    yield err((r((2, 2, 3)), r((2, 4, 4))), RuntimeError, r"Expected size for first two dimensions of batch2 tensor to be: \[2, 3\] but got: \[2, 4\].")
    yield err((r((2, 2, 3)), r((2, 3, 4), dtype=torch.float16)), RuntimeError, "expected scalar type Float but found Half")


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
    yield err((x, r((4, 3), dtype=torch.float64)), RuntimeError, "expected m1 and m2 to have the same dtype, but got: float != double")
    yield err((x, w, r((4,), dtype=torch.float64)), RuntimeError, "self and mat2 must have the same dtype, but got Double and Float")
    yield err((x, w, r((5,))), RuntimeError, r"The expanded size of the tensor \(4\) must match the existing size \(5\) at non-singleton dimension 1.  Target sizes: \[2, 4\].  Tensor sizes: \[5\]")
    yield err((r((5, 2, 3)), w, r((5,))), RuntimeError, r"The expanded size of the tensor \(4\) must match the existing size \(5\) at non-singleton dimension 1.  Target sizes: \[10, 4\]")


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
    yield err((x, 4), TypeError, r"layer_norm\(\): argument 'normalized_shape' \(position 2\) must be tuple of ints, not int")
    yield err((x, ()), RuntimeError, r"Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got normalized_shape = \[\]")
    yield err((x, (3,)), RuntimeError, r"Given normalized_shape=\[3\], expected input with shape \[\*, 3\], but got input of size\[2, 3, 4\]")
    yield err((r((4,)), (2, 4)), RuntimeError, r"Given normalized_shape=\[2, 4\], expected input with shape \[\*, 2, 4\], but got input of size\[4\]")
    yield err((x, (4,), r((3,))), RuntimeError, r"Expected weight to be of same shape as normalized_shape, but got weight of shape \[3\] and normalized_shape = \[4\]")
    yield err((x, (4,), r((4,)), r((5,))), RuntimeError, r"Expected bias to be of same shape as normalized_shape, but got bias of shape \[5\] and normalized_shape = \[4\]")
    yield err((r((2, 4), dtype=torch.int64), (4,)), NotImplementedError, "\"LayerNormKernelImpl\" not implemented for 'Long'")
    yield err((r((2, 4)), (4,), r((4,), dtype=torch.float64)), RuntimeError, r"mixed dtype \(CPU\): expect parameter to have scalar type of Float")


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
              r"Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got torch.FloatTensor instead")
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
    yield err((x, t, r((4,))), RuntimeError, r"weight tensor should be defined either for all 5 classes or no classes but got weight tensor of shape: \[4\]")
    yield err((x, probabilities(4, 5), r((4,))), RuntimeError, r"cross_entropy: weight tensor should be defined either for all 5 classes")
    yield err((x, probabilities(4, 5)), RuntimeError, "ignore_index is not supported for floating point target", {"ignore_index": 1})
    yield err((r(()), torch.tensor(0)), RuntimeError, "Expected floating point type for target with class probabilities, got Long")
    yield err((r((4, 5), dtype=torch.int64), t), NotImplementedError, "not implemented for 'Long'")
    yield err((r((5,)), class_targets(2)), ValueError, "For 1D input, 1D target must have size 1, but got target size: 2")


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
    yield err((r((4, 5), dtype=torch.int64), t), NotImplementedError, "\"nll_loss_out_frame\" not implemented for 'Long'")


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
    yield SampleInput((mk(2, 3), mk(2, 3)), {"weight": make_tensor((2, 3), dtype=dtype, low=0.5, high=2), "reduction": "sum"})


def mse_loss_errors(device):
    r = make_tensor
    x = r((2, 3))
    yield err((x, x), ValueError, "avg is not a valid value for reduction", {"reduction": "avg"})
    yield err((x, x), ValueError, "Weights and input must have the same size.", {"weight": r((3,))})
    yield err((x, x), ValueError, "Invalid reduction mode: avg. Expected one of 'none', 'mean', 'sum'.", {"weight": x, "reduction": "avg"})
    yield err((r((2, 3), dtype=torch.int64), r((2, 3), dtype=torch.int64)), NotImplementedError, "\"mse_cpu\" not implemented for 'Long'")
    yield err((x, r((4, 3))), RuntimeError, r"The size of tensor a \(3\) must match the size of tensor b \(4\) at non-singleton dimension 0|The size of tensor a \(2\) must match the size of tensor b \(4\) at non-singleton dimension 0")


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
    yield err((r((8,)), r((8,)), r((8,))), RuntimeError, "Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: 1 key.dim: 1 and value.dim: 1 instead.")
    yield err((q, r((2, 4, 8), dtype=torch.float64), q), RuntimeError, "Expected query, key, and value to have the same dtype, but got query.dtype: float key.dtype: double and value.dtype: float instead.")
    yield err((r((2, 4, 8), dtype=torch.int64),) * 3, RuntimeError, "expected scalar type Float but found Long")
    yield err((q, q, q, r((4, 4), dtype=torch.float16)), RuntimeError, "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: c10::Half and  query.dtype: float instead.")
    yield err((r((2, 6, 4, 8)), r((2, 4, 4, 8)), r((2, 4, 4, 8))), RuntimeError, "Number of heads in key and value must divide the number of heads in", {"enable_gqa": True})
    yield err((r((2, 6, 4, 8)), r((2, 4, 4, 8)), r((2, 4, 4, 8))), RuntimeError, r"The size of tensor a \(6\) must match the size of tensor b \(4\) at non-singleton dimension 1")
    yield err((q, r((2, 4, 7)), q), RuntimeError, r"Expected size for first two dimensions of batch2 tensor to be: \[2, 8\] but got: \[2, 7\].")


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
    yield err((x, 0.5, False, True), UnsupportedOpError, r"dropout\(inplace=True\) mutates its input", torch_raises=False)


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
    OpInfo("cross_entropy", F.cross_entropy, cross_entropy_samples, FLOATS, cross_entropy_errors, dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("nll_loss", F.nll_loss, nll_loss_samples, FLOATS, nll_loss_errors, dtype_tolerances=HALF_LOSS_TOLERANCES),
    OpInfo("mse_loss", F.mse_loss, mse_loss_samples, FLOATS, mse_loss_errors),
    # torch's CPU attention accumulates blockwise (flash-style), ours in one pass: equal up to rounding
    OpInfo("scaled_dot_product_attention", F.scaled_dot_product_attention, sdpa_samples, FLOATS, sdpa_errors,
           dtype_tolerances={torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-2, 2e-2)}),
    OpInfo("dropout", F.dropout, dropout_samples, ALL, dropout_errors),
]
