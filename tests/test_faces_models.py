"""Model files: the real YuNet/SCRFD assets load, the downloader is verified against a loopback HTTP server, and
corrupt or wrong files give errors that name the file and the fix."""

from __future__ import annotations

import functools
import hashlib
import http.server
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tokenfuse.faces import models
from tokenfuse.faces.analyse import load_backend
from tokenfuse.faces.detect import SCRFDDetector, YuNetDetector
from tokenfuse.faces.embed import insightface_pack
from tokenfuse.faces.models import ModelFile, ModelFileError, download, ensure_model

YUNET_ASSET = "face_detection_yunet_2026may.onnx"
YUNET_SHA = "ebafce4e3c118d6554634be5c27ab333b4c047a9a8c3faf1d7cf93101c22f0f0"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file (moved here from faces/models.py: only these tests used it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def asset_server(shared_assets: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(shared_assets))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_shared_asset_checksums(shared_assets: Path) -> None:
    assert sha256_file(shared_assets / YUNET_ASSET) == YUNET_SHA


def test_official_yunet_is_pinned() -> None:
    entry = models.DOWNLOADS["yunet"]
    assert entry.name == "face_detection_yunet_2023mar.onnx" and len(entry.sha256) == 64
    assert entry.url.startswith("https://") and entry.url.endswith(entry.name)


def test_download_good_checksum(asset_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = ModelFile(name=YUNET_ASSET, url=f"{asset_server}/{YUNET_ASSET}", sha256=YUNET_SHA)
    monkeypatch.setitem(models.DOWNLOADS, "yunet", entry)
    path = ensure_model("yunet", [tmp_path / "facedetection"])
    assert path == tmp_path / "facedetection" / YUNET_ASSET and sha256_file(path) == YUNET_SHA
    assert sorted(p.name for p in path.parent.iterdir()) == [YUNET_ASSET]  # no .part left
    # the downloaded file runs through the real backend, and a second call reuses it
    det, _ = load_backend("yunet", [tmp_path / "facedetection"])
    assert isinstance(det, YuNetDetector)
    mtime = path.stat().st_mtime_ns
    assert ensure_model("yunet", [tmp_path / "facedetection"]).stat().st_mtime_ns == mtime


def test_download_bad_checksum_leaves_nothing(asset_server: str, tmp_path: Path) -> None:
    entry = ModelFile(name=YUNET_ASSET, url=f"{asset_server}/{YUNET_ASSET}", sha256="0" * 64)
    with pytest.raises(ModelFileError, match="sha256") as err:
        download(entry, tmp_path)
    assert YUNET_ASSET in str(err.value) and str(tmp_path) in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_download_server_down(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    entry = ModelFile(name="m.onnx", url=f"http://127.0.0.1:{port}/m.onnx", sha256="0" * 64)
    with pytest.raises(ModelFileError, match="offline") as err:
        download(entry, tmp_path / "d", timeout=5)
    assert "m.onnx" in str(err.value)
    assert list((tmp_path / "d").iterdir()) == []


def test_download_404(asset_server: str, tmp_path: Path) -> None:
    entry = ModelFile(name="missing.onnx", url=f"{asset_server}/missing.onnx", sha256="0" * 64)
    with pytest.raises(ModelFileError, match="could not download missing.onnx"):
        download(entry, tmp_path)
    assert list(tmp_path.iterdir()) == []


class _ShortHandler(http.server.BaseHTTPRequestHandler):
    """Promises 1000 bytes, sends 10, hangs up (a dropped connection)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"0123456789")
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def test_an_incomplete_download_says_so(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ShortHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        entry = ModelFile(name="m.onnx", url=f"http://127.0.0.1:{server.server_address[1]}/m.onnx", sha256="0" * 64)
        with pytest.raises(ModelFileError, match=r"incomplete download of m.onnx .*\(10 of 1000 bytes\)"):
            download(entry, tmp_path, timeout=5)  # before: "the server sent a different file"
    finally:
        server.shutdown()
        server.server_close()
    assert list(tmp_path.iterdir()) == []


def test_a_cancelled_download_leaves_nothing_and_stale_parts_go(asset_server: str, tmp_path: Path) -> None:
    import os
    import time

    class Cancelled(Exception):
        pass

    def cancel() -> None:
        raise Cancelled

    entry = ModelFile(name=YUNET_ASSET, url=f"{asset_server}/{YUNET_ASSET}", sha256=YUNET_SHA)
    with pytest.raises(Cancelled):  # ComfyUI's interrupt (or Ctrl-C) reaches the caller as it is
        download(entry, tmp_path, cancel=cancel)
    assert list(tmp_path.iterdir()) == []  # before: .<name>.<pid>.part stayed forever
    stale, recent = tmp_path / f".{YUNET_ASSET}.1.part", tmp_path / f".{YUNET_ASSET}.2.part"
    stale.write_bytes(b"x")
    recent.write_bytes(b"x")  # another process's download in progress: kept
    old = time.time() - models.STALE_PART_S - 60
    os.utime(stale, (old, old))
    download(entry, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([YUNET_ASSET, recent.name])


def test_an_unwritable_first_folder_downloads_into_the_next(
    asset_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = ModelFile(name=YUNET_ASSET, url=f"{asset_server}/{YUNET_ASSET}", sha256=YUNET_SHA)
    monkeypatch.setitem(models.DOWNLOADS, "yunet", entry)
    (tmp_path / "file").write_bytes(b"x")
    blocked = tmp_path / "file" / "facedetection"  # cannot be created (a read-only mount alike, also for root)
    with pytest.raises(ModelFileError, match="cannot write") as err:
        download(entry, blocked)  # before: a raw NotADirectoryError
    assert isinstance(err.value, models.ModelFolderError)
    path = ensure_model("yunet", [blocked, tmp_path / "writable"])
    assert path == tmp_path / "writable" / YUNET_ASSET and sha256_file(path) == YUNET_SHA
    with pytest.raises(ModelFileError, match="no model folder can be written.*TOKENFUSE_MODELS"):
        ensure_model("yunet", [blocked])


def test_no_folder_and_no_download(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="TOKENFUSE_MODELS"):
        ensure_model("yunet", [])
    with pytest.raises(ModelFileError, match="face_detection_yunet_2023mar.onnx"):
        ensure_model("yunet", [tmp_path], allow_download=False)


def test_corrupt_and_wrong_model_files(shared_assets: Path, tmp_path: Path) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not an onnx model" * 10)
    with pytest.raises(ModelFileError, match="broken.onnx") as err:
        YuNetDetector(bad)
    assert "download" in str(err.value)
    with pytest.raises(ModelFileError, match="broken.onnx"):
        SCRFDDetector(bad)
    with pytest.raises(ModelFileError, match="not an SCRFD detector"):  # YuNet given as the SCRFD detector
        SCRFDDetector(shared_assets / YUNET_ASSET)
    with pytest.raises(ModelFileError, match="not found"):
        YuNetDetector(tmp_path / "absent.onnx")
    with pytest.raises(ModelFileError, match="absent.onnx not found"):
        SCRFDDetector(tmp_path / "absent.onnx")


def test_insightface_pack_layout(shared_assets: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="models/insightface/models/buffalo_l"):
        insightface_pack(tmp_path, "buffalo_l")
    pack = tmp_path / "models" / "buffalo_l"
    pack.mkdir(parents=True)
    with pytest.raises(ModelFileError, match="no detector"):
        insightface_pack(tmp_path, "buffalo_l")
    shutil.copy(shared_assets / "scrfd_500m_bnkps.onnx", pack / "det_500m.onnx")
    det, rec = insightface_pack(tmp_path, "buffalo_l")
    assert det.name == "det_500m.onnx" and rec is None
    detector, embedder = load_backend("insightface", [tmp_path])  # default pack name buffalo_l
    assert isinstance(detector, SCRFDDetector) and embedder is None
    assert detector.detect(np.zeros((64, 64, 3), np.uint8), 0.5) == []


class _MirrorHandler(http.server.BaseHTTPRequestHandler):
    """A hostile or broken mirror, chosen by the path: /trickle sends 10 bytes every 50 ms of a promised 1 MB,
    /silent sends the headers then nothing, /huge streams 64 MB without Content-Length, /announce promises 10 GB.
    The bytes it managed to send land in `sent` (a client that stops reading makes its writes fail)."""

    sent: dict[str, int] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        if self.path == "/announce":
            self.send_header("Content-Length", str(10 << 30))
        elif self.path != "/huge":
            self.send_header("Content-Length", str(1 << 20))
        self.end_headers()
        sent = 0
        try:
            if self.path == "/trickle":
                for _ in range(200):  # 10 s in all
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                    sent += 10
                    time.sleep(0.05)
            elif self.path == "/silent":
                time.sleep(10)
            else:
                block = b"x" * (1 << 20)
                for _ in range(64):
                    self.wfile.write(block)
                    sent += len(block)
        except OSError:  # the client hung up: what a stopped download looks like from here
            pass
        finally:
            _MirrorHandler.sent[self.path] = sent
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def mirror() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MirrorHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _MirrorHandler.sent.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _entry(mirror: str, path: str, max_bytes: int = models.DEFAULT_MAX_BYTES) -> ModelFile:
    return ModelFile(name="m.onnx", url=f"{mirror}{path}", sha256="0" * 64, max_bytes=max_bytes)


@pytest.mark.parametrize("path", ["/trickle", "/silent"])
def test_a_stalled_download_gives_up_within_the_stall_window(mirror: str, path: str, tmp_path: Path) -> None:
    """A mirror sending 200 bytes a second (or nothing) of a 1 MB file: before, the download waited for the server
    to end (read(1 MB) returns only when full); now it gives up after the stall window with a clear message."""
    start = time.monotonic()
    with pytest.raises(ModelFileError, match=r"download of m.onnx from .* stalled: .* in 1 s") as err:
        download(_entry(mirror, path), tmp_path, timeout=1.0)
    assert time.monotonic() - start < 4.0, "gave up within about one window (a read waits at most one more)"
    assert "put it at" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # no .part left


def test_a_download_is_cancelled_while_the_mirror_trickles(mirror: str, tmp_path: Path) -> None:
    """ComfyUI's interrupt (the cancel point raises it) stops a trickling download at once, long before the stall
    window (30 s by default) ends it."""

    class Interrupted(Exception):
        pass

    start = time.monotonic()
    calls = []

    def cancel() -> None:
        calls.append(1)
        if time.monotonic() - start > 0.3:
            raise Interrupted

    with pytest.raises(Interrupted):
        download(_entry(mirror, "/trickle"), tmp_path, cancel=cancel)
    assert time.monotonic() - start < 2.0 and len(calls) > 2  # checked between chunks of the trickle
    assert list(tmp_path.iterdir()) == []


def test_an_oversized_body_without_content_length_stops_at_the_cap(mirror: str, tmp_path: Path) -> None:
    """64 MB without Content-Length for a model capped at 1 MB: the download stops once past the cap (before: the
    whole body was written to the .part file, then the checksum refused it)."""
    with pytest.raises(ModelFileError, match=r"server sent more than 1048576 bytes") as err:
        download(_entry(mirror, "/huge", max_bytes=1 << 20), tmp_path, timeout=5.0)
    assert "put the official file at" in str(err.value)
    assert list(tmp_path.iterdir()) == []
    deadline = time.monotonic() + 5
    while "/huge" not in _MirrorHandler.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _MirrorHandler.sent["/huge"] < 32 << 20, "the client hung up long before the end of the body"


def test_a_content_length_over_the_cap_is_refused_before_reading(mirror: str, tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"announces 10737418240 bytes, more than the 524288") as err:
        download(_entry(mirror, "/announce", max_bytes=512 << 10), tmp_path, timeout=5.0)
    assert "Nothing was saved" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_every_pinned_download_declares_its_own_size_cap() -> None:
    for entry in models.DOWNLOADS.values():
        assert 0 < entry.max_bytes < models.DEFAULT_MAX_BYTES, entry.name
    assert models.YUNET_2023MAR.max_bytes <= 3 * 230_000  # about twice the official ~230 KB file


def test_face_detect_passes_comfyuis_interrupt_to_a_first_run_download(
    mirror: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node layer hands its cancel point (nodes/glue/env.throw_if_interrupted) to the download: pressing cancel
    while the YuNet mirror trickles ends the prompt at once, with nothing left in the model folder."""
    import tokenfuse
    import torch
    from tokenfuse.nodes.glue import env

    class InterruptProcessingException(Exception):  # ComfyUI's name (env.is_interrupt keys on it)
        pass

    start = time.monotonic()

    def interrupted() -> None:
        if time.monotonic() - start > 0.3:
            raise InterruptProcessingException

    monkeypatch.setenv("TOKENFUSE_MODELS", str(tmp_path))
    monkeypatch.setitem(models.DOWNLOADS, "yunet", _entry(mirror, "/trickle"))
    monkeypatch.setattr(env, "throw_if_interrupted", interrupted)
    node = tokenfuse.NODE_CLASS_MAPPINGS["TokenFuseFaceDetect"]()
    args = dict(score_threshold=0.5, order="left-right", indices="", max_faces=0, min_face_size=0, crop_size=512)
    with pytest.raises(InterruptProcessingException):
        node.detect(torch.zeros(1, 64, 64, 3), backend="yunet", crop_factor=1.0, detect_size=640, device="cpu", **args)
    assert time.monotonic() - start < 3.0
    assert list((tmp_path / "facedetection").iterdir()) == []
