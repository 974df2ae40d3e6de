"""Rules of the control-flow family: cond, scan and while_loop (prims_control_flow.py).

A rule that needs a body's derivative or batched form transforms the body's trace, replayed on
proxies (Body.inline), inside a new body of the same primitive, so a second transform transforms it
again:
- reverse mode through cond is a cond of the branches' VJPs, by the same predicate, each reading the values
  its branch saved in the forward (the rule's residuals; zeros for the other branch's); through scan, the
  forward keeping each step's residuals and starting carry, stacked, then a scan in the other direction of
  the body's VJP reading them (transforms/rules/residuals.py builds the bodies); through
  while_loop it is refused by name, as in JAX (its number of steps is known only when it runs), while a
  jitted function whose inputs require grad still trains through it with torch.autograd;
- forward mode runs the same primitive over primals and tangents together;
- vmap runs it over the batched bodies: a batched predicate runs both branches and selects, a batched
  while_loop runs until every example is done, each keeping its carry once its condition fails.
"""
from __future__ import annotations

import thunderfn.torch as ltorch
from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.cond, scan, while_loop)
from thunderfn.core.bodies import trace_body
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.rules import set_underivable
from thunderfn.errors import UnsupportedOpError
from thunderfn.torch import control_flow
from thunderfn.transforms.rules.common import (
    batch_size_of,
    batched_front,
    float_tangents,
    full_tangents,
    is_float_tensor,
    move_to_front,
    output_tangents,
    per_leaf,
    zeros_like,
    zeros_or,
)
from thunderfn.transforms.rules.define import defbatch, defjvp, defvjp, trace_jvp, trace_vjp, vmap
from thunderfn.transforms.rules.residuals import backward_body, draws, saving_forward

# reverse mode needs every step's carry, and a while_loop's number of steps is known only when it runs
_WHILE_LOOP = ("reverse mode through a while_loop is not supported (as in JAX: its number of steps is known only "
               "when it runs); write the loop with tf.fori_loop or tf.scan, whose length is known, or call .backward() "
               "on a tf.jit-ted function (torch.autograd runs through the bodies)")


# -- cond: the VJP is a cond of the branches' VJPs ----------------------------------------------------
def _branch_vjp(body, mine: int, float_positions: list):
    """A function of (operands, true_captured, false_captured, output cotangents) giving the cotangents of
    the float leaves among them for one branch: its VJP, zeros for the other branch's captured tensors
    (both branches of the backward's cond return the same structure)."""
    def vjp(operands, true_captured, false_captured, cts):
        captured = (true_captured, false_captured)[mine]
        _, backward = trace_vjp(lambda ops, cap: body.inline(*ops, *cap), (operands, captured))
        grads = backward(tuple(cts))
        own = dict(zip(range(len(operands)), grads[:len(operands)]))
        leaves = list(operands) + list(true_captured) + list(false_captured)
        start = len(operands) + (0 if mine == 0 else len(true_captured))
        own.update({start + i: g for i, g in enumerate(grads[len(operands):])})
        return tuple(own.get(i) if own.get(i) is not None else zeros_like(leaves[i]) for i in float_positions)

    vjp.__name__ = f"{body.fn_name}_vjp"
    return vjp


def _cond_saving_residuals(bsym):
    """The cond as reverse mode runs it in the forward: each branch, differentiated, also returns the values its
    backward reads, and zeros in the place of the other branch's (both return one structure), as JAX's cond."""
    pred, true_body, false_body, operands, true_captured, false_captured = bsym.args
    if bsym.kwargs.get("n_saved", 0):
        return bsym
    found = [saving_forward(body, list(body.trace.args), lambda b: True, body.__name__.rsplit("_", 1)[0])
             for body in (true_body, false_body)]
    saved = [f[1] if f is not None else [] for f in found]
    if not saved[0] and not saved[1]:
        return bsym

    def saving_branch(mine: int):
        forward = found[mine][0] if found[mine] is not None else (true_body, false_body)[mine]

        def branch(*flat):
            out = tuple(forward.inline(*flat))
            zeros = tuple(zeros_like(r) for r in saved[1 - mine])
            return out + zeros if mine == 0 else out[:len(bsym.output)] + zeros + out[len(bsym.output):]

        branch.__name__ = forward.fn_name
        body = (true_body, false_body)[mine]
        return trace_body(branch, tuple(body.trace.args), body.__name__.rsplit("_", 1)[0])

    outputs = tuple(bsym.output) + tuple(TensorProxy.like(r) for r in saved[0] + saved[1])
    return prims.cond.bind(pred, saving_branch(0), saving_branch(1), operands, true_captured, false_captured,
                           n_saved=len(saved[0]) + len(saved[1]), output=outputs)


@defvjp(prims.cond.id, residuals=_cond_saving_residuals)
def _cond_vjp(call, g):
    """A cond, by the same predicate, of the branches' VJPs, each reading what its branch saved (or, in a cond
    that saved nothing or whose saved values a second derivative differentiates, recomputing its values)."""
    pred, true_body, false_body, operands, true_captured, false_captured = call.args
    if _reads_saved(call, g, (true_body, false_body), "cond"):
        return _cond_vjp_from_saved(call, g)
    cts = tuple(c if c is not None or not is_float_tensor(o) else zeros_like(o) for o, c in zip(call.out, g))
    leaves = list(operands) + list(true_captured) + list(false_captured)
    float_positions = [i for i, x in enumerate(leaves) if is_float_tensor(x)]
    grads = control_flow.cond(pred, _branch_vjp(true_body, 0, float_positions),
                              _branch_vjp(false_body, 1, float_positions),
                              tuple(operands), tuple(true_captured), tuple(false_captured), cts)
    by_position = dict(zip(float_positions, grads))
    flat = [by_position.get(i) for i in range(len(leaves))]
    n_ops, n_true = len(operands), len(true_captured)
    return (None, None, None, tuple(flat[:n_ops]), tuple(flat[n_ops:n_ops + n_true]), tuple(flat[n_ops + n_true:]))


def _cond_vjp_from_saved(call, g):
    pred, true_body, false_body, operands, true_captured, false_captured = call.args
    n_saved = call.kwargs["n_saved"]
    n_out = len(call.out) - n_saved
    wanted = [i for i in range(n_out) if is_float_tensor(call.out[i])]
    leaves = list(operands) + list(true_captured) + list(false_captured)
    float_positions = [i for i, x in enumerate(leaves) if is_float_tensor(x)]
    n_ops, n_true = len(operands), len(true_captured)

    def branch_vjp(body, mine: int):
        outs = body.outputs
        backward, float_in = backward_body(body, n_saved, (tuple(body.trace.args), tuple(outs[n_out:]),
                                                           tuple(outs[i] for i in wanted)), wanted,
                                           f"{body.fn_name}_vjp")
        start = n_ops + (0 if mine == 0 else n_true)  # where this branch's captured tensors sit among the leaves

        def vjp(operands, true_captured, false_captured, saved, cts):
            given = backward.inline(*operands, *(true_captured, false_captured)[mine], *saved, *cts)
            own = {i if i < n_ops else start + i - n_ops: ct for i, ct in zip(float_in, given)}
            everything = list(operands) + list(true_captured) + list(false_captured)
            return tuple(own[i] if i in own else zeros_like(everything[i]) for i in float_positions)

        vjp.__name__ = f"{body.fn_name}_vjp"
        return vjp

    cts = tuple(zeros_or(g[i], call.out[i]) for i in wanted)
    grads = control_flow.cond(pred, branch_vjp(true_body, 0), branch_vjp(false_body, 1), tuple(operands),
                              tuple(true_captured), tuple(false_captured), tuple(call.out[n_out:]), cts)
    by_position = dict(zip(float_positions, grads))
    flat = [by_position.get(i) for i in range(len(leaves))]
    return (None, None, None, tuple(flat[:n_ops]), tuple(flat[n_ops:n_ops + n_true]), tuple(flat[n_ops + n_true:]))


def _reads_saved(call, g, bodies, what: str) -> bool:
    """Whether the VJP of this cond or scan reads what its forward saved (its last n_saved outputs): so it does
    unless a second derivative differentiates those, when the VJP computes the bodies' values again, which
    would draw their random numbers anew, other than the forward's: refused by name where a body draws."""
    n_saved = call.kwargs.get("n_saved", 0)
    if not n_saved or all(c is None for c in g[len(call.out) - n_saved:]):
        return bool(n_saved)
    if any(draws(b) for body in bodies for b in body.trace.bound_symbols):
        raise UnsupportedOpError(f"reverse mode through a {what} whose body draws random numbers, differentiated "
                                 f"again through what its forward saved: its values would be drawn anew; take the "
                                 f"random draws outside the {what} and pass them in")
    return False


# -- scan: the carries each step started from, then a reverse scan of the body's VJP --------------------------
def _floats(leaves) -> list:
    return [i for i, x in enumerate(leaves) if is_float_tensor(x)]


def _scan_saving_residuals(bsym):
    """The scan as reverse mode runs it in the forward: its body, differentiated, also returns each step the
    values the step's backward reads, then the carry the step started from, stacked as extra ys (n_saved of
    them), which the backward scan reads instead of computing them again. A body that is a checkpoint saves
    what its policy says (its own residuals rule ran inside)."""
    body, init, xs, captured, length, reverse = bsym.args
    if bsym.kwargs.get("n_saved", 0):
        return bsym
    n_carry = len(init)
    found = saving_forward(body, list(body.trace.args), lambda b: True, "scan_body")
    saving, saved = found if found is not None else (body, [])
    if not saved and not n_carry:
        return bsym

    def with_carries(*flat):
        return tuple(saving.inline(*flat)) + tuple(flat[:n_carry])

    with_carries.__name__ = body.fn_name
    saving = trace_body(with_carries, tuple(body.trace.args), "scan_body")
    stacked = [*saved, *init]
    outputs = tuple(bsym.output) + tuple(TensorProxy.like(p, shape=(length, *p.shape)) for p in stacked)
    return prims.scan.bind(saving, init, xs, captured, length, reverse, n_saved=len(stacked), output=outputs)


@defvjp(prims.scan.id, residuals=_scan_saving_residuals)
def _scan_vjp(call, g):
    """A scan in the other direction of the body's VJP, step by step: it carries the cotangent of the carry
    and the sum of the captured tensors' cotangents, and stacks the cotangents of xs. Each step reads what the
    forward saved for it (_scan_saving_residuals); a scan that saved nothing (or whose saved values a second
    derivative differentiates) first recomputes the carries with a forward scan, and each step its values."""
    body, init, xs, captured, length, reverse = call.args
    if _reads_saved(call, g, (body,), "scan"):
        return _scan_vjp_from_saved(call, g)
    n_carry, n_x = len(init), len(xs)
    carry_out, ys_out = call.out[:n_carry], call.out[n_carry:]
    float_carry, float_x, float_captured = _floats(init), _floats(xs), _floats(captured)
    y_examples = body.outputs[n_carry:]
    float_y = _floats(y_examples)

    def recompute(carry, x):
        return tuple(body.inline(*carry, *x, *captured)[:n_carry]), carry

    _, started_from = control_flow.scan(recompute, tuple(init), tuple(xs), length=length, reverse=reverse)
    g_carry = tuple(zeros_or(g[i], carry_out[i]) for i in float_carry)
    g_ys = tuple(zeros_or(g[n_carry + i], ys_out[i]) for i in float_y)

    def back_step(state, step):
        g_c, g_k = state
        carry, x, g_y = step
        _, backward = trace_vjp(lambda c, x, k: body.inline(*c, *x, *k), (carry, x, captured))
        cts = [None] * (n_carry + len(y_examples))
        for i, gc in zip(float_carry, g_c):
            cts[i] = gc
        for i, gy in zip(float_y, g_y):
            cts[n_carry + i] = gy
        grads = backward(tuple(cts))
        return _step_cotangents(grads, carry, x, g_k, n_carry, n_x, float_carry, float_x, float_captured)

    zero_k = tuple(zeros_like(captured[i]) for i in float_captured)
    (g_init, g_captured), g_xs = control_flow.scan(back_step, (g_carry, zero_k), (started_from, tuple(xs), g_ys),
                                                   length=length, reverse=not reverse)
    return (None, _placed(g_init, float_carry, n_carry), _placed(g_xs, float_x, n_x),
            _placed(g_captured, float_captured, len(captured)), None, None)


def _step_cotangents(grads, carry, x, g_k, n_carry, n_x, float_carry, float_x, float_captured):
    """A backward step's state and output from the cotangents of its inputs (carry, x, captured: None for
    none): the carry's, the captured tensors' summed so far, and the x's."""
    new_g_c = tuple(zeros_or(grads[i], carry[i]) for i in float_carry)
    new_g_k = tuple(acc if grads[n_carry + n_x + i] is None else acc + grads[n_carry + n_x + i]
                    for i, acc in zip(float_captured, g_k))
    return (new_g_c, new_g_k), tuple(zeros_or(grads[n_carry + i], x[i]) for i in float_x)


def _scan_vjp_from_saved(call, g):
    """The scan's VJP reading, each step, the values and the carry the forward saved for it."""
    body, init, xs, captured, length, reverse = call.args
    n_saved = call.kwargs["n_saved"]
    n_carry, n_x = len(init), len(xs)
    n_out = len(call.out) - n_saved
    outs = body.outputs
    float_carry, float_x, float_captured = _floats(init), _floats(xs), _floats(captured)
    wanted = [i for i in range(n_out) if is_float_tensor(outs[i])]
    step_inputs = tuple(body.trace.args)
    step_backward, float_in = backward_body(body, n_saved, (step_inputs, tuple(outs[n_out:]),
                                                            tuple(outs[i] for i in wanted)), wanted, "scan_backward")
    stacked = call.out[n_out:]
    residuals, started_from = tuple(stacked[:n_saved - n_carry]), tuple(stacked[n_saved - n_carry:])
    g_wanted = tuple(zeros_or(g[i], call.out[i]) for i in wanted if i >= n_carry)  # the ys', stacked
    n_wanted_carry = sum(1 for i in wanted if i < n_carry)

    def back_step(state, step):
        g_c, g_k = state
        carry, x, r, g_y = step
        given = step_backward.inline(*carry, *x, *captured, *r, *carry, *g_c[:n_wanted_carry], *g_y)
        grads = [None] * len(step_inputs)
        for i, ct in zip(float_in, given):
            grads[i] = ct
        return _step_cotangents(grads, carry, x, g_k, n_carry, n_x, float_carry, float_x, float_captured)

    g_carry = tuple(zeros_or(g[i], call.out[i]) for i in float_carry)
    zero_k = tuple(zeros_like(captured[i]) for i in float_captured)
    (g_init, g_captured), g_xs = control_flow.scan(back_step, (g_carry, zero_k),
                                                   (started_from, tuple(xs), residuals, g_wanted),
                                                   length=length, reverse=not reverse)
    return (None, _placed(g_init, float_carry, n_carry), _placed(g_xs, float_x, n_x),
            _placed(g_captured, float_captured, len(captured)), None, None)


def _placed(values, positions, n) -> tuple:
    """values, one per position, as a tuple of n entries (None elsewhere)."""
    by_position = dict(zip(positions, values))
    return tuple(by_position.get(i) for i in range(n))


# -- forward mode: the same primitive over primals and tangents together -------------------------------------
@defjvp(prims.cond.id)
def _cond_jvp(call, tangents):
    """A cond, by the same predicate, of each branch's tangent."""
    pred, true_body, false_body, operands, true_captured, false_captured = call.args
    leaves = tuple(operands) + tuple(true_captured) + tuple(false_captured)
    t_leaves = float_tangents(leaves, per_leaf(tangents[3], operands) + per_leaf(tangents[4], true_captured)
                               + per_leaf(tangents[5], false_captured))

    def branch(body, mine: int):
        def jvp(operands, true_captured, false_captured, t_float):
            full = full_tangents(tuple(operands) + tuple(true_captured) + tuple(false_captured), t_float)
            n_ops, n_true = len(operands), len(true_captured)
            captured, t_captured = ((true_captured, full[n_ops:n_ops + n_true]) if mine == 0
                                    else (false_captured, full[n_ops + n_true:]))
            _, t_out = trace_jvp(lambda ops, cap: body.inline(*ops, *cap), (tuple(operands), tuple(captured)),
                                 (full[:n_ops], tuple(t_captured)))
            return tuple(t_out)

        jvp.__name__ = f"{body.fn_name}_jvp"
        return jvp

    t_out = control_flow.cond(pred, branch(true_body, 0), branch(false_body, 1), tuple(operands),
                              tuple(true_captured), tuple(false_captured), t_leaves)
    return output_tangents(call.out, t_out)


@defjvp(prims.scan.id)
def _scan_jvp(call, tangents):
    """A scan carrying each carry's tangent beside it and stacking each y's tangent beside it."""
    body, init, xs, captured, length, reverse = call.args
    n_carry = len(init)
    t_init = float_tangents(init, per_leaf(tangents[1], init))
    t_xs = float_tangents(xs, per_leaf(tangents[2], xs))
    t_captured = full_tangents(captured, float_tangents(captured, per_leaf(tangents[3], captured)))

    def step(state, step_xs):
        (carry, t_carry), (x, t_x) = state, step_xs
        out, t_out = trace_jvp(lambda c, x, k: body.inline(*c, *x, *k), (carry, x, tuple(captured)),
                               (full_tangents(carry, t_carry), full_tangents(x, t_x), t_captured))
        new_carry, t_ys = tuple(out[:n_carry]), t_out[n_carry:]
        return (new_carry, float_tangents(new_carry, t_out[:n_carry])), float_tangents(out[n_carry:], t_ys)

    (_, t_carry), t_ys = control_flow.scan(step, (tuple(init), t_init), (tuple(xs), t_xs), length=length,
                                           reverse=reverse)
    return (output_tangents(call.out[:n_carry], full_tangents(init, t_carry))
            + output_tangents(call.out[n_carry:], full_tangents(call.out[n_carry:], t_ys)))


@defjvp(prims.while_loop.id)
def _while_loop_jvp(call, tangents):
    """A while_loop carrying each carry's tangent beside it, stopped by the primal carry."""
    cond_body, body, init, cond_captured, body_captured = call.args
    t_captured = full_tangents(body_captured, float_tangents(body_captured, per_leaf(tangents[4], body_captured)))

    def step(state):
        carry, t_carry = state
        out, t_out = trace_jvp(lambda c, k: body.inline(*c, *k), (carry, tuple(body_captured)),
                               (full_tangents(carry, t_carry), t_captured))
        return tuple(out), float_tangents(tuple(out), t_out)

    _, t_carry = control_flow.while_loop(lambda state: cond_body.inline(*state[0], *cond_captured)[0], step,
                                         (tuple(init), float_tangents(init, per_leaf(tangents[2], init))))
    return output_tangents(call.out, full_tangents(init, t_carry))


# -- vmap: the primitive over the bodies batched, every example's carry batched at dim 0 -------------------
def _select(pred, on_true, on_false):
    """Per example, on_true's value where pred (a (batch,) bool) holds, on_false's elsewhere; all batched at 0."""
    return tuple(ltorch.where(ltorch.reshape(pred, (pred.shape[0],) + (1,) * (t.ndim - 1)), t, f)
                 for t, f in zip(on_true, on_false))


@defbatch(prims.cond.id)
def _cond_batch(call, dims):
    """Both branches batched (the operands' batch dims as they are); a predicate the same for every example
    picks one, a batched one runs both and selects each example's result, as JAX does."""
    pred, true_body, false_body, operands, true_captured, false_captured = call.args
    in_axes = (per_leaf(dims[3], operands), per_leaf(dims[4], true_captured), per_leaf(dims[5], false_captured))

    def branch(body, mine: int):
        def batched(ops, t_cap, f_cap):
            return vmap(lambda o, t, f: body.inline(*o, *(t, f)[mine]), in_axes=in_axes)(ops, t_cap, f_cap)

        batched.__name__ = f"{body.fn_name}_batched"
        return batched

    args = (tuple(operands), tuple(true_captured), tuple(false_captured))
    if dims[0] is None:
        out = control_flow.cond(pred, branch(true_body, 0), branch(false_body, 1), *args)
    else:
        out = _select(move_to_front(pred, dims[0]), branch(true_body, 0)(*args), branch(false_body, 1)(*args))
    return tuple(out), (0,) * len(out)


@defbatch(prims.scan.id)
def _scan_batch(call, dims):
    """A scan of the batched body over every example at once: the carry batched at dim 0 from the start (a
    carry the same for every example at first may not stay so), xs with time first and the batch second,
    the ys stacked with the batch at dim 1."""
    body, init, xs, captured, length, reverse = call.args
    init_dims, x_dims, k_dims = per_leaf(dims[1], init), per_leaf(dims[2], xs), per_leaf(dims[3], captured)
    batch = batch_size_of(tuple(init) + tuple(xs) + tuple(captured), init_dims + x_dims + k_dims)
    carry = tuple(batched_front(c, d, batch) for c, d in zip(init, init_dims))
    # time stays dim 0; a batched x's batch dim goes to 1, so that each step's slice has it at 0
    xs = tuple(x if d is None else ltorch.movedim(x, d, 1) for x, d in zip(xs, x_dims))
    step_axes = (tuple(0 for _ in carry), tuple(None if d is None else 0 for d in x_dims), k_dims)
    n_carry = len(init)

    def step(carry, x):
        out = vmap(lambda c, x, k: body.inline(*c, *x, *k), in_axes=step_axes)(carry, x, tuple(captured))
        return tuple(out[:n_carry]), tuple(out[n_carry:])

    carry_out, ys = control_flow.scan(step, carry, tuple(xs), length=length, reverse=reverse)
    return tuple(carry_out) + tuple(ys), (0,) * n_carry + (1,) * len(ys)


@defbatch(prims.while_loop.id)
def _while_loop_batch(call, dims):
    """As JAX: the loop runs while some example's condition holds; each step the examples whose condition
    no longer holds keep their carry."""
    cond_body, body, init, cond_captured, body_captured = call.args
    init_dims = per_leaf(dims[2], init)
    cond_dims, body_dims = per_leaf(dims[3], cond_captured), per_leaf(dims[4], body_captured)
    batch = batch_size_of(tuple(init) + tuple(cond_captured) + tuple(body_captured), init_dims + cond_dims + body_dims)
    carry = tuple(batched_front(c, d, batch) for c, d in zip(init, init_dims))
    zeros = tuple(0 for _ in carry)

    def holds(carry):
        return vmap(lambda c, k: cond_body.inline(*c, *k)[0], in_axes=(zeros, cond_dims))(carry, tuple(cond_captured))

    def step(carry):
        new = vmap(lambda c, k: body.inline(*c, *k), in_axes=(zeros, body_dims))(carry, tuple(body_captured))
        return _select(holds(carry), tuple(new), carry)

    out = control_flow.while_loop(lambda carry: ltorch.any(holds(carry)), step, carry)
    return tuple(out), (0,) * len(out)


set_underivable(prims.while_loop.id, _WHILE_LOOP)
