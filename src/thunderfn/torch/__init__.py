"""The torch language: one symbol per torch operation, mirroring torch's semantics
and signature, decomposed into clang and prims.

`@torchsymbol(torch.add, torch.Tensor.add, ...)` makes a Python function a symbol
and routes every listed torch callable to it while tracing. The first callable is
the one the symbol mirrors exactly: the torch executor runs the symbol by calling
it with the recorded arguments, and forward-consistency tests compare against it.

Layout: torch/base.py holds `torchsymbol` and the symbol table; one module per family
of ops (elementwise.py, reductions.py, shape.py, ...); torch/inplace.py functionalizes
writes into tensors; torch/opaque.py runs torch functions with no symbol;
torch/dispatch.py traces one torch call, and is what core's interception calls (the
torch language hands it to core here, on import: core sits below the languages).
The torch language may import core/, prims and clang, never transforms or executors.
"""
from __future__ import annotations

from thunderfn.core import interception

# The order is deliberate, not isort's: each family registers its torch callables on import, and a later star
# import wins a name two families define.
# isort: off
from thunderfn.torch.base import register_alias, symbols, torchsymbol  # noqa: F401
from thunderfn.torch.elementwise import *  # noqa: E402,F401,F403
from thunderfn.torch.reductions import *  # noqa: E402,F401,F403
from thunderfn.torch.shape import *  # noqa: E402,F401,F403
from thunderfn.torch.factories import *  # noqa: E402,F401,F403
from thunderfn.torch.nn import *  # noqa: E402,F401,F403
from thunderfn.torch.indexing import *  # noqa: E402,F401,F403
from thunderfn.torch.linalg import *  # noqa: E402,F401,F403
from thunderfn.torch import random as _random_effects  # noqa: E402,F401  (records manual_seed & co.)
from thunderfn.torch.inplace import *  # noqa: E402,F401,F403
from thunderfn.torch import foreach as _foreach  # noqa: E402,F401  (torch._foreach_* and tensor-valued addcdiv)
from thunderfn.torch import library_queries as _library_queries  # noqa: E402,F401  (is_compiling() and isinstance helpers)
from thunderfn.torch import nn_modules as _nn_modules  # noqa: E402,F401  (nn.Module forwards that read tensor values)
from thunderfn.torch import optim as _optim  # noqa: E402,F401  (optimizer steps inside traced functions)
from thunderfn.torch import distributed as _distributed  # noqa: E402,F401  (collectives: tf.distributed)
from thunderfn.torch.statistics import *  # noqa: E402,F401,F403
from thunderfn.torch.aten_backward import *  # noqa: E402,F401,F403
from thunderfn.torch.conv_pool import *  # noqa: E402,F401,F403
from thunderfn.torch import dispatch as _dispatch  # noqa: E402
# isort: on

# Core traces every torch call it intercepts with the torch language's dispatcher (core/interception.py).
interception.set_dispatcher(_dispatch.dispatch)
