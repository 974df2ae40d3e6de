"""The transforms under symbolic sizes: each, jitted with dynamic=True (or compiled by its own automatic
dynamic), is one trace for every size of a small model-like function, and exact against eager / torch.func."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.func

import thunderfn as tf

SIZES = [3, 5, 8]  # the batch (first) dimension of x


def _block(x, w, b):
    """A small layer: a matmul, a bias broadcast, softmax over the features, a mean over the batch."""
    h = torch.tanh(x @ w + b)
    return (h.softmax(-1) * h).sum() + h.mean() * x.shape[0]


def _inputs(n: int, d: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed + n)
    return (torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(d, 6, generator=g, dtype=torch.float64),
            torch.randn(6, generator=g, dtype=torch.float64))


def _one_entry(fn):
    info = tf.cache_info(fn)
    assert info["misses"] == 1 and not info["static_fallbacks"], info
    return info


def test_jit_of_grad_is_one_entry():
    jitted = tf.jit(tf.grad(_block, argnums=(0, 1, 2)), dynamic=True)
    for n in SIZES:
        args = _inputs(n)
        torch.testing.assert_close(jitted(*args), torch.func.grad(_block, argnums=(0, 1, 2))(*args))
    _one_entry(jitted)


def test_value_and_grad_is_one_entry():
    jitted = tf.jit(tf.value_and_grad(_block, argnums=(1, 2)), dynamic=True)
    for n in SIZES:
        args = _inputs(n)
        value, grads = jitted(*args)
        expected_grads, expected_value = torch.func.grad_and_value(_block, argnums=(1, 2))(*args)
        torch.testing.assert_close((value, grads), (expected_value, expected_grads))
    _one_entry(jitted)


def test_grad_compiles_a_changed_size_once_more_symbolic():
    """tf.grad called with tensors compiles through jit's automatic dynamic: the second size opens it."""
    grad = tf.grad(_block, argnums=(0, 1))
    for n in SIZES:
        args = _inputs(n)
        torch.testing.assert_close(grad(*args), torch.func.grad(_block, argnums=(0, 1))(*args))
    assert tf.cache_info(grad)["misses"] == 2, tf.cache_info(grad)


def test_grad_of_jit_is_one_entry_of_the_inner_function():
    inner = tf.jit(_block, dynamic=True)
    grad = tf.grad(inner, argnums=(0, 1, 2))
    for n in SIZES:
        args = _inputs(n)
        torch.testing.assert_close(grad(*args), torch.func.grad(_block, argnums=(0, 1, 2))(*args))
    assert tf.cache_info(grad)["misses"] <= 2


def _torch_autograd_matches_in_one_entry(jitted, fn):
    for n in SIZES:
        args = [a.requires_grad_() for a in _inputs(n)]
        got = torch.autograd.grad(jitted(*args), args)
        expected = torch.autograd.grad(fn(*args), args)
        torch.testing.assert_close(got, expected)
    _one_entry(jitted)


def test_torch_autograd_through_a_jitted_function_is_one_entry():
    _torch_autograd_matches_in_one_entry(tf.jit(_block, dynamic=True), _block)


def test_vjp_is_one_entry():
    def f(x, w, b):
        h = torch.tanh(x @ w + b)
        return h * h.sum(0, keepdim=True)

    def vjp_of(x, w, b, ct):
        return tf.vjp(f, x, w, b)[1](ct)

    jitted = tf.jit(vjp_of, dynamic=True)
    for n in SIZES:
        x, w, b = _inputs(n)
        ct = torch.randn(n, 6, dtype=torch.float64)
        torch.testing.assert_close(jitted(x, w, b, ct), torch.func.vjp(f, x, w, b)[1](ct))
    _one_entry(jitted)


def test_vjp_called_with_tensors_and_its_pullback_at_several_sizes():
    def f(x, w, b):
        return torch.tanh(x @ w + b)

    for n in SIZES:
        x, w, b = _inputs(n)
        ct = torch.randn(n, 6, dtype=torch.float64)
        out, pullback = tf.vjp(f, x, w, b)
        expected_out, expected_pullback = torch.func.vjp(f, x, w, b)
        torch.testing.assert_close((out, pullback(ct)), (expected_out, expected_pullback(ct)))


def test_jvp_is_one_entry():
    def jvp_of(x, w, b, tx):
        return tf.jvp(lambda x: _block(x, w, b), (x,), (tx,))

    jitted = tf.jit(jvp_of, dynamic=True)
    for n in SIZES:
        x, w, b = _inputs(n)
        tx = torch.randn(n, 4, dtype=torch.float64)
        torch.testing.assert_close(jitted(x, w, b, tx), torch.func.jvp(lambda x: _block(x, w, b), (x,), (tx,)))
    _one_entry(jitted)


def test_vmap_over_a_symbolic_batch_is_one_entry():
    def per_example(x, w, b):  # x: one example (d,)
        h = torch.tanh(x @ w + b)
        return h.softmax(-1) * h.sum()

    jitted = tf.jit(tf.vmap(per_example, in_axes=(0, None, None)), dynamic=True)
    for n in SIZES:
        x, w, b = _inputs(n)
        torch.testing.assert_close(jitted(x, w, b), torch.func.vmap(per_example, in_dims=(0, None, None))(x, w, b))
    _one_entry(jitted)


def test_vmap_of_a_function_with_a_symbolic_non_batch_dimension_is_one_entry():
    """The batch is fixed (2) while the length of each example changes: the non-batch dimension is symbolic
    inside the vmapped function (a reduction, a slice and a reshape by it)."""
    def per_example(x):  # x: (t, d)
        t = x.shape[0]
        return (x.softmax(0) * x).sum(0) + x[: t - 1].mean(0) + x.reshape(-1).sum() / t

    jitted = tf.jit(tf.vmap(per_example), dynamic=True)
    for t in [3, 5, 8]:
        x = torch.randn(2, t, 4, dtype=torch.float64)
        torch.testing.assert_close(jitted(x), torch.func.vmap(per_example)(x))
    _one_entry(jitted)


def test_grad_of_vmap_is_one_entry():
    def per_example(x, w):
        return torch.tanh(x @ w).sum()

    def loss(w, x):
        return tf.vmap(per_example, in_axes=(0, None))(x, w).square().mean()

    def torch_loss(w, x):
        return torch.func.vmap(per_example, in_dims=(0, None))(x, w).square().mean()

    jitted = tf.jit(tf.grad(loss), dynamic=True)
    for n in SIZES:
        x, w, _ = _inputs(n)
        torch.testing.assert_close(jitted(w, x), torch.func.grad(torch_loss)(w, x))
    _one_entry(jitted)


def test_jacrev_on_a_small_input_is_one_entry():
    def f(x):
        return torch.tanh(x).cumsum(0) * x.sum()

    jitted = tf.jit(tf.jacrev(f), dynamic=True)
    for n in SIZES:
        x = torch.randn(n, dtype=torch.float64)
        torch.testing.assert_close(jitted(x), torch.func.jacrev(f)(x))
    _one_entry(jitted)


def test_rematerialized_backward_is_one_entry():
    def f(x, w, b):
        h = x @ w + b
        return (torch.tanh(h).sin() * h.sigmoid()).sum()

    _torch_autograd_matches_in_one_entry(tf.jit(f, rematerialize=True, dynamic=True), f)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()


def _train(model, optimizer, step_fn, sizes):
    for k, n in enumerate(sizes):
        g = torch.Generator().manual_seed(k)
        x, y = torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randn(n, 3, generator=g, dtype=torch.float64)
        step_fn(model, optimizer, x, y)
    return [p.detach().clone() for p in model.parameters()]


def _step(model, optimizer, x, y):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def test_training_a_jitted_module_over_batch_sizes_is_one_entry():
    sizes = [3, 5, 8, 6]
    model = _model()
    jitted = tf.jit(model, dynamic=True)
    got = _train(jitted, torch.optim.AdamW(model.parameters(), lr=0.01), _step, sizes)
    reference = _model()
    expected = _train(reference, torch.optim.AdamW(reference.parameters(), lr=0.01), _step, sizes)
    torch.testing.assert_close(got, expected)
    _one_entry(jitted)


def test_a_training_step_with_the_loss_and_the_optimizer_step_under_jit():
    """The loss jitted with dynamic=True (its backward by torch.autograd), torch.optim's step jitted too (its
    first step, which creates the optimizer's state, runs eagerly): the loss is one entry for every batch size,
    and the parameters are eager's."""
    sizes = [4, 3, 5, 8, 6]

    def make():
        model = _model()
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def mse(model, x, y):
        return torch.nn.functional.mse_loss(model(x), y)

    model, optimizer = make()
    loss = tf.jit(mse, dynamic=True)
    optimizer_step = tf.jit(optimizer.step)

    def step(model, optimizer, x, y):
        optimizer.zero_grad()
        loss(model, x, y).backward()
        optimizer_step()

    got = _train(model, optimizer, step, sizes)
    model, optimizer = make()
    expected = _train(model, optimizer, _step, sizes)
    torch.testing.assert_close(got, expected)
    _one_entry(loss)


@pytest.fixture
def one_process_group():
    """A gloo process group of this process alone (world size 1): tf.distributed's transforms run their
    collectives on it."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch build has no torch.distributed gloo backend")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'rendezvous')}", rank=0,
                                world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_distributed_training_over_batch_sizes_is_one_entry(one_process_group, wrap):
    sizes = [3, 5, 8]
    model = _model()
    prepared = tf.distributed.ddp(model) if wrap == "ddp" else tf.distributed.fsdp(model)
    jitted = tf.jit(prepared, dynamic=True)
    got = _train(jitted, torch.optim.SGD(jitted.parameters(), lr=0.1), _step, sizes)
    if wrap == "fsdp":
        got = list(tf.distributed.full_parameters(jitted).values())
    reference = _model()
    expected = _train(reference, torch.optim.SGD(reference.parameters(), lr=0.1), _step, sizes)
    torch.testing.assert_close(got, expected)
    _one_entry(jitted)
