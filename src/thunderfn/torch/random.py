"""Effects on torch's random number generators, recorded instead of run at trace time.

`torch.manual_seed`, `torch.get_rng_state`, `torch.set_rng_state` and their `torch.cuda`
counterparts are plain Python, invisible to torch's function hooks, so tracing would run
them once and the compiled function would never reseed. While a trace is being built
they are recorded: seeds and sets become statements of the generated code, a get becomes
an op whose output is the state at run time, and a set that restores a state read earlier
in the function is printed in a `finally` (core/printing.py), as fork_rng restores it. So
`with freeze_rng_state(): torch.manual_seed(42); ...` inside a jitted function behaves on
every call exactly as in eager. What cannot be replayed (torch.seed(), all devices at once)
is refused by name. Random ops themselves are opaque torch ops (thunderfn/torch/opaque.py)
drawing from the same generator, which is why a seeded jitted function reproduces eager's draws.

The wrappers installed on torch's namespace only call the original unless this thread is
tracing: other threads keep drawing and seeding as usual while a function compiles.
"""
from __future__ import annotations

import functools

import torch
import torch.cuda.random
from torch.jit._builtins import _find_builtin, _register_builtin

from thunderfn.core import context
from thunderfn.core.interception import lift_constants, unwrapped
from thunderfn.core.printing import format_value
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.symbol import Symbol
from thunderfn.errors import UnsupportedOpError

# (home module, name): the functions that read or reseed a default generator. torch.* and
# torch.cuda.* re-export them, and fork_rng / freeze_rng_state call them through those names.
_HOMES = {"": torch.random, "cuda.": torch.cuda.random}
_INTERCEPTED = {"": ("manual_seed", "seed", "get_rng_state", "set_rng_state"),
                "cuda.": ("manual_seed", "manual_seed_all", "seed", "seed_all", "get_rng_state", "get_rng_state_all",
                          "set_rng_state", "set_rng_state_all")}
_original = {f"{prefix}{name}": getattr(getattr(_HOMES[prefix], name), "__thunderfn_original__",
                                        getattr(_HOMES[prefix], name))
             for prefix, names in _INTERCEPTED.items() for name in names}


def _print_call(name):
    def printer(bsym, ns):
        ns["torch"] = torch
        return f"torch.{name}({', '.join(format_value(a, ns) for a in bsym.args)})"

    return printer


def _statement(name: str, *, restores: bool = False) -> Symbol:
    # `restores_state`: its first argument is a state read earlier; printing puts it in a
    # `finally` when the read is in the same block (core/printing.py)
    tags = {"no_dce", "restores_state"} if restores else {"no_dce"}
    return Symbol(name.rpartition(".")[2], f"torch.{name}", is_prim=True, printer=_print_call(name),
                  eager=_original[name], tags=frozenset(tags))


manual_seed_statement = _statement("manual_seed")
set_rng_state_statement = _statement("set_rng_state", restores=True)
cuda_manual_seed_statement = _statement("cuda.manual_seed")
cuda_manual_seed_all_statement = _statement("cuda.manual_seed_all")
cuda_set_rng_state_statement = _statement("cuda.set_rng_state", restores=True)


def _state_reader(name: str) -> Symbol:
    """An op whose output is the generator state when the compiled function runs; its
    shape is learned by reading the state once at trace time (a read has no effect)."""
    original = _original[name]

    def meta(*args):
        state = original(*args)
        return TensorProxy(shape=state.shape, dtype=state.dtype, device=state.device)

    return Symbol(name.rpartition(".")[2], ("opaque", f"torch.{name}"), meta=meta, is_prim=True,
                  print_name=f"torch.{name}", namespace={"torch": torch}, eager=original, torch_fn=original,
                  tags=frozenset({"opaque", "no_dce"}))


get_rng_state_op = _state_reader("get_rng_state")
cuda_get_rng_state_op = _state_reader("cuda.get_rng_state")


def _tracing():
    tracer = context.current_tracer()
    return tracer if tracer is not None and not tracer.symbol_depth else None


def _recording(name, record, reseeds: bool, current):
    """A function that records `name` while this thread traces and calls `current` (what the
    home held: torch's function, or a wrapper of it) otherwise."""

    @functools.wraps(current)
    def wrapper(*args, **kwargs):
        tracer = _tracing()
        if tracer is None:
            if reseeds:  # lets a trace in another thread tell this reseed from its own (core/trace.py)
                context.note_rng_reseed()
            return current(*args, **kwargs)
        return record(tracer, *args, **kwargs)

    wrapper.__thunderfn_original__ = _original[name]
    return wrapper


def _seed_value(name, seed) -> int:
    if isinstance(seed, TensorProxy):
        raise UnsupportedOpError(f"torch.{name}(tensor) needs the tensor's value; pass a Python int")
    return int(seed)


def _record_manual_seed(tracer, seed):
    tracer.emit(manual_seed_statement.bind(_seed_value("manual_seed", seed), output=None))
    return torch.default_generator


def _record_cuda_manual_seed(tracer, seed):
    tracer.emit(cuda_manual_seed_statement.bind(_seed_value("cuda.manual_seed", seed), output=None))


def _record_cuda_manual_seed_all(tracer, seed):
    tracer.emit(cuda_manual_seed_all_statement.bind(_seed_value("cuda.manual_seed_all", seed), output=None))


def _refuse(name, why):
    def record(tracer, /, *args, **kwargs):
        raise UnsupportedOpError(f"'{tracer.trace.fn_name}' calls torch.{name}(), which {why}, so the compiled "
                                 f"function could not do it again on later calls. Call it outside the jitted function.")

    return record


def _record_get_rng_state(tracer):
    return get_rng_state_op()


def _record_cuda_get_rng_state(tracer, device="cuda"):
    return cuda_get_rng_state_op(device)


def _lifted(state):
    return lift_constants(state)


def _record_set_rng_state(tracer, new_state):
    tracer.emit(set_rng_state_statement.bind(_lifted(new_state), output=None))


def _record_cuda_set_rng_state(tracer, new_state, device="cuda"):
    tracer.emit(cuda_set_rng_state_statement.bind(_lifted(new_state), device, output=None))


_NONDETERMINISTIC = "reseeds from a nondeterministic source and returns the seed, a value tracing cannot know"
_ALL_DEVICES = "reads or writes every device's generator state at once"
_RECORDERS = {  # name -> (record, reseeds)
    "manual_seed": (_record_manual_seed, True),
    "seed": (_refuse("seed", _NONDETERMINISTIC), True),
    "get_rng_state": (_record_get_rng_state, False),
    "set_rng_state": (_record_set_rng_state, True),
    "cuda.manual_seed": (_record_cuda_manual_seed, True),
    "cuda.manual_seed_all": (_record_cuda_manual_seed_all, True),
    "cuda.seed": (_refuse("cuda.seed", _NONDETERMINISTIC), True),
    "cuda.seed_all": (_refuse("cuda.seed_all", _NONDETERMINISTIC), True),
    "cuda.get_rng_state": (_record_cuda_get_rng_state, False),
    "cuda.get_rng_state_all": (_refuse("cuda.get_rng_state_all", _ALL_DEVICES), False),
    "cuda.set_rng_state": (_record_cuda_set_rng_state, True),
    "cuda.set_rng_state_all": (_refuse("cuda.set_rng_state_all", _ALL_DEVICES), True),
}


def install() -> None:
    """Route torch's seeding functions through the recording wrappers (idempotent), under
    every name they are exported as: torch.random.x and torch.x, torch.cuda.random.x and torch.cuda.x.

    A name may hold a wrapper of torch's function rather than the function itself: importing
    torch._dynamo before thunderfn replaces torch.manual_seed by a wrapper that turns Dynamo off,
    which calls the original directly. The recording wrapper goes in front of whatever the name
    holds, so seeding is recorded in either import order and the wrapper's own effect is kept."""
    for prefix, names in _INTERCEPTED.items():
        homes = (_HOMES[prefix], torch if prefix == "" else torch.cuda)
        for name in names:
            original, made = _original[prefix + name], {}
            for home in homes:
                current = getattr(home, name, None)
                chain = unwrapped(current) if current is not None else []
                if (any(getattr(f, "__thunderfn_original__", None) is original for f in chain)
                        or not any(f is original for f in chain)):
                    continue  # already recorded through this name, or the name holds something else
                if id(current) not in made:
                    made[id(current)] = _recording(prefix + name, *_RECORDERS[prefix + name], current)
                    if current is not original and _find_builtin(current) is not None:
                        # torch._dynamo registers its wrapper for TorchScript: so must the one in front of it
                        _register_builtin(made[id(current)], _find_builtin(current))
                setattr(home, name, made[id(current)])


install()
