"""Which nodes of a Dynamo graph thunderfn cannot take, and the graph split around them.

The check traces the whole graph once, as the backend would compile it (graph_runner.py),
but a node that raises is recorded with its reason and replaced by a stand-in of the shape,
dtype and device Dynamo recorded for it (`node.meta["example_value"]`), so the trace goes on
and one pass finds every unsupported node. `torch.fx.passes.split_module` then cuts the
graph into runs of consecutive nodes of one kind, as ThunderFX's splitter does; it repeats
torch's grad-mode and autocast switches in each piece inside such a region, so a piece runs
under the modes its nodes ran under.

The api layer, below dynamo/compiler.py. It never imports torch._dynamo.
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from thunderfn.core.trace import trace
from thunderfn.dynamo.graph_runner import GraphInterpreter, UnsupportedHigherOrderOp


@dataclasses.dataclass
class Unsupported:
    """A node thunderfn does not take, and why."""
    node: str  # the node's name in the graph
    target: str  # what it calls
    reason: str
    higher_order_op: str | None = None  # set for a higher-order operator without a rule
    because_of: str | None = None  # the unsupported node whose result this one uses (all its reason is that)


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return f"Tensor.{target}" if node.op == "call_method" else target
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket | torch._ops.HigherOrderOperator):
        return str(target)
    return f"{module}.{name}" if module and module not in ("builtins", "_operator") else name


class KnownOnlyAtRunTime(Exception):
    """A size or scalar Dynamo left symbolic without an example value (an unbacked SymInt: the
    length of nonzero's result, an .item()): nothing stands in for it before the graph runs."""


# what the check's trace holds for a node whose result it cannot stand in for
UNKNOWN = type("KnownOnlyAtRunTime", (), {"__repr__": lambda self: "<known only at run time>"})()


def concrete(x):
    """A SymInt's (SymFloat's, SymBool's) value for this call, any other value as it is."""
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        if x.node.hint is None:
            raise KnownOnlyAtRunTime(str(x))
        return x.node.hint
    return x


def example_tensor(fake: torch.Tensor) -> torch.Tensor:
    """A real tensor with a fake tensor's shape, strides, dtype, device and requires_grad (zeros)."""
    size = tuple(concrete(s) for s in fake.shape)
    stride = tuple(concrete(s) for s in fake.stride())
    t = torch.empty_strided(size, stride, dtype=fake.dtype, device=fake.device).zero_()
    return t.requires_grad_(fake.requires_grad) if fake.is_floating_point() or fake.is_complex() else t


def example_value(value):
    """What a node produced when Dynamo traced it, with real tensors (zeros) for fake ones."""
    if isinstance(value, torch.Tensor):
        return example_tensor(value)
    if isinstance(value, (tuple, list)):
        return type(value)(example_value(v) for v in value)
    return concrete(value)


def _stand_in(value):
    """Inside the check's trace: a traced tensor made from nothing, with a fake tensor's metadata."""
    if isinstance(value, torch.Tensor):
        return torch.empty(tuple(concrete(s) for s in value.shape), dtype=value.dtype, device=value.device)
    if isinstance(value, (tuple, list)):
        return type(value)(_stand_in(v) for v in value)
    return concrete(value)


def _uses_unknown(node: torch.fx.Node, env: dict) -> str | None:
    for arg in node.all_input_nodes:
        if env.get(arg) is UNKNOWN:
            return arg.name
    return None


def unsupported_nodes(gm: torch.fx.GraphModule, example_inputs) -> list[Unsupported]:
    """Every node thunderfn cannot trace, in graph order, found by one trace of the graph."""
    found: list[Unsupported] = []

    def stand_in(node, error, env):
        producer = _uses_unknown(node, env)
        if producer is not None:
            reason = f"it uses {producer}, which thunderfn does not compute (its value is known only at run time)"
        else:
            reason = f"{type(error).__name__}: {error}"
        hop = error.op_name if isinstance(error, UnsupportedHigherOrderOp) else None
        found.append(Unsupported(node.name, _target_name(node), reason, hop, producer))
        if "example_value" not in node.meta:
            return UNKNOWN
        try:
            return _stand_in(node.meta["example_value"])
        except KnownOnlyAtRunTime:
            return UNKNOWN

    def checked(*args):  # (its outputs may be stand-ins for nothing: the check returns none)
        GraphInterpreter(gm, stand_in=stand_in).run(*args, enable_io_processing=False)

    trace(checked, *example_inputs)
    return found


def _hoist_input_items(gm: torch.fx.GraphModule, unsupported: set[str]) -> None:
    """Move each `.item()` of a graph input that thunderfn does not take to the graph's start. Dynamo
    passes a Python float it made dynamic (one that changed between calls, or any under dynamic=True)
    as a 0-dim tensor and reads it back with .item() where it is used; split out where they stand,
    those reads cut the graph at every use, and one eager piece before the rest does the same work."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else None
    moved = False
    for node in list(gm.graph.nodes):
        # (only an input nothing else uses, as Dynamo's float inputs: an input written in place before
        # its .item() would be read too early)
        if (anchor is not None and node.name in unsupported and node.op == "call_method" and node.target == "item"
                and all(arg.op == "placeholder" and all(u.op == "call_method" and u.target == "item" for u in arg.users)
                        for arg in node.all_input_nodes)):
            anchor.append(node)  # (moves it: only graph inputs come before it, and .item() reads only them)
            anchor, moved = node, True
    if moved:
        gm.recompile()


def split_around(gm: torch.fx.GraphModule, unsupported: set[str]) -> tuple[torch.fx.GraphModule, list[bool]]:
    """gm cut into pieces (submodules submod_0, submod_1, ... called in order), each either all
    nodes thunderfn takes or all nodes it does not; the list says, per piece, whether thunderfn
    takes it."""
    _hoist_input_items(gm, unsupported)
    piece_of: dict[str, int] = {}
    takes: list[bool] = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        ours = node.name not in unsupported
        if node.op == "call_function" and node.target is operator.getitem and node.args[0].name in piece_of:
            ours = takes[piece_of[node.args[0].name]]  # unpacking a result stays with what produced it
        if not takes or takes[-1] != ours:
            takes.append(ours)
        piece_of[node.name] = len(takes) - 1
    split = split_module(gm, None, lambda node: piece_of[node.name], keep_original_order=True,
                         keep_original_node_name=True)
    return split, takes
