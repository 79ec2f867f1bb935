"""Paste processed aligned crops back into their frame: inverse affine of crop and mask, feathered alpha,
optional LAB colour transfer and Poisson (seamlessClone) blending. Pixels where the warped mask is 0 are returned
bit-identical."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import cv2
import numpy as np

from .types import Face

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlendOptions:
    """strength: alpha multiplier in [0, 1]; color_transfer: match the crop's LAB mean/std to the frame's face;
    seamless: Poisson-blend with cv2.seamlessClone before alpha compositing."""

    strength: float = 1.0
    color_transfer: bool = False
    seamless: bool = False


def _roi(face: Face, h: int, w: int) -> tuple[int, int, int, int] | None:
    """Integer image rectangle (x0, y0, x1, y1) covering the crop's footprint, clipped to the frame."""
    s = face.crop_size
    corners = np.array([[0, 0], [s, 0], [0, s], [s, s]], np.float64)
    pts = corners @ face.inverse[:, :2].T + face.inverse[:, 2]
    x0, y0 = np.floor(pts.min(0)).astype(int) - 2
    x1, y1 = np.ceil(pts.max(0)).astype(int) + 2
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    return None if x1 <= x0 or y1 <= y0 else (int(x0), int(y0), int(x1), int(y1))


def color_transfer(crop: np.ndarray, reference: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Shift crop's LAB mean/std (inside mask) to the reference's. Both [S, S, 3] float32 RGB 0..1."""
    sel = mask > 0.5
    if sel.sum() < 16:
        return crop
    lab_c = cv2.cvtColor(np.clip(crop, 0, 1).astype(np.float32), cv2.COLOR_RGB2LAB)
    lab_r = cv2.cvtColor(np.clip(reference, 0, 1).astype(np.float32), cv2.COLOR_RGB2LAB)
    mc, sc = lab_c[sel].mean(0), lab_c[sel].std(0) + 1e-6
    mr, sr = lab_r[sel].mean(0), lab_r[sel].std(0)
    out = (lab_c - mc) * (sr / sc) + mr
    rgb: np.ndarray = np.clip(cv2.cvtColor(out.astype(np.float32), cv2.COLOR_LAB2RGB), 0.0, 1.0)
    return rgb


def paste_face(frame: np.ndarray, face: Face, opts: BlendOptions = BlendOptions()) -> np.ndarray:
    """frame: [H, W, 3] float32 0..1 -> a new frame with face.crop composited in (frame unchanged if no crop)."""
    if face.crop is None or _roi(face, frame.shape[0], frame.shape[1]) is None:
        return frame
    out: np.ndarray = frame.copy()
    _paste_one(out, face, opts)
    return out


def _paste_one(frame: np.ndarray, face: Face, opts: BlendOptions) -> None:
    """Composite face.crop into frame [H, W, 3] float32 in place (only where the warped mask is > 0)."""
    placed = _placement(face, frame.shape[0], frame.shape[1])
    if placed is None:
        return
    (x0, y0, x1, y1), inv, size = placed
    crop = np.asarray(face.crop, np.float32)
    if opts.color_transfer:
        ref = cv2.warpAffine(
            frame,
            face.affine,
            (face.crop_size, face.crop_size),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REFLECT101,
        )
        crop = color_transfer(crop, ref, face.mask)
    warped = cv2.warpAffine(crop, inv, size, flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT101)
    alpha = _alpha(face, inv, size, opts.strength)
    dst = frame[y0:y1, x0:x1]
    if opts.seamless:
        warped = _seamless(warped, dst, alpha)
    _blend_into(dst, warped, alpha)


def _placement(face: Face, h: int, w: int) -> tuple[tuple[int, int, int, int], np.ndarray, tuple[int, int]] | None:
    """Where face.crop lands in an h x w frame: the rectangle (x0, y0, x1, y1), the crop -> rectangle affine [2, 3]
    and the rectangle's (width, height); None without a crop or off the frame."""
    if face.crop is None:
        return None
    roi = _roi(face, h, w)
    if roi is None:
        return None
    x0, y0, x1, y1 = roi
    inv = face.inverse.copy()
    inv[:, 2] -= (x0, y0)  # crop -> ROI coordinates
    return roi, inv, (x1 - x0, y1 - y0)


def _alpha(face: Face, inv: np.ndarray, size: tuple[int, int], strength: float) -> np.ndarray:
    """The face mask warped into the rectangle [h, w] float32, clipped to 0..1, times strength (clipped to 0..1)."""
    alpha: np.ndarray = cv2.warpAffine(
        np.asarray(face.mask, np.float32),
        inv,
        size,
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=0,
    )
    np.clip(alpha, 0.0, 1.0, out=alpha)
    alpha *= np.float32(np.clip(strength, 0.0, 1.0))
    return alpha


def _blend_into(dst: np.ndarray, warped: np.ndarray, alpha: np.ndarray) -> None:
    """dst [h, w, 3] float32 (a view) = dst x (1 - a) + clip(warped, 0, 1) x a in place, a = alpha [h, w] 0..1;
    warped [h, w, 3] float32 is used as scratch. Where a is 0 this is dst x 1 + finite x 0 = dst, bit for bit.

    alpha is spread to three channels once (cv2.cvtColor): numpy multiplying [h, w, 3] by a broadcast [h, w, 1] runs a
    slow strided loop, and took ~3.5 ms of a 720p face's paste; the values are the same products and sums."""
    a3 = cv2.cvtColor(alpha, cv2.COLOR_GRAY2RGB)
    np.clip(warped, 0.0, 1.0, out=warped)
    np.multiply(warped, a3, out=warped)
    np.subtract(np.float32(1.0), a3, out=a3)
    np.multiply(dst, a3, out=dst)
    dst += warped


def paste_into_u8(frame: np.ndarray, faces: tuple[Face, ...], strength: float = 1.0) -> None:
    """paste_into for a uint8 frame [H, W, 3] (a view is fine: it is changed in place) and uint8 crops [S, S, 3]: the
    video pass's paste-back (plain alpha compositing; color transfer and Poisson blending take the float path).

    Why: a video frame is uint8 on both sides of paste-back; the float path converted the faces' footprint to float
    and back and warped float crops, ~60 % of a 720p face's paste. Here the cubic warp is OpenCV's uint8 one and the
    blend is one cv2.blendLinear ((dst x (1 - a) + warped x a) / (1 + 1e-5), rounded): within 2 of the float path's
    value where a > 0 (the crop's rounding to uint8 and the warp's own rounding), and exactly dst where a is 0 (a
    pixel's 1e-5 share is below half a step)."""
    for face in faces:
        _paste_one_u8(frame, face, strength)


def _paste_one_u8(frame: np.ndarray, face: Face, strength: float) -> None:
    placed = _placement(face, frame.shape[0], frame.shape[1])
    if placed is None:
        return
    (x0, y0, x1, y1), inv, size = placed
    warped = cv2.warpAffine(
        np.asarray(face.crop, np.uint8), inv, size, flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT101
    )
    alpha = _alpha(face, inv, size, strength)
    dst = frame[y0:y1, x0:x1]
    dst[...] = cv2.blendLinear(dst, warped, np.float32(1.0) - alpha, alpha)


def _seamless(src: np.ndarray, dst: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Poisson-blend src into dst inside alpha > 0.5 (uint8 internally); src unchanged if OpenCV refuses."""
    m = (alpha > 0.5).astype(np.uint8) * 255
    ys, xs = np.nonzero(m)
    if len(xs) < 16 or m.shape[0] < 8 or m.shape[1] < 8:
        return src
    m[[0, -1], :] = 0
    m[:, [0, -1]] = 0
    center = (int((xs.min() + xs.max() + 1) // 2), int((ys.min() + ys.max() + 1) // 2))

    def to8(x: np.ndarray) -> np.ndarray:
        u8: np.ndarray = (np.clip(x, 0, 1) * 255 + 0.5).astype(np.uint8)
        return u8

    try:
        out = cv2.seamlessClone(to8(src), to8(dst), m, center, cv2.NORMAL_CLONE)
    except cv2.error as exc:
        log.warning("seamless blending skipped for one face: %s", exc)
        return src
    return out.astype(np.float32) / 255.0


def paste_frame(frame: np.ndarray, faces: tuple[Face, ...], opts: BlendOptions = BlendOptions()) -> np.ndarray:
    """Paste every face with a crop, in order (later faces over earlier ones). frame: [H, W, 3] float32; a new
    frame is returned (frame is not changed)."""
    out: np.ndarray = frame.copy()
    paste_into(out, faces, opts)
    return out


def paste_into(frame: np.ndarray, faces: tuple[Face, ...], opts: BlendOptions = BlendOptions()) -> None:
    """paste_frame in place: frame [H, W, 3] float32 is changed (the video pass's own scratch copy)."""
    for face in faces:
        _paste_one(frame, face, opts)
