"""Run one OpInfo's checks outside the test suite: what tests/test_ops.py does for every
op in the database, for an op you are adding (see docs/extending.md)."""
from __future__ import annotations

import re

import torch

import thunderfn as tf
from thunderfn.testing.opinfo import OpInfo


def check_opinfo(op: OpInfo, device="cpu") -> dict:
    """Every sample of every dtype must match `op.ref` under `tf.jit` (the torch executor)
    and through the decomposition into prims (unless skipped); every error input must
    raise its exception with its message. Raises AssertionError; returns the counts."""
    device = torch.device(device)
    runs = {"jit (torch executor)": tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs))}
    if not op.skip_decomposition:
        runs["jit (decomposition)"] = tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs),
                                             executors=["torch_prims"], fallback=False)
    samples = errors = 0
    for dtype in op.dtypes:
        atol, rtol = op.dtype_tolerances.get(dtype, (op.atol, op.rtol))
        for sample in op.sample_inputs(device, dtype):
            expected = op.ref(*sample.args, **sample.kwargs)
            for how, fn in runs.items():
                torch.testing.assert_close(fn(*sample.args, **sample.kwargs), expected, equal_nan=True, atol=atol,
                                           rtol=rtol, msg=lambda m, s=sample, h=how: f"{op.name} on {s}, {h}:\n{m}")
            samples += 1
    for error in (op.error_inputs(device) if op.error_inputs is not None else ()):
        for how, fn in runs.items():
            try:
                fn(*error.sample.args, **error.sample.kwargs)
            except error.exc_type as e:
                assert re.search(error.match, str(e)), (
                    f"{op.name} on {error.sample}, {how}: message {str(e)!r} does not match {error.match!r}")
            else:
                raise AssertionError(f"{op.name} on {error.sample}, {how}: expected {error.exc_type.__name__}")
        errors += 1
    return {"samples": samples, "error_inputs": errors}
