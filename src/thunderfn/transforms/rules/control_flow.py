"""Rules of the control-flow family: cond, scan and while_loop (prims_control_flow.py).

They have no derivative or batching rule yet: reverse mode, forward mode and vmap refuse them by
name, saying why (below), rather than differentiate or batch them wrongly. A jitted function whose
inputs require grad still trains through them: torch.autograd differentiates the bodies as they run,
as it differentiates eager code.
"""
from __future__ import annotations

from thunderfn import prims, prims_control_flow  # noqa: F401  (makes prims.cond, scan, while_loop)
from thunderfn.core.rules import set_underivable

_NOT_YET = ("transforms do not reach into its bodies yet; differentiate a tf.jit-ted function with .backward() "
            "(torch.autograd runs through the bodies), or write the loop or branch in Python")

for _prim in (prims.cond, prims.scan, prims.while_loop):
    set_underivable(_prim.id, _NOT_YET)
