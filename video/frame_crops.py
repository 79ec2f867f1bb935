"""The aligned face crops of a frame, made in the decoding thread one frame ahead of the fusion pass.

Each crop only needs the frame and the tracks of pass 1 (fixed before pass 2 starts), so pass 2's decoding thread
(video/pipe.py Prefetch) cuts them while the fusion thread propagates the previous frames: the cubic warp of a
720p frame into a 512 crop and its grey flow image cost ~4 ms per face and frame that would otherwise sit on the
pass's critical path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..faces.align import warp_face
from .clock import NULL_CLOCK, StageClock
from .flow import grey
from .smooth import scale_affine
from .track_pass import FaceTracks
from .types import Frame


@dataclass(frozen=True, eq=False)
class FaceCrop:
    """Track j's face in one frame: affine [2, 3] frame -> crop at crop size, crop [S, S, 3] uint8 and its grey
    image at the flow's work size [w, w] uint8."""

    affine: np.ndarray
    crop: np.ndarray
    grey: np.ndarray


def face_crop(frame: Frame, affine_512: np.ndarray, crop_size: int, work_size: int) -> FaceCrop:
    """One face's crop of frame, from its track's smoothed image -> 512 crop transform."""
    affine = scale_affine(affine_512, crop_size)
    crop = warp_face(frame.rgb, affine, crop_size)
    return FaceCrop(affine, crop, grey(crop, work_size))


def frame_crops(tracks: FaceTracks, frame: Frame, crop_size: int, work_size: int) -> dict[int, FaceCrop]:
    """The crop of every track covering the frame, by track index."""
    out = {}
    for j, tr in enumerate(tracks.tracks):
        if tr.covers(frame.index):
            assert tr.affines is not None
            out[j] = face_crop(frame, tr.affines[frame.index - tr.start], crop_size, work_size)
    return out


def with_crops(
    items: Iterable[tuple[Frame | None, list[Any]]],
    tracks: FaceTracks,
    sizes: tuple[int, int],
    clock: StageClock = NULL_CLOCK,
) -> Iterator[tuple[Frame | None, list[Any], dict[int, FaceCrop]]]:
    """frames_and_audio's (frame, audio packets) with each frame's crops added (sizes: crop size, flow work size);
    timed as stage "crop" of clock."""
    crop_size, work_size = sizes
    for frame, audio in items:
        crops: dict[int, FaceCrop] = {}
        if frame is not None:
            with clock.stage("crop"):
                crops = frame_crops(tracks, frame, crop_size, work_size)
        yield frame, audio, crops
