"""The "inductor" executor: fusion regions compiled by TorchInductor, the compiler behind
torch.compile, on CPU (C++/OpenMP kernels) and CUDA (Triton kernels).

Each region (executors/fusion.py forms them) becomes an FX graph of the same torch calls
the torch executor would make, one node per fused op, which `compile_fx` compiles
(through AOTAutograd, as torch.compile's backend does, but without Dynamo: the graph is
already known). Compiling waits for the region's first call, because Inductor's kernels
assume the input strides they were compiled for and a trace knows only shapes; each
region keeps one compiled function per input layout (shape, strides, dtype, device,
requires_grad, grad mode), and a process-wide cache shares them between regions with the
same ops. A region Inductor cannot compile warns once, naming the region, and runs its
ops unfused. A region compiles for at most LAYOUT_LIMIT layouts (jit's cache_size_limit's
default); a layout past that warns once and runs unfused rather than compiling forever.

With symbolic sizes (jit's dynamic shapes, core/symbolic.py): a region whose inputs have
symbolic dimensions, or whose ops take symbolic sizes as arguments (a reshape to (2*s0, 4);
the region then takes those symbols' values as int inputs after its tensors, see
fusion.Region.sizes), is compiled once for every size, as torch.compile(dynamic=True) would:
compile_fx is given fake example inputs of a ShapeEnv of its own, where each dimension
symbolic in the trace is a symbol (sized like the call's, duck-shaped: equal sizes share
one) and each size input a symbolic int. Inductor then generates code that reads the sizes
from its inputs; whatever it assumed about them (divisibility, a bound, equal sizes, the
strides of dense inputs in terms of their sizes) is a guard of that ShapeEnv, and the
region keeps the compiled function with its guards as one Python check over the inputs
(ShapeEnv.produce_guards_expression, static sizes and strides included), asked on every
call; a call that breaks it compiles again (LAYOUT_LIMIT bounds these too). Chosen over
torch.compile(gm, dynamic=True) on the region's graph: no Dynamo re-tracing Python we
generated, no second guard system and recompile limit of Dynamo's own, and sizes are
symbolic exactly where the trace's are (Dynamo would also make static ones symbolic).
Static regions take the per-layout path above, unchanged.

Fusion never loses to the default path: a static region's first call with a layout, once
compiled, times the compiled function against the region's ops run unfused (as the torch
executor runs them) on the call's own tensors, alternating, and keeps the unfused ops where
they take under FASTER_BY of the compiled time (Inductor's CPU convolutions, a region too
small to gain). The choice is the layout's, shared by every region with the same ops (the
process-wide cache), and tf.profile lists the regions that run unfused and their two times
(`region_choices()`). `InductorExecutor(time_regions=False)` keeps every compiled region.
With a cache_dir (docs/jit.md, "Warm starts") each choice is written there, keyed by the
region's ops by name, the layout, torch's version, the machine and its thread count: a later
process takes it instead of timing again, and does not compile a region that ran unfused.

Not a default executor: a first call pays seconds of compilation per region (see
docs/executors.md). Ask for it with `tf.jit(fn, executors=["inductor"])`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import operator
import os
import platform
import queue
import re
import shutil
import sys
import threading
import time
import warnings

import torch
import torch.fx

from thunderfn.core import artifacts, portable, progress, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_map
from thunderfn.executors.fusion import CompiledCache, FusionExecutor, Region, positional_signature

# compiled functions shared by every region with the same ops and input layout; one compile at a
# time (threads calling the same new region wait for its compile instead of compiling it again)
_compiled = CompiledCache()
_compile_lock = threading.RLock()
# the most layouts one region is compiled for (symbolic regions: compiles, each guarded to the sizes it takes)
LAYOUT_LIMIT = 8
# A compiled region is replaced by its unfused ops where those take under this fraction of its time (a tie keeps
# the compiled one); each is timed TIMED_RUNS times, alternating, and its fastest run counts.
FASTER_BY = 0.9
TIMED_RUNS = 5


@dataclasses.dataclass(frozen=True)
class RegionChoice:
    """How a compiled region's layout runs: `fused` or not, from the two times measured on its first call."""
    fused: bool
    fused_ms: float
    unfused_ms: float
    remembered: bool = False  # timed by an earlier process and read from cache_dir

    def __str__(self) -> str:
        kept = "compiled" if self.fused else "unfused (its compiled code was slower)"
        told = " (as timed by an earlier process, from cache_dir)" if self.remembered else ""
        return f"{kept}: compiled {self.fused_ms:.3f} ms, unfused {self.unfused_ms:.3f} ms{told}"


_choices: dict = {}  # the process-wide cache's key -> RegionChoice


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list):
    """Inductor's compiled function for gm (called with tensors like example_inputs: real ones, or fake ones of a
    ShapeEnv of the region's own, symbolic_examples). Compiled in a tracing context whose fake mode has a ShapeEnv,
    as under torch.compile: Inductor's on-disk cache of compiled graphs (its FX graph cache) serves only such
    compiles, and without it a new process generated every region's code again (a fused warm start paid all of
    Inductor's code generation; only the C++ compile was cached). Real examples are made fake with their static
    sizes and strides, so the code is what it was: specialized to them."""
    # torch._inductor is heavy (seconds to import) and only this executor needs it: imported on first compile
    from torch._inductor.compile_fx import compile_fx
    fake_tensor = importlib.import_module("torch._subclasses.fake_tensor")
    mode = next((x.fake_mode for x in example_inputs if isinstance(x, fake_tensor.FakeTensor)), None)
    if mode is None:
        mode = fake_tensor.FakeTensorMode(shape_env=_symbolic_shapes().ShapeEnv())
        example_inputs = [mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x
                          for x in example_inputs]
    with torch._guards.tracing(torch._guards.TracingContext(mode)):
        return compile_fx(gm, example_inputs)


class InductorExecutor(FusionExecutor):
    """`compile_in_background`: a region's first call with a new layout runs its ops unfused and
    queues the compile on a background thread; calls after the compile lands run the compiled
    function. The first call then costs what an unfused one does instead of seconds, at the price
    of results that depend on timing (fused and unfused code round differently)."""

    absorbs_traceable_operators = True  # attention kernels become Inductor's extern calls, as under torch.compile
    accepts_symbolic_arguments = True  # symbolic regions take their ops' size symbols as int inputs (module docstring)

    def __init__(self, name: str = "inductor", *, compile_in_background: bool = False, time_regions: bool = True):
        super().__init__(name, torch.__version__)
        self._availability = None
        self.compile_in_background = compile_in_background
        self.time_regions = time_regions

    def availability(self) -> tuple[bool, str]:
        if self._availability is None:
            self._availability = _availability()
        return self._availability

    def can_fuse(self, bsym) -> bool:
        """A torch call on real tensors of one CPU or CUDA device (CUDA kernels are Triton's, so
        they need triton), none complex (Inductor leaves complex math to aten), whose outputs an
        FX node can index."""
        if bsym.sym.eager is None or not _tensor_outputs(bsym.output):
            return False
        tensors = bsym.proxies()
        devices = {p.device for p in tensors}
        return (not any(p.dtype.is_complex for p in tensors) and len(devices) <= 1
                and all(d.type == "cpu" or (d.type == "cuda" and _triton_imports()) for d in devices))

    def compile_region(self, region: Region):
        if region.symbolic:
            return SymbolicRegion(region, background=self.compile_in_background)
        return CompiledRegion(region, background=self.compile_in_background, timed=self.time_regions)


class CompiledRegion:
    """A region's callable: Inductor's compiled function for the layout of the inputs it is
    called with, compiled on the first call with that layout."""

    def __init__(self, region: Region, *, background: bool = False, timed: bool = False):
        self.region = region
        self.signature = region_signature(region)
        self.by_layout: dict = {}
        self.background = background
        self.timed = timed  # choose between the compiled function and the unfused ops by timing both (docstring)
        # The last call's grad mode and strides, and the function its layout ran: a region belongs to one
        # compiled trace, whose cache key fixes its inputs' shapes, dtypes, devices and requires_grad (given
        # the grad mode), so only strides can differ between its calls. Checking those alone costs a
        # quarter of the whole layout on a region of many inputs.
        self.last_strides, self.last_fn = None, None
        self.warned_limit = False

    def __call__(self, *tensors):
        strides = (torch.is_grad_enabled(), tuple(map(torch.Tensor.stride, tensors)))
        if strides == self.last_strides:
            return self.last_fn(*tensors)
        layout = (strides[0], *[(t.shape, t.stride(), t.dtype, t.device, t.requires_grad) for t in tensors])
        fn = self.by_layout.get(layout)
        if fn is None:
            return self.first_call(layout, tensors)
        self.last_strides, self.last_fn = strides, fn
        return fn(*tensors)

    def first_call(self, layout, tensors):
        if len(self.by_layout) >= LAYOUT_LIMIT:
            return over_limit(self, tensors)
        key = (self.signature, layout)
        if self.background:
            return self.compile_later(layout, key, tensors)
        with _compile_lock:
            fn, result = self.compiled_for(key, tensors, run=True)
        self.by_layout[layout] = fn
        return fn(*tensors) if result is None else result

    def compiled_for(self, key, example_inputs, *, run: bool):
        """(the compiled function for key, from the process-wide cache or compiled now, or the unfused
        one where Inductor fails; with `run`, its result on example_inputs, whose failure falls back
        too, else None). Called holding _compile_lock."""
        fn, result = _compiled.get(key), None
        remembered = _remembered_choice(self.region, key[1]) if fn is None and run and self.timed else None
        if remembered is not None and not remembered.fused:  # slower compiled: not compiled again
            _choices[key] = remembered
            fn = self.region.unfused
            _compiled.keep(key, fn)
            return fn, fn(*example_inputs)
        if fn is None:
            # a stage of the compile running on this thread, or (a call with a new layout) a compile of its own;
            # the background thread's compile blocks no call and says nothing
            with (progress.compiling_region(self.region.name, f"Inductor compiling fusion region {self.region.name} "
                                                              f"({len(self.region.bsyms)} ops)")
                  if run else contextlib.nullcontext()):
                artifacts.point_kernel_caches()
                try:
                    with warnings.catch_warnings():  # Inductor's chatter (deprecations inside torch) is not the user's
                        warnings.simplefilter("ignore")
                        fn = compile_graph(region_graph(self.region), list(example_inputs))
                    if run:
                        result = fn(*example_inputs)
                except Exception as e:  # any failure inside Inductor: run the ops unfused instead
                    fn = self.fall_back(e)
                    result = fn(*example_inputs) if run else None
                else:
                    if remembered is not None:
                        _choices[key] = remembered
                    elif run and self.timed:
                        fn = self.faster(key, fn, example_inputs)
            _compiled.keep(key, fn)
        return fn, result

    def faster(self, key, compiled, tensors):
        """The compiled function or the region's unfused ops, whichever ran faster on these tensors (the
        module docstring); the choice is recorded under the cache's key."""
        unfused = self.region.unfused
        sync = torch.cuda.synchronize if any(t.device.type == "cuda" for t in tensors) else (lambda: None)

        def seconds(fn):
            start = time.perf_counter()
            fn(*tensors)
            sync()
            return time.perf_counter() - start

        unfused(*tensors)  # (its first call makes its Python code)
        runs = [(seconds(compiled), seconds(unfused)) for _ in range(TIMED_RUNS)]
        fused_ms, unfused_ms = (min(r[i] for r in runs) * 1e3 for i in (0, 1))
        choice = _choices[key] = RegionChoice(unfused_ms >= fused_ms * FASTER_BY, fused_ms, unfused_ms)
        _remember_choice(self.region, key[1], choice)
        return compiled if choice.fused else unfused

    def region_choices(self) -> list:
        """The RegionChoice of each layout this region was timed for (tf.profile reports them)."""
        return [_choices[(self.signature, layout)] for layout in self.by_layout
                if (self.signature, layout) in _choices]

    def compile_later(self, layout, key, tensors):
        """Run unfused now; compile on the background thread for calls to come (see InductorExecutor)."""
        fn = _compiled.get(key)
        if fn is not None:
            self.by_layout[layout] = fn
            return fn(*tensors)
        self.by_layout[layout] = self.region.unfused  # until the compiled function replaces it
        artifacts.point_kernel_caches()  # (the compile thread does not see this thread's configuration)
        # inputs of the same layout, not the caller's tensors (which the compile would keep alive); the
        # grad mode is the call's, since Inductor compiles for training where grad is on and an input requires it
        examples = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).requires_grad_(
            t.requires_grad) for t in tensors]
        _background.put((self, layout, key, examples, torch.is_grad_enabled()))
        _start_background_thread()
        return self.region.unfused(*tensors)

    def finish_background_compile(self, layout, key, examples, grad_enabled):
        """The background thread's part of compile_later: compile, then let calls with this layout use it."""
        with _compile_lock, torch.set_grad_enabled(grad_enabled):
            fn, _ = self.compiled_for(key, examples, run=False)
        self.by_layout[layout] = fn
        self.last_strides = None  # the next call looks its layout up again, and finds the compiled function

    def fall_back(self, error: Exception):
        self.region.warn_unfused("Inductor could not compile", error, stacklevel=5)
        return self.region.unfused


def over_limit(compiled, args):
    """A call of a region compiled for LAYOUT_LIMIT layouts already, with another: unfused, warned once."""
    if not compiled.warned_limit:
        compiled.warned_limit = True
        region = compiled.region
        warnings.warn(f"thunderfn: Inductor compiled {region.name} for {LAYOUT_LIMIT} input layouts already "
                      f"(inductor.LAYOUT_LIMIT); its {len(region.bsyms)} ops run unfused for new ones", stacklevel=4)
    return compiled.region.unfused(*args)


class SymbolicRegion:
    """A region with symbolic sizes' callable (module docstring): called with the region's tensors and then
    its size symbols' values, it runs the first compiled function whose guards the call meets, compiling
    one on a call that meets none."""

    warned_limit = False

    def __init__(self, region: Region, *, background: bool = False):
        self.region = region
        self.signature = region_signature(region)
        self.n_tensors = len(region.inputs)
        self.background = background
        # which dimensions of each input are symbolic in the trace (the others are its cache key's)
        self.dynamic_dims = [[symbolic.is_symbolic(n) for n in p.shape] for p in region.inputs]
        self.by_pattern: dict = {}  # grad mode -> [(check, fn)], shared with regions of the same ops
        self.pending: set = set()  # grad modes with a background compile queued
        # the last call's grad mode, and the compiled function it ran with its check (a region belongs to one
        # compiled trace, whose cache key fixes its inputs' dtypes, devices and requires_grad given the grad mode)
        self.last_grad, self.last_check, self.last_fn = None, None, None

    def __call__(self, *args):
        grad = torch.is_grad_enabled()
        if grad is self.last_grad and self.last_check(args):
            return self.last_fn(*args)
        return self.find(grad, args)

    def entries(self, grad, tensors) -> list:
        """The compiled functions for calls in this grad mode, with their checks (shared process-wide by
        regions of the same ops and inputs of the same dtypes, devices and requires_grad)."""
        found = self.by_pattern.get(grad)
        if found is None:
            key = (self.signature, grad, *[(t.dtype, t.device, t.requires_grad) for t in tensors])
            found = _compiled.get(key)
            if found is None:
                found = []
                _compiled.keep(key, found)
            self.by_pattern[grad] = found
        return found

    def find(self, grad, args):
        entries = self.entries(grad, args[:self.n_tensors])
        for check, fn in entries:
            if check(args):
                self.last_grad, self.last_check, self.last_fn = grad, check, fn
                return fn(*args)
        if len(entries) >= LAYOUT_LIMIT:
            return over_limit(self, args)
        if self.background:
            return self.compile_later(grad, entries, args)
        with _compile_lock, progress.compiling_region(
                self.region.name, f"Inductor compiling fusion region {self.region.name} with symbolic sizes "
                                  f"({len(self.region.bsyms)} ops)"):
            check, fn = self.compile(args)
            entries.append((check, fn))
        self.last_grad, self.last_check, self.last_fn = grad, check, fn
        try:
            return fn(*args)
        except Exception as e:  # a compiled function failing on its first call: the region runs unfused
            entries[entries.index((check, fn))] = (check, self.fall_back(e))
            return self.region.unfused(*args)

    def compile(self, args):
        """(check, fn): Inductor's function for every call whose sizes and strides meet its guards, and
        those as a check over the call's arguments; where Inductor fails, the unfused function for all."""
        artifacts.point_kernel_caches()
        try:
            env, examples = symbolic_examples(args[:self.n_tensors], args[self.n_tensors:], self.dynamic_dims)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn = compile_graph(region_graph(self.region), examples)
            return guard_check(env, examples), fn
        except Exception as e:
            return _always, self.fall_back(e)

    def compile_later(self, grad, entries, args):
        """Run unfused now; compile on the background thread for calls to come (see InductorExecutor)."""
        if grad not in self.pending:
            self.pending.add(grad)
            artifacts.point_kernel_caches()
            examples = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).requires_grad_(
                t.requires_grad) for t in args[:self.n_tensors]]
            _background.put((self, grad, entries, [*examples, *args[self.n_tensors:]]))
            _start_background_thread()
        return self.region.unfused(*args)

    def finish_background_compile(self, grad, entries, examples):
        with _compile_lock, torch.set_grad_enabled(grad):
            entries.append(self.compile(examples))
        self.pending.discard(grad)

    def fall_back(self, error: Exception):
        self.region.warn_unfused("Inductor could not compile", error, stacklevel=5)
        return self.region.unfused


def _always(args) -> bool:
    return True


def symbolic_examples(tensors, sizes, dynamic_dims) -> tuple:
    """(a ShapeEnv of this compile's own, fake example inputs on it): each tensor like its call's, with the
    dimensions the trace has symbolic as symbols, then each size value as a symbolic int."""
    shapes = _symbolic_shapes()
    fake_tensor = importlib.import_module("torch._subclasses.fake_tensor")
    local_source = importlib.import_module("torch._dynamo.source").LocalSource
    env = shapes.ShapeEnv()
    mode = fake_tensor.FakeTensorMode(shape_env=env)
    duck, static = shapes.DimDynamic.DUCK, shapes.DimDynamic.STATIC
    examples = []
    for i, (t, dims) in enumerate(zip(tensors, dynamic_dims)):
        context = shapes.StatelessSymbolicContext(dynamic_sizes=[duck if d else static for d in dims])
        examples.append(mode.from_tensor(t, source=local_source(f"t{i}"), symbolic_context=context))
    for j, n in enumerate(sizes):
        source = local_source(f"t{len(tensors) + j}")
        examples.append(env.create_symintnode(env.create_symbol(n, source, duck), hint=n, source=source))
    return env, examples


def guard_check(env, examples):
    """A function of the call's arguments that holds exactly when every guard of env holds for them: their
    sizes, strides and storage offsets, static ones included (the compiled code assumes those too)."""
    code = env.produce_guards_expression(examples, ignore_static=False)
    if code is None:
        return _always
    body = re.sub(r"L\['t(\d+)'\]", r"a[\1]", code)
    return eval(f"lambda a: {body}", dict(_symbolic_shapes().SYMPY_INTERP))  # noqa: S307 (torch's own guard code)


def _symbolic_shapes():
    return importlib.import_module("torch.fx.experimental.symbolic_shapes")


# -- compiling in the background ---------------------------------------------------------------
# One daemon thread takes compiles from a queue, one at a time (Inductor compiles are not run
# concurrently; a process exiting does not wait for one).
_background: queue.Queue = queue.Queue()
_background_thread = None
_thread_lock = threading.Lock()  # not _compile_lock, which the thread holds while it compiles


def _start_background_thread() -> None:
    global _background_thread
    with _thread_lock:
        if _background_thread is None:
            _background_thread = threading.Thread(target=_compile_queued, name="thunderfn-inductor", daemon=True)
            _background_thread.start()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker, say) has no compile thread and inherits no lock holder: it
    starts its own on its first background compile, with an empty queue."""
    global _background, _background_thread, _thread_lock, _compile_lock
    _background, _background_thread, _thread_lock = queue.Queue(), None, threading.Lock()
    _compile_lock = threading.RLock()  # the parent's compile thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def _compile_queued() -> None:
    while True:
        region, *job = _background.get()  # (a CompiledRegion's or a SymbolicRegion's job)
        try:
            region.finish_background_compile(*job)
        finally:
            _background.task_done()


def wait_for_background_compiles() -> None:
    """Block until every queued background compile has finished (its region then runs compiled)."""
    _background.join()


def region_graph(region: Region) -> torch.fx.GraphModule:
    """The region as an FX graph: one call_function node per fused op, calling what the torch
    executor calls (the torch function a torch symbol mirrors, a prim's torch implementation).
    Its size symbols are placeholders after the tensors; a symbolic argument is a node computing
    it from them (its source, as the trace prints it)."""
    graph = torch.fx.Graph()
    env = {p.name: graph.placeholder(p.name) for p in region.inputs}
    symbols = {name: graph.placeholder(name) for name in region.size_names}
    computed = {}  # source of a symbolic argument -> its node

    def size_node(x):
        source = symbolic.python(x)
        if source in symbols:
            return symbols[source]
        if source not in computed:
            used = sorted(symbolic.symbols_in(x))
            computed[source] = graph.call_function(size_function(used, source), tuple(symbols[n] for n in used))
        return computed[source]

    def node_for(x):
        if isinstance(x, (torch.SymInt, torch.SymFloat)):  # (a float from sizes too: a count divided)
            return size_node(x)
        if isinstance(x, torch.Size):  # a leaf of the pytree: its sizes one by one (a view to (s1, s0, 192))
            return tuple(node_for(n) for n in x)
        return env[x.name] if isinstance(x, TensorProxy) else x

    for bsym in region.bsyms:
        args, kwargs = tree_map(node_for, (bsym.args, bsym.kwargs))
        _bind(env, graph, bsym.output, graph.call_function(bsym.sym.eager, tuple(args), dict(kwargs)))
    graph.output(tuple(env[p.name] for p in region.outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def size_function(names: list[str], source: str):
    """A function of the symbols `names` computing the size whose source is `source` ("2*s0")."""
    fn = eval(f"lambda {', '.join(names)}: {source}", symbolic.evaluation_namespace())  # noqa: S307 (our printer's)
    fn.__name__ = fn.__qualname__ = "size"
    fn.__module__ = __name__  # (FX names a node's function by its module)
    return fn


# -- region choices remembered in cache_dir -------------------------------------------------------------------
_CHOICE_FILE = "choice.json"


def _choice_folder(region: Region, layout) -> str | None:
    """The cache_dir folder (artifacts.write_entry's lookup) of a region's choice for one layout: named by a hash
    of its ops by name (not by object identity, as region_signature is), the layout, torch's version, the machine
    and its threads, and how choices are made; None where an op or argument is not named the same in another
    process."""
    try:
        ops = positional_signature(region, region.bsyms, _portable_name)
    except portable.NotPortable:
        return None
    if " at 0x" in ops:  # an argument printed by its address
        return None
    key = json.dumps([ops, repr(layout), torch.__version__, platform.machine(), platform.processor(),
                      os.cpu_count(), torch.get_num_threads(), FASTER_BY, TIMED_RUNS])
    return "region-choice-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def _portable_name(bsym) -> str:
    """The op's callable by a name another process finds it by: an aten call by its operator, a function by
    module and qualified name, a builtin (torch.sin) or method (torch.Tensor.add) by its owner and name."""
    fn = bsym.sym.eager
    found = getattr(fn, "__thunderfn_found_by__", None) or portable.where(fn)
    if found is None:
        module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
        owner = sys.modules.get(module) if isinstance(module, str) else getattr(fn, "__objclass__", None)
        owner_name = module if isinstance(module, str) else portable.where(owner)
        if owner_name is None or not isinstance(name, str) or getattr(owner, name, None) is not fn:
            raise portable.NotPortable(f"{fn!r} is not found by name")
        found = (owner_name, name)
    return repr(tuple(found))


def _remembered_choice(region: Region, layout) -> RegionChoice | None:
    """The choice an earlier process wrote to cache_dir for this region and layout, if any."""
    folder = _choice_folder(region, layout) if artifacts.directory() is not None else None
    for _, text in artifacts.read_entries(folder) if folder is not None else ():
        try:
            form = json.loads(text)
            return RegionChoice(form["fused"] is True, float(form["fused_ms"]), float(form["unfused_ms"]), True)
        except (ValueError, KeyError, TypeError):
            continue
    return None


def _remember_choice(region: Region, layout, choice: RegionChoice) -> None:
    folder = _choice_folder(region, layout) if artifacts.directory() is not None else None
    if folder is not None:
        text = json.dumps({"fused": choice.fused, "fused_ms": choice.fused_ms, "unfused_ms": choice.unfused_ms})
        artifacts.write_entry(folder, _CHOICE_FILE, text)


def region_signature(region: Region) -> str:
    """What the compiled code depends on besides the input layout: the torch calls, in order."""
    return positional_signature(region, region.bsyms, _callable_name)


def _callable_name(bsym) -> str:
    fn = bsym.sym.eager
    return f"{getattr(fn, '__qualname__', fn)!s}@{id(fn)}"


def _bind(env: dict, graph, out, node) -> None:
    if out is None:  # an output the op skips (convolution_backward's bias gradient without a bias)
        return
    if isinstance(out, TensorProxy):
        env[out.name] = node
        return
    for i, o in enumerate(out):
        _bind(env, graph, o, graph.call_function(operator.getitem, (node, i)))


def _tensor_outputs(out) -> bool:
    """A proxy, or tuples/lists of proxies and Nones (named tuples included): what an FX node's outputs can be
    indexed as."""
    if isinstance(out, TensorProxy):
        return True
    return isinstance(out, (tuple, list)) and len(out) > 0 and all(o is None or _tensor_outputs(o) for o in out)


def _availability() -> tuple[bool, str]:
    # find_spec, not import: torch._inductor takes seconds to import, and asking should be cheap (a
    # submodule's find_spec would import its package, so the file is looked for in the package's folder)
    try:
        spec = importlib.util.find_spec("torch._inductor")
        found = spec is not None and any(os.path.exists(os.path.join(folder, "compile_fx.py"))
                                         for folder in spec.submodule_search_locations or ())
    except (ImportError, ValueError) as e:
        return False, f"torch._inductor cannot be found ({e})"
    if not found:
        return False, f"this torch ({torch.__version__}) has no torch._inductor"
    compilers = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    if not any(shutil.which(c) for c in compilers if c):
        return False, "no C++ compiler on PATH (g++, c++, clang++ or $CXX): Inductor builds its CPU kernels with one"
    return True, ""


_triton = None


def _triton_imports() -> bool:
    """Inductor's CUDA kernels are Triton's: without it a CUDA region is left to torch."""
    global _triton
    if _triton is None:
        _triton = importlib.util.find_spec("triton") is not None
    return _triton


inductor_ex = InductorExecutor()
# the same, compiling each new region on a background thread while the first calls run unfused
inductor_background_ex = InductorExecutor("inductor_background", compile_in_background=True)
