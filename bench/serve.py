"""Service throughput and latency: `python <pack> serve` (Ray Serve) unbatched (max batch 1) vs batched, at 1, 2, 4,
8 concurrent clients, then overload (requests refused with 503 + Retry-After instead of queueing without bound).

One run starts the service twice (unbatched, then batched) on the same machine, same graph and photo, and prints
per concurrency: requests/s, p50 / p95 latency, and the batched / unbatched throughput ratio.

    python bench/serve.py --comfyui /path/to/ComfyUI --cpu --steps 1 --guide 64          # CPU, demo graph
    python bench/serve.py --comfyui /path/to/ComfyUI --steps 20 --guide 512              # GPU

The demo graph runs the project's small trained face model (runner/demo.py, devkit/face_model): a few-MB model, so
the figures are the service's own overhead and batching behaviour, not a real checkpoint's cost. Attention backend:
ComfyUI's default for the device unless --sdpa.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def photo_png() -> bytes:
    import numpy as np
    from PIL import Image
    from skimage import data

    buf = io.BytesIO()
    Image.fromarray(np.asarray(data.astronaut())).save(buf, format="PNG")
    return buf.getvalue()


def post(url: str, body: bytes) -> tuple[int, float, dict[str, str]]:
    t0 = time.perf_counter()
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=900) as r:
            r.read()
            return r.status, time.perf_counter() - t0, dict(r.headers)
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, time.perf_counter() - t0, dict(e.headers)


def start(args: argparse.Namespace, max_batch: int, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO), "serve", "--port", str(port), "--max-batch", str(max_batch)]
    cmd += ["--batch-wait", str(args.batch_wait), "--max-queued", str(args.max_queued), "--retry-after", "2"]
    cmd += ["--set", f"fuse.steps={args.steps}", "--set", f"fuse.guide_size={args.guide}"]
    cmd += ["--set", f"fuse.max_size={args.guide}", "--set", f"detect.crop_size={args.guide}"]
    cmd += ["--set", f"fuse.faces_per_batch={max(max_batch, 1)}"]
    if args.comfyui:
        cmd += ["--comfyui", args.comfyui]
    cmd += ["--cpu"] if args.cpu else []
    cmd += ["--sdpa"] if args.sdpa else []
    proc = subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    deadline = time.monotonic() + 900
    while True:
        if proc.poll() is not None:
            sys.exit(f"service exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return proc
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                proc.kill()
                sys.exit("service did not start in 900 s")
            time.sleep(2)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()


def measure(url: str, body: bytes, clients: int, per_client: int) -> dict[str, float]:
    n = clients * per_client
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        res = list(pool.map(lambda _: post(url, body), range(n)))
    wall = time.perf_counter() - t0
    lat = sorted(r[1] for r in res if r[0] == 200)
    p95 = lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))] if lat else float("nan")
    return {
        "ok": len(lat),
        "rps": len(lat) / wall,
        "p50": statistics.median(lat) if lat else float("nan"),
        "p95": p95,
        "errors": n - len(lat),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--sdpa", action="store_true")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--per-client", type=int, default=2, help="requests each client sends per level")
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--batch-wait", type=float, default=0.1)
    ap.add_argument("--max-queued", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--guide", type=int, default=512)
    ap.add_argument("--overload", type=int, default=32, help="concurrent requests in the overload step (0: skip)")
    ap.add_argument("--log-dir", default="/tmp")
    args = ap.parse_args()
    body = photo_png()
    clients = [int(c) for c in args.clients.split(",")]
    table: dict[int, dict[int, dict[str, float]]] = {}
    overload: dict[str, object] = {}
    for max_batch in (1, args.max_batch):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        proc = start(args, max_batch, port, Path(args.log_dir) / f"tokenfuse_bench_serve_b{max_batch}.log")
        url = f"http://127.0.0.1:{port}/"
        try:
            post(url, body)  # warm-up: models load on the first request
            table[max_batch] = {}
            for c in clients:
                table[max_batch][c] = m = measure(url, body, c, args.per_client)
                print(
                    f"max_batch {max_batch} clients {c}: {json.dumps({k: round(v, 3) for k, v in m.items()})}",
                    flush=True,
                )
            if max_batch == args.max_batch and args.overload:
                t0 = time.perf_counter()
                with ThreadPoolExecutor(args.overload) as pool:
                    res = list(pool.map(lambda _, u=url: post(u, body), range(args.overload)))
                refused = [r for r in res if r[0] == 503]
                overload = {
                    "sent": args.overload,
                    "ok": sum(r[0] == 200 for r in res),
                    "503": len(refused),
                    "other": sum(r[0] not in (200, 503) for r in res),
                    "retry_after": sorted({r[2].get("retry-after") or r[2].get("Retry-After") for r in refused}),
                    "refusal_ms_p50": 1000 * statistics.median(r[1] for r in refused) if refused else None,
                    "wall_s": time.perf_counter() - t0,
                }
        finally:
            stop(proc)
    print(
        f"\nTokenFuse service (Ray Serve), demo graph, steps {args.steps}, guide {args.guide}, "
        f"{'CPU' if args.cpu else 'GPU'}; {args.per_client} requests per client"
    )
    print(f"| clients | unbatched req/s | p50 / p95 s | batched (max {args.max_batch}) req/s | p50 / p95 s | ratio |")
    print("|---|---|---|---|---|---|")
    for c in clients:
        a, b = table[1][c], table[args.max_batch][c]
        print(
            f"| {c} | {a['rps']:.3f} | {a['p50']:.2f} / {a['p95']:.2f} | {b['rps']:.3f} | "
            f"{b['p50']:.2f} / {b['p95']:.2f} | {b['rps'] / a['rps']:.2f}x |"
        )
    if overload:
        print(f"overload: {json.dumps(overload)}")


if __name__ == "__main__":
    main()
