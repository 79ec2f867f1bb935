"""`python <pack> serve` on Ray Serve (local cluster, CPU, demo graph shrunk for CPU): health, a fused photo per
request, concurrent requests batched into one execution, a bad body failing alone, a flood of requests beyond the
queue answered 503 with Retry-After (the accepted ones served), a request after the flood served, and SIGTERM
shutting down cleanly. Skips without Ray or ComfyUI."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration
pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-scale.txt")
REPO = Path(__file__).resolve().parents[2]
MAX_QUEUED = 6  # --max-queued of the service under test
FLOOD = 24  # simultaneous requests of the overload phase


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: bytes, timeout: float = 300) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = {"text": text.decode(errors="replace")}
        return e.code, dict(e.headers), data


def _decode(png_base64: str) -> Any:
    import cv2
    import numpy as np

    return cv2.imdecode(np.frombuffer(base64.b64decode(png_base64), np.uint8), cv2.IMREAD_COLOR)


def post_chunked(url: str, chunks: list[bytes]) -> tuple[int, dict]:
    """POST with Transfer-Encoding: chunked (no Content-Length); the server may answer before the body is sent."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request("POST", "/", body=iter(chunks), encode_chunked=True)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the answer came first and the server closed: read it below
    with conn.getresponse() as r:
        status, data = r.status, json.loads(r.read())
    conn.close()
    return status, data


def test_service(comfyui_path: Path, tmp_path: Path) -> None:
    import cv2
    import numpy as np
    from skimage import data

    ok, png = cv2.imencode(".png", data.astronaut()[:, :, ::-1])
    photo = png.tobytes()
    port = _port()
    cmd = [sys.executable, str(REPO), "serve", "--cpu", "--port", str(port), "--max-batch", "2", "--batch-wait", "1.0"]
    # max ongoing = 2 x max batch = 4 per replica, plus MAX_QUEUED waiting: phase 1's 3 requests always fit, even
    # when Serve's router is slow to hand them to the replica (a request counts as queued until it is assigned:
    # with a queue of 1, a loaded machine answered 503 to the second of 3 simultaneous requests); the flood
    # (FLOOD requests at once) overfills it whatever the machine's speed
    cmd += ["--max-queued", str(MAX_QUEUED), "--retry-after", "3", "--comfyui", str(comfyui_path)]
    cmd += ["--max-image-mb", "2", "--max-megapixels", "20"]
    before = set(Path(tempfile.gettempdir()).glob("tokenfuse_run_*"))
    for s in ("fuse.steps=1", "fuse.guide_size=64", "fuse.max_size=64", "detect.crop_size=64"):
        cmd += ["--set", s]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 400
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-4000:]
            time.sleep(2)
        # two concurrent requests -> one batch of 2; a bad body fails alone
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda b: post(url, b), [photo, photo, b"not an image"]))
        (s1, _, r1), (s2, _, r2), (s3, _, r3) = answers
        assert (s1, s2, s3) == (200, 200, 400), answers
        assert r1["faces"] == 1 and r1["fallbacks"] == [] and r3["error"].startswith("not a decodable image")
        assert max(r1["batch_size"], r2["batch_size"]) == 2, (r1["batch_size"], r2["batch_size"])
        fused = cv2.imdecode(np.frombuffer(base64.b64decode(r1["image_png_base64"]), np.uint8), cv2.IMREAD_COLOR)
        assert fused.shape == data.astronaut().shape
        # overload: FLOOD requests at once against 4 ongoing + MAX_QUEUED waiting; the rest are refused before any
        # work (503 + Retry-After), every accepted one is served, none fails otherwise
        with ThreadPoolExecutor(FLOOD) as pool:
            answers = list(pool.map(lambda b: post(url, b), [photo] * FLOOD))
        codes = [a[0] for a in answers]
        assert set(codes) <= {200, 503}, codes
        assert codes.count(503) >= FLOOD - (4 + MAX_QUEUED) - 4 and codes.count(200) >= 2, codes
        refused = [a for a in answers if a[0] == 503]
        assert all({k.lower(): v for k, v in a[1].items()}.get("retry-after") == "3" for a in refused), refused[0][1]
        assert all(a[2]["faces"] == 1 for a in answers if a[0] == 200)
        # after the flood the service still serves: a new request is answered 200, the health stays ok
        status, _, after = post(url, photo)
        assert status == 200 and after["faces"] == 1, (status, after)
        # a photo's result does not depend on the others batched with it (frame 1 of the batch used seed + 1)
        pixels = [_decode(r["image_png_base64"]) for r in (r1, r2, after)]  # the PNGs' metadata names the batch
        assert np.array_equal(pixels[0], pixels[1]) and np.array_equal(pixels[1], pixels[2])
        assert "frame 0 face 0: ok, seed 0," in r1["report"]["6"] and r2["report"]["6"].startswith(
            "frame 0 face 0: ok, seed 0,"
        )
        with urllib.request.urlopen(f"{url}/health", timeout=30) as r:
            health = json.loads(r.read())
        assert health["busy_s"] == 0.0 and health["interrupted"] == 0, health
        assert health["status"] == "ok" and health["served"] >= 2 + codes.count(200) + 1, (health, codes)
        # limits: a body over --max-image-mb (413 before reading it), a small PNG declaring 9000 x 9000 pixels (413
        # from its header, before decoding: it once took 115 s and 7 GB of the replica)
        status, _, big = post(url, b"x" * (3 * 2**20))
        assert status == 413 and "2 MB limit" in big["error"], (status, big)
        status, chunked = post_chunked(url, [b"x" * 2**16] * 4096)  # 256 MB, no Content-Length: refused as it arrives
        assert status == 413 and "2 MB limit" in chunked["error"], (status, chunked)
        ok, bomb = cv2.imencode(".png", np.zeros((9000, 9000, 3), np.uint8))
        t0 = time.monotonic()
        status, _, huge = post(url, bomb.tobytes())
        assert status == 413 and "9000x9000" in huge["error"] and time.monotonic() - t0 < 30, (status, huge)
        # nothing of the answered requests stays on the replica's disk (inputs, saved outputs, previews)
        (work,) = set(Path(tempfile.gettempdir()).glob("tokenfuse_run_*")) - before
        # (.lock: the live runner's lock, which tells a later run's sweep that this work folder is in use)
        left = [p.name for p in work.rglob("*") if p.is_file() and p.name != ".lock"]
        assert not left, left
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        log.close()
    assert rc == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert "shutting down" in (tmp_path / "serve.log").read_text()
    assert not set(Path(tempfile.gettempdir()).glob("tokenfuse_run_*")) - before  # the replica's work folder too
