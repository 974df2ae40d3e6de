"""The rules of every primitive and torch-language symbol that has some, one module per op family.

Importing this package enters them all into core/rules.py's table. define.py says how a rule is
written (the conventions every rule follows) and holds the decorators that enter one; common.py
holds helpers the families share. Random ops have no rules here: they run as opaque torch ops,
differentiated and batched by torch.func with their draws replayed (transforms/autodiff.py,
forward_mode.py, vmap.py).
"""
from thunderfn.transforms.rules import (  # noqa: F401  (imported for the rules they enter)
    checkpoint,
    collectives,
    control_flow,
    conv_pool,
    elementwise,
    indexing,
    linalg,
    nn,
    reductions,
    shape,
    statements,
)
