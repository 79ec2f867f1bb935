"""U-Net speed: baseline vs ComfyUI's TomePatchModel vs TokenFuse schedules, one process, same inputs, as ratios.

Builds full-size random-weight SD1.5 / SDXL U-Nets from ComfyUI's own UNetModel (no checkpoint), fp16, and times
one denoiser forward (batch 2 = cond + uncond) with the patches passed through transformer_options exactly as a
ModelPatcher would. Needs a GPU and a ComfyUI checkout:

    python bench/bench_unet_sched.py --comfyui /path/to/ComfyUI [--iters 10] [--families sd15,sdxl]

Random weights are valid for speed only. The attention backend is printed (SDPA is what NVIDIA users get).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

UNET = {
    "sd15": dict(
        image_size=32,
        in_channels=4,
        out_channels=4,
        model_channels=320,
        num_res_blocks=[2, 2, 2, 2],
        channel_mult=[1, 2, 4, 4],
        num_heads=8,
        transformer_depth=[1, 1, 1, 1, 1, 1, 0, 0],
        transformer_depth_middle=1,
        transformer_depth_output=[1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
        context_dim=768,
        use_linear_in_transformer=False,
        use_spatial_transformer=True,
        legacy=False,
    ),
    "sdxl": dict(
        image_size=32,
        in_channels=4,
        out_channels=4,
        model_channels=320,
        num_res_blocks=[2, 2, 2],
        channel_mult=[1, 2, 4],
        num_head_channels=64,
        transformer_depth=[0, 0, 2, 2, 10, 10],
        transformer_depth_middle=10,
        transformer_depth_output=[0, 0, 0, 2, 2, 2, 10, 10, 10],
        context_dim=2048,
        use_linear_in_transformer=True,
        use_spatial_transformer=True,
        legacy=False,
        num_classes="sequential",
        adm_in_channels=2816,
    ),
}
SIZES = {"sd15": (768, 512), "sdxl": (1024,)}


def build(family: str, device: torch.device):
    import comfy.ops
    from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel

    model = UNetModel(**UNET[family], dtype=torch.float16, device=device, operations=comfy.ops.disable_weight_init)
    gen = torch.Generator(device=device).manual_seed(0)
    norms = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm)) and m.weight is not None
    }
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:  # 0.5 x fan-in scaling keeps a deep fp16 random net finite
                p.normal_(0.0, 0.5 / math.sqrt(math.prod(p.shape[1:])), generator=gen)
            else:
                p.fill_(1.0) if id(p) in norms else p.zero_()
    return model.eval()


def tomesd_patches(ratio: float):
    """Exactly TomePatchModel's closures (ComfyUI's own get_functions, q-only merge at the top level)."""
    try:
        from comfy_extras.nodes_tomesd import get_functions
    except ImportError:  # comfy_api's import chain needs packages a bare GPU box may lack; the math needs none
        import types

        class _AnyAttr:
            def __getattr__(self, name: str) -> type:
                return object

        stub = types.ModuleType("comfy_api.latest")
        stub.ComfyExtension = object
        stub.io = _AnyAttr()
        for key in [k for k in sys.modules if k.startswith("comfy_api")]:
            del sys.modules[key]
        sys.modules["comfy_api"] = types.ModuleType("comfy_api")
        sys.modules["comfy_api.latest"] = stub
        from comfy_extras.nodes_tomesd import get_functions

    u = None

    def tomesd_m(q, k, v, extra_options):
        nonlocal u
        m, u = get_functions(q, ratio, extra_options["original_shape"])
        return m(q), k, v

    def tomesd_u(n, extra_options):
        return u(n)

    return tomesd_m, tomesd_u


def _profile(name: str, run) -> None:
    """GPU kernel time vs wall time of one forward (GPU-bound when close), with sync warnings switched on."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1000.0
        torch.cuda.set_sync_debug_mode("default")
    events = prof.key_averages()
    gpu = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in events) / 1000.0
    syncs = sum(e.count for e in events if "Synchronize" in e.key or "Memcpy" in e.key)
    print(
        f"  profile {name:38s} GPU kernels {gpu:7.2f} ms, wall {wall:7.2f} ms (profiled), "
        f"{sum(e.count for e in events if e.device_type.name == 'CUDA')} kernels, sync/memcpy events {syncs}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfyui", required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--families", default="sd15,sdxl")
    ap.add_argument("--batch", type=int, default=2, help="2 = cond+uncond of one image; larger = GPU-bound regime")
    ap.add_argument("--rounds", type=int, default=2, help="time every variant this many times, interleaved")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="per variant: warn on host-device syncs and print GPU-busy vs wall time (one forward)",
    )
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.comfyui).resolve()))
    import comfy.cli_args

    comfy.cli_args.args.use_pytorch_cross_attention = True
    import comfy.ldm.modules.attention as attention
    import comfy.model_management  # noqa: F401

    load_pack()
    from tokenfuse.scheduling.patches import build_unet_patches
    from tokenfuse.scheduling.schedule import Schedule, preset_schedule
    from tokenfuse.scheduling.telemetry import RunTelemetry

    dev = torch.device("cuda")
    print(
        f"attention backend: {attention.optimized_attention.__name__}, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name()}",
        flush=True,
    )
    for family in args.families.split(","):
        model = build(family, dev)
        ctx_dim = UNET[family]["context_dim"]
        for px in SIZES[family]:
            g = torch.Generator(device=dev).manual_seed(1)
            x = torch.randn(args.batch, 4, px // 8, px // 8, device=dev, dtype=torch.float16, generator=g)
            t = torch.full((args.batch,), 500.0, device=dev)
            context = torch.randn(args.batch, 77, ctx_dim, device=dev, dtype=torch.float16, generator=g)
            y = None
            if family == "sdxl":
                y = torch.randn(args.batch, 2816, device=dev, dtype=torch.float16, generator=g)
            sample_sigmas = torch.linspace(14.6, 0.0, 21, device=dev)
            variants = {"baseline": None, "ComfyUI TomePatchModel 0.5": tomesd_patches(0.5)}
            for preset in ("balanced", "lowvram_8gb", "lowvram_4gb"):
                variants[f"tokenfuse {preset}"] = preset_schedule(preset, family)
            variants["tokenfuse tome 0.5 top attn level"] = Schedule(
                strategy="tome", ratios={8 if family == "sd15" else 16: 0.5}, protect_blocks=0
            )
            first = 8 if family == "sd15" else 16
            variants[f"tokenfuse todo 2x2 /{first} only"] = Schedule(
                strategy="todo", ratios={first: 0.75}, protect_blocks=0
            )
            variants["tokenfuse balanced + protect 2 blocks"] = Schedule(
                **{**preset_schedule("balanced", family).to_dict(), "protect_blocks": 2}
            )
            times: dict[str, list[float]] = {name: [] for name in variants}
            info: dict[str, tuple[float, float]] = {}
            ref = None
            for rnd in range(args.rounds):
                for name, v in variants.items():
                    tel = RunTelemetry()
                    topts: dict = {
                        "sigmas": sample_sigmas[2:3].expand(args.batch).contiguous(),
                        "sample_sigmas": sample_sigmas,
                    }
                    if v is not None:
                        f, gpatch = build_unet_patches(v, tel) if isinstance(v, Schedule) else v
                        topts["patches"] = {"attn1_patch": [f], "attn1_output_patch": [gpatch]}

                    def run(topts=topts, model=model, x=x, t=t, context=context, y=y):
                        return model(x, t, context, y=y, transformer_options=dict(topts))

                    with torch.inference_mode():
                        for _ in range(3):
                            out = run()
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        for _ in range(args.iters):
                            out = run()
                        torch.cuda.synchronize()
                    times[name].append((time.perf_counter() - t0) / args.iters * 1000.0)
                    if args.profile and rnd == 0:
                        _profile(name, run)
                    ref = out.float() if ref is None else ref
                    rel = ((out.float() - ref).norm() / ref.norm()).item()
                    info[name] = (rel, tel.summary()["attention_pairs_saved_pct"] if tel.calls else 0.0)
            base_ms = min(times["baseline"])
            tome_ms = min(times["ComfyUI TomePatchModel 0.5"])
            for name in variants:
                ms = min(times[name])
                print(
                    f"{family} {px}px b{args.batch} {name:38s} {ms:8.2f} ms  x{base_ms / ms:5.2f} vs baseline  "
                    f"x{tome_ms / ms:5.2f} vs Tome0.5  rel.diff {info[name][0]:.3f}  "
                    f"attn pairs saved {info[name][1]:5.1f}%",
                    flush=True,
                )
        model = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
