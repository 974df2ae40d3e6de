"""The kinds of programs torch's functorch tests run (test/functorch/test_eager_transforms.py and
test_vmap.py: grad, vjp, jvp, the Jacobians, vmap's options, randomness, compositions, and the model
examples: MAML, ensembling, per-sample gradients), each run through torch.func and through thunderfn
on the same inputs, in float64: the law is that thunderfn's result is torch.func's (to 1e-10)."""
import copy
from collections import namedtuple

import pytest
import torch
import torch.func

import thunderfn as tf

D = torch.float64


def close(ours, theirs):
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)


def rand(*shape, seed=0):
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(seed + sum(shape)))


def same(build, *args):
    """build(F) returns a callable transformed with F (torch.func or thunderfn): both on args agree."""
    close(build(tf)(*args), build(torch.func)(*args))


# -- grad -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [lambda x: x.sin().sum(), lambda x: (x ** 3).mean(), lambda x: x.logsumexp((0, 1)),
                                lambda x: torch.linalg.norm(x), lambda x: (x @ x.T).trace()],
                         ids=["sin", "cube-mean", "logsumexp", "norm", "gram-trace"])
def test_grad_of_scalar_functions(fn):
    same(lambda F: F.grad(fn), rand(3, 3))


def test_grad_argnums_tuple_and_negative():
    f = lambda x, y, z: (x * y.sin() * z.exp()).sum()  # noqa: E731
    args = rand(4), rand(4, seed=1), rand(4, seed=2)
    for argnums in (0, 2, -1, (0, 2), (1, -1)):
        same(lambda F: F.grad(f, argnums=argnums), *args)


def test_grad_over_pytree_arguments():
    f = lambda p, x: (p["w"] @ x + p["b"][0]).tanh().sum()  # noqa: E731
    p = {"w": rand(3, 4), "b": (rand(3, seed=1), rand(2, seed=2))}
    same(lambda F: F.grad(f), p, rand(4))


def test_grad_and_value_with_aux():
    f = lambda x: ((x ** 2).sum(), {"mean": x.mean(), "max": x.max()})  # noqa: E731
    g_ours, aux_ours = tf.grad(f, has_aux=True)(rand(5))
    g_theirs, aux_theirs = torch.func.grad(f, has_aux=True)(rand(5))
    close(g_ours, g_theirs)
    close(aux_ours, aux_theirs)
    (value, aux), g = tf.value_and_grad(f, has_aux=True)(rand(5))
    g2, (value2, aux2) = torch.func.grad_and_value(f, has_aux=True)(rand(5))  # (torch.func's order is swapped)
    close((value, aux, g), (value2, aux2, g2))


def test_grad_of_grad_and_keyword_arguments():
    f = lambda x, *, scale: (scale * x).sin().sum()  # noqa: E731
    close(tf.grad(lambda x: tf.grad(f)(x, scale=2.0).sum())(rand(3)),
          torch.func.grad(lambda x: torch.func.grad(f)(x, scale=2.0).sum())(rand(3)))


def test_grad_of_an_independent_input_is_zeros():
    same(lambda F: F.grad(lambda x, y: x.sum(), argnums=1), rand(3), rand(2))


def test_grad_through_no_grad_and_detach():
    def f(x):
        with torch.no_grad():
            c = x.cos()
        return (x.sin() * c + x.detach() * x).sum()
    same(lambda F: F.grad(f), rand(4))


# -- vjp --------------------------------------------------------------------------------------------
def test_vjp_of_a_multi_output_function():
    f = lambda x, y: (x.sin() * y, (x @ y.unsqueeze(-1)).squeeze(-1))  # noqa: E731
    x, y = rand(3, 4), rand(4, seed=1)
    cts = (rand(3, 4, seed=2), rand(3, seed=3))
    for F in (tf, torch.func):
        out, vjp_fn = F.vjp(f, x, y)
        if F is tf:
            ours = out, vjp_fn(cts)
        else:
            theirs = out, vjp_fn(cts)
    close(ours, theirs)


def test_vjp_with_aux_and_calling_vjp_fn_twice():
    f = lambda x: (x.exp(), x.sum())  # noqa: E731
    out, vjp_fn, aux = tf.vjp(f, rand(3), has_aux=True)
    out2, vjp_fn2, aux2 = torch.func.vjp(f, rand(3), has_aux=True)
    close((out, aux, vjp_fn(rand(3, seed=4)), vjp_fn(rand(3, seed=5))),
          (out2, aux2, vjp_fn2(rand(3, seed=4)), vjp_fn2(rand(3, seed=5))))


def test_vjp_of_vjp():
    def second(F, x, v, w):
        _, vjp_fn = F.vjp(lambda x: F.vjp(torch.tanh, x)[1](v)[0], x)
        return vjp_fn(w)
    close(second(tf, rand(4), rand(4, seed=1), rand(4, seed=2)),
          second(torch.func, rand(4), rand(4, seed=1), rand(4, seed=2)))


# -- jvp and linearize ------------------------------------------------------------------------------
def test_jvp_of_several_primals_with_aux():
    f = lambda x, y: ((x * y).sin(), x.sum())  # noqa: E731
    primals, tangents = (rand(3), rand(3, seed=1)), (rand(3, seed=2), rand(3, seed=3))
    close(tf.jvp(f, primals, tangents, has_aux=True), torch.func.jvp(f, primals, tangents, has_aux=True))


def test_jvp_over_pytrees_and_jvp_of_jvp():
    f = lambda p: (p["a"] * p["b"].exp()).sum()  # noqa: E731
    p, t = {"a": rand(3), "b": rand(3, seed=1)}, {"a": rand(3, seed=2), "b": rand(3, seed=3)}
    close(tf.jvp(f, (p,), (t,)), torch.func.jvp(f, (p,), (t,)))

    def second(F, x, v):
        return F.jvp(lambda x: F.jvp(torch.sin, (x,), (v,))[1], (x,), (v,))
    close(second(tf, rand(3), rand(3, seed=1)), second(torch.func, rand(3), rand(3, seed=1)))


def test_linearize_matches_jvp():
    f = lambda x: x.sin() * x.cos()  # noqa: E731
    out, jvp_fn = tf.linearize(f, rand(5))
    out2, jvp_fn2 = torch.func.linearize(f, rand(5))
    close((out, jvp_fn(rand(5, seed=1))), (out2, jvp_fn2(rand(5, seed=1))))


# -- jacrev / jacfwd / hessian ----------------------------------------------------------------------
@pytest.mark.parametrize("jac", ["jacrev", "jacfwd"])
def test_jacobians_of_vector_functions(jac):
    same(lambda F: getattr(F, jac)(lambda x: x.sin() * x.sum()), rand(4))
    same(lambda F: getattr(F, jac)(lambda x, y: x @ y, argnums=(0, 1)), rand(2, 3), rand(3, seed=1))
    same(lambda F: getattr(F, jac)(lambda x: {"s": x.sin(), "c": (x.cos().sum(),)}), rand(3))


@pytest.mark.parametrize("jac", ["jacrev", "jacfwd"])
def test_jacobian_with_aux(jac):
    f = lambda x: (x.exp(), x.sum())  # noqa: E731
    close(getattr(tf, jac)(f, has_aux=True)(rand(3)), getattr(torch.func, jac)(f, has_aux=True)(rand(3)))


def test_jacrev_in_chunks():
    same(lambda F: F.jacrev(lambda x: x.outer(x).sin(), chunk_size=2), rand(3))


def test_hessians():
    f = lambda x: (x.sin() * x.roll(1)).sum()  # noqa: E731
    same(lambda F: F.hessian(f), rand(4))
    same(lambda F: F.jacrev(F.jacrev(f)), rand(4))
    same(lambda F: F.jacfwd(F.jacfwd(f)), rand(4))
    same(lambda F: F.hessian(lambda x, y: (x * y ** 2).sum(), argnums=(0, 1)), rand(2), rand(2, seed=1))


# -- vmap -------------------------------------------------------------------------------------------
def test_vmap_in_and_out_dims():
    f = lambda x, y: x * y.sum()  # noqa: E731
    same(lambda F: F.vmap(f, (1, 0)), rand(5, 3), rand(3, 2))
    same(lambda F: F.vmap(f, (0, None)), rand(3, 2), rand(7))
    same(lambda F: F.vmap(lambda x: (x, x.sum()), 0, (1, 0)), rand(3, 4))
    same(lambda F: F.vmap(f, (-1, None), -1), rand(2, 3), rand(4))
    same(lambda F: F.vmap(torch.sin, 0, (1,)), rand(3, 2))  # a 1-tuple for a single output, as functorch tests


def test_vmap_torch_funcs_keyword_names():
    f = lambda x, y: x @ y  # noqa: E731
    x, w = rand(5, 3), rand(3, 2)
    close(tf.vmap(f, in_dims=(0, None), out_dims=1)(x, w), torch.func.vmap(f, in_dims=(0, None), out_dims=1)(x, w))


def test_vmap_over_pytrees_and_nested_in_dims():
    f = lambda d, s: d["a"] * s[0] + d["b"].sum() * s[1]  # noqa: E731
    d, s = {"a": rand(4, 3), "b": rand(2, 4)}, (rand(3), rand(4, seed=1))
    same(lambda F: F.vmap(f, ({"a": 0, "b": 1}, (None, 0))), d, s)


def test_nested_vmap_is_an_outer_product_and_chunking_changes_nothing():
    same(lambda F: F.vmap(F.vmap(torch.mul, (None, 0)), (0, None)), rand(3), rand(4))
    same(lambda F: F.vmap(lambda x: x.sin().sum(0), chunk_size=2), rand(5, 3))


def test_vmap_of_matmul_like_ops_and_reductions():
    same(lambda F: F.vmap(torch.mm), rand(4, 2, 3), rand(4, 3, 5))
    same(lambda F: F.vmap(lambda x: x.softmax(-1).cumsum(0)), rand(3, 4, 5))
    same(lambda F: F.vmap(lambda x: torch.nn.functional.conv1d(x[None], torch.ones(2, 1, 3, dtype=D))), rand(3, 1, 8))


def test_vmap_of_in_place_ops_unbatched_outputs_and_keywords():
    same(lambda F: F.vmap(lambda x: x.clone().mul_(2).add_(1)), rand(3, 4))
    same(lambda F: F.vmap(lambda x, y: (x * 2, y.sin()), (0, None), (0, None)), rand(3, 2), rand(5))
    f = lambda x, *, scale: x * scale  # noqa: E731 (keyword arguments are not batched, in either)
    close(tf.vmap(f)(rand(3, 2), scale=rand(2, seed=9)), torch.func.vmap(f)(rand(3, 2), scale=rand(2, seed=9)))


def test_forward_and_reverse_mode_through_a_module_and_a_namedtuple():
    model = _mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}
    tangents = {k: torch.ones_like(v) for k, v in params.items()}
    x = rand(4, 3)
    close(tf.jvp(lambda p: tf.functional_call(model, p, (x,)), (params,), (tangents,)),
          torch.func.jvp(lambda p: torch.func.functional_call(model, p, (x,)), (params,), (tangents,)))
    Pair = namedtuple("Pair", "a b")
    f = lambda pair: (pair.a.exp() * pair.b).sum()  # noqa: E731
    same(lambda F: F.grad(f), Pair(rand(3), rand(3, seed=1)))
    close(tf.hessian(lambda p: (tf.functional_call(model, p, (x,)) ** 2).sum())(params)["2.bias"]["2.bias"],
          torch.func.hessian(lambda p: (torch.func.functional_call(model, p, (x,)) ** 2).sum())(params)["2.bias"][
              "2.bias"])


@pytest.mark.parametrize("randomness", ["different", "same"])
def test_vmap_randomness_draws_what_torch_func_draws(randomness):
    f = lambda x: x + torch.rand(4, dtype=D)  # noqa: E731 (an unbatched draw: "same" shares it)
    x = rand(3, 4)
    torch.manual_seed(7)
    ours = tf.vmap(f, randomness=randomness)(x)
    torch.manual_seed(7)
    theirs = torch.func.vmap(f, randomness=randomness)(x)
    close(ours, theirs)
    rows_equal = torch.allclose(ours[0] - x[0], ours[1] - x[1])
    assert rows_equal == (randomness == "same")


# -- compositions -----------------------------------------------------------------------------------
def test_per_example_gradients_and_jacobians():
    f = lambda w, x: (x @ w).tanh().sum()  # noqa: E731
    w, xs = rand(3, 2), rand(6, 3, seed=1)
    same(lambda F: F.vmap(F.grad(f), (None, 0)), w, xs)
    same(lambda F: F.vmap(F.jacrev(lambda x: x.sin() * x.sum())), rand(4, 3))
    same(lambda F: F.vmap(F.hessian(lambda x: (x ** 3).sum())), rand(2, 3))


def test_grad_of_vmap_and_jvp_of_grad():
    same(lambda F: F.grad(lambda w: F.vmap(lambda x: (w * x).sin().sum())(rand(4, 3, seed=5)).sum()), rand(3))
    for F in (tf, torch.func):  # a Hessian-vector product, forward over reverse
        hvp = F.jvp(F.grad(lambda x: (x.sin() * x).sum()), (rand(3),), (rand(3, seed=1),))[1]
        if F is tf:
            ours = hvp
    close(ours, hvp)


# -- the model examples ---------------------------------------------------------------------------
def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(D)


def test_per_sample_gradients_of_a_model():
    model = _mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}
    xs, ys = rand(5, 3), rand(5, 1, seed=1)

    def loss(F, p, x, y):
        return torch.nn.functional.mse_loss(F.functional_call(model, p, (x[None],)), y[None])

    per_sample = {F: F.vmap(F.grad(lambda p, x, y: loss(F, p, x, y)), (None, 0, 0))(params, xs, ys)
                  for F in (tf, torch.func)}
    close(per_sample[tf], per_sample[torch.func])


def test_ensembling_with_stacked_module_state():
    models = [_mlp(seed) for seed in range(3)]
    x = rand(4, 3)
    results = {}
    for F in (tf, torch.func):
        params, buffers = F.stack_module_state(models)
        base = copy.deepcopy(models[0]).to("meta")
        one = lambda p, b, x: F.functional_call(base, (p, b), (x,))  # noqa: E731
        results[F] = F.vmap(one, (0, 0, None))(params, buffers, x)
    close(results[tf], results[torch.func])
    close(results[tf][1], models[1](x).detach())


def test_maml_inner_and_outer_gradients():
    model = _mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}
    tasks = [(rand(4, 3, seed=s), rand(4, 1, seed=s + 10)) for s in range(3)]

    def meta_loss(F, params):
        total = 0.0
        for x, y in tasks:
            inner = lambda p: torch.nn.functional.mse_loss(F.functional_call(model, p, (x,)), y)  # noqa: E731
            g = F.grad(inner)(params)
            adapted = {k: params[k] - 0.1 * g[k] for k in params}
            total = total + inner(adapted)
        return total

    close(tf.grad(lambda p: meta_loss(tf, p))(params), torch.func.grad(lambda p: meta_loss(torch.func, p))(params))
