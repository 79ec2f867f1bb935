"""Runner scale-out: the same photos through `run --ray local --workers 1` and `--workers 2..N` (one run each, same
graph, same photos), printing wall time, items/s and the ratio to one worker. Wall time includes each worker's
ComfyUI start (printed separately as the first item's extra latency is not split out: compare with --photos large).

    python bench/scale.py --comfyui /path/to/ComfyUI --cpu --photos 8 --workers 1,2 --steps 1 --guide 64

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

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--photos", type=int, default=8)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--guide", type=int, default=512)
    args = ap.parse_args()
    import cv2
    import numpy as np
    from skimage import data

    tmp = Path(tempfile.mkdtemp(prefix="tokenfuse_scale_"))
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
        report = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
        ok = sum(r["status"] == "ok" for r in report)
        item_s = sorted(r["time_s"] for r in report if r["status"] == "ok")
        rows.append((n, wall, ok, item_s, len({r.get("worker") for r in report}), res.returncode))
        print(f"workers {n}: exit {res.returncode}, {ok}/{args.photos} ok, wall {wall:.1f} s", flush=True)
    base = rows[0][1]
    print(
        f"\nrun --ray local, demo graph, {args.photos} photos, steps {args.steps}, guide {args.guide}, "
        f"{'CPU' if args.cpu else 'GPU'}"
    )
    print("| workers | wall s (incl. worker start) | items/s | per-item s (median) | workers used | vs 1 |")
    print("|---|---|---|---|---|---|")
    for n, wall, ok, item_s, used, _ in rows:
        med = item_s[len(item_s) // 2] if item_s else float("nan")
        print(f"| {n} | {wall:.1f} | {ok / wall:.3f} | {med:.2f} | {used} | {base / wall:.2f}x |")


if __name__ == "__main__":
    main()
