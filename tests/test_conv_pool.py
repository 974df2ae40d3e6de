"""Convolution and pooling under reverse mode (torch/conv_pool.py, transforms/rules/conv_pool.py): a jitted
training step runs the forward op once and one of eager's backward kernels, with eager's arguments, so
gradients are eager's bit for bit, present where eager's are (None for an input that needs none, a missing
bias); second derivatives, vmap and jvp still work (through torch.func), and calls the rules do not cover
still differentiate, through torch.func."""
import copy
import re

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.testing.op_counts import top_level_aten_ops


def randn(*shape, seed, dtype=torch.float32, requires_grad=True):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return t.requires_grad_(requires_grad)


# -- cases: id -> (fn, make_args() -> args, the backward kernel the execution trace calls) ------------------
CASES: dict = {}


def case(id, fn, make_args, kernel):
    CASES[id] = (fn, make_args, kernel)


def conv_case(id, fn, x_shape, w_shape, bias: bool, input_grad=True):
    def make_args():
        args = [randn(*x_shape, seed=0, requires_grad=input_grad), randn(*w_shape, seed=1)]
        return args + [randn(w_shape[0] if "transpose" not in id else w_shape[1] * _groups(id), seed=2)] if bias \
            else args + [None]
    case(id, fn, make_args, "aten_convolution_backward")


def _groups(id):
    return 2 if "groups" in id else 1


conv_case("conv1d", lambda x, w, b: F.conv1d(x, w, b), (2, 3, 9), (4, 3, 3), bias=True)
conv_case("conv1d-unbatched", lambda x, w, b: F.conv1d(x, w, b, padding=1), (3, 9), (4, 3, 3), bias=True)
conv_case("conv2d", lambda x, w, b: F.conv2d(x, w, b, padding=1), (2, 3, 8, 8), (4, 3, 3, 3), bias=True)
conv_case("conv2d-no-bias", lambda x, w, b: F.conv2d(x, w, b, stride=2), (2, 3, 8, 8), (4, 3, 3, 3), bias=False)
conv_case("conv2d-stride-padding-dilation-groups",
          lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(2, 1), groups=2),
          (2, 4, 9, 8), (6, 2, 3, 3), bias=True)
conv_case("conv2d-padding-same", lambda x, w, b: F.conv2d(x, w, b, padding="same", dilation=2),
          (2, 3, 8, 8), (4, 3, 3, 3), bias=True)
conv_case("conv2d-padding-valid", lambda x, w, b: F.conv2d(x, w, b, padding="valid"), (2, 3, 8, 8), (4, 3, 3, 3),
          bias=False)
conv_case("conv2d-input-needs-no-grad", lambda x, w, b: F.conv2d(x, w, b), (2, 3, 8, 8), (4, 3, 3, 3), bias=True,
          input_grad=False)
conv_case("conv3d", lambda x, w, b: F.conv3d(x, w, b, stride=2, padding=1), (2, 3, 6, 6, 6), (4, 3, 3, 3, 3),
          bias=True)
conv_case("conv_transpose1d", lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, output_padding=1),
          (2, 3, 7), (3, 4, 3), bias=True)
conv_case("conv_transpose2d-groups",
          lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2, dilation=1),
          (2, 4, 5, 5), (4, 3, 3, 3), bias=True)
conv_case("conv_transpose3d", lambda x, w, b: F.conv_transpose3d(x, w, b, stride=(1, 2, 1), dilation=2),
          (1, 2, 4, 4, 4), (2, 3, 2, 2, 2), bias=False)
conv_case("module-conv2d", lambda x, w, b: torch.nn.functional.relu(F.conv2d(x, w, b, 1, 1, 1, 1)),
          (2, 3, 8, 8), (4, 3, 3, 3), bias=True)


def pool_case(id, fn, shape, kernel):
    case(id, fn, lambda: [randn(*shape, seed=0)], kernel)


pool_case("max_pool1d", lambda x: F.max_pool1d(x, 3, 2, 1), (2, 3, 9), "aten_max_pool2d_with_indices_backward")
pool_case("max_pool2d", lambda x: F.max_pool2d(x, 2), (2, 3, 8, 8), "aten_max_pool2d_with_indices_backward")
pool_case("max_pool2d-ceil-dilation", lambda x: F.max_pool2d(x, 3, stride=2, padding=1, dilation=2, ceil_mode=True),
          (2, 3, 9, 9), "aten_max_pool2d_with_indices_backward")
pool_case("max_pool2d-return-indices", lambda x: F.max_pool2d(x, 2, return_indices=True)[0] * 2,
          (2, 3, 8, 8), "aten_max_pool2d_with_indices_backward")
pool_case("torch.max_pool2d", lambda x: torch.max_pool2d(x, (3, 2), (1, 2)), (2, 3, 8, 8),
          "aten_max_pool2d_with_indices_backward")
pool_case("max_pool3d", lambda x: F.max_pool3d(x, 2, padding=1), (2, 3, 5, 6, 6),
          "aten_max_pool3d_with_indices_backward")
pool_case("avg_pool1d", lambda x: F.avg_pool1d(x, 3, 2, 1, count_include_pad=False), (2, 3, 9),
          "aten_avg_pool2d_backward")
pool_case("avg_pool2d", lambda x: F.avg_pool2d(x, 2), (2, 3, 8, 8), "aten_avg_pool2d_backward")
pool_case("avg_pool2d-ceil-divisor", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, divisor_override=5),
          (2, 3, 8, 8), "aten_avg_pool2d_backward")
pool_case("avg_pool3d", lambda x: F.avg_pool3d(x, 2, count_include_pad=False, padding=1), (2, 3, 5, 6, 6),
          "aten_avg_pool3d_backward")
pool_case("adaptive_avg_pool1d", lambda x: F.adaptive_avg_pool1d(x, 4), (2, 3, 9), "aten_adaptive_avg_pool2d_backward")
pool_case("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (3, None)), (2, 3, 8, 7),
          "aten_adaptive_avg_pool2d_backward")
pool_case("adaptive_avg_pool2d-to-1", lambda x: F.adaptive_avg_pool2d(x, 1), (2, 3, 8, 7), "torch.div")
pool_case("adaptive_avg_pool3d", lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), (2, 3, 5, 6, 6),
          "aten_adaptive_avg_pool3d_backward")
pool_case("adaptive_max_pool1d", lambda x: F.adaptive_max_pool1d(x, 4), (2, 3, 9), "aten_adaptive_max_pool2d_backward")
pool_case("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (3, 2)), (2, 3, 8, 7),
          "aten_adaptive_max_pool2d_backward")
pool_case("adaptive_max_pool3d-return-indices", lambda x: F.adaptive_max_pool3d(x, 2, return_indices=True)[0],
          (2, 3, 5, 6, 6), "aten_adaptive_max_pool3d_backward")


def _step(fn, args, seed=5):
    """Run fn on fresh leaves like args and backward with a fixed cotangent: (output, each leaf's .grad)."""
    leaves = [None if a is None else a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = fn(*leaves)
    out.backward(randn(*out.shape, seed=seed, dtype=out.dtype, requires_grad=False))
    return out, [None if a is None else a.grad for a in leaves]


@pytest.mark.parametrize("id", CASES)
def test_gradients_are_eagers_bit_for_bit_from_one_backward_kernel(id):
    fn, make_args, kernel = CASES[id]
    args = make_args()
    jitted = tf.jit(fn)
    out, grads = _step(jitted, args)
    expected_out, expected_grads = _step(fn, args)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=0)
    assert [g is None for g in grads] == [g is None for g in expected_grads]
    for g, expected in zip(grads, expected_grads):
        if expected is not None:
            torch.testing.assert_close(g, expected, rtol=0, atol=0)
    backward = str(tf.last_backward_traces(jitted)[-1])
    assert kernel in backward
    # the backward runs no forward op again (torch.func would, in torch_vjp)
    assert "torch_vjp" not in backward and not re.search(r"(conv|pool)\w*[123]d(_with_indices)?\(", backward)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.pool = torch.nn.MaxPool2d(2)

    def forward(self, x):
        y = self.pool(torch.relu(self.conv1(x)))
        y = torch.relu(self.conv2(y)) + F.avg_pool2d(y, 3, 1, 1)
        return F.adaptive_avg_pool2d(y, 1).flatten(1).sum()


def test_a_training_step_runs_each_convolution_and_pool_once_and_eagers_backward_kernels():
    torch.manual_seed(0)
    net, x = _Net(), torch.randn(2, 3, 8, 8)
    jitted = tf.jit(net)

    def steps(model):
        model(x).backward()
        return top_level_aten_ops(lambda: model(x).backward())

    eager, jit = steps(net), steps(jitted)
    for op in ("aten::conv2d", "aten::convolution_backward", "aten::avg_pool2d", "aten::avg_pool2d_backward",
               "aten::adaptive_avg_pool2d", "aten::max_pool2d_with_indices_backward"):
        assert jit[op] == eager[op], op
    # eager's max_pool2d computes its indices with max_pool2d_with_indices when its input requires grad
    assert jit["aten::max_pool2d_with_indices"] == eager["aten::max_pool2d"] == 1
    assert "aten::convolution" not in jit and "aten::_convolution" not in jit


def test_convolution_backward_computes_only_the_gradients_wanted():
    """output_mask: the first layer's images need no gradient, a frozen weight none, a missing bias none."""
    x, w, b = randn(2, 3, 8, 8, seed=0, requires_grad=False), randn(4, 3, 3, 3, seed=1), randn(4, seed=2)
    jitted = tf.jit(lambda x, w, b: F.conv2d(x, w, b))
    jitted(x, w, b).sum().backward()
    assert "[False, True, True]" in str(tf.last_backward_traces(jitted)[-1])
    frozen = w.detach()
    x.requires_grad_()
    jitted(x, frozen, None).sum().backward()
    backward = str(tf.last_backward_traces(jitted)[-1])
    assert "None" in backward and "[True, False, False]" in backward
    assert frozen.grad is None and x.grad is not None


def test_a_forward_without_gradients_runs_max_pool2d_whole():
    jitted = tf.jit(lambda x: F.max_pool2d(x, 2))
    x = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(jitted(x), F.max_pool2d(x, 2))
    calls = [line for line in str(tf.last_traces(jitted)[-1]).splitlines() if not line.lstrip().startswith("#")]
    assert any("= torch.nn.functional.max_pool2d(" in line for line in calls)
    assert not any("with_indices" in line for line in calls)


def _net64(x, w):
    y = torch.tanh(F.conv2d(x, w, padding=1, stride=2))
    y = F.max_pool2d(y, 2) + F.avg_pool2d(y, 2)
    y = F.adaptive_avg_pool2d(y, 2).sum() + F.adaptive_max_pool2d(y, 1).sum() + F.adaptive_avg_pool2d(y, 1).sum()
    return y ** 2


X64, W64 = randn(2, 3, 8, 8, seed=0, dtype=torch.float64, requires_grad=False), \
    randn(4, 3, 3, 3, seed=1, dtype=torch.float64, requires_grad=False)


def test_second_derivative_through_the_backward_kernels_is_eagers():
    def inner(grad):
        return lambda x, w: sum(g.pow(2).sum() for g in grad(_net64, argnums=(0, 1))(x, w))

    torch.testing.assert_close(tf.grad(inner(tf.grad), argnums=(0, 1))(X64, W64),
                               torch.func.grad(inner(torch.func.grad), argnums=(0, 1))(X64, W64))


def test_per_example_gradients_vmap_the_backward_kernels():
    torch.testing.assert_close(tf.vmap(tf.grad(_net64, argnums=1), (0, None))(X64[:, None], W64),
                               torch.func.vmap(torch.func.grad(_net64, argnums=1), (0, None))(X64[:, None], W64))


def test_forward_over_reverse_differentiates_the_backward_kernels():
    tangents = (randn(*X64.shape, seed=3, dtype=torch.float64, requires_grad=False), torch.zeros_like(W64))
    torch.testing.assert_close(tf.jvp(tf.grad(_net64), (X64, W64), tangents)[1],
                               torch.func.jvp(torch.func.grad(_net64), (X64, W64), tangents)[1])


def test_vmap_and_jvp_of_convolution_and_pooling_are_torch_funcs():
    tangents = (randn(*X64.shape, seed=3, dtype=torch.float64, requires_grad=False), torch.ones_like(W64))
    torch.testing.assert_close(tf.jvp(_net64, (X64, W64), tangents), torch.func.jvp(_net64, (X64, W64), tangents))
    torch.testing.assert_close(tf.vmap(_net64, (0, None))(X64[:, None], W64),
                               torch.func.vmap(_net64, (0, None))(X64[:, None], W64))


UNCOVERED = {
    "bias-by-keyword": (lambda x, w, b: F.conv2d(x, w, bias=b), (2, 3, 8, 8), (4, 3, 3, 3)),
    "padding-same-one-side-more": (lambda x, w, b: F.conv2d(x, w, b, padding="same"), (2, 3, 8, 8), (4, 3, 2, 2)),
}


@pytest.mark.parametrize("id", UNCOVERED)
def test_calls_the_rules_do_not_cover_differentiate_through_torch_func(id):
    fn, x_shape, w_shape = UNCOVERED[id]
    args = [randn(*x_shape, seed=0), randn(*w_shape, seed=1), randn(w_shape[0], seed=2)]
    (_, grads), (_, expected) = _step(tf.jit(fn), args), _step(fn, args)
    torch.testing.assert_close(grads, expected)


def test_complex_convolution_differentiates_through_torch_func():
    x, w = (randn(*s, seed=i, dtype=torch.complex64) for i, s in enumerate(((1, 2, 6), (3, 2, 3))))
    fn = lambda x, w: F.conv1d(x, w).abs().sum()  # noqa: E731
    (_, grads), (_, expected) = _step(tf.jit(fn), [x, w]), _step(fn, [x, w])
    torch.testing.assert_close(grads, expected)


def test_under_autocast_gradients_are_eagers_from_the_backward_kernels():
    """Under torch.autocast tracing records F.adaptive_avg_pool2d's inner torch._C._nn call: it has the rule too."""
    torch.manual_seed(0)
    net, x = _Net(), torch.randn(2, 3, 8, 8)
    jitted = tf.jit(copy.deepcopy(net))

    def step(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().backward()
        return out, [p.grad for p in model.parameters()]

    (expected_out, expected), (out, grads) = step(net), step(jitted)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=0)
    torch.testing.assert_close(grads, expected, rtol=0, atol=0)
    backward = str(tf.last_backward_traces(jitted)[-1])
    assert "torch_vjp" not in backward and "aten_convolution_backward" in backward
