"""Repeated blocks (thunderfn/blocks.py): a module's repeated layers traced, differentiated and lowered once, and
every layer that is the same block calling that code; exact where layers differ in anything their code reads."""
import pytest
import torch

import thunderfn as tf
from thunderfn.core.bodies import Body


class Block(torch.nn.Module):
    def __init__(self, width: int = 8, scale: float = 1.0, index: int = 0):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)
        self.scale = scale
        self.index = index  # named in forward only in a branch not taken: the layers stay one block

    def forward(self, x, gate: bool = True):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        if not gate:
            return x + h * self.index
        return x + h * self.scale


class Stack(torch.nn.Module):
    def __init__(self, layers: int = 4, width: int = 8, scales=None, block=Block):
        super().__init__()
        scales = scales or [1.0] * layers
        self.layers = torch.nn.ModuleList([block(width, s, i) for i, s in enumerate(scales)])
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum()


def _blocks(trace) -> list:
    """The bodies the trace's block calls run, in order."""
    return [b.args[0] for b in trace.bound_symbols if b.sym.id == "control_flow.block"]


def _forward_trace(jitted):
    return tf.last_traces(jitted)[0]


def _train_step_matches_eager(model, x):
    jitted = tf.jit(model)
    loss = jitted(x)
    loss.backward()
    got = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    return jitted


def test_the_layers_of_a_module_list_share_one_traced_block_and_train_like_eager():
    torch.manual_seed(0)
    jitted = _train_step_matches_eager(Stack(4), torch.randn(3, 8))
    bodies = _blocks(_forward_trace(jitted))
    assert len(bodies) == 4 and len({id(b) for b in bodies}) == 1
    assert isinstance(bodies[0], Body)


def test_layers_whose_read_attributes_differ_are_blocks_of_their_own():
    # each layer's forward reads self.scale: the layers with 2.0 cannot run the code traced with 1.0 baked in
    torch.manual_seed(0)
    jitted = _train_step_matches_eager(Stack(4, scales=[1.0, 2.0, 1.0, 2.0]), torch.randn(3, 8))
    bodies = _blocks(_forward_trace(jitted))
    assert len(bodies) == 4 and len({id(b) for b in bodies}) == 2
    assert bodies[0] is bodies[2] and bodies[1] is bodies[3]


def test_an_attribute_changed_after_compiling_on_a_reused_layer_retraces():
    torch.manual_seed(0)
    model, x = Stack(3), torch.randn(3, 8)
    jitted = tf.jit(model)
    jitted(x)
    model.layers[2].scale = 3.0  # layer 2 never ran its Python: its guards came from layer 0's, relative to it
    torch.testing.assert_close(jitted(x), model(x))
    assert tf.cache_info(jitted)["misses"] == 2


def test_a_submodule_of_another_class_makes_another_block():
    class Other(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x)

    torch.manual_seed(0)
    model = Stack(3)
    model.layers[1].norm = Other()  # (class and parameter shapes of the layers agree but for this)
    with torch.no_grad():
        jitted = tf.jit(model)
        torch.testing.assert_close(jitted(torch.ones(2, 8)), model(torch.ones(2, 8)))
    bodies = _blocks(_forward_trace(jitted))
    assert len({id(b) for b in bodies}) == 2 and bodies[0] is bodies[2]


def test_frozen_parameters_in_one_layer_make_it_another_block_and_get_no_gradient():
    torch.manual_seed(0)
    model = Stack(3)
    model.layers[1].up.weight.requires_grad_(False)
    jitted = _train_step_matches_eager(model, torch.randn(3, 8))
    assert model.layers[1].up.weight.grad is None
    bodies = _blocks(_forward_trace(jitted))
    assert len({id(b) for b in bodies}) == 2


def test_tied_parameters_across_layers_accumulate_both_gradients():
    torch.manual_seed(0)
    model = Stack(3)
    model.layers[2].up.weight = model.layers[0].up.weight
    _train_step_matches_eager(model, torch.randn(3, 8))


def test_a_layer_that_updates_its_buffers_in_place_is_traced_inline_like_eager():
    class NormBlock(torch.nn.Module):
        def __init__(self, width, scale, index):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(width)
            self.lin = torch.nn.Linear(width, width)

        def forward(self, x):
            return x + self.lin(self.bn(x))

    torch.manual_seed(0)
    model, twin = Stack(3, block=NormBlock), Stack(3, block=NormBlock)
    twin.load_state_dict(model.state_dict())
    x = torch.randn(5, 8)
    jitted = tf.jit(model)
    torch.testing.assert_close(jitted(x), twin(x))
    torch.testing.assert_close(model.layers[2].bn.running_mean, twin.layers[2].bn.running_mean)
    assert not _blocks(_forward_trace(jitted))


def test_reuse_blocks_false_traces_every_layer_inline():
    torch.manual_seed(0)
    model, x = Stack(3), torch.randn(2, 8)
    jitted = tf.jit(model, reuse_blocks=False)
    torch.testing.assert_close(jitted(x), model(x))
    assert not _blocks(_forward_trace(jitted))


def test_the_printed_trace_shows_a_blocks_statements_once():
    torch.manual_seed(0)
    model, x = Stack(3), torch.randn(2, 8)
    jitted = tf.jit(model)
    jitted(x)
    text = str(_forward_trace(jitted))
    name = _blocks(_forward_trace(jitted))[0].__name__
    assert text.count(f"def {name}(") == 1
    assert text.count(f"({name}: printed above") == 2


def test_gpt2_layers_are_one_block_and_scaling_by_layer_index_stays_exact():
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed (pip "
                                                                 "install thunderfn[test] installs it)")
    for scaled in (False, True):
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                         use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         scale_attn_by_inverse_layer_idx=scaled)
        model = transformers.GPT2LMHeadModel(config)
        ids = torch.randint(0, 64, (2, 8))
        jitted = tf.jit(model)
        out = jitted(ids, labels=ids)
        out.loss.backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        expected = model(ids, labels=ids)
        expected.loss.backward()
        torch.testing.assert_close(out.loss, expected.loss)
        for g, p in zip(got, model.parameters()):
            torch.testing.assert_close(g, p.grad)
        bodies = _blocks(_forward_trace(jitted))
        # unscaled, the layers differ only in layer_idx, which nothing reads without a KV cache
        assert len({id(b) for b in bodies}) == (3 if scaled else 1)


# -- tf.nested_compile_region, for a function ------------------------------------------------------------------
@tf.nested_compile_region
def _layer(x, w):
    return torch.tanh(x @ w)


def _net(x, ws):
    for w in ws:
        x = _layer(x, w)
    return x.sum()


def test_a_region_called_with_its_weights_as_arguments_is_traced_once():
    torch.manual_seed(0)
    x, ws = torch.randn(2, 4), [torch.randn(4, 4, requires_grad=True) for _ in range(3)]
    trace = tf.trace(_net, x, ws)
    bodies = _blocks(trace)
    assert len(bodies) == 3 and len({id(b) for b in bodies}) == 1
    got = tf.grad(_net, argnums=1)(x, ws)
    expected = torch.autograd.grad(_net(x, ws), ws)
    torch.testing.assert_close(got, list(expected))


def test_a_region_reading_a_tensor_from_outside_is_traced_for_each_call():
    torch.manual_seed(0)
    ws = [torch.randn(4, 4) for _ in range(3)]

    @tf.nested_compile_region
    def closing_over(x, i):
        return torch.tanh(x @ ws[i])

    def net(x):
        for i in range(3):
            x = closing_over(x, i)
        return x

    x = torch.randn(2, 4)
    torch.testing.assert_close(tf.jit(net)(x), net(x))


def test_a_region_whose_global_changed_between_calls_is_traced_again():
    state = {"scale": 1.0}

    @tf.nested_compile_region
    def scaled(x):
        return x * state["scale"]

    def net(x):
        y = scaled(x)
        state["scale"] = 2.0
        z = scaled(x)
        state["scale"] = 1.0
        return y + z

    x = torch.randn(3)
    torch.testing.assert_close(tf.jit(net)(x), net(x))


def test_a_layer_called_under_no_grad_is_another_block_and_the_others_still_get_gradients():
    class HalfFrozen(Stack):
        def forward(self, x):
            with torch.no_grad():
                x = self.layers[0](x)
            for layer in self.layers[1:]:
                x = layer(x)
            return self.head(x).sum()

    torch.manual_seed(0)
    model = HalfFrozen(3)
    jitted = _train_step_matches_eager(model, torch.randn(3, 8))
    assert model.layers[0].up.weight.grad is None and model.layers[2].up.weight.grad is not None
    bodies = _blocks(_forward_trace(jitted))
    assert len({id(b) for b in bodies}) == 2
