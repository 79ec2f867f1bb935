"""Face model files: where they live, the pinned download table, and a verified atomic downloader.

A download is written to `<name>.part` beside the target, checked against its pinned sha256, then renamed into
place, so a failed or interrupted download never leaves a file that looks like a model.
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

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFile:
    """A downloadable model: file name inside its model folder, official URL, pinned sha256 (hex)."""

    name: str
    url: str
    sha256: str
    licence: str = ""


# Official OpenCV zoo file (served through Git LFS). The sha256 is the one the zoo publishes for this file.
YUNET_2023MAR = ModelFile(
    name="face_detection_yunet_2023mar.onnx",
    url="https://media.githubusercontent.com/media/opencv/opencv_zoo/main/models/face_detection_yunet/"
    "face_detection_yunet_2023mar.onnx",
    sha256="8f2383e4dd3cfbb4553ea8718107fc0423210dc964f9f4280604804ed2552fa4",
    licence="MIT",
)

# Downloadable models by key. Tests (and mirrors) may point an entry elsewhere by replacing it in this dict.
DOWNLOADS: dict[str, ModelFile] = {"yunet": YUNET_2023MAR}


class ModelFileError(RuntimeError):
    """A model file is missing, corrupt, the wrong model, or could not be downloaded; the message names the fix."""


class ModelNotFoundError(ModelFileError, FileNotFoundError):
    """A model named by a prompt is not a file inside the model folders (missing, unreadable or outside them alike)."""


class ModelFolderError(ModelFileError):
    """A model folder cannot be created or written (read-only mount, no permission): another folder may do."""


STALE_PART_S = 3600.0  # a .part older than this is an interrupted download (a live one writes every second)


def _remove_stale_parts(folder: Path, name: str) -> None:
    """Delete `.<name>.<pid>.part` files an interrupted download left (killed process, restart); not recent ones,
    which may be another process's download in progress."""
    now = time.time()
    for old in folder.glob(f".{name}.*.part"):
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > STALE_PART_S:
                old.unlink()


def download(entry: ModelFile, folder: Path, timeout: float = 30.0, cancel: Callable[[], None] | None = None) -> Path:
    """Fetch `entry` into `folder` (created if needed), verify its sha256, rename it into place atomically.

    Returns the final path. Raises ModelFolderError (folder not writable), ModelFileError (offline, HTTP error,
    incomplete download, checksum mismatch) and leaves no file behind, also when interrupted. cancel(): called
    between chunks; whatever it raises (ComfyUI's interrupt) stops the download, which is then removed.
    """
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
        with out, urllib.request.urlopen(entry.url, timeout=timeout) as resp:  # noqa: S310
            length = resp.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                if cancel is not None:
                    cancel()
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
    except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as exc:
        _discard(part)
        raise ModelFileError(
            f"could not download {entry.name} from {entry.url} ({exc}). If this machine is offline, download the "
            f"file elsewhere and put it at {target}."
        ) from exc
    except BaseException:  # cancel, Ctrl-C: nothing half-written stays
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
