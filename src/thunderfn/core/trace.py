"""Trace: inputs, bound symbols, output. `str(trace)` is Python that runs.

`trace(fn, *args, **kwargs)` builds the computation trace of a function: tensors in
the argument pytrees become proxies named after the parameters they came from,
everything else is baked in as a constant, and every torch call is recorded.
A composite symbol called on real tensors runs by the same means (`_run_decomposition`).

May import: the rest of core/, errors.py.
"""
from __future__ import annotations

import contextlib
import inspect
import time
import types

import optree
import torch

from thunderfn.core import context, symbolic
from thunderfn.core.interception import TracingMode, lift_constants
from thunderfn.core.printing import compile_trace, format_trace
from thunderfn.core.proxies import CAPTURED, TensorProxy
from thunderfn.core.statements import check_inputs_do_not_alias, set_default_dtype, set_grad_enabled, write_back
from thunderfn.core.symbol import DecompositionUnavailable, Symbol, set_eager_composite
from thunderfn.core.pytree import adopt_torch_registrations, tree_flatten, tree_flatten_with_path, tree_unflatten
from thunderfn.errors import ArgumentRuntimeError, ConcretizationError, EscapedProxyError, UnsupportedOpError


class Trace:
    """A recorded program: the inputs, the bound symbols (statements) in order, and the output.

    What tf.trace returns and what tf.last_traces lists (one Trace per pass: the traced
    computation, then each transform's and the executors' result). The parts a user reads:
    `args` (the input TensorProxy objects, in call order), `bound_symbols` (a list of
    BoundSymbol), `output` (a pytree of proxies and constants) and `provenance` (which pass
    made it, printed on the first line). `str(trace)` is runnable Python source, the trace's
    debugging interface; `python_callable()` compiles it into a function of real tensors.
    Traces are built by tracing, not by hand.

        >>> import torch, thunderfn as tf
        >>> trc = tf.trace(lambda x: torch.cos(x).sum(), torch.ones(3))
        >>> trc.args, trc.output
        ([<TensorProxy name=x "cpu f32[3]">], <TensorProxy name=t1 "cpu f32[]">)
        >>> [str(bsym).splitlines()[0] for bsym in trc.bound_symbols]
        ['t0 = ltorch.cos(x)  # t0: "cpu f32[3]"', 't1 = ltorch.sum(t0)  # t1: "cpu f32[]"']
        >>> trc.python_callable()(torch.zeros(3))
        tensor(3.)
    """

    def __init__(self, fn_name: str = "computation", *, names: context.NamePool | None = None):
        self.fn_name = fn_name  # the traced function, named in error messages
        self.def_name = "computation"  # the function str(trace) defines
        # The function takes its arguments in one list, which it empties as it starts: then the caller
        # keeps no reference, and each tensor is freed at its `del` (a backward's residuals, so that
        # memory falls during the backward as in eager's)
        self.args_in_list = False
        # names of symbolic sizes (core/symbolic.py) the generated function takes after its tensors, for
        # sizes none of its inputs holds as a dimension (a backward's, given from the forward's inputs)
        self.size_args: list[str] = []
        # the symbolic sizes of an outermost trace (core/symbolic.py): jit's open dimensions, or made when an op
        # first has a data-dependent size (data_dependent_size)
        self.sizes: symbolic.SymbolicInputs | None = None
        self.args: list[TensorProxy] = []  # flat tensor inputs, in call order
        self.bound_symbols: list = []
        self.output = None
        self.provenance: str | None = None
        parent = context.current_trace()
        self.names = names if names is not None else (parent.names if parent is not None else context.NamePool())
        self._scopes: list[list] = [self.bound_symbols]
        self.symbol_depth = 0
        self._constants: dict[int, TensorProxy] = {}
        self.created: dict[int, torch.Tensor] = {}  # tensors made at trace time (torch.tensor([...]))
        self.grad_enabled = torch.is_grad_enabled()  # grad mode the recorded statements run under
        self.default_dtype = torch.get_default_dtype()  # and default dtype
        self.mutated: dict = {}  # id(live proxy) -> (frozen original, live proxy): inputs/captures written in place
        self.write_modes: dict = {}  # id(live proxy) -> the grad modes its in-place writes ran under
        self.versions: dict = {}  # id(live proxy) -> the names of the values its in-place writes left, in order
        self.rebound: set = set()  # id(proxy) of every proxy written in place (its name is its new value's)
        # view ops traced before the first in-place write, tracked when one happens (torch/inplace.py); None after
        self.views_to_track: list | None = []
        self.producers: dict = {}  # id(proxy) -> the top-level bound symbol that computed it (see `producer`)
        self.layouts: dict = {}  # id(proxy) -> (meta tensor laid out as eager would, facts), torch/inplace.py's
        self.rebinds = 0  # in-place operations traced so far
        # What the compiled function reads or checks when called (core/call_time.py): `.grad`s read while
        # tracing (key -> GradRead), and guards (callables returning why the trace went stale, or None).
        self.grad_reads: dict = {}
        self.guards: list = []
        self.input_tensors: dict = {}  # input proxy name -> the tensor it stands for, while tracing only
        self._inputs_by_proxy: dict = {}  # id(input proxy object) -> (its position, the tensor), while tracing only
        # Layout facts about input tensors the trace relies on (whether x.contiguous() is x or a copy):
        # position -> {(what, get): value}, checked by jit on every call with the cache key (cache_entry.py's CacheEntry)
        self.layout_reads: dict = {}
        # Called as f(trc, failed) when tracing ends, to undo or guard Python state the traced code
        # touched (torch/optim.py); finish_data holds their bookkeeping, by owner.
        self.finishers: list = []
        self.finish_data: dict = {}
        # id(output) -> (output, input) for torch ops that returned an input unchanged at trace time;
        # eager may return it, a view of it or a copy (torch/__init__.py, torch/inplace.py)
        self.identities: dict = {}

    # -- building -------------------------------------------------------------------
    def record(self, sym, args, kwargs):
        """Record a call of sym; returns its output proxies."""
        if not self.symbol_depth:
            self.sync_grad_mode()
        self.symbol_depth += 1
        no_decomposition = False
        try:
            if sym.is_prim:
                out, subsymbols = sym.meta(*args, **kwargs), ()
            else:
                self._scopes.append([])
                try:
                    out = sym.fn(*args, **kwargs)
                except DecompositionUnavailable:
                    if sym.fallback is None:
                        raise
                    no_decomposition = True
                finally:
                    subsymbols = tuple(self._scopes.pop())
        except Exception as e:
            if self.symbol_depth == 1 and symbolic.is_data_dependent_question(e):  # (the op the user called)
                raise data_dependent_error(e, f"{sym.print_name} asks", context.trace_stack()[0]) from None
            raise
        finally:
            self.symbol_depth -= 1
        if no_decomposition:  # the next rung of the ladder (a torch symbol's: torch runs it as an opaque op)
            return sym.fallback(*args, **kwargs)
        if not sym.is_prim and not subsymbols and "always_record" not in sym.tags and _only_passes_through(out, args, kwargs):
            # a composite that returned its input unchanged inside another's decomposition, where
            # nothing is visible to the user: no computation, so nothing to record. (At the top
            # level a torch symbol never gets here: eager may return the input, a view or a copy,
            # so it is recorded and torch decides at run time; see torch/__init__.py.)
            return out
        bsym = sym.bind(*args, output=out, subsymbols=subsymbols, **kwargs)
        _inherit_origin(bsym)
        self._scopes[-1].append(bsym)
        if not self.symbol_depth:
            self._note_producer(bsym)
        return out

    def sync_grad_mode(self) -> None:
        """Record a switch of torch's grad mode or default dtype made by the traced code
        (torch.no_grad() blocks, torch.set_default_dtype), so the compiled function switches
        at the same point on every call. (Autocast needs no switch: its casts are recorded op by op,
        torch/autocast.py.)"""
        enabled = torch.is_grad_enabled()
        if enabled != self.grad_enabled:
            self._scopes[-1].append(set_grad_enabled.bind(enabled, output=None))
            self.grad_enabled = enabled
        dtype = torch.get_default_dtype()
        if dtype != self.default_dtype:
            self._scopes[-1].append(set_default_dtype.bind(dtype, self.default_dtype, output=None))
            self.default_dtype = dtype

    def emit(self, bsym) -> None:
        self._scopes[-1].append(bsym)
        if not self.symbol_depth:
            self._note_producer(bsym)

    def _note_producer(self, bsym) -> None:
        for o in bsym.proxy_outs():
            self.producers[id(o)] = bsym

    def producer(self, proxy: TensorProxy):
        """The bound symbol recorded at the top level of this trace that computed proxy (None: an
        input, a constant, or a value made inside a decomposition)."""
        bsym = self.producers.get(id(proxy))
        return bsym if bsym is not None and any(o is proxy for o in bsym.proxy_outs()) else None

    @contextlib.contextmanager
    def scope(self):
        """Collect the bound symbols recorded inside the block instead of keeping them."""
        collected: list = []
        self._scopes.append(collected)
        try:
            yield collected
        finally:
            self._scopes.pop()

    def constant(self, tensor: torch.Tensor) -> TensorProxy:
        """The proxy for a captured tensor: one per tensor, and after an in-place op on
        it, the proxy now holding its current value. A tensor some proxy stands in for
        (a jitted module's parameters) is that proxy."""
        if context._local.stand_ins:
            proxy = context.stand_in(tensor)
            if proxy is not None:
                return proxy
        entry = self._constants.get(id(tensor))
        if entry is None or entry[0] is not tensor:
            proxy = TensorProxy(self.names.take(prefix="c"), shape=tensor.shape, dtype=tensor.dtype,
                                device=tensor.device, requires_grad=tensor.requires_grad, constant=tensor,
                                origin=CAPTURED)
            entry = self._constants[id(tensor)] = (tensor, proxy)
        return entry[1]

    def real_tensor(self, proxy: TensorProxy):
        """The tensor an input or captured proxy stands for, while tracing (whatever was written into
        it since: its memory layout is the tensor's); None for a value the traced code computed."""
        found = self._inputs_by_proxy.get(id(proxy))
        if found is not None:
            return found[1]
        for tensor, captured in self._constants.values():
            if captured is proxy:
                return tensor
        return None

    def rely_on_layout(self, proxy: TensorProxy, what: str, get, value) -> None:
        """The trace relies on `get(tensor) == value` for the tensor proxy stands for (`what` says it in
        words: "is_contiguous()"): a fact jit checks on every call of an input (a call where it differs
        compiles anew), and a guard of a captured tensor."""
        found = self._inputs_by_proxy.get(id(proxy))
        if found is not None:
            self.layout_reads.setdefault(found[0], {})[(what, get)] = value
            return
        tensor, name = self.real_tensor(proxy), proxy.name
        self.guards.append(lambda: None if get(tensor) == value else
                           f"the captured tensor {name}'s {what} was {value} when traced and is {get(tensor)} now")

    def rebind(self, proxy: TensorProxy, value: TensorProxy, *, because: str) -> None:
        """Make the proxy object user code holds denote `value` from now on: the
        functional form of an in-place operation (torch/inplace.py, which also marks
        the proxy's views stale). What was recorded before keeps the old value; an input
        or captured tensor rebound this way is written back when the function ends."""
        frozen = TensorProxy(proxy.name, shape=proxy.shape, dtype=proxy.dtype, device=proxy.device,
                             requires_grad=proxy.requires_grad, constant=proxy.constant, origin=proxy.origin)
        for scope in self._scopes:
            _replace_proxy(scope, proxy, frozen)
        if any(a is proxy for a in self.args) or proxy.constant is not None:
            self.mutated[id(proxy)] = (frozen, proxy)
        if id(proxy) in self.mutated:
            self._note_write_mode(proxy, because)
            self.versions.setdefault(id(proxy), []).append(value.name)
        self.args = [frozen if a is proxy else a for a in self.args]
        self.rebinds += 1
        self.rebound.add(id(proxy))
        # In eager an in-place op never makes a tensor stop requiring grad (a leaf written under no_grad stays one)
        proxy.name, proxy.requires_grad, proxy.constant, proxy.origin = (
            value.name, proxy.requires_grad or value.requires_grad, None, value.origin)

    def _note_write_mode(self, live: TensorProxy, because: str) -> None:
        """Remember the grad mode an input or captured tensor was written under: its write-back runs
        under the same mode, as eager's in-place op did (so an optimizer's `with torch.no_grad():
        p.sub_(...)` on a parameter is legal, and the same write under grad mode raises torch's error)."""
        frozen = self.mutated[id(live)][0]
        grad_enabled = torch.is_grad_enabled()
        captured = frozen.constant
        if grad_enabled and captured is not None and captured.requires_grad and captured.is_leaf:
            # torch's own error, raised where eager raises it (an input's is_leaf is not known while tracing:
            # its write-back raises this when it runs)
            raise ArgumentRuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        modes = self.write_modes.setdefault(id(live), set())
        modes.add(grad_enabled)
        if len(modes) > 1 and frozen.requires_grad:
            # One write-back cannot replay two modes: torch would record some of the writes and not others.
            raise UnsupportedOpError(
                f"'{self.fn_name}' writes into {_described_target(frozen)}, which requires grad, both under grad mode "
                f"and under torch.no_grad() ({because} is the second); thunderfn writes it back once, under one mode. "
                f"Make all in-place updates of that tensor under the same grad mode.")

    def written_without_grad(self, proxy: TensorProxy) -> bool:
        """Was proxy (an input or captured tensor that requires grad) written in place under no_grad?
        Reading it under grad mode afterwards must see a leaf holding the new value, which a
        functional trace cannot express (interception refuses it)."""
        return (proxy.requires_grad and id(proxy) in self.mutated and False in self.write_modes.get(id(proxy), ())
                and self.mutated[id(proxy)][0].requires_grad)

    def finish_mutations(self) -> None:
        """Write mutated inputs and captured tensors back (as eager would have mutated
        them), and return the caller's tensor wherever the function returned one."""
        if not self.mutated:
            return
        if any(any(f is a for a in self.args) for f, _ in self.mutated.values()):
            self.bound_symbols.insert(0, check_inputs_do_not_alias.bind(*self.args, output=None))
        live_to_frozen = {}
        for frozen, live in self.mutated.values():
            # the write-back runs under the grad mode of the writes it replays when that differs from the caller's
            # (mixed modes are refused above for tensors that require grad; for others only a value that
            # requires grad could tell the modes apart, and that takes grad mode)
            mode = any(self.write_modes.get(id(live), {self.grad_enabled}))
            # (versions: what the input held after each write, for core/passes.py's write_back_on_failure_pass)
            self.bound_symbols.append(write_back.bind(frozen, live, None if mode == self.grad_enabled else mode,
                                                      output=None, versions=tuple(self.versions.get(id(live), ()))))
            live_to_frozen[id(live)] = frozen
        self.output = optree.tree_map(lambda x: live_to_frozen.get(id(x), x), self.output, none_is_leaf=True,
                                      namespace="thunderfn")

    def derive(self, provenance: str, bound_symbols=None) -> "Trace":
        """A trace with the same inputs and outputs, built by a pass."""
        new = Trace(self.fn_name, names=self.names)
        new.def_name, new.args_in_list, new.size_args = self.def_name, self.args_in_list, self.size_args
        new.args, new.output = self.args, self.output
        new.bound_symbols = list(self.bound_symbols if bound_symbols is None else bound_symbols)
        new._scopes = [new.bound_symbols]
        new.provenance = provenance
        return new

    # -- reading --------------------------------------------------------------------
    def __str__(self) -> str:
        return format_trace(self)

    def __repr__(self) -> str:
        return str(self)

    def python_callable(self):
        """Compile str(self) once and return the function it defines."""
        return compile_trace(self)


def _described_target(p: TensorProxy) -> str:
    return f"{p.origin[0]} ({p.name})" if p.origin else p.name


def _inherit_origin(bsym) -> None:
    """Outputs come from where their inputs came from, so a ConcretizationError on
    `x.sum() > 0` can name argument 'x'."""
    origin = []
    for p in bsym.proxy_args():
        origin += [o for o in p.origin if o not in origin]
    if origin:
        for p in bsym.proxy_outs():
            if not p.origin:
                p.origin = tuple(origin)


@contextlib.contextmanager
def tracing(trc: Trace):
    """Make trc the trace being built; the outermost one also intercepts torch."""
    stack = context.trace_stack()
    stack.append(trc)
    try:
        if len(stack) == 1:
            with TracingMode():
                yield trc
        else:
            yield trc
    finally:
        stack.pop()


def _path_name(path) -> str | None:
    # `pair_0` for the first element of argument `pair`, params_fc1_weight for params["fc1.weight"];
    # the name pool makes any key a safe identifier (params["σ²"] -> params_sigma_2)
    return "_".join(str(p).replace(".", "_") for p in path) or None


def arg_paths(fn, args, kwargs) -> tuple:
    """Names for positional arguments taken from fn's signature, for readable traces."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    names = []
    for i in range(len(args)):
        if i < len(positional):
            names.append(positional[i].name)
        elif star is not None:  # f(a, *rest): rest_0, rest_1, ...
            names.append(f"{star}_{i - len(positional)}")
        else:
            names.append(f"arg{i}")
    return names


def proxify_inputs(trc: Trace, fn, args, kwargs):
    """Replace every tensor leaf of (args, kwargs) by a named input proxy of trc, with the symbolic
    dimensions jit opened for this trace (core/symbolic.py), if any."""
    names = arg_paths(fn, args, kwargs)
    open_dims = symbolic.current()
    paths, leaves, spec = tree_flatten_with_path((tuple(args), dict(kwargs)))
    new_leaves = []
    for path, leaf in zip(paths, leaves):
        if isinstance(leaf, torch.Tensor):
            top = names[path[1]] if path[0] == 0 else str(path[1])
            preferred = _path_name((top, *path[2:]))
            shape = leaf.shape
            if open_dims is not None:
                shape = open_dims.shape(len(trc.args), shape, f"argument '{preferred or top}'")
                trc.sizes = open_dims
            proxy = TensorProxy(trc.names.take(preferred, prefix="a"), shape=shape, dtype=leaf.dtype,
                                device=leaf.device, requires_grad=leaf.requires_grad,
                                origin=f"argument '{preferred or top}'")
            trc._inputs_by_proxy[id(proxy)] = (len(trc.args), leaf)
            trc.args.append(proxy)
            trc.input_tensors[proxy.name] = leaf
            new_leaves.append(proxy)
        else:
            new_leaves.append(leaf)
    p_args, p_kwargs = tree_unflatten(spec, new_leaves)
    return p_args, p_kwargs


def symbolic_sizes() -> symbolic.SymbolicInputs:
    """The symbolic sizes of the trace being built: its outermost trace's, made now where that one has none (a
    static compile meeting its first data-dependent size)."""
    root = context.trace_stack()[0]
    if root.sizes is None:
        root.sizes = symbolic.SymbolicInputs({})
    return root.sizes


def computation_key(proxy: TensorProxy, depth: int = 16):
    """A hashable key for what computed proxy: equal keys, equal values (the same pure ops, recorded at the top
    level of the traces being built, of the same inputs and numbers; anything else by its name). The memo of a
    data-dependent size: `x[x > 0]` twice counts one mask's elements, so both have one size u0."""
    producer = next((b for trc in reversed(context.trace_stack()) if (b := trc.producer(proxy)) is not None), None)
    if producer is None or depth == 0 or not _pure(producer):
        return proxy.name
    position = next(i for i, o in enumerate(producer.proxy_outs()) if o is proxy)
    leaves, spec = optree.tree_flatten((producer.args, producer.kwargs), none_is_leaf=True, namespace="thunderfn")
    try:
        return (producer.sym.id, position, spec, *(computation_key(x, depth - 1) if isinstance(x, TensorProxy) else
                                                   (type(x), x.hex() if type(x) is float else _hashed(x)) for x in leaves))
    except TypeError:  # (an argument with no value key: the proxy is its own)
        return proxy.name


def _hashed(x):
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return x.node.expr  # (hashing the number itself would guard it equal to this call's)
    if type(x) is slice:  # (unhashable before Python 3.12)
        return tuple(_hashed(v) for v in (x.start, x.stop, x.step))
    hash(x)
    return x


def _pure(bsym) -> bool:
    """Whether two calls of bsym on equal arguments compute equal values (no draw, no opaque op, no statement)."""
    return (bsym.sym.printer is None and not bsym.sym.tags & {"random", "opaque", "no_dce"}
            and all(_pure(s) for s in bsym.subsymbols))


def data_dependent_size(upper, described: str, memo=None) -> torch.SymInt:
    """A fresh data-dependent size for the trace being built (symbolic.SymbolicInputs.unbacked_size)."""
    return symbolic_sizes().unbacked_size(upper, described, memo)


def data_dependent_error(e, who: str, root: Trace) -> ConcretizationError:
    """torch's refusal to answer a question of a data-dependent size (e), as the ConcretizationError that says
    which size, what counts it and what to do. `who` asks: an op ("ltorch.reshape asks") or the traced code;
    root is the outermost trace being built (whose sizes name the symbols)."""
    question, sizes = symbolic.data_dependent_question(e, root.sizes)
    return ConcretizationError(
        f"{who} {question} while tracing '{root.fn_name}', where {sizes}: a size known only when the compiled function "
        f"runs, so tracing cannot answer (and no check before the call could). State what the code relies on with "
        f"torch._check (checked each time the compiled function runs), keep the computation in tensor ops "
        f"(torch.where, a mask), or branch outside the jitted function.")


def _lift_output(trc: Trace, x):
    if isinstance(x, torch.Tensor) and trc.created.get(id(x)) is x:
        # made once at trace time but a new tensor on every eager call: returning the one
        # object would let a caller's in-place update leak into later calls
        return x.clone()
    return lift_constants(x)


def _rng_fingerprint() -> tuple:
    return torch.initial_seed(), context.rng_reseeds()


def _reseeded_by_tracing(start: tuple) -> bool:
    """Whether the code being traced reseeded the default generator behind the recording
    wrappers (torch.default_generator.manual_seed(s) or .set_state(...) called directly).
    The seeding functions themselves are recorded, not run (torch/random.py), and other
    threads' draws do not change the seed; a seed change while no other code reseeded
    through torch's functions (the count) can only come from this thread."""
    seed, reseeds = start
    return torch.initial_seed() != seed and context.rng_reseeds() == reseeds


def check_rng_untouched(op_name: str) -> None:
    """Called when a random op is recorded: if the traced code reseeded the generator
    directly (even inside freeze_rng_state, which restores it afterwards), the compiled
    function would draw different numbers than eager: refuse."""
    root = context.trace_stack()[0]
    start = getattr(root, "rng_at_start", None)
    if start is not None and _reseeded_by_tracing(start):
        raise UnsupportedOpError(
            f"{op_name} draws random numbers after '{root.fn_name}' reseeded torch's generator while being traced "
            f"(a generator's own manual_seed or set_state). Tracing runs the Python once, so the compiled "
            f"function would not reseed on later calls. Use torch.manual_seed / torch.set_rng_state (recorded "
            f"and replayed), or seed outside the jitted function.")


def stamp_provenance(trc: Trace, name: str, start: int) -> Trace:
    """trc marked as made by `name`, which started at perf_counter_ns() `start` (printed atop it)."""
    trc.provenance = f"Constructed by {name} (took {(time.perf_counter_ns() - start) / 1e6:.2f} milliseconds)"
    return trc


def _unbound_tensor_method(e: TypeError, fn_name: str) -> UnsupportedOpError:
    """torch.Tensor.cfloat(x) and other torch.Tensor methods called through the class check in C
    that x is a real tensor, before any hook can see the call: the method form does work."""
    method = str(e).split("'")[1] if "'" in str(e) else "the method"
    return UnsupportedOpError(
        f"'{fn_name}' calls torch.Tensor.{method}(x, ...) through the class with a traced tensor; torch checks in C "
        f"that x is a real tensor before thunderfn can see the call. Call it as a method, x.{method}(...), or through "
        f"torch.* ({e})")


def trace(fn, /, *args, **kwargs) -> Trace:
    """The computation trace of fn applied to these arguments (like jax.make_jaxpr): a Trace.

    Tensors anywhere in the argument pytrees (positional and keyword) become the trace's
    inputs, TensorProxy objects with their shapes, dtypes and devices; other values (numbers,
    strings, None) are baked in as constants. fn runs once, on proxies, and each torch call it
    makes is recorded as a bound symbol of the torch language (`ltorch`), whose decomposition
    into prims prints indented below it. Nothing is computed and nothing is compiled: this is
    the trace tf.jit starts from, before transforms and executors (see tf.last_traces for
    the traces a jitted function runs). Printed, the trace is the Python function it stands for.

        >>> import torch, thunderfn as tf
        >>> trc = tf.trace(lambda x, n: torch.sin(x) * n, torch.ones(2, 3), 2.0)
        >>> print(trc)
        # Constructed by Tracing (took ... milliseconds)
        import thunderfn.torch as ltorch
        <BLANKLINE>
        def computation(x):
          # x: "cpu f32[2, 3]"
          t0 = ltorch.sin(x)  # t0: "cpu f32[2, 3]"
            # t0 = prims.sin(x)  # t0: "cpu f32[2, 3]"
          t1 = ltorch.mul(t0, 2.0)  # t1: "cpu f32[2, 3]"
            # t1 = prims.mul(t0, 2.0)  # t1: "cpu f32[2, 3]"
          return t1
        >>> [bsym.sym.name for bsym in trc.bound_symbols]
        ['sin', 'mul']
    """
    start = time.perf_counter_ns()
    trc = Trace(getattr(fn, "__name__", "computation"))
    rng_before = trc.rng_at_start = _rng_fingerprint()
    try:
        with tracing(trc):
            p_args, p_kwargs = proxify_inputs(trc, fn, args, kwargs)
            # what fn receives, flattened again: a registered unflatten may build new leaves from the proxies
            given, given_spec = tree_flatten((p_args, p_kwargs))
            out = up_to_date(fn(*p_args, **p_kwargs))
            _refuse_changed_containers(trc.fn_name, given, given_spec, (p_args, p_kwargs))
            adopt_torch_registrations()  # a container type registered with torch while fn ran
            trc.output = optree.tree_map(lambda x: _lift_output(trc, x), out, none_is_leaf=True, namespace="thunderfn")
            _refuse_escaping_proxies(trc.output, trc.fn_name)
            if trc.rebinds:
                _refuse_unknowable_outputs(trc.output)
            trc.sync_grad_mode()  # back to the caller's mode if the function switched it
            trc.finish_mutations()
    except BaseException as e:
        for finish in trc.finishers:
            finish(trc, True)
        if isinstance(e, TypeError) and "TensorProxy" in str(e) and "descriptor" in str(e):
            raise _unbound_tensor_method(e, trc.fn_name) from None
        if symbolic.is_data_dependent_question(e):  # (asked by the traced code itself: an `if`, int(n), range(n))
            raise data_dependent_error(e, f"'{trc.fn_name}' asks", (context.trace_stack() or [trc])[0]) from None
        raise
    finally:
        trc.input_tensors, trc._inputs_by_proxy = {}, {}  # the trace must not keep the caller's tensors alive
    for finish in trc.finishers:
        finish(trc, False)
    if _reseeded_by_tracing(rng_before):
        # a generator's own methods are C: neither torch-function hooks nor torch/random.py's wrappers see them
        raise UnsupportedOpError(
            f"'{trc.fn_name}' changed torch's random number generator while being traced (a generator's own "
            f"manual_seed, seed or set_state). Tracing runs the Python once, so the compiled function would not do "
            f"it again on later calls. Use torch.manual_seed / torch.set_rng_state (recorded and replayed), or seed "
            f"outside the jitted function.")
    return stamp_provenance(trc, "Tracing", start)


def _run_decomposition(sym: Symbol, args, kwargs):
    """A composite called on real tensors: its body is written for proxies (clang checks
    for them), so trace it on proxies of the arguments and run the recorded prims eagerly."""
    tensors = [x for x in optree.tree_leaves((tuple(args), dict(kwargs)), namespace="thunderfn")
               if isinstance(x, torch.Tensor)]
    trc = trace(sym, *args, **kwargs)
    env = {p.name: t for p, t in zip(trc.args, tensors)}

    def value(x):
        if isinstance(x, TensorProxy):
            return x.constant if x.constant is not None else env[x.name]
        return x

    def run(bsyms):
        for bsym in bsyms:
            if bsym.sym.is_prim:
                args_, kwargs_ = optree.tree_map(value, (bsym.args, bsym.kwargs), none_is_leaf=True, namespace="thunderfn")
                result = bsym.sym(*args_, **kwargs_)
                outs = optree.tree_leaves(bsym.output, none_is_leaf=True, namespace="thunderfn")
                results = optree.tree_leaves(result, none_is_leaf=True, namespace="thunderfn")
                env.update((o.name, r) for o, r in zip(outs, results) if isinstance(o, TensorProxy))
            else:
                run(bsym.subsymbols)

    run(trc.bound_symbols)
    return optree.tree_map(value, trc.output, none_is_leaf=True, namespace="thunderfn")


set_eager_composite(_run_decomposition)


def timed_pass(name: str, fn, trc: Trace, /, *args, **kwargs) -> Trace:
    start = time.perf_counter_ns()
    new = fn(trc, *args, **kwargs)
    if new is not trc:  # a pass that changes nothing returns its input, whose provenance stays
        stamp_provenance(new, name, start)
    return new


def _only_passes_through(out, args, kwargs) -> bool:
    inputs = {id(x) for x in optree.tree_leaves((args, kwargs), none_is_leaf=True, namespace="thunderfn")
              if isinstance(x, TensorProxy)}
    return all(id(x) in inputs for x in optree.tree_leaves(out, none_is_leaf=True, namespace="thunderfn")
               if isinstance(x, TensorProxy))


def _refuse_changed_containers(fn_name: str, given, given_spec, now) -> None:
    """fn put something new into a list, dict or object it was passed (`xs.append(y)`,
    `cache.layers[0].keys = ...`). Eager changes the caller's container; the traced function
    changed a copy made for tracing, and the compiled one would not do it at all: refused."""
    leaves, spec = tree_flatten(now)
    if spec == given_spec and all(a is b for a, b in zip(leaves, given)):
        return
    where = ""
    if spec == given_spec:  # an element replaced: say which
        paths = tree_flatten_with_path(now)[0]
        path = next(p for p, a, b in zip(paths, leaves, given) if a is not b)
        where = " (" + ("args" if path[0] == 0 else "kwargs") + "".join(f"[{k!r}]" for k in path[1:]) + ")"
    raise UnsupportedOpError(
        f"'{fn_name}' changed a container it was passed{where}: it added, removed or replaced an element of a list, "
        f"dict or other pytree argument. Eager would change the caller's object; a compiled function cannot (it "
        f"only returns values). Return the new values instead of storing them into an argument, or call the "
        f"function outside tf.jit.")


_OPAQUE_LEAVES = (TensorProxy, torch.Tensor, int, float, complex, bool, str, bytes, type(None), torch.dtype,
                  torch.device, torch.Size, type, types.FunctionType, types.BuiltinFunctionType, torch.nn.Module)


def _refuse_escaping_proxies(output, fn_name: str) -> None:
    """An output leaf that is an object holding traced tensors (an unregistered dataclass, a
    cache object) would hand the caller placeholders where eager hands tensors: refused, with
    the type to register."""
    for leaf in optree.tree_leaves(output, none_is_leaf=True, namespace="thunderfn"):
        if isinstance(leaf, _OPAQUE_LEAVES):
            continue
        where = _find_proxy(leaf, type(leaf).__name__, set())
        if where is not None:
            cls = type(leaf)
            raise EscapedProxyError(
                f"'{fn_name}' returns a {cls.__module__}.{cls.__qualname__} holding a traced tensor ({where}), but "
                f"thunderfn cannot see inside a {cls.__qualname__}: the compiled function could not put the real "
                f"tensor back. Register the type as a pytree container, with tf.register_pytree_node({cls.__qualname__}, "
                f"flatten, unflatten) or torch.utils._pytree.register_pytree_node, or return its tensors instead.")


def _find_proxy(obj, where: str, seen: set, depth: int = 0) -> str | None:
    """A path from obj to a TensorProxy it holds (attributes, slots and plain containers,
    a few levels deep), or None."""
    if isinstance(obj, TensorProxy):
        return where
    if depth > 4 or id(obj) in seen or isinstance(obj, _OPAQUE_LEAVES):
        return None
    seen.add(id(obj))
    if isinstance(obj, dict):
        children = [(f"{where}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = [(f"{where}[{i}]", v) for i, v in enumerate(obj)]
    else:
        attrs = dict(getattr(obj, "__dict__", {}))
        for slot in getattr(type(obj), "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                attrs[slot] = getattr(obj, slot)
        children = [(f"{where}.{k}", v) for k, v in attrs.items()]
    for path, child in children[:1000]:
        found = _find_proxy(child, path, seen, depth + 1)
        if found is not None:
            return found
    return None


def up_to_date(tree):
    """tree, with each view among its proxies brought up to date: a view whose base was written in
    place after the view's value was computed is recomputed when read (torch/inplace.py keeps the
    views, as `proxy.alias`, and says how); called on what traced code returns to a transform."""
    if context.current_trace().rebinds:
        for p in optree.tree_leaves(tree, namespace="thunderfn"):
            if isinstance(p, TensorProxy) and p.alias is not None:
                p.alias.refresh(p)
    return tree


def _refuse_unknowable_outputs(output) -> None:
    """An output whose value after an in-place write depends on memory layout at run time
    (x returned after x.contiguous().add_(1): torch/inplace.py says why) is refused."""
    for p in optree.tree_leaves(output, namespace="thunderfn"):
        if isinstance(p, TensorProxy) and p.alias is not None and p.alias.stale_message:
            raise UnsupportedOpError(p.alias.stale_message)


def _replace_proxy(bsyms: list, old: TensorProxy, new: TensorProxy) -> None:
    """Replace the object `old` by `new` in recorded bound symbols, in place."""
    def swap(tree):
        return optree.tree_map(lambda x: new if x is old else x, tree, none_is_leaf=True, namespace="thunderfn")

    for bsym in bsyms:
        leaves = optree.tree_leaves((bsym.args, bsym.kwargs, bsym.output), none_is_leaf=True, namespace="thunderfn")
        if any(x is old for x in leaves):
            bsym.args, bsym.kwargs, bsym.output = swap(bsym.args), swap(bsym.kwargs), swap(bsym.output)
        if bsym.subsymbols:
            subs = list(bsym.subsymbols)
            _replace_proxy(subs, old, new)
            bsym.subsymbols = tuple(subs)
