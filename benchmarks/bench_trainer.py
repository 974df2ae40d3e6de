"""A Hugging Face Trainer's steps with the model eager, jitted, and compiled in place (docs/integrations.md).

    python benchmarks/bench_trainer.py                      # 100 steps each (about a minute, most of it Inductor)
    python benchmarks/bench_trainer.py --steps 300 --no-inductor

GPT-2 at tiny width (4 layers, n_embd 64, 4 heads, vocab 256, dropout off, untied), batch 4 x 32 tokens, one torch
thread, `transformers.Trainer` with its defaults but for the step count, no logging and no checkpoints. For each way
of handing the model to the Trainer: the first step (tracing and compiling included) and the median of the steps
after it, each timed by a TrainerCallback from on_step_begin to on_step_end (the forward, backward and optimizer
step, the Trainer's own work around them included) in this process's CPU time, which other work on a shared
machine disturbs less than wall time (with one thread, the two agree on a quiet one), and the final loss against
eager's. Variants: `eager`,
`Trainer(model=tf.jit(model))`, `model.compile(backend="thunderfn")`, and `model.compile()` (Inductor, with its on-disk
caches off: a cold compile). Each variant runs in this process after the ones before it. Not a test: nothing here
asserts a time.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

import thunderfn as tf


def _compiled_in_place(backend: str):
    def compile_model(model):
        model.compile(backend=backend)
        return model
    return compile_model


VARIANTS = {"eager": lambda model: model, "tf.jit(model)": tf.jit,
            "model.compile(backend='thunderfn')": _compiled_in_place("thunderfn"),
            "model.compile() (Inductor, cold)": _compiled_in_place("inductor")}


def run(transformers, wrap, steps: int) -> tuple[float, float, float]:
    """(first step s, median later step s, final training loss) of `steps` Trainer steps on wrap(model)."""

    class StepClock(transformers.TrainerCallback):
        def __init__(self):
            self.seconds, self.started = [], 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.process_time() - self.started)

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                     tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, config.vocab_size, (steps * 4, 32), generator=torch.Generator().manual_seed(1))
    rows = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(tempfile.mkdtemp(), max_steps=steps, per_device_train_batch_size=4,
                                          report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
                                          disable_tqdm=True)
    trainer = transformers.Trainer(model=wrap(model), args=args, train_dataset=rows)
    trainer.remove_callback(transformers.PrinterCallback)
    clock = StepClock()
    trainer.add_callback(clock)
    loss = trainer.train().training_loss
    later = sorted(clock.seconds[1:])
    return clock.seconds[0], later[len(later) // 2], loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--no-inductor", action="store_true", help="leave out model.compile() with Inductor")
    args = parser.parse_args()
    import transformers  # (only here: importing this file needs none of it)

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, 1 thread, {args.steps} steps\n")
    print("| model given to the Trainer | first step | later steps (median) | x eager | final loss - eager's |")
    print("|---|---|---|---|---|")
    eager_step = eager_loss = None
    for name, wrap in VARIANTS.items():
        if args.no_inductor and "Inductor" in name:
            continue
        first, step, loss = run(transformers, wrap, args.steps)
        eager_step = step if eager_step is None else eager_step
        eager_loss = loss if eager_loss is None else eager_loss
        print(f"| {name} | {first:.2f} s | {step * 1e3:.1f} ms | {step / eager_step:.2f} | {loss - eager_loss:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
