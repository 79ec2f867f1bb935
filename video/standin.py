"""A stand-in for the diffusion sampler: `run --engine core --sampler standin` (runner/core/refine.py), the video
tests and benches.

It has the properties that matter to the video and scale-out paths: it changes a face depending on the crop's
content (detail boost, tint) and adds a noise pattern fixed by the seed (same seed = same noise, like a sampler
with a fixed seed), and each crop's result depends only on that crop and its seed, never on its batch. It is not
a face model: quality is measured on the trained one (face_model/).
"""

from __future__ import annotations

import cv2
import numpy as np


def standin_refine(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
    """crops [N, S, S, 3] float32 0..1, one seed per crop -> refined crops, same shape (video.fuse_pass.Refine)."""
    out = np.empty_like(crops)
    for i, (c, s) in enumerate(zip(crops, seeds, strict=True)):
        noise = np.random.default_rng(s).standard_normal(c.shape).astype(np.float32)
        blur = cv2.GaussianBlur(c, (0, 0), 3)
        out[i] = np.clip(c + 0.6 * (c - blur) + 0.03 * noise + np.array([0.04, 0.0, -0.03], np.float32), 0, 1)
    return out
