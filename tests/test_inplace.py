"""In-place operations are functionalized: every result, every mutated input and every
returned object is what eager PyTorch gives, or the call is refused before it writes."""
import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf


def _iadd(a, b):
    a += b
    return a


def _setitem_rows(a, b):
    h = a * 1
    h[0] = b[0]
    h[1:, ::2] = 0.5
    return h


def _view_write_back(a, b):
    h = a.clone()
    h[:, 1] *= 3           # getitem view, in-place, then setitem: all into h
    h[..., 0] += b[:, 0]
    return h


def _chain(a, b):
    h = a + 0
    h.mul_(2).add_(b).clamp_(min=0)  # in-place methods return their target
    return h.sqrt_()


def _inplace_flags(a, b):
    h = a - b
    F.relu(h, inplace=True)
    F.dropout(h, p=0.0, training=True, inplace=True)
    return h


def _fills(a, b):
    h = torch.empty_like(a)
    h.copy_(b)
    h[0].zero_()
    h[1].fill_(7.0)
    return h


def _advanced_setitem(a, b):
    h = a.clone()
    h[torch.tensor([0, 2])] = b[:2]
    return h


def _out_argument(a, b):
    out = torch.empty_like(a)
    torch.add(a, b, out=out)
    return out


def _dtype_kept(a, b):
    h = torch.zeros(a.shape, dtype=torch.float64)
    h += a  # float32 into float64: the target keeps its dtype
    return h


FUNCTIONS = {f.__name__.lstrip("_"): f for f in (
    _iadd, _setitem_rows, _view_write_back, _chain, _inplace_flags, _fills, _advanced_setitem, _out_argument,
    _dtype_kept)}


@pytest.mark.parametrize("executors", [None, ["torch_prims"]], ids=["torch", "decomposed"])
@pytest.mark.parametrize("fn", FUNCTIONS.values(), ids=FUNCTIONS.keys())
def test_in_place_program_matches_eager_including_mutated_inputs(fn, executors):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    a_eager, a_jit = a.clone(), a.clone()
    expected = fn(a_eager, b)
    got = tf.jit(fn, executors=executors, fallback=executors is None)(a_jit, b)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(a_jit, a_eager)  # the caller sees the same mutation of its input


def test_mutated_input_that_is_returned_is_the_callers_tensor():
    a = torch.zeros(3)
    out = tf.jit(lambda x: x.add_(1))(a)
    assert out is a and torch.equal(a, torch.ones(3))


def test_mutating_an_input_is_written_back_once_per_call():
    jf = tf.jit(lambda x: x.mul_(2))
    a = torch.ones(2)
    jf(a)
    jf(a)
    assert torch.equal(a, torch.full((2,), 4.0))
    assert "x.copy_(" in str(tf.last_traces(jf)[-1])


def test_mutating_a_captured_tensor_updates_it_as_eager_does():
    counter = torch.zeros(())
    jf = tf.jit(lambda x: (counter.add_(1), x * counter)[1])
    torch.testing.assert_close(jf(torch.ones(2)), torch.ones(2))
    torch.testing.assert_close(jf(torch.ones(2)), torch.full((2,), 2.0))
    assert counter.item() == 2


def test_inputs_that_share_memory_are_refused_when_the_function_mutates_inputs():
    a = torch.zeros(3)
    jf = tf.jit(lambda x, y: (x.add_(1), y * 2)[1])
    with pytest.raises(RuntimeError, match="share memory"):
        jf(a, a)


def test_functions_that_do_not_mutate_inputs_pay_no_aliasing_check():
    jf = tf.jit(lambda x, y: x + y)
    a = torch.ones(2)
    jf(a, a)
    assert "inputs_do_not_alias" not in str(tf.last_traces(jf)[-1])


def test_in_place_on_an_intermediate_does_not_touch_the_input():
    a = torch.ones(2)
    jf = tf.jit(lambda x: (x * 2).add_(1))
    torch.testing.assert_close(jf(a), torch.full((2,), 3.0))
    assert torch.equal(a, torch.ones(2)) and "copy_" not in str(tf.last_traces(jf)[-1])


def test_in_place_result_dtype_that_cannot_be_cast_raises_like_torch():
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        tf.jit(lambda x: x.add_(0.5))(torch.ones(2, dtype=torch.int64))


def test_in_place_broadcast_beyond_target_raises_like_torch():
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast shape \[2, 3\]"):
        tf.jit(lambda x, y: x.add_(y))(torch.ones(3), torch.ones(2, 3))


def test_random_fill_in_place_draws_what_eager_draws():
    fn = lambda x: torch.empty_like(x).normal_(2.0, 0.5) + x.uniform_(-1, 1)  # noqa: E731
    a = torch.zeros(4)
    torch.manual_seed(3)
    expected = fn(a.clone())
    torch.manual_seed(3)
    torch.testing.assert_close(tf.jit(fn)(a.clone()), expected)


def test_module_buffer_updated_in_forward_is_written_to_the_module():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls += 1
            return x * self.calls

    module = Counter()
    jm = tf.jit(module)
    jm(torch.ones(2))
    out = jm(torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 2.0))
    assert module.calls.item() == 2


NORMS_WITH_RUNNING_STATS = {
    "batch_norm_1d": (lambda: torch.nn.BatchNorm1d(3), (8, 3)),
    "batch_norm_1d_length": (lambda: torch.nn.BatchNorm1d(3), (4, 3, 5)),
    "batch_norm_2d": (lambda: torch.nn.BatchNorm2d(3), (2, 3, 4, 4)),
    "instance_norm_1d": (lambda: torch.nn.InstanceNorm1d(3, track_running_stats=True), (4, 3, 5)),
    "instance_norm_2d_affine": (lambda: torch.nn.InstanceNorm2d(3, affine=True, track_running_stats=True), (2, 3, 4, 4)),
}


@pytest.mark.parametrize("make, shape", NORMS_WITH_RUNNING_STATS.values(), ids=NORMS_WITH_RUNNING_STATS.keys())
def test_norm_training_updates_running_statistics_as_eager_does(make, shape):
    """Training mode: outputs, running_mean/var and num_batches_tracked match eager step by step."""
    import copy

    eager = make()
    traced = copy.deepcopy(eager)
    jitted = tf.jit(traced)
    for _ in range(3):
        x = torch.randn(*shape)
        torch.testing.assert_close(jitted(x), eager(x))
    for name, _ in eager.named_buffers():
        torch.testing.assert_close(getattr(traced, name), getattr(eager, name))
