"""Rematerialization (transforms/rematerialize.py): the min cut over saved bytes on hand-made and
random value graphs, and on jitted functions: fewer bytes saved between forward and backward,
gradients equal to eager's, random draws and matmuls never recomputed, writes into inputs respected,
and rematerialize=False leaving the split as it was."""
import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings

import thunderfn as tf
from thunderfn.examples.gpt import GPT, GPTConfig
from thunderfn.testing import strategies as tst
from thunderfn.testing.fusion_checks import needs_inductor
from thunderfn.testing.training import adamw_losses, gpt_batches
from thunderfn.transforms.rematerialize import cheap_to_recompute, min_cut_saved, nbytes, rematerialize

REMAT = "Constructed by Rematerialization"


# -- helpers -------------------------------------------------------------------------------------

def _has_backward(jf) -> bool:
    """False where the last compile made no forward/backward split: no output is computed from an
    input that requires grad (an output that is an input itself reaches torch.autograd as the
    caller's tensor), so nothing is saved and the last trace returns the outputs alone."""
    return any("Forward and backward split" in t.provenance for t in tf.last_traces(jf))


def _forward(jf):
    """The forward trace whose output is ((outputs...), (residuals...)) as compiled."""
    return tf.last_traces(jf)[-1]


def _saved_bytes(jf) -> int:
    """Bytes of the residuals that are neither inputs nor outputs: what the split keeps alive."""
    if not _has_backward(jf):
        return 0
    fwd = _forward(jf)
    outputs, residuals = fwd.output
    alive = {p.name for p in fwd.args} | {p.name for p in outputs}
    return sum(nbytes(p) for p in residuals if p.name not in alive)


def _residual_cost(jf) -> int:
    """What rematerialization minimizes: bytes of the residuals, inputs included, outputs free."""
    if not _has_backward(jf):
        return 0
    outputs, residuals = _forward(jf).output
    return sum(nbytes(p) for p in residuals if p.name not in {o.name for o in outputs})


def _split_traces(jf):
    """(forward, backward) straight out of the split, and (forward, backward) after
    rematerialization (None when it did not change them)."""
    forward = [t for t in tf.last_traces(jf) if "Forward and backward split" in t.provenance or REMAT in t.provenance]
    backward = [t for t in tf.last_backward_traces(jf) if "Forward and backward split" in t.provenance
                or REMAT in t.provenance]
    split = (forward[0], backward[0])
    remat = (forward[1], backward[1]) if len(forward) > 1 else None
    return split, remat


def _recomputed_bsyms(jf) -> list:
    """The bound symbols of the rematerialized backward that compute forward values again."""
    (fwd, _), remat = _split_traces(jf)
    assert remat is not None, "rematerialization did not change the split"
    forward_values = {o.name for b in fwd.bound_symbols for s in _walk(b) for o in s.proxy_outs()}  # intermediates too
    return [b for b in remat[1].bound_symbols if any(o.name in forward_values for o in b.proxy_outs())]


def _walk(bsym):
    yield bsym
    for s in bsym.subsymbols:
        yield from _walk(s)


def _grads(fn, inputs, seed=None):
    inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    if seed is not None:
        torch.manual_seed(seed)
    out = fn(*inputs)
    out.sum().backward()
    return out.detach(), [t.grad for t in inputs if t.requires_grad]


def gelu_sigmoid(x, w, b):
    h = x @ w
    return F.gelu(h + b) * torch.sigmoid(h)


def _gelu_sigmoid_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 16, generator=g, requires_grad=True), torch.randn(16, 32, generator=g, requires_grad=True),
            torch.randn(32, generator=g, requires_grad=True)]


# -- the min cut on hand-made graphs ---------------------------------------------------------------

def _cut(values, cost, arguments, fixed=(), needed=(), unsaveable=()):
    return min_cut_saved(values, cost, arguments, set(fixed), set(needed), set(unsaveable))


def test_min_cut_saves_the_small_middle_of_a_chain():
    """x -> a (big) -> b (small) -> c (big), the backward reads c: saving b and recomputing c beats
    saving c, or x and recomputing everything."""
    cut = _cut("xabc", {"x": 100, "a": 100, "b": 10, "c": 100}, {"a": "x", "b": "a", "c": "b"}, needed="c")
    assert cut.saved == ["b"] and cut.recomputed == {"c"} and cut.saved_bytes == 10


def test_min_cut_saves_a_needed_value_that_cannot_be_recomputed():
    """As above, but the backward also reads a, which may not be recomputed: a is saved, and c is
    recomputed from it (saving b as well would cost more)."""
    cut = _cut("xabc", {"x": 100, "a": 100, "b": 10, "c": 100}, {"a": "x", "b": "a", "c": "b"},
               fixed="a", needed="ac")
    assert cut.saved == ["a"] and cut.recomputed == {"b", "c"} and cut.saved_bytes == 100


def test_min_cut_goes_back_to_the_input_when_it_is_cheapest():
    """x (50) -> a (30), x -> b (30), c = f(a, b) (80); the backward reads a and c: saving x (50)
    beats a + b (60) and a + c (110)."""
    cut = _cut("xabc", {"x": 50, "a": 30, "b": 30, "c": 80}, {"a": "x", "b": "x", "c": "ab"}, needed="ac")
    assert cut.saved == ["x"] and cut.recomputed == {"a", "b", "c"} and cut.saved_bytes == 50


def test_min_cut_saves_free_outputs_instead_of_recomputing():
    """A forward output costs nothing to save (it is alive anyway): saved as itself."""
    cut = _cut("xab", {"x": 1, "a": 8, "b": 0}, {"a": "x", "b": "a"}, needed="b")
    assert cut.saved == ["b"] and cut.recomputed == set() and cut.saved_bytes == 0


def test_min_cut_on_a_tie_recomputes_least():
    """x -> a of equal size, the backward reads a: saving x or a costs the same; the cut nearest the
    sink saves a and recomputes nothing."""
    cut = _cut("xa", {"x": 16, "a": 16}, {"a": "x"}, needed="a")
    assert cut.saved == ["a"] and cut.recomputed == set()


def test_min_cut_on_a_long_chain_finds_its_cheapest_link():
    """3000 values in a chain (a path longer than Python's recursion limit), one of them cheap."""
    values = [f"v{i}" for i in range(3000)]
    cost = {v: 1 if v == "v1700" else 10 for v in values}
    cut = _cut(values, cost, {v: [u] for u, v in zip(values, values[1:])}, needed=["v2999"])
    assert cut.saved == ["v1700"] and cut.recomputed == set(values[1701:])


def test_min_cut_never_saves_an_intermediate_of_an_op_run_whole():
    """x (100) -> i (1) -> o (100), the backward reads o: i would be cheapest to save, but it is an
    intermediate of an op that runs as one call (it never exists), so o is saved."""
    cut = _cut("xio", {"x": 100, "i": 1, "o": 100}, {"i": "x", "o": "i"}, needed="o")
    assert cut.saved == ["i"]
    cut = _cut("xio", {"x": 100, "i": 1, "o": 100}, {"i": "x", "o": "i"}, needed="o", unsaveable="i")
    assert cut.saved == ["o"] and cut.recomputed == set()


def _brute_force_min(graph) -> int:
    """The least cost of a valid saved set, by trying every subset of saveable values."""
    best = None
    saveable = [v for v in graph.values if v not in graph.unsaveable]
    for k in range(len(saveable) + 1):
        for saved in itertools.combinations(saveable, k):
            cost = sum(graph.cost[v] for v in saved)
            if (best is None or cost < best) and _valid(graph, set(saved)):
                best = cost
    return best


def _valid(graph, saved) -> bool:
    """Whether everything needed is saved or recomputable from saved values through values
    that may be recomputed."""
    def available(v, seen=()):
        if v in saved:
            return True
        if v in graph.fixed or v not in graph.arguments or v in seen:
            return False
        return all(available(a, seen + (v,)) for a in graph.arguments[v])
    return all(available(v) for v in graph.needed)


@settings(max_examples=150)
@given(tst.value_graphs())
def test_min_cut_is_a_valid_cut_of_least_cost_on_random_graphs(graph):
    """On random value graphs the cut is valid (every needed value saved or recomputable from
    what is saved, nothing unsaveable saved, recomputed values never fixed or inputs) and as cheap
    as the best of all subsets, found by brute force."""
    cut = min_cut_saved(graph.values, graph.cost, graph.arguments, set(graph.fixed), set(graph.needed),
                        set(graph.unsaveable))
    assert _valid(graph, set(cut.saved)) and not set(cut.saved) & graph.unsaveable
    assert not cut.recomputed & (set(graph.fixed) | (set(graph.values) - graph.arguments.keys()))
    assert not cut.recomputed & set(cut.saved)
    assert cut.saved_bytes == sum(graph.cost[v] for v in cut.saved) == _brute_force_min(graph)


# -- the default predicate -------------------------------------------------------------------------

def test_cheap_to_recompute_takes_elementwise_and_views_and_refuses_matmul_and_shrinking_reductions():
    x = torch.randn(8, 16)
    jf = tf.jit(lambda x: (F.gelu(x).t() @ x, x.sum(-1), x.sum(0, keepdim=True) + 1, x.float().reshape(16, 8)))
    jf(x)
    by_name = {b.sym.name: b for b in tf.last_traces(jf)[2].bound_symbols}
    assert cheap_to_recompute(by_name["gelu"]) and cheap_to_recompute(by_name["reshape"])
    assert not cheap_to_recompute(by_name["matmul"])
    assert not cheap_to_recompute(by_name["sum"])  # 16x and 8x smaller than its input


# -- on jitted functions ---------------------------------------------------------------------------

def test_remat_saves_fewer_bytes_and_gradients_equal_eager():
    inputs = _gelu_sigmoid_inputs()
    plain, remat = tf.jit(gelu_sigmoid, rematerialize=False), tf.jit(gelu_sigmoid, rematerialize=True)
    expected_out, expected = _grads(gelu_sigmoid, inputs)
    for jf in (plain, remat):
        out, grads = _grads(jf, inputs)
        torch.testing.assert_close(out, expected_out)
        for g, e in zip(grads, expected):
            torch.testing.assert_close(g, e)
    # without: h + b, gelu and sigmoid (3 x 8x32 floats); with: x @ w only
    assert _saved_bytes(plain) == 3 * 8 * 32 * 4
    assert _saved_bytes(remat) == 8 * 32 * 4 < _saved_bytes(plain)
    assert {b.sym.name for b in _recomputed_bsyms(remat)} >= {"gelu", "sigmoid"}


def test_layer_norm_output_is_recomputed_from_its_saved_statistics():
    """layer_norm runs whole in the forward (its statistics are reductions, not recomputed), but
    its normalized output is recomputed in the backward from its input and statistics, which its
    backward saves anyway, through the elementwise ops of its decomposition."""
    def fn(x, w, b, weight):
        return F.layer_norm(x, (32,), w, b) @ weight
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(4, 16, 32, generator=g, requires_grad=True), torch.randn(32, generator=g, requires_grad=True),
              torch.randn(32, generator=g, requires_grad=True), torch.randn(32, 8, generator=g, requires_grad=True)]
    plain, remat = tf.jit(fn, rematerialize=False), tf.jit(fn, rematerialize=True)
    _, expected = _grads(fn, inputs)
    for jf in (plain, remat):
        _, grads = _grads(jf, inputs)
        for got, e in zip(grads, expected):
            torch.testing.assert_close(got, e)
    assert _saved_bytes(plain) == 4 * 16 * 32 * 4 + 2 * 4 * 16 * 4  # the output, mean and rstd
    assert _saved_bytes(remat) == 2 * 4 * 16 * 4  # mean and rstd
    recomputed = _recomputed_bsyms(remat)
    assert {b.sym.name for b in recomputed} >= {"sub", "mul", "add"}
    assert not any("reduction" in s.sym.tags for b in recomputed for s in _walk(b))


def test_matmul_outputs_are_saved_not_recomputed():
    """exp(h) * tanh(h) with h = x @ w 16x bigger than x and w: recomputing the matmul would save
    the most bytes, but matmuls are not recomputed by default (h is saved and exp, tanh recomputed
    from it); a predicate that allows them saves x and w."""
    def fn(x, w):
        h = x @ w
        return torch.exp(h) * torch.tanh(h)
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(64, 4, generator=g, requires_grad=True), torch.randn(4, 64, generator=g, requires_grad=True)]
    jf = tf.jit(fn, rematerialize=True)
    _, grads = _grads(jf, inputs)
    _, expected = _grads(fn, inputs)
    for got, e in zip(grads, expected):
        torch.testing.assert_close(got, e)
    assert {b.sym.name for b in _recomputed_bsyms(jf)} == {"exp", "tanh"}
    assert all(b.sym.name != "matmul" for r in _recomputed_bsyms(jf) for b in _walk(r))
    assert _saved_bytes(jf) == 64 * 64 * 4  # h

    split_fwd, split_bwd = _split_traces(jf)[0]
    new_fwd, new_bwd = rematerialize(split_fwd, split_bwd, lambda bsym: True)
    assert any(b.sym.name == "matmul" for b in new_bwd.bound_symbols)
    assert {p.name for p in new_fwd.output[1]} == {"x", "w"}


def test_random_draws_are_saved_and_gradients_equal_eager_under_the_same_seed():
    def fn(x, w):
        h = x @ w
        return F.dropout(torch.tanh(h), p=0.5, training=True) * torch.sigmoid(h)
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(8, 16, generator=g, requires_grad=True), torch.randn(16, 32, generator=g, requires_grad=True)]
    jf = tf.jit(fn, rematerialize=True)
    out, grads = _grads(jf, inputs, seed=3)
    expected_out, expected = _grads(fn, inputs, seed=3)
    torch.testing.assert_close(out, expected_out)
    for got, e in zip(grads, expected):
        torch.testing.assert_close(got, e)
    recomputed = _recomputed_bsyms(jf)
    assert {b.sym.name for b in recomputed} >= {"tanh", "sigmoid"}  # recomputed from h ...
    assert not any("random" in b.sym.tags or "opaque" in b.sym.tags for r in recomputed for b in _walk(r))
    _, (remat_fwd, _) = _split_traces(jf)
    noise = [b.output for b in remat_fwd.bound_symbols if "random" in b.sym.tags]
    assert len(noise) == 1 and noise[0].name in {p.name for p in remat_fwd.output[1]}  # ... from the saved draw


def test_random_draws_are_saved_even_where_the_predicate_allows_everything():
    def fn(x, w):
        h = x @ w
        return F.dropout(torch.tanh(h), p=0.5, training=True) * torch.sigmoid(h)
    jf = tf.jit(fn, rematerialize=True)
    _grads(jf, [torch.randn(8, 16, requires_grad=True), torch.randn(16, 32, requires_grad=True)])
    (split_fwd, split_bwd), _ = _split_traces(jf)
    new_fwd, new_bwd = rematerialize(split_fwd, split_bwd, lambda bsym: True)
    noise = [b.output.name for b in new_fwd.bound_symbols if "random" in b.sym.tags]
    assert len(noise) == 1 and noise[0] in {p.name for p in new_fwd.output[1]}
    assert not any("random" in s.sym.tags for b in new_bwd.bound_symbols for s in _walk(b))
    assert any(b.sym.name == "matmul" for b in new_bwd.bound_symbols)  # the predicate did allow the rest


def test_values_read_before_a_write_into_an_input_are_not_recomputed_from_it():
    """buf is written in place after a value computed from it: recomputing that value from buf in
    the backward would read the new buf. Saving buf (half precision) would be cheapest, but the
    value is saved instead, and gradients and buf equal eager's."""
    def fn(x, buf):
        scale = buf.float() * 2
        buf.add_(1)
        return torch.sin(x) * scale
    x = torch.randn(8, 16, requires_grad=True)
    buf = torch.randn(16).half()
    jit_buf, eager_buf = buf.clone(), buf.clone()
    jf = tf.jit(fn, rematerialize=True)
    jx, ex = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    jf(jx, jit_buf).sum().backward()
    fn(ex, eager_buf).sum().backward()
    torch.testing.assert_close(jx.grad, ex.grad)
    torch.testing.assert_close(jit_buf, eager_buf)
    assert "buf" not in {p.name for p in _forward(jf).output[1]}


def test_rematerialize_false_leaves_the_split_unchanged():
    inputs = _gelu_sigmoid_inputs()
    off, default, on = (tf.jit(gelu_sigmoid, rematerialize=r) for r in (False, None, True))
    for jf in (off, default, on):
        _grads(jf, inputs)

    def body(trc):  # the trace without its provenance line (which holds a timing)
        return str(trc).split("\n", 1)[1]

    assert not any(REMAT in t.provenance for t in tf.last_traces(off) + tf.last_backward_traces(off))
    assert list(map(body, tf.last_traces(off))) == list(map(body, tf.last_traces(default)))  # no fusion executor: off
    assert list(map(body, tf.last_backward_traces(off))) == list(map(body, tf.last_backward_traces(default)))
    assert body(tf.last_traces(on)[-1]) != body(tf.last_traces(off)[-1])


def test_rematerialize_option_is_checked():
    with pytest.raises(ValueError, match="rematerialize must be None"):
        tf.jit(gelu_sigmoid, rematerialize="yes")
    with pytest.raises(ValueError, match="rematerialize must be None"):
        tf.jit(torch.nn.Linear(2, 2), rematerialize=1.0)


@given(tst.programs(), tst.program_inputs())
@settings(max_examples=30)
def test_remat_of_random_programs_gives_eager_gradients_and_saves_no_more(program, inputs):
    inputs = [t.requires_grad_() for t in inputs]
    try:
        expected_out, expected = _grads(program, inputs)
    except RuntimeError:  # a program invalid for these shapes, or whose output does not require grad
        assume(False)
    plain, remat = tf.jit(program, rematerialize=False), tf.jit(program, rematerialize=True)
    for jf in (plain, remat):
        out, grads = _grads(jf, inputs)
        torch.testing.assert_close(out, expected_out, equal_nan=True)
        for g, e in zip(grads, expected):
            if e is None:  # an input the output does not depend on
                assert g is None or not g.any()
            else:
                torch.testing.assert_close(g, e, equal_nan=True)
    assert _residual_cost(remat) <= _residual_cost(plain)


def test_remat_of_a_program_returning_its_input_gives_its_gradient_and_saves_nothing():
    # the program hypothesis found: v2 = transpose(v0) is v0 itself for a 1-d v0
    program = tst.Program(steps=(("reshape", "transpose", (0,)),), n_inputs=2)
    inputs = [torch.tensor([1.5]).requires_grad_(), torch.tensor([2.5]).requires_grad_()]
    for remat in (False, True):
        jf = tf.jit(program, rematerialize=remat)
        out, grads = _grads(jf, inputs)
        assert not _has_backward(jf) and _residual_cost(jf) == 0
        torch.testing.assert_close(out, inputs[0].detach())
        torch.testing.assert_close(grads[0], torch.ones(1))
        assert grads[1] is None


@given(tst.programs(in_place=True), tst.program_inputs())
@settings(max_examples=60)
def test_remat_of_in_place_programs_gives_eager_gradients_and_mutates_inputs_alike(program, inputs):
    """The first input requires grad, the second does not and may be written in place: values
    computed from it before a write are never recomputed from it after the write. The second is
    in a narrower dtype, so that saving it would often be cheaper than saving what is computed
    from it (the case where recomputing after the write could happen)."""
    x, buf = inputs
    buf = buf.to(torch.float16 if x.dtype == torch.float32 else torch.float32)
    eager_x, eager_buf = x.clone().requires_grad_(), buf.clone()
    try:
        out = program(eager_x, eager_buf)
        out.sum().backward()
    except RuntimeError:  # invalid for these shapes, no gradient, or eager's own in-place error
        assume(False)
    jit_x, jit_buf = x.clone().requires_grad_(), buf.clone()
    try:
        got = tf.jit(program, rematerialize=True)(jit_x, jit_buf)
    except tf.UnsupportedOpError:
        return  # refused (a view made another way, or a stale view): allowed, never a different answer
    got.sum().backward()
    torch.testing.assert_close(got, out, equal_nan=True)
    torch.testing.assert_close(jit_buf, eager_buf, equal_nan=True)
    if eager_x.grad is None:
        assert jit_x.grad is None or not jit_x.grad.any()
    else:
        torch.testing.assert_close(jit_x.grad, eager_x.grad, equal_nan=True)


# -- training ----------------------------------------------------------------------------------------

CONFIG = GPTConfig(vocab_size=32, block_size=16, n_embd=32, n_head=4, n_layer=2, batch_size=4)


def test_gpt_trains_with_remat_to_the_same_losses_and_saves_fewer_bytes():
    torch.manual_seed(0)
    model = GPT(CONFIG).train()
    batches = gpt_batches(CONFIG, 6)
    plain, remat = tf.jit(copy.deepcopy(model), rematerialize=False), tf.jit(copy.deepcopy(model), rematerialize=True)
    expected = adamw_losses(plain, batches)
    losses = adamw_losses(remat, batches)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), atol=1e-5, rtol=1e-5)
    for p, q in zip(plain.parameters(), remat.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)
    assert _saved_bytes(remat) < _saved_bytes(plain)


@needs_inductor
def test_remat_is_on_by_default_with_inductor_and_fuses_the_recomputation():
    inputs = _gelu_sigmoid_inputs()
    jf = tf.jit(gelu_sigmoid, executors=["inductor"])
    out, grads = _grads(jf, inputs)
    expected_out, expected = _grads(gelu_sigmoid, inputs)
    torch.testing.assert_close(out, expected_out)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)
    assert _saved_bytes(jf) == 8 * 32 * 4
    recomputed = {o.name for b in _recomputed_bsyms(jf) for o in b.proxy_outs()}
    fused = [b for b in tf.last_backward_traces(jf)[-1].bound_symbols if b.sym.name.startswith("inductor_fusion")]
    assert any(recomputed & {o.name for s in region.subsymbols for o in s.proxy_outs()} for region in fused)


def test_an_op_with_one_output_saved_and_one_recomputed_defines_each_name_once():
    """x.chunk(2): the first half is returned (free to save), the second recomputed from x (saved for
    the matmul anyway): the recomputed chunk's copy of the first half gets a name of its own."""
    def fn(x, w, z):
        p, q = x.chunk(2, dim=1)
        return p, (torch.exp(q) * torch.tanh(q) * z * p).sum() + (x @ w).sum()
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(8, 16, generator=g, requires_grad=True), torch.randn(16, 8, generator=g, requires_grad=True),
              torch.randn(8, 8, generator=g, requires_grad=True)]

    def loss(f):
        return lambda *a: (lambda p, s: p.sum() * 3 + s)(*f(*a))
    jf = tf.jit(fn, rematerialize=True)
    _, grads = _grads(loss(jf), inputs)
    _, expected = _grads(loss(fn), inputs)
    for got, e in zip(grads, expected):
        torch.testing.assert_close(got, e)
    assert "chunk" in {b.sym.name for b in _recomputed_bsyms(jf)}
    _, (_, backward) = _split_traces(jf)
    defined = [p.name for p in backward.args] + [o.name for b in backward.bound_symbols for o in b.proxy_outs()]
    assert len(defined) == len(set(defined))
