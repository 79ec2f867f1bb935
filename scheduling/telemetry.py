"""Per-run telemetry of the attention patches: tokens in/out per call, aggregated into one summary line per run.

The glue calls reset() when a sampling run starts and finish() when it ends (one INFO line, optional JSONL).
record() is called from inside the patches, so it only appends plain Python numbers (no tensors, no device sync).
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

    def __init__(self, max_records: int = 100_000) -> None:
        self.max_records = max_records
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
        if len(self.records) < self.max_records:
            self.records.append(CallRecord(block, level, step, sigma, q_in, q_out, kv_in, kv_out, strategy, seconds))
        else:
            self.dropped += 1

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
        }

    def summary_line(self) -> str:
        s = self.summary()
        return (
            f"TokenFuse: {s['tokens_saved_pct']:.1f}% q+k/v tokens saved, "
            f"{s['attention_pairs_saved_pct']:.1f}% attention pairs saved, "
            f"{s['reduced_calls']}/{s['calls']} attention calls reduced over {s['steps']} steps, "
            f"{s['wall_seconds']:.2f} s (patches {s['patch_seconds'] * 1000:.1f} ms)"
        )

    def write_jsonl(self, path: str | Path) -> Path:
        """One JSON object per call, then one {"summary": ...} line. The folder must exist (nothing is created above the
        file) and a symlink at `path` is refused rather than followed (O_NOFOLLOW where the OS has it)."""
        path = Path(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        if path.is_symlink():
            raise OSError(f"refusing to write through the symlink {path}")
        with os.fdopen(os.open(path, flags, 0o644), "w", encoding="utf-8") as fh:
            for rec in self.records:
                fh.write(json.dumps(rec._asdict()) + "\n")
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
