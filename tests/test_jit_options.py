"""tf.jit's options as one record (thunderfn/jit_options.py): every option checked once, when tf.jit is
called, a bad value refused by an error naming the option; the record reaches, whole, what compiles
as tf.jit does (a jitted module's forward, tf.profile's twin, the torch.compile backend)."""
from __future__ import annotations

import dataclasses
import inspect
import os

import pytest
import torch

import thunderfn as tf
from thunderfn.errors import ArgumentTypeError, ArgumentValueError
from thunderfn.jit_options import NAMES, JitOptions
from thunderfn.transforms.ddp import DataParallel


def scale(x, n):
    return x * n


def test_jit_and_the_record_list_the_same_options_with_the_same_defaults():
    signature = inspect.signature(inspect.unwrap(tf.jit)).parameters
    assert list(signature)[1:] == list(NAMES)
    defaults = {f.name: f.default for f in dataclasses.fields(JitOptions)}
    assert {name: p.default for name, p in signature.items() if name != "fn"} == defaults


# (options, the error, a regular expression its message matches: each names the option)
BAD = {
    "executors-a-number": (dict(executors=3), ArgumentTypeError, "executors must be an executor"),
    "executors-a-number-among-them": (dict(executors=["torch", 3]), ArgumentTypeError,
                                      "executors must be .* got 3 among them"),
    "executors-an-unknown-name": (dict(executors=["nope"]), ArgumentValueError, "executors: no executor named 'nope'"),
    "fallback": (dict(fallback="no"), ArgumentTypeError, "fallback must be True or False, got 'no'"),
    "static_argnums": (dict(static_argnums="1"), ArgumentTypeError, "static_argnums must be an int or a sequence"),
    "static_argnames": (dict(static_argnames=3), ArgumentTypeError, "static_argnames must be a str or a sequence"),
    "static_argnums-past-the-signature": (dict(static_argnums=5), ArgumentValueError, "static_argnums=\\(5,\\)"),
    "disable_torch_autograd": (dict(disable_torch_autograd=None), ArgumentTypeError,
                               "disable_torch_autograd must be True or False"),
    "cache_size_limit": (dict(cache_size_limit=0), ArgumentValueError, "cache_size_limit must be a positive int"),
    "cache_size_limit-a-float": (dict(cache_size_limit=2.0), ArgumentValueError, "cache_size_limit must be"),
    "rematerialize": (dict(rematerialize="yes"), ArgumentValueError, "rematerialize must be None"),
    "rematerialize-an-int": (dict(rematerialize=1), ArgumentValueError, "rematerialize must be None"),
    "cache_dir": (dict(cache_dir=3), ArgumentTypeError, "cache_dir must be a path"),
    "distributed": (dict(distributed="ddp"), ArgumentTypeError, "distributed must be None, a DataParallel"),
    "fusion-a-number": (dict(fusion=3), ArgumentTypeError, "fusion must be True, False"),
    "fusion-not-a-fusion-executor": (dict(fusion="torch"), ArgumentValueError, "fusion= takes True or a fusion"),
    "dynamic": (dict(dynamic="auto"), ArgumentValueError, "dynamic must be None"),
    "donate_argnums": (dict(donate_argnums="0"), ArgumentTypeError, "donate_argnums must be an int or a sequence"),
    "reuse_blocks": (dict(reuse_blocks="yes"), ArgumentTypeError, "reuse_blocks must be True or False"),
}


@pytest.mark.parametrize("options, error, message", BAD.values(), ids=BAD.keys())
@pytest.mark.parametrize("target", ["function", "module", "decorator"])
def test_a_bad_value_of_each_option_is_refused_when_jit_is_called_naming_the_option(target, options, error, message):
    # (nothing is called: the error comes from tf.jit itself)
    with pytest.raises(error, match=message):
        if target == "function":
            tf.jit(scale, **options)
        elif target == "module":
            tf.jit(torch.nn.Linear(2, 2), **options)
        else:
            tf.jit(**options)(scale)


def test_every_option_is_covered_by_a_bad_value():
    covered = {name for options, _, _ in BAD.values() for name in options}
    assert covered == set(NAMES)


def test_a_value_is_kept_in_one_form():
    options = JitOptions(executors="torch", static_argnums=1, static_argnames="n")
    assert options.executors == ("torch",) and options.static_argnums == (1,) and options.static_argnames == ("n",)
    assert JitOptions(executors=None).executors is None  # the defaults, read when compiling
    fused = JitOptions(executors=["torch"], fusion=True)
    assert [ex.name for ex in fused.executors[:1]] == ["torch"] and fused.executors[-1].name == "inductor"
    assert dataclasses.replace(fused, dynamic=True).executors == fused.executors  # (checked again: unchanged)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.fallback = False


def test_jit_builds_the_record_once_and_its_state_holds_it():
    jitted = tf.jit(scale, executors="torch", static_argnums=1, cache_size_limit=3)
    state = jitted._thunderfn_state
    assert state.options == JitOptions(executors=("torch",), static_argnums=(1,), cache_size_limit=3)
    assert state.static.argnames == ("n",)  # resolved against scale's signature
    assert tf.cache_info(jitted)["cache_size_limit"] == 3


# -- the module path: every option reaches the forward's jit ---------------------------------------
class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, x, n):
        return self.w * x * n


def test_a_jitted_modules_forward_compiles_with_every_option_it_was_given(tmp_path):
    given = dict(executors=["torch"], fallback=False, static_argnames="n", disable_torch_autograd=True,
                 cache_size_limit=2, rematerialize=False, cache_dir=tmp_path, dynamic=False)
    module = tf.jit(Scale(), **given)
    out = module(torch.ones(4, 3), 2.0)
    module(torch.ones(5, 3), 2.0)
    state = module._thunderfn_state  # the forward's
    assert state.options == JitOptions(**given)
    assert state.static.argnames == ("n",) and state.static.argnums == (1,) and state.static.offset == 1
    assert not out.requires_grad  # disable_torch_autograd
    info = tf.cache_info(module)
    assert info["cache_size_limit"] == 2
    assert info["entries"] == 2 and info["symbolic"] == []  # dynamic=False: a new size compiled static
    assert any(name.endswith(".py") for _, _, files in os.walk(tmp_path) for name in files)  # cache_dir


def test_a_jitted_module_takes_fusion_as_a_function_does():
    module = tf.jit(Scale(), fusion=True)
    assert module._thunderfn_options == tf.jit(scale, fusion=True)._thunderfn_state.options
    assert module._thunderfn_options.executors[-1].name == "inductor"


def test_distributed_given_for_a_module_is_refused_not_dropped():
    """tf.jit(module) used to drop `distributed=` silently: a module's distribution is its preparation by
    tf.distributed.ddp or fsdp, which its jitted forward reads; given directly, it is refused, naming it."""
    config = DataParallel(group_id=0, world_size=1, bucket_bytes=1, n_params=1)
    with pytest.raises(ArgumentValueError, match="distributed is set by tf.distributed.ddp and fsdp .* "
                                                 "tf.jit\\(tf.distributed.ddp\\(model\\)\\)"):
        tf.jit(Scale(), distributed=config)
    assert tf.jit(scale, distributed=config)._thunderfn_state.options.distributed is config  # a function keeps it


def test_the_torch_compile_backend_checks_its_options_once_when_made():
    with pytest.raises(ArgumentValueError, match="cache_size_limit must be a positive int"):
        tf.dynamo.backend(cache_size_limit=0)
    with pytest.raises(ArgumentValueError, match="Unexpected optimization option 'distributed'"):
        tf.dynamo.backend(distributed=None)
    backend = tf.dynamo.backend(executors="torch", cache_size_limit=3)
    assert backend.options == JitOptions(executors=("torch",), cache_size_limit=3) and backend.runner == "eager"
    assert repr(backend) == "thunderfn.dynamo.backend(executors='torch', cache_size_limit=3)"
