"""Rewrites of the torch executor's calls that make a cached call cheaper than eager's.

Eager PyTorch pays, on every call, for two things a compiled trace knows how to avoid:

- **Python numbers become tensors on every call.** `torch.mul(x, 2)` wraps the 2 in a
  new 0-d tensor each time (about a microsecond, as much as the multiply itself on a
  small tensor). `lift_number_operands` makes that tensor once, when the trace
  compiles, and passes it instead: `torch.mul(x, c0)`. It does so only where torch
  gives the same result for the tensor as for the number (see `_same_as_number`),
  which is checked bit for bit over dtypes in tests/test_torch_rewrites.py.
- **Reverse-mode rules reshape what is already in shape.** A rule written for any rank folds and
  unfolds batch dims (`reshape(g, (rows, n))`, then back), which for the ranks at hand is often the
  shape the tensor has, or a reshape of a reshape. Each is one more torch call per step that eager's
  backward does not make. `collapse_reshapes` drops a reshape to a tensor's own shape and makes a
  reshape of a reshape one reshape of the first tensor.
- **Every op allocates its output.** `reuse_dead_buffers` writes an elementwise op's
  result into its first argument when that argument is a fresh intermediate the
  trace never reads again (`torch.sin(t1)` becomes `torch.Tensor.sin_(t1)`): no
  allocation, and for large tensors no page faults on new memory, as Inductor's
  buffer reuse does.

- **A new value of an input is computed, then copied into it.** A function that updates an
  input (or captured tensor) in place is traced functionally: the new value is computed into
  new memory and written back at the end (`x.copy_(t5)`). `write_into_written_back_inputs`
  lets the call that computes it write into the input itself, as eager's in-place op does,
  where nothing reads the old value afterwards: `torch.add(n, 1)` then `n.copy_(t1)` becomes
  `n.add_(1)`, and batch norm's functional form with the running statistics becomes aten's
  `native_batch_norm`, which updates them inside its kernel as eager's batch norm does.

Writing in place is only correct where nothing records the old value: torch.autograd
saves an op's inputs for its backward, and torch.func.vmap refuses to write a batched
value into an unbatched tensor. So jit applies both rewrites only to traces that
run without autograd recording (the halves of a forward/backward split, or a trace in
which nothing requires grad), and `UnlessFunctorch` keeps the unrewritten trace for
calls made under torch.func's transforms.

May import: core/, the torch language, executors/torch_executor.py.
"""
from __future__ import annotations

import collections

import torch

from thunderfn.core import symbolic
from thunderfn.core.context import functorch_active
from thunderfn.core.passes import dce, output_names, value_key
from thunderfn.core.proxies import TensorProxy
from thunderfn.core.pytree import tree_leaves, tree_map
from thunderfn.core.statements import no_writes_yet, write_back, write_back_on_failure, written
from thunderfn.core.symbol import BoundSymbol
from thunderfn.executors.torch_executor import TorchExecutor, torch_ex
from thunderfn.torch import aten_backward

# -- lifting numbers ----------------------------------------------------------------------------

# Binary arithmetic whose Python-number operand torch wraps into a 0-d tensor before dispatch. A 0-d
# tensor of the same dtype that wrapping makes (int64, float64) then takes the same kernel path (the
# number is read back at full precision: TensorIterator's cpu-scalar path) and, next to a tensor with
# dimensions of the same or a higher dtype category, the same result dtype.
_NUMBER_SECOND = (torch.add, torch.sub, torch.mul, torch.div, torch.true_divide)


def lift_number_operands(trc):
    """trc with the Python numbers of `torch.add/sub/mul/div(tensor, number)` calls made into
    0-d tensors once, when the trace compiles (one per distinct number)."""
    lifted: dict = {}
    out, changed = [], False
    for bsym in trc.bound_symbols:
        number = _liftable_number(bsym)
        if number is None:
            out.append(bsym)
            continue
        key = value_key(number)
        proxy = lifted.get(key)
        if proxy is None:
            tensor = torch.tensor(number, dtype=torch.float64 if type(number) is float else torch.int64)
            proxy = lifted[key] = TensorProxy(trc.names.take(prefix="c"), shape=(), dtype=tensor.dtype,
                                              device=tensor.device, constant=tensor,
                                              origin=f"the number {number!r}, made a tensor once")
        out.append(BoundSymbol(bsym.sym, (bsym.args[0], proxy, *bsym.args[2:]), bsym.kwargs, bsym.output,
                              bsym.subsymbols))
        changed = True
    return trc.derive("Lift number operands", out) if changed else trc


def _liftable_number(bsym):
    """The number in `torch.op(tensor, number, ...)` when passing it as a 0-d tensor is exactly
    eager's computation, else None."""
    sym = bsym.sym
    if not isinstance(sym.executor, TorchExecutor) or sym.eager not in _NUMBER_SECOND or len(bsym.args) < 2:
        return None
    a, b = bsym.args[:2]
    if not isinstance(a, TensorProxy) or type(b) not in (int, float) or not _same_as_number(a, b):
        return None
    return b


def _same_as_number(t: TensorProxy, number) -> bool:
    """Whether a 0-d int64/float64 tensor holding `number` gives what the number gives next to t.
    A tensor with dimensions decides the result dtype when the number's category (integer, float)
    is not higher than its own; a 0-d t would promote with the tensor as an equal instead; and
    devices other than CPU and CUDA may not take a CPU scalar tensor at all."""
    if len(t.shape) == 0 or t.device.type not in ("cpu", "cuda") or t.dtype is torch.bool:
        return False
    if type(number) is float:
        return t.dtype.is_floating_point or t.dtype.is_complex
    return abs(number) < 2 ** 63  # as an int64


# -- writing into dead intermediates ------------------------------------------------------------

# Elementwise torch functions and the in-place method that computes the same into its first argument.
_IN_PLACE = {
    torch.add: torch.Tensor.add_, torch.sub: torch.Tensor.sub_, torch.mul: torch.Tensor.mul_,
    torch.div: torch.Tensor.div_, torch.true_divide: torch.Tensor.true_divide_, torch.pow: torch.Tensor.pow_,
    torch.neg: torch.Tensor.neg_, torch.abs: torch.Tensor.abs_, torch.exp: torch.Tensor.exp_,
    torch.expm1: torch.Tensor.expm1_, torch.log: torch.Tensor.log_, torch.log1p: torch.Tensor.log1p_,
    torch.sin: torch.Tensor.sin_, torch.cos: torch.Tensor.cos_, torch.tan: torch.Tensor.tan_,
    torch.tanh: torch.Tensor.tanh_, torch.sigmoid: torch.Tensor.sigmoid_, torch.sqrt: torch.Tensor.sqrt_,
    torch.rsqrt: torch.Tensor.rsqrt_, torch.reciprocal: torch.Tensor.reciprocal_, torch.erf: torch.Tensor.erf_,
    torch.relu: torch.Tensor.relu_, torch.square: torch.Tensor.square_,
}
# Torch functions that always return new memory, never a view or one of their arguments. Only their
# outputs are reused, and only while every reader is among them (a view of a reused tensor would see the write).
_FRESH = set(_IN_PLACE) | {
    torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.nn.functional.linear, torch.nn.functional.gelu,
    torch.nn.functional.silu, torch.softmax, torch.log_softmax, torch.nn.functional.softmax,
    torch.nn.functional.log_softmax, torch.where, torch.maximum, torch.minimum, torch.sum, torch.mean, torch.cat,
    # aten's kernels the backward calls (gelu_backward, native_layer_norm_backward, ...): new tensors each
    *(getattr(aten_backward, name).torch_fn for name in aten_backward.__all__),
}
# Where a op b == b op a bit for bit (real dtypes: one rounding, no reassociation), the result may go into b.
_COMMUTATIVE = {torch.add, torch.mul}


_RESHAPES = {torch.reshape, torch.Tensor.reshape}


def collapse_reshapes(trc):
    """trc without reshapes (and narrows) to a tensor's own shape (their readers read the tensor), with each reshape
    of a reshape's result reshaping the first one's input instead (the middle one then goes where
    nothing else reads it), and with a sum whose only reader reshapes it to keep the reduced dims
    made a sum with keepdim=True. A reshape the trace returns is dropped only where its input is an
    intermediate nothing else returns: the caller never gets one tensor twice, nor an input back as a
    new value. Values are the same either way; a reshape may return a view or a copy, and nothing
    after lowering writes into a reshape's result (reuse_dead_buffers leaves views alone)."""
    collapsing = _CollapsingReshapes(trc)
    for bsym in trc.bound_symbols:
        collapsing.add(bsym.swap(collapsing.renamed) if collapsing.renamed else bsym)
    out, renamed = collapsing.out, collapsing.renamed
    if len(out) == len(trc.bound_symbols) and all(a is b for a, b in zip(out, trc.bound_symbols)):
        return trc
    collapsed = trc.derive("Collapse reshapes", out)
    collapsed.output = tree_map(lambda p: renamed.get(p.name, p) if isinstance(p, TensorProxy) else p, trc.output)
    return dce(collapsed)


class _CollapsingReshapes:
    """collapse_reshapes' walk over a trace's bound symbols: `out`, the ones kept (some rewritten), and
    `renamed`, what the readers of a dropped reshape's output read instead."""

    def __init__(self, trc):
        self.returned = output_names(trc)
        self.inputs = {p.name for p in tree_leaves(trc.args) if isinstance(p, TensorProxy)}
        self.readers = collections.Counter(a.name for b in trc.bound_symbols for a in b.proxy_args())
        self.origin: dict = {}  # a kept reshape's output -> the tensor its chain started from
        self.renamed: dict = {}  # a dropped reshape's output -> what its readers read instead
        self.summed: dict = {}  # a sum's output -> its position in `out`
        self.out: list = []

    def add(self, bsym) -> None:
        fn = _torch_fn(bsym)
        if fn is torch.narrow and _keeps_everything(bsym) and bsym.output.name not in self.returned:
            self.renamed[bsym.output.name] = bsym.args[0]  # a narrow to the whole length (cat's backward, one piece)
            return
        if fn is torch.sum and isinstance(bsym.output, TensorProxy) and len(bsym.args) == 2 and not bsym.kwargs:
            self.summed[bsym.output.name] = len(self.out)
        if fn in _RESHAPES and isinstance(bsym.output, TensorProxy) and not bsym.kwargs:
            self._add_reshape(bsym)
        else:
            self.out.append(bsym)

    def _add_reshape(self, bsym) -> None:
        """A reshape y of x (of the tensor x's chain of reshapes started from): dropped where y has x's shape,
        folded into x's sum as keepdim=True where it only keeps the reduced dims, else made to reshape x."""
        y, x = bsym.output, self.origin.get(bsym.args[0].name, bsym.args[0])
        returned = self.returned
        if symbolic.same_shape(x.shape, y.shape) and x.dtype == y.dtype and (y.name not in returned or (
                x.name not in returned and x.name not in self.inputs and x.name not in self.origin)):
            self.renamed[y.name] = x
            if y.name in returned:  # x is returned in its place now
                returned.add(x.name)
            return
        position = self.summed.get(x.name)
        if (position is not None and self.readers.get(x.name) == 1 and x.name not in returned
                and symbolic.same_shape(y.shape, _keepdim_shape(self.out[position]))):
            total = self.out[position]
            self.out[position] = BoundSymbol(total.sym, total.args, {"keepdim": True}, y, total.subsymbols)
            return
        if x is not bsym.args[0]:
            bsym = BoundSymbol(bsym.sym, (x, *bsym.args[1:]), bsym.kwargs, y, bsym.subsymbols)
        self.origin[y.name] = x
        self.out.append(bsym)


def _keeps_everything(bsym) -> bool:
    x, out = bsym.args[0], bsym.output
    return isinstance(out, TensorProxy) and symbolic.same_shape(x.shape, out.shape) and x.dtype == out.dtype


def _keepdim_shape(total) -> tuple:
    """The shape of `torch.sum(x, dims)` with keepdim=True."""
    x, dims = total.args
    dims = ({d % x.ndim for d in ((dims,) if isinstance(dims, int) else dims)} if dims not in (None, ())
            else set(range(x.ndim)))
    return tuple(1 if i in dims else n for i, n in enumerate(x.shape))


def reuse_dead_buffers(trc, donated=frozenset()):
    """trc with each elementwise torch call whose first argument is a fresh intermediate read for
    the last time made to write its result there (see the module docstring for when this is legal:
    the trace must not run under autograd recording). The inputs named in `donated` count as fresh
    intermediates: their memory is the compiled function's to reuse (jit's donate_argnums, donation.py)."""
    bsyms = trc.bound_symbols
    fresh, last_read = set(donated), {}
    aliasable = output_names(trc)  # the caller holds these
    for i, b in enumerate(bsyms):
        fresh_op = _torch_fn(b) in _FRESH
        for a in b.proxy_args():
            last_read[a.name] = i
            if not fresh_op:  # its output may be a view of a: a write into a would show through it
                aliasable.add(a.name)
        if fresh_op:
            fresh.update(o.name for o in b.proxy_outs())

    def reusable(t, i: int, result) -> bool:
        return (isinstance(t, TensorProxy) and t.name in fresh and t.name not in aliasable and last_read[t.name] == i
                and isinstance(result, TensorProxy) and symbolic.same_shape(result.shape, t.shape)
                and result.dtype == t.dtype and result.device == t.device)

    out, changed = list(bsyms), False
    for i, b in enumerate(bsyms):
        in_place = _IN_PLACE.get(_torch_fn(b))
        if in_place is None or not b.args:
            continue
        args = b.args
        if (not reusable(args[0], i, b.output) and _torch_fn(b) in _COMMUTATIVE and len(args) == 2 and not b.kwargs
                and reusable(args[1], i, b.output) and not b.output.dtype.is_complex):
            args = (args[1], args[0])
        if reusable(args[0], i, b.output):
            out[i] = BoundSymbol(torch_ex.op(in_place), args, b.kwargs, b.output, b.subsymbols)
            changed = True
    return trc.derive("Reuse dead buffers", out) if changed else trc


# -- writing into the inputs a trace writes back -------------------------------------------------

def native_batch_norm_into_running_stats(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """native_batch_norm_legit_functional's five results as eager's batch norm computes them: aten's
    native_batch_norm writes the new running statistics into running_mean and running_var themselves."""
    out, save_mean, save_invstd = torch.native_batch_norm(input, weight, bias, running_mean, running_var, training,
                                                          momentum, eps)
    return out, save_mean, save_invstd, running_mean, running_var


# A torch call and the call that computes the same into its arguments: that call, and for each output written so,
# the position of the argument it is written into (an elementwise op writes its result into its first argument).
_WRITES_INTO = {
    aten_backward.native_batch_norm_legit_functional.torch_fn: (native_batch_norm_into_running_stats, {3: 3, 4: 4}),
    **{fn: (in_place, {0: 0}) for fn, in_place in _IN_PLACE.items()},
}
# Calls whose outputs are new memory: reading a value with one of them makes no view of it.
_READS_WITHOUT_VIEWS = _FRESH | set(_WRITES_INTO)
_WRITE_BACKS = (write_back, write_back_on_failure)


def write_into_written_back_inputs(trc):
    """trc with each torch call that computes the new value of an input or captured tensor (one the trace
    writes back) from its old value, read there for the last time, made to write it into that tensor, and
    the write-back of that value dropped (see the module docstring for when this is legal: the trace must not
    run under autograd recording). A chain of such calls writes into the same tensor each time."""
    bsyms = trc.bound_symbols
    written_back = {b.args[0].name: i for i, b in enumerate(bsyms)
                    if b.sym is write_back and (len(b.args) < 3 or b.args[2] is None) and not b.args[0].requires_grad}
    if not written_back:
        return trc
    readers = _reader_indices(bsyms)
    outputs = output_names(trc)
    lives_in = {name: name for name in written_back}  # value -> the written-back tensor whose memory holds it

    def no_view_escapes(j: int) -> bool:  # reading there makes no alias that could be read later
        b = bsyms[j]
        return _torch_fn(b) in _READS_WITHOUT_VIEWS or b.sym in _WRITE_BACKS or not b.proxy_outs()

    def writable(a, o, i: int) -> bool:
        """May call i write its output o into a's memory: a is read for the last time there, by nothing that may
        have made a view of it, and o is read afterwards without views before its tensor is written back."""
        target = lives_in.get(a.name) if isinstance(a, TensorProxy) else None
        if (target is None or not isinstance(o, TensorProxy) or a.name in outputs or o.name in outputs
                or not symbolic.same_shape(o.shape, a.shape) or o.dtype != a.dtype or o.device != a.device
                or [p.name for p in bsyms[i].proxy_args()].count(a.name) != 1):
            return False
        if any(j > i or (j < i and not no_view_escapes(j)) for j in readers.get(a.name, ())):
            return False
        return all(i < j <= written_back[target] and no_view_escapes(j) for j in readers.get(o.name, ()))

    out, changed = list(bsyms), False
    for i, b in enumerate(bsyms):
        entry = _WRITES_INTO.get(_torch_fn(b))
        if entry is None:
            continue
        in_place, positions = entry
        outs = b.flat_outs()
        pairs = [(b.args[arg] if arg < len(b.args) else None, outs[pos]) for pos, arg in positions.items()]
        if all(writable(a, o, i) for a, o in pairs):
            out[i] = BoundSymbol(torch_ex.op(in_place), b.args, b.kwargs, b.output, b.subsymbols)
            lives_in.update((o.name, lives_in[a.name]) for a, o in pairs)
            changed = True
    if not changed:
        return trc
    return trc.derive("Write into written-back inputs", _without_writes_done_in_place(out, lives_in))


def _reader_indices(bsyms: list) -> dict:
    """name -> indices of the bound symbols that read it (a write-back's target is written, not read)."""
    readers: dict = {}
    for i, b in enumerate(bsyms):
        read = b.proxy_args()[1:] if b.sym in _WRITE_BACKS else b.proxy_args()
        for a in {a.name for a in read}:
            readers.setdefault(a, []).append(i)
    return readers


def _without_writes_done_in_place(bsyms: list, lives_in: dict) -> list:
    """bsyms without the write-backs of the values that now live in the tensor they were to be written into
    (lives_in: value -> that tensor), nor the bookkeeping for a failure write_back_on_failure_pass added for
    those tensors: a failure leaves them written as eager's ops do."""
    done = {b.args[0].name for b in bsyms if b.sym is write_back and lives_in.get(b.args[1].name) == b.args[0].name}
    slots = {b.args[0] for b in bsyms if b.sym is write_back_on_failure and b.args[1].name in done}
    out = [b for b in bsyms if not (b.sym in _WRITE_BACKS and b.args[0 if b.sym is write_back else 1].name in done
                                    or b.sym is written and b.args[0] in slots)]
    if not any(b.sym is write_back_on_failure for b in out):
        out = [b for b in out if b.sym is not no_writes_yet]
    return out


def _torch_fn(bsym):
    return bsym.sym.eager if isinstance(bsym.sym.executor, TorchExecutor) else None


def records_no_autograd(trc) -> bool:
    """Whether running trc records nothing for torch.autograd: no value in it requires grad."""
    return not any(p.requires_grad for p in trc.args) and not any(
        p.requires_grad for b in trc.bound_symbols for p in b.proxies())


class UnlessFunctorch:
    """Runs `rewritten`, or under torch.func's transforms the function `make_plain()` returns,
    made on first need (vmap's batched values may not be written into unbatched intermediates,
    and grad's tensors record autograd). jit's cache-hit path calls `rewritten` itself when
    `functorch_active()` is false, and this object otherwise: a hit either way."""

    __slots__ = ("rewritten", "make_plain", "plain")

    def __init__(self, rewritten, make_plain):
        self.rewritten, self.make_plain, self.plain = rewritten, make_plain, None

    def __call__(self, *args):
        if not functorch_active():
            return self.rewritten(*args)
        if self.plain is None:
            self.plain = self.make_plain()
        return self.plain(*args)

