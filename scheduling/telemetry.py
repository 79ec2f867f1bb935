"""Per-run telemetry of the attention patches: tokens in/out aggregated per step and level, one summary line per run.

The glue calls reset() when a sampling run starts and finish() when it ends (one INFO line, optional JSONL).
record() is called from inside the patches, so it only adds plain Python numbers (no tensors, no device sync).
Aggregation is per (step, level) by default; per-call records are kept only when asked (`per_call=True`: the JSONL
telemetry file, tests and benches that look at single calls).
Device-aware schedules note each level's calibration (note_level): the summary says which levels were kept and why.

A run ends with a status (RunStatus): "complete" when sampling returned, "cancelled" (the user's interrupt) or
"failed" (any other exception). The summary line and the JSONL summary record both carry it, and the JSONL file of a
run that did not complete never replaces the file of a complete one (TelemetryFile).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple

log = logging.getLogger(__name__)

RunStatus = Literal["complete", "cancelled", "failed"]
PARTIAL_SUFFIX = ".partial"
STALE_TMP_S = 24 * 3600  # a temporary JSONL untouched this long was left by a killed process
_OPEN_TMPS: set[str] = set()  # this process's temporary files (never swept, however long a series runs)


def _saved_pct(saved_from: float, left: float) -> float:
    """Percent of `saved_from` (tokens, attention pairs) taken out when `left` remain."""
    return 0.0 if saved_from == 0 else 100.0 * (1.0 - left / saved_from)


def partial_path(path: str | Path) -> Path:
    """Where the JSONL file of a run that did not complete goes: `<name>.partial` next to `<name>`."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


class TelemetryFile:
    """A JSONL file written under a temporary name in its own folder and renamed onto its name when committed.

    A complete run is renamed onto `path` (atomically: a reader sees the previous complete file or the new one, never
    a half-written one). A cancelled or failed run is renamed onto `path.partial` instead (partial_path) and `path`
    keeps the last complete run: the file under the asked name always describes a whole run, while the partial data
    (what a failure looked like up to the exception) is still there to read, under a name that no `*.jsonl` glob
    picks up, with its summary record's "status" saying why it stopped. Discarded (or never committed), the temporary
    file is removed.

    The folder must exist (nothing is created above the file); a symlink at the target name is refused rather than
    replaced, and the temporary file is created with O_EXCL | O_NOFOLLOW under a random name. Temporary files of the
    same name that a killed process left (untouched for STALE_TMP_S) are removed when the next one is opened, so a
    telemetry folder does not collect them run after crashed run.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        for target in (self.path, partial_path(self.path)):
            if target.is_symlink():
                raise OSError(f"refusing to write through the symlink {target}")
        sweep_stale_tmps(self.path)
        self.tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(6)}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(self.tmp, flags, 0o644)
        try:
            self._fh: IO[str] | None = os.fdopen(fd, "w", encoding="utf-8")
        except BaseException:
            os.close(fd)
            os.unlink(self.tmp)
            raise
        _OPEN_TMPS.add(os.path.abspath(self.tmp))

    def write(self, row: dict[str, Any]) -> None:
        """Append one JSON object as one line."""
        if self._fh is None:
            raise ValueError(f"telemetry file {self.path} is already closed")
        self._fh.write(json.dumps(row) + "\n")

    def commit(self, status: RunStatus = "complete") -> Path:
        """Close and rename onto `path` (complete) or `path.partial` (cancelled, failed); returns where it went."""
        target = self.path if status == "complete" else partial_path(self.path)
        try:
            self._close()
            if target.is_symlink():
                raise OSError(f"refusing to write through the symlink {target}")
            os.replace(self.tmp, target)
        except BaseException:
            self.discard()
            raise
        return target

    def discard(self) -> None:
        """Close and remove the temporary file; the files under `path` and `path.partial` stay as they were."""
        with contextlib.suppress(OSError):
            self._close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)

    def _close(self) -> None:
        fh, self._fh = self._fh, None
        _OPEN_TMPS.discard(os.path.abspath(self.tmp))
        if fh is not None:
            fh.close()


def sweep_stale_tmps(path: Path, now: float | None = None) -> int:
    """Remove `.<name>.<12 hex>.tmp` files beside `path` (TelemetryFile's temporary names) untouched for STALE_TMP_S,
    except this process's own; returns how many. Only that exact pattern is touched, and a link is removed as a link."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{12}}\.tmp")
    cutoff = (time.time() if now is None else now) - STALE_TMP_S
    removed = 0
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return 0
    for entry in entries:
        if not pattern.fullmatch(entry.name) or os.path.abspath(entry.path) in _OPEN_TMPS:
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    if removed:
        log.info("removed %d stale temporary telemetry file(s) beside %s (left by a killed run)", removed, path)
    return removed


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

    def record(  # noqa: PLR0913 - hot path: called per attention call (eager, traced and DiT patches); a per-call argument object would allocate
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

    def summary(self, status: RunStatus = "complete") -> dict[str, Any]:
        """Totals for the run. *_saved_pct are percent of tokens (or q x kv attention pairs) taken out; status: how the
        run ended (a cancelled or failed run's totals cover the steps it made)."""

        return {
            "status": status,
            "calls": self.calls,
            "reduced_calls": self.reduced_calls,
            "steps": len(self.steps),
            "q_tokens_in": self.q_in,
            "q_tokens_out": self.q_out,
            "kv_tokens_in": self.kv_in,
            "kv_tokens_out": self.kv_out,
            "tokens_saved_pct": _saved_pct(self.q_in + self.kv_in, self.q_out + self.kv_out),
            "attention_pairs_saved_pct": _saved_pct(self.pairs_in, self.pairs_out),
            "patch_seconds": self.patch_seconds,
            "wall_seconds": time.perf_counter() - self.started,
            "records_dropped": self.dropped,
            "levels": {
                str(lv): {"kept": c.kept, "reason": c.reason, "full_ms": c.full_ms, "reduced_ms": c.reduced_ms}
                for lv, c in sorted(self.levels.items())
            },
        }

    def summary_line(self, status: RunStatus = "complete") -> str:
        """The run's INFO line; one that did not complete says so first ("TokenFuse: cancelled run (partial): ...")."""
        s = self.summary(status)
        return (
            f"TokenFuse: {'' if status == 'complete' else f'{status} run (partial): '}"
            f"{s['tokens_saved_pct']:.1f}% q+k/v tokens saved, "
            f"{s['attention_pairs_saved_pct']:.1f}% attention pairs saved, "
            f"{s['reduced_calls']}/{s['calls']} attention calls reduced over {s['steps']} steps, "
            f"{s['wall_seconds']:.2f} s (patches {s['patch_seconds'] * 1000:.1f} ms)"
            + (f"; {self.levels_text()}" if self.levels else "")
        )

    def write_records(self, out: TelemetryFile, **extra: Any) -> None:
        """The run's rows: one JSON object per call (per (step, level) aggregate when per_call is off), each with
        `extra` added (e.g. run=3 when several runs share a file)."""
        for rec in self.records:
            out.write({**rec._asdict(), **extra})
        if not self.per_call:
            for (step, level), a in sorted(self.per_step.items()):
                row = dict(zip(("calls", "reduced_calls", "q_in", "q_out", "kv_in", "kv_out"), a, strict=True))
                out.write({"step": step, "level": level, **row, **extra})

    def write_jsonl(self, path: str | Path, status: RunStatus = "complete") -> Path:
        """The run's rows (write_records), then one {"summary": ...} line; returns the path written.

        Written through TelemetryFile: a complete run replaces `path` atomically; a cancelled or failed run goes to
        `path.partial` and leaves `path` (the last complete run) alone. The folder must exist and a symlink at the
        name is refused rather than followed."""
        out = TelemetryFile(path)
        try:
            self.write_records(out)
            out.write({"summary": self.summary(status)})
        except BaseException:
            out.discard()
            raise
        return out.commit(status)

    def finish(self, jsonl_path: str | Path | None = None, status: RunStatus = "complete") -> str:
        """End of a run: log the summary line at INFO (if any call was seen), write JSONL if a path is given."""
        line = self.summary_line(status)
        if self.calls:
            log.info(line)
        if jsonl_path:
            try:
                self.write_jsonl(jsonl_path, status)
            except OSError as exc:
                log.warning(
                    "TokenFuse: could not write telemetry to %s (%s); fix the path or clear it", jsonl_path, exc
                )
        return line


_SUMMED = (
    "calls",
    "reduced_calls",
    "steps",
    "q_tokens_in",
    "q_tokens_out",
    "kv_tokens_in",
    "kv_tokens_out",
    "patch_seconds",
    "wall_seconds",
    "records_dropped",
)


class RunSeries:
    """Several sampling runs that are one run for the user (VideoFaceFusion: one diffusion run per key-frame batch).

    The node layer logs each run's own line at DEBUG and hands the run here (add); the series sums what can be summed
    (runs per status, attention calls, steps, tokens and attention pairs in/out, patch and sampling seconds, the step
    cache's U-Net calls) into one summary and one INFO line. Each telemetry file the runs name holds the whole series:
    every run's rows with its number added (`"run": k`) and its own summary as {"run": k, "run_summary": {...}}, then
    one {"summary": ...} of the series at the end (close). Like a single run's file, it is written under a temporary
    name and renamed onto its name only when the series completes (`<name>.partial` otherwise: TelemetryFile).
    """

    def __init__(self) -> None:
        self.runs = 0
        self.statuses: dict[str, int] = {}
        self.totals: dict[str, float] = dict.fromkeys(_SUMMED, 0)
        self.pairs_in = self.pairs_out = 0
        self.levels: dict[str, Any] = {}
        self.labels: list[str] = []
        self.no_calls = 0  # runs in which no attention call reached the scheduler (counted by the node layer)
        self.cache: list[int] | None = None  # step cache: [full, cached, refreshed] U-Net calls, when a run had one
        self.files: dict[Path, TelemetryFile] = {}
        self.unwritable: dict[Path, str] = {}  # a file that failed once stays unwritten for the series
        self.started = time.perf_counter()

    def add(
        self,
        telemetry: RunTelemetry,
        status: RunStatus,
        label: str = "",
        cache: tuple[int, int, int] | None = None,
        jsonl_path: str | Path | None = None,
    ) -> None:
        """One finished run (its telemetry not yet reset); jsonl_path: the run's telemetry file, if it names one.
        An OSError of the file is kept (unwritable) rather than raised: it is reported when the series ends."""
        self.runs += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        s = telemetry.summary(status)
        for key in _SUMMED:
            self.totals[key] += s[key]
        self.pairs_in += telemetry.pairs_in
        self.pairs_out += telemetry.pairs_out
        self.levels = s["levels"] or self.levels
        if label and label not in self.labels:
            self.labels.append(label)
        if cache is not None:
            self.cache = [a + b for a, b in zip(self.cache or [0, 0, 0], cache, strict=True)]
        if jsonl_path is None:
            return
        path = Path(jsonl_path)
        if path in self.unwritable:
            return
        try:
            out = self.files.get(path)
            if out is None:
                out = self.files[path] = TelemetryFile(path)
            telemetry.write_records(out, run=self.runs)
            out.write({"run": self.runs, "run_summary": s})
        except OSError as exc:
            self.unwritable[path] = str(exc)
            broken = self.files.pop(path, None)
            if broken is not None:
                broken.discard()

    def summary(self, status: RunStatus = "complete") -> dict[str, Any]:
        """Totals of the series; status: how the series ended (runs_by_status: how each run ended)."""
        t = self.totals

        out: dict[str, Any] = {
            "status": status,
            "runs": self.runs,
            "runs_by_status": dict(self.statuses),
            **{key: t[key] for key in _SUMMED if key != "wall_seconds"},
            "tokens_saved_pct": _saved_pct(
                t["q_tokens_in"] + t["kv_tokens_in"], t["q_tokens_out"] + t["kv_tokens_out"]
            ),
            "attention_pairs_saved_pct": _saved_pct(self.pairs_in, self.pairs_out),
            "sampling_seconds": t["wall_seconds"],
            "wall_seconds": time.perf_counter() - self.started,
            "levels": self.levels,
        }
        if self.cache is not None:
            out["step_cache"] = dict(zip(("full_calls", "cached_calls", "refreshed"), self.cache, strict=True))
        return out

    def summary_line(self, status: RunStatus = "complete") -> str:
        """One INFO line for the series, e.g. 'TokenFuse: 12 sampling runs, 38.5% q+k/v tokens saved, ...'."""
        s = self.summary(status)
        others = ", ".join(f"{n} {st}" for st, n in sorted(self.statuses.items()) if st != "complete")
        line = (
            f"TokenFuse: {'' if status == 'complete' else f'{status} (partial): '}"
            f"{s['runs']} sampling run{'' if s['runs'] == 1 else 's'}{f' ({others})' if others else ''}, "
            f"{s['tokens_saved_pct']:.1f}% q+k/v tokens saved, "
            f"{s['attention_pairs_saved_pct']:.1f}% attention pairs saved, "
            f"{s['reduced_calls']}/{s['calls']} attention calls reduced over {s['steps']} steps, "
            f"sampling {s['sampling_seconds']:.2f} s of {s['wall_seconds']:.2f} s "
            f"(patches {s['patch_seconds'] * 1000:.1f} ms)"
        )
        if self.cache is not None:
            full, cached, _ = self.cache
            line += f", step cache {full} full / {cached} cached U-Net calls of {full + cached}"
        return line

    def close(self, status: RunStatus = "complete") -> list[tuple[Path, Path | None, str]]:
        """Write the series' summary into each telemetry file and commit it (TelemetryFile.commit(status)).

        Returns (asked path, path written or None, error text or "") per file the runs named."""
        done: list[tuple[Path, Path | None, str]] = [(p, None, err) for p, err in self.unwritable.items()]
        summary = self.summary(status)
        files, self.files = self.files, {}
        for path, out in files.items():
            try:
                out.write({"summary": summary})
                done.append((path, out.commit(status), ""))
            except OSError as exc:
                out.discard()
                done.append((path, None, str(exc)))
        return done

    def discard(self) -> None:
        """Drop every file of the series unwritten (their temporary files removed)."""
        files, self.files = self.files, {}
        for out in files.values():
            out.discard()
