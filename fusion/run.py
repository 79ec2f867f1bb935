"""ScheduledFusion's photo path: every face of every frame through the crop-batch loop (fusion/refine.py).

Faces are numbered frame-major; each frame's faces are batched together (faces_per_batch) and their context crops are
cut from the frame itself, so a smaller-guide fallback re-cuts at the new size. The backend types are re-exported
here for the callers that always imported them from this module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..faces.types import Face, FaceSet
from .backend import CropHooks, FusionBackend, MemoryEstimateError, unsampled
from .crops import face_seed, make_batches
from .fallback import FaceReport
from .refine import CropJob, FusionSettings, passed_through, refine_crops, refine_jobs

__all__ = [
    "CropHooks",
    "FusionBackend",
    "FusionResult",
    "FusionSettings",
    "MemoryEstimateError",
    "refine_crops",
    "run_fusion",
    "unsampled",
]


@dataclass
class FusionResult:
    faces: FaceSet
    crops: list[np.ndarray]  # one [crop_size, crop_size, 3] per face, frame-major (input crop when passed through)
    reports: list[FaceReport]


def run_fusion(images: np.ndarray, faces: FaceSet, settings: FusionSettings, backend: FusionBackend) -> FusionResult:
    """Refine every face of every frame.

    images: [B, H, W, 3] float32 in [0, 1] (checked against faces.image_size and batch size).
    Returns the FaceSet with processed crops attached (Face.with_crop), the crops in frame-major order, and one
    FaceReport per face. Faces that fail after all fallbacks keep crop unchanged (None) and report "passthrough".
    Face k (frame-major) is sampled with seed + k; with faces.independent_frames, face k of its frame (the service's
    batches of unrelated photos: each gets the seeds it would get alone).
    """
    b, h, w = int(images.shape[0]), int(images.shape[1]), int(images.shape[2])
    faces.check_image(h, w, b)
    reports: dict[int, FaceReport] = {}
    jobs_per_frame: list[list[CropJob]] = []
    for fi, frame_faces in enumerate(faces.faces):
        image = np.asarray(images[fi], dtype=np.float32)
        frame_jobs = []
        for k, face in enumerate(frame_faces):
            number = len(reports)
            seed = face_seed(settings.seed, k if faces.independent_frames else number)
            reports[number] = FaceReport(frame=fi, index=k, seed=seed)
            frame_jobs.append(CropJob(image, face, seed, number))
        jobs_per_frame.append(frame_jobs)
    batches = [
        [frame_jobs[i] for i in batch]
        for frame_jobs in jobs_per_frame
        for batch in make_batches(list(range(len(frame_jobs))), settings.faces_per_batch)
    ]
    outputs = refine_jobs(batches, settings, backend, reports)
    new_frames: list[tuple[Face, ...]] = []
    crops: list[np.ndarray] = []
    for frame_jobs in jobs_per_frame:
        row = []
        for j in frame_jobs:
            if j.number in outputs:
                row.append(j.face.with_crop(outputs[j.number]))
                crops.append(outputs[j.number])
            else:
                rep = reports[j.number]
                row.append(j.face)
                crops.append(passed_through(j, rep, f"frame {rep.frame} face {rep.index}"))
        new_frames.append(tuple(row))
    out_set = replace(faces, faces=tuple(new_frames))  # keeps independent_frames for the nodes downstream
    return FusionResult(out_set, crops, [reports[n] for n in sorted(reports)])
