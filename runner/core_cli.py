"""`run --engine core`: videos through the pack's ComfyUI-free video core (runner/core_video.py), no workflow.

    python <pack folder> run --engine core clips/ -o out/                       # the demo face model, this process
    python <pack folder> run --engine core long.mp4 --ray local --workers 2     # chunks of each video over Ray

The sampler is the project's small trained face model (runner/core_refine.py "demo": a test-grade model, no
download) or the seeded stand-in ("standin", for benchmarking the video and scale-out paths). Real SD1.5 / SDXL
checkpoints run through ComfyUI workflows (`run workflow.json clips/`), not through this engine.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from ..scheduling.vocabulary import Preset
from .convert import WorkflowError
from .core_refine import RefineName
from .items import expand
from .report import item_names

if TYPE_CHECKING:
    from .core_video import CoreSpec

log = logging.getLogger("tokenfuse.runner")
ENGINES = ("comfyui", "core")


def add_core_arguments(r: argparse.ArgumentParser) -> None:
    """The `run` options of the core engine (ignored by the ComfyUI engine)."""
    r.add_argument(
        "--engine",
        choices=ENGINES,
        default="comfyui",
        help="comfyui (default): run the workflow in ComfyUI; core: fuse videos with the pack's own video core, "
        "no ComfyUI and no workflow (every positional argument is a video, a folder or a list); with --ray each "
        "video is split into time chunks fused on different workers",
    )
    g = r.add_argument_group("core engine (--engine core)")
    g.add_argument(
        "--sampler",
        choices=get_args(RefineName),
        default="demo",
        help="demo: the small trained face model (for trying the chain; far below real checkpoints); standin: a "
        "seeded stand-in for timing the video path",
    )
    g.add_argument("--steps", type=int, default=20, help="sampler steps of the demo model (4-30; fewer = faster)")
    g.add_argument(
        "--denoise", type=float, default=0.45, help="how much a face may change, 0-1 (0.3-0.5 keeps the person)"
    )
    g.add_argument(
        "--preset",
        choices=get_args(Preset),
        default="balanced",
        help="TokenFuse scheduling preset on the demo model (off = plain sampling)",
    )
    g.add_argument("--crop-size", type=int, default=256, help="aligned face crop side in px (the demo model: 256)")
    g.add_argument("--seed", type=int, default=0, help="track i gets seed + i (the same noise for a whole track)")
    g.add_argument(
        "--keyframes-per-second", type=float, default=2.0, help="faces diffused per second; flow carries the rest"
    )
    g.add_argument(
        "--chunks", type=int, default=0, help="--ray: chunks per video (0 = one per worker); also for a video workflow"
    )
    g.add_argument("--crf", type=int, default=19, help="x264 quality of the output (0 = lossless, 19 default)")
    g.add_argument("--detector", default="auto", help="face detector backend (auto: the best one installed)")


CONFLICTS = (("server", "--server"), ("input", "--input"), ("set", "--set"), ("item_input", "--item-input"))


def spec_from_args(args: argparse.Namespace) -> CoreSpec:
    from .core_video import CoreSpec

    for name, flag in (("steps", "--steps"), ("crop_size", "--crop-size")):
        if getattr(args, name) < 1:
            raise WorkflowError(f"{flag} must be >= 1")
    if not 0.0 <= args.denoise <= 1.0:
        raise WorkflowError("--denoise must be between 0 and 1")
    if args.crop_size % 8:
        raise WorkflowError(f"--crop-size {args.crop_size}: use a multiple of 8 (the VAE works on 8 px cells)")
    return CoreSpec(
        refine=args.sampler,
        steps=args.steps,
        denoise=args.denoise,
        schedule=args.preset,
        detector=args.detector,
        crop_size=args.crop_size,
        seed=args.seed,
        keyframes_per_second=args.keyframes_per_second,
        crf=args.crf,
        chunks=max(0, args.chunks),
    )


def cmd_run_core(args: argparse.Namespace) -> int:
    """`run --engine core`: every positional argument is a video source; exit codes as `run`."""
    from .core_video import run_videos_local, run_videos_ray

    used = [flag for name, flag in CONFLICTS if getattr(args, name)]
    if used:
        raise WorkflowError(f"--engine core takes no workflow options: drop {', '.join(used)}")
    spec = spec_from_args(args)
    sources = ([args.workflow] if args.workflow else []) + list(args.items)
    if not sources:
        raise WorkflowError("--engine core: give videos, folders of videos or list files")
    if args.workflow and str(args.workflow).lower().endswith(".json"):
        raise WorkflowError("--engine core runs no workflow: drop the .json (or use --engine comfyui)")
    output = Path(args.output)
    items = expand(sources, item_names(output / "report.jsonl") if args.resume else None)
    if not items:
        raise WorkflowError("no items: give videos, folders or list files")
    wrong = [i for i in items if i.kind != "video"]
    if wrong:
        raise WorkflowError(f"--engine core takes videos; {wrong[0].path} is an image (use a photo workflow)")
    if not args.ray:
        summary = run_videos_local(items, output, spec, args.resume, not args.quiet)
    else:
        from .core_video import VideoWorker
        from .ray_pool import RayPool

        pool = RayPool(args.ray, args.workers, spec, worker_cls=VideoWorker)
        try:
            summary = run_videos_ray(pool, items, output, spec, args.resume, not args.quiet)
        finally:
            pool.close()
    for failure in summary.failures:
        log.error("failed: %s", failure)
    return summary.exit_code
