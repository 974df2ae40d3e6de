"""Fusion executors: claim regions of the execution trace and run each as one call.

A fusion executor runs after per-symbol lowering (jit's "Fusion (<name>)" pass). It
takes only what would otherwise run on torch: a bound symbol another executor claimed
(an operator executor's kernel) is not the torch executor's, so it splits a region.
Of those, `can_fuse(bsym)` says which the executor's compiler handles; the rest of
this module is shared by every fusion executor (Inductor, nvFuser):

1. The graph: one node per bound symbol, an edge from each producer to each consumer
   (by proxy name), plus ordering edges for effects. Statements that switch a mode or
   write into inputs (`set_grad_enabled`, `set_default_dtype`, `write_back`,
   `inputs_do_not_alias`) and collectives are barriers: everything before one runs before it, everything
   after it after. Other effects (random draws, RNG state, value checks) keep their
   order among themselves. None of them, nor opaque ops or aliases, is ever fused. Another
   executor's operators split regions, except those registered as traceable where the
   fusion executor absorbs them (`absorbs_traceable_operators`: Inductor calls sdpa's kernels).
2. Regions, grown by merging groups of fusible nodes: each producer into its consumers
   first, then groups that do not depend on each other (siblings), until nothing
   merges. A merge of A and B is legal only if no path leads from one to the other
   through a node outside both: fusing across such a path would make the region both
   feed and consume that node, a cycle.
3. The schedule: the groups in a topological order that keeps the trace's order where
   it can (ties go to the group whose first member came first), so an unfused trace
   comes out unchanged. A region worth fusing (`worth_fusing`: two ops or more, one
   an elementwise op or a reduction, by default) becomes one bound symbol, `inductor_fusion_0(...)`, whose subsymbols
   are the fused ops (printed as comments) and whose callable is `compile_region(region)`.

May import: core/, executors/base.py, executors/torch_executor.py.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
import warnings
from typing import Callable

import torch

from thunderfn.core import symbolic
from thunderfn.core.bodies import Body
from thunderfn.core.passes import del_last_used
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves, tree_map
from thunderfn.core.statements import (
    check_inputs_do_not_alias,
    python_alias,
    set_default_dtype,
    set_grad_enabled,
    write_back,
)
from thunderfn.core.symbol import BoundSymbol, Symbol
from thunderfn.core.trace import Trace
from thunderfn.errors import ArgumentNotImplementedError, InternalError
from thunderfn.executors.base import Executor
from thunderfn.executors.torch_executor import TorchExecutor

# Statements nothing may move across: grad mode and default dtype change what every later op
# does; write-backs and the aliasing check must see the inputs before and after every read.
_BARRIERS = {s.id for s in (set_grad_enabled, set_default_dtype, write_back, check_inputs_do_not_alias)}


@dataclasses.dataclass
class Region:
    """A set of bound symbols that run as one call: `inputs` are the proxies they read from
    outside, `outputs` those they produce that something outside reads (or the trace returns).
    `sizes`: where its ops take symbolic sizes as arguments (a reshape to (2*s0, 4)), the symbols
    those use, each a SymInt that is exactly one symbol, in name order: the call passes their
    values after the tensors, so the region computes the sizes itself."""
    name: str
    bsyms: list
    inputs: list
    outputs: list
    sizes: list = dataclasses.field(default_factory=list)

    @property
    def size_names(self) -> list[str]:
        """The printed names of `sizes` ("s0"): the region function's parameters after its tensors."""
        return [symbolic.python(s) for s in self.sizes]

    @property
    def symbolic(self) -> bool:
        """Whether a size of an input, or an argument of an op, is symbolic (core/symbolic.py)."""
        return bool(self.sizes) or any(symbolic.has_symbols(p.shape) for p in self.inputs)

    def unfused_trace(self) -> Trace:
        """The region's bound symbols as a trace of their own: what runs when nothing fuses them."""
        # a captured tensor the region reads is one of its parameters here, not a global
        params = {p.name: TensorProxy(p.name, shape=p.shape, dtype=p.dtype, device=p.device,
                                      requires_grad=p.requires_grad) for p in self.inputs if p.constant is not None}
        trc = Trace(self.name)
        trc.def_name = self.name
        trc.args = [params.get(p.name, p) for p in self.inputs]
        trc.size_args = self.size_names
        trc.output = tuple(self.outputs)
        trc.bound_symbols[:] = [b.swap(params) for b in self.bsyms]
        return del_last_used(trc)

    @functools.cached_property
    def unfused(self) -> Callable:
        """A function running the region's ops one by one, as the torch executor would (made on
        first use: what a region its compiler refused runs, or one waiting for its compile)."""
        return self.unfused_trace().python_callable()

    def warn_unfused(self, failed: str, error: Exception, *, stacklevel: int) -> None:
        """The one-line warning of a region its compiler failed on (`failed`: "Inductor could not
        compile"), naming the region and the error's first line."""
        line = (str(error).strip().splitlines() or [""])[0][:200]
        warnings.warn(f"thunderfn: {failed} {self.name} ({type(error).__name__}: {line}); its {len(self.bsyms)} ops "
                      f"run unfused", stacklevel=stacklevel + 1)


class FusionExecutor(Executor):
    """Base for executors that claim regions of fusible bound symbols rather than one symbol
    at a time. A subclass says which bound symbols it can fuse (`can_fuse(bsym)`, asked only
    of symbols the torch executor would run, without effects) and how a region runs
    (`compile_region(region) -> callable(*region.inputs) -> sequence of region.outputs`).

    Regions are formed along data flow from neighbouring fusible symbols, and one runs as a
    single statement named `<executor>_fusion_<n>` whose ops print below it; `region.bsyms`,
    `region.inputs` and `region.outputs` say what it holds and `region.unfused` is a callable
    running its ops one by one with torch. A region smaller than `min_region_size` (2), or one
    with no elementwise op or reduction (views, a lone matmul), is left unfused. inductor and nvfuser are
    FusionExecutors; `tf.jit(fn, fusion=True)` adds Inductor's.

        >>> import torch, thunderfn as tf
        >>> class PrintsRegions(tf.executors.FusionExecutor):
        ...     def can_fuse(self, bsym):
        ...         return True
        ...     def compile_region(self, region):
        ...         print("compiling", [b.sym.name for b in region.bsyms])
        ...         return region.unfused  # a real executor compiles the ops
        >>> f = tf.jit(lambda x: torch.sin(x).exp() * 2, executors=[PrintsRegions("docs_regions")])
        >>> torch.testing.assert_close(f(torch.ones(2)), torch.sin(torch.ones(2)).exp() * 2)
        compiling ['torch.sin', 'torch.exp', 'torch.mul']
        >>> [b.sym.name for b in tf.last_traces(f)[-1].bound_symbols if b.sym.name != "del"]
        ['docs_regions_fusion_0']
    """

    min_region_size = 2  # one op gains nothing from a fusing compiler, and costs a compile
    # Whether regions may take in other executors' operators registered as traceable (sdpa's attention
    # kernels): a compiler that traces torch code (Inductor) calls them as external kernels, so a
    # transformer's forward is one region instead of one per stretch between attention calls.
    absorbs_traceable_operators = False
    # Whether regions may hold ops given symbolic sizes as arguments (a reshape to (s0, 4)): the region then
    # takes those sizes' symbols as int inputs after its tensors (Region.sizes), which its compiler must accept.
    accepts_symbolic_arguments = False
    # Whether regions may hold ops whose sizes are data-dependent (u0: a boolean mask's row count, core/symbolic.py),
    # which differ on every call and may be 0 or 1: a compiler that specializes sizes it sees would compile anew for
    # each, so such ops stay with the torch executor unless the executor says its compiler handles them.
    accepts_data_dependent_sizes = False

    def can_fuse(self, bsym) -> bool:
        raise ArgumentNotImplementedError(f"{type(self).__name__} subclasses FusionExecutor but does not implement "
                                  f"can_fuse(bsym) -> bool")

    def compile_region(self, region: Region) -> Callable:
        raise ArgumentNotImplementedError(f"{type(self).__name__} subclasses FusionExecutor but does not implement "
                                  f"compile_region(region) -> callable")

    def worth_fusing(self, region: Region) -> bool:
        """min_region_size ops or more, one of which computes (an elementwise op or a reduction): a
        region of views or of a lone matmul would cost a compile and fuse nothing."""
        return len(region.bsyms) >= self.min_region_size and any(computes(b) for b in region.bsyms)

    def fuse(self, trc):
        """The trace with this executor's regions each replaced by one call."""
        return fuse_regions(trc, self)


class CompiledCache:
    """A fusion executor's compiled regions shared across the process, by key (the region's
    signature and its inputs' layout), least recently kept dropped past `size`: regions of
    functions long gone would otherwise keep their kernels alive forever (a region's own callable
    keeps what it uses)."""

    def __init__(self, size: int = 512):
        self.size = size
        self.entries: collections.OrderedDict = collections.OrderedDict()

    def get(self, key):
        """The entry for key (now the most recently used), or None."""
        found = self.entries.get(key)
        if found is not None:
            self.entries.move_to_end(key)
        return found

    def keep(self, key, compiled) -> None:
        self.entries[key] = compiled
        self.entries.move_to_end(key)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def __len__(self):
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)


# -- which bound symbols are candidates --------------------------------------------------------

def computes(bsym) -> bool:
    """Whether bsym's decomposition holds an elementwise op or a reduction (not only views and copies)."""
    if not bsym.subsymbols:
        return bool({"elementwise", "reduction"} & bsym.sym.tags)
    return any(computes(s) for s in bsym.subsymbols)


def has_effects(bsym) -> bool:
    """Whether bsym or anything in its decomposition must run exactly where and as often as
    recorded (a random draw, an RNG state read, a statement)."""
    return ("no_dce" in bsym.sym.tags or "random" in bsym.sym.tags or bsym.sym.printer is not None
            or any(has_effects(s) for s in bsym.subsymbols))


def runs_on_torch(bsym) -> bool:
    """Whether the torch executor runs bsym as the one torch call its symbol mirrors (an
    opaque op, which has no decomposition, shows none and is left alone)."""
    return isinstance(bsym.sym.executor, TorchExecutor) and bool(bsym.subsymbols)


def absorbable(ex: FusionExecutor, bsym) -> bool:
    """Whether bsym is another executor's operator that ex may call inside a region: one registered
    as traceable (executors/base.py), where ex says its compiler calls such operators. The kernel
    stays the one that executor chose; only the region boundary around it goes."""
    return ex.absorbs_traceable_operators and "traceable" in bsym.sym.tags


def calls_bodies(bsym) -> bool:
    """Whether bsym is a control-flow primitive's call (core/bodies.py): its bodies are compiled code of their
    own, lowered onto the same executors, and a compiler tracing the call would unroll or refuse its loop."""
    return any(isinstance(a, Body) for a in bsym.args) or any(calls_bodies(s) for s in bsym.subsymbols)


def fusion_candidate(ex: FusionExecutor, bsym) -> bool:
    outs = bsym.flat_outs()
    # (an output may be None where the op skips it: convolution_backward's bias gradient when there is no bias)
    # A call given a symbolic size (a reshape to (s0, 4)) stays outside unless the executor takes sizes as
    # inputs (accepts_symbolic_arguments): compiled code holding its ops' arguments as constants would bake one size.
    return ((runs_on_torch(bsym) or absorbable(ex, bsym)) and not has_effects(bsym) and bool(bsym.proxy_outs())
            and not calls_bodies(bsym)
            and (ex.accepts_symbolic_arguments or not symbolic.has_symbols((bsym.args, bsym.kwargs)))
            and (ex.accepts_data_dependent_sizes
                 or not symbolic.has_unbacked([(bsym.args, bsym.kwargs), *(tuple(p.shape) for p in bsym.proxies())]))
            and all(isinstance(o, TensorProxy) or o is None for o in outs) and ex.can_fuse(bsym))


def _effect_kind(bsym) -> str | None:
    """'barrier', 'ordered' (keeps its place among effects) or None (free to move with its data)."""
    if bsym.sym.id in _BARRIERS or "collective" in bsym.sym.tags:  # (communication: never fused across)
        return "barrier"
    if bsym.sym is python_alias:
        return None
    return "ordered" if has_effects(bsym) else None


# -- the graph and its groups ------------------------------------------------------------------

class _Group:
    __slots__ = ("members", "mask", "first", "preds", "succs", "desc", "fusible", "alive", "devices")

    def __init__(self, i: int, fusible: bool, devices: frozenset = frozenset()):
        self.members, self.mask, self.first = [i], 1 << i, i
        self.devices = devices  # where its tensors live: one compiled kernel runs on one device
        self.preds: set = set()
        self.succs: set = set()
        self.desc = 0  # the nodes reachable from this group (bits), its own excluded
        self.fusible, self.alive = fusible, True

    def __lt__(self, other):  # heap ties
        return self.first < other.first


def _node_preds(bsyms) -> list[set]:
    """For each node, the nodes that must run before it: producers of what it reads, and the
    effect ordering described in the module docstring."""
    producer = {}
    preds = [set() for _ in bsyms]
    barrier, last_effect, since_barrier = None, None, []
    for i, b in enumerate(bsyms):
        preds[i].update(producer[a.name] for a in b.proxy_args() if a.name in producer)
        kind = _effect_kind(b)
        if barrier is not None:
            preds[i].add(barrier)
        if kind is not None and last_effect is not None:
            preds[i].add(last_effect)
        if kind == "barrier":
            preds[i].update(since_barrier)
            barrier, since_barrier = i, []
        else:
            since_barrier.append(i)
        if kind is not None:
            last_effect = i
        for o in b.proxy_outs():
            producer.setdefault(o.name, i)
        preds[i].discard(i)
    return preds


def _written_values(bsyms) -> dict:
    """Each value an input or captured tensor held after an in-place write -> the next one (None
    after the last): write_back's `versions` and what it writes."""
    chains = [(*b.kwargs.get("versions", ()), b.args[1].name) for b in bsyms if b.sym is write_back]
    return {name: nxt for chain in chains for name, nxt in zip(chain, (*chain[1:], None))}


def _groups(bsyms, fusible: list[bool], written: dict | None = None) -> list[_Group]:
    groups = [_Group(i, f, frozenset(str(p.device) for p in b.proxies()))
              for i, (b, f) in enumerate(zip(bsyms, fusible))]
    preds = _node_preds(bsyms)
    # An op fusion leaves to others may raise when it runs (an index out of range): eager has done
    # the in-place writes before it by then, and so must the compiled code (core/passes.py's
    # write_back_on_failure_pass), so no write moves past it into a later region.
    writes = [i for i, b in enumerate(bsyms) if any(o.name in (written or {}) for o in b.proxy_outs())]
    for j, f in enumerate(fusible):
        if not f:
            preds[j].update(i for i in writes if i < j)
    for i, ps in enumerate(preds):
        for p in ps:
            groups[i].preds.add(groups[p])
            groups[p].succs.add(groups[i])
    for g in reversed(groups):  # trace order is topological: successors come later
        for s in g.succs:
            g.desc |= s.mask | s.desc
    return groups


def _legal(a: _Group, b: _Group) -> bool:
    """Both on the same device, and no path from a to b, or from b to a, through a group outside
    both (it would become a cycle)."""
    return (_same_device(a, b) and not any(s is not b and s.desc & b.mask for s in a.succs)
            and not any(s is not a and s.desc & a.mask for s in b.succs))


def _merge(a: _Group, b: _Group, groups: list[_Group]) -> None:
    """b joins a; everything that reached either now reaches what both reach."""
    a.members += b.members
    a.mask |= b.mask
    a.first = min(a.first, b.first)
    for s in b.succs:
        s.preds.discard(b)
        s.preds.add(a)
        a.succs.add(s)
    for p in b.preds:
        p.succs.discard(b)
        p.succs.add(a)
        a.preds.add(p)
    for g in (a, b):
        a.succs.discard(g)
        a.preds.discard(g)
    a.desc = (a.desc | b.desc) & ~a.mask
    a.devices |= b.devices
    b.alive = False
    for g in groups:
        if g.alive and g is not a and g.desc & a.mask:
            g.desc |= a.desc


def _same_device(a: _Group, b: _Group) -> bool:
    """Whether a and b may share a kernel: their tensors (a number-only group has none) are on one device."""
    return len(a.devices | b.devices) <= 1


def _grow_regions(groups: list[_Group]) -> None:
    def fusible_groups():
        return sorted((g for g in groups if g.alive and g.fusible), key=lambda g: g.first)

    merged_any = True
    while merged_any:
        merged_any = False
        # producer into consumer, until no consumer can join
        changed = True
        while changed:
            changed = False
            for a in fusible_groups():
                for b in sorted((s for s in a.succs if s.fusible), key=lambda g: g.first):
                    if a.alive and b.alive and b in a.succs and _legal(a, b):
                        _merge(a, b, groups)
                        changed = merged_any = True
        # independent siblings: neither reaches the other, so merging them cannot make a cycle
        candidates = fusible_groups()
        for i, a in enumerate(candidates):
            for b in candidates[i + 1:]:
                if a.alive and b.alive and _same_device(a, b) and not (a.desc & b.mask) and not (b.desc & a.mask):
                    _merge(a, b, groups)
                    merged_any = True


def _schedule(groups: list[_Group]) -> list[_Group]:
    """A topological order of the groups, the trace's own order wherever the graph allows it."""
    alive = [g for g in groups if g.alive]
    waiting = {id(g): len(g.preds) for g in alive}
    ready = [g for g in alive if not g.preds]
    heapq.heapify(ready)
    order = []
    while ready:
        g = heapq.heappop(ready)
        order.append(g)
        for s in g.succs:
            waiting[id(s)] -= 1
            if not waiting[id(s)]:
                heapq.heappush(ready, s)
    if len(order) != len(alive):
        raise InternalError("fusion made a cycle between regions: a bug in thunderfn/executors/fusion.py")
    return order


# -- the pass -----------------------------------------------------------------------------------

def form_regions(trc, ex: FusionExecutor) -> list[tuple[list[int], bool]]:
    """The trace's bound symbols grouped for fusion, in execution order: (positions in
    trc.bound_symbols of one group's members, whether the group is fusible); a bound symbol
    that is not a fusion candidate is a group of its own."""
    bsyms = trc.bound_symbols
    groups = _groups(bsyms, [fusion_candidate(ex, b) for b in bsyms], _written_values(bsyms))
    _grow_regions(groups)
    return [(sorted(g.members), g.fusible) for g in _schedule(groups)]


def fuse_regions(trc, ex: FusionExecutor):
    """trc with every region `ex` finds worth fusing replaced by one call of its compiled region."""
    bsyms = trc.bound_symbols
    returned = {p.name for p in tree_leaves(trc.output) if isinstance(p, TensorProxy)}
    # each value an input held after a write -> the next one: a region that computes the first and not
    # the next outputs it, so that an error after the region writes back what eager had written by then
    # (core/passes.py's write_back_on_failure_pass)
    next_version = {name: nxt for name, nxt in _written_values(bsyms).items() if nxt is not None}
    readers: dict[str, set] = {}
    for i, b in enumerate(bsyms):
        for a in b.proxy_args():
            readers.setdefault(a.name, set()).add(i)
    out = []
    for members, fusible in form_regions(trc, ex):
        region = (_region(trc, ex, [bsyms[i] for i in members], set(members), readers, returned, next_version)
                  if fusible else None)
        if region is None or not ex.worth_fusing(region):
            out += [bsyms[i] for i in members]
            continue
        out.append(region_call(ex, region, ex.compile_region(region)))
    return trc.derive(f"Fusion ({ex.name})", out)


def _region(trc, ex, members: list, positions: set, readers: dict, returned: set, next_version: dict) -> Region | None:
    produced = {o.name for b in members for o in b.proxy_outs()}
    inputs, seen = [], set()
    for b in members:
        for a in b.proxy_args():
            if a.name not in produced and a.name not in seen:
                seen.add(a.name)
                inputs.append(a)
    outputs = [o for b in members for o in b.proxy_outs()
               if o.name in returned or readers.get(o.name, set()) - positions
               or (o.name in next_version and next_version[o.name] not in produced)]
    if not outputs:
        return None
    sizes = {}
    for b in members:
        for size in symbolic.symbolic_leaves((b.args, b.kwargs)):
            sizes.update(symbolic.free_symbols(size))
    return Region(trc.names.take(prefix=f"{ex.name}_fusion_"), members, inputs, outputs,
                  [sizes[name] for name in sorted(sizes)])


def region_call(ex: FusionExecutor, region: Region, fn: Callable) -> BoundSymbol:
    """The bound symbol that runs `fn` on the region's inputs: one line of the execution trace,
    with the fused ops as comments below it (each op alone, not its decomposition)."""
    sym = Symbol(region.name, f"{ex.name}.{region.name}", is_prim=True, print_name=region.name,
                 namespace={region.name: fn}, eager=fn, executor=ex)
    shown = tuple(BoundSymbol(b.sym, b.args, b.kwargs, b.output, ()) for b in region.bsyms)
    return sym.bind(*region.inputs, *region.sizes, output=tuple(region.outputs), subsymbols=shown)


def positional_signature(region: Region, ops: list, op_name: Callable) -> str:
    """What a compiled region depends on besides its inputs' layout, as text: the inputs' dtypes
    and shapes, then `ops` (the region's bound symbols or their prims) in order, each as
    `op_name(op)` with its arguments, inputs and intermediates named by position, so regions
    computing the same thing from other names share one compiled function."""
    names = {p.name: f"i{k}" for k, p in enumerate(region.inputs)}

    def positional(x):
        if isinstance(x, (torch.SymInt, torch.SymFloat)):  # by its source ("2*s0"), as the trace prints it
            return _Positional(symbolic.python(x))
        return _Positional(names[x.name]) if isinstance(x, TensorProxy) else x

    lines = [f"{names[p.name]}: {p.dtype} {tree_map(positional, tuple(p.shape))!r}" for p in region.inputs]
    for op in ops:
        for p in op.proxy_outs():
            names.setdefault(p.name, f"v{len(names)}")
        lines.append(f"{tree_map(positional, op.output)!r} = "
                     f"{op_name(op)}{tree_map(positional, (op.args, op.kwargs))!r}")
    lines.append(f"return {[names[p.name] for p in region.outputs]}")
    return "\n".join(lines)


class _Positional:
    """Prints as a value's positional name in a signature."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return self.name
