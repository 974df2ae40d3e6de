"""Rules of the linear algebra family: matmul, and the torch-language matrix products whose rules
run eager's backward (linear, addmm: one matrix product per operand, no decomposition).

matmul's batching rule folds the vmapped dimension into torch.matmul's own broadcasting, so the
batched program is one matmul.
"""
from __future__ import annotations

import thunderfn.torch as ltorch
from thunderfn import prims
from thunderfn.core import symbolic
from thunderfn.prims import PrimIDs
from thunderfn.torch.reductions import sum_to
from thunderfn.transforms.rules.common import (
    add_tangents,
    batch_size_of,
    is_float_tensor,
    matrix_t,
    move_to_front,
    reshaped,
)
from thunderfn.transforms.rules.define import defbatch, defjvp, defvjp


def _matrix_transpose(x):
    return ltorch.permute(x, tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


@defvjp(PrimIDs.MATMUL)
def _matmul_vjp(call, g):
    """Promote vectors to matrices (a to a row, b to a column), take the matrix rule, sum
    over the batch dims broadcasting added, and drop the promoted dims again."""
    a, b = call.args
    if not is_float_tensor(a):
        return None, None
    if a.ndim == 1 and b.ndim == 1:
        return ltorch.mul(g, b), ltorch.mul(g, a)
    a2 = ltorch.reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = ltorch.reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    batch = tuple(g.shape[:g.ndim - (a.ndim > 1) - (b.ndim > 1)])
    g2 = ltorch.reshape(g, batch + (a2.shape[-2], b2.shape[-1]))
    da = sum_to(ltorch.matmul(g2, _matrix_transpose(b2)), a2.shape)
    db = sum_to(ltorch.matmul(_matrix_transpose(a2), g2), b2.shape)
    return ltorch.reshape(da, tuple(a.shape)), ltorch.reshape(db, tuple(b.shape))


@defjvp(PrimIDs.MATMUL)
def _matmul_jvp(call, t):
    (a, b), (ta, tb) = call.args, t
    return add_tangents(None if ta is None else prims.matmul(ta, b), None if tb is None else prims.matmul(a, tb))


@defbatch(PrimIDs.MATMUL)
def _matmul_batch(call, dims):
    """Both operands as stacks of matrices (a vector is a 1-row or 1-column matrix), the batched
    ones with the batch dimension first and 1s padding their per-example batch dims to a common
    rank, so torch.matmul's broadcasting pairs each example with its own operand; then one
    reshape drops the vector dims."""
    args, out = call.args, call.out
    (a, b), (a_dim, b_dim) = args, dims
    batch = batch_size_of(args, dims)
    a_example = tuple(a.shape[:a_dim] + a.shape[a_dim + 1:]) if a_dim is not None else tuple(a.shape)
    b_example = tuple(b.shape[:b_dim] + b.shape[b_dim + 1:]) if b_dim is not None else tuple(b.shape)
    a_matrix = (1,) + a_example if len(a_example) == 1 else a_example
    b_matrix = b_example + (1,) if len(b_example) == 1 else b_example
    stack_rank = max(len(a_matrix), len(b_matrix)) - 2

    def as_stack(x, d, matrix):
        if d is None:
            return reshaped(x, matrix)
        return reshaped(move_to_front(x, d), (batch,) + (1,) * (stack_rank + 2 - len(matrix)) + matrix)

    product = prims.matmul(as_stack(a, a_dim, a_matrix), as_stack(b, b_dim, b_matrix))
    return reshaped(product, (batch,) + tuple(out.shape)), 0


# -- torch-language matrix products: eager's backward -----------------------------------------
@defvjp(ltorch.linear.id)
def _linear_vjp(call, g):  # out = x @ w.T + b; w is (out, in), or (in,) for a dot product over the last dim
    x, w = call.args[:2]
    b = call.arg("bias")
    rows = symbolic.product(x.shape[:-1])
    if w.ndim == 1:
        dx = ltorch.mul(ltorch.unsqueeze(g, -1) if g.ndim else g, w)
        dw = (ltorch.mul(g, x) if x.ndim == 1
              else ltorch.matmul(ltorch.reshape(g, (rows,)), ltorch.reshape(x, (rows, w.shape[0]))))
    else:
        dx = ltorch.matmul(g, w)
        g2, x2 = ltorch.reshape(g, (rows, w.shape[0])), ltorch.reshape(x, (rows, w.shape[1]))
        dw = ltorch.matmul(matrix_t(g2), x2)
    if b is not None and b.ndim == 1 and w.ndim == 2 and b.shape[0] == w.shape[0] and rows:
        db = ltorch.sum(ltorch.reshape(g, (rows, w.shape[0])), 0)  # as eager's addmm over the folded rows sums it
    else:
        db = None if b is None else sum_to(g, b.shape)
    return (dx, dw, db) + (None,) * (len(call.args) - 3)


@defvjp(ltorch.addmm.id)
def _addmm_vjp(call, g):  # out = beta * input + alpha * mat1 @ mat2: eager's AddmmBackward, one mm per matrix
    input, mat1, mat2 = call.args[:3]
    beta, alpha = call.arg("beta"), call.arg("alpha")
    scaled = g if alpha == 1 else ltorch.mul(g, alpha)
    d_input = sum_to(g if beta == 1 else ltorch.mul(g, beta), input.shape)
    return d_input, ltorch.matmul(scaled, matrix_t(mat2)), ltorch.matmul(matrix_t(mat1), scaled)
