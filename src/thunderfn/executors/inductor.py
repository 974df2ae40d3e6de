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
ops unfused.

Not a default executor: a first call pays seconds of compilation per region (see
docs/executors.md). Ask for it with `tf.jit(fn, executors=["inductor"])`.
"""
from __future__ import annotations

import importlib.util
import operator
import os
import queue
import shutil
import threading
import warnings

import torch
import torch.fx

from thunderfn.core import artifacts, progress
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_map
from thunderfn.executors.fusion import CompiledCache, FusionExecutor, Region, positional_signature

# compiled functions shared by every region with the same ops and input layout; one compile at a
# time (threads calling the same new region wait for its compile instead of compiling it again)
_compiled = CompiledCache()
_compile_lock = threading.RLock()


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list):
    """Inductor's compiled function for gm (called with tensors like example_inputs)."""
    # torch._inductor is heavy (seconds to import) and only this executor needs it: imported on first compile
    from torch._inductor.compile_fx import compile_fx
    return compile_fx(gm, example_inputs)


class InductorExecutor(FusionExecutor):
    """`compile_in_background`: a region's first call with a new layout runs its ops unfused and
    queues the compile on a background thread; calls after the compile lands run the compiled
    function. The first call then costs what an unfused one does instead of seconds, at the price
    of results that depend on timing (fused and unfused code round differently)."""

    absorbs_traceable_operators = True  # attention kernels become Inductor's extern calls, as under torch.compile

    def __init__(self, name: str = "inductor", *, compile_in_background: bool = False):
        super().__init__(name, torch.__version__)
        self._availability = None
        self.compile_in_background = compile_in_background

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
        return CompiledRegion(region, background=self.compile_in_background)


class CompiledRegion:
    """A region's callable: Inductor's compiled function for the layout of the inputs it is
    called with, compiled on the first call with that layout."""

    def __init__(self, region: Region, *, background: bool = False):
        self.region = region
        self.signature = region_signature(region)
        self.by_layout: dict = {}
        self.background = background
        # The last call's grad mode and strides, and the function its layout ran: a region belongs to one
        # compiled trace, whose cache key fixes its inputs' shapes, dtypes, devices and requires_grad (given
        # the grad mode), so only strides can differ between its calls. Checking those alone costs a
        # quarter of the whole layout on a region of many inputs.
        self.last_strides, self.last_fn = None, None

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
        if fn is None:
            progress.stage(f"Inductor compiling fusion region {self.region.name} ({len(self.region.bsyms)} ops)")
            artifacts.point_kernel_caches()
            try:
                with warnings.catch_warnings():  # Inductor's own chatter (deprecations inside torch) is not the user's
                    warnings.simplefilter("ignore")
                    fn = compile_graph(region_graph(self.region), list(example_inputs))
                if run:
                    result = fn(*example_inputs)
            except Exception as e:  # any failure inside Inductor: run the ops unfused instead
                fn = self.fall_back(e)
                result = fn(*example_inputs) if run else None
            _compiled.keep(key, fn)
        return fn, result

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
        region, *job = _background.get()
        try:
            region.finish_background_compile(*job)
        finally:
            _background.task_done()


def wait_for_background_compiles() -> None:
    """Block until every queued background compile has finished (its region then runs compiled)."""
    _background.join()


def region_graph(region: Region) -> torch.fx.GraphModule:
    """The region as an FX graph: one call_function node per fused op, calling what the torch
    executor calls (the torch function a torch symbol mirrors, a prim's torch implementation)."""
    graph = torch.fx.Graph()
    env = {p.name: graph.placeholder(p.name) for p in region.inputs}

    def node_for(x):
        return env[x.name] if isinstance(x, TensorProxy) else x

    for bsym in region.bsyms:
        args, kwargs = tree_map(node_for, (bsym.args, bsym.kwargs))
        _bind(env, graph, bsym.output, graph.call_function(bsym.sym.eager, tuple(args), dict(kwargs)))
    graph.output(tuple(env[p.name] for p in region.outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


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
