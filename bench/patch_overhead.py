"""Micro bench: host cost of TokenFuse's attention patch closures alone (no U-Net, no attention).

Replays the attn1_patch / attn1_output_patch calls of one SD1.5 U-Net model call (16 transformer blocks at /8 /16 /32
/64, ComfyUI's extra_options keys, a fresh options dict per block as ComfyUI makes) for `--steps` sampling steps,
with tiny tensors (batch 1, 4 channels, 128 px by default) so the tensor work is small; it is timed alone too and
subtracted, so what is left is the Python around it.
Prints, from one run, µs per attention call for: the bare loop (dict copy + calls of an identity function: the floor),
`off`, `balanced` (todo 2x2 at /8 /16; /32 and /64 are identity calls), and `tome`; and the bare K/V pool op alone.
The target of issue 11 is <= 10 µs per patched call on the CPU side.

    python bench/patch_overhead.py [--steps 20] [--repeats 5] [--size 768] [--json PATH]

Device: CPU (host cost is device-independent apart from the kernel launches, which are the same as unpatched).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

load_pack()
from tokenfuse.scheduling.downsample import kv_downsample_functions  # noqa: E402
from tokenfuse.scheduling.patches import build_unet_patches  # noqa: E402
from tokenfuse.scheduling.schedule import Schedule, preset_schedule  # noqa: E402
from tokenfuse.scheduling.telemetry import RunTelemetry  # noqa: E402

# SD1.5 transformer blocks in call order: (block, level factor)
SD15_BLOCKS: list[tuple[tuple[str, int], int]] = (
    [(("input", 1), 8), (("input", 2), 8), (("input", 4), 16), (("input", 5), 16)]
    + [(("input", 7), 32), (("input", 8), 32), (("middle", 0), 64)]
    + [(("output", i), 32) for i in (3, 4, 5)]
    + [(("output", i), 16) for i in (6, 7, 8)]
    + [(("output", i), 8) for i in (9, 10, 11)]
)


def model_call_options(size: int, steps: int) -> list[dict[str, Any]]:
    """One transformer_options dict per step, as ComfyUI builds them (new sigmas tensor and shape list per call)."""
    sample_sigmas = torch.linspace(14.6, 0.0, steps + 1)
    lat = size // 8
    return [
        {
            "original_shape": [1, 4, lat, lat],
            "sigmas": sample_sigmas[i : i + 1].clone(),
            "sample_sigmas": sample_sigmas,
            "n_heads": 8,
            "dim_head": 40,
            "cond_or_uncond": [0],
        }
        for i in range(steps)
    ]


def block_tensors(size: int) -> dict[int, torch.Tensor]:
    lat = size // 8
    out = {}
    for k, level in enumerate((8, 16, 32, 64)):
        side = lat
        for _ in range(k):
            side = (side + 1) // 2
        out[level] = torch.randn(1, side * side, 4)
    return out


def replay(patches: tuple[Any, Any] | None, opts: list[dict[str, Any]], xs: dict[int, torch.Tensor]) -> int:
    """All attention calls of len(opts) model calls; returns the number of calls."""
    calls = 0
    for topts in opts:
        topts = dict(topts)
        for tidx, (block, level) in enumerate(SD15_BLOCKS):
            eo = dict(topts)
            eo["block"] = block
            eo["block_index"] = 0
            eo["transformer_index"] = tidx
            n = xs[level]
            if patches is None:
                n2, c2, v2 = n, n, n
                _ = n2
            else:
                f, g = patches
                n2, c2, v2 = f(n, n, n, eo)
                g(n2, eo)
            calls += 1
    return calls


def time_variant(make: Any, opts: list[dict[str, Any]], xs: dict[int, torch.Tensor], repeats: int) -> float:
    """Best µs per attention call over `repeats` runs (a fresh patch pair and telemetry per run, like a new run)."""
    best = float("inf")
    for _ in range(repeats):
        patches = make()
        replay(patches, opts[:1], xs)  # warm the per-shape tables, like the first model call does
        t0 = time.perf_counter()
        calls = replay(patches, opts, xs)
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--size", type=int, default=128, help="image size in px (latent = size / 8); small = host cost only"
    )
    parser.add_argument("--json", default="", help="write {'rows': [...]} here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    opts = model_call_options(args.size, args.steps)
    xs = block_tensors(args.size)

    def schedule_patches(schedule: Schedule) -> Any:
        return lambda: build_unet_patches(schedule, RunTelemetry())

    variants: list[tuple[str, Any]] = [
        ("bare loop (no patch)", lambda: None),
        ("off", schedule_patches(preset_schedule("off", "sd15"))),
        ("balanced (todo /8 /16)", schedule_patches(preset_schedule("balanced", "sd15"))),
        ("tome 0.5 /8", schedule_patches(Schedule(strategy="tome", ratios={8: 0.5}, protect_blocks=0))),
    ]
    rows = []
    base = None
    print(f"patch overhead, SD1.5 {args.size} px call pattern, {args.steps} steps x {len(SD15_BLOCKS)} calls, CPU")
    print(f"{'variant':28s} {'us/call':>8s} {'over bare':>10s}")
    for name, make in variants:
        us = time_variant(make, opts, xs, args.repeats)
        base = us if base is None else base
        rows.append({"variant": name, "us_per_call": round(us, 2), "over_bare_us": round(us - base, 2)})
        print(f"{name:28s} {us:8.2f} {us - base:10.2f}")
    # The tensor work of balanced alone: the same pool ops on the same tensors, outside any patch.
    lat = args.size // 8
    pools = {level: kv_downsample_functions(s, s, 0.75, "avg") for level, s in ((8, lat), (16, (lat + 1) // 2))}
    reduced = [level for _, level in SD15_BLOCKS if level in pools]
    for _ in range(20):
        for level in reduced:
            pools[level](xs[level])
    best = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            for level in reduced:
                pools[level](xs[level])
        best = min(best, (time.perf_counter() - t0) / (args.steps * len(SD15_BLOCKS)) * 1e6)
    bal = next(r for r in rows if r["variant"].startswith("balanced"))
    host = bal["us_per_call"] - best - rows[0]["us_per_call"]
    host_per_reduced = host * len(SD15_BLOCKS) / len(reduced)
    rows.append({"variant": "balanced tensor ops alone", "us_per_call": round(best, 2), "over_bare_us": None})
    rows.append({"variant": "balanced host cost", "us_per_call": round(host, 2), "over_bare_us": None})
    print(f"{'balanced tensor ops alone':28s} {best:8.2f}   (the {len(reduced)} pools per model call, outside patches)")
    print(f"{'balanced host cost':28s} {host:8.2f}   per call; {host_per_reduced:.2f} per reduced call (target <= 10)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
