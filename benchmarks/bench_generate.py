"""Per-token decode time of Hugging Face's greedy generate: eager, tf.jit, tf.jit with fusion and
torch.compile, on small random GPT-2 and Llama configurations (nothing downloaded).

    python benchmarks/bench_generate.py                      # both models, every variant
    python benchmarks/bench_generate.py --quick              # a smoke run: tiny configs, 8 tokens, eager and tf.jit
    python benchmarks/bench_generate.py --models llama --variants eager thunderfn torch.compile-static

Variants:
- eager: `model.generate(ids, max_new_tokens=N, do_sample=False)`.
- thunderfn, thunderfn-fusion: `tf.jit(model).generate(...)`, `tf.jit(model, fusion=True).generate(...)`:
  Hugging Face's loop with every forward through the jitted one (the default DynamicCache; its
  length is symbolic after one recompile).
- torch.compile-dynamic: `model.forward = torch.compile(model.forward, dynamic=True)` with the default
  DynamicCache (`torch.compile(model).generate` would run the original forward: generate is the
  module's method, and the compiled wrapper only compiles `__call__`).
- torch.compile-static: Hugging Face's recommended way for torch.compile: `cache_implementation="static"`
  (preallocated, written in place) with `model.forward = torch.compile(model.forward)`.

A decode step's time is the time between two consecutive calls of a LogitsProcessor (one forward plus
the loop's own work); per variant the median over the decode steps of `--rounds` timed generates,
after one warm-up generate (which compiles). Rounds are interleaved across variants. Tokens are
checked against eager's (`ok` or `DIFF`). One torch thread. Benchmarks are not tests: nothing here
asserts a time, and on a shared machine the times are noisy.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import thunderfn as tf
from thunderfn.testing.optional_libraries import import_torchvision, why_unavailable

VARIANTS = ("eager", "thunderfn", "thunderfn-fusion", "torch.compile-dynamic", "torch.compile-static")
QUICK_VARIANTS = ("eager", "thunderfn")


def _configs(quick: bool) -> dict:
    import_torchvision()  # made importable first: transformers imports it where installed
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    layers, width = (2, 32) if quick else (4, 256)
    return {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=layers, n_head=4, n_embd=width, vocab_size=1000, n_positions=512)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, hidden_size=width,
            intermediate_size=2 * width, vocab_size=1000, max_position_embeddings=512)),
    }


class _StepClock:
    """A LogitsProcessor (duck-typed: generate calls it with (input_ids, scores)) that stamps each step."""

    def __init__(self):
        self.stamps = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores

    def decode_times(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:])]


def _variant(name: str, model):
    """(generate function, extra generate options, the jitted module or None) for a variant."""
    if name == "eager":
        return model.generate, {}, None
    if name in ("thunderfn", "thunderfn-fusion"):
        jitted = tf.jit(model, fusion=name == "thunderfn-fusion")
        return jitted.generate, {}, jitted
    compiled = copy.deepcopy(model)
    if name == "torch.compile-dynamic":
        compiled.forward = torch.compile(compiled.forward, dynamic=True)
        return compiled.generate, {}, None
    if name == "torch.compile-static":
        compiled.forward = torch.compile(compiled.forward)
        return compiled.generate, {"cache_implementation": "static"}, None
    raise ValueError(f"unknown variant {name!r}; known: {VARIANTS}")


def _generate(generate, options, ids, tokens):
    clock = _StepClock()
    # (a list, not transformers.LogitsProcessorList: generate wraps any list it is given)
    out = generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0, logits_processor=[clock],
                   **options)
    return out, clock.decode_times()


def bench_model(make, variants, tokens: int, rounds: int, prompt: int) -> list[dict]:
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(3, model.config.vocab_size, (1, prompt))
    want = model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
    rows = {}
    for name in variants:
        row = rows[name] = {"variant": name, "times": []}
        try:
            row["generate"], row["options"], row["jitted"] = _variant(name, model)
            start = time.perf_counter()
            out, _ = _generate(row["generate"], row["options"], ids, tokens)  # warm-up: compiles
            row["first_s"] = time.perf_counter() - start
            row["ok"] = "ok" if torch.equal(out, want) else "DIFF"
        except Exception as e:  # a variant that fails is reported, the others still run
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    for _ in range(rounds):
        for row in rows.values():
            if "error" not in row:
                row["times"] += _generate(row["generate"], row["options"], ids, tokens)[1]
    for row in rows.values():
        if row.get("jitted") is not None:
            row["entries"] = tf.cache_info(row["jitted"])["entries"]
        if row["times"]:
            row["ms"] = 1e3 * statistics.median(row["times"])
    return list(rows.values())


def print_table(model_name: str, rows: list[dict]) -> None:
    eager = next((r.get("ms") for r in rows if r["variant"] == "eager"), None)
    print(f"\n{model_name}")
    print(f"  {'variant':<24}{'tokens':>7}{'first generate':>16}{'ms/token':>10}{'vs eager':>10}{'entries':>9}")
    for r in rows:
        if "error" in r:
            print(f"  {r['variant']:<24}{'':>7}  {r['error']}")
            continue
        ratio = f"{r['ms'] / eager:.2f}x" if eager else ""
        entries = str(r.get("entries", ""))
        print(f"  {r['variant']:<24}{r['ok']:>7}{r['first_s']:>15.1f}s{r['ms']:>10.2f}{ratio:>10}{entries:>9}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    parser.add_argument("--variants", nargs="+", default=None, choices=VARIANTS)
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per generate (32; --quick: 8)")
    parser.add_argument("--rounds", type=int, default=None, help="timed generates per variant (3; --quick: 1)")
    parser.add_argument("--prompt", type=int, default=16, help="prompt length")
    parser.add_argument("--quick", action="store_true", help="tiny configs, 8 tokens, 1 round, eager and tf.jit")
    args = parser.parse_args(argv)
    why = why_unavailable("transformers")
    if why is not None:
        raise SystemExit(f"bench_generate needs transformers: {why}")
    torch.set_num_threads(1)  # steadier on a shared machine; every variant alike
    variants = args.variants or (QUICK_VARIANTS if args.quick else VARIANTS)
    tokens = args.tokens or (8 if args.quick else 32)
    rounds = args.rounds or (1 if args.quick else 3)
    configs = _configs(args.quick)
    print(f"greedy generate, prompt {args.prompt}, {tokens} new tokens, median decode step over {rounds} round(s), "
          f"torch {torch.__version__}, 1 thread, CPU")
    for name in args.models:
        print_table(name, bench_model(configs[name], variants, tokens, rounds, args.prompt))


if __name__ == "__main__":
    main()
