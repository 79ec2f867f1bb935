"""The Ray side's worker: a warm embedded ComfyUI in one actor (RunnerWorker), built from a WorkerSpec, with its
inputs written from the bytes the driver sends (WorkerFiles). Ray is optional; importing this module needs no Ray.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...video.encode import output_suffix
from ..items import Item


@dataclass(frozen=True)
class WorkerSpec:
    """How each worker builds its embedded ComfyUI."""

    comfyui: str | None = None
    cpu: bool = False
    sdpa: bool = False
    demo: bool = False
    num_gpus: float = 0.0
    num_cpus: float = 1.0


@dataclass(frozen=True)
class ChunkSetup:
    """What every chunk of a chunked workflow run shares (put in Ray's object store once per run): the chunk prompt
    (runner/ray/workflow_chunks.chunk_prompt), its video loader's node id (slot) and the constant loaders' files
    (node id -> (file name, bytes))."""

    prompt: dict[str, dict[str, Any]]
    slot: str
    constants: dict[str, tuple[str, bytes]]


@dataclass(frozen=True)
class ChunkTask:
    """One chunk to run: key names the video (its bytes are staged once per worker, whatever number of its chunks
    run here), filename is the video's file name, chunk its video.chunks.Chunk."""

    key: str
    filename: str
    chunk: Any


class WorkerFiles:
    """A worker's inputs, written from the bytes the driver sends and staged in its ComfyUI's input folder.

    Constants (the same bytes for every item: a reference face, a mask) are written once per content. An item's own
    file goes as soon as the item is done (`drop`). A video under chunking stays while more of its chunks may come
    here, at most `keep_videos` of them: the oldest goes first (a retried chunk brings its bytes again). So a worker's
    disk use is bounded by a few inputs, however many items a run or a service sends it.
    comfy: anything with stage(path) -> name and unstage(name) (EmbeddedComfy).
    """

    def __init__(self, comfy: Any, root: Path, keep_videos: int = 2) -> None:
        self.comfy, self.root, self.keep_videos = comfy, root, keep_videos
        self._staged: dict[str, tuple[str, Path]] = {}  # key -> (staged name, the written file)
        self._videos: list[str] = []

    def stage(self, key: str, filename: str, blob: bytes, video: bool = False) -> str:
        """The staged name for `key` (written and staged on first use). video: counts towards keep_videos."""
        if key in self._staged:
            if video:
                self._videos.remove(key)
                self._videos.append(key)
            return self._staged[key][0]
        folder = Path(tempfile.mkdtemp(dir=self.root))
        path = folder / Path(filename).name
        path.write_bytes(blob)
        self._staged[key] = (self.comfy.stage(path), path)
        if video:
            self._videos.append(key)
            while len(self._videos) > self.keep_videos:
                self.drop(self._videos[0])
        return self._staged[key][0]

    def drop(self, key: str) -> None:
        """Unstage `key` and delete its file (nothing when it is not staged)."""
        entry = self._staged.pop(key, None)
        if key in self._videos:
            self._videos.remove(key)
        if entry is not None:
            self.comfy.unstage(entry[0])
            shutil.rmtree(entry[1].parent, ignore_errors=True)

    def path(self, key: str) -> Path:
        """The written file of a staged key."""
        return self._staged[key][1]

    def keys(self) -> list[str]:
        return list(self._staged)


def constant_key(name: str, blob: bytes) -> str:
    """A constant's key: its file name and content (the same bytes are written once per worker)."""
    import hashlib

    return f"const:{name}:{hashlib.sha1(blob).hexdigest()}"


class RunnerWorker:
    """Ray actor body: a warm EmbeddedComfy; `run` processes one item given as bytes."""

    def __init__(self, spec: WorkerSpec, scratch: str | None = None) -> None:
        import os

        import torch

        from ..on_comfyui.embedded import EmbeddedComfy
        from .chunk_node import CHUNK_NODE, RunnerVideoChunk

        # float results differ in the last bits between thread counts: pinned to this worker's CPU share, any number
        # of workers (and the driver's track pass, ray.workflow_chunks.driver_tracks) compute alike
        torch.set_num_threads(max(1, int(spec.num_cpus)))
        extra: dict[str, type] = {CHUNK_NODE: RunnerVideoChunk}
        if spec.demo:
            from ..demo import DEMO_LOADER, DemoModels

            extra[DEMO_LOADER] = DemoModels
        self._root = worker_folder("tokenfuse_worker_", scratch)
        self.comfy = EmbeddedComfy(
            spec.comfyui, cpu=spec.cpu, sdpa=spec.sdpa, work_dir=self._root / "comfy", extra_nodes=extra
        )
        self.pid = os.getpid()
        self._files = self._root / "files"
        self._files.mkdir()
        self._inputs = WorkerFiles(self.comfy, self._files)
        self._jobs = 0

    def ident(self) -> int:
        return self.pid

    def node_defs(self) -> dict[str, dict[str, Any]]:
        """JSON-plain (as /object_info sends them): the driver may have no ComfyUI to unpickle its types."""
        import json

        return dict(json.loads(json.dumps(self.comfy.node_defs(), default=str)))

    def run(
        self,
        prompt: dict[str, dict[str, Any]],
        slot: str,
        constants: dict[str, tuple[str, bytes]],
        item: Item,
        data: bytes,
    ) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
        from ..run import StagedPrompt, process_item

        fixed = {nid: self._inputs.stage(constant_key(n, b), n, b) for nid, (n, b) in constants.items()}
        self._jobs += 1
        key = f"item:{self._jobs}"
        staged = self._inputs.stage(key, item.path.name, data)
        local = Item(path=self._inputs.path(key), name=item.name, kind=item.kind)
        try:
            row, files = process_item(self.comfy, StagedPrompt(prompt, slot, fixed), local, staged=staged)
        finally:
            self._inputs.drop(key)
            self.comfy.clear_outputs()  # read into `files` already
        row["item"], row["worker"] = item.key, self.pid
        return row, files

    def run_chunk(
        self, setup: ChunkSetup, task: ChunkTask, data: bytes, tracks: Any, pts: list[int | None]
    ) -> tuple[bytes | None, dict[str, Any], int]:
        """One time chunk of a video workflow (runner/ray/workflow_chunks.py): data is the video's bytes, tracks and
        pts its whole-video tracks and frame pts (each its own ObjectRef on the driver: Ray resolves top-level
        arguments only). Returns the chunk's MP4 (video only; None when the prompt failed), its stats (or
        {"error": ...}) and this worker's pid."""
        from ..run import bind, output_name
        from .chunk_node import JOBS, ChunkJob

        prompt, slot, constants = setup.prompt, setup.slot, setup.constants
        key, filename, chunk = task.key, task.filename, task.chunk

        names = {
            nid: self._inputs.stage(constant_key(n, b), n, b) for nid, (n, b) in constants.items() if nid in prompt
        }
        names[slot] = self._inputs.stage(key, filename, data, video=True)
        self._jobs += 1
        job = f"{prompt[_chunk_node_id(prompt)]['inputs']['job']}#{self._jobs}"  # unique: never a cached result
        out = self._files / f"chunk_{self._jobs}{output_suffix()}"
        JOBS[job] = ChunkJob(tracks, chunk, pts, out)
        try:
            staged = bind(prompt, names)
            staged[_chunk_node_id(prompt)]["inputs"]["job"] = job
            result = self.comfy.execute(staged)
            if not result.ok:
                return None, {"error": result.error}, self.pid
            # the telemetry JSONL the chunk's nodes wrote, read by video_chunks.chunk_files
            written = [(output_name(f), f.read()) for f in result.written]
            return out.read_bytes(), {**JOBS[job].stats.counts(), "written": written}, self.pid
        finally:
            JOBS.pop(job, None)
            out.unlink(missing_ok=True)
            self.comfy.clear_outputs()  # what the chunk's nodes wrote is in `written` already

    def cleanup(self) -> None:
        """Delete this worker's scratch files and its ComfyUI work folder (inputs, outputs, temp previews: all in the
        worker's folder); RayPool.close calls it before killing the actor (a killed worker's folder goes with the
        pool's scratch folder)."""
        self.comfy.close()
        shutil.rmtree(self._root, ignore_errors=True)


def worker_folder(prefix: str, scratch: str | None) -> Path:
    """A worker's own temp folder: under the pool's scratch folder when this machine has it (a local cluster: the
    driver deletes that folder at close, so a worker killed mid-item leaves nothing), else the system temp folder."""
    base = Path(scratch) if scratch and Path(scratch).is_dir() else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def _chunk_node_id(prompt: dict[str, dict[str, Any]]) -> str:
    from .chunk_node import CHUNK_NODE

    return next(nid for nid, node in prompt.items() if node["class_type"] == CHUNK_NODE)
