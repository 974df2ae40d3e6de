"""Compile time by depth: the first step of tf.jit as programs grow, each measured in a fresh process.

    python benchmarks/bench_compile.py                    # every section, default sizes (about 2 minutes on 2 cores)
    python benchmarks/bench_compile.py --sections gpt2 --layers 2 8      # fewer depths
    python benchmarks/bench_compile.py --sections fresh --rounds 7       # one-time costs of a fresh process
    python benchmarks/bench_compile.py --fusion --torch-compile           # also tf.jit(fusion=True), torch.compile
                                                                          # (minutes each at 32 and 64 layers)

Sections:
- gpt2: Hugging Face GPT-2 at tiny width (n_embd 64, 4 heads, vocab 256, dropout off, no KV cache), batch 2 x 32
  tokens, one torch thread, at 2, 8, 32 and 64 layers (`--layers`): the first training step (`out = fn(ids,
  labels=ids); out.loss.backward()`: tracing, compiling and running) of eager and of `tf.jit(model)`, with its
  repeated layers compiled once (the default) and with `reuse_blocks=False` (every layer traced), each in a
  process of its own after the imports, and the steady step of tf.jit against eager's in that process (median of
  `--rounds` interleaved steps after the first). "warm" is `tf.jit(model)` in a second process with the same
  `THUNDERFN_CACHE_DIR` as a first one, which wrote its compiled entry there (docs/jit.md, "Warm starts"), and
  "/ cold first" its first step over the cold one's (in parentheses: the same for the processes' CPU time, which
  other work on a shared machine disturbs less). Each first step is the median of `--repeats` fresh processes
  (3; one for the minutes-long fusion and torch.compile variants): a shared machine's speed drifts.
  `--fusion` adds `tf.jit(model, fusion=True)` (with and without reuse, cold: Inductor's on-disk caches off; and
  warm: Inductor's and Triton's caches in that folder too), `--torch-compile` adds `torch.compile(model)` cold
  (its on-disk caches off) and warm (its caches filled by a first process).
- per-op: straight-line programs of N = 100, 1,000 and 10,000 operations (`--ops`): a Python loop of
  `x = torch.tanh(x @ w) + x` (three ops a pass: a matmul and two elementwise) on 4 x 4 tensors, summed. The first
  call of `tf.jit(f)` and of `tf.jit(tf.grad(f))` in a fresh process, in ms per operation, and the ratio of the
  largest N's ms/op to the smallest's: a compile linear in the program's length keeps it near 1 (issue 39's target:
  within 2x).
- unrolled: the first call of `tf.jit(tf.grad(f))` where f runs a Python loop of 1,000 passes of
  `x = torch.sin(x) * 1.01` over 16 floats (tracing unrolls it into 2,000 operations; target under 1.5 s).
- fresh: what a fresh process pays once (issue 39's target: each first compile under 1 s), median of `--rounds`
  processes: `import thunderfn` after `import torch`; the first compile of `tf.jit(lambda x: x.sin() + 1)` on a
  4 x 4 tensor (static); its first symbolic one, on 5 x 4 (a dimension made symbolic, as `dynamic=None` does on
  the first size change: sympy and torch's ShapeEnv are imported then); and whether that imported torch._dynamo.

Every time is the first call after imports and setup; a first call includes tracing, the transforms, compiling
and one run. Benchmarks are not tests: nothing here asserts a time. On a shared machine, rerun and compare.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

import thunderfn as tf
from harness import in_fresh_process, interleaved  # (a sibling script: run from benchmarks/ or the repo root)

BATCH, TOKENS = 2, 32
CHAIN_SIZE = 4  # the per-op chains' tensors: small, so that the cost per operation, not the arithmetic, is measured
UNROLLED_STEPS = 1_000
GPT2_VARIANTS = {"eager": "eager", "thunderfn": "tf.jit", "no-reuse": "tf.jit reuse_blocks=False",
                 "warm": "tf.jit warm", "fusion": "tf.jit fusion=True", "fusion-warm": "tf.jit fusion=True warm",
                 "fusion-no-reuse": "tf.jit fusion=True reuse_blocks=False", "torch.compile": "torch.compile",
                 "torch.compile-warm": "torch.compile warm"}
# variants measured in a second process, after a first one filled the caches in a folder of their own
WARM = {"warm": "thunderfn", "fusion-warm": "fusion", "torch.compile-warm": "torch.compile"}


# -- GPT-2 by depth -------------------------------------------------------------------------------------
def gpt2(layers: int):
    import transformers  # only here: the per-op children need not pay for importing it

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                     use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, config.vocab_size, (BATCH, TOKENS))
    return model, ids


def _training_step(model, fn, ids):
    def step():
        model.zero_grad(set_to_none=True)
        out = fn(ids, labels=ids)
        out.loss.backward()
        return out.loss.detach()
    return step


def _gpt2_child(variant: str, layers: int, rounds: int) -> dict:
    model, ids = gpt2(layers)
    variant = WARM.get(variant, variant)  # (its caches' folder is in the environment: section_gpt2)
    if variant == "eager":
        fn = model
    elif variant == "thunderfn":
        fn = tf.jit(model)
    elif variant == "no-reuse":
        fn = tf.jit(model, reuse_blocks=False)
    elif variant == "fusion":
        fn = tf.jit(model, fusion=True)
    elif variant == "fusion-no-reuse":
        fn = tf.jit(model, fusion=True, reuse_blocks=False)
    else:
        fn = torch.compile(model)
    step = _training_step(model, fn, ids)
    start, start_cpu = time.perf_counter(), time.process_time()
    loss = step()
    first, first_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if variant == "eager":
        return {"first": first, "first_cpu": first_cpu}
    eager_step = _training_step(model, model, ids)
    error = (loss - eager_step()).abs().item()
    medians = interleaved({"eager": eager_step, variant: step}, rounds, 1)
    return {"first": first, "first_cpu": first_cpu, "step_ms": medians[variant], "eager_ms": medians["eager"],
            "loss_error": error}


def _cell(out) -> str:
    return "timeout" if out is None else f"{out['first']:.3f}"


def _median_run(runs: int, *child, timeout: int, env=None) -> dict | None:
    """The child's result in the fresh process whose first step was the median of `runs` (None: one timed out)."""
    outs = [in_fresh_process(__file__, *child, timeout=timeout, env=env) for _ in range(runs)]
    if None in outs:
        return None
    return sorted(outs, key=lambda out: out["first"])[len(outs) // 2]


def section_gpt2(args) -> None:
    variants = (["thunderfn", "no-reuse", "warm"] + ["fusion", "fusion-warm", "fusion-no-reuse"] * args.fusion
                + ["torch.compile", "torch.compile-warm"] * args.torch_compile)
    print(f"\n## gpt2: Hugging Face GPT-2 (n_embd 64, 4 heads, vocab 256), batch {BATCH} x {TOKENS} tokens: the first "
          f"training step in a fresh process, seconds; steady step x eager (median of {args.rounds})\n")
    header = ["layers", "eager first"]
    for v in variants:
        header += [f"{GPT2_VARIANTS[v]} first", f"{GPT2_VARIANTS[v]} steady x eager"]
        if v in WARM:
            header.append(f"{GPT2_VARIANTS[v]} / cold first (CPU time)")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    cold = {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    for layers in args.layers:
        cells = [str(layers), _cell(_median_run(args.repeats, "gpt2", "eager", layers, args.rounds,
                                                timeout=args.timeout))]
        firsts = {}
        for v in variants:
            # (a cold compile with Inductor: none of its caches, which earlier runs of these graphs filled)
            env = cold if v in ("torch.compile", "fusion", "fusion-no-reuse") else None
            if v in WARM:  # thunderfn's entries (cache_dir), Inductor's and Triton's caches: written, then read
                caches = tempfile.mkdtemp(prefix="bench-warm-")
                env = {"THUNDERFN_CACHE_DIR": caches, "TORCHINDUCTOR_CACHE_DIR": os.path.join(caches, "inductor"),
                       "TRITON_CACHE_DIR": os.path.join(caches, "triton")}
                in_fresh_process(__file__, "gpt2", v, layers, 1, timeout=args.timeout, env=env)
            # (minutes each with fusion or torch.compile: those once)
            runs = 1 if v.startswith(("fusion", "torch.compile")) else args.repeats
            out = _median_run(runs, "gpt2", v, layers, args.rounds, timeout=args.timeout, env=env)
            if out is not None and out["loss_error"] > 1e-4:
                raise RuntimeError(f"{v} at {layers} layers: loss differs from eager's by {out['loss_error']:.2e}")
            steady = "timeout" if out is None else f"{out['step_ms'] / out['eager_ms']:.2f} ({out['step_ms']:.1f} ms)"
            cells += [_cell(out), steady]
            firsts[v] = out
            if v in WARM:
                cold_out = firsts.get(WARM[v])
                cells.append("" if None in (cold_out, out) else f"{out['first'] / cold_out['first']:.2f} "
                                                                 f"({out['first_cpu'] / cold_out['first_cpu']:.2f})")
        print("| " + " | ".join(cells) + " |", flush=True)


# -- the per-operation law ------------------------------------------------------------------------------
def chain(ops: int):
    """f(x, w): `ops` operations in a straight line (each pass a matmul, a tanh and an add), then a sum."""
    def f(x, w):
        for _ in range(ops // 3):
            x = torch.tanh(x @ w) + x
        return x.sum()
    return f


def _first_call(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def _per_op_child(transform: str, ops: int) -> dict:
    torch.manual_seed(0)
    x, w = torch.randn(CHAIN_SIZE, CHAIN_SIZE), torch.randn(CHAIN_SIZE, CHAIN_SIZE) / CHAIN_SIZE
    f = chain(ops)
    fn = tf.jit(f) if transform == "jit" else tf.jit(tf.grad(f))
    return {"first": _first_call(fn, x, w)}


def section_per_op(args) -> None:
    print("\n## per-op: the first call of a straight-line chain of N operations in a fresh process, ms per "
          "operation (seconds in all)\n")
    header = ["transform"] + [f"N = {n:,}" for n in args.ops] + [f"ms/op at {args.ops[-1]:,} / at {args.ops[0]:,}"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for transform, label in (("jit", "tf.jit(f)"), ("grad", "tf.jit(tf.grad(f))")):
        per_op, cells = {}, [label]
        for n in args.ops:
            out = in_fresh_process(__file__, "per-op", transform, n, timeout=args.timeout)
            if out is None:
                cells.append("timeout")
                continue
            per_op[n] = out["first"] * 1e3 / n
            cells.append(f"{per_op[n]:.3f} ({out['first']:.2f} s)")
        lo, hi = args.ops[0], args.ops[-1]
        cells.append(f"{per_op[hi] / per_op[lo]:.2f}" if lo in per_op and hi in per_op else "n/a")
        print("| " + " | ".join(cells) + " |", flush=True)


# -- a Python loop that tracing unrolls -------------------------------------------------------------------
def unrolled(x):
    for _ in range(UNROLLED_STEPS):
        x = torch.sin(x) * 1.01
    return x.sum()


def _unrolled_child() -> dict:
    x = torch.randn(16)
    return {"first": _first_call(tf.jit(tf.grad(unrolled)), x)}


def section_unrolled(args) -> None:
    out = in_fresh_process(__file__, "unrolled", timeout=args.timeout)
    print(f"\n## unrolled: the first call of tf.jit(tf.grad(f)), f a {UNROLLED_STEPS:,}-pass Python loop of "
          f"`x = torch.sin(x) * 1.01`, in a fresh process: {_cell(out)} s (target under 1.5 s)")


# -- what a fresh process pays once ----------------------------------------------------------------------
_IMPORT_TIME = ("import time; start = time.perf_counter(); import torch; middle = time.perf_counter(); "
                "import thunderfn; print(time.perf_counter() - middle)")


def _fresh_child() -> dict:
    import sys

    f = tf.jit(lambda x: x.sin() + 1)
    static = _first_call(f, torch.randn(4, 4))
    symbolic = _first_call(f, torch.randn(5, 4))
    if tf.cache_info(f)["misses"] != 2 or not tf.cache_info(f)["symbolic"]:
        raise RuntimeError(f"the second size did not compile symbolic: {tf.cache_info(f)}")
    return {"static": static, "symbolic": symbolic, "dynamo": "torch._dynamo" in sys.modules}


def section_fresh(args) -> None:
    import statistics
    import subprocess
    import sys

    imports = [float(subprocess.run([sys.executable, "-c", _IMPORT_TIME], capture_output=True, text=True,
                                    check=True).stdout) for _ in range(args.rounds)]
    runs = [in_fresh_process(__file__, "fresh", timeout=args.timeout) for _ in range(args.rounds)]
    runs = [r for r in runs if r is not None]
    print(f"\n## fresh: what a fresh process pays once, median of {args.rounds} processes (target: each first "
          f"compile under 1 s)\n")
    print("| import thunderfn (after torch) | first static compile | first symbolic compile | imported torch._dynamo |"
          "\n|---|---|---|---|")
    print(f"| {statistics.median(imports):.3f} s | {statistics.median(r['static'] for r in runs):.3f} s | "
          f"{statistics.median(r['symbolic'] for r in runs):.3f} s | {any(r['dynamo'] for r in runs)} |", flush=True)


SECTIONS = {"gpt2": section_gpt2, "per-op": section_per_op, "unrolled": section_unrolled, "fresh": section_fresh}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--layers", nargs="+", type=int, default=[2, 8, 32, 64])
    parser.add_argument("--ops", nargs="+", type=int, default=[100, 1_000, 10_000])
    parser.add_argument("--rounds", type=int, default=5, help="timed steady steps per variant (after two warm-ups)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="gpt2: fresh processes per variant, the median first step shown (fusion and "
                             "torch.compile: one)")
    parser.add_argument("--fusion", action="store_true", help="also tf.jit(model, fusion=True) (minutes)")
    parser.add_argument("--torch-compile", action="store_true", help="also torch.compile(model), cold (minutes)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per fresh process")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child:
        kind, *rest = args.child
        if kind == "gpt2":
            out = _gpt2_child(rest[0], int(rest[1]), int(rest[2]))
        elif kind == "per-op":
            out = _per_op_child(rest[0], int(rest[1]))
        elif kind == "fresh":
            out = _fresh_child()
        else:
            out = _unrolled_child()
        print(json.dumps(out))
        return
    print(f"torch {torch.__version__}, 1 thread, {os.cpu_count()} CPU cores")
    for name in args.sections:
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
