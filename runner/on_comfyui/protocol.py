"""What the runner needs from a ComfyUI: node definitions, a way to hand it an input file, and execution.

Two implementations: runner/on_comfyui/embedded.py (ComfyUI imported in this process, warm between items) and
runner/on_comfyui/client.py (a running ComfyUI server over HTTP).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

Progress = Callable[[int, int], None]
"""progress(value, total) of the node running now (sampler steps, faces...)."""

# ComfyUI's core nodes that write files to its output folder. An item whose prompt has one that filed nothing is
# failed, not ok with no outputs: `--resume` would otherwise skip it forever.
SAVE_NODES = frozenset({"SaveImage", "SaveVideo", "SaveWEBM", "SaveAnimatedWEBP", "SaveAnimatedPNG", "SaveAudio"})
PARTIAL_INVALID = "Some outputs failed validation"


@dataclass
class OutputFile:
    """One file a workflow saved: its name and a way to get its bytes (local copy or HTTP download)."""

    filename: str
    subfolder: str
    read: Callable[[], bytes]
    local: Path | None = None


@dataclass
class ExecResult:
    """The outcome of one prompt. `texts`: the pack's STRING report outputs per node id (embedded only).
    `written`: files the pack's nodes wrote into the ComfyUI's own output folder besides the save nodes' outputs (the
    telemetry JSONL a schedule's `telemetry_jsonl` asks for; embedded only: that folder is temporary, a --server
    ComfyUI keeps its own)."""

    ok: bool
    error: str = ""
    interrupted: bool = False
    outputs: list[OutputFile] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    written: list[OutputFile] = field(default_factory=list)
    peak_memory_mib: float | None = None
    memory_kind: str = ""


class ComfyUnavailable(ConnectionError):
    """The ComfyUI is gone (a --server ComfyUI that stopped answering): not one item's fault, so a run
    stops there (the item counts as interrupted; `--resume` redoes it) instead of failing every remaining item."""


class Comfy(Protocol):
    """A ComfyUI the item loop runs prompts on (runner/run.py): its node definitions (/object_info), `stage` (an
    input file -> the name a loader node takes), `execute` (one prompt, progress per node), `interrupt` (the running
    prompt) and `close` (its work folder goes)."""

    def node_defs(self) -> dict[str, dict[str, Any]]: ...

    def stage(self, path: Path) -> str: ...

    def execute(self, prompt: dict[str, dict[str, Any]], progress: Progress | None = None) -> ExecResult: ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...


def output_entries(ui: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """node id -> the files it saved (`type: output` entries of ComfyUI's UI outputs, e.g. history's `outputs`);
    previews (`type: temp`) are not outputs."""
    found: dict[str, list[dict[str, Any]]] = {}
    for nid, node_out in ui.items():
        for entries in node_out.values() if isinstance(node_out, dict) else []:
            for e in entries if isinstance(entries, list) else []:
                if isinstance(e, dict) and e.get("type") == "output" and "filename" in e:
                    found.setdefault(str(nid), []).append(e)
    return found


def missing_saves(prompt: dict[str, dict[str, Any]], saved: dict[str, list[dict[str, Any]]]) -> str:
    """The error of an item whose save nodes (SAVE_NODES) did not all file something ("" when they did): ComfyUI
    runs the outputs that validate and skips the others, so "success" alone does not mean the result was saved."""
    missing = [
        f"node {nid} ({n['class_type']})"
        for nid, n in prompt.items()
        if n["class_type"] in SAVE_NODES and not saved.get(nid)
    ]
    return f"{', '.join(missing)} saved no file" if missing else ""
