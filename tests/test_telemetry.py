"""RunTelemetry: aggregation, summary line, JSONL output, reset."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from tokenfuse.scheduling.telemetry import RunTelemetry


def _fill(t: RunTelemetry) -> None:
    t.record("input.1.0", 8, 0, 14.6, 1000, 1000, 1000, 250, "todo", 0.001)
    t.record("input.1.0", 8, 1, 10.0, 1000, 500, 1000, 500, "tome", 0.002)
    t.record("middle.0.0", 64, 1, 10.0, 16, 16, 16, 16, "todo")


def test_summary_aggregates_tokens_steps_and_time() -> None:
    t = RunTelemetry()
    _fill(t)
    s = t.summary()
    assert s["calls"] == 3 and s["reduced_calls"] == 2 and s["steps"] == 2
    assert s["q_tokens_in"] == 2016 and s["q_tokens_out"] == 1516
    assert s["kv_tokens_out"] == 766
    assert s["tokens_saved_pct"] == pytest.approx(100 * (1 - (1516 + 766) / 4032))
    pairs_in = 1000 * 1000 * 2 + 256
    assert s["attention_pairs_saved_pct"] == pytest.approx(100 * (1 - (250_000 + 250_000 + 256) / pairs_in))
    assert s["patch_seconds"] == pytest.approx(0.003)
    line = t.summary_line()
    assert "43.4% q+k/v tokens saved" in line and "2/3 attention calls" in line and "2 steps" in line


def test_reset_and_empty_summary() -> None:
    t = RunTelemetry()
    _fill(t)
    t.reset()
    s = t.summary()
    assert s["calls"] == 0 and s["tokens_saved_pct"] == 0.0 and s["steps"] == 0


def test_jsonl_and_finish_log_one_info_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    t = RunTelemetry(max_records=2)
    _fill(t)
    with caplog.at_level(logging.INFO, logger="tokenfuse.scheduling.telemetry"):
        (tmp_path / "sub").mkdir()  # write_jsonl creates no folder (issue 13: prompts must not make folders)
        line = t.finish(tmp_path / "sub" / "run.jsonl")
    assert [r.getMessage() for r in caplog.records] == [line]
    rows = [json.loads(x) for x in (tmp_path / "sub" / "run.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and rows[0]["block"] == "input.1.0" and rows[0]["kv_out"] == 250
    assert rows[-1]["summary"]["calls"] == 3 and rows[-1]["summary"]["records_dropped"] == 1


def test_jsonl_is_replaced_whole_and_a_partial_run_goes_next_to_it(tmp_path: Path) -> None:
    """A complete run replaces the file (through a temporary name in the same folder); a cancelled run's rows go to
    <name>.partial with status "cancelled" and the complete file is left as it was."""
    path = tmp_path / "run.jsonl"
    t = RunTelemetry()
    _fill(t)
    assert t.write_jsonl(path) == path
    complete = path.read_text()
    assert json.loads(complete.splitlines()[-1])["summary"]["status"] == "complete"
    t.reset()
    t.record("input.1.0", 8, 0, 14.6, 1000, 1000, 1000, 250, "todo")
    assert t.write_jsonl(path, "cancelled") == tmp_path / "run.jsonl.partial"
    assert path.read_text() == complete
    rows = [json.loads(x) for x in (tmp_path / "run.jsonl.partial").read_text().splitlines()]
    assert len(rows) == 2 and rows[-1]["summary"]["status"] == "cancelled" and rows[-1]["summary"]["calls"] == 1
    assert "cancelled run (partial)" in t.summary_line("cancelled") and "partial" not in t.summary_line()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl", "run.jsonl.partial"]


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("old\n")
    t = RunTelemetry()
    _fill(t)
    t.records.append(object())  # type: ignore[arg-type]  # not a CallRecord: fails after some rows were written
    with pytest.raises(AttributeError):
        t.write_jsonl(path)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["run.jsonl"]


def test_temporary_files_a_killed_run_left_are_swept_when_the_next_file_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed mid-write leaves `.run.jsonl.<hex>.tmp`; the next TelemetryFile of that name removes such
    files once untouched for a day. A fresh one (another process writing now), this process's own open file, other
    names and other patterns stay."""
    import os
    import time

    from tokenfuse.scheduling.telemetry import STALE_TMP_S, TelemetryFile

    day_old = time.time() - STALE_TMP_S - 60
    stale = tmp_path / ".run.jsonl.0123456789ab.tmp"
    fresh = tmp_path / ".run.jsonl.ba9876543210.tmp"
    other = tmp_path / ".other.jsonl.0123456789ab.tmp"
    mine = tmp_path / "run.jsonl.0123456789ab.tmp"  # not the pattern (no leading dot)
    for f in (stale, fresh, other, mine):
        f.write_text("x")
    for f in (stale, other, mine):
        os.utime(f, (day_old, day_old))
    monkeypatch.chdir(tmp_path)
    first = TelemetryFile("run.jsonl")  # a relative path, as a bench or test may give
    os.utime(first.tmp, (day_old, day_old))  # this process's own file, however long its series runs
    second = TelemetryFile(tmp_path / "run.jsonl")
    assert not stale.exists() and fresh.exists() and other.exists() and mine.exists()
    assert (tmp_path / first.tmp).exists() and second.tmp.exists()
    first.discard()
    second.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, other.name, mine.name, "run.jsonl"])
