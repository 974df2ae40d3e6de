"""Elementwise torch operations: math, comparisons, logical ops, where, clamp,
activations and the Tensor operators (including reflected ones, which mirror how
torch itself defines them so results match bit for bit)."""
from __future__ import annotations

import math
import numbers
import sys

import torch
import torch.nn.functional as F

from thunderfn import clang, prims
from thunderfn.clang import Promotion, is_tensor, maybe_convert_to_dtype
from thunderfn.core import dtypes
from thunderfn.prims import check
from thunderfn.torch import register_alias, torchsymbol

_this_module = sys.modules[__name__]
T = torch.Tensor
__all__ = []


def _export(sym):
    setattr(_this_module, sym.name, sym)
    __all__.append(sym.name)
    return sym


def _torch_callables(name: str, *extra):
    fns = [f for f in (getattr(torch, name, None), getattr(T, name, None), getattr(torch.special, name, None)) if f is not None]
    return (*fns, *extra)


# -- unary math: one line each, straight onto clang -------------------------------------
for _name in clang._INT_TO_FLOAT_UNARY + "neg floor ceil round trunc sign signbit isfinite isnan bitwise_not".split():
    _clang_fn = getattr(clang, _name)
    _export(torchsymbol(*_torch_callables(_name), name=_name)(lambda a, _f=_clang_fn: _f(a)))


@torchsymbol(torch.abs, T.abs, T.__abs__, torch.absolute)
def abs(a):
    if a.dtype is torch.bool:
        return a
    return clang.abs(a)


@torchsymbol(torch.round, T.round)
def round(a, *, decimals=0):
    if decimals == 0:
        return clang.round(a)
    scale = 10.0 ** decimals
    return clang.true_divide(clang.round(clang.mul(a, scale)), scale)


@torchsymbol(torch.real, T.real.__get__ if hasattr(T.real, "__get__") else T.real)
def real(a):
    return clang.real(a) if a.dtype.is_complex else a


@torchsymbol(torch.isinf, T.isinf)
def isinf(a):
    if not dtypes.is_inexact(a.dtype):
        return clang.ne(a, a)  # all False, shaped like a
    return clang.eq(clang.abs(a), float("inf"))


@torchsymbol(torch.isneginf, T.isneginf)
def isneginf(a):
    return clang.eq(a, -float("inf")) if dtypes.is_float(a.dtype) else clang.ne(a, a)


@torchsymbol(torch.isposinf, T.isposinf)
def isposinf(a):
    return clang.eq(a, float("inf")) if dtypes.is_float(a.dtype) else clang.ne(a, a)


@torchsymbol(torch.square, T.square)
def square(a):
    a = maybe_convert_to_dtype(a, torch.int64) if a.dtype is torch.bool else a
    return clang.mul(a, a)


@torchsymbol(torch.sigmoid, T.sigmoid, torch.special.expit)
def sigmoid(a):
    a = maybe_convert_to_dtype(a, torch.get_default_dtype()) if not dtypes.is_inexact(a.dtype) else a
    x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
    out = clang.reciprocal(clang.add(clang.exp(clang.neg(x)), 1.0))
    return maybe_convert_to_dtype(out, a.dtype)


@torchsymbol(torch.logical_not, T.logical_not)
def logical_not(a):
    return clang.eq(a, False) if a.dtype is torch.bool else clang.eq(a, 0)


def _as_bool(a):
    return a if not is_tensor(a) or a.dtype is torch.bool else clang.ne(a, 0)


@torchsymbol(torch.logical_and, T.logical_and)
def logical_and(a, b):
    return clang.bitwise_and(_as_bool(a), _as_bool(b))


@torchsymbol(torch.logical_or, T.logical_or)
def logical_or(a, b):
    return clang.bitwise_or(_as_bool(a), _as_bool(b))


@torchsymbol(torch.logical_xor, T.logical_xor)
def logical_xor(a, b):
    return clang.bitwise_xor(_as_bool(a), _as_bool(b))


# -- binary math -----------------------------------------------------------------------
def _check_binary(a, b, opname):
    check(is_tensor(a) or is_tensor(b) or isinstance(a, numbers.Number),
          lambda: f"{opname}(): argument 'input' must be Tensor, not {type(a).__name__}", TypeError)
    for x in (a, b):
        check(is_tensor(x) or isinstance(x, numbers.Number),
              lambda: f"{opname}(): argument 'other' must be Tensor or Number, not {type(x).__name__}", TypeError)


@torchsymbol(torch.add, T.add, T.__add__)
def add(a, b, *, alpha=1):
    _check_binary(a, b, "add")
    if alpha != 1:
        check(not isinstance(alpha, bool) or dtypes.result_type(a, b) is torch.bool,
              lambda: "Boolean alpha only supported for Boolean results.")
        b = clang.mul(b, alpha)
    return clang.add(a, b)


@torchsymbol(torch.sub, T.sub, T.__sub__, torch.subtract, T.subtract)
def sub(a, b, *, alpha=1):
    _check_binary(a, b, "sub")
    check(not (is_tensor(a) and a.dtype is torch.bool) or not (is_tensor(b) and b.dtype is torch.bool),
          lambda: "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead.")
    if alpha != 1:
        b = clang.mul(b, alpha)
    return clang.sub(a, b)


@torchsymbol(torch.rsub)
def rsub(a, b, *, alpha=1):
    return sub(b, a, alpha=alpha)


@torchsymbol(torch.mul, T.mul, T.__mul__, torch.multiply, T.multiply)
def mul(a, b):
    _check_binary(a, b, "mul")
    return clang.mul(a, b)


@torchsymbol(torch.div, T.div, T.__truediv__, T.__div__ if hasattr(T, "__div__") else torch.div, torch.divide, T.divide,
             torch.true_divide, T.true_divide)
def div(a, b, *, rounding_mode=None):
    _check_binary(a, b, "div")
    check(rounding_mode in (None, "trunc", "floor"),
          lambda: f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")
    return clang.div(a, b, rounding_mode)


@torchsymbol(torch.floor_divide, T.floor_divide, T.__floordiv__)
def floor_divide(a, b):
    return clang.div(a, b, "floor")


@torchsymbol(torch.remainder, T.remainder, T.__mod__)
def remainder(a, b):
    return clang.remainder(a, b)


@torchsymbol(torch.fmod, T.fmod)
def fmod(a, b):
    return clang.fmod(a, b)


@torchsymbol(torch.pow, T.pow, T.__pow__)
def pow(a, b):
    _check_binary(a, b, "pow")
    if isinstance(b, numbers.Number) and is_tensor(a) and dtypes.is_inexact(a.dtype):
        if b == 2:
            return clang.mul(a, a)
        if b == 0.5:
            return clang.sqrt(a)
        if b == 1:
            return a
    return clang.pow(a, b)


for _name in ("maximum", "minimum", "atan2", "copysign", "nextafter", "bitwise_and", "bitwise_or", "bitwise_xor",
              "bitwise_left_shift", "bitwise_right_shift"):
    _clang_fn = getattr(clang, _name)
    _extra = {"bitwise_and": (T.__and__,), "bitwise_or": (T.__or__,), "bitwise_xor": (T.__xor__,),
              "bitwise_left_shift": (T.__lshift__,), "bitwise_right_shift": (T.__rshift__,)}.get(_name, ())
    _export(torchsymbol(*_torch_callables(_name, *_extra), name=_name)(lambda a, b, _f=_clang_fn: _f(a, b)))

for _name, _dunder, _aliases in (("eq", "__eq__", ()), ("ne", "__ne__", ("not_equal",)), ("lt", "__lt__", ("less",)),
                                 ("le", "__le__", ("less_equal",)), ("gt", "__gt__", ("greater",)),
                                 ("ge", "__ge__", ("greater_equal",))):
    _clang_fn = getattr(clang, _name)
    _fns = _torch_callables(_name, getattr(T, _dunder), *(f for al in _aliases for f in _torch_callables(al)))
    _export(torchsymbol(*_fns, name=_name)(lambda a, b, _f=_clang_fn: _f(a, b)))


@torchsymbol(torch.where, T.where)
def where(condition, input=None, other=None):
    check(input is not None and other is not None,
          lambda: "torch.where(condition) returns data-dependent shapes; thunderfn supports torch.where(condition, input, other)")
    return clang.where(condition, input, other)


@torchsymbol(torch.clamp, T.clamp, torch.clip, T.clip)
def clamp(a, min=None, max=None):
    check(min is not None or max is not None, lambda: "torch.clamp: At least one of 'min' or 'max' must not be None")
    # torch propagates NaN from the input; maximum/minimum do too, so no special case
    if min is not None:
        a = clang.maximum(a, min) if is_tensor(min) else _clamp_scalar(a, min, clang.lt)
    if max is not None:
        a = clang.minimum(a, max) if is_tensor(max) else _clamp_scalar(a, max, clang.gt)
    return a


def _clamp_scalar(a, bound, beyond):
    # where(a < min, min, a) keeps a's dtype when the bound is a Python number, like torch
    dtype = dtypes.result_type(a, bound)
    a = maybe_convert_to_dtype(a, dtype)
    return clang.where(beyond(a, bound), bound, a)


@torchsymbol(torch.clamp_min, T.clamp_min)
def clamp_min(a, min):
    return clamp(a, min=min)


@torchsymbol(torch.clamp_max, T.clamp_max)
def clamp_max(a, max):
    return clamp(a, max=max)


@torchsymbol(torch.lerp, T.lerp)
def lerp(start, end, weight):
    return clang.add(start, clang.mul(weight, clang.sub(end, start)))


# -- activations -------------------------------------------------------------------------
def _in_computation_dtype(fn):
    """Run fn on a upcast to its computation dtype (f32 for f16/bf16), cast back once."""
    def wrapped(a, *args, **kwargs):
        check(dtypes.is_inexact(a.dtype) or fn.__name__ in ("relu",),
              lambda: f"\"{fn.__name__}\" not implemented for '{a.dtype}'")
        x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
        return maybe_convert_to_dtype(fn(x, *args, **kwargs), a.dtype)

    wrapped.__name__ = fn.__name__
    return wrapped


@torchsymbol(torch.relu, T.relu, F.relu)
def relu(a, inplace=False):
    check(not inplace, lambda: "relu(inplace=True) mutates its input, which thunderfn does not trace yet; use inplace=False")
    check(a.dtype is not torch.bool, lambda: "\"clamp_min_scalar_cpu\" not implemented for 'Bool'")
    return clang.where(clang.le(a, 0), 0, a)


@torchsymbol(F.gelu)
@_in_computation_dtype
def gelu(a, approximate="none"):
    check(approximate in ("none", "tanh"), lambda: f"approximate argument must be either none or tanh.")
    if approximate == "none":
        return clang.mul(clang.mul(a, 0.5), clang.add(clang.erf(clang.mul(a, 1 / math.sqrt(2))), 1.0))
    inner = clang.mul(clang.add(a, clang.mul(clang.mul(clang.mul(a, a), a), 0.044715)), math.sqrt(2 / math.pi))
    return clang.mul(clang.mul(a, 0.5), clang.add(clang.tanh(inner), 1.0))


@torchsymbol(F.silu)
@_in_computation_dtype
def silu(a, inplace=False):
    check(not inplace, lambda: "silu(inplace=True) mutates its input, which thunderfn does not trace yet")
    return clang.true_divide(a, clang.add(clang.exp(clang.neg(a)), 1.0))


@torchsymbol(F.leaky_relu)
def leaky_relu(a, negative_slope=0.01, inplace=False):
    check(not inplace, lambda: "leaky_relu(inplace=True) mutates its input, which thunderfn does not trace yet")
    return clang.where(clang.gt(a, 0), a, clang.mul(a, negative_slope))


@torchsymbol(F.elu)
@_in_computation_dtype
def elu(a, alpha=1.0, inplace=False):
    check(not inplace, lambda: "elu(inplace=True) mutates its input, which thunderfn does not trace yet")
    return clang.where(clang.gt(a, 0), a, clang.mul(clang.expm1(a), alpha))


@torchsymbol(F.softplus)
@_in_computation_dtype
def softplus(a, beta=1.0, threshold=20.0):
    scaled = clang.mul(a, beta)
    soft = clang.true_divide(clang.log1p(clang.exp(scaled)), beta)
    return clang.where(clang.gt(scaled, threshold), a, soft)


@torchsymbol(F.hardtanh)
def hardtanh(a, min_val=-1.0, max_val=1.0, inplace=False):
    check(not inplace, lambda: "hardtanh(inplace=True) mutates its input, which thunderfn does not trace yet")
    return clamp(a, min_val, max_val)


@torchsymbol(F.relu6)
def relu6(a, inplace=False):
    return hardtanh(a, 0.0, 6.0, inplace)


@torchsymbol(F.mish)
@_in_computation_dtype
def mish(a, inplace=False):
    return clang.mul(a, clang.tanh(softplus(a)))


# -- reflected operators, defined as torch defines them ------------------------------------
register_alias(T.__radd__, lambda self, other: add(self, other))
register_alias(T.__rmul__, lambda self, other: mul(self, other))
register_alias(T.__rsub__, lambda self, other: rsub(self, other))
register_alias(T.__rtruediv__, lambda self, other: mul(reciprocal(self), other))
register_alias(T.__rpow__, lambda self, other: pow(other, self))
register_alias(T.__rfloordiv__, lambda self, other: floor_divide(_as_tensor_like(other, self), self))
register_alias(T.__rmod__, lambda self, other: remainder(_as_tensor_like(other, self), self))
register_alias(T.__rand__, lambda self, other: bitwise_and(self, other))
register_alias(T.__ror__, lambda self, other: bitwise_or(self, other))
register_alias(T.__rxor__, lambda self, other: bitwise_xor(self, other))
register_alias(F.sigmoid, lambda a: sigmoid(a))
register_alias(F.tanh, lambda a: tanh(a))
register_alias(T.__neg__, lambda self: neg(self))
register_alias(T.__pos__, lambda self: self)
register_alias(T.negative, lambda self: neg(self))
register_alias(torch.negative, lambda self: neg(self))
register_alias(T.__invert__, lambda self: bitwise_not(self) if self.dtype is not torch.bool else logical_not(self))


def _as_tensor_like(value, like):
    """A Python number as a 0-dim tensor, as torch wraps it for reflected operators."""
    from thunderfn.torch.factories import scalar_tensor

    return scalar_tensor(value, dtype=dtypes.scalar_dtype(value), device=like.device)


__all__ += ["abs", "round", "real", "isinf", "isneginf", "isposinf", "square", "sigmoid", "logical_not", "logical_and",
            "logical_or", "logical_xor", "add", "sub", "rsub", "mul", "div", "floor_divide", "remainder", "fmod", "pow",
            "where", "clamp", "clamp_min", "clamp_max", "lerp", "relu", "gelu", "silu", "leaky_relu", "elu", "softplus",
            "hardtanh", "relu6", "mish"]
