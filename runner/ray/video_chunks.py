"""Chunked videos on the Ray side: one video item in flight (ChunkedVideo), each chunk's outcome filed on it
(record_chunk) and, once every chunk is back, the chunks joined into the item's file and report row (join_video).
Shared by the core engine's chunked videos (runner/core/video.py) and the workflows' (runner/ray/workflow_video.py).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from ...video.encode import output_suffix
from ..items import Item

if TYPE_CHECKING:
    from ...video.chunks import Chunk
    from .dispatch import Outcome

log = logging.getLogger("tokenfuse.runner")


@dataclass(eq=False)
class ChunkedVideo:
    """One video item in flight: its tracks and chunk plan, and the chunks' results as they come back."""

    index: int
    item: Item
    row: dict[str, Any]
    t0: float
    plan: list[Chunk] = field(default_factory=list)
    refs: tuple[Any, ...] = ()
    key: str = ""
    blobs: dict[int, bytes] = field(default_factory=dict)
    written: dict[int, list[tuple[str, bytes]]] = field(default_factory=dict)  # chunk -> the pack's files (telemetry)
    chunks: dict[int, dict[str, Any]] = field(default_factory=dict)
    files: list[tuple[str, bytes]] | None = None  # set when the item ended without chunks (failed, no faces)

    @property
    def out_name(self) -> str:
        return f"{self.item.name}_fused{output_suffix()}"

    def fail(self, e: Exception) -> None:
        log.debug("video %s failed", self.item.path, exc_info=True)
        self.row.update(status="failed", error=f"{type(e).__name__}: {e}", time_s=self.elapsed())
        self.files = []

    def elapsed(self) -> float:
        return round(time.perf_counter() - self.t0, 3)


def chunk_outcome(out: Outcome) -> tuple[dict[str, Any], bytes | None]:
    """One chunk job's report entry (range, attempts, retries, worker, stats or error) and its video blob (None when
    the chunk failed). The files a workflow chunk's nodes wrote (its stats' "written", chunk_files) stay out of the
    report."""
    c = out.job[1]
    info: dict[str, Any] = {"index": c.index, "start": c.start, "stop": c.stop, "boundary": c.boundary}
    info["attempts"] = out.attempt
    if out.lost:
        info["retried"] = out.lost
    if out.value is None:
        info["error"] = out.error
        return info, None
    blob, stats, info["worker"] = out.value
    if blob is None:
        info["error"] = stats.get("error", "chunk failed")
        return info, None
    info.update({k: s for k, s in stats.items() if k != "written"})
    return info, blob


def chunk_files(out: Outcome) -> list[tuple[str, bytes]]:
    """(name, bytes) of the files a workflow chunk's nodes wrote besides its video (the schedule's telemetry JSONL,
    named relative to ComfyUI's output folder: `tokenfuse/run.jsonl`), carried in its stats as "written"; none for a
    failed or lost chunk."""
    if out.value is None or out.value[0] is None:
        return []
    return [(str(name), bytes(data)) for name, data in out.value[1].get("written", [])]


def chunk_file_name(name: str, index: int) -> str:
    """`tokenfuse/run.jsonl` of chunk 2 -> `tokenfuse/run.chunk2.jsonl`: every chunk's file kept beside the video."""
    path = PurePosixPath(name)
    return str(path.with_name(f"{path.stem}.chunk{index}{path.suffix}"))


def record_chunk(v: ChunkedVideo, out: Outcome) -> None:
    """File one chunk outcome on its video (the core engine's and the workflows' chunked runs)."""
    info, blob = chunk_outcome(out)
    if blob is not None:
        v.blobs[info["index"]] = blob
        v.written[info["index"]] = chunk_files(out)
    v.chunks[info["index"]] = info


def join_video(
    v: ChunkedVideo, metadata: dict[str, str] | None = None
) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """Every chunk is back: the report row and the joined file (chunk order, the input's audio copied once;
    metadata: its container tags)."""
    from ...video.chunks import join_chunks

    row = v.row
    row["chunks"] = [v.chunks[i] for i in sorted(v.chunks)]
    row["workers"] = sorted({c["worker"] for c in row["chunks"] if "worker" in c})
    row["attempts"] = max(c["attempts"] for c in row["chunks"])
    lost = [f"chunk {c['index']} {line}" for c in row["chunks"] for line in c.get("retried", [])]
    if lost:
        row["retried"] = lost
    v.refs = ()  # the object store may free the video
    errors = [f"chunk {c['index']}: {c['error']}" for c in row["chunks"] if "error" in c]
    if errors:
        row.update(status="failed", error="; ".join(errors), time_s=v.elapsed())
        return row, []
    try:
        with tempfile.TemporaryDirectory(prefix="tokenfuse_join_") as tmp:
            paths = []
            for i in sorted(v.blobs):
                paths.append(Path(tmp) / f"chunk_{i}{output_suffix()}")
                paths[-1].write_bytes(v.blobs.pop(i))
            join = join_chunks(v.item.path, paths, Path(tmp) / v.out_name, metadata)
            files = [(v.out_name, (Path(tmp) / v.out_name).read_bytes())]
    except Exception as e:  # noqa: BLE001 - a failed join fails this item only
        v.fail(e)
        return row, []
    for k in ("frames", "faces", "key_frames", "flow_failures", "diffusion_runs", "crops_refined"):
        row[k] = sum(c[k] for c in row["chunks"])
    files += [(chunk_file_name(n, i), data) for i in sorted(v.written) for n, data in v.written.pop(i)]
    row["join"] = "copied" if join.copied else f"re-encoded ({join.reason})"
    row.update(audio_packets=join.audio_packets, status="ok", time_s=v.elapsed())
    return row, files
