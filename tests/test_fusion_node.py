"""ScheduledFusion's flow with a fake sampler/VAE injected: ordering, per-face seeds, batching, fallbacks, reports,
bad inputs, and the "scheduling off" model clone. No ComfyUI needed."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_fusion_geometry import astronaut_faceset
from tokenfuse.faces.types import FaceSet
from tokenfuse.fusion.run import CropHooks, FusionBackend
from tokenfuse.nodes.fusion_node import ScheduledFusion
from tokenfuse.nodes.glue.fusion_backend import ComfyInputs, comfy_backend
from tokenfuse.nodes.glue.sampling import SamplerArgs
from tokenfuse.nodes.model_patching import DISABLED_KEY, attempt_models, strip_tokenfuse


class FakeStack:
    """A VAE (8x average pool / bilinear upsample) and a sampler that records every call.

    sample() nudges the latent towards 0.5 grey inside the noise mask, seeded by the face seed, so outputs change
    where the mask allows and stay image-like (the artifact check passes)."""

    def __init__(self, oom_times: int = 0, broken_seeds: frozenset[int] = frozenset(), broken_model: str = "") -> None:
        self.calls: list[dict[str, Any]] = []
        self.oom_times = oom_times
        self.broken_seeds = broken_seeds
        self.broken_model = broken_model
        self.progress = 0

    def encode(self, pixels: torch.Tensor, tiled: bool) -> torch.Tensor:
        assert pixels.ndim == 4 and pixels.shape[-1] == 3 and pixels.dtype == torch.float32
        self.calls.append({"op": "encode", "tiled": tiled, "shape": tuple(pixels.shape)})
        return F.avg_pool2d(pixels.movedim(-1, 1), 8)

    def decode(self, latent: torch.Tensor, tiled: bool) -> torch.Tensor:
        self.calls.append({"op": "decode", "tiled": tiled, "shape": tuple(latent.shape)})
        return F.interpolate(latent, scale_factor=8, mode="bilinear", align_corners=False).movedim(1, -1).clamp(0, 1)

    def sample(self, model: str, latent: torch.Tensor, mask: torch.Tensor, seeds: list[int], plan: Any) -> torch.Tensor:
        self.calls.append(
            {
                "op": "sample",
                "model": model,
                "seeds": list(seeds),
                "shape": tuple(latent.shape),
                "mask": tuple(mask.shape),
                "plan": plan,
            }
        )
        if self.oom_times > 0:
            self.oom_times -= 1
            raise MemoryError("fake OOM")
        out = latent.clone()
        m = F.interpolate(mask, size=latent.shape[-2:], mode="area")
        for i, s in enumerate(seeds):
            g = torch.Generator().manual_seed(s)
            target = 0.5 + 0.05 * torch.randn(latent.shape[1:], generator=g)
            out[i] = latent[i] * (1 - 0.5 * m[i]) + target * 0.5 * m[i]
            if s in self.broken_seeds and model == self.broken_model:
                out[i] = 0.0  # black face: the artifact check must catch it
        return out

    def model_for(self, attempt: Any) -> tuple[str, str]:
        self.calls.append({"op": "model", "scheduling": attempt.scheduling, "preset": attempt.preset})
        name = "patched" if attempt.scheduling else "unscheduled"
        return (f"{name}:{attempt.preset}" if attempt.preset else name), ""

    def backend(self) -> FusionBackend:
        def progress() -> None:
            self.progress += 1

        return FusionBackend(
            encode=self.encode, decode=self.decode, sample=self.sample, model_for=self.model_for, progress=progress
        )

    def ops(self, op: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["op"] == op]


# ScheduledFusion's positional arguments around image and faces: its links (stand-ins: the backend replaces them)
# and its widgets, as ComfyUI's argument order has them.
LINKS = ("M", "V", "p", "n")
WIDGETS = (0, 4, 5.0, "euler", "normal", 0.4, 128, 1024, 1.0, 0.04, 2, "auto")


def _run(
    frames: int = 1, faces_per_frame: int = 1, stack: FakeStack | None = None, crop_size: int = 128, **kw: Any
) -> tuple[torch.Tensor, FaceSet, str, FakeStack]:
    images, fs = astronaut_faceset(frames, faces_per_frame, crop_size=crop_size)
    stack = stack or FakeStack()
    args = dict(
        model="MODEL",
        vae="VAE",
        positive="pos",
        negative="neg",
        image=torch.from_numpy(images),
        faces=fs,
        seed=100,
        steps=4,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=0.4,
        guide_size=128,
        max_size=1024,
        crop_factor=1.0,
        feather=0.04,
        faces_per_batch=2,
        fallback="auto",
    )
    args.update(kw)
    crops, out_faces, report = ScheduledFusion(stack.backend()).fuse(**args)
    return crops, out_faces, report, stack


def test_two_frames_three_faces_batches_seeds_and_outputs() -> None:
    crops, out, report, stack = _run(frames=2, faces_per_frame=3, faces_per_batch=2)
    assert crops.shape == (6, 128, 128, 3) and crops.dtype == torch.float32
    assert torch.isfinite(crops).all() and 0 <= float(crops.min()) and float(crops.max()) <= 1
    # batches never mix frames: [0,1] [2] per frame; seeds are seed + frame-major face number
    assert [c["seeds"] for c in stack.ops("sample")] == [[100, 101], [102], [103, 104], [105]]
    assert [c["shape"][0] for c in stack.ops("encode")] == [2, 1, 2, 1]
    assert all(c["shape"] == (2 if len(c["seeds"]) == 2 else 1, 3, 16, 16) for c in stack.ops("sample"))
    # per batch: model, encode, sample, decode in that order
    order = [c["op"] for c in stack.calls]
    assert order[:4] == ["encode", "model", "sample", "decode"] or order[:4] == ["model", "encode", "sample", "decode"]
    assert stack.progress == 6
    # FACES carry the crops for Blend; the image output holds the same crops in frame-major order
    flat = [f for row in out.faces for f in row]
    assert len(flat) == 6 and all(f.crop is not None and f.crop.shape == (128, 128, 3) for f in flat)
    assert np.allclose(flat[4].crop, crops[4].numpy())
    assert out.image_size == (512, 512)
    lines = report.splitlines()
    assert lines[0].startswith("ScheduledFusion: 6 face(s) in 2 frame(s), guide 128")
    assert "frame 1 face 2: ok, seed 105" in report and "tokens 256" in report
    assert lines[-1].startswith("6 face(s), 0 with fallbacks, 0 passed through")


def test_the_face_changes_only_inside_the_mask() -> None:
    images, fs = astronaut_faceset(1, 1, crop_size=128)
    crops, out, _, _ = _run(crop_size=128)
    face = fs.faces[0][0]
    import cv2

    original = cv2.warpAffine(images[0], face.affine, (128, 128), flags=cv2.INTER_LINEAR)
    diff = np.abs(crops[0].numpy() - original).mean(axis=2)
    assert diff[face.mask > 0.95].mean() > 0.02  # the fake sampler moved the face towards grey
    assert diff[:3, :].mean() < 0.02 and diff[:, :3].mean() < 0.02  # the crop border is the input crop


def test_denoise_zero_returns_the_input_crop_without_vae_or_sampler() -> None:
    """denoise 0 re-generates nothing: before, the crop went through the VAE (a blur) and an empty sampling."""
    import cv2

    images, fs = astronaut_faceset(1, 1, crop_size=128)
    crops, _, report, stack = _run(crop_size=128, denoise=0.0)
    assert stack.calls == [] and stack.progress == 1  # no model, encode, sample or decode; the bar still moves
    face = fs.faces[0][0]
    original = cv2.warpAffine(images[0], face.affine, (128, 128), flags=cv2.INTER_LINEAR)
    assert float(np.abs(crops[0].numpy() - original).max()) < 0.02  # only the context crop's resampling
    assert "denoise 0: faces not re-sampled" in report.splitlines()[0]
    assert "1 face(s), 0 with fallbacks, 0 passed through" in report
    _, _, _, sampled = _run(crop_size=128, denoise=0.01)
    assert len(sampled.ops("sample")) == 1  # any denoise above 0 samples


def test_seeds_are_stable_across_reruns_and_batching() -> None:
    a, _, _, _ = _run(faces_per_frame=3, faces_per_batch=3)
    b, _, _, _ = _run(faces_per_frame=3, faces_per_batch=1)
    c, _, _, _ = _run(faces_per_frame=3, faces_per_batch=3)
    assert torch.equal(a, c)
    assert torch.allclose(a, b, atol=1e-5)  # a face's result does not depend on its batch mates
    d, _, _, _ = _run(faces_per_frame=3, faces_per_batch=3, seed=101)
    assert not torch.allclose(a, d)


def test_oom_walks_the_chain_and_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenfuse.nodes import fusion_settings

    monkeypatch.setattr(fusion_settings, "stronger_presets", lambda: ())  # scheduler API absent: the step is skipped
    stack = FakeStack(oom_times=2)
    crops, out, report, stack = _run(faces_per_frame=2, faces_per_batch=2, stack=stack)
    samples = stack.ops("sample")
    # OOM on the pair -> split; OOM on face 0 alone -> (no stronger preset) tiled VAE
    assert [c["seeds"] for c in samples] == [[100, 101], [100], [100], [101]]
    assert [c["tiled"] for c in stack.ops("encode")] == [False, False, True, False]
    assert all(f.crop is not None for f in out.faces[0])
    line0 = [ln for ln in report.splitlines() if ln.startswith("frame 0 face 0")][0]
    assert "split_batch" in line0 and "tiled_vae" in line0 and "out of memory" in line0
    assert "stronger preset skipped" in line0
    assert line0.split(":")[1].strip().startswith("fallback")
    line1 = [ln for ln in report.splitlines() if ln.startswith("frame 0 face 1")][0]
    assert "split_batch" in line1 and "tiled_vae" not in line1


def test_oom_with_scheduler_api_repatches_stronger_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenfuse.nodes import fusion_settings

    monkeypatch.setattr(fusion_settings, "stronger_presets", lambda: ("balanced", "lowvram_8gb", "lowvram_4gb"))
    _, out, report, stack = _run(stack=FakeStack(oom_times=1))
    assert [c["model"] for c in stack.ops("sample")] == ["patched", "patched:lowvram_4gb"]
    assert "stronger_preset: preset input -> lowvram_4gb (after out of memory)" in report
    assert out.faces[0][0].crop is not None


def test_oom_everywhere_passes_faces_through_and_the_batch_goes_on() -> None:
    images, fs = astronaut_faceset(2, 1, crop_size=128)
    stack = FakeStack(oom_times=4)  # frame 0: first try, tiled, guide 64 ... all fail; frame 1 then succeeds
    crops, out, report, stack = _run(frames=2, stack=stack, guide_size=128)
    assert out.faces[0][0].crop is None  # passed through unchanged
    assert out.faces[1][0].crop is not None
    assert "frame 0 face 0: passthrough" in report and "no fallback left" in report
    assert "smaller_guide: guide 128 -> 64" in report
    assert "frame 1 face 0: ok" in report
    assert crops.shape == (2, 128, 128, 3)
    import cv2

    original = cv2.warpAffine(
        images[0], fs.faces[0][0].affine, (128, 128), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT101
    )
    assert np.allclose(crops[0].numpy(), original, atol=1e-6)


def test_broken_output_reruns_with_scheduling_off() -> None:
    stack = FakeStack(broken_seeds=frozenset({101}), broken_model="patched")
    crops, out, report, stack = _run(faces_per_frame=2, stack=stack)
    samples = stack.ops("sample")
    assert [(c["model"], c["seeds"]) for c in samples] == [("patched", [100, 101]), ("unscheduled", [101])]
    assert all(f.crop is not None for f in out.faces[0])
    assert "scheduling_off" in [ln for ln in report.splitlines() if "face 1" in ln][0]
    assert "artifact: " in report


def test_identity_drop_triggers_the_rerun_when_embeddings_exist() -> None:
    """Faces with an embedding and an embedder on the backend: a low similarity counts as an artifact."""
    images, fs = astronaut_faceset(1, 1, crop_size=128)
    ref = np.zeros(512, np.float32)
    ref[0] = 1.0
    fs = FaceSet(image_size=fs.image_size, faces=((replace(fs.faces[0][0], embedding=ref),),))
    stack = FakeStack()
    backend = stack.backend()
    sims = iter([-ref, ref])  # first output: another identity; rerun: the same one
    seen_landmarks = []

    def embed(crop: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
        assert crop.shape == (128, 128, 3) and landmarks.shape == (5, 2)
        seen_landmarks.append(landmarks)
        return next(sims)

    backend = replace(backend, hooks=CropHooks(embed=embed))  # the backend is frozen
    _, out, report = ScheduledFusion(backend).fuse(*LINKS, torch.from_numpy(images), fs, *WIDGETS)
    assert "identity drop (similarity -1.00" in report and "scheduling_off" in report
    assert out.faces[0][0].crop is not None
    assert [c["model"] for c in stack.ops("sample")] == ["patched", "unscheduled"]
    # landmarks are given in crop pixels: the eyes sit on the FFHQ template scaled to 128
    assert np.abs(seen_landmarks[0][0] - np.array([192.98, 239.95]) / 4).max() < 4


def test_broken_everywhere_passes_through_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    stack = FakeStack(broken_seeds=frozenset({100}), broken_model="patched")
    stack.broken_model = "patched"
    orig = stack.sample

    def always_broken(model: str, *a: Any) -> torch.Tensor:
        stack.broken_model = model
        return orig(model, *a)

    stack.sample = always_broken  # type: ignore[method-assign]
    with caplog.at_level("WARNING"):
        _, out, report, _ = _run(stack=stack)
    assert out.faces[0][0].crop is None
    assert "passthrough" in report and "passed through unchanged" in caplog.text


def test_artifacts_without_the_artifact_chain_are_reported_and_kept() -> None:
    stack = FakeStack(broken_seeds=frozenset({100}), broken_model="patched")
    _, out, report, stack = _run(stack=stack, fallback="oom-only")
    assert len(stack.ops("sample")) == 1
    assert out.faces[0][0].crop is not None
    assert "artifact: " in report and "output kept (artifact fallback off)" in report


def test_other_errors_pass_the_face_through_and_cancel_propagates() -> None:
    class Failing(FakeStack):
        def sample(self, model: str, latent: torch.Tensor, *a: Any) -> torch.Tensor:
            if not self.ops("sample"):
                self.calls.append({"op": "sample"})
                raise ValueError("shape mismatch in some patch")
            return super().sample(model, latent, *a)

    _, out, report, _ = _run(frames=2, stack=Failing())
    assert out.faces[0][0].crop is None and out.faces[1][0].crop is not None
    assert "error: ValueError: shape mismatch in some patch; no fallback left" in report

    class Cancelled(Exception):
        pass

    stack = FakeStack()
    backend = stack.backend()
    backend = replace(backend, is_fatal=lambda exc: isinstance(exc, Cancelled))  # the backend is frozen

    def cancel(*a: Any) -> torch.Tensor:
        raise Cancelled()

    backend = replace(backend, sample=cancel)
    images, fs = astronaut_faceset(1, 1, crop_size=128)
    with pytest.raises(Cancelled):
        ScheduledFusion(backend).fuse(*LINKS, torch.from_numpy(images), fs, *WIDGETS)


def test_fallback_off_reports_without_retrying() -> None:
    _, out, report, stack = _run(stack=FakeStack(oom_times=1), fallback="off")
    assert len(stack.ops("sample")) == 1 and out.faces[0][0].crop is None
    assert "out of memory; no fallback left" in report


def test_token_plan_builds_a_crop_space_plan() -> None:
    from tokenfuse.scheduling.plan import TokenPlan

    frame_plan = TokenPlan(importance=torch.ones(1, 64, 64), image_size=(512, 512), protect_threshold=0.6)
    _, _, report, stack = _run(faces_per_frame=2, token_plan=frame_plan)
    plan = stack.ops("sample")[0]["plan"]
    assert isinstance(plan, TokenPlan) and plan.batch_size == 2 and plan.image_size == (128, 128)
    assert plan.protect_threshold == 0.6
    assert "plan keeps ~" in report and "plan on" in report
    _, _, _, stack2 = _run()
    assert stack2.ops("sample")[0]["plan"] is None


@pytest.mark.parametrize("threshold", [0.3, 0.05])
def test_a_low_protect_threshold_still_refines_every_face(threshold: float) -> None:
    """PatchTokenize's protect_threshold goes down to 0.05; at or under the crop plan's face weight (0.4) the crop plan
    raised, and every face passed through unrefined with the error in the report."""
    from tokenfuse.scheduling.plan import TokenPlan

    frame_plan = TokenPlan(importance=torch.ones(1, 64, 64), image_size=(512, 512), protect_threshold=threshold)
    _, _, report, stack = _run(faces_per_frame=2, token_plan=frame_plan)
    assert len(stack.ops("sample")) >= 1 and "passthrough" not in report and "error" not in report, report
    assert stack.ops("sample")[0]["plan"].protect_threshold == threshold


def test_a_frame_plan_on_the_model_is_replaced_by_a_crop_plan() -> None:
    from tokenfuse.scheduling.plan import TokenPlan

    class PlannedModel:
        model_options = {
            "transformer_options": {
                "tokenfuse_plan": TokenPlan(
                    importance=torch.ones(1, 64, 64), image_size=(512, 512), protect_threshold=0.7
                )
            }
        }

    _, _, report, stack = _run(model=PlannedModel())
    plan = stack.ops("sample")[0]["plan"]
    assert isinstance(plan, TokenPlan) and plan.image_size == (128, 128) and plan.protect_threshold == 0.7
    assert "plan on" in report


def test_crop_factor_and_max_size_set_the_sampled_side() -> None:
    _, _, report, stack = _run(crop_factor=2.0, max_size=192)
    assert stack.ops("encode")[0]["shape"] == (1, 192, 192, 3)
    assert "guide 192" in report


def test_no_faces_and_empty_frames() -> None:
    images, _ = astronaut_faceset()
    empty = FaceSet(image_size=(512, 512), faces=((),))
    crops, out, report = ScheduledFusion(FakeStack().backend()).fuse(*LINKS, torch.from_numpy(images), empty, *WIDGETS)
    assert crops.shape[0] == 0 and out is empty and "no faces" in report
    # a frame without faces next to one with faces
    images2, fs = astronaut_faceset(2, 1, crop_size=128)
    mixed = FaceSet(image_size=(512, 512), faces=(fs.faces[0], ()))
    crops, out, report = ScheduledFusion(FakeStack().backend()).fuse(*LINKS, torch.from_numpy(images2), mixed, *WIDGETS)
    assert crops.shape[0] == 1 and out.faces[1] == () and out.faces[0][0].crop is not None


def test_mismatched_inputs_raise_actionable_errors() -> None:
    images, fs = astronaut_faceset(1, 1)
    node = ScheduledFusion(FakeStack().backend())
    common = dict(
        model="M",
        vae="V",
        positive="p",
        negative="n",
        seed=0,
        steps=4,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=0.4,
        guide_size=128,
        max_size=1024,
        crop_factor=1.0,
        feather=0.04,
        faces_per_batch=2,
        fallback="auto",
    )
    with pytest.raises(ValueError, match="connect the same image"):
        node.fuse(image=torch.zeros(1, 256, 256, 3), faces=fs, **common)
    with pytest.raises(ValueError, match="connect the same batch"):
        node.fuse(image=torch.from_numpy(np.concatenate([images, images])), faces=fs, **common)
    with pytest.raises(TypeError, match="FaceDetect"):
        node.fuse(image=torch.from_numpy(images), faces={"faces": []}, **common)
    # RGBA and gray images are taken (alpha dropped, gray repeated), as FaceDetect and Blend take them
    rgb = torch.from_numpy(images)
    for image in (torch.cat([rgb, torch.ones_like(rgb[..., :1])], -1), rgb[..., :1]):
        crops, out, report = node.fuse(image=image, faces=fs, **common)
        assert crops.shape[0] == 1 and crops.shape[-1] == 3 and "passthrough" not in report, report
    with pytest.raises(ValueError, match="IMAGE"):
        node.fuse(image=torch.zeros(512, 512, 3), faces=fs, **common)


def test_without_comfyui_the_node_says_so() -> None:
    images, fs = astronaut_faceset(1, 1)
    from tokenfuse.nodes.glue import env

    if env.comfy_available():
        pytest.skip("ComfyUI is importable here")
    with pytest.raises(env.ComfyUnavailableError, match="ComfyUI"):
        ScheduledFusion().fuse(*LINKS, torch.from_numpy(images), fs, *WIDGETS)


class FakePatcher:
    """Just enough of ModelPatcher for strip_tokenfuse."""

    def __init__(self, model_options: dict[str, Any], wrappers: dict[str, dict[str, list]]) -> None:
        self.model_options = model_options
        self.wrappers = wrappers

    def clone(self) -> FakePatcher:
        import copy

        return FakePatcher(copy.deepcopy(self.model_options), {k: dict(v) for k, v in self.wrappers.items()})

    def remove_wrappers_with_key(self, wtype: str, key: str) -> None:
        self.wrappers.get(wtype, {}).pop(key, None)


def test_strip_tokenfuse_removes_only_our_patches_and_never_touches_the_input() -> None:
    def ours(n: Any, c: Any, v: Any, e: Any) -> Any:
        return n, c, v

    ours.__module__ = "tokenfuse.scheduling.patches"

    def theirs(n: Any, c: Any, v: Any, e: Any) -> Any:
        return n, c, v

    theirs.__module__ = "custom_nodes.ipadapter"
    opts = {
        "transformer_options": {
            "patches": {"attn1_patch": [ours, theirs], "attn1_output_patch": [ours], "attn2_patch": [theirs]},
            "tokenfuse_plan": "plan",
        }
    }
    model = FakePatcher(opts, {"outer_sample": {"tokenfuse": [ours], "other": [theirs]}})
    off = strip_tokenfuse(model)
    to = off.model_options["transformer_options"]
    assert to["patches"]["attn1_patch"] == [theirs]
    assert to["patches"]["attn1_output_patch"] == []
    assert to["patches"]["attn2_patch"] == [theirs]
    assert to[DISABLED_KEY] is True
    assert off.wrappers["outer_sample"] == {"other": [theirs]}
    # the input model is untouched
    assert model.model_options["transformer_options"]["patches"]["attn1_patch"] == [ours, theirs]
    assert DISABLED_KEY not in model.model_options["transformer_options"]
    assert "tokenfuse" in model.wrappers["outer_sample"]


def test_strip_tokenfuse_unwraps_the_dit_attention_override() -> None:
    from tokenfuse.nodes.model_patching import chain_attention_override

    def ours(func: Any, *a: Any, **kw: Any) -> Any:
        return func(*a, **kw)

    ours.__module__ = "tokenfuse.scheduling.patches"

    def theirs(func: Any, *a: Any, **kw: Any) -> Any:
        return func(*a, **kw)

    alone = FakePatcher({"transformer_options": {"optimized_attention_override": ours}}, {})
    assert "optimized_attention_override" not in strip_tokenfuse(alone).model_options["transformer_options"]
    chained = chain_attention_override(ours, theirs)
    both = FakePatcher({"transformer_options": {"optimized_attention_override": chained}}, {})
    assert strip_tokenfuse(both).model_options["transformer_options"]["optimized_attention_override"] is theirs
    other = FakePatcher({"transformer_options": {"optimized_attention_override": theirs}}, {})
    assert strip_tokenfuse(other).model_options["transformer_options"]["optimized_attention_override"] is theirs


def test_node_declares_the_contract() -> None:
    spec = ScheduledFusion.INPUT_TYPES()
    req = spec["required"]
    for name in (
        "model",
        "vae",
        "positive",
        "negative",
        "image",
        "faces",
        "seed",
        "steps",
        "cfg",
        "sampler_name",
        "scheduler",
        "denoise",
        "guide_size",
        "max_size",
        "crop_factor",
        "feather",
        "faces_per_batch",
        "fallback",
    ):
        assert name in req, name
    assert req["guide_size"][1]["default"] == 512
    assert req["fallback"][0] == ["auto", "oom-only", "artifacts-only", "off"]
    assert set(spec["optional"]) == {"token_plan", "swap_model", "arcface_model", "source_image", "source_faces"}
    assert spec["optional"]["swap_model"][1]["default"] == "none"
    assert ScheduledFusion.RETURN_TYPES == ("IMAGE", "FACES", "STRING")


class TightMemoryStack(FakeStack):
    """A device where only crops up to `fits` px fit (the pre-flight estimate of issue 13)."""

    def __init__(self, fits: int) -> None:
        super().__init__()
        self.fits = fits
        self.checked: list[tuple[int, int, bool]] = []

    def backend(self) -> FusionBackend:
        backend = super().backend()

        def memory_check(batch: int, side: int, tiled: bool) -> str:
            self.checked.append((batch, side, tiled))
            return "" if side <= self.fits else f"{batch} crop(s) of {side}px need ~9.0 GiB but 1.0 GiB are free"

        return replace(backend, memory_check=memory_check)  # the backend is frozen


def test_memory_preflight_shrinks_the_guide_before_any_work() -> None:
    stack = TightMemoryStack(fits=64)
    crops, _, report, _ = _run(stack=stack, guide_size=128)
    assert [c["shape"][-1] for c in stack.ops("sample")] == [8]  # only the 64 px attempt was sampled
    assert stack.checked[0] == (1, 128, False) and stack.checked[-1][1] == 64
    assert "predicted out of memory" in report and "9.0 GiB" in report and "smaller_guide" in report
    assert crops.shape[0] == 1 and torch.isfinite(crops).all()


def test_memory_preflight_with_fallback_off_passes_the_face_through_unsampled() -> None:
    stack = TightMemoryStack(fits=0)
    crops, _, report, _ = _run(stack=stack, guide_size=128, fallback="off")
    assert stack.ops("sample") == [] and stack.ops("encode") == []
    assert "predicted out of memory" in report and "no fallback left" in report


@pytest.mark.parametrize(
    ("model", "vae", "cond", "name"),
    [
        ("MODEL", None, [], "model"),
        (SimpleNamespace(clone=1, model_options={}), "VAE", [], "vae"),
        (SimpleNamespace(clone=1, model_options={}), SimpleNamespace(encode=len, decode=len), "text", "positive"),
        (SimpleNamespace(clone=1, model_options={}), SimpleNamespace(encode=len, decode=len), [["c"]], "positive"),
    ],
)
def test_comfy_objects_are_checked_before_sampling(model: Any, vae: Any, cond: Any, name: str) -> None:
    from tokenfuse.nodes.fusion_node import _check_comfy_inputs

    with pytest.raises(TypeError, match=f"input '{name}' expects"):
        _check_comfy_inputs(model, vae, cond, cond)


def test_independent_frames_seed_each_frame_as_if_alone() -> None:
    """FaceSet.independent_frames (the service's batch of unrelated photos): face k of every frame uses seed + k, so a
    photo's faces get the seeds and the crops they get alone; the flag survives into the FACES output."""
    images, fs = astronaut_faceset(2, 2, crop_size=128)
    stack = FakeStack()
    args = dict(zip(("model", "vae", "positive", "negative"), LINKS, strict=True))
    crops, out, report = ScheduledFusion(stack.backend()).fuse(
        **args, image=torch.from_numpy(images), faces=replace(fs, independent_frames=True), seed=100, steps=4,
        cfg=5.0, sampler_name="euler", scheduler="normal", denoise=0.4, guide_size=128, max_size=1024,
        crop_factor=1.0, feather=0.04, faces_per_batch=2, fallback="auto",
    )  # fmt: skip
    assert [c["seeds"] for c in stack.ops("sample")] == [[100, 101], [100, 101]]
    assert "frame 1 face 1: ok, seed 101" in report and out.independent_frames
    alone, _, _, _ = _run(frames=1, faces_per_frame=2)
    assert torch.equal(crops[2:], alone)  # frame 1 of the batch == the same photo alone
    _, default, _, batch_stack = _run(frames=2, faces_per_frame=2)  # a ComfyUI batch: frame-major, unchanged
    assert [c["seeds"] for c in batch_stack.ops("sample")] == [
        [100, 101],
        [102, 103],
    ] and not default.independent_frames


# ---- ComfyUI's backend (nodes/glue/sampling.py) on stand-ins of comfy.sample / comfy.utils / model_management ----
class FakeProgressBar:
    """comfy.utils.ProgressBar: records every (value, total) it would show."""

    shown: list[tuple[int, int]] = []

    def __init__(self, total: int, node_id: Any = None) -> None:
        self.total, self.current = total, 0

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        self.total = self.total if total is None else total
        self.current = min(value, self.total)
        FakeProgressBar.shown.append((self.current, self.total))

    def update(self, value: int) -> None:
        self.update_absolute(self.current + value)


@pytest.fixture
def fake_comfy(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """comfy.sample.sample runs `steps` sampler steps, calling the callback after each as KSAMPLER does, and notes what
    the bar showed when each step's callback returned; no model is evaluated."""
    import sys
    import types

    seen = SimpleNamespace(steps=[], cancels=0)

    def sample(model: Any, noise: Any, steps: int, *a: Any, callback: Any = None, **kw: Any) -> torch.Tensor:
        latent = a[5]
        for i in range(steps):
            callback(i, latent, latent, steps)
            seen.steps.append(FakeProgressBar.shown[-1] if FakeProgressBar.shown else None)
        return latent

    def interrupted() -> None:
        seen.cancels += 1

    FakeProgressBar.shown = []
    comfy = types.ModuleType("comfy")
    comfy.sample = SimpleNamespace(  # type: ignore[attr-defined]
        fix_empty_latent_channels=lambda model, latent: latent,
        prepare_noise=lambda latent, seed: torch.zeros_like(latent),
        sample=sample,
    )
    comfy.utils = SimpleNamespace(PROGRESS_BAR_ENABLED=False, ProgressBar=FakeProgressBar)  # type: ignore[attr-defined]
    comfy.model_management = SimpleNamespace(  # type: ignore[attr-defined]
        throw_exception_if_processing_interrupted=interrupted, soft_empty_cache=lambda: None
    )
    for name in ("sample", "utils", "model_management"):
        monkeypatch.setitem(sys.modules, f"comfy.{name}", getattr(comfy, name))
    monkeypatch.setitem(sys.modules, "comfy", comfy)
    return seen


class FakeVae:
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(pixels.movedim(-1, 1), 8)

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        return F.interpolate(latent, scale_factor=8, mode="bilinear", align_corners=False).movedim(1, -1)


@pytest.mark.parametrize(("faces", "per_batch"), [(1, 1), (3, 2)])
def test_the_node_bar_moves_at_every_sampler_step(fake_comfy: SimpleNamespace, faces: int, per_batch: int) -> None:
    """The bar counted faces: one face showed 0/1 for the whole sampling, then 1/1. Now it counts faces x steps and
    the sampler callback (still the cancel point) moves it after every step, as KSampler's bar moves."""
    steps = 4
    images, fs = astronaut_faceset(1, faces, crop_size=128)
    model = SimpleNamespace(load_device=torch.device("cpu"))
    sampler = SamplerArgs(steps, 5.0, "euler", "normal", 0.4)
    backend = comfy_backend(ComfyInputs(model, FakeVae(), "p", "n"), sampler, faces, attempt_models(model))
    args = dict(seed=0, steps=steps, cfg=5.0, sampler_name="euler", scheduler="normal", denoise=0.4, guide_size=128)
    ScheduledFusion(backend).fuse(
        *LINKS, torch.from_numpy(images), fs, **args, max_size=1024, crop_factor=1.0, feather=0.04,
        faces_per_batch=per_batch, fallback="off",
    )  # fmt: skip
    total = faces * steps
    batches = [min(per_batch, faces - k) for k in range(0, faces, per_batch)]
    expected, done = [], 0
    for b in batches:
        expected += [(done * steps + b * (i + 1), total) for i in range(steps)]
        done += b
    assert fake_comfy.steps == expected, "the bar must move at every sampler step"
    assert FakeProgressBar.shown[-1] == (total, total)
    assert [v for v, _ in FakeProgressBar.shown] == sorted(v for v, _ in FakeProgressBar.shown), "never backwards"
    assert fake_comfy.cancels >= len(batches) * steps, "every step is still a cancel point"


def test_without_a_step_bar_the_backend_shows_nothing(fake_comfy: SimpleNamespace) -> None:
    """VideoFaceFusion's backend: its frame bar is the visible one, so sampling must not move a bar of its own."""
    images, fs = astronaut_faceset(1, 1, crop_size=128)
    model = SimpleNamespace(load_device=torch.device("cpu"))
    sampler = SamplerArgs(4, 5.0, "euler", "normal", 0.4)
    backend = comfy_backend(ComfyInputs(model, FakeVae(), "p", "n"), sampler, 1, attempt_models(model), step_bar=False)
    ScheduledFusion(backend).fuse(*LINKS, torch.from_numpy(images), fs, *WIDGETS)
    assert FakeProgressBar.shown == [] and fake_comfy.cancels >= 4


def test_the_step_bar_never_goes_back_when_a_batch_is_rerun(monkeypatch: pytest.MonkeyPatch) -> None:
    """After an out-of-memory error a batch of 2 faces is rerun face by face from the same starting point: the bar
    walked back over the batch's span for each face."""
    from tokenfuse.nodes.glue import env

    shown: list[int] = []
    bar = type("Bar", (), {"update_absolute": lambda self, value, total=None: shown.append(value)})()
    monkeypatch.setattr(env, "progress_bar", lambda total: bar)
    steps = env.StepProgress(faces=2, steps=4)
    first = steps.on_step(2)
    for i in (1, 2, 3):  # the batch of two runs 3 of 4 steps, then runs out of memory
        first(i, 4)
    for _ in range(2):  # rerun face by face
        single = steps.on_step(1)
        for i in range(1, 5):
            single(i, 4)
        steps.face_done()
    assert shown == sorted(shown) and shown[-1] == 8, shown
