"""jit of an nn.Module: a module whose forward runs the original one's through jit.

Parameters and buffers are inputs on every call (passed positionally, one input
each, named after them in traces), so optimizer steps, `load_state_dict`, a new
Parameter assigned to an attribute and dtype or device changes are all seen, the
last two by retracing. While forward is traced, the module is read as it is: each
input proxy *stands in* for its tensor (core/context.py), so nothing the user's
module holds is ever replaced and other threads can use it eagerly meanwhile.
What forward reads besides its tensors (every submodule's `training` flag, hooks,
attributes) is guarded (core/guards.py). Everything else (parameters(),
state_dict(), attribute access) is the original module's, unprefixed. A key/value
cache passed to forward changes as in eager (the trace changes a copy whose state comes
back), and `generate` runs the original module's loop with each forward through the
jitted one (see the sections below).

The api layer, below thunderfn/jit.py: jit imports this module for nn.Modules, so the
function jit a ThunderModule compiles its forward with is handed to it (`jit_module`).
May import: core/ (and anything below the api layer).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
import threading
import warnings

import torch

from thunderfn.blocks import reusing_blocks
from thunderfn.core import context, pytree
from thunderfn.core.context import to_identifier
from thunderfn.core.decorators import takes_arguments_of
from thunderfn.core.dynamo_opaque import opaque_to_dynamo
from thunderfn.errors import ArgumentRuntimeError, ArgumentValueError, UnsupportedOpError
from thunderfn.jit_options import JitOptions
from thunderfn.stages import lower
from thunderfn.static_args import StaticArguments
from thunderfn.static_args import resolve as resolve_static
from thunderfn.torch import distributed as collectives


def _state_slots(module: torch.nn.Module, named) -> list:
    """(table, key) for each of the module's parameters or buffers, in named order, so a
    call reads the current tensors with one dict lookup each (a Parameter replaced by
    assignment is seen; adding parameters or submodules after jit needs a new jit)."""
    # each name's owner from one walk of the modules (get_submodule would walk every name again, and a deep
    # model's names are long); named() names tensors by these same owners
    owners = dict(module.named_modules())
    slots = []
    for name, _ in named():
        owner_name, _, attr = name.rpartition(".")
        owner = owners[owner_name]
        slots.append((owner._parameters if attr in owner._parameters else owner._buffers, attr))
    return slots


def _identifier(name: str, taken: set) -> str:
    # any name torch accepts: "σ²" -> sigma_2, "lambda" -> lambda_, "0.weight" (nn.Sequential) -> p_0_weight
    base = to_identifier(("p_" if name[:1].isdigit() else "") + name.replace(".", "_"))
    unique, n = base, 0
    while unique in taken:
        n += 1
        unique = f"{base}_{n}"
    taken.add(unique)
    return unique


def _forward_signature(module: torch.nn.Module, state_names: list) -> inspect.Signature:
    """(<one positional parameter per parameter/buffer>, <forward's own parameters>), so
    traces name inputs `wte_weight`, `idx` and calls of all tensors take jit's fast path."""
    try:
        own = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        own = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
               inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    taken = {p.name for p in own}
    state = [inspect.Parameter(_identifier(n, taken), inspect.Parameter.POSITIONAL_ONLY) for n in state_names]
    own = [p.replace(kind=inspect.Parameter.POSITIONAL_ONLY) if p.kind is p.POSITIONAL_OR_KEYWORD else p for p in own]
    try:
        return inspect.Signature(state + own)
    except ValueError:  # e.g. keyword-only parameters before defaults: fall back to the generic form
        return inspect.Signature(state + [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                                          inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])


_creating = threading.Lock()


class ThunderModule(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, jit, options: JitOptions, static: StaticArguments):
        """jit: what compiles forward, called as jit(forward, options, static) (thunderfn.jit's jit_with_options);
        options: tf.jit's, all of them; static: forward's static arguments, resolved against its signature."""
        super().__init__()
        # Held outside _modules so names and state_dict keys are the original module's.
        object.__setattr__(self, "_thunderfn_module", module)
        # The module's own parameter and buffer tables, shared: code that swaps tensors in place
        # (torch.func.functional_call, nn.utils.parametrize) edits the original's, which forward reads.
        object.__setattr__(self, "_parameters", module._parameters)
        object.__setattr__(self, "_buffers", module._buffers)
        self._thunderfn_jit = jit
        self._thunderfn_options = options
        self._thunderfn_static = static
        self._thunderfn_forget_compiled()

    def _thunderfn_forget_compiled(self):
        self._thunderfn_forward = None  # the jitted forward, made on first use
        self._thunderfn_slots = None
        # a module prepared by tf.distributed.ddp: a jitted forward per sync mode (no_sync() switches)
        self._thunderfn_by_sync = {}

    @property
    def module(self) -> torch.nn.Module:
        return self._thunderfn_module

    @property
    def _thunderfn_state(self):  # for last_traces and cache_info
        return self._jitted()._thunderfn_state

    def _jitted(self):
        with _creating:  # threads making their first call at once share one jitted forward
            return self._current() or self._make_jitted()

    def _current(self):
        """The jitted forward for this call, if made: the one for the sync mode of a ddp module."""
        parallel = self.module.__dict__.get("_thunderfn_data_parallel")
        return self._thunderfn_forward if parallel is None else self._thunderfn_by_sync.get(parallel.sync)

    def _make_jitted(self):
        module = self.module
        options = self._thunderfn_options
        parallel = module.__dict__.get("_thunderfn_data_parallel")
        sharded = module.__dict__.get("_thunderfn_fsdp")
        if parallel is not None and parallel.sync:  # gradients all-reduced in the backward (transforms/ddp.py)
            options = dataclasses.replace(options, distributed=dataclasses.replace(parallel))
        if sharded is not None:
            options = dataclasses.replace(options, distributed=sharded)
        slots = self._slots()
        param_names = [n for n, _ in module.named_parameters()]
        buffer_names = [n for n, _ in module.named_buffers()]

        def forward(*state_and_args, **kwargs):
            state = state_and_args[:len(slots)]
            if sharded is not None:  # tf.distributed.fsdp: parameters gathered whole (transforms/fsdp.py)
                state = list(state)
                for bucket in sharded.buckets:
                    shards, shapes = [state[i] for i in bucket], [sharded.shapes[i] for i in bucket]
                    whole = ([collectives.unshard(shards[0], shapes[0], sharded.group_id)] if len(bucket) == 1 else
                             collectives.unshard_bucket(shards, shapes, sharded.group_id))
                    for i, w in zip(bucket, whole):
                        state[i] = w
            args = state_and_args[len(slots):]
            held = _state_arguments(args, kwargs)
            if held:  # the model changes a copy, whose new state is returned (see _state_arguments)
                args, kwargs = _with_copies(args, kwargs, held)
            # read at trace time: the very tensors the caller just passed as inputs
            with context.standing_in(zip([table[key] for table, key in slots], state)), \
                    (reusing_blocks(module) if options.reuse_blocks else contextlib.nullcontext()):
                out = module(*args, **kwargs)
            return (out, tuple(_argument(args, kwargs, where) for where in held)) if held else out

        forward.__name__ = forward.__qualname__ = _forward_name(module)  # named in error messages
        forward.__thunderfn_module__ = module  # what it is, by its class, for entries written to disk (disk_cache.py)
        forward.__signature__ = _forward_signature(module, param_names + buffer_names)
        static = self._thunderfn_static.after(len(slots))  # forward's static arguments, after the state inputs
        jitted = self._thunderfn_forward = self._thunderfn_jit(forward, options, static)
        if parallel is not None:
            self._thunderfn_by_sync[parallel.sync] = jitted
        return jitted

    def _slots(self):
        if self._thunderfn_slots is None:
            module = self.module
            self._thunderfn_slots = (_state_slots(module, module.named_parameters) +
                                     _state_slots(module, module.named_buffers))
        return self._thunderfn_slots

    def __call__(self, /, *args, **kwargs):
        # The module's own call (inside the trace) runs its hooks and torch's global ones, as
        # eager does; the wrapper runs only hooks registered on the wrapper itself.
        if self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks:
            return self._call_impl(*args, **kwargs)
        # a forward set on the instance wraps ours (accelerate's autocast wrapper for mixed precision)
        return self.__dict__.get("forward", self._jitted_forward)(*args, **kwargs)

    def lower(self, /, *args, **kwargs):
        """tf.jit(model).lower(*args, **kwargs): forward's program for this signature, compiled and not run
        (stages.py); its compile() reads the module's parameters and buffers when called, as forward does."""
        jitted = self._jitted()
        return lower(jitted._thunderfn_state, args, kwargs,
                     prefix=lambda: [table[key] for table, key in self._thunderfn_slots])

    @opaque_to_dynamo  # torch.compile(tf.jit(model)) runs the compiled forward as one call
    def _jitted_forward(self, /, *args, **kwargs):
        jitted = self._current()
        if jitted is None:
            if _has_uninitialized_parameters(self.module):
                # Lazy modules (nn.LazyLinear, ...) create their parameters in their first call, from
                # its inputs' shapes: that call runs eagerly, as it would without jit.
                return self.module(*args, **kwargs)
            jitted = self._jitted()
        held = _state_arguments(args, kwargs)
        out = jitted(*[table[key] for table, key in self._thunderfn_slots], *args, **kwargs)
        if not held:
            return out
        out, new_states = out
        for where, new in zip(held, new_states):
            out = _carry_state(_argument(args, kwargs, where), new, out)
        return out

    def named_parameters(self, *args, **kwargs):
        return self.module.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self.module.named_buffers(*args, **kwargs)

    def named_children(self):
        return self.module.named_children()

    def named_modules(self, *args, **kwargs):
        return self.module.named_modules(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self.module.load_state_dict(*args, **kwargs)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # A module holding this one as a submodule (a LightningModule's `self.net = tf.jit(net)`) loads its state
        # dict through each submodule's _load_from_state_dict and then its `_modules`, which here are empty (the
        # original is held outside them): the original's subtree is loaded here, as nn.Module.load_state_dict
        # walks a subtree, reporting to the outer load under this module's prefix.
        assign = {"assign_to_params_buffers": local_metadata.get("assign_to_params_buffers", False)}

        def load(module, prefix):
            module._load_from_state_dict(state_dict, prefix, {**local_metadata, **assign} if module is self.module
                                         else assign, True, missing_keys, unexpected_keys, error_msgs)
            for name, child in module._modules.items():
                if child is not None:
                    load(child, f"{prefix}{name}.")

        load(self.module, prefix)

    def train(self, mode: bool = True):
        self.module.train(mode)
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .double() / .cuda(): the original module's own parameters are not in our children
        self.module._apply(fn, *args, **kwargs)
        return self

    # copy.deepcopy and pickling (torch.save) take the module and the jit options; the copy
    # compiles again on its first call (compiled code refers to this process's objects).
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_thunderfn_forward"] = state["_thunderfn_slots"] = None
        state["_thunderfn_by_sync"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __reduce_ex__(self, protocol):
        # its class (presenting(...)'s, made at run time) is not found by name: made again from the module's class
        return _unpickled, (type(self.module),), self.__getstate__()

    def __repr__(self):
        return f"ThunderModule({self.module!r})"

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            value = getattr(self._thunderfn_module, name)
            if name == "generate" and inspect.ismethod(value) and value.__self__ is self._thunderfn_module:
                return functools.wraps(value)(functools.partial(_generate, self, value))
            return value


class _PresentedForward:
    """`forward` of a ThunderModule: the jitted forward, presented as the module's own (its signature, name and
    docstring), which libraries read. The Hugging Face Trainer keeps only the dataset columns that
    `inspect.signature(model.forward)` names, and finds a model's label arguments, and whether it returns a loss,
    from its class's `forward`: so an instance's forward presents its module's, and the class's (each module class
    gets a ThunderModule subclass of its own, `presenting`) the module class's.

    A descriptor making a callable per access, not an attribute set on each instance: a jitted module then holds
    no reference to itself (a cycle would leave a dropped model's memory to the cyclic collector). Neither has a
    `__wrapped__`: code that unwraps chains of wrappers (accelerate's) would reach the eager forward and run it."""

    def __init__(self, module_class: type | None = None):
        self.plain = ThunderModule._jitted_forward
        if module_class is not None:
            def forward(self, /, *args, **kwargs):
                return self._jitted_forward(*args, **kwargs)
            forward.__qualname__ = getattr(module_class.forward, "__qualname__", "forward")
            self.plain = takes_arguments_of(forward, module_class.forward)

    def __get__(self, owner, owner_type=None):
        return self.plain if owner is None else _BoundForward(owner)


class _BoundForward:
    __slots__ = ("__self__",)

    def __init__(self, owner: ThunderModule):
        self.__self__ = owner

    def __call__(self, /, *args, **kwargs):
        return self.__self__._jitted_forward(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.__self__.module.forward)

    @property
    def __name__(self) -> str:
        return getattr(self.__self__.module.forward, "__name__", "forward")

    @property
    def __doc__(self) -> str | None:
        return getattr(self.__self__.module.forward, "__doc__", None)

    def __repr__(self) -> str:
        return f"<jitted forward of {type(self.__self__.module).__name__}>"


ThunderModule.forward = _PresentedForward()  # (a module class's subclass presents its forward: `presenting`)
_presenting: dict = {}  # module class -> the ThunderModule subclass presenting it


class _PresentedClass:
    """`__class__` of a jitted Hugging Face model: the model's class, so that `isinstance(jitted, PreTrainedModel)`
    holds (`type(jitted)` stays the ThunderModule subclass). The Trainer, accelerate and PEFT dispatch on it: the
    Trainer saves a model it takes for a PreTrainedModel with `save_pretrained`, which writes tied weights once,
    and any other as its bare state dict with safetensors, which refuses a tensor under two names (every
    Hugging Face language model ties its output layer to its embedding), at the end of training by default.
    Assigning `__class__` still sets the instance's real class."""

    def __init__(self, module_class: type):
        self.module_class = module_class

    def __get__(self, owner, owner_type=None):
        return self.module_class if owner is not None else owner_type

    def __set__(self, owner, value):
        object.__dict__["__class__"].__set__(owner, value)


def _is_hugging_face_model(module_class: type) -> bool:
    transformers = sys.modules.get("transformers")  # (a model of its classes means it is imported)
    base = getattr(transformers, "PreTrainedModel", None) if transformers is not None else None
    return isinstance(base, type) and issubclass(module_class, base)


def presenting(module_class: type) -> type:
    """The ThunderModule subclass for modules of module_class: its `forward` presents module_class.forward (see
    _PresentedForward), its name says what it wraps (`ThunderModule[GPT2LMHeadModel]`), and for a Hugging Face
    model its instances' `__class__` is the model's (_PresentedClass)."""
    found = _presenting.get(module_class)
    if found is None:
        name = f"ThunderModule[{module_class.__name__}]"
        namespace = {"__module__": __name__, "__qualname__": name, "forward": _PresentedForward(module_class)}
        if _is_hugging_face_model(module_class):
            namespace["__class__"] = _PresentedClass(module_class)
        made = type(ThunderModule)(name, (ThunderModule,), namespace)
        found = _presenting.setdefault(module_class, made)  # (two threads making one keep the first)
    return found


def _unpickled(module_class: type) -> ThunderModule:
    """An empty jitted module of module_class's ThunderModule class, for pickle to give its state."""
    cls = presenting(module_class)
    return cls.__new__(cls)


# -- arguments that hold state: key/value caches --------------------------------------------------
# A Hugging Face cache is passed to forward and changed by it: a DynamicCache's layers grow by
# torch.cat and are stored back on the layer objects, a StaticCache allocates its tensors on first
# use. Eager changes the caller's object. A traced function may not change a container it was
# passed (core/trace.py refuses: the compiled code would not), so the jitted forward hands the model
# a copy of each such argument and returns the copy (its new tensors) beside the output, and the
# call moves that state into the caller's object on every call. The copy's tensors are the
# argument's, so in-place writes (StaticCache's index_copy_) are written back to the caller's tensors
# as for any input. A growing cache is a changing input size: symbolic after one recompile.

def _state_arguments(args, kwargs) -> tuple:
    """Where (an argument index or a keyword) the call passes a state-holding object: a container
    of its attributes (pytree.register_by_attributes: the caches). Asked at call time and again
    at trace time, of the copies the trace is given, with the same answer. On every call: kept cheap."""
    kinds = pytree.attribute_container_types()
    if not kinds:
        return ()
    return (tuple(i for i, a in enumerate(args) if type(a) in kinds) +
            tuple(k for k, v in kwargs.items() if type(v) in kinds))


def _argument(args, kwargs, where):
    return args[where] if isinstance(where, int) else kwargs[where]


def _with_copies(args, kwargs, held):
    """args and kwargs with a fresh copy (the same leaves, new containers) of each held object."""
    args, kwargs = list(args), dict(kwargs)
    for where in held:
        leaves, spec = pytree.tree_flatten(_argument(args, kwargs, where))
        (args if isinstance(where, int) else kwargs)[where] = pytree.tree_unflatten(spec, leaves)
    return tuple(args), kwargs


def _carry_state(into, new, out):
    """Give the caller's object `into` the state the model left in its copy `new`, keeping the
    caller's own inner objects (a cache's layers) where the copy has one of the same type, as
    eager changes them in place; an output entry that is the copy becomes the caller's object,
    as eager returns the cache it was given."""
    _update_attributes(into, new)
    if isinstance(out, dict):  # a ModelOutput: setting an item sets its attribute too
        for key, value in list(out.items()):
            if type(value) is type(into):
                out[key] = into
    elif type(out) is tuple:
        out = tuple(into if type(v) is type(into) else v for v in out)
    return out


def _update_attributes(into, new) -> None:
    for name in [n for n in vars(into) if n not in vars(new)]:
        delattr(into, name)
    for name, value in vars(new).items():
        into.__dict__[name] = _merged(into.__dict__.get(name), value)


def _merged(current, value):
    if type(current) is type(value) and type(value) in pytree.attribute_container_types():
        _update_attributes(current, value)
        return current
    if type(current) is list and type(value) is list:
        current[:] = [_merged(current[i] if i < len(current) else None, v) for i, v in enumerate(value)]
        return current
    return value


# -- generate: the original module's loop, each forward through the jitted one -------------------
# generate (Hugging Face's GenerationMixin, or any method of that name) is the original module's
# method and calls `self(**inputs)`, which nn.Module's __call__ sends to `self.forward`. For the
# duration of the call an instance attribute `forward` on the original module sends the calls of
# this thread to the jitted forward (prefill, then decode steps: a handful of compiled entries, the
# cache length symbolic after one recompile). The trace's own call of the module, other threads and
# nested calls get the module's own forward. Removed when the last generate on the module returns.

_routes_lock = threading.Lock()
_routes: dict = {}  # id(original module) -> [forward it had before, number of generate calls running]
_generating = threading.local()  # .jitted: {id(original module): its jitted module} for this thread's generate


def _generate(jitted: ThunderModule, generate, /, *args, **kwargs):
    module = jitted.module
    hooks = _top_level_hooks(module)
    if hooks:
        warnings.warn(
            f"{type(module).__name__}.generate runs eagerly: the module has {hooks}. generate calls the module "
            f"through nn.Module.__call__, which runs them around forward; through the jitted forward they would run "
            f"a second time inside the trace. Remove them to generate through tf.jit.", stacklevel=2)
        return generate(*args, **kwargs)
    if hasattr(module, "generation_config"):
        # Hugging Face's own generate would torch.compile forward where the cache is static (on GPU);
        # thunderfn compiles it here
        kwargs.setdefault("disable_compile", True)
    _route_forward(module)
    mine = _generating.__dict__.setdefault("jitted", {})
    outer = mine.get(id(module))
    mine[id(module)] = jitted
    try:
        return generate(*args, **kwargs)
    finally:
        if outer is None:
            del mine[id(module)]
        else:
            mine[id(module)] = outer
        _unroute_forward(module)


def _route_forward(module: torch.nn.Module) -> None:
    with _routes_lock:
        route = _routes.get(id(module))
        if route is not None:
            route[1] += 1
            return
        own = module.forward  # its class's (bound), or an instance attribute some library set

        @functools.wraps(own)  # generate reads forward's signature (to decide whether to pass position_ids)
        def forward(*args, **kwargs):
            jitted = _generating.__dict__.get("jitted", {}).pop(id(module), None)
            if jitted is None:  # another thread, or the trace's own call of the module
                return own(*args, **kwargs)
            try:
                return jitted.forward(*args, **kwargs)
            finally:
                _generating.jitted[id(module)] = jitted

        _routes[id(module)] = [module.__dict__.get("forward"), 1]
        module.__dict__["forward"] = forward


def _unroute_forward(module: torch.nn.Module) -> None:
    with _routes_lock:
        route = _routes[id(module)]
        route[1] -= 1
        if route[1]:
            return
        del _routes[id(module)]
        if route[0] is None:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = route[0]


def _top_level_hooks(module: torch.nn.Module) -> str:
    """The forward hooks nn.Module.__call__ runs around this module's forward, named; '' if none."""
    own = [name for name in ("_forward_hooks", "_forward_pre_hooks") if getattr(module, name, None)]
    everywhere = [name for name in ("_global_forward_hooks", "_global_forward_pre_hooks")
                  if getattr(torch.nn.modules.module, name, None)]
    return " and ".join([f"{n.lstrip('_').replace('_', ' ')} of its own" for n in own] +
                        [f"torch's {n.lstrip('_').replace('_', ' ')}" for n in everywhere])


def _has_uninitialized_parameters(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()
               for m in module.modules())


def jit_module(module: torch.nn.Module, jit, options: JitOptions | None = None) -> ThunderModule:
    """tf.jit(module): jit compiles the module's forward with tf.jit's options (see ThunderModule; None: the
    defaults)."""
    options = options if options is not None else JitOptions()
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        # its forward prepares its reducer for the autograd graph of real outputs, which a trace has not
        raise UnsupportedOpError(
            "tf.jit cannot trace torch's DistributedDataParallel wrapper: its forward hands the reducer the autograd "
            "graph of its outputs, which a trace does not have. Wrap the other way round, "
            "DistributedDataParallel(tf.jit(model)), or use thunderfn's own: tf.jit(tf.distributed.ddp(model)).")
    if isinstance(module, ThunderModule):  # jit of a jitted module: the module, jitted with these options
        module = module.module
    if options.distributed is not None:
        raise ArgumentValueError(
            "distributed is set by tf.distributed.ddp and fsdp on the module they prepare (which a jitted module's "
            "forward reads); for a module, write tf.jit(tf.distributed.ddp(model)) or "
            "tf.jit(tf.distributed.fsdp(model))")
    if options.donate_argnums:
        raise ArgumentValueError(
            f"donate_argnums is not supported for an nn.Module ({type(module).__name__}): its parameters and "
            f"buffers are the module's to keep. jit a function of the tensors to donate instead (an optimizer's "
            f"update of a list of tensors)")
    # checked now, against forward's own signature (bound: its indices start after self)
    static = resolve_static(module.forward, options.static_argnums, options.static_argnames, name=_forward_name(module))
    return presenting(type(module))(module, jit, options, static)


def _forward_name(module: torch.nn.Module) -> str:
    return f"{type(module).__name__}.forward"


def functional_call(module: torch.nn.Module, parameters_and_buffers: dict, args=(), kwargs=None, *,
                    tie_weights: bool = True, strict: bool = False):
    """`module(*args, **kwargs)` with the given tensors in place of its parameters and buffers
    (by name; the rest are the module's own): torch.func.functional_call, which thunderfn traces
    (torch/nn_modules.py), except that a name the module does not have is an error, not ignored.
    Tied weights (one tensor under several names) all take the value given for any of them.

    `parameters_and_buffers`: {name as in module.named_parameters()/named_buffers(): tensor}, or
    a tuple of such dicts with distinct names (torch's (params, buffers), as tf.stack_module_state gives);
    `args`: a tuple of positional arguments (a single non-tuple value is taken as the one
    argument); `kwargs`: a dict; `tie_weights` and `strict` as torch.func's (tie_weights=False on a module
    with tied weights is refused by name inside traced code; strict: every name given, none unknown, or
    torch's RuntimeError). Returns the module's output. The module itself is left
    unchanged. Its use is making a module a function of its parameters, for tf.grad, tf.vmap
    (ensembles, per-example gradients) and tf.jacrev; an unknown name is an
    ArgumentValueError naming it.

        >>> import torch, thunderfn as tf
        >>> model = torch.nn.Linear(3, 1)
        >>> params = {name: p.detach() for name, p in model.named_parameters()}
        >>> def loss(params, x):
        ...     return tf.functional_call(model, params, (x,)).pow(2).mean()
        >>> grads = tf.grad(loss)(params, torch.randn(5, 3))
        >>> {name: tuple(g.shape) for name, g in grads.items()}
        {'weight': (1, 3), 'bias': (1,)}
        >>> tf.functional_call(model, {"wieght": torch.zeros(1, 3)}, (torch.randn(5, 3),))
        Traceback (most recent call last):
        ...
        thunderfn.errors.ArgumentValueError: functional_call: Linear has no parameters or buffers named ['wieght']
    """
    named = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    named.update(name for name, _ in module.named_buffers(remove_duplicate=False))
    # torch's form (params, buffers), a sequence of dicts, too: torch refuses a name in two of them, or a non-dict
    dicts = parameters_and_buffers if isinstance(parameters_and_buffers, (tuple, list)) else [parameters_and_buffers]
    unknown = {name for d in dicts if isinstance(d, dict) for name in d} - named
    if unknown:
        raise ArgumentValueError(f"functional_call: {type(module).__name__} has no parameters or buffers "
                                 f"named {sorted(unknown)}")
    return torch.func.functional_call(module, parameters_and_buffers, args if isinstance(args, tuple) else (args,),
                                      kwargs or {}, tie_weights=tie_weights, strict=strict)


def stack_module_state(models) -> tuple[dict, dict]:
    """The parameters and buffers of several models of one class, stacked: (params, buffers), two
    dicts {name: tensor with a new leading dimension of len(models)}, as torch.func.stack_module_state.

    Made for ensembles: tf.vmap over the stacked tensors of tf.functional_call on any one of
    the models runs them all at once. Names are those of named_parameters() and named_buffers().
    A parameter that requires grad in every model is stacked into a new leaf tensor that
    requires grad (detached from the models' parameters, so it can be handed to an optimizer);
    one that requires grad in none stays without. As torch, an empty list, models in different
    training modes or of different classes, and a parameter requiring grad in some models only
    are RuntimeErrors (ArgumentRuntimeError); so are models of one class with different
    parameter or buffer names or shapes.

        >>> import torch, thunderfn as tf
        >>> models = [torch.nn.Linear(3, 2) for _ in range(4)]
        >>> params, buffers = tf.stack_module_state(models)
        >>> {name: tuple(p.shape) for name, p in params.items()}, buffers
        ({'weight': (4, 2, 3), 'bias': (4, 2)}, {})
        >>> def one_model(params, x):
        ...     return tf.functional_call(models[0], params, (x,))
        >>> x = torch.randn(5, 3)
        >>> out = tf.vmap(one_model, in_axes=(0, None))(params, x)       # every model on x, at once
        >>> torch.testing.assert_close(out[2], models[2](x))
    """
    models = list(models)
    if not models:
        raise ArgumentRuntimeError("stack_module_state: Expected at least one model, got 0.")
    if not (all(m.training for m in models) or not any(m.training for m in models)):
        raise ArgumentRuntimeError("stack_module_state: Expected all models to have the same training/eval mode.")
    if any(type(m) is not type(models[0]) for m in models):
        raise ArgumentRuntimeError("stack_module_state: Expected all models to be of the same class.")
    return (_stacked([dict(m.named_parameters()) for m in models], "parameters"),
            _stacked([dict(m.named_buffers()) for m in models], "buffers"))


def _stacked(states: list, kind: str) -> dict:
    """{name: the models' tensors of that name stacked} (torch.func's stacking of one state dict)."""
    for i, state in enumerate(states[1:], 1):
        if list(state) != list(states[0]):
            raise ArgumentRuntimeError(f"stack_module_state: Expected all models to have the same {kind}, but model "
                                       f"{i} has {list(state)} where model 0 has {list(states[0])}.")
    stacked = {}
    for name in states[0]:
        tensors = [state[name] for state in states]
        shapes = [tuple(t.shape) for t in tensors]
        if len(set(shapes)) > 1:
            raise ArgumentRuntimeError(f"stack_module_state: Expected {name} from each model to have the same shape, "
                                       f"got {shapes}.")
        requires_grad = [t.requires_grad for t in tensors]
        if any(requires_grad) and not all(requires_grad):
            raise ArgumentRuntimeError(f"Expected {name} from each model to have the same .requires_grad")
        result = torch.stack(tensors)
        stacked[name] = result.detach().requires_grad_() if all(requires_grad) else result
    return stacked
