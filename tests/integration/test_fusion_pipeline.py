"""ScheduledFusion against real ComfyUI: a random-weight SD1.5-architecture U-Net (tiny width), a real-architecture
SD VAE (comfy.sd.VAE from a random state dict, ch 32) and the astronaut photo with FACES built by hand.

Checks what CI's fakes cannot: sampling goes through comfy.sample.sample with the noise mask, the crop-space plan
and the "scheduling off" flag reach the attention patches' extra_options, an induced OOM walks the fallback chain
and is reported while the image is still produced, and seeds are stable across reruns.
Run: COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/integration/test_fusion_pipeline.py
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

GUIDE = 64  # small crops keep a CPU run to seconds; the path is the same at 512


@pytest.fixture(scope="module")
def stack(comfy: SimpleNamespace, random_model: Any) -> Iterator[SimpleNamespace]:
    import importlib

    from tokenfuse.devkit import astronaut, comfy_models

    utils = importlib.import_module("comfy.utils")
    was = utils.PROGRESS_BAR_ENABLED
    utils.PROGRESS_BAR_ENABLED = False  # no tqdm bars in the test log
    model = random_model("sd15")
    vae = comfy_models.build_vae(ch=32, seed=0)
    frame = astronaut.astronaut_frame(512)
    faces = astronaut.astronaut_faces(512, crop_size=128)
    cond = comfy.models.conditioning("sd15", seed=1), comfy.models.conditioning("sd15", seed=2)
    yield SimpleNamespace(model=model, vae=vae, image=torch.from_numpy(frame)[None], faces=faces, cond=cond)
    utils.PROGRESS_BAR_ENABLED = was


def _recording(model: Any, seen: list[dict[str, Any]]) -> Any:
    """A clone whose attn1 patch records what each attention call receives (it changes nothing)."""

    def record(n: torch.Tensor, ctx: torch.Tensor, val: torch.Tensor, extra: dict[str, Any]) -> Any:
        seen.append(
            {
                "plan": extra.get("tokenfuse_plan"),
                "disabled": extra.get("tokenfuse_disabled"),
                "shape": tuple(extra["original_shape"]),
                "tokens": n.shape[1],
            }
        )
        return n, ctx, val

    m = model.clone()
    m.set_model_attn1_patch(record)
    return m


def _fuse(st: SimpleNamespace, model: Any, **kw: Any) -> tuple[torch.Tensor, Any, str]:
    from tokenfuse.nodes.fusion_node import ScheduledFusion

    args = dict(
        model=model,
        vae=st.vae,
        positive=st.cond[0],
        negative=st.cond[1],
        image=st.image,
        faces=st.faces,
        seed=3,
        steps=2,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=0.5,
        guide_size=GUIDE,
        max_size=1024,
        crop_factor=1.0,
        feather=0.04,
        faces_per_batch=2,
        fallback="oom-only",
    )
    args.update(kw)
    with torch.inference_mode():  # as ComfyUI's executor runs every node
        return ScheduledFusion().fuse(**args)


def test_fusion_samples_through_comfy_with_plan_and_mask(stack: SimpleNamespace) -> None:
    from tokenfuse.scheduling.plan import TokenPlan

    seen: list[dict[str, Any]] = []
    plan = TokenPlan(importance=torch.ones(1, 8, 8), image_size=(8, 8), protect_threshold=0.5)
    crops, faces, report = _fuse(stack, _recording(stack.model, seen), token_plan=plan)
    assert crops.shape == (1, 128, 128, 3) and torch.isfinite(crops).all()
    face = faces.faces[0][0]
    assert face.crop is not None and face.crop.shape == (128, 128, 3)
    assert seen, "the attention patch never ran: sampling did not go through the model's patches"
    assert all(s["shape"][-2:] == (GUIDE // 8, GUIDE // 8) for s in seen)
    got = seen[0]["plan"]
    assert isinstance(got, type(plan)) and got.image_size == (GUIDE, GUIDE) and got.batch_size == 1
    assert "frame 0 face 0" in report and f"tokens {(GUIDE // 8) ** 2}" in report
    # the input model is untouched (the plan went onto a clone)
    assert "tokenfuse_plan" not in stack.model.model_options.get("transformer_options", {})
    # only the face region changed: the crop border equals the input crop
    import cv2
    import numpy as np

    original = cv2.warpAffine(stack.image[0].numpy(), face.affine, (128, 128), flags=cv2.INTER_LINEAR)
    diff = np.abs(face.crop - original).mean(axis=2)
    assert diff[:4].mean() < 0.02 and diff[face.mask > 0.95].mean() > diff[:4].mean()


def test_seeds_are_stable_across_reruns(stack: SimpleNamespace) -> None:
    a, _, _ = _fuse(stack, stack.model)
    b, _, _ = _fuse(stack, stack.model)
    c, _, _ = _fuse(stack, stack.model, seed=4)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_a_face_comes_out_the_same_batched_or_alone(stack: SimpleNamespace) -> None:
    """Two faces of one frame sampled as one batch (CFG: 4 U-Net rows) vs one at a time: each face keeps its seed's
    noise and its result."""
    from dataclasses import replace

    import cv2
    from tokenfuse.faces.types import FaceSet

    f0 = stack.faces.faces[0][0]
    affine = f0.affine.copy()
    affine[:, 2] += 6.0  # the same face, the crop 6 px off: other pixels, other result
    shifted = replace(f0, affine=affine, inverse=cv2.invertAffineTransform(affine))
    two = FaceSet(image_size=(512, 512), faces=((f0, shifted),))
    batched, _, report = _fuse(stack, stack.model, faces=two, faces_per_batch=2)
    alone, _, _ = _fuse(stack, stack.model, faces=two, faces_per_batch=1)
    assert "2 face(s)" in report and "seed 3" in report and "seed 4" in report
    assert torch.allclose(batched, alone, atol=2e-3), (batched - alone).abs().max()
    assert not torch.allclose(batched[0], batched[1], atol=1e-2)


def test_induced_oom_is_reported_and_the_image_still_comes(stack: SimpleNamespace) -> None:
    from tokenfuse.devkit.induce_oom import oom_on_first_samples

    crops, faces, report = _fuse(stack, oom_on_first_samples(stack.model, 1))
    assert "out of memory" in report and "fallbacks: none" not in report
    assert ("stronger_preset" in report) or ("tiled_vae" in report)
    assert crops.shape == (1, 128, 128, 3) and faces.faces[0][0].crop is not None
    # the whole chain: OOM three times -> stronger preset, tiled VAE, smaller guide, then it fits
    crops, faces, report = _fuse(stack, oom_on_first_samples(stack.model, 3), guide_size=128)
    line = report.splitlines()[1]
    assert "tiled_vae" in line and "smaller_guide: guide 128 -> 64" in line, report
    assert faces.faces[0][0].crop is not None


def test_cancel_propagates_instead_of_passing_the_face_through(stack: SimpleNamespace) -> None:
    import comfy.model_management as mm

    mm.interrupt_current_processing(True)
    try:
        with pytest.raises(mm.InterruptProcessingException):
            _fuse(stack, stack.model, fallback="auto")
    finally:
        mm.interrupt_current_processing(False)


def test_scheduling_off_reaches_the_patches(stack: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output the artifact check rejects is rerun with tokenfuse_disabled=True and without TokenFuse's own attn1
    patches (the recording patch, not ours, stays)."""
    from tokenfuse.fusion import artifacts
    from tokenfuse.fusion import refine as fusion_refine
    from tokenfuse.nodes.model_patching import strip_tokenfuse
    from tokenfuse.nodes.scheduler_node import TokenSchedulerController

    scheduled, _ = TokenSchedulerController().apply(stack.model, "balanced", "preset", 0.0)
    ours = scheduled.model_options["transformer_options"]["patches"]["attn1_patch"]
    off = strip_tokenfuse(scheduled)
    left = off.model_options["transformer_options"]["patches"].get("attn1_patch", [])
    assert len(left) < len(ours) and off.model_options["transformer_options"]["tokenfuse_disabled"] is True

    verdicts = iter([artifacts.ArtifactResult(False, ("black (mean 0.000)",))])

    def first_fails(*a: Any, **kw: Any) -> Any:
        forced = next(verdicts, None)
        return artifacts.check_crop(*a, **kw) if forced is None else forced

    monkeypatch.setattr(fusion_refine, "check_crop", first_fails)
    seen: list[dict[str, Any]] = []
    crops, faces, report = _fuse(stack, _recording(scheduled, seen), fallback="auto")
    assert "scheduling_off" in report, report
    assert any(s["disabled"] is True for s in seen)  # the rerun
    assert any(s["disabled"] is None for s in seen)  # the first, scheduled run
    assert faces.faces[0][0].crop is not None or "passthrough" in report


@pytest.mark.usefixtures("allow_absolute_model_paths")
def test_full_chain_in_process(stack: SimpleNamespace, shared_assets: Any) -> None:
    """FaceDetect (YuNet) -> PatchTokenize -> TokenSchedulerController -> ScheduledFusion -> GFPGANEnhance
    (visibility 0: no weights needed) -> Blend, node classes called as ComfyUI's executor would (inference mode)."""
    import numpy as np
    from tokenfuse.nodes.enhance_node import GFPGANEnhance
    from tokenfuse.nodes.face_nodes import Blend, FaceDetect, PatchTokenize
    from tokenfuse.nodes.fusion_node import ScheduledFusion
    from tokenfuse.nodes.scheduler_node import TokenSchedulerController

    def call(node: Any, **given: Any) -> Any:
        """Call a node with its widgets' defaults, as a workflow that leaves them alone would."""
        kwargs = {}
        for name, entry in node.INPUT_TYPES()["required"].items():
            if name in given:
                continue
            opts = entry[1] if len(entry) > 1 else {}
            kwargs[name] = opts.get("default", entry[0][0] if isinstance(entry[0], list) else None)
        out = getattr(node, node.FUNCTION)(**kwargs, **given)
        return out["result"] if isinstance(out, dict) else out  # {"ui": ..., "result": ...} as ComfyUI reads it

    yunet = str(shared_assets / "face_detection_yunet_2026may.onnx")
    image = stack.image
    with torch.inference_mode():
        faces, _, _ = call(FaceDetect(), image=image, backend="yunet", crop_size=128, model_name=yunet)
        assert faces.count == 1
        plan = call(PatchTokenize(), image=image, faces=faces)[0]
        model, _ = call(TokenSchedulerController(), model=stack.model, token_plan=plan)
        crops, fused, report = call(
            ScheduledFusion(),
            model=model,
            vae=stack.vae,
            positive=stack.cond[0],
            negative=stack.cond[1],
            image=image,
            faces=faces,
            seed=5,
            steps=2,
            sampler_name="euler",
            scheduler="normal",
            denoise=0.5,
            guide_size=GUIDE,
            fallback="oom-only",
            token_plan=plan,
        )
        assert fused.faces[0][0].crop is not None and "plan on" in report
        _, enhanced, _ = call(GFPGANEnhance(), image=image, faces=fused, model_name="none", visibility=0.0)
        (out,) = call(Blend(), image=image, faces=enhanced)
    assert out.shape == image.shape and torch.isfinite(out).all()
    changed = (out - image).abs().amax(dim=-1)[0].numpy()
    box = [int(v) for v in faces.faces[0][0].bbox]
    assert changed[box[1] : box[3], box[0] : box[2]].mean() > 0.005  # the face was refined and pasted back
    assert np.count_nonzero(changed[:40]) == 0  # far from the face the frame is untouched
