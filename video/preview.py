"""Preview of face tracks: a few frames with each track's smoothed crop square, landmarks and number drawn."""

from __future__ import annotations

import cv2
import numpy as np

from .smooth import ALIGN_SIZE, invert
from .track_pass import FaceTracks

_COLOURS = [(0, 255, 0), (255, 128, 0), (0, 160, 255), (255, 0, 200), (255, 255, 0), (0, 255, 255)]


def preview_indices(frame_count: int, count: int = 6) -> list[int]:
    """Evenly spaced frame indices to show (all frames when there are fewer)."""
    if frame_count <= 0:
        return []
    return sorted({int(round(i)) for i in np.linspace(0, frame_count - 1, min(count, frame_count))})


def draw_tracks(rgb: np.ndarray, tracks: FaceTracks, frame: int) -> np.ndarray:
    """rgb [H, W, 3] uint8 -> a copy with the tracks covering `frame` drawn (crop square, landmarks, number)."""
    out = np.ascontiguousarray(rgb).copy()
    thick = max(1, round(max(out.shape[:2]) / 400))
    for i in tracks.tracks_at(frame):
        tr = tracks.tracks[i]
        p = frame - tr.start
        colour = _COLOURS[i % len(_COLOURS)]
        if tr.affines is not None:
            inv = invert(tr.affines[p : p + 1])[0]
            corners = np.array([[0, 0], [ALIGN_SIZE, 0], [ALIGN_SIZE, ALIGN_SIZE], [0, ALIGN_SIZE]], np.float64)
            pts = corners @ inv[:, :2].T + inv[:, 2]
            cv2.polylines(out, [np.round(pts).astype(np.int32)], True, colour, thick, cv2.LINE_AA)
            cv2.putText(
                out, str(i), tuple(int(v) for v in pts[0]), cv2.FONT_HERSHEY_SIMPLEX, 0.4 * thick, colour, thick
            )
        for x, y in tr.landmarks[p]:
            cv2.circle(out, (int(round(x)), int(round(y))), thick + 1, colour, -1, cv2.LINE_AA)
    return np.asarray(out)


def fit_width(rgb: np.ndarray, width: int = 512) -> np.ndarray:
    """Shrink to at most `width` px wide (previews stay small)."""
    h, w = rgb.shape[:2]
    if w <= width:
        return rgb
    return cv2.resize(rgb, (width, max(1, round(h * width / w))), interpolation=cv2.INTER_AREA)
