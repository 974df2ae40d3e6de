"""torch.optim optimizers stepped inside a traced function (`tf.jit(optimizer.step)`, or a
jitted function that calls `optimizer.step()`).

An optimizer step is ordinary torch code under `torch.no_grad()` (its in-place updates of
parameters and state tensors are written back under no_grad, core/trace.py), plus Python
state that tracing would otherwise bake in once:

- **Step counters** are 0-dim tensors in the state; eager reads them with `.item()`. Inside
  a trace `torch.compiler.is_compiling()` answers True (torch/library_queries.py), so torch.optim
  keeps them as tensors, as it does under torch.compile, and the compiled step reads the
  counters' current values.
- **Lazy state** (the first step creates `exp_avg`, `momentum_buffer`, ...) and any other
  change a step makes to the optimizer's Python state (new keys, new objects, Python
  numbers) would happen once, at trace time. Such a trace is discarded, the state is put
  back as it was, and that call runs eagerly (`StepChangesOptimizerState`); the next call
  traces the steady state.
- **Hyperparameters** (`param_groups`' lr, betas, weight_decay, ...) are Python values
  baked into the trace, and `.grad`s decide which parameters are stepped: both are
  guarded, so changing lr between steps (a scheduler) traces again, never reusing a stale
  lr. The state's tensors are guarded by identity (load_state_dict replaces them).
- `capturable=True` and `fused=True` are refused by name.
"""
from __future__ import annotations

import functools
import math
import sys
import threading

import torch
import torch.optim.optimizer as optimizer_module
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from thunderfn.core import context
from thunderfn.errors import UnsupportedOpError

__all__: list = []


class StepChangesOptimizerState(UnsupportedOpError):
    """Tracing an optimizer step changed the optimizer's Python state (its first step creates
    the state). jit runs such a call eagerly and traces the next one; other transforms refuse."""


class _Local(threading.local):
    def __init__(self):
        self.stepping = 0  # optimizer steps in progress inside the trace being built on this thread


_local = _Local()


def _tracing_root():
    tracer = context.current_tracer()
    if tracer is None or tracer.symbol_depth:
        return None
    return context.tracer_stack()[0]


# -- snapshots of an optimizer's Python state -------------------------------------------------
def _same(a, b) -> bool:
    """Would the trace made with b be right for a? Tensors by identity (the trace reads them by
    reference), floats by bits (nan equals nan, 0.0 differs from -0.0), containers item by item."""
    if a is b:
        return True
    if type(a) is not type(b) or isinstance(a, torch.Tensor):
        return False
    if type(a) is float:
        return a.hex() == b.hex() if not (math.isnan(a) and math.isnan(b)) else True
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # objects whose == is not a bool
        return False


class _Snapshot:
    """An optimizer's param_groups and state (containers and values, not tensor contents)."""

    def __init__(self, opt: torch.optim.Optimizer):
        self.opt = opt
        self.groups_list, self.state_dict = opt.param_groups, opt.state
        self.groups = [(g, dict(g), list(g["params"])) for g in opt.param_groups]
        self.state = [(p, s, dict(s)) for p, s in opt.state.items()]

    def why_changed(self) -> str | None:
        opt = self.opt
        if opt.param_groups is not self.groups_list or opt.state is not self.state_dict:
            return "its param_groups or state were replaced (load_state_dict?)"
        if len(opt.param_groups) != len(self.groups):
            return "a param group was added"
        for i, (g, saved, params) in enumerate(self.groups):
            if opt.param_groups[i] is not g or g.keys() != saved.keys():
                return f"param group {i} was replaced or gained keys"
            if len(g["params"]) != len(params) or any(p is not q for p, q in zip(g["params"], params)):
                return f"the parameters of param group {i} changed"
            for k, v in saved.items():
                if k != "params" and not _same(g[k], v):
                    return f"param_groups[{i}][{k!r}] is {g[k]!r}, was {v!r} when traced"
        if len(opt.state) != len(self.state):
            return "the optimizer state gained or lost entries (its first step creates them)"
        for p, s, saved in self.state:
            if opt.state.get(p) is not s or not _same(s, saved):
                return "the optimizer state of a parameter changed (new entries, or replaced values)"
        return None

    def restore(self) -> None:
        opt = self.opt
        opt.param_groups, opt.state = self.groups_list, self.state_dict
        for g, saved, _ in self.groups:
            g.clear()
            g.update(saved)
        opt.param_groups[:] = [g for g, _, _ in self.groups]
        kept = {id(p) for p, _, _ in self.state}
        for p in [p for p in opt.state if id(p) not in kept]:
            del opt.state[p]
        for p, s, saved in self.state:
            s.clear()
            s.update(saved)
            opt.state[p] = s


def _refuse_unsupported(opt: torch.optim.Optimizer) -> None:
    for group in opt.param_groups:
        for flag in ("capturable", "fused"):
            if group.get(flag):
                raise UnsupportedOpError(
                    f"{type(opt).__name__}.step with {flag}=True inside a traced function: its kernels keep the step "
                    f"counters on the device and fuse the whole update, which thunderfn does not trace. Use the "
                    f"default (foreach or for-loop) implementation, {flag}=False.")


def _finish(snapshots: list, tracer, failed: bool) -> None:
    """When the trace is done: undo what tracing did to the optimizers' Python state, and either
    refuse the trace (a step changed that state) or guard it (the state must stay as traced)."""
    _local.stepping = 0
    if failed:
        for snap in snapshots:
            snap.restore()
        return
    for snap in snapshots:
        why = snap.why_changed()
        if why is not None:
            for s in snapshots:
                s.restore()
            raise StepChangesOptimizerState(
                f"tracing '{tracer.trace.fn_name}' stepped a {type(snap.opt).__name__} whose step changed its Python "
                f"state ({why}); a compiled function would make that change only once. tf.jit runs such a call eagerly "
                f"(the first step creates the optimizer's state) and traces the next one; other transforms cannot.")
    for snap in snapshots:
        tracer.trace.guards.append(functools.partial(_Snapshot.why_changed, snap))


def _before_step(opt, args, kwargs) -> None:
    root = _tracing_root()
    if root is None:
        return
    _refuse_unsupported(opt)
    if args[1:2] != (None,) and args[1:] or kwargs.get("closure") is not None:
        raise UnsupportedOpError(
            f"{type(opt).__name__}.step(closure) inside a traced function: the closure runs the model and "
            f"loss.backward(), which thunderfn does not trace. Call backward outside, then the jitted step without "
            f"a closure.")
    snapshots = root.finish_data.get(__name__)
    if snapshots is None:
        snapshots = root.finish_data[__name__] = []
        root.finishers.append(functools.partial(_finish, snapshots))
    if not any(s.opt is opt for s in snapshots):  # the state the trace starts from
        snapshots.append(_Snapshot(opt))
    _local.stepping += 1


def _after_step(opt, args, kwargs) -> None:
    if _tracing_root() is not None and _local.stepping:
        _local.stepping -= 1


def _read_step_as_python_number(original):
    """torch.optim's `_get_value(step)`: eager calls `.item()` and does the bias-correction arithmetic
    on Python floats (float64). While tracing the counter stays a tensor; reading it as a float64
    0-dim tensor keeps that arithmetic in float64, and a float64 0-dim value meets the float32
    parameters the way a Python float does (converted to their dtype), so the update is eager's."""

    @functools.wraps(original)
    def _get_value(x):
        if _local.stepping and isinstance(x, torch.Tensor) and _tracing_root() is not None:
            return x.to(torch.float64)
        return original(x)

    _get_value.__thunderfn_original__ = original
    return _get_value


_installed = False


def install() -> None:
    """Hook optimizer steps (idempotent; the hooks do nothing unless this thread is tracing)."""
    global _installed
    if not _installed:
        _installed = True
        register_optimizer_step_pre_hook(_before_step)
        register_optimizer_step_post_hook(_after_step)
        # each optimizer module imported _get_value by name
        original = optimizer_module._get_value
        wrapper = _read_step_as_python_number(original)
        for name, module in list(sys.modules.items()):
            if name.startswith("torch.optim.") and getattr(module, "_get_value", None) is original:
                module._get_value = wrapper


install()
