"""The patches' hot path (issue 11): per call a lookup in a table built once per (latent shape, step window, plan).

Checked by behaviour on ComfyUI's call pattern (a fresh extra_options dict per block, a new `sigmas` tensor and
`original_shape` list per model call): the grid is inferred once per table entry, not per call; a new resolution,
step window or plan gets its own entry; the fast todo path gives the same K/V as the pooling function; a K/V input
another patch already replaced still takes the general path.
"""

from __future__ import annotations

import pytest
import tokenfuse.scheduling.unet_eager as unet_eager
import torch
from tokenfuse.scheduling.downsample import pool_tokens
from tokenfuse.scheduling.patches import build_unet_patches
from tokenfuse.scheduling.plan import TokenPlan
from tokenfuse.scheduling.schedule import Schedule, preset_schedule
from tokenfuse.scheduling.telemetry import RunTelemetry

STEPS = 10
SAMPLE_SIGMAS = torch.linspace(14.6, 0.0, STEPS + 1)
# SD1.5's 16 transformer blocks by level, in call order
LEVELS = [8, 8, 16, 16, 32, 32, 64, 32, 32, 32, 16, 16, 16, 8, 8, 8]


def model_call(
    f, g, side: int, step: int, plan: TokenPlan | None = None, batch: int = 2
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One U-Net model call's attn1 patch calls; returns (n, ctx) per block."""
    topts = {"original_shape": [batch, 4, side, side], "sigmas": SAMPLE_SIGMAS[step : step + 1].clone()}
    topts["sample_sigmas"] = SAMPLE_SIGMAS
    if plan is not None:
        topts["tokenfuse_plan"] = plan
    out = []
    for tidx, level in enumerate(LEVELS):
        s = side
        while level > 8:
            s, level = (s + 1) // 2, level // 2
        eo = dict(topts, block=("input", tidx), block_index=0, transformer_index=tidx)
        n = torch.randn(batch, s * s, 8, generator=torch.Generator().manual_seed(tidx))
        n2, ctx, _ = f(n, n, n, eo)
        g(n2, eo)
        out.append((n, ctx))
    return out


@pytest.fixture
def grid_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts infer_grid calls (the per-call host work the table replaces)."""
    calls: list[int] = []
    real = unet_eager.infer_grid

    def counting(n_tokens, original_shape):
        calls.append(n_tokens)
        return real(n_tokens, original_shape)

    monkeypatch.setattr(unet_eager, "infer_grid", counting)
    return calls


def test_grid_is_inferred_once_per_entry_not_per_call(grid_calls: list[int]) -> None:
    schedule = Schedule(strategy="todo", ratios={8: 0.75, 16: 0.75}, protect_blocks=0, end_percent=0.5)
    telemetry = RunTelemetry()
    f, g = build_unet_patches(schedule, telemetry)
    for step in range(STEPS):
        model_call(f, g, 16, step)
    # two rows (inside / outside the step window) x 16 blocks, over 10 model calls of 16 attention calls
    assert len(grid_calls) == 2 * len(LEVELS)
    assert telemetry.calls == STEPS * len(LEVELS)
    reduced_steps = {r.step for r in telemetry.records if r.kv_out < r.kv_in}
    assert reduced_steps == set(range(STEPS // 2))


def test_fast_todo_path_matches_the_pool_and_new_resolution_gets_its_row(grid_calls: list[int]) -> None:
    f, g = build_unet_patches(preset_schedule("balanced", "sd15"), RunTelemetry())
    for side in (16, 24, 16):
        for (n, ctx), level in zip(model_call(f, g, side, 0), LEVELS, strict=True):
            s = int(n.shape[1] ** 0.5)
            if level in (8, 16):
                assert torch.equal(ctx, pool_tokens(n, s, s, (2, 2)))
            else:
                assert ctx is n  # identity: the same object back
    assert len(grid_calls) == 2 * len(LEVELS)  # 16 -> 24 -> 16: the 16 row is reused


def test_kv_replaced_by_an_earlier_patch_takes_the_general_path() -> None:
    f, _ = build_unet_patches(preset_schedule("balanced", "sd15"), RunTelemetry())
    eo = {"original_shape": [1, 4, 8, 8], "sigmas": SAMPLE_SIGMAS[:1], "sample_sigmas": SAMPLE_SIGMAS}
    eo["transformer_index"] = 0
    n, other = torch.randn(1, 64, 8), torch.randn(1, 64, 8)
    _, ctx, val = f(n, other, n, dict(eo))
    assert torch.equal(ctx, pool_tokens(other, 8, 8, (2, 2))) and torch.equal(val, pool_tokens(n, 8, 8, (2, 2)))


def test_a_new_plan_gets_fresh_entries(grid_calls: list[int]) -> None:
    f, g = build_unet_patches(preset_schedule("balanced", "sd15"), RunTelemetry())
    imp = torch.full((1, 128, 128), 0.1)
    imp[:, 32:96, 32:96] = 1.0
    plan_a = TokenPlan(importance=imp, image_size=(128, 128))
    plan_b = TokenPlan(importance=torch.full((1, 128, 128), 0.1), image_size=(128, 128))
    with_face = model_call(f, g, 16, 0, plan_a)
    without = model_call(f, g, 16, 0, plan_b)
    assert len(grid_calls) == 2 * len(LEVELS)
    # plan A keeps the face's K/V tokens at full resolution, plan B (no face) pools everything
    assert with_face[0][1].shape[1] > without[0][1].shape[1] == 64
