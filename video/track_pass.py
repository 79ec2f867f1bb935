"""Pass 1 over a video: detect faces on every frame (reduced size), find scene cuts, link and select tracks,
smooth each track's alignment. Streams the input; keeps only detections (a few floats per face and frame)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..faces.detect import DetectInput
from ..faces.select import Selection
from .clock import NULL_CLOCK, StageClock
from .decode import Source, VideoReader, probe
from .pipe import Prefetch
from .scenes import CutDetector, thumbnail_hist
from .smooth import jitter, raw_affines, smooth_track
from .tracks import DetectFn, FaceObs, FrameDetect, LinkOptions, Track, link_tracks, select_tracks
from .types import Frame

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
"""progress(done, total): called once per chunk of frames; total is 0 when unknown. Raising in it cancels the run
(ComfyUI's ProgressBar.update raises on user interrupt)."""


@dataclass(frozen=True)
class TrackOptions:
    """smooth_seconds: sigma of the zero-phase smoothing of each track's alignment (0 = raw landmarks);
    cut_threshold: scene-cut histogram distance (see scenes.CutDetector); crop_factor: > 1 zooms the aligned crop
    out (more context); selection: which tracks are kept (FaceDetect's vocabulary, applied per scene)."""

    smooth_seconds: float = 0.1
    cut_threshold: float = 0.45
    crop_factor: float = 1.0
    link: LinkOptions = LinkOptions()
    selection: Selection = Selection()


@dataclass(frozen=True, eq=False)
class FaceTracks:
    """The result of pass 1 (the FACE_TRACKS value): the video's frame facts, scene cuts and the selected,
    smoothed tracks. raw_jitter / smooth_jitter: mean crop-centre second difference over the tracks (px/frame^2)."""

    name: str
    width: int
    height: int
    frame_count: int
    fps: float
    cuts: tuple[int, ...]
    tracks: tuple[Track, ...]
    crop_factor: float = 1.0
    detections: int = 0
    raw_jitter: float = 0.0
    smooth_jitter: float = 0.0
    seconds: float = field(default=0.0, compare=False)
    source: str = ""  # VideoInfo.fingerprint of the tracked video ("" for tracks made in code)

    def tracks_at(self, frame: int) -> list[int]:
        """Indices of the tracks covering a frame."""
        return [i for i, tr in enumerate(self.tracks) if tr.covers(frame)]


@dataclass(frozen=True)
class TrackHooks:
    """Who watches pass 1 as it streams: progress(frames read, total) every chunk_frames frames and once at the
    end (total 0 when the container announces none); on_frame sees every decoded frame (e.g. to keep a few for a
    preview) and must not keep them all."""

    progress: Progress | None = None
    chunk_frames: int = 32
    on_frame: Callable[[Frame], None] | None = None


def _prepared(
    reader: VideoReader, detect: DetectFn, clock: StageClock
) -> Iterator[tuple[Frame, np.ndarray, DetectInput | None]]:
    """Each frame with its scene-cut histogram and (for a FrameDetect) its detector input: the per-frame work
    that needs nothing but the frame, done here in the decoding thread (Prefetch), one frame ahead of the detector
    (the INTER_AREA scaling of a 720p frame alone costs ~3 ms)."""
    prepare = detect.prepare if isinstance(detect, FrameDetect) else None
    for frame in clock.timed(reader, "decode"):
        with clock.stage("detect"):
            hist, prepared = thumbnail_hist(frame.rgb), prepare(frame.rgb) if prepare is not None else None
        yield frame, hist, prepared


DETECT_WORKERS = 2
"""Frames detected at once in pass 1. The detectors are stateless ONNX sessions (YuNet takes a lock): two frames in
flight keep both cores of a small machine busy where one run at a time left gaps between the detector's many small
operators (720p, 2 cores: pass 1 ~10 -> ~8 ms per frame); the tracks are the same (results are taken in order).
Only make_detect's FrameDetect runs this way: any other detect function runs one frame at a time (it need not be
thread-safe)."""


def _in_flight(
    frames: Iterator[tuple[Frame, np.ndarray, DetectInput | None]],
    pool: ThreadPoolExecutor,
    detected: Callable[[np.ndarray, DetectInput | None], list[FaceObs]],
    ahead: int,
) -> Iterator[tuple[Frame, np.ndarray, Future[list[FaceObs]]]]:
    """(frame, scene-cut histogram, its detections' future) in frame order, with up to `ahead` frames submitted
    ahead of the one yielded."""
    waiting: deque[tuple[Frame, np.ndarray, Future[list[FaceObs]]]] = deque()
    for frame, hist, prepared in frames:
        waiting.append((frame, hist, pool.submit(detected, frame.rgb, prepared)))
        if len(waiting) >= ahead:
            yield waiting.popleft()
    while waiting:
        yield waiting.popleft()


def track_video(
    source: Source,
    detect: DetectFn,
    opts: TrackOptions = TrackOptions(),
    hooks: TrackHooks = TrackHooks(),
    *,
    clock: StageClock = NULL_CLOCK,
) -> FaceTracks:
    """Stream a video once and return its face tracks (see module doc).

    hooks: the progress callback (and its step) and the per-frame callback (TrackHooks).
    clock: gets the time of "decode" and of "detect" (detection, scene cuts, linking and smoothing).
    """
    progress, chunk_frames, on_frame = hooks.progress, hooks.chunk_frames, hooks.on_frame
    t0 = time.perf_counter()
    info = probe(source)
    total = info.frames_expected or 0
    cutter = CutDetector(opts.cut_threshold)
    per_frame: list[list[FaceObs]] = []
    cuts: list[int] = []
    run = detect.run if isinstance(detect, FrameDetect) else lambda rgb, _prepared: detect(rgb)
    workers = DETECT_WORKERS if isinstance(detect, FrameDetect) else 1

    def detected(rgb: np.ndarray, prepared: DetectInput | None) -> list[FaceObs]:
        with clock.stage("detect"):
            return run(rgb, prepared)

    with (
        VideoReader(source) as reader,
        Prefetch(_prepared(reader, detect, clock), clock=NULL_CLOCK) as frames,
        ThreadPoolExecutor(workers, thread_name_prefix="tokenfuse-detect") as pool,
    ):
        for frame, hist, found in _in_flight(frames, pool, detected, workers):
            with clock.stage("detect"):
                if cutter.update_hist(hist):
                    cuts.append(frame.index)
            per_frame.append(found.result())
            if on_frame is not None:
                on_frame(frame)
            if progress is not None and (frame.index + 1) % chunk_frames == 0:
                progress(frame.index + 1, max(total, frame.index + 1) if total else 0)  # total may be estimated
    n = len(per_frame)
    if progress is not None:
        progress(n, n)
    with clock.stage("detect"):
        linked = link_tracks(per_frame, cuts, opts.link)
        chosen = select_tracks(linked, opts.selection)
        sigma = opts.smooth_seconds * info.fps
        smoothed = tuple(smooth_track(tr, sigma, opts.crop_factor) for tr in chosen)
    raw_j = [jitter(raw_affines(tr.landmarks, crop_factor=opts.crop_factor)) for tr in smoothed]
    smooth_j = [jitter(tr.affines) for tr in smoothed if tr.affines is not None]
    result = FaceTracks(
        name=info.name,
        width=info.width,
        height=info.height,
        frame_count=n,
        fps=info.fps,
        cuts=tuple(cuts),
        tracks=smoothed,
        crop_factor=opts.crop_factor,
        detections=sum(len(d) for d in per_frame),
        raw_jitter=float(np.mean(raw_j)) if raw_j else 0.0,
        smooth_jitter=float(np.mean(smooth_j)) if smooth_j else 0.0,
        seconds=time.perf_counter() - t0,
        source=info.fingerprint,
    )
    log.info(
        "tracked %s: %d frames, %d scene cut(s), %d track(s) kept of %d, crop jitter %.2f -> %.2f px/frame^2 (%.1f s)",
        info.name,
        n,
        len(cuts),
        len(smoothed),
        len(linked),
        result.raw_jitter,
        result.smooth_jitter,
        result.seconds,
    )
    return result
