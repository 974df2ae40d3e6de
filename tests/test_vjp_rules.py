"""The prims' VJP rules: each rule, run eagerly on real tensors and traced through jit (which checks
the prims' metas), against torch.autograd through the prim's own torch implementation."""

import pytest
import torch

import thunderfn
from thunderfn import prims
from thunderfn.core.rules import TAG_NOT_DIFFERENTIABLE, RecordedCall, rules, rules_of
from thunderfn.prims import PrimIDs

F64 = torch.float64
_gen = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(shape, generator=_gen, dtype=F64)


def uniform(lo, hi, *shape):
    return lo + (hi - lo) * torch.rand(shape, generator=_gen, dtype=F64)


def away_from_zero(*shape):
    return torch.where(randn(*shape) < 0, -1.0, 1.0).to(F64) * uniform(0.5, 1.5, *shape)


def t(values):
    return torch.tensor(values, dtype=F64)


# -- cases: (id, prim id, args, kwargs, drop) -- drop: output positions given no cotangent
CASES = []


def case(id, pid, *args, drop=(), **kwargs):
    CASES.append(pytest.param(pid, args, kwargs, drop, id=id))


_DOMAINS = {
    "log": lambda *s: uniform(0.5, 2, *s), "log2": lambda *s: uniform(0.5, 2, *s),
    "log10": lambda *s: uniform(0.5, 2, *s), "sqrt": lambda *s: uniform(0.5, 2, *s),
    "rsqrt": lambda *s: uniform(0.5, 2, *s), "lgamma": lambda *s: uniform(0.5, 3, *s),
    "log1p": lambda *s: uniform(-0.5, 2, *s), "asin": lambda *s: uniform(-0.9, 0.9, *s),
    "acos": lambda *s: uniform(-0.9, 0.9, *s), "atanh": lambda *s: uniform(-0.9, 0.9, *s),
    "erfinv": lambda *s: uniform(-0.9, 0.9, *s), "acosh": lambda *s: uniform(1.2, 3, *s), "reciprocal": away_from_zero,
}
for name in ("abs neg exp exp2 expm1 log log1p log2 log10 sqrt rsqrt reciprocal sin cos tan asin acos "
             "atan sinh cosh tanh asinh acosh atanh erf erfc erfinv lgamma floor ceil round trunc sign").split():
    make = _DOMAINS.get(name, lambda *s: uniform(-1.2, 1.2, *s))
    case(f"{name}-2d", PrimIDs[name.upper()], make(3, 4))
    case(f"{name}-0d", PrimIDs[name.upper()], make())
case("abs-int", PrimIDs.ABS, torch.tensor([-2, 3]))
case("abs-at-zero", PrimIDs.ABS, t([0.0, -1.0, 2.0]))
case("neg-int", PrimIDs.NEG, torch.tensor([-2, 3]))

_OPERANDS = {"default": randn, "nonzero": away_from_zero, "positive": lambda *s: uniform(0.5, 2, *s)}
_BINARY = {  # name: (a's domain, b's domain, a number, b number)
    "add": ("default", "default", 1.5, -0.5), "sub": ("default", "default", 1.5, -0.5),
    "mul": ("default", "default", 1.5, -0.5), "div": ("default", "nonzero", 1.5, -0.7),
    "pow": ("positive", "default", 1.7, 2.5), "atan2": ("default", "default", 1.5, -0.5),
    "maximum": ("default", "default", 0.1, -0.1), "minimum": ("default", "default", 0.1, -0.1),
    "fmod": ("default", "nonzero", 2.5, -0.7), "remainder": ("default", "nonzero", 2.5, -0.7),
    "copysign": ("default", "default", 1.5, -0.5), "nextafter": ("default", "default", 1.5, -0.5),
}
for name, (da, db, na, nb) in _BINARY.items():
    pid, ma, mb = PrimIDs[name.upper()], _OPERANDS[da], _OPERANDS[db]
    case(f"{name}-same-shape", pid, ma(3, 4), mb(3, 4))
    case(f"{name}-0d-right", pid, ma(3, 4), mb())
    case(f"{name}-0d-left", pid, ma(), mb(3, 4))
    case(f"{name}-0d-both", pid, ma(), mb())
    case(f"{name}-number-right", pid, ma(3, 4), nb)
    case(f"{name}-number-left", pid, na, mb(3, 4))
case("div-trunc", PrimIDs.DIV, randn(3, 4), away_from_zero(3, 4), rounding_mode="trunc")
case("div-floor", PrimIDs.DIV, randn(3, 4), away_from_zero(), rounding_mode="floor")
case("pow-zero-base-and-exponent", PrimIDs.POW, t([0.0, 0.0, 0.0, 2.0, 1.5]), t([0.0, 2.0, 1.0, 0.0, 3.0]))
case("pow-zero-exponent-number", PrimIDs.POW, uniform(0.5, 2, 4), 0.0)
case("pow-zero-base-number", PrimIDs.POW, 0.0, t([0.0, 1.0, 2.5]))
case("pow-negative-base-integer-exponent", PrimIDs.POW, t([-1.5, -2.0, 3.0]), 3.0)
case("maximum-ties", PrimIDs.MAXIMUM, t([1.0, 2.0, 3.0, -1.0]), t([1.0, 0.0, 3.0, 2.0]))
case("minimum-ties", PrimIDs.MINIMUM, t([1.0, 2.0, 3.0, -1.0]), t([1.0, 0.0, 3.0, 2.0]))
case("maximum-ties-0d", PrimIDs.MAXIMUM, t([1.0, 2.0, 0.5]), t(1.0))
case("copysign-zero", PrimIDs.COPYSIGN, t([0.0, -1.0, 2.0]), t([-1.0, -1.0, 1.0]))
case("add-int", PrimIDs.ADD, torch.tensor([1, 2]), torch.tensor([3, 4]))
case("mul-int-number", PrimIDs.MUL, torch.tensor([1, 2]), 3)

_pred = randn(3, 4) > 0
case("where-same-shape", PrimIDs.WHERE, _pred, randn(3, 4), randn(3, 4))
case("where-0d-and-number", PrimIDs.WHERE, _pred, randn(), 2.0)
case("where-number-and-tensor", PrimIDs.WHERE, _pred, -1.0, randn(3, 4))
case("where-0d-both", PrimIDs.WHERE, _pred, randn(), randn())

case("sum-dims", PrimIDs.SUM, randn(3, 4, 5), (0, 2))
case("sum-negative-dim", PrimIDs.SUM, randn(3, 4), (-1,))
case("sum-no-dims", PrimIDs.SUM, randn(3, 4), ())
case("sum-0d", PrimIDs.SUM, randn(), ())
case("prod-row", PrimIDs.PROD, randn(3, 4), (1,))
case("prod-all", PrimIDs.PROD, randn(2, 3), (0, 1))
case("prod-middle-and-last", PrimIDs.PROD, randn(2, 3, 2), (0, 2))
case("prod-zeros", PrimIDs.PROD, t([[1.0, 0.0, 3.0, 2.0], [0.0, 2.0, 0.0, 1.0], [1.5, 2.0, -1.0, 0.5]]), (1,))
case("prod-0d", PrimIDs.PROD, randn(), ())
for name in ("amax", "amin"):
    _ties = t([[1.0, 3.0, 3.0, -1.0], [-2.0, -2.0, 0.0, -2.0], [0.5, 0.5, 0.5, 0.5]])
    case(f"{name}-ties", PrimIDs[name.upper()], _ties, (1,))
    case(f"{name}-all", PrimIDs[name.upper()], _ties, (0, 1))
    case(f"{name}-columns", PrimIDs[name.upper()], randn(3, 4), (0,))
    case(f"{name}-0d", PrimIDs[name.upper()], randn(), ())
for name in ("var", "var_mean"):
    pid = PrimIDs[name.upper()]
    case(f"{name}-row-unbiased", pid, randn(3, 4), (1,), correction=1)
    case(f"{name}-two-dims-biased", pid, randn(3, 4, 2), (0, 2), correction=0)
    case(f"{name}-0d", pid, randn(), (), correction=0)
case("var_mean-only-var", PrimIDs.VAR_MEAN, randn(3, 4), (1,), correction=1, drop=(1,))
case("var_mean-only-mean", PrimIDs.VAR_MEAN, randn(3, 4), (0, 1), correction=1, drop=(0,))

case("broadcast_in_dim-expand-size-1", PrimIDs.BROADCAST_IN_DIM, randn(3, 1), (2, 3, 4), (1, 2))
case("broadcast_in_dim-0d", PrimIDs.BROADCAST_IN_DIM, randn(), (2, 3), ())
case("broadcast_in_dim-new-trailing", PrimIDs.BROADCAST_IN_DIM, randn(3), (3, 2), (0,))
case("broadcast_in_dim-unsqueeze", PrimIDs.BROADCAST_IN_DIM, randn(3, 4), (3, 1, 4), (0, 2))
case("reshape", PrimIDs.RESHAPE, randn(3, 4), (2, 6))
case("reshape-to-0d", PrimIDs.RESHAPE, randn(1, 1), ())
case("transpose", PrimIDs.TRANSPOSE, randn(2, 3, 4), (2, 0, 1))
case("slice-strided", PrimIDs.SLICE, randn(5, 7), (1, 0), (5, 7), (2, 3))
case("slice-unit-strides", PrimIDs.SLICE, randn(5, 6), (1, 2), (4, 5))
case("slice-empty", PrimIDs.SLICE, randn(4, 3), (2, 0), (2, 3), (2, 1))
case("squeeze", PrimIDs.SQUEEZE, randn(3, 1, 4), (1,))
case("cat-dim-0", PrimIDs.CAT, [randn(2, 3), randn(4, 3)], 0)
case("cat-last-dim", PrimIDs.CAT, [randn(2, 3), randn(2, 1), randn(2, 2)], -1)
case("flip", PrimIDs.FLIP, randn(3, 4), (0, 1))
case("take", PrimIDs.TAKE, randn(4, 5), torch.tensor([0, 2, 2, 4]), 1)
case("take-0d-index", PrimIDs.TAKE, randn(4, 5), torch.tensor(3), 0)
case("take-int32-index", PrimIDs.TAKE, randn(4, 5), torch.tensor([3, 3], dtype=torch.int32), 0)
case("take_along_axis", PrimIDs.TAKE_ALONG_AXIS, randn(3, 4), torch.tensor([[0, 0], [3, 1], [2, 2]]), 1)
case("take_along_axis-smaller-index", PrimIDs.TAKE_ALONG_AXIS, randn(4, 3), torch.tensor([[0, 2], [3, 1]]), 0)
_index = torch.tensor([[0, 1], [3, 3], [2, 0]])
case("scatter_add", PrimIDs.SCATTER_ADD, randn(3, 4), _index, randn(3, 2), 1)
case("scatter", PrimIDs.SCATTER, randn(3, 4), torch.tensor([[0, 1], [3, 2], [2, 0]]), randn(3, 2), 1)
case("scatter-dim-0", PrimIDs.SCATTER, randn(4, 3), torch.tensor([[0, 1, 3], [2, 0, 1]]), randn(2, 3), 0)
case("pad-interior-and-crop", PrimIDs.PAD, randn(3, 4), 0.5, ((1, 2, 1), (-1, 0, 2)))
case("pad-positive", PrimIDs.PAD, randn(3, 4), 0.0, ((2, 1, 0), (0, 3, 0)))
case("pad-negative", PrimIDs.PAD, randn(4, 5), 0.0, ((-1, -2, 0), (0, -1, 1)))
case("convert_element_type-to-float32", PrimIDs.CONVERT_ELEMENT_TYPE, randn(3, 4), torch.float32)
case("convert_element_type-to-int", PrimIDs.CONVERT_ELEMENT_TYPE, randn(3, 4), torch.int64)
case("convert_element_type-from-int", PrimIDs.CONVERT_ELEMENT_TYPE, torch.tensor([1, 2]), F64)
case("device_put", PrimIDs.DEVICE_PUT, randn(3, 4), torch.device("cpu"))
for a_shape, b_shape in [((3,), (3,)), ((3,), (3, 4)), ((3, 4), (4,)), ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
                         ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)), ((4,), (2, 4, 5)), ((2, 3, 4), (4,)),
                         ((1, 3, 4), (2, 4, 5))]:
    case(f"matmul-{a_shape}x{b_shape}".replace(" ", ""), PrimIDs.MATMUL, randn(*a_shape), randn(*b_shape))
case("cumsum", PrimIDs.CUMSUM, randn(3, 4), 1)
case("cumsum-negative-dim", PrimIDs.CUMSUM, randn(3, 4), -2)
case("cumsum-0d", PrimIDs.CUMSUM, randn(), 0)
case("cumprod", PrimIDs.CUMPROD, randn(3, 5), 1)
case("cumprod-dim-0", PrimIDs.CUMPROD, randn(4, 3), 0)
case("cumprod-zeros", PrimIDs.CUMPROD,
     t([[1.5, 0.0, 2.0, 3.0, -1.0], [0.0, 2.0, 0.0, 1.0, 2.0], [2.0, 3.0, 1.0, 0.5, 0.0]]), 1)
case("cumprod-0d", PrimIDs.CUMPROD, randn(), 0)
case("sort-descending", PrimIDs.SORT, randn(3, 4), 1, True, False)
case("sort-dim-0-stable", PrimIDs.SORT, randn(4, 3), 0, False, True)
case("sort-0d", PrimIDs.SORT, randn(), 0, False, False)
case("sort-indices-only", PrimIDs.SORT, randn(3, 4), 1, False, False, drop=(0,))
case("topk", PrimIDs.TOPK, randn(3, 5), 2, 1, True, True)
case("topk-smallest-dim-0", PrimIDs.TOPK, randn(5, 3), 3, 0, False, True)


# -- the check -----------------------------------------------------------------------------
def _map(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, y) for y in x)
    return fn(x)


def _is_float_tensor(x):
    return isinstance(x, torch.Tensor) and x.dtype.is_floating_point


def _leaves(x):
    if isinstance(x, (list, tuple)):
        return [leaf for y in x for leaf in _leaves(y)]
    return [x]


def _run_rule(pid, args, kwargs, g):
    prim = getattr(prims, pid.name.lower())
    return rules_of(pid).vjp.bwd(RecordedCall(prim, tuple(args), dict(kwargs), prim(*args, **kwargs)), g)


def _expected(pid, args, kwargs, drop):
    """torch.autograd through the prim's torch implementation (the prim computes eagerly with
    executors.torch_executor.prim_impls, numbers on either side included)."""
    targs = _map(lambda x: x.detach().clone().requires_grad_(True) if _is_float_tensor(x) else x, args)
    with torch.enable_grad():
        out = getattr(prims, pid.name.lower())(*targs, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    cots = tuple(None if i in drop
                 or not o.dtype.is_floating_point else torch.randn(o.shape, generator=_gen, dtype=o.dtype)
                 for i, o in enumerate(outs))
    inputs = [x for x in _leaves(targs) if _is_float_tensor(x)]
    pairs = [(o, c) for o, c in zip(outs, cots) if c is not None and o.requires_grad]
    grads = (torch.autograd.grad([o for o, _ in pairs], inputs, [c for _, c in pairs], allow_unused=True)
             if pairs and inputs else [None] * len(inputs))
    by_id = {id(x): (torch.zeros_like(x) if gr is None else gr) for x, gr in zip(inputs, grads)}
    expected = _map(lambda x: by_id.get(id(x)), targs)
    return expected, (cots if isinstance(out, tuple) else cots[0])


def _assert_cotangents(got, expected, args, where):
    assert isinstance(got,
                      tuple) and len(got) == len(args), f"{where}: expected one cotangent per argument, got {got!r}"
    for i, (c, e, a) in enumerate(zip(got, expected, args)):
        if isinstance(a, list):
            _assert_cotangents(c, tuple(e), a, f"{where}, argument {i}")
            continue
        if not _is_float_tensor(a):
            assert c is None, f"{where}: argument {i} is not a float tensor, so its cotangent must be None"
            continue
        if c is None:
            assert torch.all(e == 0), f"{where}: argument {i} got None, but torch's gradient is {e}"
            continue
        assert c.shape == a.shape and c.dtype == a.dtype, \
            f"{where}: argument {i}: cotangent {tuple(c.shape)} {c.dtype}, argument {tuple(a.shape)} {a.dtype}"
        torch.testing.assert_close(c, e.to(c.dtype), equal_nan=True, msg=lambda m: f"{where}: argument {i}: {m}")


@pytest.mark.parametrize("pid, args, kwargs, drop", CASES)
def test_rule_matches_torch_autograd_eagerly_and_traced(pid, args, kwargs, drop):
    expected, g = _expected(pid, args, kwargs, drop)
    _assert_cotangents(_run_rule(pid, args, kwargs, g), expected, args, "eager")
    traced = thunderfn.jit(lambda args, g: _run_rule(pid, args, kwargs, g))
    _assert_cotangents(traced(list(args), g), expected, args, "traced")


def _not_differentiable(pid) -> bool:
    return TAG_NOT_DIFFERENTIABLE in getattr(prims, pid.name.lower()).tags


def test_every_prim_is_differentiated_or_declared_otherwise():
    """Each prim has a VJP rule, or its tag says its outputs carry no gradient, or its record says why it
    has no rule; never two of these."""
    for p in PrimIDs:
        record = rules_of(p)
        declared = [record.vjp is not None, _not_differentiable(p), record.underivable is not None]
        assert sum(declared) == 1, f"prims.{p.name.lower()}: a VJP rule, the tag, an underivable reason: {declared}"
        assert record.underivable is None or (isinstance(record.underivable, str) and record.underivable)


def test_every_rule_has_a_case():
    tested = {p.values[0] for p in CASES}
    prim_rules = {k for k, r in rules.items() if isinstance(k, PrimIDs) and r.vjp is not None}  # (custom_vjp: others)
    assert prim_rules <= tested, f"rules without a test case: {prim_rules - tested}"


def test_complex_arguments_are_refused_with_the_prim_named():
    z = torch.tensor([1 + 2j])
    with pytest.raises(NotImplementedError, match="prims.sin"):
        rules_of(PrimIDs.SIN).vjp.bwd(RecordedCall(prims.sin, (z,), {}, prims.sin(z)), torch.ones_like(z))


def _second_order(pid, args, kwargs, drop, use_rule):
    """Gradients, with respect to the inputs and the cotangent, of <first-order gradients, w>,
    where the first-order gradients come from the rule or from torch.autograd."""
    gen = torch.Generator().manual_seed(1)
    targs = _map(lambda x: x.detach().clone().requires_grad_(True) if _is_float_tensor(x) else x, args)
    inputs = [x for x in _leaves(targs) if _is_float_tensor(x)]
    with torch.enable_grad():
        prim = getattr(prims, pid.name.lower())
        out = prim(*targs, **kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        cots = tuple(None if i in drop or not o.dtype.is_floating_point else
                     torch.randn(o.shape, generator=gen, dtype=o.dtype).requires_grad_(True)
                     for i, o in enumerate(outs))
        if use_rule:
            firsts = _leaves(rules_of(pid).vjp.bwd(RecordedCall(prim, tuple(targs), dict(kwargs), out),
                                                   cots if isinstance(out, tuple) else cots[0]))
            firsts = [f for f, a in zip(firsts, _leaves(targs)) if _is_float_tensor(a)]
        else:
            pairs = [(o, c) for o, c in zip(outs, cots) if c is not None and o.requires_grad]
            firsts = torch.autograd.grad([o for o, _ in pairs], inputs, [c for _, c in pairs], create_graph=True,
                                         allow_unused=True) if pairs else [None] * len(inputs)
        ws = [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in inputs]
        total = sum(((f * w).sum() for f, w in zip(firsts, ws) if f is not None), torch.zeros((), dtype=F64))
        wrt = inputs + [c for c in cots if c is not None]
        if not total.requires_grad:
            return [torch.zeros_like(x) for x in wrt]
        return [torch.zeros_like(x) if s is None else s
                for x, s in zip(wrt, torch.autograd.grad(total, wrt, allow_unused=True))]


# torch's double backward of pow is nan at a zero base (0 * inf inside its formula); ours is finite
_NAN_IN_TORCH = ("pow-zero-base-and-exponent", "pow-zero-base-number")
# a known limitation, see transforms/rules/reductions.py's _cumprod_vjp: the second derivative with respect to the first
# zero is dropped
_WRONG_SECOND_ORDER = ("cumprod-zeros",)
SECOND_ORDER_CASES = [c for c in CASES if c.id not in _NAN_IN_TORCH + _WRONG_SECOND_ORDER
                      and any(map(_is_float_tensor, _leaves(c.values[1])))]


@pytest.mark.parametrize("pid, args, kwargs, drop", SECOND_ORDER_CASES)
def test_rule_is_differentiable_and_matches_torch_double_backward(pid, args, kwargs, drop):
    ours, theirs = _second_order(pid, args, kwargs, drop, True), _second_order(pid, args, kwargs, drop, False)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(o, t, equal_nan=True, msg=lambda m: f"second-order gradient {i}: {m}")


@pytest.mark.parametrize("pid, args, kwargs, drop", [c for c in CASES if c.id in _NAN_IN_TORCH])
def test_pow_second_order_is_finite_at_a_zero_base_and_matches_torch_elsewhere(pid, args, kwargs, drop):
    ours, theirs = _second_order(pid, args, kwargs, drop, True), _second_order(pid, args, kwargs, drop, False)
    for o, t in zip(ours, theirs):
        assert torch.isfinite(o).all()
        torch.testing.assert_close(o[~t.isnan()], t[~t.isnan()])


def _as_float32(x):
    return x.to(torch.float32) if _is_float_tensor(x) else (torch.float32 if x is F64 else x)


@pytest.mark.parametrize("pid, args, kwargs, drop", CASES)
def test_rule_keeps_float32_in_float32(pid, args, kwargs, drop):
    args = _map(_as_float32, args)
    expected, g = _expected(pid, args, kwargs, drop)
    _assert_cotangents(_run_rule(pid, args, kwargs, g), expected, args, "eager float32")
