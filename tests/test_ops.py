"""The OpInfo database, run: every op on every sample of every dtype it lists must
match eager torch under the torch executor and through its decomposition into prims,
every error input must raise what torch raises, and every torch-language symbol must
be reached by some OpInfo."""
from __future__ import annotations

import functools
import inspect
import re
import zlib

import pytest
import torch

import thunderfn as tf
import thunderfn.torch as ltorch
from thunderfn.core.interception import handlers
from thunderfn.testing.opinfos import op_db

DEVICE = torch.device("cpu")
# Samples reach these on purpose (var of one element, F.softmax without dim); torch warns too.
pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning",
                                        "ignore:Implicit dimension choice for:UserWarning")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Samples are random; a seed fixed per test id makes every failure reproduce on rerun."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


OP_DTYPES = [pytest.param(op, dtype, id=f"{op.name}-{_dtype_name(dtype)}") for op in op_db for dtype in op.dtypes]
OPS_WITH_ERRORS = [pytest.param(op, id=op.name) for op in op_db if op.error_inputs is not None]


def _jitted(op, **jit_options):
    # A fresh function per test: jit keys its cache on every non-tensor argument, so one
    # jitted function serves all of an op's samples, retracing where they differ.
    return tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs), **jit_options)


def _decomposed(op):
    """op run as its decomposition: every torch symbol lowered to prims, no torch fallback."""
    return _jitted(op, executors=["torch_prims"], fallback=False)


def _check_forward(op, dtype, jfn):
    atol, rtol = op.dtype_tolerances.get(dtype, (op.atol, op.rtol))
    for sample in op.sample_inputs(DEVICE, dtype):
        expected = op.ref(*sample.args, **sample.kwargs)
        actual = jfn(*sample.args, **sample.kwargs)
        # assert_close compares sequences by their items; torch's named tuples (torch.max's
        # values/indices) must come back as such, or `.values` breaks in user code
        assert type(actual) is type(expected), \
            f"{op.name} on {sample}: returned {type(actual)}, torch returns {type(expected)}"
        torch.testing.assert_close(actual, expected, equal_nan=True, atol=atol, rtol=rtol,
                                   msg=lambda m, s=sample: f"{op.name} on {s}:\n{m}")


@pytest.mark.parametrize("op, dtype", OP_DTYPES)
def test_forward_consistency_torch_executor(op, dtype):
    _check_forward(op, dtype, _jitted(op))


@pytest.mark.parametrize("op, dtype", OP_DTYPES)
def test_forward_consistency_decomposition(op, dtype):
    if op.skip_decomposition:
        pytest.skip(op.skip_decomposition)
    _check_forward(op, dtype, _decomposed(op))


def _raised(fn, sample) -> BaseException | None:
    try:
        fn(*sample.args, **sample.kwargs)
    except Exception as e:  # noqa: BLE001 (the exception is the result under test)
        return e
    return None


@pytest.mark.parametrize("op", OPS_WITH_ERRORS)
def test_error_inputs(op):
    runs = {"eager torch": op.op, "jit (torch executor)": _jitted(op)}
    if not op.skip_decomposition:
        runs["jit (decomposition)"] = _decomposed(op)
    for error in op.error_inputs(DEVICE):
        for how, fn in runs.items():
            if how == "eager torch" and not error.torch_raises:  # a refusal of thunderfn's own
                continue
            e = _raised(fn, error.sample)
            assert isinstance(e, error.exc_type), (
                f"{op.name} on {error.sample}, {how}: expected {error.exc_type.__name__}, got {e!r}")
            # eager torch only has to agree on the type; thunderfn's message is the one we promise
            if how != "eager torch":
                assert re.search(error.match, str(e)), (
                    f"{op.name} on {error.sample}, {how}: message {str(e)!r} does not match {error.match!r}")


@functools.cache
def _symbols_reached() -> tuple[dict, dict]:
    """(symbol -> names of the OpInfos reaching it, OpInfo name -> why its first sample would not trace).
    An OpInfo reaches the symbol its op is routed to, and every torch symbol that tracing
    its first sample records at the top level of the trace."""
    reached, untraceable = {}, {}
    torch_symbols = set(ltorch.symbols.values())
    for op in op_db:
        torch_fn = inspect.unwrap(op.op)  # method OpInfos wrap the unbound Tensor method
        targets = {handlers[torch_fn]} & torch_symbols if torch_fn in handlers else set()
        sample = next(iter(op.sample_inputs(DEVICE, op.dtypes[0])), None)
        if sample is not None:
            try:
                trc = tf.trace(lambda *args, **kwargs: op.op(*args, **kwargs), *sample.args, **sample.kwargs)
                targets |= {bsym.sym for bsym in trc.bound_symbols} & torch_symbols
            except Exception as e:  # noqa: BLE001 (reported by the coverage test)
                untraceable[op.name] = f"{type(e).__name__}: {e}"
        for sym in targets:
            reached.setdefault(sym, []).append(op.name)
    return reached, untraceable


@pytest.mark.parametrize("name", sorted(ltorch.symbols))
def test_every_torch_symbol_has_an_opinfo(name):
    reached, untraceable = _symbols_reached()
    assert ltorch.symbols[name] in reached, (
        f"no OpInfo reaches ltorch.{name}; add one to thunderfn/testing/opinfos/"
        + (f" (OpInfos whose first sample failed to trace: {untraceable})" if untraceable else ""))
