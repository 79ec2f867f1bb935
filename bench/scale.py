"""Runner scale-out: the same photos through `run --ray local --workers 1` and `--workers 2..N` (one run each, same
graph, same photos), printing wall time, ok items/s and the ratio to the first worker count (only where both runs
finished every item: a run with failures did less work). Wall time includes each worker's ComfyUI start (printed
separately as the first item's extra latency is not split out: compare with --photos large).

    python bench/scale.py --comfyui /path/to/ComfyUI --cpu --photos 8 --workers 1,2 --steps 1 --guide 64
    python bench/scale.py --video 600 --workers 1,2 --steps 4 --guide 256          # one long video in time chunks

--video FRAMES: one 1280x720 30 fps talking-head clip of FRAMES frames (bench/video.py's) through `run --engine core
--sampler demo --ray local --workers N --chunks N` (no ComfyUI needed): tracks once on the driver, N time chunks on
N workers, joined in order; prints the same table per worker count plus the chunks and key frames.

Demo graph (runner/demo.py: the project's small trained face model, a few MB): the runner's own cost and spread,
not a real checkpoint's.
On a 2-core CPU two workers compete for the same cores, so a ratio near 1x there says nothing about GPUs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--photos", type=int, default=8)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--guide", type=int, default=512)
    ap.add_argument("--video", type=int, default=0, help="frames of one long video instead of photos (0: photos)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tokenfuse_scale_"))
    if args.video:
        video_rows(args, tmp)
        return
    import cv2
    import numpy as np
    from skimage import data

    (tmp / "in").mkdir()
    img = data.astronaut()[:, :, ::-1]
    for k in range(args.photos):
        cv2.imwrite(str(tmp / "in" / f"p{k:03d}.png"), np.ascontiguousarray(img if k % 2 == 0 else img[:, ::-1]))
    rows = []
    for n in [int(w) for w in args.workers.split(",")]:
        out = tmp / f"out_{n}"
        cmd = [sys.executable, str(REPO), "run", "--demo", str(tmp / "in"), "-o", str(out), "--quiet"]
        cmd += ["--ray", "local", "--workers", str(n), "--set", f"fuse.steps={args.steps}"]
        cmd += ["--set", f"fuse.guide_size={args.guide}", "--set", f"fuse.max_size={args.guide}"]
        cmd += ["--set", f"detect.crop_size={args.guide}"]
        cmd += (["--comfyui", args.comfyui] if args.comfyui else []) + (["--cpu"] if args.cpu else [])
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        report = read_report(out, res)
        ok = sum(r["status"] == "ok" for r in report)
        item_s = sorted(r["time_s"] for r in report if r["status"] == "ok")
        rows.append((n, wall, ok, item_s, len({r.get("worker") for r in report}), res.returncode))
        print(f"workers {n}: exit {res.returncode}, {ok}/{args.photos} ok, wall {wall:.1f} s", flush=True)
    print(
        f"\nrun --ray local, demo graph, {args.photos} photos, steps {args.steps}, guide {args.guide}, "
        f"{'CPU' if args.cpu else 'GPU'}"
    )
    print("\n".join(photo_table(rows, args.photos)))


def read_report(out: Path, res: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The runner's report.jsonl in out, one dict per item; [] with a message when the run wrote none."""
    path = out / "report.jsonl"
    if not path.is_file():
        tail = (res.stdout[-1500:] + res.stderr[-1500:]).strip()
        print(f"no {path} (runner exit {res.returncode}): the run stopped before reporting; its output ends:\n{tail}")
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def vs_first(ok: int, wall: float, first: tuple[int, float], total: int) -> str:
    """This run's ok items per second over the first run's, only when both finished every item: a run with failures
    did a different (smaller, often fast-failing) job, so its time is no speed-up ('-')."""
    if ok != total or first[0] != total or total == 0:
        return "-"
    return f"{(ok / wall) / (first[0] / first[1]):.2f}x"


def photo_table(rows: list[tuple[int, float, int, list[float], int, int]], total: int) -> list[str]:
    """The Markdown table of the photo runs (n, wall, ok, ok items' seconds, workers used, exit code)."""
    first = (rows[0][2], rows[0][1])
    out = [
        "| workers | ok | wall s (incl. worker start) | ok items/s | per-item s (median) | workers used | vs 1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, wall, ok, item_s, used, _ in rows:
        med = item_s[len(item_s) // 2] if item_s else float("nan")
        vs = vs_first(ok, wall, first, total)
        out.append(f"| {n} | {ok}/{total} | {wall:.1f} | {ok / wall:.3f} | {med:.2f} | {used} | {vs} |")
    out.append(
        "ok items/s: items that finished ok per second of wall. vs 1: that over the first run's, only where both runs "
        "finished every item ('-' otherwise: a run with failures did less work, often fast because it failed)."
    )
    return out


def video_rows(args: argparse.Namespace, tmp: Path) -> None:
    """--video: one clip, `run --engine core --ray local --workers N --chunks N` per worker count."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from video import make_clip

    clip = make_clip(tmp / "talk.mp4", args.video)
    rows = []
    for n in [int(w) for w in args.workers.split(",")]:
        out = tmp / f"out_{n}"
        cmd = [sys.executable, str(REPO), "run", "--engine", "core", "--sampler", "demo", str(clip), "-o", str(out)]
        cmd += ["--steps", str(args.steps), "--crop-size", str(args.guide), "--quiet"]
        cmd += ["--ray", "local", "--workers", str(n), "--chunks", str(n)]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        report = read_report(out, res)
        row = report[0] if report else {"status": "no report"}
        rows.append((n, wall, row, res.returncode))
        print(f"workers {n}: exit {res.returncode}, {row['status']}, wall {wall:.1f} s", flush=True)
        if res.returncode and report:
            print(res.stdout[-2000:] + res.stderr[-2000:], flush=True)
    first = (int(rows[0][2]["status"] == "ok"), rows[0][1])
    print(f"\nrun --engine core --ray local, demo sampler, {args.video} frames 1280x720, ", end="")
    print(f"steps {args.steps}, crop {args.guide}, CPU torch threads: 1 per worker")
    print("| workers | status | chunks | wall s (incl. worker start) | frames/s | key frames | workers used | vs 1 |")
    print("|---|---|---|---|---|---|---|---|")
    for n, wall, row, _ in rows:
        frames, chunks = row.get("frames", 0), len(row.get("chunks", []))
        used = len(row.get("workers", []))
        keys = row.get("key_frames")
        vs = vs_first(int(row["status"] == "ok"), wall, first, 1)
        print(f"| {n} | {row['status']} | {chunks} | {wall:.1f} | {frames / wall:.2f} | {keys} | {used} | {vs} |")
    print("vs 1: the first run's wall / this one's, only where both runs ended ok ('-' otherwise).")


if __name__ == "__main__":
    main()
