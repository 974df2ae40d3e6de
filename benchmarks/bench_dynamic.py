"""Training on batches of varying length: compiles, first pass and steady steps, eager vs tf.jit vs torch.compile.

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
from bench_models import _LLAMA_LIKE, _without_dropout  # noqa: E402  (a sibling script, not a package)

import thunderfn as tf  # noqa: E402
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(CONFIGS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--lengths", type=int, default=16, help="how many distinct sequence lengths (in [8, 128])")
    parser.add_argument("--no-compile", action="store_true", help="leave out the variants that run Inductor or Dynamo")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 lengths, no Inductor or Dynamo")
    args = parser.parse_args(argv)
    missing = why_unavailable("transformers")
    if missing:
        sys.exit(f"transformers is not available: {missing}")
    n_lengths = 3 if args.quick else args.lengths
    variants = [v for v in args.variants if not ((args.no_compile or args.quick) and v in COMPILING)]
    lengths = random.Random(0).sample(range(8, 129), n_lengths)
    print(f"{n_lengths} lengths in [8, 128], batch {BATCH}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"| model | variant | compiles | first pass (s) | steady step (ms) | vs eager | loss error |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        for r in run(name, variants, lengths):
            print(f"| {r['model']} | {r['variant']} | {'-' if r['compiles'] is None else r['compiles']} | "
                  f"{r['first_s']:.1f} | {r['steady_ms']:.2f} | {r['ratio']:.2f}x | {r['loss_error']:.1e} |")


if __name__ == "__main__":
    main()
