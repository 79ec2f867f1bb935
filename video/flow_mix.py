"""The per-pixel arithmetic of propagation (video/flow.py): mixing the keys' warped changes and refined crops by
validity and temporal weight, the detail split's low-pass, and the parts of a crop-size resize the mask's box needs.
Pure NumPy/OpenCV on arrays; no flow is computed here."""

from __future__ import annotations

import cv2
import numpy as np


def masked_sum(valid: np.ndarray, mask: np.ndarray) -> float:
    """sum(valid x mask) over two [h, w] float32 arrays (views too), without a temporary and without BLAS: np.dot
    hands a vector this long to OpenBLAS's threads, which then busy-wait for the next call and took ~6 ms of CPU per
    frame from the decoding and encoding threads (measured: OPENBLAS_NUM_THREADS=1 made the whole run 6 % faster)."""
    return float(np.einsum("ij,ij->", valid, mask))


def upscale_part(img: np.ndarray, s: int, box: tuple[slice, slice]) -> np.ndarray:
    """cv2.resize(img, (s, s), INTER_LINEAR)[box] for img [n, n, ...] (s a multiple of n), computed only around the
    box: the same pixels (the bilinear weights of an integer scale do not depend on where the part starts, and the
    part keeps one source pixel beyond the box on each side, so its edge clamping never reaches the box)."""
    n = img.shape[0]
    rows, cols = box
    if s % n:
        whole: np.ndarray = cv2.resize(img, (s, s), interpolation=cv2.INTER_LINEAR)
        return whole[rows, cols]
    f = s // n
    r0, r1 = max(rows.start // f - 1, 0), min(-(-rows.stop // f) + 1, n)
    c0, c1 = max(cols.start // f - 1, 0), min(-(-cols.stop // f) + 1, n)
    part = cv2.resize(img[r0:r1, c0:c1], ((c1 - c0) * f, (r1 - r0) * f), interpolation=cv2.INTER_LINEAR)
    out: np.ndarray = part[rows.start - r0 * f : rows.stop - r0 * f, cols.start - c0 * f : cols.stop - c0 * f]
    return out


def blended(
    target: np.ndarray,
    changes: list[np.ndarray],
    refined: list[np.ndarray],
    valids: list[np.ndarray],
    weights: list[float],
) -> tuple[np.ndarray, np.ndarray]:
    """(own, warped) of detail_parts for one or two keys, [h, w, 3] float32 each: the keys' warped changes mixed
    onto the target (own), the keys' warped refined crops mixed by validity x temporal weight and faded towards own
    by trust = clip(sum v w / sum w) (warped).

    Each per-pixel weighted mean of two [h, w, 3] images is one cv2.blendLinear pass (mean2): the numpy form
    broadcast [h, w, 1] coefficients over three channels, a slow strided loop, and took ~7 ms of a 512 crop's ~10.
    The last blend's weights (1 - trust, trust) sum to 1 already."""
    parts = [v * np.float32(wt) for v, wt in zip(valids, weights, strict=True)]
    if len(parts) == 1:
        own: np.ndarray = target + changes[0]
        mixed = refined[0]
        trust = np.clip(parts[0] / np.float32(weights[0]), 0.0, 1.0)
    else:
        den = parts[0] + parts[1]
        ok = den > 1e-4  # where no key is valid: the temporal weights alone
        temporal = [np.where(ok, p, np.float32(wt)) for p, wt in zip(parts, weights, strict=True)]
        own = target + mean2(changes, temporal)
        mixed = mean2(refined, parts)
        trust = np.clip(den / np.float32(sum(weights)), 0.0, 1.0)
    warped: np.ndarray = cv2.blendLinear(own, mixed, np.float32(1.0) - trust, trust)
    return own, warped


def mean2(images: list[np.ndarray], coefs: list[np.ndarray]) -> np.ndarray:
    """(a x ca + b x cb) / (ca + cb) per pixel, images [h, w, C], coefs [h, w] >= 0 (0 where both are 0): one
    cv2.blendLinear pass on coefficients normalised to sum 1 first, so its + 1e-5 in the denominator moves every
    pixel by 1e-5 of its value at most (on raw weights near 1e-4 it would be 10 %)."""
    total = np.maximum(coefs[0] + coefs[1], np.float32(1e-30))
    out: np.ndarray = cv2.blendLinear(images[0], images[1], coefs[0] / total, coefs[1] / total)
    return out


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


def weighted_sum(images: list[np.ndarray], coefs: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """sum_i images[i] [S, S, C] x coefs[i] [S, S] (+ out, when given, added in place), with one scratch array:
    at 512 px each full-size temporary costs about as much as the arithmetic."""
    scratch = np.empty_like(images[0])
    acc: np.ndarray = out if out is not None else np.zeros_like(images[0])
    for img, c in zip(images, coefs, strict=True):
        np.multiply(img, c[..., None], out=scratch)
        acc += scratch
    return acc


def mix_coefs(valids: list[np.ndarray], weights: list[float]) -> list[np.ndarray]:
    """The [S, S] float32 weight of each key in mix: validity x temporal weight, normalised, where any key is valid;
    the temporal weights alone (normalised) elsewhere."""
    parts = [v * np.float32(wt) for v, wt in zip(valids, weights, strict=True)]
    den = np.add.reduce(parts) if len(parts) > 1 else parts[0]
    ok = den > 1e-4
    inv = np.float32(1.0) / np.maximum(den, np.float32(1e-4))
    total = float(sum(weights))
    return [
        np.where(ok, p * inv, np.float32(wt / total)).astype(np.float32) for p, wt in zip(parts, weights, strict=True)
    ]


def mix(warped: list[np.ndarray], valids: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """Per pixel, the warped images [S, S, C] weighted by validity x temporal weight; where no key is valid, by
    the temporal weights alone. The weights are worked out per pixel ([S, S]) first and applied once per image."""
    out: np.ndarray = weighted_sum(warped, mix_coefs(valids, weights)).astype(np.float32, copy=False)
    return out


def refined_detail(  # noqa: PLR0913 - hot path: per propagated frame (refined detail); its arguments are that frame's arrays, a bundle would allocate per frame
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
    own, warped = detail_parts(target, change, refined, valids, weights)
    # blur(own) + warped - blur(warped) == warped + blur(own - warped): the blur is linear, one is enough
    np.subtract(own, warped, out=own)
    warped += lowpass(own, max(sigma * s, 0.5))
    warped -= target
    result: np.ndarray = warped.astype(np.float32, copy=False)
    return result


def detail_parts(
    target: np.ndarray,
    change: np.ndarray,
    refined: list[np.ndarray],
    valids: list[np.ndarray],
    weights: list[float],
) -> tuple[np.ndarray, np.ndarray]:
    """(own, warped) of refined_detail, both [h, w, 3] float32 (any size, the same for every input): own = target +
    change, warped = trust x (sum_i r_i v_i w_i / sum_i v_i w_i) + (1 - trust) x own, trust =
    clip(sum_i v_i w_i / sum_i w_i), computed as per-pixel [h, w] coefficients first, so the full-size arithmetic is a
    few in-place passes."""
    own = target + change
    parts = [v * np.float32(wt) for v, wt in zip(valids, weights, strict=True)]
    den = np.add.reduce(parts) if len(parts) > 1 else parts[0]
    trust = np.clip(den / np.float32(sum(weights)), 0.0, 1.0)
    scale = trust / np.maximum(den, np.float32(1e-6))
    warped = weighted_sum([own, *refined], [np.float32(1.0) - trust, *(p * scale for p in parts)])
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
    carphone clip, the outputs agree at > 45 dB per frame (each version writing a lossless file).
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
