"""Four behaviours a mutation pass could break without any test failing (issue 8), now pinned.

- the family detector's SDXL-by-depth clause (a U-Net with no attention at full resolution is SDXL-like);
- the kept-tokens figure in ScheduledFusion's report (the crop plan's level-/8 budget of that face);
- the anti-alias blur before the context -> crop warp (strong shrinks must not alias);
- the protect clause of the importance plan (tokens at or above the threshold are kept whole).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
from test_fusion_geometry import astronaut_faceset
from test_fusion_node import _run
from tokenfuse.faces.importance import PlanOptions, build_plan, kept_fraction
from tokenfuse.fusion.refine import _back_to_crop
from tokenfuse.nodes.glue import patcher


def _stand_in(config_name: str, depth: list[int]) -> Any:
    """A ModelPatcher-shaped stand-in: only class names and unet_config are read by detect_family."""
    diffusion = type("UNetModel", (), {})()
    config = type(config_name, (), {"unet_config": {"transformer_depth": depth}})()
    base = type("BaseModel", (), {"model_config": config, "diffusion_model": diffusion})()
    return type("ModelPatcher", (), {"model": base})()


def test_sdxl_like_unet_detected_by_depth() -> None:
    """A config class the detector does not know by name (a community SDXL derivative) with no attention at the
    first level is scheduled with the SDXL level layout; attention at the first level means SD1.5 layout."""
    sdxl_like = patcher.detect_family(_stand_in("CommunityXL", [0, 0, 2, 2, 10, 10]))
    sd_like = patcher.detect_family(_stand_in("CommunityXL", [1, 1, 1, 1, 1, 1, 0, 0]))
    no_depth = patcher.detect_family(_stand_in("CommunityXL", []))
    assert (sdxl_like.family, sdxl_like.route, sdxl_like.name) == ("sdxl", "unet", "CommunityXL")
    assert (sd_like.family, no_depth.family) == ("sd15", "sd15")


def test_report_shows_each_faces_kept_tokens() -> None:
    from tokenfuse.scheduling.plan import TokenPlan

    frame_plan = TokenPlan(importance=torch.ones(1, 64, 64), image_size=(512, 512))
    _, _, report, stack = _run(faces_per_frame=2, token_plan=frame_plan)
    plan = stack.ops("sample")[0]["plan"]
    figures = [int(n) for n in re.findall(r"tokens 256 \(plan keeps ~(\d+)\)", report)]
    assert figures == [plan.budgets[0][8], plan.budgets[1][8]], report
    assert all(0 < n < 256 for n in figures)  # the level-/8 budget, not the uniform count


def _checkerboard(side: int) -> np.ndarray:
    yy, xx = np.mgrid[0:side, 0:side]
    return np.repeat(((yy + xx) % 2).astype(np.float32)[..., None], 3, axis=-1)


def test_strong_shrink_is_blurred_before_the_warp() -> None:
    """A 1-px checkerboard shrunk 4x must come out near its mean (bilinear sampling alone aliases it to 0/1)."""
    ctx = _checkerboard(512)
    m_c = np.array([[4.0, 0.0, 0.3], [0.0, 4.0, 0.7]])  # crop -> context, 4x, sub-pixel offset
    out = _back_to_crop(ctx, m_c, 128)
    assert out.shape == (128, 128, 3) and out.dtype == np.float32
    assert abs(float(out.mean()) - 0.5) < 0.05 and float(out[8:-8, 8:-8].std()) < 0.1
    # a mild scale is not blurred: the identity warp returns the context unchanged
    same = _back_to_crop(ctx[:128, :128], np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), 128)
    assert np.array_equal(same, ctx[:128, :128])


def test_protected_tokens_are_kept_whole() -> None:
    opts = PlanOptions(min_keep=0.1, protect_threshold=0.5)
    imp = torch.tensor([0.05, 0.3, 0.5, 0.6, 1.0])
    assert torch.allclose(kept_fraction(imp, opts), torch.tensor([0.1, 0.3, 1.0, 1.0, 1.0]))


def test_protect_threshold_changes_plan_budgets() -> None:
    """Through build_plan: with the threshold below the hull's importance the whole hull is kept (budget grows);
    above it, hull tokens keep only their importance."""
    _, faces = astronaut_faceset()
    low = build_plan(faces, (64, 64), PlanOptions(face_weight=0.6, protect_threshold=0.5))
    high = build_plan(faces, (64, 64), PlanOptions(face_weight=0.6, protect_threshold=0.95))
    assert low.budgets[0][8] > high.budgets[0][8]
