"""The fallback policy as pure logic: ordered actions, stop conditions, and the report that makes them visible."""

from __future__ import annotations

from tokenfuse.fusion.fallback import (
    Attempt,
    FaceReport,
    FallbackConfig,
    after_artifact,
    after_oom,
    format_report,
    stronger_preset,
)

PRESETS = ("balanced", "lowvram_8gb", "lowvram_6gb", "lowvram_4gb")


def _walk_oom(attempt: Attempt, cfg: FallbackConfig, batch: int = 1) -> list[str]:
    actions = []
    while True:
        step = after_oom(attempt, cfg, batch)
        if step is None:
            return actions
        attempt, action, _ = step
        actions.append(action)


def test_oom_chain_order_with_scheduler_api() -> None:
    cfg = FallbackConfig(mode="auto", stronger_presets=PRESETS, min_guide=256)
    start = Attempt(guide_size=512)
    assert _walk_oom(start, cfg, batch=3) == ["split_batch", "stronger_preset", "tiled_vae", "smaller_guide"]
    # The incoming schedule is unknown: the stronger preset is the strongest there is, applied once.
    step = after_oom(Attempt(guide_size=512, single=True), cfg)
    assert step is not None and step[0].preset == "lowvram_4gb" and step[1] == "stronger_preset"
    # A known preset steps to the next one.
    step = after_oom(Attempt(preset="balanced"), cfg)
    assert step is not None and step[0].preset == "lowvram_8gb"


def test_smaller_guide_always_samples_a_smaller_crop() -> None:
    """guide 1024 x crop_factor 2 capped by max_size 1024 samples 1024 px; halving the guide to 512 still samples
    1024 px (the cap), so the "smaller" retry ran out of memory the same way. It halves until the side shrinks."""
    cfg = FallbackConfig(min_guide=256, crop_factor=2.0, max_size=1024)
    step = after_oom(Attempt(guide_size=1024, single=True, scheduling=False, tiled_vae=True), cfg)
    assert step is not None and step[1] == "smaller_guide"
    assert step[0].guide_size == 256 and "sampled side 1024 -> 512" in step[2], step
    assert after_oom(Attempt(guide_size=256, single=True, scheduling=False, tiled_vae=True), cfg) is None


def test_oom_chain_without_scheduler_api_reports_the_skip() -> None:
    cfg = FallbackConfig(mode="auto", stronger_presets=(), min_guide=128)
    step = after_oom(Attempt(guide_size=512), cfg)
    assert step is not None
    attempt, action, detail = step
    assert action == "tiled_vae" and attempt.tiled_vae and "stronger preset skipped" in detail
    guides = []
    while (step := after_oom(attempt, cfg)) is not None:
        attempt, action, _ = step
        assert action == "smaller_guide"
        guides.append(attempt.guide_size)
    assert guides == [256, 128]  # halves, never below min_guide


def test_scheduling_off_skips_the_preset_step() -> None:
    cfg = FallbackConfig(stronger_presets=PRESETS)
    step = after_oom(Attempt(scheduling=False), cfg)
    assert step is not None and step[1] == "tiled_vae" and "preset" not in step[2]


def test_artifact_reruns_once_with_scheduling_off() -> None:
    cfg = FallbackConfig()
    step = after_artifact(Attempt(guide_size=512, tiled_vae=True), cfg)
    assert step is not None
    attempt, action, _ = step
    assert action == "scheduling_off" and attempt.scheduling is False
    assert attempt.tiled_vae and attempt.guide_size == 512  # everything else that was learned is kept
    assert after_artifact(attempt, cfg) is None


def test_modes_switch_chains_off() -> None:
    a = Attempt()
    assert after_oom(a, FallbackConfig(mode="off")) is None
    assert after_artifact(a, FallbackConfig(mode="off")) is None
    assert after_oom(a, FallbackConfig(mode="artifacts-only")) is None
    assert after_artifact(a, FallbackConfig(mode="artifacts-only")) is not None
    assert after_oom(a, FallbackConfig(mode="oom-only")) is not None
    assert after_artifact(a, FallbackConfig(mode="oom-only")) is None


def test_stronger_preset_ranks() -> None:
    assert stronger_preset("lowvram_4gb", PRESETS) is None
    assert stronger_preset("lowvram_8gb", PRESETS) == "lowvram_6gb"
    assert stronger_preset("off", ("lowvram_6gb",)) == "lowvram_6gb"
    assert stronger_preset("", ()) is None


def test_report_lists_every_fallback_and_passthrough() -> None:
    ok = FaceReport(
        frame=0, index=0, seed=5, context_side=512, tokens=4096, kept_tokens=3000, time_s=1.5, peak_memory=3 * 2**30
    )
    fb = FaceReport(frame=0, index=1, seed=6, context_side=256, tokens=1024, time_s=2.0)
    fb.add("tiled_vae", "tiled VAE encode/decode (after out of memory)")
    fb.add("smaller_guide", "guide 512 -> 256")
    dead = FaceReport(frame=1, index=0, seed=7)
    dead.add("scheduling_off", "rerun with token scheduling off")
    dead.status = "passthrough"
    dead.warnings.append("artifact: black (mean 0.000)")
    text = format_report([ok, fb, dead], "header")
    lines = text.splitlines()
    assert lines[0] == "header" and len(lines) == 5
    assert "frame 0 face 0: ok, seed 5" in lines[1] and "tokens 4096 (plan keeps ~3000)" in lines[1]
    assert "3072 MiB" in lines[1] and "fallbacks: none" in lines[1]
    assert "fallback" in lines[2] and "tiled_vae" in lines[2] and "smaller_guide: guide 512 -> 256" in lines[2]
    assert "peak n/a" in lines[2]
    assert "passthrough" in lines[3] and "black" in lines[3]
    assert lines[4] == "3 face(s), 2 with fallbacks, 1 passed through, 3.50 s total"


def test_oom_steps_up_from_the_preset_the_controller_recorded() -> None:
    cfg = FallbackConfig(mode="auto", stronger_presets=PRESETS, incoming_preset="lowvram_8gb")
    step = after_oom(Attempt(guide_size=512, single=True), cfg)
    assert step is not None and step[0].preset == "lowvram_6gb" and step[1] == "stronger_preset"
    strongest = FallbackConfig(mode="auto", stronger_presets=PRESETS, incoming_preset="lowvram_4gb")
    step = after_oom(Attempt(guide_size=512, single=True), strongest)
    assert step is not None and step[1] == "tiled_vae"  # nothing stronger exists: the preset step is skipped
