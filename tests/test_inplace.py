"""In-place operations are functionalized: every result, every mutated input and every
returned object is what eager PyTorch gives, or the call is refused before it writes."""
import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.executors import FusionExecutor, OperatorExecutor


class RunsRegionsWithTorch(FusionExecutor):
    """A stand-in fusion executor: fuses every candidate but indexing (which checks its indices
    when it runs), and runs a region's ops with torch."""

    def __init__(self):
        super().__init__("inplace_regions")

    def can_fuse(self, bsym):
        return "gather" not in bsym.sym.name and "index" not in bsym.sym.name

    def compile_region(self, region):
        return region.unfused


def _iadd(a, b):
    a += b
    return a


def _setitem_rows(a, b):
    h = a * 1
    h[0] = b[0]
    h[1:, ::2] = 0.5
    return h


def _view_write_back(a, b):
    h = a.clone()
    h[:, 1] *= 3           # getitem view, in-place, then setitem: all into h
    h[..., 0] += b[:, 0]
    return h


def _chain(a, b):
    h = a + 0
    h.mul_(2).add_(b).clamp_(min=0)  # in-place methods return their target
    return h.sqrt_()


def _inplace_flags(a, b):
    h = a - b
    F.relu(h, inplace=True)
    F.dropout(h, p=0.0, training=True, inplace=True)
    return h


def _fills(a, b):
    h = torch.empty_like(a)
    h.copy_(b)
    h[0].zero_()
    h[1].fill_(7.0)
    return h


def _advanced_setitem(a, b):
    h = a.clone()
    h[torch.tensor([0, 2])] = b[:2]
    return h


def _out_argument(a, b):
    out = torch.empty_like(a)
    torch.add(a, b, out=out)
    return out


def _dtype_kept(a, b):
    h = torch.zeros(a.shape, dtype=torch.float64)
    h += a  # float32 into float64: the target keeps its dtype
    return h


FUNCTIONS = {f.__name__.lstrip("_"): f for f in (
    _iadd, _setitem_rows, _view_write_back, _chain, _inplace_flags, _fills, _advanced_setitem, _out_argument,
    _dtype_kept)}


@pytest.mark.parametrize("executors", [None, ["torch_prims"]], ids=["torch", "decomposed"])
@pytest.mark.parametrize("fn", FUNCTIONS.values(), ids=FUNCTIONS.keys())
def test_in_place_program_matches_eager_including_mutated_inputs(fn, executors):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    a_eager, a_jit = a.clone(), a.clone()
    expected = fn(a_eager, b)
    got = tf.jit(fn, executors=executors, fallback=executors is None)(a_jit, b)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(a_jit, a_eager)  # the caller sees the same mutation of its input


def test_mutated_input_that_is_returned_is_the_callers_tensor():
    a = torch.zeros(3)
    out = tf.jit(lambda x: x.add_(1))(a)
    assert out is a and torch.equal(a, torch.ones(3))


def test_mutating_an_input_is_written_back_once_per_call():
    jf = tf.jit(lambda x: x.mul_(2))
    a = torch.ones(2)
    jf(a)
    jf(a)
    assert torch.equal(a, torch.full((2,), 4.0))
    assert "x.copy_(" in str(tf.last_traces(jf)[-1])


def test_mutating_a_captured_tensor_updates_it_as_eager_does():
    counter = torch.zeros(())
    jf = tf.jit(lambda x: (counter.add_(1), x * counter)[1])
    torch.testing.assert_close(jf(torch.ones(2)), torch.ones(2))
    torch.testing.assert_close(jf(torch.ones(2)), torch.full((2,), 2.0))
    assert counter.item() == 2


def test_inputs_that_share_memory_are_refused_when_the_function_mutates_inputs():
    a = torch.zeros(3)
    jf = tf.jit(lambda x, y: (x.add_(1), y * 2)[1])
    with pytest.raises(RuntimeError, match="share memory"):
        jf(a, a)


def test_functions_that_do_not_mutate_inputs_pay_no_aliasing_check():
    jf = tf.jit(lambda x, y: x + y)
    a = torch.ones(2)
    jf(a, a)
    assert "inputs_do_not_alias" not in str(tf.last_traces(jf)[-1])


def test_in_place_on_an_intermediate_does_not_touch_the_input():
    a = torch.ones(2)
    jf = tf.jit(lambda x: (x * 2).add_(1))
    torch.testing.assert_close(jf(a), torch.full((2,), 3.0))
    assert torch.equal(a, torch.ones(2)) and "copy_" not in str(tf.last_traces(jf)[-1])


def test_in_place_result_dtype_that_cannot_be_cast_raises_like_torch():
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        tf.jit(lambda x: x.add_(0.5))(torch.ones(2, dtype=torch.int64))


def test_in_place_broadcast_beyond_target_raises_like_torch():
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast shape \[2, 3\]"):
        tf.jit(lambda x, y: x.add_(y))(torch.ones(3), torch.ones(2, 3))


def test_random_fill_in_place_draws_what_eager_draws():
    fn = lambda x: torch.empty_like(x).normal_(2.0, 0.5) + x.uniform_(-1, 1)  # noqa: E731
    a = torch.zeros(4)
    torch.manual_seed(3)
    expected = fn(a.clone())
    torch.manual_seed(3)
    torch.testing.assert_close(tf.jit(fn)(a.clone()), expected)


def test_module_buffer_updated_in_forward_is_written_to_the_module():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls += 1
            return x * self.calls

    module = Counter()
    jm = tf.jit(module)
    jm(torch.ones(2))
    out = jm(torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 2.0))
    assert module.calls.item() == 2


NORMS_WITH_RUNNING_STATS = {
    "batch_norm_1d": (lambda: torch.nn.BatchNorm1d(3), (8, 3)),
    "batch_norm_1d_length": (lambda: torch.nn.BatchNorm1d(3), (4, 3, 5)),
    "batch_norm_2d": (lambda: torch.nn.BatchNorm2d(3), (2, 3, 4, 4)),
    "instance_norm_1d": (lambda: torch.nn.InstanceNorm1d(3, track_running_stats=True), (4, 3, 5)),
    "instance_norm_2d_affine": (lambda: torch.nn.InstanceNorm2d(3, affine=True,
                                                                track_running_stats=True), (2, 3, 4, 4)),
}


@pytest.mark.parametrize("make, shape", NORMS_WITH_RUNNING_STATS.values(), ids=NORMS_WITH_RUNNING_STATS.keys())
def test_norm_training_updates_running_statistics_as_eager_does(make, shape):
    """Training mode: outputs, running_mean/var and num_batches_tracked match eager step by step."""
    import copy

    eager = make()
    traced = copy.deepcopy(eager)
    jitted = tf.jit(traced)
    for _ in range(3):
        x = torch.randn(*shape)
        torch.testing.assert_close(jitted(x), eager(x))
    for name, _ in eager.named_buffers():
        torch.testing.assert_close(getattr(traced, name), getattr(eager, name))


# -- views: a write through a view reaches its base, a write into a base reaches every view ----------
# Each view of a (3, 4) tensor, and whether eager lets one write through it.
VIEWS = {
    "select": (lambda y: y[1], True),
    "select_method": (lambda y: y.select(1, 2), True),
    "slice_with_step": (lambda y: y[:, ::2], True),
    "narrow": (lambda y: y.narrow(1, 1, 2), True),
    "transpose": (lambda y: y.t(), True),
    "permute_T": (lambda y: y.T, True),
    "movedim": (lambda y: y.movedim(0, 1), True),
    "view": (lambda y: y.view(2, 6), True),
    "reshape": (lambda y: y.reshape(4, 3), True),
    "flatten": (lambda y: y.flatten(), True),
    "unsqueeze": (lambda y: y.unsqueeze(0), True),
    "diagonal": (lambda y: y.diagonal(), True),
    "diagonal_offset": (lambda y: y.diagonal(1), True),
    "unbind": (lambda y: y.unbind(1)[2], True),
    "split": (lambda y: y.split(2, dim=1)[1], True),
    "chunk": (lambda y: y.chunk(3)[1], True),
    "unfold": (lambda y: y.unfold(1, 2, 2), True),
    "view_of_transpose": (lambda y: y.t()[1:, 0], True),
    "view_of_view": (lambda y: y[1:][:, 1::2].unsqueeze(-1), True),
    "same_tensor": (lambda y: y.to(y.dtype), True),
    "expand": (lambda y: y[0].expand(2, 4), False),  # read only: its elements share memory
}
WRITABLE = {name: view for name, (view, writable) in VIEWS.items() if writable}


def _base_written_then_view_returned(view):
    def fn(x):
        y = x.clone()
        v = view(y)
        y.sin_()
        return v  # eager: v shows the new values
    return fn


def _base_written_then_view_read(view):
    def fn(x):
        y = x * 2
        v = view(y)
        y[0, 1:] = x[2, :3]
        y.mul_(x)
        return v * 1.5 + y[2, 0]
    return fn


def _view_written_then_base_returned(view):
    def fn(x):
        y = x.clone()
        v = view(y)
        v.mul_(v + 1)
        return y, v
    return fn


def _view_written_then_sibling_read(view):
    def fn(x):
        y = x.clone()
        sibling = y.t()[:, 1:]
        v = view(y)
        v.add_(torch.ones_like(v))
        return sibling.exp(), y
    return fn


def _input_written_through_view(view):
    def fn(x):
        view(x).mul_(3)
        return x.sum(0)
    return fn


PROGRAMS = {"base written, view returned": (_base_written_then_view_returned, VIEWS),
            "base written, view read": (_base_written_then_view_read, VIEWS),
            "view written, base returned": (_view_written_then_base_returned, WRITABLE),
            "view written, sibling read": (_view_written_then_sibling_read, WRITABLE)}
CASES = [pytest.param(program(v if callable(v) else v[0]), id=f"{name}: {view_name}")
         for name, (program, views) in PROGRAMS.items() for view_name, v in views.items()]


@pytest.mark.parametrize("fn", CASES)
def test_writes_through_views_and_into_bases_match_eager_under_jit(fn):
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(tf.jit(fn)(x), fn(x))


@pytest.mark.parametrize("view", WRITABLE.values(), ids=WRITABLE.keys())
def test_writing_an_input_through_a_view_writes_the_callers_tensor(view):
    fn = _input_written_through_view(view)
    x = torch.randn(3, 4)
    eager_x, jit_x = x.clone(), x.clone()
    torch.testing.assert_close(tf.jit(fn)(jit_x), fn(eager_x))
    torch.testing.assert_close(jit_x, eager_x)


@pytest.mark.parametrize("fn", CASES)
def test_gradients_through_views_written_in_place_match_torch_autograd(fn):
    x = torch.randn(3, 4, dtype=torch.float64)
    weights = None

    def loss(x):
        nonlocal weights
        out = torch.cat([o.reshape(-1) for o in torch.utils._pytree.tree_leaves(fn(x))])
        if weights is None:
            weights = torch.randn(out.shape, dtype=out.dtype)
        return (out * weights).sum()

    eager_x = x.clone().requires_grad_()
    try:
        loss(eager_x).backward()
    except RuntimeError as e:  # eager autograd refuses writes into views of split/unbind/chunk
        assert "function that returns multiple views" in str(e)
        return
    torch.testing.assert_close(tf.grad(loss)(x), eager_x.grad)
    jit_x = x.clone().requires_grad_()
    tf.jit(loss)(jit_x).backward()
    torch.testing.assert_close(jit_x.grad, eager_x.grad)


@pytest.mark.parametrize("fn", CASES)
def test_tangents_through_views_written_in_place_match_torch_func(fn):
    x, t = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    expected = torch.func.jvp(fn, (x,), (t,))
    got = tf.jvp(fn, (x,), (t,))
    torch.testing.assert_close(got, expected)


# (under vmap an example's layout is not known: a reshape or flatten of it, a view or a copy in eager
# depending on it, is refused when written, as is reading it after its base was written)
@pytest.mark.parametrize("fn", [c for c in CASES if not c.id.endswith((": reshape", ": flatten"))])
def test_views_written_in_place_batch_like_torch_func(fn):
    xs = torch.randn(2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(tf.vmap(fn)(xs), torch.func.vmap(fn)(xs))


def test_writing_columns_of_an_input_under_jvp_keeps_the_other_columns_tangent():
    """jvp of a function writing into x[:, ::2]: the columns it does not write keep x's own tangent."""
    def fn(x, y):
        x[:, ::2].copy_(y)
        return x

    x, y = torch.randn(2, 4), torch.randn(2, 2)
    tx, ty = torch.randn(2, 4), torch.randn(2, 2)
    expected = torch.func.jvp(fn, (x.clone(), y), (tx, ty))
    torch.testing.assert_close(tf.jvp(fn, (x.clone(), y), (tx, ty)), expected)


def test_gradient_of_a_function_writing_its_input_is_taken_at_the_value_passed_in():
    """tf.grad(f)(x) where f writes into x first: the derivative is with respect to x as passed,
    not to its value after the write (d/dx (3x)^2 = 18x)."""
    def fn(x):
        x.mul_(3)
        return (x * x).sum()

    x = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(tf.grad(fn)(x.clone()), 18 * x)


def test_output_argument_that_is_a_view_writes_its_base():
    def fn(a, b):
        y = torch.zeros(3, 4)
        torch.add(a, b, out=y[1])
        return y

    a, b = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(tf.jit(fn)(a, b), fn(a, b))


def test_writing_an_expanded_view_raises_torchs_error():
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        tf.jit(lambda x: x.clone()[0].expand(2, 4).add_(1))(torch.randn(3, 4))


def test_transforms_inside_jit_read_a_view_whose_base_changed_as_updated():
    def fn(x, differentiate):
        y = x.clone()
        row = y[0]
        y.mul_(2)  # eager: row shows the doubled values
        return (tf.grad(lambda r: (r * r).sum())(row), tf.vmap(torch.sin)(row),
                tf.jvp(torch.sin, (row,), (torch.ones(2),))[1]) if differentiate else (2 * row, row.sin(), row.cos())

    x = torch.randn(3, 2)
    torch.testing.assert_close(tf.jit(fn, static_argnums=1)(x, True), fn(x, False))


def test_vmap_writing_its_input_writes_through_a_view_to_the_base():
    def fn(x, vmap):
        y = x.clone()
        vmap(lambda r: r.mul_(2))(y[0:2])
        return y

    x = torch.randn(3, 2)
    torch.testing.assert_close(tf.jit(fn, static_argnums=1)(x, tf.vmap), fn(x, torch.func.vmap))


# -- an error after in-place writes: the writes that completed stay, as in eager -----------------------
def _eager_and_jitted_after_failure(fn, make_args, **jit_options):
    """(eager's arguments after fn raised on them, the jitted function's): both must raise."""
    eager_args, jit_args = make_args(), make_args()
    with pytest.raises(Exception) as eager_error:
        fn(*eager_args)
    jitted = tf.jit(fn, **jit_options)
    jitted(*make_args(valid=True))  # compile with arguments that work
    with pytest.raises(type(eager_error.value)):
        jitted(*jit_args)
    return eager_args, jit_args


def _index_args(valid=False):
    return torch.zeros(3), torch.tensor([0, 1 if valid else 5]), torch.ones(2)


def _writes_then_gathers(x, index, w):
    x.add_(1)
    w.mul_(2)
    y = torch.gather(x, 0, index)  # index out of range: raises when it runs
    w.add_(y.sum())
    return y


@pytest.mark.parametrize("executors", [None, [RunsRegionsWithTorch()]], ids=["torch", "fusion"])
def test_an_error_after_in_place_writes_leaves_the_completed_writes_as_eager_does(executors):
    eager_args, jit_args = _eager_and_jitted_after_failure(_writes_then_gathers, _index_args, executors=executors)
    torch.testing.assert_close(jit_args, eager_args)


def test_an_error_after_in_place_writes_keeps_the_last_completed_write_of_each_tensor():
    def fn(x, index, w):
        x.add_(1)
        x.mul_(3)  # written twice before the error: the second value stays
        picked = torch.index_select(w, 0, index)
        x.add_(100)  # never runs in eager
        return x, picked

    eager_args, jit_args = _eager_and_jitted_after_failure(fn, _index_args)
    torch.testing.assert_close(jit_args, eager_args)


def test_an_error_in_a_user_executor_op_after_a_buffer_update_keeps_the_update():
    ex = OperatorExecutor("raises_at_run_time")

    def checked_double(a):
        if bool((a < 0).any()):
            raise ValueError("negative input")
        return a * 2

    double = ex.register_operator("checked_double", like=lambda a: a, fn=checked_double)

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls += 1
            return double(x)

    module = Counting()
    jitted = tf.jit(module, executors=[ex])
    jitted(torch.ones(2))
    with pytest.raises(ValueError, match="negative input"):
        jitted(-torch.ones(2))
    assert module.calls.item() == 2  # eager counts the failed call too


def test_an_error_after_an_optimizer_style_update_of_a_parameter_keeps_the_update():
    def fn(p, y, index):
        with torch.no_grad():
            p.sub_(0.5)
        return torch.gather(y, 0, index).sum()

    def make_args(valid=False):
        return torch.ones(3, requires_grad=True), torch.ones(3), torch.tensor([0, 1 if valid else 7])

    eager_args, jit_args = _eager_and_jitted_after_failure(fn, make_args)
    torch.testing.assert_close(jit_args[0], eager_args[0])


def test_a_write_through_a_reshape_of_a_tensor_of_unknown_layout_is_refused_by_name():
    """Under vmap an example's layout is not known, so whether its reshape is a view or a copy is not either."""
    fn = _view_written_then_base_returned(lambda y: y.reshape(4, 3))
    with pytest.raises(tf.UnsupportedOpError, match="memory layout at run time"):
        tf.vmap(fn)(torch.randn(2, 3, 4))


def test_requires_grad_on_a_value_the_function_computed_changes_no_gradient():
    # (Hugging Face's gradient checkpointing hooks the embeddings' output so) eager: a no-op where the value
    # already requires grad; the caller's own tensors' flags stay the caller's to change
    w = torch.randn(3, requires_grad=True)

    def f(x):
        h = x * w
        h.requires_grad_(True)
        return h.sin().sum()

    x = torch.randn(3)
    tf.jit(f)(x).backward()
    expected = torch.autograd.grad(f(x), w)[0]
    torch.testing.assert_close(w.grad, expected)
    with pytest.raises(tf.UnsupportedOpError, match="requires_grad_"):
        tf.jit(lambda x: x.requires_grad_(True) * 2)(torch.randn(3))


def test_resizing_to_its_own_shape_changes_nothing_and_any_other_resize_is_refused():
    """x.resize_(x.shape) and x.resize_as_(y) with y of x's shape leave x as it is in eager (also per example,
    under vmap); another size would leave what x's storage holds, which is not traced."""
    def same(x, y):
        return x.clone().resize_as_(y) * 2 + torch.resize_as_(x.clone(), y) + x.clone().resize_(*x.shape)

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(tf.jit(same)(x, y), same(x, y))
    torch.testing.assert_close(tf.vmap(same)(x, y), torch.stack([same(x[i], y[i]) for i in range(3)]))
    for other in (lambda x: x.clone().resize_(12), lambda x: x.clone().resize_as_(x[0]),
                  lambda x: x.clone().resize_(3, 4, memory_format=torch.contiguous_format)):
        with pytest.raises(tf.errors.UnsupportedOpError, match=r"changes t\d+'s shape in place"):
            tf.jit(other)(x)
