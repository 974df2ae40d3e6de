"""The prims' JVP rules: each rule, run eagerly on real tensors and traced through jit (which checks the
prims' metas), against torch.func.jvp through the prim's own torch implementation. The cases
are the VJP rules' (tests/test_vjp_rules.py), plus a few that only forward mode needs."""

import pytest
import torch
from torch.func import jvp

import thunderfn
from test_vjp_rules import CASES as VJP_CASES
from test_vjp_rules import F64, _is_float_tensor, _leaves, _map, randn, t
from thunderfn import prims
from thunderfn.core.rules import TAG_NOT_DIFFERENTIABLE, RecordedCall, rules, rules_of
from thunderfn.prims import PrimIDs

CASES = [pytest.param(*c.values[:3], id=c.id) for c in VJP_CASES]


def case(id, pid, *args, **kwargs):
    CASES.append(pytest.param(pid, args, kwargs, id=id))


case("nextafter-ties", PrimIDs.NEXTAFTER, t([1.0, 2.0, 3.0, -1.0]), t([1.0, 0.0, 3.0, 2.0]))
case("nextafter-ties-0d", PrimIDs.NEXTAFTER, t([1.0, 2.0]), t(1.0))
case("where-float32-into-float32", PrimIDs.WHERE, randn(3) > 0, randn(3).float(), 1.0)
case("cumprod-zeros-dim-0", PrimIDs.CUMPROD, t([[0.0, 1.0], [2.0, 0.0], [0.0, 3.0], [1.5, -2.0]]), 0)
case("cumprod-3d-middle", PrimIDs.CUMPROD, randn(2, 4, 3), 1)
case("amin-ties-0d", PrimIDs.AMIN, t(2.0), ())
case("topk-0d", PrimIDs.TOPK, randn(), 1, 0, True, True)
case("cat-one-of-two", PrimIDs.CAT, [randn(2, 3), torch.zeros(1, 3, dtype=F64)], 0)
case("scatter_add-dim-0", PrimIDs.SCATTER_ADD, randn(4, 3), torch.tensor([[0, 1, 3], [0, 0, 1]]), randn(2, 3), 0)
case("matmul-broadcast-both", PrimIDs.MATMUL, randn(2, 1, 3, 4), randn(3, 4, 2))
case("var-no-dims", PrimIDs.VAR, randn(3, 4), (), correction=0)
case("pad-0d", PrimIDs.PAD, randn(), 0.0, ())

CASES = [c for c in CASES if any(map(_is_float_tensor, _leaves(c.values[1])))]  # no float input: no tangent


# -- which arguments get a tangent: all of them, and each alone where there are several -------
def _subsets(args):
    n = sum(map(_is_float_tensor, _leaves(args)))
    return [None] + (list(range(n)) if n > 1 else [])


PARAMS = [pytest.param(*c.values, only, id=f"{c.id}-{'all' if only is None else f'only-{only}'}")
          for c in CASES for only in _subsets(c.values[1])]


# -- the check -----------------------------------------------------------------------------
def _split(args):
    """The float tensors in args, and a function that puts replacements back in their places."""
    leaves = [x for x in _leaves(args) if _is_float_tensor(x)]

    def rebuild(new, others_as_none=False):
        it = iter(new)
        return _map(lambda x: next(it) if _is_float_tensor(x) else None if others_as_none else x, args)

    return leaves, rebuild


def _tangents(args, only, gen):
    """Random tangents for the float tensors of args (None for the others, and for all but
    `only` when only is given), laid out like args."""
    positions = iter(range(len(_leaves(args))))

    def tangent(x):
        if not _is_float_tensor(x):
            return None
        i = next(positions)
        return torch.randn(x.shape, generator=gen, dtype=x.dtype) if only in (None, i) else None

    return _map(tangent, args)


def _run_rule(pid, args, kwargs, tangents):
    prim = getattr(prims, pid.name.lower())
    tangents = tuple(tuple(x) if isinstance(x, list) else x for x in tangents)
    return rules_of(pid).jvp.fwd(RecordedCall(prim, tuple(args), dict(kwargs), prim(*args, **kwargs)), tangents)


def _expected(pid, args, kwargs, tangents):
    """torch.func.jvp through the prim (which computes eagerly with executors.torch_executor.prim_impls,
    numbers on either side included); a None tangent is a zero one."""
    primals, rebuild = _split(args)
    tans = [torch.zeros_like(p) if x is None else x for p, x in
            zip(primals, [x for x, a in zip(_leaves(tangents), _leaves(args)) if _is_float_tensor(a)])]
    return jvp(lambda *ps: getattr(prims, pid.name.lower())(*rebuild(ps), **kwargs), tuple(primals), tuple(tans))


def _assert_tangent(got, expected_out, expected_tangent, where):
    outs, tans = ((expected_out, expected_tangent) if isinstance(expected_out, tuple)
                  else ((expected_out,), (expected_tangent,)))
    if isinstance(expected_out, tuple):
        assert isinstance(got,
                          tuple) and len(got) == len(outs), f"{where}: expected one tangent per output, got {got!r}"
    else:
        got = (got,)
    for i, (g, o, e) in enumerate(zip(got, outs, tans)):
        if not o.dtype.is_floating_point:
            assert g is None, f"{where}: output {i} is not floating point, so its tangent must be None"
            continue
        if g is None:
            assert torch.all(e == 0), f"{where}: output {i} got None, but torch's tangent is {e}"
            continue
        assert g.shape == o.shape and g.dtype == o.dtype, \
            f"{where}: output {i}: tangent {tuple(g.shape)} {g.dtype}, output {tuple(o.shape)} {o.dtype}"
        torch.testing.assert_close(g, e.to(g.dtype), equal_nan=True, msg=lambda m: f"{where}: output {i}: {m}")


@pytest.mark.parametrize("pid, args, kwargs, only", PARAMS)
def test_rule_matches_torch_func_jvp_eagerly_and_traced(pid, args, kwargs, only):
    tangents = _tangents(args, only, torch.Generator().manual_seed(0))
    out, expected = _expected(pid, args, kwargs, tangents)
    _assert_tangent(_run_rule(pid, args, kwargs, tangents), out, expected, "eager")
    traced = thunderfn.jit(lambda args, tangents: _run_rule(pid, args, kwargs, tangents))
    _assert_tangent(traced(list(args), list(tangents)), out, expected, "traced")


def _as_float32(x):
    return x.to(torch.float32) if _is_float_tensor(x) else (torch.float32 if x is F64 else x)


@pytest.mark.parametrize("pid, args, kwargs", CASES)
def test_rule_keeps_float32_in_float32(pid, args, kwargs):
    args = _map(_as_float32, args)
    tangents = _tangents(args, None, torch.Generator().manual_seed(0))
    out, expected = _expected(pid, args, kwargs, tangents)
    _assert_tangent(_run_rule(pid, args, kwargs, tangents), out, expected, "eager float32")


# -- second order: the rule, differentiated forward again, against torch's forward-over-forward
# torch's second derivative of pow is nan at a zero base (0 * inf inside its formula); ours is finite
_NAN_IN_TORCH = ("pow-zero-base-and-exponent", "pow-zero-base-number")


def _cumprod_by_products(a, dim):
    """cumprod as a chain of multiplications: torch's forward-over-forward of torch.cumprod is
    wrong at zeros (its cumprod_jvp divides where it can), this one is exact."""
    if a.ndim == 0:
        return a
    a = a.movedim(dim, -1)
    outs = [a[..., 0]]
    for i in range(1, a.shape[-1]):
        outs.append(outs[-1] * a[..., i])
    return torch.stack(outs, -1).movedim(-1, dim)


_SECOND_ORDER_REFERENCES = {PrimIDs.CUMPROD: _cumprod_by_products}


def _second_order(pid, args, kwargs, use_rule):
    """The forward derivative, in random directions for the inputs and the tangents, of the
    first-order tangent, which comes from the rule or from torch.func.jvp."""
    gen = torch.Generator().manual_seed(1)
    primals, rebuild = _split(args)
    tans = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in primals]
    directions = tuple(torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in primals + tans)

    def first_order(*xs):
        ps, ts = xs[:len(primals)], xs[len(primals):]
        if not use_rule:
            reference = _SECOND_ORDER_REFERENCES.get(pid, getattr(prims, pid.name.lower()))
            return jvp(lambda *qs: reference(*rebuild(qs), **kwargs), ps, ts)[1]
        return _run_rule(pid, rebuild(ps), kwargs, rebuild(ts, others_as_none=True))

    first = first_order(*primals, *tans)
    if first is None or (isinstance(first, tuple) and all(f is None for f in first)):
        return None
    return jvp(lambda *xs: tuple(f for f in _leaves(first_order(*xs)) if f is not None),
               tuple(primals + tans), directions)[1]


@pytest.mark.parametrize("pid, args, kwargs", [c for c in CASES if c.id not in _NAN_IN_TORCH])
def test_rule_is_forward_differentiable_and_matches_torch_forward_over_forward(pid, args, kwargs):
    ours, theirs = _second_order(pid, args, kwargs, True), _second_order(pid, args, kwargs, False)
    if ours is None:
        assert all(torch.all(x == 0) for x in _leaves(theirs)), f"the rule gives no tangent, torch's is {theirs}"
        return
    for i, (o, e) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(o, e, equal_nan=True, msg=lambda m: f"second-order tangent {i}: {m}")


@pytest.mark.parametrize("pid, args, kwargs", [c for c in CASES if c.id in _NAN_IN_TORCH])
def test_pow_second_order_is_finite_at_a_zero_base_and_matches_torch_elsewhere(pid, args, kwargs):
    ours, theirs = _second_order(pid, args, kwargs, True), _second_order(pid, args, kwargs, False)
    for o, e in zip(ours, theirs):
        assert torch.isfinite(o).all()
        torch.testing.assert_close(o[~e.isnan()], e[~e.isnan()])


# -- coverage ------------------------------------------------------------------------------
def test_every_prim_with_a_vjp_rule_has_a_jvp_rule_or_a_reason():
    """Each prim has a JVP rule, or its tag says its outputs carry no gradient (in both modes: the one
    tag), or its record says why it has no rule; never two of these; and a JVP rule exactly where the
    prim has a VJP rule."""
    for p in PrimIDs:
        record = rules_of(p)
        tagged = TAG_NOT_DIFFERENTIABLE in getattr(prims, p.name.lower()).tags
        declared = [record.jvp is not None, tagged, record.underivable is not None]
        assert sum(declared) == 1, f"prims.{p.name.lower()}: a JVP rule, the tag, an underivable reason: {declared}"
        assert (record.jvp is None) == (record.vjp is None), f"prims.{p.name.lower()}: a rule in one mode only"
        assert record.underivable is None or (isinstance(record.underivable, str) and record.underivable)


def test_every_prim_rule_has_a_case():
    """(Torch-level forward rules are checked in tests/test_vjp_conventions.py.)"""
    tested = {p.values[0] for p in CASES}
    prim_rules = {k for k, r in rules.items() if isinstance(k, PrimIDs) and r.jvp is not None}
    assert prim_rules <= tested, f"rules without a test case: {prim_rules - tested}"


def test_complex_arguments_are_refused_with_the_prim_named():
    z = torch.tensor([1 + 2j])
    with pytest.raises(NotImplementedError, match="prims.sin"):
        rules_of(PrimIDs.SIN).jvp.fwd(RecordedCall(prims.sin, (z,), {}, prims.sin(z)), (torch.ones_like(z),))
