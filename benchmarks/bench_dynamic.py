"""Varying lengths: compile counts against torch.compile's, and training on batches of varying length.

First, compile counts on the same calls, measured in one run: the small decoder of thunderfn/examples/decoder.py
(positions sliced by a length read from a shape, a causal mask built from it, nn.MultiheadAttention, cross-entropy
over B*T rows) over 12 lengths, in eval and in training, and testing/strategies.py's size-reading programs over a
sequence of lengths. thunderfn's count is tf.cache_info's misses (compiles), torch.compile's the graphs Dynamo
compiled (counters["stats"]["unique_graphs"], with the "eager" backend: the count does not depend on the backend,
and Inductor would only add time). Every result is checked against eager's.

    python benchmarks/bench_dynamic.py --counts-only         # the compile-count table alone (a minute)

Each variant trains a tiny Hugging Face causal LM (GPT-2, Llama) for one pass over a schedule of
sequence lengths (every step a new length: the first pass pays each variant's compiles), then a second
pass over the same lengths (everything compiled: steady steps). Printed per model and variant:

- compiles: tf.jit's compiled entries (tf.cache_info misses), or the graphs Dynamo compiled;
- first pass: the wall time of the first pass, compiles included;
- steady: the median step of the second pass, and its ratio to eager's (below 1 is faster);
- loss error: the largest |loss - eager's loss| over the schedule (the same weights for every variant).

    python benchmarks/bench_dynamic.py                       # gpt2 and llama, 16 lengths in [8, 128]
    python benchmarks/bench_dynamic.py --models hf-gpt2 --lengths 8 --quick

Timings on a shared machine are noisy: compare variants within one run.
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import thunderfn as tf  # noqa: E402
from bench_models import _LLAMA_LIKE, _without_dropout  # noqa: E402  (a sibling script, not a package)
from thunderfn.testing.optional_libraries import import_torchvision, why_unavailable  # noqa: E402

BATCH = 4
CONFIGS = {
    "hf-gpt2": ("GPT2Config", dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=512)),
    "hf-llama": ("LlamaConfig", dict(_LLAMA_LIKE, max_position_embeddings=512)),
}


def _torch_compile_dynamic(model):
    return torch.compile(model, dynamic=True)


VARIANTS = {
    "eager": lambda model: model,
    "thunderfn": tf.jit,  # dynamic=None: a changed length compiles once more as symbolic
    "thunderfn dynamic=False": lambda model: tf.jit(model, dynamic=False, cache_size_limit=1000),
    "thunderfn+fusion": lambda model: tf.jit(model, fusion=True),
    "torch.compile": torch.compile,  # automatic dynamic shapes: the same rule
    "torch.compile dynamic=True": _torch_compile_dynamic,
}
COMPILING = ("thunderfn+fusion", "torch.compile", "torch.compile dynamic=True")


def build(name: str) -> torch.nn.Module:
    import_torchvision()
    import transformers
    config_name, fields = CONFIGS[name]
    config = _without_dropout(getattr(transformers, config_name)(**fields))
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def train_pass(model, compiled, batches) -> tuple[list, list]:
    losses, times = [], []
    for ids in batches:
        for p in model.parameters():
            p.grad = None
        start = time.perf_counter()
        loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return losses, times


def compiles(variant: str, compiled) -> int | None:
    if variant.startswith("thunderfn"):
        return tf.cache_info(compiled)["misses"]
    if variant.startswith("torch.compile"):
        return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return None


def run(name: str, variants: list[str], lengths: list[int]) -> list[dict]:
    base = build(name)
    vocab = base.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (BATCH, n), generator=generator) for n in lengths]
    rows, reference = [], None
    for variant in variants:
        model = copy.deepcopy(base)
        if variant.startswith("torch.compile"):
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
        compiled = VARIANTS[variant](model)
        start = time.perf_counter()
        losses, _ = train_pass(model, compiled, batches)
        first = time.perf_counter() - start
        _, times = train_pass(model, compiled, batches)
        if reference is None:
            reference = losses
        rows.append(dict(model=name, variant=variant, compiles=compiles(variant, compiled), first_s=first,
                         steady_ms=statistics.median(times) * 1e3,
                         loss_error=max(abs(a - b) for a, b in zip(losses, reference))))
    eager = next((r["steady_ms"] for r in rows if r["variant"] == "eager"), None)
    for r in rows:
        r["ratio"] = r["steady_ms"] / eager if eager else float("nan")
    return rows


def _count_compiles(variant: str, fn, calls) -> int:
    """Run fn's calls (each (args, check)) under a variant; the number of compiles (thunderfn) or graphs (Dynamo)."""
    if variant.startswith("torch.compile"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(fn, backend="eager", dynamic=True if "True" in variant else None)
    else:
        compiled = tf.jit(fn, dynamic=True if "True" in variant else None)
    for args, check in calls:
        check(compiled(*args), fn(*args))
    return compiles(variant, compiled)


COUNT_VARIANTS = ("thunderfn", "thunderfn dynamic=True", "torch.compile", "torch.compile dynamic=True")


def _close(got, expected):
    assert got.shape == expected.shape, (got.shape, expected.shape)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def count_rows() -> list[dict]:
    from thunderfn.examples.decoder import DECODER_LENGTHS, Decoder
    from thunderfn.testing.strategies import SIZE_READING_PROGRAMS

    workloads = {}
    for training in (False, True):
        torch.manual_seed(0)
        model = Decoder().train(training)
        g = torch.Generator().manual_seed(0)
        batches = [(torch.randint(0, 50, (2, n), generator=g), torch.randint(0, 50, (2, n), generator=g))
                   for n in DECODER_LENGTHS]
        if training:
            def step(idx, targets, model=model):
                return model(idx, targets)
            calls = [((idx, t), _close) for idx, t in batches]
        else:
            def step(idx, model=model):
                with torch.no_grad():
                    return model(idx)
            calls = [((idx,), _close) for idx, _ in batches]
        workloads[f"decoder ({'training' if training else 'eval'}), 12 lengths"] = (step, calls)
    lengths = (5, 1, 3, 7, 16, 2, 33, 0, 4, 1)
    for name, program in sorted(SIZE_READING_PROGRAMS.items()):
        g = torch.Generator().manual_seed(0)
        calls = [((torch.randn(2, n, 4, dtype=torch.float64, generator=g),
                   torch.randn(lengths[k - 1] if k else n, 4, dtype=torch.float64, generator=g)), _close)
                 for k, n in enumerate(lengths)]
        workloads[f"{name}, {len(lengths)} lengths"] = (program, calls)
    rows = []
    for workload, (fn, calls) in workloads.items():
        row = dict(workload=workload)
        for variant in COUNT_VARIANTS:
            try:
                row[variant] = _count_compiles(variant, fn, calls)
            except Exception as e:  # noqa: BLE001 (a benchmark reports what failed and goes on)
                row[variant] = f"error: {type(e).__name__}"
        rows.append(row)
    return rows


def print_counts() -> None:
    print("| workload | " + " | ".join(COUNT_VARIANTS) + " |")
    print("|---" * (len(COUNT_VARIANTS) + 1) + "|")
    for row in count_rows():
        print(f"| {row['workload']} | " + " | ".join(str(row[v]) for v in COUNT_VARIANTS) + " |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(CONFIGS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--lengths", type=int, default=16, help="how many distinct sequence lengths (in [8, 128])")
    parser.add_argument("--no-compile", action="store_true", help="leave out the variants that run Inductor or Dynamo")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 lengths, no Inductor or Dynamo")
    parser.add_argument("--counts-only", action="store_true", help="the compile-count table alone")
    args = parser.parse_args(argv)
    import warnings
    warnings.simplefilter("ignore")  # (cache-limit warnings: the counts say it)
    print_counts()
    if args.counts_only:
        return
    missing = why_unavailable("transformers")
    if missing:
        sys.exit(f"transformers is not available: {missing}")
    n_lengths = 3 if args.quick else args.lengths
    variants = [v for v in args.variants if not ((args.no_compile or args.quick) and v in COMPILING)]
    lengths = random.Random(0).sample(range(8, 129), n_lengths)
    print(f"{n_lengths} lengths in [8, 128], batch {BATCH}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| model | variant | compiles | first pass (s) | steady step (ms) | vs eager | loss error |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        for r in run(name, variants, lengths):
            print(f"| {r['model']} | {r['variant']} | {'-' if r['compiles'] is None else r['compiles']} | "
                  f"{r['first_s']:.1f} | {r['steady_ms']:.2f} | {r['ratio']:.2f}x | {r['loss_error']:.1e} |")


if __name__ == "__main__":
    main()
