"""fusion.refine.refine_crops, the one crop-batch entry (VideoFaceFusion, the runner's chunks, the core engine):
batching, seeds as given, fallbacks, per-crop reports, the crop hooks, and equality with the photo path."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_fusion_geometry import astronaut_faceset
from test_fusion_node import FakeStack
from tokenfuse.faces.align import template
from tokenfuse.faces.types import FaceSet
from tokenfuse.fusion.backend import CropHooks
from tokenfuse.fusion.crops import aligned_crop
from tokenfuse.fusion.fallback import FallbackConfig
from tokenfuse.fusion.refine import FusionSettings, crop_face, refine_crops
from tokenfuse.fusion.run import run_fusion

SIDE = 128


def _crops(n: int) -> np.ndarray:
    """n real aligned face crops [n, 128, 128, 3] (the astronaut, shifted a little per crop)."""
    images, fs = astronaut_faceset(1, n, crop_size=SIDE)
    return np.stack([aligned_crop(images[0], f, SIDE, 1.0, SIDE) for f in fs.faces[0]])


def _settings(**kw: object) -> FusionSettings:
    return replace(FusionSettings(guide_size=SIDE, max_size=SIDE, faces_per_batch=2), **kw)  # type: ignore[arg-type]


def test_batches_in_order_with_the_seeds_given_and_one_report_per_crop() -> None:
    stack = FakeStack()
    crops = _crops(3)
    out, reports = refine_crops(crops, [7, 7, 9], _settings(), stack.backend())
    assert [c["seeds"] for c in stack.ops("sample")] == [[7, 7], [9]]
    assert [c["shape"] for c in stack.ops("sample")] == [(2, 3, 16, 16), (1, 3, 16, 16)]  # the crops, no mosaic
    assert out.shape == crops.shape and out.dtype == np.float32 and 0.0 <= out.min() and out.max() <= 1.0
    assert [(r.index, r.seed, r.status) for r in reports] == [(0, 7, "ok"), (1, 7, "ok"), (2, 9, "ok")]
    assert {r.frame for r in reports} == {0}
    assert all(r.context_side == SIDE and r.tokens == (SIDE // 8) ** 2 for r in reports)
    assert stack.progress == 3, "progress once per crop"
    assert all(not np.array_equal(o, c) for o, c in zip(out, crops, strict=True)), "every crop was refined"


def test_a_crop_result_depends_on_its_pixels_and_seed_only() -> None:
    crops = _crops(3)
    together, _ = refine_crops(crops, [1, 2, 3], _settings(faces_per_batch=3), FakeStack().backend())
    alone, _ = refine_crops(crops, [1, 2, 3], _settings(faces_per_batch=1), FakeStack().backend())
    again, _ = refine_crops(crops, [1, 2, 3], _settings(faces_per_batch=3), FakeStack().backend())
    assert np.array_equal(together, again)
    np.testing.assert_allclose(together, alone, atol=1e-5)
    other, _ = refine_crops(crops, [1, 2, 4], _settings(faces_per_batch=3), FakeStack().backend())
    assert np.array_equal(other[:2], together[:2]) and not np.allclose(other[2], together[2])


def test_oom_splits_the_batch_then_goes_down_the_chain_cutting_from_the_crop() -> None:
    stack = FakeStack(oom_times=3)  # the pair (-> split), crop 0 alone (-> tiled VAE), again (-> smaller guide)
    settings = _settings(fallback=FallbackConfig(min_guide=64, max_size=SIDE))
    out, reports = refine_crops(_crops(2), [5, 6], settings, stack.backend())
    assert [c["seeds"] for c in stack.ops("sample")] == [[5, 6], [5], [5], [5], [6]]
    assert [c["shape"][-1] for c in stack.ops("sample")] == [16, 16, 16, 8, 16]  # guide 128 -> 64 for crop 0
    assert out.shape == (2, SIDE, SIDE, 3), "a smaller guide still returns crops at their own side"
    assert [r.status for r in reports] == ["fallback", "fallback"]
    assert [f.split(":")[0] for f in reports[0].fallbacks] == ["split_batch", "tiled_vae", "smaller_guide"]
    assert reports[0].context_side == 64 and reports[1].context_side == SIDE


def test_artifacts_rerun_with_scheduling_off() -> None:
    stack = FakeStack()

    def sample(model: str, latent: torch.Tensor, mask: torch.Tensor, seeds: list[int], plan: object) -> torch.Tensor:
        out = stack.sample(model, latent, mask, seeds, plan)
        for i, s in enumerate(seeds):
            if s == 6 and model == "patched":
                out[i] = float("nan")  # a diverged sampler: the artifact check must catch it
        return out

    out, reports = refine_crops(_crops(2), [5, 6], _settings(), replace(stack.backend(), sample=sample))
    assert [(c["model"], c["seeds"]) for c in stack.ops("sample")] == [("patched", [5, 6]), ("unscheduled", [6])]
    assert reports[0].status == "ok" and reports[1].fallbacks[0].startswith("scheduling_off")
    assert any(w.startswith("artifact: ") for w in reports[1].warnings) and np.isfinite(out).all()


def test_a_crop_that_fails_everything_comes_back_unchanged() -> None:
    crops = _crops(2)
    settings = _settings(fallback=FallbackConfig(mode="off"))
    out, reports = refine_crops(crops, [5, 6], settings, FakeStack(oom_times=1).backend())
    assert np.array_equal(out, crops)
    assert [r.status for r in reports] == ["passthrough", "passthrough"]
    assert "out of memory; no fallback left" in reports[0].warnings
    assert "face passed through unchanged" in reports[0].warnings


def test_hooks_see_the_crop_and_its_template_landmarks() -> None:
    seen: list[tuple[tuple[int, ...], np.ndarray]] = []

    def pre_swap(crop: np.ndarray, lm: np.ndarray) -> np.ndarray:
        seen.append((crop.shape, lm))
        return crop

    backend = replace(FakeStack().backend(), hooks=CropHooks(pre_swap=pre_swap))
    refine_crops(_crops(2), [1, 2], _settings(), backend, crop_factor=1.3)
    assert [s for s, _ in seen] == [(SIDE, SIDE, 3)] * 2
    for _, lm in seen:
        np.testing.assert_array_equal(lm, template(SIDE, 1.3).astype(np.float32))


def test_refine_crops_is_the_photo_path_on_the_same_pixels() -> None:
    """run_fusion (faces in frames) and refine_crops share one loop: a crop given as a one-face photo of itself
    comes out the same."""
    crops = _crops(2)
    out, _ = refine_crops(crops, [11, 12], _settings(faces_per_batch=1), FakeStack().backend())
    face = crop_face(SIDE)
    for k in range(2):
        fs = FaceSet((SIDE, SIDE), ((face,),))
        res = run_fusion(crops[k][None], fs, _settings(seed=11 + k, faces_per_batch=1), FakeStack().backend())
        assert np.array_equal(res.crops[0], out[k])


def test_one_seed_per_crop() -> None:
    with pytest.raises(ValueError, match="one seed per crop"):
        refine_crops(_crops(2), [1], _settings(), FakeStack().backend())


def test_denoise_zero_crops_come_back_as_prepared() -> None:
    from tokenfuse.fusion.backend import unsampled

    crops = _crops(2)
    out, _ = refine_crops(crops, [1, 2], _settings(), unsampled(FakeStack().backend()))
    mask = torch.from_numpy(crop_face(SIDE).mask)[..., None].numpy()
    np.testing.assert_allclose(out * mask, crops * mask, atol=1e-5)
