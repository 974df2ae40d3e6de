"""Pytrees (core/pytree.py): any nesting of tuples, lists, dicts, namedtuples, None and
registered classes goes into and comes out of traced functions unchanged."""
import collections

import optree
import pytest
import torch

import thunderfn as tf
from thunderfn.core.pytree import of_leaves, of_positions, tree_flatten

Pair = collections.namedtuple("Pair", "a b")


class Point:
    """A user class made traversable with tf.register_pytree_node; `tag` is static."""

    def __init__(self, x, y, tag="p"):
        self.x, self.y, self.tag = x, y, tag


tf.register_pytree_node(Point, lambda p: ((p.x, p.y), p.tag), lambda tag, children: Point(*children, tag=tag))


def _t(*shape):
    return torch.randn(*shape)


# One list of trees parametrizes every test (as optree's and equinox's tests do).
TREES = {
    "tensor": lambda: _t(2),
    "tuple": lambda: (_t(2), _t(3)),
    "list": lambda: [_t(2), _t(2), _t(1)],
    "dict": lambda: {"w": _t(2, 2), "b": _t(2)},
    "namedtuple": lambda: Pair(_t(2), _t(2)),
    "none-leaf": lambda: (_t(2), None),
    "empty-containers": lambda: ((), [], {}, _t(1)),
    "nested": lambda: {"layers": [Pair(_t(2), None), Pair(_t(3), (_t(1),))], "scale": (_t(1), {"z": [_t(2)]})},
    "registered": lambda: Point(_t(2), _t(2), tag="start"),
    "registered-nested": lambda: [Point(Pair(_t(1), _t(1)), {"k": _t(2)}), None],
    "ordered-dict": lambda: collections.OrderedDict(b=_t(1), a=_t(2)),
    "with-numbers": lambda: {"t": _t(2), "n": 3, "f": 0.5, "s": "name"},
}


def _double(tree):
    """What the traced functions compute: every tensor doubled, the structure kept."""
    return optree.tree_map(lambda v: v * 2 if isinstance(v, torch.Tensor) else v, tree, namespace="thunderfn")


def _assert_trees_equal(got, want):
    got_leaves, got_spec = optree.tree_flatten(got, none_is_leaf=True, namespace="thunderfn")
    want_leaves, want_spec = optree.tree_flatten(want, none_is_leaf=True, namespace="thunderfn")
    assert got_spec == want_spec
    for g, w in zip(got_leaves, want_leaves):
        assert type(g) is type(w)
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w
    if isinstance(want, Point):
        assert got.tag == want.tag


def _tree_map_tensors(fn, tree):
    # while tracing, leaves are TensorProxy objects, which are not torch.Tensor instances
    return optree.tree_map(lambda v: fn(v) if isinstance(v, (torch.Tensor, tf.TensorProxy)) else v, tree,
                           namespace="thunderfn")


@pytest.fixture(params=TREES.values(), ids=TREES.keys())
def tree(request):
    torch.manual_seed(0)
    return request.param()


def test_jit_takes_and_returns_any_pytree(tree):
    f = tf.jit(lambda t: _tree_map_tensors(lambda v: v * 2, t))
    for _ in range(2):
        _assert_trees_equal(f(tree), _double(tree))


def test_trace_inputs_are_the_tensor_leaves_of_the_pytree(tree):
    trc = tf.trace(lambda t: _tree_map_tensors(lambda v: v * 2, t), tree)
    tensors = [v for v in optree.tree_leaves(tree, namespace="thunderfn") if isinstance(v, torch.Tensor)]
    assert [tuple(a.shape) for a in trc.args] == [tuple(t.shape) for t in tensors]
    compile(str(trc), "<trace>", "exec")


def test_pytree_output_of_computation_trace_round_trips(tree):
    fn = lambda t: _tree_map_tensors(lambda v: v + 1, t)  # noqa: E731
    trc = tf.trace(fn, tree)
    tensors = [v for v in optree.tree_leaves(tree, namespace="thunderfn") if isinstance(v, torch.Tensor)]
    _assert_trees_equal(trc.python_callable()(*tensors), fn(tree))


def test_pytree_can_be_passed_as_keyword_argument(tree):
    f = tf.jit(lambda *, t: _tree_map_tensors(lambda v: v * 2, t))
    _assert_trees_equal(f(t=tree), _double(tree))


def test_registered_class_static_data_is_part_of_the_signature():
    count = []

    def fn(p):
        count.append(1)
        return Point(p.x + p.y, p.y, tag=p.tag + "!")

    f = tf.jit(fn)
    a = torch.ones(2)
    assert f(Point(a, a, "u")).tag == "u!"
    assert f(Point(a, a, "u")).tag == "u!"
    assert f(Point(a, a, "v")).tag == "v!"
    assert len(count) == 2


def test_registered_class_comes_out_as_an_instance_of_the_class():
    f = tf.jit(lambda a: Point(a, a * 3, tag="made"))
    out = f(torch.ones(2))
    assert type(out) is Point and out.tag == "made"
    torch.testing.assert_close(out.y, torch.full((2,), 3.0))


def test_none_in_arguments_is_structure_not_a_value():
    f = tf.jit(lambda a, maybe: a if maybe is None else a + maybe)
    x = torch.ones(2)
    torch.testing.assert_close(f(x, None), x)
    torch.testing.assert_close(f(x, x), x + x)


def test_namedtuple_field_access_works_while_tracing():
    f = tf.jit(lambda p: p.a * p.b)
    x = torch.randn(3)
    torch.testing.assert_close(f(Pair(x, x)), x * x)


class TorchRegistered:
    """A container registered with torch's pytree only (as Hugging Face registers ModelOutput)."""

    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


torch.utils._pytree.register_pytree_node(
    TorchRegistered, lambda o: ([o.loss, o.logits], None), lambda values, context: TorchRegistered(*values))


def test_a_container_registered_with_torchs_pytree_goes_in_and_comes_out_holding_tensors():
    f = tf.jit(lambda o: TorchRegistered(o.loss * 2, o.logits.sum()))
    out = f(TorchRegistered(torch.ones(()), torch.ones(3)))
    assert type(out) is TorchRegistered
    assert type(out.loss) is torch.Tensor and type(out.logits) is torch.Tensor
    assert out.loss.item() == 2.0 and out.logits.item() == 3.0
    assert len(tf.last_traces(f)[0].args) == 2  # both tensors are inputs, not constants


def test_a_class_registered_with_torch_after_thunderfn_was_imported_is_adopted_on_the_next_call():
    class Late:
        def __init__(self, x):
            self.x = x

    torch.utils._pytree.register_pytree_node(Late, lambda o: ([o.x], None), lambda v, c: Late(*v))
    out = tf.jit(lambda x: Late(x + 1))(torch.zeros(2))
    assert type(out) is Late and type(out.x) is torch.Tensor


class Unregistered:
    def __init__(self, x):
        self.state = {"x": x}


def test_an_output_object_thunderfn_cannot_see_into_is_refused_before_a_placeholder_escapes():
    with pytest.raises(tf.errors.EscapedProxyError,
                       match=r"returns a test_pytree.Unregistered holding a traced tensor \(Unregistered.state\['x'\]\)"
                             r".*tf.register_pytree_node\(Unregistered"):
        tf.jit(lambda x: Unregistered(x * 2))(torch.ones(2))
    # an object holding no traced tensor is an ordinary (constant) output
    out = tf.jit(lambda x: (x * 2, Unregistered(3)))(torch.ones(2))
    assert out[1].state == {"x": 3}


@pytest.mark.parametrize("mutate, where", [
    (lambda xs: xs.append(xs[0] * 2), ""),
    (lambda xs: xs.__setitem__(0, xs[0] * 2), r" \(args\[0\]\[0\]\)"),
])
def test_storing_into_a_container_argument_is_refused_not_silently_dropped(mutate, where):
    def f(xs):
        mutate(xs)
        return xs[0] + 1

    xs = [torch.ones(2)]
    with pytest.raises(tf.errors.UnsupportedOpError, match=f"'f' changed a container it was passed{where}"):
        tf.jit(f)(xs)
    assert len(xs) == 1 and xs[0].tolist() == [1.0, 1.0]


def test_a_users_own_registration_replaces_the_one_adopted_from_torch():
    class Twice:
        def __init__(self, x):
            self.x = x

    torch.utils._pytree.register_pytree_node(Twice, lambda o: ([o.x], None), lambda v, c: Twice(*v))
    tf.jit(lambda x: x + 1)(torch.zeros(1))  # adopts Twice
    tf.register_pytree_node(Twice, lambda o: ((o.x,), "mine"), lambda aux, children: Twice(children[0] * 0 + 7))
    out = tf.jit(lambda t: Twice(t.x + 1))(Twice(torch.zeros(2)))
    assert out.x.tolist() == [7.0, 7.0]  # rebuilt by the user's unflatten


def test_of_positions_and_of_leaves_vary_only_the_chosen_arguments_and_keep_the_functions_name():
    """One "call fn with some arguments held fixed" (core/pytree.py) serves grad's argnums, the
    Jacobians' argnums and the opaque ops' tensors."""
    def affine(a, b, c, *, scale):
        return (a + 10 * b + 100 * c) * scale

    of_b = of_positions(affine, (1, 2, 3), (1,), {"scale": 2})
    assert of_b(5) == (1 + 50 + 300) * 2 and of_b.__name__ == "affine"
    of_a_c = of_positions(affine, [1, 2, 3], (0, 2), {"scale": 1})
    assert of_a_c(7, 9) == 7 + 20 + 900
    leaves, spec = tree_flatten(((1, 2, 3), {"scale": 3}))
    of_c_scale = of_leaves(affine, leaves, spec, (2, 3))
    assert of_c_scale(4, -1) == -(1 + 20 + 400) and of_c_scale.__name__ == "affine"


def test_grad_and_jacobians_with_argnums_hold_the_other_arguments_fixed():
    def f(x, w, b, *, scale):
        return ((x @ w + b) * scale).tanh().sum()

    x, w, b = torch.randn(3, 4), torch.randn(4, 2), torch.randn(2)
    wt = w.clone().requires_grad_(True)
    expected, = torch.autograd.grad(f(x, wt, b, scale=0.5), wt)
    torch.testing.assert_close(tf.grad(f, argnums=1)(x, w, b, scale=0.5), expected)
    torch.testing.assert_close(tf.jacrev(f, argnums=1)(x, w, b, scale=0.5), expected)
    torch.testing.assert_close(tf.jacfwd(f, argnums=1)(x, w, b, scale=0.5), expected)
