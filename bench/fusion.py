"""Face refinement cost: naive full-frame img2img vs FaceDetailer-style crop vs ScheduledFusion (crop + schedule).

One process, one seed, real ComfyUI code (comfy.sample.sample, comfy.sd.VAE), random weights of the full SD1.5
U-Net and SD VAE architectures (valid for speed and memory, never for quality). Per frame size it prints top-level
U-Net tokens, wall time and peak memory beyond the weights, and the ratios (a)/(c):

    (a) naive   : VAE-encode the whole frame, img2img at denoise, decode the whole frame
    (b) crop G  : ScheduledFusion on the unscheduled model at guide G (FaceDetailer-style), G in --guides
    (c) ours    : ScheduledFusion at guide 512 on a TokenSchedulerController-patched model with a token plan
    (d) ours+cache / (e) cache : (c) with the step cache added (--cache, a schedule_text such as
                  '{"cache_interval": 3}'), and the step cache alone (preset off); only with --cache

    python bench/fusion.py --comfyui /path/to/ComfyUI --device cuda --dtype fp16 --steps 20 --caps 4,8 --repeats 3
    python bench/fusion.py --comfyui /path/to/ComfyUI --quick          # CPU smoke run (tiny model, small frames)
    COMFYUI_PATH=/path/to/ComfyUI python bench/fusion.py --quick       # the checkout from COMFYUI_PATH instead

--caps (CUDA) reruns (a) and (c) at the largest frame under torch.cuda.set_per_process_memory_fraction caps (GB)
and says which fit. Peak memory: CUDA max_memory_allocated minus what was allocated with the weights loaded
(the number that matters). CPU: peak RSS (VmHWM, reset per case through /proc/self/clear_refs) minus the RSS before
the case; indicative only, since memory freed by an earlier case is reused without raising RSS (run a case alone
with --frames/--guides).
Artifact reruns are off here (fallback "oom-only"): random weights produce garbage, and a rerun would time twice.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
import comfy_models as cm  # noqa: E402  (devkit/comfy_models.py)
from astronaut import astronaut_faces, astronaut_frame  # noqa: E402  (devkit/astronaut.py)
from bench_report import quick_settings  # noqa: E402  (devkit/bench_report.py)
from pack_loader import load_pack  # noqa: E402  (devkit/pack_loader.py)


class Meter:
    """Peak memory beyond a baseline, per case: CUDA allocator stats, or the process's peak RSS on CPU (Linux)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    @staticmethod
    def _status(field: str) -> int | None:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            except OSError:
                pass
            self.base = self._status("VmRSS")

    def peak(self) -> int | None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device) - self.base)
        hwm = self._status("VmHWM")
        return None if hwm is None or self.base is None else max(0, hwm - self.base)


def timed(meter: Meter, fn: Callable[[], Any]) -> tuple[Any, float, int | None, str]:
    """(result, seconds, peak bytes beyond the start, error or "")."""
    import comfy.model_management as mm

    mm.soft_empty_cache()
    meter.start()
    t0 = time.perf_counter()
    try:
        out = fn()
        err = ""
    except mm.OOM_EXCEPTION as exc:  # noqa: F841 - reported as OOM
        out, err = None, "OOM"
    if meter.cuda:
        torch.cuda.synchronize(meter.device)
    dt = time.perf_counter() - t0
    peak = meter.peak()
    mm.soft_empty_cache()
    return out, dt, peak, err


def naive(model: Any, vae: Any, frame: np.ndarray, args: argparse.Namespace, cond: Any) -> Any:
    from tokenfuse.nodes.glue import sampling

    px = torch.from_numpy(frame)[None]
    lat = sampling.vae_encode(vae, px, False)
    sampler = sampling.SamplerArgs(args.steps, args.cfg, "euler", "normal", args.denoise)
    out = sampling.sample(model, lat, None, [args.seed], sampling.SampleCall(sampler, cond[0], cond[1]))
    return sampling.vae_decode(vae, out, False)


def crop(
    model: Any, vae: Any, frame: np.ndarray, faces: Any, guide: int, plan: Any, args: argparse.Namespace, cond: Any
) -> str:
    from tokenfuse.nodes.fusion_node import ScheduledFusion

    _, _, report = ScheduledFusion().fuse(
        model,
        vae,
        cond[0],
        cond[1],
        torch.from_numpy(frame)[None],
        faces,
        args.seed,
        args.steps,
        args.cfg,
        "euler",
        "normal",
        args.denoise,
        guide,
        max(guide, 1024),
        1.0,
        0.04,
        1,
        "oom-only",
        token_plan=plan,
    )
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH", ""), help="ComfyUI checkout (or COMFYUI_PATH)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--denoise", type=float, default=0.45)
    ap.add_argument("--cfg", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--frames", default="1024,2048", help="frame sides for (a)")
    ap.add_argument("--guides", default="512,1024", help="guide sizes for (b)")
    ap.add_argument("--ours-guide", type=int, default=512)
    ap.add_argument("--preset", default="balanced", help="TokenSchedulerController preset for (c)")
    ap.add_argument("--cache", default="", help='step-cache schedule_text for rows (d)/(e), e.g. {"cache_interval": 3}')
    ap.add_argument("--caps", default="", help="CUDA memory caps in GB for (a) vs (c) at the largest frame, e.g. 4,8")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny U-Net/VAE, frames 256,512, guides 64,128")
    ap.add_argument(
        "--repeats", type=int, default=1, help="interleaved rounds of the crop cases per frame ((a) once); median time"
    )
    args = ap.parse_args(argv)
    if not args.comfyui:
        ap.error("needs ComfyUI: --comfyui PATH or COMFYUI_PATH")
    if args.quick:  # tiny models; options given on the command line are kept
        quick_settings(ap, args, argv, {"frames": "256,512", "guides": "64,128", "ours_guide": 64, "steps": 2})
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]

    cm.setup_comfy(args.comfyui, cpu=args.device == "cpu", sdpa=True)
    load_pack()
    import comfy.model_management as mm
    import comfy.utils

    comfy.utils.PROGRESS_BAR_ENABLED = False
    from tokenfuse.nodes.scheduler_node import TokenSchedulerController
    from tokenfuse.scheduling.plan import TokenPlan

    device = mm.get_torch_device()
    model = cm.build_model("sd15", model_channels=32 if args.quick else 320, tiny=args.quick, dtype=dtype)
    vae = cm.build_vae(32 if args.quick else 128, dtype=dtype if args.device == "cuda" else None)
    cond = (cm.conditioning("sd15", seed=1), cm.conditioning("sd15", seed=2))
    plan = TokenPlan(importance=torch.ones(1, 8, 8), image_size=(8, 8))  # presence switches crop-space plans on
    ours_model, sched_report = TokenSchedulerController().apply(model, args.preset, "preset", 0.0, plan)
    cached: list[tuple[str, Any]] = []
    if args.cache:  # the step cache (issue 11.3): on top of the preset, and alone
        both, _ = TokenSchedulerController().apply(model, args.preset, "preset", 0.0, plan, schedule_text=args.cache)
        alone, _ = TokenSchedulerController().apply(model, "off", "preset", 0.0, plan, schedule_text=args.cache)
        cached = [(f"(d) ours+cache {args.ours_guide}", both), (f"(e) cache {args.ours_guide}", alone)]
    mm.load_models_gpu([model, vae.patcher])
    meter = Meter(torch.device(device))
    print(
        f"# device {device}, dtype {args.dtype}, attention {cm.attention_backend()}, steps {args.steps}, "
        f"denoise {args.denoise}, seed {args.seed}, {'TINY quick' if args.quick else 'full SD1.5 + SD VAE'}"
    )
    print(f"# (c) {sched_report}")
    if cached:
        print(f"# (d) = (c) + step cache {args.cache}; (e) = preset off + step cache")
    # warm-up (CUDA context, cuDNN/SDPA kernel choice) so the first timed case is not charged for it
    warm = argparse.Namespace(**{**vars(args), "steps": 1})
    naive(model, vae, astronaut_frame(256), warm, cond)
    crop(ours_model, vae, astronaut_frame(512), astronaut_faces(512), args.ours_guide, plan, warm, cond)
    frames = [int(v) for v in args.frames.split(",")]
    guides = [int(v) for v in args.guides.split(",")]
    print(
        f"{'frame':>6} {'case':<16} {'tokens':>8} {'time s':>8} {'peak MiB':>9} {'tok x':>6} {'time x':>7} "
        f"{'mem -%':>7}"
    )

    def fmt_mem(b: int | None) -> str:
        return "n/a" if b is None else f"{b / 2**20:.0f}"

    for size in frames:
        frame = astronaut_frame(size)
        faces = astronaut_faces(size)
        cases: list[tuple[str, int, Callable[[], Any]]] = [
            ("(a) naive", (size // 8) ** 2, lambda f=frame: naive(model, vae, f, args, cond))
        ]
        for g in guides:
            cases.append(
                (
                    f"(b) crop {g}",
                    (g // 8) ** 2,
                    lambda g=g, f=frame, fs=faces: crop(model, vae, f, fs, g, None, args, cond),
                )
            )
        ours_tok = (args.ours_guide // 8) ** 2
        cases.append(
            (
                f"(c) ours {args.ours_guide}",
                ours_tok,
                lambda f=frame, fs=faces: crop(ours_model, vae, f, fs, args.ours_guide, plan, args, cond),
            )
        )
        for name, cm_model in cached:
            cases.append(
                (
                    name,
                    ours_tok,
                    lambda m=cm_model, f=frame, fs=faces: crop(m, vae, f, fs, args.ours_guide, plan, args, cond),
                )
            )
        times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        first: dict[str, tuple[Any, int | None, str]] = {}
        for rnd in range(max(1, args.repeats)):  # interleaved: allocator state and clock drift hit every case alike
            for name, _, run in cases[1:] if rnd else cases:  # (a) naive once: it is the slow reference
                out, t, p, e = timed(meter, run)
                times[name].append(t)
                first.setdefault(name, (out, p, e))
        rep = first[f"(c) ours {args.ours_guide}"][0]
        rows = [(name, tok, float(np.median(times[name])), first[name][1], first[name][2]) for name, tok, _ in cases]
        a = rows[0]
        for name, tok, t, p, e in rows:
            tx = f"{a[1] / tok:.1f}"
            sx = f"{a[2] / t:.1f}" if t > 0 else "-"
            mx = f"{100 * (1 - p / a[3]):.0f}" if p is not None and a[3] else "-"
            print(f"{size:>6} {name:<16} {tok:>8} {t:>8.2f} {fmt_mem(p):>9} {tx:>6} {sx:>7} {mx:>7} {e}")
        b_name, c_name = f"(b) crop {args.ours_guide}", f"(c) ours {args.ours_guide}"
        if b_name in times:
            b_t, c_t = float(np.median(times[b_name])), float(np.median(times[c_name]))
            print(
                f"#   crop + schedule vs crop alone at guide {args.ours_guide}: {b_t / c_t:.3f}x "
                f"(median of {len(times[c_name])}; (b) {' '.join(f'{t:.3f}' for t in times[b_name])}, "
                f"(c) {' '.join(f'{t:.3f}' for t in times[c_name])})"
            )
        if rep:
            print("#   (c) report: " + " | ".join(rep.splitlines()[1:2]))

    if args.caps and args.device == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        size = frames[-1]
        frame, faces = astronaut_frame(size), astronaut_faces(size)
        for cap in [float(c) for c in args.caps.split(",")]:
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap * 2**30 / total), device)
            _, ta, pa, ea = timed(meter, lambda: naive(model, vae, frame, args, cond))
            rep, tc, pc, ec = timed(
                meter, lambda: crop(ours_model, vae, frame, faces, args.ours_guide, plan, args, cond)
            )
            fb = "" if not rep else rep.splitlines()[1].split("fallbacks:")[-1].strip()
            print(
                f"# cap {cap:g} GB, frame {size}: (a) {ea or 'fits'} {ta:.2f}s peak {fmt_mem(pa)} MiB; "
                f"(c) {ec or 'fits'} {tc:.2f}s peak {fmt_mem(pc)} MiB, fallbacks: {fb}"
            )
        torch.cuda.set_per_process_memory_fraction(1.0, device)


if __name__ == "__main__":
    with torch.inference_mode():  # as ComfyUI's executor runs every node
        main()
