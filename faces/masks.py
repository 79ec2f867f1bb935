"""Soft face masks in aligned-crop space, from the face's own landmarks."""

from __future__ import annotations

import cv2
import numpy as np


def face_ellipse(landmarks_crop: np.ndarray) -> tuple[tuple[float, float], tuple[float, float], float]:
    """(center, semi-axes, angle in degrees) of an ellipse covering brows to chin, from 5 crop-space landmarks.

    Proportions come from the FFHQ template: the eye-mouth distance d spans ~0.39 of the face height.
    """
    lm = np.asarray(landmarks_crop, np.float64)
    eyes = lm[:2].mean(0)
    mouth = lm[3:].mean(0)
    axis = mouth - eyes
    d = max(float(np.hypot(*axis)), 1.0)
    center = eyes + axis * 0.45
    angle = float(np.degrees(np.arctan2(axis[1], axis[0]))) - 90.0
    return (float(center[0]), float(center[1])), (1.2 * d, 1.45 * d), angle


def crop_mask(landmarks_crop: np.ndarray, crop_size: int, feather: float = 0.08) -> np.ndarray:
    """Feathered face mask [crop_size, crop_size] float32 in [0, 1]; exactly 0 near the crop border.

    The hard ellipse is eroded by the feather width before blurring, so the soft edge stays inside the ellipse
    and the crop's border (where the warp reflected pixels) never shows after paste-back. The mask is smooth, so
    it is drawn at <= 128 px and resized (a 512 px blur costs ~10x more for the same result).
    """
    work = min(crop_size, 128)
    k_scale = work / crop_size
    (cx, cy), (ax, ay), ang = face_ellipse(np.asarray(landmarks_crop, np.float64) * k_scale)
    f = max(1.0, feather * work)
    mask: np.ndarray = np.zeros((work, work), np.float32)
    axes = (max(1, int(round(ax - f))), max(1, int(round(ay - f))))
    cv2.ellipse(mask, (int(round(cx)), int(round(cy))), axes, ang, 0, 360, 1.0, -1, cv2.LINE_AA)
    border = int(np.ceil(f)) + 2
    mask[:border], mask[-border:], mask[:, :border], mask[:, -border:] = 0, 0, 0, 0
    k = int(2 * round(f) + 1)
    mask = cv2.GaussianBlur(mask, (k, k), f / 2.5)
    mask[:2], mask[-2:], mask[:, :2], mask[:, -2:] = 0, 0, 0, 0
    if work != crop_size:
        mask = cv2.resize(mask, (crop_size, crop_size), interpolation=cv2.INTER_LINEAR)
    return np.clip(mask, 0.0, 1.0)
