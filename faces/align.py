"""5-point similarity alignment to the FFHQ-512 template (the template GFPGAN / CodeFormer expect)."""

from __future__ import annotations

import cv2
import numpy as np

# GFPGAN/CodeFormer 5-point template for 512 x 512 crops (eyes, nose, mouth corners as seen in the image).
FFHQ_512 = np.array(
    [
        [192.98138, 239.94708],
        [318.90277, 240.1936],
        [256.63416, 314.01935],
        [201.26117, 371.41043],
        [313.08905, 371.15118],
    ],
    dtype=np.float64,
)


def template(crop_size: int = 512, crop_factor: float = 1.0) -> np.ndarray:
    """FFHQ template for a crop_size crop; crop_factor > 1 zooms out (more context around the face). [5, 2]."""
    pts = (FFHQ_512 - 256.0) / crop_factor + 256.0
    return pts * (crop_size / 512.0)


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Least-squares similarity (rotation, uniform scale, translation) mapping src -> dst (Umeyama). [2, 3] float64.

    Deterministic for 5 points, unlike RANSAC/LMEDS estimators that sample subsets.
    """
    src = np.asarray(src, np.float64)
    dst = np.asarray(dst, np.float64)
    mu_s, mu_d = src.mean(0), dst.mean(0)
    s, d = src - mu_s, dst - mu_d
    cov = d.T @ s / len(src)
    u, sig, vt = np.linalg.svd(cov)
    fix = np.eye(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        fix[1, 1] = -1
    rot = u @ fix @ vt
    var = (s**2).sum() / len(src)
    scale = (sig * np.diag(fix)).sum() / max(var, 1e-12)
    m = np.zeros((2, 3))
    m[:, :2] = scale * rot
    m[:, 2] = mu_d - m[:, :2] @ mu_s
    return m


def align_affine(
    landmarks: np.ndarray, crop_size: int = 512, crop_factor: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(affine image->crop, inverse crop->image), both [2, 3] float64."""
    m = similarity_transform(landmarks, template(crop_size, crop_factor))
    return m, cv2.invertAffineTransform(m)


def warp_face(image: np.ndarray, affine: np.ndarray, crop_size: int) -> np.ndarray:
    """The aligned crop [crop_size, crop_size, C] of image [H, W, C] (float32 or uint8), borders reflected."""
    size = (crop_size, crop_size)
    return cv2.warpAffine(image, affine, size, flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT101)


def transform_points(points: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Apply a [2, 3] affine to points [N, 2]."""
    out: np.ndarray = np.asarray(points, np.float64) @ affine[:, :2].T + affine[:, 2]
    return out
