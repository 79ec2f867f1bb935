"""Tracked text files carry no trace of one machine or one work session: no absolute path of a particular machine
(/work/..., /root/..., /home/<user>/..., /Users/<user>/..., C:\\Users\\<user>\\...), no branch name of a work branch and
no session numbering. Documents say what is and how to reproduce it, with generic paths (/path/to/ComfyUI); the story
of how it got there belongs in commit messages and issue notes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

MACHINE_PATH = re.compile(
    r"(?<![\w.~-])(?:/(?:work|root)/[\w.-]|/(?:home|Users)/(?!user/|username/|you/|me/)[\w.-]+/|[A-Za-z]:\\\\?Users\\\\?)"
)
WORK_LOG = re.compile(
    r"\b[Ss]ession (?:\d+|of \d{4}-\d\d-\d\d)\b"  # "session 23", "Session of 2026-11-30"
    r"|\b[Bb]ranch [`'\"]?(?!name\b|names\b|of\b|and\b|or\b|to\b|is\b|that\b)[a-z][\w-]*[`'\"]?(?=[\s,.;:)])"
    r"|\([a-z][\w-]* branch\b"  # "(identity branch, ...)"
)
TEXT_SUFFIXES = {".py", ".md", ".sh", ".mjs", ".js", ".json", ".toml", ".txt", ".yaml", ".yml", ".cfg", ".ini", ""}


def tracked_text_files() -> list[Path]:
    """Files git tracks whose suffix is a text format (binary pictures and weights are left out)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60, check=True).stdout
    paths = [REPO / p for p in out.decode().split("\0") if p]
    return [p for p in paths if p.suffix.lower() in TEXT_SUFFIXES and p.is_file()]


def findings(text: str) -> list[str]:
    """The machine paths and work-log marks in a text."""
    return [m.group(0) for m in MACHINE_PATH.finditer(text)] + [m.group(0) for m in WORK_LOG.finditer(text)]


def test_findings_parser() -> None:
    bad = (
        "python bench/x.py --faces /work/data/fm256/heldout; see /root/.cache/x and /home/alice/ComfyUI, "
        "C:\\Users\\bob\\ComfyUI; session 23; Session of 2026-11-30; branch `speed`, (identity branch, today)"
    )
    assert findings(bad) == [
        "/work/d",
        "/root/.",
        "/home/alice/",
        "C:\\Users\\",
        "session 23",
        "Session of 2026-11-30",
        "branch `speed`",
        "(identity branch",
    ]
    good = (
        "COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python; ~/ComfyUI; /home/user/ComfyUI; a/work/b; "
        "a branch name; the ComfyUI-TokenFuse clone; /tmp/x; the session's websocket; run 1 / run 2"
    )
    assert findings(good) == []


def test_tracked_text_has_no_machine_paths_or_work_log_marks() -> None:
    me = Path(__file__).resolve()
    bad = []
    for path in tracked_text_files():
        if path.resolve() == me:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for line_no, line in enumerate(text.splitlines(), 1):
            bad += [f"{path.relative_to(REPO)}:{line_no}: {hit}" for hit in findings(line)]
    assert not bad, "machine paths / branch names / session numbers in tracked files:\n" + "\n".join(bad[:50])
