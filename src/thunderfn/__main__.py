"""`python -m thunderfn`: jit a small GPT-style model and show what thunderfn did.

Checks the jitted outputs against eager PyTorch (exit status 1 if they disagree),
prints the execution trace (the Python that actually runs), and times eager and
jitted calls. The model is `thunderfn.examples.gpt`, shared with the benchmarks.

`python -m thunderfn --model gpt2-tiny` trains instead: the same model in GPT-2's
layout (more layers and heads, still tiny), eagerly and as `tf.jit(model)`, side by
side with AdamW, printing each step's loss and time for both (exit status 1 if the
losses part).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import thunderfn as tf
from thunderfn.examples.gpt import GPTConfig, make_example

# float32 results of the same ops in a different order (e.g. a decomposed layer_norm)
# differ by a few ulps; anything beyond this is a wrong answer.
ATOL = 1e-5
RTOL = 1e-5
# Training: losses of the same steps computed in a different order drift by float32 rounding.
LOSS_RTOL = 1e-4
# The embedded model in the sizes --model names.
TRAINING_CONFIGS = {
    "gpt-tiny": GPTConfig(),
    "gpt2-tiny": GPTConfig(vocab_size=256, block_size=64, n_embd=128, n_head=4, n_layer=4, batch_size=8),
}
# A trace up to this long is printed whole; a longer one is cut to TRACE_HEAD lines.
TRACE_MAX_LINES = 150
TRACE_HEAD = 120


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m thunderfn", description=__doc__.splitlines()[0])
    parser.add_argument("--full-trace", action="store_true", help="print the whole execution trace, however long")
    parser.add_argument("--calls", type=int, default=50, help="timed calls per function (default: 50)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the model's weights and inputs (default: 0)")
    parser.add_argument("--model", choices=sorted(TRAINING_CONFIGS),
                        help="train this embedded model eagerly and under tf.jit, step by step, instead")
    parser.add_argument("--steps", type=int, default=10, help="training steps with --model (default: 10)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a busy small machine a second thread turns "
                             "other processes' load into large, erratic slowdowns)")
    return parser.parse_args(argv)


def time_calls(fns, args, calls: int, warmup: int = 5) -> list[float]:
    """Median wall time of one call of each fn, in microseconds. Calls alternate
    between the fns, so a burst of background load slows all of them alike."""
    for _ in range(warmup):
        for fn in fns:
            fn(*args)
    samples = [[] for _ in fns]
    for _ in range(calls):
        for fn, fn_samples in zip(fns, samples):
            start = time.perf_counter_ns()
            fn(*args)
            fn_samples.append(time.perf_counter_ns() - start)
    return [statistics.median(fn_samples) / 1e3 for fn_samples in samples]


def max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def print_trace(trace, full: bool) -> None:
    lines = str(trace).splitlines()
    if full or len(lines) <= TRACE_MAX_LINES:
        print("\n".join(lines))
        return
    print("\n".join(lines[:TRACE_HEAD]))
    print(f"... ({len(lines) - TRACE_HEAD} more lines; run with --full-trace to see all {len(lines)})")


def main(argv=None) -> int:
    options = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(options.threads)
    try:
        return train_demo(options) if options.model else run_demo(options)
    finally:  # main() is also called in-process (by the tests): leave torch as we found it
        torch.set_num_threads(threads)


def run_demo(options) -> int:
    config = GPTConfig()
    model, idx, targets = make_example(config, seed=options.seed)

    # jit a function that calls the model rather than the model itself (tf.jit(model) works
    # too) so that the printed trace names its inputs after these parameters.
    def gpt_forward(idx, targets):
        return model(idx, targets)

    jitted = tf.jit(gpt_forward)
    print(f"thunderfn {tf.__version__}, torch {torch.__version__}, intra-op threads: {torch.get_num_threads()}")
    print(f"model: thunderfn.examples.gpt.GPT {config}, eval mode, no_grad\n")

    with torch.no_grad():
        eager_logits, eager_loss = model(idx, targets)
        start = time.perf_counter_ns()
        jit_logits, jit_loss = jitted(idx, targets)
        first_call_ms = (time.perf_counter_ns() - start) / 1e6

        logits_diff = max_abs_difference(eager_logits, jit_logits)
        loss_diff = max_abs_difference(eager_loss, jit_loss)
        agree = (torch.allclose(jit_logits, eager_logits, atol=ATOL, rtol=RTOL)
                 and torch.allclose(jit_loss, eager_loss, atol=ATOL, rtol=RTOL))
        print("== eager vs jitted ==")
        print(f"loss: eager {eager_loss.item():.6f}, jitted {jit_loss.item():.6f}")
        print(f"max abs difference: logits {logits_diff:.3e}, loss {loss_diff:.3e}")
        verdict = "PASS" if agree else "FAIL"
        print(f"{verdict}: jitted outputs {'match' if agree else 'do NOT match'} eager "
              f"(atol={ATOL:g}, rtol={RTOL:g})\n")

        traces = tf.last_traces(jitted)
        print("== execution trace: tf.last_traces(jitted)[-1] ==")
        print_trace(traces[-1], options.full_trace)

        eager_us, jit_us = time_calls([model, jitted], (idx, targets), options.calls)

    print(f"\n== timings (median of {options.calls} calls each after 5 warmup calls, eager and jitted alternating) ==")
    print(f"eager:  {eager_us:10.1f} us per call")
    print(f"jitted: {jit_us:10.1f} us per call ({jit_us / eager_us:.2f}x eager's time, lower is faster)")
    print(f"first jitted call: {first_call_ms:.1f} ms (trace, passes, code generation, one run); its stages:")
    for trace in traces:
        print(f"  {str(trace).splitlines()[0].lstrip('# ')}")
    return 0 if agree else 1


def train_demo(options) -> int:
    """Train the embedded model eagerly and under tf.jit, one step each in turn, from the same
    weights, on the same batches; print each step's losses and times."""
    config = TRAINING_CONFIGS[options.model]
    eager_model, idx, targets = make_example(config, seed=options.seed)
    jit_model = make_example(config, seed=options.seed)[0]
    eager_model.train()
    jit_model.train()
    jitted = tf.jit(jit_model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager_model, jit_model)]
    targets = torch.roll(idx, -1, dims=1)  # one batch, seen every step: learn its next tokens
    n_params = sum(p.numel() for p in eager_model.parameters())
    print(f"thunderfn {tf.__version__}, torch {torch.__version__}, intra-op threads: {torch.get_num_threads()}")
    print(f"training {options.model}: thunderfn.examples.gpt.GPT {config}, {n_params} parameters, AdamW lr 1e-3\n")
    print(f"{'step':>4}  {'eager loss':>10}  {'jit loss':>10}  {'eager ms':>9}  {'jit ms':>9}")
    agree, times = True, [[], []]
    for step in range(options.steps):
        losses = []
        for fn, optimizer, spent in zip((eager_model, jitted), optimizers, times):
            start = time.perf_counter_ns()
            loss = fn(idx, targets)[1]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            spent.append((time.perf_counter_ns() - start) / 1e6)
            losses.append(loss.item())
        agree &= abs(losses[0] - losses[1]) <= LOSS_RTOL * abs(losses[0])
        print(f"{step:>4}  {losses[0]:>10.5f}  {losses[1]:>10.5f}  {times[0][-1]:>9.2f}  {times[1][-1]:>9.2f}"
              + ("   (jit: trace and compile)" if step == 0 else ""))
    if options.steps > 1:
        eager_ms, jit_ms = (statistics.median(t[1:]) for t in times)
        print(f"\nmedian step after the first: eager {eager_ms:.2f} ms, jit {jit_ms:.2f} ms "
              f"({jit_ms / eager_ms:.2f}x eager's time, lower is faster)")
    print(f"{'PASS' if agree else 'FAIL'}: the jitted model's losses {'follow' if agree else 'do NOT follow'} eager's "
          f"(rtol={LOSS_RTOL:g})")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
