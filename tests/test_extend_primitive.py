"""A primitive from outside the library, with its rules, in one call: `tf.extend.primitive`.

`top_k_last(x, k)` is torch.topk along the last dimension, two outputs (values, indices): a meta
function, torch.topk as its implementation, and its three rules written here, in the torch
language. It runs, jits, differentiates in both modes and to second order, and batches, against
torch's own topk; its OpInfo passes the op_db's checks. A missing rule, a taken name and a bad rule
are refused by name; a tag is read by the transforms; the meta function sees symbolic sizes."""
from __future__ import annotations

import pytest
import torch
from torch.func import jvp as torch_jvp
from torch.func import vmap as torch_vmap

import test_ops as forward_checks
import test_ops_autodiff as autodiff_checks
import thunderfn as tf
import thunderfn.torch as ltorch
from thunderfn import prims
from thunderfn.core.rules import rules_of
from thunderfn.testing.opinfo import OpInfo, SampleInput, make_tensor
from thunderfn.testing.registries import registries_restored

K = 2


def _top_k_last_meta(x, k):
    prims.check_tensor(x, "top_k_last")
    prims.check(x.ndim >= 1 and 0 <= k <= x.shape[-1], lambda: "selected index k out of range")
    shape = (*x.shape[:-1], k)  # sizes as given: symbolic ones under tf.jit(dynamic=True)
    return (tf.TensorProxy(shape=shape, dtype=x.dtype, device=x.device),
            tf.TensorProxy(shape=shape, dtype=torch.int64, device=x.device))


def _top_k_last_impl(x, k):
    return tuple(torch.topk(x, k))  # a plain tuple, as the prim returns


def _top_k_last_vjp(call, g):
    """The values' cotangent goes back to the places they were picked from; k gets none."""
    x = call.arg("x")
    g_values, _ = g  # the indices carry no cotangent
    if g_values is None:
        return None, None
    _, indices = call.out
    return ltorch.scatter_add(ltorch.zeros_like(x), -1, indices, g_values), None


def _top_k_last_jvp(call, tangents):
    """The values' tangent is the input's tangent at the picked places; the indices have none."""
    t_x, _ = tangents
    return ltorch.gather(t_x, -1, call.out[1]), None


def _top_k_last_batch(call, dims):
    """Any batch dimension is moved to the front: the last dimension stays the last."""
    x, k = call.args
    values, indices = prims.top_k_last(ltorch.movedim(x, dims[0], 0), k)
    return (values, indices), (0, 0)


def _add_top_k_last(**rules):
    return tf.extend.primitive("top_k_last", meta=_top_k_last_meta, impl=_top_k_last_impl, **rules)


@pytest.fixture
def top_k_last():
    """top_k_last with all three rules, removed again after the test."""
    with registries_restored():
        yield _add_top_k_last(vjp=_top_k_last_vjp, jvp=_top_k_last_jvp, batch=_top_k_last_batch)
    assert not hasattr(prims, "top_k_last")


def _torch_top_k_last(x, k=K):
    return tuple(torch.topk(x, k))


def _x(*shape):
    return torch.randn(*shape, dtype=torch.float64)  # distinct values: no ties, so one right gradient


def test_one_call_makes_a_prim_with_its_rules(top_k_last):
    assert prims.top_k_last is top_k_last and top_k_last.print_name == "prims.top_k_last"
    record = rules_of(top_k_last.id)
    assert None not in (record.vjp, record.jvp, record.batch) and top_k_last.id in prims.torch_impls
    trc = tf.trace(lambda x: top_k_last(x, K), _x(3, 5))
    assert [b.sym for b in trc.bound_symbols if b.sym.print_name.startswith("prims.")] == [top_k_last]


def test_runs_and_jits_like_torch(top_k_last):
    x = _x(3, 5)
    torch.testing.assert_close(top_k_last(x, K), _torch_top_k_last(x))
    torch.testing.assert_close(tf.jit(lambda x: top_k_last(x, K))(x), _torch_top_k_last(x))


def _weighted(topk, w):
    def loss(x):
        values, _ = topk(x)
        return (values * values * w).sum()
    return loss


def test_grad_and_grad_of_grad_match_torch(top_k_last):
    x, w = _x(3, 5), _x(3, K)
    ours, theirs = _weighted(lambda x: top_k_last(x, K), w), _weighted(_torch_top_k_last, w)
    torch.testing.assert_close(tf.grad(ours)(x), torch.func.grad(theirs)(x))
    # second order: the VJP rule, written in the torch language, is differentiated again
    v = _x(3, 5)
    second = tf.grad(lambda x: (tf.grad(ours)(x) * v).sum())(x)
    torch.testing.assert_close(second, torch.func.grad(lambda x: (torch.func.grad(theirs)(x) * v).sum())(x))
    assert second.abs().sum() > 0  # 2 * w * v at the picked places: not trivially zero
    # tf.jit's torch.autograd backward uses the same rule
    x_ = x.clone().requires_grad_()
    tf.jit(ours)(x_).backward()
    torch.testing.assert_close(x_.grad, torch.func.grad(theirs)(x))


def test_jvp_matches_torch(top_k_last):
    x, t = _x(4, 6), _x(4, 6)
    out, tangent = tf.jvp(lambda x: top_k_last(x, K)[0], (x,), (t,))
    expected = torch_jvp(lambda x: _torch_top_k_last(x)[0], (x,), (t,))
    torch.testing.assert_close((out, tangent), expected)
    # both outputs: the rule's None for the indices is their zero tangent, as torch.func gives it
    torch.testing.assert_close(tf.jvp(lambda x: top_k_last(x, K), (x,), (t,)),
                               torch_jvp(_torch_top_k_last, (x,), (t,)))


@pytest.mark.parametrize("in_dim", [0, 1, 2])
def test_vmap_matches_torch_and_the_per_example_law(top_k_last, in_dim):
    xs = _x(4, 3, 5).movedim(0, in_dim)  # 4 examples of shape (3, 5), batched along in_dim

    def f(x):
        return top_k_last(x, K)

    batched = tf.vmap(f, in_axes=in_dim)(xs)
    torch.testing.assert_close(batched, torch_vmap(_torch_top_k_last, in_dims=in_dim)(xs))
    # the law: vmap(f)(xs)[i] == f(xs[i]) for each example
    for i in range(4):
        torch.testing.assert_close(tuple(o[i] for o in batched), f(xs.select(in_dim, i)))


def test_vmap_of_grad_matches_torch(top_k_last):
    xs, w = _x(4, 3, 5), _x(3, K)
    ours, theirs = _weighted(lambda x: top_k_last(x, K), w), _weighted(_torch_top_k_last, w)
    torch.testing.assert_close(tf.vmap(tf.grad(ours))(xs), torch_vmap(torch.func.grad(theirs))(xs))


def _samples(device, dtype):
    yield SampleInput((make_tensor((3, 5), device=device, dtype=dtype), 2))
    yield SampleInput((make_tensor((7,), device=device, dtype=dtype), 3))
    yield SampleInput((make_tensor((2, 3, 4), device=device, dtype=dtype, noncontiguous=True), 4))


def test_its_opinfo_passes_the_op_db_checks(top_k_last):
    op = OpInfo("top_k_last", top_k_last, _samples, dtypes=(torch.float32, torch.float64),
                reference=lambda x, k: tuple(torch.topk(x, k)))
    for dtype in op.dtypes:
        forward_checks._check_forward(op, dtype, forward_checks._jitted(op))
        forward_checks._check_forward(op, dtype, forward_checks._decomposed(op))
    try:  # each check skips when no sample could be checked: here every sample must be
        autodiff_checks.test_vjp_matches_torch_autograd(op)
        autodiff_checks.test_vjp_jvp_inner_product_identity(op)
    except pytest.skip.Exception as skipped:
        pytest.fail(f"the autodiff checks checked no sample: {skipped}")


def test_a_taken_name_is_refused():
    with registries_restored():
        for taken in ("topk", "add"):
            with pytest.raises(tf.errors.ArgumentValueError, match=f"'{taken}' is taken"):
                tf.extend.primitive(taken, meta=_top_k_last_meta, impl=_top_k_last_impl)
        _add_top_k_last()
        with pytest.raises(tf.errors.ArgumentValueError, match="'top_k_last' is taken"):
            _add_top_k_last()
    assert prims.topk.print_name == "prims.topk"  # the library's prim is untouched


@pytest.mark.parametrize("name", ["top-k", "2topk", "", "top k"])
def test_a_name_that_is_not_an_identifier_is_refused(name):
    with registries_restored():
        with pytest.raises(tf.errors.ArgumentValueError, match="must be a Python identifier"):
            tf.extend.primitive(name, meta=_top_k_last_meta, impl=_top_k_last_impl)


@pytest.mark.parametrize("role", ["meta", "impl", "vjp", "jvp", "batch"])
def test_a_rule_that_is_not_a_function_is_refused_by_its_name(role):
    given = {"meta": _top_k_last_meta, "impl": _top_k_last_impl, role: "not a function"}
    with registries_restored():
        with pytest.raises(tf.errors.ArgumentTypeError, match=f"'top_k_last': {role} must be a function, got str"):
            tf.extend.primitive("top_k_last", **given)
        assert not hasattr(prims, "top_k_last")  # nothing was made


def test_a_missing_rule_is_refused_naming_the_primitive_and_the_rule():
    x = _x(4, 3, 5)
    with registries_restored():
        top_k_last = _add_top_k_last()  # no rules at all
        torch.testing.assert_close(top_k_last(x[0], K), _torch_top_k_last(x[0]))  # it still runs
        with pytest.raises(tf.errors.UnsupportedOpError, match=r"prims\.top_k_last: .*no VJP rule.*defvjp"):
            tf.grad(lambda x: top_k_last(x, K)[0].sum())(x[0])
        with pytest.raises(tf.errors.UnsupportedOpError,
                           match=r"prims\.top_k_last in forward mode: .*no JVP rule.*defjvp\(prims\.top_k_last\.id\)"):
            tf.jvp(lambda x: top_k_last(x, K)[0], (x[0],), (x[0],))
        with pytest.raises(tf.errors.BatchingError,
                           match=r"prims\.top_k_last: it has no batching rule.*defbatch\(prims\.top_k_last\.id\)"):
            tf.vmap(lambda x: top_k_last(x, K))(x)


def test_forward_mode_refusal_points_to_reverse_mode_when_there_is_a_vjp_rule():
    x = _x(3, 5)
    with registries_restored():
        top_k_last = _add_top_k_last(vjp=_top_k_last_vjp)
        with pytest.raises(tf.errors.UnsupportedOpError, match=r"no JVP rule.*reverse mode \(tf\.grad"):
            tf.jvp(lambda x: top_k_last(x, K)[0], (x,), (x,))
        torch.testing.assert_close(tf.grad(lambda x: top_k_last(x, K)[0].sum())(x),
                                   torch.func.grad(lambda x: _torch_top_k_last(x)[0].sum())(x))


def test_the_not_differentiable_tag_makes_it_carry_no_gradient_like_an_integer_op():
    x = _x(3, 5)
    with registries_restored():
        top_k_last = _add_top_k_last(tags=("not_differentiable",))  # and no rules: none is needed

        def loss(x, topk):
            return (topk(x)[0] * x[:, :K]).sum()

        # as torch sees a detached output (an integer op's): only the second factor's path has a gradient
        expected = torch.func.grad(lambda x: loss(x, lambda x: tuple(o.detach() for o in _torch_top_k_last(x))))(x)
        torch.testing.assert_close(tf.grad(loss)(x, lambda x: top_k_last(x, K)), expected)
        _, tangent = tf.jvp(lambda x: loss(x, lambda x: top_k_last(x, K)), (x,), (torch.ones_like(x),))
        torch.testing.assert_close(tangent, _torch_top_k_last(x)[0].sum())  # the values' tangent is zero
    with pytest.raises(tf.errors.ArgumentTypeError, match="tags must be a sequence of strings"):
        tf.extend.primitive("top_k_last", meta=_top_k_last_meta, impl=_top_k_last_impl, tags="not_differentiable")


def test_the_meta_function_sees_symbolic_sizes_under_dynamic_jit():
    seen = []

    def meta(x, k):
        seen.append(tuple(x.shape))
        return _top_k_last_meta(x, k)

    with registries_restored():
        top_k_last = tf.extend.primitive("top_k_last", meta=meta, impl=_top_k_last_impl)
        jitted = tf.jit(lambda x: top_k_last(x, K)[0] * 2, dynamic=True)
        for length in (5, 9):
            x = _x(3, length)
            torch.testing.assert_close(jitted(x), _torch_top_k_last(x)[0] * 2)
        assert tf.cache_info(jitted)["entries"] == 1 and tf.cache_info(jitted)["hits"] == 1
        assert seen and all(isinstance(shape[-1], torch.SymInt) for shape in seen)
