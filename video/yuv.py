"""Keep the decoder's YUV outside the faces: a fused frame differs from its input only where faces were pasted,
so only those rectangles go through RGB -> YUV again; every other pixel is written as the decoder gave it.

Why: converting a whole 720p frame from RGB to yuv420p cost ~4-6 ms of the encoder thread's time per frame, more
than paste-back, and the round trip YUV -> RGB -> YUV moved the untouched pixels by up to a few levels (mean 0.4
with the source's own matrix, 3.4 with another one). Kept planes are exact.

When it applies (`source_colour`, `frame_planes`): 8-bit 4:2:0 (yuv420p), limited or unspecified range, even
size, not rotated, and a matrix the decode used that swscale can invert the same way: BT.709 (tagged) or BT.601
(tagged, or untagged, which the decoder converts with BT.601). The output then keeps that matrix and says so
(untagged input is written as BT.601 with that tag: players show what the pack saw). Anything else keeps the old
path: whole frames converted with BT.709 (video/encode.py).

A converted rectangle is bit-identical to the same pixels of a whole-frame conversion: it is aligned to even
coordinates (whole 2x2 chroma blocks) and converted with MARGIN more pixels around it, which swscale's vertical
chroma filter reads (measured: a 2 px margin matched a whole-frame conversion on every plane, none did not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .types import SCALE_THREADS, Planes

BT709_MATRIX, BT601_MATRIX = 1, 5  # swscale colorspaces (SWS_CS_ITU709, SWS_CS_ITU601)
LIMITED = 1  # AVCOL_RANGE_MPEG
MARGIN = 4
_MATRIX_OF_TAG = {1: BT709_MATRIX, 2: BT601_MATRIX, 5: BT601_MATRIX, 6: BT601_MATRIX}
"""AVColorSpace of a decoded frame -> the swscale matrix its RGB was made with (PyAV hands the tag to swscale:
unspecified (2) and BT.470BG / SMPTE 170M (5, 6) all select BT.601's coefficients)."""

Rect = tuple[int, int, int, int]


@dataclass(frozen=True)
class Colour:
    """How a writer turns RGB into YUV and what its stream says: matrix (swscale colorspace, BT709_MATRIX or
    BT601_MATRIX), tags (AVColorSpace, AVColorRange, primaries, transfer) of the output stream."""

    matrix: int
    tags: tuple[int, int, int, int]


BT709_OUT = Colour(BT709_MATRIX, (1, LIMITED, 1, 1))
"""What every output used before planes were kept, and still uses for inputs they cannot be kept for."""


def source_colour(codec_context: Any) -> Colour | None:
    """The Colour that keeps an input's YUV (see module doc), from its video stream's codec context; None when its
    planes cannot be kept (the writer then converts whole frames with BT709_OUT). Rotation is a frame's matter
    (frame_planes): a rotated input's frames are converted whole, with this Colour's matrix, which stays right."""
    cc = codec_context
    matrix = _MATRIX_OF_TAG.get(int(cc.colorspace or 2))
    if cc.pix_fmt != "yuv420p" or int(cc.color_range or 0) not in (0, LIMITED) or matrix is None:
        return None
    if cc.width % 2 or cc.height % 2:
        return None
    if matrix == BT709_MATRIX:
        return BT709_OUT
    return Colour(BT601_MATRIX, (6, LIMITED, int(cc.color_primaries or 2), int(cc.color_trc or 2)))


def frame_planes(vf: Any, colour: Colour) -> Planes | None:
    """A decoded av.VideoFrame's planes (a copy) when they can be written as they are under `colour`: the frame's
    own format, matrix, range, size parity and rotation match (a stream may change mid-way); else None."""
    if vf.format.name != "yuv420p" or vf.width % 2 or vf.height % 2 or getattr(vf, "rotation", 0):
        return None
    if int(vf.color_range or 0) not in (0, LIMITED) or _MATRIX_OF_TAG.get(int(vf.colorspace or 2)) != colour.matrix:
        return None
    return Planes(vf.to_ndarray(), colour.matrix)


def planes_of(data: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Views (Y [h, w], U [h/2, w/2], V [h/2, w/2]) of packed yuv420p [h * 3 / 2, w] (PyAV's layout: the planes one
    after another, so U and V need not start on a row)."""
    flat = data.reshape(-1)
    q = (h // 2) * (w // 2)
    return (
        flat[: h * w].reshape(h, w),
        flat[h * w : h * w + q].reshape(h // 2, w // 2),
        flat[h * w + q :].reshape(h // 2, w // 2),
    )


def even_rect(rect: Rect, w: int, h: int) -> Rect:
    """(x0, y0, x1, y1) grown to even coordinates (whole chroma blocks; w and h even) and clipped to the frame."""
    x0, y0, x1, y1 = rect
    return max(x0 - x0 % 2, 0), max(y0 - y0 % 2, 0), min(x1 + x1 % 2, w), min(y1 + y1 % 2, h)


def convert_into(planes: np.ndarray, rgb: np.ndarray, rects: tuple[Rect, ...], matrix: int) -> None:
    """Write the YUV of rgb [H, W, 3] uint8 inside each rect into packed yuv420p planes [H * 3 / 2, W] in place:
    the same values a whole-frame conversion with `matrix` (limited range) gives there (see module doc)."""
    import av

    h, w = rgb.shape[:2]
    dst = planes_of(planes, h, w)
    for rect in rects:
        x0, y0, x1, y1 = even_rect(rect, w, h)
        if x1 <= x0 or y1 <= y0:
            continue
        a0, b0, a1, b1 = max(x0 - MARGIN, 0), max(y0 - MARGIN, 0), min(x1 + MARGIN, w), min(y1 + MARGIN, h)
        part = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb[b0:b1, a0:a1]), format="rgb24").reformat(
            format="yuv420p", dst_colorspace=matrix, dst_color_range=LIMITED, threads=SCALE_THREADS
        )
        src = planes_of(part.to_ndarray(), b1 - b0, a1 - a0)
        for k, (d, s) in enumerate(zip(dst, src, strict=True)):
            f = 1 if k == 0 else 2  # Y at full resolution, U and V at half
            rows, cols = slice((y0 - b0) // f, (y1 - b0) // f), slice((x0 - a0) // f, (x1 - a0) // f)
            d[y0 // f : y1 // f, x0 // f : x1 // f] = s[rows, cols]


def merged_rects(rects: list[Rect]) -> tuple[Rect, ...]:
    """The dirty rectangles (x0, y0, x1, y1) for convert_into: two become their bounding rectangle whenever it is no
    larger than the two together (overlapping rectangles are converted twice otherwise: the same values, twice the
    work there); other rectangles stay apart (one rectangle around faces far apart converts the frame between them)."""
    out: list[Rect] = []
    for rect in rects:
        i = 0
        while i < len(out):
            other = out[i]
            box = (min(rect[0], other[0]), min(rect[1], other[1]), max(rect[2], other[2]), max(rect[3], other[3]))
            if _area(box) <= _area(rect) + _area(other):
                rect = box
                del out[i]
                i = 0
            else:
                i += 1
        out.append(rect)
    return tuple(out)


def _area(r: Rect) -> int:
    return max(r[2] - r[0], 0) * max(r[3] - r[1], 0)
