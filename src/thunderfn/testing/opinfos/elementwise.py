"""OpInfos for thunderfn.torch.elementwise: unary math, binary math, comparisons,
logical and bitwise ops, where/clamp/lerp, activations and the Tensor operators,
reflected ones included (`2.0 - x` is `x.__rsub__(2.0)`)."""
from __future__ import annotations

import functools
import itertools
import operator
import re

import torch
import torch.nn.functional as F

from thunderfn.testing.opinfo import ALL, FLOATS, INTS, ErrorInput, OpInfo, SampleInput, make_tensor

NUMBERS = FLOATS + INTS  # every tested dtype but bool
BITWISE = INTS + (torch.bool,)
NAN, INF = float("nan"), float("inf")
# Values where decompositions of composite ops usually go wrong: overflow, NaN, signed zeros.
EXTREMALS = (INF, -INF, NAN, 0.0, -0.0, 1.0, -1.0)


def _reflected(op):
    """`scalar <op> tensor` as Python evaluates it (the tensor's reflected dunder), taking
    (tensor, scalar) so samples put the tensor first."""
    def reflected(tensor, scalar):
        return op(scalar, tensor)

    reflected.__name__ = f"reflected_{op.__name__}"
    return reflected


def _method(name):
    """`self.name(*args)` as a user writes it; Tensor's C methods refuse a proxy as an explicit self."""
    def method(self, *args, **kwargs):
        return getattr(self, name)(*args, **kwargs)

    method.__name__ = name
    return method


def _maker(device, dtype, low=None, high=None, **kwargs):
    return functools.partial(make_tensor, device=device, dtype=dtype, low=low, high=high, **kwargs)


def _chain(*sample_fns):
    """One sample_inputs function yielding the samples of each in turn."""
    def sample_inputs(device, dtype):
        return itertools.chain.from_iterable(fn(device, dtype) for fn in sample_fns)

    return sample_inputs


def _errors(*cases):
    """error_inputs from (make_args(device), kwargs, exc_type, regex[, torch_raises]) tuples."""
    def error_inputs(device):
        for make_args, kwargs, exc, match, *torch_raises in cases:
            yield ErrorInput(SampleInput(make_args(device), kwargs), exc, match, *torch_raises)

    return error_inputs


def _number_refused(name, position):
    """A Python number where torch's signature wants a tensor: TypeError."""
    args = ((lambda d: (make_tensor((2,), device=d), 2)) if position == 2
            else (lambda d: (2, make_tensor((2,), device=d))))
    return (args, {}, TypeError, rf"{name}\(\)")


def _t(*shape, dtype=torch.float32):
    """The args of a one-tensor error input (called with the device)."""
    return lambda device: (make_tensor(shape, device=device, dtype=dtype),)


# -- sample patterns -----------------------------------------------------------------------
def unary_samples(low=None, high=None, *, out_of_domain=(), variants=({},), extremals=EXTREMALS):
    """Every shape a unary op meets: plain, 0-dim, empty, non-contiguous, a transposed view;
    for floating dtypes also inf/nan/signed zeros and values outside the op's domain.
    Each extra kwargs variant runs on a plain tensor and on the extremal values."""
    def sample_inputs(device, dtype):
        make = _maker(device, dtype, low, high)
        kwargs = variants[0]
        yield SampleInput((make((2, 3)),), kwargs)
        yield SampleInput((make(()),), kwargs, "0-dim")
        yield SampleInput((make((0,)),), kwargs, "empty")
        yield SampleInput((make((2, 0)),), kwargs, "empty")
        yield SampleInput((make((3, 4), noncontiguous=True),), kwargs, "noncontiguous")
        yield SampleInput((make((4, 3)).T,), kwargs, "transposed")
        special = (*extremals, *out_of_domain)
        for kwargs in variants:
            if kwargs is not variants[0]:
                yield SampleInput((make((2, 3)),), kwargs)
            if dtype.is_floating_point and special:
                yield SampleInput((torch.tensor(special, device=device, dtype=dtype),), kwargs,
                                  "extremal and out-of-domain values")

    return sample_inputs


def binary_samples(low=None, high=None, *, rhs_low=None, rhs_high=None, exclude_zero=False, scalars=(2, 2.5, True),
                   lhs_scalars=(), mixed=(torch.float64, torch.int64, torch.bool)):
    """Samples for op(a, b): equal shapes, broadcasting ((3,1)x(1,4), (4,)x(2,3,4)), 0-dim,
    empty, non-contiguous and transposed operands, Python scalars on the right (and on the
    left where torch's function takes them), operands of the `mixed` dtypes (type promotion;
    float64 as a 0-dim tensor on either side, which a half tensor does not promote to) and,
    for floats, every pair of inf/nan/signed zeros/±1."""
    def sample_inputs(device, dtype):
        a = _maker(device, dtype, low, high)
        b = _maker(device, dtype, rhs_low, rhs_high, exclude_zero=exclude_zero)
        yield SampleInput((a((2, 3)), b((2, 3))))
        yield SampleInput((a((3, 1)), b((1, 4))), name="broadcast")
        yield SampleInput((a((4,)), b((2, 3, 4))), name="broadcast")
        yield SampleInput((a(()), b(())), name="0-dim")
        yield SampleInput((a((2, 3)), b(())), name="0-dim rhs")
        yield SampleInput((a((0,)), b((0,))), name="empty")
        yield SampleInput((a((2, 0)), b((1, 0))), name="empty broadcast")
        yield SampleInput((a((3, 4), noncontiguous=True), b((4, 3)).T), name="noncontiguous and transposed")
        for s in scalars:
            yield SampleInput((a((2, 3)), s), name="scalar rhs")
        for s in lhs_scalars:
            yield SampleInput((s, b((2, 3))), name="scalar lhs")
        for other in mixed:
            if other is dtype:
                continue
            if other is torch.float64:
                make_other = _maker(device, other, low, high, exclude_zero=exclude_zero)
                yield SampleInput((make_other(()), b((2, 3))), name="promotion with a 0-dim float64 lhs")
            make_other = _maker(device, other, rhs_low, rhs_high, exclude_zero=exclude_zero)
            yield SampleInput((a((2, 3)), make_other(() if other is torch.float64 else (2, 3))),
                              name=f"promotion with {other}")
        if dtype.is_floating_point:
            values = torch.tensor(EXTREMALS, device=device, dtype=dtype)
            grid = torch.cartesian_prod(values, values)
            yield SampleInput((grid[:, 0], grid[:, 1]), name="extremal values")

    return sample_inputs


def reflected_samples(scalars, low=None, high=None, exclude_zero=False):
    """op(tensor, scalar) for a reflected operator: `scalar <op> tensor`."""
    def sample_inputs(device, dtype):
        make = _maker(device, dtype, low, high, exclude_zero=exclude_zero)
        for s in scalars:
            yield SampleInput((make((2, 3)), s), name=f"{s!r} on the left")
            yield SampleInput((make(()), s), name="0-dim")
        yield SampleInput((make((0,)), scalars[0]), name="empty")
        yield SampleInput((make((3, 4), noncontiguous=True), scalars[0]), name="noncontiguous")

    return sample_inputs


def _float_scalars(dtype):
    return (2, 2.5, True) if dtype is not torch.bool else (True, 2, 2.5)


# -- error inputs shared by many ops ---------------------------------------------------------
def _not_implemented_for(dtype, *shapes):
    """torch's dispatch failure for a dtype an op does not support ("... not implemented for 'Bool'")."""
    torch_name = {torch.bool: "Bool", torch.float32: "Float", torch.int64: "Long", torch.uint8: "Byte"}[dtype]
    return (lambda device: tuple(make_tensor(s, device=device, dtype=dtype) for s in shapes or ((2,),)), {},
            NotImplementedError, f"not implemented for '{torch_name}'")


def _bad_broadcast():
    return (lambda device: (make_tensor((2, 3), device=device), make_tensor((3, 2), device=device)), {},
            RuntimeError,
            r"The size of tensor a \(3\) must match the size of tensor b \(2\) at non-singleton dimension 1")


def _binary_errors(*extra):
    return _errors(_bad_broadcast(), *extra)


# -- unary ops -------------------------------------------------------------------------------
# (name, low, high, values outside the domain): ops that take any dtype and return floats for ints
_INT_TO_FLOAT_UNARY = [
    ("exp", None, None, ()), ("exp2", None, None, ()), ("expm1", None, None, ()),
    ("log", 0.1, None, (-1.0, -0.5)), ("log1p", -0.9, None, (-2.0, -1.0)), ("log2", 0.1, None, (-1.0,)),
    ("log10", 0.1, None, (-1.0,)), ("sqrt", 0, None, (-1.0, -4.0)), ("rsqrt", 0, None, (-1.0,)),
    ("reciprocal", None, None, ()), ("sin", None, None, ()), ("cos", None, None, ()), ("tan", None, None, ()),
    ("asin", -1, 1, (1.5, -2.0)), ("acos", -1, 1, (1.5, -2.0)), ("atan", None, None, ()), ("sinh", None, None, ()),
    ("cosh", None, None, ()), ("tanh", None, None, ()), ("asinh", None, None, ()), ("acosh", 1, None, (0.5, -1.0)),
    ("atanh", -1, 1, (1.5, -2.0)), ("erf", None, None, ()), ("erfc", None, None, ()),
    ("erfinv", -1, 1, (1.5, -2.0)), ("lgamma", None, None, (-2.0, -2.5)), ("digamma", None, None, (-2.0, -2.5)),
]

opinfos: list[OpInfo] = [
    OpInfo(name, getattr(torch, name), unary_samples(low, high, out_of_domain=ood), dtypes=ALL)
    for name, low, high, ood in _INT_TO_FLOAT_UNARY
]

opinfos += [
    OpInfo("neg", torch.neg, unary_samples(), dtypes=NUMBERS, error_inputs=_errors(
        (_t(2, dtype=torch.bool), {}, RuntimeError, "Negation, the `-` operator, on a bool tensor is not supported"))),
    OpInfo("operator.neg", operator.neg, unary_samples(), dtypes=(torch.float32, torch.int64)),
    OpInfo("operator.pos", operator.pos, unary_samples(), dtypes=(torch.float32, torch.int64)),
    OpInfo("floor", torch.floor, unary_samples(), dtypes=NUMBERS,
           error_inputs=_errors(_not_implemented_for(torch.bool))),
    OpInfo("ceil", torch.ceil, unary_samples(), dtypes=NUMBERS,
           error_inputs=_errors(_not_implemented_for(torch.bool))),
    OpInfo("trunc", torch.trunc, unary_samples(), dtypes=NUMBERS,
           error_inputs=_errors(_not_implemented_for(torch.bool))),
    OpInfo("round", torch.round, unary_samples(-20, 20), dtypes=NUMBERS,
           error_inputs=_errors(_not_implemented_for(torch.bool))),
    OpInfo("round_decimals", torch.round,
           unary_samples(-20, 20, variants=({"decimals": 2}, {"decimals": -1}, {"decimals": 0})), dtypes=FLOATS,
           error_inputs=_errors(
               (_t(3, dtype=torch.int64), {"decimals": 2}, NotImplementedError, "not implemented for 'Long'"))),
    OpInfo("sign", torch.sign, unary_samples(), dtypes=ALL),
    OpInfo("signbit", torch.signbit, unary_samples(), dtypes=ALL),
    OpInfo("isfinite", torch.isfinite, unary_samples(), dtypes=ALL),
    OpInfo("isnan", torch.isnan, unary_samples(), dtypes=ALL),
    OpInfo("isinf", torch.isinf, unary_samples(), dtypes=ALL),
    OpInfo("isneginf", torch.isneginf, unary_samples(), dtypes=ALL),
    OpInfo("isposinf", torch.isposinf, unary_samples(), dtypes=ALL),
    OpInfo("bitwise_not", torch.bitwise_not, unary_samples(), dtypes=BITWISE,
           error_inputs=_errors(_not_implemented_for(torch.float32))),
    OpInfo("operator.invert", operator.invert, unary_samples(), dtypes=BITWISE),
    OpInfo("abs", torch.abs, unary_samples(), dtypes=NUMBERS,
           error_inputs=_errors(_not_implemented_for(torch.bool))),
    OpInfo("operator.abs", operator.abs, unary_samples(), dtypes=(torch.float32, torch.int8)),
    OpInfo("real", torch.real, unary_samples(), dtypes=ALL),
    OpInfo("square", torch.square, unary_samples(), dtypes=ALL),
    OpInfo("sigmoid", torch.sigmoid, unary_samples(), dtypes=ALL),
    OpInfo("logical_not", torch.logical_not, unary_samples(), dtypes=ALL),
]

# -- binary math -----------------------------------------------------------------------------
_SHIFT = dict(rhs_low=0, rhs_high=4, scalars=(1, 3), lhs_scalars=(2,), mixed=(torch.int64,))


def _alpha_samples(device, dtype):
    a = _maker(device, dtype)
    alphas = (True,) if dtype is torch.bool else (2, -1) if not dtype.is_floating_point else (2, 0.5)
    for alpha in alphas:
        yield SampleInput((a((2, 3)), a((2, 3))), {"alpha": alpha}, "alpha")
        yield SampleInput((a((3, 1)), True if dtype is torch.bool else 3), {"alpha": alpha}, "alpha, scalar rhs")


def _rounding_samples(device, dtype):
    if dtype is torch.bool:
        return
    a, b = _maker(device, dtype), _maker(device, dtype, exclude_zero=True)
    for mode in ("trunc", "floor"):
        yield SampleInput((a((2, 3)), b((2, 3))), {"rounding_mode": mode}, "rounding")
        yield SampleInput((a((3, 1)), b((1, 4))), {"rounding_mode": mode}, "rounding, broadcast")
        yield SampleInput((a((2, 3)), 3), {"rounding_mode": mode}, "rounding, scalar rhs")
        yield SampleInput((a((2, 3)), -2.5), {"rounding_mode": mode}, "rounding, float scalar rhs")
        if dtype.is_floating_point:
            x = torch.tensor(EXTREMALS, device=device, dtype=dtype)
            grid = torch.cartesian_prod(x, x)
            yield SampleInput((grid[:, 0], grid[:, 1]), {"rounding_mode": mode}, "rounding, extremal values")


def _pow_samples(device, dtype):
    a = _maker(device, dtype, -4, 4)
    for exponent in (2, 0.5, 1, 3, 0, -1, -2.5):
        if dtype.is_floating_point or (isinstance(exponent, float) or exponent >= 0):
            yield SampleInput((a((2, 3)), exponent), name="special-cased exponent")
    if dtype.is_floating_point:
        yield SampleInput((torch.tensor(EXTREMALS, device=device, dtype=dtype), 0.5), name="sqrt of extremal values")
        yield SampleInput((torch.tensor(EXTREMALS, device=device, dtype=dtype), 2), name="square of extremal values")


def _where_samples(device, dtype):
    cond = _maker(device, torch.bool)
    a = _maker(device, dtype)
    yield SampleInput((cond((2, 3)), a((2, 3)), a((2, 3))))
    yield SampleInput((cond((3, 1)), a((1, 4)), a((4,))), name="broadcast")
    yield SampleInput((cond(()), a((2, 3)), a(())), name="0-dim condition")
    yield SampleInput((cond((2, 3)), a(()), a(())), name="0-dim values")
    yield SampleInput((cond((0,)), a((0,)), a((0,))), name="empty")
    yield SampleInput((cond((2, 0)), a((2, 0)), a(())), name="empty")
    yield SampleInput((cond((4, 3)).T, a((3, 4), noncontiguous=True), a((4, 3)).T), name="noncontiguous")
    yield SampleInput((cond((2, 3)), a((2, 3)), 2.5), name="scalar other")
    yield SampleInput((cond((2, 3)), 2, a((2, 3))), name="scalar input")
    yield SampleInput((cond((2, 3)), True, a((2, 3))), name="bool scalar input")
    yield SampleInput((cond((2, 3)), 2.0, 3), name="two scalars")
    for other in (torch.float64, torch.int64, torch.bool):
        if other is not dtype:
            yield SampleInput((cond((2, 3)), a((2, 3)), make_tensor((2, 3), device=device, dtype=other)),
                              name="promotion")
            yield SampleInput((cond((2, 3)), make_tensor((), device=device, dtype=other), a((2, 3))), name="promotion")


def _tensor_where_samples(device, dtype):
    """Tensor.where(self, condition, other): self is the value where condition holds."""
    for s in _where_samples(device, dtype):
        cond, x, y = s.args
        if isinstance(x, torch.Tensor):
            yield SampleInput((x, cond, y), name=s.name)


_WHERE_ERRORS = _errors(
    (lambda d: (make_tensor((2, 3), device=d), make_tensor((2, 3), device=d), make_tensor((2, 3), device=d)), {},
     RuntimeError, "where expected condition to be a boolean tensor, but got a tensor with dtype Float"),
    (lambda d: (make_tensor((2, 3), device=d, dtype=torch.int64), 1.0, 2.0), {},
     RuntimeError, "where expected condition to be a boolean tensor, but got a tensor with dtype Long"),
    (lambda d: (make_tensor((2, 3), device=d, dtype=torch.bool), make_tensor((3, 2), device=d), 1.0), {},
     RuntimeError, "The size of tensor a"),
    (lambda d: (True, make_tensor((2,), device=d), make_tensor((2,), device=d)), {}, TypeError,
     r"where\(\) received an invalid combination of arguments"),
)

opinfos += [
    OpInfo("add", torch.add, _chain(binary_samples(lhs_scalars=(2, 2.5)), _alpha_samples), dtypes=ALL,
           error_inputs=_binary_errors(
               (lambda d: (make_tensor((2,), device=d), make_tensor((2,), device=d)), {"alpha": True},
                RuntimeError, "Boolean alpha only supported for Boolean results"),
               (lambda d: (make_tensor((2,), device=d, dtype=torch.int64),) * 2, {"alpha": 0.5},
                RuntimeError, "For integral input tensors, argument alpha must not be a floating point number"),
               (lambda d: (make_tensor((2,), device=d), "a"), {}, TypeError, r"add\(\): argument 'other'"),
               (lambda d: ("a", make_tensor((2,), device=d)), {}, TypeError, r"add\(\): argument 'input'"))),
    OpInfo("operator.add", operator.add, binary_samples(), dtypes=(torch.float32, torch.int64, torch.bool)),
    OpInfo("sub", torch.sub,
           _chain(binary_samples(scalars=(2, 2.5), lhs_scalars=(2, 2.5), mixed=(torch.float64, torch.int64)),
                  _alpha_samples), dtypes=NUMBERS,
           error_inputs=_binary_errors(
               (lambda d: (make_tensor((2,), device=d, dtype=torch.bool),) * 2, {}, RuntimeError,
                "Subtraction, the `-` operator, with two bool tensors is not supported"),
               (lambda d: (make_tensor((2,), device=d, dtype=torch.bool), 1), {}, RuntimeError,
                "Subtraction, the `-` operator, with a bool tensor is not supported"),
               (lambda d: (make_tensor((2,), device=d), make_tensor((2,), device=d, dtype=torch.bool)),
                {}, RuntimeError, "Subtraction, the `-` operator, with a bool tensor is not supported"),
               (lambda d: (make_tensor((2,), device=d), True), {}, RuntimeError,
                "Subtraction, the `-` operator, with a bool tensor is not supported"),
               (lambda d: (make_tensor((2,), device=d),) * 2, {"alpha": True}, RuntimeError,
                "Boolean alpha only supported for Boolean results"))),
    OpInfo("operator.sub", operator.sub, binary_samples(scalars=(2, 2.5), mixed=(torch.int64,)),
           dtypes=(torch.float32, torch.int64)),
    OpInfo("rsub", torch.rsub,
           _chain(binary_samples(scalars=(2, 2.5), mixed=(torch.float64, torch.int64)), _alpha_samples), dtypes=NUMBERS,
           error_inputs=_errors(
               (lambda d: (make_tensor((2,), device=d, dtype=torch.bool),) * 2, {}, RuntimeError,
                "Subtraction, the `-` operator, with two bool tensors is not supported"))),
    OpInfo("mul", torch.mul, binary_samples(lhs_scalars=(2, 2.5, True)), dtypes=ALL,
           error_inputs=_binary_errors((lambda d: (make_tensor((2,), device=d), None), {}, TypeError,
                                        r"mul\(\): argument 'other'"))),
    OpInfo("operator.mul", operator.mul, binary_samples(), dtypes=(torch.float32, torch.int64, torch.bool)),
    OpInfo("div", torch.div,
           _chain(binary_samples(exclude_zero=True, lhs_scalars=(2, 2.5)), _rounding_samples), dtypes=ALL,
           error_inputs=_binary_errors(
               (lambda d: (make_tensor((2,), device=d),) * 2, {"rounding_mode": "bad"}, RuntimeError,
                "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found 'bad'"),
               (lambda d: (make_tensor((2,), device=d, dtype=torch.bool),) * 2, {"rounding_mode": "floor"},
                NotImplementedError, "not implemented for 'Bool'"))),
    OpInfo("operator.truediv", operator.truediv, binary_samples(exclude_zero=True),
           dtypes=(torch.float32, torch.int64)),
    OpInfo("floor_divide", torch.floor_divide,
           binary_samples(exclude_zero=True, lhs_scalars=(7,), mixed=(torch.float64, torch.int64)),
           dtypes=NUMBERS, error_inputs=_binary_errors(_not_implemented_for(torch.bool, (2,), (2,)))),
    OpInfo("operator.floordiv", operator.floordiv, binary_samples(exclude_zero=True, scalars=(2, 2.5), mixed=()),
           dtypes=(torch.float32, torch.int64)),
    OpInfo("remainder", torch.remainder, binary_samples(exclude_zero=True, scalars=(3, 2.5), lhs_scalars=(7,),
                                                        mixed=(torch.float64, torch.int64)),
           dtypes=NUMBERS, error_inputs=_binary_errors(_not_implemented_for(torch.bool, (2,), (2,)))),
    OpInfo("operator.mod", operator.mod, binary_samples(exclude_zero=True, scalars=(3, 2.5), mixed=()),
           dtypes=(torch.float32, torch.int64)),
    OpInfo("fmod", torch.fmod, binary_samples(exclude_zero=True, scalars=(3, 2.5), mixed=(torch.float64, torch.int64)),
           dtypes=NUMBERS,
           error_inputs=_binary_errors(_not_implemented_for(torch.bool, (2,), (2,)), _number_refused("fmod", 1))),
    OpInfo("pow", torch.pow,
           _chain(binary_samples(-4, 4, rhs_low=0, rhs_high=4, scalars=(2, 0.5, 3), lhs_scalars=(2, 1.5),
                                 mixed=(torch.float64, torch.int64)), _pow_samples),
           dtypes=NUMBERS, error_inputs=_binary_errors(
               _not_implemented_for(torch.bool, (2,), (2,)),
               (lambda d: (make_tensor((2,), device=d, dtype=torch.int64), -1), {}, RuntimeError,
                "Integers to negative integer powers are not allowed"))),
    OpInfo("operator.pow", operator.pow,
           _chain(binary_samples(-4, 4, rhs_low=0, rhs_high=4, scalars=(2, 0.5), mixed=()),
                                               _pow_samples), dtypes=(torch.float32, torch.int64)),
    OpInfo("maximum", torch.maximum, binary_samples(scalars=()), dtypes=ALL, error_inputs=_binary_errors(
        _number_refused("maximum", 1), (lambda d: (make_tensor((2,), device=d), 2.5), {}, TypeError,
                                        r"maximum\(\): argument 'other' \(position 2\) must be Tensor, not float"))),
    OpInfo("minimum", torch.minimum, binary_samples(scalars=()), dtypes=ALL,
           error_inputs=_binary_errors(_number_refused("minimum", 1), _number_refused("minimum", 2))),
    OpInfo("atan2", torch.atan2, binary_samples(scalars=()), dtypes=ALL,
           error_inputs=_binary_errors(_number_refused("atan2", 1), _number_refused("atan2", 2))),
    OpInfo("copysign", torch.copysign, binary_samples(scalars=(-2, 2.5)), dtypes=ALL,
           error_inputs=_binary_errors(_number_refused("copysign", 1))),
    OpInfo("nextafter", torch.nextafter, binary_samples(scalars=(), mixed=(torch.float64,)), dtypes=FLOATS,
           error_inputs=_binary_errors(_not_implemented_for(torch.int64, (2,), (2,)), _number_refused("nextafter", 2))),
]

# -- bitwise, comparison and logical ops -----------------------------------------------------
opinfos += [
    OpInfo(name, getattr(torch, name),
           binary_samples(scalars=(2, True), lhs_scalars=(5,), mixed=(torch.int64, torch.bool)), dtypes=BITWISE,
           error_inputs=_binary_errors(_not_implemented_for(torch.float32, (2,), (2,))))
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor")
] + [
    OpInfo(name, getattr(torch, name), binary_samples(**_SHIFT), dtypes=INTS,
           error_inputs=_binary_errors(_not_implemented_for(torch.float32, (2,), (2,))))
    for name in ("bitwise_left_shift", "bitwise_right_shift")
] + [
    OpInfo(f"operator.{name}", getattr(operator, name), binary_samples(**_SHIFT), dtypes=(torch.int64, torch.uint8))
    for name in ("lshift", "rshift")
] + [
    OpInfo(f"operator.{name}", getattr(operator, name), binary_samples(scalars=(3,), mixed=()),
           dtypes=(torch.int32, torch.bool))
    for name in ("and_", "or_", "xor")
] + [
    OpInfo(name, getattr(torch, name), binary_samples(scalars=(2, 2.5, True)), dtypes=ALL,
           error_inputs=_binary_errors(_number_refused(name, 1)))
    for name in ("eq", "ne", "lt", "le", "gt", "ge")
] + [
    OpInfo(f"operator.{name}", getattr(operator, name), binary_samples(scalars=(2, 2.5)),
           dtypes=(torch.float32, torch.int64))
    for name in ("eq", "ne", "lt", "le", "gt", "ge")
] + [
    OpInfo(name, getattr(torch, name), binary_samples(scalars=()), dtypes=ALL, error_inputs=_binary_errors(
        (lambda d: (make_tensor((2,), device=d), 2), {}, TypeError, rf"{name}\(\): argument 'other'")))
    for name in ("logical_and", "logical_or", "logical_xor")
]

# -- reflected operators: `scalar <op> tensor` -------------------------------------------------
opinfos += [
    OpInfo("reflected_add", _reflected(operator.add), reflected_samples((2, 2.5, True)), dtypes=ALL),
    OpInfo("reflected_sub", _reflected(operator.sub), reflected_samples((2, 2.5)), dtypes=NUMBERS, error_inputs=_errors(
        (lambda d: (make_tensor((2,), device=d, dtype=torch.bool), True), {}, RuntimeError,
         "Subtraction, the `-` operator, with two bool tensors is not supported"))),
    OpInfo("reflected_mul", _reflected(operator.mul), reflected_samples((2, 2.5, True)), dtypes=ALL),
    OpInfo("reflected_truediv", _reflected(operator.truediv),
           reflected_samples((2, 2.5, True), exclude_zero=True), dtypes=ALL),
    OpInfo("reflected_pow", _reflected(operator.pow), reflected_samples((2, 1.5), low=0, high=4), dtypes=NUMBERS),
    OpInfo("reflected_floordiv", _reflected(operator.floordiv), reflected_samples((7, 2.5), exclude_zero=True),
           dtypes=NUMBERS),
    OpInfo("reflected_mod", _reflected(operator.mod), reflected_samples((7, 2.5), exclude_zero=True), dtypes=NUMBERS),
    OpInfo("reflected_and", _reflected(operator.and_), reflected_samples((6, True)), dtypes=BITWISE),
    OpInfo("reflected_or", _reflected(operator.or_), reflected_samples((6, True)), dtypes=BITWISE),
    OpInfo("reflected_xor", _reflected(operator.xor), reflected_samples((6, True)), dtypes=BITWISE),
    OpInfo("reflected_lshift", _reflected(operator.lshift), reflected_samples((3,), low=0, high=4), dtypes=INTS),
    OpInfo("reflected_rshift", _reflected(operator.rshift), reflected_samples((100,), low=0, high=4), dtypes=INTS),
]

# -- where, clamp, lerp ----------------------------------------------------------------------
def _clamp_samples(device, dtype):
    a = _maker(device, dtype)
    lo, hi = (-3, 4) if dtype is not torch.uint8 else (2, 6)
    yield SampleInput((a((2, 3)), lo, hi), name="int bounds")
    yield SampleInput((a((2, 3)),), {"min": lo}, "min only")
    yield SampleInput((a((2, 3)),), {"max": hi}, "max only")
    yield SampleInput((a((2, 3)), hi, lo), name="min above max")
    yield SampleInput((a((2, 3)), -2.5, 3.5), name="float bounds")
    yield SampleInput((a(()), lo, hi), name="0-dim")
    yield SampleInput((a((0,)), lo, hi), name="empty")
    yield SampleInput((a((3, 4), noncontiguous=True), lo, hi), name="noncontiguous")
    yield SampleInput((a((3, 4)), a((3, 1)), a((4,))), name="tensor bounds, broadcast")
    yield SampleInput((a((2, 3)),), {"min": a(())}, "0-dim tensor min")
    yield SampleInput((a((2, 3)),), {"max": a((2, 3))}, "tensor max")
    if dtype.is_floating_point:
        x = torch.tensor(EXTREMALS, device=device, dtype=dtype)
        yield SampleInput((x, -0.5, 0.5), name="extremal values")
        yield SampleInput((x, torch.full_like(x, NAN), None), name="NaN bound")
    if dtype is not torch.float64:
        yield SampleInput((a((2, 3)), make_tensor((2, 3), device=device, dtype=torch.float64)), name="promotion")


def _clamp_bound_samples(bound):
    def sample_inputs(device, dtype):
        a = _maker(device, dtype)
        value = 2 if dtype is not torch.uint8 else 4
        yield SampleInput((a((2, 3)), value))
        yield SampleInput((a((2, 3)), 2.5), name="float bound")
        yield SampleInput((a(()), value), name="0-dim")
        yield SampleInput((a((0,)), value), name="empty")
        yield SampleInput((a((3, 4), noncontiguous=True), a((4,))), name="tensor bound, broadcast")
        if dtype.is_floating_point:
            yield SampleInput((torch.tensor(EXTREMALS, device=device, dtype=dtype), 0.5), name="extremal values")

    return sample_inputs


def _lerp_samples(device, dtype):
    a = _maker(device, dtype)
    for weight in (0.25, 0.75, -1.5, 2):
        yield SampleInput((a((2, 3)), a((2, 3)), weight), name="scalar weight")
    yield SampleInput((a((3, 1)), a((1, 4)), 0.5), name="broadcast")
    yield SampleInput((a((2, 3)), a((2, 3)), a((2, 3), low=0, high=1)), name="tensor weight")
    yield SampleInput((a((2, 3)), a((3,)), a((2, 1), low=-1, high=2)), name="tensor weight, broadcast")
    yield SampleInput((a(()), a(()), a(())), name="0-dim")
    yield SampleInput((a((0,)), a((0,)), 0.5), name="empty")
    yield SampleInput((a((3, 4), noncontiguous=True), a((4, 3)).T, 0.3), name="noncontiguous")
    x = torch.tensor(EXTREMALS, device=device, dtype=dtype)
    yield SampleInput((x, x.flip(0), 0.5), name="extremal values")


opinfos += [
    OpInfo("where", torch.where, _where_samples, dtypes=ALL, error_inputs=_WHERE_ERRORS),
    OpInfo("Tensor.where", _method("where"), _tensor_where_samples, dtypes=(torch.float32, torch.int64, torch.bool)),
    OpInfo("clamp", torch.clamp, _clamp_samples, dtypes=NUMBERS, error_inputs=_errors(
        (_t(2, 3), {}, RuntimeError, "torch.clamp: At least one of 'min' or 'max' must not be None"),
        (lambda d: (make_tensor((2,), device=d, dtype=torch.bool), True, True), {}, NotImplementedError,
         "not implemented for 'Bool'"),
        (lambda d: (make_tensor((2, 3), device=d), make_tensor((3, 2), device=d)), {}, RuntimeError,
         "The size of tensor a"))),
    OpInfo("clamp_min", torch.clamp_min, _clamp_bound_samples("min"), dtypes=NUMBERS),
    OpInfo("clamp_max", torch.clamp_max, _clamp_bound_samples("max"), dtypes=NUMBERS),
    OpInfo("lerp", torch.lerp, _lerp_samples, dtypes=FLOATS, error_inputs=_errors(
        (lambda d: (make_tensor((2,), device=d, dtype=torch.int64),) * 2 + (0.5,), {}, NotImplementedError,
         "not implemented for 'Long'"),
        (lambda d: (make_tensor((2, 3), device=d), make_tensor((3, 2), device=d), 0.5), {}, RuntimeError,
         "The size of tensor a"),
        (lambda d: (make_tensor((2,), device=d), 2, 0.5), {}, TypeError,
         r"lerp\(\) received an invalid combination of arguments"),
        (lambda d: (make_tensor((2,), device=d), make_tensor((2,), device=d, dtype=torch.float64), 0.5),
         {}, RuntimeError, "expected dtype .* for `end` but got dtype"),
        (lambda d: (make_tensor((2,), device=d),) * 2 + (make_tensor((2,), device=d, dtype=torch.float64),),
         {}, RuntimeError, "expected dtype .* for `weight` but got dtype"))),
]

# -- activations -----------------------------------------------------------------------------
def _int_input_error(dtype=torch.int64):
    return _not_implemented_for(dtype)


opinfos += [
    OpInfo("relu", torch.relu, unary_samples(), dtypes=NUMBERS, error_inputs=_errors(
        (_t(2, dtype=torch.bool), {}, RuntimeError, "Boolean inputs not supported for relu"))),
    OpInfo("nn.functional.relu", F.relu, unary_samples(), dtypes=(torch.float32, torch.int64),
           error_inputs=None),
    # no +inf: torch's vectorized float32/bfloat16 GELU kernel returns NaN there, float64's returns inf
    OpInfo("nn.functional.gelu", F.gelu, unary_samples(variants=({}, {"approximate": "tanh"}),
                                                       extremals=tuple(v for v in EXTREMALS
                                                                       if v != INF)), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error(),
                                (_t(2), {"approximate": "bad"}, RuntimeError,
                                 "approximate argument must be either none or tanh"))),
    OpInfo("nn.functional.silu", F.silu, unary_samples(), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error())),
    OpInfo("nn.functional.leaky_relu", F.leaky_relu,
           unary_samples(variants=({}, {"negative_slope": 0.2})), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error())),
    OpInfo("nn.functional.elu", F.elu, unary_samples(variants=({}, {"alpha": 0.5})), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error())),
    OpInfo("nn.functional.softplus", F.softplus,
           unary_samples(-30, 30, variants=({}, {"beta": 2.0}, {"beta": 0.5, "threshold": 5.0})), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error())),
    OpInfo("nn.functional.hardtanh", F.hardtanh, unary_samples(variants=({}, {"min_val": -2.0, "max_val": 3.0})),
           dtypes=FLOATS + (torch.int64, torch.int32, torch.int8), error_inputs=_errors(
               (_t(2, dtype=torch.bool), {}, RuntimeError, "Bool inputs not supported for hardtanh"),
               (_t(2, dtype=torch.uint8), {}, RuntimeError,
                "cannot do hardtanh on an unsigned type with negative limits"))),
    OpInfo("nn.functional.relu6", F.relu6, unary_samples(), dtypes=NUMBERS, error_inputs=_errors(
        (_t(2, dtype=torch.bool), {}, RuntimeError, "Bool inputs not supported for hardtanh"))),
    OpInfo("nn.functional.mish", F.mish, unary_samples(), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error())),
    OpInfo("nn.functional.sigmoid", F.sigmoid, unary_samples(), dtypes=(torch.float32, torch.bfloat16)),
    OpInfo("nn.functional.tanh", F.tanh, unary_samples(), dtypes=(torch.float32, torch.bfloat16)),
]


def _glu_samples(device, dtype):
    make = _maker(device, dtype)
    yield SampleInput((make((2, 4)),))
    yield SampleInput((make((4, 3)), 0), name="dim 0")
    yield SampleInput((make((2, 3, 6)),), {"dim": -1})
    yield SampleInput((make((0, 4)),), name="empty")
    yield SampleInput((make((2, 0)),), {"dim": 0}, "empty halves")
    yield SampleInput((make((3, 4), noncontiguous=True),), name="noncontiguous")
    yield SampleInput((make((4, 2)).T,), name="transposed")
    if dtype.is_floating_point:
        yield SampleInput((torch.tensor(EXTREMALS + (2.0,), device=device, dtype=dtype).reshape(2, 4), 0),
                          name="extremal values")


def _prelu_samples(device, dtype):
    make = _maker(device, dtype)
    yield SampleInput((make((2, 3, 4)), make((3,))), name="per channel")
    yield SampleInput((make((2, 3)), make((3,))), name="per channel, 2-D")
    yield SampleInput((make((2, 3, 2, 2)), make((1,))), name="one slope")
    yield SampleInput((make((5,)), make(())), name="0-dim slope")
    yield SampleInput((make(()), make((1,))), name="0-dim")
    yield SampleInput((make((0, 3)), make((3,))), name="empty")
    yield SampleInput((make((4, 3, 2), noncontiguous=True), make((3,), noncontiguous=True)), name="noncontiguous")
    if dtype.is_floating_point:
        yield SampleInput((torch.tensor(EXTREMALS, device=device, dtype=dtype), make((1,))), name="extremal values")


def _normalize_samples(device, dtype):
    make = _maker(device, dtype)
    yield SampleInput((make((2, 3, 4)),))
    for p in (1, 3, 0.5, 0, INF, -INF):
        yield SampleInput((make((2, 3, 4)),), {"p": p}, f"p={p}")
    yield SampleInput((make((3, 4)),), {"dim": 0})
    yield SampleInput((make((3, 4)), 2.0, -1, 0.5), name="large eps")
    yield SampleInput((make((4,)),), {"dim": 0}, "1-D")
    yield SampleInput((make(()),), {"dim": 0}, "0-dim")
    yield SampleInput((make((0, 3)),), name="empty")
    yield SampleInput((make((3, 0)),), name="empty norm")
    yield SampleInput((torch.zeros((2, 3), device=device, dtype=dtype),), name="zero rows: divided by eps")
    yield SampleInput((make((3, 4), noncontiguous=True),), name="noncontiguous")
    yield SampleInput((make((4, 3)).T,), name="transposed")


def _softshrink_lambda_error(dtype, text):
    return (_t(2, dtype=dtype), {"lambd": -0.5}, RuntimeError,
            rf"lambda must be in range \[0, {re.escape(text)}\] for input dtype {_SCALAR_NAME[dtype]}, but found -0.5")


_SCALAR_NAME = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16"}

opinfos += [
    OpInfo("nn.functional.hardswish", F.hardswish, unary_samples(-6, 6), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error())),
    OpInfo("nn.functional.hardsigmoid", F.hardsigmoid, unary_samples(-6, 6), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error())),
    OpInfo("nn.functional.selu", F.selu, unary_samples(), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error())),
    OpInfo("selu", torch.selu, unary_samples(), dtypes=(torch.float32,)),
    OpInfo("nn.functional.celu", F.celu, unary_samples(variants=({}, {"alpha": 0.5}, {"alpha": 2.0})), dtypes=FLOATS,
           error_inputs=_errors(_int_input_error(),
                                (_t(2), {"alpha": 0.0}, RuntimeError,
                                 "ZeroDivisionError: alpha cannot be 0 for CELU"))),
    OpInfo("celu", torch.celu, unary_samples(variants=({}, {"alpha": 0.5})), dtypes=(torch.float32,)),
    OpInfo("nn.functional.logsigmoid", F.logsigmoid, unary_samples(-30, 30), dtypes=FLOATS,
           error_inputs=_errors(_not_implemented_for(torch.int64), _not_implemented_for(torch.bool))),
    OpInfo("nn.functional.softsign", F.softsign, unary_samples(), dtypes=FLOATS + (torch.int64, torch.int32),
           error_inputs=_errors(_not_implemented_for(torch.bool))),
    OpInfo("nn.functional.tanhshrink", F.tanhshrink, unary_samples(), dtypes=FLOATS + (torch.int64,),
           error_inputs=_errors((_t(2, dtype=torch.bool), {}, RuntimeError,
                                 "Subtraction, the `-` operator, with a bool tensor is not supported"))),
    OpInfo("nn.functional.threshold", F.threshold,
           unary_samples(variants=({"threshold": 0.5, "value": 2.0}, {"threshold": -1.0, "value": -3.0})),
           dtypes=FLOATS + (torch.int64, torch.int32),
           error_inputs=_errors(
               (lambda d: (make_tensor((2,), device=d, dtype=torch.bool), 0, 1), {}, NotImplementedError,
                "\"threshold_cpu\" not implemented for 'Bool'"))),
    OpInfo("threshold", torch.threshold, unary_samples(variants=({"threshold": 0.5, "value": 2.0},)),
           dtypes=(torch.float32,)),
    OpInfo("nn.functional.hardshrink", F.hardshrink, unary_samples(variants=({}, {"lambd": 1.0}, {"lambd": 0.0})),
           dtypes=FLOATS, error_inputs=_errors(_not_implemented_for(torch.int64))),
    OpInfo("hardshrink", torch.hardshrink, unary_samples(variants=({}, {"lambd": 1.5})), dtypes=(torch.float32,)),
    OpInfo("Tensor.hardshrink", _method("hardshrink"), unary_samples(), dtypes=(torch.float32,)),
    OpInfo("nn.functional.softshrink", F.softshrink, unary_samples(variants=({}, {"lambd": 1.0}, {"lambd": 0.0})),
           dtypes=FLOATS, error_inputs=_errors(
               (_t(2, dtype=torch.int64), {}, NotImplementedError, "\"softshrink_check\" not implemented for 'Long'"),
               *(_softshrink_lambda_error(dt, text) for dt, text in (
                   (torch.float32, "3.40282e+38"), (torch.float64, "1.79769e+308"), (torch.float16, "65504"),
                   (torch.bfloat16, "3.38953e+38"))))),
    OpInfo("nn.functional.glu", F.glu, _glu_samples, dtypes=FLOATS, error_inputs=_errors(
        (_t(), {}, RuntimeError, "glu does not support scalars because halving size must be even"),
        (_t(2, 3), {}, RuntimeError, "Halving dimension must be even, but dimension 1 is size 3"),
        (_t(3, 2), {"dim": 0}, RuntimeError, "Halving dimension must be even, but dimension 0 is size 3"),
        (_t(3, 2), {"dim": 2}, IndexError,
         r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
        (_t(2, 4, dtype=torch.int64), {}, NotImplementedError, "\"glu_cpu\" not implemented for 'Long'"))),
    OpInfo("nn.functional.prelu", F.prelu, _prelu_samples, dtypes=FLOATS, error_inputs=_errors(
        (lambda d: (make_tensor((2, 4), device=d), make_tensor((2, 2), device=d)), {}, RuntimeError,
         "prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = 2"),
        (lambda d: (make_tensor((2, 4), device=d), make_tensor((3,), device=d)), {}, RuntimeError,
         r"Mismatch of parameter numbers and input channel size. Found parameter numbers = 3 and channel size = 4."),
        (lambda d: (make_tensor((4,), device=d), make_tensor((4,), device=d)), {}, RuntimeError,
         r"Found parameter numbers = 4 and channel size = 1."),
        (lambda d: (make_tensor((2, 4), device=d), make_tensor((4,), device=d, dtype=torch.float64)), {}, RuntimeError,
         "prelu: Type promoting not supported. Got Float and Double"),
        (lambda d: (make_tensor((2, 4), device=d, dtype=torch.float16), make_tensor((4,), device=d)), {}, RuntimeError,
         "prelu: Type promoting not supported. Got Half and Float"),
        (lambda d: (make_tensor((2, 4), device=d, dtype=torch.int64),
                    make_tensor((4,), device=d, dtype=torch.int64)), {},
         NotImplementedError,
         "\"prelu_cpu\" not implemented for 'Long'"))),
    OpInfo("prelu", torch.prelu, _prelu_samples, dtypes=(torch.float32,)),
    OpInfo("Tensor.prelu", _method("prelu"), _prelu_samples, dtypes=(torch.float32,)),
    OpInfo("nn.functional.normalize", F.normalize, _normalize_samples, dtypes=FLOATS, error_inputs=_errors(
        (_t(2, 3, dtype=torch.int64), {}, RuntimeError,
         "linalg.vector_norm: Expected a floating point or complex tensor as input. Got Long"),
        (_t(2, 3), {"dim": 2}, IndexError,
         r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
        (_t(3), {}, IndexError, r"Dimension out of range \(expected to be in range of \[-1, 0\], but got 1\)"))),
]
