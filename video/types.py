"""Typed records shared by the video core: stream facts, decoded frames."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

SCALE_THREADS = 1
"""Threads of PyAV's colour conversions (yuv -> rgb24 when decoding, rgb24 -> yuv420p when encoding). PyAV >= 17
defaults to one per core, and its VideoFrame.reformat makes a new scaler, so new threads, for every frame: on a
2-core machine that cost more than the conversion (720p decode + rgb24 3.1 -> 1.7 ms per frame, the same pixels),
and the video passes run decoding, fusion and encoding in threads of their own already."""


@dataclass(frozen=True)
class VideoInfo:
    """What the container says about its first video stream (sizes after rotation).

    frame_count: from the header; None when the container does not know it (a count of 0 in the header).
    rate: average frame rate (frames/s) or None; time_base: the video stream's pts unit.
    rotation: degrees the decoded frames are turned (counter-clockwise, multiple of 90) to display upright.
    """

    name: str
    width: int
    height: int
    frame_count: int | None
    rate: Fraction | None
    time_base: Fraction
    duration_s: float | None
    rotation: int
    codec: str
    audio_streams: int
    first_frame: str = ""  # digest of the first decoded frame's pixels ("" when it did not decode)
    sar: Fraction | None = None  # sample aspect ratio of the upright frames; None for square or unknown pixels

    @property
    def fps(self) -> float:
        """Frames per second (30.0 when the container gives no rate)."""
        return float(self.rate) if self.rate else 30.0

    @property
    def fingerprint(self) -> str:
        """What tells two videos apart cheaply: size, header frame count, codec, the first frame's pixels. FaceTrack
        stores it in FACE_TRACKS; VideoFaceFusion refuses tracks made from another video."""
        return f"{self.width}x{self.height}/{self.frame_count}/{self.codec}/{self.first_frame}"

    @property
    def frames_expected(self) -> int | None:
        """The header's frame count, else duration x rate (Matroska / WebM headers hold no count): for progress bars
        and preview picks only, never for correctness (the decoded frames are counted)."""
        if self.frame_count:
            return self.frame_count
        if self.duration_s and self.rate:
            return max(1, round(self.duration_s * float(self.rate)))
        return None


@dataclass(frozen=True, eq=False)
class Planes:
    """A decoded frame's own YUV: data [H * 3 / 2, W] uint8 packed yuv420p (PyAV's layout), matrix: the swscale
    colorspace its RGB was made with (video/yuv.py)."""

    data: np.ndarray
    matrix: int


@dataclass(frozen=True, eq=False)
class Frame:
    """One decoded frame: rgb [H, W, 3] uint8 upright, pts in time_base units (None when the stream has none).

    yuv: the decoder's planes when the reader was asked to keep them (video/yuv.py), else None. dirty: set only by
    whoever changed rgb and knows where: the rectangles (x0, y0, x1, y1) where rgb may differ from yuv (() for none);
    None (the default) means "anywhere", and the writer converts the whole frame."""

    index: int
    rgb: np.ndarray
    pts: int | None
    time_base: Fraction
    yuv: Planes | None = None
    dirty: tuple[tuple[int, int, int, int], ...] | None = None

    @property
    def time(self) -> float | None:
        return None if self.pts is None else float(self.pts * self.time_base)
