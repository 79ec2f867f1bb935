"""5-point similarity alignment to the FFHQ-512 template (the template GFPGAN / CodeFormer expect)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

Interpolation = Literal["nearest", "linear", "cubic", "area"]
Border = Literal["reflect", "replicate", "constant"]
_INTERPOLATION: dict[str, int] = {
    "nearest": cv2.INTER_NEAREST,
    "linear": cv2.INTER_LINEAR,
    "cubic": cv2.INTER_CUBIC,
    "area": cv2.INTER_AREA,
}
# reflect = OpenCV's BORDER_REFLECT_101 (the edge pixel is not repeated: gfedcb|abcdefgh|gfedcba).
_BORDER: dict[str, int] = {
    "reflect": cv2.BORDER_REFLECT101,
    "replicate": cv2.BORDER_REPLICATE,
    "constant": cv2.BORDER_CONSTANT,
}

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


@dataclass(frozen=True)
class WarpStyle:
    """How warp_to_crop fills the crop: the filter, what lies outside the frame, and whether to clip.

    No defaults for the filter and border, so each caller's choice is visible where it builds one: FFHQ crops for
    detection/restorer data use cubic + reflect, the sampler's context crops linear + reflect (the VAE sees plausible
    content off the frame), GFPGAN's input linear + constant grey (its own alignment's padding).
    border_value: the fill for border="constant" (one value per channel). clip: clip to [0, 1] (float images in
    [0, 1]: cubic overshoot and border values stay in range).
    """

    interpolation: Interpolation
    border: Border
    border_value: float | tuple[float, ...] = 0.0
    clip: bool = False

    def __post_init__(self) -> None:
        if self.interpolation not in _INTERPOLATION:
            raise ValueError(
                f"warp_to_crop: interpolation must be one of {sorted(_INTERPOLATION)}, got {self.interpolation!r}"
            )
        if self.border not in _BORDER:
            raise ValueError(f"warp_to_crop: border must be one of {sorted(_BORDER)}, got {self.border!r}")


def warp_to_crop(image: np.ndarray, affine: np.ndarray, size: int, style: WarpStyle) -> np.ndarray:
    """Warp the square crop [size, size, C] out of image [H, W, C] through `affine` ([2, 3] image -> crop pixels).

    The one implementation of "cut the aligned crop out of the frame", in the caller's WarpStyle. dtype is kept
    (uint8 or float).
    """
    crop: np.ndarray = cv2.warpAffine(
        np.ascontiguousarray(image),
        np.asarray(affine, dtype=np.float64),
        (int(size), int(size)),
        flags=_INTERPOLATION[style.interpolation],
        borderMode=_BORDER[style.border],
        borderValue=style.border_value,
    )
    return np.clip(crop, 0.0, 1.0) if style.clip else crop


def warp_face(image: np.ndarray, affine: np.ndarray, crop_size: int) -> np.ndarray:
    """The aligned crop [crop_size, crop_size, C] of image [H, W, C] (float32 or uint8): cubic, borders reflected."""
    return warp_to_crop(image, affine, crop_size, WarpStyle("cubic", "reflect"))


def transform_points(points: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Apply a [2, 3] affine to points [N, 2]."""
    out: np.ndarray = np.asarray(points, np.float64) @ affine[:, :2].T + affine[:, 2]
    return out
