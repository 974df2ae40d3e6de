"""Transforms: functions from functions to functions. Each is an interpreter over a
trace plus the rule each symbol's record gives it (core/rules.py; the rules are written one
module per op family under rules/): reverse mode (autodiff.py), forward mode
(forward_mode.py), batching (vmap.py), custom_vjp, the split of a differentiated trace for
torch.autograd (autograd_split.py), and lowering onto executors (executor_lower.py).

May import: core, prims, clang and the torch language; never executors (transforms know
executors only by what they answer: lowering_for, checkers, rules) or the api (jit
reaches them through core/context.py's register_jit).
"""
from thunderfn.transforms.autodiff import grad, value_and_grad, vjp
from thunderfn.transforms.executor_lower import executor_lower

__all__ = ["executor_lower", "grad", "value_and_grad", "vjp"]
