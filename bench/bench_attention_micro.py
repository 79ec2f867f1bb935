"""Micro-benchmark: one BasicTransformerBlock-sized self-attention (to_q/k/v + SDPA + to_out) per strategy.

Prints baseline and each strategy from the same run, as time and speed ratio, plus the patch overhead where it can be
separated. Default shapes: SD1.5 at 768 px, top level (9216 tokens, 320 ch, 8 heads) and /16 (2304, 640, 8 heads),
SDXL 1024 px /16 (4096, 640, 10 heads) and /32 (1024, 1280, 20 heads). Needs a GPU for meaningful numbers; on CPU
use --tiny for a smoke run.

    python bench/bench_attention_micro.py [--tiny] [--iters 30]

"q-only ToMe 0.5" emulates ComfyUI's TomePatchModel (merge queries only, K/V full) with this pack's matcher.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

load_pack()
from tokenfuse.scheduling.patches import build_unet_patches  # noqa: E402
from tokenfuse.scheduling.schedule import Schedule  # noqa: E402
from tokenfuse.scheduling.telemetry import RunTelemetry  # noqa: E402


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


def block_call(attn: Attn, x: torch.Tensor, patches, opts: dict) -> torch.Tensor:
    n = x
    if patches is None:
        return attn(n, n, n)
    f, g = patches
    eo = dict(opts)
    n2, c2, v2 = f(n, n, n, eo)
    return g(attn(n2, c2, v2), eo)


def qonly_patches(schedule: Schedule, tel: RunTelemetry):
    f, g = build_unet_patches(schedule, tel)

    def fq(n, ctx, val, eo):
        n2, _, _ = f(n, ctx, val, eo)
        return n2, ctx, val

    return fq, g


def timeit(fn, iters: int, cuda: bool) -> float:
    for _ in range(3):
        fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="small shapes for a CPU smoke run")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.float16 if cuda else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = True
    cases = [
        ("SD1.5 768 /8", 96, 96, 320, 8, 8),
        ("SD1.5 768 /16", 48, 48, 640, 8, 16),
        ("SDXL 1024 /16", 64, 64, 640, 10, 16),
        ("SDXL 1024 /32", 32, 32, 1280, 20, 32),
    ]
    if args.tiny:
        cases = [("tiny /8", 24, 24, 64, 4, 8)]
    tel = RunTelemetry()
    for name, h, w, c, heads, level in cases:
        torch.manual_seed(0)
        attn = Attn(c, heads).to(dev, dtype)
        x = torch.randn(2, h * w, c, device=dev, dtype=dtype)
        # latent grid whose level-`level` grid is h x w
        k = {8: 1, 16: 2, 32: 4, 64: 8}[level]
        opts = {"original_shape": [2, 4, h * k, w * k], "transformer_index": 5, "block": ("input", 1), "block_index": 0}
        variants = {
            "baseline": None,
            "q-only ToMe 0.5 (TomePatchModel-like)": qonly_patches(
                Schedule(strategy="tome", ratios={level: 0.5}, protect_blocks=0), tel
            ),
            "tome 0.5 (q,k,v)": build_unet_patches(
                Schedule(strategy="tome", ratios={level: 0.5}, protect_blocks=0), tel
            ),
            "todo 2x2 avg": build_unet_patches(Schedule(strategy="todo", ratios={level: 0.75}, protect_blocks=0), tel),
            "todo 1x2 avg": build_unet_patches(Schedule(strategy="todo", ratios={level: 0.5}, protect_blocks=0), tel),
            "topk 0.5": build_unet_patches(Schedule(strategy="topk", ratios={level: 0.5}, protect_blocks=0), tel),
        }
        with torch.inference_mode():
            base = None
            for vname, patches in variants.items():
                ms = timeit(lambda p=patches, a=attn, x=x, o=opts: block_call(a, x, p, o), args.iters, cuda)
                overhead = ""
                if patches is not None:
                    f, g = patches

                    def only_patch(f=f, g=g, x=x, opts=opts):
                        eo = dict(opts)
                        n2, _, _ = f(x, x, x, eo)
                        return g(n2, eo)

                    overhead = f"  patch-only {timeit(only_patch, args.iters, cuda):.3f} ms"
                base = ms if base is None else base
                print(f"{name:15s} {vname:40s} {ms:8.3f} ms  speed x{base / ms:5.2f}{overhead}", flush=True)


if __name__ == "__main__":
    main()
