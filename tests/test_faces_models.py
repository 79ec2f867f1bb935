"""Model files: the real YuNet/SCRFD assets load, the downloader is verified against a loopback HTTP server, and
corrupt or wrong files give errors that name the file and the fix."""

from __future__ import annotations

import functools
import hashlib
import http.server
import shutil
import socket
import threading
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
    with pytest.raises(ModelFileError, match="models/insightface/models/<name>"):
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
