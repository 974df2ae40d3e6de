"""Real models, one training step each: eager, thunderfn.jit, thunderfn.jit with fusion, thunderfn as
torch.compile's backend (with and without fusion) and torch.compile side by side, in one process per
model, with interleaved timing rounds.

    python benchmarks/bench_models.py                       # every model whose library is installed
    python benchmarks/bench_models.py --models hf-gpt2 timm-resnet18 --no-compile
    python benchmarks/bench_models.py --models hf-bert --variants eager thunderfn thunderfn-backend torch.compile
    python benchmarks/bench_models.py --list                # the models, and why any are skipped

Each model is a tiny random configuration from transformers, timm, torchvision or litgpt, or nanoGPT's
plain-PyTorch GPT (benchmarks/nanogpt.py; bench_nanogpt.py times it by depth), in training mode with
dropout and stochastic depth off (so every variant computes the same numbers), fp32, batch 2; the random
generator is reseeded before each variant's first step all the same. A step is: gradients cleared,
forward, loss, backward. Per model and variant it prints
- `ok` or the largest gradient error against eager (every parameter's gradient); `ok (fp64)` where a
  variant differs from eager in fp32 but matches eager run in fp64 (see _ROUNDING_NOTE); `refused` and
  the named error where tf.jit cannot trace a model, as JIT_REFUSES expects (Mixtral's router),
- aten ops per step: top-level aten calls that torch.profiler records during one step (what the
  Python code and torch.autograd ask the dispatcher for; the CPU analogue of kernel launches),
- the median step time and its ratio to eager's in the same rounds,
- the first step's time (tracing and compiling included; after earlier variants warmed up
  Inductor in the same process unless `--cold`),
- peak memory of a step (CUDA: torch's peak counter; CPU: the running sum of the profiler's
  allocation events).
On a machine with CUDA the models run there (`--device cpu` to stay on the CPU).
Benchmarks are not tests: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.testing.op_counts import top_level_aten_ops
from thunderfn.testing.optional_libraries import import_torchvision, why_unavailable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nanogpt  # noqa: E402  (sibling scripts, not a package)
from bench_training import cpu_peak_bytes, interleaved_medians  # noqa: E402

BATCH = 2
SEED = 0
TOLERANCE = 1e-4  # of gradient_error: rounding in fp32, with no ill-conditioned spot to amplify it
_DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                   "activation_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout",
                   "dropout_rate", "hidden_dropout", "classifier_dropout", "embed_dropout", "layerdrop",
                   "encoder_layerdrop", "decoder_layerdrop", "resid_dropout", "emb_dropout")


def _without_dropout(config):
    for field in _DROPOUT_FIELDS:
        if isinstance(getattr(config, field, None), float):
            setattr(config, field, 0.0)
    for sub in ("text_config", "vision_config"):
        if getattr(config, sub, None) is not None:
            _without_dropout(getattr(config, sub))
    return config


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A floating input in the dtype a loss is computed in (fp32 steps, the fp64 reference step): a
    Python check, so fp32 steps record no extra aten::to."""
    return x if x.dtype == dtype or not x.is_floating_point() else x.to(dtype)


# Every builder returns (model, loss_of), loss_of(model, dtype=torch.float32) -> the loss, its floating
# inputs in `dtype` (token ids stay integers; a model in fp64 is enough there).
def _hf_causal_lm(config_name, **fields):
    def build():
        import transformers
        config = _without_dropout(getattr(transformers, config_name)(**fields))
        model = transformers.AutoModelForCausalLM.from_config(config)
        ids = torch.randint(0, config.vocab_size, (BATCH, 32))
        return model, lambda m, dtype=torch.float32: m(input_ids=ids, labels=ids).loss
    return build


_LLAMA_LIKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def _hf_mixtral():
    # experts_implementation="eager": the reference routing (a loop over the experts hit, each taking its
    # tokens by torch.where), not the sorted grouped matmul transformers picks where it can
    return _hf_causal_lm("MixtralConfig", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
                         num_local_experts=4, num_experts_per_tok=2, experts_implementation="eager")()


def _hf_masked_lm(config_name):
    def build():
        import transformers
        config = _without_dropout(getattr(transformers, config_name)(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=256,
            max_position_embeddings=130))
        model = transformers.AutoModelForMaskedLM.from_config(config)
        ids = torch.randint(3, config.vocab_size, (BATCH, 32))
        return model, lambda m, dtype=torch.float32: m(input_ids=ids, labels=ids).loss
    return build


def _hf_t5():
    import transformers
    config = _without_dropout(transformers.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                                    vocab_size=256, decoder_start_token_id=0,
                                                    pad_token_id=0))
    model = transformers.T5ForConditionalGeneration(config)
    ids, labels = torch.randint(0, 256, (BATCH, 32)), torch.randint(0, 256, (BATCH, 16))
    return model, lambda m, dtype=torch.float32: m(input_ids=ids, labels=labels).loss


def _hf_vit():
    import transformers
    config = _without_dropout(transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                     intermediate_size=128, image_size=32, patch_size=8,
                                                     num_labels=10))
    model = transformers.ViTForImageClassification(config)
    pixels, labels = torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
    return model, lambda m, dtype=torch.float32: m(pixel_values=_as(pixels, dtype), labels=labels).loss


def _hf_whisper():
    import transformers
    config = _without_dropout(transformers.WhisperConfig(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32,
        max_target_positions=32, vocab_size=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1))
    model = transformers.WhisperForConditionalGeneration(config)
    features, labels = torch.randn(BATCH, 16, 64), torch.randint(3, 256, (BATCH, 16))
    return model, lambda m, dtype=torch.float32: m(input_features=_as(features, dtype), labels=labels).loss


def _hf_clip():
    import transformers
    config = _without_dropout(transformers.CLIPConfig(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=256, max_position_embeddings=32),
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8),
        projection_dim=32))
    model = transformers.CLIPModel(config)
    ids, pixels = torch.randint(0, 256, (BATCH, 16)), torch.randn(BATCH, 3, 32, 32)
    return model, lambda m, dtype=torch.float32: m(input_ids=ids, pixel_values=_as(pixels, dtype),
                                                   return_loss=True).loss


def _classifier(make_model, image_size):
    def build():
        model = make_model()
        images, labels = torch.randn(BATCH, 3, image_size, image_size), torch.randint(0, 10, (BATCH,))
        return model, lambda m, dtype=torch.float32: F.cross_entropy(m(_as(images, dtype)), labels)
    return build


def _timm(name, image_size=64, **kwargs):
    def make():
        import timm
        # drop_path_rate: stochastic depth, on by default in some models (swin: 0.1), draws at every step
        return timm.create_model(name, pretrained=False, num_classes=10, drop_rate=0.0, drop_path_rate=0.0,
                                 **kwargs)
    return _classifier(make, image_size)


def _torchvision(make_model, image_size=64):
    return _classifier(lambda: make_model(import_torchvision().models), image_size)


def _litgpt(name, **fields):
    def build():
        from litgpt import GPT, Config
        config = Config.from_name(name, n_layer=2, n_embd=64, n_head=4, block_size=64, padded_vocab_size=256,
                                  vocab_size=256, **fields)
        model = GPT(config)
        ids = torch.randint(0, 256, (BATCH, 32))
        return model, lambda m, dtype=torch.float32: F.cross_entropy(m(ids[:, :-1]).flatten(0, 1),
                                                                      ids[:, 1:].flatten())
    return build


def _nanogpt():
    model, ids, targets = nanogpt.tiny(n_layer=2, batch=BATCH)
    return model, lambda m, dtype=torch.float32: m(ids, targets)[1]


MODELS = {
    "nanogpt": ("torch", _nanogpt),
    "hf-bert": ("transformers", _hf_masked_lm("BertConfig")),
    "hf-roberta": ("transformers", _hf_masked_lm("RobertaConfig")),
    "hf-t5": ("transformers", _hf_t5),
    "hf-gpt2": ("transformers", _hf_causal_lm("GPT2Config", n_layer=2, n_embd=64, n_head=4, vocab_size=256,
                                              n_positions=128)),
    "hf-gpt-neox": ("transformers", _hf_causal_lm("GPTNeoXConfig", hidden_size=64, intermediate_size=128,
                                                  num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
                                                  max_position_embeddings=128)),
    "hf-llama": ("transformers", _hf_causal_lm("LlamaConfig", **_LLAMA_LIKE)),
    "hf-mistral": ("transformers", _hf_causal_lm("MistralConfig", **_LLAMA_LIKE)),
    "hf-qwen2": ("transformers", _hf_causal_lm("Qwen2Config", **_LLAMA_LIKE)),
    "hf-phi3": ("transformers", _hf_causal_lm("Phi3Config", **_LLAMA_LIKE, pad_token_id=0)),
    "hf-gemma": ("transformers", _hf_causal_lm("GemmaConfig", **_LLAMA_LIKE, head_dim=16)),
    "hf-vit": ("transformers", _hf_vit),
    "hf-whisper": ("transformers", _hf_whisper),
    "hf-clip": ("transformers", _hf_clip),
    "timm-resnet18": ("timm", _timm("resnet18")),
    "timm-convnext": ("timm", _timm("convnext_atto")),
    "timm-vit": ("timm", _timm("vit_tiny_patch16_224", image_size=32, img_size=32, patch_size=8, depth=2)),
    "timm-swin": ("timm", _timm("swin_tiny_patch4_window7_224", image_size=56, img_size=56, window_size=7,
                                depths=(2, 2), num_heads=(2, 4), embed_dim=32)),
    "timm-mobilenetv3": ("timm", _timm("mobilenetv3_small_050")),
    "torchvision-resnet18": ("torchvision", _torchvision(lambda models: models.resnet18(num_classes=10))),
    "torchvision-vit": ("torchvision", _torchvision(lambda models: models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10),
        image_size=32)),
    "torchvision-swin": ("torchvision", _torchvision(lambda models: models.SwinTransformer(
        patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4], num_classes=10,
        stochastic_depth_prob=0.0))),
    "litgpt-pythia": ("litgpt", _litgpt("pythia-14m")),
    "litgpt-llama": ("litgpt", _litgpt("Llama-3.2-1B", n_query_groups=2, intermediate_size=128)),
    # mixtures of experts: each expert takes the tokens routed to it by torch.where(mask), a size known
    # only when the step runs (a data-dependent size, which tf.jit traces)
    "litgpt-llama-moe": ("litgpt", _litgpt("Llama-3.2-1B", n_query_groups=2, mlp_class_name="LLaMAMoE", n_expert=4,
                                           n_expert_per_token=2, intermediate_size=128, moe_intermediate_size=64)),
    "hf-mixtral": ("transformers", _hf_mixtral),
}


def _fusion(model):
    return tf.jit(model, fusion=True)


def _backend(model):
    return torch.compile(model, backend="thunderfn")


def _backend_fusion(model):
    return torch.compile(model, backend=tf.dynamo.backend(fusion=True))


VARIANTS = {
    "eager": lambda model: model,
    "thunderfn": tf.jit,
    "thunderfn+fusion": _fusion,
    # thunderfn as torch.compile's backend: Dynamo captures the graphs, thunderfn compiles each
    "thunderfn-backend": _backend,
    "thunderfn-backend+fusion": _backend_fusion,
    "torch.compile": torch.compile,
}
JITTING = ("thunderfn", "thunderfn+fusion")  # the variants that trace the whole model with tf.jit
# what --no-compile leaves out: the variants that run Inductor or Dynamo
COMPILING = ("thunderfn+fusion", "thunderfn-backend", "thunderfn-backend+fusion", "torch.compile")
INDUCTOR = ("thunderfn+fusion", "thunderfn-backend+fusion", "torch.compile")  # what --cold times cold

# Models tf.jit alone cannot trace, with the named error it stops at: Mixtral loops over the experts hit
# (`for expert_idx in expert_hit`, the rows of a nonzero()), a Python loop over a size known only when the
# step runs. (litgpt's mixture of experts loops over its experts and takes their tokens by torch.where(mask):
# data-dependent sizes, which tf.jit traces.) Through the thunderfn backend, Dynamo ends a graph there.
JIT_REFUSES = {
    "hf-mixtral": "ConcretizationError",
}


def refused(row: dict) -> bool:
    """Whether a row's failure is tf.jit refusing a model it cannot trace, as JIT_REFUSES expects."""
    expected = JIT_REFUSES.get(row["model"])
    return expected is not None and row["variant"] in JITTING and row.get("failure", "").startswith(expected + ":")


def step(model, loss_of):
    for p in model.parameters():
        p.grad = None
    loss = loss_of(model)
    loss.backward()
    return loss


def aten_ops_per_step(model, loss_of) -> int:
    """Top-level aten calls in one step (thunderfn/testing/op_counts.py)."""
    return sum(top_level_aten_ops(lambda: step(model, loss_of)).values())


def gradients(model) -> list:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def gradient_error(grads, reference) -> float:
    """The largest |g - g_ref| / (1 + |g_ref|) over every parameter's gradient (inf where one of the
    two has a gradient and the other None)."""
    worst = 0.0
    for g, ref in zip(grads, reference):
        if (g is None) != (ref is None):
            return float("inf")
        if ref is not None:
            worst = max(worst, ((g.double() - ref.double()).abs() / (1 + ref.double().abs())).max().item())
    return worst


def _synchronized(device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def peak_mib(model, loss_of, device) -> float:
    if device.type != "cuda":
        return cpu_peak_bytes(lambda: step(model, loss_of)) / 2**20
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step(model, loss_of)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


_ROUNDING_NOTE = """ok (fp64): the gradients differ from eager's by more than the tolerance in fp32, yet match eager run
in fp64 (the exact answer, to fp32's eyes) within it. Eager's own fp32 rounding then sits on the other
side of a discontinuity than the exact answer: e.g. a ReLU input within rounding of 0 (or a max within
rounding of a tie) routes one element's gradient differently, and normalization over few elements
(BatchNorm over batch 2 x 2x2 pixels) spreads that through the network."""


def fp64_reference(base, loss_of) -> list:
    """Eager's gradients with the model and its floating inputs in fp64, from the same seed."""
    torch.manual_seed(SEED)
    model = copy.deepcopy(base).double()
    step(model, lambda m: loss_of(m, torch.float64))
    return gradients(model)


def run_one(name: str, variants: list[str], rounds: int, calls: int,
            device: torch.device = torch.device("cpu")) -> list[dict]:
    why_unavailable(MODELS[name][0])  # imports the library, torchvision made importable first
    torch.manual_seed(SEED)
    with device:  # parameters and inputs made on the device
        base, loss_of = MODELS[name][1]()
    base.train()
    sync = _synchronized(device)
    rows, ready, reference, first_grads = [], {}, None, {}
    for variant in variants:
        row = {"model": name, "variant": variant}
        rows.append(row)
        try:
            model = VARIANTS[variant](copy.deepcopy(base))
            torch.manual_seed(SEED)  # what a step still draws, every variant draws the same
            start = time.perf_counter()
            loss = step(model, loss_of)  # the first step: tracing and compiling included
            sync()
            row["first_s"] = time.perf_counter() - start
            grads = first_grads[variant] = gradients(model)
            if reference is None:
                reference = grads
            row["error"] = gradient_error(grads, reference)
            row["loss"] = loss.item()
            row["ops"] = aten_ops_per_step(model, loss_of)
            row["peak_mib"] = peak_mib(model, loss_of, device)
            ready[variant] = model
        except Exception as e:  # a variant that cannot run a model is reported, not fatal
            row["failure"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:100] if str(e).strip() else ''}"
    if any(row.get("error", 0.0) > TOLERANCE for row in rows):
        try:  # an arbiter for the rows that differ from eager: are they off the exact answer too?
            exact = fp64_reference(base, loss_of)
        except Exception as e:  # a model that does not run in fp64 keeps its fp32 verdict
            exact = None
            print(f"{name}: no fp64 reference ({type(e).__name__}: {e})", file=sys.stderr)
        for row in rows if exact is not None else ():
            if row["variant"] in first_grads:
                row["error_fp64"] = gradient_error(first_grads[row["variant"]], exact)
    medians = interleaved_medians(ready, loss_of, device, rounds, calls) if rounds else {}  # (0: correctness only)
    for row in rows:
        if row["variant"] in medians:
            row["step_ms"] = medians[row["variant"]]
    return rows


def first_step_only(name: str, variant: str, device: torch.device) -> dict:
    why_unavailable(MODELS[name][0])
    torch.manual_seed(SEED)
    with device:
        base, loss_of = MODELS[name][1]()
    model = VARIANTS[variant](base.train())
    start = time.perf_counter()
    step(model, loss_of)
    _synchronized(device)()
    return {"first_s": time.perf_counter() - start}


def _run_json(command, env=None):
    """The JSON a --one process printed last, or why it failed."""
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return "process failed: " + (done.stderr.strip().splitlines() or ["no output"])[-1][:100]
    return json.loads(lines[-1])


def _format(rows: list[dict]) -> list[tuple]:
    eager = {r["model"]: r for r in rows if r["variant"] == "eager" and "step_ms" in r}
    out = []
    for r in rows:
        if "failure" in r:
            out.append((r["model"], r["variant"], "refused" if refused(r) else "FAILED", r["failure"], "", "", "", ""))
            continue
        if "step_ms" not in r:
            out.append((r["model"], r["variant"], "skipped", r.get("skip", ""), "", "", "", ""))
            continue
        e = eager.get(r["model"])
        correct = "ok" if r["error"] <= TOLERANCE else (
            "ok (fp64)" if r.get("error_fp64", float("inf")) <= TOLERANCE else f"err {r['error']:.1e}")
        out.append((r["model"], r["variant"], correct, f"{r['ops']}" + (f" ({r['ops'] / e['ops']:.2f}x)" if e else ""),
                    f"{r['step_ms']:.2f}", f"{r['step_ms'] / e['step_ms']:.2f}x" if e else "",
                    f"{r['first_s']:.2f}" + (f" (cold {r['cold_first_s']:.1f})"
                                             if isinstance(r.get("cold_first_s"), float)
                                             else f" ({r['cold_first_s']})" if "cold_first_s" in r else ""),
                    f"{r['peak_mib']:.1f}"))
    return out


def _measured_rows(names: list, variants: list, skipped: dict, args) -> list[dict]:
    """The rows of run_one for each model, each measured in a process of its own (and with --cold, each
    Inductor variant's first step again in a new process with an empty Inductor cache)."""
    rows = []
    for n in names:
        if skipped[MODELS[n][0]]:
            rows.append({"model": n, "variant": "all", "skip": skipped[MODELS[n][0]]})
            continue
        common = ["--threads", str(args.threads), "--device", args.device]
        done = _run_json([sys.executable, __file__, "--one", n, "--rounds", str(args.rounds), "--calls",
                          str(args.calls), *common, "--variants", *variants])
        if isinstance(done, str):
            rows.append({"model": n, "variant": "all", "failure": done})
            continue
        rows.extend(done)
        for row in done:
            if args.cold and row["variant"] in INDUCTOR and "first_s" in row:
                with tempfile.TemporaryDirectory() as cache:
                    cold = _run_json([sys.executable, __file__, "--one", n, "--first-step-only", *common, "--variants",
                                      row["variant"]], env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache))
                row["cold_first_s"] = cold if isinstance(cold, str) else cold["first_s"]
        print(f"  done {n}", file=sys.stderr, flush=True)
    return rows


def _print_report(rows: list[dict]) -> None:
    """The rows as a table, with the rounding note for the variants judged in fp64."""
    header = ("model", "variant", "vs eager", "aten ops/step", "step ms", "step ratio", "first step s", "peak MiB")
    table = _format(rows)
    widths = [max(len(str(r[i])) for r in table + [header]) for i in range(len(header))]
    for row in [header] + table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    rounding = [r for r in rows if "error_fp64" in r]
    if rounding:
        print("\n" + _ROUNDING_NOTE)
        for r in rounding:
            print(f"  {r['model']} {r['variant']}: {r['error']:.1e} from eager in fp32, {r['error_fp64']:.1e} from "
                  f"eager in fp64")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None, help="model names (default: all); see --list")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--no-compile", action="store_true",
                        help=f"leave out the variants that run Dynamo or Inductor ({', '.join(COMPILING)})")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cold", action="store_true",
                        help=f"time the first step of {', '.join(INDUCTOR)} each in a new process with an empty "
                             f"Inductor cache (a cold compile, which a first step after other variants is not)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one model in this process, print JSON rows
    parser.add_argument("--first-step-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    variants = [v for v in args.variants if not (args.no_compile and v in COMPILING)]
    torch.set_num_threads(args.threads)
    if args.one and args.first_step_only:
        print(json.dumps(first_step_only(args.one, variants[0], torch.device(args.device))))
        return
    if args.one:
        print(json.dumps(run_one(args.one, variants, args.rounds, args.calls, torch.device(args.device))))
        return
    names = args.models or list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    skipped = {lib: why_unavailable(lib) for lib in {MODELS[n][0] for n in names}}
    if args.list:
        for n in names:
            print(f"{n:24} {skipped[MODELS[n][0]] or 'available'}")
        return
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, intra-op threads {args.threads}"
    print(f"torch {torch.__version__}, thunderfn {tf.__version__}, {where}, batch {BATCH}, fp32")
    rows = _measured_rows(names, variants, skipped, args)
    _print_report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
