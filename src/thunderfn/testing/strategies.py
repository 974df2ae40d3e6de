"""Hypothesis strategies shared by every property test (the one place they live).

Tensors are drawn as (shape, dtype, seed) and built with a local torch.Generator,
so examples shrink well and never touch the global RNG. Programs are drawn as a
list of small steps over a working set of tensors and replayed by `run_program`,
so the same drawn program runs eagerly, under jit and under any transform.
"""
from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

FLOAT_DTYPES = (torch.float32, torch.float64)
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)
ALL_DTYPES = FLOAT_DTYPES + (torch.float16, torch.bfloat16) + INT_DTYPES + (torch.bool,)


def shapes(min_dims: int = 0, max_dims: int = 3, min_side: int = 1, max_side: int = 4):
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


def broadcastable_to(shape):
    """Shapes that broadcast to `shape`: a suffix of it with some sides set to 1."""
    def shrink(data):
        n, ones = data
        suffix = shape[len(shape) - n:] if n else ()
        return tuple(1 if i in ones else s for i, s in enumerate(suffix))

    return st.tuples(st.integers(0, len(shape)), st.sets(st.integers(0, max(len(shape) - 1, 0)))).map(shrink)


def make(shape, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    low = 0 if dtype is torch.uint8 else -8
    return torch.randint(low, 9, shape, generator=g, dtype=torch.int64).to(dtype)


@st.composite
def tensors(draw, shape=None, dtypes=FLOAT_DTYPES):
    shape = draw(shapes()) if shape is None else shape
    return make(shape, draw(st.sampled_from(dtypes)), draw(st.integers(0, 2**16)))


def python_scalars():
    return st.one_of(st.booleans(), st.integers(-5, 5), st.floats(-4, 4, allow_nan=False, width=32))


# -- random programs ---------------------------------------------------------------------
UNARY = {
    "sin": torch.sin, "exp": lambda x: torch.exp(x.clamp(max=4)), "tanh": torch.tanh, "neg": torch.neg,
    "abs": torch.abs, "sigmoid": torch.sigmoid, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
    "square": torch.square, "log1p_abs": lambda x: torch.log1p(x.abs()),
    "softmax": lambda x: torch.softmax(x, -1) if x.ndim else x,
}
BINARY = {
    "add": torch.add, "mul": torch.mul, "sub": lambda a, b: a - b, "maximum": torch.maximum,
    "where_gt": lambda a, b: torch.where(a > b, a, b), "div_safe": lambda a, b: a / (b.abs() + 1),
}
REDUCE = {
    "sum_last": lambda x: x.sum(-1, keepdim=True) if x.ndim else x, "mean_all": lambda x: x.mean(),
    "amax_first": lambda x: x.amax(0) if x.ndim else x,
}
# In-place steps write into their first operand (possibly an input) and return it.
INPLACE = {
    "add_": lambda a, b: a.add_(b), "mul_scalar_": lambda a: a.mul_(1.5), "clamp_": lambda a: a.clamp_(min=-0.5),
    "setitem_row": lambda a, b: (a.__setitem__(0, b[0] if b.ndim else b), a)[1] if a.ndim else a.add_(b.sum()),
    "view_iadd": lambda a: (a[..., :1].add_(1), a)[1] if a.ndim else a.add_(1),
}
RESHAPE = {
    "transpose": lambda x: x.transpose(0, -1) if x.ndim >= 2 else x, "flatten": lambda x: x.reshape(-1),
    "unsqueeze": lambda x: x.unsqueeze(0), "scale": lambda x: x * 0.5 + 1,
}


@dataclasses.dataclass(frozen=True)
class Program:
    """Steps over a working list that starts as the inputs; each step appends a value."""
    steps: tuple  # (kind, name, operand indices)
    n_inputs: int

    def __call__(self, *inputs):
        values = list(inputs)
        for kind, name, operands in self.steps:
            table = {"unary": UNARY, "binary": BINARY, "reduce": REDUCE, "reshape": RESHAPE, "inplace": INPLACE}[kind]
            values.append(table[name](*(values[i] for i in operands)))
        return values[-1]

    def __repr__(self):
        return "Program(" + "; ".join(f"v{self.n_inputs + i} = {n}({', '.join(f'v{o}' for o in ops)})"
                                      for i, (_, n, ops) in enumerate(self.steps)) + ")"


_INPLACE_ARITY = {"add_": 2, "setitem_row": 2}


@st.composite
def programs(draw, n_inputs: int = 2, max_steps: int = 6, in_place: bool = False):
    """Random float programs of unary, binary (broadcasting), reduction and shape steps,
    and with `in_place`, steps that write into an earlier value (an input, possibly).
    Steps that do not fit the shapes they meet raise in eager too; tests skip those."""
    steps, count = [], n_inputs
    kinds = ["unary", "binary", "reduce", "reshape"] + (["inplace", "inplace"] if in_place else [])
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(kinds))
        if kind == "binary":
            steps.append((kind, draw(st.sampled_from(sorted(BINARY))), (count - 1, draw(st.integers(0, count - 1)))))
        elif kind == "inplace":
            name = draw(st.sampled_from(sorted(INPLACE)))
            operands = tuple(draw(st.integers(0, count - 1)) for _ in range(_INPLACE_ARITY.get(name, 1)))
            steps.append((kind, name, operands))
        else:
            table = {"unary": UNARY, "reduce": REDUCE, "reshape": RESHAPE}[kind]
            steps.append((kind, draw(st.sampled_from(sorted(table))), (draw(st.integers(0, count - 1)),)))
        count += 1
    return Program(tuple(steps), n_inputs)


@st.composite
def program_inputs(draw, n_inputs: int = 2, dtypes=FLOAT_DTYPES):
    """Inputs of one shared shape (binary steps may still mix ranks after reductions)."""
    shape = draw(shapes(min_dims=1, max_dims=3))
    dtype = draw(st.sampled_from(dtypes))
    return tuple(make(shape, dtype, draw(st.integers(0, 2**16))) for _ in range(n_inputs))


# -- bodies of control flow (tf.scan, tf.cond) made of random programs ------------------------------------------
@dataclasses.dataclass(frozen=True)
class ScanBody:
    """A tf.scan body f(carry, x) -> (carry, y) around a random program of the carry and the step's x: y is
    the program's value, the new carry the old one moved by the mean of y, squashed (so that it keeps its
    shape and stays bounded over the steps)."""
    program: Program

    def __call__(self, carry, x):
        y = self.program(carry, x)
        return torch.tanh(carry + y.mean()), y


@dataclasses.dataclass(frozen=True)
class Branch:
    """A tf.cond branch f(x, y) -> a value of x's shape and dtype, around a random program of x and y."""
    program: Program

    def __call__(self, x, y):
        return torch.tanh(x + self.program(x, y).mean())


@st.composite
def scan_bodies(draw, max_steps: int = 4):
    return ScanBody(draw(programs(n_inputs=2, max_steps=max_steps)))


@st.composite
def cond_branches(draw, max_steps: int = 4):
    """A pair of branches (true_fn, false_fn)."""
    return Branch(draw(programs(n_inputs=2, max_steps=max_steps))), Branch(draw(programs(n_inputs=2,
                                                                                           max_steps=max_steps)))


@st.composite
def scan_inputs(draw, batch: int | None = None, dtype=torch.float64):
    """(init, xs): a carry of a random shape and 1 to 4 steps of xs of the same shape; with `batch`, both with
    a leading batch dimension of that size (xs's steps second)."""
    shape = draw(shapes(min_dims=1, max_dims=2, max_side=3))
    steps = draw(st.integers(1, 4))
    front = (batch,) if batch is not None else ()
    return (make(front + shape, dtype, draw(st.integers(0, 2**16))),
            make(front + (steps,) + shape, dtype, draw(st.integers(0, 2**16))))


@dataclasses.dataclass(frozen=True)
class ValueGraph:
    """A small forward computation as rematerialization sees it (transforms/rematerialize.py's
    min_cut_saved): values in topological order, each an input or computed from earlier ones,
    with a cost to save it, whether it may be recomputed, and which the backward reads."""
    values: tuple  # names, in topological order
    cost: dict  # name -> bytes to save it
    arguments: dict  # name -> names it is computed from (absent: an input)
    fixed: frozenset  # names that cannot be recomputed (besides the inputs)
    needed: frozenset  # names the backward reads
    unsaveable: frozenset  # names that cannot be saved (intermediates of an op run whole), never needed


@st.composite
def value_graphs(draw, max_values: int = 8):
    """Random value graphs: a few inputs, then values computed from one to three earlier values,
    random costs (0 for some: a forward output is free to save), some not recomputable, some not
    saveable, and a random non-empty set of values the backward needs."""
    n_inputs = draw(st.integers(1, 3))
    n = draw(st.integers(n_inputs + 1, max(n_inputs + 1, max_values)))
    values = tuple(f"v{i}" for i in range(n))
    cost = {v: draw(st.sampled_from([0, 1, 2, 4, 8, 16, 100])) for v in values}
    arguments = {}
    for i in range(n_inputs, n):
        arguments[values[i]] = tuple(sorted(set(draw(st.lists(st.sampled_from(values[:i]), min_size=1, max_size=3)))))
    fixed = frozenset(v for v in values[n_inputs:] if draw(st.booleans()) and draw(st.booleans()))
    needed = frozenset(draw(st.lists(st.sampled_from(values), min_size=1, max_size=4)))
    unsaveable = frozenset(v for v in values[n_inputs:] if v not in needed and draw(st.booleans()))
    return ValueGraph(values, cost, arguments, fixed, needed, unsaveable)


# -- programs that read sizes as Python values (dynamic shapes' law: tests/test_size_reads.py) -----------------
# Each takes x of shape (B, T, D) (and `other` of shape (T2, D)) and reads a size in one of the ways user code
# does; a jitted program must equal it in shape and value at every length, whatever the lengths before.
_POSITIONS = torch.linspace(-1.0, 1.0, 64 * 4, dtype=torch.float64).reshape(64, 4)  # learned positions, D = 4


def _int_of_a_size(x, other):
    T = int(x.shape[1])
    return x + _POSITIONS[:T]


def _size_method(x, other):
    return x.sum(1) / max(x.size(1), 1) + x.size(0)


def _len(x, other):
    return x * len(x) + len(other)


def _range_over_a_size(x, other):
    out = x[:, :0].sum(1)
    for i in range(x.shape[1]):
        out = out + x[:, i] * (i + 1)
    return out


def _slice_bounds(x, other):
    T = x.shape[1]
    return torch.cat([x[:, T // 2:], x[:, : T - T // 2]], 1) + x[:, -1:].sum(1, keepdim=True)


def _positions_sliced(x, other):
    return x + _POSITIONS[: x.shape[1]]


def _arange(x, other):
    T = x.shape[1]
    return x * torch.arange(T, dtype=x.dtype).view(1, T, 1) + torch.arange(1, T + 1, dtype=x.dtype)[None, :, None]


def _causal_mask(x, other):
    T = x.shape[1]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    scores = (x @ x.transpose(1, 2)).masked_fill(mask, float("-inf"))
    return torch.nan_to_num(scores.softmax(-1)) @ x


def _view_computed(x, other):
    B, T, D = x.shape
    return x.reshape(B * T, D).sin().view(B, T, D) + x.reshape(B, -1)[:, : T * D].view(B, T, D)


def _size_arithmetic(x, other):
    B, T, D = x.shape
    return x.reshape(B, T * D // 2, 2).sum(-1) * (T * 2 + 1) / (D + T)


def _zero_one_branch(x, other):
    if x.shape[1] == 1:
        return x * 3
    if x.shape[1] == 0:
        return x + 1
    return x.cumsum(1)


def _equal_to_another_inputs(x, other):
    if x.shape[1] == other.shape[0]:
        return x + other
    return x * other.sum()


def _size_as_a_tensor(x, other):
    return x * torch.tensor(x.shape[1], dtype=x.dtype) + torch.full((x.shape[1], 1), float(x.shape[0]), dtype=x.dtype)


SIZE_READING_PROGRAMS = {f.__name__.lstrip("_"): f for f in (
    _int_of_a_size, _size_method, _len, _range_over_a_size, _slice_bounds, _positions_sliced, _arange, _causal_mask,
    _view_computed, _size_arithmetic, _zero_one_branch, _equal_to_another_inputs, _size_as_a_tensor)}


def size_reading_programs():
    """(name, program) pairs from SIZE_READING_PROGRAMS."""
    return st.sampled_from(sorted(SIZE_READING_PROGRAMS.items()))


def call_lengths(max_calls: int = 6):
    """Sequences of sequence lengths for successive calls: 0, 1, 2, small, large, and repeats of earlier ones."""
    length = st.sampled_from([0, 1, 1, 1, 2, 2, 3, 5, 7, 16, 33])
    return st.lists(length, min_size=2, max_size=max_calls).flatmap(
        lambda ls: st.lists(st.sampled_from(ls), max_size=2).map(lambda again: ls + again))
