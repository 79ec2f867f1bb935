"""Per-run telemetry of the attention patches: tokens in/out aggregated per step and level, one summary line per run.

The glue calls reset() when a sampling run starts and finish() when it ends (one INFO line, optional JSONL).
record() is called from inside the patches, so it only adds plain Python numbers (no tensors, no device sync).
Aggregation is per (step, level) by default; per-call records are kept only when asked (`per_call=True`: the JSONL
telemetry file, tests and benches that look at single calls).
Device-aware schedules note each level's calibration (note_level): the summary says which levels were kept and why.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger(__name__)


class CallRecord(NamedTuple):
    """One attention call. Token counts are per image; seconds is patch wall time (None when timing is off)."""

    block: str
    level: int
    step: int
    sigma: float
    q_in: int
    q_out: int
    kv_in: int
    kv_out: int
    strategy: str
    seconds: float | None = None


class RunTelemetry:
    """Aggregates CallRecords for one sampling run (keeps at most max_records for the JSONL file)."""

    def __init__(self, max_records: int = 100_000, per_call: bool = True) -> None:
        self.max_records = max_records
        self.per_call = per_call
        self.levels: dict[int, Any] = {}  # level -> calibrate.LevelCheck (kept across runs: a property of the device)
        self.reset()

    def reset(self) -> None:
        self.records: list[CallRecord] = []
        self.calls = 0
        self.reduced_calls = 0
        self.q_in = self.q_out = self.kv_in = self.kv_out = 0
        self.pairs_in = self.pairs_out = 0
        self.patch_seconds = 0.0
        self.steps: set[int] = set()
        self.started = time.perf_counter()
        self.dropped = 0
        # (step, level) -> [calls, reduced calls, q_in, q_out, kv_in, kv_out]; window: level -> [calls, kv_in, kv_out]
        self.per_step: dict[tuple[int, int], list[int]] = {}
        self.window: dict[int, list[int]] = {}

    def record(
        self,
        block: str,
        level: int,
        step: int,
        sigma: float,
        q_in: int,
        q_out: int,
        kv_in: int,
        kv_out: int,
        strategy: str = "",
        seconds: float | None = None,
    ) -> None:
        self.calls += 1
        self.reduced_calls += int(q_out < q_in or kv_out < kv_in)
        self.q_in += q_in
        self.q_out += q_out
        self.kv_in += kv_in
        self.kv_out += kv_out
        self.pairs_in += q_in * kv_in
        self.pairs_out += q_out * kv_out
        if seconds is not None:
            self.patch_seconds += seconds
        if step >= 0:
            self.steps.add(step)
        agg = self.per_step.get((step, level))
        if agg is None:
            agg = self.per_step[(step, level)] = [0, 0, 0, 0, 0, 0]
        agg[0] += 1
        agg[1] += int(q_out < q_in or kv_out < kv_in)
        agg[2] += q_in
        agg[3] += q_out
        agg[4] += kv_in
        agg[5] += kv_out
        win = self.window.get(level)
        if win is None:
            win = self.window[level] = [0, 0, 0]
        win[0] += 1
        win[1] += kv_in
        win[2] += kv_out
        if not self.per_call:
            return
        if len(self.records) < self.max_records:
            self.records.append(CallRecord(block, level, step, sigma, q_in, q_out, kv_in, kv_out, strategy, seconds))
        else:
            self.dropped += 1

    def note_level(self, check: Any) -> None:
        """A device-aware calibration's answer for one level (calibrate.LevelCheck)."""
        self.levels[check.level] = check

    def drain_window(self) -> dict[int, list[int]]:
        """level -> [calls, kv_in, kv_out] since the last drain (live stats), then starts a new window."""
        window, self.window = self.window, {}
        return window

    def level_means(self) -> dict[int, tuple[float, float, float, float]]:
        """level -> mean (q_in, q_out, kv_in, kv_out) per call over the run."""
        acc: dict[int, list[int]] = {}
        for (_, level), a in self.per_step.items():
            t = acc.setdefault(level, [0, 0, 0, 0, 0])
            t[0] += a[0]
            for i in range(4):
                t[i + 1] += a[i + 2]
        return {lv: (t[1] / t[0], t[2] / t[0], t[3] / t[0], t[4] / t[0]) for lv, t in sorted(acc.items()) if t[0]}

    def levels_text(self) -> str:
        """Which levels a device-aware schedule kept and why, e.g. 'kept /8 (1.9x attention on cpu); dropped ...'."""
        if not self.levels:
            return ""
        parts = [f"{'kept' if c.kept else 'dropped'} /{lv} ({c.reason})" for lv, c in sorted(self.levels.items())]
        return "device-aware: " + "; ".join(parts)

    def add_seconds(self, seconds: float) -> None:
        """Patch time spent outside record() (e.g. the unmerge in the output patch)."""
        self.patch_seconds += seconds

    def summary(self) -> dict[str, Any]:
        """Totals for the run. *_saved_pct are percent of tokens (or q x kv attention pairs) taken out."""

        def pct(saved_from: int, left: int) -> float:
            return 0.0 if saved_from == 0 else 100.0 * (1.0 - left / saved_from)

        return {
            "calls": self.calls,
            "reduced_calls": self.reduced_calls,
            "steps": len(self.steps),
            "q_tokens_in": self.q_in,
            "q_tokens_out": self.q_out,
            "kv_tokens_in": self.kv_in,
            "kv_tokens_out": self.kv_out,
            "tokens_saved_pct": pct(self.q_in + self.kv_in, self.q_out + self.kv_out),
            "attention_pairs_saved_pct": pct(self.pairs_in, self.pairs_out),
            "patch_seconds": self.patch_seconds,
            "wall_seconds": time.perf_counter() - self.started,
            "records_dropped": self.dropped,
            "levels": {
                str(lv): {"kept": c.kept, "reason": c.reason, "full_ms": c.full_ms, "reduced_ms": c.reduced_ms}
                for lv, c in sorted(self.levels.items())
            },
        }

    def summary_line(self) -> str:
        s = self.summary()
        return (
            f"TokenFuse: {s['tokens_saved_pct']:.1f}% q+k/v tokens saved, "
            f"{s['attention_pairs_saved_pct']:.1f}% attention pairs saved, "
            f"{s['reduced_calls']}/{s['calls']} attention calls reduced over {s['steps']} steps, "
            f"{s['wall_seconds']:.2f} s (patches {s['patch_seconds'] * 1000:.1f} ms)"
            + (f"; {self.levels_text()}" if self.levels else "")
        )

    def write_jsonl(self, path: str | Path) -> Path:
        """One JSON object per call (per (step, level) aggregate when per_call is off), then one {"summary": ...} line.

        The folder must exist (nothing is created above the file) and a symlink at `path` is refused rather than
        followed (O_NOFOLLOW where the OS has it)."""
        path = Path(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        if path.is_symlink():
            raise OSError(f"refusing to write through the symlink {path}")
        with os.fdopen(os.open(path, flags, 0o644), "w", encoding="utf-8") as fh:
            for rec in self.records:
                fh.write(json.dumps(rec._asdict()) + "\n")
            if not self.per_call:
                for (step, level), a in sorted(self.per_step.items()):
                    row = dict(zip(("calls", "reduced_calls", "q_in", "q_out", "kv_in", "kv_out"), a, strict=True))
                    fh.write(json.dumps({"step": step, "level": level, **row}) + "\n")
            fh.write(json.dumps({"summary": self.summary()}) + "\n")
        return path

    def finish(self, jsonl_path: str | Path | None = None) -> str:
        """End of a run: log the summary line at INFO (if any call was seen), write JSONL if a path is given."""
        line = self.summary_line()
        if self.calls:
            log.info(line)
        if jsonl_path:
            try:
                self.write_jsonl(jsonl_path)
            except OSError as exc:
                log.warning(
                    "TokenFuse: could not write telemetry to %s (%s); fix the path or clear it", jsonl_path, exc
                )
        return line
