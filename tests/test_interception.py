"""Interception (core/interception.py, core/proxies.py): every way user code calls torch
reaches thunderfn while tracing, and metadata questions are answered without tracing."""
import copy
import functools
import sys

import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.core import interception
from thunderfn.core.interception import find_handler

X = torch.randn(2, 3)
W = torch.randn(3, 4)
LINEAR = torch.nn.Linear(3, 4)


def _names(trc) -> list[str]:
    return [b.sym.name for b in trc.bound_symbols]


# (function of proxies p, q; the symbols its trace records)
FORMS = {
    "torch.add(p, q)": (lambda p, q: torch.add(p, q), ["add"]),
    "p + q": (lambda p, q: p + q, ["add"]),
    "2 * p": (lambda p, q: 2 * p, ["mul"]),
    "p / 2": (lambda p, q: p / 2, ["div"]),
    "1 - p": (lambda p, q: 1 - p, ["rsub"]),
    "-p": (lambda p, q: -p, ["neg"]),
    "real + p": (lambda p, q: X + p, ["add"]),
    "real * p": (lambda p, q: X * p, ["mul"]),
    "p.add(q)": (lambda p, q: p.add(q), ["add"]),
    "p.add(q, alpha=2)": (lambda p, q: p.add(q, alpha=2), ["add"]),
    "F.gelu(p)": (lambda p, q: F.gelu(p), ["gelu"]),
    "torch.tanh(p)": (lambda p, q: torch.tanh(p), ["tanh"]),
    "p @ captured": (lambda p, q: p @ W, ["matmul"]),
    "captured.T @ p.T": (lambda p, q: W.T @ p.T, ["transpose", "transpose", "matmul"]),
    "nn.Linear(p)": (lambda p, q: LINEAR(p), ["linear"]),
    "torch.cat([p, real])": (lambda p, q: torch.cat([p, X]), ["cat"]),
    "p.sum(dim=0)": (lambda p, q: p.sum(dim=0), ["sum"]),
    "p[0]": (lambda p, q: p[0], ["getitem"]),
    "p.view(3, 2)": (lambda p, q: p.view(3, 2), ["view"]),
}


@pytest.mark.parametrize("fn, expected", FORMS.values(), ids=FORMS.keys())
def test_every_form_of_torch_call_is_recorded(fn, expected):
    trc = tf.trace(fn, torch.randn(2, 3), torch.randn(2, 3))
    assert _names(trc) == expected
    assert isinstance(trc.output, tf.TensorProxy)


@pytest.mark.parametrize("fn", [f for f, _ in FORMS.values()], ids=FORMS.keys())
def test_every_form_of_torch_call_computes_like_eager(fn):
    p, q = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(tf.jit(fn)(p, q), fn(p, q))


def test_module_call_reads_real_parameters_as_constants():
    trc = tf.trace(lambda p: LINEAR(p), X)
    (linear,) = trc.bound_symbols
    consts = [a for a in linear.proxy_args() if a.constant is not None]
    assert {id(c.constant) for c in consts} == {id(LINEAR.weight), id(LINEAR.bias)}
    assert [a.name for a in trc.args] == ["p"]


def test_module_parameters_stay_parameters_after_tracing():
    tf.trace(lambda p: LINEAR(p), X)
    assert all(type(p) is torch.nn.Parameter for p in LINEAR.parameters())


@pytest.mark.parametrize("fn, name", [
    (lambda p: p + torch.ones(3), "ones"),
    (lambda p: p + torch.zeros(2, 3), "zeros"),
    (lambda p: p + torch.arange(3), "arange"),
    (lambda p: p + torch.full((3,), 2.0), "full"),
], ids=["ones", "zeros", "arange", "full"])
def test_factory_calls_without_proxy_arguments_are_traced_not_frozen(fn, name):
    trc = tf.trace(fn, X)
    assert name in _names(trc)
    assert not any(a.constant is not None for b in trc.bound_symbols for a in b.proxy_args())
    torch.testing.assert_close(tf.jit(fn)(X), fn(X))


def test_arange_of_a_shape_is_traced_with_that_shape():
    fn = lambda p: p * torch.arange(p.shape[1])  # noqa: E731
    jf = tf.jit(fn)
    for shape in [(2, 3), (2, 5)]:
        p = torch.randn(shape)
        torch.testing.assert_close(jf(p), fn(p))


def test_factory_default_dtype_follows_torch():
    trc = tf.trace(lambda p: torch.ones(3), X)
    assert trc.output.dtype is torch.get_default_dtype()
    assert tf.trace(lambda p: torch.arange(3), X).output.dtype is torch.int64


METADATA = {
    "shape": lambda p: p.shape,
    "dtype": lambda p: p.dtype,
    "device": lambda p: p.device,
    "ndim": lambda p: p.ndim,
    "dim()": lambda p: p.dim(),
    "size()": lambda p: p.size(),
    "size(1)": lambda p: p.size(1),
    "size(-1)": lambda p: p.size(-1),
    "numel()": lambda p: p.numel(),
    "is_floating_point()": lambda p: p.is_floating_point(),
    "is_complex()": lambda p: p.is_complex(),
    "requires_grad": lambda p: p.requires_grad,
    "len": lambda p: len(p),
    "element_size()": lambda p: p.element_size(),
    "is_cuda": lambda p: p.is_cuda,
    "shape[0] arithmetic": lambda p: p.shape[0] * p.shape[1] + 1,
    "real.shape": lambda p: X.shape,
    "real.dtype": lambda p: W.dtype,
    "real.size(0)": lambda p: W.size(0),
    "real.numel()": lambda p: W.numel(),
    "real.ndim": lambda p: W.ndim,
    "torch.numel(p)": lambda p: torch.numel(p),
    "torch.is_floating_point(p)": lambda p: torch.is_floating_point(p),
    "torch.is_complex(p)": lambda p: torch.is_complex(p),
    "torch.is_signed(p)": lambda p: torch.is_signed(p),
    "is_signed()": lambda p: p.is_signed(),
    "torch.result_type(p, 1.0)": lambda p: torch.result_type(p, 1.0),
    "p.is_same_size(real)": lambda p: p.is_same_size(X),
    "get_device()": lambda p: p.get_device(),
    "grad_fn": lambda p: p.grad_fn,
    "is_leaf": lambda p: p.is_leaf,
}


@pytest.mark.parametrize("fn", METADATA.values(), ids=METADATA.keys())
def test_metadata_is_answered_at_trace_time_with_torchs_types(fn):
    captured = []

    def probe(p):
        captured.append(fn(p))
        return p * 1

    trc = tf.trace(probe, X)
    want = fn(X)
    assert type(captured[0]) is type(want) and captured[0] == want
    assert _names(trc) == ["mul"], "metadata records nothing"
    assert not any(a.constant is not None for b in trc.bound_symbols for a in b.proxy_args())


@pytest.mark.parametrize("fn", METADATA.values(), ids=METADATA.keys())
def test_metadata_returned_from_jit_matches_eager(fn):
    got = tf.jit(fn)(X)
    assert type(got) is type(fn(X)) and got == fn(X)


def test_size_out_of_range_is_torchs_index_error():
    with pytest.raises(IndexError) as eager:
        X.size(2)
    with pytest.raises(IndexError) as traced:
        tf.trace(lambda p: p.size(2), X)
    assert str(traced.value) == str(eager.value)


def test_len_of_0d_is_torchs_type_error():
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        tf.trace(lambda p: len(p), torch.tensor(1.0))


def test_shape_dependent_python_loop_unrolls():
    def fn(p):
        out = p[0]
        for i in range(1, p.shape[0]):
            out = out + p[i]
        return out

    p = torch.randn(4, 2)
    trc = tf.trace(fn, p)
    assert _names(trc).count("add") == 3
    torch.testing.assert_close(tf.jit(fn)(p), p.sum(0))


def test_iterating_a_proxy_unbinds_its_first_dimension():
    fn = lambda p: [row * 2 for row in p]  # noqa: E731
    out = tf.jit(fn)(X)
    assert len(out) == 2
    for got, want in zip(out, fn(X)):
        torch.testing.assert_close(got, want)


def test_torch_is_not_intercepted_outside_tracing():
    tf.trace(lambda p: p + 1, X)
    assert type(torch.add(X, 1)) is torch.Tensor
    assert type(torch.ones(2)) is torch.Tensor


def test_proxy_used_outside_of_tracing_is_a_clear_error():
    trc = tf.trace(lambda p: p + 1, X)
    with pytest.raises(RuntimeError, match="outside of tracing"):
        torch.add(trc.output, 1)


def test_torch_function_without_tensor_arguments_runs_once_and_becomes_a_constant():
    trc = tf.trace(lambda p: p + torch.tensor([1.0, 2.0, 3.0]), X)
    consts = [a for b in trc.bound_symbols for a in b.proxy_args() if a.constant is not None]
    assert len(consts) == 1
    torch.testing.assert_close(consts[0].constant, torch.tensor([1.0, 2.0, 3.0]))


def test_copying_a_proxy_gives_an_equivalent_proxy():
    def fn(p):
        return copy.copy(p) * 2 + copy.deepcopy(p)

    torch.testing.assert_close(tf.jit(fn)(X), X * 3)


def test_copy_shares_and_deepcopy_clones_as_for_tensors():
    def fn(p):
        shallow, deep = copy.copy(p), copy.deepcopy(p)
        shallow.add_(1)  # writes through to p, as copy.copy's shared storage does in eager
        deep.mul_(10)  # does not
        return p, deep

    x = torch.ones(3)
    expected = fn(x.clone())
    got = tf.jit(fn)(x.clone())
    torch.testing.assert_close(got, expected)


def test_protocol_lookups_on_a_proxy_answer_as_on_a_tensor():
    def fn(p):
        seen.append((hasattr(p, "__dlpack__"), hasattr(p, "__array_interface__"), hasattr(p, "no_such_method")))
        return p

    seen = []
    fn(X)
    tf.trace(fn, X)
    assert seen[0] == seen[1] == (True, False, False)


def test_a_proxy_is_a_tensor_and_methods_called_through_the_class_are_traced():
    def fn(x, y):
        seen.append((isinstance(x, torch.Tensor), torch.is_tensor(x), torch.Tensor.dim(x), torch.Tensor.size(x, 1),
                     torch.Tensor.shape.__get__(x)))
        z = torch.Tensor.contiguous(x.t())
        torch.Tensor.atan2_(z, y.t())
        return torch.Tensor.add(z, 1), torch.Tensor.copy_(torch.empty_like(y), y)

    x, y = torch.randn(2, 3), torch.randn(2, 3)
    seen = []
    expected = fn(x, y)
    got = tf.jit(fn)(x, y)
    torch.testing.assert_close(got, expected)
    assert seen[0] == seen[1] == (True, True, 2, 3, torch.Size([2, 3]))


def test_a_value_request_through_the_class_is_a_concretization_error():
    with pytest.raises(tf.ConcretizationError, match=r"tensor.item\(\)"):
        tf.jit(lambda x: torch.Tensor.item(x))(X)
    with pytest.raises(tf.ConcretizationError, match=r"bool\(tensor\)"):
        tf.jit(lambda x: torch.Tensor.__bool__(x))(X)


def test_a_call_that_skips_torch_function_is_refused_by_name_not_run_on_no_data():
    def fn(x):
        with torch._C.DisableTorchFunction():  # (the subclass's and tracing's overrides both)
            return torch.sin(x)

    with pytest.raises(tf.UnsupportedOpError, match=r"aten.sin.default reached a traced tensor without being traced"):
        tf.jit(fn)(X)


def _functions_dropping_arguments_in_torch_function():
    """Python functions in torch.nn.functional whose handle_torch_function call leaves out
    parameters they accept: a traced call would silently lose those arguments."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(inspect.getmodule(F.dropout)))
    dropping = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        params = [a.arg for a in node.args.args + node.args.kwonlyargs]
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "handle_torch_function":
                passed = {a.id for a in call.args[2:] if isinstance(a, ast.Name)} | {k.arg for k in call.keywords}
                if any(p not in passed for p in params):
                    dropping.append(node.name)
                break
    return dropping


def test_every_functional_that_drops_arguments_in_dispatch_is_routed_around():
    for name in _functions_dropping_arguments_in_torch_function():
        assert hasattr(getattr(F, name), "__thunderfn_original__"), (
            f"F.{name} drops arguments when dispatching __torch_function__; route it (see torch/nn.py)")


def test_l1_loss_weight_reaches_the_traced_symbol():
    x, y, w = torch.randn(4), torch.randn(4), torch.rand(4)
    torch.testing.assert_close(tf.jit(lambda a, b, c: F.l1_loss(a, b, weight=c))(x, y, w), F.l1_loss(x, y, weight=w))


# -- wrappers in front of torch's functions ------------------------------------------------------
# torch._dynamo's import wraps torch.manual_seed, deprecation decorators and libraries wrap functions
# with functools.wraps, and torch's Python functions pass their module-level name (the wrapper, once
# replaced) to __torch_function__: the handler is found through the wrapper chain (tests/test_import_order.py
# checks the import orders themselves).
def test_a_wrapped_torch_function_is_traced_by_its_handler(monkeypatch):
    original = F.silu
    monkeypatch.setattr(F, "silu", functools.wraps(original)(lambda *a, **k: original(*a, **k)))
    assert find_handler(F.silu) is find_handler(original)
    trc = tf.trace(lambda x: F.silu(x), X)  # silu's handle_torch_function names the wrapper
    assert _names(trc) == ["silu"]
    torch.testing.assert_close(tf.jit(lambda x: F.silu(x))(X), original(X))


def test_registering_a_wrapper_registers_the_function_it_wraps(monkeypatch):
    monkeypatch.setattr(interception, "handlers", dict(interception.handlers))

    def inner(x):
        return x

    def handler(x):
        return x

    interception.register_handler(functools.wraps(inner)(lambda x: inner(x)), handler)
    assert find_handler(inner) is handler


def test_metadata_queries_through_a_wrapper_are_answered_at_trace_time():
    size = functools.wraps(torch.Tensor.size)(lambda t, *a: torch.Tensor.size(t, *a))
    assert interception.is_metadata_query(size)


# -- torch names resolved by attribute walks, never by evaluating strings -------------------------
def test_torch_names_resolve_by_attribute_walk_without_evaluating_strings(monkeypatch):
    evaluated = []

    def no_eval(source, *args, **kwargs):
        evaluated.append(source)
        raise AssertionError(f"thunderfn evaluated {source!r}")

    for name, module in list(sys.modules.items()):  # a module-level `eval` shadows the builtin in that module
        if name == "thunderfn" or name.startswith("thunderfn."):
            monkeypatch.setattr(module, "eval", no_eval, raising=False)
    assert interception.resolve_torch_name("torch.nn.functional.gelu") is torch.nn.functional.gelu
    assert interception.resolve_torch_name("torch.linalg.svd") is torch.linalg.svd
    assert interception.resolve_torch_name("torch.no_such_function") is None
    assert interception.resolve_torch_name("torch.add(1, 2)") is None  # an expression is not a name
    assert interception.resolve_torch_name("os.system") is None  # only names inside torch
    # opaque ops and torch executor operators are named the same way
    jf = tf.jit(lambda x: torch.special.i0e(x) + torch.nn.functional.softsign(x))
    x = torch.randn(4)
    torch.testing.assert_close(jf(x), torch.special.i0e(x) + torch.nn.functional.softsign(x))
    assert evaluated == []
