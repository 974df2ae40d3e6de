"""Statements: bound symbols that are Python statements rather than operations.

They print themselves, pass through executor lowering untouched, and are kept
by dead-code elimination when they have an effect.

May import: core/context.py, core/printing.py, core/pytree.py, core/symbol.py.
"""
from __future__ import annotations

import builtins
import sys

import torch

from thunderfn.core import context
from thunderfn.core.printing import format_value
from thunderfn.core.pytree import tree_unflatten
from thunderfn.core.symbol import Symbol
from thunderfn.errors import ArgumentRuntimeError, InternalError, invalid_argument


def _print_del(bsym, ns) -> str:
    return "del " + ", ".join(p.name for p in bsym.args)


def _print_alias(bsym, ns) -> str:
    return f"{bsym.output.name} = {format_value(bsym.args[0], ns)}"


def _print_set_grad_enabled(bsym, ns) -> str:
    ns["torch"] = torch
    return f"torch._C._set_grad_enabled({bool(bsym.args[0])})"


# `del a, b`: frees intermediates as soon as their last reader has run.
python_del = Symbol("del", "python.del", is_prim=True, printer=_print_del, tags=frozenset({"no_dce"}))
# `t1 = t0`: when a lowering returns one of its inputs as an output.
python_alias = Symbol("alias", "python.alias", is_prim=True, printer=_print_alias)
# `with torch.no_grad():` inside a traced function runs once, at trace time; recording the
# switch makes every call do what eager does (and tells transforms where gradients stop).
set_grad_enabled = Symbol("set_grad_enabled", "python.set_grad_enabled", is_prim=True,
                          printer=_print_set_grad_enabled, eager=torch._C._set_grad_enabled,
                          tags=frozenset({"no_dce"}))


def _print_set_default_dtype(bsym, ns) -> str:
    ns["torch"] = torch
    return f"torch.set_default_dtype({bsym.args[0]})"


def _set_default_dtype(dtype, previous=None) -> None:
    torch.set_default_dtype(dtype)


# `torch.set_default_dtype(torch.float64)` in a traced function changes what its factories make
# at trace time, and the torch executor's factories read it again when they run: recorded (with
# the dtype it replaced, so printing can undo a scoped change in a `finally`) and replayed.
set_default_dtype = Symbol("set_default_dtype", "python.set_default_dtype", is_prim=True,
                           printer=_print_set_default_dtype, eager=_set_default_dtype, tags=frozenset({"no_dce"}))


def _print_write_back(bsym, ns) -> str:
    statement = f"{format_value(bsym.args[0], ns)}.copy_({format_value(bsym.args[1], ns)})"
    grad_mode = bsym.args[2] if len(bsym.args) > 2 else None
    if grad_mode is None:  # written under the mode the function returns in
        return statement
    ns["torch"] = torch
    return f"with torch.{'enable_grad' if grad_mode else 'no_grad'}(): {statement}"


def inputs_do_not_alias(*tensors) -> None:
    """Run first by a compiled function that writes into its inputs: the trace computed
    each input's new value on its own, which is only right if no two share memory."""
    seen = {}
    for i, t in enumerate(tensors):
        if t.numel() == 0:
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            raise ArgumentRuntimeError(
                f"inputs {seen[ptr]} and {i} of a jitted function that modifies its inputs in place share memory; "
                f"thunderfn traced them as independent tensors. Pass separate tensors (clone one of them).")
        seen[ptr] = i


def _print_check_aliasing(bsym, ns) -> str:
    ns["inputs_do_not_alias"] = inputs_do_not_alias
    return f"inputs_do_not_alias({', '.join(p.name for p in bsym.args)})"


# `x.copy_(t5)`: an input or captured tensor the function modified in place, written back; the third
# argument is the grad mode the writes ran under when it is not the one the function returns in
# (`with torch.no_grad(): p.copy_(t5)` for an optimizer's update of a parameter).
write_back = Symbol("write_back", "python.write_back", is_prim=True, printer=_print_write_back,
                    tags=frozenset({"no_dce"}))


# When an op raises after some writes into inputs completed, eager leaves those inputs written: the
# compiled code keeps, per written input, the value its last completed write left (`_written0 = t3`,
# `_written0 = None` once the write-back ran), and a `finally` enclosing the body writes it back
# (core/passes.py's write_back_on_failure puts them in; core/printing.py prints `on_exit` in the finally).
def _print_written(bsym, ns) -> str:
    slot, value = bsym.args
    return f"_written{slot} = {format_value(value, ns)}"


def _print_no_writes(bsym, ns) -> str:
    return " = ".join(f"_written{slot}" for slot in range(bsym.args[0])) + " = None"


def copy_under_grad_mode(grad_mode: bool, target, value) -> None:
    with torch.set_grad_enabled(grad_mode):
        target.copy_(value)


def _print_write_back_on_failure(bsym, ns) -> str:
    slot, target, grad_mode = bsym.args
    statement = f"{format_value(target, ns)}.copy_(_written{slot})"
    if grad_mode is not None:  # (one line: `if ...: with ...:` is not Python)
        ns["copy_under_grad_mode"] = copy_under_grad_mode
        statement = f"copy_under_grad_mode({grad_mode}, {format_value(target, ns)}, _written{slot})"
    return f"if _written{slot} is not None: {statement}"


written = Symbol("written", "python.written", is_prim=True, printer=_print_written, tags=frozenset({"no_dce"}))
no_writes_yet = Symbol("no_writes_yet", "python.no_writes_yet", is_prim=True, printer=_print_no_writes,
                       tags=frozenset({"no_dce"}))
write_back_on_failure = Symbol("write_back_on_failure", "python.write_back_on_failure", is_prim=True,
                               printer=_print_write_back_on_failure, tags=frozenset({"no_dce", "on_exit"}))
check_inputs_do_not_alias = Symbol("inputs_do_not_alias", "python.inputs_do_not_alias", is_prim=True,
                                   printer=_print_check_aliasing, eager=inputs_do_not_alias, tags=frozenset({"no_dce"}))


_CHECK_ERRORS = {"RuntimeError": RuntimeError, "ValueError": ValueError, "IndexError": IndexError}


def check_value(condition, error: str, message: str) -> None:
    """Raise error(message) unless the 0-dim bool tensor `condition` holds: a check on
    values, which tracing cannot do, made when the compiled function runs."""
    if not bool(condition):
        raise invalid_argument(_CHECK_ERRORS[error])(message)


def _print_check_value(bsym, ns) -> str:
    ns["check_value"] = check_value
    return f"check_value({', '.join(format_value(a, ns) for a in bsym.args)})"


# `check_value(t3, 'RuntimeError', 'cov(): aweights cannot be negative')`: eager's value check, at run time.
runtime_check = Symbol("check_value", "python.check_value", is_prim=True, printer=_print_check_value,
                       eager=check_value, tags=frozenset({"no_dce"}))


def emit_runtime_check(condition, error: str, message: str) -> None:
    """Record a value check (condition: a 0-dim bool proxy) in the trace being built."""
    if error not in _CHECK_ERRORS:
        raise InternalError(f"runtime checks raise one of {sorted(_CHECK_ERRORS)}, not {error}")
    context.current_tracer().emit(runtime_check.bind(condition, error, message, output=None))


# -- tf.debug (thunderfn/debug.py): values at run time ---------------------------------------
def format_and_print(fmt: str, spec, *leaves) -> None:
    """tf.debug.print at run time: `fmt` formatted with the arguments rebuilt from their leaves."""
    args, kwargs = tree_unflatten(spec, list(leaves))
    builtins.print(fmt.format(*args, **kwargs), file=sys.stdout, flush=True)


def _print_statement(bsym, ns) -> str:
    ns["debug_print"] = format_and_print
    fmt, spec, *leaves = bsym.args
    structure = ns.bind_object(spec, "_debug_structure")
    return f"debug_print({fmt!r}, {structure}{''.join(', ' + format_value(x, ns) for x in leaves)})"


def break_into_debugger(*values) -> None:
    """tf.debug.breakpoint at run time: Python's breakpoint() (pdb unless PYTHONBREAKPOINT says
    otherwise), in a frame whose `values` are the tensors passed to it, as they are on this call."""
    builtins.breakpoint()


def _print_breakpoint(bsym, ns) -> str:
    ns["debug_breakpoint"] = break_into_debugger
    return f"debug_breakpoint({', '.join(format_value(x, ns) for x in bsym.args)})"


# Kept where they are (no_dce), run by no executor; reverse mode keeps them in the forward, and
# vmap gives them the batched values (transforms/rules/statements.py).
# `debug_print('loss {}', _debug_structure0, t5)`: the format, the arguments' pytree structure, the leaves.
debug_print = Symbol("debug_print", "python.debug_print", is_prim=True, printer=_print_statement,
                     eager=format_and_print, tags=frozenset({"no_dce"}))
# `debug_breakpoint(t5)`: stops on every call of the compiled function.
debug_breakpoint = Symbol("debug_breakpoint", "python.debug_breakpoint", is_prim=True, printer=_print_breakpoint,
                          eager=break_into_debugger, tags=frozenset({"no_dce"}))
