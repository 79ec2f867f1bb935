"""Device-aware balanced (issue 11 part 2): a level is reduced only where a measurement on this device says it pays."""

from __future__ import annotations

import pytest
import tokenfuse.scheduling.calibrate as calibrate
import tokenfuse.scheduling.calibration_store as calibration_store
import torch
from tokenfuse.scheduling.downsample import pool_tokens
from tokenfuse.scheduling.patches import build_unet_patches
from tokenfuse.scheduling.schedule import preset_schedule
from tokenfuse.scheduling.telemetry import RunTelemetry

SAMPLE_SIGMAS = torch.linspace(14.6, 0.0, 11)


@pytest.fixture(autouse=True)
def measured(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Undo the suite's pin (tests/conftest.py): these tests measure and decide (stored in their own folder)."""
    monkeypatch.setattr(calibrate, "PINNED", None)
    monkeypatch.setenv(calibration_store.ENV, str(tmp_path / "calibration"))
    calibrate.clear_cache()


def test_a_decision_is_kept_across_processes_and_the_first_one_wins(tmp_path) -> None:
    """The keep / drop decision changes the samples: a later process (a new run, another Ray worker) must adopt the
    stored one instead of re-timing (on a loaded machine the demo flipped /16 between kept and dropped run to run)."""
    n = torch.zeros(2, 64, 8)
    first = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 5e-3))
    assert first.kept and "earlier" not in first.reason
    calibrate.clear_cache()  # a new process: nothing in memory
    calls: list = []
    again = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 9.9e-3, calls=calls))
    assert again.kept and calls == [] and again.reason == f"{first.reason} (calibrated earlier)"
    # two processes measuring at once: the one that stores first wins, the other adopts its answer
    calibration_store.save(
        (str(n.device), n.dtype, (2, 64, 8), 2, 4, 16, "b"),
        n.device,
        first._replace(level=16, kept=False, reason="theirs")._asdict(),
    )
    mine = calibrate.check_level(n, pool2, 16, 2, 4, ("b",), fake_measure(10e-3, 5e-3))
    assert not mine.kept and mine.reason == "theirs (calibrated earlier)"
    files = list((tmp_path / "calibration").iterdir())
    assert len(files) == 2 and all(f.suffix == ".json" for f in files)  # no temp file left


def test_an_unwritable_store_keeps_decisions_in_the_process(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv(calibration_store.ENV, str(tmp_path / "file" / "calibration"))
    n = torch.zeros(2, 64, 8)
    check = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 5e-3))
    assert check.kept and calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(1.0, 1.0)) is check


def test_no_home_folder_keeps_decisions_in_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """No $HOME, no $XDG_CACHE_HOME and a uid without a passwd entry (`docker run --user 1234`, OpenShift): Path.home()
    raises RuntimeError; balanced's first sampling call raised it out of the sampler."""
    monkeypatch.delenv(calibration_store.ENV)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home() -> None:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(calibration_store.Path, "home", staticmethod(no_home))
    n = torch.zeros(2, 64, 8)
    check = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 5e-3))
    assert check.kept and calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(1.0, 1.0)) is check


def fake_measure(full: float, reduced: float, host: float = 0.0, calls: list | None = None):
    def measure(n, reduce, heads, dim_head):
        if calls is not None:
            calls.append(tuple(n.shape))
        return full, reduced, host

    return measure


def pool2(x: torch.Tensor) -> torch.Tensor:
    s = int(x.shape[1] ** 0.5)
    return pool_tokens(x, s, s, (2, 2))


def test_decision_rule_margin_and_cache() -> None:
    n = torch.zeros(2, 64, 8)
    calls: list = []
    kept = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 6e-3, calls=calls))
    assert kept.kept and kept.speedup == pytest.approx(10 / 6) and "1.67x" in kept.reason
    again = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(1.0, 1.0, calls=calls))
    assert again is kept and len(calls) == 1  # cached per device / dtype / shape / key: measured once
    noise = calibrate.check_level(n, pool2, 8, 2, 4, ("b",), fake_measure(10e-3, 9.8e-3))
    assert not noise.kept and "< 5%" in noise.reason  # 2 % is within the noise margin: not worth it


def test_async_devices_also_weigh_the_host_cost() -> None:
    """Off the CPU a GPU-time saving can hide behind a launch-bound model: it must beat 3x the host work it adds."""
    n = torch.zeros(2, 64, 8, device="meta")
    small = calibrate.check_level(n, pool2, 16, 2, 4, (), fake_measure(0.30e-3, 0.20e-3, host=20e-6))
    assert not small.kept and "host cost" in small.reason  # 0.1 ms saved < 3 x (0.02 + 0.015) ms
    big = calibrate.check_level(n, pool2, 8, 2, 4, ("x",), fake_measure(3.0e-3, 1.0e-3, host=20e-6))
    assert big.kept


def test_real_measurement_keeps_pooling_a_large_attention_level() -> None:
    """4 096 tokens, 2x2 K/V pooling: attention over a quarter of the keys is clearly cheaper on any CPU."""
    n = torch.randn(2, 4096, 64, generator=torch.Generator().manual_seed(0))
    check = calibrate.check_level(n, pool2, 8, 2, 32)
    assert check.kept, check
    assert check.full_ms > check.reduced_ms > 0


def test_balanced_patches_follow_the_calibration_and_report_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The /8 level pays, the /16 level does not: only /8 is pooled, and the summary line names both with reasons."""

    def measure(n, reduce, heads, dim_head):
        return (4e-3, 1e-3, 0.0) if n.shape[1] == 256 else (1e-3, 1e-3, 0.0)

    monkeypatch.setattr(calibrate, "measure", measure)
    telemetry = RunTelemetry()
    f, _ = build_unet_patches(preset_schedule("balanced", "sd15"), telemetry)
    base = {"original_shape": [2, 4, 16, 16], "sigmas": SAMPLE_SIGMAS[:1].clone(), "sample_sigmas": SAMPLE_SIGMAS}
    out = {}
    for tidx, tokens in enumerate((256, 64)):
        n = torch.randn(2, tokens, 8)
        _, ctx, _ = f(n, n, n, dict(base, transformer_index=tidx, n_heads=2, dim_head=4))
        out[tokens] = ctx.shape[1]
    assert out == {256: 64, 64: 64}
    line = telemetry.summary_line()
    assert "kept /8 (4.00x attention on cpu)" in line and "dropped /16 (saves 0% < 5% on cpu)" in line
    assert telemetry.summary()["levels"]["16"]["kept"] is False
