"""A body differentiated with residuals, for the rules of the primitives that call bodies (checkpoint, scan).

Reverse mode through such a primitive runs, in the forward, the body as differentiated, returning besides its
outputs some of the values its backward reads (the residuals a checkpoint's policy saves, or all of them for
each step of a scan), and in the backward a body that takes those values instead of computing them:
- `saving_forward(body, flat, saves, kind)`: the body differentiated once on stand-ins; its forward (the
  decomposition the backward reads) returning its outputs, then the residuals `saves` approves;
- `backward_body(body, n_saved, operands, wanted, kind)`: a body of (inputs, saved values, the wanted
  outputs' cotangents) -> the float inputs' cotangents, which records the forward again on the inputs, drops
  the statements of the saved values (reading them instead) and every random draw (drawn again, it would
  differ), and runs the VJP;
- `draws(bsym)`: whether computing bsym again could give another value, so that it must be saved.
"""
from __future__ import annotations

from thunderfn.core import context
from thunderfn.core.bodies import Body, renamed, trace_body
from thunderfn.core.passes import dce
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_flatten
from thunderfn.core.trace import Trace
from thunderfn.core.tracer import tracing
from thunderfn.transforms.rules.common import is_float_tensor, zeros_like
from thunderfn.transforms.rules.define import trace_vjp


def _calls(bsym):
    yield bsym
    for sub in bsym.subsymbols:
        yield from _calls(sub)


def draws(bsym) -> bool:
    """Whether computing bsym again could give another value: a random draw, a read of the generator's
    state, anything kept for its effect."""
    return any(b.sym.tags & {"random", "no_dce"} for b in _calls(bsym))


def saving_forward(body: Body, flat: list, saves, kind: str) -> tuple[Body, list] | None:
    """(the body's forward returning its outputs then the residuals `saves(bsym)` approves of those its
    backward reads, those residuals), None where it approves none. `flat`: examples of the body's inputs."""
    scratch = Trace(body.fn_name, names=context.current_trace().names)
    with tracing(scratch):
        scratch.args = [TensorProxy.like(x) for x in flat]
        out, backward = trace_vjp(lambda *xs: body.inline(*xs), scratch.args)
        n_forward = len(scratch.bound_symbols)
        backward(tuple(TensorProxy.like(o) if is_float_tensor(o) else None for o in out))
    forward, backward_part = scratch.bound_symbols[:n_forward], scratch.bound_symbols[n_forward:]
    made = {o.name: b for b in forward for o in b.proxy_outs()}
    read = {p.name: p for b in backward_part for p in b.proxy_args() if p.name in made}
    saved = [p for name, p in read.items() if saves(made[name])]
    if not saved:
        return None
    scratch.bound_symbols = forward
    scratch.output = tuple(out) + tuple(saved)
    saving = Body(f"{kind}_{body.__name__}", body.fn_name, dce(scratch), body.n_operands, body.captured,
                  tree_flatten(scratch.output)[1])
    return saving, saved


def backward_body(body: Body, n_saved: int, operands: tuple, wanted: list, kind: str) -> tuple[Body, list]:
    """(the backward's body, the positions of the float inputs whose cotangents it returns, in order).
    `operands`: (the body's inputs, its last n_saved outputs as the forward saved them, the cotangents of its
    outputs at the positions `wanted`), examples of what the backward's body is called with."""
    n_out = len(body.outputs)
    float_in = [i for i, x in enumerate(operands[0]) if is_float_tensor(x)]
    env, made = {}, {}

    def recompute_and_backward(inputs, saved, cts):
        tracer = context.current_tracer()
        out, backward = trace_vjp(lambda *xs: body.inline(*xs, env=env), tuple(inputs))
        made["forward"] = {id(b) for b in tracer.trace.bound_symbols}
        made["saved"] = {env[s.name].name: given for s, given in zip(body.outputs[n_out - n_saved:], saved)}
        full = [None] * n_out
        for i, c in zip(wanted, cts):
            full[i] = c
        grads = backward(tuple(full))
        return tuple(grads[i] if grads[i] is not None else zeros_like(inputs[i]) for i in float_in)

    recompute_and_backward.__name__ = f"{body.fn_name}_backward"
    backward = trace_body(recompute_and_backward, operands, kind)
    _taking_saved(backward, made["saved"], made["forward"])
    return backward, float_in


def _taking_saved(backward: Body, saved: dict, forward: set) -> None:
    """backward's trace reading the saved values it was given where it computed them again: their
    statements (and every random draw of the forward it ran again) dropped."""
    trc = backward.trace
    # Walked from the end: a statement of the forward run again is dropped where each of its outputs is saved or
    # read by nothing kept after it (layer_norm's mean and rstd saved and its normalized output read only by a
    # view that is saved too: run again, it would only overwrite the saved values), and every random draw.
    live = {o.name for o in trc.output if isinstance(o, TensorProxy)}
    kept = []
    for bsym in reversed(trc.bound_symbols):
        outs = bsym.proxy_outs()
        if id(bsym) in forward and (draws(bsym) or all(o.name in saved or o.name not in live for o in outs)):
            continue
        live.update(p.name for p in bsym.proxy_args())
        kept.append(renamed(bsym, saved) if any(p.name in saved for p in bsym.proxy_args()) else bsym)
    kept.reverse()
    trc.bound_symbols = kept
    trc.output = tuple(saved.get(o.name, o) if isinstance(o, TensorProxy) else o for o in trc.output)
    backward.trace = dce(trc)
