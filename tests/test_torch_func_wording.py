"""Where thunderfn refuses a call for the reason torch.func refuses it, it raises the builtin torch.func
raises, and its message contains torch.func's sentence (PyTorch's functorch tests match these sentences
with regexes); thunderfn's own advice may follow. Each case runs the same call through torch.func and
through thunderfn, so a sentence torch changes fails here."""
import pytest
import torch
import torch.func

import thunderfn as tf

X, X2, M = torch.randn(3), torch.randn(2), torch.randn(3, 4)
INT = torch.arange(3)
COMPLEX = torch.randn(3, dtype=torch.complex64)

# id: (the call, given torch.func or thunderfn, torch.func's sentence)
CASES = {
    # vmap: what it is asked to batch
    "vmap-random-in-error-mode": (
        lambda F: F.vmap(lambda x: torch.rand_like(x) + x)(X),
        "vmap: called random operation while in randomness error mode. Please either use the 'same' or 'different' "
        "randomness flags on vmap or perform the randomness operation out of vmap"),
    "vmap-same-randomness-batched-input": (
        lambda F: F.vmap(torch.bernoulli, randomness="same")(torch.rand(3, 4)),
        "Vmap does not currently support same randomness with a batched tensor input"),
    "vmap-different-inplace-randomness-unbatched": (
        lambda F: F.vmap(lambda x, y: y.uniform_() + x, (0, None), randomness="different")(M, torch.zeros(4)),
        "vmap: Cannot ask for different inplace randomness on an unbatched tensor. This will appear like same "
        "randomness. If this is necessary for your usage, please file an issue with functorch."),
    "vmap-batch-sizes-differ": (
        lambda F: F.vmap(torch.add)(X, X2),
        "Expected all tensors to have the same size in the mapped dimension, got sizes [3, 2] for the mapped "
        "dimension"),
    "vmap-nothing-batched": (
        lambda F: F.vmap(torch.sin, (None,))(X),
        "vmap: Expected at least one Tensor to vmap over"),
    "vmap-no-inputs": (
        lambda F: F.vmap(lambda: torch.ones(1))(),
        "got no inputs. Maybe you forgot to add inputs, or you are trying to vmap over a function with no inputs. "
        "The latter is unsupported."),
    "vmap-item": (
        lambda F: F.vmap(lambda x: x.sum().item())(M),
        "vmap: It looks like you're calling .item() on a Tensor. We don't support vmap over calling .item() on a "
        "Tensor, please try to rewrite what you're doing with other operations."),
    "vmap-data-dependent-control-flow": (
        lambda F: F.vmap(lambda x: x if x.sum() > 0 else -x)(M),
        "vmap: It looks like you're attempting to use a Tensor in some data-dependent control flow. We don't "
        "support that yet"),
    # vmap: its options
    "vmap-chunk-size-0": (
        lambda F: F.vmap(torch.sin, chunk_size=0),
        "vmap: chunk_size should be None or greater than 0."),
    "vmap-unknown-randomness": (
        lambda F: F.vmap(torch.sin, randomness="sometimes"),
        "Only allowed values for randomness are 'error', 'different', or 'same'. Got sometimes"),
    "vmap-in-dims-a-string": (
        lambda F: F.vmap(torch.sin, "a")(X),
        "expected `in_dims` to be int or a (potentially nested) tuple matching the structure of inputs, got: "
        "<class 'str'>."),
    "vmap-in-dim-a-string": (
        lambda F: F.vmap(torch.add, (0, "a"))(X, X),
        "Got in_dim=a for an input but in_dim must be either an integer dimension or None."),
    "vmap-in-dims-structure": (
        lambda F: F.vmap(torch.add, (0, 0, 0))(X, X),
        "in_dims is not compatible with the structure of `inputs`."),
    "vmap-in-dim-for-a-float": (
        lambda F: F.vmap(lambda x, s: x * s, (0, 0))(X, 2.0),
        "Got in_dim=0 for an input but the input is of type <class 'float'>. We cannot vmap over non-Tensor "
        "arguments, please use None as the respective in_dim"),
    "vmap-in-dim-out-of-range": (
        lambda F: F.vmap(torch.sin, 1)(X),
        "Got in_dim=1 for some input, but that input is a Tensor of dimensionality 1 so expected in_dim to "
        "satisfy -1 <= in_dim < 1."),
    "vmap-out-dims-structure": (
        lambda F: F.vmap(lambda x: (x, x), 0, (0, 0, 0))(X),
        "out_dims is not compatible with the structure of `outputs`."),
    "vmap-out-dims-a-string": (
        lambda F: F.vmap(torch.sin, 0, "a")(X),
        "`out_dims` must be an int, None or a python collection of ints representing where in the outputs the "
        "vmapped dimension should appear."),
    "vmap-out-dim-none-of-a-batched-output": (
        lambda F: F.vmap(torch.sin, 0, None)(X),
        "vmap(sin, ...): `sin` can not return a BatchedTensor when out_dim is None"),
    "vmap-out-dim-of-a-float": (
        lambda F: F.vmap(lambda x: 2.0)(X),
        "`<lambda>` must only return Tensors, got type <class 'float'>. Did you mean to set out_dims= to None for "
        "output?"),
    "vmap-out-dim-out-of-range": (
        lambda F: F.vmap(torch.sin, 0, 2)(X),
        "Dimension out of range (expected to be in range of [-1, 0], but got 2)"),
    # argnums (grad, jacrev, jacfwd)
    "grad-argnum-past-the-arguments": (
        lambda F: F.grad(torch.sin, argnums=1)(X.sum()),
        "Got argnum=1, but only 1 positional inputs"),
    "grad-argnums-empty": (
        lambda F: F.grad(lambda x: x.sum(), argnums=())(X),
        "argnums must be non-empty"),
    "grad-argnums-repeated": (
        lambda F: F.grad(lambda x: x.sum(), argnums=(0, -1))(X),
        "argnums elements must be unique, got (0, 0)"),
    "grad-argnums-a-float": (
        lambda F: F.grad(lambda x: x.sum(), argnums=0.0)(X),
        "argnums must be int or Tuple[int, ...], got: <class 'float'>"),
    "grad-argnum-a-float": (
        lambda F: F.grad(lambda x: x.sum(), argnums=(0.0,))(X),
        "argnum must be int, got: <class 'float'>"),
    "jacfwd-argnums-repeated": (
        lambda F: F.jacfwd(torch.sin, argnums=(0, 0))(X),
        "argnums elements must be unique, got (0, 0)"),
    "jacrev-argnum-past-the-arguments": (
        lambda F: F.jacrev(torch.sin, argnums=2)(X),
        "Got argnum=2, but only 1 positional inputs"),
    # what the function returns
    "grad-has-aux-not-a-pair": (
        lambda F: F.grad(lambda x: x.sum(), has_aux=True)(X),
        "grad_and_value(f)(*args): output of function f should be a tuple: (output, aux) if has_aux is True"),
    "vjp-has-aux-not-a-pair": (
        lambda F: F.vjp(torch.sin, X, has_aux=True),
        "vjp(f, *primals): output of function f should be a tuple: (output, aux) if has_aux is True"),
    "jvp-has-aux-not-a-pair": (
        lambda F: F.jvp(torch.sin, (X,), (X,), has_aux=True),
        "jvp(f, primals, tangents): output of function f should be a tuple: (output, aux) if has_aux is True"),
    "jacrev-has-aux-not-a-pair": (
        lambda F: F.jacrev(torch.sin, has_aux=True)(X),
        "vjp(f, *primals): output of function f should be a tuple: (output, aux) if has_aux is True"),
    "jacfwd-has-aux-not-a-pair": (
        lambda F: F.jacfwd(torch.sin, has_aux=True)(X),
        "jvp(f, primals, tangents): output of function f should be a tuple: (output, aux) if has_aux is True"),
    "grad-of-a-vector": (
        lambda F: F.grad(torch.sin)(X),
        "grad_and_value(f)(*args): Expected f(*args) to return a scalar Tensor, got tensor with 1 dims. Maybe you "
        "wanted to use the vjp or jacrev APIs instead?"),
    "grad-of-a-one-element-vector": (  # (JAX refuses it too: "Gradient only defined for scalar-output functions")
        lambda F: F.grad(lambda x: x.sum(0, keepdim=True))(X),
        "grad_and_value(f)(*args): Expected f(*args) to return a scalar Tensor, got tensor with 1 dims."),
    "grad-of-a-float": (
        lambda F: F.grad(lambda x: 2.0)(X),
        "grad_and_value(f)(*args): Expected f(*args) to return a Tensor, got <class 'float'>"),
    "jacrev-of-a-float": (
        lambda F: F.jacrev(lambda x: 2.0)(X),
        "vjp(f, *primals): expected f(*primals) to return only tensors, got unsupported type <class 'float'>"),
    "jacfwd-of-a-float": (
        lambda F: F.jacfwd(lambda x: 2.0)(X),
        "jvp(f, primals, tangents): expected f(*primals) to return only tensors, got unsupported type "
        "<class 'float'>"),
    "jacrev-boolean-output": (
        lambda F: F.jacrev(lambda x: x > 0)(X),
        "vjp(f, ...): All outputs of f must be floating-point or complex Tensors, got Tensor with dtype torch.bool"),
    "jacrev-returns-none": (
        lambda F: F.jacrev(lambda x: None)(X),
        "vjp(f, *primals): Expected f to be a function that has non-empty output (got output = [None])"),
    # what it is differentiated at
    "jacrev-of-an-integer-tensor": (
        lambda F: F.jacrev(lambda x: x.float())(INT),
        "only Tensors of floating point dtype can require gradients"),
    "vjp-of-a-string": (
        lambda F: F.vjp(lambda s: torch.ones(1), "a"),
        "Thing passed to transform API must be Tensor, got <class 'str'>"),
    "grad-of-a-python-int": (  # (JAX's TypeError too: the error is both)
        lambda F: F.grad(lambda x, n: x.sum() * n, argnums=1)(X, 2),
        "Thing passed to transform API must be Tensor, got <class 'int'>"),
    "vmap-chunk-size-a-float": (  # (torch's TypeError is Python's, from slicing; the error is a ValueError too)
        lambda F: F.vmap(torch.sin, chunk_size=1.5)(X),
        ""),
    "jacrev-chunk-size-a-float": (
        lambda F: F.jacrev(torch.sin, chunk_size=1.5)(X),
        ""),
    "grad-of-an-integer-tensor": (
        lambda F: F.grad(lambda x: x.sum())(torch.arange(3)),
        "only Tensors of floating point dtype can require gradients"),
    "jacrev-complex-input": (
        lambda F: F.jacrev(torch.sin)(COMPLEX),
        "jacrev: Expected all inputs to be real but received complex tensor at flattened input idx: 0"),
    "jacfwd-complex-input": (
        lambda F: F.jacfwd(torch.sin)(COMPLEX),
        "jacfwd: Expected all inputs to be real but received complex tensor at flattened input idx: 0"),
    "jacfwd-complex-output": (  # (thunderfn's forward mode gave a Jacobian of zeros here)
        lambda F: F.jacfwd(lambda x: x * 1j)(X),
        "jacfwd: Expected all outputs to be real but received complex tensor at flattened input idx: 0"),
    "jacrev-chunk-size-0": (
        lambda F: F.jacrev(torch.sin, chunk_size=0)(X),
        "jacrev: `chunk_size` should be greater than 0."),
    "vjp-cotangent-structure": (
        lambda F: F.vjp(lambda x: (x, x), X)[1](X),
        "Expected pytree structure of cotangents to be the same as pytree structure of outputs to the function."),
    "vjp-cotangent-shape": (
        lambda F: F.vjp(torch.sin, X)[1](X2),
        "Mismatch in shape: grad_output[0] has a shape of torch.Size([2]) and output[0] has a shape of "
        "torch.Size([3])."),
    "jvp-primals-not-a-tuple": (
        lambda F: F.jvp(torch.sin, X, (X,)),
        "jvp(f, primals, tangents): Expected primals to be a tuple. E.g. it should be valid to call f(*primals)."),
    "jvp-tangents-of-another-structure": (
        lambda F: F.jvp(torch.add, (X, X), (X,)),
        "jvp(f, primals, tangents): Expected primals and tangents to have the same python structure. For example, "
        "if primals is a tuple of 3 tensors, tangents also must be."),
    "jvp-tangents-not-a-tuple": (
        lambda F: F.jvp(torch.sin, (X,), X),
        "Expected primals and tangents to have the same python structure."),
    "jvp-no-primals": (
        lambda F: F.jvp(lambda: torch.ones(1), (), ()),
        "jvp(f, primals, tangents): Expected primals to contain at least one Tensor."),
    "jvp-a-string-primal": (
        lambda F: F.jvp(lambda s: torch.ones(1), ("a",), ("a",)),
        "jvp(f, primals, tangents): Expected primals to only contain Tensors, got <class 'str'>"),
    "jvp-a-float-tangent-of-a-tensor": (
        lambda F: F.jvp(torch.sin, (X,), (1.0,)),
        "jvp(f, primals, tangents): Expected tangents to only contain Tensors, got <class 'float'>"),
    "jvp-integer-primal": (
        lambda F: F.jvp(lambda x: x.float(), (INT,), (INT,)),
        "Expected primal to be floating point or complex, but got: torch.int64"),
    "jacfwd-integer-primal": (
        lambda F: F.jacfwd(lambda x: x.float())(INT),
        "Expected primal to be floating point or complex, but got: torch.int64"),
    "hessian-integer-primal": (
        lambda F: F.hessian(lambda x: x.float().sum())(INT),
        "Expected primal to be floating point or complex, but got: torch.int64"),
    "jacfwd-returns-none": (
        lambda F: F.jacfwd(lambda x: None)(X),
        "jvp(f, primals, tangents): Expected f to be a function that has non-empty output (got output = [None])"),
    "jvp-tangent-shape": (
        lambda F: F.jvp(torch.sin, (X,), (X2,)),
        "Trying to set a forward gradient that has a different size than that of the original Tensor, this is not "
        "supported. Tensor is of size [3] while the given forward gradient is of size [2]."),
}


def _raised(call, transforms) -> Exception:
    with pytest.raises(Exception) as raised:
        call(transforms)
    return raised.value


@pytest.mark.parametrize("call, sentence", CASES.values(), ids=CASES.keys())
def test_thunderfn_refuses_in_torch_funcs_words_with_its_builtin(call, sentence):
    theirs, ours = _raised(call, torch.func), _raised(call, tf)
    builtin = type(theirs)
    assert builtin.__module__ == "builtins", repr(theirs)
    assert sentence in str(theirs), f"torch.func's message changed: {theirs}"
    assert isinstance(ours, tf.ThunderFnError) and isinstance(ours, builtin), repr(ours)
    assert sentence in str(ours), f"\ntorch.func: {theirs}\nthunderfn:  {ours}"


def test_the_options_torch_func_has():
    x = torch.randn(3, dtype=torch.float64)
    # jvp(strict=True): an output independent of the inputs is refused in torch.func's words
    for jvp in (torch.func.jvp, tf.jvp):
        with pytest.raises(RuntimeError, match="The output of f is independent of the inputs"):
            jvp(lambda x: torch.ones(3, dtype=torch.float64), (x,), (torch.ones_like(x),), strict=True)
    torch.testing.assert_close(tf.jvp(torch.sin, (x,), (torch.ones_like(x),), strict=True)[1], x.cos())
    # jacfwd(randomness=): vmap's, over the input elements
    torch.manual_seed(0)
    same = tf.jacfwd(lambda x: x * torch.rand(()), randomness="same")(x)
    torch.testing.assert_close(same, same[0, 0] * torch.eye(3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="called random operation while in randomness error mode"):
        tf.jacfwd(lambda x: x * torch.rand(()))(x)
    # jacrev(_preallocate_and_copy=) is accepted, with the same result
    torch.testing.assert_close(tf.jacrev(torch.sin, _preallocate_and_copy=True)(x), torch.diag(x.cos()))


def test_functional_call_takes_tie_weights_and_strict():
    model = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    weight = {"weight": torch.zeros(2, 3)}
    calls = (torch.func.functional_call, tf.functional_call,
             lambda *a, **k: tf.grad(lambda w: tf.functional_call(model, {"weight": w}, (x,), strict=True).sum())(
                 weight["weight"]))  # (traced)
    torchs = r"Error\(s\) in reparametrizing for Linear:\n\tMissing key\(s\): 'bias'\."
    for call in calls:
        with pytest.raises(RuntimeError, match=torchs):
            call(model, weight, (x,), strict=True)
    torch.testing.assert_close(tf.functional_call(model, weight, (x,), tie_weights=False),
                               torch.func.functional_call(model, weight, (x,), tie_weights=False))
    grad = tf.grad(lambda w: tf.functional_call(model, {"weight": w}, (x,), strict=False).sum())(torch.ones(2, 3))
    torch.testing.assert_close(grad, x.sum(0).expand(2, 3))


def test_where_jax_takes_what_torch_func_refuses_thunderfn_takes_it():
    # (each is refused by torch.func and taken by JAX: a JAX program keeps working; see
    # docs/porting-from-torch-func.md)
    x = torch.randn(3, dtype=torch.float64)
    out, tangent = tf.jvp(torch.sin, [x], [torch.ones_like(x)])  # jax.jvp takes lists
    torch.testing.assert_close(tangent, x.cos())
    torch.testing.assert_close(tf.jacrev(lambda s: torch.stack([s, s ** 2]))(3.0), torch.tensor([1.0, 6.0]))
    g, aux = tf.grad(lambda x: (x.sum(), "label"), has_aux=True)(x)  # any aux, as JAX's
    assert aux == "label"
    out, vjp_fn = tf.vjp(lambda x: (x.argmax(), x.exp()), x)  # an integer output gets no cotangent
    torch.testing.assert_close(vjp_fn((None, torch.ones_like(x)))[0], x.exp())
    # torch.func's vjp_fn options and vmap's names are taken too
    torch.testing.assert_close(vjp_fn((None, torch.ones_like(x)), retain_graph=True, create_graph=False)[0], x.exp())
    torch.testing.assert_close(tf.vmap(torch.mul, in_dims=(0, None), out_dims=1)(torch.ones(2, 3), x),
                               torch.func.vmap(torch.mul, in_dims=(0, None), out_dims=1)(torch.ones(2, 3), x))
    with pytest.raises(TypeError, match="got both in_axes= and in_dims="):
        tf.vmap(torch.sin, in_axes=1, in_dims=0)
