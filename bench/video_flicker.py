"""Where does key-frame mode's added flicker come from? A per-frame breakdown, and a replay of key-frame mode on
the real model's per-frame outputs (no diffusion: cheap enough to compare propagation variants).

Inputs come from a finished `bench/video.py` run (its --workdir): the input clip, the per-frame mode output and,
optionally, the key-frame mode output.

- breakdown: bench/video.py's added-flicker metric per frame transition (t-1 -> t), grouped by kind: transitions
  into a key frame, out of a key frame, between two propagated frames; and inside the face (mask > 0.9) vs its
  feathered edge (0 < mask <= 0.9: the paste's blend band).
- replay: key-frame mode run by fuse_video with a refine that returns, for each crop, the same crop of the
  per-frame output (the trained model's refined pixels of that frame, as pasted and encoded), for each
  propagation variant in --details. So the key frames' refined pixels are the model's and only the propagation
  differs; the per-frame output itself is the baseline.

    python bench/video_flicker.py --workdir /tmp/flk --frames 60 --size 128
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devkit"))
from pack_loader import load_pack  # noqa: E402

load_pack()
from tokenfuse.devkit.flicker import flicker_parts as per_frame_flicker  # noqa: E402


def breakdown(res: dict[str, np.ndarray], keys: set[int], name: str) -> None:
    """Print the ratio by transition kind and the worst transitions."""
    n = len(res["num"])
    kinds = {
        "into key (t key)": [t for t in range(1, n) if t in keys],
        "out of key (t-1 key)": [t for t in range(1, n) if t - 1 in keys and t not in keys],
        "propagated -> propagated": [t for t in range(1, n) if t not in keys and t - 1 not in keys],
    }
    total = res["num"].sum() / max(res["den"].sum(), 1e-9)
    print(f"\n{name}: added flicker {total:.3f} (inside {_r(res, '_in')}, edge band {_r(res, '_edge')})")
    print("| transitions | count | share of output change | added flicker |")
    print("|---|---|---|---|")
    for kind, ts in kinds.items():
        if not ts:
            continue
        num, den = res["num"][ts].sum(), res["den"][ts].sum()
        print(f"| {kind} | {len(ts)} | {num / max(res['num'].sum(), 1e-9):.2f} | {num / max(den, 1e-9):.3f} |")
    ratio = res["num"][1:] / np.maximum(res["den"][1:], 1e-9)
    worst = np.argsort(-ratio)[:6] + 1
    print(
        "worst transitions t-1 -> t (ratio): "
        + ", ".join(f"{t}{'*' if t in keys else ''} {ratio[t - 1]:.2f}" for t in worst)
    )


def _r(res: dict[str, np.ndarray], suffix: str) -> str:
    return f"{res['num' + suffix].sum() / max(res['den' + suffix].sum(), 1e-9):.3f}"


def replay_refine(src: Path, per_frame_out: Path, tracks: Any, size: int) -> Any:
    """A Refine returning, for a crop of the input, the same crop of the per-frame output (looked up by the crop's
    bytes, as fuse_video cuts them)."""
    from tokenfuse.faces.align import warp_face
    from tokenfuse.video.decode import VideoReader
    from tokenfuse.video.smooth import scale_affine

    table: dict[bytes, np.ndarray] = {}
    with VideoReader(src) as a, VideoReader(per_frame_out) as b:
        for fa, fb in zip(a, b, strict=True):
            for j in tracks.tracks_at(fa.index):
                tr = tracks.tracks[j]
                aff = scale_affine(tr.affines[fa.index - tr.start], size)
                crop = warp_face(fa.rgb, aff, size)
                table[hashlib.sha1(crop.tobytes()).digest()] = warp_face(fb.rgb, aff, size).astype(np.float32) / 255
    misses = [0]

    def refine(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
        out = []
        for c in crops:
            key = hashlib.sha1((c * 255.0 + 0.5).astype(np.uint8).tobytes()).digest()
            hit = table.get(key)
            if hit is None:
                misses[0] += 1
                hit = c
            out.append(hit)
        return np.stack(out)

    refine.misses = misses  # type: ignore[attr-defined]
    return refine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, help="bench/video.py's --workdir (head720_N.mp4, out_N_*_off.mp4)")
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--size", type=int, default=128, help="crop size (bench/video.py's --guide)")
    p.add_argument("--kps", type=float, default=2.0)
    p.add_argument("--details", default="change,refined", help="propagation variants to replay (FlowOptions.detail)")
    p.add_argument("--sigmas", default="0.08", help="FlowOptions.detail_sigma values to replay 'refined' with")
    p.add_argument("--no-model-runs", action="store_true", help="skip the breakdown of the two model outputs")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(1)
    from dataclasses import replace

    from tokenfuse.faces.detect import RetinaFaceDetector
    from tokenfuse.video.chunks import track_keyframes
    from tokenfuse.video.encode import EncodeOptions
    from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
    from tokenfuse.video.keyframes import KeyframeOptions
    from tokenfuse.video.track_pass import track_video
    from tokenfuse.video.tracks import make_detect

    work = Path(args.workdir)
    clip = work / f"head720_{args.frames}.mp4"
    per_frame = work / f"out_{args.frames}_per_frame_off.mp4"
    t0 = time.perf_counter()
    tracks = track_video(clip, make_detect(RetinaFaceDetector(), detect_size=480))
    print(f"pass 1: {time.perf_counter() - t0:.0f} s, {len(tracks.tracks)} track(s)", flush=True)
    opts = FuseOptions(
        crop_size=args.size,
        faces_per_batch=2,
        seed=1,
        keyframes=KeyframeOptions(per_second=args.kps),
        encode=EncodeOptions(crf=19, preset="veryfast"),
    )
    keys = {int(k) for ks in track_keyframes(tracks, opts) for k in ks}
    print(f"key frames: {sorted(keys)}")
    real = work / f"out_{args.frames}_keyframes_off.mp4"
    if not args.no_model_runs:
        breakdown(per_frame_flicker(clip, per_frame, tracks), set(range(args.frames)), "per_frame (model output)")
    if real.exists() and not args.no_model_runs:
        breakdown(per_frame_flicker(clip, real, tracks), keys, "keyframes (model run)")
    refine = replay_refine(clip, per_frame, tracks, args.size)
    out_dir = Path(tempfile.mkdtemp(prefix="flk_replay_"))
    variants = [
        (d, float(sg)) for d in args.details.split(",") for sg in (args.sigmas.split(",") if d == "refined" else [0])
    ]
    for detail, sigma in variants:
        out = out_dir / f"replay_{detail}_{sigma}.mp4"
        flow = replace(opts.flow, detail=detail, detail_sigma=sigma or opts.flow.detail_sigma)
        stats = fuse_video(clip, out, FuseJob(tracks, refine, replace(opts, flow=flow)))
        name = (
            f"keyframes replay, detail={detail}"
            + (f" sigma {sigma}" if detail == "refined" else "")
            + f" ({stats.key_frames} keys, {stats.flow_failures} flow fails)"
        )
        breakdown(per_frame_flicker(clip, out, tracks), keys, name)
    print(f"\nreplay crops not found in the per-frame output: {refine.misses[0]}")  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
