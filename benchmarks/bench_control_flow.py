"""Loops and checkpointing: tf.scan, tf.while_loop and tf.checkpoint beside eager and torch.compile, in one run.

    python benchmarks/bench_control_flow.py                    # every section (about five minutes on 2 cores)
    python benchmarks/bench_control_flow.py --sections checkpoint --rounds 5    # fewer timing rounds (default 15)

Sections:
- scan-first-call: the first call of `tf.jit(tf.grad(loss))` of an RNN (h = tanh(h @ W + x @ U)) over 10 to
  10,000 steps, each in a fresh process (imports excluded, tracing, compiling and running included), and that
  less the second call (the compile's own cost): written with tf.scan, and written as a Python loop (which
  tracing unrolls; up to 1,000 steps), beside eager's first step (forward and torch.autograd's backward) and
  torch.compile's of the Python loop (which Dynamo unrolls; up to 100 steps);
- scan-step: the median time of a 1,000-step RNN's forward and of a training step (forward and backward):
  tf.jit of tf.scan against an eager Python loop and against a Python loop of a torch.compile-d cell;
- while-loop: a loop whose trip count depends on the data (halve x while its norm exceeds 1) called on inputs
  that take 4 to 120 steps: how many compiles tf.jit of tf.while_loop makes (tf.cache_info misses) and how many
  graphs torch.compile compiles for the Python loop (Dynamo's unique_graphs), with each call's mean time;
- checkpoint: an 8-layer MLP (Linear 512 -> GELU per layer, batch 256) with each layer checkpointed: bytes
  kept for the backward (the distinct tensors torch.autograd.graph.saved_tensors_hooks sees packed, besides the
  parameters and the input, which are alive anyway), the median training step, and the first call in a fresh
  process, for eager, eager torch.utils.checkpoint, tf.jit without and with tf.checkpoint under three policies
  and with torch.utils.checkpoint, torch.compile without and with torch.utils.checkpoint. Every variant's
  gradients are checked against eager's.

Benchmarks are not tests: nothing here asserts a time. Timings on a shared machine are noisy: compare
variants within one run.
"""
from __future__ import annotations

import argparse
import functools
import json
import time

import torch
import torch.utils.checkpoint as torch_checkpoint

import thunderfn as tf
from harness import in_fresh_process, interleaved  # (a sibling script: run from benchmarks/ or the repo root)
from thunderfn.testing.training import saved_bytes

WIDTH, BATCH = 16, 4  # the RNN: small, so that the cost per step, not the arithmetic, is measured
MLP_WIDTH, MLP_BATCH, MLP_LAYERS = 512, 256, 8


# -- the RNN -------------------------------------------------------------------------------------------
def rnn_inputs(steps: int):
    torch.manual_seed(0)
    return (torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5, torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5,
            torch.randn(steps, BATCH, WIDTH))


def rnn_scan(w, u, xs):
    def cell(h, x):
        h = torch.tanh(h @ w + x @ u)
        return h, h
    _, hs = tf.scan(cell, torch.zeros(BATCH, WIDTH), xs)
    return hs.square().mean()


def rnn_loop(w, u, xs):
    h, hs = torch.zeros(BATCH, WIDTH), []
    for x in xs:
        h = torch.tanh(h @ w + x @ u)
        hs.append(h)
    return torch.stack(hs).square().mean()


def _first_call(variant: str, steps: int) -> tuple[float, float]:
    """Run in a fresh process: the seconds of the first call of one variant, and of its second."""
    w, u, xs = rnn_inputs(steps)
    if variant in ("eager", "torch.compile"):
        w.requires_grad_(), u.requires_grad_()
        fn = torch.compile(rnn_loop) if variant == "torch.compile" else rnn_loop

        def step():
            return torch.autograd.grad(fn(w, u, xs), (w, u))
    else:
        step = functools.partial(tf.jit(tf.grad(rnn_scan if variant == "tf.scan" else rnn_loop, argnums=(0, 1))),
                                 w, u, xs)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times[0], times[1]


def scan_first_call(args) -> None:
    print("\n## scan-first-call: the first call of the RNN's gradient in a fresh process, seconds (and the first "
          "call less the second: what compiling took)\n")
    limits = {"tf.scan": 10_000, "Python loop (unrolled)": 1_000, "eager": 10_000, "torch.compile": 100}
    steps_list = [10, 100, 1_000, 10_000]
    print("| variant | " + " | ".join(f"{n:,} steps" for n in steps_list) + " |")
    print("|---|" + "---|" * len(steps_list))
    for variant, limit in limits.items():
        cells = []
        for steps in steps_list:
            if steps > limit:
                cells.append("not run")
                continue
            out = in_fresh_process(__file__, "first-call", variant, steps)
            cells.append("timeout" if out is None else f"{out['first']:.2f} ({out['first'] - out['second']:.2f})")
        print(f"| {variant} | " + " | ".join(cells) + " |")
    print("\n(not run: tracing unrolls the Python loop, 1,000 steps take seconds and 10,000 over a minute; "
          "Dynamo unrolls it likewise)")


# -- timing ---------------------------------------------------------------------------------------------
def scan_step(args) -> None:
    steps = 1_000
    w, u, xs = rnn_inputs(steps)
    wg, ug = w.clone().requires_grad_(), u.clone().requires_grad_()

    @torch.compile
    def compiled_cell(h, x, w_, u_):
        return torch.tanh(h @ w_ + x @ u_)

    def compiled_loop(w_, u_, xs_):
        h, hs = torch.zeros(BATCH, WIDTH), []
        for x in xs_:
            h = compiled_cell(h, x, w_, u_)
            hs.append(h)
        return torch.stack(hs).square().mean()

    forward = tf.jit(rnn_scan)
    torch.testing.assert_close(forward(w, u, xs), rnn_loop(w, u, xs))
    with torch.no_grad():
        fwd = interleaved({"eager Python loop": lambda: rnn_loop(w, u, xs),
                           "tf.jit(tf.scan)": lambda: forward(w, u, xs),
                           "torch.compile-d cell in a loop": lambda: compiled_loop(w, u, xs)}, args.rounds, 5)
    train = tf.jit(tf.grad(rnn_scan, argnums=(0, 1)))
    torch.testing.assert_close(train(w, u, xs), torch.autograd.grad(rnn_loop(wg, ug, xs), (wg, ug)))
    step = interleaved({"eager Python loop": lambda: rnn_loop(wg, ug, xs).backward(),
                        "tf.jit(tf.scan)": lambda: train(w, u, xs),
                        "torch.compile-d cell in a loop": lambda: compiled_loop(wg, ug, xs).backward()},
                       args.rounds, 2)
    print(f"\n## scan-step: a {steps:,}-step RNN (width {WIDTH}, batch {BATCH}), median ms\n")
    print("| variant | forward | x eager | forward and backward | x eager |\n|---|---|---|---|---|")
    for name in fwd:
        print(f"| {name} | {fwd[name]:.1f} | {fwd[name] / fwd['eager Python loop']:.2f} | {step[name]:.1f} | "
              f"{step[name] / step['eager Python loop']:.2f} |")


# -- while_loop -------------------------------------------------------------------------------------------
def halve_loop(x):
    while x.norm() > 1:
        x = x * 0.5
    return x


def halve_while(x):
    return tf.while_loop(lambda x: x.norm() > 1, lambda x: x * 0.5, x)


def while_loop(args) -> None:
    import torch._dynamo  # noqa: PLC0415  (only this section needs Dynamo's counters)
    from torch._dynamo.utils import counters  # noqa: PLC0415

    scales = [2.0 ** k for k in (4, 40, 120)]  # (float32 reaches 2 ** 127)
    inputs = [torch.full((8,), s) for s in scales]
    jitted = tf.jit(halve_while)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(halve_loop, backend="eager")  # graph counts do not depend on the backend
    rows = []
    for x in inputs:
        expected = halve_loop(x)
        times = {}
        for name, fn in (("tf.jit(tf.while_loop)", jitted), ("torch.compile(Python loop)", compiled)):
            start = time.perf_counter()
            torch.testing.assert_close(fn(x), expected)
            times[name] = (time.perf_counter() - start) * 1e3
        trips = int(torch.log2(x[0] / expected[0]).round())
        rows.append((trips, times, tf.cache_info(jitted)["misses"], counters["stats"]["unique_graphs"]))
    print("\n## while-loop: a data-dependent trip count; compiles so far and this call's ms (first calls)\n")
    print("| trips | tf.jit compiles | tf.jit ms | torch.compile graphs | torch.compile ms |\n|---|---|---|---|---|")
    for trips, times, misses, graphs in rows:
        print(f"| {trips} | {misses} | {times['tf.jit(tf.while_loop)']:.1f} | {graphs} | "
              f"{times['torch.compile(Python loop)']:.1f} |")


# -- checkpoint ---------------------------------------------------------------------------------------------
def mlp():
    torch.manual_seed(0)
    return torch.nn.ModuleList([torch.nn.Linear(MLP_WIDTH, MLP_WIDTH) for _ in range(MLP_LAYERS)])


def block(lin, h):
    return torch.nn.functional.gelu(lin(h))


def loss_function(layers, how: str, policy=None):
    def loss(h):
        for lin in layers:
            if how == "tf.checkpoint":
                h = tf.checkpoint(block, policy=policy)(lin, h)
            elif how == "torch.utils.checkpoint":
                h = torch_checkpoint.checkpoint(block, lin, h, use_reentrant=False)
            else:
                h = block(lin, h)
        return h.square().mean()
    return loss


CHECKPOINT_VARIANTS = {  # name -> (compiler, how layers are checkpointed, policy name)
    "eager": (None, "plain", None),
    "eager, torch.utils.checkpoint": (None, "torch.utils.checkpoint", None),
    "tf.jit": ("tf.jit", "plain", None),
    "tf.jit, tf.checkpoint nothing_saveable": ("tf.jit", "tf.checkpoint", "nothing_saveable"),
    "tf.jit, tf.checkpoint dots_saveable": ("tf.jit", "tf.checkpoint", "dots_saveable"),
    "tf.jit, tf.checkpoint everything_saveable": ("tf.jit", "tf.checkpoint", "everything_saveable"),
    "tf.jit, torch.utils.checkpoint": ("tf.jit", "torch.utils.checkpoint", None),
    "torch.compile": ("torch.compile", "plain", None),
    "torch.compile, torch.utils.checkpoint": ("torch.compile", "torch.utils.checkpoint", None),
}


def checkpoint_variant(name: str):
    compiler, how, policy = CHECKPOINT_VARIANTS[name]
    layers = mlp()
    loss = loss_function(layers, how, getattr(tf.checkpoint_policies, policy) if policy else None)
    compiled = tf.jit(loss) if compiler == "tf.jit" else torch.compile(loss) if compiler == "torch.compile" else loss
    return layers, compiled


def mlp_input():
    torch.manual_seed(1)
    return torch.randn(MLP_BATCH, MLP_WIDTH)


def _checkpoint_first_call(name: str) -> float:
    layers, fn = checkpoint_variant(name)
    x = mlp_input()
    start = time.perf_counter()
    fn(x).backward()
    return time.perf_counter() - start


def checkpoint(args) -> None:
    x = mlp_input()
    built = {name: checkpoint_variant(name) for name in CHECKPOINT_VARIANTS}
    reference = None
    rows = {}
    for name, (layers, fn) in built.items():
        excluded = {p.data_ptr() for p in layers.parameters()} | {x.data_ptr()}
        layers.zero_grad()
        nbytes = saved_bytes(fn, x, excluded=excluded)
        grads = [p.grad.clone() for p in layers.parameters()]
        if reference is None:
            reference = grads
        error = max((g - r).abs().max().item() for g, r in zip(grads, reference))
        rows[name] = {"saved": nbytes, "error": error}

    def training_step(layers, fn):
        def run():
            layers.zero_grad(set_to_none=True)
            fn(x).backward()
        return run

    times = interleaved({name: training_step(*built[name]) for name in built}, args.rounds, 2)
    for name in built:
        out = in_fresh_process(__file__, "checkpoint-first-call", name)
        rows[name]["first"] = None if out is None else out["seconds"]
    print(f"\n## checkpoint: {MLP_LAYERS}-layer MLP (Linear {MLP_WIDTH} -> GELU, batch {MLP_BATCH}), each layer "
          f"checkpointed\n")
    print("| variant | saved MiB | x eager checkpoint | step ms | x eager | first call s | gradient error |")
    print("|---|---|---|---|---|---|---|")
    base_saved, base_time = rows["eager, torch.utils.checkpoint"]["saved"], times["eager"]
    for name, row in rows.items():
        first = "timeout" if row["first"] is None else f"{row['first']:.2f}"
        print(f"| {name} | {row['saved'] / 2 ** 20:.2f} | {row['saved'] / base_saved:.2f} | {times[name]:.1f} | "
              f"{times[name] / base_time:.2f} | {first} | {row['error']:.1e} |")


SECTIONS = {"scan-first-call": scan_first_call, "scan-step": scan_step, "while-loop": while_loop,
            "checkpoint": checkpoint}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.child:
        kind, *rest = args.child
        if kind == "first-call":
            first, second = _first_call(rest[0], int(rest[1]))
            print(json.dumps({"first": first, "second": second}))
        else:
            print(json.dumps({"seconds": _checkpoint_first_call(rest[0])}))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.sections:
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
