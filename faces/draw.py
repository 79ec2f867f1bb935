"""Preview drawings: boxes, landmarks, scores."""

from __future__ import annotations

import cv2
import numpy as np

from .types import Face

_LANDMARK_COLOURS = ((255, 64, 64), (255, 220, 0), (255, 0, 255), (0, 220, 0), (64, 128, 255))


def draw_faces(rgb: np.ndarray, faces: tuple[Face, ...], label: str = "") -> np.ndarray:
    """rgb: [H, W, 3] uint8 -> a copy with each face's box, index, score and 5 landmarks.

    label: drawn at the top left (FaceDetect writes the detector that ran, e.g. "detector: mtcnn" under auto).
    """
    out: np.ndarray = rgb.copy()
    h, w = out.shape[:2]
    t = max(1, round(max(h, w) / 400))
    if label:
        org = (4 * t, 14 * t)
        cv2.putText(out, label, org, cv2.FONT_HERSHEY_SIMPLEX, 0.45 * t, (0, 0, 0), 3 * t, cv2.LINE_AA)
        cv2.putText(out, label, org, cv2.FONT_HERSHEY_SIMPLEX, 0.45 * t, (0, 255, 0), t, cv2.LINE_AA)
    for i, f in enumerate(faces):
        x1, y1, x2, y2 = (int(round(v)) for v in f.bbox)
        cv2.rectangle(out, (x1, y1), (x2, y2), (0, 255, 0), t, cv2.LINE_AA)
        cv2.putText(
            out,
            f"{i}:{f.score:.2f}",
            (x1, max(y1 - 3 * t, 10)),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.4 * t,
            (0, 255, 0),
            t,
            cv2.LINE_AA,
        )
        r = max(2, round(f.width / 40))
        for (x, y), c in zip(f.landmarks, _LANDMARK_COLOURS, strict=True):
            cv2.circle(out, (int(round(x)), int(round(y))), r, c, -1, cv2.LINE_AA)
    return out


def face_mask_image(h: int, w: int, faces: tuple[Face, ...]) -> np.ndarray:
    """Union (max) of the faces' crop masks warped back to the frame: [H, W] float32 in [0, 1]."""
    out = np.zeros((h, w), np.float32)
    for f in faces:
        m = cv2.warpAffine(
            f.mask.astype(np.float32),
            f.inverse,
            (w, h),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=0,
        )
        np.maximum(out, m, out=out)
    return np.clip(out, 0.0, 1.0)
