"""Effects on torch's random number generator, recorded instead of run at trace time.

`torch.manual_seed`, `torch.get_rng_state` and `torch.set_rng_state` are plain Python,
invisible to torch's function hooks, so tracing would run them once and the compiled
function would never reseed. While a trace is being built they are recorded: the
seed and set become statements of the generated code, get becomes an op whose output
is the state at run time. So `with freeze_rng_state(): torch.manual_seed(42); ...`
inside a jitted function behaves on every call exactly as in eager. Random ops
themselves are opaque torch ops (thunderfn/torch/opaque.py) drawing from the same
generator, which is why a seeded jitted function reproduces eager's draws.

The wrappers installed on torch's namespace do nothing but call the original unless
this thread is tracing.
"""
from __future__ import annotations

import functools

import torch

from thunderfn.core import context
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.symbol import Symbol
from thunderfn.errors import UnsupportedOpError

_original = {name: getattr(torch.random, name) for name in ("manual_seed", "seed", "get_rng_state", "set_rng_state")}


def _print_call(name):
    def printer(bsym, ns):
        from thunderfn.core.printing import format_value

        ns["torch"] = torch
        return f"torch.{name}({', '.join(format_value(a, ns) for a in bsym.args)})"

    return printer


manual_seed_statement = Symbol("manual_seed", "torch.manual_seed", is_prim=True, printer=_print_call("manual_seed"),
                               eager=_original["manual_seed"], tags=frozenset({"no_dce"}))
set_rng_state_statement = Symbol("set_rng_state", "torch.set_rng_state", is_prim=True,
                                 printer=_print_call("set_rng_state"), eager=_original["set_rng_state"],
                                 tags=frozenset({"no_dce"}))


def _get_rng_state_meta():
    state = _original["get_rng_state"]()
    return TensorProxy(shape=state.shape, dtype=state.dtype, device=state.device)


get_rng_state_op = Symbol("get_rng_state", ("opaque", "torch.get_rng_state"), meta=_get_rng_state_meta, is_prim=True,
                          print_name="torch.get_rng_state", namespace={"torch": torch}, eager=_original["get_rng_state"],
                          torch_fn=_original["get_rng_state"], tags=frozenset({"opaque", "no_dce"}))


def _tracing():
    trc = context.current_trace()
    return trc if trc is not None and not trc.symbol_depth else None


def _recording(name, record):
    original = _original[name]

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        trc = _tracing()
        if trc is None:
            return original(*args, **kwargs)
        return record(trc, *args, **kwargs)

    wrapper.__thunderfn_original__ = original
    return wrapper


def _record_manual_seed(trc, seed):
    if isinstance(seed, TensorProxy):
        raise UnsupportedOpError("torch.manual_seed(tensor) needs the tensor's value; pass a Python int")
    trc.emit(manual_seed_statement.bind(int(seed), output=None))
    return torch.default_generator


def _record_seed(trc):
    raise UnsupportedOpError("torch.seed() reseeds from a nondeterministic source and returns the seed, a value "
                             "tracing cannot know; call it outside the jitted function")


def _record_get_rng_state(trc):
    return get_rng_state_op()


def _record_set_rng_state(trc, new_state):
    from thunderfn.core.interception import lift_constants

    trc.emit(set_rng_state_statement.bind(lift_constants(new_state), output=None))


def install() -> None:
    """Route torch's CPU seeding functions through the recording wrappers (idempotent)."""
    for name, record in (("manual_seed", _record_manual_seed), ("seed", _record_seed),
                         ("get_rng_state", _record_get_rng_state), ("set_rng_state", _record_set_rng_state)):
        if hasattr(getattr(torch.random, name), "__thunderfn_original__"):
            continue
        wrapper = _recording(name, record)
        setattr(torch.random, name, wrapper)
        setattr(torch, name, wrapper)


install()
