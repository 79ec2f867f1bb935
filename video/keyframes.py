"""Which frames of a track are diffused (key frames); the others take the refined change by optical flow.

A track's key frames: its first and last frame (a track starts at a scene cut or where a face appears, so cuts
are key frames), one every 1 / keyframes_per_second seconds, and any frame whose pose or expression moved far
from the last key frame's. Pose/expression is measured on the landmarks in the smoothed aligned crop: the
similarity alignment removes position, size and in-plane rotation, so what remains is head turn, nod and
mouth/eye motion.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .smooth import ALIGN_SIZE
from .tracks import Track

REASON_NONE, REASON_ENDS, REASON_INTERVAL, REASON_POSE = 0, 1, 2, 3


@dataclass(frozen=True)
class KeyframeOptions:
    """per_second: key frames per second (2 default; <= 0: every frame is diffused, the per-frame mode);
    pose_threshold: mean landmark motion in the aligned crop, as a fraction of the crop side, since the last key
    frame that forces a new one (0.04 ~ a head turn of ~15 degrees or an opened mouth; 0 disables)."""

    per_second: float = 2.0
    pose_threshold: float = 0.04


def crop_landmarks(track: Track) -> np.ndarray:
    """[T, 5, 2] landmarks in the smoothed 512 aligned crop, divided by the crop side."""
    if track.affines is None:
        raise ValueError("track has no smoothed transforms: run smooth.smooth_track first")
    a = track.affines
    pts = np.einsum("tij,tkj->tki", a[:, :, :2], track.landmarks.astype(np.float64)) + a[:, None, :, 2]
    return np.asarray(pts / ALIGN_SIZE)


def choose_keyframes(
    track: Track, fps: float, opts: KeyframeOptions = KeyframeOptions(), max_step: int = 0
) -> np.ndarray:
    """Reasons per track frame, [T] int8: REASON_NONE (propagated) or why the frame is a key frame.

    max_step > 0: key frames at most that many frames apart, whatever per_second asks. The frames between two key
    frames wait in memory for the later one (their change is interpolated from both), so the fuse pass passes its
    frame budget (FuseOptions.max_buffer_frames): a low rate on a long or high-frame-rate clip cannot hold seconds of
    4K frames.
    """
    n = track.length
    reasons = np.zeros(n, np.int8)
    if n == 0:
        return reasons
    if opts.per_second <= 0:
        reasons[:] = REASON_INTERVAL
        return reasons
    reasons[0] = reasons[-1] = REASON_ENDS
    step = max(1, int(round(fps / opts.per_second)))
    step = min(step, max_step) if max_step > 0 else step
    lm = crop_landmarks(track) if opts.pose_threshold > 0 else None
    last = 0
    for t in range(1, n - 1):
        if t - last >= step:
            reasons[t] = REASON_INTERVAL
        elif lm is not None and float(np.linalg.norm(lm[t] - lm[last], axis=1).mean()) > opts.pose_threshold:
            reasons[t] = REASON_POSE
        if reasons[t]:
            last = t
    return reasons
