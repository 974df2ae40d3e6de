"""Tracer: the state of one trace while it is being built, and the building itself.

A Trace (core/trace.py) is the program: its inputs, bound symbols, output and names. Building one needs
much more: where the next bound symbol goes (a decomposition's scope), which tensors the traced code
wrote in place and what each write left, the views to bring up to date after a write, the memory layout
eager would give a value, the caller's tensors behind the input proxies, the Python state to restore when
tracing ends. That is a Tracer's, made by `tracing(trc)` when trc starts being built and dropped when it
ends: a finished trace holds none of it (nor, through it, the caller's tensors).

`context.current_tracer()` is the innermost Tracer (`context.tracer_stack()` all of them, outermost
first); `context.current_trace()` its trace.

May import: the rest of core/ below trace.py, errors.py.
"""
from __future__ import annotations

import contextlib

import optree
import torch

from thunderfn.core import context, symbolic
from thunderfn.core.interception import TracingMode
from thunderfn.core.proxies import CAPTURED, DerivedOrigin, TensorProxy
from thunderfn.core.statements import check_inputs_do_not_alias, set_default_dtype, set_grad_enabled, write_back
from thunderfn.core.symbol import DecompositionUnavailable
from thunderfn.errors import ArgumentRuntimeError, ConcretizationError, InternalError, UnsupportedOpError


class Tracer:
    """The state of `trace` while it is being built (see the module docstring): what records into it
    (`record`, `emit`, `scope`), and the bookkeeping of in-place writes (`rebind`, `finish_mutations`),
    captured tensors (`constant`) and the caller's tensors (`real_tensor`, `rely_on_layout`).

    What the finished trace must still say is written into `trace` itself: its inputs and output, the
    write-backs, and the call-time facts (Trace.grad_reads, Trace.guards, Trace.layout_reads)."""

    def __init__(self, trace):
        self.trace = trace
        # where record and emit append: the trace's bound symbols, then one list per decomposition or
        # scope() being recorded, innermost last
        self._scopes: list[list] = [trace.bound_symbols]
        self.symbol_depth = 0  # symbols being recorded (0: user code, whose torch calls are traced)
        # The grad mode and default dtype the statements recorded so far run under: a switch the traced code
        # makes is recorded where it is first seen (sync_grad_mode)
        self.grad_enabled = torch.is_grad_enabled()
        self.default_dtype = torch.get_default_dtype()
        # the symbolic sizes of an outermost trace (core/symbolic.py): jit's open dimensions, or made when an op
        # first has a data-dependent size (trace.py's symbolic_sizes)
        self.sizes: symbolic.SymbolicInputs | None = None
        self.rng_at_start: tuple | None = None  # (seed, reseeds) when tracing began (trace.py's check_rng_untouched)
        self._constants: dict = {}  # id(captured tensor) -> (tensor, its proxy)
        self.created: dict[int, torch.Tensor] = {}  # tensors made at trace time (torch.tensor([...]))
        self.input_tensors: dict = {}  # input proxy name -> the caller's tensor it stands for
        self._inputs_by_proxy: dict = {}  # id(input proxy object) -> (its position, the caller's tensor)
        self.mutated: dict = {}  # id(live proxy) -> (frozen original, live proxy): inputs/captures written in place
        self.write_modes: dict = {}  # id(live proxy) -> the grad modes its in-place writes ran under
        self.versions: dict = {}  # id(live proxy) -> the names of the values its in-place writes left, in order
        self.rebound: set = set()  # id(proxy) of every proxy written in place (its name is its new value's)
        self.written_names: set = set()  # the names proxies had before their first write in place
        self.rebinds = 0  # in-place operations traced so far
        # view ops traced before the first in-place write, tracked when one happens (torch/inplace.py); None after
        self.views_to_track: list | None = []
        self.producers: dict = {}  # id(proxy) -> the top-level bound symbol that computed it (see `producer`)
        self.layouts: dict = {}  # id(proxy) -> (meta tensor laid out as eager would, facts), torch/inplace.py's
        # id(output) -> (output, input) for torch ops that returned an input unchanged at trace time;
        # eager may return it, a view of it or a copy (torch/__init__.py, torch/inplace.py)
        self.identities: dict = {}
        # Called as f(tracer, failed) when tracing ends, to undo or guard Python state the traced code
        # touched (torch/optim.py); finish_data holds their bookkeeping, by owner.
        self.finishers: list = []
        self.finish_data: dict = {}

    # -- recording --------------------------------------------------------------------
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
                raise data_dependent_error(e, f"{sym.print_name} asks", context.tracer_stack()[0]) from None
            raise
        finally:
            self.symbol_depth -= 1
        if no_decomposition:  # the next rung of the ladder (a torch symbol's: torch runs it as an opaque op)
            return sym.fallback(*args, **kwargs)
        if (not sym.is_prim and not subsymbols and "always_record" not in sym.tags
                and _only_passes_through(out, args, kwargs)):
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

    # -- the tensors behind the proxies ------------------------------------------------
    def add_input(self, proxy: TensorProxy, tensor: torch.Tensor) -> None:
        """proxy is the trace's next input, standing for the caller's tensor."""
        self._inputs_by_proxy[id(proxy)] = (len(self.trace.args), tensor)
        self.trace.args.append(proxy)
        self.input_tensors[proxy.name] = tensor

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
            proxy = TensorProxy(self.trace.names.take(prefix="c"), shape=tensor.shape, dtype=tensor.dtype,
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
            self.trace.layout_reads.setdefault(found[0], {})[(what, get)] = value
            return
        tensor, name = self.real_tensor(proxy), proxy.name
        self.trace.guards.append(lambda: None if get(tensor) == value else f"the captured tensor {name}'s {what} "
                                 f"was {value} when traced and is {get(tensor)} now")

    # -- in-place writes ---------------------------------------------------------------
    def rebind(self, proxy: TensorProxy, value: TensorProxy, *, because: str) -> None:
        """Make the proxy object user code holds denote `value` from now on: the
        functional form of an in-place operation (torch/inplace.py, which also marks
        the proxy's views stale). What was recorded before keeps the old value; an input
        or captured tensor rebound this way is written back when the function ends."""
        frozen = TensorProxy(proxy.name, shape=proxy.shape, dtype=proxy.dtype, device=proxy.device,
                             requires_grad=proxy.requires_grad, constant=proxy.constant, origin=proxy.origin)
        for scope in self._scopes:
            _replace_proxy(scope, proxy, frozen)
        trc = self.trace
        if any(a is proxy for a in trc.args) or proxy.constant is not None:
            self.mutated[id(proxy)] = (frozen, proxy)
        if id(proxy) in self.mutated:
            self._note_write_mode(proxy, because)
            self.versions.setdefault(id(proxy), []).append(value.name)
        trc.args = [frozen if a is proxy else a for a in trc.args]
        self.rebinds += 1
        if id(proxy) not in self.rebound:
            self.written_names.add(frozen.name)
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
                f"'{self.trace.fn_name}' writes into {_described_target(frozen)}, which requires grad, both under "
                f"grad mode and under torch.no_grad() ({because} is the second); thunderfn writes it back once, "
                f"under one mode. Make all in-place updates of that tensor under the same grad mode.")

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
        trc = self.trace
        if any(any(f is a for a in trc.args) for f, _ in self.mutated.values()):
            trc.bound_symbols.insert(0, check_inputs_do_not_alias.bind(*trc.args, output=None))
        live_to_frozen = {}
        for frozen, live in self.mutated.values():
            # the write-back runs under the grad mode of the writes it replays when that differs from the caller's
            # (mixed modes are refused above for tensors that require grad; for others only a value that
            # requires grad could tell the modes apart, and that takes grad mode)
            mode = any(self.write_modes.get(id(live), {self.grad_enabled}))
            # (versions: what the input held after each write, for core/passes.py's write_back_on_failure_pass)
            trc.bound_symbols.append(write_back.bind(frozen, live, None if mode == self.grad_enabled else mode,
                                                     output=None, versions=tuple(self.versions.get(id(live), ()))))
            live_to_frozen[id(live)] = frozen
        trc.output = optree.tree_map(lambda x: live_to_frozen.get(id(x), x), trc.output, none_is_leaf=True,
                                     namespace="thunderfn")


@contextlib.contextmanager
def tracing(trc, tracer: Tracer | None = None):
    """Make trc the trace being built, by a new Tracer (or `tracer`, trc's, to go on building it with the
    state it was left in); yields the Tracer. The outermost one also intercepts torch."""
    if tracer is None:
        tracer = Tracer(trc)
    elif tracer.trace is not trc:
        raise InternalError("tracing(trc, tracer): the tracer builds another trace")
    stack = context.tracer_stack()
    stack.append(tracer)
    try:
        if len(stack) == 1:
            with TracingMode():
                yield tracer
        else:
            yield tracer
    finally:
        stack.pop()


class FloatValueQuestion(ConcretizationError):
    """The traced code asked the value of a Python float jit traces as a value (`if lr > 0.1`, float(lr))."""


def data_dependent_error(e, who: str, root: Tracer, *, by_traced_code: bool = False) -> ConcretizationError:
    """torch's refusal to answer a question of a data-dependent size (e), as the ConcretizationError that says
    which size, what counts it and what to do. `who` asks: an op ("ltorch.reshape asks") or the traced code;
    root is the outermost tracer (whose sizes name the symbols)."""
    question, sizes = symbolic.data_dependent_question(e, root.sizes)
    floats = symbolic.numbers_asked(e, root.sizes)
    if floats:  # (an op's question of one: jit compiles with the floats' values instead; the code's own is refused)
        return (FloatValueQuestion if by_traced_code else ConcretizationError)(
            f"{who} {question} while tracing '{root.trace.fn_name}', where {floats}: jit traces a Python float "
            f"as a value once it has been called with a second value of it (dynamic=None), so its value is known "
            f"only when the compiled function runs and tracing cannot answer. Name the argument in static_argnums "
            f"or static_argnames to compile once per value, pass dynamic=False, or keep the computation in tensor "
            f"ops (torch.where).")
    return ConcretizationError(
        f"{who} {question} while tracing '{root.trace.fn_name}', where {sizes}: a size known only when the compiled "
        f"function runs, so tracing cannot answer (and no check before the call could). State what the code relies "
        f"on with torch._check (checked each time the compiled function runs), keep the computation in tensor ops "
        f"(torch.where, a mask), or branch outside the jitted function.")


def _described_target(p: TensorProxy) -> str:
    return f"{p.origin[0]} ({p.name})" if p.origin else p.name


def _inherit_origin(bsym) -> None:
    """Outputs come from where their inputs came from, so a ConcretizationError on
    `x.sum() > 0` can name argument 'x'."""
    parents = [p.origin for p in bsym.proxy_args() if p.origin]
    if parents:
        first = parents[0]
        origin = first if all(o is first for o in parents) else DerivedOrigin(parents)
        for p in bsym.proxy_outs():
            if not p.origin:
                p.origin = origin


def _only_passes_through(out, args, kwargs) -> bool:
    inputs = {id(x) for x in optree.tree_leaves((args, kwargs), none_is_leaf=True, namespace="thunderfn")
              if isinstance(x, TensorProxy)}
    return all(id(x) in inputs for x in optree.tree_leaves(out, none_is_leaf=True, namespace="thunderfn")
               if isinstance(x, TensorProxy))


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
