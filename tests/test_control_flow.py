"""tf.cond, tf.scan, tf.while_loop and tf.fori_loop: each body traced once and run as compiled code, with
the results of the Python `if`, `for` and `while` they stand for, pytrees in and out; mismatched branches
or carries refused naming the function and the leaf; reverse mode through cond, scan and fori_loop, forward
mode through all four and vmap of all four equal to torch.func's through the Python they stand for (to
second order, and vmap(grad)); reverse mode through while_loop refused by name, as in JAX, while
torch.autograd trains through a jitted function that uses it."""
from __future__ import annotations

import pytest
import torch

import thunderfn as tf
from thunderfn.errors import ArgumentTypeError, ArgumentValueError, UnsupportedOpError
from thunderfn.executors import OperatorExecutor
from thunderfn.testing.fusion_checks import needs_inductor

F64 = torch.float64


def _randn(*shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape) + len(shape)), dtype=F64)


# -- cond -------------------------------------------------------------------------------------
def _branchy(x, w):
    """A branch on a value, over a pytree, one branch closing over an input and one over a constant."""
    scale = torch.tensor(3.0, dtype=F64)
    return tf.cond(x.sum() > 0,
                   lambda d: {"y": d["a"] * w, "n": d["a"].sum()},
                   lambda d: {"y": d["a"] - scale, "n": d["a"].mean()},
                   {"a": x})


def _branchy_in_python(x, w):
    return {"y": x * w, "n": x.sum()} if x.sum() > 0 else {"y": x - 3.0, "n": x.mean()}


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_runs_the_branch_the_value_picks_with_one_compile(sign):
    f = tf.jit(_branchy)
    w = _randn(4)
    for x in (sign * _randn(4).abs(), -sign * _randn(4).abs()):
        torch.testing.assert_close(f(x, w), _branchy_in_python(x, w))
    assert tf.cache_info(f)["entries"] == 1


def test_cond_on_real_tensors_and_on_a_python_bool_runs_the_branch():
    x, w = _randn(3).abs(), _randn(3)
    torch.testing.assert_close(_branchy(x, w), _branchy_in_python(x, w))
    assert tf.jit(lambda x: tf.cond(True, lambda x: x + 1, lambda x: x - 1, x))(x).equal(x + 1)


def test_cond_traces_each_branch_once_and_prints_them_nested():
    f = tf.jit(_branchy)
    f(_randn(4), _randn(4))
    source = str(tf.last_traces(f)[0])
    assert source.count("prims.cond(") == 1
    assert "def cond_true_" in source and "def cond_false_" in source


@pytest.mark.parametrize("false_fn, match", [
    (lambda d: {"y": d["a"].sum(), "n": d["a"].sum()}, r"\['y'\] of shape \(\) .* has shape \(4,\)"),
    (lambda d: {"y": d["a"]}, "the same structure"),
    (lambda d: {"y": d["a"].to(torch.float32), "n": d["a"].sum()}, "dtype torch.float32"),
])
def test_cond_branches_that_disagree_are_refused_naming_the_leaf(false_fn, match):
    with pytest.raises(ArgumentTypeError, match=match):
        tf.jit(lambda x: tf.cond(x.sum() > 0, lambda d: {"y": d["a"], "n": d["a"].sum()}, false_fn, {"a": x}))(
            _randn(4))


def test_cond_predicate_must_be_one_bool():
    with pytest.raises(ArgumentTypeError, match="one-element bool tensor"):
        tf.jit(lambda x: tf.cond(x > 0, lambda x: x, lambda x: -x, x))(_randn(4))
    with pytest.raises(ArgumentTypeError, match="one-element bool tensor"):
        tf.jit(lambda x: tf.cond(x.sum(), lambda x: x, lambda x: -x, x))(_randn(4))


# -- scan -------------------------------------------------------------------------------------
def _rnn_step(w):
    def step(carry, x):
        h = torch.tanh(carry["h"] @ w + x)
        return {"h": h, "t": carry["t"] + 1}, (h.sum(), h * 2)

    return step


def _scan_in_python(f, init, xs, reverse=False):
    carry, ys = init, []
    for x in (reversed(xs) if reverse else xs):
        carry, y = f(carry, x)
        ys.append(y)
    ys = ys[::-1] if reverse else ys
    return carry, tuple(torch.stack([y[i] for y in ys]) for i in range(len(ys[0])))


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_a_python_loop_with_pytrees(reverse):
    w, xs = _randn(3, 3) / 3, _randn(6, 3)
    init = {"h": torch.zeros(3, dtype=F64), "t": torch.zeros((), dtype=F64)}
    f = tf.jit(lambda w, xs: tf.scan(_rnn_step(w), init, xs, reverse=reverse))
    expected = _scan_in_python(_rnn_step(w), init, xs, reverse)
    torch.testing.assert_close(f(w, xs), expected)
    torch.testing.assert_close(tf.scan(_rnn_step(w), init, xs, reverse=reverse), expected)  # on real tensors


def test_scan_without_xs_takes_length_steps():
    f = tf.jit(lambda c: tf.scan(lambda c, _: (c * 2, c), c, None, length=4))
    carry, ys = f(torch.ones(2, dtype=F64))
    torch.testing.assert_close(carry, torch.full((2,), 16.0, dtype=F64))
    torch.testing.assert_close(ys, torch.tensor([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0], [8.0, 8.0]], dtype=F64))


def test_scan_is_one_statement_whatever_its_length():
    """The body is traced once: the trace of 1,000 steps has as many statements as that of 10."""
    sizes = {}
    for steps in (10, 1000):
        f = tf.jit(lambda xs: tf.scan(lambda c, x: (c + x.sin(), c), torch.zeros(2, dtype=F64), xs))
        xs = _randn(steps, 2)
        carry, _ = f(xs)
        torch.testing.assert_close(carry, xs.sin().sum(0))
        sizes[steps] = str(tf.last_traces(f)[-1]).count("\n")
    assert sizes[10] == sizes[1000]


def test_scan_refuses_a_carry_that_changes_and_a_body_that_returns_no_pair():
    with pytest.raises(ArgumentTypeError, match="scan: '<lambda>' returns the output of shape \\(\\)"):
        tf.jit(lambda xs: tf.scan(lambda c, x: (c.sum(), c), torch.zeros(2), xs))(torch.ones(3, 2))
    with pytest.raises(ArgumentTypeError, match="must return a pair"):
        tf.jit(lambda xs: tf.scan(lambda c, x: c + x, torch.zeros(2), xs))(torch.ones(3, 2))
    with pytest.raises(ArgumentValueError, match="different leading dimensions"):
        tf.jit(lambda a, b: tf.scan(lambda c, x: (c, c), torch.zeros(2), (a, b)))(torch.ones(3, 2), torch.ones(4, 2))
    with pytest.raises(ArgumentValueError, match="give length"):
        tf.jit(lambda c: tf.scan(lambda c, x: (c, c), c, None))(torch.ones(2))


# -- while_loop and fori_loop ----------------------------------------------------------------------
def test_a_data_dependent_while_loop_compiles_once_for_every_trip_count():
    def halve(x):
        return tf.while_loop(lambda s: s["x"].sum() > 1, lambda s: {"x": s["x"] / 2, "n": s["n"] + 1},
                             {"x": x, "n": torch.zeros((), dtype=torch.int64)})

    f = tf.jit(halve)
    for start in (0.5, 4.0, 4096.0):
        x = torch.full((2,), start, dtype=F64)
        out = f(x)
        expected, n = x, 0
        while expected.sum() > 1:
            expected, n = expected / 2, n + 1
        torch.testing.assert_close(out["x"], expected)
        assert int(out["n"]) == n
    assert tf.cache_info(f)["entries"] == 1
    torch.testing.assert_close(halve(torch.full((2,), 4.0, dtype=F64))["x"], torch.full((2,), 0.5, dtype=F64))


def test_while_loop_body_must_keep_the_carry():
    with pytest.raises(ArgumentTypeError, match="while_loop: '<lambda>' returns"):
        tf.jit(lambda x: tf.while_loop(lambda x: x.sum() > 1, lambda x: x.sum(), x))(torch.ones(2))


def test_fori_loop_matches_a_python_for_loop():
    def body(i, c):
        return c * 0.5 + i

    x = _randn(3)
    expected = x
    for i in range(2, 7):
        expected = body(i, expected)
    torch.testing.assert_close(tf.jit(lambda x: tf.fori_loop(2, 7, body, x))(x), expected)
    torch.testing.assert_close(tf.fori_loop(2, 7, body, x), expected)
    with pytest.raises(ArgumentTypeError, match="Python ints"):
        tf.jit(lambda x: tf.fori_loop(0, x.sum(), body, x))(x)


# -- transforms and executors ---------------------------------------------------------------------
def test_torch_autograd_trains_through_a_jitted_function_with_control_flow():
    w, xs = _randn(3, 3) / 3, _randn(5, 3)
    init = {"h": torch.zeros(3, dtype=F64), "t": torch.zeros((), dtype=F64)}

    def loss(w, xs):
        carry, (sums, hs) = tf.scan(_rnn_step(w), init, xs)
        return tf.cond(carry["h"].sum() > 0, lambda a: (a * 2).sum(), lambda a: a.sum(), hs) + sums.sum()

    w1, xs1 = w.clone().requires_grad_(), xs.clone().requires_grad_()
    tf.jit(loss)(w1, xs1).backward()
    w2, xs2 = w.clone().requires_grad_(), xs.clone().requires_grad_()
    loss(w2, xs2).backward()  # on real tensors: Python's loop and branch
    torch.testing.assert_close((w1.grad, xs1.grad), (w2.grad, xs2.grad))


def _cond_loss(x, w):
    out = _branchy(x, w)
    return (out["y"] ** 2).sum() + out["n"] * w.sum()


def _cond_loss_in_python(x, w):
    out = _branchy_in_python(x, w)
    return (out["y"] ** 2).sum() + out["n"] * w.sum()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_grad_through_cond_is_the_taken_branchs_to_second_order(sign):
    x, w = sign * _randn(4).abs(), _randn(4)
    expected = torch.func.grad(_cond_loss_in_python, argnums=(0, 1))(x, w)
    torch.testing.assert_close(tf.grad(_cond_loss, argnums=(0, 1))(x, w), expected)
    torch.testing.assert_close(tf.jit(tf.grad(_cond_loss, argnums=(0, 1)))(x, w), expected)
    torch.testing.assert_close(tf.grad(lambda x: tf.grad(_cond_loss)(x, w).sum())(x),
                               torch.func.grad(lambda x: torch.func.grad(_cond_loss_in_python)(x, w).sum())(x))


def _rnn_loss(scan, reverse):
    def loss(w, xs, h0):
        init = {"h": h0, "t": torch.zeros((), dtype=torch.int64)}  # an integer carry gets no cotangent
        carry, (sums, hs) = scan(_rnn_step_int(w), init, xs, reverse=reverse)
        return (carry["h"] ** 2).sum() + sums.sum() + (hs ** 2).mean()

    return loss


def _rnn_step_int(w):
    def step(carry, x):
        h = torch.tanh(carry["h"] @ w + x)
        return {"h": h, "t": carry["t"] + 1}, (h.sum(), h * 2)

    return step


@pytest.mark.parametrize("reverse", [False, True])
def test_grad_through_scan_equals_torch_funcs_through_the_python_loop(reverse):
    w, xs, h0 = _randn(3, 3) / 3, _randn(5, 3), _randn(3)
    ours, theirs = _rnn_loss(tf.scan, reverse), _rnn_loss(_scan_in_python, reverse)
    expected = torch.func.grad(theirs, argnums=(0, 1, 2))(w, xs, h0)
    torch.testing.assert_close(tf.grad(ours, argnums=(0, 1, 2))(w, xs, h0), expected)
    torch.testing.assert_close(tf.jit(tf.grad(ours, argnums=(0, 1, 2)))(w, xs, h0), expected)
    torch.testing.assert_close(tf.grad(lambda w: tf.grad(ours)(w, xs, h0).sum())(w),
                               torch.func.grad(lambda w: torch.func.grad(theirs)(w, xs, h0).sum())(w))


def test_grad_through_fori_loop_and_scan_without_xs():
    def body(i, c):
        return torch.sin(c) * 0.9 + i * 0.1

    def python(c):
        for i in range(3):
            c = body(torch.tensor(i), c)
        return c.sum()

    x = _randn(3)
    torch.testing.assert_close(tf.grad(lambda c: tf.fori_loop(0, 3, body, c).sum())(x), torch.func.grad(python)(x))
    torch.testing.assert_close(tf.grad(lambda c: tf.scan(lambda c, _: (c.sin(), c), c, None, length=3)[0].sum())(x),
                               torch.func.grad(lambda c: c.sin().sin().sin().sum())(x))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_jvp_through_cond_is_the_taken_branchs(sign):
    x, w, t = sign * _randn(4).abs(), _randn(4), _randn(2, 2).flatten()

    def ours(x):
        out = _branchy(x, w)
        return out["y"] * out["n"]

    def theirs(x):
        out = _branchy_in_python(x, w)
        return out["y"] * out["n"]

    torch.testing.assert_close(tf.jvp(ours, (x,), (t,)), torch.func.jvp(theirs, (x,), (t,)))


@pytest.mark.parametrize("reverse", [False, True])
def test_jvp_through_scan_and_forward_over_reverse(reverse):
    w, xs, h0 = _randn(3, 3) / 3, _randn(5, 3), _randn(3)
    tangents = (_randn(3, 3), _randn(5, 3) * 0.5, _randn(3) * 2)
    ours, theirs = _rnn_loss(tf.scan, reverse), _rnn_loss(_scan_in_python, reverse)
    torch.testing.assert_close(tf.jvp(ours, (w, xs, h0), tangents), torch.func.jvp(theirs, (w, xs, h0), tangents))
    torch.testing.assert_close(tf.jvp(lambda w: tf.grad(ours)(w, xs, h0), (w,), (tangents[0],)),
                               torch.func.jvp(lambda w: torch.func.grad(theirs)(w, xs, h0), (w,), (tangents[0],)))


def test_jvp_through_while_loop_takes_the_steps_the_values_take():
    def ours(x):
        return tf.while_loop(lambda x: x.sum() > 1, lambda x: x * x * 0.5, x)

    def theirs(x):
        while x.sum() > 1:
            x = x * x * 0.5
        return x

    # x * x / 2 shrinks each below a sum of 1, in two steps, two and none
    for x in (torch.tensor([1.5, 1.2], dtype=F64), torch.tensor([1.3, 0.9], dtype=F64),
              torch.tensor([0.5, 0.2], dtype=F64)):
        t = torch.ones_like(x)
        torch.testing.assert_close(tf.jvp(ours, (x,), (t,)), torch.func.jvp(theirs, (x,), (t,)))
        torch.testing.assert_close(tf.jit(lambda x, t: tf.jvp(ours, (x,), (t,)))(x, t),
                                   torch.func.jvp(theirs, (x,), (t,)))


def test_vmap_of_cond_with_a_batched_and_a_shared_predicate():
    """vmap(f)(x)[i] == f(x[i]): a batched predicate runs both branches and selects per example."""
    w, xs = _randn(4), torch.cat([_randn(3, 4).abs(), -_randn(3, 4).abs()])
    ours = tf.vmap(lambda x: _branchy(x, w))(xs)
    for i, x in enumerate(xs):
        torch.testing.assert_close({k: v[i] for k, v in ours.items()}, _branchy_in_python(x, w))
    shared = tf.vmap(lambda x, s: tf.cond(s > 0, lambda x: x * w, lambda x: x.sin(), x), in_axes=(0, None))
    torch.testing.assert_close(shared(xs, torch.tensor(-1.0)), xs.sin())
    torch.testing.assert_close(tf.jit(shared)(xs, torch.tensor(1.0)), xs * w)


@pytest.mark.parametrize("in_axes", [(None, 0, None), (None, 1, 0), (0, 0, 0)])
def test_vmap_of_scan_and_per_example_gradients_of_an_rnn(in_axes):
    w, xs, h0 = _randn(3, 3) / 3, _randn(4, 5, 3), _randn(3)
    ws, h0s = torch.stack([w * (1 + i / 10) for i in range(4)]), torch.stack([h0 * (i - 1) for i in range(4)])
    args = (ws if in_axes[0] == 0 else w, xs if in_axes[1] == 0 else xs.movedim(0, 1), h0s if in_axes[2] == 0 else h0)

    def example(i):
        return tuple(a if d is None else a.select(d, i) for a, d in zip(args, in_axes))

    ours, theirs = _rnn_loss(tf.scan, False), _rnn_loss(_scan_in_python, False)
    values = tf.vmap(ours, in_axes=in_axes)(*args)
    grads = tf.vmap(tf.grad(ours), in_axes=in_axes)(*args)
    for i in range(4):
        torch.testing.assert_close(values[i], theirs(*example(i)))
        torch.testing.assert_close(grads[i], torch.func.grad(theirs)(*example(i)))


def test_vmap_of_while_loop_runs_until_every_example_is_done():
    def ours(x):
        return tf.while_loop(lambda s: s[0].sum() > 1, lambda s: (s[0] * 0.5, s[1] + 1), (x, torch.tensor(0)))

    def theirs(x):
        n = 0
        while x.sum() > 1:
            x, n = x * 0.5, n + 1
        return x, n

    xs = torch.rand(5, 2, dtype=F64) * torch.tensor([[1.0], [4.0], [10.0], [0.2], [100.0]], dtype=F64)
    batched, steps = tf.jit(tf.vmap(ours))(xs)
    for i, x in enumerate(xs):
        expected, n = theirs(x)
        torch.testing.assert_close(batched[i], expected)
        assert int(steps[i]) == n


def test_transforms_that_do_not_reach_into_bodies_refuse_by_name():
    with pytest.raises(UnsupportedOpError, match="cannot differentiate prims.while_loop: reverse mode through a "
                                                 "while_loop is not supported"):
        tf.grad(lambda x: tf.while_loop(lambda x: x.sum() > 1, lambda x: x / 2, x).sum())(torch.full((2,), 4.0))


def test_executors_claim_the_ops_inside_a_body():
    ex = OperatorExecutor("body_mul_ex")
    op = ex.register_operator("body_mul", like=lambda a, b: a * b, fn=torch.mul)
    ex.register_lowering(tf.torch.mul, lower=op)
    f = tf.jit(lambda xs: tf.scan(lambda c, x: (c * x, c), torch.ones(2, dtype=F64), xs), executors=[ex])
    xs = _randn(4, 2)
    torch.testing.assert_close(f(xs)[0], xs.prod(0))
    body = [line for line in str(tf.last_traces(f)[-1]).splitlines() if "def scan_body_" in line]
    assert body and "body_mul(" in str(tf.last_traces(f)[-1]).split(body[0])[1]


# -- torch's own operators inside traced code: the same primitives ----------------------------------------
def test_torch_cond_inside_traced_code_is_tf_cond():
    def f(x):
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: -x.sin(), (x,))

    def in_python(x):
        return x * 2 if x.sum() > 0 else -x.sin()

    for x in (_randn(3).abs(), -_randn(3).abs()):
        torch.testing.assert_close(tf.jit(f)(x), in_python(x))
        torch.testing.assert_close(tf.grad(lambda x: (f(x) ** 2).sum())(x),
                                   torch.func.grad(lambda x: (in_python(x) ** 2).sum())(x))
    jitted = tf.jit(f)
    jitted(_randn(3))
    assert "prims.cond(" in str(tf.last_traces(jitted)[0])


def test_torch_while_loop_scan_and_map_inside_traced_code():
    from torch._higher_order_ops import map as torch_map
    from torch._higher_order_ops import scan as torch_scan
    from torch._higher_order_ops import while_loop as torch_while_loop

    def halve(x):
        return torch_while_loop(lambda a, n: a.sum() > 1, lambda a, n: (a * 0.5, n + 1), (x, torch.tensor(0)))

    x = torch.full((2,), 40.0, dtype=F64)
    torch.testing.assert_close(tf.jit(halve)(x), halve(x))  # (torch's own on real tensors)

    def cumulative(xs):
        return torch_scan(lambda c, x: (c + x, c * x), torch.zeros(2, 3, dtype=F64), xs, dim=1)

    xs = _randn(2, 5, 3)
    torch.testing.assert_close(tf.jit(cumulative)(xs), cumulative(xs))
    w, rows = _randn(2, 3), _randn(4, 2)
    torch.testing.assert_close(tf.jit(lambda rows, w: torch_map(lambda r, w: r @ w, rows, w))(rows, w), rows @ w)


@needs_inductor
def test_fusion_leaves_a_loop_to_its_bodies_and_fuses_around_it(recwarn):
    """A fusion compiler tracing the scan's call would unroll or refuse its loop: the call stays outside every
    region (its body is compiled code of its own), and the ops after it fuse."""
    f = tf.jit(lambda xs: tf.scan(lambda c, x: (c.sin() + x, c), torch.zeros(2), xs)[0].exp() + 1, fusion=True)
    xs = torch.ones(3, 2)
    expected = _scan_in_python(lambda c, x: (c.sin() + x, (c,)), torch.zeros(2), xs)[0].exp() + 1
    torch.testing.assert_close(f(xs), expected)
    source = str(tf.last_traces(f)[-1])
    assert source.count("inductor_fusion") >= 2 and "_scan_impl(" in source  # the body's ops fused too
    assert not [w for w in recwarn if "could not compile" in str(w.message)]


def test_a_custom_vjp_inside_a_scan_body_gives_its_rule_every_step():
    @tf.custom_vjp
    def clipped_gradient(x):
        return x

    clipped_gradient.defvjp(lambda x: (x, None), lambda residuals, g: (g.clamp(-0.1, 0.1),))

    def step(w):
        def body(h, x):
            h = clipped_gradient(torch.tanh(h @ w + x))
            return h, (h.sum(),)
        return body

    w, xs = _randn(3, 3), _randn(5, 3)
    expected = tf.grad(lambda w: _scan_in_python(step(w), torch.zeros(3, dtype=F64), xs)[1][0].sum())(w)
    scanned = tf.grad(lambda w: tf.scan(step(w), torch.zeros(3, dtype=F64), xs)[1][0].sum())
    torch.testing.assert_close(scanned(w), expected)
    torch.testing.assert_close(tf.jit(scanned)(w), expected)


def _dropped(x, w):
    return torch.nn.functional.dropout(torch.tanh(x @ w), 0.5)


@pytest.mark.parametrize("construct", ["scan", "cond"])
def test_random_draws_in_a_body_are_the_forwards_in_the_backward(construct):
    """The backward reads the mask the forward drew (saved with the body's residuals), never a new draw:
    the jitted function's gradient is eager's under the same seed."""
    w, xs = _randn(4, 4), _randn(6, 3, 4).abs()

    def step(w):
        def body(h, x):
            h = _dropped(h + x, w)
            return h, (h,)
        return body

    def structured(w):
        if construct == "scan":
            return tf.scan(step(w), torch.zeros(3, 4, dtype=F64), xs)[1][0].sum()
        return tf.cond(xs.sum() > 0, _dropped, lambda x, w: x @ w, xs[0], w).sum()

    def in_python(w):
        if construct == "scan":
            return _scan_in_python(step(w), torch.zeros(3, 4, dtype=F64), xs)[1][0].sum()
        return _dropped(xs[0], w).sum()

    grads = []
    for fn in (tf.jit(structured), in_python):
        wg = w.clone().requires_grad_()
        torch.manual_seed(3)
        fn(wg).backward()
        grads.append(wg.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_cond_takes_real_tensors_among_its_operands_inside_traced_code():
    x, w = _randn(3).abs(), _randn(3)
    got = tf.grad(lambda w: tf.cond(w.sum() > -100, lambda x, w: (x * w).sin(), lambda x, w: x, x, w).sum())(w)
    torch.testing.assert_close(got, x * (x * w).cos())
