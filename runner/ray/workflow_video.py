"""`run workflow.json clip.mp4 --ray ... --workers N` for a video workflow: each video split into time chunks fused
on different RunnerWorkers (a warm embedded ComfyUI each), joined in order with the audio copied once; the frames
equal a one-worker run's (runner/ray/workflow_chunks.py says when chunking applies and why faces_per_batch is 1).

Per item: the driver runs FaceTrack's track pass (no ComfyUI), plans chunks, and dispatches one job per chunk
(ray.dispatch.dispatch: a worker lost mid-chunk is replaced and the chunk sent again elsewhere); when every chunk is
back it joins them (video_chunks.join_video: chunk order, the input's audio, packets copied). An item that cannot be
chunked (the workflow, one worker, no face tracks, too short for two chunks) runs whole on one worker like
`run_items_ray`. Every report row says how the item ran: `route` ("chunks: 3 on 2 workers" or "whole: <why>"),
and for chunks the chunk list with each chunk's worker, attempts and lost attempts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..items import Item
from ..run import RunTarget, Summary, Workflow
from .dispatch import Outcome, dispatch
from .pool import RayPool
from .video_chunks import ChunkedVideo, join_video, record_chunk
from .worker import ChunkSetup, ChunkTask
from .workflow_chunks import (
    VideoGraph,
    chunk_prompt,
    driver_tracks,
    find_video_graph,
    fuse_options,
    joined_metadata,
    output_name,
    track_widgets,
)

log = logging.getLogger("tokenfuse.runner")
MIN_CHUNK_S = 1.0  # videos shorter than two of these run whole


@dataclass(eq=False)
class _WorkflowVideo(ChunkedVideo):
    """A video item of a chunked workflow run; out_name as the workflow's SaveVideo would name it."""

    name: str = ""

    @property
    def out_name(self) -> str:
        return self.name


@dataclass(frozen=True)
class _Whole:
    """An item sent whole to one worker, and why."""

    index: int
    item: Item
    reason: str


def chunk_plan_count(frame_count: int, fps: float, chunks: int, workers: int) -> int:
    """Chunks for a video: `chunks` (0 = one per worker), at most one per MIN_CHUNK_S seconds."""
    longest = max(1, int(frame_count / max(MIN_CHUNK_S * fps, 1.0)))
    return max(1, min(chunks or workers, longest))


@dataclass(frozen=True)
class _Planning:
    """What the driver plans every video of a chunked run with (built once per run): the workflow's prompt, its
    video graph, chunks per video (0 = one per worker) and the torch threads of the track pass (cpus)."""

    prompt: dict[str, dict[str, Any]]
    graph: VideoGraph
    chunks: int
    cpus: int


def _prepare(pool: RayPool, index: int, item: Item, planning: _Planning) -> _WorkflowVideo | _Whole:
    """Track pass and chunk plan on the driver; a _Whole when this item runs whole; a failed _WorkflowVideo
    (files == []) on a bad input."""
    from ...video.chunks import plan_chunks

    prompt, graph, chunks, cpus = planning.prompt, planning.graph, planning.chunks, planning.cpus

    row = {"item": item.key, "name": item.name, "kind": item.kind}
    v = _WorkflowVideo(index, item, row, time.perf_counter(), name=output_name(prompt, graph, item.name))
    try:
        tracks, pts = driver_tracks(item.path, track_widgets(prompt, graph), threads=cpus)
        if not tracks.tracks:
            return _Whole(index, item, "no face tracks (copied through)")
        n = chunk_plan_count(tracks.frame_count, tracks.fps, chunks, len(pool.actors))
        plan = plan_chunks(tracks, n, fuse_options(prompt, graph))
        if len(plan) < 2:
            return _Whole(index, item, f"too short for 2 chunks ({tracks.frame_count} frames)")
        v.row.update(tracks=len(tracks.tracks), cuts=len(tracks.cuts), track_s=round(tracks.seconds, 3))
        v.plan = plan
        v.refs = (pool.ray.put(item.path.read_bytes()), pool.ray.put(tracks), pool.ray.put(pts))
        v.key = f"{item.key}:{item.path.stat().st_mtime_ns}"
    except Exception as e:  # noqa: BLE001 - a bad input fails its item only
        v.fail(e)
    return v


def _whole_row(out: Outcome, reason: str) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    item = out.job.item
    if out.value is not None:
        row, files = out.value
    else:
        row = {"item": item.key, "name": item.name, "kind": item.kind, "status": "failed"}
        row["error"], files = out.error.removeprefix("OSError: "), []
    row["attempts"] = out.attempt
    if out.lost:
        row["retried"] = out.lost
    row["route"] = f"whole: {reason}"
    return row, files


def _whole_reason(graph: Any, workers: int, chunks: int) -> str:
    """Why the videos run whole on the workers ("" when they go in chunks): the workflow cannot be chunked (graph is
    find_video_graph's reason), or one worker with chunks 0 or 1. Logged once."""
    reason = graph if isinstance(graph, str) else ""
    if not reason and workers < 2 and chunks <= 1:
        reason = "one worker"
    if reason:
        log.info("video workflow runs whole videos on the workers: %s", reason)
    return reason


def _joined_row(v: ChunkedVideo, metadata: dict[str, str]) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """A chunked video's report row and files once every chunk is back: the chunks joined, the route recorded."""
    row, files = join_video(v, metadata)
    workers = row.get("workers", [])
    row["route"] = f"chunks: {len(v.plan)} on {len(workers)} worker(s)"
    row["faces_per_batch"] = 1
    return row, files


def run_workflow_videos_ray(
    pool: RayPool, workflow: Workflow, target: RunTarget, chunks: int = 0, on_dispatch: Any = None
) -> Summary:
    """Video items of a workflow over the pool's RunnerWorkers (module docstring). chunks: per video (0 = one per
    worker; a single worker with chunks 0 or 1 runs items whole). Same report, resume and summary as run_items_ray;
    on_dispatch(job, actor, attempt): test hook (job: a (video, Chunk) pair or a _Whole). A lost worker's job is
    sent again at most twice."""
    ray = pool.ray
    prompt, slot, constants, items = workflow.prompt, workflow.slot, workflow.constants, workflow.items
    graph = find_video_graph(prompt, slot)
    reason = _whole_reason(graph, len(pool.actors), chunks)
    cpus = max(1, int(pool.spec.num_cpus))
    run = target.log(len(items))
    prompt_ref = ray.put(prompt)
    consts = {nid: (p.name, p.read_bytes()) for nid, p in constants.items()}
    const_ref = ray.put(consts)
    chunk_ref = (
        None if isinstance(graph, str) else ray.put(ChunkSetup(chunk_prompt(prompt, graph, "runner"), slot, consts))
    )

    planning = None if isinstance(graph, str) else _Planning(prompt, graph, chunks, cpus)

    def jobs() -> Iterator[Any]:
        for index, item in enumerate(items, 1):
            if run.skip_done(index, item):
                continue
            if reason or planning is None:
                yield _Whole(index, item, reason)
                continue
            v = _prepare(pool, index, item, planning)
            if isinstance(v, _Whole):
                yield v
            elif v.files is not None:
                run.finish(index, item, v.row, v.files)
            else:
                for chunk in v.plan:
                    yield v, chunk

    def submit(actor: Any, job: Any) -> Any:
        if isinstance(job, _Whole):
            try:
                data = job.item.path.read_bytes()
            except OSError as e:
                raise OSError(f"cannot read input: {e}") from e
            return actor.run.remote(prompt_ref, slot, const_ref, job.item, data)
        v, chunk = job
        task = ChunkTask(v.key, v.item.path.name, chunk)
        return actor.run_chunk.remote(chunk_ref, task, v.refs[0], v.refs[1], v.refs[2])

    try:
        for out in dispatch(pool, jobs(), submit, 2, on_dispatch):
            if isinstance(out.job, _Whole):
                row, files = _whole_row(out, out.job.reason)
                run.finish(out.job.index, out.job.item, row, files)
                continue
            v = out.job[0]
            record_chunk(v, out)
            if len(v.chunks) == len(v.plan):
                names = {**{nid: p.name for nid, p in constants.items()}, slot: v.item.path.name}
                run.finish(v.index, v.item, *_joined_row(v, joined_metadata(prompt, names)))
    finally:
        run.end(f" (ray, {len(pool.actors)} workers, video chunks)")
    return run.summary
