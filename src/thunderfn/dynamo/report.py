"""What the torch.compile backend did, on one page: `tf.dynamo.explain(compiled)`.

Per graph Dynamo handed over: where it came from and why Dynamo ended it there (the graph
break's reason, from Dynamo's own record on the graph), then its pieces in order: thunderfn's
(whose jitted function `tf.last_traces` and `tf.last_backward_traces` read), and those that run
eagerly or through Inductor, each with the nodes thunderfn did not take and why.

The api layer.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
import weakref

import torch.fx


def count_nodes(gm: torch.fx.GraphModule) -> int:
    """The nodes of gm that compute (not its inputs, output or attribute reads)."""
    return sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr"))


@dataclasses.dataclass
class Piece:
    """A run of a graph's nodes and what runs it: "thunderfn", "eager" or "inductor"."""
    runner: str
    graph: torch.fx.GraphModule
    fn: object = None  # thunderfn's: the jitted function (tf.last_traces(piece.fn))
    unsupported: list = dataclasses.field(default_factory=list)  # splitting.Unsupported, for a piece not thunderfn's
    error: str | None = None  # why a piece thunderfn should have taken runs elsewhere

    @property
    def n_nodes(self) -> int:
        return count_nodes(self.graph)

    def describe(self) -> list[str]:
        lines = [f"  {self.runner:9s} {self.n_nodes} node{'s' if self.n_nodes != 1 else ''}"]
        if self.runner == "thunderfn":
            lines[0] += "  (tf.last_traces(piece.fn) shows its traces)"
        causes = [u for u in self.unsupported if u.because_of is None]
        following = [u.node for u in self.unsupported if u.because_of is not None]
        for u in causes:
            lines.append(f"      {u.node} = {u.target}(...): {u.reason}")
        if following:
            lines.append(f"      and what uses their results: {', '.join(dict.fromkeys(following))}")
        if self.error:
            lines.append(f"      thunderfn could not compile it: {self.error}")
        return lines


@dataclasses.dataclass
class GraphRecord:
    graph: torch.fx.GraphModule
    graph_break: str | None  # why Dynamo ended the graph here (None: the function returned)
    where: str  # the user code where Dynamo ended it
    mode: str | None = None  # torch.compile's mode, which the thunderfn backend does not use
    pieces: list = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, mode=None) -> GraphRecord:
        reason = getattr(gm, "compile_subgraph_reason", None)
        stack = list(getattr(reason, "user_stack", None) or ())
        where = f"{stack[-1].filename}:{stack[-1].lineno} in {stack[-1].name}" if stack else "?"
        graph_break = reason.reason if reason is not None and getattr(reason, "graph_break", False) else None
        return cls(gm, graph_break, where, mode)

    @property
    def splits(self) -> list:
        """The nodes thunderfn did not take, with their reasons (a size node split_module repeats in
        several pieces, once)."""
        return list({u.node: u for p in self.pieces for u in p.unsupported}.values())

    def describe(self, position: int) -> list[str]:
        n = count_nodes(self.graph)
        head = f"graph {position}: {n} nodes, "
        head += f"ended by a graph break at {self.where}: {self.graph_break.strip().splitlines()[0]}" \
            if self.graph_break else \
            "ended where the function returns"
        return [head, *(line for p in self.pieces for line in p.describe())]


class Records:
    """A backend's graph records, kept apart by the torch.compile call that compiled them (its
    wrapper object, held weakly by id: torch's wrapper defines __eq__, so it does not hash). A
    compiled object's records go when it goes: the backend "thunderfn" lives as long as the process,
    and must not keep every graph it ever compiled alive."""

    def __init__(self):
        self._lock = threading.RLock()  # (a wrapper's weakref callback may run while add holds it)
        self._order = itertools.count()
        self._unattributed: list[tuple[int, GraphRecord]] = []  # compiled where no torch.compile wrapper called
        self._by_wrapper: dict[int, tuple[weakref.ref, list]] = {}

    def add(self, wrapper, record: GraphRecord) -> None:
        with self._lock:
            entry = (next(self._order), record)
            if wrapper is None:
                self._unattributed.append(entry)
                return
            held = self._by_wrapper.get(id(wrapper))
            if held is None or held[0]() is not wrapper:
                key = id(wrapper)
                held = self._by_wrapper[key] = (weakref.ref(wrapper, lambda _, key=key: self._forget(key)), [])
            held[1].append(entry)

    def _forget(self, key: int) -> None:
        with self._lock:
            self._by_wrapper.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._unattributed.clear()
            self._by_wrapper.clear()

    def of(self, wrapper) -> list[GraphRecord]:
        """The records of the torch.compile call with this wrapper; with None, all of them, in order."""
        with self._lock:
            if wrapper is None:
                entries = [*self._unattributed, *(e for _, held in self._by_wrapper.values() for e in held)]
            else:
                held = self._by_wrapper.get(id(wrapper))
                entries = held[1] if held is not None and held[0]() is wrapper else []
            return [record for _, record in sorted(entries, key=lambda e: e[0])]


@dataclasses.dataclass
class Explanation:
    """The report: `graphs` (GraphRecord: `.graph_break`, `.pieces`, `.splits`), `graph_breaks`
    (why Dynamo broke), `splits` (nodes thunderfn did not take), `thunderfn_functions` (the
    jitted functions, for tf.last_traces); str() is the page."""
    graphs: list

    @property
    def graph_breaks(self) -> list[str]:
        return [f"{g.where}: {g.graph_break.strip().splitlines()[0]}" for g in self.graphs if g.graph_break]

    @property
    def splits(self) -> list:
        return [u for g in self.graphs for u in g.splits]

    @property
    def thunderfn_functions(self) -> list:
        return [p.fn for g in self.graphs for p in g.pieces if p.runner == "thunderfn"]

    def __str__(self) -> str:
        if not self.graphs:
            return ("No graphs: Dynamo has not handed the thunderfn backend a graph for this object (it has not run "
                    "yet, or Dynamo reused graphs compiled for an equal torch.compile call, or ran "
                    "everything eagerly).")
        pieces = [p for g in self.graphs for p in g.pieces]
        ours = sum(p.n_nodes for p in pieces if p.runner == "thunderfn")
        total = sum(p.n_nodes for p in pieces)
        lines = [f"{len(self.graphs)} graph{'s' if len(self.graphs) != 1 else ''}, {len(self.graph_breaks)} graph "
                 f"break{'s' if len(self.graph_breaks) != 1 else ''}, {len(self.splits)} node"
                 f"{'s' if len(self.splits) != 1 else ''} thunderfn did not take; thunderfn runs {ours} of {total} "
                 f"nodes."]
        modes = {g.mode for g in self.graphs if g.mode not in (None, "default")}
        if modes:
            lines.append(f"torch.compile's mode {', '.join(sorted(modes))} is Inductor's setting: "
                         f"the thunderfn backend does not use it (pass fusion=True in options= for fusion).")
        for position, g in enumerate(self.graphs):
            lines += ["", *g.describe(position)]
        return "\n".join(lines)

    __repr__ = __str__
