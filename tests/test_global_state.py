"""torch's global state under jit (grad mode, the random generator, the default dtype): what the
compiled function changes is restored as eager restores it, also when an op raises at run time, and
other threads drawing random numbers during a compile are not mistaken for the traced code reseeding."""
import threading

import pytest
import torch

import thunderfn as tf


def _gather_rows(x, index):
    return torch.gather(x, 0, index)


# -- what the compiled function changes is undone as eager undoes it, also when an op raises ----
def test_grad_mode_is_restored_when_an_op_under_no_grad_raises_at_run_time():
    def f(x, index):
        y = x * 2
        with torch.no_grad():
            picked = _gather_rows(y, index)  # index values are checked only when it runs
        return y + picked

    jf = tf.jit(f)
    x = torch.randn(3)
    torch.testing.assert_close(jf(x, torch.tensor([0, 2, 1])), f(x, torch.tensor([0, 2, 1])))
    assert "finally:" in str(tf.last_traces(jf)[-1])
    with pytest.raises(RuntimeError, match="out of bounds"):
        jf(x, torch.tensor([0, 7, 1]))  # a cache hit that fails inside the no_grad block
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("caller_grad", [True, False], ids=["caller_grad", "caller_no_grad"])
def test_grad_mode_is_restored_when_an_op_under_nested_enable_grad_raises(caller_grad):
    def f(x, index):
        with torch.no_grad():
            y = x * 2
            with torch.enable_grad():
                picked = _gather_rows(y, index)
            z = picked + 1
        return z

    jf = tf.jit(f)
    x = torch.randn(3)
    with torch.set_grad_enabled(caller_grad):
        torch.testing.assert_close(jf(x, torch.tensor([2, 1, 0])), f(x, torch.tensor([2, 1, 0])))
        with pytest.raises(RuntimeError, match="out of bounds"):
            jf(x, torch.tensor([5, 1, 0]))
        assert torch.is_grad_enabled() is caller_grad


def test_rng_state_forked_by_the_traced_code_is_restored_when_an_op_raises():
    def f(x, index):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            noise = torch.randn(3)
            picked = _gather_rows(x + noise, index)
        return picked

    jf = tf.jit(f)
    x = torch.randn(3)
    jf(x, torch.tensor([0, 1, 2]))
    assert "finally:" in str(tf.last_traces(jf)[-1])
    torch.manual_seed(11)
    with pytest.raises(RuntimeError, match="out of bounds"):
        jf(x, torch.tensor([0, 9, 2]))
    after_jit = torch.rand(4)
    torch.manual_seed(11)
    with pytest.raises(RuntimeError, match="out of bounds"):
        f(x, torch.tensor([0, 9, 2]))
    torch.testing.assert_close(after_jit, torch.rand(4))  # eager's fork_rng restored the stream too


def test_two_states_read_together_are_restored_together_when_an_op_raises():
    """fork_rng's pattern on a GPU machine (CPU state, then each device's), with CPU states here."""
    def f(x, index):
        first, second = torch.get_rng_state(), torch.get_rng_state()
        try:
            torch.manual_seed(0)
            picked = _gather_rows(x + torch.rand(3), index)
        finally:
            torch.set_rng_state(first)
            torch.set_rng_state(second)
        return picked

    jf, x = tf.jit(f), torch.randn(3)
    jf(x, torch.tensor([0, 1, 2]))
    assert str(tf.last_traces(jf)[-1]).count("finally:") == 1
    torch.manual_seed(5)
    with pytest.raises(RuntimeError, match="out of bounds"):
        jf(x, torch.tensor([0, 3, 2]))
    after_jit = torch.rand(4)
    torch.manual_seed(5)
    torch.testing.assert_close(after_jit, torch.rand(4))


@pytest.fixture
def restore_default_dtype():
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)


def test_default_dtype_set_and_restored_by_the_traced_code_is_restored_when_an_op_raises(restore_default_dtype):
    def f(x, index):
        torch.set_default_dtype(torch.float64)
        try:
            picked = _gather_rows(x, index) + torch.ones(3)  # float64 in eager: so under jit too
        finally:
            torch.set_default_dtype(torch.float32)
        return picked

    jf = tf.jit(f)
    x = torch.randn(3)
    out = jf(x, torch.tensor([0, 1, 2]))
    assert out.dtype == f(x, torch.tensor([0, 1, 2])).dtype == torch.float64
    with pytest.raises(RuntimeError, match="out of bounds"):
        jf(x, torch.tensor([0, 4, 2]))
    assert torch.get_default_dtype() == torch.float32


def test_default_dtype_left_changed_by_the_traced_code_is_changed_on_every_call(restore_default_dtype):
    def f(x):
        torch.set_default_dtype(torch.float64)
        return x + torch.ones(3)

    jf, x = tf.jit(f), torch.randn(3)
    jf(x)
    torch.set_default_dtype(torch.float32)
    assert jf(x).dtype == torch.float64  # a cache hit still sets the default, as every eager call does
    assert torch.get_default_dtype() == torch.float64


# -- other threads' random draws do not disturb a compile --------------------------------------
class _Drawing:
    """A thread drawing random numbers from torch's global generator until stopped."""

    def __init__(self, reseed: bool = False):
        self.draws, self.stop, self.reseed = 0, threading.Event(), reseed
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            if self.reseed:
                torch.manual_seed(self.draws)
            torch.rand(8)
            self.draws += 1

    def wait_for_a_draw(self):
        seen = self.draws
        while self.draws == seen:
            self.stop.wait(0.0005)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("reseed", [False, True], ids=["draws", "seeds_and_draws"])
def test_random_draws_in_another_thread_during_a_compile_are_not_mistaken_for_reseeding(reseed):
    drawing = _Drawing(reseed)

    def f(x):
        drawing.wait_for_a_draw()  # runs at trace time: the other thread moves the generator mid-trace
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.randn(3)

    def eager(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.randn(3)

    jf = tf.jit(f)
    x = torch.randn(3)
    with drawing:
        jf(x)  # compiles while the other thread draws
    torch.manual_seed(3)
    expected = eager(x)
    torch.manual_seed(3)
    torch.testing.assert_close(jf(x), expected)


def test_reseeding_inside_the_traced_function_is_still_refused_by_name():
    def seeds_nondeterministically(x):
        torch.seed()
        return x + torch.rand(3)

    def seeds_the_generator_itself(x):
        torch.default_generator.manual_seed((torch.initial_seed() + 1) % 2**32)
        return x + torch.rand(3)

    with _Drawing():
        with pytest.raises(tf.UnsupportedOpError, match=r"torch\.seed\(\)"):
            tf.jit(seeds_nondeterministically)(torch.randn(3))
        with pytest.raises(tf.UnsupportedOpError, match="manual_seed"):
            tf.jit(seeds_the_generator_itself)(torch.randn(3))
