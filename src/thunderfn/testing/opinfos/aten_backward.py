"""OpInfos for thunderfn/torch/aten_backward.py: aten's backward kernels (and the forwards whose saved values they
read), called as the OpOverloads a user (or a VJP rule) writes; tracing routes each to its symbol."""
import torch

from thunderfn.testing.opinfo import OpInfo, SampleInput, make_tensor

aten = torch.ops.aten
DTYPES = (torch.float32, torch.float64)


def _pair(device, dtype, shape=(3, 4)):
    return (make_tensor(shape, device=device, dtype=dtype),
            make_tensor(shape, device=device, dtype=dtype, low=-4, high=4))


def gelu_backward_samples(device, dtype):
    g, x = _pair(device, dtype)
    yield SampleInput((g, x))
    yield SampleInput((g, x), {"approximate": "tanh"}, name="tanh")


def output_samples(fn):
    def samples(device, dtype):
        g, x = _pair(device, dtype)
        yield SampleInput((g, fn(x)))
    return samples


def threshold_backward_samples(device, dtype):
    g, x = _pair(device, dtype)
    yield SampleInput((g, x, 0))
    yield SampleInput((g, x, 0.5))


def input_samples(device, dtype):
    """(grad, x) with x on both sides of the kinks at -3, 0 and 3, and on them."""
    g, x = _pair(device, dtype, (3, 5))
    x[0] = torch.tensor([-3.0, 0.0, 3.0, -6.0, 6.0], device=device, dtype=dtype)
    yield SampleInput((g, x))


def hardtanh_backward_samples(device, dtype):
    g, x = next(input_samples(device, dtype)).args
    yield SampleInput((g, x, -1.0, 1.0))
    yield SampleInput((g, x, 0.0, 6.0), name="relu6")


def softmax_backward_samples(fn):
    def samples(device, dtype):
        g, x = _pair(device, dtype, (2, 3, 4))
        for dim in (-1, 1):
            yield SampleInput((g, fn(x, dim), dim, dtype))
    return samples


def native_layer_norm_samples(device, dtype):
    x = make_tensor((2, 3, 4), device=device, dtype=dtype)
    w, b = make_tensor((4,), device=device, dtype=dtype), make_tensor((4,), device=device, dtype=dtype)
    yield SampleInput((x, [4], w, b, 1e-5))
    yield SampleInput((x, [3, 4], None, None, 1e-5), name="no weight, no bias")


def _native_layer_norm_output(*args):
    return aten.native_layer_norm.default(*args)[0]


def native_layer_norm_backward_samples(device, dtype):
    g, x = _pair(device, dtype, (2, 3, 4))
    w, b = make_tensor((4,), device=device, dtype=dtype), make_tensor((4,), device=device, dtype=dtype)
    _, mean, rstd = aten.native_layer_norm.default(x, [4], w, b, 1e-5)
    yield SampleInput((g, x, [4], mean, rstd, w, b, [True, True, True]))
    yield SampleInput((g, x, [4], mean, rstd, None, None, [True, False, False]), name="input only")


def _batch_norm_inputs(device, dtype):
    x = make_tensor((4, 3, 5), device=device, dtype=dtype)
    w, b = make_tensor((3,), device=device, dtype=dtype), make_tensor((3,), device=device, dtype=dtype)
    mean, var = (make_tensor((3,), device=device, dtype=dtype),
                 make_tensor((3,), device=device, dtype=dtype, low=0.5, high=2))
    return x, w, b, mean, var


def native_batch_norm_samples(device, dtype):
    x, w, b, mean, var = _batch_norm_inputs(device, dtype)
    yield SampleInput((x, w, b, None, None, True, 0.1, 1e-5), name="training")
    yield SampleInput((x, w, b, mean, var, False, 0.1, 1e-5), name="evaluation")
    yield SampleInput((x[:, :, 0], None, None, None, None, True, 0.1, 1e-3), name="training, 2-D, no weight, no bias")


def _native_batch_norm_output(*args):
    return aten.native_batch_norm.default(*args)[0]


def native_batch_norm_backward_samples(device, dtype):
    x, w, b, mean, var = _batch_norm_inputs(device, dtype)
    g = make_tensor(x.shape, device=device, dtype=dtype)
    _, save_mean, save_invstd = aten.native_batch_norm.default(x, w, b, None, None, True, 0.1, 1e-5)
    yield SampleInput((g, x, w, None, None, save_mean, save_invstd, True, 1e-5, [True, True, True]), name="training")
    yield SampleInput((g, x, w, mean, var, None, None, False, 1e-5, [True, True, True]), name="evaluation")
    yield SampleInput((g, x, None, None, None, save_mean, save_invstd, True, 1e-5, [True, False, False]),
                      name="training, input only")


def native_group_norm_samples(device, dtype):
    x = make_tensor((2, 6, 3, 2), device=device, dtype=dtype)
    w, b = make_tensor((6,), device=device, dtype=dtype), make_tensor((6,), device=device, dtype=dtype)
    yield SampleInput((x, w, b, 2, 6, 6, 3, 1e-5))
    yield SampleInput((x[:, :, :, 0], None, None, 2, 6, 3, 2, 1e-3), name="3-D, no weight, no bias")


# aten's group norm kernels take their tensors contiguous only: aten's group_norm and its derivative make them so
def _native_group_norm_output(input, *args):
    return aten.native_group_norm.default(input.contiguous(), *args)[0]


def _native_group_norm_backward(grad_out, input, *args):
    return aten.native_group_norm_backward.default(grad_out.contiguous(), input.contiguous(), *args)


def native_group_norm_backward_samples(device, dtype):
    x, w = make_tensor((2, 6, 3), device=device, dtype=dtype), make_tensor((6,), device=device, dtype=dtype)
    g = make_tensor(x.shape, device=device, dtype=dtype)
    _, mean, rstd = aten.native_group_norm.default(x, w, None, 2, 6, 3, 3, 1e-5)
    yield SampleInput((g, x, mean, rstd, w, 2, 6, 3, 3, [True, True, True]))
    yield SampleInput((g, x, mean, rstd, None, 2, 6, 3, 3, [True, False, False]), name="input only")


def _nll_inputs(device, dtype):
    x = make_tensor((5, 4), device=device, dtype=dtype).log_softmax(1)
    target = torch.tensor([0, 3, -100, 1, 3], device=device)
    weight = make_tensor((4,), device=device, dtype=dtype, low=0.1, high=1)
    return x, target, weight


def nll_loss_forward_samples(device, dtype):
    x, target, weight = _nll_inputs(device, dtype)
    for reduction in (0, 1, 2):
        yield SampleInput((x, target, weight, reduction, -100))
    yield SampleInput((x[0], target[1], None, 1, -100), name="1-D input")


def nll_loss_backward_samples(device, dtype):
    x, target, weight = _nll_inputs(device, dtype)
    for reduction in (0, 1, 2):
        total_weight = aten.nll_loss_forward.default(x, target, weight, reduction, -100)[1]
        g = make_tensor((5,) if reduction == 0 else (), device=device, dtype=dtype)
        yield SampleInput((g, x, target, weight, reduction, -100, total_weight))


def embedding_dense_backward_samples(device, dtype):
    g = make_tensor((2, 3, 4), device=device, dtype=dtype)
    indices = torch.tensor([[1, 2, 1], [5, 1, 0]], device=device)
    yield SampleInput((g, indices, 6, -1, False))
    yield SampleInput((g, indices, 6, 1, True), name="padding_idx, scale_grad_by_freq")


opinfos = [
    OpInfo("aten.gelu_backward", aten.gelu_backward.default, gelu_backward_samples, DTYPES),
    OpInfo("aten.tanh_backward", aten.tanh_backward.default, output_samples(torch.tanh), DTYPES),
    OpInfo("aten.sigmoid_backward", aten.sigmoid_backward.default, output_samples(torch.sigmoid), DTYPES),
    OpInfo("aten.threshold_backward", aten.threshold_backward.default, threshold_backward_samples, DTYPES),
    OpInfo("aten.silu_backward", aten.silu_backward.default, input_samples, DTYPES),
    OpInfo("aten.hardswish_backward", aten.hardswish_backward.default, input_samples, DTYPES),
    OpInfo("aten.hardsigmoid_backward", aten.hardsigmoid_backward.default, input_samples, DTYPES),
    OpInfo("aten.hardtanh_backward", aten.hardtanh_backward.default, hardtanh_backward_samples, DTYPES),
    OpInfo("aten._softmax_backward_data", aten._softmax_backward_data.default, softmax_backward_samples(torch.softmax),
           DTYPES),
    OpInfo("aten._log_softmax_backward_data", aten._log_softmax_backward_data.default,
           softmax_backward_samples(torch.log_softmax), DTYPES),
    # the normalized output only: torch's autograd ignores cotangents of mean and rstd (thunderfn's rule does not,
    # so that second derivatives are right); their values are checked in tests/test_backward_symbols.py
    OpInfo("aten.native_layer_norm", _native_layer_norm_output, native_layer_norm_samples, DTYPES),
    OpInfo("aten.native_layer_norm_backward", aten.native_layer_norm_backward.default,
           native_layer_norm_backward_samples, DTYPES),
    # the output only, as for layer norm; the statistics are checked in tests/test_backward_symbols.py
    OpInfo("aten.native_batch_norm", _native_batch_norm_output, native_batch_norm_samples, DTYPES),
    OpInfo("aten.native_batch_norm_backward", aten.native_batch_norm_backward.default,
           native_batch_norm_backward_samples, DTYPES),
    OpInfo("aten.native_group_norm", _native_group_norm_output, native_group_norm_samples, DTYPES),
    OpInfo("aten.native_group_norm_backward", _native_group_norm_backward, native_group_norm_backward_samples, DTYPES),
    OpInfo("aten.nll_loss_forward", aten.nll_loss_forward.default, nll_loss_forward_samples, DTYPES),
    OpInfo("aten.nll_loss_backward", aten.nll_loss_backward.default, nll_loss_backward_samples, DTYPES),
    OpInfo("aten.embedding_dense_backward", aten.embedding_dense_backward.default, embedding_dense_backward_samples,
           DTYPES),
]
