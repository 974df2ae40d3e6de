"""Linear algebra beyond matmul: addmm and its batched and vector forms, mv, dot, vdot,
outer, einsum, tensordot and kron, each lowered to one prims.matmul (or a broadcast
multiply) around transposes and reshapes, so fusion and autodiff see inside."""
from __future__ import annotations

import math
import numbers

import torch

from thunderfn import clang, prims
from thunderfn.clang import keepdim_reshape, maybe_convert_to_dtype
from thunderfn.core import dtypes, symbolic
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.symbol import DecompositionUnavailable
from thunderfn.errors import UnsupportedOpError
from thunderfn.prims import canonical_dim, check, check_dtype_supported, scalar_type_name
from thunderfn.torch.base import torchsymbol
from thunderfn.torch.opaque import meta_outputs, shape_rule

T = torch.Tensor
__all__ = ["addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "outer", "einsum", "tensordot", "kron"]


def _scaled_sum(input, product, beta, alpha):
    """beta * input + alpha * product, computed in product's computation dtype and rounded
    once, as torch's fused kernels do; beta == 0 ignores input (its NaNs included)."""
    out_dtype = product.dtype
    compute = dtypes.computation_dtype(out_dtype)
    out = maybe_convert_to_dtype(product, compute)
    if alpha != 1:
        out = clang.mul(out, alpha)
    bias = clang.expand_to(input, product.shape)  # torch's "The expanded size of the tensor" check
    if beta != 0:
        bias = maybe_convert_to_dtype(bias, compute)
        out = clang.add(out, bias if beta == 1 else clang.mul(bias, beta))
    elif torch.is_grad_enabled() and dtypes.is_inexact(input.dtype):
        out = clang.in_place_of(bias, out)  # torch's input gradient at beta=0 is zeros, not None
    return maybe_convert_to_dtype(out, out_dtype)


def _computed_matmul(a, b):
    compute = dtypes.computation_dtype(a.dtype)
    return prims.matmul(maybe_convert_to_dtype(a, compute), maybe_convert_to_dtype(b, compute))


def _round_to(out, like):
    return maybe_convert_to_dtype(out, like.dtype)


@torchsymbol(torch.addmm, T.addmm)
def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    check(mat1.ndim == 2, lambda: f"mat1 must be a matrix, got {mat1.ndim}-D tensor")
    check(mat2.ndim == 2, lambda: f"mat2 must be a matrix, got {mat2.ndim}-D tensor")
    check(mat1.shape[1] == mat2.shape[0], lambda: f"mat1 and mat2 shapes cannot be multiplied "
                                                  f"({mat1.shape[0]}x{mat1.shape[1]} and "
                                                  f"{mat2.shape[0]}x{mat2.shape[1]})")
    for t in (input, mat1):
        check(t.dtype == mat2.dtype, lambda: f"self and mat2 must have the same dtype, but got "
                                             f"{scalar_type_name(t.dtype)} and {scalar_type_name(mat2.dtype)}")
    product = _round_to(_computed_matmul(mat1, mat2), mat1)
    return _scaled_sum(input, product, beta, alpha)


def _check_batches(batch1, batch2):
    check(batch1.ndim == 3, lambda: "batch1 must be a 3D tensor")
    check(batch2.ndim == 3, lambda: "batch2 must be a 3D tensor")
    check(batch1.dtype == batch2.dtype, lambda: f"expected scalar type {scalar_type_name(batch1.dtype)} but found "
                                                f"{scalar_type_name(batch2.dtype)}")


@torchsymbol(torch.baddbmm, T.baddbmm)
def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    _check_batches(batch1, batch2)
    check(batch1.shape[0] == batch2.shape[0] and batch1.shape[2] == batch2.shape[1],
          lambda: "Expected size for first two dimensions of batch2 tensor to be: "
                  f"[{batch1.shape[0]}, {batch1.shape[2]}] but got: [{batch2.shape[0]}, {batch2.shape[1]}].")
    check(input.dtype == batch1.dtype, lambda: f"expected scalar type {scalar_type_name(batch1.dtype)} but found "
                                               f"{scalar_type_name(input.dtype)}")
    product = _round_to(_computed_matmul(batch1, batch2), batch1)
    return _scaled_sum(input, product, beta, alpha)


@torchsymbol(torch.addbmm, T.addbmm)
def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    _check_batches(batch1, batch2)
    check(batch1.shape[0] == batch2.shape[0],
          lambda: f"batch1 and batch2 must have same number of batches, got {batch1.shape[0]} and {batch2.shape[0]}")
    check(batch1.shape[2] == batch2.shape[1],
          lambda: f"Incompatible matrix sizes for bmm ({batch1.shape[1]}x{batch1.shape[2]} "
                  f"and {batch2.shape[1]}x{batch2.shape[2]})")
    check(input.dtype == batch1.dtype, lambda: f"expected scalar type {scalar_type_name(batch1.dtype)} but found "
                                               f"{scalar_type_name(input.dtype)}")
    # the sum over batches of batch1[b] @ batch2[b] is one matrix product: (n, B*m) @ (B*m, p)
    b, n, m = batch1.shape
    left = clang.reshape(clang.permute(batch1, (1, 0, 2)), (n, b * m))
    right = clang.reshape(batch2, (b * m, batch2.shape[2]))
    product = _round_to(_computed_matmul(left, right), batch1)
    return _scaled_sum(input, product, beta, alpha)


def _check_matrix_vector(input_ndim, mat, vec):
    check(mat.ndim == 2 and vec.ndim == 1 and input_ndim <= 1,
          lambda: f"vector + matrix @ vector expected, got {input_ndim}, {mat.ndim}, {vec.ndim}")


@torchsymbol(torch.addmv, T.addmv)
def addmv(input, mat, vec, *, beta=1, alpha=1):
    _check_matrix_vector(input.ndim, mat, vec)
    check(mat.shape[1] == vec.shape[0] and input.numel() in (1, mat.shape[0]),
          lambda: f"size mismatch, got input ({input.shape[0] if input.ndim else 1}), mat "
                  f"({mat.shape[0]}x{mat.shape[1]}), vec ({vec.shape[0]})")
    check(input.dtype == mat.dtype == vec.dtype,
          lambda: f"addmv input tensors must have the same dtype, but got {scalar_type_name(input.dtype)}, "
                  f"{scalar_type_name(mat.dtype)}, and {scalar_type_name(vec.dtype)}")
    product = _round_to(_computed_matmul(mat, vec), mat)
    return _scaled_sum(input, product, beta, alpha)


@torchsymbol(torch.mv, T.mv)
def mv(input, vec):
    _check_matrix_vector(1, input, vec)
    check(input.shape[1] == vec.shape[0],
          lambda: f"size mismatch, got input ({input.shape[0]}), mat ({input.shape[0]}x{input.shape[1]}), "
                  f"vec ({vec.shape[0]})")
    check(input.dtype == vec.dtype,
          lambda: f"addmv input tensors must have the same dtype, but got "
                  f"{scalar_type_name(torch.promote_types(input.dtype, vec.dtype))}, {scalar_type_name(input.dtype)}, "
                  f"and {scalar_type_name(vec.dtype)}")
    return _round_to(_computed_matmul(input, vec), input)


def _check_vectors(a, b, name):
    check(a.ndim == 1 and b.ndim == 1, lambda: f"1D tensors expected, but got {a.ndim}D and {b.ndim}D tensors")
    check(a.shape[0] == b.shape[0],
          lambda: f"inconsistent tensor size, expected tensor [{a.shape[0]}] and src [{b.shape[0]}] to have the same "
                  f"number of elements, but got {a.shape[0]} and {b.shape[0]} elements respectively")
    check(a.dtype == b.dtype, lambda: f"{name} : expected both vectors to have same dtype, but found "
                                      f"{scalar_type_name(a.dtype)} and {scalar_type_name(b.dtype)}")
    check_dtype_supported(a.dtype is not torch.bool, name, a.dtype)


@torchsymbol(torch.dot, T.dot)
def dot(input, other):
    _check_vectors(input, other, "dot")
    return _round_to(_computed_matmul(input, other), input)


@torchsymbol(torch.vdot, T.vdot)
def vdot(input, other):
    _check_vectors(input, other, "vdot")
    if dtypes.is_complex(input.dtype):  # conjugation has no prim: torch computes the complex case, as an opaque op
        raise DecompositionUnavailable
    return _round_to(_computed_matmul(input, other), input)


@torchsymbol(torch.outer, T.outer, torch.ger, T.ger)
def outer(input, vec2):
    check(input.ndim == 1, lambda: f"outer: Expected 1-D argument self, but got {input.ndim}-D")
    check(vec2.ndim == 1, lambda: f"outer: Expected 1-D argument vec2, but got {vec2.ndim}-D")
    return clang.mul(clang.reshape(input, (input.shape[0], 1)), vec2)


# -- einsum ---------------------------------------------------------------------------------
# Labels are letters; the dims an ellipsis covers are labelled 0, 1, ... (right-aligned across
# operands, so they broadcast as torch's do).
def _einsum_term(term: str, offset: int, what: str) -> list:
    labels, i = [], 0
    while i < len(term):
        c = term[i]
        if c == ".":
            check(term[i:i + 3] == "..." and "..." not in labels,
                  lambda: f"einsum(): found '.' for {what} that is not part of any ellipsis")
            labels.append("...")
            i += 3
            continue
        check(c.isascii() and c.isalpha(),
              lambda: f"einsum(): invalid subscript given at index {offset + i} in the equation "
                                                    f"string, subscripts must be in [a-zA-Z]")
        labels.append(c)
        i += 1
    return labels


def _einsum_parse(equation: str, operands):
    check(isinstance(equation, str),
          lambda: "einsum(): the equation must be a string (the sublist format is not supported "
                  "while tracing)", UnsupportedOpError)
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms, offsets, pos = lhs.split(","), [], 0
    for term in terms:
        offsets.append(pos)
        pos += len(term) + 1
    check(len(terms) <= len(operands), lambda: "einsum(): fewer operands were provided than specified in the equation")
    check(len(terms) >= len(operands), lambda: "einsum(): more operands were provided than specified in the equation")
    inputs = []
    for k, (term, offset, t) in enumerate(zip(terms, offsets, operands)):
        labels = _einsum_term(term, offset, f"operand {k}")
        letters = len([c for c in labels if c != "..."])
        if "..." in labels:
            check(letters <= t.ndim,
                  lambda: f"einsum(): the number of subscripts in the equation ({letters}) is more than "
                          f"the number of dimensions ({t.ndim}) for operand {k}")
        else:
            check(letters == t.ndim,
                  lambda: f"einsum(): the number of subscripts in the equation ({letters}) does not match "
                          f"the number of dimensions ({t.ndim}) for operand {k} and "
                          "no ellipsis was given")
        inputs.append(labels)
    n_ell = max([t.ndim - len(ls) + 1 for ls, t in zip(inputs, operands) if "..." in ls], default=0)
    expanded = []
    for labels, t in zip(inputs, operands):
        if "..." in labels:
            i, e = labels.index("..."), t.ndim - len(labels) + 1
            labels = labels[:i] + list(range(n_ell - e, n_ell)) + labels[i + 1:]
        expanded.append(labels)
    counts: dict = {}
    for labels in expanded:
        for label in labels:
            counts[label] = counts.get(label, 0) + 1
    if arrow:
        out = _einsum_term(rhs, len(lhs) + 2, "the output")
        for i, label in enumerate(out):
            check(label == "..." or label not in out[:i],
                  lambda: f"einsum(): output subscript {label} appears more than once in the output")
            check(label == "..." or label in counts,
                  lambda: f"einsum(): output subscript {label} does not appear in the "
                          f"equation for any input operand")
        if "..." in out:
            i = out.index("...")
            out = out[:i] + list(range(n_ell)) + out[i + 1:]
    else:  # the ellipsis dims, then the letters used once, in alphabetical (ASCII) order
        out = list(range(n_ell)) + sorted(c for c, n in counts.items() if isinstance(c, str) and n == 1)
    return expanded, out


def _einsum_diagonal(t, labels, k):
    """Operand t with each repeated label taken along its diagonal (its dims moved last)."""
    while len(set(labels)) < len(labels):
        label = next(x for i, x in enumerate(labels) if x in labels[:i])
        pos = [i for i, x in enumerate(labels) if x == label]
        n = t.shape[pos[0]]
        for p in pos[1:]:
            check(t.shape[p] == n,
                  lambda: f"einsum(): subscript {label} is repeated for operand {k} but the sizes don't "
                          f"match, {t.shape[p]} != {n}")
        keep = [i for i in range(t.ndim) if i not in pos]
        t = clang.reshape(clang.permute(t, keep + pos), tuple(t.shape[i] for i in keep) + (n ** len(pos),))
        # in the flattened (n, n, ..., n) block, the diagonal is every (1 + n + n^2 + ...)-th element
        t = clang.slice_in_dim(t, 0, n ** len(pos), sum(n ** j for j in range(len(pos))), dim=t.ndim - 1)
        labels = [labels[i] for i in keep] + [label]
    return t, labels


def _sum(t, dims, keepdim=False):
    """torch's sum, which einsum uses for every label it sums out of one operand: integers
    come back as int64 (so einsum("ij->", int32) is int64 while einsum("ij,jk", int32) is not)."""
    out = prims.sum(t, dims)
    if keepdim:
        out = clang.keepdim_reshape(out, t, dims)
    return maybe_convert_to_dtype(out, torch.int64) if not dtypes.is_inexact(t.dtype) else out


def _sum_out(t, labels, keep):
    dims = tuple(i for i, label in enumerate(labels) if label not in keep)
    if not dims:
        return t, labels
    return _sum(t, dims), [label for label in labels if label in keep]


def _einsum_pair(a, la, b, lb, keep):
    batch = [x for x in la if x in lb and x in keep]
    contracted = [x for x in la if x in lb and x not in keep]
    left, right = [x for x in la if x not in lb], [x for x in lb if x not in la]
    # a contracted label of size 1 on one side is summed out of the other side first, as torch does
    for x in contracted:
        na, nb = a.shape[la.index(x)], b.shape[lb.index(x)]
        if symbolic.known_equal(na, nb):  # (not asked of symbolic sizes, which would guard them to differ from 1)
            continue
        if na == 1 and nb != 1:
            b = _sum(b, (lb.index(x),), keepdim=True)
        elif nb == 1 and na != 1:
            a = _sum(a, (la.index(x),), keepdim=True)
    size = dict(zip(lb, b.shape))
    size.update((x, n) for x, n in zip(la, a.shape) if x not in size or symbolic.was_expanded(size[x], n))
    # size-1 batch dims broadcast
    a = clang.expand_to(a, tuple(size[x] if x in batch else n for x, n in zip(la, a.shape)))
    b = clang.expand_to(b, tuple(size[x] if x in batch else n for x, n in zip(lb, b.shape)))
    dtype = torch.promote_types(a.dtype, b.dtype)  # differ only where a sum above made int64
    a, b = maybe_convert_to_dtype(a, dtype), maybe_convert_to_dtype(b, dtype)

    def grouped(t, labels, groups):
        t = clang.permute(t, [labels.index(x) for g in groups for x in g])
        return clang.reshape(t, tuple(math.prod(size[x] for x in g) for g in groups))

    out = prims.matmul(grouped(a, la, (batch, left, contracted)), grouped(b, lb, (batch, contracted, right)))
    labels = batch + left + right
    return clang.reshape(out, tuple(size[x] for x in labels)), labels



@torchsymbol(torch.einsum)
def einsum(equation, *operands):
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    inputs, out = _einsum_parse(equation, operands)
    for i, t in enumerate(operands[1:], 1):
        check(t.dtype == operands[0].dtype,
              lambda: f"expected scalar type {scalar_type_name(operands[0].dtype)} but found "
                      f"{scalar_type_name(t.dtype)}")
    sizes: dict = {}
    tensors = []
    for k, (t, labels) in enumerate(zip(operands, inputs)):
        t, labels = _einsum_diagonal(t, labels, k)
        for label, n in zip(labels, t.shape):
            seen = sizes.get(label, 1)
            check(symbolic.broadcastable(n, seen),
                  lambda: f"einsum(): subscript {label} has size {n} for operand {k} which does not broadcast with "
                          f"previously seen size {seen}" if isinstance(label, str) else
                          f"einsum(): operands do not broadcast (an ellipsis dimension has sizes {seen} and {n})")
            sizes[label] = symbolic.broadcast_size(seen, n)
        tensors.append((t, labels))
    # contract left to right; each step first sums out what no later operand nor the output needs
    t, labels = _sum_out(*tensors[0], set(out).union(*(ls for _, ls in tensors[1:])))
    for i in range(1, len(tensors)):
        later = set(out).union(*(ls for _, ls in tensors[i + 1:]))
        other, other_labels = _sum_out(*tensors[i], later | set(labels))
        t, labels = _einsum_pair(t, labels, other, other_labels, later)
    return clang.permute(t, [labels.index(x) for x in out])


# -- tensordot and kron -----------------------------------------------------------------------
@torchsymbol(torch.tensordot)
def tensordot(a, b, dims=2, out=None):
    check(out is None,
          lambda: "torch.tensordot(out=...) writes into an argument, which thunderfn does not trace; use the "
                  "result instead", UnsupportedOpError)
    check(a.dtype == b.dtype, lambda: "both inputs should have same dtype")
    if isinstance(dims, numbers.Integral):
        check(dims >= 0, lambda: f"tensordot expects dims >= 0, but got dims={dims}")
        check(dims <= min(a.ndim, b.ndim), lambda: f"tensordot expects dims < ndim_a or ndim_b, but got dims={dims}")
        dims_a, dims_b = list(range(-dims, 0)), list(range(dims))
    else:
        check(isinstance(dims, (list, tuple)) and len(dims) == 2,
              lambda: "tensordot expects dims to be an int or a pair of dim lists (a tensor of dims is not supported "
                      "while tracing)", UnsupportedOpError if is_tensor_like(dims) else RuntimeError)
        dims_a, dims_b = ([d] if isinstance(d, numbers.Integral) else list(d) for d in dims)
        check(len(dims_a) == len(dims_b), lambda: "both dimension lists should have same length")
    for x, y in zip(dims_a, dims_b):
        check(symbolic.broadcastable(a.shape[x], b.shape[y]),
              lambda: f"contracted dimensions need to match, but first has size {a.shape[x]} in "
                      f"dim {x} and second has size {b.shape[y]} in dim {y}")
        # torch broadcasts a size-1 contracted dim: the other side is summed over it first
        if a.shape[x] != b.shape[y]:
            if a.shape[x] == 1:
                b = keepdim_reshape(prims.sum(b, (canonical_dim(y, b.ndim),)), b, (canonical_dim(y, b.ndim),))
            else:
                a = keepdim_reshape(prims.sum(a, (canonical_dim(x, a.ndim),)), a, (canonical_dim(x, a.ndim),))
    ca, cb = [canonical_dim(d, a.ndim) for d in dims_a], [canonical_dim(d, b.ndim) for d in dims_b]
    free_a, free_b = [i for i in range(a.ndim) if i not in ca], [i for i in range(b.ndim) if i not in cb]
    k = math.prod(a.shape[i] for i in ca)
    left = clang.reshape(clang.permute(a, free_a + ca), (math.prod(a.shape[i] for i in free_a), k))
    right = clang.reshape(clang.permute(b, cb + free_b), (k, math.prod(b.shape[i] for i in free_b)))
    return clang.reshape(prims.matmul(left, right),
                         tuple(a.shape[i] for i in free_a) + tuple(b.shape[i] for i in free_b))


def is_tensor_like(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


@torchsymbol(torch.kron, T.kron)
def kron(input, other):
    n = max(input.ndim, other.ndim)
    a_shape, b_shape = (1,) * (n - input.ndim) + tuple(input.shape), (1,) * (n - other.ndim) + tuple(other.shape)
    # a's dims interleaved with size-1 dims times b's the other way round; merging each pair gives the blocks
    a = clang.reshape(input, tuple(s for x in a_shape for s in (x, 1)))
    b = clang.reshape(other, tuple(s for y in b_shape for s in (1, y)))
    return clang.reshape(clang.mul(a, b), tuple(x * y for x, y in zip(a_shape, b_shape)))



# -- opaque LAPACK kernels torch gives no meta kernel: their outputs' shapes, from the arguments' shapes ----------
def _like(x, shape, dtype=None) -> TensorProxy:
    return TensorProxy(shape=tuple(shape), dtype=dtype or x.dtype, device=x.device)


@shape_rule(torch.geqrf, T.geqrf)
def _geqrf_shape(input):
    check(input.ndim >= 2, lambda: "torch.geqrf: input must have at least 2 dimensions.")
    m, n = input.shape[-2:]
    return torch.return_types.geqrf((_like(input, input.shape), _like(input, (*input.shape[:-2], min(m, n)))))


@shape_rule(torch.linalg.lstsq)
def _lstsq_shape(A, B, rcond=None, *, driver=None):
    # (torch's linalg_lstsq_out_info): the solution (*, n, k); residuals (*, k) for m > n, but for gelsy never; rank
    # (A's batch) except for gels; singular values (*, min(m, n)) for gelsd and gelss; the rest empty
    check(A.ndim >= 2, lambda: "torch.linalg.lstsq: input must have at least 2 dimensions.")
    check(A.dtype == B.dtype, lambda: f"torch.linalg.lstsq: Expected input and other to have the same dtype, but got "
                                      f"input's dtype {scalar_type_name(A.dtype)} and other's dtype "
                                      f"{scalar_type_name(B.dtype)}")
    check(B.ndim >= A.ndim - 1 and A.ndim - B.ndim <= 1,
          lambda: "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
                  "(input.dim() - other.dim()) <= 1")
    vector = B.ndim == A.ndim - 1
    b_shape = (*B.shape, 1) if vector else tuple(B.shape)
    m, n = A.shape[-2:]
    check(b_shape[-2] == m, lambda: "torch.linalg.lstsq: input.size(-2) should match other.size(-2)")
    if driver is None:
        driver = "gels" if A.device.type == "cuda" else "gelsy"
    if driver not in ("gels", "gelsy", "gelsd", "gelss") or tuple(A.shape[:-2]) != tuple(b_shape[:-2]):
        return None  # torch's own words for a driver it does not know; batches broadcast: not ruled here
    if m > n and driver in ("gelsd", "gelss"):
        raise UnsupportedOpError(
            f"torch.linalg.lstsq(driver={driver!r}) on tall matrices returns residuals only when every matrix has "
            f"full rank, so the shape of the residuals depends on tensor values, which tracing does not know; use "
            "driver='gelsy' or 'gels' (and compute residuals from the solution), or call it outside jit")
    batch, k, real = tuple(A.shape[:-2]), b_shape[-1], dtypes.to_real(A.dtype)
    solution = _like(A, (*batch, n) if vector else (*batch, n, k))
    residuals = _like(A, (*batch, k) if m > n and driver != "gelsy" else (0,), real)
    rank = _like(A, (0,) if driver == "gels" else batch, torch.int64)
    singular_values = _like(A, (*batch, min(m, n)) if driver in ("gelsd", "gelss") else (0,), real)
    return torch.return_types.linalg_lstsq((solution, residuals, rank, singular_values))


def _column_major_mat2_shape(fn):
    """The shapes of fn(mat1, mat2, ...), a scaled matmul whose kernel asks for mat2 column-major: proxies have no
    strides, so torch's meta kernel runs with a mat2 that is (one that is not, at run time, gets torch's own error)."""
    def rule(mat1, mat2, *args, **kwargs):
        if not isinstance(mat2, TensorProxy) or mat2.ndim != 2 or symbolic.has_symbols(tuple(mat2.shape)):
            return None
        column_major = torch.empty_strided(tuple(mat2.shape), (1, mat2.shape[0]), dtype=mat2.dtype, device="meta")
        return meta_outputs(fn, (mat1, column_major, *args), kwargs)
    return rule


for _scaled_mm in (torch._scaled_mm, torch._scaled_mm_v2):
    shape_rule(_scaled_mm)(_column_major_mat2_shape(_scaled_mm))
