"""Rematerialization: recompute cheap forward values in the backward instead of saving them.

The forward/backward split (autograd_split.py) saves every forward value the backward
reads: `gelu(x @ w + b) * sigmoid(x @ w)` saves the matmul's sum with b, the gelu and
the sigmoid, three activations. Saving only `x @ w` (and b) and computing the rest
again in the backward keeps one activation alive between the passes instead of three;
with a fusing compiler the recomputed elementwise ops join the backward's fused
regions, so they cost almost nothing. This is functorch's min-cut partitioner
(torch/_functorch/partitioners.py, min_cut_rematerialization_partition) and Lightning
Thunder's rematerialization (thunder/core/rematerialization.py), on our traces.

Which values to save is a minimum cut in a flow graph of the forward's tensors, each
value v split into two nodes v_in -> v_out:

- v_in -> v_out has capacity = v's size in bytes: cutting it means saving v. A forward
  output costs nothing (it is alive anyway; ThunderFunction saves it as that output);
- u_out -> v_in, infinite, for every argument u of the op that computes v: v can only
  be recomputed where its arguments are available (saved or recomputed themselves);
- source -> v_in, infinite, where v cannot be recomputed: a forward input, or the
  output of an op the caller's `recomputable` predicate refuses (matmuls, random draws,
  opaque ops, statements, reductions that shrink their input, ...). Such a value is
  saved or not needed;
- v_out -> sink, infinite, for every value the backward reads.

An op the predicate refuses whole may still have cheap parts: its decomposition's values
join the graph, computed by its subsymbols, so that `layer_norm`'s normalized output can be
recomputed elementwise from its input and its saved statistics (functorch gets the same by
working on aten ops). Those intermediates never exist at run time (the forward runs the op as
one call), so they cannot be saved: their v_in -> v_out edge is infinite.

Every source-to-sink path crosses some v_in -> v_out edge, so a finite cut exists (the
split's own residuals are one), and a minimum cut is a set of values to save of least
total bytes from which everything the backward reads can be recomputed. Of the minimum
cuts we take the one nearest the sink (the nodes that can still reach the sink after
max flow form its sink side), which recomputes the least; and we keep the split as it
was unless the cut saves strictly fewer bytes, so a tie never adds work.

The max flow is Dinic's algorithm on integer capacities, with no graph library: a node pair
per forward value, a few thousand for a 12-block GPT.

Not done (functorch does): its bias towards saving values near the backward
(1.1 ** distance), banning recomputation of values the backward must materialize
anyway (a matmul's operand), and a memory budget knob. Random ops are saved, never
recomputed (Thunder makes them counter-based so that they can be).
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable, Iterable

from thunderfn.core import symbolic
from thunderfn.core.passes import dce, makes_new_memory
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.rules import TAG_CHEAP
from thunderfn.core.statements import write_back
from thunderfn.core.trace import stamp_provenance
from thunderfn.errors import InternalError

# Primitives that are cheap to compute again: the elementwise ones, the shape/view ones, and those
# tagged so where they are made (a dtype conversion, and factories, which read nothing)
_CHEAP_TAGS = frozenset({"elementwise", "shape", TAG_CHEAP})

# A reduction whose output is at least this fraction of its input is recomputed; one that shrinks
# more is banned, since its output is cheap to save and costly to recompute (functorch's 4x rule:
# it keeps normalizations' statistics saved).
_REDUCTION_SHRINK_LIMIT = 4


def nbytes(p: TensorProxy) -> int:
    """Its size in bytes, for the cost model only: a symbolic size counts as the size this compile has."""
    return symbolic.hint(p.numel()) * p.dtype.itemsize


def cheap_to_recompute(bsym) -> bool:
    """The default `recomputable` predicate: whether every primitive bsym decomposes into is
    elementwise, a shape or view op (broadcast, reshape, transpose, slice, cat, ...), a dtype
    conversion, a factory, or a reduction that does not shrink its input more than 4x; and
    nothing in it is random, opaque, a statement or kept for its effects. Matmuls, gathers,
    scatters, sorts, scans and device transfers are not: they cost more than the bytes they
    would save, or are not worth reasoning about."""
    sym = bsym.sym
    if sym.printer is not None or sym.tags & {"no_dce", "random", "opaque"}:
        return False
    if bsym.subsymbols:
        return all(cheap_to_recompute(s) for s in bsym.subsymbols)
    if not sym.is_prim or sym.executor is not None:  # an executor's own operator: a kernel, not ours to judge
        return False
    if sym.tags & _CHEAP_TAGS:
        return True
    if "reduction" in sym.tags:
        read = sum(nbytes(p) for p in bsym.proxy_args())
        return sum(nbytes(p) for p in bsym.proxy_outs()) * _REDUCTION_SHRINK_LIMIT >= read
    return False


# -- max flow / min cut ---------------------------------------------------------------------------

class FlowGraph:
    """A directed graph with integer capacities, for one max-flow / min-cut computation. Each
    edge is stored with its reverse (capacity 0) so that residual capacities live in one list."""

    def __init__(self, n_nodes: int):
        self.adjacent = [[] for _ in range(n_nodes)]  # node -> edge indices leaving it
        self.head: list[int] = []  # edge -> the node it enters
        self.capacity: list[int] = []  # edge -> residual capacity

    def add_edge(self, u: int, v: int, capacity: int) -> None:
        for a, b, c in ((u, v, capacity), (v, u, 0)):  # edge e's reverse is e ^ 1
            self.adjacent[a].append(len(self.head))
            self.head.append(b)
            self.capacity.append(c)

    def max_flow(self, source: int, sink: int) -> int:
        """Dinic's algorithm: in phases, a breadth-first search levels the nodes by distance from the
        source through edges with capacity left, then paths that climb one level per edge are
        saturated until none is left. Few phases (paths here are short), each linear in the edges."""
        total = 0
        while True:
            level = self._levels(source)
            if level[sink] < 0:
                return total
            next_edge = [0] * len(self.adjacent)  # per node, the first of its edges that may still carry flow
            while True:
                pushed = self._push_one_path(source, sink, level, next_edge)
                if not pushed:
                    break
                total += pushed

    def _levels(self, source: int) -> list:
        level = [-1] * len(self.adjacent)
        level[source] = 0
        queue = collections.deque([source])
        while queue:
            u = queue.popleft()
            for e in self.adjacent[u]:
                v = self.head[e]
                if level[v] < 0 and self.capacity[e] > 0:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level

    def _push_one_path(self, source: int, sink: int, level: list, next_edge: list) -> int:
        """Saturate one source-to-sink path of the level graph (depth-first, without recursion: paths
        may be thousands of nodes long); 0 when there is none. Edges found useless are skipped for
        the rest of the phase (next_edge), which keeps a phase linear."""
        path, u = [], source
        while u != sink:
            edges = self.adjacent[u]
            while next_edge[u] < len(edges):
                e = edges[next_edge[u]]
                if self.capacity[e] > 0 and level[self.head[e]] == level[u] + 1:
                    break
                next_edge[u] += 1
            else:  # a dead end: back up one edge and try the next one there
                if u == source:
                    return 0
                level[u] = -1
                u = self.head[path.pop() ^ 1]
                next_edge[u] += 1
                continue
            e = edges[next_edge[u]]
            path.append(e)
            u = self.head[e]
        pushed = min(self.capacity[e] for e in path)
        for e in path:
            self.capacity[e] -= pushed
            self.capacity[e ^ 1] += pushed
        return pushed

    def reaching(self, sink: int) -> set:
        """After max_flow: the nodes that can still reach `sink` through edges with capacity
        left, the sink side of the minimum cut nearest the sink."""
        found, queue = {sink}, collections.deque([sink])
        while queue:
            v = queue.popleft()
            for e in self.adjacent[v]:  # e leaves v, so e ^ 1 enters v from head[e]
                u = self.head[e]
                if u not in found and self.capacity[e ^ 1] > 0:
                    found.add(u)
                    queue.append(u)
        return found


@dataclasses.dataclass
class Cut:
    saved: list  # names of the values to save, in the order given
    recomputed: set  # names of the values the backward computes again
    saved_bytes: int


def min_cut_saved(values: Iterable[str], cost: dict, arguments: dict, fixed: set, needed: set,
                  unsaveable: set = frozenset()) -> Cut:
    """The values to save so that every value in `needed` is saved or recomputable from saved
    values, with the least total cost (see the module docstring for the graph).

    values: every value's name, in an order in which each comes after its arguments;
    cost: name -> bytes to save it; arguments: name -> names of the values its op reads (absent
    for inputs); fixed: values that cannot be recomputed (inputs, outputs of ops not to repeat);
    needed: the values the backward reads; unsaveable: values that cannot be saved (the
    intermediates of an op the forward runs whole), whose cost is then ignored."""
    values = list(values)
    index = {v: i for i, v in enumerate(values)}
    source, sink = 0, 1
    infinite = sum(cost[v] for v in values if v not in unsaveable) + 1  # more than any cut of finite edges

    def node_in(v):
        return 2 + 2 * index[v]

    graph = FlowGraph(2 + 2 * len(values))
    for v in values:
        graph.add_edge(node_in(v), node_in(v) + 1, infinite if v in unsaveable else cost[v])
        if v in fixed or v not in arguments:
            graph.add_edge(source, node_in(v), infinite)
        for a in arguments.get(v, ()):
            graph.add_edge(node_in(a) + 1, node_in(v), infinite)
        if v in needed:
            graph.add_edge(node_in(v) + 1, sink, infinite)
    flow = graph.max_flow(source, sink)
    if flow >= infinite:  # cannot happen for a well-formed problem (saving all of `needed` is finite)
        raise InternalError("no finite cut: a needed value depends on something that can be neither "
                            "saved nor recomputed")
    sink_side = graph.reaching(sink)
    saved = [v for v in values if node_in(v) not in sink_side and node_in(v) + 1 in sink_side]
    # the values to recompute: what `needed` reads, back to the saved values
    saved_set, recomputed, stack = set(saved), set(), [v for v in needed if v not in saved]
    while stack:
        v = stack.pop()
        if v in recomputed:
            continue
        if v in fixed or v not in arguments:
            raise InternalError(f"min cut left {v} neither saved nor recomputable")  # a bug here, never a wrong answer
        recomputed.add(v)
        stack.extend(a for a in arguments[v] if a not in saved_set)
    return Cut(saved, recomputed, sum(cost[v] for v in saved))


# -- the pass on a forward/backward split ---------------------------------------------------------

def _has_effects(bsym) -> bool:
    """Whether running bsym again could compute something else or do something twice: a random
    draw, a statement, anything kept for its effect, anywhere in its decomposition. Never
    recomputed, whatever the caller's predicate says."""
    return (bsym.sym.printer is not None or bool(bsym.sym.tags & {"no_dce", "random"})
            or any(_has_effects(s) for s in bsym.subsymbols))


def _written_in_forward(forward) -> set:
    """Names of the tensors whose memory the forward may write into (a write-back into an input, an
    opaque op's arguments) and of everything that may be a view of them. Recomputing from one of
    these in the backward would read the value after the write, not the one the forward read."""
    written = set()
    for bsym in forward.bound_symbols:
        if bsym.sym is write_back:
            written.add(bsym.args[0].name)
        elif "opaque" in bsym.sym.tags and "random" not in bsym.sym.tags:
            written.update(p.name for p in bsym.proxy_args())
    changed = True
    while changed:  # views of written tensors, in either direction, see the writes too
        changed = False
        for bsym in forward.bound_symbols:
            if not makes_new_memory(bsym):
                names = {p.name for p in bsym.proxies()}
                if names & written and not names <= written:
                    written |= names
                    changed = True
    return written


class _ForwardValues:
    """The min-cut problem read off a forward trace: every value it defines, top-level or inside a
    decomposition, with the values its op reads (`arguments`), those that cannot be recomputed
    (`fixed`), and the bound symbols that define them, in order (`producers`)."""

    def __init__(self, forward, recomputable: Callable):
        self.recomputable = recomputable
        self.written = _written_in_forward(forward)
        self.proxies = {p.name: p for p in forward.args}
        self.arguments, self.fixed = {}, set()
        self.producers = []
        for bsym in forward.bound_symbols:
            self.add(bsym)

    def add(self, bsym) -> None:
        reads = [p.name for p in bsym.proxy_args() if p.constant is None]  # captured constants are always there
        repeatable = not _has_effects(bsym) and self.recomputable(bsym) and not any(n in self.written for n in reads)
        if not repeatable and bsym.subsymbols:
            self._add_decomposition(bsym, reads)
            return
        new = False
        for o in bsym.proxy_outs():
            if o.name in self.proxies:  # defined twice (an input passed through): not ours to move
                self.fixed.add(o.name)
                continue
            self.proxies[o.name], self.arguments[o.name], new = o, reads, True
            if not repeatable:
                self.fixed.add(o.name)
        if new:
            self.producers.append(bsym)

    def _add_decomposition(self, bsym, reads: list) -> None:
        """An op not to repeat whole (layer_norm: its statistics are reductions) may still have cheap
        parts: its decomposition joins the graph, so that its normalized output can be recomputed
        from its saved statistics. The decomposition's intermediates cannot be saved (the op runs
        as one call, they never exist); its outputs can, as any value."""
        defined_before = {o.name for o in bsym.proxy_outs() if o.name in self.proxies}
        for sub in bsym.subsymbols:
            self.add(sub)
        for o in bsym.proxy_outs():
            if o.name in defined_before:  # an input passed through: not ours to move
                self.fixed.add(o.name)
            elif o.name not in self.proxies:  # computed otherwise than by its decomposition's ops
                self.proxies[o.name], self.arguments[o.name] = o, reads
                self.fixed.add(o.name)


def _recomputations(producers: list, cut: Cut, backward) -> list:
    """The forward's bound symbols that compute the values the cut recomputes, in forward order.
    An op with several outputs, one saved and another recomputed: the copy's saved output gets a
    name of its own, so that each name is defined once in the backward."""
    saved = set(cut.saved)
    recompute = []
    for bsym in producers:
        outs = bsym.proxy_outs()
        if any(o.name in cut.recomputed for o in outs):
            renamed = {o.name: TensorProxy.like(o, name=backward.names.take(prefix="t"))
                       for o in outs if o.name in saved}
            recompute.append(bsym.swap(renamed))
    return recompute


def _placed_before_first_reads(backward, recompute: list) -> list:
    """The backward's bound symbols with each recomputation placed before the first op that reads
    its outputs (directly, or through a later recomputation): recomputed values then live no
    longer than needed."""
    end = len(backward.bound_symbols)
    first_read = {}
    for i, bsym in enumerate(backward.bound_symbols):
        for p in bsym.proxy_args():
            first_read.setdefault(p.name, i)
    for g in backward.output:
        if isinstance(g, TensorProxy):
            first_read.setdefault(g.name, end)
    position = {}
    for bsym in reversed(recompute):
        at = min(first_read.get(o.name, end) for o in bsym.proxy_outs())
        position[id(bsym)] = at
        for p in bsym.proxy_args():
            first_read[p.name] = min(first_read.get(p.name, at), at)
    before_op = collections.defaultdict(list)
    for bsym in recompute:
        before_op[position[id(bsym)]].append(bsym)
    body = []
    for i, bsym in enumerate(backward.bound_symbols):
        body += before_op.pop(i, [])
        body.append(bsym)
    body += before_op.pop(end, [])
    return body


def rematerialize(forward, backward, recomputable: Callable = cheap_to_recompute):
    """(forward, backward) of a split (autograd_split.Split's traces) with the residuals chosen by
    a minimum cut over saved bytes: the backward recomputes, from the new residuals, the values
    the cut does not save, with the forward's own bound symbols, each group placed just before
    the first backward op that reads it. `recomputable(bsym)` says which forward ops may run
    again (default: cheap_to_recompute); random draws and statements never do, nor ops reading
    a tensor the forward writes into. Returns the traces unchanged when no cut saves fewer
    bytes than the split's residuals."""
    start = time.perf_counter_ns()
    outputs, residuals = forward.output
    cotangents = backward.args[len(residuals):]
    output_names = {p.name for p in outputs}
    values = _ForwardValues(forward, recomputable)
    proxies = values.proxies
    needed = {p.name for p in residuals}
    if not needed <= proxies.keys():  # a residual the forward does not define (none known): leave the split alone
        return forward, backward
    runtime_values = {p.name for p in forward.args} | {o.name for b in forward.bound_symbols for o in b.proxy_outs()}
    unsaveable = proxies.keys() - runtime_values
    cost = {name: 0 if name in output_names else nbytes(p) for name, p in proxies.items()}
    before = sum(cost[p.name] for p in residuals)
    cut = min_cut_saved(proxies, cost, values.arguments, values.fixed, needed, unsaveable)
    if cut.saved_bytes >= before:
        return forward, backward

    # residuals the split had keep their places; new ones follow in forward order
    saved = set(cut.saved)
    new_residuals = [p for p in residuals if p.name in saved]
    new_residuals += [proxies[n] for n in cut.saved if n not in needed]
    body = _placed_before_first_reads(backward, _recomputations(values.producers, cut, backward))

    new_backward = backward.derive("", body)
    new_backward.args = new_residuals + list(cotangents)
    new_backward = dce(new_backward)
    stamp_provenance(new_backward, "Rematerialization", start)
    new_forward = forward.derive("")
    new_forward.output = (outputs, tuple(new_residuals))
    new_forward = dce(new_forward)
    stamp_provenance(new_forward, "Rematerialization", start)
    return new_forward, new_backward
