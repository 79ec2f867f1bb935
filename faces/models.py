"""Face model files: where they live, the pinned download table, and a verified atomic downloader.

A download is written to `<name>.part` beside the target, checked against its pinned sha256, then renamed into
place, so a failed or interrupted download never leaves a file that looks like a model. It is bounded three ways, so
a slow, hostile or broken mirror cannot hold ComfyUI's single queue or fill the disk: the caller's cancel point runs
between chunks (ComfyUI's interrupt), a stall (too few bytes for `STALL_S` seconds, or none at all: the socket
timeout) gives up, and the body may not exceed the entry's `max_bytes`, whether or not Content-Length is sent.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger(__name__)


DEFAULT_MAX_BYTES = 256 << 20  # an entry that declares no size cap of its own (every pinned entry declares one)


@dataclass(frozen=True)
class ModelFile:
    """A downloadable model: file name inside its model folder, official URL, pinned sha256 (hex).

    max_bytes: the most a download may receive (about twice the official file): a body past it is refused while it
    arrives, a Content-Length past it before any byte is read.
    """

    name: str
    url: str
    sha256: str
    licence: str = ""
    max_bytes: int = DEFAULT_MAX_BYTES


# Official OpenCV zoo file (served through Git LFS). The sha256 is the one the zoo publishes for this file.
YUNET_2023MAR = ModelFile(
    name="face_detection_yunet_2023mar.onnx",
    url="https://media.githubusercontent.com/media/opencv/opencv_zoo/main/models/face_detection_yunet/"
    "face_detection_yunet_2023mar.onnx",
    sha256="8f2383e4dd3cfbb4553ea8718107fc0423210dc964f9f4280604804ed2552fa4",
    licence="MIT",
    max_bytes=512 << 10,  # the official file is about 230 KB
)

# Downloadable models by key. Tests (and mirrors) may point an entry elsewhere by replacing it in this dict.
DOWNLOADS: dict[str, ModelFile] = {"yunet": YUNET_2023MAR}


class ModelFileError(RuntimeError):
    """A model file is missing, corrupt, the wrong model, or could not be downloaded; the message names the fix."""


class ModelNotFoundError(ModelFileError, FileNotFoundError):
    """A model named by a prompt is not a file inside the model folders (missing, unreadable or outside them alike)."""


class ModelFolderError(ModelFileError):
    """A model folder cannot be created or written (read-only mount, no permission): another folder may do."""


STALL_S = 30.0  # a download that receives fewer than STALL_MIN_BYTES in this many seconds gives up
STALL_MIN_BYTES = 16 << 10  # per STALL_S window: 100 bytes a second is a stall, a slow 1 KB/s link is not
CHUNK_BYTES = 64 << 10  # the most one read returns; a read returns what has arrived (the cancel point runs after it)
STALE_PART_S = 3600.0  # a .part older than this is an interrupted download (a live one writes every second)


def _remove_stale_parts(folder: Path, name: str) -> None:
    """Delete `.<name>.<pid>.part` files an interrupted download left (killed process, restart); not recent ones,
    which may be another process's download in progress."""
    now = time.time()
    for old in folder.glob(f".{name}.*.part"):
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > STALE_PART_S:
                old.unlink()


def download(
    entry: ModelFile, folder: Path, timeout: float | None = None, cancel: Callable[[], None] | None = None
) -> Path:
    """Fetch `entry` into `folder` (created if needed), verify its sha256, rename it into place atomically.

    Returns the final path. Raises ModelFolderError (folder not writable), ModelFileError (offline, HTTP error,
    stalled, larger than entry.max_bytes, incomplete download, checksum mismatch) and leaves no file behind, also
    when interrupted. timeout: the stall window in seconds (default STALL_S): one read waits at most this long for a
    byte (the socket timeout), and each window of this length must bring STALL_MIN_BYTES or the end of the file.
    cancel(): called before connecting and after every read (a read returns whatever has arrived, so a trickling
    server cannot hold it); whatever it raises (ComfyUI's interrupt) stops the download, which is then removed.
    """
    stall_s = STALL_S if timeout is None else float(timeout)
    folder = Path(folder)
    target = folder / entry.name
    part = folder / f".{entry.name}.{os.getpid()}.part"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_stale_parts(folder, entry.name)
        out = open(part, "wb")  # noqa: SIM115 - closed below, before the checks
    except OSError as exc:
        raise ModelFolderError(f"cannot write {entry.name} into {folder} ({exc.strerror or exc})") from exc
    digest, size, expected = hashlib.sha256(), 0, None
    try:
        with out:
            if cancel is not None:
                cancel()
            with urllib.request.urlopen(entry.url, timeout=stall_s) as resp:  # noqa: S310
                expected = _declared_length(entry, resp, target)
                size = _copy_body(_Fetch(entry, target, stall_s, cancel), resp, out, digest)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        _discard(part)
        raise ModelFileError(
            f"could not download {entry.name} from {entry.url} ({exc}). If this machine is offline, download the "
            f"file elsewhere and put it at {target}."
        ) from exc
    except BaseException:  # cancel, Ctrl-C, a stall, an oversized body: nothing half-written stays
        _discard(part)
        raise
    if expected is not None and size != expected:
        _discard(part)
        raise ModelFileError(
            f"incomplete download of {entry.name} from {entry.url} ({size} of {expected} bytes): the connection "
            f"ended early. Nothing was saved; try again, or put the official file at {target}."
        )
    if digest.hexdigest() != entry.sha256.lower():
        _discard(part)
        raise ModelFileError(
            f"downloaded {entry.name} from {entry.url} but its sha256 is {digest.hexdigest()}, expected "
            f"{entry.sha256}: the server sent a different file. Nothing was saved; put the official file at {target}."
        )
    try:
        os.replace(part, target)
    except OSError as exc:
        _discard(part)
        raise ModelFolderError(f"cannot write {entry.name} into {folder} ({exc.strerror or exc})") from exc
    log.info("downloaded %s to %s", entry.name, target)
    return target


def _declared_length(entry: ModelFile, resp: http.client.HTTPResponse, target: Path) -> int | None:
    """The body size the server announces (None without Content-Length); one past entry.max_bytes is refused
    before a byte of it is read."""
    length = (resp.headers.get("Content-Length") or "").strip()
    if not (length.isascii() and length.isdigit()):
        return None  # absent or not a number (http.client reads to the end then): the cap applies while reading
    if len(length) > 18 or int(length) > entry.max_bytes:
        raise ModelFileError(
            f"refused to download {entry.name} from {entry.url}: the server announces {_echo_length(length)} bytes, "
            f"more than the {entry.max_bytes} this model may have (a different file). Nothing was saved; "
            f"put the official file at {target}."
        )
    return int(length)


def _echo_length(length: str) -> str:
    """A Content-Length header for a message, cut short (a hostile server may send a huge number)."""
    return length if len(length) <= 24 else f"{length[:21]}..."


@dataclass(frozen=True)
class _Fetch:
    """One download in progress: the model, where it goes, the stall window in seconds, the cancel point."""

    entry: ModelFile
    target: Path
    stall_s: float
    cancel: Callable[[], None] | None


def _copy_body(fetch: _Fetch, resp: http.client.HTTPResponse, out: BinaryIO, digest: Any) -> int:
    """Copy the response body to `out` and `digest` chunk by chunk; returns its size in bytes.

    read1() returns whatever has arrived (at most CHUNK_BYTES), so the cancel point runs while a server trickles;
    a window of stall_s seconds with fewer than STALL_MIN_BYTES, a read that waits stall_s for any byte (socket
    timeout), or a body past entry.max_bytes raise ModelFileError before more is written.
    """
    entry, target, stall_s, cancel = fetch.entry, fetch.target, fetch.stall_s, fetch.cancel
    size = window_bytes = 0
    window_start = time.monotonic()
    while True:
        try:
            chunk = resp.read1(CHUNK_BYTES)
        except TimeoutError:
            raise ModelFileError(_stalled(entry, stall_s, size, target)) from None
        if not chunk:
            return size
        if cancel is not None:
            cancel()
        size += len(chunk)
        if size > entry.max_bytes:
            raise ModelFileError(
                f"refused to download {entry.name} from {entry.url}: the server sent more than {entry.max_bytes} "
                f"bytes, more than this model may have (it sent a different file). Nothing was saved; put the "
                f"official file at {target}."
            )
        digest.update(chunk)
        out.write(chunk)
        window_bytes += len(chunk)
        now = time.monotonic()
        if now - window_start >= stall_s:
            if window_bytes < STALL_MIN_BYTES:
                raise ModelFileError(_stalled(entry, stall_s, size, target))
            window_start, window_bytes = now, 0


def _stalled(entry: ModelFile, stall_s: float, size: int, target: Path) -> str:
    return (
        f"download of {entry.name} from {entry.url} stalled: fewer than {STALL_MIN_BYTES} bytes arrived in "
        f"{stall_s:g} s ({size} received in all). Nothing was saved; try again later, or download the file "
        f"elsewhere and put it at {target}."
    )


def _discard(part: Path) -> None:
    with contextlib.suppress(OSError):
        part.unlink(missing_ok=True)


def ensure_model(
    key: str, folders: list[Path], allow_download: bool = True, cancel: Callable[[], None] | None = None
) -> Path:
    """Path of the model `key` of DOWNLOADS: the first folder holding it, else download it into the first folder
    that can be written (a read-only mount first in the list is skipped)."""
    entry = DOWNLOADS[key]
    for folder in folders:
        candidate = Path(folder) / entry.name
        if candidate.is_file():
            return candidate
    if not folders:
        raise ModelFileError(f"no model folder known for {entry.name}: run inside ComfyUI or set TOKENFUSE_MODELS.")
    if not allow_download:
        raise ModelFileError(f"{entry.name} not found in {[str(f) for f in folders]}: put it there ({entry.url}).")
    refused = []
    for folder in folders:
        try:
            return download(entry, Path(folder), cancel=cancel)
        except ModelFolderError as exc:
            refused.append(str(exc))
    raise ModelFileError(
        f"no model folder can be written ({'; '.join(refused)}): download {entry.url} elsewhere and put it at "
        f"{Path(folders[0]) / entry.name}, or set TOKENFUSE_MODELS to a writable folder."
    )


def find_onnx(folders: list[Path], name: str) -> Path | None:
    """A file `name` (or `name`.onnx) in the first folder that has it."""
    for folder in folders:
        for cand in (Path(folder) / name, Path(folder) / f"{name}.onnx"):
            if cand.is_file():
                return cand
    return None
