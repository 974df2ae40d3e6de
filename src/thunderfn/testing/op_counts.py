"""Counting what a step asks the dispatcher for: the aten ops torch.profiler records, each counted where
Python code or torch.autograd called it (an aten op's own calls inside it are not counted). The CPU
analogue of kernel launches, used by tests and benchmarks/bench_models.py to hold a jitted step to no
more ops than eager's. `kernel_counts` counts the matrix multiplies and copies a step runs wherever
they are called from (addmm copies its bias into the output, contiguous() inside a kernel copies), to
hold a jitted step to eager's operand layouts."""
from __future__ import annotations

import collections

import torch


def top_level_aten_ops(fn) -> collections.Counter:
    """{aten op name: how many times} over one call of fn(), counting each op no aten op called."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    counts = collections.Counter()
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            counts[event.name] += 1
    return counts


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
# every copy, wherever it comes from (clone, contiguous, reshape of a non-viewable tensor, .to), ends in copy_
COPY_OPS = ("aten::copy_",)


def kernel_counts(fn) -> dict:
    """{"matmul": n, "copy": n}: the matrix multiplies and copies one call of fn() runs, nested calls included
    (a copy that a kernel makes of an operand whose layout it cannot take counts as well)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = collections.Counter(event.name for event in prof.events())
    return {"matmul": sum(names[n] for n in MATMUL_OPS), "copy": sum(names[n] for n in COPY_OPS)}
