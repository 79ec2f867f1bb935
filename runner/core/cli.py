"""`run --engine core`: videos through the pack's ComfyUI-free video core (runner/core/video.py), no workflow.

    python <pack folder> run --engine core clips/ -o out/                       # the demo face model, this process
    python <pack folder> run --engine core long.mp4 --ray local --workers 2     # chunks of each video over Ray

The sampler is the project's small trained face model (runner/core/refine.py "demo": a test-grade model, no
download) or the seeded stand-in ("standin", for benchmarking the video and scale-out paths). Real SD1.5 / SDXL
checkpoints run through ComfyUI workflows (`run workflow.json clips/`), not through this engine.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from ...scheduling.vocabulary import Preset
from ..errors import WorkflowError
from ..items import expand
from ..output_folder import refuse_non_folder
from ..ray.workflow_chunks import DRIVER_BACKENDS
from ..report import item_names
from .refine import RefineName

if TYPE_CHECKING:
    from .video import CoreSpec

log = logging.getLogger("tokenfuse.runner")
ENGINES = ("comfyui", "core")


# The core engine's own options: their defaults, and what a workflow or `run --demo` takes instead (they would be
# ignored there, so they are refused: refuse_core_options).
CORE_DEFAULTS: dict[str, Any] = {
    "sampler": "demo",
    "steps": 20,
    "denoise": 0.45,
    "preset": "balanced",
    "crop_size": 256,
    "seed": 0,
    "keyframes_per_second": 2.0,
    "crf": 19,
    "detector": "auto",
}
_PHOTO, _VIDEO = "TokenFuseScheduledFusion", "TokenFuseVideoFaceFusion"
WORKFLOW_EQUIVALENTS: dict[str, str] = {
    "sampler": "nothing: a workflow's loader nodes pick the model (run --demo: the small trained face model)",
    "steps": f"--set {_PHOTO}.steps=N (videos: {_VIDEO}.steps; run --demo: fuse.steps)",
    "denoise": f"--set {_PHOTO}.denoise=X (videos: {_VIDEO}.denoise; run --demo: fuse.denoise)",
    # a video workflow's scheduling preset is on its TokenSchedulerController too: VideoFaceFusion's `preset` is x264's
    "preset": "--set TokenFuseTokenSchedulerController.preset=NAME (photo and video workflows; run --demo: "
    "schedule.preset)",
    "crop_size": f"--set {_PHOTO}.guide_size=N (videos: {_VIDEO}.guide_size; run --demo: fuse.guide_size)",
    "seed": f"--set {_PHOTO}.seed=N (videos: {_VIDEO}.seed; run --demo: fuse.seed)",
    "keyframes_per_second": f"--set {_VIDEO}.keyframes_per_second=X",
    "crf": f"--set {_VIDEO}.crf=N",
    "detector": "--set TokenFuseFaceDetect.backend=NAME (videos: TokenFuseFaceTrack.backend; run --demo: "
    "detect.backend)",
}


def add_core_arguments(r: argparse.ArgumentParser) -> None:
    """The `run` options of the core engine (refused without --engine core: refuse_core_options)."""
    r.add_argument(
        "--engine",
        choices=ENGINES,
        default="comfyui",
        help="comfyui (default): run the workflow in ComfyUI; core: fuse videos with the pack's own video core, "
        "no ComfyUI and no workflow (every positional argument is a video, a folder or a list); with --ray each "
        "video is split into time chunks fused on different workers",
    )
    g = r.add_argument_group(
        "core engine (--engine core only; a workflow or --demo takes --set NODE.INPUT=VALUE instead)"
    )
    g.add_argument(
        "--sampler",
        choices=get_args(RefineName),
        help="demo (default): the small trained face model (for trying the chain; far below real checkpoints); "
        "standin: a seeded stand-in for timing the video path",
    )
    g.add_argument("--steps", type=int, help="sampler steps (default 20; 4-30, fewer = faster)")
    g.add_argument(
        "--denoise", type=float, help="how much a face may change, 0-1 (default 0.45; 0.3-0.5 keeps the person)"
    )
    g.add_argument(
        "--preset",
        choices=get_args(Preset),
        help="TokenFuse scheduling preset (default balanced; off = plain sampling)",
    )
    g.add_argument("--crop-size", type=int, help="aligned face crop side in px (default 256, the demo model's)")
    g.add_argument("--seed", type=int, help="track i gets seed + i (default 0; the same noise for a whole track)")
    g.add_argument(
        "--keyframes-per-second", type=float, help="faces diffused per second (default 2); flow carries the rest"
    )
    g.add_argument(
        "--chunks", type=int, default=0, help="--ray: chunks per video (0 = one per worker); also for a video workflow"
    )
    g.add_argument("--crf", type=int, help="x264 quality of the output (default 19; 0 = lossless)")
    g.add_argument(
        "--detector",
        choices=DRIVER_BACKENDS,
        help="face detector of the track pass (default auto: RetinaFace when installed, else MTCNN)",
    )


def refuse_core_options(args: argparse.Namespace) -> None:
    """WorkflowError when a core-engine option is given without --engine core: a workflow run or --demo would
    ignore it silently (its nodes' widgets decide), so the error names the --set that does it there."""
    given = [name for name in CORE_DEFAULTS if getattr(args, name, None) is not None]
    if given:
        lines = "; ".join(f"--{n.replace('_', '-')}: use {WORKFLOW_EQUIVALENTS[n]}" for n in given)
        raise WorkflowError(
            f"{', '.join('--' + n.replace('_', '-') for n in given)} only apply to --engine core. {lines}"
        )


CONFLICTS = (("server", "--server"), ("input", "--input"), ("set", "--set"), ("item_input", "--item-input"))


def spec_from_args(args: argparse.Namespace) -> CoreSpec:
    from .video import CoreSpec

    v = {
        name: default if getattr(args, name, None) is None else getattr(args, name)
        for name, default in CORE_DEFAULTS.items()
    }
    for name, flag in (("steps", "--steps"), ("crop_size", "--crop-size")):
        if v[name] < 1:
            raise WorkflowError(f"{flag} must be >= 1")
    if not 0.0 <= v["denoise"] <= 1.0:
        raise WorkflowError("--denoise must be between 0 and 1")
    if v["crop_size"] % 8:
        raise WorkflowError(f"--crop-size {v['crop_size']}: use a multiple of 8 (the VAE works on 8 px cells)")
    return CoreSpec(
        refine=v["sampler"],
        steps=v["steps"],
        denoise=v["denoise"],
        schedule=v["preset"],
        detector=v["detector"],
        crop_size=v["crop_size"],
        seed=v["seed"],
        keyframes_per_second=v["keyframes_per_second"],
        crf=v["crf"],
        chunks=max(0, args.chunks),
    )


def cmd_run_core(args: argparse.Namespace) -> int:
    """`run --engine core`: every positional argument is a video source; exit codes as `run`."""
    from ..run import RunTarget
    from .video import run_videos_local, run_videos_ray

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
    refuse_non_folder(output)
    items = expand(sources, item_names(output / "report.jsonl") if args.resume else None)
    if not items:
        raise WorkflowError("no items: give videos, folders or list files")
    wrong = [i for i in items if i.kind != "video"]
    if wrong:
        raise WorkflowError(f"--engine core takes videos; {wrong[0].path} is an image (use a photo workflow)")
    if not args.ray:
        summary = run_videos_local(items, spec, RunTarget(output, args.resume, not args.quiet))
    else:
        from ..ray.pool import RayPool
        from .video import VideoWorker

        pool = RayPool(args.ray, args.workers, spec, worker_cls=VideoWorker)
        try:
            summary = run_videos_ray(pool, items, spec, RunTarget(output, args.resume, not args.quiet))
        finally:
            pool.close()
    for failure in summary.failures:
        log.error("failed: %s", failure)
    return summary.exit_code
