"""The "nvfuser" executor: fusion regions run as nvFuser fusions, on CUDA.

Each region (executors/fusion.py forms them) becomes one nvFuser `FusionDefinition`,
built through nvFuser's Python frontend from the prims its ops decompose into: the
leaves of each fused op's decomposition, translated one by one through `translations`
(prim id -> rule). Written against the frontend as `nvfuser_direct` (the only one since
nvFuser removed its legacy bindings in February 2026) and the legacy `nvfuser` module
spell it (the same calls in both; Thunder's nvfuserex_impl.py uses either):

    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[4, 3], contiguity=[True, True], dtype=DataType.Float,
                              stride_order=[1, 0])
        t1 = fd.ops.mul(t0, fd.define_scalar(0.5, DataType.Double))
        fd.add_output(t1)
    outputs = fd.execute([x])               # a list of tensors, one per add_output

and `compute_tensor_descriptor(sizes, strides) -> (contiguity, stride_order)` for how
nvFuser describes an input's layout. A definition fixes its inputs' contiguity and
stride order, which only the first call's tensors tell, so it is built on the first
call with each layout and kept in a process-wide cache keyed by the region's prims and
the inputs' descriptors (nvFuser compiles kernels per input signature inside it). A
region whose definition fails to build or to run warns once, naming the region, and
runs its ops unfused.

Loads only where `nvfuser_direct` or `nvfuser` can be found and CUDA is available; the
frontend is imported on the first definition. Tests pass a stand-in frontend
(`NvFuserExecutor(frontend=..., device_type="cpu")`, thunderfn/testing/nvfuser_standin.py).
Not a default executor: ask for it with `tf.jit(fn, executors=["nvfuser"])`.
"""
from __future__ import annotations

import importlib
import importlib.util
import numbers
import threading
from typing import Callable, NamedTuple

import torch

from thunderfn import prims
from thunderfn.core import progress, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.errors import ExecutorError
from thunderfn.executors.fusion import CompiledCache, FusionExecutor, Region, positional_signature
from thunderfn.prims import PrimIDs

FRONTENDS = ("nvfuser_direct", "nvfuser")  # the current module first; the legacy one was removed in 2026

# torch dtype -> nvFuser DataType member name (what Thunder's executor maps; complex and the
# small integer types are left to torch)
_DATA_TYPES = {torch.float64: "Double", torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
               torch.int64: "Int", torch.int32: "Int32", torch.bool: "Bool"}
# a Python number's DataType when it becomes an nvFuser scalar
_NUMBER_TYPES = {bool: torch.bool, int: torch.int64, float: torch.float64}
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_MAX_RANK = 8  # nvFuser's limit on a tensor's dimensions (Thunder checks the same)

# definitions shared by every region with the same prims and input layout; one build at a time
_definitions = CompiledCache()
_build_lock = threading.RLock()


# -- the rule table --------------------------------------------------------------------------------

class Rule(NamedTuple):
    """How one prim becomes nvFuser ops: `translate(b, *args, **kwargs)` (b a DefinitionBuilder,
    args the prim's, proxies included) returns the nvFuser value(s) of its output(s); `accepts`,
    asked with the same arguments at trace time, says which calls nvFuser handles (None: all)."""
    translate: Callable
    accepts: Callable | None = None


def _unary(name: str, accepts=None) -> Rule:
    return Rule(lambda b, a: getattr(b.ops, name)(b.nv(a)), accepts)


def _binary(name: str) -> Rule:
    # a Python number operand becomes a double/int64 scalar; cast back to the prim's dtype
    # (a prim's result takes its tensor operand's dtype, whatever the number's type)
    return Rule(lambda b, x, y: b.keep_dtype(getattr(b.ops, name)(*b.operands(x, y)), x, y))


def _div(b, x, y, *, rounding_mode=None):
    # nvFuser's div truncates integers (C division) and divides floats exactly
    q = b.keep_dtype(b.ops.div(*b.operands(x, y)), x, y)
    return b.ops.trunc(q) if rounding_mode == "trunc" and b.out.dtype.is_floating_point else q


def _where(b, pred, x, y):
    return b.keep_dtype(b.ops.where(*b.operands(pred, x, y)), x, y)


def _reduction(name: str) -> Rule:
    def translate(b, a, dims):
        r = getattr(b.ops, name)(b.nv(a), list(dims))
        # nvFuser sums and multiplies integers and bools into int64; the prim keeps its input's dtype
        upcast = name in ("sum", "prod") and not a.dtype.is_floating_point
        return b.ops.cast(r, b.dtype(b.out.dtype)) if upcast else r

    # nothing to reduce (no dims) is a copy, not a reduction; half-precision sums would accumulate
    # in half here (Thunder refuses them too); nvFuser has no max/min of bools
    return Rule(translate, lambda a, dims: (len(dims) > 0 and a.dtype not in _LOW_PRECISION
                                            and not (name in ("max", "min") and a.dtype is torch.bool)))


def _var_accepts(a, dims, *, correction):
    return (len(dims) > 0 and a.dtype.is_floating_point and a.dtype not in _LOW_PRECISION
            and float(correction).is_integer())


def _pad(b, a, value, config):
    widths = [w for lo, hi, _ in reversed(config) for w in (lo, hi)]  # nvFuser (and F.pad): last dim first
    return b.ops.pad(b.nv(a), widths, b.scalar(value, a.dtype))


def _index_accepts(a, index, dim):
    return index.ndim == 1 and a.ndim >= 1 and a.numel() > 0 and index.dtype in (torch.int64, torch.int32)


def _take_along_accepts(a, index, dim):
    # nvFuser's take_along_axis wants every other dimension equal, where torch's gather allows smaller
    d = dim % max(a.ndim, 1)
    return (index.ndim == a.ndim >= 1 and a.numel() > 0
            and all(i == d or index.shape[i] == a.shape[i] for i in range(a.ndim)))


def elementwise_rule(op) -> Rule:
    """The rule of an elementwise table entry (prims.py) with a same-named nvFuser op: taken for the
    dtype kinds op.nvfuser_kinds names (on integers floor and friends are identities torch runs
    without a kernel; nvFuser has no abs, neg or sign of bools)."""
    def accepts(a):
        return prims.dtype_kind(a.dtype) in op.nvfuser_kinds

    narrowed = op.nvfuser_kinds != op.kinds
    return _unary(op.nvfuser, accepts if narrowed else None) if op.arity == 1 else _binary(op.nvfuser)


translations: dict = {
    **{op.prim.id: elementwise_rule(op) for op in prims.elementwise_ops.values() if op.nvfuser is not None},
    PrimIDs.DIV: Rule(_div, lambda x, y, *, rounding_mode=None: rounding_mode in (None, "trunc")),
    PrimIDs.WHERE: Rule(_where),
    PrimIDs.SUM: _reduction("sum"),
    PrimIDs.PROD: _reduction("prod"),
    PrimIDs.AMAX: _reduction("max"),
    PrimIDs.AMIN: _reduction("min"),
    PrimIDs.VAR: Rule(lambda b, a, dims, *, correction: b.ops.var(b.nv(a), list(dims), int(correction)),
                      _var_accepts),
    PrimIDs.VAR_MEAN: Rule(lambda b, a, dims, *, correction: tuple(b.ops.var_mean(b.nv(a), list(dims),
                                                                                 int(correction))),
                           _var_accepts),
    PrimIDs.BROADCAST_IN_DIM: Rule(lambda b, a, shape, bdims: b.ops.broadcast_in_dim(b.nv(a), list(shape),
                                                                                     list(bdims))),
    PrimIDs.RESHAPE: Rule(lambda b, a, shape: b.ops.reshape(b.nv(a), list(shape))),
    PrimIDs.TRANSPOSE: Rule(lambda b, a, perm: b.ops.permute(b.nv(a), list(perm))),
    # strided slices are left to torch, as Thunder leaves them
    PrimIDs.SLICE: Rule(lambda b, a, start, end, strides=None: b.ops.slice(b.nv(a), list(start), list(end)),
                        lambda a, start, end, strides=None: strides is None or all(s == 1 for s in strides)),
    PrimIDs.SQUEEZE: Rule(lambda b, a, dims: b.ops.squeeze(b.nv(a), list(dims)), lambda a, dims: len(dims) > 0),
    PrimIDs.CAT: Rule(lambda b, tensors, dim: b.ops.cat([b.nv(t) for t in tensors], dim)),
    # nvFuser pads without interior (dilating) padding; negative padding crops, which it is not asked to do
    PrimIDs.PAD: Rule(_pad, lambda a, value, config: all(lo >= 0 and hi >= 0 and i == 0 for lo, hi, i in config)),
    PrimIDs.TAKE: Rule(lambda b, a, index, dim: b.ops.index_select(b.nv(a), b.nv(index), dim), _index_accepts),
    PrimIDs.TAKE_ALONG_AXIS: Rule(lambda b, a, index, dim: b.ops.take_along_axis(b.nv(a), b.nv(index), dim),
                                  _take_along_accepts),
    PrimIDs.CONVERT_ELEMENT_TYPE: Rule(lambda b, a, dtype: b.ops.cast(b.nv(a), b.dtype(dtype)),
                                       lambda a, dtype: dtype in _DATA_TYPES),
    PrimIDs.FULL: Rule(lambda b, shape, value, *, device, dtype: b.ops.full(list(shape), b.scalar(value, dtype),
                                                                           b.dtype(dtype)),
                       lambda shape, value, *, device, dtype: dtype in _DATA_TYPES),
    PrimIDs.IOTA: Rule(lambda b, length, *, start, step, device, dtype: b.ops.iota(
        b.scalar(length, torch.int64), b.scalar(start), b.scalar(step), b.dtype(dtype)),
        lambda length, *, start, step, device, dtype: dtype in _DATA_TYPES),
}


# -- which bound symbols nvFuser takes ---------------------------------------------------------------

def prim_leaves(bsym) -> list:
    """The leaves of bsym's decomposition, in order: what nvFuser is asked to compute."""
    if not bsym.subsymbols:
        return [bsym]
    return [leaf for s in bsym.subsymbols for leaf in prim_leaves(s)]


def _numbers_ok(bsym) -> bool:
    # a bool, int or float becomes an nvFuser scalar; complex numbers (complex tensors are refused
    # too) and other number types (numpy's) are left to torch
    return all(type(x) in _NUMBER_TYPES for x in bsym.flat_args() if isinstance(x, numbers.Number))


def translatable(bsym, device_type: str) -> bool:
    """Whether every prim in bsym's decomposition has a rule that accepts its call, on tensors
    of one `device_type` device with dtypes nvFuser has."""
    leaves = prim_leaves(bsym)
    tensors = [t for b in (bsym, *leaves) for t in b.proxies()]
    if len({t.device for t in tensors}) > 1 or any(t.device.type != device_type or t.dtype not in _DATA_TYPES
                                                   or t.ndim > _MAX_RANK for t in tensors):
        return False
    known = {p.name for p in bsym.proxy_args()}  # what the definition has a value for, so far
    for leaf in leaves:
        rule = translations.get(leaf.sym.id) if leaf.sym.is_prim else None
        if rule is None or not _numbers_ok(leaf) or (rule.accepts is not None
                                                     and not rule.accepts(*leaf.args, **leaf.kwargs)):
            return False
        if any(p.name not in known for p in leaf.proxy_args()):  # a tensor the decomposition made up itself
            return False
        known.update(o.name for o in leaf.proxy_outs())
    # each output the fused op hands on is one a prim computes (not an input passed through)
    produced = {o.name for leaf in leaves for o in leaf.proxy_outs()}
    return all(o.name in produced for o in bsym.proxy_outs())


class NvFuserExecutor(FusionExecutor):
    """See the module docstring. `frontend` replaces the nvFuser module (tests pass a stand-in);
    `device_type` is the device whose tensors it fuses: "cuda", except in tests with a stand-in
    frontend that runs on the CPU."""

    def __init__(self, name: str = "nvfuser", *, frontend=None, device_type: str = "cuda"):
        super().__init__(name, None)
        self._frontend = frontend
        self.device_type = device_type

    @property
    def frontend(self):
        """nvFuser's Python frontend module, imported on first use (it loads CUDA libraries)."""
        if self._frontend is None:
            name = _frontend_name()
            if name is None:
                raise ExecutorError(f"executor '{self.name}' cannot run here: {_availability()[1]}")
            self._frontend = importlib.import_module(name)
            self.version = getattr(self._frontend, "__version__", None)
        return self._frontend

    def availability(self) -> tuple[bool, str]:
        if self._frontend is not None:
            if self.device_type == "cuda" and not torch.cuda.is_available():
                return False, "CUDA is not available (nvFuser runs on NVIDIA GPUs)"
            return True, ""
        return _availability()

    def can_fuse(self, bsym) -> bool:
        # A FusionDefinition is built per concrete input layout from the proxies' shapes: an op on tensors
        # with symbolic sizes (core/symbolic.py) stays with the torch executor.
        return translatable(bsym, self.device_type) and not any(
            symbolic.has_symbols(p.shape) for p in bsym.proxies())

    def compile_region(self, region: Region):
        return NvFuserRegion(region, self)


# -- a region's definition -----------------------------------------------------------------------

class DefinitionBuilder:
    """What a rule translates with: the FusionDefinition being built (`fd`, its `ops`), the
    frontend (for DataType), the nvFuser value of each proxy so far, and the prim's output."""

    def __init__(self, frontend, fd):
        self.frontend, self.fd = frontend, fd
        self.values: dict = {}
        self.out = None

    @property
    def ops(self):
        return self.fd.ops

    def dtype(self, dtype: torch.dtype):
        return getattr(self.frontend.DataType, _DATA_TYPES[dtype])

    def nv(self, x):
        return self.values[x.name]

    def scalar(self, value, dtype: torch.dtype | None = None):
        return self.fd.define_scalar(value, self.dtype(_NUMBER_TYPES[type(value)] if dtype is None else dtype))

    def operands(self, *xs) -> list:
        """Elementwise operands as nvFuser values: numbers as scalars, a 0-dim tensor among larger
        ones broadcast to the output's shape (prims allow it; nvFuser is told explicitly)."""
        shape = list(self.out.shape)
        out = []
        for x in xs:
            if isinstance(x, TensorProxy):
                v = self.nv(x)
                out.append(self.ops.broadcast_in_dim(v, shape, []) if x.ndim == 0 and shape else v)
            else:
                out.append(self.scalar(x))
        return out

    def keep_dtype(self, result, *operands):
        """result cast to the prim's output dtype where a number took part (its scalar may have
        another type than the tensor, and nvFuser promotes as torch does, where the prim does not)."""
        if all(isinstance(x, TensorProxy) for x in operands):
            return result
        return self.ops.cast(result, self.dtype(self.out.dtype))


def region_prims(region: Region) -> list:
    return [leaf for b in region.bsyms for leaf in prim_leaves(b)]


def build_definition(frontend, region: Region, descriptors):
    """The region as a FusionDefinition of `frontend` (nvfuser_direct, nvfuser or a stand-in),
    for inputs with the given (contiguity, stride_order) descriptors."""
    fd = frontend.FusionDefinition()
    b = DefinitionBuilder(frontend, fd)
    with fd:
        for p, (contiguity, stride_order) in zip(region.inputs, descriptors):
            b.values[p.name] = fd.define_tensor(shape=list(p.shape), contiguity=list(contiguity),
                                                dtype=b.dtype(p.dtype), stride_order=list(stride_order))
        for leaf in region_prims(region):
            b.out = leaf.output
            result = translations[leaf.sym.id].translate(b, *leaf.args, **leaf.kwargs)
            outs = leaf.output if isinstance(leaf.output, (tuple, list)) else (leaf.output,)
            results = result if isinstance(leaf.output, (tuple, list)) else (result,)
            for o, v in zip(outs, results):
                if isinstance(o, TensorProxy):
                    b.values[o.name] = v
        inputs = {id(b.values[p.name]) for p in region.inputs}
        added = set()
        for p in region.outputs:
            v = b.values[p.name]
            # an output that is an input, or one already added (a reshape to the same shape may
            # return its operand), is copied: each output is a tensor of its own
            if id(v) in inputs or id(v) in added:
                v = b.ops.set(v)
            added.add(id(v))
            fd.add_output(v)
    return fd


def definition_signature(region: Region) -> str:
    """What a region's definition depends on besides its inputs' layout: the prims, in order."""
    return positional_signature(region, region_prims(region), lambda leaf: leaf.sym.id)


_UNFUSED = "unfused"  # what a layout maps to once its definition has failed


class NvFuserRegion:
    """A region's callable: the FusionDefinition for the layout of the inputs it is called with,
    built on the first call with that layout."""

    def __init__(self, region: Region, ex: NvFuserExecutor):
        self.region, self.ex = region, ex
        self.signature = definition_signature(region)
        self.by_layout: dict = {}  # (strides, device) of each input -> its FusionDefinition, or _UNFUSED

    def __call__(self, *tensors):
        layout = tuple((t.stride(), t.device) for t in tensors)
        fd = self.by_layout.get(layout)
        if fd is None:
            return self.first_call(layout, tensors)
        return self.run(fd, tensors)

    def run(self, fd, tensors):
        # _UNFUSED may come from the shared cache, put there by another region with the same prims
        return self.region.unfused(*tensors) if fd is _UNFUSED else fd.execute(list(tensors))

    def definitions(self) -> list:
        """The FusionDefinitions built for this region so far, one per input layout."""
        return [fd for fd in self.by_layout.values() if fd is not _UNFUSED]

    def first_call(self, layout, tensors):
        with _build_lock:
            frontend = self.ex.frontend
            descriptors = tuple(tuple(tuple(x) for x in frontend.compute_tensor_descriptor(list(t.shape),
                                                                                           list(t.stride())))
                                for t in tensors)
            key = (self.signature, descriptors)
            fd = _definitions.get(key)
            if fd is None:
                # (its first execute compiles the kernels: a stage of the compile running here, or one of its own)
                with progress.compiling_region(self.region.name, f"nvFuser compiling fusion region "
                                                                 f"{self.region.name} ({len(self.region.bsyms)} ops)"):
                    try:
                        fd = build_definition(frontend, self.region, descriptors)
                        result = fd.execute(list(tensors))
                    except Exception as e:  # any failure inside nvFuser: run the ops unfused instead
                        fd = self.fall_back(e)
                        result = self.run(fd, tensors)
                _definitions.keep(key, fd)
            else:
                result = None
        self.by_layout[layout] = fd
        return self.run(fd, tensors) if result is None else result

    def fall_back(self, error: Exception):
        self.region.warn_unfused("nvFuser could not run", error, stacklevel=5)
        return _UNFUSED


def definitions(trace) -> dict:
    """{region name: [its FusionDefinitions so far, one per input layout]} for the nvFuser regions
    of an execution trace (`tf.last_traces(jitted)[-1]`): `print` one to see what nvFuser was given."""
    return {b.sym.name: b.sym.eager.definitions() for b in trace.bound_symbols
            if isinstance(b.sym.eager, NvFuserRegion)}


# -- where nvFuser can run --------------------------------------------------------------------------

def _frontend_name() -> str | None:
    # find_spec, not import: importing nvFuser loads its CUDA libraries, and asking should be cheap
    for name in FRONTENDS:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return None


def _availability() -> tuple[bool, str]:
    if _frontend_name() is None:
        return False, ("nvFuser is not installed (neither nvfuser_direct nor nvfuser imports): pip install a wheel "
                       "matching your CUDA and torch, e.g. nvfuser-cu128-torch210")
    if not torch.cuda.is_available():
        return False, "CUDA is not available (nvFuser runs on NVIDIA GPUs)"
    return True, ""


nvfuser_ex = NvFuserExecutor()
