"""`python <pack> serve` on Ray Serve (local cluster, CPU, demo graph shrunk for CPU): health, a fused photo per
request, concurrent requests batched into one execution, a bad body failing alone, overload answered 503 with
Retry-After, and SIGTERM shutting down cleanly. Skips without Ray or ComfyUI."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-scale.txt")
REPO = Path(__file__).resolve().parents[2]


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


def test_service(comfyui_path: Path, tmp_path: Path) -> None:
    import cv2
    import numpy as np
    from skimage import data

    ok, png = cv2.imencode(".png", data.astronaut()[:, :, ::-1])
    photo = png.tobytes()
    port = _port()
    cmd = [sys.executable, str(REPO), "serve", "--cpu", "--port", str(port), "--max-batch", "2", "--batch-wait", "1.0"]
    cmd += ["--max-queued", "1", "--retry-after", "3", "--comfyui", str(comfyui_path)]
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
        assert r1["faces"] == 1 and r1["fallbacks"] == [] and r3["error"] == "not a decodable image"
        assert max(r1["batch_size"], r2["batch_size"]) == 2, (r1["batch_size"], r2["batch_size"])
        fused = cv2.imdecode(np.frombuffer(base64.b64decode(r1["image_png_base64"]), np.uint8), cv2.IMREAD_COLOR)
        assert fused.shape == data.astronaut().shape
        # overload: 4 ongoing (2 x max batch) + 1 queued per replica; the rest are refused before any work
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda b: post(url, b), [photo] * 10))
        codes = [a[0] for a in answers]
        assert codes.count(503) >= 3 and codes.count(200) >= 2, codes
        refused = next(a for a in answers if a[0] == 503)
        assert {k.lower(): v for k, v in refused[1].items()}.get("retry-after") == "3", refused[1]
        with urllib.request.urlopen(f"{url}/health", timeout=30) as r:
            health = json.loads(r.read())
        assert health["status"] == "ok" and health["served"] >= 4
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
