"""thunderfn: JAX-style function transformations for PyTorch programs.

    import thunderfn as tf
    fast = tf.jit(fn)            # trace, lower onto executors, cache
    tf.last_traces(fast)[-1]     # the Python that runs

The api layer, on top of everything (docs/architecture.md draws the layers); nothing
in the package imports it.
"""
import importlib

# The import order is the layers' order, on which registration at import depends (see below): not isort's.
# isort: off
from thunderfn import clang, errors, prims  # noqa: F401  (the languages)
from thunderfn import torch  # noqa: F401  (the torch language: tf.torch.mul, ...)
# The layers in order (docs/architecture.md). Transforms come before executors:
# the built-in kernel executors register vjp= pairs on import, which become custom_vjp functions
# (core/context.py).
from thunderfn.transforms.custom_vjp import custom_vjp
from thunderfn.transforms.custom_jvp import custom_jvp
# torch.autograd.Function and custom ops with register_autograd keep their backward when traced
from thunderfn.transforms import user_functions  # noqa: F401
from thunderfn import executors  # noqa: F401
from thunderfn import extend  # noqa: F401  (the executor API under Thunder's name)
from thunderfn import distributed  # noqa: F401  (tf.distributed: ddp on torch.distributed)
from thunderfn import dynamo  # noqa: F401  (tf.dynamo: the torch.compile backend)
from thunderfn import debug  # noqa: F401  (tf.debug.print, tf.debug.breakpoint: values at run time)
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import register_pytree_node
from thunderfn.core.symbol import BoundSymbol, Symbol
from thunderfn.core.trace import Trace, eval_shape, trace
from thunderfn.errors import (ConcretizationError, EscapedProxyError, ThunderFnError, UnsupportedOpError,
                              UserGradientError)
from thunderfn.dynamic_shapes import mark_dynamic, mark_static
from thunderfn.examine import Examination, examine
from thunderfn.jit import cache_info, jit, last_backward_traces, last_traces
from thunderfn.module import functional_call, stack_module_state
from thunderfn.blocks import nested_compile_region
from thunderfn.transforms import executor_lower
from thunderfn.transforms.autodiff import grad, value_and_grad, vjp
from thunderfn.transforms.forward_mode import jvp
from thunderfn.transforms.linearize import linearize
from thunderfn.transforms.vmap import vmap
from thunderfn.torch import checkpoint_policies
from thunderfn.torch.checkpoint import checkpoint, checkpoint_name
from thunderfn.torch.control_flow import cond, fori_loop, scan, while_loop
from thunderfn.transforms.jacobians import hessian, jacfwd, jacrev
from thunderfn.visualize import visualize
from thunderfn.profile import profile
# isort: on

__version__ = "0.1.0"  # the one place it is written: pyproject.toml reads it from here


def __getattr__(name):
    # tf.testing (check_grads, the strategies, the OpInfo database) sits above the api and imports
    # it, so it is loaded when first asked for rather than by `import thunderfn`
    if name == "testing":
        return importlib.import_module("thunderfn.testing")
    raise AttributeError(f"module 'thunderfn' has no attribute {name!r}")

__all__ = [
    "jit", "grad", "value_and_grad", "vjp", "jvp", "vmap", "jacrev", "jacfwd", "hessian", "custom_vjp", "custom_jvp",
    "trace", "last_traces", "last_backward_traces", "cache_info", "visualize", "profile", "mark_dynamic", "mark_static",
    "examine", "Examination", "functional_call", "executor_lower", "Trace", "Symbol", "BoundSymbol", "TensorProxy",
    "register_pytree_node", "ThunderFnError", "ConcretizationError", "UnsupportedOpError", "EscapedProxyError",
    "UserGradientError", "prims", "clang", "torch", "executors", "errors", "dynamo", "debug", "testing",
    "cond", "scan", "while_loop", "fori_loop", "checkpoint", "checkpoint_name", "checkpoint_policies",
    "linearize", "eval_shape", "stack_module_state", "nested_compile_region",
]
