"""Symbolic dimensions: one trace for every size of a dimension (dynamic shapes).

A dimension jit decides to leave open (jit.py: `dynamic=`, `tf.mark_dynamic`) enters the
trace as a `torch.SymInt` of torch's own `ShapeEnv` (torch.fx.experimental.symbolic_shapes),
the machinery torch.compile guards with: sizes computed from it are SymInts too (`2*s0`,
`s0 // 2`), and wherever traced code asks a question of one (`if x.shape[1] > 128`, a
broadcast's `a == b`, a reshape's divisibility), the ShapeEnv answers from the size this
call has and records the answer as a guard. A compiled entry checks those guards on every
call (`guard_code`); a call that breaks one compiles anew, it never runs a trace whose
decisions do not hold for it. `int(s)` and `range(s)` specialize the size (guarded equal).

Code reading shapes may meet a SymInt wherever it met an int (`is_int`); a decision made only
for speed (a heuristic, never a result) reads the size this call has without guarding (`hint`).

Generated code binds each symbol it uses from an input's shape (`s0 = x.shape[1]`, printed
first in the function: where the symbol comes from) or from a trailing size parameter where
no input holds it bare (a backward given the forward's sizes).

Data-dependent sizes (torch.compile's unbacked SymInts): an op whose output size depends on tensor
values (nonzero, a boolean mask's index, unique) gives it a fresh symbol `u0` (`unbacked_size`),
with only the facts its op guarantees (0 <= u0 <= the input's numel). Generated code binds it from
the op's output right after the op runs (`u0 = t5.shape[0]`), so later ops compute with it. A
question whose answer needs its value (`if n > 0`, `int(n)`, a broadcast against another size) cannot
be answered while tracing and is never a guard: the trace reports it as a ConcretizationError
(`DataDependentQuestion` tells it apart). `torch._check(n > 0)` states a fact instead: the ShapeEnv
takes it as known, and generated code checks it where the op has run (`runtime_checks`). A static
compile has no ShapeEnv until its first data-dependent size makes one (`SymbolicInputs({})`).

Imported by the core; torch's symbolic_shapes is imported on the first dynamic compile or data-dependent
size (with sympy: half a second to a second, once per process), never otherwise. torch._dynamo, which a ShapeEnv
would import for three things (its validator module's question whether translation validation is on, the
Source types of guards, and the metadata of the process's first structured-trace record), is not: each is
answered without it (_shape_env, _input_source and _guards_expression, _without_lazy_trace_handler), which
took a small function's first symbolic compile from 3.4 s to under 1 s on 2 cores.
May import: errors.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import logging
import numbers
import os
import re
import sys
import threading
import weakref

import torch

from thunderfn.errors import InternalError

INT_TYPES = (int, torch.SymInt)  # what a size may be while tracing
NUMBER_TYPES = (numbers.Number, torch.SymInt, torch.SymFloat)  # a Python number, or one computed from sizes


def is_int(x) -> bool:
    """An int or a symbolic size (not a bool)."""
    return isinstance(x, INT_TYPES) and not isinstance(x, bool)


def _format_number(self, spec: str) -> str:
    # torch.SymFloat has no __format__: object's printed the symbol's name (f"{lr}" gave "zuf0") where the program
    # formats a number. Formatting asks the value, as float() does: the value where torch knows it, and for a float
    # jit traces as a value, the ConcretizationError that names static_argnums (never a silent wrong string).
    return format(float(self), spec)


if "__format__" not in vars(torch.SymFloat):
    torch.SymFloat.__format__ = _format_number


def is_symbolic(x) -> bool:
    return isinstance(x, torch.SymInt)


# What a data-dependent size counts as where only a heuristic reads it (torch's unbacked_symint_fallback)
UNBACKED_HINT = 8192


def hint(x):
    """The size this compile's call has, without recording a guard: for heuristics only (a data-dependent
    size, which this call does not know yet, counts as UNBACKED_HINT, within the range known for it)."""
    if isinstance(x, torch.SymInt):
        if x.node.hint is not None:
            return x.node.hint
        return x.node.shape_env.optimization_hint(x.node.expr, fallback=UNBACKED_HINT)
    return x


def hints(shape) -> tuple:
    return tuple(hint(s) for s in shape)


def has_symbols(tree) -> bool:
    """Whether a value (an argument of a recorded call: nested lists, tuples, dicts) holds a SymInt or a number
    computed from one (a SymFloat: a mean's count divided)."""
    if isinstance(tree, (torch.SymInt, torch.SymFloat)):
        return True
    if isinstance(tree, (list, tuple, torch.Size)):
        return any(has_symbols(x) for x in tree)
    if isinstance(tree, dict):
        return any(has_symbols(x) for x in tree.values())
    return False


def symbolic_leaves(tree) -> list:
    """The SymInts (and SymFloats) a value (nested lists, tuples, dicts) holds, in order."""
    if isinstance(tree, (torch.SymInt, torch.SymFloat)):
        return [tree]
    if isinstance(tree, (list, tuple, torch.Size)):
        return [s for x in tree for s in symbolic_leaves(x)]
    if isinstance(tree, dict):
        return [s for x in tree.values() for s in symbolic_leaves(x)]
    return []


def product(shape):
    """The number of elements of a shape, symbolic where the shape is (torch.Size.numel specializes)."""
    n = 1
    for s in shape:
        n = n * s
    return n


def expands_to(n, target) -> bool:
    """Whether a size n broadcasts to target (n == 1 or n == target), asking a symbolic size only what the
    answer needs: a static 1 or the same symbol first, so expanding a 1 to s0 does not guard s0 != 1."""
    if n is target or _static_one(n):
        return True
    return n == target or n == 1


def broadcastable(x, y) -> bool:
    """Whether two sizes broadcast together, in the same order of questions as expands_to."""
    if x is y or _static_one(x) or _static_one(y):
        return True
    return x == y or x == 1 or y == 1


def broadcast_size(x, y):
    """The size two broadcastable sizes broadcast to (see broadcastable)."""
    if x is y or _static_one(y):
        return x
    if _static_one(x):
        return y
    if x == y:  # (the same expression computed twice: answered without a guard)
        return x
    return y if x == 1 else x


def broadcast_dims(from_shape, to_shape) -> tuple:
    """The dimensions of from_shape that broadcasting to_shape made (the leading ones, and those where
    to_shape has a 1 that was expanded): what a gradient sums over to return to to_shape. A static 1 is
    summed over whatever the size it was expanded to (summing a size-1 dimension changes nothing), so a
    symbolic size is not guarded to differ from 1."""
    lead = len(from_shape) - len(to_shape)
    return tuple(range(lead)) + tuple(lead + i for i, n in enumerate(to_shape) if was_expanded(n, from_shape[lead + i]))


def was_expanded(n, m) -> bool:
    """Whether a size n broadcast to m was a 1 expanded (what a gradient sums over), asking a symbolic size only
    what the answer needs: a static 1 counts as expanded whatever m is (summing a size-1 dimension changes
    nothing), so expanding a bias's 1 to s0 does not guard s0 != 1."""
    if n is m or _static_one(m) or known_equal(n, m):
        return False
    return _static_one(n) or n == 1 and m != 1


def same_shape(a, b) -> bool:
    """Whether two shapes are provably the same, without guarding: for "is this reshape a no-op" questions,
    whose other answer (reshape anyway) is right too. A symbolic size equals a number or another symbolic
    size only where the ShapeEnv knows it already; asking would guard this trace to sizes that differ."""
    a, b = tuple(a), tuple(b)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is y:
            continue
        if type(x) is int and type(y) is int:
            if x != y:
                return False
        elif not _shapes().statically_known_true(x == y):
            return False
    return True


def known_equal(x, y) -> bool:
    """Whether two sizes are the same without guarding (the same expression computed twice; equal ints)."""
    if type(x) is int and type(y) is int:
        return x == y
    return _shapes().statically_known_true(x == y)


def is_size(n) -> bool:
    """Whether n is an input's symbolic size itself (a symbol, never negative): asked nothing about its sign."""
    return isinstance(n, torch.SymInt) and n.node.expr.is_Symbol


def is_minus_one(n) -> bool:
    """Whether a requested size is -1 (infer it): a literal -1, or a computed size that is (guarded); an input's
    size never is, and is not asked (each question of a symbolic size costs the ShapeEnv a solve)."""
    if type(n) is int:
        return n == -1
    return not is_size(n) and n == -1


def _static_one(n) -> bool:
    return type(n) is int and n == 1


def slice_indices(k: slice, n) -> tuple:
    """slice.indices(n) where n or the bounds may be symbolic: Python's clamping, each comparison a guard
    only where a symbolic size takes part (slice.indices itself would specialize n)."""
    if not any(isinstance(v, torch.SymInt) for v in (k.start, k.stop, k.step, n)):
        return k.indices(n)
    step = 1 if k.step is None else k.step
    if step > 0:
        start = 0 if k.start is None else _clamped(k.start, n, 0, n)
        stop = n if k.stop is None else _clamped(k.stop, n, 0, n)
    else:
        start = n - 1 if k.start is None else _clamped(k.start, n, -1, n - 1)
        stop = -1 if k.stop is None else _clamped(k.stop, n, -1, n - 1)
    return start, stop, step


def _clamped(i, n, low, high):
    if i < 0:
        i = i + n
        return low if i < low else i
    return high if i > high else i


def is_unbacked(x) -> bool:
    """Whether x is a size (or a number computed from sizes) that depends on a data-dependent size."""
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) and bool(
        _shapes().free_unbacked_symbols(x.node.expr))


def has_unbacked(tree) -> bool:
    """Whether a value (a shape, an op's arguments: nested lists, tuples, dicts) holds a data-dependent size."""
    return any(is_unbacked(s) for s in symbolic_leaves(tree))


def unbacked_names(tree) -> set[str]:
    """The printed names of the data-dependent sizes a value's SymInts use."""
    names = set()
    for s in symbolic_leaves(tree):
        inputs = inputs_of(s)
        if inputs is not None and inputs.unbacked:  # (most compiles have none: asked nothing)
            names |= {inputs.names.get(u, str(u)) for u in _shapes().free_unbacked_symbols(s.node.expr)}
    return names


def holds(condition) -> bool:
    """Whether a condition on sizes holds, for a shortcut whose other path is right too (`numel == 0`: an
    empty-tensor shortcut). Of static and input sizes it is asked as any question is (guarded); of a
    data-dependent size it is true only where the ShapeEnv knows it for every value the size may take,
    never asked (it may be 0 or 1 at run time, or not), so the op takes the path right for every size."""
    if isinstance(condition, bool):
        return condition
    if isinstance(condition, torch.SymBool) and _shapes().free_unbacked_symbols(condition.node.expr):
        return _shapes().statically_known_true(condition)
    return bool(condition)


def is_data_dependent_question(e: BaseException) -> bool:
    """Whether e is torch's refusal to answer a question about a data-dependent size (while tracing)."""
    return isinstance(e, _shapes().GuardOnDataDependentSymNode)


def data_dependent_question(e, inputs: SymbolicInputs | None) -> tuple[str, str]:
    """(the question torch refused to answer (e: its GuardOnDataDependentSymNode), in the names of the trace whose
    sizes are `inputs`: "whether u0 > 0", "the value of u0"; what each data-dependent size in it counts)."""
    expr = e.cond
    if inputs is not None and not expr.free_symbols <= inputs.names.keys():
        inputs = None
    printed = python(expr, inputs) if inputs is not None else str(expr)
    question = (f"the value of {printed}" if getattr(expr, "is_integer", False) or getattr(expr, "is_Symbol", False)
                else f"whether {printed}")
    if inputs is None:
        return question, "a size depends on tensor values"
    counts = [f"{inputs.names[u]} is {inputs.unbacked[inputs.names[u]]}" for u in
              sorted(_shapes().free_unbacked_symbols(expr), key=str) if inputs.names.get(u) in inputs.unbacked]
    return question, "; ".join(counts) or "a size depends on tensor values"


def numbers_asked(e, inputs: SymbolicInputs | None) -> str | None:
    """The floats traced as values that torch's refused question (e) reads, in words ("f0 is argument 'lr'"),
    or None where it reads none."""
    if inputs is None or not inputs.number_names:
        return None
    asked = [inputs.names[s] for s in sorted(e.cond.free_symbols, key=str)
             if inputs.names.get(s) in inputs.number_names]
    return "; ".join(f"{name} is {inputs.number_names[name]}" for name in asked) or None


@functools.cache
def _shapes():
    return importlib.import_module("torch.fx.experimental.symbolic_shapes")


def _shape_env(**options):
    """A ShapeEnv of torch's, made without importing torch._dynamo where that import would only say that torch's
    translation validation (a debugging aid of Dynamo's, off unless configured) is off: ShapeEnv asks
    torch.fx.experimental.validator, which imports torch._dynamo (seconds, once per process: most of a small
    function's first symbolic compile). While the ShapeEnv is made, that module's name stands for a stand-in
    that answers the question as the real one would and imports the real one for anything else it is asked."""
    shapes = _shapes()
    name = "torch.fx.experimental.validator"
    config = importlib.import_module("torch.fx.experimental._config")
    if name in sys.modules or getattr(config, "translation_validation", True):
        return shapes.ShapeEnv(**options)
    stand_in = _ValidatorStandIn(name)
    with _stand_in_lock:
        sys.modules.setdefault(name, stand_in)
        try:
            return shapes.ShapeEnv(**options)
        finally:
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]


_stand_in_lock = threading.Lock()


class _ValidatorStandIn(type(sys)):
    """torch.fx.experimental.validator while a ShapeEnv is made (_shape_env): translation validation is off (as
    the real module answers when its configuration says so); any other name imports the real module."""

    @staticmethod
    def translation_validation_enabled() -> bool:
        return bool(importlib.import_module("torch.fx.experimental._config").translation_validation) and \
            _real_validator().translation_validation_enabled()

    def __getattr__(self, attr):
        if attr.startswith("__"):  # (the import system's questions: `from m import x` asks for __path__)
            raise AttributeError(attr)
        return getattr(_real_validator(), attr)


def _real_validator():
    name = "torch.fx.experimental.validator"
    if isinstance(sys.modules.get(name), _ValidatorStandIn):
        del sys.modules[name]
    return importlib.import_module(name)


@functools.cache
def _input_source():
    """The type of the `Source` (torch's name for where a symbol comes from) of an input's size: one of thunderfn's
    with the name torch's LocalSource prints ("L['t0']"), so that making symbols imports nothing of Dynamo's; torch's
    own where Dynamo is imported already or where torch's Source is not the one this was written for."""
    guards = importlib.import_module("torch._guards")
    if ("torch._dynamo.source" in sys.modules
            or not isinstance(inspect.getattr_static(guards.Source, "name", None), functools.cached_property)
            or not hasattr(guards.Source, "_name_template")):
        return importlib.import_module("torch._dynamo.source").LocalSource

    @dataclasses.dataclass(frozen=True)
    class InputSize(guards.Source):
        local_name: str

        @property
        def _name_template(self) -> str:
            return f"L[{self.local_name!r}]"

        @property
        def guard_source(self):
            return guards.GuardSource.LOCAL

        def reconstruct_pycode(self, codegen) -> str:
            return self.local_name

    return InputSize


def _guards_expression(env, placeholders) -> str | None:
    """What `env.produce_guards_expression(placeholders, ignore_static=True)` returns for placeholders of ints and
    SymInts of input sizes (this module's): a Python expression over L['t0'], L['t1'], ... (the placeholders) that
    holds exactly where the guards do, or None. torch's imports torch._dynamo (for its Source types and its
    configuration: seconds, once per process); this is its algorithm for what a compile of ours has (no tensor
    placeholders, constraints or input equalities, no automatic-dynamic exclusions), in its order, printed by its
    printer. Where this torch's ShapeEnv is not the one it was written for, torch's own answers."""
    try:
        if getattr(env, "exclusion_constraints", None) or env._translation_validation_enabled:
            raise AttributeError("Dynamo's case")
        symbol_to_source: dict = {}
        printer = _shapes().ShapeGuardPythonPrinter(symbol_to_source, lambda source: source.name, env.var_to_sources)
        exprs = _input_guards(placeholders, symbol_to_source, printer)
        issued = set()
        for guard in env.guards:
            if env._maybe_evaluate_static(guard.expr, axioms=(), size_oblivious=guard.size_oblivious) is not None:
                continue
            expr = env.simplify(guard.expr)
            if expr not in issued:
                issued.add(expr)
                exprs.append(printer.doprint(expr))
        exprs += _range_guards(env, symbol_to_source, printer)
    except (AttributeError, TypeError):
        return env.produce_guards_expression(placeholders, ignore_static=True)
    return " and ".join(exprs) if exprs else None


def _input_guards(placeholders, symbol_to_source: dict, printer) -> list[str]:
    """produce_guards' first guards (its track_symint): each placeholder equal to its value where that is a number
    or another placeholder's symbol; fills symbol_to_source (symbol -> the sources that hold it bare)."""
    shapes = _shapes()
    source_type = _input_source()
    inputs = []
    for i, value in enumerate(placeholders):
        source = source_type(f"t{i}")
        if isinstance(value, torch.SymInt) and value.node.maybe_as_int() is not None:
            value = value.node.maybe_as_int()
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
            if isinstance(expr, shapes.sympy.Symbol):
                symbol_to_source.setdefault(expr, []).append(source)
        else:
            expr = shapes.sympy.Integer(value)
        inputs.append((source, expr))
    return [f"{printer.print_source(source)} == {printer.doprint(expr)}" for source, expr in inputs
            if not (isinstance(expr, shapes.sympy.Symbol) and symbol_to_source[expr][0] == source)]


def _range_guards(env, symbol_to_source: dict, printer) -> list[str]:
    """produce_guards' last guards: each input symbol's known range, where it has a bound."""
    shapes = _shapes()
    sympy, int_oo = shapes.sympy, shapes.int_oo
    exprs = []
    for symbol in symbol_to_source:
        r = env.var_to_range.get(symbol)
        if r is None:
            continue
        bounds = []
        if r.lower not in (-sympy.oo, -int_oo):
            bounds.append(sympy.Le(r.lower, symbol, evaluate=False))
        if r.upper not in (sympy.oo, int_oo):
            bounds.append(sympy.Le(symbol, r.upper, evaluate=False))
        if bounds:
            exprs.append(printer.doprint(sympy.And(*bounds, evaluate=False)))
    return exprs


def _without_lazy_trace_handler() -> None:
    """Let torch's structured-trace handler go now if it would go at the first record it is given: torch attaches
    one to every process, which at its first record drops itself unless TORCH_TRACE (or Meta's infrastructure)
    gives it a place to write; until then every ShapeEnv.create_symbol computes the record's metadata, a stack
    symbolized by the profiler's machinery (which imports torch._inductor and torch._dynamo: seconds). Given an
    empty record instead, it drops itself as it would have (the condition is torch's own, in LazyTraceHandler.emit)."""
    try:
        internal = importlib.import_module("torch._logging._internal")
        for handler in list(internal.trace_log.handlers):
            if (type(handler) is internal.LazyTraceHandler and handler.root_dir is None and handler.stream is None
                    and hasattr(torch.version, "git_version") and os.getenv("MAST_HPC_JOB_NAME") is None):
                handler.emit(logging.makeLogRecord({}))
    except AttributeError:  # another torch's logging: it pays what it pays
        pass


@functools.cache
def _printer():
    printers = importlib.import_module("torch.utils._sympy.printers")

    class Printer(printers.PythonPrinter):
        def _print_Float(self, expr) -> str:  # (a float as Python writes it: 0.1, not 0.10000000000000001)
            return repr(float(expr))

    return Printer()


class SymbolicInputs:
    """The symbols of one compile's input dimensions.

    `plan` maps a tensor input's number (its place among the call's tensors) to the dimensions
    left open. Sizes 0 stay static (an empty tensor takes other paths in many ops); a size of 1
    becomes a symbol too, traced at the size `hints` gives, so a length-1 call can share the trace unless
    the trace branched on it.""" 

    def __init__(self, plan: dict, hints: dict | None = None, numbers=frozenset()):
        shapes = _shapes()
        self.plan = plan
        # the places among the call's flattened arguments of the Python floats traced as values (`number`)
        self.numbers = frozenset(numbers)
        self.number_names: dict = {}  # "f0" -> "argument 'lr'", in the order the generated code takes them
        # (tensor number, dim) -> the size to trace a symbol at instead of the call's (see jit's dynamic_shapes.py)
        self.hints = hints or {}
        _without_lazy_trace_handler()
        self.env = _shape_env(specialize_zero_one=False)
        self.placeholders: list = []  # every dimension of every tensor input, in order (int or SymInt)
        self.access: list[tuple[int, int]] = []  # (tensor number, dim) of each placeholder
        self.names: dict = {}  # sympy symbol -> "s0": the printed name, in order of creation
        self.described: dict = {}  # "s0" -> "argument 'x'.shape[1]"
        self.printed: dict = {}  # sympy expression -> its Python source (see python)
        self.fake_mode = None  # a FakeTensorMode on env, made when first needed (fake_tensor_mode)
        # sympy symbol -> where a guard made it a number: "pinned by torch.triu at model.py:12" (cache_info's)
        self.pinned_at: dict = {}
        replace = self.env._set_replacement

        def replacing(symbol, target, *rest):
            if getattr(target, "is_number", False) and symbol not in self.pinned_at:
                self.pinned_at[symbol] = where_traced()
            return replace(symbol, target, *rest)

        self.env._set_replacement = replacing  # (this ShapeEnv is ours alone: one per compile)
        def located(framework_loc=None):  # each guard's location says which op and line of the traced code asked
            # (from thunderfn's own stack walk: torch's, which this replaces, imports Dynamo's, Inductor's and
            # export's modules the first time, to know which files are its own: half a second per process)
            return shapes.SLoc(framework_loc, where_traced(asked=True))

        self.env._get_sloc = located
        self.env._get_stack_summary = lambda is_debug=False, framework_loc=None: (located(framework_loc), "")
        # data-dependent sizes: "u0" -> what it counts ("the number of nonzero elements of t3 (ltorch.nonzero)")
        self.unbacked: dict = {}
        self._memo: dict = {}  # what a data-dependent size counts (an op and its input's name) -> the size
        _registry[self.env] = self

    def shape(self, number: int, shape, described: str) -> torch.Size:
        open_dims = self.plan.get(number, ())
        dims = []
        for d, n in enumerate(shape):
            self.access.append((number, d))
            if d in open_dims and n >= 1:
                source = _input_source()(f"t{len(self.placeholders)}")
                at = self.hints.get((number, d), n)
                # a symbol of its own, even where another dimension has the same size now (no duck sizing: two
                # sizes equal by chance would be one symbol, and a size of a weight or a Python number the
                # trace compares one with would pin the other too); equalities the trace relies on are guards
                expr = self.env.create_symbol(at, source, dynamic_dim=_shapes().DimDynamic.DYNAMIC,
                                              do_not_specialize_zero_one=True)
                n = self.env.create_symintnode(expr, hint=at, source=source)
                self.names[expr] = f"s{len(self.names)}"
                self.described[self.names[expr]] = f"{described}.shape[{d}]"
            self.placeholders.append(n)
            dims.append(n)
        return torch.Size(dims)

    def number(self, value: float, described: str) -> torch.SymFloat:
        """A Python float traced as a value: a symbol "f<k>" the generated function takes after its tensors
        (Trace.size_args), so one trace serves every value. Ops meet it as the Python float it stands for (a
        number's type promotion: float32 * f0 stays float32), and arithmetic on it is an expression of it. It is
        data-dependent to the ShapeEnv (unbacked): a question of its value (`if lr > 0.1`, float(lr)) cannot be
        answered while tracing and is a ConcretizationError (core/tracer.py's data_dependent_error), never a guard."""
        with self.env.ignore_fresh_unbacked_symbols():  # (bound as a parameter by generated code)
            f = self.env.create_unbacked_symfloat()
        self.names[f.node.expr] = name = f"f{len(self.number_names)}"
        self.number_names[name] = described
        return f

    def fake(self):
        """A FakeTensorMode on env (made once): where torch's kernels run on symbolic sizes, and where an op whose
        output size depends on values (unique) gets a data-dependent size of its own."""
        if self.fake_mode is None:
            fake = importlib.import_module("torch._subclasses.fake_tensor")
            self.fake_mode = fake.FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=True)
        return self.fake_mode

    def unbacked_size(self, upper, described: str, memo=None) -> torch.SymInt:
        """A fresh data-dependent size (a symbol "u<k>"), between 0 and upper (an int; a symbolic or None upper
        bound: no upper bound), that counts what `described` says. `memo` (hashable: the op and its input's
        name) gives the same size for the same computation, so two identical ops agree on their sizes (a
        common-subexpression pass may merge them; x[mask] + y[mask] broadcasts)."""
        known = self._memo.get(memo) if memo is not None else None
        if known is not None:
            return known
        with self.env.ignore_fresh_unbacked_symbols():  # (bound by generated code, not by an FX graph of torch's)
            n = self.env.create_unbacked_symint()
        _shapes()._constrain_range_for_size(n, min=0, max=upper if type(upper) is int else None)
        self.adopt(n, described)
        if memo is not None:
            self._memo[memo] = n
        return n

    def adopt(self, n: torch.SymInt, described: str) -> None:
        """Name a data-dependent size that torch made (a fake kernel's output size), as unbacked_size names its own."""
        self.names[n.node.expr] = name = f"u{len(self.unbacked)}"
        self.unbacked[name] = described

    def adopt_fresh(self, shapes, described: str) -> None:
        """Name the data-dependent sizes in shapes (an opaque op's outputs, from a fake kernel) that have no name yet,
        and forget torch's list of them (thunderfn binds them in generated code)."""
        for s in symbolic_leaves(list(shapes)):
            for u in _shapes().free_unbacked_symbols(s.node.expr):
                if u not in self.names:
                    self.adopt(self.env.create_symintnode(u, hint=None), described)
        self.env.pending_fresh_unbacked_symbols.clear()

    def runtime_checks(self) -> list:
        """(the names of the sizes it reads, its Python source) of every fact torch._check stated about
        data-dependent sizes: generated code checks each once it has bound them (core/printing.py)."""
        return [(frozenset(self.names.get(u, str(u)) for u in fact.expr.free_symbols), python(fact.expr, self))
                for facts in self.env.deferred_runtime_asserts.values() for fact in facts]

    @property
    def symbolic_dims(self) -> dict:
        """tensor number -> the dimensions that are symbolic in this compile."""
        out: dict = {}
        for (number, d), n in zip(self.access, self.placeholders):
            if isinstance(n, torch.SymInt) and not self.env.simplify(n.node.expr).is_number:  # (not specialized)
                out.setdefault(number, []).append(d)
        return {k: tuple(v) for k, v in out.items()}

    def traced_shapes(self) -> dict:
        """tensor number -> its shape as the trace holds it: each size an int (static, or a symbol a guard
        specialized to the number it was traced at), None where it stayed symbolic."""
        shapes: dict = {}
        for (number, _), n in zip(self.access, self.placeholders):
            if isinstance(n, torch.SymInt):
                value = self.env.simplify(n.node.expr)
                n = int(value) if value.is_number else None
            shapes.setdefault(number, []).append(n)
        return {k: tuple(v) for k, v in shapes.items()}

    def pinned(self) -> list[str]:
        """The symbols a guard specialized to a number, in words ("s0 = argument 'x'.shape[1] == 3"): the
        trace relied on that size, so the entry's key holds it as a static size."""
        out = []
        for expr, name in self.names.items():
            if name in self.unbacked or name in self.number_names:  # (a torch._check fact, a float: no key)
                continue
            value = self.env.simplify(expr)
            if value.is_number:
                at = self.pinned_at.get(expr)
                out.append(f"{name} = {self.described[name]} == {int(value)}" + (f" ({at})" if at else ""))
        return out

    def still_symbolic(self) -> dict:
        """"s0" -> where it comes from, for the symbols no guard specialized to a number, and each float traced as
        a value ("f0" -> "argument 'lr'")."""
        names = {python(n) for n in self.placeholders if isinstance(n, torch.SymInt)}
        return {**{name: where for name, where in self.described.items() if name in names}, **self.number_names}

    def guard_code(self, tensor_names: list[str]) -> str | None:
        """A Python expression over the call's tensors (named `tensor_names`, in input order) that holds
        exactly when every fact the trace relied on holds for their sizes, or None when there is none.
        Static dimensions are not in it: the cache key compares them."""
        # (torch refuses a guard on a data-dependent size, which a check before the call could never read)
        unbacked = [g.expr for g in self.env.guards if _shapes().free_unbacked_symbols(g.expr)]
        if unbacked:
            raise InternalError(f"a guard of this compile reads a data-dependent size: {python(unbacked[0], self)}")
        code = _guards_expression(self.env, self.placeholders)
        if code is None:
            return None

        def access(m):
            number, d = self.access[int(m.group(1))]
            return f"{tensor_names[number]}.shape[{d}]"

        return re.sub(r"L\['t(\d+)'\]", access, code)

    def broken_by(self, shapes) -> list[str]:
        """The guards that the sizes of a call (each tensor's shape, in input order) break, in words with where the
        traced code asked them ("s0 > 1 (asked by torch.nn.functional.scaled_dot_product_attention at x.py:3)")."""
        values = {}
        for (number, d), n in zip(self.access, self.placeholders):
            if isinstance(n, torch.SymInt) and n.node.expr.is_Symbol:
                values[n.node.expr] = shapes[number][d]
        broken = []
        for guard in self.env.guards:
            holds = self.env.simplify(guard.expr).xreplace(values)
            if holds is not True and getattr(holds, "is_Boolean", False) and not bool(holds):
                at = guard.sloc.maybe_user_loc
                broken.append(python(self.env.simplify(guard.expr), self) + (f" ({at})" if at else ""))
        return broken

    def guards_in_words(self) -> list[str]:
        """The facts the trace relied on, over the symbols' printed names (for cache_info and errors)."""
        words = []
        for guard in self.env.guards:
            expr = self.env.simplify(guard.expr)
            if expr is not True and str(expr) != "True":
                words.append(python(expr, self))
        return words


_THUNDERFN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def where_traced(asked: bool = False) -> str | None:
    """The torch operation being traced and the line of the traced code that called it ("torch.triu at
    model.py:12"), from the Python stack: the outermost interception.dispatch frame's function, and the innermost
    frame outside thunderfn and torch. For saying which line of the user's relied on a size."""
    op, line = None, None
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "trace" and code.co_filename.endswith(os.path.join("core", "trace.py")):
            break  # where the traced code was entered: the frames outside are the caller's, not the traced code's
        if code.co_name == "dispatch" and code.co_filename.endswith(os.path.join("core", "interception.py")):
            func = frame.f_locals.get("func")
            op = _op_namer(func) if func is not None else None
        elif line is None and not code.co_filename.startswith((_THUNDERFN_DIR, _TORCH_DIR, "<")):
            line = f"{os.path.basename(code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    else:  # asked after tracing (differentiating, lowering): by no line of the traced code
        return None
    if op is None and line is None:
        return None
    verb = "asked" if asked else "pinned"
    if op is None:  # int(size), a branch or an index the traced code computed itself
        return f"{verb} at {line}: int(), a comparison or a Python index read it"
    return f"{verb} by {op}" + (f" at {line}" if line else "")


_op_namer = repr  # how an op is named in words: interception.torch_name, handed down when it is imported


def name_ops_with(namer) -> None:
    """Called once by core/interception.py (which imports this module, so it cannot be imported here)."""
    global _op_namer
    _op_namer = namer


# every live ShapeEnv of ours -> its SymbolicInputs, for printing a SymInt by its names
_registry: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def inputs_of(x) -> SymbolicInputs | None:
    return _registry.get(x.node.shape_env) if isinstance(x, (torch.SymInt, torch.SymFloat)) else None


def python(x, inputs: SymbolicInputs | None = None) -> str:
    """Python source computing a size (an int, a SymInt or a sympy expression of ours) from its symbols."""
    if isinstance(x, int):
        return repr(x)
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        inputs = inputs_of(x)
        x = inputs.env.simplify(x.node.expr) if inputs is not None else x.node.expr
    if inputs is None:
        raise InternalError(f"a symbolic size {x} of no jit compile reached code generation")
    if x.is_number:
        return repr(int(x)) if x.is_integer else repr(float(x))
    printed = inputs.printed.get(x)
    if printed is None:  # (each trace line's annotation prints its sizes: printed once per expression)
        named = x.xreplace({s: _named_symbol(inputs.names.get(s, str(s))) for s in x.free_symbols})
        printed = inputs.printed[x] = _printer().doprint(named)
    return printed


@functools.cache
def _named_symbol(name: str):
    return importlib.import_module("sympy").Symbol(name, integer=True)


def symbols_in(x) -> set[str]:
    """The printed names of the symbols a size's source uses."""
    if not isinstance(x, (torch.SymInt, torch.SymFloat)):
        return set()
    inputs = inputs_of(x)
    if inputs is None:
        return set()
    expr = inputs.env.simplify(x.node.expr)
    return {inputs.names.get(s, str(s)) for s in expr.free_symbols}


def bare_symbol(x) -> str | None:
    """The printed name of x when x is exactly one symbol (so generated code can bind it from a shape)."""
    if not isinstance(x, torch.SymInt):
        return None
    inputs = inputs_of(x)
    if inputs is None:
        return None
    expr = inputs.env.simplify(x.node.expr)
    return inputs.names.get(expr) if expr.is_Symbol else None


def free_symbols(x) -> dict:
    """printed name -> a SymInt that is exactly that symbol, for each symbol a size's source uses (so code can
    take the symbols as parameters and compute the size from them)."""
    inputs = inputs_of(x)
    if inputs is None:
        return {}
    env = inputs.env
    values = getattr(env, "backed_var_to_val", None) or env.var_to_val  # (renamed in torch 2.12)
    return {inputs.names.get(s, str(s)): env.create_symintnode(s, hint=int(values[s]) if s in values else None)
            for s in env.simplify(x.node.expr).free_symbols}


def fake_tensor_mode(values):
    """A FakeTensorMode on the ShapeEnv of the first symbolic number among values, or None where none is: torch's
    meta kernels run on tensors of symbolic sizes only under it (a plain meta tensor of symbolic sizes fails in
    many: 'dispatch_on_subclass called with NO overloaded args')."""
    for v in values:
        inputs = inputs_of(v)
        if inputs is not None:
            return inputs.fake()
    return None


def evaluation_namespace() -> dict:
    """What a guard expression needs besides the tensors (sympy's functions as Python)."""
    return dict(_shapes().SYMPY_INTERP)


_local = threading.local()


@contextlib.contextmanager
def opening(inputs: SymbolicInputs | None):
    """Trace inputs with the symbolic dimensions of `inputs` (core/trace.py's proxify_inputs asks `current`)."""
    previous = getattr(_local, "inputs", None)
    _local.inputs = inputs
    try:
        yield inputs
    finally:
        _local.inputs = previous


def current() -> SymbolicInputs | None:
    """The symbolic inputs of the trace being started on this thread, consumed by the outermost trace."""
    inputs = getattr(_local, "inputs", None)
    _local.inputs = None  # inner traces (a transform's inside jit) take their inputs' shapes as given
    return inputs
