"""Every GPU path of thunderfn, run and measured on one CUDA machine: one table, and JSON.

    python benchmarks/gpu_check.py                  # on a CUDA machine: run, check, time; writes gpu_check.json
    python benchmarks/gpu_check.py --dry-run        # anywhere: import every path and build its traces, small, on CPU

Checks (each against torch on the same inputs, then timed with CUDA events, median of --reps;
rows marked profiled also give the GPU's kernel time per step from torch.profiler, device_ms, so
a step slower than its kernels shows as host overhead):
- Triton cross-entropy, forward + backward, [2048, 50257] bfloat16, against
  F.cross_entropy: jitted, and the two kernels alone (the autograd.Function, no jit); their
  achieved bandwidth against the device's, measured here with a large device-to-device copy
  (the memory-bandwidth floor: the kernels must read the logits twice and write their gradient
  once). Target: within 1.5x of the floor.
- Attention, forward + backward, bfloat16 and float16, against F.scaled_dot_product_attention
  under torch's default choice and under each CUDA backend (flash, memory-efficient, cuDNN):
  the sdpa executor follows torch's backend selection, so its side is jitted and run under the
  same switches as torch's (the row's kernel says which pair its trace ran); the cudnn_sdpa
  executor runs cuDNN whatever the switches, so its side runs outside them. Target: cuDNN no
  slower than torch's default choice.
- The fusion executors on CUDA (Inductor; nvFuser where it imports) on an elementwise chain.
- A GPT-2-small-sized block (768 channels, 12 heads, 1024 tokens, batch 8) training step
  (forward, backward, AdamW): eager, tf.jit with the default executors, tf.jit with Inductor
  fusion, torch.compile. Target: fusion >= 1.3x faster than eager.

Without CUDA it says so; with --dry-run it then checks that every path imports and traces
(exit status 0 when they do), which CI runs. Measured numbers go in docs/executors.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import thunderfn as tf
from thunderfn.examples.gpt import GPT, GPTConfig
from thunderfn.executors.triton_crossentropy import triton_cross_entropy


@dataclasses.dataclass
class Case:
    name: str
    fn: object  # thunderfn's side: jitted with `executors`, or run as it is when executors is None
    make_inputs: object  # (device, small) -> tuple of tensors
    executors: list | None  # thunderfn executors (names) for the jitted run
    needs: tuple = ()  # executors that must be available for the case to run (else: skipped, with why)
    backend: object = None  # the SDPA backend torch's side runs under (None: torch's default choice)
    # the SDPA backend thunderfn's side is jitted and run under (None: the switches as they are)
    jit_backend: object = None
    reference: object = None  # torch's side (None: fn itself, run eagerly)
    bytes_moved: object = None  # (inputs) -> bytes the kernel must move, for bandwidth
    target: str = ""
    tolerance: float = 2e-2
    profiled: bool = False  # also measure the GPU's kernel time per step (torch.profiler)
    grad_tolerance: float = 2e-2  # the gradients' relative error (norm of the difference / norm of torch's)


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


def _ce_kernels(logits, targets):
    """The two Triton kernels alone: the autograd.Function the operator is, without thunderfn."""
    return triton_cross_entropy(logits, targets, -100, "mean")


def _causal_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _chain_inputs(device, small):
    return (torch.randn(1 << (10 if small else 24), device=device),)


def _chain(x):
    return ((x.sin() * 2 + 1).relu() - x.cos()).square().mean()


def cases() -> list[Case]:
    ce_bytes = lambda x, t: 3 * x.numel() * x.element_size()  # noqa: E731 (read, read, write)
    out = [Case("triton cross-entropy fwd+bwd [2048, 50257] bf16", _ce, _ce_inputs, ["triton_crossentropy"],
                needs=("triton_crossentropy",), bytes_moved=ce_bytes, profiled=True,
                target="within 1.5x of the memory-bandwidth floor"),
           Case("triton cross-entropy kernels alone (no jit) fwd+bwd [2048, 50257] bf16", _ce_kernels, _ce_inputs,
                None, needs=("triton_crossentropy",), reference=_ce, bytes_moved=ce_bytes, profiled=True,
                target="within 1.5x of the memory-bandwidth floor")]
    backends = {"default": None, "flash": "FLASH_ATTENTION", "memory-efficient": "EFFICIENT_ATTENTION",
                "cuDNN": "CUDNN_ATTENTION"}
    for dtype in (torch.bfloat16, torch.float16):
        for label, backend in backends.items():
            name = f"vs torch {label} attention fwd+bwd {str(dtype)[6:]}"
            # sdpa follows torch's backend selection: jitted and run under the same switches as torch
            out.append(Case(f"sdpa {name}", _causal_attention, _attention_inputs(dtype), ["sdpa"], needs=("sdpa",),
                            backend=backend, jit_backend=backend, profiled=backend is None, grad_tolerance=5e-2))
            # cudnn_sdpa picks cuDNN itself: its side runs outside the switches torch's side runs under
            out.append(Case(f"cudnn_sdpa {name}", _causal_attention, _attention_inputs(dtype), ["cudnn_sdpa"],
                            needs=("cudnn_sdpa",), backend=backend, profiled=backend is None, grad_tolerance=5e-2,
                            target="cuDNN no slower than torch's default" if backend is None else ""))
    for ex in ("inductor", "nvfuser"):
        out.append(Case(f"{ex} fusion, elementwise chain on 16M floats", _chain, _chain_inputs, [ex], needs=(ex,)))
    return out


# -- running ---------------------------------------------------------------------------------------
def _step(fn, inputs):
    """fn(*inputs) followed by backward where the output requires grad."""
    out = fn(*inputs)
    if isinstance(out, torch.Tensor) and out.requires_grad:
        out.float().sum().backward()


def _value_and_grads(fn, inputs):
    """fn's output on copies of the inputs, and the gradients of its sum for those that require grad."""
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*leaves)
    wrt = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad(out.float().sum(), wrt) if wrt and out.requires_grad else ()
    return out.detach(), grads


def _timed(fn, inputs, reps: int) -> float:
    """Median milliseconds of a step (fn, then backward)."""
    for _ in range(3):
        _step(fn, inputs)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _step(fn, inputs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _device_ms(fn, inputs, steps: int = 5) -> float | None:
    """The GPU's kernel time per step (sum of the CUDA kernels torch.profiler saw), or None
    where the profiler cannot say; below the step's time, the rest is host overhead."""
    try:
        _step(fn, inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                _step(fn, inputs)
            torch.cuda.synchronize()
        cuda = torch.autograd.DeviceType.CUDA
        return sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == cuda) / steps / 1e3
    except Exception:  # noqa: BLE001 (informational: a profiler that cannot run leaves the field empty)
        return None


def _backend(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, name))


def copy_bandwidth() -> float:
    """The device's achievable memory bandwidth in GB/s: a 1 GiB device-to-device copy (read + write)."""
    src = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    ms = _timed(lambda s: dst.copy_(s), (src,), 10)
    return 2 * src.numel() * src.element_size() / ms / 1e6


def _kernels_ran(jitted) -> str:
    """The operators of the kernel executors in the jitted function's last forward trace."""
    text = str(tf.last_traces(jitted)[-1])
    found = re.findall(r"\b((?:sdpa|cudnn_sdpa|triton_cross_entropy)\w*)\(", text)
    return ", ".join(dict.fromkeys(found))


def _under(backend):
    return _backend(backend) if backend else _nothing()


def run_case(case: Case, reps: int, bandwidth: float) -> dict:
    missing = {ex: why for ex in case.needs for ok, why in [tf.executors.get_executor(ex).availability()] if not ok}
    if missing:
        return {"case": case.name, "status": "skipped", "why": "; ".join(f"{k}: {v}" for k, v in missing.items())}
    inputs = case.make_inputs("cuda", False)
    reference = case.reference or case.fn
    with _under(case.jit_backend):
        ours = tf.jit(case.fn, executors=case.executors) if case.executors is not None else case.fn
        got, got_grads = _value_and_grads(ours, inputs)
        jit_ms = _timed(ours, inputs, reps)
        jit_device_ms = _device_ms(ours, inputs) if case.profiled else None
    with _under(case.backend):
        want, want_grads = _value_and_grads(reference, inputs)
        torch_ms = _timed(reference, inputs, reps)
        torch_device_ms = _device_ms(reference, inputs) if case.profiled else None
    torch.testing.assert_close(got.float(), want.float(), atol=case.tolerance, rtol=case.tolerance)
    grad_errors = [float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))
                   for a, b in zip(got_grads, want_grads)]
    row = {"case": case.name, "status": "ok", "thunderfn_ms": jit_ms, "torch_ms": torch_ms,
           "speedup": torch_ms / jit_ms, "target": case.target, "grad_rel_errors": grad_errors}
    if any(e > case.grad_tolerance for e in grad_errors):  # a failure, with its timings kept
        row.update(status="FAILED", why=f"gradients differ from torch's: relative errors "
                                        f"{[f'{e:.3g}' for e in grad_errors]} (tolerance {case.grad_tolerance})")
    if case.executors is not None:
        row["kernels"] = _kernels_ran(ours)
        row["claimed"] = bool(row["kernels"]) or any(
            ex.replace("_", "") in str(tf.last_traces(ours)[-1]).replace("_", "") for ex in case.executors)
    if case.profiled:
        row.update(thunderfn_device_ms=jit_device_ms, torch_device_ms=torch_device_ms)
    if case.bytes_moved is not None:
        floor_ms = case.bytes_moved(*inputs) / bandwidth / 1e6
        row.update(floor_ms=floor_ms, vs_floor=jit_ms / floor_ms)
        if jit_device_ms:
            row["device_vs_floor"] = jit_device_ms / floor_ms
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
                "thunderfn + inductor": lambda m: tf.jit(m,
                                                         executors=[*tf.executors.get_default_executors(), "inductor"]),
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
                     "speedup_vs_eager": eager_ms / ms,
                     "target": ">= 1.3x eager with fusion" if "inductor" in name else ""})
    return rows


def dry_run() -> int:
    """Import every path and build its traces, small, on CPU."""
    problems = []
    for case in cases():
        inputs = case.make_inputs("cpu", True)
        try:
            # a case run without jit (the kernels alone) traces its torch reference; its kernels need a GPU
            trace = tf.trace(case.fn if case.executors is not None else case.reference, *inputs)
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
    print(f"\n{'case':78} {'status':8} {'ms':>9} {'speedup':>8}  target / kernels / notes")
    for r in rows:
        ms = r.get("thunderfn_ms", r.get("ms", float("nan")))
        speedup = r.get("speedup", r.get("speedup_vs_eager", float("nan")))
        extra = f" ({r['vs_floor']:.2f}x the bandwidth floor)" if "vs_floor" in r else ""
        if r.get("thunderfn_device_ms") is not None and r.get("torch_device_ms") is not None:
            extra += (f" [GPU kernel time per step: thunderfn {r['thunderfn_device_ms']:.3f} ms, "
                      f"torch {r['torch_device_ms']:.3f} ms]")
        if r.get("kernels"):
            extra += f" ran: {r['kernels']}"
        print(f"{r['case']:78} {r['status']:8} {ms:9.3f} {speedup:8.2f}  "
              f"{r.get('target', '')}{extra} {r.get('why', '')}")
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "bandwidth_gbs": bandwidth, "when": time.ctime(),
                   "rows": rows}, f, indent=1)
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
