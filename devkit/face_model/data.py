"""Face data for the small face model: detect + align real photos with the pack's own faces/ core, split held-out.

Every photo goes through the default RetinaFace detector and the FFHQ five-point similarity alignment
(faces/align.py), exactly what FaceDetect feeds ScheduledFusion at crop_factor 1.0, so the model learns the crops
it will be asked to refine. The held-out split is a fixed hash of the file name (not random state), so it is the
same on every machine and training can never see it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ...faces.align import align_affine, warp_face
from ...faces.detect import Detector, RetinaFaceDetector, detect_frame

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
# Faces CI tests use as held-out references: never train on them (matched by file name, case-insensitive).
NEVER_TRAIN = ("t1.jpg", "astronaut.png", "astronaut.jpg")


@dataclass(frozen=True)
class AlignedFace:
    """name: source file name; crop: [S, S, 3] uint8 RGB aligned to the FFHQ template; eye_px: eye distance in the
    source photo (a small one means an upsampled, blurry crop)."""

    name: str
    crop: np.ndarray
    eye_px: float


def is_held_out(name: str, percent: int = 5) -> bool:
    """Deterministic split: the first byte of sha1(file name) below percent% of 256 goes to held-out.

    Names from NEVER_TRAIN are always held out.
    """
    if name.lower() in NEVER_TRAIN:
        return True
    return hashlib.sha1(name.encode("utf-8")).digest()[0] < round(256 * percent / 100)


def difference_hash(rgb: np.ndarray) -> np.ndarray:
    """[256] bool: signs of horizontal neighbour differences on a 17 x 16 grey thumbnail. Brightness, contrast and
    size changes keep it; another photo differs in ~128 of 256 bits."""
    grey = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY)
    small = cv2.resize(grey, (17, 16), interpolation=cv2.INTER_AREA).astype(np.int16)
    return (small[:, 1:] > small[:, :-1]).reshape(-1)


def near_copies(held: dict[str, np.ndarray], train: dict[str, np.ndarray], max_bits: int = 20) -> dict[str, str]:
    """Held-out photo name -> the training photo it nearly copies (difference hashes <= max_bits of 256 apart).

    The split is by file name, and the data set holds brightness-changed copies of some photos under other names
    (`augmented_image_*`) and consecutive frames of one person: 15 of the 108 held-out photos have such a copy in
    training, so they are not faces the model never saw. held / train: name -> difference_hash."""
    if not train or not held:
        return {}
    names = list(train)
    table = np.stack([train[n] for n in names])
    out: dict[str, str] = {}
    for name, sig in held.items():
        bits = (table != sig).sum(axis=1)
        best = int(bits.argmin())
        if bits[best] <= max_bits:
            out[name] = names[best]
    return out


def list_images(folders: Iterable[Path]) -> list[Path]:
    """Image files of the folders (non-recursive), sorted by name for a reproducible order."""
    out: list[Path] = []
    for folder in folders:
        out.extend(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    return sorted(out, key=lambda p: (p.name, str(p)))


def read_rgb(path: Path) -> np.ndarray | None:
    """[H, W, 3] uint8 RGB, or None when the file is not a readable image."""
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    return None if bgr is None else np.ascontiguousarray(bgr[..., ::-1])


def main_face(
    rgb: np.ndarray, detector: Detector, size: int, min_score: float = 0.8, min_eye_px: float = 12.0
) -> tuple[np.ndarray, float] | None:
    """The largest confident face of rgb [H, W, 3] uint8 aligned to a size x size FFHQ crop, and its eye distance."""
    dets = [d for d in detect_frame(detector, rgb, min_score, 640) if d.score >= min_score]
    if not dets:
        return None
    d = max(dets, key=lambda d: float((d.bbox[2] - d.bbox[0]) * (d.bbox[3] - d.bbox[1])))
    eye_px = float(np.linalg.norm(d.landmarks[1] - d.landmarks[0]))
    if eye_px < min_eye_px:
        return None
    affine, _ = align_affine(d.landmarks, size)
    crop = warp_face(rgb, affine, size)
    return np.clip(crop, 0, 255).astype(np.uint8), eye_px


def align_folder(
    paths: list[Path], size: int, on_image: Callable[[int, int], None] | None = None
) -> tuple[list[AlignedFace], list[str]]:
    """(aligned faces, names of photos without a usable face) for the paths, in order."""
    detector = RetinaFaceDetector("cpu")
    faces, skipped = [], []
    for i, path in enumerate(paths):
        rgb = read_rgb(path)
        got = main_face(rgb, detector, size) if rgb is not None else None
        if got is None:
            skipped.append(path.name)
        else:
            faces.append(AlignedFace(path.name, got[0], got[1]))
        if on_image is not None:
            on_image(i + 1, len(paths))
    return faces, skipped
