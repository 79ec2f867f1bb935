"""The runner's JSONL report: one JSON object per item, appended and flushed as each item ends, so a killed run
keeps what it finished and `--resume` can skip it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import IO, Any

from .output_folder import open_report, read_report

_SUMMARY = re.compile(r"(\d+) face\(s\), (\d+) with fallbacks, (\d+) passed through")
_SECONDS = re.compile(r", (\d+(?:\.\d+)?) s, peak ")  # a per-face line's time (fusion/fallback.py FaceReport.line)
_FACE = re.compile(r"^frame (\d+) face (\d+): (\w+),.*fallbacks: (.*?)(?: \| warnings: (.*))?$")


def _rows(path: Path) -> list[dict[str, Any]]:
    """The report's rows about an item (absent file -> none); a line cut by a kill is skipped: that item is redone.
    A report that is a link is refused (OutputFolderError), not read: it is in the output folder (output_folder.py)."""
    root = path.parent.resolve()
    text = read_report(root, root / path.name) if path.parent.is_dir() else None
    rows = []
    for line in (text or "").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("item"), str):
            rows.append(row)
    return rows


def done_keys(path: Path) -> set[str]:
    """Items a previous run finished ("ok") according to the report at `path` (absent -> empty)."""
    return {row["item"] for row in _rows(path) if row.get("status") == "ok"}


def item_names(path: Path) -> dict[str, str]:
    """item key -> the output name the report at `path` gave it (its last row; absent -> empty). `--resume` keeps
    these names: an item added since (a.jpg next to a finished a.png) must not take `a` and overwrite a's files."""
    return {row["item"]: row["name"] for row in _rows(path) if isinstance(row.get("name"), str)}


def summarize_texts(texts: dict[str, str]) -> dict[str, Any]:
    """faces / fallbacks / passthrough counts and the per-face fallback lines from the pack's report strings
    (ScheduledFusion's `report` output; fusion/fallback.py format_report)."""
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


def frame_report(text: str, frame: int, as_frame: int | None = None) -> str:
    """The part of a pack report about one frame of a batch: its per-face lines ("frame N face M: ...", renumbered
    as frame `as_frame` when given) and, when the report has a summary line, one recounted over those lines. The
    service answers each photo of a batch with its own frame as frame 0, the report it would get alone; and
    summarize_texts counts fallbacks and pass-throughs from the summary line only."""
    lines = text.splitlines()
    prefix = f"frame {frame} face "
    own = [line for line in lines if line.startswith(prefix)]
    if as_frame is not None:
        own = [f"frame {as_frame} face {line[len(prefix) :]}" for line in own]
    if not any(_SUMMARY.search(line) for line in lines):
        return "\n".join(own)
    faces = [f for f in (_FACE.match(line.strip()) for line in own) if f]
    with_fallbacks = sum(1 for f in faces if f[4] != "none")
    passed = sum(1 for f in faces if f[3] == "passthrough")
    seconds = sum(float(t) for line in own for t in _SECONDS.findall(line)[:1])
    summary = f"{len(faces)} face(s), {with_fallbacks} with fallbacks, {passed} passed through, {seconds:.2f} s total"
    return "\n".join([*own, summary])


class ReportWriter:
    """Appends rows to a JSONL file, flushing each line. The file is opened without following a link, and must be a
    regular file with one name (output_folder.open_report): a report planted as a link to a file elsewhere stops the
    run (OutputFolderError) instead of truncating that file. root: the resolved output folder (default: the file's
    folder, created when missing)."""

    def __init__(self, path: Path, append: bool, root: Path | None = None) -> None:
        if root is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            root = path.parent.resolve()
            path = root / path.name
        self.path = path
        self._fh: IO[str] = open_report(root, path, append)

    def write(self, row: dict[str, Any]) -> None:
        self._fh.write(json.dumps(row, sort_keys=True, default=str) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
