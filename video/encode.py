"""Video writer (PyAV; H.264 by default) that keeps the input's timestamps and copies its audio packets unchanged.

- Codecs and containers live here only: `CODECS` maps a codec name (h264, h265, vp9, av1) to the PyAV encoders
  that can write it (the first one the installed PyAV has is used), the containers that hold it, its default file
  suffix and how the shared quality settings (CRF, x264 preset vocabulary, threads) become that encoder's options.
  A new codec is one `Codec` entry; `available_codecs()` says which ones this PyAV can write.

- Every frame's pts is copied, and both `stream.time_base` and `stream.codec_context.time_base` are set to the
  input's: with only one of them set PyAV re-quantises timestamps and variable frame rate is lost.
- Audio streams are added with `add_stream_from_template` and their packets muxed as they are (no re-encoding,
  packets without dts skipped: the flush packets; Matroska audio carries dts, its B-frame video does not), with
  their language, title and default flag; audio the container cannot hold is transcoded to AAC (video/streams.py).
- Frames are converted to YUV with the writer's Colour (video/yuv.py: the input's own BT.709 or BT.601 matrix when
  its planes can be kept, else BT.709), limited range, and the stream says so (unspecified tags make browsers
  guess, and an HD input decoded with its own BT.709 tags then shows shifted colours). A frame that carries its
  decoder planes and the rectangles its RGB changed in (Frame.yuv, Frame.dirty) has only those converted. The
  input's sample aspect ratio is kept (anamorphic DV / HDV stays unsqueezed).
- yuv420p needs even width and height: an odd size is padded by one replicated row/column (logged), since libx264
  refuses odd sizes for 4:2:0 and players expect 4:2:0.
- Subtitle streams are copied packet by packet too when the output container can hold their codec (MP4/MOV:
  mov_text; Matroska: the text and bitmap subtitle codecs); otherwise a warning names the stream it leaves out.
- The file is written under a temporary name and renamed only by `finish()`: a cancelled or failed run leaves no
  file that looks finished (the temporary one is deleted).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, cast, get_args

import numpy as np

from .streams import StreamCopy, add_copy
from .types import SCALE_THREADS, Frame
from .yuv import BT709_OUT, LIMITED, Colour, convert_into

log = logging.getLogger(__name__)

Preset = Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow"]
PRESETS: tuple[str, ...] = get_args(Preset)
_FORMATS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska"}
_SPEED = {p: i for i, p in enumerate(PRESETS)}  # 0 = ultrafast .. 8 = veryslow


def _x26x_options(opts: EncodeOptions) -> dict[str, str]:
    return {"crf": str(int(opts.crf)), "preset": opts.preset}


def _x265_options(opts: EncodeOptions) -> dict[str, str]:
    return {**_x26x_options(opts), "x265-params": "log-level=error"}  # x265 prints a banner and stats otherwise


def _vpx_options(opts: EncodeOptions) -> dict[str, str]:
    """libvpx-vp9 in constant quality mode (crf with b=0); cpu-used 8 (ultrafast) .. 0 (veryslow)."""
    cpu = max(0, 8 - _SPEED[opts.preset])
    return {"crf": str(int(opts.crf)), "b": "0", "deadline": "good", "cpu-used": str(cpu), "row-mt": "1"}


def _svt_options(opts: EncodeOptions) -> dict[str, str]:
    """SVT-AV1: preset 12 (ultrafast) .. 4 (veryslow)."""
    return {"crf": str(int(opts.crf)), "preset": str(12 - _SPEED[opts.preset])}


def _aom_options(opts: EncodeOptions) -> dict[str, str]:
    """libaom-av1 in constant quality mode: cpu-used 8 (ultrafast) .. 0 (veryslow)."""
    return {"crf": str(int(opts.crf)), "b": "0", "cpu-used": str(max(0, 8 - _SPEED[opts.preset]))}


@dataclass(frozen=True)
class Codec:
    """One output codec: encoders (PyAV names, first available wins) with the function turning EncodeOptions into
    each one's options; containers: the formats (ffmpeg names) that hold it; suffix: the default file extension;
    tag: the codec tag written in MP4 / MOV (None = the muxer's default)."""

    name: str
    encoders: tuple[tuple[str, Callable[[EncodeOptions], dict[str, str]]], ...]
    containers: frozenset[str]
    suffix: str = ".mp4"
    tag: str | None = None


CODECS: dict[str, Codec] = {
    c.name: c
    for c in (
        Codec("h264", (("libx264", _x26x_options),), frozenset({"mp4", "mov", "matroska"})),
        Codec("h265", (("libx265", _x265_options),), frozenset({"mp4", "mov", "matroska"}), tag="hvc1"),
        Codec("vp9", (("libvpx-vp9", _vpx_options),), frozenset({"mp4", "matroska"})),
        Codec("av1", (("libsvtav1", _svt_options), ("libaom-av1", _aom_options)), frozenset({"mp4", "matroska"})),
    )
}
"""The output codecs (see module doc); h264 is the default (PyAV's wheels always ship libx264)."""


def _has_encoder(name: str) -> bool:
    import av

    try:
        av.codec.Codec(name, "w")
    except Exception:  # UnknownCodecError, or a build without that encoder
        return False
    return True


def encoder_of(codec: str) -> tuple[str, Callable[[EncodeOptions], dict[str, str]]]:
    """(PyAV encoder name, options function) of `codec`, the first its entry lists that this PyAV has; raises
    VideoWriteError naming the codecs it can write otherwise."""
    entry = CODECS.get(codec)
    if entry is None:
        raise VideoWriteError(f"video codec '{codec}' unknown: use one of {sorted(CODECS)}")
    for name, options in entry.encoders:
        if _has_encoder(name):
            return name, options
    names = "/".join(n for n, _ in entry.encoders)
    raise VideoWriteError(
        f"video codec '{codec}' needs the {names} encoder, which this PyAV build lacks: use one of {available_codecs()}"
    )


def available_codecs() -> list[str]:
    """The codec names this PyAV can write (h264 first)."""
    return [c.name for c in CODECS.values() if any(_has_encoder(n) for n, _ in c.encoders)]


def output_suffix(codec: str = "h264") -> str:
    """The default file extension of an output in `codec` (".mp4" for every codec today)."""
    entry = CODECS.get(codec)
    return entry.suffix if entry is not None else ".mp4"


# Subtitle codecs each output container takes as they are (ffmpeg's mp4/mov muxer takes mov_text only).
_SUBTITLE_CODECS = {
    "mp4": {"mov_text"},
    "mov": {"mov_text"},
    "matroska": {"ass", "ssa", "subrip", "srt", "webvtt", "text", "dvd_subtitle", "hdmv_pgs_subtitle", "dvb_subtitle"},
}


def copyable_subtitles(streams: list[Any] | tuple[Any, ...], fmt: str, name: str) -> list[Any]:
    """The input subtitle streams an output of container format `fmt` can hold; a warning names each other one."""
    keep = []
    for st in streams:
        codec = st.codec_context.name
        if codec in _SUBTITLE_CODECS.get(fmt, set()):
            keep.append(st)
        else:
            fix = f" (use .mkv for {codec})" if fmt != "matroska" else ""
            held = "/".join(sorted(_SUBTITLE_CODECS.get(fmt, set()))) or "no"
            log.warning(
                "%s: subtitle stream #%d (%s) is not copied: a %s file holds %s subtitles only%s",
                name,
                st.index,
                codec,
                fmt,
                held,
                fix,
            )
    return keep


class VideoWriteError(RuntimeError):
    """The output cannot be written; the message names the file and the fix."""


@dataclass(frozen=True)
class EncodeOptions:
    """crf: quality (x264/x265: 0 lossless .. 51, 18 ~ visually lossless, 23 default; VP9/AV1: 0 .. 63);
    preset: speed vs size in x264's vocabulary (mapped for the other codecs, see CODECS); codec: a CODECS name;
    threads: encoder threads (0 = the encoder decides)."""

    crf: int = 19
    preset: Preset = "medium"
    codec: str = "h264"
    threads: int = 0


def even_size(width: int, height: int) -> tuple[int, int]:
    """The encoded size: odd sides grow by one pixel (yuv420p needs even sides)."""
    return width + width % 2, height + height % 2


def pad_even(rgb: np.ndarray) -> np.ndarray:
    """[H, W, 3] -> [H + H%2, W + W%2, 3], the extra row/column replicated from the edge."""
    h, w = rgb.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return rgb
    return np.pad(rgb, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")


def temp_path(path: Path) -> Path:
    """The name written while encoding: hidden, in the same folder (so the final rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.part")


def mux_options(fmt: str, metadata: dict[str, str] | None = None) -> dict[str, str]:
    """The muxer options of an output: MP4/MOV start playing before they are fully downloaded (faststart) and, with
    metadata, keep custom tags such as ComfyUI's "prompt" (use_metadata_tags, as ComfyUI's SaveVideo writes)."""
    if fmt not in ("mp4", "mov"):
        return {}
    return {"movflags": "+faststart+use_metadata_tags" if metadata else "+faststart"}


@dataclass(frozen=True)
class FrameFormat:
    """The written video's frames and clock: width/height (odd sizes padded, see module doc), rate: nominal frame
    rate (x264 rate control; None = 30), time_base: the input video stream's (pts of written frames are in it), sar:
    the input's sample aspect ratio (VideoInfo.sar), kept in the output."""

    width: int
    height: int
    rate: Fraction | None
    time_base: Fraction
    sar: Fraction | None = None


@dataclass(frozen=True)
class CopiedStreams:
    """What a VideoWriter carries over from the input besides the frames: the av audio streams whose packets will
    be passed to `mux_audio`, the subtitle streams (those the container can hold: `subtitles`), and the container
    metadata (None: none)."""

    audio: list[Any] | tuple[Any, ...] = ()
    subtitles: list[Any] | tuple[Any, ...] = ()
    metadata: dict[str, str] | None = None


class VideoWriter:
    """Write RGB frames as H.264 (or options.codec) plus copied audio packets to `path` (.mp4/.m4v/.mov/.mkv).

    frame_format: the frames' size, rate, time base and sample aspect ratio (FrameFormat); streams: the input's
    audio and subtitle streams and metadata carried over (CopiedStreams).

        with VideoWriter(out, FrameFormat(w, h, rate, tb), CopiedStreams(reader.audio)) as writer:
            writer.write(frame); writer.mux_audio(reader.pop_audio())
            writer.finish()          # without it (an exception, a cancel) the output is deleted
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        frame_format: FrameFormat,
        streams: CopiedStreams = CopiedStreams(),
        options: EncodeOptions = EncodeOptions(),
        colour: Colour = BT709_OUT,
    ) -> None:
        ff = frame_format
        width, height, rate, time_base, sar = ff.width, ff.height, ff.rate, ff.time_base, ff.sar
        audio_streams, subtitle_streams, metadata = streams.audio, streams.subtitles, streams.metadata
        import av
        from av.video.stream import VideoStream

        self.path = Path(path)
        fmt = _FORMATS.get(self.path.suffix.lower())
        if fmt is None:
            raise VideoWriteError(f"output {self.path}: use one of {sorted(_FORMATS)} as the file extension")
        if options.preset not in PRESETS:
            raise VideoWriteError(f"x264 preset '{options.preset}' unknown: use one of {PRESETS}")
        encoder, encoder_options = encoder_of(options.codec)
        codec = CODECS[options.codec]
        if fmt not in codec.containers:
            fits = sorted(k for k, v in _FORMATS.items() if v in codec.containers)
            raise VideoWriteError(f"output {self.path}: a {fmt} file cannot hold {options.codec}: use one of {fits}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = temp_path(self.path)
        self.size = (width, height)
        self.time_base = Fraction(time_base)
        self.rate = Fraction(rate) if rate else Fraction(30)
        self.colour = colour
        self.frames_written = 0
        self.planes_kept = 0  # frames written from the decoder's YUV (video/yuv.py), the faces' rectangles converted
        self.audio_packets = 0
        self.subtitle_packets = 0
        self._last_pts: int | None = None
        self._done = False
        if width % 2 or height % 2:
            log.info(
                "%s: %dx%d is odd, encoded as %dx%d (edge replicated) for yuv420p",
                self.path.name,
                width,
                height,
                *even_size(width, height),
            )
        self.container = av.open(str(self.tmp), "w", format=fmt, options=mux_options(fmt, metadata))
        try:
            for key, value in (metadata or {}).items():
                self.container.metadata[key] = value
            ew, eh = even_size(width, height)
            self.stream = cast(VideoStream, self.container.add_stream(encoder, rate=self.rate))
            self.stream.width, self.stream.height = ew, eh
            self.stream.pix_fmt = "yuv420p"
            self.stream.time_base = self.time_base
            self.stream.codec_context.time_base = self.time_base
            threads = {"threads": str(options.threads)} if options.threads > 0 else {}
            self.stream.options = {**encoder_options(options), **threads}
            if codec.tag is not None and fmt in ("mp4", "mov"):
                self.stream.codec_context.codec_tag = codec.tag
            cc = self.stream.codec_context  # the RGB -> YUV matrix `write` uses, said in the stream (players follow it)
            cc.colorspace, cc.color_range, cc.color_primaries, cc.color_trc = colour.tags
            if sar is not None and sar > 0 and sar != 1:
                cc.sample_aspect_ratio = self.stream.sample_aspect_ratio = sar
            self.subtitles = copyable_subtitles(subtitle_streams, fmt, self.path.name)
            self._audio_map = {
                a.index: StreamCopy(self.container, a, self.path.name) for a in [*audio_streams, *self.subtitles]
            }
        except Exception:
            self._abort()
            raise

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if not self._done:
            self._abort()

    def write(self, frame: Frame) -> None:
        """Encode one upright frame [H, W, 3] uint8; its pts (in this writer's time_base) is kept."""
        rgb = frame.rgb
        if rgb.shape[1::-1] != self.size:
            raise VideoWriteError(
                f"{self.path.name}: frame {frame.index} is {rgb.shape[1]}x{rgb.shape[0]}, expected "
                f"{self.size[0]}x{self.size[1]}"
            )
        pts = frame.pts
        if pts is None:
            pts = int(round(frame.index / self.rate / self.time_base))
        elif frame.time_base != self.time_base:
            pts = int(round(pts * frame.time_base / self.time_base))
        if self._last_pts is not None and pts <= self._last_pts:
            pts = self._last_pts + 1  # a repeated timestamp would be refused by the muxer
        self._last_pts = pts
        vf = self._yuv_frame(frame)
        vf.pts = pts
        vf.time_base = self.time_base
        for packet in self.stream.encode(vf):
            self.container.mux(packet)
        self.frames_written += 1

    def _yuv_frame(self, frame: Frame) -> Any:
        """frame as an av.VideoFrame in yuv420p: its decoder planes with only the dirty rectangles converted when it
        carries both and they are this writer's matrix (video/yuv.py keeps planes of even-sized, upright frames only,
        which `write` has checked against this writer's size), else the whole frame converted with self.colour."""
        import av

        planes, rgb = frame.yuv, frame.rgb
        if planes is not None and frame.dirty is not None and planes.matrix == self.colour.matrix:
            convert_into(planes.data, rgb, frame.dirty, planes.matrix)
            self.planes_kept += 1
            return av.VideoFrame.from_ndarray(planes.data, format="yuv420p")
        return av.VideoFrame.from_ndarray(np.ascontiguousarray(pad_even(rgb)), format="rgb24").reformat(
            format="yuv420p", dst_colorspace=self.colour.matrix, dst_color_range=LIMITED, threads=SCALE_THREADS
        )

    def mux_audio(self, packets: list[Any]) -> None:
        """Copy input audio and subtitle packets (from VideoReader.pop_audio) unchanged; packets without dts are
        skipped."""
        for packet in packets:
            out = self._audio_map.get(packet.stream.index)
            if out is None or packet.dts is None:
                continue
            if packet.stream.type == "audio":
                self.audio_packets += 1
            else:
                self.subtitle_packets += 1
            out.mux(packet)

    def finish(self) -> Path:
        """Flush the encoder, close the file and give it its final name. Returns the path."""
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        for copy in self._audio_map.values():
            copy.finish()
        self.container.close()
        os.replace(self.tmp, self.path)
        self._done = True
        return self.path

    def _abort(self) -> None:
        """Close without finishing and delete the temporary file (the final name is never created)."""
        self._done = True
        try:
            self.container.close()
        except Exception as exc:  # closing a half-written container may fail; the file is deleted anyway
            log.debug("closing aborted output %s: %s", self.tmp, exc)
        self.tmp.unlink(missing_ok=True)


def remux_copy(source: Any, path: str | os.PathLike[str], frames: int | None = None) -> Path:
    """Copy every video and audio packet of an opened input (VideoReader) into `path` without re-encoding.

    Used when there is nothing to change (no face): fast and lossless. Temporary name, renamed on success.
    Only empty (flush) packets are skipped: Matroska stores no dts, so with B-frames the first packets, the opening key
    frame among them, carry none, and the muxer derives it. frames: the decoded frame count, if known; a copy that
    holds another number of video packets raises VideoWriteError (the caller re-encodes), never a short file.
    """
    import av

    path = Path(path)
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise VideoWriteError(f"output {path}: use one of {sorted(_FORMATS)} as the file extension")
    tmp = temp_path(path)
    opts = {"movflags": "+faststart"} if fmt in ("mp4", "mov") else {}
    try:
        with av.open(str(tmp), "w", format=fmt, options=opts) as out:
            streams = [source.video, *source.audio, *copyable_subtitles(source.subtitles, fmt, path.name)]
            mapping = {s.index: add_copy(out, s) for s in streams}  # audio the container cannot hold: ValueError
            copied = 0
            for packet in source.container.demux(*streams):
                if packet.size == 0:
                    continue
                copied += packet.stream is source.video
                packet.stream = mapping[packet.stream.index]
                out.mux(packet)
        if frames is not None and copied != frames:
            raise VideoWriteError(f"output {path.name}: {copied} video packets copied for {frames} frames")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
