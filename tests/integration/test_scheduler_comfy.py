"""TokenSchedulerController inside real ComfyUI sampling: KSampler on random-weight SD1.5 / SDXL / Flux models.

Checks: the output changes when active, is bit-identical with preset off, telemetry counts the reduced tokens, the
input MODEL is untouched, and other attention patches (TomePatchModel's attn1 patch, an IPAdapter-style attn2
replacement) keep running next to ours.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from tokenfuse.nodes.glue import patcher
from tokenfuse.nodes.model_patching import schedule_model
from tokenfuse.nodes.scheduler_node import TokenSchedulerController, schedule_from_widgets
from tokenfuse.scheduling.schedule import Schedule

pytestmark = pytest.mark.integration
NODE = TokenSchedulerController()
SIZE = 128  # px: latent 16x16, level /8 = 256 tokens


def ksample(comfy: SimpleNamespace, model, family: str, steps: int = 3, cfg: float = 2.0) -> torch.Tensor:
    """ComfyUI's KSampler (nodes.common_ksampler) with euler/normal, seed 0; cfg > 1 runs cond + uncond (batch 2)."""
    pos = comfy.models.conditioning(family, seed=1, tiny=True)
    neg = comfy.models.conditioning(family, seed=2, tiny=True)
    latent = {"samples": torch.zeros(1, comfy.models.latent_channels(family), SIZE // 8, SIZE // 8)}
    (out,) = comfy.nodes.common_ksampler(model, 0, steps, cfg, "euler", "normal", pos, neg, latent)
    samples = out["samples"]
    assert torch.isfinite(samples).all(), "random-weight model produced NaN/Inf"
    return samples


def run_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "tokens saved" in r.getMessage()]


@pytest.fixture(scope="module")
def baselines(comfy: SimpleNamespace, random_model) -> dict[str, torch.Tensor]:
    return {fam: ksample(comfy, random_model(fam), fam) for fam in ("sd15", "sdxl")}


@pytest.mark.parametrize(("family", "levels"), [("sd15", {8: 4, 16: 4}), ("sdxl", {16: 4, 32: 2})])
def test_ksampler_runs_through_the_scheduler(comfy, random_model, baselines, caplog, family, levels) -> None:
    model = random_model(family)
    assert patcher.detect_family(model).family == family
    before = repr(model.model_options)
    with caplog.at_level(logging.INFO):
        patched, report = NODE.apply(model, "balanced", "preset", 0.0)
        out = ksample(comfy, patched, family)
    assert repr(model.model_options) == before, "the input MODEL was mutated"
    assert f"({family}, attn1 patches)" in report
    assert not torch.equal(out, baselines[family])
    (line,) = run_lines(caplog)  # one summary line per sampling run
    assert "attention calls reduced over 3 steps" in line and "peak RSS" in line

    # Telemetry: K/V shrink by the preset's pooling factor at its levels, queries keep their count.
    schedule = schedule_from_widgets("balanced", "preset", 0.0, family)
    patched2, telemetry = schedule_model(model, schedule, patcher.detect_family(model))
    ksample(comfy, patched2, family)
    summary = telemetry.summary()
    assert summary["reduced_calls"] > 0 and summary["kv_tokens_out"] < summary["kv_tokens_in"]
    assert summary["q_tokens_out"] == summary["q_tokens_in"]
    assert telemetry.per_step  # aggregated per (step, level); per-call records only with a telemetry file
    for (step, level), agg in telemetry.per_step.items():
        assert agg[4] == agg[5] * levels.get(level, 1), (step, level, agg)


@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_preset_off_is_bit_identical(comfy, random_model, baselines, family) -> None:
    patched, report = NODE.apply(random_model(family), "off", "tome", 0.5)
    assert torch.equal(ksample(comfy, patched, family), baselines[family])
    assert "off (identity)" in report


def test_tome_strategy_runs_and_unmerges(comfy, random_model, baselines) -> None:
    schedule = schedule_from_widgets("balanced", "tome", 0.5, "sd15")
    model = random_model("sd15")
    patched, telemetry = schedule_model(model, schedule, patcher.detect_family(model))
    out = ksample(comfy, patched, "sd15")
    assert not torch.equal(out, baselines["sd15"])
    assert telemetry.summary()["q_tokens_out"] < telemetry.summary()["q_tokens_in"]


def test_chains_with_tome_and_an_attn2_replacement(comfy, random_model, baselines, caplog) -> None:
    """TomePatchModel (attn1 patch before ours) and an IPAdapter-style attn2 replace keep running. Tome's merge at
    the full-resolution level hides that level's grid from ours: TokenFuse leaves it alone and says so, once."""
    from comfy.ldm.modules.attention import optimized_attention
    from comfy_extras.nodes_tomesd import TomePatchModel

    model = random_model("sd15")
    calls = {"attn2": 0}

    def attn2_replace(q, k, v, extra_options):
        calls["attn2"] += 1
        return optimized_attention(q, k, v, extra_options["n_heads"])

    other = TomePatchModel.execute(model, 0.5).result[0]
    other.set_model_attn2_replace(attn2_replace, "input", 1)
    schedule = schedule_from_widgets("balanced", "preset", 0.0, "sd15")
    patched, telemetry = schedule_model(other, schedule, patcher.detect_family(other))
    assert len(patched.model_options["transformer_options"]["patches"]["attn1_patch"]) == 2
    with caplog.at_level(logging.WARNING):
        out = ksample(comfy, patched, "sd15")
    assert calls["attn2"] > 0 and telemetry.summary()["reduced_calls"] > 0
    grid = [r.getMessage() for r in caplog.records if "matches no latent grid" in r.getMessage()]
    assert len(grid) == 1 and "Apply TomePatchModel after TokenSchedulerController" in grid[0], grid
    assert not torch.equal(out, baselines["sd15"])
    assert "attn1_patch" in other.model_options["transformer_options"]["patches"]
    assert len(other.model_options["transformer_options"]["patches"]["attn1_patch"]) == 1  # Tome's clone untouched


def test_flux_attention_override(comfy, random_model, caplog) -> None:
    model = random_model("flux")
    assert patcher.detect_family(model) == patcher.ModelFamily("dit", "override", "Flux")
    base = ksample(comfy, model, "flux")
    with caplog.at_level(logging.INFO):
        patched, report = NODE.apply(model, "balanced", "preset", 0.0, schedule_text='{"protect_blocks": 0}')
        out = ksample(comfy, patched, "flux")
    assert "optimized_attention_override" not in model.model_options["transformer_options"]
    assert "(dit, attention override)" in report
    assert not torch.equal(out, base)
    (line,) = run_lines(caplog)
    assert "0/0" not in line
    off, _ = NODE.apply(model, "off", "preset", 0.0)
    assert torch.equal(ksample(comfy, off, "flux"), base)


def test_sd3_attention_override(comfy, random_model, caplog) -> None:
    """SD3's MMDiT (random weights, two joint blocks) reaches the override in ComfyUI 0.3.64: `balanced` reduces every
    joint attention call (odd latent 17 x 13, cond + uncond batched); `off` is bit-identical. Before, SD3 passed
    through unchanged."""
    model = random_model("sd3")
    assert patcher.detect_family(model) == patcher.ModelFamily("dit", "override", "SD3")

    def sample(m) -> torch.Tensor:
        pos = comfy.models.conditioning("sd3", seed=1, tiny=True)
        neg = comfy.models.conditioning("sd3", seed=2, tiny=True)
        latent = {"samples": torch.zeros(1, comfy.models.latent_channels("sd3"), 17, 13)}
        (out,) = comfy.nodes.common_ksampler(m, 0, 2, 2.0, "euler", "normal", pos, neg, latent)
        assert torch.isfinite(out["samples"]).all()
        return out["samples"]

    base = sample(model)
    with caplog.at_level(logging.INFO):
        patched, report = NODE.apply(model, "balanced", "preset", 0.0)
        out = sample(patched)
    assert "SD3 (dit, attention override)" in report and not torch.equal(out, base)
    (line,) = run_lines(caplog)
    assert " 4/4 attention calls reduced" in line, line
    assert torch.equal(sample(NODE.apply(model, "off", "preset", 0.0)[0]), base)


def test_flux_reads_a_token_plan_on_its_patchified_grid(comfy, random_model) -> None:
    """A TOKEN_PLAN on Flux (odd latent 17 x 13: a 9 x 7 token grid after 2x2 patches, after the prompt's tokens): a
    plan protecting every pixel keeps every K/V token (bit-identical to the unscheduled model), a face plan keeps
    fewer than that and more than no plan. Before, the override never read the plan."""
    from tokenfuse.scheduling.plan import TokenPlan

    h, w = 136, 104
    model = random_model("flux")

    def sample(m) -> torch.Tensor:
        pos = comfy.models.conditioning("flux", seed=1, tiny=True)
        neg = comfy.models.conditioning("flux", seed=2, tiny=True)
        latent = {"samples": torch.zeros(1, comfy.models.latent_channels("flux"), h // 8, w // 8)}
        (out,) = comfy.nodes.common_ksampler(m, 0, 2, 2.0, "euler", "normal", pos, neg, latent)
        assert torch.isfinite(out["samples"]).all()
        return out["samples"]

    imp = torch.full((1, h, w), 0.1)
    imp[:, 20:80, 20:70] = 1.0
    base = sample(model)
    everything, _ = NODE.apply(model, "balanced", "preset", 0.0, token_plan=TokenPlan(torch.ones(1, h, w), (h, w)))
    assert torch.equal(sample(everything), base)
    no_plan = sample(NODE.apply(model, "balanced", "preset", 0.0)[0])
    face = sample(NODE.apply(model, "balanced", "preset", 0.0, token_plan=TokenPlan(imp, (h, w)))[0])
    assert not torch.equal(face, base) and not torch.equal(face, no_plan) and not torch.equal(no_plan, base)


def test_patches_added_after_ours_keep_working(comfy, random_model) -> None:
    """TomePatchModel applied on top of our clone: both attn1 patches run, in registration order."""
    from comfy_extras.nodes_tomesd import TomePatchModel

    model = random_model("sd15")
    schedule = schedule_from_widgets("balanced", "tome", 0.5, "sd15")
    ours, telemetry = schedule_model(model, schedule, patcher.detect_family(model))
    both = TomePatchModel.execute(ours, 0.5).result[0]
    ksample(comfy, both, "sd15")
    assert telemetry.summary()["q_tokens_out"] < telemetry.summary()["q_tokens_in"]
    assert len(ours.model_options["transformer_options"]["patches"]["attn1_patch"]) == 1


def test_live_stats_per_step_in_a_real_run(comfy, random_model, monkeypatch) -> None:
    events: list[dict] = []
    instance = SimpleNamespace(send_sync=lambda event, data, sid=None: events.append(data), client_id=None)
    monkeypatch.setitem(sys.modules, "server", SimpleNamespace(PromptServer=SimpleNamespace(instance=instance)))
    patched, _ = NODE.apply(random_model("sd15"), "balanced", "preset", 0.0, unique_id="7")
    ksample(comfy, patched, "sd15", steps=3)
    assert [e["step"] for e in events] == [1, 2, 3, 3] and {e["steps"] for e in events} == {3}
    assert events[-1]["final"] and "tokens saved" in events[-1]["summary"]
    levels = {lv["level"]: lv for lv in events[0]["levels"]}
    assert levels[8]["tokens_out"] * 4 == levels[8]["tokens_in"] == (SIZE // 8) ** 2


def test_adaptive_ratio_lags_a_step_and_runs_repeat(comfy, random_model) -> None:
    """The adaptive ratio (lowvram presets; strength 1 here so that kernels flip) reads the statistic the previous step
    measured (no device sync): step 0 keeps the base ratio, later steps follow the tokens; a new sampling run starts
    over, so the same patched model samples the same twice (a statistic left over from the last run would change
    run 2's first step)."""
    model = random_model("sd15")
    family = patcher.detect_family(model)
    schedule = Schedule(strategy="todo", ratios={8: 0.6, 16: 0.6}, protect_blocks=0, adaptive=1.0)

    def kv_out_per_step(s: Schedule) -> tuple[torch.Tensor, dict[int, int]]:
        patched, telemetry = schedule_model(model, s, family)
        out = ksample(comfy, patched, "sd15", steps=4)
        return out, {step: agg[5] for (step, level), agg in telemetry.per_step.items() if level == 8}

    fixed = kv_out_per_step(replace(schedule, adaptive=0.0))[1]
    patched, telemetry = schedule_model(model, schedule, family)
    first = ksample(comfy, patched, "sd15", steps=4)
    adapted = {step: agg[5] for (step, level), agg in telemetry.per_step.items() if level == 8}
    second = ksample(comfy, patched, "sd15", steps=4)
    assert torch.equal(first, second), "the second run adapted differently"
    assert adapted[0] == fixed[0], (adapted, fixed)  # the first step: the base ratio
    assert adapted != fixed, f"no step adapted: {adapted} vs {fixed}"


@pytest.mark.parametrize("other", ["PerturbedAttentionGuidance", "SelfAttentionGuidance", "HyperTile"])
@pytest.mark.parametrize("strategy", ["preset", "tome", "topk"])
@pytest.mark.parametrize("ours_first", [True, False])
def test_nodes_that_need_the_blocks_own_attention(comfy, random_model, caplog, other, strategy, ours_first) -> None:
    """PAG / SAG replace the middle block's attention and expect its own K/V (lowvram_4gb reduces /64: PAG's output
    had half the tokens, SAG's map could not be reshaped: both crashed); HyperTile's tiles have the token count of a
    coarser level (tome merged the tiles, top-K's K/V could not be tiled: both crashed). Those calls stay unreduced,
    the others are reduced, in either order of the nodes, and sampling gives finite samples."""
    import importlib

    model = random_model("sd15")
    if other == "HyperTile":
        node = importlib.import_module("comfy_extras.nodes_hypertile").HyperTile
        apply = lambda m: node.execute(m, 64, 1, 0, False)[0]  # noqa: E731 - tiles of /8 at 128 px
    elif other == "PerturbedAttentionGuidance":
        node = importlib.import_module("comfy_extras.nodes_pag").PerturbedAttentionGuidance
        apply = lambda m: node.execute(m, 3.0)[0]  # noqa: E731
    else:
        node = importlib.import_module("comfy_extras.nodes_sag").SelfAttentionGuidance
        apply = lambda m: node.execute(m, 0.5, 2.0)[0]  # noqa: E731
    schedule = schedule_from_widgets("lowvram_4gb", strategy, 0.0, "sd15")
    schedule_of = lambda m: schedule_model(m, schedule, patcher.detect_family(m))  # noqa: E731
    if ours_first:
        ours, telemetry = schedule_of(model)
        both = apply(ours)
    else:
        both, telemetry = schedule_of(apply(model))
    with caplog.at_level(logging.WARNING):
        ksample(comfy, both, "sd15", steps=2)
    said = " ".join(r.getMessage() for r in caplog.records)
    if other == "HyperTile" and strategy == "topk" and ours_first:  # top-K's K/V are no grid to tile: all alone
        assert telemetry.summary()["reduced_calls"] == 0 and "strategy topk leaves attention unreduced" in said
        return
    assert telemetry.summary()["reduced_calls"] > 0
    if other != "HyperTile":
        assert "('middle', 0" in said and "left unreduced" in said, said
