"""prims: the smallest set of operations everything else decomposes into.

A prim is a Symbol with a meta function: given proxies (and Python numbers) it
checks its inputs, raising torch's exception type with torch-like wording, and
returns output proxies. Prims do no broadcasting and no type promotion; clang does
that before calling them.

The elementwise prims are one line each of the elementwise table (`exp = unary_op(...)`,
`elementwise_ops`), from which clang, the torch language, the torch executor and nvFuser
make their parts; their derivatives are transforms/rules/elementwise.py's `partials`.

Every prim also computes on real tensors, with its torch implementation (`torch_impls`:
torch's own function or one of prims_eager.py's): importing this module is
enough to call `prims.add(x, y)` on tensors. The torch executor runs prims with the
same table (executors/torch_executor.py); other executors lower them their own way.

May import: core/, prims_eager.py.
"""
from __future__ import annotations

import builtins
import dataclasses
import enum
import sys
from typing import Callable, Sequence

import torch

from thunderfn import prims_eager
from thunderfn.core import dtypes, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.rules import TAG_CHEAP, TAG_MOVES_DATA_ONLY, TAG_NOT_BATCHED, TAG_NOT_DIFFERENTIABLE
from thunderfn.core.symbol import Symbol
from thunderfn.core.trace import computation_key, data_dependent_size
from thunderfn.errors import ArgumentTypeError, ArgumentValueError, invalid_argument

_this_module = sys.modules[__name__]


class PrimIDs(enum.Enum):
    # elementwise unary
    ABS = enum.auto(); NEG = enum.auto(); EXP = enum.auto(); EXP2 = enum.auto(); EXPM1 = enum.auto()
    LOG = enum.auto(); LOG1P = enum.auto(); LOG2 = enum.auto(); LOG10 = enum.auto()
    SQRT = enum.auto(); RSQRT = enum.auto(); RECIPROCAL = enum.auto()
    SIN = enum.auto(); COS = enum.auto(); TAN = enum.auto(); ASIN = enum.auto(); ACOS = enum.auto(); ATAN = enum.auto()
    SINH = enum.auto(); COSH = enum.auto(); TANH = enum.auto()
    ASINH = enum.auto(); ACOSH = enum.auto(); ATANH = enum.auto()
    ERF = enum.auto(); ERFC = enum.auto(); ERFINV = enum.auto(); LGAMMA = enum.auto(); DIGAMMA = enum.auto()
    FLOOR = enum.auto(); CEIL = enum.auto(); ROUND = enum.auto(); TRUNC = enum.auto(); SIGN = enum.auto()
    SIGNBIT = enum.auto(); BITWISE_NOT = enum.auto(); ISFINITE = enum.auto(); ISNAN = enum.auto()
    REAL = enum.auto(); IMAG = enum.auto()
    # elementwise binary
    ADD = enum.auto(); SUB = enum.auto(); MUL = enum.auto(); DIV = enum.auto(); FMOD = enum.auto()
    REMAINDER = enum.auto(); POW = enum.auto(); ATAN2 = enum.auto(); MAXIMUM = enum.auto(); MINIMUM = enum.auto()
    EQ = enum.auto(); NE = enum.auto(); LT = enum.auto(); LE = enum.auto(); GT = enum.auto(); GE = enum.auto()
    BITWISE_AND = enum.auto(); BITWISE_OR = enum.auto(); BITWISE_XOR = enum.auto()
    BITWISE_LEFT_SHIFT = enum.auto(); BITWISE_RIGHT_SHIFT = enum.auto(); COPYSIGN = enum.auto(); NEXTAFTER = enum.auto()
    # elementwise ternary
    WHERE = enum.auto()
    # reductions
    SUM = enum.auto(); PROD = enum.auto(); AMAX = enum.auto(); AMIN = enum.auto(); VAR = enum.auto()
    VAR_MEAN = enum.auto(); ARGMAX = enum.auto(); ARGMIN = enum.auto()
    # shape
    BROADCAST_IN_DIM = enum.auto(); RESHAPE = enum.auto(); TRANSPOSE = enum.auto(); SLICE = enum.auto()
    SQUEEZE = enum.auto(); CAT = enum.auto(); FLIP = enum.auto()
    # indexing
    TAKE = enum.auto(); TAKE_ALONG_AXIS = enum.auto(); NONZERO = enum.auto()
    # conversions and memory
    CONVERT_ELEMENT_TYPE = enum.auto(); DEVICE_PUT = enum.auto()
    # linear algebra
    MATMUL = enum.auto()
    # factories
    FULL = enum.auto(); IOTA = enum.auto()
    # scattering and padding
    SCATTER = enum.auto(); SCATTER_ADD = enum.auto(); PAD = enum.auto()
    # scans and sorting
    CUMSUM = enum.auto(); CUMPROD = enum.auto(); SORT = enum.auto(); TOPK = enum.auto()


def make_prim(id, name: str, *, meta: Callable, impl: Callable | None = None, tags: Sequence = ()) -> Symbol:
    """Define a prim: `id` (a PrimIDs member or any hashable), `name` (an identifier,
    printed as prims.<name>), `meta` (proxies in, output proxies out).

    A prim is an operation thunderfn does not decompose: for an operation that has no
    decomposition into existing prims (most new operations are better written as a
    torch-language symbol, see tf.torch.torchsymbol). `meta(*args, **kwargs)` receives
    TensorProxy objects and Python values, checks them as torch would (thunderfn.prims.check)
    and returns the output proxies. `impl`, when given, is how it computes on real tensors, eagerly and
    on the torch executor (`implement`). `tags`: properties transforms read ("random", core/rules.py's
    TAG_ constants, ...).
    Returns the Symbol, also set as `thunderfn.prims.<name>`; a name that is not an identifier
    is an ArgumentValueError. It runs nowhere until an executor implements it, usually torch's:
    `tf.executors.torch_ex.register_prim(prim, fn)`; it is differentiable once it has a VJP
    rule (tf.extend.defvjp), batchable once it has a batching rule (tf.extend.defbatch);
    tf.extend.primitive makes one with its implementation and rules in one call.

        >>> import torch, thunderfn as tf
        >>> from thunderfn.testing.registries import RegistrySnapshot
        >>> snapshot = RegistrySnapshot()  # to undo this example's registrations at its end
        >>> def cube_meta(a):
        ...     return tf.TensorProxy(shape=a.shape, dtype=a.dtype, device=a.device)
        >>> cube = tf.prims.make_prim("docs.cube", "cube", meta=cube_meta)
        >>> tf.executors.torch_ex.register_prim(cube, lambda a: a ** 3)
        >>> x = torch.tensor([1.0, 2.0])
        >>> [bsym.sym for bsym in tf.trace(lambda x: cube(x) + 1, x).bound_symbols]
        [[Symbol name=prims.cube], [Symbol name=ltorch.add]]
        >>> cube(x)
        tensor([1., 8.])
        >>> snapshot.restore()
    """
    if not (isinstance(name, str) and name.isidentifier()):
        raise ArgumentValueError(f"a prim's name must be a Python identifier, got {name!r}")
    sym = Symbol(name, id, meta=meta, is_prim=True, print_name=f"prims.{name}",
                 namespace={"prims": _this_module}, tags=frozenset(tags))
    setattr(_this_module, name, sym)
    if impl is not None:
        implement(sym, impl)
    return sym


# -- checks shared by the meta functions -----------------------------------------------
def check(cond: bool, msg: Callable[[], str], exc: type = RuntimeError) -> None:
    """Raise `exc`, the builtin torch raises for the same operands, as thunderfn's InvalidArgumentError
    of that builtin (both `except RuntimeError` and `except tf.errors.InvalidArgumentError` catch it)."""
    if not cond:
        raise invalid_argument(exc)(msg())


def check_tensor(a, opname: str, argname: str = "input") -> None:
    check(isinstance(a, TensorProxy),
          lambda: f"{opname}(): argument '{argname}' must be Tensor, not {type(a).__name__}", TypeError)


def canonical_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    check(-n <= dim < n,
          lambda: f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})", IndexError)
    return dim % n


def canonical_dims(dims, ndim: int) -> tuple:
    canonical = [canonical_dim(d, ndim) for d in dims]
    for i, d in enumerate(canonical):
        check(d not in canonical[:i], lambda: f"dim {d} appears multiple times in the list of dims")
    return tuple(sorted(canonical))


def _out(like: TensorProxy, *, shape=None, dtype=None, device=None) -> TensorProxy:
    return TensorProxy(shape=like.shape if shape is None else shape, dtype=like.dtype if dtype is None else dtype,
                       device=like.device if device is None else device)


# -- on real tensors -------------------------------------------------------------------
# Each prim's torch implementation, by id: what the prim computes when called outside tracing (its
# `eager`), and what the torch executor calls for it (executors/torch_executor.py; TorchExecutor.register_prim
# adds a new prim's). A binary prim's number_impls entry serves a Python number operand. An elementwise
# op's entries are made by its table line below; the other prims' are listed at the end of this module.
torch_impls: dict = {}
number_impls: dict = {}


def implement(prim: Symbol, fn) -> None:
    """The one way a prim gets its torch implementation: how it computes on real tensors (its
    `eager`) and how the torch executor runs it (TorchExecutor.register_prim wraps this for a new
    prim). A binary prim computes a Python number operand as its number_impls entry does."""
    torch_impls[prim.id] = fn
    prim.eager = fn if prim.id not in number_impls else prims_eager.binary_eager(fn, number_impls[prim.id])


# -- elementwise -----------------------------------------------------------------------
# The dtype kinds a prim takes, in the order its refusal names them.
FLOAT, INT, BOOL, COMPLEX = "float", "int", "bool", "complex"
ANY = (FLOAT, INT, BOOL, COMPLEX)


def dtype_kind(dtype) -> str:
    """FLOAT, INT, BOOL or COMPLEX: the kind of a dtype, as an elementwise op's `kinds` name them."""
    return (BOOL, INT, FLOAT, COMPLEX)[dtypes.category(dtype)]


_SCALAR_TYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
    torch.complex32: "ComplexHalf",
}


def scalar_type_name(dtype: torch.dtype) -> str:
    """How torch's messages name a dtype ('Float', 'Long', 'Bool')."""
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def check_dtype_supported(ok: bool, opname: str, dtype: torch.dtype, hint: str = "") -> None:
    """torch's dispatch failure for an unsupported dtype: NotImplementedError, "... not implemented for 'Bool'"."""
    check(ok, lambda: f"\"{opname}\" not implemented for '{scalar_type_name(dtype)}'{hint}", NotImplementedError)


class Promotion(enum.Enum):
    """How an elementwise op derives its result dtype from the promoted input dtype (clang promotes
    before calling the prim; the prim's own result dtype follows from it too)."""
    DEFAULT = "default"  # result_type of the inputs
    INT_TO_FLOAT = "int_to_float"  # bool/int results become the default float dtype (exp, sqrt, true div)
    ALWAYS_BOOL = "always_bool"  # comparisons: inputs promoted together, result bool
    COMPLEX_TO_FLOAT = "complex_to_float"  # abs: complex results become their real dtype
    BOOL_TO_LONG = "bool_to_long"  # bool results become int64 (sum of bools)


DEFAULT, INT_TO_FLOAT, ALWAYS_BOOL, COMPLEX_TO_FLOAT = (Promotion.DEFAULT, Promotion.INT_TO_FLOAT,
                                                        Promotion.ALWAYS_BOOL, Promotion.COMPLEX_TO_FLOAT)


def _prim_dtype(promotion: Promotion, dtype: torch.dtype) -> torch.dtype:
    """The dtype of a prim's result for inputs of `dtype` (already promoted by clang)."""
    if promotion is Promotion.ALWAYS_BOOL:
        return torch.bool
    return dtypes.to_real(dtype) if promotion is Promotion.COMPLEX_TO_FLOAT else dtype


@dataclasses.dataclass(frozen=True)
class TorchSymbol:
    """The torch-language symbol of an elementwise op that is its clang function behind torch's
    argument checks (torch/elementwise.py makes it; an op whose symbol has checks or extras of its
    own is written there by hand instead). It stands for torch.<name>, Tensor.<name> and
    torch.special.<name> where they exist, then `also`; `number_input`, `number_other`: whether
    torch takes a Python number as that operand of a binary op (its signature says)."""
    also: tuple = ()
    number_input: bool = True
    number_other: bool = True


SYMBOL = TorchSymbol()  # a plain symbol with torch's own names only


@dataclasses.dataclass(frozen=True)
class ElementwiseOp:
    """One elementwise op, from which each layer makes its part: the prim (its meta refuses dtype
    kinds outside `kinds`), its torch implementation (torch_impls, number_impls), clang's function
    (promotes by `promotion`, broadcasts, calls the prim), the torch-language symbol (`ltorch`, a
    TorchSymbol, or None where it is hand-written or absent), and nvFuser's op of the name `nvfuser`
    (None: no same-named op), taken for dtypes of `nvfuser_kinds`. Derivatives are the transforms'
    (transforms/rules/elementwise.py's `partials`, one line per prim: they are written in the torch
    language, which this layer cannot import)."""
    prim: Symbol
    kinds: tuple
    promotion: Promotion
    ltorch: TorchSymbol | None
    nvfuser: str | None
    nvfuser_kinds: tuple
    arity: int  # 1 or 2 operands
    clang: bool = True  # False: clang's function is hand-written (div's rounding modes)

    @property
    def name(self) -> str:
        return self.prim.name


elementwise_ops: dict[str, ElementwiseOp] = {}  # name -> entry, in table order


def _op_name(id, name) -> str:
    return name if name is not None else id.name.lower()


def _add_op(prim, arity, kinds, promotion, ltorch, nvfuser, nvfuser_kinds, clang, impl, number_impl=None) -> Symbol:
    if number_impl is not None:
        number_impls[prim.id] = number_impl
    implement(prim, impl if impl is not None else getattr(torch, prim.name))
    elementwise_ops[prim.name] = ElementwiseOp(prim, tuple(kinds), promotion, ltorch, nvfuser,
                                               tuple(kinds if nvfuser_kinds is None else nvfuser_kinds), arity, clang)
    return prim


def _elementwise_tags(kinds, promotion) -> tuple:
    """An elementwise prim's tags: one whose output is never floating point (a comparison, a bitwise
    op) carries no gradient."""
    inexact_out = promotion is not Promotion.ALWAYS_BOOL and (FLOAT in kinds or COMPLEX in kinds)
    return ("elementwise",) if inexact_out else ("elementwise", TAG_NOT_DIFFERENTIABLE)


def _unary_meta(name, supported, promotion):
    def meta(a):
        check_tensor(a, f"prims.{name}")
        check_dtype_supported(dtype_kind(a.dtype) in supported, name, a.dtype,
                              f" (prims.{name} takes {' or '.join(supported)} tensors)")
        return _out(a, dtype=_prim_dtype(promotion, a.dtype))

    return meta


def unary_op(id, kinds=(FLOAT, COMPLEX), promotion=Promotion.DEFAULT, *, name=None, impl=None, ltorch=None,
             nvfuser=None, nvfuser_kinds=None) -> Symbol:
    """An elementwise prim of one tensor, with every layer's part (ElementwiseOp): `id` a PrimIDs
    member (named by it) or, outside the library, any hashable with `name`; `impl` its torch
    implementation (torch.<name> unless given)."""
    name = _op_name(id, name)
    prim = make_prim(id, name, meta=_unary_meta(name, tuple(kinds), promotion),
                     tags=_elementwise_tags(kinds, promotion))
    return _add_op(prim, 1, kinds, promotion, ltorch, nvfuser, nvfuser_kinds, True, impl)


def _binary_meta(name, supported=ANY, promotion=Promotion.DEFAULT):
    def meta(a, b):
        tensors = [x for x in (a, b) if isinstance(x, TensorProxy)]
        check(bool(tensors), lambda: f"prims.{name}: expected at least one tensor input", TypeError)
        for x in (a, b):
            check(isinstance(x, (TensorProxy, symbolic.NUMBER_TYPES)),
                  lambda: f"prims.{name}: expected a tensor or a number, got {type(x).__name__}", TypeError)
        if len(tensors) == 2:
            check(a.dtype == b.dtype,
                  lambda: f"prims.{name}: expected both inputs to have the same dtype, got {a.dtype} and {b.dtype} "
                          f"(clang.{name} promotes types)")
            check(a.shape == b.shape or a.ndim == 0 or b.ndim == 0,
                  lambda: f"prims.{name}: expected inputs of the same shape, got {tuple(a.shape)} and {tuple(b.shape)} "
                          f"(clang.{name} broadcasts)")
            check(a.device == b.device or (a.ndim == 0 and a.device.type == "cpu")
                  or (b.ndim == 0 and b.device.type == "cpu"),
                  lambda: "Expected all tensors to be on the same device, but found at least two devices, "
                          f"{a.device} and {b.device}!")
        big = max(tensors, key=lambda t: t.ndim)
        dtype = tensors[0].dtype
        check_dtype_supported(dtype_kind(dtype) in supported, name, dtype,
                              f" (prims.{name} takes {' or '.join(supported)} tensors)")
        return _out(big, dtype=_prim_dtype(promotion, dtype))

    return meta


def binary_op(id, kinds=ANY, promotion=Promotion.DEFAULT, *, name=None, impl=None, ltorch=None, nvfuser=None,
              nvfuser_kinds=None, meta=None, clang=True) -> Symbol:
    """An elementwise prim of two operands (tensors, or one a Python number), with every layer's part
    (ElementwiseOp); as unary_op. `meta` replaces the shared one (div's rounding modes), and `clang`
    False leaves clang's function to be written by hand."""
    name = _op_name(id, name)
    impl = impl if impl is not None else getattr(torch, name)
    prim = make_prim(id, name, meta=meta or _binary_meta(name, tuple(kinds), promotion),
                     tags=_elementwise_tags(kinds, promotion))
    return _add_op(prim, 2, kinds, promotion, ltorch, nvfuser, nvfuser_kinds, clang, impl,
                   prims_eager.with_tensor_operands(impl))


_NO_BOOL = (FLOAT, INT, COMPLEX)  # nvFuser has no abs, neg or sign of bools
_T = torch.Tensor

# The elementwise ops: one line each (ElementwiseOp says what each field makes).
abs = unary_op(PrimIDs.ABS, (FLOAT, INT, COMPLEX, BOOL), COMPLEX_TO_FLOAT, nvfuser="abs", nvfuser_kinds=_NO_BOOL)
neg = unary_op(PrimIDs.NEG, (FLOAT, INT, COMPLEX), nvfuser="neg", nvfuser_kinds=_NO_BOOL)
exp = unary_op(PrimIDs.EXP, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="exp")
exp2 = unary_op(PrimIDs.EXP2, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="exp2")
expm1 = unary_op(PrimIDs.EXPM1, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="expm1")
log = unary_op(PrimIDs.LOG, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="log")
log1p = unary_op(PrimIDs.LOG1P, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="log1p")
log2 = unary_op(PrimIDs.LOG2, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="log2")
log10 = unary_op(PrimIDs.LOG10, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="log10")
sqrt = unary_op(PrimIDs.SQRT, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="sqrt")
rsqrt = unary_op(PrimIDs.RSQRT, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="rsqrt")
reciprocal = unary_op(PrimIDs.RECIPROCAL, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="reciprocal")
sin = unary_op(PrimIDs.SIN, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="sin")
cos = unary_op(PrimIDs.COS, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="cos")
tan = unary_op(PrimIDs.TAN, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="tan")
asin = unary_op(PrimIDs.ASIN, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="asin")
acos = unary_op(PrimIDs.ACOS, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="acos")
atan = unary_op(PrimIDs.ATAN, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="atan")
sinh = unary_op(PrimIDs.SINH, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="sinh")
cosh = unary_op(PrimIDs.COSH, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="cosh")
tanh = unary_op(PrimIDs.TANH, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="tanh")
asinh = unary_op(PrimIDs.ASINH, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="asinh")
acosh = unary_op(PrimIDs.ACOSH, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="acosh")
atanh = unary_op(PrimIDs.ATANH, (FLOAT, COMPLEX), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="atanh")
erf = unary_op(PrimIDs.ERF, (FLOAT,), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="erf")
erfc = unary_op(PrimIDs.ERFC, (FLOAT,), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="erfc")
erfinv = unary_op(PrimIDs.ERFINV, (FLOAT,), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="erfinv")
lgamma = unary_op(PrimIDs.LGAMMA, (FLOAT,), INT_TO_FLOAT, ltorch=SYMBOL, nvfuser="lgamma")
digamma = unary_op(PrimIDs.DIGAMMA, (FLOAT,), INT_TO_FLOAT, ltorch=SYMBOL)
# on integers floor, ceil, round and trunc are identities torch runs without a kernel: nvFuser takes floats
floor = unary_op(PrimIDs.FLOOR, (FLOAT, INT), ltorch=SYMBOL, nvfuser="floor", nvfuser_kinds=(FLOAT,))
ceil = unary_op(PrimIDs.CEIL, (FLOAT, INT), ltorch=SYMBOL, nvfuser="ceil", nvfuser_kinds=(FLOAT,))
round = unary_op(PrimIDs.ROUND, (FLOAT, INT), nvfuser="round", nvfuser_kinds=(FLOAT,))
trunc = unary_op(PrimIDs.TRUNC, (FLOAT, INT), ltorch=SYMBOL, nvfuser="trunc", nvfuser_kinds=(FLOAT,))
sign = unary_op(PrimIDs.SIGN, (FLOAT, INT, BOOL), ltorch=SYMBOL, nvfuser="sign", nvfuser_kinds=_NO_BOOL)
signbit = unary_op(PrimIDs.SIGNBIT, (FLOAT, INT, BOOL), ALWAYS_BOOL, ltorch=SYMBOL, nvfuser="signbit")
bitwise_not = unary_op(PrimIDs.BITWISE_NOT, (INT, BOOL), ltorch=SYMBOL, nvfuser="bitwise_not")
isfinite = unary_op(PrimIDs.ISFINITE, ANY, ALWAYS_BOOL, ltorch=SYMBOL, nvfuser="isfinite")
isnan = unary_op(PrimIDs.ISNAN, ANY, ALWAYS_BOOL, ltorch=SYMBOL, nvfuser="isnan")
real = unary_op(PrimIDs.REAL, (COMPLEX,), COMPLEX_TO_FLOAT)
imag = unary_op(PrimIDs.IMAG, (COMPLEX,), COMPLEX_TO_FLOAT)

add = binary_op(PrimIDs.ADD, ANY, nvfuser="add")
sub = binary_op(PrimIDs.SUB, ANY, nvfuser="sub")
mul = binary_op(PrimIDs.MUL, ANY, nvfuser="mul")
pow = binary_op(PrimIDs.POW, ANY, nvfuser="pow")
maximum = binary_op(PrimIDs.MAXIMUM, ANY, ltorch=TorchSymbol(number_input=False, number_other=False), nvfuser="maximum")
minimum = binary_op(PrimIDs.MINIMUM, ANY, ltorch=TorchSymbol(number_input=False, number_other=False), nvfuser="minimum")
eq = binary_op(PrimIDs.EQ, ANY, ALWAYS_BOOL, ltorch=TorchSymbol((_T.__eq__,), number_input=False), nvfuser="eq")
ne = binary_op(PrimIDs.NE, ANY, ALWAYS_BOOL,
               ltorch=TorchSymbol((_T.__ne__, torch.not_equal, _T.not_equal), number_input=False), nvfuser="ne")
lt = binary_op(PrimIDs.LT, ANY, ALWAYS_BOOL,
               ltorch=TorchSymbol((_T.__lt__, torch.less, _T.less), number_input=False), nvfuser="lt")
le = binary_op(PrimIDs.LE, ANY, ALWAYS_BOOL,
               ltorch=TorchSymbol((_T.__le__, torch.less_equal, _T.less_equal), number_input=False), nvfuser="le")
gt = binary_op(PrimIDs.GT, ANY, ALWAYS_BOOL,
               ltorch=TorchSymbol((_T.__gt__, torch.greater, _T.greater), number_input=False), nvfuser="gt")
ge = binary_op(PrimIDs.GE, ANY, ALWAYS_BOOL,
               ltorch=TorchSymbol((_T.__ge__, torch.greater_equal, _T.greater_equal), number_input=False), nvfuser="ge")
fmod = binary_op(PrimIDs.FMOD, (FLOAT, INT), nvfuser="fmod")
remainder = binary_op(PrimIDs.REMAINDER, (FLOAT, INT), nvfuser="remainder")
atan2 = binary_op(PrimIDs.ATAN2, (FLOAT,), INT_TO_FLOAT,
                  ltorch=TorchSymbol((_T.arctan2, torch.arctan2), number_input=False, number_other=False),
                  nvfuser="atan2")
copysign = binary_op(PrimIDs.COPYSIGN, (FLOAT,), INT_TO_FLOAT, ltorch=TorchSymbol(number_input=False))
nextafter = binary_op(PrimIDs.NEXTAFTER, (FLOAT,), INT_TO_FLOAT, nvfuser="nextafter")
bitwise_and = binary_op(PrimIDs.BITWISE_AND, (INT, BOOL), ltorch=TorchSymbol((_T.__and__,)), nvfuser="bitwise_and")
bitwise_or = binary_op(PrimIDs.BITWISE_OR, (INT, BOOL), ltorch=TorchSymbol((_T.__or__,)), nvfuser="bitwise_or")
bitwise_xor = binary_op(PrimIDs.BITWISE_XOR, (INT, BOOL), ltorch=TorchSymbol((_T.__xor__,)), nvfuser="bitwise_xor")
bitwise_left_shift = binary_op(PrimIDs.BITWISE_LEFT_SHIFT, (INT,), ltorch=TorchSymbol((_T.__lshift__,)),
                               nvfuser="bitwise_left_shift")
bitwise_right_shift = binary_op(PrimIDs.BITWISE_RIGHT_SHIFT, (INT,), ltorch=TorchSymbol((_T.__rshift__,)),
                                nvfuser="bitwise_right_shift")


def _div_meta(a, b, *, rounding_mode=None):
    check(rounding_mode in (None, "trunc", "floor"),
          lambda: f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")
    out = _binary_div_shape(a, b)
    check(rounding_mode is not None or dtypes.is_inexact(out.dtype),
          lambda: "prims.div: true division needs floating inputs (clang.div converts integers)")
    return out


_binary_div_shape = _binary_meta("div", (FLOAT, INT, COMPLEX))
# div's meta, clang functions (true_divide, div), torch symbol and nvFuser rule take its rounding modes
div = binary_op(PrimIDs.DIV, (FLOAT, INT, COMPLEX), meta=_div_meta, clang=False)


def _where_meta(pred, a, b):
    check_tensor(pred, "prims.where", "condition")
    check(pred.dtype is torch.bool,
          lambda: f"where expected condition to be a boolean tensor, but got a tensor with dtype {pred.dtype}")
    tensors = [x for x in (pred, a, b) if isinstance(x, TensorProxy)]
    values = [x for x in (a, b) if isinstance(x, TensorProxy)]
    check(all(t.shape == pred.shape or t.ndim == 0 for t in tensors),
          lambda: f"prims.where: expected inputs of the same shape, got {[tuple(t.shape) for t in tensors]} "
                  "(clang.where broadcasts)")
    check(len({t.dtype for t in values}) <= 1,
          lambda: f"expected scalar type {values[0].dtype} but found {values[-1].dtype}")
    dtype = values[0].dtype if values else dtypes.result_type(a, b)
    return _out(pred, dtype=dtype)


make_prim(PrimIDs.WHERE, "where", meta=_where_meta, impl=torch.where, tags=("elementwise",))


# -- reductions ------------------------------------------------------------------------
def _reduced_shape(a, dims) -> tuple:
    return tuple(s for i, s in enumerate(a.shape) if i not in dims)


def _reduction(id, name, impl, out_dtype=None):
    def meta(a, dims):
        check_tensor(a, f"prims.{name}")
        dims = canonical_dims(dims, a.ndim) if a.ndim else ()  # a 0-dim tensor takes dim 0, reducing nothing
        if name in ("amax", "amin"):  # no identity element to return for an empty reduction
            for d in dims:
                check(a.shape[d] != 0,
                      lambda: f"{name}(): Expected reduction dim {d} to have non-zero size.", IndexError)
        return _out(a, shape=_reduced_shape(a, dims), dtype=out_dtype(a.dtype) if out_dtype else a.dtype)

    return make_prim(id, name, meta=meta, impl=impl, tags=("reduction",))


_reduction(PrimIDs.SUM, "sum", prims_eager.reduce_sum)
_reduction(PrimIDs.PROD, "prod", prims_eager.reduce_prod)
_reduction(PrimIDs.AMAX, "amax", prims_eager.reduce_amax)
_reduction(PrimIDs.AMIN, "amin", prims_eager.reduce_amin)


def _var_meta(a, dims, *, correction):
    check_tensor(a, "prims.var")
    check(dtypes.is_inexact(a.dtype),
          lambda: f"std and var only support floating point and complex dtypes, got {a.dtype}")
    dims = canonical_dims(dims, a.ndim)
    return _out(a, shape=_reduced_shape(a, dims), dtype=dtypes.to_real(a.dtype))


make_prim(PrimIDs.VAR, "var", meta=_var_meta, impl=prims_eager.reduce_var, tags=("reduction",))


def _var_mean_meta(a, dims, *, correction):
    var = _var_meta(a, dims, correction=correction)
    return var, _out(var, dtype=a.dtype)


make_prim(PrimIDs.VAR_MEAN, "var_mean", meta=_var_mean_meta, impl=prims_eager.reduce_var_mean, tags=("reduction",))


def _arg_reduction(id, name, impl):
    def meta(a, dim):
        check_tensor(a, f"prims.{name}")
        if dim is None:
            check(a.numel() > 0,
                  lambda: f"{name}(): Expected reduction dim to be specified for input.numel() == 0.", IndexError)
            return _out(a, shape=(), dtype=torch.int64)
        d = canonical_dim(dim, a.ndim)
        check(a.ndim == 0 or a.shape[d] != 0,
              lambda: f"{name}(): Expected reduction dim {d} to have non-zero size.", IndexError)
        return _out(a, shape=_reduced_shape(a, (d,)), dtype=torch.int64)

    return make_prim(id, name, meta=meta, impl=impl, tags=("reduction", TAG_NOT_DIFFERENTIABLE))  # (integer indices)


_arg_reduction(PrimIDs.ARGMAX, "argmax", torch.argmax)
_arg_reduction(PrimIDs.ARGMIN, "argmin", torch.argmin)


# -- shapes ----------------------------------------------------------------------------
def _broadcast_in_dim_meta(a, shape, broadcast_dimensions):
    check_tensor(a, "prims.broadcast_in_dim")
    shape, bdims = tuple(shape), tuple(broadcast_dimensions)
    check(len(bdims) == a.ndim, lambda: f"prims.broadcast_in_dim: need one broadcast dimension per input dimension, "
                                        f"got {bdims} for a {a.ndim}-d tensor")
    check(all(0 <= d < len(shape) for d in bdims) and list(bdims) == sorted(set(bdims)),
          lambda: f"prims.broadcast_in_dim: broadcast_dimensions {bdims} must be increasing and within the "
                  f"{len(shape)}-d output")
    for i, d in enumerate(bdims):
        check(symbolic.expands_to(a.shape[i], shape[d]),
              lambda: f"The expanded size of the tensor ({shape[d]}) must match the existing size ({a.shape[i]}) "
                      f"at non-singleton dimension {d}.  Target sizes: {list(shape)}.  Tensor sizes: {list(a.shape)}")
    return _out(a, shape=shape)


make_prim(PrimIDs.BROADCAST_IN_DIM, "broadcast_in_dim", meta=_broadcast_in_dim_meta, impl=prims_eager.broadcast_in_dim,
          tags=("shape", TAG_MOVES_DATA_ONLY))


def _reshape_meta(a, shape):
    check_tensor(a, "prims.reshape")
    shape = tuple(shape)
    check(all(symbolic.is_int(s) and s >= 0 for s in shape), lambda: f"prims.reshape: invalid shape {shape}")
    check(symbolic.product(shape) == a.numel(),
          lambda: f"shape '{list(shape)}' is invalid for input of size {a.numel()}")
    return _out(a, shape=shape)


make_prim(PrimIDs.RESHAPE, "reshape", meta=_reshape_meta, impl=torch.reshape, tags=("shape", TAG_MOVES_DATA_ONLY))


def _transpose_meta(a, permutation):
    check_tensor(a, "prims.transpose")
    perm = tuple(permutation)
    check(sorted(perm) == list(range(a.ndim)),
          lambda: "permute(sparse_coo): number of dimensions in the tensor input does not match the length of the "
                  f"desired ordering of dimensions i.e. input.dim() = {a.ndim} is not equal to len(dims) = {len(perm)}"
          if len(perm) != a.ndim else "permute(): duplicate dims are not allowed.")
    return _out(a, shape=tuple(a.shape[p] for p in perm))


make_prim(PrimIDs.TRANSPOSE, "transpose", meta=_transpose_meta, impl=torch.permute, tags=("shape", TAG_MOVES_DATA_ONLY))


def _slice_meta(a, start_indices, end_indices, strides=None):
    check_tensor(a, "prims.slice")
    strides = tuple(strides) if strides is not None else (1,) * a.ndim
    check(len(start_indices) == len(end_indices) == len(strides) == a.ndim,
          lambda: f"prims.slice: expected {a.ndim} start, end and stride values")
    shape = []
    for s, e, st, n in zip(start_indices, end_indices, strides, a.shape):
        check(0 <= s <= e <= n and st >= 1,
              lambda: f"prims.slice: invalid slice [{s}:{e}:{st}] of a dimension of length {n}")
        shape.append((e - s + st - 1) // st)
    return _out(a, shape=tuple(shape))


make_prim(PrimIDs.SLICE, "slice", meta=_slice_meta, impl=prims_eager.slice_prim, tags=("shape", TAG_MOVES_DATA_ONLY))


def _squeeze_meta(a, dims):
    check_tensor(a, "prims.squeeze")
    dims = canonical_dims(dims, a.ndim)
    check(all(a.shape[d] == 1 for d in dims),
          lambda: f"prims.squeeze: dims {dims} of shape {tuple(a.shape)} are not all 1")
    return _out(a, shape=_reduced_shape(a, dims))


make_prim(PrimIDs.SQUEEZE, "squeeze", meta=_squeeze_meta, impl=torch.squeeze, tags=("shape", TAG_MOVES_DATA_ONLY))


def _cat_meta(tensors, dim):
    check(isinstance(tensors, (list, tuple)) and len(tensors) > 0,
          lambda: "torch.cat(): expected a non-empty list of Tensors", ValueError if not tensors else TypeError)
    for t in tensors:
        check_tensor(t, "prims.cat", "tensors")
    first = tensors[0]
    d = canonical_dim(dim, first.ndim)
    for i, t in enumerate(tensors):
        check(t.ndim == first.ndim,
              lambda: f"Tensors must have same number of dimensions: got {first.ndim} and {t.ndim}")
        check(t.dtype == first.dtype, lambda: f"prims.cat: expected tensors of one dtype, got {first.dtype} and "
                                              f"{t.dtype} (ltorch.cat promotes)")
        check(t.device == first.device, lambda: "Expected all tensors to be on the same device, but found at least "
                                                f"two devices, {first.device} and {t.device}!")
        for j in range(first.ndim):
            check(j == d or t.shape[j] == first.shape[j],
                  lambda: f"Sizes of tensors must match except in dimension {d}. Expected size {first.shape[j]} but "
                          f"got size {t.shape[j]} for tensor number {i} in the list.")
    shape = list(first.shape)
    shape[d] = builtins.sum(t.shape[d] for t in tensors)  # `sum` is the prim here
    return _out(first, shape=tuple(shape))


make_prim(PrimIDs.CAT, "cat", meta=_cat_meta, impl=torch.cat, tags=("shape", TAG_MOVES_DATA_ONLY))


def _flip_meta(a, dims):
    check_tensor(a, "prims.flip")
    canonical_dims(dims, a.ndim)
    return _out(a)


make_prim(PrimIDs.FLIP, "flip", meta=_flip_meta, impl=torch.flip, tags=("shape", TAG_MOVES_DATA_ONLY))


# -- indexing --------------------------------------------------------------------------
def _check_index(index, opname):
    check_tensor(index, opname, "index")
    check(index.dtype in (torch.int64, torch.int32),
          lambda: f"{opname}(): Expected dtype int32 or int64 for index" if opname == "index_select" else
                  f"{opname}(): Expected dtype int32/int64 for index", RuntimeError)


def _take_meta(a, index, dim):
    check_tensor(a, "prims.take")
    _check_index(index, "index_select")
    check(index.ndim <= 1, lambda: "index_select(): Index is supposed to be a vector", IndexError)
    d = canonical_dim(dim, a.ndim)
    shape = list(a.shape)
    if a.ndim:
        shape[d] = index.numel()
    return _out(a, shape=tuple(shape))


make_prim(PrimIDs.TAKE, "take", meta=_take_meta, impl=prims_eager.take)


def _take_along_axis_meta(a, index, dim):
    check_tensor(a, "prims.take_along_axis")
    _check_index(index, "gather")
    d = canonical_dim(dim, a.ndim)
    # torch reads a 0-dim tensor as 1-dim here
    check(max(index.ndim, 1) == max(a.ndim, 1),
          lambda: "Index tensor must have the same number of dimensions as input tensor")
    for i in range(min(a.ndim, index.ndim)):
        check(i == d or index.shape[i] <= a.shape[i],
              lambda: f"Size does not match at dimension {i} expected index {list(index.shape)} to be no larger than "
                      f"self {list(a.shape)} apart from dimension {d}")
    return _out(a, shape=index.shape)


make_prim(PrimIDs.TAKE_ALONG_AXIS, "take_along_axis", meta=_take_along_axis_meta, impl=prims_eager.take_along_axis)


def _nonzero_meta(a):
    """The positions of a's nonzero elements, one row each: how many there are is known only at run time, a
    data-dependent size (core/symbolic.py) between 0 and a's numel. The same a (or a computed the same way from
    the same inputs: core/trace.py's computation_key) gives the same size."""
    check_tensor(a, "prims.nonzero")
    n = a.numel()
    count = 0 if type(n) is int and n == 0 else data_dependent_size(
        n, f"the number of nonzero elements of {a.name} (prims.nonzero)", memo=("nonzero", computation_key(a)))
    return TensorProxy(shape=(count, a.ndim), dtype=torch.int64, device=a.device)


make_prim(PrimIDs.NONZERO, "nonzero", meta=_nonzero_meta, impl=torch.nonzero,
          tags=(TAG_NOT_DIFFERENTIABLE,))  # (integer indices)


# -- conversions -----------------------------------------------------------------------
def _convert_element_type_meta(a, dtype):
    check(isinstance(dtype, torch.dtype),
          lambda: f"prims.convert_element_type: expected a torch.dtype, got {dtype!r}", TypeError)
    if isinstance(a, symbolic.NUMBER_TYPES):
        raise ArgumentTypeError("prims.convert_element_type converts tensors; convert numbers in Python")
    check_tensor(a, "prims.convert_element_type")
    return _out(a, dtype=dtype)


make_prim(PrimIDs.CONVERT_ELEMENT_TYPE, "convert_element_type", meta=_convert_element_type_meta,
          impl=prims_eager.convert_element_type,
          tags=(TAG_MOVES_DATA_ONLY, TAG_CHEAP))


def _device_put_meta(a, device):
    check_tensor(a, "prims.device_put")
    return _out(a, device=torch.device(device))


make_prim(PrimIDs.DEVICE_PUT, "device_put", meta=_device_put_meta, impl=prims_eager.device_put,
          tags=(TAG_MOVES_DATA_ONLY,))


# -- linear algebra --------------------------------------------------------------------
def _broadcast_batch(a_batch, b_batch) -> list:
    ndim = max(len(a_batch), len(b_batch))
    a_batch, b_batch = (1,) * (ndim - len(a_batch)) + tuple(a_batch), (1,) * (ndim - len(b_batch)) + tuple(b_batch)
    for j, (x, y) in enumerate(zip(a_batch, b_batch)):
        check(symbolic.broadcastable(x, y),
              lambda: f"The size of tensor a ({x}) must match the size of tensor b ({y}) at "
                      f"non-singleton dimension {j}")
    return [symbolic.broadcast_size(x, y) for x, y in zip(a_batch, b_batch)]


def matmul_shape(a_shape, b_shape) -> tuple:
    """torch.matmul's output shape, with the message of the kernel torch picks for each rank pair."""
    an, bn = len(a_shape), len(b_shape)
    check(an > 0 and bn > 0, lambda: f"both arguments to matmul need to be at least 1D, but they are {an}D and {bn}D")
    if an == 1 and bn == 1:
        check(a_shape[0] == b_shape[0],
              lambda: f"inconsistent tensor size, expected tensor [{a_shape[0]}] and src [{b_shape[0]}] to have the "
                      f"same number of elements, but got {a_shape[0]} and {b_shape[0]} elements respectively")
        return ()
    a2 = (1, a_shape[0]) if an == 1 else tuple(a_shape)
    b2 = (b_shape[0], 1) if bn == 1 else tuple(b_shape)
    rows = symbolic.product(a2[:-1])
    if bn == 1:  # torch folds a's batch into rows: a matrix-vector product
        check(a2[-1] == b2[-2], lambda: f"size mismatch, got input ({rows}), mat ({rows}x{a2[-1]}), vec ({b_shape[0]})")
    elif bn == 2:  # a's batch folds into rows: one matrix product
        check(a2[-1] == b2[-2], lambda: "mat1 and mat2 shapes cannot be multiplied "
                                        f"({rows if an > 2 else a2[-2]}x{a2[-1]} and {b2[-2]}x{b2[-1]})")
    batch = _broadcast_batch(a2[:-2], b2[:-2])
    if bn > 2:  # a batched matrix product over the broadcast batch
        b = symbolic.product(batch)
        check(a2[-1] == b2[-2], lambda: f"Expected size for first two dimensions of batch2 tensor to be: [{b}, "
                                        f"{a2[-1]}] but got: [{b}, {b2[-2]}].")
    return tuple(batch + ([] if an == 1 else [a2[-2]]) + ([] if bn == 1 else [b2[-1]]))


def _matmul_meta(a, b):
    check_tensor(a, "prims.matmul")
    check_tensor(b, "prims.matmul", "other")
    check(a.dtype == b.dtype, lambda: f"expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}")
    check(a.device == b.device, lambda: "Expected all tensors to be on the same device, but found at least two "
                                        f"devices, {a.device} and {b.device}!")
    return _out(a, shape=matmul_shape(a.shape, b.shape))


make_prim(PrimIDs.MATMUL, "matmul", meta=_matmul_meta, impl=torch.matmul)


# -- factories -------------------------------------------------------------------------
# a factory's output is a constant (no gradient), cheap to make again, and the same for every example of a batch
_FACTORY_TAGS = (TAG_NOT_DIFFERENTIABLE, TAG_CHEAP, TAG_NOT_BATCHED)


def _full_meta(shape, fill_value, *, device, dtype):
    check(all(symbolic.is_int(s) for s in shape),
          lambda: f"full(): shape must be a sequence of ints, got {shape}", TypeError)
    check(all(s >= 0 for s in shape),
          lambda: f"Trying to create tensor with negative dimension {min(shape)}: {list(shape)}")
    check(isinstance(fill_value, symbolic.NUMBER_TYPES),
          lambda: f"full(): fill_value must be a number, got {type(fill_value).__name__}", TypeError)
    return TensorProxy(shape=tuple(shape), dtype=dtype, device=torch.device(device))


make_prim(PrimIDs.FULL, "full", meta=_full_meta, impl=torch.full, tags=_FACTORY_TAGS)


def _iota_meta(length, *, start, step, device, dtype):
    check(symbolic.is_int(length) and length >= 0,
          lambda: f"prims.iota: length must be a non-negative int, got {length}")
    return TensorProxy(shape=(length,), dtype=dtype, device=torch.device(device))


make_prim(PrimIDs.IOTA, "iota", meta=_iota_meta, impl=prims_eager.iota, tags=_FACTORY_TAGS)


# -- scans and sorting -----------------------------------------------------------------
# Scans are prims: a decomposition (a triangular-matrix matmul, or log2(n) shifted adds)
# does O(n^2) or O(n log n) work where the scan does O(n), and rounds differently from
# torch's sequential accumulation. Sorting and top-k have no decomposition into the
# other prims at all.
def _scan(id, name, impl):
    def meta(a, dim):
        check_tensor(a, f"prims.{name}")
        canonical_dim(dim, a.ndim)
        check_dtype_supported(a.dtype is not torch.bool, name, a.dtype, f" (ltorch.{name} converts bool to int64)")
        return _out(a)

    return make_prim(id, name, meta=meta, impl=impl, tags=("scan",))


_scan(PrimIDs.CUMSUM, "cumsum", prims_eager.cumsum)
_scan(PrimIDs.CUMPROD, "cumprod", prims_eager.cumprod)


def _sort_meta(a, dim, descending, stable):
    check_tensor(a, "prims.sort")
    canonical_dim(dim, a.ndim)
    return _out(a), _out(a, dtype=torch.int64)


make_prim(PrimIDs.SORT, "sort", meta=_sort_meta, impl=prims_eager.sort_prim)


def _topk_meta(a, k, dim, largest, sorted):
    check_tensor(a, "prims.topk")
    d = canonical_dim(dim, a.ndim)
    check(a.dtype is not torch.bool, lambda: "topk does not support bool dtypes on CPU")
    n = a.shape[d] if a.ndim else 1
    check(symbolic.is_int(k) and 0 <= k <= n, lambda: "selected index k out of range")  # (k may be a size's)
    shape = list(a.shape)
    if a.ndim:
        shape[d] = k
    return _out(a, shape=tuple(shape)), _out(a, shape=tuple(shape), dtype=torch.int64)


make_prim(PrimIDs.TOPK, "topk", meta=_topk_meta, impl=prims_eager.topk_prim)


# -- scattering and padding ------------------------------------------------------------
# scatter_add is gather's transpose (autodiff of take/take_along_axis needs it) and the one
# pass behind index_add, index_put(accumulate=True) and put; scatter is its overwriting
# twin, behind index_copy, index_put and x[i] = v: a mask-and-where emulation would need
# two scatter_adds and still sum duplicates. Both take `value` of index's shape (torch
# reads only that corner of a larger src; ltorch slices it). pad is jax.lax.pad, slice's
# transpose (a strided slice transposes to interior padding, which no other prim makes),
# and one fusible op where cat-with-full would be several.
def _scatter(id, name, impl):
    def meta(a, index, value, dim):
        check_tensor(a, f"prims.{name}")
        check_tensor(index, f"prims.{name}", "index")
        check_tensor(value, f"prims.{name}", "src")
        check(index.dtype in (torch.int64, torch.int32), lambda: f"{name}(): Expected dtype int32/int64 for index")
        d = canonical_dim(dim, a.ndim)
        check(value.dtype == a.dtype, lambda: f"{name}(): Expected self.dtype to be equal to src.dtype")
        check(max(index.ndim, 1) == max(a.ndim, 1),
              lambda: "Index tensor must have the same number of dimensions as self tensor")
        check(tuple(value.shape) == tuple(index.shape),
              lambda: f"prims.{name}: value must have index's shape {list(index.shape)}, got {list(value.shape)}")
        for i in range(min(a.ndim, index.ndim)):
            check(i == d or index.shape[i] <= a.shape[i],
                  lambda: f"Expected index {list(index.shape)} to be no larger than self {list(a.shape)} "
                          f"apart from dimension {d}")
        return _out(a)

    return make_prim(id, name, meta=meta, impl=impl)


_scatter(PrimIDs.SCATTER, "scatter", prims_eager.scatter_prim)
_scatter(PrimIDs.SCATTER_ADD, "scatter_add", prims_eager.scatter_add_prim)


def _pad_meta(a, padding_value, padding_config):
    check_tensor(a, "prims.pad")
    check(isinstance(padding_value, symbolic.NUMBER_TYPES),
          lambda: f"prims.pad: padding_value must be a number, got {type(padding_value).__name__}", TypeError)
    config = tuple(tuple(c) for c in padding_config)
    check(len(config) == a.ndim and all(len(c) == 3 for c in config),
          lambda: f"prims.pad: expected one (low, high, interior) per dimension of a {a.ndim}-d tensor, got {config}")
    shape = []
    for n, (lo, hi, interior) in zip(a.shape, config):
        dilated = n + max(n - 1, 0) * interior
        size = dilated + lo + hi
        check(interior >= 0 and lo >= -dilated and hi >= -dilated and size >= 0,
              lambda: f"prims.pad: padding {(lo, hi, interior)} does not fit a dimension of length {n}")
        shape.append(size)
    return _out(a, shape=tuple(shape))


make_prim(PrimIDs.PAD, "pad", meta=_pad_meta, impl=prims_eager.pad_prim, tags=(TAG_MOVES_DATA_ONLY,))


