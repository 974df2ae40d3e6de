"""jit's compile pipeline (thunderfn/compile_stages.py): named stages run in order, each adding its traces,
ending in the function a cache entry runs; the same traces tf.last_traces shows."""
from __future__ import annotations

import gc
import re

import pytest
import torch

import thunderfn as tf
from thunderfn import compile_stages
from thunderfn.errors import UnsupportedOpError
from thunderfn.jit_options import JitOptions
from thunderfn.transforms.ddp import DataParallel

STAGE_NAMES = ["trace", "optimize", "split", "rematerialize", "distribute", "lower", "generate"]


def _made_by(trc) -> str:
    return re.sub(r" \(took .*", "", str(trc).splitlines()[0])


def _begin(fn, *args, **options):
    return compile_stages.begin(fn, fn.__name__, args, {}, JitOptions(**options))


def test_the_stages_are_the_pipeline_architecture_md_lists_in_order():
    assert [stage.__name__ for stage in compile_stages.STAGES] == STAGE_NAMES
    with open("docs/architecture.md") as doc:
        listed = re.findall(r"^\d\. \*\*(\w+)\*\*", doc.read(), flags=re.MULTILINE)
    assert listed == STAGE_NAMES


def test_each_stage_adds_its_traces_and_the_result_computes_and_differentiates_like_eager():
    def f(x, w):
        return torch.sin(x @ w) * 2

    x, w = torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)
    c = _begin(f, x, w)
    made = {}
    for stage in compile_stages.STAGES:
        before = (len(c.traces), len(c.backward))
        c = stage(c)
        made[stage.__name__] = ([_made_by(t) for t in c.traces[before[0]:]],
                                [_made_by(t) for t in c.backward[before[1]:]])
    assert made["trace"] == (["# Constructed by Tracing"], [])
    assert made["optimize"] == (["# Constructed by Dead Code Elimination",
                                 "# Constructed by Common Subexpression Elimination"], [])
    assert made["split"] == (["# Constructed by Forward and backward split"],
                             ["# Constructed by Forward and backward split"])
    assert made["rematerialize"] == made["distribute"] == made["generate"] == ([], [])  # (no fusion executor)
    assert made["lower"][0][:2] == ["# Constructed by Common Subexpression Elimination",
                                    "# Constructed by Transform for execution"]
    assert made["lower"][1][-1] == made["lower"][0][-1] == "# Constructed by Delete Last Used"
    assert c.tried_split and c.why_no_backward is None

    # the same traces a jitted call keeps
    jitted = tf.jit(f)
    out = jitted(x, w)
    assert [_made_by(t) for t in tf.last_traces(jitted)] == [_made_by(t) for t in c.traces]
    assert [_made_by(t) for t in tf.last_backward_traces(jitted)] == [_made_by(t) for t in c.backward]
    got = c.compiled(x, w)  # (an entry is called with the call's tensors)
    torch.testing.assert_close(got, f(x, w))
    torch.testing.assert_close(out, f(x, w))
    (grad,) = torch.autograd.grad(got.sum(), w)
    torch.testing.assert_close(grad, torch.autograd.grad(f(x, w).sum(), w)[0])


def test_without_grad_there_is_no_split_and_lowering_writes_in_place():
    c = _begin(lambda x: (x * 2 + 1).sin(), torch.randn(4))
    with torch.no_grad():
        c = compile_stages.run(c)
    assert c.split is None and not c.tried_split and c.backward == []
    assert "# Constructed by Reuse dead buffers" in [_made_by(t) for t in c.traces]


def test_the_distribute_stage_refuses_a_distributed_function_torch_must_differentiate():
    """ddp synchronizes gradients in thunderfn's backward: a function with none is refused, saying why,
    before anything is lowered."""
    def writes_into_x(x):
        x.add_(1)  # into an input that requires grad: torch's autograd wiring is kept, no split
        return x * 2

    config = DataParallel(group_id=0, world_size=1, bucket_bytes=1, n_params=1)
    c = _begin(writes_into_x, torch.randn(3, requires_grad=True) * 1, distributed=config)
    for stage in compile_stages.STAGES[:compile_stages.STAGES.index(compile_stages.distribute)]:
        c = stage(c)
    assert c.split is None and c.tried_split
    with pytest.raises(UnsupportedOpError, match="'writes_into_x' has none: it writes into an input or captured "
                                                 "tensor that requires grad. For data parallelism, wrap"):
        compile_stages.distribute(c)
    assert c.forward_lowered is None


def test_the_cyclic_collector_is_paused_while_compiling_and_back_as_it_was_after():
    seen = []

    def f(x):
        seen.append(gc.isenabled())  # read while tracing
        return x.sin()

    assert gc.isenabled()
    tf.jit(f)(torch.randn(3))
    assert seen == [False] and gc.isenabled()

    def fails(x):
        raise ValueError("not traceable")

    with pytest.raises(ValueError):
        tf.jit(fails)(torch.randn(3))
    assert gc.isenabled()
    gc.disable()
    try:
        tf.jit(lambda x: x.cos())(torch.randn(3))
        assert not gc.isenabled()  # the caller's choice is kept
    finally:
        gc.enable()
