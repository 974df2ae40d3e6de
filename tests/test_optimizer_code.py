"""Optimizer-style code under tf.jit matches eager: `.grad` is read when the compiled function
is called, and in-place updates of parameters under no_grad and whole optimizer steps give
eager's parameters and state; what cannot be traced (capturable, fused, a value-dependent step) is
refused by name and leaves the optimizer's state as it was."""
import copy

import pytest
import torch

import thunderfn as tf


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def _backward(model, x):
    model.zero_grad()
    (model(x) ** 2).sum().backward()


# -- .grad read at call time ---------------------------------------------------------------------
def test_grad_of_captured_parameter_is_read_at_call_time_not_trace_time():
    lin = torch.nn.Linear(3, 2)
    jitted = tf.jit(lambda: lin.weight.grad * 2)
    for i in range(3):  # zero_grad() (set_to_none) and backward() give a new .grad tensor every time
        lin.zero_grad()
        (lin(torch.randn(4, 3)) ** (i + 1)).sum().backward()
        assert torch.equal(jitted(), lin.weight.grad * 2)
    lin.zero_grad()  # .grad is None now: the guard retraces, and the function fails as eager does
    with pytest.raises(TypeError, match="NoneType"):
        jitted()


def test_grad_of_an_argument_and_of_an_intermediate_are_eagers():
    def f(p):
        return p.grad, (p * 2).grad

    p = torch.ones(3, requires_grad=True)
    jitted = tf.jit(f)
    assert jitted(p) == (None, None)
    p.grad = torch.full((3,), 5.0)
    grad, intermediate = jitted(p)
    assert grad is p.grad and intermediate is None


def test_in_place_update_of_a_grad_is_written_into_the_callers_grad():
    lin = torch.nn.Linear(3, 2)
    lin(torch.randn(4, 3)).sum().backward()
    before = lin.weight.grad.clone()

    def clip():
        lin.weight.grad.mul_(0.5)

    tf.jit(clip)()
    assert torch.equal(lin.weight.grad, before * 0.5)


def test_assigning_grad_inside_a_traced_function_is_refused_by_name():
    lin = torch.nn.Linear(3, 2)

    def reset():
        lin.weight.grad = None

    with pytest.raises(tf.UnsupportedOpError, match=r"assigning a tensor's \.grad"):
        tf.jit(reset)()


# -- in-place updates of parameters under no_grad ---------------------------------------------------
def test_no_grad_update_of_captured_parameters_matches_eager():
    model, ref = _model(), _model()

    def step(lr):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.9).sub_(lr * p.grad)

    def ref_step(lr):
        with torch.no_grad():
            for p in ref.parameters():
                p.mul_(0.9).sub_(lr * p.grad)

    jitted = tf.jit(step)
    for _ in range(3):
        x = torch.randn(5, 4)
        _backward(model, x)
        _backward(ref, x)
        jitted(0.1)
        ref_step(0.1)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q) and p.is_leaf and p.requires_grad
    assert torch.is_grad_enabled()


def test_write_into_a_leaf_requiring_grad_under_grad_mode_raises_torchs_error():
    lin = torch.nn.Linear(3, 2)

    def bad():
        lin.weight.mul_(0.5)

    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        bad()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        tf.jit(bad)()


def test_reading_a_parameter_under_grad_mode_after_a_no_grad_update_is_refused_by_name():
    lin = torch.nn.Linear(3, 2)

    def update_then_use(x):
        with torch.no_grad():
            lin.weight.mul_(0.5)
        return lin(x).sum()

    with pytest.raises(tf.UnsupportedOpError, match="under grad mode after writing into it in place"):
        tf.jit(update_then_use)(torch.randn(2, 3))


# -- optimizer steps: eager's parameters and state -----------------------------------------------------
OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "sgd_nesterov_weight_decay": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adam_foreach_amsgrad": lambda p: torch.optim.Adam(p, lr=0.01, foreach=True, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True),
}


def _assert_same_state(opt, ref_opt):
    got, want = opt.state_dict(), ref_opt.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for k, state in want["state"].items():
        assert got["state"][k].keys() == state.keys()
        for name, value in state.items():
            assert torch.equal(got["state"][k][name], value), (k, name)


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_jitted_optimizer_step_matches_eager_parameters_and_state_bitwise(make):
    model, ref = _model(), _model()
    opt, ref_opt = make(model.parameters()), make(ref.parameters())
    step = tf.jit(opt.step)
    for i in range(4):  # the first step creates the state (run eagerly), the next ones are compiled
        x = torch.randn(5, 4)
        _backward(model, x)
        _backward(ref, x)
        if i == 2:  # a Python float read at trace time: changing it must retrace, never reuse the old lr
            for o in (opt, ref_opt):
                for group in o.param_groups:
                    group["lr"] *= 0.5
        step()
        ref_opt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.equal(p, q), i
        _assert_same_state(opt, ref_opt)
    assert tf.cache_info(step)["misses"] == 3  # eager first step, steady trace, retrace for the new lr


def test_a_jitted_function_calling_optimizer_step_matches_eager_with_a_parameter_without_grad():
    model, ref = _model(), _model()
    opt, ref_opt = torch.optim.AdamW(model.parameters(), lr=0.01), torch.optim.AdamW(ref.parameters(), lr=0.01)

    @tf.jit
    def update(scale):
        opt.step()
        return scale * 2

    for i in range(4):
        x = torch.randn(5, 4)
        _backward(model, x)
        _backward(ref, x)
        if i == 3:  # AdamW skips a parameter whose .grad is None (the guard on .grad retraces)
            model[0].bias.grad = ref[0].bias.grad = None
        assert torch.equal(update(torch.ones(2)), torch.full((2,), 2.0))
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    _assert_same_state(opt, ref_opt)


def test_load_state_dict_replacing_the_state_tensors_retraces():
    model, ref = _model(), _model()
    opt, ref_opt = torch.optim.Adam(model.parameters(), lr=0.01), torch.optim.Adam(ref.parameters(), lr=0.01)
    step = tf.jit(opt.step)
    for _ in range(3):
        x = torch.randn(5, 4)
        _backward(model, x)
        _backward(ref, x)
        step()
        ref_opt.step()
    # new state tensors: the compiled step must not keep the old ones
    opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))
    x = torch.randn(5, 4)
    _backward(model, x)
    _backward(ref, x)
    step()
    ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    _assert_same_state(opt, ref_opt)


@pytest.mark.parametrize("flag", ["capturable", "fused"])
def test_capturable_and_fused_optimizers_are_refused_by_name(flag):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, **{flag: True}) if flag == "capturable" else None
    if opt is None:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for group in opt.param_groups:  # fused=True needs a device with fused kernels to construct
            group["fused"] = True
    _backward(model, torch.randn(5, 4))
    with pytest.raises(tf.UnsupportedOpError, match=f"{flag}=True inside a traced function"):
        tf.jit(opt.step)()
    assert all(len(s) == 0 for s in opt.state.values())  # nothing was left behind by the refused trace


def test_a_failed_trace_of_an_optimizer_step_leaves_its_state_as_it_was():
    class DataDependent(torch.optim.SGD):
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["scaled"] = p.grad * 2  # Python state written while tracing
                    if p.grad.sum() > 0:  # value-dependent: tracing stops here
                        p.data.add_(1)

    model = _model()
    opt = DataDependent(model.parameters(), lr=0.1)
    _backward(model, torch.randn(5, 4))
    with pytest.raises(tf.ConcretizationError):
        tf.jit(opt.step)()
    assert len(opt.state) == 0  # no proxy left in the optimizer's state
