"""The OpInfo database, differentiated: for every op with float64 samples, thunderfn's
reverse mode (tf.grad) must match eager torch autograd, and its reverse and forward modes
must agree with each other (<vjp(ct), t> == <ct, jvp(t)>).

Per sample (the first two float64 samples of an op): the differentiable leaves are the
floating-point tensors among the positional args (inside lists/tuples too, e.g. cat's
tensor list; never kwargs, never integer tensors). The checked function rebuilds the call
from the leaves and weights each floating output by a fixed random tensor before summing,
so a gradient that is right only for an all-ones cotangent is still caught.

Ops where thunderfn raises or is wrong are listed in KNOWN_GAPS (kept out of the
parametrization, each with its reason) rather than dropped silently.
"""
from __future__ import annotations

import zlib

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import thunderfn as tf
from thunderfn.testing.opinfos import op_db

DEVICE = torch.device("cpu")
DTYPE = torch.float64
SAMPLES_PER_OP = 2

# OpInfo name -> why it is not tested here. Each one is a thunderfn bug or limitation.
KNOWN_GAPS: dict[str, str] = {
    "digamma": "thunderfn raises UnsupportedOpError: cannot differentiate prims.digamma "
               "(its derivative is polygamma(1, x), and there is no polygamma prim)",
    # (tests/test_data_dependent.py differentiates it against torch.autograd, weighting by the output itself)
    "masked_select": "its output's length is a data-dependent size: weighting it by a tensor of the eager output's "
                     "shape is a broadcast tracing cannot decide (a ConcretizationError), and tf.vjp called with real "
                     "tensors refuses such outputs",
}

pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning",
                                        "ignore:Implicit dimension choice for:UserWarning")


def _is_float(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


OPS = [pytest.param(op, id=op.name) for op in op_db if DTYPE in op.dtypes and op.name not in KNOWN_GAPS]


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Samples are random; a seed fixed per test id makes every failure reproduce on rerun."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


class _Case:
    """One sample made differentiable: leaves, a function of them, and its output structure."""

    def __init__(self, op, sample):
        self.op, self.sample = op, sample
        self.flat_args, self.spec = tree_flatten(sample.args)
        self.leaf_pos = [i for i, a in enumerate(self.flat_args) if _is_float(a)]
        self.leaves = tuple(self.flat_args[i] for i in self.leaf_pos)
        self.out_pos = None  # set by the first (eager) float_outputs

    def call(self, *leaves):
        """op on the sample with its floating positional tensors replaced by `leaves`. The
        other tensors are cloned per call, so in-place ops do not change the sample."""
        flat = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.flat_args]
        for i, leaf in zip(self.leaf_pos, leaves):
            flat[i] = leaf
        return self.op.op(*tree_unflatten(flat, self.spec), **self.sample.kwargs)

    def float_outputs(self, *leaves):
        """The floating outputs (by their positions in the eager run: under tracing the
        outputs are proxies, not torch.Tensors)."""
        flat = tree_flatten(self.call(*leaves))[0]
        if self.out_pos is None:
            self.out_pos = [i for i, o in enumerate(flat) if _is_float(o)]
        return tuple(flat[i] for i in self.out_pos)


def _cases(op):
    """(case, None) for each usable sample of the first SAMPLES_PER_OP, or (None, why skipped)."""
    for sample in list(op.sample_inputs(DEVICE, DTYPE))[:SAMPLES_PER_OP]:
        case = _Case(op, sample)
        if not case.leaves:
            yield None, f"{sample}: no floating positional tensor"
            continue
        outs = case.float_outputs(*(leaf.clone() for leaf in case.leaves))
        if not outs:
            yield None, f"{sample}: no floating output"
            continue
        case.out_shapes = [o.shape for o in outs]
        case.out_dtypes = [o.dtype for o in outs]
        yield case, None


def _fresh(leaves, requires_grad=False):
    return tuple(leaf.detach().clone().requires_grad_(requires_grad) for leaf in leaves)


def _run_cases(op, check):
    """check(case) on every usable sample; skips (with the reasons) if none was checked."""
    skipped, checked = [], 0
    for case, why in _cases(op):
        if case is None:
            skipped.append(why)
            continue
        why = check(case)
        if why:
            skipped.append(why)
        else:
            checked += 1
    if not checked:
        pytest.skip("; ".join(skipped) or "no float64 samples")


@pytest.mark.parametrize("op", OPS)
def test_vjp_matches_torch_autograd(op):
    def check(case):
        weights = [torch.randn(s, dtype=DTYPE) for s in case.out_shapes]

        def fn(*leaves):
            return sum((o * w).sum() for o, w in zip(case.float_outputs(*leaves), weights))

        leaves = _fresh(case.leaves, requires_grad=True)
        try:
            value = fn(*leaves)
            expected = torch.autograd.grad(value, leaves, allow_unused=True)
        except Exception as e:  # noqa: BLE001 (any refusal of eager autograd skips the sample)
            return f"{case.sample}: not differentiable in eager torch autograd ({type(e).__name__}: {e})"
        expected = tuple(torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, expected))

        actual = tf.grad(fn, argnums=tuple(range(len(leaves))))(*_fresh(case.leaves))
        assert len(actual) == len(expected)
        for i, (a, e) in enumerate(zip(actual, expected)):
            torch.testing.assert_close(a, e, equal_nan=True,
                                       msg=lambda m, i=i: f"{op.name} on {case.sample}, gradient of leaf {i}:\n{m}")
        return None

    _run_cases(op, check)


@pytest.mark.parametrize("op", OPS)
def test_vjp_jvp_inner_product_identity(op):
    def check(case):
        # Conversions (x.half(), x.to(torch.bfloat16)) round: tangents exactly representable in
        # the narrowest output dtype make both sides exact; products are summed in float64.
        narrowest = min(case.out_dtypes, key=lambda d: torch.finfo(d).bits)
        tangents = tuple(torch.randn_like(leaf).to(narrowest).to(leaf.dtype) for leaf in case.leaves)
        cotangents = tuple(torch.randn(s, dtype=DTYPE).to(d) for s, d in zip(case.out_shapes, case.out_dtypes))

        _, vjp_fn = tf.vjp(case.float_outputs, *_fresh(case.leaves))
        vjps = vjp_fn(cotangents)
        _, jvp_out = tf.jvp(case.float_outputs, _fresh(case.leaves), tangents)

        lhs = sum((v.to(DTYPE) * t.to(DTYPE)).sum() for v, t in zip(vjps, tangents))
        rhs = sum((c.to(DTYPE) * j.to(DTYPE)).sum() for c, j in zip(cotangents, jvp_out))
        torch.testing.assert_close(lhs, rhs, equal_nan=True,
                                   msg=lambda m: f"{op.name} on {case.sample}: <vjp(ct), t> != <ct, jvp(t)>:\n{m}")
        return None

    _run_cases(op, check)


def test_known_gaps_name_float64_opinfos():
    """A KNOWN_GAPS entry for a renamed or removed OpInfo would hide nothing; catch it."""
    names = {op.name for op in op_db if DTYPE in op.dtypes}
    assert set(KNOWN_GAPS) <= names, f"stale KNOWN_GAPS entries: {sorted(set(KNOWN_GAPS) - names)}"
