"""Transforms: functions from functions to functions. Each is an interpreter over a
trace plus a rule table keyed by symbol."""
from thunderfn.transforms.autodiff import grad, value_and_grad, vjp
from thunderfn.transforms.executor_lower import executor_lower

__all__ = ["executor_lower", "grad", "value_and_grad", "vjp"]
