"""How much of thunderfn's op library is exact under symbolic sizes: thunderfn's OpInfo database
(thunderfn/testing/opinfos) through `tf.jit(op, dynamic=True)`.

Per op, the first N samples (--samples) of its first floating dtype (float32 where listed):
- forward: `tf.jit(op, dynamic=True)` on the sample, then on the sample *grown*: every tensor dimension
  of one size v (every dimension of that size, so sizes the op needs equal stay equal) made v + 3, or
  else 2v (a view's divisibility); the first growth eager accepts. Both against eager.
- backward (where the sample has floating positional tensors, a floating output and eager can
  differentiate it): the same with `tf.jit(fn, dynamic=True)` of sum(output * weight) (the weights a
  fixed pattern computed from the output's shape) and torch.autograd.grad through it (the VJP rules),
  against eager's gradients;
- jvp: `tf.jit(lambda: tf.jvp(op, leaves, tangents), dynamic=True)` (the JVP rules) against torch.func.jvp
  (where they differ, central differences in float64 decide: "known" where they agree with thunderfn);
- vmap: `tf.jit(tf.vmap(op), dynamic=True)` over two examples (the positional tensors stacked; the
  batching rules) against the op on each example, stacked.

Each sample's jitted function is classified by what its two calls did:
- symbolic: one entry served both sizes (exact: both match eager);
- specialized: the grown call compiled anew because the first trace relied on a size: a guard on it
  (`size_guards`) or a size it pinned to a number (`pinned`), both shown, with the thunderfn line
  that asked (this script records where each guard was asked);
- static: the symbolic compile failed and jit compiled with static sizes (`static_fallbacks`: why);
- no sizes: nothing to leave symbolic (no tensor input, or only 0-dim / empty ones);
- ungrown: no growth of the sample ran eagerly (only the first call checked);
- error: jit raised where eager did not; WRONG: a value or gradient different from eager (must be 0);
  known: different from eager where eager is known not to be the reference (KNOWN_DIFFERENT, with why).
An op's class is its worst sample's (WRONG, error, static, specialized, known, symbolic, ungrown, no sizes).

    python benchmarks/opdb_dynamic_coverage.py             # summary and the ops per class
    python benchmarks/opdb_dynamic_coverage.py -v -k cat   # one line per op whose name contains 'cat'
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import traceback
import warnings

import torch
from torch.fx.experimental import symbolic_shapes
from torch.utils._pytree import tree_flatten, tree_unflatten

import thunderfn as tf
from harness import clone  # (a sibling script: run from benchmarks/ or the repo root)
from thunderfn.testing.opinfos import op_db

DEVICE = torch.device("cpu")
ORDER = ("WRONG", "error", "static", "specialized", "known", "symbolic", "ungrown", "no sizes", "skip")
# Factories of uninitialized memory: any contents are correct, so values cannot be compared.
UNSPECIFIED_CONTENTS = {"empty", "empty_like", "new_empty", "empty_strided", "torch.empty", "Tensor.new_empty"}
THUNDERFN_SOURCE = os.path.dirname(tf.__file__)
DYNAMIC = [True]  # jit's dynamic= for every compile here (--static: False, to tell a wrong result at any size)
# (op, part) -> why eager is not the reference there: counted "differs (known)", not WRONG
KNOWN_DIFFERENT = {
    ("aten.embedding_dense_backward", "backward"):
        "torch's double backward ignores scale_grad_by_freq (embedding_dense_double_backward: 'the first backward "
        "takes care of scaling'), so with a repeated index eager's gradient is not the derivative; thunderfn's VJP "
        "divides by the counts (a growth draws repeated indices; the op_db sample has none)",
    ("batch_norm_running_update", "jvp"):
        "torch's forward mode is of two minds about the new running statistics: aten's functional "
        "_native_batch_norm_legit_functional gives them a zero tangent, while F.batch_norm and F.instance_norm, "
        "which run the same kernel writing in place, leave each statistic its own tangent; thunderfn records "
        "F.batch_norm as the functional op and follows F.batch_norm (tests/test_forward_mode.py)",
}


# -- where each guard and specialization was asked (the thunderfn line), for the report -------------------
_asked: list[str] = []


def _thunderfn_frame() -> str:
    frames = [f for f in traceback.extract_stack()
              if f.filename.startswith(THUNDERFN_SOURCE)
              and not f.filename.endswith(("symbolic.py", "symbolic_shapes.py"))]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{os.path.relpath(f.filename, THUNDERFN_SOURCE)}:{f.lineno} {(f.line or '').strip()[:80]}"


_log_guard = symbolic_shapes.ShapeEnv._log_guard
_set_replacement = symbolic_shapes.ShapeEnv._set_replacement


def _logging_guard(self, prefix, g, forcing_spec):
    _asked.append(f"{g}  <- {_thunderfn_frame()}")
    return _log_guard(self, prefix, g, forcing_spec)


def _logging_replacement(self, a, tgt, msg):
    if getattr(tgt, "is_number", False):
        _asked.append(f"{a} := {tgt}  <- {_thunderfn_frame()}")
    return _set_replacement(self, a, tgt, msg)


symbolic_shapes.ShapeEnv._log_guard = _logging_guard
symbolic_shapes.ShapeEnv._set_replacement = _logging_replacement


# -- samples -------------------------------------------------------------------------------------------
def _tensors(tree) -> list:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _grown(tree, old: int, new: int):
    """tree with every tensor's dimensions of size `old` made `new` (values drawn afresh, same dtype)."""
    flat, spec = tree_flatten(tree)
    out = []
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor) and old in x.shape:
            shape = tuple(new if n == old else n for n in x.shape)
            g = torch.Generator().manual_seed(1000 + i)
            if x.dtype.is_floating_point or x.dtype.is_complex:
                y = torch.randn(shape, generator=g, dtype=torch.float64).to(x.dtype)
            elif x.dtype is torch.bool:
                y = torch.randint(0, 2, shape, generator=g).bool()
            else:  # integer tensors are often indices: stay within the smallest size they may index
                high = max(int(x.max()) + 1 if x.numel() else 1, 1)
                low = min(int(x.min()) if x.numel() else 0, 0)
                y = torch.randint(low, high, shape, generator=g).to(x.dtype)
            if not x.is_contiguous() and y.ndim >= 2:  # keep a non-contiguous sample non-contiguous
                y = y.transpose(0, 1).contiguous().transpose(0, 1)
            out.append(y.requires_grad_(x.requires_grad))
        else:
            out.append(x)
    return tree_unflatten(out, spec)


def growths(args, kwargs):
    """(args, kwargs) grown along one size each: the sizes >= 2 the tensors have (commonest first), then 1."""
    sizes = collections.Counter(n for t in _tensors((args, kwargs)) for n in t.shape if n >= 1)
    for old in sorted(sizes, key=lambda n: (n == 1, -sizes[n], -n)):
        for new in (old + 3, 2 * old + 2):
            yield (old, new), _grown(args, old, new), _grown(kwargs, old, new)


def _mismatch(a, b) -> str | None:
    try:
        torch.testing.assert_close(a, b, equal_nan=True, atol=1e-4, rtol=1e-4)
        return None
    except (AssertionError, TypeError, ValueError, RuntimeError) as e:
        return " ".join(str(e).split())[:200]


def _float(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


# -- one sample ----------------------------------------------------------------------------------------
class Outcome(Exception):
    def __init__(self, kind, detail):
        super().__init__(kind)
        self.kind, self.detail = kind, detail


def _eager(fn, args, kwargs):
    torch.manual_seed(0)
    return fn(*clone(args), **clone(kwargs))


def _classify(jitted, first_misses: int, grown_at) -> tuple[str, str]:
    info = tf.cache_info(jitted)
    if info["static_fallbacks"]:
        return "static", info["static_fallbacks"][0]
    if not info["symbolic"] and not info["pinned"]:
        return "no sizes", ""
    if info["misses"] == first_misses and info["symbolic"]:
        return ("symbolic", "") if grown_at is not None else ("ungrown", "")
    facts = [f for facts in info["size_guards"] for f in facts]
    where = "; ".join(dict.fromkeys(_asked))[:600]
    grown = f"grown {grown_at[0]}->{grown_at[1]}: " if grown_at else ""
    return "specialized", (f"{grown}{info['recompiles'][-1][:160] if info['recompiles'] else ''} | guards {facts} "
                           f"pinned {info['pinned']} | asked: {where}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__


def _survives(fn, args, kwargs) -> bool:
    """Whether fn(args, kwargs) returns in a child process: aten's internal ops (aten.nll_loss_backward)
    check few of their inputs, and a growth breaking what they assume may crash the interpreter."""
    pid = os.fork()
    if pid == 0:
        try:
            fn(args, kwargs)
            code = 0
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def run_two_sizes(jitted, call_jitted, call_eager, args, kwargs, compare, unchecked=False):
    """The jitted function on the sample and on its first growth eager accepts (with `unchecked`, tried in a
    child process first): (class, detail)."""
    expected = call_eager(args, kwargs)
    _asked.clear()
    try:
        got = call_jitted(args, kwargs)
    except Exception as e:  # noqa: BLE001
        raise Outcome("error", _first_line(e))
    why = compare(got, expected)
    if why:
        raise Outcome("WRONG", f"first size: {why}")
    info = tf.cache_info(jitted)
    first_misses = info["misses"]
    if not info["symbolic"]:  # static, or every size pinned: growing tells nothing more
        return _classify(jitted, first_misses, ("*", "*") if info["pinned"] else None)
    asked_first = list(_asked)
    for at, gargs, gkwargs in growths(args, kwargs):
        if unchecked and not _survives(call_eager, gargs, gkwargs):
            continue
        try:
            expected = call_eager(gargs, gkwargs)
        except Exception:  # noqa: BLE001 (this growth is not a valid input)
            continue
        try:
            got = call_jitted(gargs, gkwargs)
        except Exception as e:  # noqa: BLE001
            raise Outcome("error", f"grown {at[0]}->{at[1]}: {_first_line(e)}")
        why = compare(got, expected)
        if why:
            raise Outcome("WRONG", f"grown {at[0]}->{at[1]}: {why}")
        _asked[:] = asked_first
        return _classify(jitted, first_misses, at)
    return _classify(jitted, first_misses, None)


def _same_type_and_value(got, expected) -> str | None:
    if type(got) is not type(expected):
        return f"returned {type(got).__name__}, eager {type(expected).__name__}"
    return _mismatch(got, expected)


def forward(op, sample):
    jitted = tf.jit(lambda *a, **k: op.op(*a, **k), dynamic=DYNAMIC[0])

    def call_jitted(args, kwargs):
        torch.manual_seed(0)
        return jitted(*clone(args), **clone(kwargs))

    return run_two_sizes(jitted, call_jitted, lambda a, k: _eager(op.op, a, k), sample.args, sample.kwargs,
                         _same_type_and_value, unchecked=op.name.startswith("aten."))


class _Differentiated:
    """sum(op(...) * weights) over the floating outputs, as a function of the floating positional tensors (the
    leaves) and the sample's other tensors (tests/test_ops_autodiff.py's case). The weights are computed from
    each output's shape inside the function (a fixed pattern, so a gradient right only for an all-ones
    cotangent is still caught): inputs holding them would have sizes that coincide with others'."""

    def __init__(self, op, sample):
        self.op = op
        self.flat, self.spec = tree_flatten((sample.args, sample.kwargs))
        n_positional = len(tree_flatten(sample.args)[0])
        self.leaf_pos = [i for i, a in enumerate(self.flat[:n_positional]) if _float(a)]
        self.other_pos = [i for i, a in enumerate(self.flat) if isinstance(a, torch.Tensor) and i not in self.leaf_pos]
        self.out_pos = None  # the floating outputs' positions, from the first (eager) run: traced, they are proxies

    def split(self, tree):
        """(leaves, other tensors) of a sample's (args, kwargs)."""
        flat = tree_flatten(tree)[0]
        return [flat[i] for i in self.leaf_pos], [flat[i] for i in self.other_pos]

    def outputs(self, leaves, others):
        flat = list(self.flat)
        for i, x in zip(self.leaf_pos + self.other_pos, [*leaves, *(o.clone() for o in others)]):
            flat[i] = x
        args, kwargs = tree_unflatten(flat, self.spec)
        outs = tree_flatten(self.op.op(*args, **kwargs))[0]
        if self.out_pos is None:
            self.out_pos = [i for i, o in enumerate(outs) if _float(o)]
        return [outs[i] for i in self.out_pos]

    def __call__(self, leaves, others):
        total = 0
        for o in self.outputs(leaves, others):
            weight = (torch.arange(o.numel(), dtype=o.dtype, device=o.device).reshape(o.shape) * 0.7 + 0.3).sin()
            total = total + (o * weight).sum()
        return total


def _value_and_grads(fn, leaves, others):
    leaves = [x.detach().clone().requires_grad_(True) for x in leaves]
    torch.manual_seed(0)
    out = fn(leaves, others)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return out, None
    return out, torch.autograd.grad(out, leaves, allow_unused=True)


def backward(op, sample):
    case = _Differentiated(op, sample)
    leaves, others = case.split((sample.args, sample.kwargs))
    if not leaves:
        return "skip", "no floating positional tensor"
    try:
        if not case.outputs(leaves, others):
            return "skip", "no floating output"
        _, grads = _value_and_grads(case, leaves, others)
    except Exception:  # noqa: BLE001
        return "skip", "eager cannot differentiate it"
    if grads is None:
        return "skip", "the output does not depend on the floating inputs"
    jitted = tf.jit(case, dynamic=DYNAMIC[0])

    def call(fn):
        return lambda args, kwargs: _value_and_grads(fn, *case.split(args))

    def compare(got, expected):
        (value, grads), (value_e, grads_e) = got, expected
        if (grads is None) != (grads_e is None):
            return f"gradients {'absent' if grads is None else 'present'}, eager's not"
        grads = [g if g is not None or e is None else torch.zeros_like(e) for g, e in zip(grads or (), grads_e or ())]
        return _mismatch(value, value_e) or _mismatch(list(grads), list(grads_e or ()))

    return run_two_sizes(jitted, call(jitted), call(case), (sample.args, sample.kwargs), {}, compare,
                         unchecked=op.name.startswith("aten."))


def _tangents(leaves):
    """A fixed direction for each leaf, computed from it (so it grows with it)."""
    return tuple((x * 1.3 + 0.2).sin() for x in leaves)


def forward_mode(op, sample):
    """tf.jvp of the op's floating outputs in its floating positional tensors, jitted, against torch.func.jvp."""
    case = _Differentiated(op, sample)
    leaves, others = case.split((sample.args, sample.kwargs))
    if not leaves:
        return "skip", "no floating positional tensor"

    def of(jvp):
        def fn(leaves, others):
            return jvp(lambda *xs: tuple(case.outputs(xs, others)), tuple(leaves), _tangents(leaves))
        return fn

    try:
        if not case.outputs(leaves, others):
            return "skip", "no floating output"
        of(torch.func.jvp)(leaves, others)
    except Exception:  # noqa: BLE001
        return "skip", "torch.func.jvp cannot differentiate it"
    jitted = tf.jit(of(tf.jvp), dynamic=DYNAMIC[0])

    def call(fn):
        def run(args, kwargs):
            torch.manual_seed(0)
            return fn(*case.split(args))
        return run

    try:
        return run_two_sizes(jitted, call(jitted), call(of(torch.func.jvp)), (sample.args, sample.kwargs), {},
                             _mismatch, unchecked=op.name.startswith("aten."))
    except Outcome as o:
        if o.kind != "WRONG" or not _finite_differences_agree(case, leaves, others):
            raise
        return ("known", "torch.func.jvp is not the derivative here: central differences in float64 agree with "
                         f"thunderfn's; {o.detail}")


def _finite_differences_agree(case, leaves, others) -> bool:
    """Whether thunderfn's JVP (float64, uncompiled) matches central differences where torch.func.jvp does not:
    torch's forward-mode formulas treat some inputs as constants (nll_loss's weight, the *_backward ops')."""
    leaves = [x.double() for x in leaves]
    others = [x.double() if x.is_floating_point() else x for x in others]

    def f(*xs):
        torch.manual_seed(0)
        return tuple(case.outputs(xs, others))

    tangents, eps = _tangents(leaves), 1e-6
    try:
        plus = f(*[x + eps * t for x, t in zip(leaves, tangents)])
        minus = f(*[x - eps * t for x, t in zip(leaves, tangents)])
        differences = [(a - b) / (2 * eps) for a, b in zip(plus, minus)]
        ours = tf.jvp(f, tuple(leaves), tangents)[1]
        theirs = torch.func.jvp(f, tuple(leaves), tangents)[1]
    except Exception:  # noqa: BLE001
        return False
    close = lambda got: _mismatch([g.double() for g in got], differences) is None  # noqa: E731
    return close(ours) and not close(theirs)


def batched(op, sample):
    """tf.vmap of the op over two examples (its positional tensors stacked; keyword tensors shared), jitted,
    against torch.func.vmap."""
    flat, spec = tree_flatten((sample.args, sample.kwargs))
    n_positional = len(tree_flatten(sample.args)[0])
    tensor_pos = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    in_dims = tuple(0 if i < n_positional else None for i in tensor_pos)
    if 0 not in in_dims:
        return "skip", "no positional tensor"

    def fn(*tensors):
        full = list(flat)
        for i, t in zip(tensor_pos, tensors):
            full[i] = t
        args, kwargs = tree_unflatten(full, spec)
        return op.op(*args, **kwargs)

    def examples(tree):
        tensors = [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]
        return [torch.stack([t, t * 0.5 + 0.25 if t.is_floating_point() else t]) if d == 0 else t.clone()
                for t, d in zip(tensors, in_dims)]

    def call(vmap):
        mapped = vmap(fn)

        def run(args, kwargs):
            torch.manual_seed(0)
            return mapped(*examples(args))
        return run

    def per_example(f):
        """vmap's definition: f on each example, the outputs stacked (torch.func.vmap's batching rules have
        their own bugs: argmax(keepdim=True) without a dim, index_select with a 0-dim index)."""
        def mapped(*tensors):
            outs = [f(*(t[i] if d == 0 else t for t, d in zip(tensors, in_dims))) for i in range(2)]
            flat = [tree_flatten(o) for o in outs]
            if not all(isinstance(x, torch.Tensor) for x in flat[0][0]):
                raise TypeError("vmap returns tensors only")
            return tree_unflatten([torch.stack(xs) for xs in zip(flat[0][0], flat[1][0])], flat[0][1])
        return mapped

    try:
        call(per_example)((sample.args, sample.kwargs), {})
    except Exception:  # noqa: BLE001
        return "skip", "eager raises on an example, or returns a non-tensor"
    jitted = tf.jit(tf.vmap(fn, in_axes=in_dims), dynamic=DYNAMIC[0])
    return run_two_sizes(jitted, call(lambda f: jitted), call(per_example), (sample.args, sample.kwargs), {},
                         _same_type_and_value, unchecked=op.name.startswith("aten."))


def run_op(op, samples: int, only: str | None):
    """[(part, class, detail)] for the op's first `samples` samples."""
    if op.name in UNSPECIFIED_CONTENTS:
        return [("forward", "skip", "contents unspecified")]
    dtype = torch.float32 if torch.float32 in op.dtypes else op.dtypes[0]
    try:
        chosen = [s for _, s in zip(range(samples), op.sample_inputs(DEVICE, dtype))]
    except Exception as e:  # noqa: BLE001
        return [("forward", "skip", f"sample_inputs raised {type(e).__name__}")]
    results = []
    for sample in chosen:
        for part, check in (("forward", forward), ("backward", backward), ("jvp", forward_mode), ("vmap", batched)):
            if only and part not in only:
                continue
            if part == "forward":
                try:
                    _eager(op.op, sample.args, sample.kwargs)
                    again = _eager(op.op, sample.args, sample.kwargs)
                    if _mismatch(_eager(op.op, sample.args, sample.kwargs), again):
                        results.append((part, "skip", "eager is nondeterministic"))
                        continue
                except Exception:  # noqa: BLE001
                    results.append((part, "skip", "eager raised"))
                    continue
            try:
                kind, detail = check(op, sample)
            except Outcome as o:
                kind, detail = o.kind, o.detail
            if kind == "WRONG" and (op.name, part) in KNOWN_DIFFERENT:
                kind, detail = "known", f"{KNOWN_DIFFERENT[op.name, part]}; {detail}"
            results.append((part, kind, f"{sample!r}: {detail}" if detail else ""))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="-v: a line per op; -vv: and per sample "
                        "that is not symbolic")
    parser.add_argument("-k", default="", help="only ops whose name contains this")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--static", action="store_true", help="compile with dynamic=False: whether a WRONG is "
                        "wrong at static sizes too (not a symbolic-size bug)")
    parser.add_argument("--only", nargs="+", choices=("forward", "backward", "jvp", "vmap"), default=None,
                        help="the parts to run (default: all)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    DYNAMIC[0] = not args.static
    torch.set_num_threads(1)  # a child forked by _survives must not inherit a thread pool (it would hang)
    start = time.perf_counter()
    per_op, per_sample = {}, collections.Counter()
    for op in op_db:
        if args.k not in op.name:
            continue
        t0 = time.perf_counter()
        results = run_op(op, args.samples, args.only)
        per_sample.update((part, kind) for part, kind, _ in results)
        counted = [r for r in results if r[1] != "skip"] or results or [("forward", "skip", "no samples")]
        worst = min(counted, key=lambda r: ORDER.index(r[1]))
        per_op[op.name] = worst
        if args.verbose:
            print(f"{worst[1]:11} {op.name:40} {time.perf_counter() - t0:5.1f}s {worst[0]} {worst[2][:400]}",
                  flush=True)
        if args.verbose > 1:
            for part, kind, detail in results:
                if kind not in ("symbolic", "no sizes", "skip"):
                    print(f"    {kind:11} {part:8} {detail[:1200]}")
    classes = collections.Counter(kind for _, kind, _ in per_op.values())
    print(f"\nthunderfn op database under tf.jit(dynamic={DYNAMIC[0]}): {len(per_op)} ops, {args.samples} samples each "
          f"[{time.perf_counter() - start:.0f} s]")
    parts = ("forward", "backward", "jvp", "vmap")
    print(f"{'class':12} {'ops':>5}" + "".join(f" {p + ' samples':>16}" for p in parts))
    for kind in ORDER:
        print(f"{kind:12} {classes[kind]:5}" + "".join(f" {per_sample[p, kind]:16}" for p in parts))
    for kind in ("WRONG", "error", "static", "specialized", "known", "ungrown"):
        names = sorted(n for n, (_, k, _) in per_op.items() if k == kind)
        if names:
            print(f"\n{kind} ({len(names)}):")
            for n in names:
                part, _, detail = per_op[n]
                print(f"  {n:36} {part:8} {detail[:700]}")
    return 1 if classes["WRONG"] else 0


if __name__ == "__main__":
    sys.exit(main())
