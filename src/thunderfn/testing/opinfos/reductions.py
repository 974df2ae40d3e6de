"""OpInfos for thunderfn.torch.reductions: sum/prod/mean, amax/amin, max/min, argmax/argmin,
var/std (and their _mean forms), all/any, count_nonzero and the softmax family."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from thunderfn.testing.opinfo import ALL, FLOATS, INTS, ErrorInput, OpInfo, SampleInput, make_tensor

NUMBERS = FLOATS + INTS
NAN, INF = float("nan"), float("inf")


def _method(name):
    """`self.name(*args)` as a user writes it; Tensor's C methods refuse a proxy as an explicit self."""
    def method(self, *args, **kwargs):
        return getattr(self, name)(*args, **kwargs)

    method.__name__ = name
    return method


def _maker(device, dtype, **kwargs):
    return functools.partial(make_tensor, device=device, dtype=dtype, **kwargs)


def _errors(*cases):
    """error_inputs from (make_args(device), kwargs, exc_type, regex) tuples."""
    def error_inputs(device):
        for make_args, kwargs, exc, match in cases:
            yield ErrorInput(SampleInput(make_args(device), kwargs), exc, match)

    return error_inputs


def _x(*shape, dtype=torch.float32, **rest):
    """The args of an error input: one tensor, then the given positional args."""
    return lambda device: (make_tensor(shape, device=device, dtype=dtype), *rest.get("args", ()))


_DIM_OUT_OF_RANGE = (_x(2, 3, args=(2,)), {}, IndexError,
                     r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)")
_NEGATIVE_DIM_OUT_OF_RANGE = (_x(2, 3, args=(-3,)), {}, IndexError, r"Dimension out of range")


# -- sample patterns -----------------------------------------------------------------------
def reduction_samples(*, dim_kinds=("none", "int", "tuple"), empty_dims=True, keepdim=True, float_range=(None, None)):
    """Samples for op(a, dim=..., keepdim=...): every dim spelling the op takes (`none`: no dim
    argument; `int`: positive and negative ints; `tuple`: tuples and lists, negative entries
    included), keepdim both ways, 0-dim and empty inputs (reducing an empty dim when
    `empty_dims`), non-contiguous and transposed inputs, and NaN/inf for floats;
    `float_range` bounds floating values."""
    def sample_inputs(device, dtype):
        low, high = float_range if dtype.is_floating_point else (None, None)
        make = _maker(device, dtype, low=low, high=high)
        x = make((2, 3, 4))
        if "none" in dim_kinds:
            yield SampleInput((x,), name="all dims")
            yield SampleInput((make(()),), name="0-dim")
            yield SampleInput((make((3, 4), noncontiguous=True),), name="noncontiguous")
            if empty_dims:
                yield SampleInput((make((0,)),), name="empty")
        if "int" in dim_kinds:
            yield SampleInput((x, 1))
            yield SampleInput((x, -1), {"keepdim": True} if keepdim else {})
            yield SampleInput((make(()), 0), name="0-dim")
            yield SampleInput((make(()), -1), {"keepdim": True} if keepdim else {}, "0-dim")
            yield SampleInput((make((4, 3)).T, 1), name="transposed")
            yield SampleInput((make((3, 4), noncontiguous=True), 0), name="noncontiguous")
            yield SampleInput((make((2, 0)), 0), name="empty, nonempty reduced dim")
            if empty_dims:
                yield SampleInput((make((2, 0)), 1), {"keepdim": True} if keepdim else {}, "empty reduced dim")
        if "tuple" in dim_kinds:
            yield SampleInput((x, (0, 2)))
            yield SampleInput((x, (-1, 0)), {"keepdim": True} if keepdim else {})
            yield SampleInput((x, [1, 2]), name="list of dims")
            yield SampleInput((make((4, 3)).T, (0, 1)), name="transposed")
            if empty_dims:
                yield SampleInput((make((2, 0, 3)), (1, 2)), name="empty reduced dims")
        if keepdim and "int" in dim_kinds:
            yield SampleInput((x, 2), {"keepdim": False})
        if dtype.is_floating_point:
            special = torch.tensor([[1.0, NAN, 2.0], [INF, -1.0, 3.0], [-INF, INF, 0.0]], device=device, dtype=dtype)
            yield SampleInput((special, 1 if "int" in dim_kinds else (1,)), name="NaN and inf")

    return sample_inputs


def _chain(*fns):
    def sample_inputs(device, dtype):
        for fn in fns:
            yield from fn(device, dtype)

    return sample_inputs


def _dtype_kwarg_samples(out_dtypes, *, dim=1):
    """op(a, dim, dtype=...): the accumulation and output dtype chosen by the caller."""
    def sample_inputs(device, dtype):
        x = make_tensor((2, 3, 4), device=device, dtype=dtype)
        for out in out_dtypes:
            yield SampleInput((x, dim), {"dtype": out}, f"dtype={out}")
        yield SampleInput((x,), {"dtype": out_dtypes[0]}, "all dims, dtype")

    return sample_inputs


def _var_samples(device, dtype):
    make = _maker(device, dtype)
    x = make((2, 3, 4))
    yield SampleInput((x,))
    yield SampleInput((x, 1))
    yield SampleInput((x, (0, -1)), {"keepdim": True})
    yield SampleInput((x, 1), {"unbiased": False})
    yield SampleInput((x, 1, True, True), name="positional unbiased, keepdim")
    yield SampleInput((x, False), name="legacy positional unbiased")
    yield SampleInput((x,), {"dim": 2, "correction": 0})
    yield SampleInput((x, (0, 1)), {"correction": 2})
    yield SampleInput((x,), {"dim": None, "correction": 1, "keepdim": True})
    yield SampleInput((make(()),), name="0-dim (one element: NaN)")
    yield SampleInput((make((3, 4), noncontiguous=True), 0), name="noncontiguous")
    yield SampleInput((make((4, 3)).T, 1), name="transposed")
    yield SampleInput((make((2, 0)), 0), name="empty, nonempty reduced dim")
    yield SampleInput((make((2, 0)), 1), {"correction": 0}, "empty reduced dim: NaN")
    special = torch.tensor([[1.0, NAN, 2.0], [INF, -1.0, 3.0], [1.0, 2.0, 3.0]], device=device, dtype=dtype)
    yield SampleInput((special, 1), name="NaN and inf")


def _max_samples(device, dtype):
    """torch.max's three forms: full reduction, (values, indices) along a dim, and elementwise."""
    make = _maker(device, dtype)
    x = make((2, 3, 4))
    yield SampleInput((x,), name="all dims")
    yield SampleInput((make(()),), name="0-dim")
    yield SampleInput((make((3, 4), noncontiguous=True),), name="noncontiguous")
    yield SampleInput((x, 1), name="values and indices")
    yield SampleInput((x, -1, True), name="values and indices, keepdim")
    yield SampleInput((x,), {"dim": 0, "keepdim": False})
    yield SampleInput((make(()), 0), name="0-dim, dim")
    yield SampleInput((make((4, 3)).T, 1), name="transposed")
    yield SampleInput((make((2, 0)), 0), name="empty, nonempty reduced dim")
    yield SampleInput((x, make((3, 1))), name="elementwise, broadcast")
    yield SampleInput((x, make((2, 3, 4), dtype=torch.float64)), name="elementwise, promotion")
    if dtype.is_floating_point:
        special = torch.tensor([[1.0, NAN, 2.0], [INF, -1.0, 3.0], [-INF, INF, 0.0]], device=device, dtype=dtype)
        yield SampleInput((special,), name="NaN and inf")
        yield SampleInput((special, 1), name="NaN and inf, dim")


def _arg_samples(device, dtype):
    make = _maker(device, dtype)
    x = make((2, 3, 4))
    yield SampleInput((x,), name="flattened")
    yield SampleInput((x,), {"keepdim": True}, "flattened, keepdim")
    yield SampleInput((x, 1))
    yield SampleInput((x, -1, True))
    yield SampleInput((make(()),), name="0-dim")
    yield SampleInput((make(()), 0), name="0-dim, dim")
    yield SampleInput((make(()), 0, True), name="0-dim, dim, keepdim")
    yield SampleInput((make((4, 3)).T, 1), name="transposed")
    yield SampleInput((make((3, 4), noncontiguous=True), 0), name="noncontiguous")
    yield SampleInput((make((2, 0)), 0), name="empty, nonempty reduced dim")
    # ties: torch returns the first extreme index
    yield SampleInput((torch.tensor([[1, 3, 3, 0], [2, 2, 0, 0]], device=device, dtype=dtype), 1), name="ties")
    if dtype.is_floating_point:
        special = torch.tensor([[1.0, NAN, 2.0], [INF, -1.0, 3.0], [-INF, INF, 0.0]], device=device, dtype=dtype)
        yield SampleInput((special, 1), name="NaN and inf")


def _softmax_samples(device, dtype):
    make = _maker(device, dtype)
    x = make((2, 3, 4))
    yield SampleInput((x, 1))
    yield SampleInput((x, -1))
    yield SampleInput((x,), {"dim": 0})
    yield SampleInput((make(()), 0), name="0-dim")
    yield SampleInput((make((0, 3)), 1), name="empty")
    yield SampleInput((make((3, 0)), 1), name="empty softmax dim")
    yield SampleInput((make((4, 3)).T, 1), name="transposed")
    yield SampleInput((make((3, 4), noncontiguous=True), 0), name="noncontiguous")
    yield SampleInput((make((3, 4), low=-1000, high=1000), 1), name="large logits")
    if dtype is not torch.float64:
        yield SampleInput((x, 1), {"dtype": torch.float64}, "dtype")
    special = torch.tensor([[1.0, NAN, 2.0], [INF, -1.0, 3.0], [-INF, -INF, -INF], [-INF, 0.0, 1.0]],
                           device=device, dtype=dtype)
    yield SampleInput((special, 1), name="NaN, inf and all -inf rows")


def _positional_dtype_samples(device, dtype):
    """torch.softmax(x, dim, dtype) and x.softmax(dim, dtype) take dtype third, where F.softmax takes _stacklevel."""
    yield SampleInput((make_tensor((2, 3), device=device, dtype=dtype), 1, torch.float64), name="positional dtype")


def _implicit_dim_samples(device, dtype):
    """F.softmax(x) picks dim 0 for 0-, 1- and 3-d inputs and dim 1 otherwise (deprecated, with a warning)."""
    for shape in ((), (4,), (2, 3), (2, 3, 4)):
        yield SampleInput((make_tensor(shape, device=device, dtype=dtype),), name="implicit dim")


def _int_softmax_samples(device, dtype):
    """Integer inputs are softmaxed only with an explicit floating dtype."""
    yield SampleInput((make_tensor((2, 3), device=device, dtype=dtype), 1), {"dtype": torch.float32},
                      "int input, dtype")


def _logsumexp_samples(device, dtype):
    make = _maker(device, dtype)
    x = make((2, 3, 4))
    yield SampleInput((x, 1))
    yield SampleInput((x, -1, True))
    yield SampleInput((x, (0, 2)))
    yield SampleInput((x,), {"dim": (-1, 0), "keepdim": True})
    yield SampleInput((make(()), 0), name="0-dim")
    yield SampleInput((make((2, 0)), 1), name="empty reduced dim: -inf")
    yield SampleInput((make((2, 0)), 0), name="empty, nonempty reduced dim")
    yield SampleInput((make((4, 3)).T, 1), name="transposed")
    yield SampleInput((make((3, 4), noncontiguous=True), 0), name="noncontiguous")
    if dtype.is_floating_point:
        yield SampleInput((make((3, 4), low=-1000, high=1000), 1), name="large values")
        yield SampleInput((torch.tensor(1000.0, device=device, dtype=dtype), 0), name="0-dim, large: exp overflows")
        special = torch.tensor([[1.0, NAN, 2.0], [INF, -1.0, 3.0], [-INF, -INF, -INF], [-INF, 0.0, 1.0]],
                               device=device, dtype=dtype)
        yield SampleInput((special, 1), name="NaN, inf and all -inf rows")


# -- error inputs ------------------------------------------------------------------------------
def _empty_dim(name):
    return _x(2, 0, args=(1,)), {}, IndexError, rf"{name}\(\): Expected reduction dim 1 to have non-zero size"


def _empty_without_dim(name, exc=RuntimeError):
    return _x(0), {}, exc, rf"{name}\(\): Expected reduction dim to be specified for input.numel\(\) == 0"


def _no_dims_samples(device, dtype):
    """all/any read dim=() as "reduce nothing", where sum reads it as "reduce everything"."""
    yield SampleInput((make_tensor((2, 3), device=device, dtype=dtype), ()), name="no dims: nothing reduced")
_DUPLICATE_DIMS = (_x(2, 3, args=((0, -2),)), {}, RuntimeError, "dim 0 appears multiple times in the list of dims")

# The decompositions of softmax and logsumexp compute half types in float32 and round once;
# torch's kernels use a faster exp and may land one half-precision ulp away.
_HALF_TOLERANCES = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 1.6e-2)}

opinfos: list[OpInfo] = [
    OpInfo("sum", torch.sum,
           _chain(reduction_samples(), _dtype_kwarg_samples((torch.float64, torch.int32))), dtypes=ALL,
           error_inputs=_errors(_DIM_OUT_OF_RANGE, _NEGATIVE_DIM_OUT_OF_RANGE, _DUPLICATE_DIMS)),
    OpInfo("Tensor.sum", _method("sum"), reduction_samples(dim_kinds=("none", "tuple")),
           dtypes=(torch.float32, torch.bool)),
    # Values of magnitude <= 1.5 keep 24-element products inside float16's range. torch multiplies
    # half types in half on some paths (dim reductions, strided inputs) and in float32 on others;
    # the decomposition always uses float32, so half results differ by a few ulps.
    OpInfo("prod", torch.prod, _chain(reduction_samples(dim_kinds=("none", "int"), float_range=(-1.5, 1.5)),
                                      _dtype_kwarg_samples((torch.float64, torch.int64))),
           dtypes=ALL, dtype_tolerances={torch.float16: (1e-3, 1e-2), torch.bfloat16: (1e-2, 5e-2)},
           error_inputs=_errors(_DIM_OUT_OF_RANGE)),
    OpInfo("mean", torch.mean, _chain(reduction_samples(), _dtype_kwarg_samples((torch.float64,))), dtypes=FLOATS,
           error_inputs=_errors(
               _DIM_OUT_OF_RANGE, _DUPLICATE_DIMS,
               (_x(2, 3, dtype=torch.int64), {}, RuntimeError,
                r"mean\(\): could not infer output dtype. Input dtype must be either a floating point or "
                r"complex dtype. Got: Long"),
               (_x(2, 3, dtype=torch.int32), {}, RuntimeError, "could not infer output dtype.* Got: Int"),
               (_x(2, 3, dtype=torch.bool), {}, RuntimeError, "could not infer output dtype.* Got: Bool"),
               (_x(2, 3), {"dtype": torch.int64}, RuntimeError,
                r"mean\(\): could not infer output dtype. Optional dtype must be either a floating point or complex "
                r"dtype. Got: Long"))),
    OpInfo("mean_int_input_with_dtype", torch.mean, _dtype_kwarg_samples((torch.float32, torch.float64)), dtypes=INTS),
    OpInfo("amax", torch.amax, reduction_samples(empty_dims=False), dtypes=ALL,
           error_inputs=_errors(_DIM_OUT_OF_RANGE, _DUPLICATE_DIMS, _empty_dim("amax"), _empty_without_dim("amax"))),
    OpInfo("amin", torch.amin, reduction_samples(empty_dims=False), dtypes=ALL,
           error_inputs=_errors(_DIM_OUT_OF_RANGE, _empty_dim("amin"), _empty_without_dim("amin"))),
    OpInfo("max", torch.max, _max_samples, dtypes=ALL, error_inputs=_errors(
        _DIM_OUT_OF_RANGE, _empty_dim("max"), _empty_without_dim("max"),
        (lambda d: (make_tensor((2, 3), device=d), make_tensor((3, 2), device=d)), {}, RuntimeError,
         "The size of tensor a"))),
    OpInfo("min", torch.min, _max_samples, dtypes=ALL, error_inputs=_errors(
        _DIM_OUT_OF_RANGE, _empty_dim("min"), _empty_without_dim("min"))),
    OpInfo("Tensor.max", _method("max"), _max_samples, dtypes=(torch.float32, torch.int64)),
    OpInfo("argmax", torch.argmax, _arg_samples, dtypes=NUMBERS, error_inputs=_errors(
        _DIM_OUT_OF_RANGE, _empty_dim("argmax"), _empty_without_dim("argmax", IndexError),
        (_x(3, dtype=torch.bool), {}, RuntimeError, r"argmax\(\): does not support bool input"))),
    OpInfo("argmin", torch.argmin, _arg_samples, dtypes=NUMBERS, error_inputs=_errors(
        _DIM_OUT_OF_RANGE, _empty_dim("argmin"), _empty_without_dim("argmin", IndexError),
        (_x(3, dtype=torch.bool), {}, RuntimeError, r"argmin\(\): does not support bool input"))),
    OpInfo("var", torch.var, _var_samples, dtypes=FLOATS, error_inputs=_errors(
        _DIM_OUT_OF_RANGE,
        (_x(2, 3), {"unbiased": True, "correction": 1}, TypeError,
         r"var\(\) received an invalid combination of arguments"),
        (_x(2, 3, dtype=torch.int64), {}, RuntimeError, "std and var only support floating point and complex dtypes"))),
    OpInfo("std", torch.std, _var_samples, dtypes=FLOATS, error_inputs=_errors(
        _DIM_OUT_OF_RANGE,
        (_x(2, 3, dtype=torch.int64), {}, RuntimeError, "std and var only support floating point and complex dtypes"))),
    OpInfo("var_mean", torch.var_mean, _var_samples, dtypes=FLOATS, error_inputs=_errors(
        _DIM_OUT_OF_RANGE,
        (_x(2, 3, dtype=torch.int64), {}, RuntimeError, "var_mean only support floating point and complex dtypes"))),
    OpInfo("std_mean", torch.std_mean, _var_samples, dtypes=FLOATS, error_inputs=_errors(
        _DIM_OUT_OF_RANGE,
        (_x(2, 3, dtype=torch.int64), {}, RuntimeError, "std_mean only support floating point and complex dtypes"))),
    OpInfo("Tensor.var", _method("var"), _var_samples, dtypes=(torch.float32,)),
    OpInfo("all", torch.all, _chain(reduction_samples(), _no_dims_samples), dtypes=ALL,
           error_inputs=_errors(_DIM_OUT_OF_RANGE, _DUPLICATE_DIMS)),
    OpInfo("any", torch.any, _chain(reduction_samples(), _no_dims_samples), dtypes=ALL,
           error_inputs=_errors(_DIM_OUT_OF_RANGE, _DUPLICATE_DIMS)),
    OpInfo("count_nonzero", torch.count_nonzero, reduction_samples(keepdim=False), dtypes=ALL,
           error_inputs=_errors(_DIM_OUT_OF_RANGE, _DUPLICATE_DIMS)),
    OpInfo("softmax", torch.softmax, _chain(_softmax_samples, _positional_dtype_samples), dtypes=FLOATS,
           dtype_tolerances=_HALF_TOLERANCES, error_inputs=_errors(
        _DIM_OUT_OF_RANGE,
        (_x(2, 3, dtype=torch.int64, args=(1,)), {}, NotImplementedError, "not implemented for 'Long'"))),
    OpInfo("softmax_int_input_with_dtype", torch.softmax, _int_softmax_samples, dtypes=INTS + (torch.bool,)),
    OpInfo("Tensor.softmax", _method("softmax"), _positional_dtype_samples, dtypes=(torch.float32,)),
    OpInfo("nn.functional.softmax", F.softmax, _chain(_softmax_samples, _implicit_dim_samples),
           dtypes=(torch.float32, torch.bfloat16), dtype_tolerances=_HALF_TOLERANCES),
    OpInfo("log_softmax", torch.log_softmax, _chain(_softmax_samples, _positional_dtype_samples), dtypes=FLOATS,
           dtype_tolerances=_HALF_TOLERANCES, error_inputs=_errors(
        _DIM_OUT_OF_RANGE,
        (_x(2, 3, dtype=torch.int64, args=(1,)), {}, NotImplementedError, "not implemented for 'Long'"))),
    OpInfo("Tensor.log_softmax", _method("log_softmax"), _positional_dtype_samples, dtypes=(torch.float32,)),
    OpInfo("nn.functional.log_softmax", F.log_softmax, _chain(_softmax_samples, _implicit_dim_samples),
           dtypes=(torch.float32, torch.float16), dtype_tolerances=_HALF_TOLERANCES),
    OpInfo("logsumexp", torch.logsumexp, _logsumexp_samples, dtypes=ALL, dtype_tolerances=_HALF_TOLERANCES,
           error_inputs=_errors(_DIM_OUT_OF_RANGE, _DUPLICATE_DIMS, (_x(2, 3), {}, TypeError, r"logsumexp\(\)"))),
]


# -- scans, sorting, norms and NaN-skipping reductions ---------------------------------------
def _scan_samples(*, float_range=(None, None)):
    def sample_inputs(device, dtype):
        low, high = float_range if dtype.is_floating_point else (None, None)
        make = _maker(device, dtype, low=low, high=high)
        x = make((2, 3, 4))
        yield SampleInput((x, 1))
        yield SampleInput((x, -1))
        yield SampleInput((x,), {"dim": 0})
        yield SampleInput((make(()), 0), name="0-dim")
        yield SampleInput((make(()), -1), name="0-dim")
        yield SampleInput((make((2, 0)), 1), name="empty scanned dim")
        yield SampleInput((make((2, 0)), 0), name="empty")
        yield SampleInput((make((4, 3)).T, 1), name="transposed")
        yield SampleInput((make((3, 4), noncontiguous=True), 0), name="noncontiguous")
        if dtype.is_floating_point:
            special = torch.tensor([[1.0, NAN, 2.0], [INF, -1.0, 3.0], [-INF, INF, 0.0]], device=device, dtype=dtype)
            yield SampleInput((special, 1), name="NaN and inf")

    return sample_inputs


def _scan_dtype_samples(device, dtype):
    x = make_tensor((2, 3, 4), device=device, dtype=dtype, low=-1.5 if dtype.is_floating_point else None,
                    high=1.5 if dtype.is_floating_point else None)
    yield SampleInput((x, 1), {"dtype": torch.float64}, "dtype=float64")
    yield SampleInput((x, -1), {"dtype": torch.int32}, "dtype=int32")


def _logcumsumexp_samples(device, dtype):
    yield from _scan_samples()(device, dtype)
    make = _maker(device, dtype)
    yield SampleInput((make((3, 17), low=-1000, high=1000), 1), name="large values, wide range")
    yield SampleInput((torch.tensor([-1000.0, 0.0, -INF, 5.0, -INF], device=device, dtype=dtype), 0),
                      name="a prefix far below the maximum, -inf")
    yield SampleInput((torch.full((2, 5), -INF, device=device, dtype=dtype), 1), name="all -inf")


def _cummax_samples(device, dtype):
    """Ties take the last index (torch compares with >= and <=) and a NaN wins from where it appears."""
    yield from _scan_samples()(device, dtype)
    yield SampleInput((_ties(device, dtype), 1), name="ties")
    yield SampleInput((_ties(device, dtype), 0), name="ties")
    if dtype.is_floating_point:
        yield SampleInput((torch.tensor([1.0, NAN, 0.0, NAN, -1.0, INF], device=device, dtype=dtype), 0), name="NaNs")
        yield SampleInput((torch.tensor([-INF, -INF, 2.0, INF, INF], device=device, dtype=dtype), 0), name="infs")
    if dtype in (torch.int64, torch.int32, torch.int8, torch.uint8):
        info = torch.iinfo(dtype)
        yield SampleInput((torch.tensor([info.max, info.min, info.min, info.max], device=device, dtype=dtype), 0),
                          name="the dtype's extremes")


def _unique_values(shape, device, dtype, noncontiguous=False):
    """Distinct values in random order, so unstable sorts have one right answer for indices too."""
    n = torch.Size(shape).numel()
    values = (torch.randperm(n, device=device) - (n // 2 if dtype not in (torch.uint8,) else 0)).reshape(shape)
    if dtype.is_floating_point:
        values = values * 0.5
    values = values.to(dtype)
    if noncontiguous:
        values = torch.repeat_interleave(values, 2, dim=-1)[..., ::2]
    return values


def _ties(device, dtype):
    return torch.tensor([[1, 3, 3, 0, 1, 1], [2, 2, 0, 0, 2, 1]], device=device, dtype=dtype)


def _sort_samples(device, dtype):
    if dtype is torch.bool:  # two values: indices are only determined by a stable sort
        x = make_tensor((3, 5), device=device, dtype=dtype)
        yield SampleInput((x,), {"stable": True})
        yield SampleInput((x,), {"dim": 0, "descending": True, "stable": True})
        yield SampleInput((make_tensor((), device=device, dtype=dtype),), {"stable": True}, "0-dim")
        return
    x = _unique_values((2, 3, 4), device, dtype)
    yield SampleInput((x,))
    yield SampleInput((x, 1))
    yield SampleInput((x, -1, True), name="descending")
    yield SampleInput((x,), {"dim": 0, "descending": True})
    yield SampleInput((x,), {"stable": False, "dim": -2})
    yield SampleInput((_unique_values((), device, dtype),), name="0-dim")
    yield SampleInput((_unique_values((), device, dtype), 0, True), name="0-dim")
    yield SampleInput((_unique_values((2, 0), device, dtype), 1), name="empty")
    yield SampleInput((_unique_values((2, 0), device, dtype), 0), name="empty")
    yield SampleInput((_unique_values((4, 3), device, dtype).T, 1), name="transposed")
    yield SampleInput((_unique_values((3, 4), device, dtype, noncontiguous=True), 1), name="noncontiguous")
    yield SampleInput((_ties(device, dtype),), {"stable": True}, "ties")
    yield SampleInput((_ties(device, dtype),), {"dim": 1, "descending": True, "stable": True}, "ties, descending")
    yield SampleInput((_ties(device, dtype),), {"dim": 0, "stable": True}, "ties")
    if dtype.is_floating_point:
        special = torch.tensor([[1.0, NAN, 2.0, -INF], [INF, -1.0, 3.0, -0.5]], device=device, dtype=dtype)
        yield SampleInput((special, 1), name="NaN and inf")
        yield SampleInput((special, 1, True), name="NaN and inf, descending")


def _argsort_samples(device, dtype):
    for sample in _sort_samples(device, dtype):
        yield sample


def _msort_samples(device, dtype):
    yield SampleInput((_unique_values((5, 3), device, dtype),))
    yield SampleInput((_unique_values((5,), device, dtype),))
    yield SampleInput((_unique_values((), device, dtype),), name="0-dim")
    yield SampleInput((_unique_values((0, 3), device, dtype),), name="empty")
    yield SampleInput((_unique_values((3, 5), device, dtype).T,), name="transposed")


def _topk_samples(device, dtype):
    x = _unique_values((2, 3, 5), device, dtype)
    yield SampleInput((x, 2))
    yield SampleInput((x, 3, 1))
    yield SampleInput((x, 1, -1, False), name="smallest")
    yield SampleInput((x,), {"k": 2, "dim": 0, "largest": True, "sorted": True})
    yield SampleInput((x, 5), name="k = size")
    yield SampleInput((x, 0), name="k = 0")
    yield SampleInput((x, 3), {"sorted": False}, "unsorted")
    yield SampleInput((_unique_values((), device, dtype), 1), name="0-dim")
    yield SampleInput((_unique_values((), device, dtype), 0, 0), name="0-dim, k = 0")
    yield SampleInput((_unique_values((2, 0), device, dtype), 0), name="empty")
    yield SampleInput((_unique_values((0, 3), device, dtype), 2), name="empty")
    yield SampleInput((_unique_values((5, 4), device, dtype).T, 2), name="transposed")
    yield SampleInput((_unique_values((3, 5), device, dtype, noncontiguous=True), 2), name="noncontiguous")
    if dtype.is_floating_point:
        special = torch.tensor([[1.0, NAN, 2.0, -INF], [INF, -1.0, 3.0, -0.5]], device=device, dtype=dtype)
        yield SampleInput((special, 2), name="NaN and inf")
        yield SampleInput((special, 2, 1, False), name="NaN and inf, smallest")


def _vector_norm_samples(device, dtype):
    make = _maker(device, dtype)
    x = make((2, 3, 4))
    for ord in (2, 1, INF, -INF, 0, 3, -1, 0.5, 2.5):
        yield SampleInput((x, ord), name=f"ord={ord}")
    yield SampleInput((x, 2, 1))
    yield SampleInput((x,), {"ord": 1, "dim": (0, -1), "keepdim": True})
    yield SampleInput((x, INF, [1, 2]), name="list of dims")
    yield SampleInput((x, 2, ()), {"keepdim": True}, "dim=(): all dims")
    yield SampleInput((x,), {"keepdim": True})
    yield SampleInput((make(()),), name="0-dim")
    yield SampleInput((make(()), INF, 0), name="0-dim")
    yield SampleInput((make((0,)),), name="empty")
    yield SampleInput((make((2, 0)), 1, 1), name="empty reduced dim")
    yield SampleInput((make((2, 0)), INF, 0), name="empty, nonempty reduced dim")
    yield SampleInput((make((4, 3)).T, 2, 1), name="transposed")
    yield SampleInput((make((3, 4), noncontiguous=True), 3, 0), name="noncontiguous")
    yield SampleInput((x, 2, 1), {"dtype": torch.float64}, "dtype")
    special = torch.tensor([[1.0, NAN, 2.0], [INF, -1.0, 3.0], [0.0, 0.0, -2.0]], device=device, dtype=dtype)
    for ord in (2, INF, 0, -INF):
        yield SampleInput((special, ord, 1), name="NaN and inf")


def _norm_samples(device, dtype):
    make = _maker(device, dtype)
    x = make((2, 3, 4))
    yield SampleInput((x,))
    yield SampleInput((x, "fro"))
    yield SampleInput((x, "fro", (0, 1)))
    yield SampleInput((x, 2, 1, True))
    yield SampleInput((x,), {"p": 1, "dim": -1})
    yield SampleInput((x, INF))
    yield SampleInput((x, 3), {"dim": (0, 2), "dtype": torch.float64})
    yield SampleInput((x, None, 2), name="p=None")
    yield SampleInput((make(()),), name="0-dim")
    yield SampleInput((make((0, 3)), 2, 1), name="empty")
    yield SampleInput((make((4, 3)).T, "fro"), name="transposed")
    if dtype in (torch.float32, torch.float64):
        yield SampleInput((make((3, 4)), "nuc"), name="nuclear norm (torch computes it)")


def _method_norm_samples(device, dtype):
    x = make_tensor((2, 3), device=device, dtype=dtype)
    yield SampleInput((x,))
    yield SampleInput((x, 1, 1, True))


def _aminmax_samples(device, dtype):
    make = _maker(device, dtype)
    x = make((2, 3, 4))
    yield SampleInput((x,))
    yield SampleInput((x,), {"dim": 1})
    yield SampleInput((x,), {"dim": -1, "keepdim": True})
    yield SampleInput((x,), {"keepdim": True})
    yield SampleInput((make(()),), name="0-dim")
    yield SampleInput((make(()),), {"dim": 0, "keepdim": True}, "0-dim")
    yield SampleInput((make((2, 0)),), {"dim": 0}, "empty, nonempty reduced dim")
    yield SampleInput((make((4, 3)).T,), {"dim": 1}, "transposed")
    yield SampleInput((make((3, 4), noncontiguous=True),), {"dim": 0}, "noncontiguous")
    if dtype.is_floating_point:
        special = torch.tensor([[1.0, NAN, 2.0], [INF, -1.0, 3.0], [-INF, INF, 0.0]], device=device, dtype=dtype)
        yield SampleInput((special,), {"dim": 1}, "NaN and inf")


def _nan_samples(device, dtype):
    """NaNs scattered through a tensor (a whole row of them too), for the nan-skipping reductions."""
    if not dtype.is_floating_point:
        return
    x = make_tensor((3, 4), device=device, dtype=dtype)
    x[0, 1] = x[2, 3] = NAN
    x[1] = NAN
    yield SampleInput((x,), name="NaNs")
    yield SampleInput((x, 1), name="NaNs, a row of them")
    yield SampleInput((x, 0, True), name="NaNs, keepdim")


# torch's nansum of a half type over several dims rounds partial sums to the half type (a few
# bf16 ulps off); the decomposition accumulates in float32 and rounds once, as sum does
_NANSUM_TOLERANCES = {torch.float16: (1e-3, 1e-2), torch.bfloat16: (1e-2, 5e-2)}
_NORM_TOLERANCES = {torch.float16: (1e-3, 2e-3), torch.bfloat16: (8e-3, 1.6e-2)}

opinfos += [
    OpInfo("cumsum", torch.cumsum, _chain(_scan_samples(), _scan_dtype_samples), dtypes=ALL,
           dtype_tolerances=_HALF_TOLERANCES, error_inputs=_errors(
        _DIM_OUT_OF_RANGE, (_x(2, 3), {}, TypeError, r"cumsum\(\)"))),
    OpInfo("Tensor.cumsum", _method("cumsum"), _scan_samples(), dtypes=(torch.float32, torch.bool)),
    # values of magnitude <= 1.5 keep products of 4 inside every dtype's range
    OpInfo("cumprod", torch.cumprod, _chain(_scan_samples(float_range=(-1.5, 1.5)), _scan_dtype_samples), dtypes=ALL,
           dtype_tolerances=_HALF_TOLERANCES, error_inputs=_errors(_DIM_OUT_OF_RANGE)),
    OpInfo("logcumsumexp", torch.logcumsumexp, _logcumsumexp_samples, dtypes=FLOATS, dtype_tolerances=_HALF_TOLERANCES,
           error_inputs=_errors(_DIM_OUT_OF_RANGE, (_x(2, 3, dtype=torch.int64, args=(1,)), {}, NotImplementedError,
                                                    "\"logcumsumexp_out_cpu\" not implemented for 'Long'"))),
    OpInfo("cummax", torch.cummax, _cummax_samples, dtypes=ALL, error_inputs=_errors(_DIM_OUT_OF_RANGE)),
    OpInfo("cummin", torch.cummin, _cummax_samples, dtypes=ALL, error_inputs=_errors(_DIM_OUT_OF_RANGE)),
    OpInfo("Tensor.cummax", _method("cummax"), _cummax_samples, dtypes=(torch.float32,)),
    OpInfo("sort", torch.sort, _sort_samples, dtypes=ALL, error_inputs=_errors(
        _DIM_OUT_OF_RANGE, (_x(2, 3, args=(0, False, True)), {}, TypeError, r"sort\(\)"))),
    OpInfo("Tensor.sort", _method("sort"), _sort_samples, dtypes=(torch.float32,)),
    OpInfo("argsort", torch.argsort, _argsort_samples, dtypes=ALL, error_inputs=_errors(_DIM_OUT_OF_RANGE)),
    OpInfo("msort", torch.msort, _msort_samples, dtypes=NUMBERS),
    OpInfo("topk", torch.topk, _topk_samples, dtypes=NUMBERS, error_inputs=_errors(
        (_x(2, 3, args=(4,)), {}, RuntimeError, "selected index k out of range"),
        (_x(2, 3, args=(-1,)), {}, RuntimeError, "selected index k out of range"),
        (_x(2, 3, args=(1, 2)), {}, IndexError,
         r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
        (_x(3, dtype=torch.bool, args=(1,)), {}, RuntimeError, "topk does not support bool dtypes on CPU"))),
    OpInfo("Tensor.topk", _method("topk"), _topk_samples, dtypes=(torch.float32,)),
    OpInfo("linalg.vector_norm", torch.linalg.vector_norm, _vector_norm_samples, dtypes=FLOATS,
           dtype_tolerances=_NORM_TOLERANCES, error_inputs=_errors(
        (_x(3, dtype=torch.int64), {}, RuntimeError,
         "linalg.vector_norm: Expected a floating point or complex tensor as input. Got Long"),
        (_x(0, args=(INF,)), {}, RuntimeError,
         "linalg.vector_norm cannot compute the inf norm on an empty tensor because the operation does "
         "not have an identity"),
        (_x(0, args=(-1,)), {}, RuntimeError, "linalg.vector_norm cannot compute the -1 norm on an empty tensor"),
        (_x(0, 3, args=(INF, 0)), {}, RuntimeError,
         "linalg.vector_norm cannot compute the inf norm on the dimension 0because this dimension is empty "
         "and the operation does not have an identity"),
        (_x(3, args=("fro",)), {}, TypeError,
         r"linalg_vector_norm\(\): argument 'ord' \(position 2\) must be Number, not str"),
        (_x(3), {"dtype": torch.int64}, RuntimeError,
         "linalg.vector_norm: dtype should be floating point or complex, but got Long"),
        (_x(3, dtype=torch.float64), {"dtype": torch.float32}, RuntimeError,
         r"linalg.vector_norm: the dtype of the input \(Double\) should be convertible without "
         r"narrowing to the specified dtype \(Float\)"),
        (_x(2, 3, args=(2, 2)), {}, IndexError, r"Dimension out of range"))),
    OpInfo("norm", torch.norm, _norm_samples, dtypes=FLOATS, dtype_tolerances=_NORM_TOLERANCES, error_inputs=_errors(
        (_x(3, dtype=torch.int64), {}, RuntimeError,
         "linalg.vector_norm: Expected a floating point or complex tensor as input. Got Long"))),
    OpInfo("Tensor.norm", _method("norm"), _method_norm_samples, dtypes=(torch.float32,)),
    OpInfo("aminmax", torch.aminmax, _aminmax_samples, dtypes=ALL, error_inputs=_errors(
        (_x(0), {}, RuntimeError,
         r"aminmax\(\): cannot compute aminmax over an empty dimension as the operation has no identity."),
        (_x(2, 0), {"dim": 1}, IndexError, "aminmax: Expected reduction dim 1 to have non-zero size."),
        (_x(2, 3), {"dim": 2}, IndexError, r"Dimension out of range"))),
    OpInfo("nansum", torch.nansum, _chain(reduction_samples(), _dtype_kwarg_samples((torch.float64, torch.int32)),
                                          _nan_samples), dtypes=ALL, dtype_tolerances=_NANSUM_TOLERANCES,
           error_inputs=_errors(_DIM_OUT_OF_RANGE, _DUPLICATE_DIMS)),
    OpInfo("nanmean", torch.nanmean, _chain(reduction_samples(), _dtype_kwarg_samples((torch.float64,)), _nan_samples),
           dtypes=FLOATS, dtype_tolerances=_HALF_TOLERANCES, error_inputs=_errors(
        _DIM_OUT_OF_RANGE,
        (_x(2, 3, dtype=torch.int64), {}, RuntimeError,
         "nanmean\\(\\): expected input to have floating point or complex dtype but got Long"))),
]
