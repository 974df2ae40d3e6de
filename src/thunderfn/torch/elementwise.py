"""Elementwise torch operations: math, comparisons, logical ops, where, clamp,
activations and the Tensor operators (including reflected ones, which mirror how
torch itself defines them so results match bit for bit)."""
from __future__ import annotations

import builtins
import functools
import math
import numbers
import sys

import torch
import torch.nn.functional as F

from thunderfn import clang, prims
from thunderfn.clang import is_tensor, maybe_convert_to_dtype
from thunderfn.core import dtypes, symbolic
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import check, check_dtype_supported
from thunderfn.torch.base import register_alias, torchsymbol
from thunderfn.torch.opaque import shape_rule

_this_module = sys.modules[__name__]
T = torch.Tensor
__all__ = []


def _export(sym):
    setattr(_this_module, sym.name, sym)
    __all__.append(sym.name)
    return sym


def _torch_callables(name: str, *extra):
    fns = [f for f in (getattr(torch, name, None), getattr(T, name, None), getattr(torch.special, name, None))
           if f is not None]
    return (*fns, *extra)


def plain_symbol(op: prims.ElementwiseOp):
    """The torch-language symbol of an elementwise table entry whose op.ltorch says it is a plain one
    (prims.py): op's clang function behind torch's argument checks, standing for torch's callables of
    op's name and op.ltorch.also."""
    clang_fn, spec = getattr(clang, op.name), op.ltorch
    if op.arity == 1:
        def body(a):
            return clang_fn(a)
    else:
        def body(a, b):
            _check_operands(op.name, a, b, number_input=spec.number_input, number_other=spec.number_other)
            return clang_fn(a, b)

    sym = plain[op.name] = _export(torchsymbol(*_torch_callables(op.name, *spec.also), name=op.name)(body))
    return sym


@torchsymbol(torch.neg, T.neg)
def neg(a):
    check(a.dtype is not torch.bool,
          lambda: "Negation, the `-` operator, on a bool tensor is not supported. "
                  "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")
    return clang.neg(a)


@torchsymbol(torch.abs, T.abs, T.__abs__, torch.absolute)
def abs(a):
    check_dtype_supported(a.dtype is not torch.bool, "abs", a.dtype)
    return clang.abs(a)


@torchsymbol(torch.round, T.round)
def round(a, *, decimals=0):
    if decimals == 0:
        return clang.round(a)
    check_dtype_supported(dtypes.is_inexact(a.dtype), "round", a.dtype)
    # torch scales, rounds and unscales in float32 for half types, rounding once at the end
    x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
    if decimals > 0:  # torch's order of operations, so results match to the last bit
        out = clang.true_divide(clang.round(clang.mul(x, 10.0 ** decimals)), 10.0 ** decimals)
    else:
        out = clang.mul(clang.round(clang.true_divide(x, 10.0 ** -decimals)), 10.0 ** -decimals)
    return maybe_convert_to_dtype(out, a.dtype)


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


# -- binary math -----------------------------------------------------------------------
def _check_operands(opname, a, b, *, number_input=True, number_other=True):
    """torch's argument parsing: which operands may be Python numbers; anything else is a TypeError."""
    for position, argname, x, number_ok in ((1, "input", a, number_input), (2, "other", b, number_other)):
        check(is_tensor(x) or (number_ok and isinstance(x, symbolic.NUMBER_TYPES)),
              lambda: f"{opname}(): argument '{argname}' (position {position}) must be Tensor, not {type(x).__name__}",
              TypeError)
    check(is_tensor(a) or is_tensor(b),
          lambda: f"{opname}(): argument 'input' (position 1) must be Tensor, not {type(a).__name__}", TypeError)


def _scaled_combine(combine, a, b, alpha):
    """a combine alpha * b, with torch's checks on alpha and its single rounding: torch's
    kernels scale and combine in the computation dtype (f32 for half types)."""
    dtype = dtypes.result_type(a, b)
    check(not isinstance(alpha, bool) or dtype is torch.bool,
          lambda: "Boolean alpha only supported for Boolean results.")
    check(dtypes.is_inexact(dtype) or isinstance(alpha, numbers.Integral),
          lambda: "For integral input tensors, argument alpha must not be a floating point number.")
    if symbolic.holds(alpha == 1):  # (a float jit traces as a value may be 1 or not: the general form)
        return combine(a, b)
    compute = dtypes.computation_dtype(dtype)
    a, b = maybe_convert_to_dtype(a, compute), maybe_convert_to_dtype(b, compute)
    scaled = clang.mul(b, alpha) if is_tensor(b) else b * alpha
    return maybe_convert_to_dtype(combine(a, scaled), dtype)


@torchsymbol(torch.add, T.add, T.__add__)
def add(a, b, *, alpha=1):
    _check_operands("add", a, b)
    return _scaled_combine(clang.add, a, b, alpha)


def _is_bool(x) -> bool:
    return x.dtype is torch.bool if is_tensor(x) else isinstance(x, bool)


@torchsymbol(torch.sub, T.sub, T.__sub__, torch.subtract, T.subtract)
def sub(a, b, *, alpha=1):
    _check_operands("sub", a, b)
    check(not (_is_bool(a) and _is_bool(b)),
          lambda: "Subtraction, the `-` operator, with two bool tensors is not supported. "
                  "Use the `^` or `logical_xor()` operator instead.")
    check(not (_is_bool(a) or _is_bool(b)),
          lambda: "Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
                  "trying to invert a mask, use the `~` or `logical_not()` operator instead.")
    return _scaled_combine(clang.sub, a, b, alpha)


@torchsymbol(torch.rsub)
def rsub(a, b, *, alpha=1):
    return sub(b, a, alpha=alpha)


def _reading_scalar_tensor_in_float32(fn, a, b, **kwargs):
    """fn(a, b) as torch's CPU mul and div kernels compute it: with a half-precision result,
    a 0-dim tensor of another dtype as `b` is read at float32 precision instead of being
    rounded to half first (as `a` it is rounded, and add, sub, remainder, ... round it too)."""
    dtype = dtypes.result_type(a, b)
    if dtype in dtypes.low_precision and is_tensor(b) and b.ndim == 0 and b.dtype != dtype:
        a, b = maybe_convert_to_dtype(a, torch.float32), maybe_convert_to_dtype(b, torch.float32)
        return maybe_convert_to_dtype(fn(a, b, **kwargs), dtype)
    return fn(a, b, **kwargs)


@torchsymbol(torch.mul, T.mul, T.__mul__, torch.multiply, T.multiply)
def mul(a, b):
    _check_operands("mul", a, b)
    return _reading_scalar_tensor_in_float32(clang.mul, a, b)


@torchsymbol(torch.div, T.div, T.__truediv__, T.__div__ if hasattr(T, "__div__") else torch.div, torch.divide, T.divide,
             torch.true_divide, T.true_divide)
def div(a, b, *, rounding_mode=None):
    _check_operands("div", a, b)
    check(rounding_mode in (None, "trunc", "floor"),
          lambda: f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")
    return _reading_scalar_tensor_in_float32(clang.div, a, b, rounding_mode=rounding_mode)


@torchsymbol(torch.floor_divide, T.floor_divide, T.__floordiv__)
def floor_divide(a, b):
    _check_operands("floor_divide", a, b)
    return _reading_scalar_tensor_in_float32(clang.div, a, b, rounding_mode="floor")


@torchsymbol(torch.remainder, T.remainder, T.__mod__)
def remainder(a, b):
    _check_operands("remainder", a, b)
    return clang.remainder(a, b)


@torchsymbol(torch.fmod, T.fmod)
def fmod(a, b):
    _check_operands("fmod", a, b, number_input=False)
    return clang.fmod(a, b)


@torchsymbol(torch.pow, T.pow, T.__pow__)
def pow(a, b):
    _check_operands("pow", a, b)
    # x**2 is x*x bit for bit in torch; no other exponent is special-cased, because torch's
    # own shortcuts differ by dtype (x**0.5 is sqrt for float32 but std::pow for float16)
    # (an exponent traced as a value is asked nothing: torch's kernel makes the same choice when it runs)
    if (isinstance(b, symbolic.NUMBER_TYPES) and not isinstance(b, bool) and symbolic.holds(b == 2) and is_tensor(a)
            and dtypes.is_inexact(a.dtype)):
        return clang.mul(a, a)
    return clang.pow(a, b)


@torchsymbol(torch.nextafter, T.nextafter)
def nextafter(a, b):
    _check_operands("nextafter", a, b, number_input=False, number_other=False)
    dtype = dtypes.result_type(a, b)
    check_dtype_supported(dtype.is_floating_point, "nextafter", dtype)
    return clang.nextafter(a, b)


# ltorch.exp, ltorch.maximum, ltorch.eq, ...: the plain symbols of prims.py's elementwise table, also
# by name in `plain` (plain["tanh"]) for the functions below that call one
plain: dict = {}
for _op in prims.elementwise_ops.values():
    if _op.ltorch is not None:
        plain_symbol(_op)


@torchsymbol(torch.logical_and, T.logical_and)
def logical_and(a, b):
    _check_operands("logical_and", a, b, number_input=False, number_other=False)
    return clang.bitwise_and(_as_bool(a), _as_bool(b))


@torchsymbol(torch.logical_or, T.logical_or)
def logical_or(a, b):
    _check_operands("logical_or", a, b, number_input=False, number_other=False)
    return clang.bitwise_or(_as_bool(a), _as_bool(b))


@torchsymbol(torch.logical_xor, T.logical_xor)
def logical_xor(a, b):
    _check_operands("logical_xor", a, b, number_input=False, number_other=False)
    return clang.bitwise_xor(_as_bool(a), _as_bool(b))


# -- where, clamp, lerp --------------------------------------------------------------------
@torchsymbol(torch.where)
def where(condition, input=None, other=None):
    if input is None and other is None:  # torch.nonzero(condition, as_tuple=True): of a data-dependent length
        check(is_tensor(condition),
              lambda: f"where(): argument 'condition' (position 1) must be Tensor, not {type(condition).__name__}",
              TypeError)
        return tuple(clang.nonzero_columns(condition))
    check(input is not None and other is not None,
          lambda: "where() received an invalid combination of arguments: expected (Tensor condition) "
                  "or (Tensor condition, Tensor input, Tensor other)",
          TypeError)
    check(is_tensor(condition),
          lambda: f"where(): argument 'condition' (position 1) must be Tensor, not {type(condition).__name__}",
          TypeError)
    # torch still takes uint8 conditions (with a deprecation warning); anything else is an error
    check(condition.dtype in (torch.bool, torch.uint8),
          lambda: f"where expected condition to be a boolean tensor, but got a tensor with dtype "
                  f"{prims.scalar_type_name(condition.dtype)}")
    return clang.where(condition, input, other)


register_alias(T.where, lambda self, condition, other: where(condition, self, other))


@torchsymbol(torch.clamp, T.clamp, torch.clip, T.clip)
def clamp(a, min=None, max=None):
    check(min is not None or max is not None, lambda: "torch.clamp: At least one of 'min' or 'max' must not be None")
    dtype = dtypes.result_type(a, *(b for b in (min, max) if b is not None))
    check_dtype_supported(dtype is not torch.bool, "clamp", dtype)
    # torch propagates NaN from the input and from tensor bounds; maximum/minimum do too
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
    check(is_tensor(end) and (is_tensor(weight) or isinstance(weight, symbolic.NUMBER_TYPES)),
          lambda: f"lerp() received an invalid combination of arguments - got ({type(start).__name__}, "
                  f"{type(end).__name__}, {type(weight).__name__})", TypeError)
    dtype = dtypes.result_type(start, end)
    check_dtype_supported(dtypes.is_inexact(dtype), "lerp_kernel", dtype)
    check(start.dtype == end.dtype and (not is_tensor(weight) or weight.dtype == start.dtype),
          lambda: f"expected dtype {str(start.dtype)[6:]} for "
                  f"`{'end' if end.dtype != start.dtype else 'weight'}` but got dtype "
                  f"{str(end.dtype if end.dtype != start.dtype else weight.dtype)[6:]}")
    # torch's formula, in float32 for half types: the endpoint nearer the weight anchors the
    # result, so lerp(a, b, 1) == b exactly
    compute = dtypes.computation_dtype(dtype)
    start, end, w = (maybe_convert_to_dtype(x, compute) for x in (start, end, weight))
    diff = clang.sub(end, start)
    if not is_tensor(w):
        out = clang.add(start, clang.mul(w, diff)) if builtins.abs(w) < 0.5 else clang.sub(end, clang.mul(diff, 1 - w))
    else:
        out = clang.where(clang.lt(clang.abs(w), 0.5), clang.add(start, clang.mul(w, diff)),
                          clang.sub(end, clang.mul(diff, clang.sub(1, w))))
    return maybe_convert_to_dtype(out, dtype)


# -- activations -------------------------------------------------------------------------
def _float_kernel(kernel):
    """Decorator: run fn on a upcast to its computation dtype (f32 for f16/bf16), cast back once;
    like torch's kernel named `kernel` ("hardswish_cpu"), refuse integer and bool inputs."""
    def decorator(fn):
        @functools.wraps(fn)  # the symbol's signature is fn's: rules read its arguments by name
        def wrapped(a, *args, **kwargs):
            check_dtype_supported(dtypes.is_inexact(a.dtype), kernel, a.dtype)
            x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
            return maybe_convert_to_dtype(fn(x, *args, **kwargs), a.dtype)

        return wrapped

    return decorator


def _in_computation_dtype(fn):
    """_float_kernel, naming the op itself in the refusal."""
    return _float_kernel(fn.__name__)(fn)


def _no_inplace(name, inplace):
    check(not inplace,
          lambda: f"{name}(inplace=True) mutates its input, which thunderfn does not trace yet; use inplace=False",
          UnsupportedOpError)


# F.relu first: the torch executor calls it with the recorded arguments, and only it takes `inplace`
@torchsymbol(F.relu, torch.relu, T.relu)
def relu(a, inplace=False):
    _no_inplace("relu", inplace)
    check(a.dtype is not torch.bool, lambda: "Boolean inputs not supported for relu")
    return clang.where(clang.le(a, 0), 0, a)


@torchsymbol(F.gelu)
@_in_computation_dtype
def gelu(a, approximate="none"):
    check(approximate in ("none", "tanh"), lambda: "approximate argument must be either none or tanh.")
    if approximate == "none":
        return clang.mul(clang.mul(a, 0.5), clang.add(clang.erf(clang.mul(a, 1 / math.sqrt(2))), 1.0))
    inner = clang.mul(clang.add(a, clang.mul(clang.mul(clang.mul(a, a), a), 0.044715)), math.sqrt(2 / math.pi))
    return clang.mul(clang.mul(a, 0.5), clang.add(clang.tanh(inner), 1.0))


@torchsymbol(F.silu)
@_in_computation_dtype
def silu(a, inplace=False):
    _no_inplace("silu", inplace)
    return clang.true_divide(a, clang.add(clang.exp(clang.neg(a)), 1.0))


@torchsymbol(F.leaky_relu)
@_in_computation_dtype
def leaky_relu(a, negative_slope=0.01, inplace=False):
    _no_inplace("leaky_relu", inplace)
    return clang.where(clang.gt(a, 0), a, clang.mul(a, negative_slope))


@torchsymbol(F.elu)
@_in_computation_dtype
def elu(a, alpha=1.0, inplace=False):
    _no_inplace("elu", inplace)
    return clang.where(clang.gt(a, 0), a, clang.mul(clang.expm1(a), alpha))


@torchsymbol(F.softplus)
@_in_computation_dtype
def softplus(a, beta=1.0, threshold=20.0):
    scaled = clang.mul(a, beta)
    soft = clang.true_divide(clang.log1p(clang.exp(scaled)), beta)
    return clang.where(clang.gt(scaled, threshold), a, soft)


@torchsymbol(F.hardtanh)
def hardtanh(a, min_val=-1.0, max_val=1.0, inplace=False):
    _no_inplace("hardtanh", inplace)
    check(a.dtype is not torch.bool, lambda: "Bool inputs not supported for hardtanh")
    check(a.dtype is not torch.uint8 or (min_val >= 0 and max_val >= 0),
          lambda: "cannot do hardtanh on an unsigned type with negative limits")
    if not dtypes.is_inexact(a.dtype):  # torch casts the limits to the input's integer type
        min_val, max_val = int(min_val), int(max_val)
    return clamp(a, min_val, max_val)


@torchsymbol(F.relu6)
def relu6(a, inplace=False):
    return hardtanh(a, 0.0, 6.0, inplace)


@torchsymbol(F.mish)
@_in_computation_dtype
def mish(a, inplace=False):
    _no_inplace("mish", inplace)
    return clang.mul(a, clang.tanh(softplus(a)))


def _clip(x, lo, hi):
    """min(max(x, lo), hi) with NaN passing through, as torch's kernels compute it."""
    x = clang.where(clang.lt(x, lo), lo, x)
    return clang.where(clang.gt(x, hi), hi, x)


@torchsymbol(F.hardswish, torch._C._nn.hardswish)
@_float_kernel("hardswish_cpu")
def hardswish(a, inplace=False):
    _no_inplace("hardswish", inplace)
    return clang.true_divide(clang.mul(a, _clip(clang.add(a, 3.0), 0.0, 6.0)), 6.0)


@torchsymbol(F.hardsigmoid, torch._C._nn.hardsigmoid)
@_float_kernel("hardsigmoid_cpu")
def hardsigmoid(a, inplace=False):
    _no_inplace("hardsigmoid", inplace)
    return clang.true_divide(_clip(clang.add(a, 3.0), 0.0, 6.0), 6.0)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


@torchsymbol(F.selu, torch.selu)
@_float_kernel("elu_cpu")
def selu(a, inplace=False):
    _no_inplace("selu", inplace)
    return clang.where(clang.gt(a, 0), clang.mul(a, _SELU_SCALE), clang.mul(clang.expm1(a), _SELU_ALPHA * _SELU_SCALE))


@torchsymbol(F.celu, torch.celu)
@_float_kernel("elu_cpu")
def celu(a, alpha=1.0, inplace=False):
    _no_inplace("celu", inplace)
    check(alpha != 0, lambda: "ZeroDivisionError: alpha cannot be 0 for CELU")
    # torch's elu kernel scales the input by 1/alpha (rather than dividing by alpha)
    return clang.where(clang.gt(a, 0), a, clang.mul(clang.expm1(clang.mul(a, 1.0 / alpha)), alpha))


@torchsymbol(F.logsigmoid)
@_float_kernel("log_sigmoid_cpu")
def logsigmoid(a):
    # min(x, 0) - log1p(exp(-|x|)): never overflows, as torch's kernel
    return clang.sub(clang.where(clang.lt(a, 0), a, 0.0), clang.log1p(clang.exp(clang.neg(clang.abs(a)))))


@torchsymbol(F.softsign)
def softsign(a):
    # torch's own Python composite: input / (input.abs() + 1), each op rounding in the input's dtype
    check_dtype_supported(a.dtype is not torch.bool, "abs_cpu", a.dtype)
    return clang.true_divide(a, clang.add(clang.abs(a), 1))


@torchsymbol(F.tanhshrink)
def tanhshrink(a):
    return sub(a, plain["tanh"](a))  # torch's composite: input - input.tanh()


@torchsymbol(F.threshold, torch.threshold)
def threshold(a, threshold, value, inplace=False):
    _no_inplace("threshold", inplace)
    check_dtype_supported(a.dtype is not torch.bool, "threshold_cpu", a.dtype)
    if not dtypes.is_inexact(a.dtype):  # torch casts threshold and value to the input's integer type
        threshold, value = int(threshold), int(value)
    return clang.where(clang.le(a, threshold), value, a)


@torchsymbol(F.hardshrink, torch.hardshrink, T.hardshrink)
@_float_kernel("hardshrink_cpu")
def hardshrink(a, lambd=0.5):
    return clang.where(clang.bitwise_and(clang.ge(a, -lambd), clang.le(a, lambd)), 0.0, a)


_FINFO_MAX_TEXT = {torch.float32: "3.40282e+38", torch.float64: "1.79769e+308", torch.float16: "65504",
                   torch.bfloat16: "3.38953e+38"}


@torchsymbol(F.softshrink)
def softshrink(a, lambd=0.5):
    check_dtype_supported(dtypes.is_float(a.dtype), "softshrink_check", a.dtype)
    check(lambd >= 0,
          lambda: f"lambda must be in range [0, {_FINFO_MAX_TEXT.get(a.dtype, torch.finfo(a.dtype).max)}] for "
                  f"input dtype {prims.scalar_type_name(a.dtype)}, but found {lambd:g}")
    x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
    # x * 0 (not 0) in the middle band, so NaN stays NaN
    out = clang.where(clang.gt(x, lambd), clang.sub(x, lambd),
                      clang.where(clang.lt(x, -lambd), clang.add(x, lambd), clang.mul(x, 0.0)))
    return maybe_convert_to_dtype(out, a.dtype)


@torchsymbol(F.glu, torch._C._nn.glu)
def glu(a, dim=-1):
    check(a.ndim > 0, lambda: "glu does not support scalars because halving size must be even")
    d = prims.canonical_dim(dim, a.ndim)
    n = a.shape[d]
    check(n % 2 == 0, lambda: f"Halving dimension must be even, but dimension {d} is size {n}")
    check_dtype_supported(dtypes.is_inexact(a.dtype), "glu_cpu", a.dtype)
    x = maybe_convert_to_dtype(a, dtypes.computation_dtype(a.dtype))
    first, second = clang.slice_in_dim(x, 0, n // 2, dim=d), clang.slice_in_dim(x, n // 2, n, dim=d)
    gate = clang.reciprocal(clang.add(clang.exp(clang.neg(second)), 1.0))
    return maybe_convert_to_dtype(clang.mul(first, gate), a.dtype)


@torchsymbol(F.prelu, torch.prelu, T.prelu)
def prelu(a, weight):
    check(weight.ndim <= 1,
          lambda: f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {weight.ndim}")
    channels = a.shape[1] if a.ndim >= 2 else 1
    check(weight.numel() == 1 or weight.numel() == channels,
          lambda: "Mismatch of parameter numbers and input channel size. Found parameter numbers = "
                  f"{weight.numel()} and channel size = {channels}.")
    check(a.dtype == weight.dtype,
          lambda: f"prelu: Type promoting not supported. Got {prims.scalar_type_name(a.dtype)} and "
                  f"{prims.scalar_type_name(weight.dtype)}")
    check_dtype_supported(dtypes.is_inexact(a.dtype), "prelu_cpu", a.dtype)
    compute = dtypes.computation_dtype(a.dtype)
    x, w = maybe_convert_to_dtype(a, compute), maybe_convert_to_dtype(weight, compute)
    if weight.numel() == 1:
        w = clang.reshape(w, ())
    elif a.ndim >= 2:  # one slope per channel (dim 1)
        w = clang.reshape(w, (channels,) + (1,) * (a.ndim - 2))
    return maybe_convert_to_dtype(clang.where(clang.gt(x, 0), x, clang.mul(w, x)), a.dtype)


def _vector_norm_keepdim(x, p, dims):
    """torch.linalg.vector_norm(x, p, dims, keepdim=True) of a float tensor in its computation dtype."""
    if p == 2:
        out = clang.sqrt(prims.sum(clang.mul(x, x), dims))
    elif p == float("inf"):
        out = prims.amax(clang.abs(x), dims)
    elif p == -float("inf"):
        out = prims.amin(clang.abs(x), dims)
    elif p == 0:
        out = prims.sum(maybe_convert_to_dtype(clang.ne(x, 0), x.dtype), dims)
    elif p == 1:
        out = prims.sum(clang.abs(x), dims)
    else:
        out = clang.pow(prims.sum(clang.pow(clang.abs(x), p), dims), 1.0 / p)
    return clang.keepdim_reshape(out, x, dims)


@torchsymbol(F.normalize)
def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    check(out is None, lambda: "normalize(out=...) writes into a given tensor, which thunderfn does not trace; "
                               "use the returned tensor", UnsupportedOpError)
    check(dtypes.is_inexact(input.dtype), lambda: f"linalg.vector_norm: Expected a floating point or complex tensor as "
                                                  f"input. Got {prims.scalar_type_name(input.dtype)}")
    # checks dim (torch's norm also takes a tuple of dims); a 0-dim input has nothing to reduce
    dims = clang.reduction_dims(input, tuple(dim) if isinstance(dim, (tuple, list)) else (dim,))
    # torch rounds the norm to the input's dtype, clamps it there and divides elementwise
    norm = maybe_convert_to_dtype(_vector_norm_keepdim(maybe_convert_to_dtype(input,
                                                                              dtypes.computation_dtype(input.dtype)),
                                                       p, dims), input.dtype)
    norm = clang.where(clang.lt(norm, eps), eps, norm)
    return clang.true_divide(input, norm)

# -- reflected operators, defined as torch defines them (torch/_tensor.py) -------------------
register_alias(T.__radd__, lambda self, other: add(self, other))
register_alias(T.__rmul__, lambda self, other: mul(self, other))
register_alias(T.__rsub__, lambda self, other: rsub(self, other))
register_alias(T.__rtruediv__, lambda self, other: mul(plain["reciprocal"](self), other))
register_alias(T.__rpow__, lambda self, other: pow(other, self))
register_alias(T.__rfloordiv__, lambda self, other: floor_divide(other, self))
register_alias(T.__rmod__, lambda self, other: remainder(other, self))
register_alias(T.__rand__, lambda self, other: plain["bitwise_and"](self, other))
register_alias(T.__ror__, lambda self, other: plain["bitwise_or"](self, other))
register_alias(T.__rxor__, lambda self, other: plain["bitwise_xor"](self, other))
register_alias(T.__rlshift__, lambda self, other: plain["bitwise_left_shift"](other, self))
register_alias(T.__rrshift__, lambda self, other: plain["bitwise_right_shift"](other, self))
register_alias(F.sigmoid, lambda a: sigmoid(a))
register_alias(F.tanh, lambda a: plain["tanh"](a))
register_alias(T.__neg__, lambda self: neg(self))
register_alias(T.__pos__, lambda self: self)
register_alias(T.negative, lambda self: neg(self))
register_alias(torch.negative, lambda self: neg(self))
register_alias(T.__invert__,
               lambda self: plain["bitwise_not"](self) if self.dtype is not torch.bool else logical_not(self))


__all__ += ["neg", "abs", "round", "real", "isinf", "isneginf", "isposinf", "square", "sigmoid", "logical_not",
            "logical_and", "logical_or", "logical_xor", "add", "sub", "rsub", "mul", "div", "floor_divide", "remainder",
            "fmod", "pow", "nextafter", "where", "clamp", "clamp_min", "clamp_max", "lerp", "relu", "gelu", "silu",
            "leaky_relu", "elu", "softplus", "hardtanh", "relu6", "mish", "hardswish", "hardsigmoid", "selu", "celu",
            "logsigmoid", "softsign", "tanhshrink", "threshold", "hardshrink", "softshrink", "glu",
            "prelu", "normalize"]


# torch.allclose and torch.equal answer with a Python bool, which a trace cannot know: refused with the tensor form
@shape_rule(torch.allclose, T.allclose)
def _allclose_refusal(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    raise UnsupportedOpError(
        "torch.allclose returns a Python bool, decided by tensor values that tracing does not know; use "
        "torch.isclose(input, other, rtol, atol, equal_nan).all(), a bool tensor (return it and call .item() "
        "outside), or call torch.allclose outside the jitted function")


@shape_rule(torch.equal, T.equal)
def _equal_refusal(input, other):
    raise UnsupportedOpError(
        "torch.equal returns a Python bool, decided by tensor values that tracing does not know; compare the shapes "
        "in Python and use torch.eq(input, other).all(), a bool tensor (return it and call .item() outside), or call "
        "torch.equal outside the jitted function")
