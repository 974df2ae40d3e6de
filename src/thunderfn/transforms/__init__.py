"""Transforms: functions from functions to functions. Each is an interpreter over a
trace plus a rule table keyed by symbol: reverse mode (autodiff.py with vjp_rules.py,
vjp_rules_torch.py and vjp_rules_conv_pool.py), forward mode (forward_mode.py with jvp_rules.py), batching (vmap.py
with batching_rules.py), custom_vjp, the split of a differentiated trace for
torch.autograd (autograd_split.py), and lowering onto executors (executor_lower.py).

May import: core, prims, clang and the torch language; never executors (transforms know
executors only by what they answer: lowering_for, checkers, rules) or the api (jit
reaches them through core/context.py's register_jit).
"""
from thunderfn.transforms.autodiff import grad, value_and_grad, vjp
from thunderfn.transforms.executor_lower import executor_lower

__all__ = ["executor_lower", "grad", "value_and_grad", "vjp"]
