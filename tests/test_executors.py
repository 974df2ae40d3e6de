"""Executors: operators appear in execution traces under their names and compute what
torch computes; lowering rules claim by priority, checkers decide, decompositions are
tried when nobody claims; an executor's vjp is how its symbols are differentiated; names
are checked and re-registration is explicit. The tutorial in docs/extending.md is run
here too, and its claims about traces and values are asserted."""
from __future__ import annotations

import re
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import thunderfn as tf
import thunderfn.torch as ltorch
from thunderfn.core import interception
from thunderfn.core.interception import find_handler
from thunderfn.executors import (
    OperatorExecutor,
    add_operator_executor,
    get_default_executors,
    get_executor,
    register_executor,
    set_default_executors,
)
from thunderfn.testing.registries import RegistrySnapshot
from thunderfn.transforms.executor_lower import contiguous as lowering_contiguous

PAGE = Path(__file__).resolve().parent.parent / "docs" / "extending.md"


@pytest.fixture(autouse=True)
def _registrations_undone():
    """Every test's executors, defaults and symbols are gone after it."""
    snapshot = RegistrySnapshot()
    yield
    snapshot.restore()


@pytest.fixture(scope="module")
def page():
    """docs/extending.md run as one session: its namespace (its registrations undone after)."""
    snapshot = RegistrySnapshot()
    namespace = {"__name__": "docs_extending"}
    blocks = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), flags=re.S | re.M)
    try:
        for source in blocks:
            exec(compile(source, str(PAGE), "exec"), namespace)
        yield SimpleNamespace(**namespace)
    finally:
        snapshot.restore()


def execution_trace(fn) -> str:
    return str(tf.last_traces(fn)[-1])


def calls(fn, name: str, *, backward: bool = False) -> int:
    """How many times the execution (or backward) trace calls `name`."""
    trc = (tf.last_backward_traces(fn) if backward else tf.last_traces(fn))[-1]
    return sum(b.sym.print_name == name for b in trc.bound_symbols)


def np_mul(x, y):
    out = np.multiply(*(t.numpy() if isinstance(t, torch.Tensor) else t for t in (x, y)))
    return torch.from_numpy(out) if isinstance(out, np.ndarray) else out


def multimul_executor(name="mm_ex"):
    """The tutorial's executor: multimul (NumPy) and the lowering of ltorch.mul onto it."""
    ex = OperatorExecutor(name)
    multimul = ex.register_operator("multimul", like=lambda a, b, c, d: (a * b, c * d),
                                    fn=lambda a, b, c, d: (np_mul(a, b), np_mul(c, d)))
    ex.register_lowering(ltorch.mul, checker=cpu_only, lower=lambda a, b: multimul(a, b, 0, 0)[0])
    return ex, multimul


def cpu_only(a, b):
    return all(x.device.type == "cpu" for x in (a, b) if isinstance(x, tf.TensorProxy))


def mul_vjp(multimul):
    def fwd(a, b):
        return a * b, (a, b)

    def bwd(residuals, g):
        a, b = residuals
        return tuple(multimul(b, g, a, g))

    return fwd, bwd


def loss(a, b):
    return (a * b).sum()


A, B = torch.randn(3, 2), torch.randn(3, 2)


# -- operators -----------------------------------------------------------------------------------
def test_operator_appears_in_the_execution_trace_and_computes_what_torch_does():
    ex, multimul = multimul_executor()
    jfn = tf.jit(lambda a, b, c, d: multimul(a, b, c, d), executors=[ex])
    torch.testing.assert_close(jfn(A, B, B, A), (A * B, B * A))
    assert calls(jfn, "multimul") == 1


def test_operator_used_directly_runs_without_its_executor_listed_but_not_without_fallback():
    ex, multimul = multimul_executor()
    fn = lambda a, b: multimul(a, b, a, b)[0]  # noqa: E731
    jfn = tf.jit(fn)
    torch.testing.assert_close(jfn(A, B), A * B)
    assert calls(jfn, "multimul") == 1
    with pytest.raises(RuntimeError, match=r"^Could not find executor for bound symbol"):
        tf.jit(fn, executors=[OperatorExecutor("other")], fallback=False)(A, B)


def test_operator_defined_like_a_function_is_differentiable_through_it():
    ex, multimul = multimul_executor()
    g = tf.grad(lambda a, b, c: (multimul(a, b, c, a)[0] + multimul(a, b, c, a)[1] * 2).sum(), argnums=(0, 1, 2))
    expected = torch.func.grad(lambda a, b, c: (a * b + c * a * 2).sum(), argnums=(0, 1, 2))(A, B, A + 1)
    torch.testing.assert_close(g(A, B, A + 1), expected)


def test_operator_defined_by_meta_is_not_differentiable_until_it_has_a_vjp():
    ex = OperatorExecutor("meta_ex")
    square = ex.register_operator("square",
                                  meta=lambda a: tf.TensorProxy(shape=a.shape, dtype=a.dtype, device=a.device),
                                  fn=lambda a: a * a)
    f = lambda a: square(a).sum()  # noqa: E731
    torch.testing.assert_close(tf.jit(f, executors=[ex])(A), (A * A).sum())
    with pytest.raises(tf.UnsupportedOpError, match=r"square, an operator of executor 'meta_ex'.*register a vjp"):
        tf.grad(f)(A)
    ex.register_lowering(square, vjp=(lambda a: (square(a), a), lambda a, g: (g * 2 * a,)))
    torch.testing.assert_close(tf.grad(f)(A), 2 * A)


@pytest.mark.parametrize("name", ["bad name", "del", "torch", "__x", "ünï", 3])
def test_operator_and_executor_names_must_be_safe_identifiers(name):
    with pytest.raises(ValueError, match="identifier"):
        OperatorExecutor("ok").register_operator(name, like=torch.neg, fn=torch.neg)
    if name not in ("torch", "__x"):  # names generated code reserves, fine for an executor (never printed)
        with pytest.raises(ValueError, match="identifier"):
            OperatorExecutor(name)


def test_registering_a_name_again_is_an_error_unless_it_says_replace():
    ex, multimul = multimul_executor()
    with pytest.raises(ValueError, match="already has an operator 'multimul'.*replace=True"):
        ex.register_operator("multimul", like=torch.neg, fn=torch.neg)
    ex.register_operator("multimul", like=torch.neg, fn=torch.neg, replace=True)
    with pytest.raises(ValueError, match="already has a lowering for ltorch.mul.*replace=True"):
        ex.register_lowering(ltorch.mul, lower=torch.neg)
    ex.register_lowering(ltorch.mul, lower=lambda a, b: a * b, replace=True)
    register_executor(ex)
    with pytest.raises(ValueError, match="already registered"):
        register_executor(OperatorExecutor(ex.name))
    assert get_executor(ex.name) is ex


def test_register_operator_needs_like_or_meta():
    with pytest.raises(TypeError, match=r"give like= or meta= \(or both\)"):
        OperatorExecutor("ex").register_operator("op", fn=torch.neg)


def test_an_operator_with_meta_and_like_takes_its_outputs_from_meta_and_its_derivative_from_like():
    """meta says what it returns (like is not traced for that); like is differentiated in its place, in
    reverse and forward mode, and may give None for an output without a derivative."""
    like_calls = []

    def sin_and_index_like(x):
        like_calls.append(x)
        return torch.sin(x), None

    ex = OperatorExecutor("sin_meta_like")
    op = ex.register_operator(
        "sin_and_index",
        meta=lambda x: (tf.TensorProxy.like(x), tf.TensorProxy(shape=(), dtype=torch.int64, device=x.device)),
        like=sin_and_index_like, fn=lambda x: (torch.sin(x), torch.tensor(7)))
    x = torch.randn(5, dtype=torch.float64)

    def f(x):
        return op(x)[0] * 2

    jitted = tf.jit(f)
    torch.testing.assert_close(jitted(x), 2 * torch.sin(x))
    assert "sin_and_index(" in str(tf.last_traces(jitted)[-1]) and not like_calls
    torch.testing.assert_close(tf.grad(lambda x: f(x).sum())(x), 2 * torch.cos(x))
    assert like_calls
    torch.testing.assert_close(tf.grad(lambda x: tf.grad(lambda x: f(x).sum())(x).sum())(x), -2 * torch.sin(x))
    _, tangent = tf.jvp(f, (x,), (torch.ones_like(x),))
    torch.testing.assert_close(tangent, 2 * torch.cos(x))


def test_bad_lowering_registrations_are_refused():
    ex = OperatorExecutor("ex")
    with pytest.raises(TypeError, match="give lower="):
        ex.register_lowering(ltorch.mul, checker=cpu_only)
    with pytest.raises(TypeError, match=r"\(fwd, bwd\) pair"):
        ex.register_lowering(ltorch.mul, lower=torch.mul, vjp=lambda a, b: a)
    with pytest.raises(TypeError, match="has no rule yet"):
        ex.register_lowering(ltorch.mul, lower=torch.mul, vjp=tf.custom_vjp(torch.mul))


# -- lowering and claiming -----------------------------------------------------------------------
def test_lowering_replaces_the_symbol_with_the_executors_operator():
    ex, _ = multimul_executor()
    jfn = tf.jit(lambda a, b: a * b, executors=[ex])
    torch.testing.assert_close(jfn(A, B), A * B)
    assert calls(jfn, "multimul") == 1 and "torch.mul" not in execution_trace(jfn)


def test_checker_is_called_with_proxies_and_a_no_leaves_the_symbol_to_the_next_executor():
    seen = []
    ex, _ = multimul_executor()
    ex.register_lowering(ltorch.mul, checker=lambda a, b: seen.append((a, b)) or b.ndim == 1,
                         lower=ex.lowerings[ltorch.mul.id].action.fn, replace=True)
    jfn = tf.jit(lambda a, b: a * b, executors=[ex])
    torch.testing.assert_close(jfn(A, B), A * B)
    assert all(isinstance(x, tf.TensorProxy) for x in seen[0])
    assert calls(jfn, "multimul") == 0 and calls(jfn, "torch.mul") == 1
    torch.testing.assert_close(jfn(A, B[0]), A * B[0])
    assert calls(jfn, "multimul") == 1


def test_the_first_executor_that_accepts_claims():
    first, _ = multimul_executor("first")
    second = OperatorExecutor("second")
    second_mul = second.register_operator("second_mul", like=lambda a, b: a * b, fn=np_mul)
    second.register_lowering(ltorch.mul, checker=cpu_only, lower=second_mul)
    for order, expected in (([first, second], "multimul"), ([second, first], "second_mul")):
        jfn = tf.jit(lambda a, b: a * b, executors=order)
        torch.testing.assert_close(jfn(A, B), A * B)
        assert calls(jfn, expected) == 1


def test_an_unclaimed_symbol_is_tried_as_its_decomposition():
    ex = OperatorExecutor("prim_ex")
    prim_mul = ex.register_operator("prim_mul", like=lambda a, b: a * b, fn=np_mul)
    ex.register_lowering(tf.prims.mul, lower=prim_mul)
    jfn = tf.executor_lower(lambda a, b: torch.sigmoid(a) * b, [ex, "torch_prims"])
    torch.testing.assert_close(jfn(A, B), torch.sigmoid(A) * B)
    assert calls(jfn, "prim_mul") == 1 and calls(jfn, "torch.mul") == 0  # ltorch.mul -> prims.mul -> prim_mul


def _numpy_add_executor():
    """The tutorial's executor: numpy's add for prims.add, on float32 matrices with two rows only."""
    def checker(a, b):
        return a.dtype == torch.float32 and a.ndim == 2 and a.shape[0] == 2

    return add_operator_executor("numpy_add", {tf.prims.PrimIDs.ADD: (
        "add_numpy", checker, lambda a, b: torch.from_numpy(np.add(a.numpy(), b.numpy())))},
        add_to_default_executors=False)


def test_priority_beats_granularity_a_prim_executor_before_torch_runs_inside_torch_add():
    _numpy_add_executor()
    before = tf.jit(lambda a, b: torch.add(a, b) * 2, executors=["numpy_add", "torch"])
    after = tf.jit(lambda a, b: torch.add(a, b) * 2, executors=["torch", "numpy_add"])
    x = torch.randn(2, 3)
    for jfn in (before, after):
        torch.testing.assert_close(jfn(x, x), (x + x) * 2)
    assert calls(before, "add_numpy") == 1 and calls(before, "torch.add") == 0
    assert calls(after, "add_numpy") == 0 and calls(after, "torch.add") == 1  # listed after torch: never runs
    y = torch.randn(3, 3)  # the checker refuses this call site: torch runs torch.add whole
    torch.testing.assert_close(before(y, y), (y + y) * 2)
    assert calls(before, "add_numpy") == 0 and calls(before, "torch.add") == 1


def test_no_executor_for_a_prim_is_an_error_naming_the_bound_symbol_and_the_executors():
    ex, _ = multimul_executor()
    with pytest.raises(RuntimeError) as info:
        tf.executor_lower(lambda x: torch.sin(x) * 2, [ex])(torch.randn(3))
    message = str(info.value)
    assert message.startswith("Could not find executor for bound symbol")
    assert "prims.sin(x)" in message and "mm_ex" in message


def test_a_checker_that_raises_is_reported_with_the_executors_name():
    ex = OperatorExecutor("fragile")
    ex.register_lowering(ltorch.mul, checker=lambda a, b: 1 / 0, lower=lambda a, b: a * b)
    with pytest.raises(RuntimeError, match="executor 'fragile'.*ltorch.mul.*ZeroDivisionError") as info:
        tf.jit(lambda a, b: a * b, executors=[ex])(A, B)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_a_lowering_can_add_torch_ops_around_the_operator():
    ex = OperatorExecutor("strict")

    def strict(a):
        assert a.is_contiguous(), "needs contiguous input"
        return -a

    neg = ex.register_operator("strict_neg", like=torch.neg, fn=strict)
    ex.register_lowering(ltorch.neg, lower=lambda a: neg(a.contiguous()))
    x = torch.randn(3, 4).t()
    jfn = tf.jit(lambda a: -a, executors=[ex])
    torch.testing.assert_close(jfn(x), -x)
    lines = execution_trace(jfn).splitlines()
    contiguous = next(i for i, line in enumerate(lines) if "torch.Tensor.contiguous(a)" in line)
    assert contiguous < next(i for i, line in enumerate(lines) if "strict_neg(" in line)


def test_register_implementation_is_register_lowering_with_the_tutorials_names():
    ex, multimul = multimul_executor()
    fwd, bwd = mul_vjp(multimul)
    ex.register_implementation(ltorch.mul, checker=cpu_only, execution_transform=ex.lowerings[ltorch.mul.id].action.fn,
                               grad_transform=(fwd, bwd), replace=True)
    g = tf.jit(tf.grad(loss, argnums=(0, 1)), executors=[ex])
    torch.testing.assert_close(g(A, B), (B, A))
    assert calls(g, "multimul") == 1


# -- an executor's vjp ----------------------------------------------------------------------------
def test_a_lowering_on_torch_mul_runs_the_forward_and_both_backward_products():
    """The backward is written in the torch language: the two products of mul's VJP are
    ltorch.mul, so the tutorial's lowering registered on tf.torch.mul claims them too."""
    ex, _ = multimul_executor()
    vg = tf.jit(tf.value_and_grad(loss, argnums=(0, 1)), executors=[ex])
    torch.testing.assert_close(vg(A, B), (loss(A, B), (B, A)))
    assert calls(vg, "multimul") == 3
    a, b = A.clone().requires_grad_(), B.clone().requires_grad_()
    jfn = tf.jit(lambda a, b: a * b, executors=[ex])
    jfn(a, b).sum().backward()
    torch.testing.assert_close((a.grad, b.grad), (B, A))
    assert calls(jfn, "multimul") == 1 and calls(jfn, "multimul", backward=True) == 2


def test_backward_traces_read_in_the_torch_language():
    """No bare prim at the top level of a backward where torch has the operation (sum's VJP is an
    expand, mul's a mul, a cast a to): the vocabulary a torch-level executor claims."""
    def f(x, w):
        return (torch.tanh(x @ w) * 2.0).sum(dim=1).to(torch.float64).mean()

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    jf = tf.jit(f)
    jf(x, w).backward()
    bwd = tf.last_backward_traces(jf)[0]
    top = [b.sym.print_name for b in bwd.bound_symbols if b.sym.printer is None]
    assert top and all(name.startswith("ltorch.") for name in top), top
    g = tf.jit(tf.grad(f, argnums=(0, 1)))
    g(x.detach(), w.detach())
    forward_and_backward = tf.last_traces(g)[0]
    assert not [b for b in forward_and_backward.bound_symbols if b.sym.is_prim and b.sym.printer is None
                and b.sym.print_name in ("prims.mul", "prims.broadcast_in_dim", "prims.convert_element_type")]


def test_a_custom_vjp_makes_the_backward_one_multimul_call():
    ex, multimul = multimul_executor()
    ex.register_lowering(ltorch.mul, checker=cpu_only, lower=ex.lowerings[ltorch.mul.id].action.fn,
                         vjp=mul_vjp(multimul), replace=True)
    g = tf.jit(tf.grad(loss, argnums=(0, 1)), executors=[ex])
    torch.testing.assert_close(g(A, B), (B, A))
    assert calls(g, "multimul") == 1 and "torch.mul" not in execution_trace(g)
    lowered = tf.executor_lower(tf.grad(loss, argnums=(0, 1)), [ex, "torch"])  # the transform on its own
    torch.testing.assert_close(lowered(A, B), (B, A))
    assert calls(lowered, "multimul") == 1


def test_a_custom_vjp_serves_torch_autograd_with_a_one_call_backward():
    ex, multimul = multimul_executor()
    ex.register_lowering(ltorch.mul, checker=cpu_only, lower=ex.lowerings[ltorch.mul.id].action.fn,
                         vjp=mul_vjp(multimul), replace=True)
    a, b = A.clone().requires_grad_(), B.clone().requires_grad_()
    jfn = tf.jit(lambda a, b: a * b, executors=[ex])
    out = jfn(a, b)
    out.sum().backward()
    torch.testing.assert_close((out.detach(), a.grad, b.grad), (A * B, B, A))
    assert calls(jfn, "multimul") == 1 and calls(jfn, "multimul", backward=True) == 1


def test_a_custom_vjp_function_is_used_as_is():
    ex, multimul = multimul_executor()
    scaled = tf.custom_vjp(torch.mul)
    scaled.defvjp(lambda a, b: (a * b, (a, b)), lambda res, g: (g * res[1] * 10, g * res[0] * 10))
    ex.register_lowering(ltorch.mul, checker=cpu_only, lower=ex.lowerings[ltorch.mul.id].action.fn, vjp=scaled,
                         replace=True)
    torch.testing.assert_close(tf.jit(tf.grad(loss, argnums=(0, 1)), executors=[ex])(A, B), (10 * B, 10 * A))


def test_an_executors_vjp_is_used_only_where_it_claims_the_symbol():
    ex, multimul = multimul_executor()
    ex.register_lowering(ltorch.mul, checker=lambda a, b: a.ndim == 1, lower=ex.lowerings[ltorch.mul.id].action.fn,
                         vjp=mul_vjp(multimul), replace=True)
    rejected = tf.jit(tf.grad(loss, argnums=(0, 1)), executors=[ex])
    torch.testing.assert_close(rejected(A, B), (B, A))
    assert calls(rejected, "multimul") == 0  # 2-D: the checker says no, mul is differentiated as usual
    torch.testing.assert_close(rejected(A[0], B[0]), (B[0], A[0]))
    assert calls(rejected, "multimul") == 1
    elsewhere = tf.grad(loss, argnums=(0, 1))  # ex is not among the executors
    torch.testing.assert_close(elsewhere(A[0], B[0]), (B[0], A[0]))
    assert calls(elsewhere, "multimul") == 0


def test_vjp_uses_the_executors_vjp_where_its_executors_are_active():
    ex, multimul = multimul_executor()
    ex.register_lowering(ltorch.mul, checker=cpu_only, lower=ex.lowerings[ltorch.mul.id].action.fn,
                         vjp=mul_vjp(multimul), replace=True)
    ct = torch.randn(3, 2)
    pullback = tf.jit(lambda a, b, ct: tf.vjp(lambda a, b: a * b, a, b)[1](ct), executors=[ex])
    torch.testing.assert_close(pullback(A, B, ct), (ct * B, ct * A))
    assert calls(pullback, "multimul") == 1


def test_grad_of_grad_through_an_executors_vjp():
    ex, multimul = multimul_executor()
    ex.register_lowering(ltorch.mul, checker=cpu_only, lower=ex.lowerings[ltorch.mul.id].action.fn,
                         vjp=mul_vjp(multimul), replace=True)
    x = torch.randn(4, dtype=torch.float64)
    f = lambda t: (t * t * t).sum()  # noqa: E731
    hess_diag_sum = tf.jit(tf.grad(lambda t: tf.grad(f)(t).sum()), executors=[ex])
    torch.testing.assert_close(hess_diag_sum(x), 6 * x)


# -- the registry ---------------------------------------------------------------------------------
def test_add_operator_executor_builds_registers_and_prepends_to_the_defaults():
    calls_made = []

    def np_add(a, b, *, alpha=1):
        calls_made.append(1)
        return torch.from_numpy(np.add(a.numpy(), b.numpy()))

    before = get_default_executors()
    ex = add_operator_executor("np_add_ex", {ltorch.add.id: ("np_add", lambda a, b, alpha=1: alpha == 1, np_add)})
    assert get_executor("np_add_ex") is ex and get_default_executors() == [ex, *before]
    jfn = tf.jit(lambda a, b: a + b)
    torch.testing.assert_close(jfn(A, B), A + B)
    assert calls(jfn, "np_add") == 1 and calls_made
    # the operator takes the symbol's gradient
    torch.testing.assert_close(tf.grad(lambda a, b: (a + b * 2).sum(), argnums=(0, 1))(A, B),
                               (torch.ones_like(A), torch.full_like(B, 2.0)))
    set_default_executors(before)
    add_operator_executor("np_add_later", {tf.prims.PrimIDs.ADD: ("np_add", None, np_add)},
                          add_to_default_executors=False)
    assert get_default_executors() == before
    with pytest.raises(ValueError, match="no prim or torch-language symbol has the id"):
        add_operator_executor("nothing", {"torch.no_such_op": ("op", None, np_add)})


def test_executors_are_named_by_string_or_passed_as_objects():
    ex, _ = multimul_executor("by_name")
    register_executor(ex)
    for executors in (["by_name"], [ex]):
        jfn = tf.jit(lambda a, b: a * b, executors=executors)
        torch.testing.assert_close(jfn(A, B), A * B)
        assert calls(jfn, "multimul") == 1
    with pytest.raises(ValueError, match="no executor named 'nope'"):
        tf.jit(lambda a: a, executors=["nope"])(A)



def test_one_executor_alone_is_a_list_of_one_not_one_executor_per_letter():
    ex, _ = multimul_executor("alone")
    register_executor(ex)
    for executors in ("alone", ex, ("alone",)):
        jfn = tf.jit(lambda a, b: a * b, executors=executors)
        torch.testing.assert_close(jfn(A, B), A * B)
        assert calls(jfn, "multimul") == 1
        lowered = tf.executor_lower(lambda a, b: a * b, executors)
        torch.testing.assert_close(lowered(A, B), A * B)
        assert calls(lowered, "multimul") == 1
    with pytest.raises(ValueError, match="no executor named 'nope'"):  # the name, not its letter 'n'
        tf.jit(lambda a: a, executors="nope")(A)
    with pytest.raises(tf.errors.ArgumentTypeError, match="executors must be an executor .* or a list of them"):
        tf.jit(lambda a: a, executors=3)


# -- docs/extending.md ------------------------------------------------------------------------------
def test_page_multimul_runs_as_the_operator(page):
    assert calls(page.cfoo, "multimul") == 1
    assert calls(page.cbar, "multimul") == 1 and calls(page.cbar, "torch.mul") == 0


def test_page_gradient_runs_on_multimul_and_its_custom_vjp_makes_one_call(page):
    a, b = page.a, page.b
    torch.testing.assert_close(page.grads(a, b), (b, a))
    assert calls(page.grads, "multimul") == 1 and "torch.mul" not in execution_trace(page.grads)
    assert calls(page.jbar, "multimul", backward=True) == 1


def test_page_contiguous_lowering_copies_before_the_operator(page):
    trace = execution_trace(page.cstrict)
    assert trace.index("torch.Tensor.contiguous(a)") < trace.index("strict_mul(")


def test_page_numpy_add_claims_only_what_its_checker_accepts_and_order_matters(page):
    x32, y32 = torch.randn(2, 3), torch.randn(2, 3)
    for executors, expected in ((["np_ex"], "np_add"), (["torch", "np_ex"], "torch.add")):
        jfn = tf.jit(page.add, executors=executors)
        torch.testing.assert_close(jfn(x32, y32), x32 + y32)
        assert page.ran(jfn) == [expected]
    jfn = tf.jit(page.add, executors=["np_ex"])
    for x in (torch.randn(3, 3), torch.randn(2, 3, dtype=torch.float64), torch.randn(2)):
        torch.testing.assert_close(jfn(x, x), x + x)
        assert page.ran(jfn) == ["torch.add"]
    assert page.np_ex not in get_default_executors()  # the page put the defaults back


def test_page_new_prim_and_decomposition_pass_their_opinfo_checks(page):
    from thunderfn.testing.checks import check_opinfo

    assert check_opinfo(page.unfold_opinfo) == {"samples": 10, "error_inputs": 3}
    x = torch.randn(4, 6)
    assert "prims.unfold" in str(tf.trace(lambda t: t.unfold(0, 2, 1), x))
    t = torch.tensor([0.0, 0.5, -2.0], dtype=torch.float64)
    torch.testing.assert_close(tf.jit(torch.sinc, executors=["torch_prims"], fallback=False)(t), torch.sinc(t))
    assert "ltorch.sinc" in str(tf.trace(torch.sinc, t))


def test_page_cross_entropy_executor_claims_only_mean_and_sum(page):
    logits, target = torch.randn(6, 4), torch.randint(0, 4, (6,))
    target[0] = -100  # ignored, as torch ignores it
    for reduction, expected in (("mean", "fused_cross_entropy"), ("sum", "fused_cross_entropy"),
                                ("none", "torch.nn.functional.cross_entropy")):
        jfn = tf.jit(lambda x, t: F.cross_entropy(x, t, reduction=reduction), executors=[page.ce_ex])
        torch.testing.assert_close(jfn(logits, target), F.cross_entropy(logits, target, reduction=reduction))
        assert page.ran(jfn) == [expected]
    soft = torch.softmax(torch.randn(6, 4), 1)  # probabilities: not for this executor
    jfn = tf.jit(lambda x, t: F.cross_entropy(x, t), executors=[page.ce_ex])
    torch.testing.assert_close(jfn(logits, soft), F.cross_entropy(logits, soft))
    assert calls(jfn, "fused_cross_entropy") == 0
    g = tf.jit(tf.grad(lambda x, t: F.cross_entropy(x, t, reduction="sum")), executors=[page.ce_ex])
    torch.testing.assert_close(g(logits, target), torch.func.grad(
        lambda x: F.cross_entropy(x, target, reduction="sum"))(logits))


def test_two_objects_printed_under_one_name_are_refused_not_confused():
    one, multimul_one = multimul_executor("one")
    two, multimul_two = multimul_executor("two")
    with pytest.raises(ValueError, match="bind 'multimul' to two different objects"):
        tf.jit(lambda a, b: multimul_one(a, b, a, b)[0] + multimul_two(a, b, a, b)[0], executors=[one, two])(A, B)


def test_a_lowerings_contiguous_copies_change_only_its_own_threads_tracing():
    """While one thread lowers (an executor's lowering traced with x.contiguous() as a copy), another thread
    tracing user code keeps x.contiguous()'s usual meaning: no global handler is swapped."""
    usual = find_handler(torch.Tensor.contiguous)
    inside, release, seen = threading.Event(), threading.Event(), {}

    def lowering_thread():
        with interception.handled_by(torch.Tensor.contiguous, lowering_contiguous):
            seen["lowering"] = find_handler(torch.Tensor.contiguous)
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=lowering_thread)
    worker.start()
    assert inside.wait(10)
    seen["other"] = find_handler(torch.Tensor.contiguous)
    release.set()
    worker.join()
    assert seen["lowering"] is lowering_contiguous
    assert seen["other"] is usual and usual is not lowering_contiguous
    assert find_handler(torch.Tensor.contiguous) is usual
