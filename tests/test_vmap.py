"""vmap: the batched program computes every example as the function does alone, agrees with
torch.func.vmap, composes with jit, grad and itself, prints as one batched trace (no loop
over examples), and refuses what it cannot batch with an error naming the argument or op."""
import optree
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

import thunderfn as tf
from thunderfn import prims
from thunderfn.core.rules import TAG_NOT_BATCHED, BatchRule, rules, rules_of
from thunderfn.errors import BatchingError
from thunderfn.prims import PrimIDs
from thunderfn.testing import strategies as tst

FUNCTIONS = {  # name -> (fn, per-example shapes of its args)
    "elementwise": (lambda a, b: torch.sin(a) * b.exp() - a ** 2 / (b.abs() + 1), [(3, 4), (3, 4)]),
    "broadcast_scalar_example": (lambda a, b: a.sum() * b + torch.where(b > 0, a.mean(), b), [(3, 4), (4,)]),
    "reductions": (lambda a, b: a.amax(0) + a.amin(-1).sum() + a.prod(1).sum() + a.var(0) + b, [(3, 4), (4,)]),
    "var_mean": (lambda a, b: torch.var_mean(a, 1)[0] * torch.var_mean(a, 1)[1] + b[:3], [(3, 4), (4,)]),
    "shapes": (lambda a, b: torch.cat([a.T.reshape(2, 6), b.reshape(2, 2).flip(0)], 1).unsqueeze(0).squeeze(0)[:, 1::2],
               [(3, 4), (4,)]),
    "matmul_matrix_vector": (lambda a, b: a @ b + (b @ b), [(3, 4), (4,)]),
    "matmul_batched_stack": (lambda a, b: (a.reshape(2, 3, 2) @ b.reshape(2, 2)).sum(0), [(3, 4), (4,)]),
    "softmax_layer_norm": (lambda a, b: F.layer_norm(a.softmax(-1), (4,)) * b, [(3, 4), (4,)]),
    "indexing": (lambda a, b: (a[torch.tensor([2, 0])].sum(0) + a[:, b.argmax()].sum()
                               + a.gather(1, torch.tensor([[0], [1], [3]]))),
                 [(3, 4), (4,)]),
    "scans_sort": (lambda a, b: a.cumsum(1) + torch.sort(a, 1).values - torch.topk(b, 2).values.sum(), [(3, 4), (4,)]),
    "pad_convert": (lambda a, b: F.pad(a, (1, 1)).to(torch.float32).double() + 1, [(3, 4), (4,)]),
    "factories": (lambda a, b: a + torch.ones(3, 4, dtype=a.dtype) * torch.arange(4, dtype=a.dtype), [(3, 4), (4,)]),
    # torch.func.vmap at run time
    "opaque_torch_op": (lambda a, b: F.max_pool1d(a[None], 2)[0] + b[:2], [(3, 4), (4,)]),
}
BATCH = 5


def _batched_inputs(shapes, axes, seed=0):
    out = []
    for i, (shape, axis) in enumerate(zip(shapes, axes)):
        x = tst.make((BATCH,) + shape, torch.float64, seed + i)
        out.append(x if axis is None else x.movedim(0, axis))
    return out


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("axes", [(0, 0), (-1, None)], ids=["both_at_0", "first_at_-1_second_shared"])
def test_vmap_equals_the_function_on_each_example(name, axes):
    """vmap(f, in_axes)(xs)[i] == f(xs[i]) for every example i, and agrees with torch.func.vmap."""
    fn, shapes = FUNCTIONS[name]
    inputs = _batched_inputs(shapes, axes)
    if axes[1] is None:
        inputs[1] = inputs[1][0]
    out = tf.vmap(fn, in_axes=axes)(*inputs)
    for i in range(BATCH):
        example = [x.select(a % x.ndim, i) if a is not None else x for x, a in zip(inputs, axes)]
        torch.testing.assert_close(out[i], fn(*example))
    torch.testing.assert_close(out, torch.func.vmap(fn, in_dims=axes)(*inputs))


@given(tst.programs(), tst.program_inputs(dtypes=(torch.float64,)), st.integers(2, 4))
def test_vmap_of_a_random_program_is_the_program_on_each_example(program, inputs, batch):
    """vmap(program)(xs)[i] == program(xs[i]): the inputs stacked along a new leading dim of
    `batch` examples (the k-th example scaled by k + 1 so examples differ)."""
    try:
        program(*inputs)
    except RuntimeError:
        assume(False)
    stacked = [torch.stack([x * (k + 1) for k in range(batch)]) for x in inputs]
    out = tf.vmap(program)(*stacked)
    for k in range(batch):
        torch.testing.assert_close(out[k], program(*(x[k] for x in stacked)), equal_nan=True)


@given(tst.programs(in_place=True), tst.program_inputs(dtypes=(torch.float64,)), st.integers(2, 4))
def test_vmap_of_a_random_in_place_program_writes_each_example_as_the_program_does(program, inputs, batch):
    """For programs that write into their inputs: vmap(program)(xs)[i] == program(xs[i]), and
    afterwards xs[i] holds what program left in its i-th example's inputs."""
    try:
        program(*(x.clone() for x in inputs))
    except RuntimeError:
        assume(False)
    stacked = [torch.stack([x * (k + 1) for k in range(batch)]) for x in inputs]
    examples = [[x[k].clone() for x in stacked] for k in range(batch)]
    try:
        out = tf.vmap(program)(*stacked)
    except tf.UnsupportedOpError:  # a write through a view jit refuses as well (not a vmap limitation)
        with pytest.raises(tf.UnsupportedOpError):
            tf.jit(program)(*(x.clone() for x in inputs))
        assume(False)
    for k in range(batch):
        torch.testing.assert_close(out[k], program(*examples[k]), equal_nan=True)
        for written, expected in zip(stacked, examples[k]):
            torch.testing.assert_close(written[k], expected, equal_nan=True)


# -- composition ---------------------------------------------------------------------------------
def _mlp_params():
    g = torch.Generator().manual_seed(0)
    return {"w1": torch.randn(4, 8, dtype=torch.float64, generator=g),
            "b1": torch.randn(8, dtype=torch.float64, generator=g),
            "w2": torch.randn(8, 3, dtype=torch.float64, generator=g),
            "b2": torch.randn(3, dtype=torch.float64, generator=g)}


def _mlp_mse(p, x, y):
    return F.mse_loss(torch.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"], y)


def _mlp_cross_entropy(p, x, target):  # one example: a batch of 1 for cross_entropy
    return F.cross_entropy((torch.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])[None], target[None])


@pytest.mark.parametrize("loss", [_mlp_mse, _mlp_cross_entropy], ids=["mse", "cross_entropy"])
def test_per_example_gradients_match_torch_func(loss):
    """vmap(grad(loss), in_axes=(None, 0, 0)): one gradient per example, as torch.func computes."""
    params, x = _mlp_params(), tst.make((6, 4), torch.float64, 1)
    y = tst.make((6, 3), torch.float64, 2) if loss is _mlp_mse else torch.tensor([0, 2, 1, 1, 0, 2])
    grads = tf.vmap(tf.grad(loss), in_axes=(None, 0, 0))(params, x, y)
    expected = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    assert set(grads) == set(expected)
    for k in expected:
        assert grads[k].shape == (6,) + params[k].shape
        torch.testing.assert_close(grads[k], expected[k])


def test_jit_of_vmap_prints_one_batched_trace_without_a_loop():
    f = lambda a, w: torch.tanh(a @ w).sum(-1)  # noqa: E731
    jitted = tf.jit(tf.vmap(f, in_axes=(0, None)))
    a, w = tst.make((BATCH, 3, 4), torch.float64, 0), tst.make((4, 2), torch.float64, 1)
    torch.testing.assert_close(jitted(a, w), torch.func.vmap(f, in_dims=(0, None))(a, w))
    source = str(tf.last_traces(jitted)[0])
    assert "for " not in source and source.count("prims.matmul") == 1 and source.count("prims.tanh") == 1
    assert "f64[5, 3, 2]" in source  # the batched matmul's output: the whole batch at once


def test_vmap_of_vmap_and_of_jit_and_grad_of_vmap():
    a, b = tst.make((3, 5, 4), torch.float64, 0), tst.make((5, 4), torch.float64, 1)
    f = lambda x, y: (x * y).sum() + x.max()  # noqa: E731
    nested = tf.vmap(tf.vmap(f, in_axes=(0, 0)), in_axes=(0, None))(a, b)
    torch.testing.assert_close(nested, torch.func.vmap(torch.func.vmap(f), in_dims=(0, None))(a, b))
    g = lambda x: x.softmax(-1) * 3  # noqa: E731
    torch.testing.assert_close(tf.vmap(tf.jit(g))(a), g(a))
    h = lambda x: (torch.sin(x) @ x.T).sum()  # noqa: E731
    torch.testing.assert_close(tf.grad(lambda x: tf.vmap(h)(x).sum())(a),
                               torch.func.grad(lambda x: torch.func.vmap(h)(x).sum())(a))


def test_vmap_composes_with_jvp_both_ways_and_grad_through_an_opaque_op():
    a, t = tst.make((3, 5, 4), torch.float64, 0), tst.make((3, 5, 4), torch.float64, 1)
    f = lambda x: (x.sin() * x).sum()  # noqa: E731
    _, expected = torch.func.jvp(torch.func.vmap(f), (a,), (t,))
    torch.testing.assert_close(tf.jvp(tf.vmap(f), (a,), (t,))[1], expected)
    torch.testing.assert_close(tf.vmap(lambda x, v: tf.jvp(f, (x,), (v,))[1])(a, t), expected)
    pooled = lambda x: F.max_pool1d(x[None], 2).sum()  # noqa: E731  (an opaque op inside: torch.func.vmap, then torch.func.vjp)
    torch.testing.assert_close(tf.grad(lambda x: tf.vmap(pooled)(x).sum())(a),
                               torch.func.grad(lambda x: torch.func.vmap(pooled)(x).sum())(a))


# -- in_axes and out_axes ----------------------------------------------------------------------------
def test_out_axes_pytrees_and_unbatched_outputs():
    a, b = tst.make((3, 5, 4), torch.float64, 0), tst.make((5, 4), torch.float64, 1)
    torch.testing.assert_close(tf.vmap(lambda x: x.T, out_axes=-1)(a), a.transpose(1, 2).movedim(0, -1))
    # an output the same for every example is broadcast along out_axes (torch.func's behaviour)
    total, shared = tf.vmap(lambda x, y: (x.sum(), y * 2), in_axes=(0, None), out_axes=(0, 1))(a, b)
    torch.testing.assert_close(total, a.sum((1, 2)))
    torch.testing.assert_close(shared, (b * 2).unsqueeze(1).expand(5, 3, 4))
    d = tf.vmap(lambda p: {"s": p["x"] + p["y"], "n": p["x"].sum()}, in_axes=({"x": 1, "y": None},),
                out_axes={"s": 0, "n": 0})({"x": a.movedim(0, 1), "y": b})
    torch.testing.assert_close(d["s"], a + b)
    torch.testing.assert_close(d["n"], a.sum((1, 2)))
    doubled, three = tf.vmap(lambda x: (x * 2, 3), out_axes=(0, None))(a)  # a non-tensor output: out_axes None
    assert three == 3
    torch.testing.assert_close(doubled, a * 2)


# torch.func's sentence first (tests/test_torch_func_wording.py holds it to torch's), then which argument
@pytest.mark.parametrize("call, error, message", [
    (lambda: tf.vmap(torch.sin, in_axes=2)(torch.ones(3, 4)), ValueError,
     r"expected in_dim to satisfy -2 <= in_dim < 2\. \(args\[0\] has shape \(3, 4\)\)"),
    (lambda: tf.vmap(lambda x, p: x + p["w"], in_axes=(0, {"w": 0}))(torch.ones(3), {"w": torch.ones(4)}),
     ValueError, r"got sizes \[3, 4\] .*args\[0\] has 3 along its batch dim but args\[1\]\['w'\] has 4"),
    (lambda: tf.vmap(lambda x, s: x * s)(torch.ones(3), 2.0), ValueError,
     r"input is of type <class 'float'>.*\(args\[1\]\)"),
    (lambda: tf.vmap(torch.sin, in_axes=None)(torch.ones(3)), ValueError, "Expected at least one Tensor to vmap over"),
    (lambda: tf.vmap(lambda x, y: x + y, in_axes=(0,))(torch.ones(3), torch.ones(3)), ValueError,
     "one entry per positional argument"),
    (lambda: tf.vmap(lambda x: x * 2, out_axes=None)(torch.ones(3)), ValueError,
     r"when out_dim is None \(output differs between examples"),
    (lambda: tf.vmap(lambda x: x * 2, out_axes=2)(torch.ones(3)), IndexError,
     r"Dimension out of range .*out_axes gives output the batch dim 2"),
    (lambda: tf.vmap(lambda x: (x, 3))(torch.ones(3)), ValueError,
     r"got type <class 'int'>.*out_axes gives output\[1\] the batch dim 0"),
])
def test_vmap_errors_name_the_argument_and_the_problem(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_vmap_refuses_random_ops_in_error_mode_and_bad_options_by_name():
    with pytest.raises(BatchingError, match="random operation .*randomness error mode"):
        tf.vmap(lambda x: x + torch.rand(3))(torch.ones(2, 3))
    with pytest.raises(ValueError, match="chunk_size should be None or greater than 0"):
        tf.vmap(torch.sin, chunk_size=0)
    with pytest.raises(RuntimeError, match="Only allowed values for randomness are 'error', 'different', or 'same'"):
        tf.vmap(torch.sin, randomness="sometimes")


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7])
def test_chunk_size_gives_the_whole_batch_result(chunk_size):
    """vmap(f, chunk_size=k) == vmap(f) for k dividing the batch or not, with outputs at
    different out_axes (an unbatched one among them)."""
    f = lambda a, w: (torch.tanh(a @ w).sum(-1), w * 2, a.T)  # noqa: E731
    a, w = tst.make((3, 7, 4), torch.float64, 0), tst.make((4, 2), torch.float64, 1)
    kwargs = dict(in_axes=(1, None), out_axes=(0, None, -1))
    jitted = tf.jit(tf.vmap(f, **kwargs, chunk_size=chunk_size))
    for got, expected in zip(jitted(a, w), torch.func.vmap(f, in_dims=(1, None), out_dims=(0, None, -1))(a, w)):
        torch.testing.assert_close(got, expected)
    assert str(tf.last_traces(jitted)[0]).count("prims.matmul") == -(-7 // chunk_size)  # one per chunk


def test_a_custom_vjp_function_keeps_its_rule_under_vmap_and_grad_in_either_order():
    """The rule (here 100x the true derivative in x, the true one in w) is what both orders
    differentiate; w, shared by the examples, gets the sum of the per-example cotangents."""
    @tf.custom_vjp
    def scaled_sin(x, w):
        return torch.sin(x) * w

    scaled_sin.defvjp(lambda x, w: (torch.sin(x) * w, (x, w)),
                      lambda res, g: (g * 100 * res[1], g * torch.sin(res[0])))
    x, w = tst.make((4, 3), torch.float64, 0), tst.make((3,), torch.float64, 1)
    batched = tf.vmap(scaled_sin, in_axes=(0, None))
    torch.testing.assert_close(batched(x, w), torch.sin(x) * w)
    gx, gw = tf.grad(lambda x, w: batched(x, w).sum(), argnums=(0, 1))(x, w)
    torch.testing.assert_close(gx, 100 * w.expand(4, 3))
    torch.testing.assert_close(gw, torch.sin(x).sum(0))
    per_example = tf.vmap(tf.grad(lambda x, w: scaled_sin(x, w).sum()), in_axes=(0, None))(x, w)
    torch.testing.assert_close(per_example, 100 * w.expand(4, 3))


def test_in_place_writes_batch_into_the_batched_input_and_refuse_unbatched_targets():
    def add_into(x, y):
        x.add_(y)
        return x

    x, y = torch.ones(3, 4), tst.make((3, 4), torch.float32, 0)
    out = tf.vmap(add_into)(x, y)
    torch.testing.assert_close(out, 1 + y)
    torch.testing.assert_close(x, 1 + y)  # written back, as torch.func.vmap writes it
    with pytest.raises(BatchingError, match="in-place operation writes a batched value"):
        tf.vmap(add_into, in_axes=(None, 0))(torch.ones(4), y)
    x = torch.ones(4, 3)  # batched at dim 1, in chunks of 2 (the last one 1): each chunk's update written back
    out = tf.vmap(add_into, in_axes=(1, 0), chunk_size=2)(x, y[:, :4])
    torch.testing.assert_close(x, 1 + y[:, :4].T)
    torch.testing.assert_close(out, 1 + y[:, :4])


def _shared_draw(x):
    return x + torch.rand(8)  # no batched input: one draw, or one per example


def _dropout_of_example(x):
    return F.dropout(x, 0.5)  # a batched input


@pytest.mark.parametrize("randomness", ["different", "same"])
@pytest.mark.parametrize("fn", [_shared_draw, _dropout_of_example])
def test_randomness_draws_what_torch_func_vmap_draws_under_a_seed(fn, randomness):
    """Random ops are batched by torch.func.vmap in the same mode: under one seed both draw the
    same values, per example for 'different', shared where the inputs are for 'same'."""
    x = torch.ones(4, 8)
    torch.manual_seed(0)
    got = tf.vmap(fn, randomness=randomness)(x)
    torch.manual_seed(0)
    expected = torch.func.vmap(fn, randomness=randomness)(x)
    torch.testing.assert_close(got, expected)
    rows_equal = all(torch.equal(got[0], got[i]) for i in range(1, 4))
    assert rows_equal == (randomness == "same")  # x's rows are equal: only the draws differ


_RANDOM_OPS = {  # every random op follows vmap's randomness: the dropout family and the samplers
    "dropout": (lambda x: F.dropout(x, 0.5), (3, 4, 5)),
    "dropout1d": (lambda x: F.dropout1d(x, 0.5), (3, 4)),
    "dropout2d": (lambda x: F.dropout2d(x, 0.5), (3, 4, 5)),
    "dropout3d": (lambda x: F.dropout3d(x, 0.5), (3, 4, 5, 6)),
    "alpha_dropout": (lambda x: F.alpha_dropout(x, 0.5, True), (3, 4, 5)),
    "feature_alpha_dropout": (lambda x: F.feature_alpha_dropout(x, 0.5, True), (3, 4, 5)),
    "standard_gamma": (lambda x: torch._standard_gamma(x + 1), (3, 4, 5)),
    "binomial": (lambda x: torch.binomial(x + 4, torch.full_like(x, 0.5)), (3, 4, 5)),
    "sample_dirichlet": (lambda x: torch._sample_dirichlet(x + 1), (3, 4, 5)),
}


def _vmapped(vmap, op, shape, randomness, shared):
    """op over a batch of 4: of a batched input, or of one shared by every example (in_axes None)."""
    if shared:
        return vmap(lambda _, z: op(z), in_dims=(0, None), randomness=randomness)(torch.ones(4), torch.ones(shape))
    return vmap(op, randomness=randomness)(torch.ones(4, *shape))


def _tf_vmap(fn, in_dims=0, randomness="error"):
    return tf.vmap(fn, in_axes=in_dims, randomness=randomness)


@pytest.mark.parametrize("shared", [False, True], ids=["batched", "shared"])
@pytest.mark.parametrize("name", _RANDOM_OPS)
def test_every_random_op_follows_randomness_as_torch_func(name, shared):
    op, shape = _RANDOM_OPS[name]
    with pytest.raises(BatchingError, match="random operation .*randomness error mode"):
        _vmapped(_tf_vmap, op, shape, "error", shared)
    with pytest.raises(RuntimeError):
        _vmapped(torch.func.vmap, op, shape, "error", shared)
    for randomness in ("different", "same"):
        torch.manual_seed(0)
        try:
            expected = _vmapped(torch.func.vmap, op, shape, randomness, shared)
        except RuntimeError:  # torch.func refuses 'same' with a batched input to a sampler: so does vmap
            with pytest.raises(BatchingError, match="same randomness"):
                _vmapped(_tf_vmap, op, shape, randomness, shared)
            continue
        torch.manual_seed(0)
        got = _vmapped(_tf_vmap, op, shape, randomness, shared)
        torch.testing.assert_close(got, expected)  # the same draws under a seed
        rows_equal = all(torch.equal(got[0], got[i]) for i in range(1, 4))
        assert rows_equal == (randomness == "same")  # every example's input is the same: only draws differ


@pytest.mark.parametrize("name", ["standard_gamma", "binomial", "sample_dirichlet"])
def test_samplers_run_under_jit_with_eagers_draws(name):
    op, shape = _RANDOM_OPS[name]
    x = torch.ones(shape)
    torch.manual_seed(3)
    expected = op(x)
    torch.manual_seed(3)
    torch.testing.assert_close(tf.jit(op)(x), expected)


@pytest.mark.parametrize("fn", [lambda x: F.dropout(x, 0.5), lambda x: x + torch.rand(()),
                                lambda x: torch.bernoulli(torch.full((3,), 0.5)) * x],
                         ids=["dropout_of_batched", "rand_shared", "bernoulli_shared"])
def test_chunk_size_with_same_randomness_draws_what_torch_func_draws(fn):
    """Every chunk draws from the generator's state before the first, as torch.func's chunks: the same values
    for the whole batch, and the generator left where one chunk's draws leave it."""
    for chunk_size in (1, 3, 4):
        results = []
        for vmap in (torch.func.vmap, tf.vmap):
            torch.manual_seed(0)
            try:
                out = vmap(fn, randomness="same", chunk_size=chunk_size)(torch.ones(4, 3))
                results.append((out, torch.rand(2)))
            except RuntimeError as e:  # torch.func refuses same randomness on a batched input
                results.append(str(e).split(".")[0])
        if isinstance(results[0], str):
            assert isinstance(results[1], str) and results[0] in results[1]
        else:
            torch.testing.assert_close(results[1], results[0])


def test_nested_vmap_of_a_factory_draw_with_different_randomness():
    inner = tf.vmap(lambda x: torch.randn(()), randomness="different")
    out = tf.vmap(inner, randomness="different")(torch.ones(2, 3))
    assert out.shape == (2, 3) and len(set(out.flatten().tolist())) == 6
    same = tf.vmap(tf.vmap(lambda x: torch.randn(()), randomness="same"), randomness="same")(torch.ones(2, 3))
    assert len(set(same.flatten().tolist())) == 1


def test_per_example_gradients_through_dropout_with_different_randomness_match_torch_func():
    def loss(w, x):
        return F.dropout(x * w, 0.5).sum()

    w, xs = torch.ones(3), torch.randn(6, 3)
    torch.manual_seed(1)
    got = tf.jit(tf.vmap(tf.grad(loss), in_axes=(None, 0), randomness="different"))(w, xs)
    torch.manual_seed(1)
    expected = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0), randomness="different")(w, xs)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("mask", [None, "causal_2d"])
def test_attention_folds_the_batch_into_its_own_batch_dim_one_call(mask):
    attn_mask = None if mask is None else torch.ones(8, 8, dtype=torch.bool).tril()

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)

    q, k, v = (torch.randn(3, 2, 4, 8, 16) for _ in range(3))
    jf = tf.jit(tf.vmap(attend))
    torch.testing.assert_close(jf(q, k, v), torch.stack([attend(q[i], k[i], v[i]) for i in range(3)]))
    calls = [b.sym.name for b in tf.last_traces(jf)[-1].bound_symbols]
    # one attention call on the folded batch (the sdpa executor's kernel), not its math decomposition
    assert sum("sdpa" in c or "scaled_dot_product" in c for c in calls) == 1 and "torch.matmul" not in calls


@pytest.mark.parametrize("mask", [None, "bool_2d", "per_example_4d"])
@pytest.mark.parametrize("axes", [(0, 0, 0), (1, None, 0)], ids=["all_batched", "kv_shared_q_at_1"])
def test_per_example_gradients_through_claimed_attention_fold_into_one_fused_forward_and_backward(mask, axes):
    """vmap(grad(f)) where the sdpa executor claims f's attention: its fused forward and backward
    operators batch by folding the vmapped batch into the kernels' batch (one call each), and the
    gradients are torch.func's."""
    q = torch.randn(3, 2, 4, 4, 8)
    masks = {None: None, "bool_2d": torch.ones(4, 4, dtype=torch.bool).tril(),
             "per_example_4d": torch.randn(3, 2, 1, 4, 4)}
    m = masks[mask]
    if mask == "per_example_4d":
        def loss(q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m).sum()
        axes, extra = axes + (0,), [m]
    else:
        def loss(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m).sum()
        extra = []
    inputs = [(q * (i + 1)).movedim(0, a) if a is not None else q[0] * (i + 1) for i, a in enumerate(axes[:3])] + extra
    per_example = tf.jit(tf.vmap(tf.grad(loss, argnums=(0, 1, 2)), in_axes=axes))
    got = per_example(*inputs)
    expected = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)), in_dims=axes)(*inputs)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    calls = [b.sym.name for b in tf.last_traces(per_example)[-1].bound_symbols]
    assert calls.count("sdpa_flash_cpu_fwd") == 1 and calls.count("sdpa_flash_cpu_bwd") == 1


def test_per_example_gradients_of_a_module_through_functional_call_match_torch_func():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    params = {name: p.detach() for name, p in model.named_parameters()}
    xs, ys = torch.randn(5, 4), torch.randn(5, 2)

    def loss(call, params, x, y):
        return ((call(model, params, (x,)) - y) ** 2).sum()

    got = tf.vmap(tf.grad(lambda p, x, y: loss(tf.functional_call, p, x, y)), in_axes=(None, 0, 0))(params, xs, ys)
    expected = torch.func.vmap(torch.func.grad(lambda p, x, y: loss(torch.func.functional_call, p, x, y)),
                               in_dims=(None, 0, 0))(params, xs, ys)
    for name in params:
        torch.testing.assert_close(got[name], expected[name])


@pytest.mark.parametrize("fn", [lambda x: torch.tensor(1.0), lambda x: (x, torch.ones(2)), lambda x: _CAPTURED],
                         ids=["torch_tensor", "factory", "captured"])
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_an_output_the_same_for_every_example_is_broadcast_as_torch_func(fn, chunk_size):
    x = torch.ones(3, 2)
    got = tf.vmap(fn, chunk_size=chunk_size)(x)
    torch.testing.assert_close(got, torch.func.vmap(fn, chunk_size=chunk_size)(x))
    for i in range(3):  # vmap(f)(x)[i] == f(x[i])
        torch.testing.assert_close(optree.tree_map(lambda t: t[i], got), fn(x[i]))


_CAPTURED = torch.tensor([1.0, -2.0])


# -- coverage ------------------------------------------------------------------------------
def _not_batched(p) -> bool:
    return TAG_NOT_BATCHED in getattr(prims, p.name.lower()).tags


def test_every_prim_has_a_batching_rule_or_a_reason():
    """Each prim has a batching rule or is tagged as never batched (it takes no tensor), not both."""
    for p in PrimIDs:
        assert (rules_of(p).batch is not None) != _not_batched(p), f"prims.{p.name.lower()}: a rule or the tag"
    # a prim declared without a rule is one the driver never batches: it takes no tensor
    not_batched = [p for p in PrimIDs if _not_batched(p)]
    assert not_batched
    for p in not_batched:
        x = tst.make((BATCH, 3), torch.float64, 0)
        made = {PrimIDs.FULL: lambda a: prims.full((3,), 2.0, device=a.device, dtype=a.dtype),
                PrimIDs.IOTA: lambda a: prims.iota(3, start=0, step=1, device=a.device, dtype=a.dtype)}[p]
        torch.testing.assert_close(tf.vmap(lambda a: a + made(a))(x), x + made(x))


def test_every_batching_table_entry_is_a_batch_rule():
    batch_rules = [record.batch for record in rules.values() if record.batch is not None]
    assert batch_rules and all(isinstance(rule, BatchRule) for rule in batch_rules)


# -- ensembles: tf.stack_module_state with tf.functional_call -------------------------------------
class _MLP(torch.nn.Module):
    def __init__(self, hidden=5):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(3, hidden), torch.nn.Linear(hidden, 2)
        self.norm = torch.nn.BatchNorm1d(hidden)

    def forward(self, x):
        return self.l2(self.norm(torch.relu(self.l1(x))))


def test_an_ensemble_of_stacked_mlps_under_vmap_computes_each_model():
    models = [_MLP().eval() for _ in range(3)]
    for m in models:  # buffers that differ between the models, so using the wrong one shows
        m.norm.running_mean.normal_()
    params, buffers = tf.stack_module_state(models)
    expected_params, expected_buffers = torch.func.stack_module_state(models)
    for mine, torchs in ((params, expected_params), (buffers, expected_buffers)):
        assert list(mine) == list(torchs)
        for name in mine:
            torch.testing.assert_close(mine[name], torchs[name])
            assert mine[name].requires_grad == torchs[name].requires_grad
            assert mine[name].is_leaf and mine[name].grad_fn is None
    assert all(p.requires_grad for p in params.values()) and not any(b.requires_grad for b in buffers.values())
    x = torch.randn(4, 3)
    out = tf.vmap(lambda p, b, x: tf.functional_call(models[0], (p, b), (x,)), in_axes=(0, 0, None))(params, buffers, x)
    assert out.shape == (3, 4, 2)
    for i, m in enumerate(models):
        torch.testing.assert_close(out[i], m(x))


def test_stack_module_state_refuses_what_torch_refuses_in_its_words():
    with pytest.raises(RuntimeError, match="stack_module_state: Expected at least one model, got 0."):
        tf.stack_module_state([])
    with pytest.raises(RuntimeError, match="Expected all models to be of the same class"):
        tf.stack_module_state([_MLP(), torch.nn.Linear(3, 2)])
    with pytest.raises(RuntimeError, match="Expected all models to have the same training/eval mode"):
        tf.stack_module_state([_MLP(), _MLP().eval()])
    with pytest.raises(RuntimeError, match=r"Expected l1.weight from each model to have the same shape"):
        tf.stack_module_state([_MLP(5), _MLP(6)])
    frozen = _MLP()
    frozen.l1.weight.requires_grad_(False)
    with pytest.raises(RuntimeError, match="Expected l1.weight from each model to have the same .requires_grad"):
        tf.stack_module_state([_MLP(), frozen])
    extra = _MLP()
    extra.l3 = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="Expected all models to have the same parameters, but model 1 has"):
        tf.stack_module_state([_MLP(), extra])


def test_functional_call_takes_torchs_tuple_of_dicts():
    model = torch.nn.Linear(3, 2)
    weight, bias = {"weight": torch.zeros(2, 3)}, {"bias": torch.ones(2)}
    torch.testing.assert_close(tf.functional_call(model, (weight, bias), (torch.randn(4, 3),)), torch.ones(4, 2))
    with pytest.raises(ValueError, match="appeared in multiple dictionaries"):
        tf.functional_call(model, (weight, weight), (torch.randn(4, 3),))
    with pytest.raises(tf.errors.ArgumentValueError, match=r"has no parameters or buffers named \['bais'\]"):
        tf.functional_call(model, (weight, {"bais": torch.ones(2)}), (torch.randn(4, 3),))
