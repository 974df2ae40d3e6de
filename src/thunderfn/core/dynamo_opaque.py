"""Compiled functions are opaque to torch.compile (Dynamo).

`torch.compile(tf.jit(f))`, or a torch.compile'd function that calls one, runs the jitted
function as one call, with a graph break around it, the way it runs a function wrapped in
`torch.compiler.disable`. Dynamo must neither inline it (it would trace thunderfn's own
machinery and the generated code, which it cannot) nor evaluate the frames it runs.

Both are said without importing torch._dynamo, which costs seconds and which `import
thunderfn` must not load: the `_torchdynamo_disable` attribute is what Dynamo checks before
inlining a callee (what torch.compiler.disable sets), and the code object is marked, through
torch's C extension, to run its frame and every frame it calls without Dynamo (what
torch.compiler.disable's wrapper does with set_eval_frame).
"""
from __future__ import annotations

try:  # torch's C switch for Dynamo's frame evaluation (torch 2.6 and later)
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    _SKIP_RECURSIVELY = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
except (ImportError, AttributeError):  # an older torch: inlining is still refused, by the attribute
    set_code_exec_strategy = _SKIP_RECURSIVELY = None

REASON = "thunderfn compiles this function itself (tf.jit): torch.compile runs it as one call"


def opaque_to_dynamo(fn, codes=()):
    """Mark `fn` (a function, or a method's function) and the code objects in `codes` (those its
    call runs first, where they are not fn's own) opaque to Dynamo; returns fn."""
    target = getattr(fn, "__func__", fn)
    target._torchdynamo_disable = True
    target._torchdynamo_disable_msg = REASON
    if _SKIP_RECURSIVELY is not None:
        for code in (getattr(target, "__code__", None), *codes):
            if code is not None:
                set_code_exec_strategy(code, _SKIP_RECURSIVELY)
    return fn
