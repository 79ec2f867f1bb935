"""Crop, mask and batch geometry for ScheduledFusion (pure numpy/opencv/torch; never imports ComfyUI).

A face is refined in its aligned crop at guide size: `face.affine` maps the frame to a crop_size crop, so the same
map scaled by guide/crop_size gives the guide-size crop, and the result is resized back to crop_size for Blend
(which pastes with `face.inverse`). Only the masked face region is re-noised (the noise mask), so the crop's border
stays as it was and the paste seam is invisible.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch

from ..faces.align import WarpStyle, warp_to_crop
from ..faces.importance import feature_discs
from ..faces.types import Face
from ..scheduling.plan import TokenPlan
from ..scheduling.vocabulary import LEVELS


def context_side(guide_size: int, crop_factor: float = 1.0, max_size: int = 4096) -> int:
    """Side of the sampled context crop: guide_size x crop_factor (>= 1) rounded up to a multiple of 8, capped at
    max_size, at least 64."""
    side = int(math.ceil(guide_size * max(1.0, float(crop_factor)) / 8.0) * 8)
    return max(64, min(side, int(max_size) // 8 * 8))


def context_transform(
    crop_size: int, guide_size: int, crop_factor: float = 1.0, max_size: int = 4096
) -> tuple[np.ndarray, int]:
    """Map from the face's aligned crop (crop_size px) to the sampled context crop, and that crop's side.

    The aligned crop lands centred at guide_size px; crop_factor > 1 adds context around it. The side is
    guide_size * crop_factor rounded up to a multiple of 8 (the latent factor), capped at max_size (then the face is
    sampled below guide size). Returns ([2, 3] float64, side).
    """
    cf = max(1.0, float(crop_factor))
    side = context_side(guide_size, crop_factor, max_size)
    k = side / (crop_size * cf)
    t = side / 2.0 - k * crop_size / 2.0
    return np.array([[k, 0.0, t], [0.0, k, t]], dtype=np.float64), side


def context_affine(
    face: Face, guide_size: int, crop_factor: float = 1.0, max_size: int = 4096
) -> tuple[np.ndarray, int]:
    """[2, 3] float64 map from frame pixels to the context crop, and its side."""
    m_c, side = context_transform(face.crop_size, guide_size, crop_factor, max_size)
    full = np.vstack([m_c, [0.0, 0.0, 1.0]]) @ np.vstack([np.asarray(face.affine, np.float64), [0.0, 0.0, 1.0]])
    return full[:2], side


def aligned_crop(
    image: np.ndarray, face: Face, guide_size: int, crop_factor: float = 1.0, max_size: int = 4096
) -> np.ndarray:
    """image: [H, W, 3] float32 in [0, 1] -> [S, S, 3] float32 context crop (S from context_transform).

    Borders outside the frame are reflected so the VAE sees plausible content (they are never pasted back).
    """
    a, side = context_affine(face, guide_size, crop_factor, max_size)
    return warp_to_crop(np.asarray(image, dtype=np.float32), a, side, WarpStyle("linear", "reflect", clip=True))


def resize_square(img: np.ndarray, size: int) -> np.ndarray:
    """Resize [S, S(, C)] to [size, size(, C)]: area filter when shrinking, cubic when growing."""
    if img.shape[0] == size and img.shape[1] == size:
        return img.astype(np.float32, copy=True)
    interp = cv2.INTER_AREA if size < img.shape[0] else cv2.INTER_CUBIC
    out = cv2.resize(np.ascontiguousarray(img, dtype=np.float32), (size, size), interpolation=interp)
    return np.clip(out, 0.0, 1.0)


def noise_mask_context(face: Face, m_c: np.ndarray, side: int, feather: float = 0.04, grow: float = 0.02) -> np.ndarray:
    """[side, side] float32 in [0, 1]: where the sampler may change the context crop.

    The face mask is warped from crop space by m_c. grow: dilation, feather: Gaussian sigma, both as fractions of
    the face's size in the context crop (cover the hairline/jaw the landmark mask misses; soft edge, no seam).
    """
    m = cv2.warpAffine(
        np.ascontiguousarray(face.mask, dtype=np.float32), m_c, (side, side), flags=cv2.INTER_LINEAR, borderValue=0.0
    )
    face_px = float(m_c[0, 0]) * face.crop_size
    if grow > 0:
        k = int(round(grow * face_px)) * 2 + 1
        if k > 1:
            m = cv2.dilate(m, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (k, k)))
    if feather > 0:
        m = cv2.GaussianBlur(m, (0, 0), sigmaX=max(0.5, feather * face_px))
    return np.clip(m, 0.0, 1.0).astype(np.float32)


def face_seed(seed: int, face_number: int) -> int:
    """Deterministic per-face seed: seed + the face's number in frame-major order (stable across reruns)."""
    return (int(seed) + int(face_number)) % (2**64)


CROP_FACE_WEIGHT = 0.4  # the face outside the eyes and mouth: reducible (below TokenPlan's default threshold 0.5)


def make_batches(items: list[int], per_batch: int) -> list[list[int]]:
    """Split face numbers into consecutive batches of at most per_batch (>= 1)."""
    per_batch = max(1, int(per_batch))
    return [items[i : i + per_batch] for i in range(0, len(items), per_batch)]


def top_tokens(guide_size: int) -> int:
    """Top-level U-Net tokens for one guide-size image (latent /8 grid)."""
    return (guide_size // 8) ** 2


# The share of the reducible tokens crop_plan's budgets count as kept (an estimate for the report).
BUDGET_BACKGROUND_KEEP = 0.5


def crop_plan(
    masks: np.ndarray,
    floor: float = 0.1,
    protect_threshold: float = 0.5,
    landmarks: np.ndarray | None = None,
) -> TokenPlan:
    """A TokenPlan in crop space from the noise masks of a batch.

    masks: [B, S, S] float in [0, 1]; landmarks: [B, 5, 2] in crop pixels, or None.
    With landmarks (ScheduledFusion): the eyes and mouth are protected (importance 1), the rest of the face gets
    CROP_FACE_WEIGHT (below the default protect threshold: reducible; a threshold at or under it, PatchTokenize's
    protect_threshold <= 0.4, protects the whole face, as a lower threshold asks) and the background `floor`.
    Without: importance = max(mask, floor), the whole face protected. Why features only: on an aligned crop the face
    is ~70 % of the tokens, so protecting all of it left the schedule almost nothing to reduce (crop + schedule 1.03x
    crop alone on CPU), while the trained face model's quality gate passes with no protection at all
    (docs/quality.md).
    budgets estimate kept tokens per level: protected tokens plus BUDGET_BACKGROUND_KEEP of the others (the scheduler
    decides the real reduction; budgets are for the report).
    """
    m = torch.from_numpy(np.ascontiguousarray(masks, dtype=np.float32))
    if m.ndim != 3:
        raise ValueError(f"crop_plan needs masks [B, S, S], got {tuple(m.shape)}")
    if landmarks is None:
        importance = torch.clamp(m, min=floor, max=1.0)
    else:
        lm = np.asarray(landmarks, np.float64)
        if lm.shape != (m.shape[0], 5, 2):
            raise ValueError(f"crop_plan needs landmarks [B, 5, 2] matching the masks, got {lm.shape}")
        feats = np.stack([feature_discs(m.shape[1], m.shape[2], p) for p in lm])
        importance = torch.maximum(
            torch.clamp(m * CROP_FACE_WEIGHT, min=floor), torch.from_numpy(np.ascontiguousarray(feats, np.float32))
        )
    size = int(m.shape[-1])
    budgets, uniform = [], []
    for b in range(m.shape[0]):
        kept: dict[int, int] = {}
        full: dict[int, int] = {}
        for f in LEVELS:
            g = max(1, math.ceil(size / f))
            pooled = torch.nn.functional.adaptive_max_pool2d(importance[b][None, None], (g, g)).flatten()
            prot = int((pooled >= protect_threshold).sum())
            full[f] = g * g
            kept[f] = prot + int(round((g * g - prot) * BUDGET_BACKGROUND_KEEP))
        budgets.append(kept)
        uniform.append(full)
    return TokenPlan(
        importance=importance,
        image_size=(size, size),
        budgets=tuple(budgets),
        uniform_tokens=tuple(uniform),
        protect_threshold=protect_threshold,
    )
