"""Every GPU path of thunderfn, run and measured on one CUDA machine: one table, and JSON.

    python benchmarks/gpu_check.py                  # on a CUDA machine: run, check, time; writes gpu_check.json
    python benchmarks/gpu_check.py --dry-run        # anywhere: import every path and build its traces, small, on CPU

Checks (each against torch on the same inputs, then timed with CUDA events, median of --reps):
- Triton cross-entropy, forward + backward, [2048, 50257] bfloat16, against
  F.cross_entropy; its achieved bandwidth against the device's, measured here with a large
  device-to-device copy (the memory-bandwidth floor: the kernel must read the logits twice and
  write their gradient once). Target: within 1.5x of the floor.
- The sdpa executor and the cudnn_sdpa executor on each CUDA attention backend torch has
  (flash, memory-efficient, cuDNN) in bfloat16 and float16, forward + backward, against
  F.scaled_dot_product_attention under the same backend. Target: cuDNN no slower than torch's
  default choice.
- The fusion executors on CUDA (Inductor; nvFuser where it imports) on an elementwise chain.
- A GPT-2-small-sized block (768 channels, 12 heads, 1024 tokens, batch 8) training step
  (forward, backward, AdamW): eager, tf.jit with the default executors, tf.jit with Inductor
  fusion, torch.compile. Target: fusion >= 1.3x faster than eager.

Without CUDA it says so; with --dry-run it then checks that every path imports and traces
(exit status 0 when they do), which CI runs. Nothing here has run on a GPU yet: the first
run's numbers go in docs/executors.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import thunderfn as tf
from thunderfn.examples.gpt import GPT, GPTConfig


@dataclasses.dataclass
class Case:
    name: str
    fn: object  # the function jitted, and the reference called on the same inputs
    make_inputs: object  # (device, small) -> tuple of tensors
    executors: list  # thunderfn executors (names) for the jitted run
    needs: tuple = ()  # executors that must be available for the case to run (else: skipped, with why)
    backend: object = None  # an SDPA backend to run both sides under
    bytes_moved: object = None  # (inputs) -> bytes the kernel must move, for bandwidth
    target: str = ""
    tolerance: float = 2e-2


def _ce_inputs(device, small):
    rows, classes = (64, 1000) if small else (2048, 50257)
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = torch.randn(rows, classes, generator=g).to(device=device, dtype=torch.bfloat16).requires_grad_()
    return logits, torch.randint(0, classes, (rows,), generator=g).to(device)


def _ce(logits, targets):
    return F.cross_entropy(logits, targets)


def _attention_inputs(dtype):
    def make(device, small):
        b, h, L, e = (1, 2, 64, 64) if small else (8, 16, 1024, 64)
        g = torch.Generator(device="cpu").manual_seed(0)
        return tuple(torch.randn(b, h, L, e, generator=g).to(device=device, dtype=dtype).requires_grad_()
                     for _ in range(3))
    return make


def _causal_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _chain_inputs(device, small):
    return (torch.randn(1 << (10 if small else 24), device=device),)


def _chain(x):
    return ((x.sin() * 2 + 1).relu() - x.cos()).square().mean()


def cases() -> list[Case]:
    out = [Case("triton cross-entropy fwd+bwd [2048, 50257] bf16", _ce, _ce_inputs, ["triton_crossentropy"],
                needs=("triton_crossentropy",), bytes_moved=lambda x, t: 3 * x.numel() * x.element_size(),
                target="within 1.5x of the memory-bandwidth floor")]
    backends = {"flash": "FLASH_ATTENTION", "memory-efficient": "EFFICIENT_ATTENTION", "cuDNN": "CUDNN_ATTENTION"}
    for dtype in (torch.bfloat16, torch.float16):
        for label, backend in backends.items():
            for ex in ("sdpa", "cudnn_sdpa"):
                out.append(Case(f"{ex} vs torch {label} attention fwd+bwd {str(dtype)[6:]}", _causal_attention,
                                _attention_inputs(dtype), [ex], needs=(ex,), backend=backend,
                                target="cuDNN no slower than torch's default" if ex == "cudnn_sdpa" else ""))
    for ex in ("inductor", "nvfuser"):
        out.append(Case(f"{ex} fusion, elementwise chain on 16M floats", _chain, _chain_inputs, [ex], needs=(ex,)))
    return out


# -- running ---------------------------------------------------------------------------------------
def _timed(fn, inputs, reps: int) -> float:
    """Median milliseconds of fn(*inputs) followed by backward where the output requires grad."""
    def step():
        out = fn(*inputs)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.float().sum().backward()

    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _backend(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, name))


def copy_bandwidth() -> float:
    """The device's achievable memory bandwidth in GB/s: a 1 GiB device-to-device copy (read + write)."""
    src = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    ms = _timed(lambda s: dst.copy_(s), (src,), 10)
    return 2 * src.numel() * src.element_size() / ms / 1e6


def run_case(case: Case, reps: int, bandwidth: float) -> dict:
    missing = {ex: why for ex in case.needs for ok, why in [tf.executors.get_executor(ex).availability()] if not ok}
    if missing:
        return {"case": case.name, "status": "skipped", "why": "; ".join(f"{k}: {v}" for k, v in missing.items())}
    context = _backend(case.backend) if case.backend else _nothing()
    inputs = case.make_inputs("cuda", False)
    with context:
        jitted = tf.jit(case.fn, executors=case.executors)
        got, want = jitted(*inputs), case.fn(*inputs)
        torch.testing.assert_close(got.float(), want.float(), atol=case.tolerance, rtol=case.tolerance)
        jit_ms, torch_ms = _timed(jitted, inputs, reps), _timed(case.fn, inputs, reps)
    row = {"case": case.name, "status": "ok", "thunderfn_ms": jit_ms, "torch_ms": torch_ms,
           "speedup": torch_ms / jit_ms, "target": case.target,
           "claimed": any(ex.replace("_", "") in str(tf.last_traces(jitted)[-1]).replace("_", "") for ex in
                          case.executors)}
    if case.bytes_moved is not None:
        floor_ms = case.bytes_moved(*inputs) / bandwidth / 1e6
        row.update(floor_ms=floor_ms, vs_floor=jit_ms / floor_ms)
    return row


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def gpt_block_step(reps: int) -> list[dict]:
    """A GPT-2-small-sized block, one training step: eager, thunderfn (defaults), thunderfn with
    Inductor fusion, torch.compile."""
    config = GPTConfig(vocab_size=50257, block_size=1024, n_embd=768, n_head=12, n_layer=1, batch_size=8)
    torch.manual_seed(0)
    idx = torch.randint(0, config.vocab_size, (config.batch_size, config.block_size), device="cuda")
    variants = {"eager": lambda m: m, "thunderfn": tf.jit,
                "thunderfn + inductor": lambda m: tf.jit(m, executors=[*tf.executors.get_default_executors(), "inductor"]),
                "torch.compile": torch.compile}
    rows, eager_ms = [], None
    for name, wrap in variants.items():
        model = GPT(config).cuda().to(torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        runner = wrap(model)

        def step():
            loss = runner(idx, idx)[1]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss.detach()

        ms = _timed(lambda: step(), (), reps)
        eager_ms = ms if eager_ms is None else eager_ms
        rows.append({"case": f"GPT-2-small block train step: {name}", "status": "ok", "ms": ms,
                     "speedup_vs_eager": eager_ms / ms, "target": ">= 1.3x eager with fusion" if "inductor" in name else ""})
    return rows


def dry_run() -> int:
    """Import every path and build its traces, small, on CPU."""
    problems = []
    for case in cases():
        inputs = case.make_inputs("cpu", True)
        try:
            trace = tf.trace(case.fn, *inputs)
            assert trace.bound_symbols, "an empty trace"
            for ex in case.needs:
                tf.executors.get_executor(ex)  # registered (its module imported)
        except Exception as e:  # noqa: BLE001 (reported)
            problems.append(f"{case.name}: {type(e).__name__}: {e}")
        status = "traces" if not problems or not problems[-1].startswith(case.name) else "FAILED"
        why = [f"{ex}: {tf.executors.available()[ex]}" for ex in case.needs]
        print(f"  {status:7} {case.name}  ({'; '.join(why)})")
    config = GPTConfig(n_embd=64, n_head=4, n_layer=1, block_size=32, vocab_size=128, batch_size=2)
    idx = torch.randint(0, 128, (2, 32))
    try:
        tf.trace(GPT(config), idx, idx)
        print("  traces  GPT block train step (small config)")
    except Exception as e:  # noqa: BLE001
        problems.append(f"GPT block: {type(e).__name__}: {e}")
    for p in problems:
        print("FAILED", p)
    return 1 if problems else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="without running kernels: import and trace every path")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", default="gpu_check.json", help="where to write the results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to run or measure here (torch.cuda.is_available() is False)")
        if not args.dry_run:
            return 0
        print("dry run: every path imports and builds its traces:")
        return dry_run()
    if args.dry_run:
        return dry_run()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, thunderfn {tf.__version__}")
    bandwidth = copy_bandwidth()
    print(f"device-to-device copy bandwidth: {bandwidth:.0f} GB/s")
    rows = []
    for case in cases():
        try:
            rows.append(run_case(case, args.reps, bandwidth))
        except Exception as e:  # noqa: BLE001 (a failing path is a row of the report, not the end of it)
            rows.append({"case": case.name, "status": "FAILED", "why": f"{type(e).__name__}: {e}"[:300]})
        print(json.dumps(rows[-1]))
    try:
        rows += gpt_block_step(args.reps)
    except Exception as e:  # noqa: BLE001
        rows.append({"case": "GPT block", "status": "FAILED", "why": f"{type(e).__name__}: {e}"[:300]})
    print(f"\n{'case':70} {'status':8} {'ms':>9} {'speedup':>8}  target")
    for r in rows:
        ms = r.get("thunderfn_ms", r.get("ms", float("nan")))
        speedup = r.get("speedup", r.get("speedup_vs_eager", float("nan")))
        extra = f" ({r['vs_floor']:.2f}x the bandwidth floor)" if "vs_floor" in r else ""
        print(f"{r['case']:70} {r['status']:8} {ms:9.3f} {speedup:8.2f}  {r.get('target', '')}{extra} {r.get('why', '')}")
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "bandwidth_gbs": bandwidth, "when": time.ctime(),
                   "rows": rows}, f, indent=1)
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
