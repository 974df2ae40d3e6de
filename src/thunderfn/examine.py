"""tf.examine: which torch calls in a function thunderfn decomposes, runs opaquely, or refuses.

The function runs once, eagerly, on the real arguments, with every torch call it
makes seen by a TorchFunctionMode; so a call thunderfn would refuse does not stop
the report, and calls after it are examined too. Each distinct torch callable is
classified the way tracing would treat it:

- symbol: a thunderfn symbol with a hand-written decomposition (fusible, transformable);
- opaque: no symbol; runs as an opaque torch op (torch executes it, shapes from meta);
- in-place: functionalized (see torch/inplace.py);
- unsupported: refused, with the reason (an output that depends on values as lstsq's residuals do, no meta kernel);
- needs a value: reads a tensor's value (`.item()`, `bool(t)`), a ConcretizationError under jit;
- user gradient: a torch.autograd.Function, or a torch.library custom op with register_autograd,
  whose backward is its VJP rule (transforms/user_functions.py); the detail says how vmap and
  jvp treat it.
"""
from __future__ import annotations

import collections
import dataclasses

import torch
from torch.overrides import TorchFunctionMode

from thunderfn.core.interception import find_handler, is_metadata_query, lookup, torch_name
from thunderfn.core.symbol import Symbol
from thunderfn.core.trace import trace
from thunderfn.module import jit_module
from thunderfn.torch.inplace import is_in_place
from thunderfn.torch.opaque import _to_meta_tensor_tree, probe_opaque
from thunderfn.transforms.user_functions import function_spec, registered_gradient, watching_functions

_VALUE_READS = dict.fromkeys((torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.tolist, torch.Tensor.__int__,
                              torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy,
                              torch.Tensor.__complex__), True)


@dataclasses.dataclass
class Call:
    name: str  # how a user writes the torch callable
    status: str  # symbol | opaque | in-place | unsupported | needs a value
    detail: str  # the symbol, or the reason
    count: int = 0


@dataclasses.dataclass
class Examination:
    """What tf.examine found; str() is the report it prints."""
    fn_name: str
    calls: list
    trace_error: str | None = None  # what tracing fn raised, as jit would ("Type: message"), or None

    def by_status(self, status: str) -> list:
        return [c for c in self.calls if c.status == status]

    @property
    def jit_ready(self) -> bool:
        """Whether tf.jit traces fn: the verdict of tracing it, not of the table."""
        return self.trace_error is None

    def __repr__(self) -> str:  # a prompt or a notebook shows the table, as print does
        return str(self)

    def __str__(self) -> str:
        width = max([len(c.name) for c in self.calls] + [14])
        lines = [f"thunderfn.examine({self.fn_name}): {len(self.calls)} distinct torch calls"]
        order = ("symbol", "user gradient", "opaque", "in-place", "unsupported", "needs a value")
        for status in order:
            for c in sorted(self.by_status(status), key=lambda c: c.name):
                lines.append(f"  {c.name:<{width}}  x{c.count:<4} {c.status:<13} {c.detail}")
        counts = collections.Counter(c.status for c in self.calls)
        lines.append("  " + ", ".join(f"{counts[s]} {s}" for s in order if counts[s]))
        lines.append("  ready for tf.jit: it traces" if self.jit_ready else
                     f"  not ready for tf.jit: tracing raises {self.trace_error}")
        return "\n".join(lines)


def _classify(func, args, kwargs) -> tuple[str, str]:
    if registered_gradient(func) is not None:
        return "user gradient", ("custom op with register_autograd: its backward is the gradient; vmap by torch's "
                                 "vmap of the op and the backward; no jvp")
    if lookup(_VALUE_READS, func):
        return ("needs a value",
                "reads a tensor's value: keep it a tensor (torch.where), or pass it as a static argument")
    if is_in_place(func):
        return "in-place", "functionalized (written back if it mutates an input or captured tensor)"
    handler = find_handler(func)
    if isinstance(handler, Symbol):
        return "symbol", handler.print_name
    if handler is not None:
        return "symbol", f"via {getattr(handler, '__qualname__', 'an alias')}"
    meta_args, meta_kwargs = _to_meta_tensor_tree(args, kwargs)
    problem = probe_opaque(func, meta_args, meta_kwargs)
    return ("unsupported", problem) if problem else ("opaque", "runs as an opaque torch op")


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: dict = {}

    def function_applied(self, cls) -> None:
        """A torch.autograd.Function applied by the examined code (user_functions.watching_functions)."""
        name = f"{cls.__module__}.{cls.__qualname__}.apply"
        call = self.calls.get(name)
        if call is None:
            spec = function_spec(cls)
            vmap = ("its vmap staticmethod" if spec.vmap is not None else
                    "generate_vmap_rule" if spec.generate_vmap_rule else "refused (no vmap, no generate_vmap_rule)")
            call = self.calls[name] = Call(name, "user gradient",
                                           f"autograd.Function: its backward is the gradient; vmap: {vmap}; jvp: "
                                           f"{'its jvp staticmethod' if spec.jvp is not None else 'refused (no jvp)'}")
        call.count += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not is_metadata_query(func):
            name = torch_name(func)
            call = self.calls.get(name)
            if call is None:
                status, detail = _classify(func, args, kwargs)
                call = self.calls[name] = Call(name, status, detail)
            call.count += 1
        return func(*args, **kwargs)


def examine(fn, /, *args, **kwargs) -> Examination:
    """Run fn once eagerly and report how thunderfn would treat each torch call it makes.

    Returns the report (an Examination: `.calls`, `.by_status(s)`, `.jit_ready`), which prints
    as the table: `print(tf.examine(fn, x))`, or the bare call at a prompt or in a notebook.
    Nothing is printed otherwise, so the report never appears twice. Arguments are used as
    given: clone tensors that fn modifies.

        >>> import torch, thunderfn as tf
        >>> fit = lambda a, b: torch.linalg.lstsq(torch.sin(a), b, driver="gelsd")
        >>> report = tf.examine(fit, torch.randn(4, 2), torch.randn(4, 1))
        >>> report.jit_ready  # residuals only where sin(a) has full rank: a value tracing does not know
        False
        >>> [call.name for call in report.by_status("unsupported")]
        ['torch.linalg.lstsq']
    """
    recorder = _Recorder()
    with torch.no_grad(), recorder, watching_functions(recorder.function_applied):
        fn(*args, **kwargs)
    report = Examination(getattr(fn, "__name__", type(fn).__name__), list(recorder.calls.values()),
                         _trace_error(fn, args, kwargs))
    return report


def _trace_error(fn, args, kwargs) -> str | None:
    """Trace fn as jit would (a module, as tf.jit(module) does), without running it: what
    tracing raises, in one line, or None. The table says why a call is a problem; this says
    whether it is one (a refused call on a path tracing does not take is not)."""
    target = jit_module(fn, _traced_by) if isinstance(fn, torch.nn.Module) else _traced_by(fn)
    try:
        target(*args, **kwargs)
    except Exception as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {message}"
    return None


def _traced_by(fn, *options):
    """In place of jit (for a ThunderModule's forward too, given its options): a function that only traces fn."""
    return lambda *args, **kwargs: trace(fn, *args, **kwargs)
