"""The torch executor's rewrites (executors/torch_rewrites.py): Python numbers made tensors
once, and elementwise results written into dead intermediates, change nothing a caller sees."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import thunderfn as tf
from thunderfn.testing.op_counts import top_level_aten_ops
from thunderfn.testing.strategies import ALL_DTYPES, make, shapes

OPS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
NUMBERS = st.one_of(st.integers(-2**62, 2**62), st.sampled_from([0, 1, -1, 2, 3, 2**40]),
                    st.floats(allow_nan=False, allow_infinity=False, width=64),
                    st.sampled_from([0.1, 1 / 3, 1e-8, -2.5]))


def lines(trc) -> list[str]:
    return [ln.strip() for ln in str(trc).splitlines() if not ln.strip().startswith("#")]


def in_place_calls(trc) -> list[str]:
    return [ln for ln in lines(trc) if "torch.Tensor." in ln and "_(" in ln]


@given(op=st.sampled_from(sorted(OPS)), dtype=st.sampled_from(ALL_DTYPES + (torch.complex64,)),
       shape=shapes(min_dims=0), number=NUMBERS, seed=st.integers(0, 2**16))
def test_law_a_lifted_number_computes_what_eager_computes_bit_for_bit(op, dtype, shape, number, seed):
    # law: jit(lambda x: op(x, n))(x) == op(x, n), same dtype and same bits, whether or not n was lifted
    x = make(shape, dtype, seed) if not dtype.is_complex else make(shape, torch.float32, seed).to(dtype)
    fn = OPS[op]
    try:
        expected = fn(x, number)
    except RuntimeError as e:  # bool - number and the like: the jitted call must raise the same
        with pytest.raises(RuntimeError, match=str(e)[:30]):
            tf.jit(lambda t: fn(t, number))(x)
        return
    got = tf.jit(lambda t: fn(t, number))(x)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert_same_values(got, expected)


def assert_same_values(got, expected):
    """Equal values, NaN equal to NaN. A complex number is compared by its real and imaginary parts,
    each as torch.testing compares floats: so inf+nanj (what x / 0 gives for a complex x with a zero
    imaginary part) equals inf+nanj but not nan+nanj, which torch.isclose would call equal."""
    as_real = lambda t: torch.view_as_real(t) if t.is_complex() else t  # noqa: E731
    torch.testing.assert_close(as_real(got), as_real(expected), rtol=0, atol=0, equal_nan=True)


def test_the_law_compares_complex_non_finite_values_part_by_part():
    nan, inf = float("nan"), float("inf")
    inf_nan = torch.tensor([complex(inf, nan), complex(nan, nan)])
    assert_same_values(inf_nan, inf_nan.clone())
    assert_same_values(torch.div(torch.tensor([1 + 0j, 0j]), 0), inf_nan)
    with pytest.raises(AssertionError):
        assert_same_values(inf_nan, torch.tensor([complex(nan, nan), complex(nan, nan)]))
    with pytest.raises(AssertionError):
        assert_same_values(torch.tensor([nan, 1.0]), torch.tensor([nan, 2.0]))


def test_a_number_is_lifted_once_where_the_result_cannot_change_and_kept_where_it_could():
    jf = tf.jit(lambda x, i, s: (torch.sin(x * 2 + 1) * 2, i * 2.5, s * 2))
    x, i, s = torch.randn(4), torch.arange(4), torch.tensor(3.0, dtype=torch.float16)
    out = jf(x, i, s)
    code = str(tf.last_traces(jf)[-1])
    assert code.count("(the number 2, made a tensor once)") == 1  # one tensor for both 2s
    assert "(the number 1, made a tensor once)" in code
    # int tensor * float: eager's result is the default float dtype, a float64 tensor would give float64
    assert "torch.mul(i, 2.5)" in code and out[1].dtype == torch.float32
    # a 0-d tensor promotes with a 0-d float64 as an equal (float64); with the number it stays float16
    assert "torch.mul(s, 2)" in code and out[2].dtype == torch.float16


def test_an_elementwise_result_is_written_into_its_dead_first_argument():
    def f(x, w, b):
        return torch.nn.functional.gelu(x * w + b) * torch.sigmoid(x)

    args = [torch.randn(64) for _ in range(3)]
    before = [a.clone() for a in args]
    jf = tf.jit(f)
    torch.testing.assert_close(jf(*args), f(*args), rtol=0, atol=0)
    assert [c.split("(")[0].split("= ")[1] for c in in_place_calls(tf.last_traces(jf)[-1])] == [
        "torch.Tensor.add_", "torch.Tensor.mul_"]
    assert all(torch.equal(a, c) for a, c in zip(args, before))  # inputs are never written


def test_a_value_with_a_live_view_is_not_written_into():
    def f(x):
        t = x * 2
        row = t[0]  # a view of t, read after t's last direct reader
        s = torch.sin(t)
        return s, row + 0

    x = torch.randn(3, 4)
    jf = tf.jit(f)
    s, row = jf(x)
    torch.testing.assert_close(row, x[0] * 2, rtol=0, atol=0)
    torch.testing.assert_close(s, torch.sin(x * 2), rtol=0, atol=0)
    assert not any("sin_" in c for c in in_place_calls(tf.last_traces(jf)[-1]))


@pytest.mark.parametrize("make_alias", [lambda x: x.float(), lambda x: x.contiguous(), lambda x: x.to(torch.float32)],
                         ids=["float", "contiguous", "to"])
def test_what_may_be_the_input_itself_at_run_time_is_never_written_into(make_alias):
    x = torch.randn(5)
    kept = x.clone()
    out = tf.jit(lambda t: torch.sin(make_alias(t)))(x)
    torch.testing.assert_close(out, torch.sin(kept), rtol=0, atol=0)
    assert torch.equal(x, kept)


def test_both_halves_of_a_training_step_write_into_dead_intermediates_and_give_eagers_gradients():
    def loss(x, w):
        return (torch.tanh(x @ w) * 3 + 1).square().sum()

    x, w = torch.randn(8, 4), torch.randn(4, 4, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()
    jf = tf.jit(loss)
    jf(x, w).backward()
    loss(x, w_eager).backward()
    torch.testing.assert_close(w.grad, w_eager.grad)
    assert in_place_calls(tf.last_traces(jf)[-1]) and in_place_calls(tf.last_backward_traces(jf)[-1])


def test_a_trace_that_torch_autograd_records_is_not_rewritten_in_place():
    # writing into an input that requires grad keeps autograd through torch's own ops: torch saves
    # tanh's output for its backward, so writing into it would corrupt the gradient
    def f(x):
        y = torch.tanh(x * 2)
        x.mul_(0.5)
        return (y * 3).sum()

    base = torch.randn(4, requires_grad=True)
    jf = tf.jit(f)
    jf(base * 1).backward()
    grad = base.grad.clone()
    base.grad = None
    f(base * 1).backward()
    torch.testing.assert_close(grad, base.grad)
    with pytest.raises(RuntimeError, match="writes into an input"):  # no split: torch records the ops
        tf.last_backward_traces(jf)
    assert not in_place_calls(tf.last_traces(jf)[-1])


def test_torch_func_vmap_over_a_jitted_function_runs_the_trace_without_in_place_writes():
    # w * 2 is unbatched under vmap(in_dims=(None, 0)); writing the batched `+ y` into it would raise
    def f(w, y):
        return torch.sin(w * 2 + y)

    jf = tf.jit(f)
    w, ys = torch.randn(3), torch.randn(5, 3)
    jf(w, ys[0])
    assert in_place_calls(tf.last_traces(jf)[-1])  # the trace called directly writes in place
    got = torch.func.vmap(jf, in_dims=(None, 0))(w, ys)
    torch.testing.assert_close(got, torch.stack([f(w, y) for y in ys]))


def test_a_commutative_op_writes_into_its_dead_second_argument_when_the_first_is_an_input():
    def f(x, y):
        return x + torch.sin(y), x * torch.cos(y)

    x, y = torch.randn(6), torch.randn(6)
    kept = x.clone(), y.clone()
    jf = tf.jit(f)
    for got, expected in zip(jf(x, y), f(x, y)):
        assert torch.equal(got, expected)
    assert torch.equal(x, kept[0]) and torch.equal(y, kept[1])
    calls = in_place_calls(tf.last_traces(jf)[-1])
    assert any("torch.Tensor.add_(t" in c and ", x)" in c for c in calls)
    assert any("torch.Tensor.mul_(t" in c and ", x)" in c for c in calls)
    # complex products round differently when their operands swap: left out of place
    xc, yc = torch.randn(6, dtype=torch.complex64), torch.randn(6, dtype=torch.complex64)
    jc = tf.jit(f)
    for got, expected in zip(jc(xc, yc), f(xc, yc)):
        assert torch.equal(got, expected)
    assert not in_place_calls(tf.last_traces(jc)[-1])


def _reshapes(trace) -> list[str]:
    return [b.output.name for b in trace.bound_symbols if "reshape" in b.sym.name]


def test_a_reshape_to_the_same_shape_is_dropped_and_a_reshape_of_a_reshape_reads_the_first_input():
    def f(x):
        y = x.reshape(4, 6).reshape(2, 12) * 2  # a chain: one reshape of x
        z = (x + 1).reshape(2, 3, 4)  # its own shape: no call at all
        return y, z.sin()

    jf = tf.jit(f)
    x = torch.randn(2, 3, 4)
    for got, want in zip(jf(x), f(x)):
        torch.testing.assert_close(got, want)
    execution = tf.last_traces(jf)[-1]
    (chain,) = [b for b in execution.bound_symbols if "reshape" in b.sym.name]
    assert chain.args[0].name == "x" and tuple(chain.output.shape) == (2, 12)


def test_a_returned_reshape_stays_a_tensor_of_its_own():
    jf = tf.jit(lambda x: (x, x.reshape(x.shape)))
    x = torch.randn(3)
    a, b = jf(x)
    assert a is x and b is not x and torch.equal(b, x)


def test_linear_layers_backward_makes_no_reshape_eager_does_not():
    """addmm's backward is eager's two matmuls, and a linear layer's rank-folding reshapes collapse: a
    GPT-2-style Conv1D (addmm on folded rows) trains in no more aten ops than eager."""
    w, b = torch.randn(8, 16, requires_grad=True), torch.randn(16, requires_grad=True)

    def conv1d(x):
        return torch.addmm(b, x.view(-1, 8), w).view(2, 5, 16).relu().sum()

    jitted = tf.jit(conv1d)
    x = torch.randn(2, 5, 8)

    def aten_ops(fn):
        w.grad = b.grad = None
        fn(x).backward()
        grads = (w.grad, b.grad)
        return grads, sum(top_level_aten_ops(lambda: fn(x).backward()).values())

    (want, eager_ops), (got, jit_ops) = aten_ops(conv1d), aten_ops(jitted)
    for g, ref in zip(got, want):
        torch.testing.assert_close(g, ref)
    assert jit_ops <= eager_ops


def test_a_sum_reshaped_to_keep_its_dims_is_one_sum_with_keepdim_and_a_returned_reshape_of_an_intermediate_goes():
    def f(x):
        s = torch.sum(x * 2, (0, 2)).reshape(1, 3, 1)  # sum then keepdim reshape: one call
        t = torch.sum(x, (0, 1)).reshape(4)  # returned, its input an intermediate: the sum is returned
        return s + 1, t

    jf = tf.jit(f)
    x = torch.randn(2, 3, 4)
    for got, want in zip(jf(x), f(x)):
        torch.testing.assert_close(got, want)
    execution = tf.last_traces(jf)[-1]
    assert not [b for b in execution.bound_symbols if "reshape" in b.sym.name]
    assert [b.kwargs for b in execution.bound_symbols if b.sym.name.endswith("sum")] == [{"keepdim": True}, {}]


# -- writing into the inputs a trace writes back ---------------------------------------------------
def copies(trc) -> list[str]:
    return [ln for ln in lines(trc) if ".copy_(" in ln]


def test_an_input_updated_in_place_is_computed_into_it_not_copied_back():
    def f(x, count):
        count.add_(1)
        x.mul_(2)
        return x + count

    args = [torch.randn(4), torch.zeros((), dtype=torch.int64)]
    eager_args = [a.clone() for a in args]
    jf = tf.jit(f)
    torch.testing.assert_close(jf(*args), f(*eager_args), rtol=0, atol=0)
    assert all(torch.equal(a, e) for a, e in zip(args, eager_args))
    trc = tf.last_traces(jf)[-1]
    assert [c.split("(")[0].split("= ")[1] for c in in_place_calls(trc)] == ["torch.Tensor.add_", "torch.Tensor.mul_"]
    assert not copies(trc)


@pytest.mark.parametrize("read_before", [lambda x: torch.sin(x), lambda x: x[1], lambda x: x.view(2, 2)],
                         ids=["new-value", "view", "reshaped-view"])
def test_an_input_read_after_its_update_reads_what_eager_reads(read_before):
    """A value computed from the old input keeps the old value; a view of it shows the new one (as in eager)."""
    def f(x):
        before = read_before(x)
        x.add_(1)
        return before * 1

    x = torch.randn(4)
    x_eager = x.clone()
    torch.testing.assert_close(tf.jit(f)(x), f(x_eager), rtol=0, atol=0)
    torch.testing.assert_close(x, x_eager, rtol=0, atol=0)


def test_an_input_returned_after_its_update_is_eagers_value():
    def f(x):
        x.add_(1)
        return x

    x = torch.randn(4)
    expected = x + 1
    out = tf.jit(f)(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(x, expected, rtol=0, atol=0)


def test_batch_norm_updates_its_running_statistics_in_its_kernel_each_call_of_a_module_used_twice():
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm1d(3)
    traced = copy.deepcopy(eager)

    def twice(bn):
        return lambda x: bn(bn(x) * 2)

    jf = tf.jit(twice(traced))
    for _ in range(2):
        x = torch.randn(5, 3)
        torch.testing.assert_close(jf(x), twice(eager)(x), rtol=0, atol=0)
    for a, b in zip(traced.buffers(), eager.buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    trc = tf.last_traces(jf)[-1]
    assert str(trc).count("native_batch_norm_into_running_stats(") == 2 and not copies(trc)


def test_batch_norm_statistics_returned_or_read_later_are_eagers():
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm1d(3)
    traced = copy.deepcopy(eager)

    def f(bn):
        def run(x):
            old = bn.running_mean * 1
            out = bn(x)
            return out, old, bn.running_mean, bn.running_var + 0
        return run

    x = torch.randn(5, 3)
    for got, want in zip(tf.jit(f(traced))(x), f(eager)(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(traced.buffers(), eager.buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_an_error_after_batch_norm_leaves_its_running_statistics_updated_as_eager_does():
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm1d(3)
    traced = copy.deepcopy(eager)

    def f(bn):
        return lambda x, index: bn(x)[index]

    x, index = torch.randn(5, 3), torch.tensor([0, 4])
    jf = tf.jit(f(traced))
    torch.testing.assert_close(jf(x, index), f(eager)(x, index), rtol=0, atol=0)
    bad = torch.tensor([0, 7])
    for fn in (jf, f(eager)):
        with pytest.raises(IndexError):
            fn(x, bad)
    for a, b in zip(traced.buffers(), eager.buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_returned_sum_keeps_its_shape_when_a_reshape_of_it_keeps_the_dims():
    def f(x):
        s = torch.sum(x, (0,))
        return s, s.reshape(1, 4) * 2

    jf = tf.jit(f)
    x = torch.randn(3, 4)
    for got, want in zip(jf(x), f(x)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
