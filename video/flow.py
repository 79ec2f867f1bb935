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

from .clock import NULL_CLOCK, StageClock

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
    return remap(img, coords(flow))


def coords(flow: np.ndarray) -> np.ndarray:
    """The sampling positions x + flow(x) [h, w, 2] float32: computed once per flow, used by every `remap` of it."""
    out: np.ndarray = _grid(*flow.shape[:2]) + flow
    return out


def remap(img: np.ndarray, at: np.ndarray) -> np.ndarray:
    """img [h, w, ...] sampled at positions `at` [h, w, 2] (bilinear, border replicated); the two-channel map goes
    to OpenCV as it is (the same pixels as separate x / y maps, without copying them out)."""
    out: np.ndarray = cv2.remap(img, at, None, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return out


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

    @functools.cached_property
    def refined(self) -> np.ndarray:
        """The refined key crop, crop + change [S, S, 3] float32: computed once, warped onto every frame it serves."""
        assert self.crop is not None
        out: np.ndarray = self.crop + self.change
        return out

    @functools.cached_property
    def small(self) -> tuple[np.ndarray, np.ndarray]:
        """(change, refined) reduced to the work size [w, w, 3] float32 (area average): what the coarse half of the
        detail split is computed from (see propagate)."""
        w = self.grey.shape[0]
        return _area(self.change, w), _area(self.refined, w)


def _area(img: np.ndarray, w: int) -> np.ndarray:
    """img [S, S, C] reduced to [w, w, C] by area averaging (a copy when S == w)."""
    if img.shape[0] == w:
        same: np.ndarray = img.copy()
        return same
    out: np.ndarray = cv2.resize(img, (w, w), interpolation=cv2.INTER_AREA)
    return out


def key_flow(target_grey: np.ndarray, key: KeyChange, max_residual: float = 24.0) -> tuple[np.ndarray, np.ndarray]:
    """Flow [S, S, 2] from the target crop to the key's crop at crop size, and a [S, S] float32 validity map
    (1 = trustworthy flow): work_flow scaled up to the key's crop size."""
    return upscale_flow(*work_flow(target_grey, key, max_residual), key.change.shape[0])


def work_flow(target_grey: np.ndarray, key: KeyChange, max_residual: float = 24.0) -> tuple[np.ndarray, np.ndarray]:
    """Flow [w, w, 2] (work-size pixels) from the target crop to the key's crop at work size w, and its [w, w]
    float32 validity map (1 = trustworthy flow).

    A pixel is valid when forward and backward flow agree and the key frame, warped by the flow, matches the
    target there (grey difference < max_residual of 255): the second test catches occlusions by flat content,
    where both flows are zero and agree.
    """
    fwd = dis_flow(target_grey, key.grey)
    bwd = dis_flow(key.grey, target_grey)
    residual = np.abs(sample(key.grey.astype(np.float32), fwd) - target_grey.astype(np.float32))
    valid = (consistency(fwd, bwd) & (cv2.GaussianBlur(residual, (0, 0), 1.0) < max_residual)).astype(np.float32)
    return fwd, valid


def upscale_flow(fwd: np.ndarray, valid: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """A work-size flow [w, w, 2] and validity [w, w] as crop-size ones [S, S, 2] (in crop pixels) and [S, S]."""
    k = s / fwd.shape[0]
    big = cv2.resize(fwd, (s, s), interpolation=cv2.INTER_LINEAR) * k
    valid_big = cv2.resize(valid, (s, s), interpolation=cv2.INTER_LINEAR)
    return big, valid_big


def warp_change(target_grey: np.ndarray, key: KeyChange, max_residual: float = 24.0) -> tuple[np.ndarray, np.ndarray]:
    """The key's change moved onto the target crop, and its [S, S] float32 validity map (see key_flow)."""
    big, valid = key_flow(target_grey, key, max_residual)
    return sample(key.change, big), valid


def propagate(  # noqa: PLR0913 - hot path: called per propagated frame of every track; a per-call argument object would allocate
    target_grey: np.ndarray,
    frame: int,
    keys: list[KeyChange],
    face_mask: np.ndarray,
    opts: FlowOptions = FlowOptions(),
    target: np.ndarray | None = None,
    *,
    clock: StageClock = NULL_CLOCK,
) -> tuple[np.ndarray | None, float]:
    """The change for a frame between key frames, or None when the flow failed there.

    keys: the neighbouring key frames (one or two), each weighted by temporal closeness and by its per-pixel
    flow validity; where no key is valid at a pixel the temporal weights alone are used (a soft fallback for
    small occlusions). face_mask: [S, S] float32, where validity is counted. target: the frame's crop [S, S, 3]
    float32 0..1; with it (and opts.detail "refined", keys carrying their crops) the fine detail is the key
    frames' refined detail, warped (see FlowOptions). Returns (change [S, S, 3] float32, valid fraction of the
    face) or (None, fraction) when fewer than opts.min_valid of the face pixels are valid for every key.

    With the refined detail the change is computed at crop size only inside the face mask's box (mask_box: the
    pixels paste-back reads) and is 0 outside it; the low-pass half of the detail split, which reaches ~3 sigma
    beyond the box, is computed over the whole crop at the flow's work size (see _coarse). Why: the crop-size
    arithmetic was most of a propagated frame's cost and the mask's box is ~half the crop.
    clock: where the time goes ("flow": the DIS flows and validity maps; "propagation": the rest).
    """
    if not keys:
        return None, 0.0
    span = max(abs(keys[-1].frame - keys[0].frame), 1)  # two keys: weights 1 - distance / gap; one key: 1
    s = keys[0].change.shape[0]
    small, flows, valids, weights = [], [], [], []
    with clock.stage("flow"):
        for key in keys:
            f_w, v_w = work_flow(target_grey, key)
            small.append((f_w, v_w))
            f, v = upscale_flow(f_w, v_w, s)
            flows.append(f)
            valids.append(v)
            weights.append(max(1e-3, 1.0 - abs(frame - key.frame) / span) if len(keys) > 1 else 1.0)
    with clock.stage("propagation"):
        return _combine(frame, keys, flows, valids, weights, face_mask, opts, target, small)


def mask_box(mask: np.ndarray, margin: int = 4) -> tuple[slice, slice]:
    """(rows, cols): the box of mask > 0 [S, S] grown by margin px, clipped; the whole crop when the mask is empty.
    Paste-back's bicubic warp of the crop reads at most 2 crop pixels beyond where the mask is > 0 (plus fixed-point
    rounding): the margin covers it, so crop pixels outside the box never reach the frame."""
    s = mask.shape[0]
    rows, cols = np.flatnonzero((mask > 0).any(1)), np.flatnonzero((mask > 0).any(0))
    if rows.size == 0:
        return slice(0, s), slice(0, mask.shape[1])
    return (
        slice(max(int(rows[0]) - margin, 0), min(int(rows[-1]) + 1 + margin, s)),
        slice(max(int(cols[0]) - margin, 0), min(int(cols[-1]) + 1 + margin, mask.shape[1])),
    )


def _combine(  # noqa: PLR0913 - hot path: propagate's second half, per propagated frame; its arguments are that frame's arrays, a bundle would allocate per frame
    frame: int,
    keys: list[KeyChange],
    flows: list[np.ndarray],
    valids: list[np.ndarray],
    weights: list[float],
    face_mask: np.ndarray,
    opts: FlowOptions,
    target: np.ndarray | None,
    small: list[tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[np.ndarray | None, float]:
    """propagate's second half: the validity check, then the keys' warped changes (and refined detail) mixed.
    small: the keys' work-size (flow, validity); with it the refined detail is computed in the mask's box only."""
    flat_mask = face_mask.reshape(-1)
    mass = max(float(flat_mask.sum()), 1e-6)
    # sum(v x mask) as one dot product: no [S, S] temporary (this was ~1.5 ms per key at 512 px)
    fractions = [float(np.dot(v.reshape(-1), flat_mask)) / mass for v in valids]
    best = max(fractions)
    if best < opts.min_valid:
        return None, best
    refined = opts.detail == "refined" and target is not None and all(k.crop is not None for k in keys)
    s = face_mask.shape[0]
    sigma = max(opts.detail_sigma * s, 0.5)
    if not refined or small is None or s // pyramid_factor(sigma) > small[0][0].shape[0]:
        at = [coords(f) for f in flows]
        change = _mix([remap(k.change, m) for k, m in zip(keys, at, strict=True)], valids, weights)
        if refined:
            assert target is not None
            moved = [remap(k.refined, m) for k, m in zip(keys, at, strict=True)]
            change = _refined_detail(target, change, moved, valids, weights, opts.detail_sigma)
        return change, best
    assert target is not None
    box = mask_box(face_mask)
    grid = _grid(s, s)[box]
    box_at = [grid + f[box] for f in flows]
    vb = [v[box] for v in valids]
    _, warped = _detail_parts(
        target[box],
        _mix([remap(k.change, m) for k, m in zip(keys, box_at, strict=True)], vb, weights),
        [remap(k.refined, m) for k, m in zip(keys, box_at, strict=True)],
        vb,
        weights,
    )
    warped += _coarse(target, keys, small, weights, sigma)[box]
    warped -= target[box]
    change = np.zeros_like(target)
    change[box] = warped
    return change, best


def _coarse(
    target: np.ndarray,
    keys: list[KeyChange],
    small: list[tuple[np.ndarray, np.ndarray]],
    weights: list[float],
    sigma: float,
) -> np.ndarray:
    """lowpass(own - warped) of _refined_detail [S, S, 3], computed from the work-size flows and the keys' work-size
    change and refined crops (KeyChange.small) instead of crop-size ones.

    lowpass averages down to a level of S / pyramid_factor(sigma) px (64 px for the default split of a 512 crop)
    before it blurs; whenever the work size is at least that level, own - warped sampled at work size and then
    averaged to the level differs from the crop-size one averaged down only by detail finer than the work size,
    which the blur (sigma ~41 px) removes: measured on the bench's and the carphone clip, > 45 dB per frame.
    """
    w = small[0][0].shape[0]
    s = target.shape[0]
    at = [coords(f) for f, _ in small]
    vs = [v for _, v in small]
    change = _mix([remap(k.small[0], m) for k, m in zip(keys, at, strict=True)], vs, weights)
    own, warped = _detail_parts(
        _area(target, w), change, [remap(k.small[1], m) for k, m in zip(keys, at, strict=True)], vs, weights
    )
    np.subtract(own, warped, out=own)
    f = pyramid_factor(sigma)
    level = own if s // f == w else cv2.resize(own, (s // f, s // f), interpolation=cv2.INTER_AREA)
    level_sigma = np.sqrt(max(sigma**2 - (f * f - 1) / 12.0 - f * f / 6.0, 1.0)) / f
    level = cv2.GaussianBlur(level, (0, 0), float(level_sigma))
    out: np.ndarray = cv2.resize(level, (s, s), interpolation=cv2.INTER_LINEAR)
    return out


def _weighted_sum(images: list[np.ndarray], coefs: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """sum_i images[i] [S, S, C] x coefs[i] [S, S] (+ out, when given, added in place), with one scratch array:
    at 512 px each full-size temporary costs about as much as the arithmetic."""
    scratch = np.empty_like(images[0])
    acc: np.ndarray = out if out is not None else np.zeros_like(images[0])
    for img, c in zip(images, coefs, strict=True):
        np.multiply(img, c[..., None], out=scratch)
        acc += scratch
    return acc


def _mix_coefs(valids: list[np.ndarray], weights: list[float]) -> list[np.ndarray]:
    """The [S, S] float32 weight of each key in _mix: validity x temporal weight, normalised, where any key is valid;
    the temporal weights alone (normalised) elsewhere."""
    parts = [v * np.float32(wt) for v, wt in zip(valids, weights, strict=True)]
    den = np.add.reduce(parts) if len(parts) > 1 else parts[0]
    ok = den > 1e-4
    inv = np.float32(1.0) / np.maximum(den, np.float32(1e-4))
    total = float(sum(weights))
    return [
        np.where(ok, p * inv, np.float32(wt / total)).astype(np.float32) for p, wt in zip(parts, weights, strict=True)
    ]


def _mix(warped: list[np.ndarray], valids: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """Per pixel, the warped images [S, S, C] weighted by validity x temporal weight; where no key is valid, by
    the temporal weights alone. The weights are worked out per pixel ([S, S]) first and applied once per image."""
    out: np.ndarray = _weighted_sum(warped, _mix_coefs(valids, weights)).astype(np.float32, copy=False)
    return out


def _refined_detail(  # noqa: PLR0913 - hot path: per propagated frame (refined detail); its arguments are that frame's arrays, a bundle would allocate per frame
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
    own, warped = _detail_parts(target, change, refined, valids, weights)
    # blur(own) + warped - blur(warped) == warped + blur(own - warped): the blur is linear, one is enough
    np.subtract(own, warped, out=own)
    warped += lowpass(own, max(sigma * s, 0.5))
    warped -= target
    result: np.ndarray = warped.astype(np.float32, copy=False)
    return result


def _detail_parts(
    target: np.ndarray,
    change: np.ndarray,
    refined: list[np.ndarray],
    valids: list[np.ndarray],
    weights: list[float],
) -> tuple[np.ndarray, np.ndarray]:
    """(own, warped) of _refined_detail, both [h, w, 3] float32 (any size, the same for every input): own = target +
    change, warped = trust x (sum_i r_i v_i w_i / sum_i v_i w_i) + (1 - trust) x own, trust =
    clip(sum_i v_i w_i / sum_i w_i), computed as per-pixel [h, w] coefficients first, so the full-size arithmetic is a
    few in-place passes."""
    own = target + change
    parts = [v * np.float32(wt) for v, wt in zip(valids, weights, strict=True)]
    den = np.add.reduce(parts) if len(parts) > 1 else parts[0]
    trust = np.clip(den / np.float32(sum(weights)), 0.0, 1.0)
    scale = trust / np.maximum(den, np.float32(1e-6))
    warped = _weighted_sum([own, *refined], [np.float32(1.0) - trust, *(p * scale for p in parts)])
    return own, warped


MIN_LEVEL_SIGMA = 4.0
"""The smallest Gaussian sigma (px) `lowpass` blurs with on a reduced level: below it the level's sampling and the
bilinear upsampling would show."""


def pyramid_factor(sigma: float) -> int:
    """The reduction (a power of two) `lowpass` blurs at: the largest f with sigma / f >= MIN_LEVEL_SIGMA."""
    f = 1
    while sigma / (2 * f) >= MIN_LEVEL_SIGMA:
        f *= 2
    return f


def lowpass(img: np.ndarray, sigma: float) -> np.ndarray:
    """A Gaussian blur of img [H, W, C] float32 with sigma px, computed on a level reduced by pyramid_factor(sigma)
    and upsampled bilinearly.

    Why: OpenCV's GaussianBlur costs ~6 sigma taps per pixel and pass; the default detail split (sigma 0.08 x a
    512 crop = 41 px) took ~250 ms per crop at full size, ~1 ms on a 64 px level. The area reduction (a box of f px,
    variance (f^2 - 1) / 12) and the bilinear upsampling (a tent of f px, variance f^2 / 6) blur too: the level's
    sigma is reduced by their variance so the whole low-pass keeps sigma. What differs from the full-size blur is
    the level's sampling of an image whose content above ~1 / sigma is gone already: measured on the bench's and the
    carphone clip, the outputs agree at > 45 dB (bench/video.py --compare).
    """
    f = pyramid_factor(sigma)
    if f == 1:
        out: np.ndarray = cv2.GaussianBlur(img, (0, 0), sigma)
        return out
    h, w = img.shape[:2]
    small = cv2.resize(img, (max(w // f, 1), max(h // f, 1)), interpolation=cv2.INTER_AREA)
    level_sigma = np.sqrt(max(sigma**2 - (f * f - 1) / 12.0 - f * f / 6.0, 1.0)) / f
    small = cv2.GaussianBlur(small, (0, 0), float(level_sigma))
    out = cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR)
    return out
