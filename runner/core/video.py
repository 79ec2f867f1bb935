"""The ComfyUI-free video engine: the pack's video core (track pass, fuse pass, chunks, join) with a sampler given
by name, for long videos over Ray workers and for the service's video endpoint.

A long video is analysed once on the driver (face tracks, smoothing, scene cuts, every frame's timestamp), split
into time chunks (video/chunks.py: at scene cuts, faceless gaps or key frames), and its chunks are fused on
different workers given the whole-video tracks; the driver joins the chunk files in order (packet copy) and
copies the input's audio once. The fused frames equal a one-worker run's (see video/chunks.py); each chunk is
encoded on its own, so the file equals a one-worker file frame for frame only at crf 0 (lossless). A worker lost
mid-chunk is replaced and the chunk run again elsewhere (ray.dispatch.dispatch); the item's report row
lists every chunk with the worker that fused it and its lost attempts.

The sampler (runner/core/refine.py): "demo", the small trained face model in plain torch through the pack's
fusion loop (`run --engine core`), or "standin", a seeded stand-in (what the Ray CI tests and the scale-out's own
cost measurements use). ComfyUI video workflows under `run --ray` are chunked the same way on RunnerWorkers
(runner/ray/workflow_video.py).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...video.encode import output_suffix
from ..items import Item
from ..ray.video_chunks import ChunkedVideo, join_video, record_chunk
from .refine import RefineName, make_refine

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ...video.chunks import Chunk
    from ...video.fuse_pass import FuseOptions, Refine
    from ...video.track_pass import FaceTracks, Progress
    from ..ray.pool import RayPool
    from ..run import RunTarget, Summary

log = logging.getLogger("tokenfuse.runner")


@dataclass(frozen=True)
class CoreSpec:
    """What the core engine runs. detector/detect_size: the track pass (driver); refine: the sampler (workers;
    runner/core/refine.py), steps/denoise/schedule: the demo model's sampling and TokenFuse scheduling preset;
    crop_size .. preset: the fuse pass (video/fuse_pass.FuseOptions; preset is x264's); chunks: chunks per video
    (0 = one per worker); min_chunk_s: videos shorter than two of these are not split."""

    refine: RefineName = "standin"
    steps: int = 20
    denoise: float = 0.45
    schedule: str = "balanced"
    detector: str = "auto"
    detect_size: int = 320
    crop_size: int = 256
    faces_per_batch: int = 2
    seed: int = 0
    keyframes_per_second: float = 2.0
    crf: int = 19
    preset: str = "medium"
    chunks: int = 0
    min_chunk_s: float = 1.0
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def fuse_options(self) -> FuseOptions:
        from ...video.encode import EncodeOptions
        from ...video.fuse_pass import FuseOptions
        from ...video.keyframes import KeyframeOptions

        return FuseOptions(
            crop_size=self.crop_size,
            faces_per_batch=self.faces_per_batch,
            seed=self.seed,
            keyframes=KeyframeOptions(per_second=self.keyframes_per_second),
            encode=EncodeOptions(crf=self.crf, preset=self.preset),  # type: ignore[arg-type]
        )

    def make_refine(self, threads: int = 0) -> Refine:
        """threads: torch threads for the demo model (0 = as set). Its float results differ in the last bits between
        thread counts, so a Ray worker pins its CPU share: one worker and N workers give the same frames."""
        return make_refine(self.refine, self.steps, self.denoise, self.schedule, threads)


def analyse(path: Path, spec: CoreSpec) -> tuple[FaceTracks, list[int | None]]:
    """The track pass over the whole video, once: its tracks and every frame's pts (for the chunks' seeks)."""
    from ...faces.analyse import load_backend
    from ...video.track_pass import TrackHooks, track_video
    from ...video.tracks import make_detect

    detector, _ = load_backend(spec.detector, [], device="cpu")  # type: ignore[arg-type]
    pts: list[int | None] = []
    tracks = track_video(
        path, make_detect(detector, spec.detect_size), hooks=TrackHooks(on_frame=lambda f: pts.append(f.pts))
    )
    return tracks, pts


def fuse_file(
    path: Path, out_path: Path, spec: CoreSpec, refine: Refine | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """One video, one process: track pass then fuse pass (the single-worker path; the service's video endpoint;
    `run --engine core` without --ray). progress(frames done, total) during the fuse pass. Returns the report
    fields (frames, faces, key frames, diffusion runs, ..., time_s). Raises on a bad input."""
    from ...video.fuse_pass import FuseJob, fuse_video

    t0 = time.perf_counter()
    tracks, _ = analyse(path, spec)
    stats = fuse_video(path, out_path, FuseJob(tracks, refine or spec.make_refine(), spec.fuse_options(), progress))
    row: dict[str, Any] = {
        **stats.counts(),
        "tracks": len(tracks.tracks),
        "cuts": len(tracks.cuts),
        "copied": stats.copied,
    }
    row["time_s"] = round(time.perf_counter() - t0, 3)
    return row


class VideoWorker:
    """Ray actor body: fuses chunks of videos given their whole-video tracks."""

    def __init__(self, spec: CoreSpec, scratch: str | None = None) -> None:
        from ..ray.worker import worker_folder

        self.spec = spec
        self.refine = spec.make_refine(threads=max(1, int(spec.num_cpus)))
        self.opts = spec.fuse_options()
        self.pid = os.getpid()
        self._files = worker_folder("tokenfuse_vworker_", scratch)
        self._videos: dict[str, Path] = {}

    def ident(self) -> int:
        return self.pid

    def cleanup(self) -> None:
        """Delete this worker's copies of the videos (RayPool.close calls it before killing the actor)."""
        import shutil

        shutil.rmtree(self._files, ignore_errors=True)
        self._videos = {}

    def fuse_chunk(
        self, key: str, data: bytes, tracks: FaceTracks, chunk: Chunk, pts: list[int | None]
    ) -> tuple[bytes, dict[str, Any], int]:
        """The chunk's MP4 (video only) as bytes, its stats and this worker's pid."""
        from ...video.chunks import fuse_chunk
        from ...video.fuse_pass import FuseJob

        path = self._videos.get(key)
        if path is None:  # a video's bytes are written once per worker, whatever number of its chunks run here
            for old in self._videos.values():
                old.unlink(missing_ok=True)
            path = self._files / f"{len(self._videos)}{Path(tracks.name).suffix or '.mp4'}"
            path.write_bytes(data)
            self._videos = {key: path}
        out = self._files / f"chunk_{chunk.index}{output_suffix(self.opts.encode.codec)}"
        stats = fuse_chunk(path, out, FuseJob(tracks, self.refine, self.opts), chunk, pts)
        blob = out.read_bytes()
        out.unlink()
        return blob, stats.counts(), self.pid


def chunk_count(tracks: FaceTracks, spec: CoreSpec, workers: int) -> int:
    n = spec.chunks or workers
    longest = max(1, int(tracks.frame_count / max(spec.min_chunk_s * tracks.fps, 1.0)))
    return max(1, min(n, longest))


def _prepare(pool: RayPool, index: int, item: Item, spec: CoreSpec) -> ChunkedVideo:
    """Analyse a video on the driver and plan its chunks (or finish it: a bad input, a video without faces)."""
    from ...video.chunks import plan_chunks
    from ...video.fuse_pass import FuseJob, fuse_video

    v = ChunkedVideo(index, item, {"item": item.key, "name": item.name, "kind": item.kind}, time.perf_counter())
    if item.kind != "video":
        v.fail(ValueError("the core video engine takes videos only"))
        return v
    try:
        tracks, pts = analyse(item.path, spec)
        v.row.update(tracks=len(tracks.tracks), cuts=len(tracks.cuts), track_s=round(tracks.seconds, 3))
        if not tracks.tracks:  # nothing to fuse: copied through on the driver
            with tempfile.TemporaryDirectory(prefix="tokenfuse_copy_") as tmp:
                out = Path(tmp) / v.out_name
                stats = fuse_video(item.path, out, FuseJob(tracks, spec.make_refine(), spec.fuse_options()))
                v.files = [(v.out_name, out.read_bytes())]
            v.row.update(stats.counts(), status="ok", chunks=[], join="copied (no face tracks)", time_s=v.elapsed())
            return v
        v.plan = plan_chunks(tracks, chunk_count(tracks, spec, len(pool.actors)), spec.fuse_options())
        v.refs = (pool.ray.put(item.path.read_bytes()), pool.ray.put(tracks), pool.ray.put(pts))
        v.key = f"{item.key}:{item.path.stat().st_mtime_ns}"
    except Exception as e:  # noqa: BLE001 - a bad input fails its item only
        v.fail(e)
    return v


def run_videos_ray(
    pool: RayPool, items: list[Item], spec: CoreSpec, target: RunTarget, on_dispatch: Any = None
) -> Summary:
    """Every video item over the pool's VideoWorker actors (module docstring). The chunks of all items form one
    stream of jobs: while the workers fuse one item's chunks, the driver analyses the next item, so several short
    videos (one chunk each) also run side by side. Same report, resume and summary as run.run_items;
    on_dispatch(chunk, actor, attempt): test hook (tests kill a worker there). A lost worker's chunk is sent again
    at most twice."""
    from ..ray.dispatch import dispatch

    run = target.log(len(items))

    def jobs() -> Iterator[tuple[ChunkedVideo, Chunk]]:
        for index, item in enumerate(items, 1):
            if run.skip_done(index, item):
                continue
            v = _prepare(pool, index, item, spec)
            if v.files is not None:
                run.finish(index, item, v.row, v.files)
                continue
            for chunk in v.plan:
                yield v, chunk

    def submit(actor: Any, job: tuple[ChunkedVideo, Chunk]) -> Any:
        v, chunk = job
        return actor.fuse_chunk.remote(v.key, v.refs[0], v.refs[1], chunk, v.refs[2])

    hook = None if on_dispatch is None else (lambda job, actor, attempt: on_dispatch(job[1], actor, attempt))
    try:
        for out in dispatch(pool, jobs(), submit, 2, hook):
            v = out.job[0]
            record_chunk(v, out)
            if len(v.chunks) == len(v.plan):
                row, files = join_video(v)
                run.finish(v.index, v.item, row, files)
    finally:
        run.end(f" (ray core video, {len(pool.actors)} workers)")
    return run.summary


def run_videos_local(items: list[Item], spec: CoreSpec, target: RunTarget) -> Summary:
    """Every video item in this process, one after the other (`run --engine core` without --ray): same outputs
    (`<output>/<name>/<name>_fused.mp4`), report rows, resume and summary as run_videos_ray. A bad input fails its
    item only; Ctrl-C (KeyboardInterrupt) ends the run after writing the report of the items done."""
    run = target.log(len(items))
    refine = spec.make_refine()  # built once: the demo model stays loaded between videos
    try:
        for index, item in enumerate(items, 1):
            if run.skip_done(index, item):
                continue
            run.bar.item(index, item.name)
            row: dict[str, Any] = {"item": item.key, "name": item.name, "kind": item.kind}
            files: list[tuple[str, bytes]] = []
            t0 = time.perf_counter()
            try:
                if item.kind != "video":
                    raise ValueError("the core video engine takes videos only")
                with tempfile.TemporaryDirectory(prefix="tokenfuse_core_") as tmp:
                    out = Path(tmp) / f"{item.name}_fused{output_suffix()}"
                    row.update(fuse_file(item.path, out, spec, refine, run.bar.step), status="ok")
                    files = [(out.name, out.read_bytes())]
            except Exception as e:  # noqa: BLE001 - a bad input fails its item only
                log.debug("video %s failed", item.path, exc_info=True)
                row.update(status="failed", error=f"{type(e).__name__}: {e}", time_s=round(time.perf_counter() - t0, 3))
            run.finish(index, item, row, files)
    except KeyboardInterrupt:
        run.summary.interrupted = True
    finally:
        run.end(f" (core video, sampler {spec.refine})")
    return run.summary
