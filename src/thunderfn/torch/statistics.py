"""Statistics: cov and corrcoef, decomposed. Weight checks that need values (no
negative weights) become runtime checks, so invalid input fails as it does in eager."""
from __future__ import annotations

import torch

from thunderfn import clang, prims
from thunderfn.clang import maybe_convert_to_dtype
from thunderfn.core import dtypes, symbolic
from thunderfn.core.statements import emit_runtime_check
from thunderfn.prims import check
from thunderfn.torch.base import torchsymbol
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
