"""Face model files: where they live, the pinned download table, and a verified atomic downloader.

A download is written to `<name>.part` beside the target, checked against its pinned sha256, then renamed into
place, so a failed or interrupted download never leaves a file that looks like a model.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.error
import urllib.request
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


def download(entry: ModelFile, folder: Path, timeout: float = 30.0) -> Path:
    """Fetch `entry` into `folder` (created if needed), verify its sha256, rename it into place atomically.

    Returns the final path. Raises ModelFileError (offline, HTTP error, checksum mismatch) and leaves no file behind.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / entry.name
    part = folder / f".{entry.name}.{os.getpid()}.part"
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(entry.url, timeout=timeout) as resp, open(part, "wb") as out:  # noqa: S310
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        part.unlink(missing_ok=True)
        raise ModelFileError(
            f"could not download {entry.name} from {entry.url} ({exc}). If this machine is offline, download the "
            f"file elsewhere and put it at {target}."
        ) from exc
    if digest.hexdigest() != entry.sha256.lower():
        part.unlink(missing_ok=True)
        raise ModelFileError(
            f"downloaded {entry.name} from {entry.url} but its sha256 is {digest.hexdigest()}, expected "
            f"{entry.sha256}: the server sent a different file. Nothing was saved; put the official file at {target}."
        )
    os.replace(part, target)
    log.info("downloaded %s to %s", entry.name, target)
    return target


def ensure_model(key: str, folders: list[Path], allow_download: bool = True) -> Path:
    """Path of the model `key` of DOWNLOADS: the first folder holding it, else download it into folders[0]."""
    entry = DOWNLOADS[key]
    for folder in folders:
        candidate = Path(folder) / entry.name
        if candidate.is_file():
            return candidate
    if not folders:
        raise ModelFileError(f"no model folder known for {entry.name}: run inside ComfyUI or set TOKENFUSE_MODELS.")
    if not allow_download:
        raise ModelFileError(f"{entry.name} not found in {[str(f) for f in folders]}: put it there ({entry.url}).")
    return download(entry, Path(folders[0]))


def find_onnx(folders: list[Path], name: str) -> Path | None:
    """A file `name` (or `name`.onnx) in the first folder that has it."""
    for folder in folders:
        for cand in (Path(folder) / name, Path(folder) / f"{name}.onnx"):
            if cand.is_file():
                return cand
    return None
