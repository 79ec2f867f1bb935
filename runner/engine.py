"""What the runner needs from a ComfyUI: node definitions, a way to hand it an input file, and execution.

Two implementations: runner/embedded.py (ComfyUI imported in this process, warm between items) and runner/client.py
(a running ComfyUI server over HTTP).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

Progress = Callable[[int, int], None]
"""progress(value, total) of the node running now (sampler steps, faces...)."""


@dataclass
class OutputFile:
    """One file a workflow saved: its name and a way to get its bytes (local copy or HTTP download)."""

    filename: str
    subfolder: str
    read: Callable[[], bytes]
    local: Path | None = None


@dataclass
class ExecResult:
    """The outcome of one prompt. `texts`: the pack's STRING report outputs per node id (embedded only)."""

    ok: bool
    error: str = ""
    interrupted: bool = False
    outputs: list[OutputFile] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    peak_memory_mib: float | None = None
    memory_kind: str = ""


class EngineUnavailable(ConnectionError):
    """The engine's backend is gone (a --server ComfyUI that stopped answering): not one item's fault, so a run
    stops there (the item counts as interrupted; `--resume` redoes it) instead of failing every remaining item."""


class Engine(Protocol):
    def node_defs(self) -> dict[str, dict[str, Any]]: ...

    def stage(self, path: Path) -> str: ...

    def execute(self, prompt: dict[str, dict[str, Any]], progress: Progress | None = None) -> ExecResult: ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...
