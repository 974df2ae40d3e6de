"""torch.autocast, traced as explicit casts.

Eager autocast changes dtypes op by op as the program runs: inside an autocast region
each op on torch's lists first casts its floating inputs (matmul, linear and conv to the
low-precision dtype; on CUDA softmax, norms and losses to float32; on CPU the losses and
a few numerically delicate ops). Tracing does the same at each torch call it records,
reading the autocast state torch holds at that moment (a `with torch.autocast(...)`
block inside the function sets it while the function is traced, one around the call sets
it for the whole trace), so the trace shows every cast as a `convert_element_type` and
the compiled function needs no autocast at run time. jit keys its cache on the autocast
state at the call (`autocast_state`, below) and runs an entry traced under autocast with
autocast turned off, so nothing is cast twice.

The lists are torch's (aten/src/ATen/autocast_mode.cpp), by the short name of the torch
callable a program calls (`linear`, `matmul`, `__matmul__`, `cross_entropy`), per
device type. As in eager, only floating tensors other than float64 are cast, and an op
not listed runs in the dtypes it is given. A policy applies where user code (or torch's
own Python, such as F.multi_head_attention_forward) calls the op; a torch symbol's
decomposition then runs in the dtypes the cast gave it, as torch's kernels do.
"""
from __future__ import annotations

import contextlib
import math
import types

import torch

from thunderfn import clang
from thunderfn.core.interception import torch_name
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten, tree_map, tree_unflatten
from thunderfn.errors import ThunderFnError, UnsupportedOpError

_MATMULS = {"mm", "bmm", "matmul", "__matmul__", "__rmatmul__", "addmm", "addbmm", "baddbmm", "linear", "vecdot",
            "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc",
            "convolution", "_convolution", "prelu", "scaled_dot_product_attention", "multi_dot"}

# Cast floating inputs to the autocast dtype (bfloat16 or float16).
LOWER_PRECISION = {
    # (and, on CPU, the composites torch builds from matmuls that thunderfn has one symbol for)
    "cpu": frozenset(_MATMULS | {"cov", "corrcoef"}),
    "cuda": frozenset(_MATMULS | {"addmv", "addr", "einsum", "mv", "chain_matmul", "lstm_cell", "gru_cell",
                                  "rnn_tanh_cell", "rnn_relu_cell"}),
}

_LOSSES = {"nll_loss", "cross_entropy", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
           "binary_cross_entropy_with_logits", "poisson_nll_loss", "cosine_embedding_loss", "hinge_embedding_loss",
           "margin_ranking_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
           "multilabel_margin_loss", "ctc_loss"}

_FFTS = {f"{kind}{suffix}" for kind in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft") for suffix in ("", "2", "n")}
_LINALG = {"cholesky", "cholesky_ex", "inv", "inv_ex", "solve", "solve_ex", "lstsq", "qr", "svd", "svdvals", "eig",
           "eigh", "eigvals", "eigvalsh", "householder_product", "tensorinv", "tensorsolve", "matrix_rank", "cond"}

# Cast lower-precision floating inputs to float32.
FLOAT32 = {
    "cpu": frozenset(_LOSSES | _FFTS | _LINALG | {
        "binary_cross_entropy", "prod", "trace", "cdist", "quantile", "nanquantile", "polar", "stft", "view_as_complex",
        "avg_pool3d", "max_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d", "adaptive_max_pool3d_with_indices",
        "max_unpool1d", "max_unpool2d", "max_unpool3d", "fractional_max_pool2d", "fractional_max_pool3d",
        "fractional_max_pool2d_with_indices", "fractional_max_pool3d_with_indices", "grid_sample", "grid_sampler",
        "grid_sampler_2d", "grid_sampler_3d", "cholesky_inverse", "cholesky_solve", "inverse", "pinverse",
        "lu_solve", "orgqr", "ormqr", "geqrf", "triangular_solve"}),
    "cuda": frozenset(_LOSSES | {
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
        "rsqrt", "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "group_norm",
        "cosine_similarity", "dist", "pdist", "cdist", "renorm", "logsumexp", "softmax", "log_softmax",
        "cumsum", "cumprod", "prod", "sum", "norm", "vector_norm", "matrix_norm", "interpolate"}),
}

# Cast floating inputs to the widest floating dtype among them.
PROMOTE = {
    "cpu": frozenset({"cat", "stack", "index_copy"}),
    "cuda": frozenset({"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
                       "index_put", "scatter_add", "tensordot"}),
}


def _pad_mode(args, kwargs) -> str:
    return kwargs.get("mode", args[2] if len(args) > 2 else "constant")


def _tensordot_is_mm(args, kwargs) -> bool:
    # torch's tensordot is an mm, except when both sides keep no dimension (a dot product)
    a, b = args[0], args[1]
    dims = kwargs.get("dims", args[2] if len(args) > 2 else 2)
    if isinstance(dims, int):
        kept_a, kept_b = a.shape[:a.ndim - dims], b.shape[dims:]
    else:
        kept_a = [n for d, n in enumerate(a.shape) if d not in [i % a.ndim for i in dims[0]]]
        kept_b = [n for d, n in enumerate(b.shape) if d not in [i % b.ndim for i in dims[1]]]
    return math.prod(kept_a) != 1 or math.prod(kept_b) != 1


def _power(args, kwargs) -> int:
    return kwargs.get("n", args[1] if len(args) > 1 else 1)


# Ops on a list only in some of their forms: F.pad runs aten's reflection and replication pads
# (float32 on CPU) for those modes and constant_pad_nd (not listed) otherwise; matrix_power
# multiplies (low precision) for |n| >= 2 and inverts (float32 on CPU) for n = -1.
_FLOAT32_WHEN = {("cpu", "pad"): lambda args, kwargs: _pad_mode(args, kwargs) in ("reflect", "replicate"),
                 ("cpu", "matrix_power"): lambda args, kwargs: _power(args, kwargs) == -1}
_LOWER_WHEN = {("cpu", "tensordot"): _tensordot_is_mm,
               ("cpu", "matrix_power"): lambda args, kwargs: abs(_power(args, kwargs)) >= 2}
# Composites whose last step is a low-precision matmul after float32-only steps (pinv: an SVD,
# then products): computed as given, their floating outputs rounded to the autocast dtype.
LOWER_PRECISION_OUTPUT = {"cpu": frozenset({"pinv"})}

def _device_type(leaves) -> str | None:
    for leaf in leaves:
        if isinstance(leaf, TensorProxy):
            return leaf.device.type
    return None


def _eligible(x) -> bool:
    # autocast's is_eligible: a floating tensor that is not float64
    return isinstance(x, TensorProxy) and x.dtype.is_floating_point and x.dtype is not torch.float64


def _never(args, kwargs) -> bool:
    return False


def policy(func, args, kwargs, device_type: str) -> torch.dtype | str | None:
    """The dtype func's floating inputs are cast to under autocast on device_type ("promote"
    for the widest among them, "round output" for a LOWER_PRECISION_OUTPUT composite), or None
    for an op autocast leaves alone."""
    short = torch_name(func).rsplit(".", 1)[-1]
    if short in LOWER_PRECISION_OUTPUT.get(device_type, ()):
        return "round output"
    if short in LOWER_PRECISION.get(device_type, ()) or _LOWER_WHEN.get((device_type, short), _never)(args, kwargs):
        return torch.get_autocast_dtype(device_type)
    if short in FLOAT32.get(device_type, ()) or _FLOAT32_WHEN.get((device_type, short), _never)(args, kwargs):
        return torch.float32
    if short in PROMOTE.get(device_type, ()):
        return "promote"
    return None


def cast_arguments(func, args, kwargs):
    """(args, kwargs, finish): the arguments as autocast would hand them to func, each eligible
    floating tensor converted (recorded in the trace), and what to do to func's result (None:
    nothing). Called while tracing, for a call made while some autocast is enabled."""
    leaves, spec = tree_flatten((args, kwargs))
    device_type = _device_type(leaves)
    if device_type is None or not torch.is_autocast_enabled(device_type):
        return args, kwargs, None
    target = policy(func, args, kwargs, device_type)
    if target is None:
        return args, kwargs, None
    if target == "round output":
        low = torch.get_autocast_dtype(device_type)
        return args, kwargs, lambda result: tree_map(
            lambda x: clang.maybe_convert_to_dtype(x, low) if _eligible(x) else x, result)
    if target == "promote":
        floating = [x.dtype for x in leaves if _eligible(x)]
        if len(set(floating)) < 2:
            return args, kwargs, None
        target = max(floating, key=lambda d: torch.finfo(d).bits)
    leaves = [clang.maybe_convert_to_dtype(x, target) if _eligible(x) else x for x in leaves]
    return (*tree_unflatten(spec, leaves), None)


# -- torch's Python composites ----------------------------------------------------------------
# A torch function written in Python with no thunderfn symbol (F.linear_cross_entropy) runs as one
# opaque op; under autocast eager casts inside it, op by op, which one opaque call cannot reproduce.
# So under autocast its body is traced instead: a copy of the function whose own __torch_function__
# check says no, so that it runs its Python, and each torch call it makes is dispatched (and cast)
# as the user's own would be. Those in ALWAYS_TRACED are traced so everywhere: as one opaque op,
# nn.MultiheadAttention's F.multi_head_attention_forward would run twice per training step (torch.func
# runs it again to differentiate it), where its body is linears and scaled_dot_product_attention,
# which thunderfn runs as eager does (the fused attention kernel pair) and transforms see through.
ALWAYS_TRACED = frozenset({torch.nn.functional.multi_head_attention_forward})
_NO_TORCH_FUNCTION = {name: (lambda *args: False)
                      for name in ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")}
_bodies: dict = {}


def run_python_body(func, body, args, kwargs):
    """Trace func's Python body (see python_body); a body that cannot be traced is refused by name."""
    try:
        return body(*args, **kwargs)
    except ThunderFnError:
        raise
    except TypeError as e:
        if "TensorProxy" not in str(e):
            raise
        if func in ALWAYS_TRACED:
            raise UnsupportedOpError(
                f"{torch_name(func)}: thunderfn traces its Python, which passed a traced tensor to code that needs a "
                f"real one ({e}). Call it outside the jitted function.") from None
        raise UnsupportedOpError(
            f"{torch_name(func)} under torch.autocast: eager casts inside it op by op, so thunderfn traces its Python, "
            f"which passed a traced tensor to code that needs a real one ({e}). Call it outside the autocast region, "
            f"or outside the jitted function.") from None


def python_body(func):
    """func's Python body, run without its torch-function check; None if func is not a
    torch function written in Python that makes that check."""
    if func in _bodies:
        return _bodies[func]
    body = None
    code = getattr(func, "__code__", None)
    if (isinstance(func, types.FunctionType) and (func.__module__ or "").startswith("torch.")
            and code is not None and set(code.co_names) & set(_NO_TORCH_FUNCTION)):
        body = types.FunctionType(code, {**func.__globals__, **_NO_TORCH_FUNCTION}, func.__name__, func.__defaults__,
                                  func.__closure__)
        body.__kwdefaults__ = func.__kwdefaults__
    _bodies[func] = body
    return body


def autocast_state() -> tuple:
    """The autocast regions in force now, as (device type, dtype) pairs: () outside autocast.
    Part of jit's cache key; checked first with one call when nothing is enabled."""
    if not torch._C._is_any_autocast_enabled():
        return ()
    return tuple((d, torch.get_autocast_dtype(d)) for d in _DEVICE_TYPES if torch.is_autocast_enabled(d))


@contextlib.contextmanager
def switched_off():
    """Every enabled autocast switched off inside the block: how a compiled entry traced under
    autocast runs, since its casts are already explicit in its trace."""
    enabled = [d for d, _ in autocast_state()]
    with contextlib.ExitStack() as stack:
        for device_type in enabled:
            stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def _device_types() -> tuple:
    found = []
    for device_type in ("cpu", "cuda", "xpu", "mps"):
        try:
            torch.is_autocast_enabled(device_type)
        except (TypeError, RuntimeError):
            continue
        found.append(device_type)
    return tuple(found)


_DEVICE_TYPES = _device_types()
