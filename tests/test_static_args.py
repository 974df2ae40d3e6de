"""static_argnums and static_argnames (static_args.py): checked against the signature when jit is called,
JAX's rules (each completes the other, negative indices, *args and **kwargs), each call's static arguments
refused when they hold a tensor or cannot be hashed, whether passed by position or by keyword, and a
module's applied to its forward."""
import functools
import re

import pytest
import torch

import thunderfn as tf
from thunderfn.errors import InvalidArgumentError


@pytest.fixture
def x():
    return torch.randn(2, 3)


def one(x):
    return x


def scale(x, n, *, mode="mul"):
    return x * n if mode == "mul" else x + n


def positional_only(x, n, /, k=1):
    return x * n * k


def variadic(x, *rest, **options):
    return x * sum(rest) if options.get("double") is None else 2 * x * sum(rest)


def _resolved(jitted):
    static = jitted._thunderfn_state.static
    return static.argnums, static.argnames


# -- checked when jit is called ----------------------------------------------------------------
@pytest.mark.parametrize("fn, options, message", [
    (one, dict(static_argnums=(3,)),
     "jitted function 'one' has static_argnums=(3,), but only accepts 1 positional argument; its parameters: (x)"),
    (one, dict(static_argnums=1), "static_argnums=(1,), but only accepts 1 positional argument"),
    (one, dict(static_argnums=-2), "static_argnums=(-2,), but only accepts 1 positional argument"),
    (scale, dict(static_argnums=(0, 2)),
     "jitted function 'scale' has static_argnums=(0, 2), but only accepts 2 positional arguments; "
     "its parameters: (x, n, *, mode)"),
    (one, dict(static_argnames="m"),
     "jitted function 'one' has static_argnames=('m',), but 'm' is not one of its parameters; its parameters: (x)"),
    (scale, dict(static_argnames=("q", "mode", "z")),
     "'q', 'z' are not among its parameters; its parameters: (x, n, *, mode)"),
    (positional_only, dict(static_argnames="n"),
     "jitted function 'positional_only' has static_argnames=('n',), but 'n' cannot be passed by keyword "
     "(positional-only or *args): name it in static_argnums instead; its parameters: (x, n, /, k)"),
    (variadic, dict(static_argnames="rest"), "'rest' cannot be passed by keyword"),
], ids=["past-the-end", "one-past", "negative-past-the-start", "two-parameters", "unknown-name", "unknown-names",
        "positional-only-name", "star-args-name"])
def test_an_index_or_name_the_signature_lacks_is_a_value_error_naming_the_function_and_its_parameters(
        fn, options, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        tf.jit(fn, **options)
    assert isinstance(info.value, InvalidArgumentError)


@pytest.mark.parametrize("options, message", [
    (dict(static_argnums="1"), "static_argnums must be an int or a sequence of ints, got '1'"),
    (dict(static_argnums=(1.0,)), "static_argnums must be an int or a sequence of ints"),
    (dict(static_argnames=3), "static_argnames must be a str or a sequence of strs, got 3"),
    (dict(static_argnames=("n", 1)), "static_argnames must be a str or a sequence of strs"),
], ids=["str-index", "float-index", "int-name", "int-among-names"])
def test_an_option_of_the_wrong_type_is_a_type_error(options, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        tf.jit(scale, **options)


def test_a_decorator_checks_when_it_decorates():
    with pytest.raises(ValueError, match="'power' has static_argnums=.5,."):
        @tf.jit(static_argnums=5)
        def power(x, n):
            return x ** n


# -- each completes the other ----------------------------------------------------------------
@pytest.mark.parametrize("fn, options, resolved", [
    (scale, dict(static_argnums=1), ((1,), ("n",))),
    (scale, dict(static_argnums=-1), ((1,), ("n",))),  # from the end of the positional parameters
    (scale, dict(static_argnums=(-1, 1)), ((1,), ("n",))),
    (scale, dict(static_argnames="n"), ((1,), ("n",))),
    (scale, dict(static_argnames="mode"), ((), ("mode",))),  # keyword-only: no index
    (scale, dict(static_argnums=0, static_argnames="mode"), ((0,), ("mode", "x"))),
    (positional_only, dict(static_argnums=1), ((1,), ())),  # positional-only: no name
    (positional_only, dict(static_argnames="k"), ((2,), ("k",))),
    (positional_only, dict(static_argnums=-1), ((2,), ("k",))),
    (variadic, dict(static_argnums=(1, 4)), ((1, 4), ())),  # *args: any index, no name past x
    (variadic, dict(static_argnums=-1), ((-1,), ())),  # *args: counted per call
    (variadic, dict(static_argnums=0), ((0,), ("x",))),
    (variadic, dict(static_argnames="double"), ((), ("double",))),  # **kwargs: any name
    (variadic, dict(static_argnames="options"), ((), ("options",))),  # even its own
    (functools.partial(scale, torch.ones(1)), dict(static_argnums=0), ((0,), ("n",))),  # partial: what is left
    (torch.sin, dict(static_argnums=(1, -1)), ((-1, 1), ())),  # no signature: nothing to check, as in JAX
], ids=["index", "negative", "duplicate", "name", "keyword-only", "both", "positional-only", "name-to-index",
        "negative-positional-or-keyword", "star-args", "star-args-negative", "star-args-named", "star-kwargs",
        "star-kwargs-own-name", "partial", "builtin"])
def test_indices_and_names_complete_each_other_through_the_signature(fn, options, resolved):
    assert _resolved(tf.jit(fn, **options)) == resolved


# -- each call ---------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [dict(static_argnums=1), dict(static_argnames="n")], ids=["argnum", "argname"])
@pytest.mark.parametrize("call", [lambda f, x: f(x, x), lambda f, x: f(x, n=x), lambda f, x: f(x, (1, x))],
                         ids=["by-position", "by-keyword", "nested"])
def test_a_tensor_in_a_static_argument_is_refused_however_it_is_passed(options, call, x):
    f = tf.jit(scale, **options)
    with pytest.raises(TypeError, match="static argument (.index 1.|'n') of 'scale' holds a tensor"):
        call(f, x)


@pytest.mark.parametrize("options", [dict(static_argnums=1), dict(static_argnames="n")], ids=["argnum", "argname"])
@pytest.mark.parametrize("call, where", [(lambda f, x: f(x, [2]), "(index 1)"), (lambda f, x: f(x, n={"a": 2}), "'n'")],
                         ids=["by-position", "by-keyword"])
def test_an_unhashable_static_argument_is_a_value_error_as_in_jax(options, call, where, x):
    f = tf.jit(scale, **options)
    message = f"Non-hashable static arguments are not supported: static argument {where} of 'scale' is a"
    with pytest.raises(ValueError, match=re.escape(message)):
        call(f, x)


def test_a_static_argument_is_keyed_by_value_whether_passed_by_position_or_keyword(x):
    f = tf.jit(scale, static_argnums=1)
    torch.testing.assert_close(f(x, 2), x * 2)
    torch.testing.assert_close(f(x, 3), x * 3)
    torch.testing.assert_close(f(x, n=2), x * 2)
    torch.testing.assert_close(f(x, n=2, mode="add"), x + 2)
    assert tf.cache_info(f)["misses"] == 4
    f(x, 2), f(x, n=2)
    assert tf.cache_info(f)["hits"] == 2


def test_a_negative_index_counts_from_the_end_of_the_parameters_even_when_a_default_is_left_out(x):
    f = tf.jit(positional_only, static_argnums=-1)  # k, passed or not
    torch.testing.assert_close(f(x, x), x * x)
    torch.testing.assert_close(f(x, x, 3), x * x * 3)
    with pytest.raises(TypeError, match="static argument .index 2. of 'positional_only' holds a tensor"):
        f(x, x, x)


def test_star_args_take_any_index_and_count_a_negative_one_per_call(x):
    f = tf.jit(variadic, static_argnums=(1, -1))
    torch.testing.assert_close(f(x, 2, 3), x * 5)
    torch.testing.assert_close(f(x, 2, 3, 4), x * 9)  # index 4 not passed: nothing to check
    with pytest.raises(TypeError, match="static argument .index -1. of 'variadic' holds a tensor"):
        f(x, 2, x)
    with pytest.raises(TypeError, match="static argument .index 1. of 'variadic' holds a tensor"):
        f(x, x, 2)
    with pytest.raises(ValueError, match=r"static_argnums=\(-5,\), but was called with 2 positional arguments"):
        tf.jit(variadic, static_argnums=-5)(x, 2)


# -- modules -----------------------------------------------------------------------------------
class Gated(torch.nn.Module):
    """Branches on a Python flag: a static argument of forward."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x, gelu=False, *, scale=1.0):
        y = self.linear(x) + self.shift
        return (torch.nn.functional.gelu(y) if gelu else torch.tanh(y)) * scale


@pytest.mark.parametrize("options", [dict(static_argnums=1), dict(static_argnums=-1), dict(static_argnames="gelu")],
                         ids=["argnum", "negative", "argname"])
def test_a_modules_static_arguments_count_forwards_parameters_after_self_and_are_baked_in(options, x):
    model = Gated()
    jitted = tf.jit(model, **options)
    for gelu in (True, False, True, False):
        torch.testing.assert_close(jitted(x, gelu), model(x, gelu))
    info = tf.cache_info(jitted)
    assert (info["entries"], info["hits"]) == (2, 2)  # one entry per value of the flag
    traces = tf.last_traces(jitted)
    assert "gelu" not in str(traces[0]) and "tanh" in str(traces[0])  # the flag decided the trace
    with pytest.raises(TypeError, match="static argument (.index 1.|'gelu') of 'Gated.forward' holds a tensor"):
        jitted(x, x)
    with pytest.raises(TypeError, match="static argument 'gelu' of 'Gated.forward' holds a tensor"):
        jitted(x, gelu=x)
    with pytest.raises(ValueError, match="Non-hashable static arguments"):
        jitted(x, [True])


def test_a_modules_keyword_only_static_argument_is_baked_in(x):
    model = Gated()
    jitted = tf.jit(model, static_argnames="scale")
    torch.testing.assert_close(jitted(x, scale=2.0), model(x, scale=2.0))
    torch.testing.assert_close(jitted(x, scale=3.0), model(x, scale=3.0))
    assert tf.cache_info(jitted)["entries"] == 2
    with pytest.raises(TypeError, match="static argument 'scale' of 'Gated.forward' holds a tensor"):
        jitted(x, scale=torch.tensor(2.0))


@pytest.mark.parametrize("options, message", [
    (dict(static_argnums=2),
     "jitted function 'Gated.forward' has static_argnums=(2,), but only accepts 2 positional arguments; "
     "its parameters: (x, gelu, *, scale)"),
    (dict(static_argnums=-3), "static_argnums=(-3,), but only accepts 2 positional arguments"),
    (dict(static_argnames="self"), "'self' is not one of its parameters; its parameters: (x, gelu, *, scale)"),
    (dict(static_argnames=("gelus",)), "'gelus' is not one of its parameters"),
], ids=["past-the-end", "negative", "self", "unknown-name"])
def test_a_modules_static_arguments_are_checked_against_forward_when_jit_is_called(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tf.jit(Gated(), **options)


def test_a_profile_of_a_jitted_module_compiles_with_its_static_arguments(x):
    jitted = tf.jit(Gated(), static_argnums=1)
    with pytest.raises(TypeError, match="static argument .index 1. of 'Gated.forward' holds a tensor"):
        tf.profile(jitted, x, x)  # its own compile, from the same options
