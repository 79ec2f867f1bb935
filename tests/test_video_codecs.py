"""video/encode.py's codec registry: every codec this PyAV can write round-trips a few frames with their timestamps;
unknown codecs and containers that cannot hold a codec are refused with a message naming the fix."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest
from tokenfuse.video.encode import (
    CODECS,
    EncodeOptions,
    FrameFormat,
    VideoWriteError,
    VideoWriter,
    available_codecs,
    encoder_of,
    output_suffix,
)
from tokenfuse.video.types import Frame
from video_clips import read_frames, video_pts, webp_frames

TB = Fraction(1, 1000)


def _frames(n: int = 6) -> list[np.ndarray]:
    src, _ = webp_frames("api_kling_avatar2-1.webp")
    return [cv2.resize(f, (160, 128), interpolation=cv2.INTER_AREA) for f in src[:n]]


def _write(path: Path, frames: list[np.ndarray], opts: EncodeOptions) -> Path:
    with VideoWriter(path, FrameFormat(160, 128, Fraction(15), TB), options=opts) as w:
        for i, rgb in enumerate(frames):
            w.write(Frame(i, rgb, i * 67, TB))  # 15 fps in milliseconds: uneven steps survive only exact pts
        return w.finish()


def test_h264_is_always_there_and_first() -> None:
    assert available_codecs()[0] == "h264"
    assert encoder_of("h264")[0] == "libx264"
    assert output_suffix() == ".mp4" and output_suffix("h264") == CODECS["h264"].suffix


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_each_available_codec_round_trips_frames_and_timestamps(tmp_path: Path, codec: str) -> None:
    if codec not in available_codecs():
        pytest.skip(f"this PyAV build has no encoder for {codec}")
    frames = _frames()
    out = _write(tmp_path / f"x{output_suffix(codec)}", frames, EncodeOptions(crf=20, preset="ultrafast", codec=codec))
    got = read_frames(out)
    assert len(got) == len(frames)
    times, _ = video_pts(out)
    assert times == pytest.approx([i * 0.067 for i in range(len(frames))], abs=1e-9)
    import av

    with av.open(str(out)) as c:
        decoders = {"h264": {"h264"}, "h265": {"hevc"}, "vp9": {"vp9", "libvpx-vp9"}, "av1": {"av1", "libdav1d"}}
        assert c.streams.video[0].codec_context.name in decoders[codec]
    mse = np.mean([((a.astype(float) - b.astype(float)) ** 2).mean() for a, b in zip(frames, got, strict=True)])
    assert 10 * np.log10(255**2 / mse) > 28.0  # the picture survives (CRF 20; a broken colour path scores < 20)


def test_threads_and_matroska(tmp_path: Path) -> None:
    out = _write(tmp_path / "x.mkv", _frames(3), EncodeOptions(preset="ultrafast", threads=1))
    assert len(read_frames(out)) == 3


def test_unknown_codec_and_wrong_container_are_refused(tmp_path: Path) -> None:
    with pytest.raises(VideoWriteError, match="unknown"):
        _write(tmp_path / "a.mp4", _frames(1), EncodeOptions(codec="mjpeg2"))
    with pytest.raises(VideoWriteError, match="cannot hold vp9"):
        _write(tmp_path / "b.mov", _frames(1), EncodeOptions(codec="vp9"))
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_node_output_path_takes_the_suffix_from_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenfuse.nodes.glue import video as video_glue

    monkeypatch.setitem(CODECS, "h264", dataclasses.replace(CODECS["h264"], suffix=".mkv"))
    assert video_glue.output_path("x").endswith(".mkv")
    assert video_glue.output_path("x", codec="vp9").endswith(CODECS["vp9"].suffix)
