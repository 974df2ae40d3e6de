"""Jitted modules as objects users share, copy, save and wrap:
threads compiling and using one module, deepcopy, torch.save, jit of a jitted module."""
import copy
import io
import threading

import torch

import thunderfn as tf
from thunderfn.core.proxies import TensorProxy


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


def _no_proxies_in(module: torch.nn.Module) -> bool:
    tensors = list(module.parameters()) + list(module.buffers())
    tables = [t for m in module.modules() for t in (*m._parameters.values(), *m._buffers.values())]
    return not any(isinstance(t, TensorProxy) for t in tensors + tables)


# -- threads compiling and calling one module --------------------------------------------------
def test_concurrent_first_calls_compile_once_and_never_expose_proxies():
    model = MLP()
    jm, x = tf.jit(model), torch.randn(3, 8)
    expected = model(x)
    barrier, results, errors = threading.Barrier(6), [], []

    def first_call():
        try:
            barrier.wait()
            results.append(jm(x))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=first_call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for r in results:
        torch.testing.assert_close(r, expected)
    assert _no_proxies_in(model)
    assert tf.cache_info(jm)["misses"] == 1


def test_eager_use_of_the_module_during_a_compile_sees_its_own_tensors():
    model = MLP()
    x = torch.randn(3, 8)
    expected = model(x)
    seen = []

    class Probe(torch.nn.Module):  # runs an eager call of `model` in another thread mid-trace
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, inp):
            out = self.inner(inp)
            t = threading.Thread(target=lambda: seen.append((model(x), _no_proxies_in(model))))
            t.start()
            t.join()
            return out

    jm = tf.jit(Probe())
    torch.testing.assert_close(jm(x), expected)
    (eager_out, clean), = seen
    torch.testing.assert_close(eager_out, expected)
    assert clean


def test_tracing_a_module_never_replaces_its_tensors():
    model = MLP()
    before = {n: t for n, t in [*model.named_parameters(), *model.named_buffers()]}
    jm = tf.jit(model)
    jm(torch.randn(2, 8))
    after = {n: t for n, t in [*model.named_parameters(), *model.named_buffers()]}
    assert before.keys() == after.keys() and all(before[n] is after[n] for n in before)


# -- copies, checkpoints, wrapping ------------------------------------------------------------
def test_deepcopy_of_a_called_jitted_module_is_an_independent_working_copy():
    model = MLP()
    jm, x = tf.jit(model), torch.randn(2, 8)
    jm(x)
    ema = copy.deepcopy(jm)
    torch.testing.assert_close(ema(x), jm(x))
    with torch.no_grad():
        ema.module.fc1.weight.zero_()
    assert not torch.equal(ema(x), jm(x))  # the copy owns its parameters
    torch.testing.assert_close(ema(x), ema.module(x))
    assert list(ema.state_dict()) == list(model.state_dict())


def test_torch_save_and_load_of_a_jitted_module():
    model = MLP()
    jm, x = tf.jit(model), torch.randn(2, 8)
    jm(x)
    buffer = io.BytesIO()
    torch.save(jm, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded(x), jm(x))
    assert list(loaded.state_dict()) == list(model.state_dict())


def test_state_dict_keys_equal_the_original_module():
    model = MLP()
    jm = tf.jit(model)
    jm(torch.randn(2, 8))
    assert list(jm.state_dict()) == list(model.state_dict())
    jm.load_state_dict(MLP().state_dict())  # a checkpoint of the plain module loads into the jitted one


def test_jit_of_a_jitted_module_works():
    model = MLP()
    x = torch.randn(2, 8)
    jjm = tf.jit(tf.jit(model))
    torch.testing.assert_close(jjm(x), model(x))
    assert list(jjm.state_dict()) == list(model.state_dict())


def test_jit_of_a_jitted_function_works():
    f = tf.jit(lambda x: torch.sin(x) * 2)
    x = torch.randn(3)
    torch.testing.assert_close(tf.jit(f)(x), torch.sin(x) * 2)


def test_lazy_module_initializes_in_an_eager_first_call_then_jits():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.ReLU())
    twin = copy.deepcopy(model)
    jm, x = tf.jit(model), torch.randn(2, 3)
    torch.manual_seed(1)
    first = jm(x)  # creates the parameters from the seed, as eager's first call does
    torch.manual_seed(1)
    torch.testing.assert_close(first, twin(x))
    torch.testing.assert_close(jm(x), twin(x))
    assert tf.cache_info(jm)["misses"] == 1  # the second call compiled; the first ran eagerly


def test_transformer_layer_asking_is_nested_traces():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(tf.jit(layer)(x), layer(x))


def test_torch_func_functional_call_on_a_jitted_module_matches_the_module():
    for model in (torch.nn.Linear(3, 2), torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())):
        jm, x = tf.jit(model), torch.randn(4, 3)
        params = {k: torch.randn_like(v) for k, v in model.named_parameters()}
        torch.testing.assert_close(torch.func.functional_call(jm, params, (x,)),
                                   torch.func.functional_call(model, params, (x,)))
        torch.testing.assert_close(jm(x), model(x))  # the module's own parameters are back
