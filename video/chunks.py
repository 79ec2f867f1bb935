"""A long video in time chunks: plan the chunks from the whole-video tracks, fuse one chunk [start, stop) given
those tracks, and join the chunk files in order with the input's audio copied once.

Why the result equals one pass over the whole video, frame for frame: the tracks (and their smoothing, key
frames and seeds) are analysed once over the whole video and handed to every chunk; a frame's fused pixels depend
only on its own crop and on the refined changes of its track's key frames on both sides of it. A chunk therefore
also decodes and refines the key frames just outside it that its first and last frames propagate from (context
frames, never written): at most two extra crops per track crossing a boundary, none at a scene cut, one when the
boundary is that track's key frame. This needs a refine that is a function of each crop and its seed (the
`Refine` contract: one seed per crop), not of which crops share a batch.

Chunks are encoded separately (each starts with an IDR frame) and joined packet by packet without re-encoding
when their codec headers match; the pixels are identical to a one-pass run, the H.264 bitstream is not (each
chunk restarts rate control), so with lossless settings (crf 0) the decoded frames are bit-identical.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .decode import Source, VideoReader, output_colour, probe
from .encode import _FORMATS, CopiedStreams, FrameFormat, VideoWriter, copyable_subtitles, mux_options, temp_path
from .fuse_pass import FuseJob, FuseOptions, VideoStats, _Fuser
from .keyframes import REASON_NONE, choose_keyframes
from .pipe import Prefetch, WriterThread
from .streams import add_copy
from .track_pass import FaceTracks
from .types import Frame

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """Frames [start, stop) written by this chunk; [first, last] decoded (context key frames included).
    boundary: why `start` was chosen ("start", "cut", "gap", "keyframe", "frame")."""

    index: int
    start: int
    stop: int
    first: int
    last: int
    boundary: str


def track_keyframes(tracks: FaceTracks, opts: FuseOptions) -> list[np.ndarray]:
    """Per track, the absolute indices of its key frames (as the fuse pass chooses them), sorted."""
    out = []
    for tr in tracks.tracks:
        reasons = choose_keyframes(tr, tracks.fps, opts.keyframes, opts.max_buffer_frames)
        out.append(tr.start + np.flatnonzero(reasons != REASON_NONE))
    return out


def _crossing(tracks: FaceTracks, t: int) -> list[int]:
    """Tracks alive on both frames t - 1 and t (a boundary at t splits them)."""
    return [j for j, tr in enumerate(tracks.tracks) if tr.covers(t - 1) and tr.covers(t)]


def _boundary_cost(tracks: FaceTracks, keys: list[np.ndarray], t: int) -> tuple[int, str]:
    """Extra crops a boundary at t costs (refined on both sides) and its kind."""
    if t in tracks.cuts:
        return 0, "cut"
    crossing = _crossing(tracks, t)
    if not crossing:
        return 0, "gap"
    extra = sum(1 if t in set(keys[j].tolist()) else 2 for j in crossing)
    return extra, "keyframe" if all(t in set(keys[j].tolist()) for j in crossing) else "frame"


def plan_chunks(tracks: FaceTracks, chunks: int, opts: FuseOptions, slack: float = 0.25) -> list[Chunk]:
    """Split the video into about `chunks` time chunks of similar length.

    Each boundary is taken within +-slack of a chunk length from its even position, preferring (in order) a scene
    cut or a frame no track crosses (free), then a key frame of every crossing track (one extra crop per track),
    then the nearest frame. Chunks of fewer than 2 frames are never made.
    """
    n = tracks.frame_count
    chunks = max(1, min(int(chunks), n // 2 or 1))
    keys = track_keyframes(tracks, opts)
    length = n / chunks
    starts = [0]
    kinds = ["start"]
    for i in range(1, chunks):
        ideal = round(i * length)
        lo, hi = max(starts[-1] + 2, round(ideal - slack * length)), min(n - 2, round(ideal + slack * length))
        if lo > hi:
            continue
        best = min(
            range(lo, hi + 1),
            key=lambda t: (_boundary_cost(tracks, keys, t)[0], abs(t - ideal)),
        )
        starts.append(best)
        kinds.append(_boundary_cost(tracks, keys, best)[1])
    out = []
    for i, (s, kind) in enumerate(zip(starts, kinds, strict=True)):
        e = starts[i + 1] if i + 1 < len(starts) else n
        first, last = context_range(tracks, keys, s, e)
        out.append(Chunk(i, s, e, first, last, kind))
    return out


def context_range(tracks: FaceTracks, keys: list[np.ndarray], start: int, stop: int) -> tuple[int, int]:
    """[first, last] frames a chunk [start, stop) must decode: the previous key frame of every track alive at
    `start` and the next key frame of every track alive at `stop - 1`."""
    first, last = start, stop - 1
    for j, tr in enumerate(tracks.tracks):
        k = keys[j]
        if tr.covers(start):
            first = min(first, int(k[bisect.bisect_right(k, start) - 1]))
        if tr.covers(stop - 1):
            last = max(last, int(k[bisect.bisect_left(k, stop - 1)]))
    return first, last


def frame_times(source: Source) -> list[int | None]:
    """Every frame's pts in decode order (a pass over the packets with decoding, as the frame index is defined
    by decoded order). The driver records these during the track pass instead when it can (`on_frame`)."""
    with VideoReader(source) as reader:
        return [f.pts for f in reader]


def read_frames(source: Source, first: int, last: int, pts: list[int | None]) -> Iterator[Frame]:
    """Frames first..last (indices of the whole video) with their whole-video indices.

    Seeks to the stream key frame before `first` when every frame has a pts (decoding forward from there gives
    the same pixels as decoding from the start); otherwise, or when the seek lands past `first`, decodes from
    the start.
    """
    index = {p: i for i, p in enumerate(pts)} if all(p is not None for p in pts) else None
    if index is not None and len(index) == len(pts) and first > 0:
        with VideoReader(source, keep_yuv=True) as reader:
            reader.seek(int(pts[first]))  # type: ignore[arg-type]
            frames = iter(reader)
            for f in frames:
                i = index.get(f.pts)
                if i is None or i < first:
                    continue
                if i != first:
                    log.debug("seek in %s landed past frame %d; decoding from the start", reader.name, first)
                    break
                yield replace(f, index=i)
                for g in frames:  # from here on the frames follow in order; fuse_chunk checks the count
                    k = index.get(g.pts)
                    if k is None or k > last:
                        return
                    yield replace(g, index=k)
                return
    with VideoReader(source, keep_yuv=True) as reader:
        for f in reader:
            if f.index > last:
                return
            if f.index >= first:
                yield f


def fuse_chunk(source: Source, out_path: str | Path, job: FuseJob, chunk: Chunk, pts: list[int | None]) -> VideoStats:
    """Write frames [chunk.start, chunk.stop) of the fused video to out_path (video only, the input's
    timestamps; audio is added by `join_chunks`). Same pixels as those frames of fuse_pass.fuse_video.
    job: the whole video's tracks, the refine, options and progress (reported over the chunk's frames)."""
    tracks, opts, progress = job.tracks, job.opts, job.progress
    t0 = time.perf_counter()
    out_path = Path(out_path)
    window = range(chunk.start, chunk.stop)
    info = probe(source)
    with (
        VideoWriter(
            out_path,
            FrameFormat(tracks.width, tracks.height, info.rate, info.time_base, info.sar),
            options=opts.encode,
            colour=output_colour(source),
        ) as video_writer,
        WriterThread(video_writer) as writer,
    ):
        fuser = _Fuser(job, writer, window)
        with Prefetch(read_frames(source, chunk.first, chunk.last, pts)) as frames:
            for frame in frames:
                fuser.add(frame)
        fuser.flush()
        fuser.drain()
        if fuser.buffer or fuser.stats.frames != len(window):
            raise RuntimeError(
                f"chunk {chunk.index} of {tracks.name}: wrote {fuser.stats.frames} of {len(window)} frames "
                "(the input decodes differently from the track pass)"
            )
        writer.finish()
        stats = fuser.stats
    if progress is not None:
        progress(stats.frames, len(window))
    stats.seconds = time.perf_counter() - t0
    stats.output = str(out_path)
    return stats


@dataclass
class JoinStats:
    """How the chunks were joined: packets copied (True) or frames re-encoded; audio packets copied."""

    copied: bool
    video_packets: int = 0
    audio_packets: int = 0
    reason: str = ""


def _headers(paths: list[Path]) -> set[bytes]:
    import av

    out = set()
    for p in paths:
        with av.open(str(p)) as c:
            v = c.streams.video[0]
            out.add(bytes(v.codec_context.extradata or b"") + f"{v.codec_context.name}{v.width}x{v.height}".encode())
    return out


def _video_packets(paths: list[Path]) -> Iterator[Any]:
    """Every chunk's video packets with data, in order. ValueError (the join re-encodes) on a packet without dts:
    Matroska stores none (ffmpeg's demuxer leaves some files' packets, e.g. a 7-frame chunk's, without one), and
    skipping them, as the flush packets are skipped, silently dropped those chunks' frames from the joined file."""
    import av

    for p in paths:
        with av.open(str(p)) as c:
            for packet in c.demux(c.streams.video[0]):
                if packet.size == 0:
                    continue  # the demuxer's flush packet
                if packet.dts is None:
                    raise ValueError(f"chunk {p.name} has video packets without timestamps to copy")
                yield packet


def _audio_packets(reader: VideoReader, streams: list[Any]) -> Iterator[Any]:
    """The packets of an input's audio / subtitle `streams` (opened with keep_audio), in file order (flush packets
    skipped)."""
    if not streams:
        return
    for packet in reader.container.demux(*streams):
        if packet.dts is not None:
            yield packet


def _time(packet: Any) -> float:
    return float(packet.dts * packet.time_base)


def join_chunks(
    source: Source, chunk_paths: list[Path], out_path: str | Path, metadata: dict[str, str] | None = None
) -> JoinStats:
    """Concatenate chunk files (in order) into out_path and copy the input's audio streams once; metadata: container
    tags of the joined file (the runner puts the workflow's "prompt" there, as ComfyUI's SaveVideo does).

    Packets are copied without re-encoding when all chunks share one codec header; otherwise (or when the
    muxer refuses the timestamps) the chunks' frames are re-encoded with the input's timestamps. Written under a
    temporary name, renamed on success.
    """
    import av

    out_path = Path(out_path)
    fmt = _FORMATS.get(out_path.suffix.lower())
    if fmt is None:
        raise ValueError(f"output {out_path}: use one of {sorted(_FORMATS)} as the file extension")
    if len(_headers(chunk_paths)) == 1:
        tmp = temp_path(out_path)
        stats = JoinStats(copied=True)
        try:
            with av.open(str(chunk_paths[0])) as first, VideoReader(source, keep_audio=True) as inp:
                with av.open(str(tmp), "w", format=fmt, options=mux_options(fmt, metadata)) as out:
                    for key, value in (metadata or {}).items():
                        out.metadata[key] = value
                    ov = out.add_stream_from_template(first.streams.video[0])
                    extra = [*inp.audio, *copyable_subtitles(inp.subtitles, fmt, out_path.name)]
                    amap = {a.index: add_copy(out, a) for a in extra}  # audio MP4 cannot hold: re-encode below
                    last_dts: int | None = None
                    merged = heapq.merge(
                        ((_time(p), 0, p) for p in _video_packets(chunk_paths)),
                        ((_time(p), 1, p) for p in _audio_packets(inp, extra)),
                        key=lambda x: (x[0], x[1]),
                    )
                    for _, kind, packet in merged:
                        if kind == 0:
                            dts = int(packet.dts)
                            if last_dts is not None and dts <= last_dts:
                                if packet.pts is None or last_dts + 1 > packet.pts:
                                    raise ValueError(f"chunk timestamps overlap at dts {dts}")
                                packet.dts = dts = last_dts + 1
                            last_dts = dts
                            packet.stream = ov
                            stats.video_packets += 1
                        else:
                            stats.audio_packets += packet.stream.type == "audio"
                            packet.stream = amap[packet.stream.index]
                        out.mux(packet)
            os.replace(tmp, out_path)
            return stats
        except (ValueError, av.error.FFmpegError) as exc:
            log.warning("joining %d chunks by copy failed (%s); re-encoding them", len(chunk_paths), exc)
            reason = str(exc)
        finally:
            tmp.unlink(missing_ok=True)
    else:
        reason = "the chunks' codec headers differ"
    return _join_reencode(source, chunk_paths, out_path, reason, metadata)


def _join_reencode(
    source: Source, chunk_paths: list[Path], out_path: Path, reason: str, metadata: dict[str, str] | None
) -> JoinStats:
    """The fallback join: decode the chunks in order and encode one stream (timestamps kept, audio and subtitles
    copied; audio the container cannot hold transcoded)."""
    info = probe(chunk_paths[0])
    stats = JoinStats(copied=False, reason=reason)
    with VideoReader(source, keep_audio=True) as inp:
        with VideoWriter(
            out_path,
            FrameFormat(info.width, info.height, info.rate, info.time_base, info.sar),
            CopiedStreams(inp.audio, subtitles=inp.subtitles, metadata=metadata),
            colour=output_colour(chunk_paths[0]),
        ) as writer:
            for path in chunk_paths:
                with VideoReader(path, keep_yuv=True) as reader:
                    for frame in reader:
                        writer.write(replace(frame, dirty=()))  # the chunk's planes as they are
                        stats.video_packets += 1
            writer.mux_audio(list(_audio_packets(inp, [*inp.audio, *writer.subtitles])))
            writer.finish()
            stats.audio_packets = writer.audio_packets
    return stats
