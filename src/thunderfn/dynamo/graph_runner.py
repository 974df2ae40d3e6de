"""Running a Dynamo FX graph under a thunderfn trace, node by node.

thunderfn compiles each graph Dynamo hands the backend by tracing a function that interprets
the graph (`graph_function`): every `call_function`/`call_method` node makes the torch call
the user's code made, which the trace records as it records user code (the same rules, the
same executors), so nothing is translated twice. What Dynamo adds that user code never calls,
its higher-order operators (a subgraph and how to run it), is the rule table below, keyed by
the operator's name:

- `wrap`, `invoke_subgraph`: the subgraph, inlined;
- `tag_activation_checkpoint` (torch.utils.checkpoint): the subgraph as a checkpoint region saving
  nothing (torch/checkpoint.py), computed again in the backward as eager's;
- `autograd_function_apply` (a user's torch.autograd.Function): a Function whose forward
  runs the forward subgraph and whose backward runs the backward subgraph, traced by
  transforms/user_functions.py as any Function is (the backward subgraph is the VJP rule);
- `cond`, `while_loop`, `scan` and `map_impl` (torch.cond and torch._higher_order_ops' loops): tf.cond,
  tf.while_loop and tf.scan of the subgraphs, the control-flow primitives user code reaches, so a
  predicate or trip count known only when the graph runs is one statement of the trace.

Any other higher-order operator raises UnsupportedHigherOrderOp: the splitter (dynamo/splitting.py)
runs that node outside thunderfn.

The api layer: the torch.compile backend's machinery. It never imports torch._dynamo.
"""
from __future__ import annotations

import inspect

import torch
import torch.fx
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
from torch.fx.immutable_collections import immutable_dict, immutable_list

from thunderfn.core import context
from thunderfn.errors import UnsupportedOpError
from thunderfn.torch import control_flow
from thunderfn.torch.checkpoint import checkpoint_region


class UnsupportedHigherOrderOp(UnsupportedOpError):
    """A Dynamo higher-order operator thunderfn does not trace (the node runs eagerly)."""

    def __init__(self, name: str, why: str = "thunderfn has no rule for it"):
        self.op_name = name
        super().__init__(f"torch.ops.higher_order.{name}: {why}")


class GraphInterpreter(torch.fx.Interpreter):
    """Runs a GraphModule's nodes in order; torch calls on traced tensors are recorded by the
    trace being built. `stand_in(node, error, env)`, when given, is called for a node that raised,
    and its result takes the node's place (the support check: dynamo/splitting.py)."""

    def __init__(self, gm: torch.fx.GraphModule, stand_in=None):
        super().__init__(gm, garbage_collect_values=True)
        self.stand_in = stand_in

    def run(self, *args, **kwargs):
        # The graph switches grad mode and autocast with calls, not with-blocks: where tracing it
        # fails half way, the caller's modes come back here.
        grad_mode = torch.is_grad_enabled()
        self.autocasts = []
        try:
            return super().run(*args, **kwargs)
        except BaseException:
            while self.autocasts:
                self.autocasts.pop().__exit__(None, None, None)
            torch._C._set_grad_enabled(grad_mode)
            raise

    def run_node(self, n):
        if self.stand_in is None or n.op in ("placeholder", "output"):
            return super().run_node(n)
        try:
            return super().run_node(n)
        except Exception as e:  # noqa: BLE001  (any failure makes the node unsupported; stand_in records why)
            return self.stand_in(n, e, self.env)

    def fetch_args_kwargs_from_env(self, n):
        # FX hands a node's list and dict arguments over as its immutable_list/immutable_dict, types a
        # trace would keep as opaque constants (torch.cat([a, b]) would hold the list, not a and b;
        # torch.cat([a real tensor, a traced one]) would not lift the real one as a constant)
        args, kwargs = super().fetch_args_kwargs_from_env(n)
        return _as_plain(args), _as_plain(kwargs)

    def call_function(self, target, args, kwargs):
        if isinstance(target, torch._ops.HigherOrderOperator):
            rule = HIGHER_ORDER_RULES.get(target.name())
            if rule is None:
                raise UnsupportedHigherOrderOp(target.name())
            return rule(*args, **kwargs)
        out = target(*args, **kwargs)
        if target is _enter_autocast:
            self.autocasts.append(out)
        elif target is _exit_autocast and self.autocasts and self.autocasts[-1] is args[0]:
            self.autocasts.pop()
        return out


def _as_plain(value):
    """value with FX's immutable lists and dicts (at any depth of lists, tuples and dicts) as plain ones."""
    if type(value) in (list, immutable_list):
        return [_as_plain(v) for v in value]
    if type(value) is tuple:
        return tuple(_as_plain(v) for v in value)
    if type(value) in (dict, immutable_dict):
        return {k: _as_plain(v) for k, v in value.items()}
    return value


def run_graph(gm: torch.fx.GraphModule, args) -> object:
    return GraphInterpreter(gm).run(*args, enable_io_processing=False)


def graph_function(gm: torch.fx.GraphModule):
    """The function tf.jit compiles for a graph: traced, it interprets the graph's nodes; called
    on tensors outside a trace (tf.jit runs a call eagerly past its cache_size_limit), it is
    the graph's own forward."""
    forward = gm.forward

    def graph(*args):
        if context.current_trace() is None:
            return forward(*args)
        return run_graph(gm, args)

    graph.__name__ = graph.__qualname__ = "dynamo_graph"
    graph.__signature__ = inspect.signature(forward)  # a fixed arity: jit's fast path for it
    return graph


# -- the higher-order operators' rules -----------------------------------------------------------------

def _inline(body, *args, **_options):
    return run_graph(body, args)


def _invoke_subgraph(body, _identifier, *args):
    return run_graph(body, args)


def _graph_of(gm, *extra):
    """The subgraph as a function of its leading arguments, `extra` passed after them."""
    def run(*leading):
        return run_graph(gm, (*leading, *extra))
    run.__name__ = gm.__class__.__name__
    return run


def _cond(pred, true_fn, false_fn, operands, *additional):
    return control_flow.cond(pred, _graph_of(true_fn, *additional), _graph_of(false_fn, *additional), *operands)


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _while_loop(cond_fn, body_fn, carried_inputs, additional_inputs=()):
    def holds(carry):
        return _as_tuple(run_graph(cond_fn, (*carry, *additional_inputs)))[0]

    def step(carry):
        return _as_tuple(run_graph(body_fn, (*carry, *additional_inputs)))

    return control_flow.while_loop(holds, step, tuple(carried_inputs))


def _scan(combine_fn, init, xs, additional_inputs=()):
    n_carry = len(init)

    def step(carry, x):
        out = _as_tuple(run_graph(combine_fn, (*carry, *x, *additional_inputs)))
        return out[:n_carry], out[n_carry:]

    carry, ys = control_flow.scan(step, tuple(init), tuple(xs))
    return [*carry, *ys]


def _map(body, xs, pos_args):
    return control_flow.scan(lambda carry, x: (carry, run_graph(body, (*x, *pos_args))), (), tuple(xs))[1]


def _checkpoint(body, *args, **_options):
    return checkpoint_region(_graph_of(body), *args)


def _autograd_function_apply(fwd, bwd, *args, non_differentiable_idx=(), saved_for_backward_idx=(), dirty_idx=(),
                             **_options):
    """A user's torch.autograd.Function as Dynamo captured it: fwd(*args) returns (outputs, saved
    values); bwd(*grads, *saved values) returns one gradient per argument."""
    if dirty_idx:
        raise UnsupportedHigherOrderOp("autograd_function_apply", "the Function writes into its inputs "
                                                                  "(ctx.mark_dirty)")
    non_differentiable = set(non_differentiable_idx)

    class CapturedFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            output, saved = run_graph(fwd, inputs)
            ctx.saved_values = tuple(saved)  # a residual, as any attribute set on ctx
            if non_differentiable:
                outputs = output if isinstance(output, (tuple, list)) else (output,)
                ctx.mark_non_differentiable(*(o for i, o in enumerate(outputs) if i in non_differentiable))
            return output

        @staticmethod
        def backward(ctx, *grads):
            return tuple(run_graph(bwd, (*grads, *ctx.saved_values)))

    CapturedFunction.__name__ = CapturedFunction.__qualname__ = f"autograd_function_{fwd.__class__.__name__}"
    return CapturedFunction.apply(*args)


HIGHER_ORDER_RULES = {
    "wrap": _inline,
    "tag_activation_checkpoint": _checkpoint,
    "invoke_subgraph": _invoke_subgraph,
    "autograd_function_apply": _autograd_function_apply,
    "cond": _cond,
    "map_impl": _map,
    "while_loop": _while_loop,
    "scan": _scan,
}
