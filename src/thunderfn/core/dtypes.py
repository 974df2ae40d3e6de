"""dtype facts and torch's type promotion, computed on metadata alone.

We mirror c10's `ResultTypeState` (aten/src/ATen/native/TypeProperties.cpp): tensors
with dimensions outrank zero-dim tensors, which outrank Python scalars, but a lower
rank can still raise the *category* (bool < integer < floating < complex).
"""
from __future__ import annotations

import numbers

import torch

from thunderfn.errors import ArgumentTypeError, ArgumentValueError

short_names = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.complex128: "c128", torch.complex64: "c64", torch.complex32: "c32",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.uint16: "u16", torch.uint32: "u32", torch.uint64: "u64",
    torch.bool: "b8",
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        short_names[getattr(torch, _name)] = _name.replace("float", "f")

low_precision = frozenset({torch.float16, torch.bfloat16})


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def is_complex(dtype: torch.dtype) -> bool:
    return dtype.is_complex


def is_integer(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype is not torch.bool


def is_inexact(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def category(dtype: torch.dtype) -> int:
    """0 bool, 1 integer, 2 floating, 3 complex."""
    if dtype is torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def to_complex(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(dtype, torch.complex64)


def to_real(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex128: torch.float64, torch.complex64: torch.float32,
            torch.complex32: torch.float16}.get(dtype, dtype)


def scalar_dtype(value) -> torch.dtype:
    """The dtype torch gives a Python scalar wrapped as a number."""
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, (numbers.Integral, torch.SymInt)):  # (a symbolic size is an int)
        return torch.int64
    if isinstance(value, (numbers.Real, torch.SymFloat)):
        return torch.get_default_dtype()
    if isinstance(value, numbers.Complex):
        return to_complex(torch.get_default_dtype())
    raise ArgumentTypeError(f"expected a tensor or a Python number, got {type(value).__name__}")


def _promote(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return torch.promote_types(a, b)


def _combine(higher, lower):
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        return to_complex(higher) if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher is torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def result_type(*args) -> torch.dtype:
    """torch.result_type generalised to any number of tensors (proxies) and scalars."""
    dim_result = zero_result = wrapped_result = None
    for a in args:
        if a is None:
            continue
        dtype = getattr(a, "dtype", None)
        if dtype is None:
            wrapped_result = _promote(wrapped_result, scalar_dtype(a))
        elif len(a.shape) == 0:
            zero_result = _promote(zero_result, dtype)
        else:
            dim_result = _promote(dim_result, dtype)
    result = _combine(dim_result, _combine(zero_result, wrapped_result))
    if result is None:
        raise ArgumentValueError("result_type needs at least one tensor or number")
    return result


def computation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Composite ops on half types compute in float32 and round once, as torch's CPU
    kernels do; everything else computes in its own dtype."""
    if dtype in low_precision:
        return torch.float32
    if dtype is torch.complex32:
        return torch.complex64
    return dtype
