"""Statistics: cov and corrcoef, decomposed. Weight checks that need values (no
negative weights) become runtime checks, so invalid input fails as it does in eager.
histogram and histogramdd run as opaque torch ops (torch has no meta kernel for them): their
shapes, from the bins' count, are ruled here; the edges' values are the kernel's."""
from __future__ import annotations

import torch

from thunderfn import clang, prims
from thunderfn.clang import maybe_convert_to_dtype
from thunderfn.core import dtypes, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.statements import emit_runtime_check
from thunderfn.prims import check
from thunderfn.torch.base import torchsymbol
from thunderfn.torch.opaque import shape_rule
from thunderfn.torch.reductions import all as all_

T = torch.Tensor
__all__ = ["cov", "corrcoef"]


def _check_weights(w, name, n):
    check(w.ndim <= 1,
          lambda: f"cov(): expected {name} to have one or fewer dimensions but got {name} with {w.ndim} dimensions")
    check(w.numel() == n, lambda: f"cov(): expected {name} to have the same number of elements as observations, but "
                                  f"got {w.numel()} != {n}")
    emit_runtime_check(all_(clang.ge(w, 0)), "RuntimeError", f"cov(): {name} cannot be negative")


@torchsymbol(torch.cov, T.cov)
def cov(input, *, correction=1, fweights=None, aweights=None):
    check(input.ndim <= 2, lambda: "cov(): expected input to have two or fewer dimensions but got an input with "
                                   f"{input.ndim} dimensions")
    x = input if input.ndim == 2 else clang.reshape(input, (1, -1))
    n = x.shape[1]
    dtype = input.dtype if dtypes.is_inexact(input.dtype) else torch.get_default_dtype()
    x = maybe_convert_to_dtype(x, dtype)
    w = None
    if fweights is not None:
        check(not dtypes.is_inexact(fweights.dtype), lambda: "cov(): expected fweights to have integral dtype")
        _check_weights(fweights, "fweights", n)
        w = fweights
    if aweights is not None:
        check(dtypes.is_float(aweights.dtype),
              lambda: f"cov(): expected aweights to have floating point dtype but got {aweights.dtype}")
        _check_weights(aweights, "aweights", n)
        w = aweights if w is None else clang.mul(w, aweights)
    if w is None:
        w_sum = n
        avg = clang.true_divide(prims.sum(x, (1,)), n)
        norm = n - correction
    else:
        w = maybe_convert_to_dtype(w, dtype)
        w_sum = prims.sum(w, (0,))
        avg = clang.true_divide(prims.sum(clang.mul(x, w), (1,)), w_sum)
        if aweights is None:
            norm = clang.sub(w_sum, correction)
        else:
            norm = clang.sub(w_sum,
                             clang.true_divide(clang.mul(prims.sum(clang.mul(w, aweights), (0,)), correction), w_sum))
    if isinstance(norm, symbolic.NUMBER_TYPES):  # (a symbolic size's n - correction: guarded on its sign)
        norm = max(norm, 0)
    else:
        norm = clang.where(clang.le(norm, 0), 0.0, norm)
    centered = clang.sub(x, clang.unsqueeze(avg, 1))
    weighted = centered if w is None else clang.mul(centered, w)
    c = clang.true_divide(prims.matmul(weighted, clang.transpose(centered, 0, 1)), norm)
    return clang.squeeze(c)  # one variable (a vector, or a single row) gives a 0-dim result, as torch squeezes


@torchsymbol(torch.corrcoef, T.corrcoef)
def corrcoef(input):
    c = cov(input)
    if c.ndim == 0:
        return clang.true_divide(c, c)
    v = c.shape[0]
    diagonal = prims.slice(clang.reshape(c, (v * v,)), (0,), (v * v,), (v + 1,))
    stddev = clang.sqrt(diagonal)
    c = clang.true_divide(c, clang.unsqueeze(stddev, 1))
    c = clang.true_divide(c, clang.unsqueeze(stddev, 0))
    return clang.where(clang.gt(c, 1.0), 1.0, clang.where(clang.lt(c, -1.0), -1.0, c))


def _bin_count(bins, op: str, dim: int) -> int:
    """How many bins `bins` (a count, or a tensor of edges) makes along dimension dim."""
    if isinstance(bins, TensorProxy):
        check(bins.ndim == 1 and bins.numel() >= 1,
              lambda: f"{op}(): bins tensor should have one dimension and at least 1 element, but got {bins.ndim} "
                      f"dimensions and {bins.numel()} elements for dimension {dim}")
        return bins.shape[0] - 1
    check(bins > 0, lambda: f"{op}(): bins must be > 0, but got {bins} for dimension {dim}")
    return bins


def _edges(input, count) -> TensorProxy:
    return TensorProxy(shape=(count + 1,), dtype=input.dtype, device=input.device)


@shape_rule(torch.histogram, T.histogram)
def _histogram_shape(input, bins=100, *, range=None, weight=None, density=False):
    count = _bin_count(bins, "torch.histogram", 0)
    hist = TensorProxy(shape=(count,), dtype=input.dtype, device=input.device)
    return torch.return_types.histogram((hist, _edges(input, count)))


@shape_rule(torch.histogramdd)
def _histogramdd_shape(input, bins=10, *, range=None, weight=None, density=False):
    check(input.ndim >= 1, lambda: "torch.histogramdd: input tensor should have at least 1 dimension, but got 0")
    dims = input.shape[-1]
    bins = [bins] * dims if isinstance(bins, int) else list(bins)
    check(len(bins) == dims, lambda: "histogramdd: The size of bins must be equal to the innermost dimension of the "
                                     "input.")
    counts = [_bin_count(b, "torch.histogramdd", d) for d, b in enumerate(bins)]
    hist = TensorProxy(shape=tuple(counts), dtype=input.dtype, device=input.device)
    return torch.return_types.histogramdd((hist, tuple(_edges(input, c) for c in counts)))
