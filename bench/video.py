"""Video face fusion: key-frame mode vs per-frame mode on a long 720p talking-head clip, same seed, one process.

The clip is made from a real talking head (comfyui-workflow-templates-media-video `api_kling_avatar2-1.webp`,
350 px, upscaled into a 1280x720 frame and looped back and forth) at 30 fps, for each length in --frames.
Pass 1 (FaceTrack: detection at 480 px, tracks, smoothing) runs once per length; pass 2 (VideoFaceFusion) runs
per mode. Printed per length and mode: frames, key frames, diffusion runs, seconds per frame (pass 2), peak RSS
of pass 2 (VmHWM, reset per run), added flicker and crop jitter.

- added flicker: inside the face mask of the smoothed aligned crop, the frame-to-frame change left after motion
  compensation (DIS flow estimated on the input crops, applied to both videos), output / input. 1.0 = no flicker
  added. Measured over the first --stability-frames frames.
- crop jitter: mean second difference of the aligned crop's centre, raw landmarks vs smoothed track (px/frame^2).

--refine fake   : the test suite's stand-in sampler (content-dependent detail boost + seeded noise); costs ~nothing,
                  so seconds per frame show the video path's own overhead (decode, flow, paste, encode).
--refine sd15   : ComfyUI's sampler on a random-weight SD1.5 U-Net + SD VAE through VideoFaceFusion (needs
                  --comfyui); random weights: valid for cost and memory, never for quality (flicker numbers on
                  random weights mean nothing).
--refine face   : ComfyUI's sampler on the project's trained face model (devkit/face_model: SD1.5-shaped U-Net at
                  32 base channels + its VAE, cfg 1 with its learned context) through VideoFaceFusion (needs
                  --comfyui): the real sampler path with trained attention, so flicker numbers mean something.
--x264-threads  : x264 threads of the output and of the floor (0 = x264's own choice, the pack's default). Both
                  move together: 1 slows the floor more than the pipeline (whose other threads fill the cores), so
                  its ratio reads better for a slower run; 2 measured the same as auto on 2 cores.
--anchors       : anchor_attention settings to run key-frame (and per-frame) mode with, e.g. off,full,pooled
                  (ComfyUI samplers only; the stand-in sampler has no attention).

Where the time goes (printed last, --refine fake only): milliseconds per frame per stage of the whole pipeline
(FaceTrack pass + fusion pass; video/clock.py StageClock) beside a floor row measured in the same process on the same
clip: PyAV decode -> to_ndarray("rgb24") -> from_ndarray -> libx264 with the run's preset and CRF, nothing else.
total / floor is wall time; CPU / floor CPU counts every thread of the process (decoder, x264, OpenCV) and moves
less with the load of a shared machine. Decode and encode run in their own threads, so the stages' sum exceeds the
wall time ("other" goes negative). Measured on a shared 2-core CPU (load average 5-17, so wall ratios move),
1280x720 30 fps, 300 frames, guide 512, 2 key frames/s, stand-in sampler, x264 CRF 19, x264 threads auto, OpenCV
threads 2; flicker: added flicker over the first 60 frames; "before" is the code before the speed work, same bench:

    python bench/video.py --frames 300 --modes keyframes --refine fake --threads 2 --stability-frames 60 \
        --preset medium [--faces 3] [--height 1080]

| run | decode | detect | crop | diffuse | flow | propagate | paste | encode | total | / floor | CPU ratio | flicker |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
| floor, medium | 5.3 | | | | | | | 144.7 | 150.0 | 1.00x | 1.00x (37.4 ms) | |
| medium, before | 36.0 | 108.7 | 10.3 | 6.4 | 51.7 | 818.6 | 94.2 | 139.9 | 1288.5 | 8.39x | 6.49x | 1.154 |
| floor, medium | 3.7 | | | | | | | 56.5 | 60.2 | 1.00x | 1.00x (37.6 ms) | |
| medium | 12.2 | 20.5 | 10.4 | 2.8 | 34.1 | 44.5 | 28.5 | 94.8 | 156.2 | 2.59x | 2.66x | 1.156 |
| floor, veryfast | 5.8 | | | | | | | 26.5 | 32.3 | 1.00x | 1.00x (21.4 ms) | |
| veryfast | 10.5 | 18.4 | 7.5 | 1.9 | 19.0 | 20.5 | 14.2 | 35.2 | 86.2 | 2.66x | 3.98x | 1.112 |
| floor, medium | 5.8 | | | | | | | 53.4 | 59.2 | 1.00x | 1.00x (39.7 ms) | |
| medium, 3 faces | 11.6 | 14.7 | 15.8 | 3.6 | 40.2 | 49.0 | 27.0 | 51.7 | 160.8 | 2.72x | 4.55x | 1.119 |

(the "before" row ran after its own floor row, 153.6 ms, at load 9-17; the other rows at load 5-8. 1920x1080 medium,
one face, before the mask-box propagation: 723.5 vs 379.1 ms, 1.91x.)

    python bench/video.py --frames 1000,4000 --refine fake
    python bench/video.py --quick [--refine sd15 --comfyui /path/to/ComfyUI]      # smoke run, under a minute on CPU
    python bench/video.py --comfyui /path/to/ComfyUI --refine sd15 --device cuda --dtype fp16 --guide 512 --steps 20
    python bench/video.py --comfyui /path/to/ComfyUI --refine face --frames 60 --guide 256 --steps 10 \
        --anchors off,full,pooled --stability-frames 60
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
sys.path.insert(0, str(REPO / "tests"))  # the clip helpers and the stand-in sampler the tests use
from bench_report import quick_settings, write_json  # noqa: E402
from pack_loader import load_pack  # noqa: E402

load_pack()  # video_clips imports the stand-in sampler from the pack (tokenfuse.video.standin); the root is light
from video_clips import fake_refine, webp_frames  # noqa: E402

CLIP_PACKAGE = "comfyui_workflow_templates_media_video"
WARM_FRAMES = 8  # the untimed warm-up clip: every timed case runs once on it first


def peak_rss_reset() -> int | None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
    except OSError:
        return None
    return _status("VmRSS")


def _status(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def make_clip(path: Path, frames: int, fps: int = 30, height: int = 720, faces: int = 1) -> Path:
    """A 16:9 30 fps talking head (1280x720 by default) of `frames` frames (ping-pong loop of the WebP's 56 frames),
    H.264; one face fills the frame's height, or `faces` heads side by side (each a third of the width, each at
    another point of the loop, so they do not move in step)."""
    import av

    src, _ = webp_frames("api_kling_avatar2-1.webp")
    cycle = src + src[-2:0:-1]
    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", rate=fps)
        width = height * 16 // 9 // 2 * 2
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"crf": "18", "preset": "ultrafast"}
        canvas = np.zeros((height, width, 3), np.uint8)
        side = height if faces == 1 else min(height, width // faces)
        y0 = (height - side) // 2
        x0s = [(width - height) // 2] if faces == 1 else [k * (width // faces) for k in range(faces)]
        for i in range(frames):
            for k, x0 in enumerate(x0s):
                head = cycle[(i + 17 * k) % len(cycle)]
                canvas[y0 : y0 + side, x0 : x0 + side] = cv2.resize(head, (side, side), interpolation=cv2.INTER_CUBIC)
            vf = av.VideoFrame.from_ndarray(canvas, format="rgb24")
            vf.pts = i
            for p in s.encode(vf):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)
    return path


def floor_run(clip: Path, out: Path, crf: int, preset: str, x264_threads: int) -> dict[str, float]:
    """The floor, ms per frame: PyAV decode -> to_ndarray("rgb24") -> from_ndarray -> the run's encoder settings
    (libx264, yuv420p BT.709 as the pack writes, same CRF / preset / threads), nothing else, one thread of Python."""
    import av

    dec = enc = 0.0
    n = 0
    cpu0 = time.process_time()
    with av.open(str(clip)) as src, av.open(str(out), "w") as dst:
        v = src.streams.video[0]
        v.thread_type = "AUTO"
        s = dst.add_stream("libx264", rate=v.average_rate)
        s.width, s.height, s.pix_fmt = v.codec_context.width, v.codec_context.height, "yuv420p"
        s.time_base = s.codec_context.time_base = v.time_base
        s.options = {"crf": str(crf), "preset": preset, **({"threads": str(x264_threads)} if x264_threads else {})}
        it = src.decode(v)
        while True:
            t0 = time.perf_counter()
            frame = next(it, None)
            if frame is None:
                break
            rgb = frame.to_ndarray(format="rgb24", threads=1)  # as the pack converts (video/types.py SCALE_THREADS)
            t1 = time.perf_counter()
            vf = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
                format="yuv420p", dst_colorspace=1, dst_color_range=1, threads=1
            )
            vf.pts, vf.time_base = frame.pts, v.time_base
            for p in s.encode(vf):
                dst.mux(p)
            dec, enc, n = dec + t1 - t0, enc + time.perf_counter() - t1, n + 1
        t0 = time.perf_counter()
        for p in s.encode(None):
            dst.mux(p)
        enc += time.perf_counter() - t0
    cpu = (time.process_time() - cpu0) * 1000 / n  # every thread of the process: the decoder's and x264's too
    return {"decode": dec * 1000 / n, "encode": enc * 1000 / n, "total": (dec + enc) * 1000 / n, "cpu": cpu}


def stability(src: Path, out: Path, tracks: Any, limit: int, size: int = 256) -> float:
    """Added flicker (see module doc): sum over frames of the motion-compensated change, output / input."""
    from tokenfuse.devkit.flicker import flicker_parts

    parts = flicker_parts(src, out, tracks, size=size, limit=limit)
    return float(parts["num"].sum() / max(float(parts["den"].sum()), 1e-9))


def comfy_refine_runner(args: argparse.Namespace) -> Any:
    """fuse(src, out, tracks, mode, anchor) through VideoFaceFusion on a random-weight SD1.5 U-Net + SD VAE
    (--refine sd15) or the trained face model (--refine face)."""
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    import comfy_models

    comfy_models.setup_comfy(args.comfyui, cpu=args.device == "cpu", sdpa=True)
    import comfy.utils
    import utils.extra_config  # noqa: F401

    comfy.utils.PROGRESS_BAR_ENABLED = False
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    cfg = 5.0
    if args.refine == "face":
        from tokenfuse.face_model import loader

        fm = loader.load_face_model(dtype=dtype)
        model, vae, cfg = fm.model, fm.vae, 1.0
        cond = fm.conditioning(), fm.conditioning()
    else:
        model = comfy_models.build_model("sd15", model_channels=args.channels, tiny=args.channels < 320, seed=0)
        vae = comfy_models.build_vae(ch=128 if args.channels >= 320 else 32, seed=0, dtype=dtype)
        cond = comfy_models.conditioning("sd15", seed=1), comfy_models.conditioning("sd15", seed=2)
    from tokenfuse.nodes.glue.video import VideoPath
    from tokenfuse.nodes.video_nodes import VideoFaceFusion

    def run(src: Path, out: Path, tracks: Any, mode: str, anchor: str) -> Any:
        node = VideoFaceFusion(out_path=str(out))
        with torch.inference_mode():
            node.fuse(
                VideoPath(src),
                tracks,
                model,
                vae,
                cond[0],
                cond[1],
                seed=1,
                steps=args.steps,
                cfg=cfg,
                sampler_name="euler",
                scheduler="normal",
                denoise=args.denoise,
                guide_size=args.guide,
                faces_per_batch=args.batch,
                mode=mode,
                keyframes_per_second=args.kps,
                pose_threshold=0.04,
                strength=1.0,
                crf=19,
                preset=args.preset,
                fallback="oom-only",
                anchor_attention=anchor,
            )
        anchors = node.last_anchors
        return node.last_stats, (anchors.peak_bytes if anchors is not None else 0)

    return run


STAGE_NAMES = {
    "decode": "decode",
    "detect": "detect + track",
    "crop": "crop",
    "diffusion": "key-frame diffusion",
    "flow": "flow",
    "propagation": "propagation",
    "paste": "paste",
    "encode": "encode",
}


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def floor_row(n: int, floor: dict[str, float], args: argparse.Namespace) -> dict[str, Any]:
    """The floor as a stage row: decode (+ rgb24) and encode (from_ndarray + YUV + libx264) only."""
    stages = {"decode": floor["decode"], "encode": floor["encode"]}
    return dict(
        frames=n,
        run=f"floor ({args.preset})",
        stages=stages,
        other=0.0,
        total=floor["total"],
        ratio=1.0,
        cpu=floor["cpu"],
        cpu_ratio=1.0,
        load=load_average(),
    )


def pipeline_row(
    n: int, mode: str, clock1: Any, clock2: Any, spf: float, cpu_spf: float, floor: dict[str, float]
) -> dict[str, Any]:
    """Pass 1 + pass 2 of one mode as a stage row (ms/frame); other = wall time not in any stage (negative when
    threaded stages overlap)."""
    ms1, ms2 = clock1.ms_per_frame(n), clock2.ms_per_frame(n)
    stages = {k: ms1.get(k, 0.0) + ms2.get(k, 0.0) for k in {*ms1, *ms2}}
    total = spf * 1000.0
    return dict(
        frames=n,
        run=mode,
        stages=stages,
        other=total - sum(stages.values()),
        total=total,
        ratio=total / floor["total"],
        cpu=cpu_spf * 1000.0,
        cpu_ratio=cpu_spf * 1000.0 / floor["cpu"],
        load=load_average(),
    )


def median_pair(pairs: list[tuple[dict[str, Any], dict[str, Any]]], mode: str) -> tuple[dict[str, Any], ...]:
    """The (floor row, run row) of the repeat with the median total / floor: each repeat times the floor right before
    its run, so a machine whose speed drifts (a shared VM) moves both; with several repeats the spread is printed."""
    ordered = sorted(pairs, key=lambda p: p[1]["ratio"])
    if len(ordered) > 1:
        ratios = ", ".join(f"{p[1]['ratio']:.2f}x" for p in pairs)
        print(f"{mode}: total / floor over {len(pairs)} interleaved repeats: {ratios}; the median run is tabled")
    return ordered[len(ordered) // 2]


def stage_line(r: dict[str, Any]) -> str:
    from tokenfuse.video.clock import STAGES

    cells = " | ".join(f"{r['stages'][k]:.1f}" if k in r["stages"] else "" for k in STAGES)
    return (
        f"| {r['frames']} | {r['run']} | {cells} | {r['other']:.1f} | {r['total']:.1f} | {r['ratio']:.2f}x | "
        f"{r['cpu']:.1f} | {r['cpu_ratio']:.2f}x |"
    )


def table_row(r: dict[str, Any]) -> str:
    return (
        f"| {r['frames']} | {r['mode']} | {r['anchor']} ({r['anchor_mb']:.1f} MB) | {r['keys']} (+{r['fails']}) | "
        f"{r['runs']} | {r['spf']:.3f} ({r['cpf']:.3f}) | {r['track_spf']:.3f} | "
        f"{r['peak']:.0f} MB ({r['base']:.0f}) | "
        f"{r['flicker']:.3f} | {r['jraw']:.2f} -> {r['jsm']:.2f} |"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", default="1000,4000", help="clip lengths (frames at 30 fps)")
    p.add_argument("--modes", default="keyframes,per_frame")
    p.add_argument("--per-frame-up-to", type=int, default=0, help="skip per_frame mode on longer clips (0 = never)")
    p.add_argument("--refine", choices=["fake", "sd15", "face"], default="fake")
    p.add_argument("--anchors", default="off", help="anchor_attention values to run (comma list: off,full,pooled)")
    p.add_argument("--per-frame-anchors", default="", help="anchor values for per_frame mode (default: --anchors)")
    p.add_argument("--denoise", type=float, default=0.45)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy shared CPU)")
    p.add_argument(
        "--comfyui",
        default=os.environ.get("COMFYUI_PATH", ""),
        help="ComfyUI checkout (or COMFYUI_PATH; --refine sd15/face)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32")
    p.add_argument("--channels", type=int, default=320, help="U-Net model_channels (320 = real SD1.5 size)")
    p.add_argument("--guide", type=int, default=512)
    p.add_argument("--height", type=int, default=720, help="clip height (16:9; 720 = the issue's 1280x720)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=2, help="faces_per_batch")
    p.add_argument("--kps", type=float, default=2.0, help="key frames per second")
    p.add_argument("--preset", default="veryfast", help="x264 preset of the output")
    p.add_argument("--crf", type=int, default=19, help="x264 CRF of the output (and of the floor)")
    p.add_argument("--x264-threads", type=int, default=0, help="x264 threads of the output and the floor (0 = auto)")
    p.add_argument("--faces", type=int, choices=[1, 3], default=1, help="talking heads in the clip (1 or 3)")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="time floor + pass 1 + pass 2 this many times, interleaved, and table the median ratio (a noisy machine)",
    )
    p.add_argument("--json", default="", help="write the rows (stages in ms/frame, floor, ratios) to this file")
    p.add_argument("--stability-frames", type=int, default=600)
    p.add_argument("--workdir", default="", help="keep clips and outputs here (default: a temp folder)")
    p.add_argument("--quick", action="store_true", help="smoke run: one 30-frame 640x360 clip, guide 64, 2 steps")
    args = p.parse_args(argv)
    if args.quick:  # every code path of the chosen --refine once; the numbers mean nothing
        quick = {"frames": "30", "stability_frames": 30, "height": 360, "guide": 64, "steps": 2, "channels": 32}
        quick_settings(p, args, argv, quick)  # options given on the command line are kept
    if args.refine != "fake" and not args.comfyui:
        p.error(f"--refine {args.refine} needs ComfyUI: --comfyui PATH or COMFYUI_PATH")
    if importlib.util.find_spec(CLIP_PACKAGE) is None:  # else video_clips raises pytest's Skipped mid-run
        p.error(f"the talking-head clip needs {CLIP_PACKAGE} (requirements-test.txt) in this Python")
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(args.threads)
    load_pack()
    from tokenfuse.faces.detect import RetinaFaceDetector
    from tokenfuse.video.clock import STAGES, StageClock
    from tokenfuse.video.encode import EncodeOptions
    from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
    from tokenfuse.video.keyframes import KeyframeOptions
    from tokenfuse.video.track_pass import TrackHooks, track_video
    from tokenfuse.video.tracks import make_detect

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tokenfuse_bench_video_"))
    work.mkdir(parents=True, exist_ok=True)
    runner = comfy_refine_runner(args) if args.refine != "fake" else None
    detect = make_detect(RetinaFaceDetector(), detect_size=480)
    lengths = [int(x) for x in args.frames.split(",")]
    anchors = args.anchors.split(",") if runner is not None else ["off"]
    pf_anchors = args.per_frame_anchors.split(",") if runner is not None and args.per_frame_anchors else anchors

    def cases(n: int) -> list[tuple[str, str]]:
        """The (mode, anchor) runs timed on an n-frame clip."""
        return [
            (m, a)
            for m in args.modes.split(",")
            for a in anchors
            if m != "per_frame" or (not 0 < args.per_frame_up_to < n and a in pf_anchors)
        ]

    def refine(clip: Path, out: Path, tracks: Any, mode: str, anchor: str, clock: Any = None) -> tuple[Any, int]:
        if runner is not None:
            stats, anchor_bytes = runner(clip, out, tracks, mode, anchor)
            return stats, anchor_bytes
        opts = FuseOptions(
            crop_size=args.guide,
            faces_per_batch=args.batch,
            seed=1,
            keyframes=KeyframeOptions(per_second=0.0 if mode == "per_frame" else args.kps),
            encode=EncodeOptions(crf=args.crf, preset=args.preset, threads=args.x264_threads),
        )
        progress = (lambda d, t: print(f"\r  pass 2 {d}/{t}", end="", flush=True)) if "warmup" not in out.name else None
        return fuse_video(clip, out, FuseJob(tracks, fake_refine, opts, progress), clock=clock or StageClock()), 0

    # Not timed: every timed case once on a short clip, pass 1 included, so no row pays first-call costs (the
    # detector's session, the model load, the sampler's and the encoder's first allocations, the patches' set-up).
    tag = f"{args.height}" + (f"x{args.faces}faces" if args.faces > 1 else "")
    warm_clip = work / f"warmup{tag}_{WARM_FRAMES}.mp4"
    if not warm_clip.exists():
        make_clip(warm_clip, WARM_FRAMES, height=args.height, faces=args.faces)
    warm_tracks = track_video(warm_clip, detect)
    warm_cases = list(dict.fromkeys(c for n in lengths for c in cases(n)))
    print(f"warm-up (not timed): {WARM_FRAMES} frames, {', '.join(f'{m}/{a}' for m, a in warm_cases)} ...", flush=True)
    for mode, anchor in warm_cases:
        refine(warm_clip, work / f"warmup_{mode}_{anchor}.mp4", warm_tracks, mode, anchor)
    floor_run(warm_clip, work / "warmup_floor.mp4", args.crf, args.preset, args.x264_threads)
    rows, stage_rows = [], []
    for n in lengths:
        clip = work / f"head{tag}_{n}.mp4"
        if not clip.exists():
            print(f"making {clip.name} ...", flush=True)
            make_clip(clip, n, height=args.height, faces=args.faces)
        timed: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}  # mode -> (floor row, run row) per repeat
        for rep in range(args.repeat):
            last = rep == args.repeat - 1
            floor = floor_run(clip, work / f"floor_{n}.mp4", args.crf, args.preset, args.x264_threads)
            print("stages " + stage_line(floor_row(n, floor, args)), flush=True)
            clock1 = StageClock()
            t0, c1 = time.perf_counter(), time.process_time()
            tracks = track_video(
                clip,
                detect,
                hooks=TrackHooks(progress=lambda d, t: print(f"\r  pass 1 {d}/{t}", end="", flush=True)),
                clock=clock1,
            )
            t_track, c_track = (time.perf_counter() - t0) / n, (time.process_time() - c1) / n
            print()
            for mode, anchor in cases(n):
                out = work / f"out_{n}_{mode}_{anchor}.mp4"
                base = peak_rss_reset()
                clock2 = StageClock()
                t0, c0 = time.perf_counter(), time.process_time()
                print(f"{n} frames, {mode}, anchor {anchor}", flush=True)
                stats, anchor_bytes = refine(clip, out, tracks, mode, anchor, clock2)
                secs, cpu = time.perf_counter() - t0, time.process_time() - c0
                print()
                if runner is None:
                    spf, cpu_spf = t_track + secs / n, c_track + cpu / n
                    row = pipeline_row(n, mode, clock1, clock2, spf, cpu_spf, floor)
                    timed.setdefault(mode, []).append((floor_row(n, floor, args), row))
                    print("stages " + stage_line(row), flush=True)
                if not last:
                    continue
                peak = _status("VmHWM")
                flick = stability(clip, out, tracks, args.stability_frames)
                rows.append(
                    dict(
                        frames=n,
                        mode=mode,
                        anchor=anchor,
                        anchor_mb=anchor_bytes / 2**20,
                        keys=stats.key_frames,
                        fails=stats.flow_failures,
                        runs=stats.diffusion_runs,
                        spf=secs / n,
                        cpf=cpu / n,
                        track_spf=t_track,
                        peak=(peak or 0) / 2**20,
                        base=(base or 0) / 2**20,
                        flicker=flick,
                        jraw=tracks.raw_jitter,
                        jsm=tracks.smooth_jitter,
                    )
                )
                print("row " + table_row(rows[-1]), flush=True)  # each row as soon as it is measured
        for mode, pairs in timed.items():
            stage_rows.extend(median_pair(pairs, mode))
    backend = {
        "fake": "stand-in sampler (no diffusion)",
        "sd15": f"random-weight SD1.5 U-Net ch {args.channels}, cfg 5",
        "face": "trained face model (devkit/face_model, SD1.5-shaped U-Net ch 32), cfg 1",
    }[args.refine]
    if runner is not None:
        from comfy_models import attention_backend

        backend += (
            f", {args.dtype}, {args.device}, attention {attention_backend()}, {args.steps} steps euler/normal, "
            f"denoise {args.denoise}, torch threads {args.threads}"
        )
    print(
        f"\nVideo fusion, {args.height * 16 // 9 // 2 * 2}x{args.height} 30 fps talking head, guide {args.guide}, "
        f"batch {args.batch}, {args.kps} key/s, "
        f"refine: {backend}; pass 1 (detect 480 px + track) shown separately; flicker over the first "
        f"{args.stability_frames} frames"
    )
    print(
        "| frames | mode | anchor attention (tokens held) | key frames (+flow fails) | diffusion runs | "
        "pass 2 s/frame wall (CPU) | "
        "pass 1 s/frame | peak RSS pass 2 (start) | added flicker | crop jitter raw -> smoothed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(table_row(r))
    by = {(r["frames"], r["mode"], r["anchor"]): r for r in rows}
    for n in sorted({r["frames"] for r in rows}):
        k, pf = by.get((n, "keyframes", "off")), by.get((n, "per_frame", "off"))
        if k and pf:
            print(
                f"{n} frames: per_frame / keyframes = {pf['runs'] / max(k['runs'], 1):.1f}x diffusion runs, "
                f"{pf['spf'] / k['spf']:.2f}x time per frame (wall), {pf['cpf'] / k['cpf']:.2f}x CPU time per frame"
            )
        for a in anchors[1:] if runner is not None else []:
            for mode in args.modes.split(","):
                on, off = by.get((n, mode, a)), by.get((n, mode, "off"))
                if on and off:
                    print(
                        f"{n} frames {mode}: anchor {a} / off = {on['flicker'] / off['flicker']:.3f}x added flicker, "
                        f"{on['spf'] / off['spf']:.2f}x time per frame (wall), {on['cpf'] / off['cpf']:.2f}x CPU"
                    )
    ks = sorted((r for r in rows if r["mode"] == "keyframes" and r["anchor"] == "off"), key=lambda r: r["frames"])
    if len(ks) > 1:
        ratio = ks[-1]["peak"] / ks[0]["peak"]
        print(f"peak RSS {ks[-1]['frames']} vs {ks[0]['frames']} frames (keyframes): {ratio:.3f}x")
    print(
        f"\nWhere the time goes, ms per frame, whole pipeline (pass 1 + pass 2), {args.faces} face(s), "
        f"{args.height * 16 // 9 // 2 * 2}x{args.height}; encoder libx264 preset {args.preset} CRF {args.crf}, "
        f"x264 threads {args.x264_threads or 'auto'}, OpenCV threads {cv2.getNumThreads()}, "
        f"torch threads {args.threads}; load average {load_average()}. Floor: PyAV decode -> rgb24 -> from_ndarray "
        "-> the same encoder, same process and clip."
    )
    print(
        "| frames | run | "
        + " | ".join(STAGE_NAMES[k] for k in STAGES)
        + " | other | total | total / floor | CPU ms/frame | CPU / floor CPU |"
    )
    print("|---|---|" + "---|" * (len(STAGES) + 5))
    for r in stage_rows:
        print(stage_line(r))
    write_json(args.json, {"settings": vars(args), "rows": rows, "stages": stage_rows})


if __name__ == "__main__":
    main()
