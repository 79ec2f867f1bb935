"""A lower bound on the video pipeline's wall time per frame, from the CPU its parts cost alone.

bench/video.py times the whole pipeline against the decode + encode floor; this says how far down that ratio can go
on this machine without changing what is computed. On C cores a frame cannot take less wall time than the CPU of
all its work divided by C, however the work is spread over threads. Measured on the same clip as bench/video.py
(1280x720 30 fps talking head, one face or three), stand-in sampler, guide 512, 2 key frames/s:

- floor: PyAV decode -> rgb24 -> libx264 (--preset, CRF 19, threads auto), the whole process's CPU (bench/video.py
  floor_run): what any output pays for decoding and encoding;
- pass 1: FaceTrack (RetinaFace at 480 px, scene cuts, tracks), the whole process's CPU (onnxruntime's threads too);
- pass 2's own stages, with OpenCV on one thread, each the CPU time of the thread it ran in (video/clock.py
  StageClock(timer=time.thread_time)): crop, diffusion (the stand-in sampler), flow, propagation, paste.

bound = (floor + pass 1 + pass 2's stages) / cores, and the same without the propagation stage (what would be left
if all of propagation's arithmetic cost nothing). It assumes the pipeline's decoder and x264 cost what the floor's
do and every core is busy all the time, so the real pipeline is slower than the bound; what the bound leaves out
(pass 2's decoding of the planes, the writer's RGB -> YUV of the faces, Python between the stages) only adds.

    python bench/video_budget.py --faces 3 --preset veryfast [--frames 150] [--cores 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from bench_report import quick_settings, write_json  # noqa: E402

CLIP_PACKAGE = "comfyui_workflow_templates_media_video"
PACK_STAGES = ("crop", "diffusion", "flow", "propagation", "paste")
"""Pass 2's stages that are the pack's own work (decode and encode are the floor's)."""


def _video_bench() -> Any:
    """bench/video.py as a module: its clip maker, floor and stand-in sampler (main() not run)."""
    spec = importlib.util.spec_from_file_location("tokenfuse_bench_video", Path(__file__).with_name("video.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _goal(preset: str, height: int) -> float:
    """The issue's target ratio: 2.0x the floor at x264 medium 720p, 2.5x at veryfast and at 1080p."""
    return 2.0 if preset == "medium" and height <= 720 else 2.5


def faces_per_frame(tracks: Any) -> float:
    """Faces pass 2 works on per frame: the selected tracks' frames over the clip's."""
    covered = sum(tr.end - tr.start for tr in tracks.tracks)
    return covered / max(tracks.frame_count, 1)


def budget(parts: dict[str, float], floor_wall: float, cores: int) -> dict[str, float]:
    """The bound from CPU ms per frame (floor, pass1 and PACK_STAGES in parts): ms per frame and x the floor's wall,
    with and without propagation."""
    total = sum(parts.values())
    without = total - parts.get("propagation", 0.0)
    return {
        "cpu": total,
        "bound_ms": total / cores,
        "bound_ratio": total / cores / floor_wall,
        "bound_ms_no_propagation": without / cores,
        "bound_ratio_no_propagation": without / cores / floor_wall,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=150, help="clip length (frames at 30 fps)")
    p.add_argument("--height", type=int, default=720, help="clip height (16:9)")
    p.add_argument("--faces", type=int, choices=[1, 3], default=1, help="talking heads in the clip")
    p.add_argument("--preset", default="veryfast", help="x264 preset of the floor")
    p.add_argument("--crf", type=int, default=19)
    p.add_argument("--guide", type=int, default=512, help="crop size")
    p.add_argument("--repeat", type=int, default=3, help="floor, pass 1 and pass 2 this many times (medians)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores the bound divides by")
    p.add_argument("--workdir", default="", help="keep the clip and outputs here (default: a temp folder)")
    p.add_argument("--json", default="", help="write the parts and the bound to this file")
    p.add_argument("--quick", action="store_true", help="smoke run: 20 frames at 640x360, guide 64")
    args = p.parse_args(argv)
    if args.quick:
        quick_settings(p, args, argv, {"frames": 20, "height": 360, "guide": 64, "repeat": 1})
    if importlib.util.find_spec(CLIP_PACKAGE) is None:  # else the clip helpers raise pytest's Skipped mid-run
        p.error(f"the talking-head clip needs {CLIP_PACKAGE} (requirements-test.txt) in this Python")
    logging.basicConfig(level=logging.WARNING)
    vb = _video_bench()
    from tokenfuse.faces.detect import RetinaFaceDetector
    from tokenfuse.video.clock import StageClock
    from tokenfuse.video.encode import EncodeOptions
    from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
    from tokenfuse.video.keyframes import KeyframeOptions
    from tokenfuse.video.track_pass import track_video
    from tokenfuse.video.tracks import make_detect

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tokenfuse_bench_budget_"))
    work.mkdir(parents=True, exist_ok=True)
    tag = f"{args.height}" + (f"x{args.faces}faces" if args.faces > 1 else "")
    clip = work / f"head{tag}_{args.frames}.mp4"
    if not clip.exists():
        vb.make_clip(clip, args.frames, height=args.height, faces=args.faces)
    detect = make_detect(RetinaFaceDetector(), detect_size=480)
    opts = FuseOptions(
        crop_size=args.guide,
        faces_per_batch=2,
        seed=1,
        keyframes=KeyframeOptions(per_second=2.0),
        encode=EncodeOptions(crf=args.crf, preset=args.preset),
    )
    floors, pass1, stages = [], [], []
    threads = cv2.getNumThreads()
    for rep in range(args.repeat + 1):  # the first round untimed (first-call costs: the detector's session too)
        floor = vb.floor_run(clip, work / "floor.mp4", args.crf, args.preset, 0)
        c0 = time.process_time()
        tracks = track_video(clip, detect)
        n = tracks.frame_count
        p1 = (time.process_time() - c0) * 1000 / n
        clock = StageClock(timer=time.thread_time)
        cv2.setNumThreads(1)
        try:
            fuse_video(clip, work / "out.mp4", FuseJob(tracks, vb.fake_refine, opts, None), clock=clock)
        finally:
            cv2.setNumThreads(threads)
        if rep:
            floors.append(floor)
            pass1.append(p1)
            stages.append(clock.ms_per_frame(n))
        print(f"round {rep}{' (untimed)' if not rep else ''}: floor {floor['total']:.1f} ms wall", flush=True)
    floor_wall = statistics.median(f["total"] for f in floors)
    parts = {
        "floor": statistics.median(f["cpu"] for f in floors),
        "pass1": statistics.median(pass1),
        **{k: statistics.median(s[k] for s in stages) for k in PACK_STAGES},
    }
    fpf = faces_per_frame(tracks)
    result = budget(parts, floor_wall, args.cores)
    goal = _goal(args.preset, args.height)
    width = args.height * 16 // 9 // 2 * 2
    print(
        f"\nCPU per frame, {width}x{args.height}, {args.faces} face(s) ({fpf:.2f} per frame), {n} frames, guide "
        f"{args.guide}, x264 {args.preset} CRF {args.crf} (threads auto), stand-in sampler, medians of {args.repeat}; "
        "pass 2's stages on one OpenCV thread, the CPU of the thread each ran in:"
    )
    print("| part | CPU ms per frame | per face |\n|---|---|---|")
    names = {"floor": f"floor (decode + x264 {args.preset})", "pass1": "pass 1 (detection, cuts, tracks)"}
    for k, v in parts.items():
        per_face = f"{v / fpf:.1f}" if k in PACK_STAGES and fpf else ""
        print(f"| {names.get(k, k)} | {v:.1f} | {per_face} |")
    print(f"| all | {result['cpu']:.1f} | |")
    print(
        f"\nfloor wall {floor_wall:.1f} ms per frame. Bound on {args.cores} cores: {result['bound_ms']:.1f} ms "
        f"per frame = {result['bound_ratio']:.2f}x the floor; with propagation free: "
        f"{result['bound_ms_no_propagation']:.1f} ms = {result['bound_ratio_no_propagation']:.2f}x "
        f"(goal {goal:.1f}x = {goal * floor_wall:.1f} ms)."
    )
    write_json(
        args.json,
        {"settings": vars(args), "parts": parts, "faces_per_frame": fpf, "floor_wall": floor_wall, "goal": goal}
        | result,
    )


if __name__ == "__main__":
    main()
