"""tf.visualize: a self-contained HTML page of a compiled function's last compile.

The page draws the dataflow of the execution traces, the forward and, where one exists, the
backward: one box per operation that runs, labelled with its op and its result's dtype and
shape and coloured by the executor that runs it; the operations a fusion executor claimed
drawn inside one group per region; the tensors the forward saves for the backward outlined,
with their bytes. Given a `tf.profile(...)` result, each box and region also shows its time.

Layout is not ours: Graphviz's `dot` lays the graph out where it is installed, else grandalf
(a pure-Python Sugiyama layout, the `visualize` extra); the page only draws the positions. The
base install has neither, and visualize then raises UnsupportedOpError naming both installs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import html
import math
import shutil
import subprocess

from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves
from thunderfn.core.trace import Trace
from thunderfn.errors import ArgumentTypeError, ArgumentValueError, NoTraceError, UnsupportedOpError
from thunderfn.executors.fusion import FusionExecutor
from thunderfn.jit import last_backward_traces, last_traces

try:  # the fallback layout engine: optional, like Graphviz itself
    from grandalf.graphs import Edge as _GEdge
    from grandalf.graphs import Graph as _GGraph
    from grandalf.graphs import Vertex as _GVertex
    from grandalf.layouts import SugiyamaLayout as _Sugiyama
except ImportError:  # pragma: no cover - exercised where grandalf is not installed
    _Sugiyama = None

# Executors' colours: the built-ins fixed (so pages compare), anyone else's from its name.
EXECUTOR_COLORS = {
    "torch": "#d9d9d9", "inductor": "#f4a259", "nvfuser": "#8cc084", "sdpa": "#7fb3d5",
    "cudnn_sdpa": "#5d9cec", "triton_crossentropy": "#c39bd3", "apex_crossentropy": "#e59866",
    "transformer_engine": "#76d7c4", None: "#ffffff",
}
_MORE_COLORS = ("#f7dc6f", "#f1948a", "#82e0aa", "#85c1e9", "#bb8fce", "#f0b27a", "#73c6b6", "#d7bde2")
_STATEMENTS = {"python.del"}  # bound symbols that free memory rather than compute: not drawn


def executor_color(name) -> str:
    if name in EXECUTOR_COLORS:
        return EXECUTOR_COLORS[name]
    return _MORE_COLORS[int(hashlib.sha1(name.encode()).hexdigest(), 16) % len(_MORE_COLORS)]


@dataclasses.dataclass
class Node:
    id: str
    label: list  # lines: the op, then the result's dtype and shape
    executor: str | None  # who runs it (None: an input or the output)
    kind: str  # "input", "op" or "output"
    statement: str = ""  # the trace line, shown on hover
    region: str | None = None  # the fusion region it belongs to
    saved: list = dataclasses.field(default_factory=list)  # (name, dtype and shape, bytes) of what it
    # makes that the forward saves for the backward
    time_ms: float | None = None  # from tf.profile: the op's median time (a fused op's is its region's)

    @property
    def saved_bytes(self) -> int | None:
        return sum(b for _, _, b in self.saved) if self.saved else None


@dataclasses.dataclass
class Dataflow:
    """One execution trace as a graph: what the page draws."""
    title: str
    nodes: dict  # id -> Node, in trace order
    edges: list  # (from id, to id)
    regions: dict  # region name -> executor name
    region_ms: dict = dataclasses.field(default_factory=dict)  # region name -> median time, from tf.profile

    def nodes_of(self, region: str) -> list:
        return [n for n in self.nodes.values() if n.region == region]


def visualize(fn_or_trace, path, *, layout: str = "auto", profile=None) -> str:
    """Write an HTML page of `fn_or_trace`'s last compile to `path` and return the path.

    `fn_or_trace`: a function from `tf.jit` that has been called (its forward and backward
    execution traces are drawn), or a `Trace`. `layout`: "graphviz", "grandalf", or "auto"
    (Graphviz's `dot` where it is installed, else grandalf). `profile`: what `tf.profile` returned
    for the function; the traces it timed are drawn, each box and region with its median time.

        >>> import torch, thunderfn as tf
        >>> f = tf.jit(lambda x: torch.tanh(x) * 2)
        >>> _ = f(torch.randn(3))
        >>> tf.visualize(f, "f.html")  # doctest: +SKIP
        'f.html'
    """
    engine = _engine(layout)
    drawn = _traces_of(fn_or_trace) if profile is None else _forward_and_backward(
        [profile.traces["forward"]], [profile.traces["backward"]] if "backward" in profile.traces else [])
    graphs = [dataflow(t, title, saved=saved, results=results) for title, t, saved, results in drawn]
    if profile is not None:
        for graph in graphs:
            _add_times(graph, profile)
    page = _page(graphs, engine)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return str(path)


# How to install each layout engine. The base install (`pip install -e .`) has neither: grandalf is
# the `visualize` extra, and Graphviz is a system program, not a Python package.
_INSTALL_GRANDALF = ("grandalf, a pure-Python layout: pip install grandalf, or the visualize extra "
                     "(pip install -e '.[visualize]' in a clone, pip install 'thunderfn[visualize]' otherwise)")
_INSTALL_GRAPHVIZ = "Graphviz's `dot` program on PATH: apt-get install graphviz (brew install graphviz on macOS)"


def _engine(layout: str) -> str:
    if layout not in ("auto", "graphviz", "grandalf"):
        raise ArgumentValueError(f"visualize: layout must be 'auto', 'graphviz' or 'grandalf', got {layout!r}")
    has_dot, has_grandalf = shutil.which("dot") is not None, _Sugiyama is not None
    if layout == "graphviz" and not has_dot:
        raise UnsupportedOpError(f"visualize: layout='graphviz' needs {_INSTALL_GRAPHVIZ}")
    if layout == "grandalf" and not has_grandalf:
        raise UnsupportedOpError(f"visualize: layout='grandalf' needs {_INSTALL_GRANDALF}")
    if layout == "auto":
        if not (has_dot or has_grandalf):
            raise UnsupportedOpError(f"visualize needs a layout engine and finds none installed; install either "
                                     f"{_INSTALL_GRANDALF}; or {_INSTALL_GRAPHVIZ}")
        return "graphviz" if has_dot else "grandalf"
    return layout


def _traces_of(fn_or_trace):
    """(title, execution trace, the tensors it saves for a backward by name, its results) for each
    trace drawn."""
    if isinstance(fn_or_trace, Trace):
        return [("trace", fn_or_trace, {}, None)]
    if not callable(fn_or_trace):
        raise ArgumentTypeError("visualize expects a function from tf.jit or a Trace, got "
                                f"{type(fn_or_trace).__name__}")
    forward = last_traces(fn_or_trace)
    if not forward:
        raise ArgumentValueError("visualize: this function has not been compiled yet; call it once first")
    try:
        backward = last_backward_traces(fn_or_trace)
    except NoTraceError:  # no input required grad: a forward alone
        backward = []
    return _forward_and_backward(forward, backward)


def _forward_and_backward(forward, backward):
    if not backward:
        return [("forward", forward[-1], {}, None)]
    fwd, bwd = forward[-1], backward[-1]
    # a forward with a backward returns (outputs, saved): what the backward reads is what is kept alive
    outputs, kept = fwd.output
    bwd_inputs = {a.name for a in bwd.args}
    saved = {p.name: p for p in tree_leaves(kept) if isinstance(p, TensorProxy) and p.name in bwd_inputs}
    return [("forward", fwd, saved, outputs), ("backward", bwd, {}, None)]


def _add_times(graph: Dataflow, profile) -> None:
    times = {f"op{r.index}": r for r in profile.rows if r.trace == graph.title}
    for node in graph.nodes.values():
        row = times.get(node.id.rpartition("_")[0] if node.region else node.id)
        if row is not None:
            node.time_ms = row.ms
            if node.region:
                graph.region_ms[node.region] = row.ms


def tensor_bytes(p: TensorProxy) -> int:
    numel = math.prod(int(s) for s in p.shape)
    return numel * p.dtype.itemsize


def _describe(p) -> str:
    if not isinstance(p, TensorProxy):
        return ""
    dtype = str(p.dtype).removeprefix("torch.")
    return f"{dtype}[{', '.join(str(s) for s in p.shape)}]"


def _outputs(bsym) -> list:
    return [p for p in tree_leaves(bsym.output) if isinstance(p, TensorProxy)]


def _reads(bsym) -> list:
    return [p for p in tree_leaves((bsym.args, bsym.kwargs)) if isinstance(p, TensorProxy)]


def dataflow(trc: Trace, title: str = "trace", *, saved=None, results=None) -> Dataflow:
    """The graph of an execution trace: inputs, one node per computing bound symbol (one per fused
    op inside a fusion region), the output; `saved` (name -> proxy) marks what a backward keeps, and
    `results` (the trace's output where None) is what the output node draws edges from."""
    saved = saved or {}
    nodes, edges, regions, producer = {}, [], {}, {}

    def add(node: Node, reads=(), writes=()):
        nodes[node.id] = node
        for p in reads:
            if p.name in producer and (producer[p.name], node.id) not in edges:
                edges.append((producer[p.name], node.id))
        for p in writes:
            producer[p.name] = node.id
            if p.name in saved and node.kind == "op":  # an input is kept alive by its owner anyway
                node.saved.append((p.name, _describe(p), tensor_bytes(p)))

    for a in trc.args:
        add(Node(f"in_{a.name}", [a.name, _describe(a)], None, "input", statement=a.name), writes=[a])
    for k, bsym in enumerate(trc.bound_symbols):
        if bsym.sym.id in _STATEMENTS:
            continue
        executor = bsym.sym.executor
        name = getattr(executor, "name", None)
        if isinstance(executor, FusionExecutor) and bsym.subsymbols:
            regions[bsym.sym.name] = name
            for j, sub in enumerate(bsym.subsymbols):
                outs = _outputs(sub)
                add(Node(f"op{k}_{j}", [sub.sym.name, *map(_describe, outs[:1])], name, "op",
                         statement=str(sub).strip(), region=bsym.sym.name), reads=_reads(sub), writes=outs)
            continue
        outs = _outputs(bsym)
        if not outs and not _reads(bsym):
            continue  # a statement with no dataflow
        add(Node(f"op{k}", [bsym.sym.name, *map(_describe, outs[:1])], name, "op", statement=str(bsym).splitlines()[0]),
            reads=_reads(bsym), writes=outs)
    results = [p for p in tree_leaves(trc.output if results is None else results) if isinstance(p, TensorProxy)]
    add(Node("output", ["output"], None, "output", statement="return"), reads=results)
    return Dataflow(title, nodes, edges, regions)


# -- drawing ---------------------------------------------------------------------------
_CHAR_W, _LINE_H, _PAD = 7.0, 14.0, 8.0


def _box_size(node: Node) -> tuple:
    lines = _lines(node)
    return max(len(s) for s in lines) * _CHAR_W + 2 * _PAD, len(lines) * _LINE_H + _PAD


def _lines(node: Node) -> list:
    extra = []
    if node.saved_bytes is not None:
        extra.append(f"saved {_bytes(node.saved_bytes)}")
    if node.time_ms is not None and node.region is None:
        extra.append(f"{node.time_ms:.3f} ms")
    return [s for s in node.label if s] + extra


def _region_label(graph: Dataflow, region: str, executor) -> str:
    ms = graph.region_ms.get(region)
    return f"{region} ({executor})" + (f", {ms:.3f} ms" if ms is not None else "")


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _svg_graphviz(graph: Dataflow) -> str:
    lines = ["digraph G {", "rankdir=TB; nodesep=0.25; ranksep=0.35;",
             'node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']

    def node_line(n: Node) -> str:
        label = "\\n".join(s.replace('"', '\\"') for s in _lines(n))
        border = ', penwidth=3, color="#c0392b"' if n.saved_bytes is not None else ""
        tooltip = n.statement.replace('"', '\\"')[:400]
        return (f'"{n.id}" [label="{label}", fillcolor="{executor_color(n.executor)}", '
                f'tooltip="{tooltip}", class="{n.kind}"{border}];')

    for region, executor in graph.regions.items():
        lines.append(f'subgraph "cluster_{region}" {{ label="{_region_label(graph, region, executor)}"; '
                     f'style="dashed,rounded"; color="{executor_color(executor)}"; penwidth=2; '
                     'fontname="Helvetica"; fontsize=11;')
        lines += [node_line(n) for n in graph.nodes_of(region)]
        lines.append("}")
    lines += [node_line(n) for n in graph.nodes.values() if n.region is None]
    lines += [f'"{a}" -> "{b}";' for a, b in graph.edges]
    lines.append("}")
    svg = subprocess.run(["dot", "-Tsvg"], input="\n".join(lines), capture_output=True, text=True, check=True).stdout
    return svg[svg.index("<svg"):]


def _svg_grandalf(graph: Dataflow) -> str:
    vertices = {}
    for n in graph.nodes.values():
        v = _GVertex(n.id)
        v.view = type("View", (), {})()
        v.view.w, v.view.h = _box_size(n)
        vertices[n.id] = v
    g = _GGraph(list(vertices.values()), [_GEdge(vertices[a], vertices[b]) for a, b in graph.edges])
    boxes, x_offset = {}, 0.0
    for component in g.C:  # each connected part laid out alone, then side by side
        layout = _Sugiyama(component)
        layout.init_all()
        layout.draw()
        placed = list(component.sV)
        left = min(v.view.xy[0] - v.view.w / 2 for v in placed)
        right = max(v.view.xy[0] + v.view.w / 2 for v in placed)
        for v in placed:
            x, y = v.view.xy
            boxes[v.data] = (x - left + x_offset - v.view.w / 2, y - v.view.h / 2, v.view.w, v.view.h)
        x_offset += right - left + 40
    top = min(b[1] for b in boxes.values())
    boxes = {k: (x + 20, y - top + 40, w, h) for k, (x, y, w, h) in boxes.items()}
    width = max(x + w for x, _, w, _ in boxes.values()) + 20
    height = max(y + h for _, y, _, h in boxes.values()) + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica" font-size="10">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>']
    for region, executor in graph.regions.items():
        members = [boxes[n.id] for n in graph.nodes_of(region)]
        x0 = min(b[0] for b in members) - 10
        y0 = min(b[1] for b in members) - 22
        x1 = max(b[0] + b[2] for b in members) + 10
        y1 = max(b[1] + b[3] for b in members) + 10
        out.append(f'<g class="cluster" id="{html.escape(region)}"><rect x="{x0:.1f}" y="{y0:.1f}" '
                   f'width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" rx="8" fill="none" '
                   f'stroke="{executor_color(executor)}" stroke-width="2" stroke-dasharray="6 3"/>'
                   f'<text x="{x0 + 6:.1f}" y="{y0 + 14:.1f}" font-size="11">'
                   f'{html.escape(_region_label(graph, region, executor))}</text></g>')
    for a, b in graph.edges:
        ax, ay, aw, ah = boxes[a]
        bx, by, bw, _ = boxes[b]
        out.append(f'<line x1="{ax + aw / 2:.1f}" y1="{ay + ah:.1f}" x2="{bx + bw / 2:.1f}" y2="{by:.1f}" '
                   f'stroke="#555" stroke-width="1" marker-end="url(#arrow)"/>')
    for n in graph.nodes.values():
        x, y, w, h = boxes[n.id]
        stroke = 'stroke="#c0392b" stroke-width="3"' if n.saved_bytes is not None else 'stroke="#333" stroke-width="1"'
        out.append(f'<g class="node {n.kind}" id="{html.escape(n.id)}"><title>{html.escape(n.statement)}</title>'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="4" '
                   f'fill="{executor_color(n.executor)}" {stroke}/>')
        for i, line in enumerate(_lines(n)):
            out.append(f'<text x="{x + w / 2:.1f}" y="{y + _PAD / 2 + (i + 0.8) * _LINE_H:.1f}" '
                       f'text-anchor="middle">{html.escape(line)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _page(graphs: list, engine: str) -> str:
    executors = sorted({n.executor for g in graphs for n in g.nodes.values() if n.executor is not None})
    legend = "".join(f'<span class="swatch" style="background:{executor_color(e)}"></span>{html.escape(e)} '
                     for e in executors)
    sections = []
    for g in graphs:
        svg = _svg_graphviz(g) if engine == "graphviz" else _svg_grandalf(g)
        sections.append(f'<section id="{g.title}"><h2>{g.title}</h2>{_summary(g)}{_saved_table(g)}'
                        f'<div class="graph">{svg}</div></section>')
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>thunderfn: the last compile</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 1.5em; }}
.swatch {{ display: inline-block; width: 1em; height: 1em; border: 1px solid #333; margin: 0 0.3em 0 1em;
          vertical-align: middle; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1em; }}
td, th {{ border: 1px solid #bbb; padding: 2px 8px; text-align: left; font-size: 0.9em; }}
.graph {{ overflow: auto; border: 1px solid #ddd; }}
</style></head>
<body>
<h1>The last compile</h1>
<p>Each box is an operation that runs, coloured by its executor; a dashed group is one fusion region;
a box outlined in red makes a tensor the forward saves for the backward. Hover a box for its trace line.
Laid out by {'Graphviz' if engine == 'graphviz' else 'grandalf'}.</p>
<p class="legend">Executors: {legend}</p>
{''.join(sections)}
</body></html>
"""


def _summary(g: Dataflow) -> str:
    ops = [n for n in g.nodes.values() if n.kind == "op"]
    rows = "".join(f"<tr><td>{html.escape(r)}</td><td>{html.escape(str(e))}</td><td>{len(g.nodes_of(r))}</td>"
                   f"<td>{'' if r not in g.region_ms else f'{g.region_ms[r]:.3f} ms'}</td></tr>"
                   for r, e in g.regions.items())
    table = ("<table class=\"regions\"><tr><th>region</th><th>executor</th><th>ops</th><th>time</th></tr>"
             f"{rows}</table>") if rows else ""
    return f"<p>{len(ops)} operations, {len(g.regions)} fusion regions.</p>{table}"


def _saved_table(g: Dataflow) -> str:
    saved = [(n, entry) for n in g.nodes.values() for entry in n.saved]
    if not saved:
        return ""
    rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{html.escape(described)}</td><td>{_bytes(size)}</td>"
                   f"<td>{html.escape(n.label[0])}</td></tr>"
                   for n, (name, described, size) in saved)
    return (f"<p>Saved for the backward, besides inputs: {len(saved)} tensors, "
            f"{_bytes(sum(size for _, (_, _, size) in saved))}.</p><table class=\"saved\"><tr><th>tensor</th>"
            f"<th>dtype and shape</th><th>bytes</th><th>made by</th></tr>{rows}</table>")
