"""The runner's JSONL report: one JSON object per item, appended and flushed as each item ends, so a killed run
keeps what it finished and `--resume` can skip it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TextIO

_SUMMARY = re.compile(r"(\d+) face\(s\), (\d+) with fallbacks, (\d+) passed through")
_FACE = re.compile(r"^frame (\d+) face (\d+): (\w+),.*fallbacks: (.*?)(?: \| warnings: (.*))?$")


def done_keys(path: Path) -> set[str]:
    """Items a previous run finished ("ok") according to the report at `path` (absent -> empty)."""
    if not path.is_file():
        return set()
    keys: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill: that item is redone
        if row.get("status") == "ok" and isinstance(row.get("item"), str):
            keys.add(row["item"])
    return keys


def summarize_texts(texts: dict[str, str]) -> dict[str, Any]:
    """faces / fallbacks / passthrough counts and the per-face fallback lines from the pack's report strings
    (ScheduledFusion's `report` output; faces/fallback.py format_report)."""
    faces = fallbacks = passed = 0
    details: list[str] = []
    for text in texts.values():
        for line in text.splitlines():
            m = _SUMMARY.search(line)
            if m:
                faces, fallbacks, passed = faces + int(m[1]), fallbacks + int(m[2]), passed + int(m[3])
            f = _FACE.match(line.strip())
            if f and f[4] != "none":
                details.append(f"frame {f[1]} face {f[2]}: {f[3]}: {f[4]}")
    return {"faces": faces, "faces_with_fallbacks": fallbacks, "faces_passed_through": passed, "fallbacks": details}


class ReportWriter:
    """Appends rows to a JSONL file, flushing each line."""

    def __init__(self, path: Path, append: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: TextIO = path.open("a" if append else "w", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._fh.write(json.dumps(row, sort_keys=True, default=str) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
