"""Aliasing under jit equals eager: an output shares storage with an input iff eager's
does (views are views, copies are copies, layout-dependent ops decide at run time as
torch does), and the checks eager makes on layouts raise under jit too."""
from __future__ import annotations

import re
import zlib

import pytest
import torch

import thunderfn as tf
from thunderfn.testing.aliasing import alias_mismatches
from thunderfn.testing.opinfos import op_db

pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning",
                                        "ignore:Implicit dimension choice for:UserWarning")


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.mark.parametrize("op", [pytest.param(op, id=op.name) for op in op_db])
def test_output_shares_storage_with_input_iff_eager_does(op):
    jitted = tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs))
    problems = []
    for dtype in op.dtypes[:1]:  # samples of conversions carry their target dtypes; one input dtype suffices
        problems += alias_mismatches(op, dtype, jitted)
    assert not problems, "\n".join(problems)


# Where the forward/backward split cannot keep eager's view. The split runs an op without a VJP
# rule as its decomposition, and these decompose into a gather whose index (a tensor value the
# backward needs) is computed inside the decomposition, so they return a copy where eager
# returns a view. Writing into such an output of a jitted function differs from eager only if
# the input is not a leaf (eager refuses in-place writes into views of leaves requiring grad).
GRAD_VIEW_EXEMPT = {
    "narrow": "start given as a tensor",
    "narrow.method": "start given as a tensor",
    "getitem": "indexing with a 0-D integer tensor (x[i])",
}


def _exempt(problem: str) -> bool:
    name = problem.split(" on ", 1)[0]
    marker = {"narrow": "'Tensor():int64', ", "narrow.method": "'Tensor():int64', ",
              "getitem": "'Tensor():int64')"}.get(name)
    return marker is not None and marker in problem and "jit False, eager True" in problem


@pytest.mark.parametrize("op", [pytest.param(op, id=op.name) for op in op_db if op.dtypes[0].is_floating_point])
def test_output_shares_storage_with_input_iff_eager_does_when_inputs_require_grad(op):
    """The forward/backward split runs the forward as a torch.autograd.Function: its ops must alias as
    eager's (torch's own op runs whole wherever the decomposition's VJP needs no residual from it)."""
    jitted = tf.jit(lambda *args, **kwargs: op.op(*args, **kwargs))
    problems = [p for p in alias_mismatches(op, op.dtypes[0], jitted, requires_grad=True) if not _exempt(p)]

    assert not problems, "\n".join(problems)


def _noncontiguous(shape):
    return torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]


def _same_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("requires_grad", [False, True])
def test_copies_eager_makes_are_copies_under_jit(requires_grad):
    """x.to(dtype, copy=True) always copies; x.contiguous() copies a non-contiguous x and is x
    itself otherwise: one compiled function (the cache key has no strides) must do both."""
    to_copy = tf.jit(lambda x: x.to(torch.float32, copy=True))
    contiguous = tf.jit(lambda x: x.contiguous())
    for x in (torch.randn(3, 4), _noncontiguous((3, 4))):
        x.requires_grad_(requires_grad)
        assert not _same_storage(to_copy(x), x)
        assert _same_storage(contiguous(x), x) == x.is_contiguous()
        out = contiguous(x)
        assert out.is_contiguous()
        if not requires_grad:
            assert (out is x) == x.is_contiguous()  # eager returns x itself
            before = x.clone()
            to_copy(x).add_(1)
            torch.testing.assert_close(x, before)  # a write into the copy leaves the caller's tensor alone
            contiguous(x).add_(1)  # as in eager: into x itself when x is contiguous, into a copy otherwise
            torch.testing.assert_close(x, before + 1 if x.is_contiguous() else before)


def test_returning_an_input_returns_the_callers_tensor():
    x = torch.randn(3)
    assert tf.jit(lambda x: x)(x) is x
    assert tf.jit(lambda x: x.to(x.dtype))(x) is x  # eager returns x itself
    assert tf.jit(lambda x: x.float())(x) is x
    w = torch.randn(3, requires_grad=True)
    out = tf.jit(lambda w: w)(w)
    assert _same_storage(out, w)  # torch.autograd returns a view of an input a Function returns


@pytest.mark.parametrize("requires_grad", [False, True])
def test_views_of_inputs_returned_are_views(requires_grad):
    x = torch.randn(4, 6, requires_grad=requires_grad)
    for fn in (lambda x: x.t(), lambda x: x[1:], lambda x: x.view(-1), lambda x: x.reshape(2, 12), lambda x: x[...],
               lambda x: x.view(x.shape), lambda x: x.unsqueeze(0).squeeze(0), lambda x: x.expand(2, 4, 6)):
        out = tf.jit(fn)(x)
        assert _same_storage(out, x)
        if not requires_grad:
            assert out._base is x
    # reshape of a non-contiguous tensor copies, through the entry compiled for a contiguous one
    reshape = tf.jit(lambda x: x.reshape(-1))
    assert _same_storage(reshape(torch.randn(4, 6)), torch.randn(4, 6)) is False
    y = torch.randn(6, 4).t()
    assert not _same_storage(reshape(y), y)


def test_in_place_writes_through_aliases_reach_what_eager_reaches():
    def through_to(x):
        x.to(x.dtype).add_(1)  # x itself in eager
        x.view(x.shape).mul_(2)  # a view of all of x
        return x

    x = torch.randn(3)
    expected = (x + 1) * 2
    tf.jit(through_to)(x)
    torch.testing.assert_close(x, expected)

    def through_copy(x):
        y = x.to(torch.float32, copy=True)
        y.add_(1)
        z = torch.cat([x])
        z.add_(1)
        return y + z

    x = torch.randn(3)
    before = x.clone()
    torch.testing.assert_close(tf.jit(through_copy)(x), 2 * (before + 1))
    torch.testing.assert_close(x, before)


LAYOUTS = {
    "contiguous": lambda: torch.randn(3, 4),
    "transposed": lambda: torch.randn(4, 3).t(),
    "strided": lambda: torch.randn(3, 8)[:, ::2],
    "channels_last": lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
}
# In eager each is the input itself (or a view of it) for some layouts and a copy for others.
LAYOUT_DEPENDENT_WRITES = {
    "contiguous": lambda x: x.contiguous().mul_(2),
    "contiguous_channels_last": lambda x: x.contiguous(memory_format=torch.channels_last).add_(1)
    if x.ndim == 4 else x.contiguous().add_(1),
    "reshape": lambda x: x.reshape(-1).add_(1),
    "flatten": lambda x: x.flatten().sub_(1),
    "reshape_of_a_view": lambda x: x.transpose(0, 1).reshape(-1).mul_(3),
}


@pytest.mark.parametrize("write", LAYOUT_DEPENDENT_WRITES.values(), ids=LAYOUT_DEPENDENT_WRITES.keys())
def test_in_place_write_into_a_view_or_copy_of_an_input_matches_eager_for_every_layout(write):
    """Eager writes into x when x's layout lets the op return x (or a view of it) and into a copy
    otherwise: the trace knows which from the input's layout, which is part of its signature."""
    def fn(x):
        y = write(x)
        return y * 1, x * 1

    jitted = tf.jit(fn)
    for make in LAYOUTS.values():
        torch.manual_seed(0)
        eager_x = make()
        torch.manual_seed(0)
        jit_x = make()
        torch.testing.assert_close(jitted(jit_x), fn(eager_x))
        torch.testing.assert_close(jit_x, eager_x)


def test_in_place_write_into_contiguous_of_an_intermediate_matches_eager():
    def fn(x):
        y = (x * 2).contiguous()
        y.add_(1)
        return y

    x = torch.randn(3, 4)
    torch.testing.assert_close(tf.jit(fn)(x), fn(x))

    def reads_the_source_after(x):
        t = x * 2  # laid out as x: the layout of an op's result is worked out from its inputs'
        t.contiguous().add_(1)
        return t  # eager: t + 1 for a contiguous x, t for a non-contiguous one

    jitted = tf.jit(reads_the_source_after)
    for x in (torch.randn(3, 4), torch.randn(4, 3).t()):
        torch.testing.assert_close(jitted(x), reads_the_source_after(x))

    def layout_unknown(x):
        t = torch.special.erfcx(x)  # an opaque op: its result's layout is not worked out
        t.contiguous().add_(1)
        return t

    with pytest.raises(tf.errors.UnsupportedOpError, match="is read after"):
        tf.jit(layout_unknown)(x)


def test_prims_decomposition_of_aliasing_ops_stays_functional():
    fn = lambda x: (x.contiguous() + 1, x.to(torch.float32, copy=True), x.t().contiguous().view(-1), x.reshape(-1))
    prims_only = tf.jit(fn, executors=["torch_prims"], fallback=False)
    for x in (torch.randn(3, 4), _noncontiguous((3, 4))):
        torch.testing.assert_close(prims_only(x), fn(x))


# -- checks eager makes on layouts hold under jit ----------------------------------------------------
VIEW_MESSAGE = "view size is not compatible with input tensor's size and stride"
OVERLAP_MESSAGE = "more than one element of the written-to tensor refers to a single memory location"


def _raises_like_eager(fn, *args, match, exc=RuntimeError):
    with pytest.raises(exc, match=match):
        fn(*args)
    with pytest.raises(exc, match=match):
        tf.jit(fn)(*args)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_layout_checks_eager_makes_raise_under_jit(requires_grad):
    x = torch.randn(3, 4, requires_grad=requires_grad)
    _raises_like_eager(lambda x: x.t().view(-1), x, match=VIEW_MESSAGE)
    _raises_like_eager(lambda x, y: x.t().view_as(y), x, torch.randn(12), match=VIEW_MESSAGE)
    # one compiled entry serves both layouts (strides are not in the cache key): torch checks at run time
    view = tf.jit(lambda x: x.view(-1))
    assert view(torch.randn(4, 3, requires_grad=requires_grad))._base is not None
    with pytest.raises(RuntimeError, match=VIEW_MESSAGE):
        view(torch.randn(3, 4).t().requires_grad_(requires_grad))
    torch.testing.assert_close(tf.jit(lambda x: x.t().contiguous().view(-1))(x), x.t().contiguous().view(-1))
    _raises_like_eager(lambda x: x.expand(3, 5), x, match="must match the existing size")
    _raises_like_eager(lambda x: x.expand(-1, 3, 4), x, match="isn't allowed in a leading, non-existing dimension")
    # torch checks from the last dimension and names the first mismatch it finds
    _raises_like_eager(lambda x, y: x.expand_as(y), x, torch.randn(5, 5), match=re.escape(
        "The expanded size of the tensor (5) must match the existing size (4) at non-singleton dimension 1.  "
        "Target sizes: [5, 5].  Tensor sizes: [3, 4]"))


def test_in_place_writes_into_expanded_tensors_raise_torchs_error():
    x = torch.randn(3, 4)
    _raises_like_eager(lambda x: x.expand(2, 3, 4).add_(1), x, match=OVERLAP_MESSAGE)
    _raises_like_eager(lambda x: torch.broadcast_to(x, (2, 3, 4)).mul_(2), x, match=OVERLAP_MESSAGE)
    _raises_like_eager(lambda x, y: torch.add(y, 1, out=x.expand(2, 3, 4)), x, torch.randn(2, 3, 4),
                       match=OVERLAP_MESSAGE)
    _raises_like_eager(lambda x: x.add_(1), torch.randn(4).expand(3, 4), match=OVERLAP_MESSAGE)
    # expanding a size-1 dimension to size 1 shares nothing: allowed, as in eager
    y = torch.randn(3, 1)
    tf.jit(lambda y: y.expand(3, 1).add_(1))(y.clone())


def test_in_place_shape_changes_are_refused_by_name():
    with pytest.raises(tf.errors.UnsupportedOpError, match="resize_"):
        tf.jit(lambda x: x.resize_(2, 6))(torch.randn(3, 4))
    with pytest.raises(tf.errors.UnsupportedOpError, match="resize_as_"):
        tf.jit(lambda x, y: torch.resize_as_(x.clone(), y))(torch.randn(3, 4), torch.randn(12))


def test_resizing_to_the_same_size_leaves_the_tensor_as_it_is():
    """In eager resize_ to a tensor's own size (no memory format) returns it untouched, an input's too."""
    fns = [lambda x: x.clone().resize_((3, 4)) * 2, lambda x: x.resize_(3, 4).add_(1),
           lambda x: torch.resize_as_(x, x.T.T).sin(), lambda x: x[1:].resize_as_(x[:2]).mul_(3)]
    for fn in fns:
        x = torch.randn(3, 4)
        expected_x = x.clone()
        expected = fn(expected_x)
        torch.testing.assert_close(tf.jit(fn)(x), expected)
        torch.testing.assert_close(x, expected_x)  # what it wrote into the input, as eager
    # torch refuses to resize a tensor that requires grad, even to its own size; a value computed from such a
    # tensor may require grad, which the trace does not know: refused by name
    w = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="cannot resize variables that require grad"):
        tf.jit(lambda w: w.resize_(3, 4))(w)
    with pytest.raises(tf.errors.UnsupportedOpError, match="Resize a detached tensor"):
        tf.jit(lambda w: (w * 2).resize_(3, 4))(w)


@pytest.mark.parametrize("make_alias", [lambda x: x.contiguous(), lambda x: x.reshape(-1), lambda x: x.flatten()],
                         ids=["contiguous", "reshape", "flatten"])
def test_reading_a_view_or_copy_of_an_input_after_the_input_changed_matches_eager_for_every_layout(make_alias):
    def fn(x):
        y = make_alias(x)
        x.add_(1)  # y shows it when y is x or a view of x
        return y * 1

    jitted = tf.jit(fn)
    for make in LAYOUTS.values():
        torch.manual_seed(0)
        eager_x = make()
        torch.manual_seed(0)
        jit_x = make()
        torch.testing.assert_close(jitted(jit_x), fn(eager_x))
        torch.testing.assert_close(jit_x, eager_x)
