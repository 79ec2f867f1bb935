"""Pass 2 over a video: refine the key-frame face crops in batches through a pluggable `refine`, carry the
refined change to the other frames by optical flow, paste back and encode, all while streaming.

Frames wait in a small buffer until the key frames on both sides of them (per track) are refined; so the buffer
holds about one key-frame interval (0.5 s at 2 key frames/s) plus one batch, whatever the video's length. Frames
with no tracked face are written untouched (bit-identical before encoding). A video with no tracks at all is
copied packet by packet without re-encoding.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..faces.align import template
from ..faces.masks import crop_mask
from ..faces.paste import BlendOptions, paste_into, paste_into_u8
from ..faces.pixels import to_u8_, unit_float
from ..faces.types import Face
from .clock import NULL_CLOCK, StageClock
from .decode import Source, VideoReader, no_frames_error, probe
from .encode import CopiedStreams, EncodeOptions, FrameFormat, VideoWriter, remux_copy
from .flow import FlowOptions, KeyChange, propagate_crop
from .frame_crops import FaceCrop, face_crop, with_crops
from .keyframes import REASON_NONE, KeyframeOptions, choose_keyframes
from .pipe import Prefetch, WriterThread, frames_and_audio
from .progress import FrameProgress, takes_tick
from .track_pass import FaceTracks, Progress
from .tracks import seed_offsets
from .types import Frame
from .yuv import BT709_OUT, merged_rects

log = logging.getLogger(__name__)

Refine = Callable[..., np.ndarray]
"""refine(crops [N, S, S, 3] float32 0..1, seeds [N]) -> refined crops, same shape. One call = one diffusion run;
the seeds are one per track (the same noise for a whole track). A refine that takes the keyword `tick` (a parameter
of that name or **kwargs) is called with tick=<callable>: call it per sampler step, so the run's progress moves
while the batch diffuses (video/progress.py); it may raise to cancel."""


@dataclass(frozen=True)
class FuseOptions:
    """crop_size: aligned crop side given to refine; faces_per_batch: crops per refine call (they may come from
    different frames); seed: track i gets seed + i (a person's later tracks get their first track's: seed_offsets);
    max_buffer_frames: frames held before a partial batch is forced and the longest gap between a track's key frames
    (the memory bound: frames wait for their next key frame);
    chunk_frames: no longer read (the fusion pass reports every frame written, video/progress.py); kept so code that
    sets it still runs; feather: mask edge as a crop fraction."""

    crop_size: int = 512
    faces_per_batch: int = 2
    seed: int = 0
    keyframes: KeyframeOptions = KeyframeOptions()
    flow: FlowOptions = FlowOptions()
    blend: BlendOptions = BlendOptions()
    encode: EncodeOptions = EncodeOptions()
    feather: float = 0.08
    max_buffer_frames: int = 48
    chunk_frames: int = 16


@dataclass(frozen=True)
class FuseJob:
    """What one fusion pass fuses and with what: pass 1's face tracks, the refine (one diffusion run per call),
    the fusion options, and progress(frames written, total), called for every frame written and every `tick`
    (None: no reports; see fuse_video)."""

    tracks: FaceTracks
    refine: Refine
    opts: FuseOptions = FuseOptions()
    progress: Progress | None = None


@dataclass
class VideoStats:
    """What a run did: frames written, face crops (one per track and frame), key frames chosen, frames diffused
    because their flow failed, refine calls (diffusion runs) and crops refined, audio packets copied.
    announced_frames: set when the input was truncated (its header announced more frames than decoded)."""

    frames: int = 0
    faces: int = 0
    key_frames: int = 0
    flow_failures: int = 0
    diffusion_runs: int = 0
    crops_refined: int = 0
    audio_packets: int = 0
    copied: bool = False
    seconds: float = 0.0
    max_buffered: int = 0
    output: str = ""
    announced_frames: int | None = None

    def counts(self) -> dict[str, int]:
        """The counters a report row carries (the runner's per-item rows, the service's video answer)."""
        return {
            "frames": self.frames,
            "faces": self.faces,
            "key_frames": self.key_frames,
            "flow_failures": self.flow_failures,
            "diffusion_runs": self.diffusion_runs,
            "crops_refined": self.crops_refined,
            "audio_packets": self.audio_packets,
        }

    def summary(self) -> str:
        cut = (
            f"; WARNING: input truncated, {self.frames} of {self.announced_frames} announced frames decoded and written"
            if self.announced_frames
            else ""
        )
        if self.copied:
            return f"{self.frames} frames copied without re-encoding (no face tracks) in {self.seconds:.1f} s{cut}"
        per = self.seconds / max(self.frames, 1)
        return (
            f"{self.frames} frames, {self.faces} face crops: {self.key_frames} key frames + {self.flow_failures} flow "
            f"failures diffused in {self.diffusion_runs} runs ({self.crops_refined} crops), "
            f"{self.faces - self.crops_refined} propagated; {self.seconds:.1f} s ({per:.3f} s/frame){cut}"
        )


@dataclass(eq=False)
class _Item:
    """One face of one buffered frame: track j at frame t, its aligned crop [S, S, 3] uint8 and, once known,
    the crop to paste back, refined or propagated [S, S, 3] uint8."""

    j: int
    t: int
    affine: np.ndarray
    crop: np.ndarray
    key: bool
    grey: np.ndarray  # the crop at the flow's work size [w, w] uint8
    fused: np.ndarray | None = None
    own: bool = False  # flow failed: diffused itself
    queued: bool = False


@dataclass(eq=False)
class _Pending:
    """A buffered frame. context: outside the fused window (video/chunks.py), held only for its key-frame
    crops, never written."""

    frame: Frame
    items: list[_Item] = field(default_factory=list)
    context: bool = False


class _Fuser:
    """window: write only frames [window.start, window.stop) of the whole-video tracks (a chunk, see
    video/chunks.py); frames outside it are fed only when they hold a key frame the window's frames propagate
    from, and are refined but never written. None: every frame fed is written."""

    def __init__(
        self,
        job: FuseJob,
        writer: WriterThread,
        window: range | None = None,
        clock: StageClock = NULL_CLOCK,
    ) -> None:
        tracks, refine, opts = job.tracks, job.refine, job.opts
        self.ft, self.refine, self.opts, self.writer, self.window = tracks, refine, opts, writer, window
        self.clock = clock
        self.progress = FrameProgress(job.progress, tracks.frame_count if window is None else len(window))
        self._refine_kw = {"tick": self.progress.tick} if takes_tick(refine) else {}
        self._read = 0
        s = opts.crop_size
        self.mask = crop_mask(template(s, tracks.crop_factor), s, opts.feather)
        self.support = _support_corners(self.mask)
        self.reasons = [
            choose_keyframes(tr, tracks.fps, opts.keyframes, opts.max_buffer_frames) for tr in tracks.tracks
        ]
        self.key_frames = [tr.start + np.flatnonzero(r) for tr, r in zip(tracks.tracks, self.reasons, strict=True)]
        self.done: list[dict[int, KeyChange]] = [{} for _ in tracks.tracks]
        self.seed_of = seed_offsets(tracks.tracks)
        self.buffer: deque[_Pending] = deque()
        self.queue: list[_Item] = []
        inside = [k if window is None else k[(k >= window.start) & (k < window.stop)] for k in self.key_frames]
        self.stats = VideoStats(key_frames=int(sum(len(k) for k in inside)))

    # ---------------------------------------------------------------------------------------------- reading
    def add(self, frame: Frame, crops: dict[int, FaceCrop] | None = None) -> None:
        """Buffer a frame. crops: its faces' crops made ahead (video/frame_crops.py with_crops); None: made here."""
        pending = _Pending(frame, context=self.window is not None and frame.index not in self.window)
        if not pending.context:
            self._read += 1
            self.progress.read(self._read)
        for j, tr in enumerate(self.ft.tracks):
            if not tr.covers(frame.index):
                continue
            p = frame.index - tr.start
            key = bool(self.reasons[j][p] != REASON_NONE)
            if pending.context and not key:
                continue
            assert tr.affines is not None
            made = crops.get(j) if crops is not None else None
            if made is None:
                with self.clock.stage("crop"):
                    made = face_crop(frame, tr.affines[p], self.opts.crop_size, self.opts.flow.work_size)
            item = _Item(j, frame.index, made.affine, made.crop, key=key, grey=made.grey)
            pending.items.append(item)
            if item.key:
                self._enqueue(item)
        if pending.context and not pending.items:
            return  # outside the window and no key frame there: not needed
        self.buffer.append(pending)
        self.stats.max_buffered = max(self.stats.max_buffered, len(self.buffer))
        if len(self.queue) >= self.opts.faces_per_batch:
            self._refine_batch()
        self.drain()
        if len(self.buffer) > self.opts.max_buffer_frames and self.queue:
            self.flush()

    def _enqueue(self, item: _Item) -> None:
        item.queued = True
        self.queue.append(item)

    # --------------------------------------------------------------------------------------------- refining
    def _refine_batch(self) -> None:
        batch, self.queue = self.queue[: self.opts.faces_per_batch], self.queue[self.opts.faces_per_batch :]
        crops = np.stack([it.crop for it in batch]).astype(np.float32) / 255.0
        seeds = [(self.opts.seed + self.seed_of[it.j]) % 2**64 for it in batch]  # as fusion.crops.face_seed
        with self.clock.stage("diffusion"):
            out = np.asarray(self.refine(crops, seeds, **self._refine_kw), dtype=np.float32)
        if out.shape != crops.shape:
            raise ValueError(f"refine returned {out.shape} for crops of shape {crops.shape}")
        if not np.isfinite(out).all():
            raise ValueError("refine returned NaN/inf pixels: the model or its settings are broken")
        self.stats.diffusion_runs += 1
        self.stats.crops_refined += len(batch)
        for it, src, ref in zip(batch, crops, np.clip(out, 0.0, 1.0), strict=True):
            change = ref - src
            it.fused = to_u8_(src + change)
            if it.key:
                self.done[it.j][it.t] = KeyChange(it.t, it.grey, change, src)

    def flush(self) -> None:
        """Refine everything queued (a partial last batch included) and write what is ready."""
        while self.queue:
            self._refine_batch()
            self.drain()

    # ----------------------------------------------------------------------------------------- propagating
    def _resolve(self, item: _Item) -> bool:
        """Set item.fused from the neighbouring key frames; False while it must wait (or is queued itself)."""
        if item.key or item.own:
            return False
        keys = self.key_frames[item.j]
        i = int(bisect.bisect_left(keys, item.t))
        k0, k1 = int(keys[i - 1]), int(keys[i])  # a track's first and last frames are key frames
        done = self.done[item.j]
        if k1 not in done:
            return False
        around = [done[k0], done[k1]]
        fused, _ = propagate_crop(item.grey, item.t, around, self.mask, self.opts.flow, item.crop, clock=self.clock)
        if fused is None:
            item.own = True
            self.stats.flow_failures += 1
            self._enqueue(item)
            return False
        item.fused = fused
        return True

    def drain(self) -> None:
        """Write buffered frames, oldest first, as long as all their faces are resolved."""
        while self.buffer:
            head = self.buffer[0]
            if not all(it.fused is not None or self._resolve(it) for it in head.items):
                return
            self.buffer.popleft()
            self._write(head)
            self._prune(head.frame.index + 1)

    def _prune(self, next_frame: int) -> None:
        """Forget key changes no frame from next_frame on can use (older than its previous key frame)."""
        for j, done in enumerate(self.done):
            if not done:
                continue
            keys = self.key_frames[j]
            i = int(bisect.bisect_right(keys, next_frame)) - 1
            floor = int(keys[i]) if i >= 0 else -1
            for k in [k for k in done if k < floor]:
                del done[k]

    # --------------------------------------------------------------------------------------------- writing
    def _write(self, pending: _Pending) -> None:
        if pending.context:
            return
        if pending.items:
            self.stats.faces += len(pending.items)
            self.writer.write_made(self._pasted_timed, pending)  # paste-back in the encoder's thread
        else:  # unchanged: written from the decoder's planes where it kept them (video/yuv.py)
            self.writer.write(replace(pending.frame, dirty=()))  # timed where it runs: the encoder's thread
        self.stats.frames += 1
        self.progress.written(self.stats.frames)

    def _pasted_timed(self, pending: _Pending) -> Frame:
        with self.clock.stage("paste"):
            return self._pasted(pending)

    def _pasted(self, pending: _Pending) -> Frame:
        """The buffered frame with its faces' refined crops pasted back, into the frame's own pixels: the decoder made
        them for this frame alone and nothing reads them once the frame is written (a copy cost ~0.5 ms per 720p
        frame).

        Only a face's footprint (where its warped mask is > 0) goes through paste-back, so a 4k frame costs what its
        faces do. With plain alpha compositing (uint8) each face is pasted into its own footprint, in paste order:
        in a rectangle covering several faces, each face's warp covered its whole crop square inside it (~2x its
        footprint). Colour transfer and Poisson blending composite in float, so their faces share one rectangle and
        are rounded to uint8 once. The frame's dirty rectangles are those footprints (video/yuv.py merged_rects)."""
        frame = pending.frame
        rgb = frame.rgb if frame.rgb.flags.writeable else frame.rgb.copy()
        h, w = rgb.shape[:2]
        order = self._paste_order(pending.items)
        blend = self.opts.blend
        groups = [order] if blend.color_transfer or blend.seamless else [[it] for it in order]
        rects: list[tuple[int, int, int, int]] = []
        for group in groups:
            x0, y0, x1, y1 = self._footprint(group, h, w)
            if x1 > x0 and y1 > y0:
                rects.append((x0, y0, x1, y1))
                _paste_u8(rgb[y0:y1, x0:x1], tuple(self._face(it, x0, y0) for it in group), blend)
        return Frame(frame.index, rgb, frame.pts, frame.time_base, frame.yuv, merged_rects(rects))

    def _face(self, it: _Item, x0: int, y0: int) -> Face:
        """Item it as a Face pasted into the frame rectangle starting at (x0, y0): its transforms, box and landmarks
        moved from frame to rectangle coordinates, its crop the fused one."""
        tr = self.ft.tracks[it.j]
        p = it.t - tr.start
        assert it.fused is not None
        shift = np.array([x0, y0], np.float64)
        affine = it.affine.copy()
        affine[:, 2] += affine[:, :2] @ shift  # frame -> crop becomes rectangle -> crop
        box = tr.bboxes[p] - np.tile(shift, 2)
        return Face(
            bbox=(float(box[0]), float(box[1]), float(box[2]), float(box[3])),
            score=float(tr.scores[p]),
            landmarks=tr.landmarks[p] - shift.astype(np.float32),
            affine=affine,
            inverse=cv2.invertAffineTransform(affine),
            crop_size=self.opts.crop_size,
            mask=self.mask,
            crop=it.fused,
        )

    def _paste_order(self, items: list[_Item]) -> list[_Item]:
        """The faces in paste order (later over earlier): faces interpolated through a detection gap first, those the
        detector saw on this frame last. A face hidden behind another (within max_gap frames) keeps its track through
        the gap, and its guessed crop there shows the front face: pasted last it covered the front face's refinement
        with its own refinement of that face (another seed, another alignment)."""
        return sorted(items, key=lambda it: bool(self.ft.tracks[it.j].detected[it.t - self.ft.tracks[it.j].start]))

    def _footprint(self, items: list[_Item], h: int, w: int) -> tuple[int, int, int, int]:
        """(x0, y0, x1, y1): the frame rectangle covering every face's pasted pixels (where its warped mask is > 0),
        clipped to the frame. Paste-back leaves every other pixel as it is, so only this rectangle is pasted into
        (about half of the crop's footprint: the mask leaves the crop's corners out)."""
        corners = self.support
        pts = np.concatenate([corners @ inv[:, :2].T + inv[:, 2] for inv in (_inverse(it.affine) for it in items)])
        x0, y0 = np.floor(pts.min(0)).astype(int) - 2
        x1, y1 = np.ceil(pts.max(0)).astype(int) + 2
        return max(int(x0), 0), max(int(y0), 0), min(int(x1), w), min(int(y1), h)


def _paste_u8(roi: np.ndarray, faces: tuple[Face, ...], blend: BlendOptions) -> None:
    """Paste the faces (uint8 crops) into roi [h, w, 3] uint8, a view of the frame, in place: uint8 compositing
    (faces/paste.py paste_into_u8) for plain alpha blending; through float for color transfer or Poisson blending."""
    if not blend.color_transfer and not blend.seamless:
        paste_into_u8(roi, faces, blend.strength)
        return
    as_float = tuple(replace(f, crop=unit_float(f.crop)) if f.crop is not None else f for f in faces)
    work = unit_float(roi)
    paste_into(work, as_float, blend)
    roi[...] = to_u8_(work)


def _support_corners(mask: np.ndarray, margin: int = 2) -> np.ndarray:
    """[4, 2] crop coordinates of the corners of the mask's nonzero box, grown by `margin` px (a frame pixel's
    bilinear sample of the mask reaches one crop pixel further, plus fixed-point rounding); the whole crop when the
    mask is empty."""
    s = mask.shape[0]
    ys, xs = np.nonzero(mask > 0)
    if xs.size == 0:
        x0 = y0 = 0
        x1 = y1 = s
    else:
        x0, y0 = max(int(xs.min()) - margin, 0), max(int(ys.min()) - margin, 0)
        x1, y1 = min(int(xs.max()) + 1 + margin, s), min(int(ys.max()) + 1 + margin, s)
    return np.array([[x0, y0], [x1, y0], [x0, y1], [x1, y1]], np.float64)


def _inverse(affine: np.ndarray) -> np.ndarray:
    return cv2.invertAffineTransform(np.asarray(affine, np.float64))


def fuse_video(source: Source, out_path: str | Path, job: FuseJob, *, clock: StageClock = NULL_CLOCK) -> VideoStats:
    """Pass 2 (see module doc): write the fused video to out_path (.mp4/.mov/.mkv) and return what was done.

    job: the tracks, refine, options and progress of the run (FuseJob).
    clock: gets each stage's time (video/clock.py STAGES: decode, crop, diffusion, flow, propagation, paste, encode).

    job.progress(frames written, total) is called for every frame written and for every `tick` a refine that takes
    one calls (video/progress.py). The output exists only when the run finished: an exception (a cancel from
    `progress`, a refine error, a corrupt frame) leaves nothing at out_path.
    """
    tracks, opts, progress = job.tracks, job.opts, job.progress
    t0 = time.perf_counter()
    out_path = Path(out_path)
    total = tracks.frame_count
    if total == 0:  # the copy below would "succeed" with an empty video track that players and SaveVideo refuse
        raise no_frames_error(tracks.name)
    if not tracks.tracks:
        log.warning("no face tracks in %s: the video is copied through unchanged", tracks.name)
        if progress is not None:
            progress(0, total)  # a cancel point before the copy (a cancel must propagate, never be re-encoded)
        with VideoReader(source, keep_audio=True) as reader:
            try:
                remux_copy(reader, out_path, total or None)
            except Exception as exc:  # a codec the output container cannot hold, a short copy: re-encode below
                log.warning("copying %s failed (%s); re-encoding instead", tracks.name, exc)
            else:
                stats = VideoStats(frames=total, copied=True, output=str(out_path))
                stats.seconds = time.perf_counter() - t0
                if progress is not None:
                    try:
                        progress(total, total)
                    except BaseException:  # a cancel after the copy: nothing is left at out_path
                        out_path.unlink(missing_ok=True)
                        raise
                return stats
    sar = probe(source).sar
    with VideoReader(source, keep_audio=True, keep_yuv=True) as reader:
        rate = reader.video.average_rate
        with (
            VideoWriter(
                out_path,
                FrameFormat(tracks.width, tracks.height, rate, reader.time_base, sar),
                CopiedStreams(reader.audio, subtitles=reader.subtitles),
                opts.encode,
                reader.colour or BT709_OUT,
            ) as video_writer,
            WriterThread(video_writer, clock=clock) as writer,
        ):
            fuser = _Fuser(job, writer, clock=clock)
            rest: list[Any] = []  # the packets demuxed after the last frame: muxed after the last frame is written
            sizes = (opts.crop_size, opts.flow.work_size)
            ahead = with_crops(clock.timed(frames_and_audio(reader), "decode"), tracks, sizes, clock)
            with Prefetch(ahead, clock=NULL_CLOCK) as items:
                for frame, audio, crops in items:
                    if frame is None:
                        rest = audio
                        continue
                    fuser.add(frame, crops)
                    writer.mux_audio(audio)
            fuser.flush()
            fuser.drain()
            if fuser.buffer:
                raise RuntimeError(f"{len(fuser.buffer)} frames of {tracks.name} were never resolved (internal error)")
            writer.mux_audio(rest)
            if progress is not None:
                progress(fuser.stats.frames, total)
            writer.finish()
            stats = fuser.stats
            stats.audio_packets = writer.audio_packets
            stats.announced_frames = reader.expected_frames if reader.truncated else None
    stats.seconds = time.perf_counter() - t0
    stats.output = str(out_path)
    log.info("fused %s -> %s: %s", tracks.name, out_path.name, stats.summary())
    return stats
