"""Device-aware balanced (issue 11 part 2): a level is reduced only where a measurement on this device says it pays."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

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
        (str(n.device), n.dtype, (64, 8), 2, 4, 16, "b"),
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


def test_one_decision_per_shape_whatever_the_batch_or_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """ComfyUI runs cond and uncond in one call or two (free memory decides), the service batches concurrent photos,
    Ray workers run with their CPU share of threads: the same input must meet the same decision in all of them."""
    first = calibrate.check_level(torch.zeros(2, 64, 8), pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 5e-3))
    calibrate.clear_cache()  # another process ...
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)  # ... with another thread count ...
    calls: list = []
    other = calibrate.check_level(torch.zeros(4, 64, 8), pool2, 8, 2, 4, ("a",), fake_measure(1.0, 1.0, calls=calls))
    assert other.kept == first.kept and calls == []  # ... and another batch: the stored decision, not measured again


def test_without_hard_links_the_first_writer_still_wins(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some file systems (SMB, some FUSE mounts) refuse os.link: the answer was then never stored, and every process
    kept its own timing's decision. The exclusive create stores it; a later process adopts it."""

    def no_links(src, dst) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(calibration_store.os, "link", no_links)
    n = torch.zeros(2, 64, 8)
    first = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 5e-3))
    calibrate.clear_cache()
    later = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 9.9e-3))
    assert first.kept and later.kept and later.reason == f"{first.reason} (calibrated earlier)"
    assert [f.suffix for f in (tmp_path / "calibration").iterdir()] == [".json"]  # no temp file left


def test_a_reader_waits_for_an_answer_being_written(tmp_path) -> None:
    """Without hard links the file exists before its content: a reader waits for it instead of deciding alone."""
    key = ("cpu", torch.float32, (64, 8), 2, 4, 8)
    path = calibration_store._paths(key, torch.device("cpu"))[0]
    path.parent.mkdir(parents=True)
    path.write_text('{"key": ')  # a writer between its exclusive create and its write
    record = json.dumps({"key": repr(key), "kept": False})
    later = threading.Timer(0.2, path.write_text, (record,))
    later.start()
    try:
        assert calibration_store.load(key, torch.device("cpu"), ("kept",)) == {"key": repr(key), "kept": False}
    finally:
        later.cancel()


def test_an_unreadable_answer_moves_every_process_to_the_same_next_name(tmp_path) -> None:
    """A file cut short by a killed writer (or edited by hand) is no decision: before, each process then measured and
    kept its own, so two processes could compute different samples; now they all meet on the key's next name."""
    n = torch.zeros(2, 64, 8)
    key = (str(n.device), n.dtype, (64, 8), 2, 4, 8, "a")
    broken = calibration_store._paths(key, n.device)[0]
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    os.utime(broken, (time.time() - 60, time.time() - 60))  # not being written: left by a writer long gone
    first = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 5e-3))
    calibrate.clear_cache()
    later = calibrate.check_level(n, pool2, 8, 2, 4, ("a",), fake_measure(10e-3, 9.9e-3))
    assert first.kept and later.kept and "earlier" in later.reason
    assert broken.read_text() == "{not json"  # never overwritten


CALIBRATING_PROCESS = r"""
import importlib.util, json, sys, time
from pathlib import Path

repo, ready, go, threads, batch, full_ms = sys.argv[1:]
init = Path(repo) / "__init__.py"
spec = importlib.util.spec_from_file_location("tokenfuse", init, submodule_search_locations=[repo])
sys.modules["tokenfuse"] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
import torch
from tokenfuse.scheduling import calibrate
from tokenfuse.scheduling.patches import build_unet_patches
from tokenfuse.scheduling.schedule import preset_schedule
from tokenfuse.scheduling.telemetry import RunTelemetry

torch.set_num_threads(int(threads))


def measure(n, reduce, heads, dim_head):
    time.sleep(0.5)  # every process is measuring before any of them stores its answer
    return float(full_ms) * 1e-3, 1e-3, 0.0


calibrate.measure = measure
patch, _ = build_unet_patches(preset_schedule("balanced", "sd15"), RunTelemetry())
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.005)
sigmas = torch.linspace(14.6, 0.0, 11)
n = torch.randn(1, 256, 8, generator=torch.Generator().manual_seed(0)).repeat(int(batch), 1, 1)
options = {"original_shape": [int(batch), 4, 16, 16], "sigmas": sigmas[:1].clone(), "sample_sigmas": sigmas}
_, kv, _ = patch(n, n, n, dict(options, transformer_index=0, n_heads=2, dim_head=4))
print(json.dumps({"tokens": kv.shape[1], "kv": kv[0].flatten().tolist()}))
"""


def test_processes_calibrating_at_once_use_one_decision_and_compute_alike(tmp_path) -> None:
    """Issue 34 item 6: three processes (other thread counts and batches, as a server, a runner and Ray workers have)
    calibrate the same level at once and measure opposite answers (4x faster reduced / no gain); every one of them
    must use the first stored decision, so the same input gives the same keys / values (and samples) in all."""
    repo = str(Path(calibration_store.__file__).resolve().parents[1])
    store = tmp_path / "shared_store"
    env = {**os.environ, calibration_store.ENV: str(store), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    go = tmp_path / "go"
    runs = [(1, 2, 4.0), (2, 2, 1.0), (1, 4, 1.0)]  # threads, batch, measured full ms (reduced 1 ms)
    procs = []
    for i, (threads, batch, full_ms) in enumerate(runs):
        args = [repo, str(tmp_path / f"ready{i}"), str(go), str(threads), str(batch), str(full_ms)]
        cmd = [sys.executable, "-c", CALIBRATING_PROCESS, *args]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(len(runs))):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
                p.communicate() for p in procs
            ]
            time.sleep(0.02)
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert len({r["tokens"] for r in results}) == 1, [r["tokens"] for r in results]
    assert all(r["kv"] == results[0]["kv"] for r in results)
    assert [f.suffix for f in store.iterdir()] == [".json"]  # one decision, no temp file left
