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

from ..faces.pixels import to_u8_, unit_float
from .clock import NULL_CLOCK, StageClock
from .flow_mix import (
    blended,
    mask_box,
    masked_sum,
    mix,
    pyramid_factor,
    refined_detail,
    upscale_part,
)

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
DIS_DESCENT_ITERATIONS, DIS_REFINEMENT_ITERATIONS = 12, 3
"""DIS's medium preset with fewer iterations (25 gradient-descent steps per patch and 5 variational refinement steps
per scale in the preset): a 128 px flow costs ~1.7 instead of ~2.5 ms of CPU (four per propagated face and frame)
and the faces' 128 px crops converge well before: the fused outputs stay within 47.5 dB PSNR per frame (means
53-57 dB) of the preset's on the bench's clips and carphone, about what any other iteration count gives."""


def _dis() -> Any:
    """One DIS instance (medium preset, fewer iterations) per process; creating it costs more than a 128 px flow."""
    global _DIS
    if _DIS is None:
        dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM)  # type: ignore[attr-defined]
        dis.setGradientDescentIterations(DIS_DESCENT_ITERATIONS)
        dis.setVariationalRefinementIterations(DIS_REFINEMENT_ITERATIONS)
        _DIS = dis
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
    d = fwd + b_at
    # x^2 + y^2 per channel view: numpy's sum over a last axis of 2 was ~6x slower (the same values)
    err = _sq(d)
    mag = _sq(fwd) + _sq(b_at)
    ok: np.ndarray = err < np.float32(0.01) * mag + np.float32(0.5)
    return ok


def _sq(v: np.ndarray) -> np.ndarray:
    """|v|^2 [h, w] of a vector field [h, w, 2]."""
    x, y = v[..., 0], v[..., 1]
    out: np.ndarray = x * x + y * y
    return out


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
    def quad(self) -> tuple[np.ndarray, np.ndarray]:
        """(change, refined) as 4-channel images [S, S, 4] float32, the fourth channel 0: what the mask-box path
        samples. OpenCV's remap has vector code for 1 and 4 channels only; a 4-channel float image is sampled in
        about half the time of a 3-channel one, to the same values."""
        return _rgba(self.change), _rgba(self.refined)

    @functools.cached_property
    def small(self) -> tuple[np.ndarray, np.ndarray]:
        """(change, refined) reduced to the work size [w, w, 4] float32 (area average; the fourth channel 0 as in
        quad): what the coarse half of the detail split is computed from (see propagate)."""
        w = self.grey.shape[0]
        return _rgba(_area(self.change, w)), _rgba(_area(self.refined, w))


def _rgba(img: np.ndarray) -> np.ndarray:
    """img [h, w, 3] float32 -> [h, w, 4] float32 with a fourth channel of 0 (a new array)."""
    out: np.ndarray = np.zeros((*img.shape[:2], 4), np.float32)
    out[..., :3] = img
    return out


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
    beyond the box, is computed over the whole crop at the flow's work size (see _coarse_level). Why: the crop-size
    arithmetic was most of a propagated frame's cost and the mask's box is ~half the crop.
    clock: where the time goes ("flow": the DIS flows and validity maps; "propagation": the rest).
    """
    if not keys:
        return None, 0.0
    if _in_box(keys, face_mask, opts, target):
        assert target is not None
        rows, cols = box = mask_box(face_mask)
        fused, best = _box_propagate(target_grey, frame, keys, face_mask, opts, target, box, clock)
        if fused is None:
            return None, best
        change = np.zeros_like(target)
        np.subtract(fused[..., :3], target[rows, cols], out=change[rows, cols])
        return change, best
    s = keys[0].change.shape[0]
    small, weights = _work_flows(target_grey, frame, keys, clock)
    with clock.stage("flow"):
        big = [upscale_flow(f, v, s) for f, v in small]
    with clock.stage("propagation"):
        return _combine(frame, keys, [f for f, _ in big], [v for _, v in big], weights, face_mask, opts, target)


def propagate_crop(  # noqa: PLR0913 - hot path: the video pass's per propagated frame call; see propagate
    target_grey: np.ndarray,
    frame: int,
    keys: list[KeyChange],
    face_mask: np.ndarray,
    opts: FlowOptions,
    crop: np.ndarray,
    *,
    clock: StageClock = NULL_CLOCK,
) -> tuple[np.ndarray | None, float]:
    """The frame's crop with the keys' refinement carried onto it, as paste-back takes it: crop [S, S, 3] uint8 (the
    frame's own) -> a new uint8 crop, round(clip(crop + change of propagate)); or (None, fraction) when the flow
    failed.

    Why a crop and not a change: paste-back needs the crop, and the change was made from it and turned back into it
    (three crop-size passes per face and frame); outside the face mask's box, where propagate's change is 0, the
    result is the frame's own crop, copied, and only the box goes through float and back.
    """
    if not keys:
        return None, 0.0
    with clock.stage("propagation"):
        target = unit_float(crop)
    if _in_box(keys, face_mask, opts, target):
        rows, cols = box = mask_box(face_mask)
        fused, best = _box_propagate(target_grey, frame, keys, face_mask, opts, target, box, clock)
        if fused is None:
            return None, best
        with clock.stage("propagation"):
            out = crop.copy()
            out[rows, cols] = cv2.cvtColor(to_u8_(fused), cv2.COLOR_RGBA2RGB)  # numpy's strided [..., :3] was slower
        return out, best
    change, best = propagate(target_grey, frame, keys, face_mask, opts, target, clock=clock)
    if change is None:
        return None, best
    with clock.stage("propagation"):
        target += change
        return to_u8_(target), best


def _work_flows(
    target_grey: np.ndarray, frame: int, keys: list[KeyChange], clock: StageClock
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[float]]:
    """Per key, its work-size (flow, validity) from work_flow and its temporal weight (two keys: 1 - distance / gap;
    one key: 1)."""
    span = max(abs(keys[-1].frame - keys[0].frame), 1)
    with clock.stage("flow"):
        small = [work_flow(target_grey, key) for key in keys]
    weights = [max(1e-3, 1.0 - abs(frame - key.frame) / span) if len(keys) > 1 else 1.0 for key in keys]
    return small, weights


def _in_box(keys: list[KeyChange], face_mask: np.ndarray, opts: FlowOptions, target: np.ndarray | None) -> bool:
    """True when propagate takes the mask-box path: the refined detail (target and the keys' crops given), one or
    two keys, and a work size at least the low-pass level (S / pyramid_factor) _coarse_level samples down to."""
    if opts.detail != "refined" or target is None or not 1 <= len(keys) <= 2 or any(k.crop is None for k in keys):
        return False
    s = face_mask.shape[0]
    return bool(s // pyramid_factor(max(opts.detail_sigma * s, 0.5)) <= keys[0].grey.shape[0])


def _box_propagate(  # noqa: PLR0913 - hot path: propagate's mask-box path, per propagated frame
    target_grey: np.ndarray,
    frame: int,
    keys: list[KeyChange],
    face_mask: np.ndarray,
    opts: FlowOptions,
    target: np.ndarray,
    box: tuple[slice, slice],
    clock: StageClock,
) -> tuple[np.ndarray | None, float]:
    """(target + change) in the face mask's box (mask_box(face_mask), the caller's) [h, w, 4] float32 (unclipped;
    the fourth channel meaningless) and the valid fraction; (None, fraction) when the flow failed. The flows and
    validity maps are scaled up only inside the box (the mask is 0 outside it, so the valid fraction is the same
    sum)."""
    s = face_mask.shape[0]
    small, weights = _work_flows(target_grey, frame, keys, clock)
    with clock.stage("flow"):
        # flows scaled to crop pixels before the resize (a linear map; on the small image), flow and validity resized
        # apart: views into a 3-channel image were strided and numpy's passes over them ~10x slower
        k = np.float32(s / small[0][0].shape[0])
        grid = _grid(s, s)[box]
        at = [grid + upscale_part(f * k, s, box) for f, _ in small]  # the sampling positions
        valids = [upscale_part(v, s, box) for _, v in small]
    with clock.stage("propagation"):
        mask = face_mask[box]
        mass = max(float(mask.sum()), 1e-6)
        best = max(masked_sum(v, mask) / mass for v in valids)
        if best < opts.min_valid:
            return None, best
        fused = _fused(keys, at, valids, weights, cv2.cvtColor(target[box], cv2.COLOR_RGB2RGBA))
        sigma = max(opts.detail_sigma * s, 0.5)
        fused += upscale_part(_coarse_level(target, keys, small, weights, sigma), s, box)
        return fused, best


def _fused(
    keys: list[KeyChange],
    at: list[np.ndarray],
    valids: list[np.ndarray],
    weights: list[float],
    target: np.ndarray,
) -> np.ndarray:
    """warped of refined_detail in the box [h, w, 4] float32, its fourth channel meaningless (at: per key, the box's
    sampling positions [h, w, 2] in crop pixels; valids [h, w]; target the box of the frame's crop [h, w, 4]): the
    keys' change and refined crops sampled there (KeyChange.quad: 4 channels), mixed by blended."""
    changes = [remap(k.quad[0], m) for k, m in zip(keys, at, strict=True)]
    refined = [remap(k.quad[1], m) for k, m in zip(keys, at, strict=True)]
    return blended(target, changes, refined, valids, weights)[1]


def _combine(  # noqa: PLR0913 - hot path: propagate's second half, per propagated frame; its arguments are that frame's arrays, a bundle would allocate per frame
    frame: int,
    keys: list[KeyChange],
    flows: list[np.ndarray],
    valids: list[np.ndarray],
    weights: list[float],
    face_mask: np.ndarray,
    opts: FlowOptions,
    target: np.ndarray | None,
) -> tuple[np.ndarray | None, float]:
    """propagate's second half over the whole crop (the path without the mask box, see _in_box): the validity
    check, then the keys' warped changes (and refined detail) mixed."""
    mass = max(float(face_mask.sum()), 1e-6)
    fractions = [masked_sum(v, face_mask) / mass for v in valids]
    best = max(fractions)
    if best < opts.min_valid:
        return None, best
    refined = opts.detail == "refined" and target is not None and all(k.crop is not None for k in keys)
    at = [coords(f) for f in flows]
    change = mix([remap(k.change, m) for k, m in zip(keys, at, strict=True)], valids, weights)
    if refined:
        assert target is not None
        moved = [remap(k.refined, m) for k, m in zip(keys, at, strict=True)]
        change = refined_detail(target, change, moved, valids, weights, opts.detail_sigma)
    return change, best


def _coarse_level(
    target: np.ndarray,
    keys: list[KeyChange],
    small: list[tuple[np.ndarray, np.ndarray]],
    weights: list[float],
    sigma: float,
) -> np.ndarray:
    """lowpass(own - warped) of refined_detail before its last step, the bilinear scale-up to the crop: a
    [S / f, S / f, 4] level (f = pyramid_factor(sigma); the fourth channel meaningless, as the box's), computed from
    the work-size flows and the keys' work-size change and refined crops (KeyChange.small) instead of crop-size ones.

    lowpass averages down to that level (64 px for the default split of a 512 crop) before it blurs; whenever the
    work size is at least that level, own - warped sampled at work size and then averaged to the level differs from
    the crop-size one averaged down only by detail finer than the work size, which the blur (sigma ~41 px) removes:
    measured on the bench's and the carphone clip, > 45 dB per frame.
    """
    w = small[0][0].shape[0]
    s = target.shape[0]
    at = [coords(f) for f, _ in small]
    vs = [v for _, v in small]
    own, warped = blended(
        cv2.cvtColor(_area(target, w), cv2.COLOR_RGB2RGBA),
        [remap(k.small[0], m) for k, m in zip(keys, at, strict=True)],
        [remap(k.small[1], m) for k, m in zip(keys, at, strict=True)],
        vs,
        weights,
    )
    np.subtract(own, warped, out=own)
    f = pyramid_factor(sigma)
    level = own if s // f == w else cv2.resize(own, (s // f, s // f), interpolation=cv2.INTER_AREA)
    level_sigma = np.sqrt(max(sigma**2 - (f * f - 1) / 12.0 - f * f / 6.0, 1.0)) / f
    out: np.ndarray = cv2.GaussianBlur(level, (0, 0), float(level_sigma))
    return out
