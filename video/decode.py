"""Streaming decode with PyAV: frames in order, one at a time, from a path or a binary file object.

Nothing here holds more than the frame being yielded (plus the demuxed audio packets the caller has not taken
yet), so a one-hour video costs the memory of one frame. Seeking is never used: PyAV lands on the key frame
before a seek target, so every pass decodes forward from the start.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import IO, Any

import numpy as np

from .types import SCALE_THREADS, Frame, VideoInfo
from .yuv import BT709_OUT, Colour, frame_planes, source_colour

log = logging.getLogger(__name__)

Source = str | os.PathLike[str] | IO[bytes]


class VideoReadError(ValueError):
    """The input cannot be read as a video; the message names the input and what to do."""


def no_frames_error(name: str) -> VideoReadError:
    """The pack's error for a video whose video stream gives no frame (declared, but no picture in it: an
    audio-only export with an empty video track): nothing to track or fuse, and nothing must be written for it."""
    return VideoReadError(
        f"video {name} has no video frames to process: its video stream holds no picture (an audio-only export?). "
        "Re-export the clip with its video."
    )


def source_name(source: Source) -> str:
    """A name for messages: the path, or the file object's name, or its type."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return str(getattr(source, "name", None) or f"<{type(source).__name__}>")


def _open(source: Source) -> Any:
    import av

    name = source_name(source)
    if isinstance(source, (str, os.PathLike)):
        if not Path(source).is_file():
            raise VideoReadError(f"video file {name} not found")
        target: Any = str(source)
    else:
        source.seek(0)  # every pass starts at the beginning of the stream
        target = source
    try:
        container = av.open(target, "r")
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise VideoReadError(
            f"cannot read video {name}: {exc}. The file is corrupt, truncated or not a video: re-export it."
        ) from exc
    if not container.streams.video:
        container.close()
        raise VideoReadError(f"{name} has no video stream")
    return container


def rotation_of(value: float | int | None) -> int:
    """A display-matrix rotation (degrees counter-clockwise, any sign) as 0/90/180/270."""
    return int(round(float(value or 0) / 90.0)) % 4 * 90


def upright(rgb: np.ndarray, rotation: int) -> np.ndarray:
    """Turn a decoded frame [H, W, 3] by `rotation` degrees counter-clockwise (np.rot90), as players display it."""
    k = rotation_of(rotation) // 90
    return np.ascontiguousarray(np.rot90(rgb, k)) if k else rgb


def _first_frame(container: Any, stream: Any) -> tuple[int, str]:
    """(display-matrix rotation, digest of the decoded pixels) of a stream's first frame (PyAV puts the rotation on
    frames); (0, "") when it cannot decode (the reader itself reports that)."""
    try:
        for frame in container.decode(stream):
            pixels = frame.to_ndarray()  # its own pixel format: no colour conversion
            digest = hashlib.blake2b(np.ascontiguousarray(pixels).tobytes(), digest_size=8).hexdigest()
            return rotation_of(getattr(frame, "rotation", 0)), digest
    except Exception:  # a stream that cannot decode is reported by the reader itself
        return 0, ""
    return 0, ""


def _upright_sar(stream: Any, rotation: int) -> Fraction | None:
    """The stream's sample aspect ratio (pixel width / height) for the upright frames; None when square/unknown."""
    sar = stream.sample_aspect_ratio or stream.codec_context.sample_aspect_ratio
    if not sar or sar <= 0 or sar == 1:
        return None
    return 1 / Fraction(sar) if rotation in (90, 270) else Fraction(sar)


def probe(source: Source) -> VideoInfo:
    """Stream facts of the first video stream (decodes one frame: its rotation and a digest of its pixels)."""
    container = _open(source)
    try:
        v = container.streams.video[0]
        rot, digest = _first_frame(container, v)
        w, h = v.codec_context.width, v.codec_context.height
        if rot in (90, 270):
            w, h = h, w
        tb = v.time_base or Fraction(1, 90000)
        duration = None
        if v.duration is not None:
            duration = float(v.duration * tb)
        elif container.duration is not None:
            duration = container.duration / 1_000_000
        return VideoInfo(
            name=source_name(source),
            width=int(w),
            height=int(h),
            frame_count=int(v.frames) or None,
            rate=Fraction(v.average_rate) if v.average_rate else None,
            time_base=Fraction(tb),
            duration_s=duration,
            rotation=rot,
            codec=v.codec_context.name,
            audio_streams=len(container.streams.audio),
            first_frame=digest,
            sar=_upright_sar(v, rot),
        )
    finally:
        container.close()


def output_colour(source: Source) -> Colour:
    """The Colour a re-encode of `source` writes with: the one that keeps its YUV (VideoReader.colour), else BT.709
    (video/yuv.py). Opens the input once."""
    with VideoReader(source) as reader:
        return reader.colour or BT709_OUT


def count_packets(source: Source, at_most: int) -> int:
    """Video packets with data the file holds, counted by demuxing only (no decoding), stopping once past `at_most`
    (returns at_most + 1 then): what a frame limit is checked against, since a header's count or duration need not
    match the stream (119 KB of H.264 hold 3 000 4K frames). A file damaged further on counts up to the damage."""
    import av

    container = _open(source)
    frames = 0
    try:
        for packet in container.demux(container.streams.video[0]):
            frames += packet.size > 0
            if frames > at_most:
                break
    except (av.error.FFmpegError, OSError):  # decoding stops where demuxing did (the reader reports it)
        pass
    finally:
        container.close()
    return frames


class VideoReader:
    """Iterate decoded frames of the first video stream, in presentation order, as upright RGB uint8.

    With keep_audio the audio and subtitle packets met while demuxing are queued (no decoding) for `pop_audio`, so
    a writer can copy them without a second pass over the input; data and attachment streams (timecode, telemetry,
    fonts) and further video streams are not copied, and a warning names them. Errors while decoding raise
    VideoReadError naming the input and the frame; a stream that ends early (a truncated file) ends the iteration
    and `truncated` says so; a stream that gave no frame at all (read from the start) raises VideoReadError.

        with VideoReader(path) as reader:
            for frame in reader: ...
    """

    def __init__(self, source: Source, keep_audio: bool = False, keep_yuv: bool = False) -> None:
        self.name = source_name(source)
        self.container = _open(source)
        self.video = self.container.streams.video[0]
        self.video.thread_type = "AUTO"
        self.audio = list(self.container.streams.audio) if keep_audio else []
        self.subtitles = list(self.container.streams.subtitles) if keep_audio else []
        if keep_audio:
            left = [
                st
                for st in self.container.streams
                if st.type not in ("audio", "subtitle") and st.index != self.video.index
            ]
            for st in left:
                codec = getattr(getattr(st, "codec_context", None), "name", None) or "unknown codec"
                log.warning(
                    "video %s: stream #%d (%s, %s) is not copied to the output", self.name, st.index, st.type, codec
                )
        self.time_base = Fraction(self.video.time_base or Fraction(1, 90000))
        self.frames_read = 0
        self.packets_read = 0  # video packets with data: what the file holds, decodable or not
        self._seeked = False
        self._audio_queue: list[Any] = []
        self._keep: Colour | None = self.colour if keep_yuv else None

    @property
    def colour(self) -> Colour | None:
        """The output Colour that keeps this input's YUV outside the faces (video/yuv.py source_colour, from the
        stream's parameters; frames that do not match it, rotated ones among them, are converted whole), or None."""
        return source_colour(self.video.codec_context)

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.container.close()

    @property
    def expected_frames(self) -> int | None:
        return int(self.video.frames) or None

    def seek(self, pts: int) -> None:
        """Go to the key frame at or before `pts` (the video stream's time base): the counts no longer start at the
        first frame, so `truncated` says nothing after it."""
        self.container.seek(pts, stream=self.video, backward=True, any_frame=False)
        self._seeked = True

    @property
    def truncated(self) -> bool:
        """True when the file held fewer video packets than its header announced: it ends early (call after the
        iteration ended; False after a seek)."""
        n = self.expected_frames
        return not self._seeked and n is not None and self.packets_read < n

    @property
    def undecodable(self) -> int:
        """Video packets the file holds that gave no frame (a stream that starts without its key frame, a damaged
        stretch); 0 after a seek."""
        return 0 if self._seeked else max(0, self.packets_read - self.frames_read)

    def pop_audio(self) -> list[Any]:
        """The audio and subtitle packets demuxed so far and not yet taken (av.Packet of an input stream)."""
        out, self._audio_queue = self._audio_queue, []
        return out

    def __iter__(self) -> Iterator[Frame]:
        import av

        damaged: Exception | None = None  # PyAV < 18: a packet that failed to decode, raised if more data follows
        try:
            for packet in self.container.demux(self.video, *self.audio, *self.subtitles):
                if packet.stream.type in ("audio", "subtitle"):
                    if packet.dts is not None:  # flush packets carry no data
                        self._audio_queue.append(packet)
                    continue
                if damaged is not None and packet.size > 0:
                    raise damaged  # damage in the middle: the file and frame are named below
                self.packets_read += packet.size > 0
                try:
                    frames = packet.decode()
                except av.error.InvalidDataError as exc:
                    # PyAV < 18 (Python 3.10 gets 17.1 at most) raises on the packet a truncated file's cut damaged,
                    # where 18 yields no frame: at the end of the file it is a truncation, reported below
                    damaged = exc
                    continue
                for vf in frames:
                    pixels = vf.to_ndarray(format="rgb24", threads=SCALE_THREADS)
                    rgb = upright(pixels, rotation_of(getattr(vf, "rotation", 0)))
                    yuv = frame_planes(vf, self._keep) if self._keep is not None else None
                    yield Frame(self.frames_read, rgb, vf.pts, self.time_base, yuv)
                    self.frames_read += 1
        except av.error.FFmpegError as exc:
            raise VideoReadError(
                f"video {self.name} is corrupt at frame {self.frames_read}: {exc}. Re-export or repair the file."
            ) from exc
        if self.frames_read == 0 and not self._seeked:
            raise no_frames_error(self.name)  # before: 0 frames tracked and a "successful" empty copy
        if self.truncated:
            log.warning(
                "video %s ended after %d of %d frames: the file is truncated; the frames that decoded are used",
                self.name,
                self.packets_read,
                self.expected_frames,
            )
        elif self.undecodable:
            log.warning(
                "video %s: %d of its %d frames could not be decoded (the stream starts without a key frame, or a "
                "stretch is damaged); the %d that decoded are used",
                self.name,
                self.undecodable,
                self.packets_read,
                self.frames_read,
            )
