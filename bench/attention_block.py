"""Benchmark: one self-attention block (to_q/k/v + SDPA + to_out) per token strategy, without ComfyUI.

Not a test. Prints the unpatched block and each strategy from the same run, as time and speed ratio, plus the cost of
the patch closures alone, and what the device-aware calibration (scheduling/calibrate.py) decides at that shape.
Shapes (level of the image, tokens, channels, heads): SD1.5 768 px /8 (9 216, 320, 8) and /16 (2 304, 640, 8), SD1.5
1024 /8 (16 384), SDXL 1024 /16 (4 096, 640, 10) and /32 (1 024, 1 280, 20). Attention backend: PyTorch SDPA
(torch.nn.functional.scaled_dot_product_attention, what ComfyUI uses on NVIDIA), named in the header.

    python bench/attention_block.py --quick              # tiny shapes, CPU smoke run
    python bench/attention_block.py --iters 30 --json block.json

"q-only ToMe 0.5" emulates ComfyUI's TomePatchModel (merge queries only, K/V full) with this pack's matcher.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from bench_report import quick_settings  # noqa: E402  (devkit/bench_report.py)
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

load_pack()
from tokenfuse.scheduling import calibrate  # noqa: E402
from tokenfuse.scheduling.downsample import kv_downsample_functions  # noqa: E402
from tokenfuse.scheduling.patches import build_unet_patches  # noqa: E402
from tokenfuse.scheduling.schedule import Schedule  # noqa: E402
from tokenfuse.scheduling.telemetry import RunTelemetry  # noqa: E402

# name, grid h, grid w, channels, heads, level
CASES = [
    ("SD1.5 768 /8", 96, 96, 320, 8, 8),
    ("SD1.5 768 /16", 48, 48, 640, 8, 16),
    ("SD1.5 1024 /8", 128, 128, 320, 8, 8),
    ("SDXL 1024 /16", 64, 64, 640, 10, 16),
    ("SDXL 1024 /32", 32, 32, 1280, 20, 32),
]
QUICK_CASES = [("tiny /8", 24, 24, 64, 4, 8), ("tiny /16", 12, 12, 128, 4, 16)]


class Attn(torch.nn.Module):
    def __init__(self, c: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(c, c, bias=(i == 3)) for i in range(4))

    def forward(self, n: torch.Tensor, ctx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
        b, h = n.shape[0], self.heads
        q, k, v = self.q(n), self.k(ctx), self.v(val)
        q, k, v = (t.view(b, -1, h, t.shape[-1] // h).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.o(out.transpose(1, 2).reshape(b, -1, h * out.shape[-1]))


def block_call(attn: Attn, x: torch.Tensor, patches: Any, opts: dict) -> torch.Tensor:
    if patches is None:
        return attn(x, x, x)
    f, g = patches
    eo = dict(opts)
    n2, c2, v2 = f(x, x, x, eo)
    return g(attn(n2, c2, v2), eo)


def qonly_patches(schedule: Schedule) -> tuple[Callable, Callable]:
    f, g = build_unet_patches(schedule, RunTelemetry())

    def fq(n: torch.Tensor, ctx: Any, val: Any, eo: dict) -> tuple:
        n2, _, _ = f(n, ctx, val, eo)
        return n2, ctx, val

    return fq, g


def timeit(fn: Callable[[], Any], iters: int, cuda: bool) -> float:
    for _ in range(2):
        fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1000.0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 3 iterations: a CPU smoke run")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--json", default="", help="write {'rows': [{case, batch, device, variant, ms, vs_base}]}")
    args = ap.parse_args(argv)
    if args.quick:  # an explicit --iters is kept
        quick_settings(ap, args, argv, {"iters": 3})
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.float16 if cuda else torch.float32
    cases, iters = (QUICK_CASES if args.quick else CASES), args.iters
    name = torch.cuda.get_device_name() if cuda else f"cpu, {torch.get_num_threads()} threads"
    print(
        f"TokenFuse attention_block bench | {name} | {dtype} | attention backend: pytorch-sdpa "
        f"(torch.nn.functional.scaled_dot_product_attention) | batch {args.batch} | load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    rows = []
    for case, h, w, c, heads, level in cases:
        torch.manual_seed(0)
        attn = Attn(c, heads).to(dev, dtype)
        x = torch.randn(args.batch, h * w, c, device=dev, dtype=dtype)
        k = {8: 1, 16: 2, 32: 4, 64: 8}[level]
        opts = {"original_shape": [args.batch, 4, h * k, w * k], "transformer_index": 5, "block": ("input", 1)}
        variants: dict[str, Any] = {
            "baseline": None,
            "q-only ToMe 0.5 (TomePatchModel-like)": qonly_patches(
                Schedule(strategy="tome", ratios={level: 0.5}, protect_blocks=0)
            ),
            "tome 0.5 (q,k,v)": build_unet_patches(
                Schedule(strategy="tome", ratios={level: 0.5}, protect_blocks=0), RunTelemetry()
            ),
            "todo 2x2 avg": build_unet_patches(
                Schedule(strategy="todo", ratios={level: 0.75}, protect_blocks=0), RunTelemetry()
            ),
            "todo 1x2 avg": build_unet_patches(
                Schedule(strategy="todo", ratios={level: 0.5}, protect_blocks=0), RunTelemetry()
            ),
            "topk 0.5": build_unet_patches(
                Schedule(strategy="topk", ratios={level: 0.5}, protect_blocks=0), RunTelemetry()
            ),
        }
        with torch.inference_mode():
            base = None
            for vname, patches in variants.items():
                ms = timeit(lambda p=patches, a=attn, x=x, o=opts: block_call(a, x, p, o), iters, cuda)
                overhead = ""
                if patches is not None:
                    f, g = patches

                    def only_patch(f: Any = f, g: Any = g, x: torch.Tensor = x, opts: dict = opts) -> Any:
                        eo = dict(opts)
                        n2, _, _ = f(x, x, x, eo)
                        return g(n2, eo)

                    overhead = f"  patch-only {timeit(only_patch, iters, cuda):.3f} ms"
                base = ms if base is None else base
                print(f"{case:15s} {vname:40s} {ms:9.3f} ms  x{base / ms:5.2f}{overhead}", flush=True)
                rows.append(
                    {
                        "case": case,
                        "batch": args.batch,
                        "device": name,
                        "variant": vname,
                        "ms": ms,
                        "vs_base": base / ms,
                    }
                )
            check = calibrate.check_level(x, kv_downsample_functions(h, w, 0.75), level, heads, c // heads)
            print(
                f"{case:15s} {'device-aware calibration, todo 2x2':40s} {'kept' if check.kept else 'dropped'}: "
                f"{check.reason} (estimate full {check.full_ms:.3f} ms, reduced {check.reduced_ms:.3f} ms per call)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
