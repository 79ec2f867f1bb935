"""Benchmark: one U-Net step, unpatched vs ComfyUI's TomePatchModel vs TokenFuse presets, on real ComfyUI U-Net code.

Not a test. One process, one seed, random weights (valid for speed and memory, never for quality). Every variant
calls the U-Net the way sampling does: `model.apply_model(x, sigma, c_crossattn=..., y=..., transformer_options=...)`
with the patcher's transformer_options plus the keys ComfyUI's calc_cond_batch and CFGGuider add (cond_or_uncond,
uuids, sigmas, sample_sigmas); the timed sigma is the first step of a 20-step schedule (`--walk-steps`: each call
carries the next step's sigma and the run's step state, as ComfyUI's sampler path does with the pack's SAMPLER_SAMPLE
wrapper, so per-step work such as the lowvram presets' adaptive statistic, taken once per level and step, is timed
too, and a fresh sigma per call costs no device read). Batch 2 = one image with CFG; batch 8 approximates the
GPU-bound regime of a 4-8 GB card on a big GPU.

Columns: step time (median of --repeats interleaved rounds; the first, untimed call also runs the device-aware
calibration), ratio to the unpatched step and to TomePatchModel, activation peak memory (CUDA max_memory_allocated
above the weights; CPU: peak RSS with --cpu-peak only), our patch closures' cost per step (device-synced) and its share
of the attention time saved, output deviation (relative L2), calls reduced, tokens per level, and for device-aware
presets which levels the calibration kept and why.

The attention backend decides everything (DESIGN.md §2): `--backend sdpa` (default) forces PyTorch SDPA like ComfyUI
on NVIDIA; `--backend default` keeps ComfyUI's own choice (sub-quadratic on CPU). Run each backend as its own process.

    python bench/unet_step.py --comfyui /path/to/ComfyUI --quick                 # tiny smoke run, CPU
    python bench/unet_step.py --comfyui ... --device cpu --models sd15 --sizes 512,768 --batch 1,2
    python bench/unet_step.py --comfyui ... --device cuda --sizes 1024 --batch 2,8 --profile --json out.json

`--compile BACKEND` puts ComfyUI's TorchCompileModel wrapper (`set_torch_compile_wrapper`, e.g. `inductor`) on every
variant, baseline included, with dynamo's default limits as a user gets them: does a preset still pay over the
*compiled* unpatched U-Net? Compiled variants are timed one after another, dynamo reset before each (they share the
U-Net's code objects, so interleaved they would share one cache and recompile limit); the table gives each variant's
graph count and timed rounds. Use `--warmup 3` or more (the untimed calls compile); no closure timing is done.
`--no-tome` leaves the TomePatchModel variant out (one compile fewer when only baseline vs ours matters).

Presets: a comma list of preset[/strategy] (balanced, lowvram_8gb, balanced/tome, ...); `balanced-static` is balanced
with device_aware off (every level reduced whatever it costs), to show what the calibration changes.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
import comfy_models  # noqa: E402  (devkit/comfy_models.py)
import unet_bench as ub  # noqa: E402  (devkit/unet_bench.py)
from bench_report import quick_settings, write_json  # noqa: E402  (devkit/bench_report.py)
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)

DEFAULT_SIZES = {"sd15": [512, 768], "sdxl": [768]}
PRESETS = "balanced,balanced-static,lowvram_8gb,lowvram_4gb"


def make_variants(
    patcher: Any, presets: list[str], tome_ratio: float, control: bool = False, tome: bool = True
) -> list[ub.Variant]:
    """baseline, (control), TomePatchModel (unless tome is False: --no-tome), then one variant per preset."""
    glue = sys.modules["tokenfuse.nodes.glue.patcher"]
    node = sys.modules["tokenfuse.nodes.scheduler_node"]
    patching = sys.modules["tokenfuse.nodes.model_patching"]
    fam = glue.detect_family(patcher)
    variants = [
        ub.Variant("baseline", patcher),
        *([ub.Variant("baseline (control)", patcher.clone())] if control else []),
        *([ub.Variant(f"TomePatchModel {tome_ratio}", ub.tome_patch_model(patcher, tome_ratio))] if tome else []),
    ]
    for item in presets:
        preset, _, strategy = item.partition("/")
        static = preset.endswith("-static")
        schedule = node.schedule_from_widgets(preset.removesuffix("-static"), strategy or "preset", 0.0, fam.family)
        if static:
            schedule = replace(schedule, device_aware=False)
        m, telemetry = patching.schedule_model(patcher, schedule, fam)
        variants.append(ub.Variant(f"ours {item}", m, telemetry, schedule))
    return variants


def fresh_dynamo() -> int:
    """Dynamo's caches cleared, as in a fresh process (each compiled variant gets the default recompile limit to
    itself, like a user's one model); returns the graph counter before the variant runs."""
    torch._dynamo.reset()
    return comfy_models.dynamo_graphs()


def profile(name: str, run: Any, device: torch.device) -> None:
    """One profiled forward: busy time vs wall (GPU-bound when close), op count, host-device syncs (CUDA warns)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.no_grad():
        ub.sync(device)
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        t0 = time.perf_counter()
        with torch_profile(activities=acts) as prof:
            run()
            ub.sync(device)
        wall = (time.perf_counter() - t0) * 1000.0
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    events = prof.key_averages()
    if cuda:
        busy = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1000.0
        syncs = sum(e.count for e in events if "Synchronize" in e.key or "Memcpy" in e.key)
        print(f"  profile {name:26s} GPU kernels {busy:8.2f} ms, wall {wall:8.2f} ms, sync/memcpy events {syncs}")
    else:
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:3]
        tops = ", ".join(f"{e.key} {e.self_cpu_time_total / 1000:.1f} ms" for e in top)
        print(f"  profile {name:26s} wall {wall:8.2f} ms (profiled), {sum(e.count for e in events)} ops; top {tops}")


def face_crop_plan(batch: int, size: int) -> Any:
    """A TokenPlan like ScheduledFusion's crop-space plan on an aligned face crop (fusion/crops.crop_plan): a centred
    ellipse mask (the face, ~70 % of the crop) and the FFHQ template's landmarks, so the eyes and mouth are protected
    and the rest of the face is reducible; the plan-aware reduction path is what gets timed."""
    import numpy as np
    from tokenfuse.faces.align import template
    from tokenfuse.fusion.crops import crop_plan

    yy, xx = np.meshgrid(np.linspace(-1, 1, size), np.linspace(-1, 1, size), indexing="ij")
    face = ((xx / 0.92) ** 2 + (yy / 0.98) ** 2 <= 1.0).astype(np.float32)
    masks = np.repeat(face[None], batch, axis=0)
    landmarks = np.repeat(template(size)[None], batch, axis=0)
    return crop_plan(masks, landmarks=landmarks)


def bench_step(patcher: Any, family: str, size: int, batch: int, args: argparse.Namespace) -> list[ub.Variant]:
    import comfy.model_management as mm
    import comfy.patcher_extension
    import comfy.samplers

    device = mm.get_torch_device()
    inputs = comfy_models.model_inputs(patcher, family, (batch, size, size), seed=args.seed, tiny=args.quick)
    x = inputs.pop("x")
    inputs.pop("t")
    sample_sigmas = comfy.samplers.calculate_sigmas(patcher.model.model_sampling, "normal", 20).to(device)
    t = sample_sigmas[:1].expand(x.shape[0]).clone()

    def call(p: Any, to: dict) -> torch.Tensor:
        return p.model.apply_model(x, t, transformer_options=to, **inputs)

    from tokenfuse.scheduling.keys import PLAN_KEY, STEP_KEY
    from tokenfuse.scheduling.step_state import SamplingSteps

    plan = face_crop_plan(batch, size) if args.plan else None

    calls = itertools.count()
    # The run's host-side step (the SAMPLER_SAMPLE wrapper reads the sigmas once per run and advances the step in the
    # sampler's callback): without it every fresh sigma would be read to the host, a device sync per model call.
    steps_state = SamplingSteps(sample_sigmas.tolist(), source=sample_sigmas)

    def options(p: Any) -> dict:
        sigma = t
        if args.walk_steps:  # steps 0..19 in turn, across the variants' calls; wrapping round is a new sampling run
            step = next(calls) % (len(sample_sigmas) - 1)
            sigma = sample_sigmas[step : step + 1].expand(x.shape[0]).clone()
            steps_state.step = step
        to = ub.sampling_options(p, sigma, sample_sigmas, batch)
        if args.walk_steps:
            to[STEP_KEY] = steps_state
        if args.compile:  # the sampler hands the patcher's wrappers to apply_model (sampler_helpers.prepare_model)
            to["wrappers"] = comfy.patcher_extension.copy_nested_dicts(p.wrappers)
        if plan is not None:
            to[PLAN_KEY] = plan
        return to

    variants = make_variants(patcher, args.presets, args.tome_ratio, args.control, tome=not args.no_tome)
    graphs: list[int] = []
    if args.compile:
        for v in variants:
            v.patcher = comfy_models.torch_compiled(v.patcher, args.compile)
    timing = ub.Timing(
        args.repeats,
        args.warmup,
        args.cpu_peak,
        overhead=not (args.no_overhead or args.compile),
        isolate=(lambda: graphs.append(fresh_dynamo())) if args.compile else None,
    )
    ub.run_variants(variants, ub.StepCall(call, options, device), timing)
    for v, before, after in zip(variants, graphs, [*graphs[1:], comfy_models.dynamo_graphs()], strict=False):
        v.results["graphs"] = after - before
    if args.profile:
        for v in variants:
            profile(v.name, lambda v=v: call(v.patcher, options(v.patcher)), device)
    return variants


def print_table(title: str, variants: list[ub.Variant]) -> None:
    base = variants[0].results["ms"]
    tome = next((v.results["ms"] for v in variants if v.name.startswith("TomePatchModel")), None)  # None: --no-tome
    print(f"\n{title}")
    head = (
        f"{'variant':<26}{'step ms':>10}{'vs base':>9}{'vs tome':>9}{'peak MiB':>10}{'match ms':>10}"
        f"{'ovh/saved':>10}{'rel L2':>9}  {'reduced/calls':<14}tokens per level (per image)"
    )
    print(head)
    print("-" * len(head))
    for v in variants:
        r = v.results
        ovh = r.get("overhead_ms")
        gross = base - r["ms"] + (ovh or 0.0)
        share = f"{100 * ovh / gross:.1f}%" if ovh is not None and gross > 0 else ("-" if ovh is None else "n/a")
        calls = f"{r['calls'][0]}/{r['calls'][1]}" if "calls" in r else "-"
        vs_tome = f"{tome / r['ms']:.2f}x" if tome is not None else "-"
        flag = ("" if r["finite"] else "  NaN/Inf!") + ("" if r.get("ran", True) else "  PATCH NEVER RAN!")
        print(
            f"{v.name:<26}{r['ms']:>10.1f}{base / r['ms']:>8.2f}x{vs_tome:>9}{r['peak']:>10.1f}"
            f"{(f'{ovh:.2f}' if ovh is not None else '-'):>10}{share:>10}{r['dev']:>9.4f}  {calls:<14}"
            f"{r.get('levels', '-')}{flag}"
        )
        if r.get("device_aware"):
            print(f"{'':<26}  {r['device_aware']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH", ""), help="ComfyUI checkout (or COMFYUI_PATH)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default=None, help="default: fp16 on cuda, fp32 on cpu")
    p.add_argument(
        "--backend", choices=("sdpa", "default"), default="sdpa", help="sdpa: PyTorch SDPA; default: ComfyUI's"
    )
    p.add_argument("--models", default="sd15,sdxl", help="comma list of sd15, sdxl")
    p.add_argument("--sizes", default="", help="px sizes for every model (default: sd15 512,768; sdxl 768)")
    p.add_argument("--batch", default="2", help="comma list of batch sizes (2 = one image with CFG)")
    p.add_argument("--presets", default=PRESETS, help="comma list of preset[/strategy]; NAME-static = no calibration")
    p.add_argument("--tome-ratio", type=float, default=0.5)
    p.add_argument(
        "--no-tome",
        action="store_true",
        help="leave out the TomePatchModel variant (its 'vs tome' column shows '-'): under --compile each variant is "
        "one more full compile",
    )
    p.add_argument("--plan", action="store_true", help="pass a face-crop TokenPlan (ScheduledFusion's crop case)")
    p.add_argument(
        "--walk-steps",
        action="store_true",
        help="each call carries the next step's sigma (a fresh tensor, as sampling makes) and the run's step state "
        "(as the pack's sampler wrapper provides): per-step work such as the adaptive ratio's statistic is timed as in "
        "a run (the U-Net's own timestep input stays the first step's)",
    )
    p.add_argument(
        "--control", action="store_true", help="time an unpatched clone as its own row: its 'vs base' is the noise"
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--no-overhead", action="store_true", help="skip timing the patch closures (2 calls per variant)")
    p.add_argument("--profile", action="store_true", help="one profiled forward per variant after timing")
    p.add_argument("--cpu-peak", action="store_true", help="CPU peak RSS (slows steps: use in a memory-only run)")
    p.add_argument(
        "--json", default="", help="write {'rows': [{model, size, batch, device, variant, step_ms, vs_base}]}"
    )
    p.add_argument("--quick", action="store_true", help="tiny smoke run: narrow models, 128 px, 2 repeats")
    p.add_argument("--compile", default="", help="TorchCompileModel backend on every variant (inductor, eager, ...)")
    args = p.parse_args(argv)
    if not args.comfyui:
        p.error("--comfyui (or COMFYUI_PATH) must point at a ComfyUI checkout")
    args.dtype = args.dtype or ("fp16" if args.device == "cuda" else "fp32")
    args.models = [m for m in args.models.split(",") if m]
    args.presets = [s for s in args.presets.split(",") if s]
    args.batch = [int(b) for b in args.batch.split(",") if b]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.quick:
        sizes = sizes or [128]
        quick_settings(p, args, argv, {"repeats": 2})
    args.model_sizes = {m: sizes or DEFAULT_SIZES.get(m, [768]) for m in args.models}
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cpu" and args.cpu_peak:
        ub.track_large_allocations()
    comfy_models.setup_comfy(args.comfyui, cpu=args.device == "cpu", sdpa=args.backend == "sdpa")
    import comfy.model_management as mm

    load_pack()
    import tokenfuse.nodes.scheduler_node  # noqa: F401

    device = mm.get_torch_device()
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    backend = comfy_models.attention_backend()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(
        f"TokenFuse unet_step bench | device {device} ({name}) | {args.dtype} | attention backend: {backend} | "
        f"torch {torch.__version__} | seed {args.seed} | median of {args.repeats} | "
        f"{'QUICK tiny models' if args.quick else 'full architectures'} | load average {load[0]:.2f}"
        + (f" | TorchCompileModel backend {args.compile} on every variant" if args.compile else "")
    )
    torch.manual_seed(args.seed)
    rows: list[dict[str, Any]] = []
    for family in args.models:
        kw = {"model_channels": 32, "tiny": True} if args.quick else {"model_channels": 320}
        patcher = comfy_models.build_model(family, dtype=dtype, seed=args.seed, **kw)
        mm.load_models_gpu([patcher])
        for size in args.model_sizes[family]:
            for batch in args.batch:
                variants = bench_step(patcher, family, size, batch, args)
                print_table(
                    f"{family.upper()} U-Net, {size}x{size} px, latent {size // 8}x{size // 8}, batch {batch}, "
                    f"{backend}" + (f", TorchCompileModel {args.compile}" if args.compile else ""),
                    variants,
                )
                if args.compile:
                    for v in variants:
                        rounds = ", ".join(f"{t:.1f}" for t in v.results["rounds_ms"])
                        print(f"  {v.name:26s} dynamo graphs {v.results['graphs']:3d}; timed rounds ms: {rounds}")
                base = variants[0].results["ms"]
                for v in variants:
                    rows.append(
                        {
                            "model": family,
                            "size": size,
                            "batch": batch,
                            "device": str(device) if device.type == "cpu" else name,
                            "variant": v.name,
                            "step_ms": round(v.results["ms"], 3),
                            "vs_base": round(base / v.results["ms"], 4),
                            "backend": backend,
                            "dtype": args.dtype,
                            "quick": args.quick,
                            "device_aware": v.results.get("device_aware", ""),
                            "compile": args.compile,
                            "graphs": v.results.get("graphs"),
                            "match_ms": v.results.get("overhead_ms"),
                            "match_raw_ms": v.results.get("overhead_raw_ms"),
                            "timer_floor_us": v.results.get("timer_floor_us"),
                        }
                    )
                # after every table: a run stopped by a time cap keeps what it measured
                write_json(args.json, {"rows": rows})
        del patcher
        mm.unload_all_models()
        gc.collect()
        mm.soft_empty_cache()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(
        f"\nload average at the end {load[0]:.2f}. vs base / vs tome: speed ratio (>1 = faster). match ms: our patch "
        "closures per step, each call device-synced, less the timer's own cost per call (an empty closure timed the "
        "same way; the raw sum is match_raw_ms in the JSON). ovh/saved: match ms / (baseline - ours + match ms). "
        "rel L2: output vs baseline (random weights: speed/memory only). reduced/calls: attention calls whose tokens "
        "shrank / calls."
    )
    if args.json:
        write_json(args.json, {"rows": rows})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
