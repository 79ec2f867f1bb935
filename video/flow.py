"""Carry a key frame's refined change to the frames around it with optical flow (OpenCV DIS: no weights).

The change is `refined - original` in the aligned crop. Between two key frames k0 < t < k1 of a track the
crops are aligned already (smoothed similarity), so the remaining motion is small and non-rigid (mouth, eyes,
head turn): DIS flow from frame t's crop to each key frame's crop says where each pixel of t is in the key
frame, the key frame's change is sampled there, and the two are mixed by temporal distance; by default only the
coarse part of the frame is its own crop plus that change, its fine detail is the key frames' refined crops sampled
the same way (FlowOptions.detail: the change alone made key-frame mode flicker). A forward-backward
check marks pixels where the flow is not trustworthy (occlusions, blur, failed matches); when too little of the
face passes it, the frame is reported as failed and the driver diffuses it itself.

Flow is computed at `work_size` (128 px) on grey crops and scaled up: cheap, and faces carry little
high-frequency motion that a 512 flow would add.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np

Detail = Literal["refined", "change"]


@dataclass(frozen=True)
class FlowOptions:
    """work_size: crop side flow is computed at; min_valid: fraction of the face mask that must pass the
    forward-backward check for the propagation to be used (otherwise the frame is diffused itself).

    detail: what a propagated frame's fine detail is. "refined" (default): the key frames' refined crops, warped
    (above detail_sigma); only the coarse part is the key frames' change added to the frame's own crop. "change":
    the whole change added to the frame's own crop (the first version). Why: a model that redraws detail
    (smooths, sharpens, restores) makes a change that is minus the key crop's own detail plus its new detail;
    warped onto another frame it no longer cancels that frame's detail (sub-pixel flow error, noise, compression),
    so both frames' detail shows and moves against each other: measured on the trained face model, key-frame mode
    added more flicker than diffusing every frame (bench/video_flicker.py, docs/video.md).
    detail_sigma: the coarse/fine split, a Gaussian sigma as a fraction of the crop side."""

    work_size: int = 128
    min_valid: float = 0.6
    detail: Detail = "refined"
    detail_sigma: float = 0.08


_DIS: Any = None


def _dis() -> Any:
    """One DIS instance (medium preset) per process; creating it costs more than a 128 px flow."""
    global _DIS
    if _DIS is None:
        _DIS = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM)  # type: ignore[attr-defined]
    return _DIS


def grey(crop: np.ndarray, work_size: int) -> np.ndarray:
    """crop [S, S, 3] float32 0..1 or uint8 -> [w, w] uint8 grey at work_size."""
    img = crop if crop.dtype == np.uint8 else (np.clip(crop, 0, 1) * 255 + 0.5).astype(np.uint8)
    g = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    return cv2.resize(g, (work_size, work_size), interpolation=cv2.INTER_AREA) if g.shape[0] != work_size else g


def dis_flow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Flow [h, w, 2] float32 from grey a to grey b: a(x) ~ b(x + flow(x))."""
    return np.asarray(_dis().calc(a, b, None), np.float32)


@functools.lru_cache(maxsize=8)
def _grid(h: int, w: int) -> np.ndarray:
    """Pixel coordinates [h, w, 2] (x, y), cached per size (read-only)."""
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    grid = np.stack([xs, ys], -1)
    grid.flags.writeable = False
    return grid


def sample(img: np.ndarray, flow: np.ndarray) -> np.ndarray:
    """img [h, w, ...] sampled at x + flow(x) (bilinear, border replicated), flow [h, w, 2] in img pixels."""
    m = _grid(*flow.shape[:2]) + flow
    return cv2.remap(img, m[..., 0], m[..., 1], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def consistency(fwd: np.ndarray, bwd: np.ndarray) -> np.ndarray:
    """[h, w] bool: forward flow a->b and backward b->a agree (|f + b(x + f)|^2 < 0.01 (|f|^2 + |b|^2) + 0.5)."""
    b_at = sample(bwd, fwd)
    err = ((fwd + b_at) ** 2).sum(-1)
    mag = (fwd**2).sum(-1) + (b_at**2).sum(-1)
    ok: np.ndarray = err < 0.01 * mag + 0.5
    return ok


@dataclass(frozen=True, eq=False)
class KeyChange:
    """A refined key frame of a track: frame index, its original crop as grey at work size, the change
    refined - original [S, S, 3] float32, and (for FlowOptions.detail "refined") the original crop [S, S, 3]
    float32 0..1."""

    frame: int
    grey: np.ndarray
    change: np.ndarray
    crop: np.ndarray | None = None


def key_flow(target_grey: np.ndarray, key: KeyChange, max_residual: float = 24.0) -> tuple[np.ndarray, np.ndarray]:
    """Flow [S, S, 2] from the target crop to the key's crop at crop size, and a [S, S] float32 validity map
    (1 = trustworthy flow).

    A pixel is valid when forward and backward flow agree and the key frame, warped by the flow, matches the
    target there (grey difference < max_residual of 255): the second test catches occlusions by flat content,
    where both flows are zero and agree.
    """
    fwd = dis_flow(target_grey, key.grey)
    bwd = dis_flow(key.grey, target_grey)
    residual = np.abs(sample(key.grey.astype(np.float32), fwd) - target_grey.astype(np.float32))
    valid = (consistency(fwd, bwd) & (cv2.GaussianBlur(residual, (0, 0), 1.0) < max_residual)).astype(np.float32)
    s = key.change.shape[0]
    k = s / target_grey.shape[0]
    big = cv2.resize(fwd, (s, s), interpolation=cv2.INTER_LINEAR) * k
    valid_big = cv2.resize(valid, (s, s), interpolation=cv2.INTER_LINEAR)
    return big, valid_big


def warp_change(target_grey: np.ndarray, key: KeyChange, max_residual: float = 24.0) -> tuple[np.ndarray, np.ndarray]:
    """The key's change moved onto the target crop, and its [S, S] float32 validity map (see key_flow)."""
    big, valid = key_flow(target_grey, key, max_residual)
    return sample(key.change, big), valid


def propagate(
    target_grey: np.ndarray,
    frame: int,
    keys: list[KeyChange],
    face_mask: np.ndarray,
    opts: FlowOptions = FlowOptions(),
    target: np.ndarray | None = None,
) -> tuple[np.ndarray | None, float]:
    """The change for a frame between key frames, or None when the flow failed there.

    keys: the neighbouring key frames (one or two), each weighted by temporal closeness and by its per-pixel
    flow validity; where no key is valid at a pixel the temporal weights alone are used (a soft fallback for
    small occlusions). face_mask: [S, S] float32, where validity is counted. target: the frame's crop [S, S, 3]
    float32 0..1; with it (and opts.detail "refined", keys carrying their crops) the fine detail is the key
    frames' refined detail, warped (see FlowOptions). Returns (change [S, S, 3] float32, valid fraction of the
    face) or (None, fraction) when fewer than opts.min_valid of the face pixels are valid for every key.
    """
    if not keys:
        return None, 0.0
    span = max(abs(keys[-1].frame - keys[0].frame), 1)  # two keys: weights 1 - distance / gap; one key: 1
    flows, valids, weights = [], [], []
    for key in keys:
        f, v = key_flow(target_grey, key)
        flows.append(f)
        valids.append(v)
        weights.append(max(1e-3, 1.0 - abs(frame - key.frame) / span) if len(keys) > 1 else 1.0)
    mass = max(float(face_mask.sum()), 1e-6)
    fractions = [float((v * face_mask).sum() / mass) for v in valids]
    best = max(fractions)
    if best < opts.min_valid:
        return None, best
    change = _mix([sample(k.change, f) for k, f in zip(keys, flows, strict=True)], valids, weights)
    crops = [k.crop for k in keys if k.crop is not None]
    if opts.detail == "refined" and target is not None and len(crops) == len(keys):
        refined = [sample(c + k.change, f) for c, k, f in zip(crops, keys, flows, strict=True)]
        change = _refined_detail(target, change, refined, valids, weights, opts.detail_sigma)
    return change, best


def _mix(warped: list[np.ndarray], valids: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """Per pixel, the warped images [S, S, C] weighted by validity x temporal weight; where no key is valid, by
    the temporal weights alone."""
    num = np.zeros_like(warped[0])
    den = np.zeros(valids[0].shape, np.float32)
    soft_num = np.zeros_like(warped[0])
    for w, v, wt in zip(warped, valids, weights, strict=True):
        num += w * (v * wt)[..., None]
        den += v * wt
        soft_num += w * wt
    soft = soft_num / float(sum(weights))
    out: np.ndarray = np.where(den[..., None] > 1e-4, num / np.maximum(den, 1e-4)[..., None], soft)
    return out.astype(np.float32)


def _refined_detail(
    target: np.ndarray,
    change: np.ndarray,
    refined: list[np.ndarray],
    valids: list[np.ndarray],
    weights: list[float],
    sigma: float,
) -> np.ndarray:
    """The change that makes the target crop [S, S, 3] = coarse(target + change) + fine(warped refined keys).

    Where no key's flow is valid the warped refined crops are faded out (by the keys' mean validity) towards
    target + change, the plain propagation, so an occlusion keeps the frame's own detail instead of a ghost.
    At a key frame itself (flow 0, valid) this is exactly its refined crop.
    """
    s = target.shape[0]
    own = target + change
    num = np.zeros_like(own)
    den = np.zeros(valids[0].shape, np.float32)
    for r, v, wt in zip(refined, valids, weights, strict=True):
        num += r * (v * wt)[..., None]
        den += v * wt
    trust = np.clip(den / float(sum(weights)), 0.0, 1.0)[..., None]
    warped = trust * (num / np.maximum(den, 1e-6)[..., None]) + (1.0 - trust) * own
    blur = functools.partial(cv2.GaussianBlur, ksize=(0, 0), sigmaX=max(sigma * s, 0.5))
    out = blur(own) + (warped - blur(warped))
    result: np.ndarray = (out - target).astype(np.float32)
    return result
