"""Trace: inputs, bound symbols, output. `str(trace)` is Python that runs.

`trace(fn, *args, **kwargs)` builds the computation trace of a function: tensors in
the argument pytrees become proxies named after the parameters they came from,
everything else is baked in as a constant, and every torch call is recorded.
A composite symbol called on real tensors runs by the same means (`_run_decomposition`).
While a trace is built, the state of the building is its Tracer's (core/tracer.py), which
the finished trace does not keep.

May import: the rest of core/, errors.py.
"""
from __future__ import annotations

import inspect
import time
import types

import optree
import torch

from thunderfn.core import context, symbolic
from thunderfn.core.interception import lift_constants
from thunderfn.core.printing import compile_trace, format_trace
from thunderfn.core.proxies import TensorProxy, is_real_tensor
from thunderfn.core.pytree import adopt_torch_registrations, tree_flatten, tree_flatten_with_path, tree_unflatten
from thunderfn.core.symbol import Symbol, set_eager_composite
from thunderfn.core.tracer import Tracer, data_dependent_error, tracing
from thunderfn.errors import EscapedProxyError, UnsupportedOpError


class Trace:
    """A recorded program: the inputs, the bound symbols (statements) in order, and the output.

    What tf.trace returns and what tf.last_traces lists (one Trace per pass: the traced
    computation, then each transform's and the executors' result). The parts a user reads:
    `args` (the input TensorProxy objects, in call order), `bound_symbols` (a list of
    BoundSymbol), `output` (a pytree of proxies and constants) and `provenance` (which pass
    made it, printed on the first line). `str(trace)` is runnable Python source, the trace's
    debugging interface; `python_callable()` compiles it into a function of real tensors.
    Traces are built by tracing (core/tracer.py's Tracer records into them), not by hand.

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
        self.args: list[TensorProxy] = []  # flat tensor inputs, in call order
        self.bound_symbols: list = []
        self.output = None
        self.provenance: str | None = None
        parent = context.current_trace()
        self.names = names if names is not None else (parent.names if parent is not None else context.NamePool())
        # What the computation trace says of its calls beyond its arguments, which jit's cache entry checks or
        # passes on every call (core/call_time.py's guarded, cache_entry.py's CacheEntry). They stay with the
        # trace because they are part of what it computes from: a `.grad` read is an input of the trace (its
        # proxy is among `args`), and a guard or layout fact is a condition under which the trace is the
        # function's. Written while tracing, into the computation trace (the one jit reads them from); a
        # pass's trace (derive) starts without them.
        self.grad_reads: dict = {}  # `.grad`s read while tracing: key -> call_time.GradRead
        self.guards: list = []  # callables returning why the trace went stale, or None
        # Layout facts about input tensors the trace relies on (whether x.contiguous() is x or a copy):
        # position -> {(what, get): value}, checked by jit on every call with the cache key
        self.layout_reads: dict = {}

    def derive(self, provenance: str, bound_symbols=None) -> "Trace":
        """A trace with the same inputs and outputs, built by a pass."""
        new = Trace(self.fn_name, names=self.names)
        new.def_name, new.args_in_list, new.size_args = self.def_name, self.args_in_list, self.size_args
        new.args, new.output = self.args, self.output
        new.bound_symbols = list(self.bound_symbols if bound_symbols is None else bound_symbols)
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


def proxify_inputs(tracer: Tracer, fn, args, kwargs):
    """Replace every tensor leaf of (args, kwargs) by a named input proxy of the trace being built, with the
    symbolic dimensions jit opened for this trace (core/symbolic.py), if any; each float jit traces as a value
    (its place among the flattened arguments in the symbolic inputs' `numbers`) by a symbol of it."""
    trc = tracer.trace
    names = arg_paths(fn, args, kwargs)
    open_dims = symbolic.current()
    paths, leaves, spec = tree_flatten_with_path((tuple(args), dict(kwargs)))
    new_leaves = []
    for position, (path, leaf) in enumerate(zip(paths, leaves)):
        if open_dims is not None and position in open_dims.numbers and type(leaf) is float:
            # a float jit traces as a value: a parameter of the generated function after its tensors
            top = names[path[1]] if path[0] == 0 else str(path[1])
            number = open_dims.number(leaf, f"argument '{_path_name((top, *path[2:])) or top}'")
            trc.size_args = [*trc.size_args, symbolic.python(number)]
            tracer.sizes = open_dims
            new_leaves.append(number)
            continue
        if is_real_tensor(leaf):
            top = names[path[1]] if path[0] == 0 else str(path[1])
            preferred = _path_name((top, *path[2:]))
            shape = leaf.shape
            if open_dims is not None:
                shape = open_dims.shape(len(trc.args), shape, f"argument '{preferred or top}'")
                tracer.sizes = open_dims
            proxy = TensorProxy(trc.names.take(preferred, prefix="a"), shape=shape, dtype=leaf.dtype,
                                device=leaf.device, requires_grad=leaf.requires_grad,
                                origin=f"argument '{preferred or top}'")
            tracer.add_input(proxy, leaf)
            new_leaves.append(proxy)
        else:
            new_leaves.append(leaf)
    p_args, p_kwargs = tree_unflatten(spec, new_leaves)
    return p_args, p_kwargs


def symbolic_sizes() -> symbolic.SymbolicInputs:
    """The symbolic sizes of the trace being built: its outermost trace's, made now where that one has none (a
    static compile meeting its first data-dependent size)."""
    root = context.tracer_stack()[0]
    if root.sizes is None:
        root.sizes = symbolic.SymbolicInputs({})
    return root.sizes


def computation_key(proxy: TensorProxy, depth: int = 16):
    """A hashable key for what computed proxy: equal keys, equal values (the same pure ops, recorded at the top
    level of the traces being built, of the same inputs and numbers; anything else by its name). The memo of a
    data-dependent size: `x[x > 0]` twice counts one mask's elements, so both have one size u0."""
    producer = next((b for tracer in reversed(context.tracer_stack()) if (b := tracer.producer(proxy)) is not None),
                    None)
    if producer is None or depth == 0 or not _pure(producer):
        return proxy.name
    position = next(i for i, o in enumerate(producer.proxy_outs()) if o is proxy)
    leaves, spec = optree.tree_flatten((producer.args, producer.kwargs), none_is_leaf=True, namespace="thunderfn")
    try:
        return (producer.sym.id, position, spec, *(computation_key(x, depth - 1) if isinstance(x, TensorProxy) else
                                                   (type(x), x.hex() if type(x) is float else _hashed(x))
                                                   for x in leaves))
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


def _lift_output(tracer: Tracer, x):
    if isinstance(x, torch.Tensor) and tracer.created.get(id(x)) is x:
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
    root = context.tracer_stack()[0]
    start = root.rng_at_start  # (None: a trace built by a transform, not by tracing a function)
    if start is not None and _reseeded_by_tracing(start):
        raise UnsupportedOpError(
            f"{op_name} draws random numbers after '{root.trace.fn_name}' reseeded torch's generator while being "
            f"traced (a generator's own manual_seed or set_state). Tracing runs the Python once, so the compiled "
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
    rng_before = _rng_fingerprint()
    tracer = None
    try:
        with tracing(trc) as tracer:
            tracer.rng_at_start = rng_before
            p_args, p_kwargs = proxify_inputs(tracer, fn, args, kwargs)
            # what fn receives, flattened again: a registered unflatten may build new leaves from the proxies
            given, given_spec = tree_flatten((p_args, p_kwargs))
            out = up_to_date(fn(*p_args, **p_kwargs))
            _refuse_changed_containers(trc.fn_name, given, given_spec, (p_args, p_kwargs))
            adopt_torch_registrations()  # a container type registered with torch while fn ran
            trc.output = optree.tree_map(lambda x: _lift_output(tracer, x), out, none_is_leaf=True,
                                         namespace="thunderfn")
            _refuse_escaping_proxies(trc.output, trc.fn_name)
            if tracer.rebinds:
                _refuse_unknowable_outputs(trc.output)
            tracer.sync_grad_mode()  # back to the caller's mode if the function switched it
            tracer.finish_mutations()
    except BaseException as e:
        for finish in tracer.finishers if tracer is not None else ():
            finish(tracer, True)
        if isinstance(e, TypeError) and "TensorProxy" in str(e) and "descriptor" in str(e):
            raise _unbound_tensor_method(e, trc.fn_name) from None
        if symbolic.is_data_dependent_question(e):  # (asked by the traced code itself: an `if`, int(n), range(n))
            raise data_dependent_error(e, f"'{trc.fn_name}' asks", (context.tracer_stack() or [tracer])[0],
                                       by_traced_code=True) from None
        raise
    finally:
        if tracer is not None:  # (a traceback's frames hold the tracer: it must not keep the caller's tensors alive)
            tracer.input_tensors, tracer._inputs_by_proxy = {}, {}
    for finish in tracer.finishers:
        finish(tracer, False)
    if _reseeded_by_tracing(rng_before):
        # a generator's own methods are C: neither torch-function hooks nor torch/random.py's wrappers see them
        raise UnsupportedOpError(
            f"'{trc.fn_name}' changed torch's random number generator while being traced (a generator's own "
            f"manual_seed, seed or set_state). Tracing runs the Python once, so the compiled function would not do "
            f"it again on later calls. Use torch.manual_seed / torch.set_rng_state (recorded and replayed), or seed "
            f"outside the jitted function.")
    return stamp_provenance(trc, "Tracing", start)


def eval_shape(fn, /, *args, **kwargs):
    """The shapes and dtypes of fn's outputs at these arguments, computing nothing (jax.eval_shape).

    fn is traced as tf.trace traces it, on proxies, so no kernel runs, no random number is drawn
    and an in-place write into an argument is recorded, not made. Each tensor of the output
    pytree comes back as an empty tensor on device "meta" with the output's shape and dtype
    (torch.empty(shape, dtype=dtype, device="meta")); other outputs (numbers, strings, None) pass
    through as they are. The arguments may themselves be meta tensors, so a shape can be
    checked for tensors too large to allocate. A size known only when fn runs (nonzero, a
    boolean mask's selection) has no shape to give: an UnsupportedOpError.

        >>> import torch, thunderfn as tf
        >>> x = torch.empty(100_000, 100_000, device="meta")      # 40 GB, were it real
        >>> w = torch.empty(100_000, 8, device="meta")
        >>> out = tf.eval_shape(lambda x, w: (torch.sin(x) @ w).sum(0), x, w)
        >>> out.shape, out.dtype, out.device
        (torch.Size([8]), torch.float32, device(type='meta'))
        >>> tf.eval_shape(lambda x: (x.to(torch.float16), x.shape[0]), torch.ones(2, 3))
        (tensor(..., device='meta', size=(2, 3), dtype=torch.float16), 2)
    """
    trc = trace(fn, *args, **kwargs)

    def empty_like(x):
        if not isinstance(x, TensorProxy):
            return x
        if symbolic.has_unbacked(tuple(x.shape)):
            raise UnsupportedOpError(
                f"eval_shape: '{trc.fn_name}' returns a tensor whose size {tuple(x.shape)} is known only when it "
                f"runs (a boolean mask's selection, nonzero, unique), so it has no shape to give without running it. "
                f"Run the function (or tf.jit of it) to see the shape.")
        return torch.empty(symbolic.hints(x.shape), dtype=x.dtype, device="meta")

    return optree.tree_map(empty_like, trc.output, none_is_leaf=True, namespace="thunderfn")


def _run_decomposition(sym: Symbol, args, kwargs):
    """A composite called on real tensors: its body is written for proxies (clang checks
    for them), so trace it on proxies of the arguments and run the recorded prims eagerly."""
    tensors = [x for x in optree.tree_leaves((tuple(args), dict(kwargs)), namespace="thunderfn")
               if is_real_tensor(x)]
    trc = trace(sym, *args, **kwargs)
    env = {p.name: t for p, t in zip(trc.args, tensors)}

    def value(x):
        if isinstance(x, TensorProxy):
            return x.constant if x.constant is not None else env[x.name]
        return x

    def run(bsyms):
        for bsym in bsyms:
            if bsym.sym.is_prim:
                args_, kwargs_ = optree.tree_map(value, (bsym.args, bsym.kwargs), none_is_leaf=True,
                                                 namespace="thunderfn")
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
                "tensor back. Register the type as a pytree container, with "
                f"tf.register_pytree_node({cls.__qualname__}, flatten, unflatten) or "
                "torch.utils._pytree.register_pytree_node, or return its tensors instead.")


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
    if context.current_tracer().rebinds:
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
