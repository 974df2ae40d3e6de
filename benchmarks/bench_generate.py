"""Per-token decode time of Hugging Face's greedy generate from prompts of several lengths: eager, tf.jit,
tf.jit with fusion and torch.compile, on small random GPT-2 and Llama configurations (nothing downloaded),
with thunderfn's compiled entries and torch.compile's graphs for the same calls, counted in the same run.

    python benchmarks/bench_generate.py                      # both models, every variant
    python benchmarks/bench_generate.py --quick              # a smoke run: tiny configs, 8 tokens, eager and tf.jit
    python benchmarks/bench_generate.py --models llama --variants eager thunderfn torch.compile

Each variant generates `--tokens` new tokens (100) from each prompt of `--prompts` (7, 1 and 12 tokens),
one prompt after another on one model, as a server would. Variants:
- eager: `model.generate(ids, max_new_tokens=N, do_sample=False)`.
- thunderfn, thunderfn-fusion: `tf.jit(model).generate(...)`, `tf.jit(model, fusion=True).generate(...)`:
  Hugging Face's loop with every forward through the jitted one (the default DynamicCache).
  `compiled` is `tf.cache_info(jitted)["entries"]`.
- torch.compile: `model.forward = torch.compile(model.forward)` (Inductor, the default automatic dynamic)
  with the default DynamicCache (`torch.compile(model).generate` would run the original forward: generate is
  the module's method, and the compiled wrapper only compiles `__call__`). torch.compile-dynamic: the same
  with `dynamic=True`. `compiled` is the number of graphs Dynamo handed to Inductor (a backend that counts,
  then calls Inductor's).
- torch.compile-static: Hugging Face's recommended way for torch.compile: `cache_implementation="static"`
  (preallocated, written in place) with `model.forward = torch.compile(model.forward)`.

A decode step's time is the time between two consecutive calls of a LogitsProcessor (one forward plus
the loop's own work); per variant the median over the decode steps of every prompt in `--rounds` timed
passes over the prompts, after one warm-up pass (which compiles: `first pass`). Passes are interleaved
across variants. Tokens are checked against eager's for every prompt (`ok` or `DIFF`). Llama's end-of-text
token is ignored (`eos_token_id=None`), so every prompt gets its `--tokens`. One torch thread. Benchmarks
are not tests: nothing here asserts a time, and on a shared machine the times are noisy.
"""
from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time
import types

import torch
import torch._dynamo

import thunderfn as tf
from thunderfn.testing.optional_libraries import import_torchvision, why_unavailable

VARIANTS = ("eager", "thunderfn", "thunderfn-fusion", "torch.compile", "torch.compile-dynamic", "torch.compile-static")
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


class _GraphCounter:
    """A torch.compile backend that counts the graphs Dynamo hands over, then compiles each with Inductor."""

    def __init__(self):
        self.graphs = 0
        self.inductor = torch._dynamo.lookup_backend("inductor")

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return self.inductor(graph_module, example_inputs)


def _with_own_code(method, variant: str):
    """The bound method, its function copied onto a code object of its own (named after the variant). Dynamo keeps
    its compiled code, and its record of which sizes changed (automatic dynamic), per code object, by file, line
    and name: the variants' deep copies of one forward would share them, and a variant's graph count would
    depend on the variants compiled before it."""
    fn = method.__func__
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{variant.replace('.', '_').replace('-', '_')}")
    own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(own, fn)  # (generate reads forward's signature, through __wrapped__)
    return types.MethodType(own, method.__self__)


def _variant(name: str, model):
    """(generate function, extra generate options, a function giving its count of compiled entries or graphs)."""
    if name == "eager":
        return model.generate, {}, None
    if name in ("thunderfn", "thunderfn-fusion"):
        jitted = tf.jit(model, fusion=name == "thunderfn-fusion")
        return jitted.generate, {}, lambda: tf.cache_info(jitted)["entries"]
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; known: {VARIANTS}")
    compiled, counter = copy.deepcopy(model), _GraphCounter()
    compiled.forward = torch.compile(_with_own_code(compiled.forward, name), backend=counter,
                                     dynamic=True if name == "torch.compile-dynamic" else None)
    options = {"cache_implementation": "static"} if name == "torch.compile-static" else {}
    return compiled.generate, options, lambda: counter.graphs


def _generate(generate, options, ids, tokens):
    clock = _StepClock()
    # (a list, not transformers.LogitsProcessorList: generate wraps any list it is given)
    out = generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0, eos_token_id=None,
                   logits_processor=[clock], **options)
    return out, clock.decode_times()


def bench_model(make, variants, tokens: int, rounds: int, prompt_lengths) -> list[dict]:
    torch.manual_seed(0)
    model = make().eval()
    prompts = [torch.randint(3, model.config.vocab_size, (1, n)) for n in prompt_lengths]
    wants = [_generate(model.generate, {}, ids, tokens)[0] for ids in prompts]
    rows = {}
    for name in variants:
        row = rows[name] = {"variant": name, "times": []}
        try:
            row["generate"], row["options"], row["count"] = _variant(name, model)
            start = time.perf_counter()
            outs = [_generate(row["generate"], row["options"], ids, tokens)[0] for ids in prompts]  # compiles
            row["first_s"] = time.perf_counter() - start
            row["ok"] = "ok" if all(torch.equal(o, w) for o, w in zip(outs, wants)) else "DIFF"
        except Exception as e:  # a variant that fails is reported, the others still run
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    for _ in range(rounds):
        for ids in prompts:
            for row in rows.values():
                if "error" not in row:
                    row["times"] += _generate(row["generate"], row["options"], ids, tokens)[1]
    for row in rows.values():
        if row.get("count") is not None and "error" not in row:
            row["compiled"] = row["count"]()
        if row["times"]:
            row["ms"] = 1e3 * statistics.median(row["times"])
    return list(rows.values())


def print_table(model_name: str, rows: list[dict]) -> None:
    eager = next((r.get("ms") for r in rows if r["variant"] == "eager"), None)
    print(f"\n{model_name}")
    print(f"  {'variant':<24}{'tokens':>7}{'first pass':>12}{'ms/token':>10}{'vs eager':>10}{'compiled':>10}")
    for r in rows:
        if "error" in r:
            print(f"  {r['variant']:<24}{'':>7}  {r['error']}")
            continue
        ratio = f"{r['ms'] / eager:.2f}x" if eager else ""
        compiled = str(r.get("compiled", ""))
        print(f"  {r['variant']:<24}{r['ok']:>7}{r['first_s']:>11.1f}s{r['ms']:>10.2f}{ratio:>10}{compiled:>10}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    parser.add_argument("--variants", nargs="+", default=None, choices=VARIANTS)
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per prompt (100; --quick: 8)")
    parser.add_argument("--rounds", type=int, default=None, help="timed passes over the prompts (2; --quick: 1)")
    parser.add_argument("--prompts", type=int, nargs="+", default=[7, 1, 12], help="prompt lengths, in order")
    parser.add_argument("--quick", action="store_true", help="tiny configs, 8 tokens, 1 round, eager and tf.jit")
    args = parser.parse_args(argv)
    why = why_unavailable("transformers")
    if why is not None:
        raise SystemExit(f"bench_generate needs transformers: {why}")
    torch.set_num_threads(1)  # steadier on a shared machine; every variant alike
    variants = args.variants or (QUICK_VARIANTS if args.quick else VARIANTS)
    tokens = args.tokens or (8 if args.quick else 100)
    rounds = args.rounds or (1 if args.quick else 2)
    configs = _configs(args.quick)
    print(f"greedy generate, prompts of {', '.join(map(str, args.prompts))} tokens in turn, {tokens} new tokens each, "
          f"median decode step over {rounds} pass(es), torch {torch.__version__}, 1 thread, CPU; compiled: "
          f"thunderfn's entries, torch.compile's graphs, for the same calls")
    for name in args.models:
        print_table(name, bench_model(configs[name], variants, tokens, rounds, args.prompts))


if __name__ == "__main__":
    main()
