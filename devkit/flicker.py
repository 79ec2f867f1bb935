"""Added flicker of a fused video, per frame transition: bench/video.py's metric (the face region's frame-to-frame
change after motion compensation, output / input; 1.0 = no flicker added), split so it can be attributed.

Per transition t-1 -> t and track: inside the smoothed aligned crop's face mask, DIS flow estimated on the input
crops (t -> t-1) moves frame t-1 onto frame t for both videos; the absolute difference left is summed for the
input (den) and the output (num). Parts: the whole feathered mask, its core (mask > 0.9) and its edge band
(0 < mask <= 0.9, where paste-back blends).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..faces.align import template, warp_face
from ..faces.masks import crop_mask
from ..video.decode import VideoReader
from ..video.flow import grey, sample
from ..video.smooth import scale_affine

_DIS: Any = None


def _flow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Flow [h, w, 2] from grey a to grey b with DIS's medium preset as OpenCV defines it: the metric keeps its own
    instance, so it does not move when the pack's propagation tunes its flow (video/flow.py _dis)."""
    global _DIS
    if _DIS is None:
        _DIS = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM)  # type: ignore[attr-defined]
    return np.asarray(_DIS.calc(a, b, None), np.float32)


def flicker_parts(
    src: Path, out: Path, tracks: Any, size: int = 256, limit: int | None = None
) -> dict[str, np.ndarray]:
    """Arrays [frames] indexed by t (transition t-1 -> t; entry 0 stays 0): num, den (whole mask), num_in, den_in
    (core), num_edge, den_edge (edge band). tracks: FaceTrack's FaceTracks of src; limit: frames measured."""
    mask = crop_mask(template(size, tracks.crop_factor), size)[..., None]
    parts = {"": mask, "_in": mask * (mask > 0.9), "_edge": mask * (mask <= 0.9)}
    n = tracks.frame_count if limit is None else min(limit, tracks.frame_count)
    res = {k + p: np.zeros(n) for k in ("num", "den") for p in parts}
    prev: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    with VideoReader(src) as a, VideoReader(out) as b:
        for fa, fb in zip(a, b, strict=False):
            if fa.index >= n:
                break
            cur = {}
            for j in tracks.tracks_at(fa.index):
                tr = tracks.tracks[j]
                aff = scale_affine(tr.affines[fa.index - tr.start], size)
                ci = warp_face(fa.rgb, aff, size).astype(np.float32)
                co = warp_face(fb.rgb, aff, size).astype(np.float32)
                cur[j] = (ci, co)
                if j in prev:
                    pi, po = prev[j]
                    flow = _flow(grey(ci.astype(np.uint8), size), grey(pi.astype(np.uint8), size))
                    di, do = np.abs(ci - sample(pi, flow)), np.abs(co - sample(po, flow))
                    for suffix, m in parts.items():
                        res["den" + suffix][fa.index] += float((di * m).sum())
                        res["num" + suffix][fa.index] += float((do * m).sum())
            prev = cur
    return res


def added_flicker(parts: dict[str, np.ndarray], frames: list[int] | None = None, suffix: str = "") -> float:
    """Output / input motion-compensated change over the given transitions (all by default)."""
    num, den = parts["num" + suffix], parts["den" + suffix]
    if frames is not None:
        num, den = num[frames], den[frames]
    return float(num.sum() / max(float(den.sum()), 1e-9))
