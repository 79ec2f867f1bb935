"""video/flow.py's detail split: the low-pass on a pyramid level matches OpenCV's full-size Gaussian, and the
propagated change matches the full-size formula, at a small fraction of the cost."""

from __future__ import annotations

import time

import cv2
import numpy as np
from tokenfuse.faces.align import template
from tokenfuse.faces.masks import crop_mask
from tokenfuse.video.flow import FlowOptions, KeyChange, _combine, grey, key_flow, propagate
from tokenfuse.video.flow_mix import lowpass, mask_box, pyramid_factor, refined_detail
from video_clips import webp_frames


def _crops(s: int = 512) -> list[np.ndarray]:
    src, _ = webp_frames("api_kling_avatar2-1.webp")
    return [cv2.resize(src[i], (s, s), interpolation=cv2.INTER_CUBIC).astype(np.float32) / 255.0 for i in (0, 4, 9)]


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(1.0 / max(float(((a - b) ** 2).mean()), 1e-20)))


def test_pyramid_factor_keeps_the_level_sigma_at_least_four_px() -> None:
    assert [pyramid_factor(s) for s in (0.5, 3.9, 8.0, 20.5, 41.0, 100.0)] == [1, 1, 2, 4, 8, 16]


def test_lowpass_matches_the_full_size_blur() -> None:
    a, b, _ = _crops()
    img = a - 0.9 * b  # what it blurs: own - warped, a mix of coarse change and detail
    for sigma in (41.0, 20.5, 10.0, 2.0):
        exact = cv2.GaussianBlur(img, (0, 0), sigma)
        assert _psnr(lowpass(img, sigma), exact) > 60.0, sigma


def test_refined_detail_agrees_with_the_full_size_formula_and_is_fast() -> None:
    target, r0, r1 = _crops()
    rng = np.random.default_rng(0)
    change = (0.05 * rng.standard_normal(target.shape)).astype(np.float32)
    change = cv2.GaussianBlur(change, (0, 0), 6.0)
    valid = [np.ones(target.shape[:2], np.float32), np.full(target.shape[:2], 0.5, np.float32)]
    valid[1][:200] = 0.0  # an occluded band: the frame's own detail there
    weights = [0.7, 0.3]
    sigma = 0.08

    def full_size() -> np.ndarray:  # the formula with OpenCV's blur on the full crop (before the pyramid)
        own = target + change
        num = r0 * (valid[0] * weights[0])[..., None] + r1 * (valid[1] * weights[1])[..., None]
        den = valid[0] * weights[0] + valid[1] * weights[1]
        trust = np.clip(den / sum(weights), 0.0, 1.0)[..., None]
        warped = trust * (num / np.maximum(den, 1e-6)[..., None]) + (1.0 - trust) * own
        blur = lambda x: cv2.GaussianBlur(x, (0, 0), sigma * 512)  # noqa: E731
        return blur(own) + (warped - blur(warped)) - target

    t0 = time.perf_counter()
    reference = full_size()
    t_full = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = refined_detail(target, change, [r0, r1], valid, weights, sigma)
    t_new = time.perf_counter() - t0
    assert got.dtype == np.float32 and got.shape == target.shape
    assert _psnr(target + got, target + reference) > 55.0
    assert np.abs(got - reference).max() < 2.0 / 255
    assert t_new < t_full / 2  # the full-size blur is ~90 % of the formula's time


def test_propagate_in_the_mask_box_agrees_with_the_crop_size_formula() -> None:
    """propagate's refined detail is computed at crop size inside the face mask's box only (0 outside it, where
    paste-back never reads) and its low-pass half at the flow's work size: inside the mask it agrees with the whole
    crop-size formula (the path it replaced, still taken without work-size flows) within 55 dB."""
    target, a, b = _crops()
    mask = crop_mask(template(512), 512, 0.08)
    opts = FlowOptions()
    rng = np.random.default_rng(1)
    keys = []
    for t, crop in ((0, a), (8, b)):
        change = cv2.GaussianBlur((0.05 * rng.standard_normal(crop.shape)).astype(np.float32), (0, 0), 3.0)
        change += 0.6 * (crop - cv2.GaussianBlur(crop, (0, 0), 2.0))  # a detail boost: fine detail in the change
        keys.append(KeyChange(t, grey(crop, opts.work_size), change, crop))
    target_grey = grey(target, opts.work_size)
    got, frac = propagate(target_grey, 3, keys, mask, opts, target)
    assert got is not None and got.dtype == np.float32 and got.shape == target.shape
    flows = [key_flow(target_grey, k) for k in keys]
    weights = [1.0 - 3 / 8, 1.0 - 5 / 8]
    ref, frac_ref = _combine(3, keys, [f for f, _ in flows], [v for _, v in flows], weights, mask, opts, target)
    assert ref is not None and abs(frac - frac_ref) < 1e-6  # the same sum, over the mask's box only
    inside = mask > 0
    err = ((got - ref)[inside] ** 2).mean()
    assert 10 * np.log10(1.0 / err) > 55.0
    rows, cols = mask_box(mask)
    outside = np.ones(mask.shape, bool)
    outside[rows, cols] = False
    assert not (inside & outside).any() and not got[outside].any()
    assert outside.mean() > 0.4  # the box saves about half the crop
