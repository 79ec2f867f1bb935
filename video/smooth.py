"""Zero-phase smoothing of a track's alignment transform.

Raw 5-point landmarks jitter by a pixel or two from frame to frame, and an aligned crop that follows them shakes
(the shake survives diffusion and paste-back as flicker). The whole track is known after pass 1, so a symmetric
(non-causal) Gaussian filter smooths it with no lag. The similarity transform is smoothed in parameters that
interpolate sanely: crop centre in the image, log scale, unwrapped angle. A track never spans a scene cut, so no
smoothing crosses one.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..faces.align import similarity_transform, template
from .tracks import Track

ALIGN_SIZE = 512  # tracks keep transforms to a 512 crop; other crop sizes scale them (see scale_affine)


def raw_affines(landmarks: np.ndarray, crop_size: int = ALIGN_SIZE, crop_factor: float = 1.0) -> np.ndarray:
    """landmarks [T, 5, 2] -> per-frame image -> crop similarity transforms [T, 2, 3] float64 (no smoothing)."""
    dst = template(crop_size, crop_factor)
    return np.stack([similarity_transform(lm, dst) for lm in landmarks]) if len(landmarks) else np.zeros((0, 2, 3))


def invert(affines: np.ndarray) -> np.ndarray:
    """Invert [T, 2, 3] affines (crop <-> image)."""
    a = affines[:, :, :2]
    inv_a = np.linalg.inv(a)
    return np.concatenate([inv_a, -(inv_a @ affines[:, :, 2:])], axis=2)


def to_params(affines: np.ndarray, crop_size: int = ALIGN_SIZE) -> np.ndarray:
    """image -> crop similarities [T, 2, 3] -> [T, 4]: crop centre x, y in the image, log scale, angle (unwrapped)."""
    inv = invert(affines)
    centre = inv[:, :, :2] @ np.array([crop_size / 2, crop_size / 2]) + inv[:, :, 2]
    a, b = inv[:, 0, 0], inv[:, 1, 0]
    return np.stack([centre[:, 0], centre[:, 1], np.log(np.hypot(a, b)), np.unwrap(np.arctan2(b, a))], 1)


def from_params(params: np.ndarray, crop_size: int = ALIGN_SIZE) -> np.ndarray:
    """Inverse of to_params: [T, 4] -> image -> crop similarities [T, 2, 3]."""
    cx, cy, logs, th = params.T
    s = np.exp(logs)
    inv = np.zeros((len(params), 2, 3))
    inv[:, 0, 0], inv[:, 0, 1] = s * np.cos(th), -s * np.sin(th)
    inv[:, 1, 0], inv[:, 1, 1] = s * np.sin(th), s * np.cos(th)
    half = np.array([crop_size / 2, crop_size / 2])
    inv[:, :, 2] = np.stack([cx, cy], 1) - inv[:, :, :2] @ half
    return invert(inv)


def zero_phase(x: np.ndarray, sigma: float) -> np.ndarray:
    """Symmetric Gaussian filter along axis 0 of x [T, ...] (zero phase: no lag). Ends are extended by odd
    reflection, which keeps a linear motion linear instead of bending it towards a standstill."""
    if sigma <= 0 or len(x) < 3:
        return np.array(x, copy=True)
    r = int(np.ceil(3 * sigma))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k /= k.sum()
    pad = [(r, r)] + [(0, 0)] * (x.ndim - 1)
    xp = np.pad(x, pad, mode="reflect", reflect_type="odd") if len(x) > r else np.pad(x, pad, mode="edge")
    out = np.zeros_like(x, dtype=np.float64)
    for i, w in enumerate(k):
        out += w * xp[i : i + len(x)]
    return out


def smooth_track(track: Track, sigma_frames: float, crop_factor: float = 1.0) -> Track:
    """The track with `affines` set: raw alignment per frame smoothed by a zero-phase Gaussian of sigma_frames."""
    raw = raw_affines(track.landmarks, ALIGN_SIZE, crop_factor)
    params = zero_phase(to_params(raw), sigma_frames)
    return replace(track, affines=from_params(params))


def scale_affine(affine: np.ndarray, crop_size: int) -> np.ndarray:
    """An image -> 512 crop transform [.., 2, 3] for a crop_size crop (similarity: scale every row)."""
    return affine * (crop_size / ALIGN_SIZE)


def crop_centres(affines: np.ndarray) -> np.ndarray:
    """[T, 2, 3] -> [T, 2] crop centres in image pixels."""
    return to_params(affines)[:, :2]


def jitter(affines: np.ndarray) -> float:
    """Mean magnitude of the second difference of the crop centre, px per frame^2 (0 = perfectly steady)."""
    c = crop_centres(affines)
    if len(c) < 3:
        return 0.0
    return float(np.linalg.norm(np.diff(c, 2, axis=0), axis=1).mean())
