"""FaceDetect on an IMAGE batch that is a short clip: faces linked across frames and their alignment smoothed.

An IMAGE batch may be video frames (a short clip through the photo nodes) or unrelated photos of one size. Only
consecutive frames that look like one continuous shot are linked: a shot break is declared where the colour
histogram jumps (scenes.CutDetector, the video path's cut test) or where a 32 px grey thumbnail changes by more than
`max_thumb_change` on average. On the test material consecutive video frames change by at most 0.06 (carphone 0.02,
the WebP heads 0.03-0.06, every 4th carphone frame 0.05) and unrelated photos by at least 0.16, so unrelated photos
are never linked: each becomes a shot of one frame and keeps the photo path's per-frame result.

Inside a shot the video path's cores do the work: tracks linked by box overlap (and identity when the backend gives
embeddings, video/tracks.py), gaps filled, FaceDetect's selection applied per track (the same people are kept in
every frame, in the same order), and each track's alignment smoothed with the zero-phase Gaussian of video/smooth.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from ..faces.align import transform_points
from ..faces.analyse import AlignOptions, FaceFinder
from ..faces.masks import crop_mask
from ..faces.select import Selection
from ..faces.types import Face
from .scenes import CutDetector
from .smooth import jitter, raw_affines, scale_affine, smooth_track
from .tracks import FaceObs, LinkOptions, Track, link_tracks, make_detect, selection_order


@dataclass(frozen=True)
class BatchLinkOptions:
    """sigma_frames: zero-phase smoothing of each track's alignment, in frames (0 = linked but not smoothed);
    max_thumb_change: mean absolute change (0..1) of a 32 px grey thumbnail above which frames are different shots;
    cut_threshold: colour-histogram cut threshold (scenes.CutDetector); link: track linking (min_hits 1: a face the
    photo path would keep is never dropped for being seen in few frames)."""

    sigma_frames: float = 2.0
    max_thumb_change: float = 0.1
    cut_threshold: float = 0.45
    link: LinkOptions = LinkOptions(min_hits=1)


@dataclass(frozen=True)
class BatchLinkReport:
    """shots: (start, length) of each shot; tracks: faces followed; filled: faces added in frames where the
    detector missed a tracked face; raw_jitter / smooth_jitter: mean crop-centre second difference (px/frame^2)
    over tracks of >= 3 frames, at the 512 alignment."""

    shots: tuple[tuple[int, int], ...]
    tracks: int
    filled: int
    raw_jitter: float
    smooth_jitter: float

    @property
    def linked_frames(self) -> int:
        return sum(n for _, n in self.shots if n > 1)

    def summary(self) -> str:
        multi = [s for s in self.shots if s[1] > 1]
        if not multi:
            return f"{len(self.shots)} unrelated frame(s): not linked"
        return (
            f"{self.linked_frames} frame(s) linked in {len(multi)} shot(s) ({len(self.shots) - len(multi)} frame(s) "
            f"on their own), {self.tracks} track(s), {self.filled} gap(s) filled, crop jitter "
            f"{self.raw_jitter:.2f} -> {self.smooth_jitter:.2f} px/frame^2"
        )


def _thumb(rgb: np.ndarray) -> np.ndarray:
    grey = cv2.cvtColor(np.ascontiguousarray(rgb[..., :3]), cv2.COLOR_RGB2GRAY)
    return cv2.resize(grey, (32, 32), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0


def shot_starts(frames: Sequence[np.ndarray], opts: BatchLinkOptions = BatchLinkOptions()) -> list[int]:
    """frames: [H, W, 3] uint8 in batch order -> the frames (> 0) that start a new shot (see module doc)."""
    cutter = CutDetector(opts.cut_threshold)
    starts = []
    prev: np.ndarray | None = None
    for i, rgb in enumerate(frames):
        cut = cutter.update(rgb)
        thumb = _thumb(rgb)
        if prev is not None and (cut or float(np.abs(thumb - prev).mean()) > opts.max_thumb_change):
            starts.append(i)
        prev = thumb
    return starts


def _shots(starts: list[int], n: int) -> tuple[tuple[int, int], ...]:
    bounds = [0, *starts, n]
    return tuple((a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True))


def link_batch(
    per_frame: Sequence[Sequence[FaceObs]],
    starts: list[int],
    sel: Selection,
    align: AlignOptions,
    opts: BatchLinkOptions = BatchLinkOptions(),
) -> tuple[tuple[tuple[Face, ...], ...], BatchLinkReport]:
    """Detections of each frame (all of them, before selection) -> the selected faces of each frame.

    starts: shot starts from shot_starts (no track crosses one). Within a frame the faces keep their track's rank
    in sel.order, so index k is the same person in every frame of a shot. align: the crop size, crop factor and mask
    feather of the faces (FaceFinder.align). Returns (faces per frame, report).
    """
    crop_size, crop_factor, feather = align.crop_size, align.crop_factor, align.feather
    n = len(per_frame)
    tracks = link_tracks(per_frame, starts, opts.link)
    kept = selection_order(tracks, sel)
    smoothed = [smooth_track(tr, opts.sigma_frames, crop_factor) for tr in kept]
    people = list(dict.fromkeys(tr.who for tr in smoothed))  # in FaceDetect's order (the indices' order)
    rank = {tr.id: people.index(tr.who) for tr in smoothed}  # a person's pieces share its place in every frame
    frames: list[list[tuple[int, Face]]] = [[] for _ in range(n)]
    filled = 0
    for tr in smoothed:
        for k in range(tr.length):
            frames[tr.start + k].append((rank[tr.id], _face(tr, k, crop_size, feather)))
            filled += int(not tr.detected[k])
    long = [tr for tr in smoothed if tr.length >= 3 and tr.affines is not None]
    report = BatchLinkReport(
        shots=_shots(starts, n),
        tracks=len(smoothed),
        filled=filled,
        raw_jitter=float(np.mean([jitter(raw_affines(tr.landmarks, crop_factor=crop_factor)) for tr in long]))
        if long
        else 0.0,
        smooth_jitter=float(np.mean([jitter(tr.affines) for tr in long if tr.affines is not None])) if long else 0.0,
    )
    return tuple(tuple(f for _, f in sorted(fr, key=lambda rf: rf[0])) for fr in frames), report


def _face(tr: Track, k: int, crop_size: int, feather: float) -> Face:
    """Frame k of a smoothed track as a Face: its smoothed alignment at crop_size, the frame's own landmarks and box
    (interpolated where the detector missed it: score 0), the track's mean identity."""
    assert tr.affines is not None
    affine = scale_affine(tr.affines[k], crop_size)
    lm = tr.landmarks[k]
    box = tr.bboxes[k]
    return Face(
        bbox=(float(box[0]), float(box[1]), float(box[2]), float(box[3])),
        score=float(tr.scores[k]),
        landmarks=lm.astype(np.float32),
        affine=affine,
        inverse=cv2.invertAffineTransform(affine),
        crop_size=crop_size,
        mask=crop_mask(transform_points(lm, affine), crop_size, feather),
        embedding=None if tr.embedding is None else tr.embedding.astype(np.float32),
    )


def detect_linked(
    frames: np.ndarray,
    starts: list[int],
    finder: FaceFinder,
    opts: BatchLinkOptions = BatchLinkOptions(),
    on_frame: Callable[[], None] | None = None,
) -> tuple[tuple[tuple[Face, ...], ...], BatchLinkReport]:
    """frames [B, H, W, 3] uint8 -> (selected faces per frame, report): detect every frame, link within shots.

    starts: shot_starts(frames). finder: the node's detector, embedder, selection and alignment; each frame is
    detected through tracks.make_detect over them (score threshold applied there, embeddings when the backend has
    them).
    """
    sel = finder.sel
    detect = make_detect(finder.detector, finder.detect_size, sel.score_threshold, finder.embedder)
    per_frame = []
    for rgb in frames:
        per_frame.append(detect(rgb))
        if on_frame is not None:
            on_frame()
    return link_batch(per_frame, starts, sel, finder.align, opts)
