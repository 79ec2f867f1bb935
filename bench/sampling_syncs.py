"""Device syncs per step of a whole ComfyUI sampling run, unpatched vs TokenFuse's schedules (CUDA).

Real ComfyUI sampling (ScheduledFusion's sampling glue: `comfy.sample.sample` as KSampler calls it; euler, normal
schedule, full denoise) of a random-weight SD1.5 U-Net (SD1.5's width, one image with CFG; and a tiny Flux for the
DiT route, the attention override), each variant patched the way TokenSchedulerController patches it
(`schedule_model`: the attention patches, the SAMPLER_SAMPLE step-state wrapper, the step cache), with and without a
face-crop TOKEN_PLAN in the transformer options as the glue passes it. PyTorch's sync debug mode counts the
synchronising CUDA operations of each run (after a warm-up run of the same variant). ComfyUI's own sampling syncs
too (its sampler reads sigmas on the host, its progress code, ...): the unpatched row is that floor, and issue 11 §1
asks that ours adds nothing per step; per run, the wrapper's one read of the sigmas is expected (+1), and a
device-aware schedule (`balanced`) times its levels once per shape, in the warm-up run.

    python bench/sampling_syncs.py --comfyui PATH [--steps 20] [--size 512] [--json PATH]

Needs CUDA for the counts (sync debug mode is CUDA only); on other devices it samples every variant as on a GPU
and prints that nothing was measured (a smoke run of the code paths).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {  # name -> (preset, schedule_text)
    "balanced": ("balanced", ""),
    "lowvram_8gb": ("lowvram_8gb", ""),
    "tome 0.5 /8": ("balanced", '{"strategy": "tome", "ratios": {"8": 0.5}, "device_aware": false}'),
    "step cache": ("off", '{"cache_interval": 3}'),
    "balanced + step cache": ("balanced", '{"cache_interval": 3}'),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH", ""), help="ComfyUI checkout")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--size", type=int, default=512, help="image side in px (latent = size / 8)")
    ap.add_argument("--width", type=int, default=320, help="U-Net base channels (320 = SD1.5; 32 for a smoke run)")
    ap.add_argument("--json", default="", help="write {'rows': [...]} here")
    a = ap.parse_args(argv)
    if not a.comfyui:
        ap.error("needs ComfyUI: --comfyui PATH or COMFYUI_PATH")
    sys.path.insert(0, str(REPO / "devkit"))
    import comfy_models
    from pack_loader import load_pack

    cuda = torch.cuda.is_available()
    comfy_models.setup_comfy(a.comfyui, cpu=not cuda, sdpa=True)
    import comfy.utils

    comfy.utils.PROGRESS_BAR_ENABLED = False
    load_pack()
    from tokenfuse.devkit.patch_replay import count_syncs, face_plan
    from tokenfuse.nodes.glue import patcher, sampling
    from tokenfuse.nodes.model_patching import schedule_model
    from tokenfuse.scheduling.widgets import schedule_from_widgets

    dtype = torch.float16 if cuda else torch.float32
    tiny = a.width < 320
    sd15 = comfy_models.build_model("sd15", model_channels=a.width, tiny=tiny, dtype=dtype)
    flux = comfy_models.build_model("flux", tiny=True, dtype=dtype)  # the DiT route (attention override), tiny
    plan = face_plan(a.size)

    def sampler(family: str, size: int, with_plan: bool = False) -> Any:
        """ScheduledFusion's sampling glue (comfy.sample.sample as KSampler calls it; a plan reaches the patches
        through the transformer options of a clone), euler, cfg 5, full denoise."""
        pos = comfy_models.conditioning(family, seed=1, tiny=tiny or family == "flux")
        neg = comfy_models.conditioning(family, seed=2, tiny=tiny or family == "flux")
        latent = torch.zeros(1, comfy_models.latent_channels(family), size // 8, size // 8)
        args = sampling.SamplerArgs(a.steps, 5.0, "euler", "normal", 1.0)
        call = sampling.SampleCall(args, pos, neg, plan if with_plan else None)
        return lambda m: sampling.sample(m, latent, None, [0], call)

    def scheduled(model: Any, family: str, preset: str, text: str) -> tuple[Any, Any]:
        """The node's own widgets -> Schedule path (preset, then the text override), then its patching."""
        schedule = schedule_from_widgets(preset, "preset", 0.0, family, text)
        return schedule_model(model, schedule, patcher.detect_family(model))  # type: ignore[no-any-return]

    # (name, model, telemetry, sample, name of its unpatched row)
    run15, run15_plan, runflux = sampler("sd15", a.size), sampler("sd15", a.size, True), sampler("flux", 128)
    variants: list[tuple[str, Any, Any, Any, str]] = [
        ("unpatched", sd15, None, run15, "unpatched"),
        ("unpatched + plan", sd15, None, run15_plan, "unpatched + plan"),
    ]
    for name, (preset, text) in VARIANTS.items():
        patched, telemetry = scheduled(sd15, "sd15", preset, text)
        variants += [(name, patched, telemetry, run15, "unpatched")]
        variants += [(name + " + plan", patched, telemetry, run15_plan, "unpatched + plan")]
    patched, telemetry = scheduled(flux, "dit", "balanced", '{"protect_blocks": 0}')
    variants += [("flux: unpatched", flux, None, runflux, "flux: unpatched")]
    variants += [("flux: balanced (attention override)", patched, telemetry, runflux, "flux: unpatched")]
    count = count_syncs if cuda else (lambda fn: (fn(), 0)[1])
    rows: list[dict[str, Any]] = []
    for name, m, telemetry, sample, base_name in variants:
        sample(m)  # warm-up: loads the model, builds tables, calibrates
        if telemetry is not None:
            telemetry.reset()
        syncs = count(lambda m=m, sample=sample: sample(m))
        summary = telemetry.summary() if telemetry is not None else {}
        base = next((r["syncs_per_run"] for r in rows if r["variant"] == base_name), syncs)
        rows.append(
            {
                "variant": name,
                "syncs_per_run": syncs,
                "syncs_per_step": syncs / a.steps,
                "vs_unpatched": syncs - base,
                "steps": a.steps,
                "attention_calls": telemetry.calls if telemetry is not None else None,
                "reduced_calls": summary.get("reduced_calls"),
            }
        )
    device = torch.cuda.get_device_name(0) if cuda else "cpu (nothing counted: sync debug mode is CUDA only)"
    head = f"device syncs of a whole sampling run, SD1.5 width {a.width} at {a.size} px and a tiny Flux at 128 px"
    print(f"{head}, {a.steps} steps, {device}")
    print(f"{'variant':38s} {'per run':>8s} {'per step':>9s} {'vs unpatched':>13s}  reduced/patched calls")
    for r in rows:
        calls = "-" if r["attention_calls"] is None else f"{r['reduced_calls']}/{r['attention_calls']}"
        print(
            f"{r['variant']:38s} {r['syncs_per_run']:8d} {r['syncs_per_step']:9.2f} {r['vs_unpatched']:+13d}  {calls}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "device": device}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
