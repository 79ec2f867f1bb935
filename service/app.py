"""`serve`: TokenFuse face fusion behind Ray Serve.

POST /  (body: an image file) -> JSON {"status", "faces", "fallbacks", "time_s", "batch_size", "image_png_base64",
"report"}; POST /video (body: a video file) -> the fused MP4 (same frames, timestamps and audio; video/mp4) with
the JSON report in the X-TokenFuse-Report header, or JSON {"status": "failed", "error"} with 400; GET /health ->
{"status": "ok", ...}. One replica per GPU (num_gpus=1 when the cluster has GPUs), each
holding a warm embedded ComfyUI. Concurrent requests are batched (`@serve.batch`, at most `max_batch` photos,
waiting at most `batch_wait_s`): photos of one size become one IMAGE batch through the workflow, so their faces
share ScheduledFusion's sampler calls (faces_per_batch). Backpressure: more than `max_queued` waiting requests per
replica are answered 503 with Retry-After by Serve itself, before any work. Shutdown (SIGINT/SIGTERM) drains
in-flight requests (graceful_shutdown_timeout_s) and stops a local Ray it started.

Access: bound beyond loopback (--host other than 127.0.0.1 / localhost / ::1) the service refuses to start without a
token (--token or TOKENFUSE_SERVE_TOKEN); with a token, every request needs `Authorization: Bearer <token>` (401
otherwise), on loopback too. GET /health stays open for liveness probes but answers only {"status": "ok"} without the
token; its counters need it. The replica checks the token (not Serve's proxy), so a request reaching it by another
path (Serve's inter-deployment gRPC) is checked as well. A local Ray cluster listens on 127.0.0.1 only
(runner/ray/cluster.connect; the replicas' gRPC servers too: replica_grpc_on_loopback).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import os
import shutil
import threading
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tokenfuse.service.access import (  # noqa: F401 - TOKEN_ENV, token_digest: the service's names for its callers
    TOKEN_ENV,
    UNAUTHORIZED,
    access_error,
    authorized,
    is_loopback,
    replica_grpc_on_loopback,
    token_digest,
)
from tokenfuse.service.bodies import read_body, spool_body, without_paths
from tokenfuse.video.encode import output_suffix

if TYPE_CHECKING:
    from tokenfuse.runner.core.video import CoreSpec
    from tokenfuse.runner.on_comfyui.embedded import EmbeddedComfy

log = logging.getLogger("tokenfuse.service")
UNREADABLE = "not a decodable image"
GONE = "the client disconnected before its answer"
NO_VIDEO_WORKFLOW = "no video workflow: start serve with --video-workflow"
_T = TypeVar("_T")


@dataclass(eq=False)
class Ticket:
    """One request inside the replica: its body (a photo's bytes) or file (a video, spooled to disk as it arrived),
    and `gone`, set (on Serve's event loop) when its client disconnected and Serve cancelled it; the ComfyUI thread
    reads it to skip or stop work nobody will receive."""

    body: bytes
    gone: threading.Event = field(default_factory=threading.Event)
    file: Path | None = None


@dataclass(frozen=True)
class ServiceConfig:
    workflow: str | None = None  # UI or API workflow with one LoadImage; None = the demo graph
    demo: bool = True
    sets: tuple[str, ...] = ()
    comfyui: str | None = None
    cpu: bool = False
    sdpa: bool = False
    max_batch: int = 4
    batch_wait_s: float = 0.05
    video_workflow: str | None = None  # UI or API workflow with one LoadVideo, for POST /video (ComfyUI replicas)
    core: dict[str, Any] | None = None  # runner.core.video.CoreSpec fields: the ComfyUI-free video engine instead
    max_image_mb: float = 50.0  # request body limits (413 above): a photo's file, a video's file
    max_video_mb: float = 2048.0
    max_megapixels: float = 50.0  # decoded photo size limit (413 above; read from the header, before decoding)
    # a video's frames and frame size (413 above; counted from its packets before any work): a 119 KB H.264 file
    # holds 3000 black 4K frames, hours of work for one replica
    max_video_frames: int = 18_000
    max_video_megapixels: float = 8.3
    # sha256 hex of the bearer token every request must carry (None: no token, loopback only); the token itself is
    # never handed to the replicas
    token_sha256: str | None = None


class FusionReplica:
    """Deployment body (wrapped by serve.deployment in build_app)."""

    def __init__(self, config: dict[str, Any]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        # ComfyUI calls asyncio.run() internally, which cannot run on Serve's event loop: all ComfyUI work (start-up
        # and every batch) runs on one dedicated thread, which also serialises executions.
        replica_grpc_on_loopback()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokenfuse-comfy")
        self._init_state()
        self._pool.submit(self._start, config).result()
        batcher: Any = self.fuse  # Serve's batch wrapper: its setters are not in the method's type
        batcher.set_max_batch_size(self.cfg.max_batch)
        batcher.set_batch_wait_timeout_s(self.cfg.batch_wait_s)

    def _init_state(self) -> None:
        """Counters for /health, and what runs now: the requests of the execution on the ComfyUI thread and since
        when (under `_lock`: Serve's event loop reads them when a client leaves, the ComfyUI thread writes them)."""
        self.served = 0
        self.batches = 0
        self.videos = 0
        self.interrupted = 0
        self._lock = threading.Lock()
        self._running: list[Ticket] = []
        self._busy_since: float | None = None
        self._stopped = False  # the running execution was interrupted (counted once)
        self.engine: EmbeddedComfy | None = None  # the embedded ComfyUI (None: the video core serves)
        self.core: CoreSpec | None = None
        self.video_prompt: dict[str, Any] | None = None  # the --video-workflow prompt (None: photos only)

    @property
    def comfy(self) -> EmbeddedComfy:
        """The embedded ComfyUI of a replica that serves workflows (photos, videos through a workflow)."""
        if self.engine is None:
            raise RuntimeError("this replica runs the video core: it has no ComfyUI")
        return self.engine

    def _start(self, config: dict[str, Any]) -> None:
        cfg = ServiceConfig(**config)
        self.cfg = cfg
        self.video_prompt = None
        if cfg.core is not None:  # no ComfyUI: videos through the pack's video core (runner/core/video.py)
            from tokenfuse.runner.core.video import CoreSpec

            self.core = CoreSpec(**cfg.core)
            self.refine = self.core.make_refine()
            return
        self._start_comfy(cfg)

    def _start_comfy(self, cfg: ServiceConfig) -> None:
        from tokenfuse.runner.cli import apply_sets_to, load_prompt
        from tokenfuse.runner.demo import DEMO_LOADER, DemoModels, demo_prompt, fill_defaults
        from tokenfuse.runner.errors import WorkflowError
        from tokenfuse.runner.items import item_slot
        from tokenfuse.runner.on_comfyui.embedded import EmbeddedComfy
        from tokenfuse.service.batch_node import BATCH_LOADER, FRAMES_APART, FramesApart, LoadBatch, insert_frames_apart

        extra: dict[str, type] = {
            BATCH_LOADER: LoadBatch,
            FRAMES_APART: FramesApart,
            **({DEMO_LOADER: DemoModels} if cfg.demo else {}),
        }
        self.engine = engine = EmbeddedComfy(cfg.comfyui, cpu=cfg.cpu, sdpa=cfg.sdpa, extra_nodes=extra)
        defs = engine.node_defs()
        if cfg.demo:
            prompt = fill_defaults(demo_prompt(), defs)
        else:
            prompt = load_prompt(Path(str(cfg.workflow)), defs)
        if cfg.video_workflow:
            self.video_prompt = load_prompt(Path(cfg.video_workflow), defs)
        for p in (prompt, self.video_prompt):
            internal = sorted({n["class_type"] for n in (p or {}).values()} & {BATCH_LOADER, FRAMES_APART})
            if internal:  # the service places these itself; a workflow's own copy would read files it names
                raise WorkflowError(f"the workflow holds service-only node(s) {', '.join(internal)}: remove them")
        # one --set list for both workflows: each --set goes where its node is (an error only when in neither)
        apply_sets_to([p for p in (prompt, self.video_prompt) if p is not None], list(cfg.sets), defs)
        self.slot = item_slot(prompt, set())
        prompt[self.slot] = {"class_type": BATCH_LOADER, "inputs": {"files": ""}, "_meta": {"title": "batch"}}
        insert_frames_apart(prompt)  # a photo's seeds do not depend on the others batched with it
        self.prompt = prompt
        if self.video_prompt is not None:
            self.video_slot = item_slot(self.video_prompt, set(), "video")

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        path = request.url.path.rstrip("/")
        allowed = authorized(request.headers.get("authorization"), self.cfg.token_sha256)
        if request.method == "GET" and path.endswith("health"):  # open to liveness probes; counters with the token
            return JSONResponse(self._health() if allowed else {"status": "ok"})
        if not allowed:  # before reading any of the body
            return JSONResponse({"error": UNAUTHORIZED}, 401, headers={"WWW-Authenticate": 'Bearer realm="tokenfuse"'})
        if request.method != "POST":
            return JSONResponse({"error": "POST an image file to /, a video file to /video, or GET /health"}, 405)
        video = path.endswith("/video")
        limit_mb = self.cfg.max_video_mb if video else self.cfg.max_image_mb
        too_big = JSONResponse({"error": f"the file is over this service's {limit_mb:g} MB limit"}, status_code=413)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit_mb * 2**20:
            return too_big  # before reading the body
        empty = JSONResponse({"error": "empty body: POST the file's bytes"}, status_code=400)
        if video and self.core is None and self.video_prompt is None:  # before reading up to 2 GB for nothing
            return JSONResponse({"error": NO_VIDEO_WORKFLOW}, status_code=400)
        if video:  # up to --max-video-mb (2 GB) each, several at once: to disk as it arrives, never whole in memory
            import tempfile

            fd, name = tempfile.mkstemp(prefix="tokenfuse_upload_", suffix=".mp4")
            os.close(fd)
            spool = Path(name)
            queued = False
            try:
                size = await spool_body(request.stream(), int(limit_mb * 2**20), spool)
                if size is None:
                    return too_big
                if size == 0:
                    return empty
                ticket = Ticket(b"", file=spool)
                queued = True
                return await self._until_gone(ticket, self._video(ticket))
            finally:
                if queued:  # its work may still read it: removed after that work, on the ComfyUI thread
                    self._discard(spool)
                else:  # refused or broken off before any work: up to --max-video-mb, gone now, not after a long run
                    spool.unlink(missing_ok=True)
        body = await read_body(request.stream(), int(limit_mb * 2**20))
        if body is None:
            return too_big
        if not body:
            return empty
        ticket = Ticket(body)
        if self.core is not None:
            return JSONResponse({"error": "this service runs the video engine only: POST videos to /video"}, 400)
        refused = self._refusal(body)
        if refused is not None:
            return JSONResponse({"error": refused[1]}, status_code=refused[0])
        result = await self._until_gone(ticket, self.fuse(ticket))
        status = result.pop("http_status", 200 if result["status"] == "ok" else 400)
        return JSONResponse(result, status_code=status)

    def _health(self) -> dict[str, Any]:
        """GET /health: counters, and busy_s, how long the current execution has been running (0 when idle), so a
        replica stuck on one long request shows; interrupted: executions stopped because every client left."""
        since = self._busy_since
        busy = 0.0 if since is None else round(time.monotonic() - since, 1)
        counts = {"served": self.served, "batches": self.batches, "videos": self.videos}
        return {"status": "ok", **counts, "busy_s": busy, "interrupted": self.interrupted}

    async def _until_gone(self, ticket: Ticket, work: Awaitable[_T]) -> _T:
        """Await a request's work; when Serve cancels it (its client disconnected), the request is abandoned."""
        try:
            return await work
        except asyncio.CancelledError:
            self._abandon(ticket)
            raise

    def _abandon(self, ticket: Ticket) -> None:
        """A client left: its request is dropped if it has not started, and the running execution is interrupted
        once none of its clients is left (nobody would get its answer; the next requests would wait for it)."""
        ticket.gone.set()
        with self._lock:
            if ticket in self._running:
                self._stop_if_abandoned()

    def _stop_if_abandoned(self) -> None:
        """Interrupt the running execution when every one of its clients has left (under `_lock`). Called again at
        each progress update (_watch): ComfyUI clears its interrupt flag when an execution starts, so an interrupt
        sent between a batch's last check and that start would be lost, the batch run for nobody."""
        if not self._running or not all(t.gone.is_set() for t in self._running):
            return
        if not self._stopped:
            self._stopped = True
            self.interrupted += 1
            log.info("TokenFuse service: every client of the running execution left; interrupting it")
        if self.engine is not None:  # the video core has no engine: its progress callback stops it
            self.engine.interrupt()

    def _watch(self, done: int, total: int) -> None:
        """The running execution's progress callback (each sampling step, each node's progress update)."""
        with self._lock:
            self._stop_if_abandoned()

    @contextmanager
    def _executing(self, tickets: list[Ticket]) -> Iterator[None]:
        """Marks `tickets` as the running execution (for _abandon and /health's busy_s) while the block runs."""
        with self._lock:
            self._running, self._busy_since, self._stopped = tickets, time.monotonic(), False
        try:
            yield
        finally:
            with self._lock:
                self._running, self._busy_since = [], None

    def _clear_work(self) -> None:
        """After a request: the embedded ComfyUI's outputs and temp files (the nodes' previews, VideoFaceFusion's MP4)
        go, so nothing of a request stays on the replica's disk once answered (its files were read as bytes)."""
        self.comfy.clear_outputs()
        for left in (self.comfy.work / "temp").glob("*"):
            if left.is_file() or left.is_symlink():
                left.unlink(missing_ok=True)

    def _discard(self, spool: Path) -> None:
        """Remove a request's spooled upload once nothing can read it: queued on the one ComfyUI thread, so it runs
        after that request's work, whether it ran, runs now, or was cancelled before it started."""
        try:
            self._pool.submit(spool.unlink, True)
        except RuntimeError:  # the pool is shut down: nothing runs on it any more
            spool.unlink(missing_ok=True)

    async def _video(self, ticket: Ticket) -> Any:
        import json

        from starlette.responses import JSONResponse, Response

        # One video at a time per replica, on the ComfyUI thread (videos are not batched across requests: the
        # fuse pass already batches a video's face crops, faces_per_batch).
        status, report, mp4 = await asyncio.get_running_loop().run_in_executor(self._pool, self._video_sync, ticket)
        if status != 200:
            return JSONResponse(report, status_code=status)
        headers = {"X-TokenFuse-Report": json.dumps(report, sort_keys=True, default=str)}
        return Response(mp4, media_type="video/mp4", headers=headers)

    def _video_sync(self, ticket: Ticket) -> tuple[int, dict[str, Any], bytes]:
        """(HTTP status, report, MP4 bytes): the same streaming path as the runner's video items."""
        if ticket.gone.is_set():  # its client left while it waited for the ComfyUI thread
            return 400, {"status": "failed", "error": GONE}, b""
        import tempfile

        from tokenfuse.runner.items import Item
        from tokenfuse.video.decode import VideoReadError, probe

        with tempfile.TemporaryDirectory(prefix="tokenfuse_req_") as tmp:
            path = Path(tmp) / "request.mp4"
            if ticket.file is not None:
                shutil.move(ticket.file, path)
            else:
                path.write_bytes(ticket.body)
            try:
                info = probe(path)
            except VideoReadError:
                return 400, {"status": "failed", "error": "not a decodable video"}, b""
            refused = self._video_refusal(path, info.width * info.height)
            if refused is not None:
                return refused[0], {"status": "failed", "error": refused[1]}, b""
            self.videos += 1
            if self.core is not None:
                from tokenfuse.runner.core.video import fuse_file

                out = Path(tmp) / f"fused{output_suffix()}"

                def stop_when_gone(done: int, total: int) -> None:
                    if ticket.gone.is_set():
                        raise RuntimeError(GONE)

                try:
                    with self._executing([ticket]):
                        report = {"status": "ok", **fuse_file(path, out, self.core, self.refine, stop_when_gone)}
                except Exception as e:  # noqa: BLE001 - a bad request fails alone; the replica goes on
                    text = without_paths(f"{type(e).__name__}: {e}", {path: "the video", out: "the output"}, [tmp])
                    return 400, {"status": "failed", "error": text}, b""  # no server path in the answer
                return 200, {**report, "width": info.width, "height": info.height}, out.read_bytes()
            if self.video_prompt is None:
                return 400, {"status": "failed", "error": NO_VIDEO_WORKFLOW}, b""
            from tokenfuse.runner.run import StagedPrompt, process_item

            comfy = self.comfy
            staged = comfy.stage(path)
            try:
                with self._executing([ticket]):
                    row, files = process_item(
                        comfy,
                        StagedPrompt(self.video_prompt, self.video_slot, {}),
                        Item(path, "request", "video"),
                        self._watch,
                        staged,
                    )
            finally:  # as for photos: nothing of a request stays on the replica's disk once answered (files are bytes)
                comfy.unstage(staged)
                self._clear_work()
            # the row is the runner's: its item is the request's temp path, its error may name staged files
            row["item"] = "request"
            if isinstance(row.get("error"), str):
                staged_path = comfy.work / "input" / staged
                row["error"] = without_paths(
                    row["error"], {path: "the video", staged_path: "the video"}, [tmp, comfy.work]
                )
            videos = [data for name, data in files if Path(name).suffix.lower() in (".mp4", ".mov", ".mkv", ".webm")]
            if row["status"] != "ok" or not videos:
                row.setdefault("error", "the workflow saved no video (it needs a SaveVideo node)")
                return 400, {**row, "status": "failed"}, b""
            return 200, row, videos[0]

    from ray import serve as _serve  # noqa: E402 - decorator needs Ray; this module is imported only when serving

    @_serve.batch(max_batch_size=4, batch_wait_timeout_s=0.05)
    async def fuse(self, tickets: list[Ticket]) -> list[dict[str, Any]]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._fuse_sync, tickets)

    def _fuse_sync(self, tickets: list[Ticket]) -> list[dict[str, Any]]:
        import cv2
        import numpy as np

        results: list[dict[str, Any] | None] = [None] * len(tickets)
        groups: dict[tuple[int, ...], list[tuple[int, str]]] = {}
        for i, ticket in enumerate(tickets):  # headers checked by __call__ (_refusal)
            if ticket.gone.is_set():  # its client left before the batch ran: not decoded, not run
                results[i] = {"status": "failed", "error": GONE}
                continue
            img = cv2.imdecode(np.frombuffer(ticket.body, np.uint8), cv2.IMREAD_COLOR)
            if img is None or img.shape[0] * img.shape[1] > self.cfg.max_megapixels * 1e6:  # header != content
                results[i] = {"status": "failed", "error": UNREADABLE}
                continue
            path = self.comfy.work / "input" / f"req_{time.monotonic_ns()}_{i}.png"
            path.write_bytes(cv2.imencode(".png", img)[1].tobytes())  # cv2.imwrite: ANSI paths on Windows
            groups.setdefault(img.shape, []).append((i, path.name))
        try:
            for members in groups.values():  # on the one ComfyUI thread: one execution at a time per replica
                live = [m for m in members if not tickets[m[0]].gone.is_set()]  # a group waits for the one before
                for i, _ in members:
                    results[i] = {"status": "failed", "error": GONE}
                if live:
                    answers = self._run_group([m[1] for m in live], [tickets[m[0]] for m in live])
                    for (i, _), res in zip(live, answers, strict=True):
                        results[i] = res
        finally:  # nothing of a request stays on the replica's disk once answered
            for members in groups.values():
                for _, name in members:
                    (self.comfy.work / "input" / name).unlink(missing_ok=True)
            self._clear_work()
        self.served += len(tickets)
        self.batches += 1
        return [r if r is not None else {"status": "failed", "error": "lost"} for r in results]

    def _refusal(self, body: bytes) -> tuple[int, str] | None:
        """(HTTP status, error) for a photo refused before it joins a batch, from its header alone; None to go on.

        The size must be readable before decoding: a small PNG can declare 9000 x 9000 (a 236 KB file took 115 s and
        7 GB on one CPU replica, every other request waiting), and a format Pillow cannot read but OpenCV decodes
        (Radiance .hdr: 4 MB declaring 10000 x 10000) would otherwise be decoded whole, unchecked."""
        import io

        from PIL import Image

        try:
            with Image.open(io.BytesIO(body)) as im:  # reads the header only
                w, h = im.size
        except Image.DecompressionBombError as exc:  # Pillow's own cap (~179 Mpx) read the header first: too big
            return 413, f"over this service's {self.cfg.max_megapixels:g} megapixel limit ({exc})"
        except Exception:  # noqa: BLE001 - not an image whose size Pillow can read: never decoded
            return 400, f"{UNREADABLE}: its size cannot be read before decoding (PNG, JPEG, WebP, BMP, TIFF can)"
        if w * h > self.cfg.max_megapixels * 1e6:
            return 413, f"{w}x{h} is over this service's {self.cfg.max_megapixels:g} megapixel limit"
        return None

    def _video_refusal(self, path: Path, pixels: int) -> tuple[int, str] | None:
        """(413, why) for a video over --max-video-megapixels (its first frame) or --max-video-frames (its video
        packets, read without decoding: video.decode.count_packets); None to go on."""
        from tokenfuse.video.decode import count_packets

        if pixels > self.cfg.max_video_megapixels * 1e6:
            return 413, f"its frames are over this service's {self.cfg.max_video_megapixels:g} megapixel limit"
        if count_packets(path, self.cfg.max_video_frames) > self.cfg.max_video_frames:
            return 413, f"it is over this service's {self.cfg.max_video_frames} frame limit"
        return None

    def __del__(self) -> None:
        """Ray Serve calls it when the replica shuts down: the embedded ComfyUI's work folder goes too."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()

    def _run_group(self, names: list[str], tickets: list[Ticket]) -> list[dict[str, Any]]:
        from tokenfuse.runner.report import frame_report, summarize_texts

        prompt = copy.deepcopy(self.prompt)
        prompt[self.slot]["inputs"]["files"] = "\n".join(names)
        t0 = time.perf_counter()
        with self._executing(tickets):
            result = self.comfy.execute(prompt, self._watch)
        elapsed = round(time.perf_counter() - t0, 3)
        if not result.ok:
            return [{"status": "failed", "error": result.error, "time_s": elapsed, "batch_size": len(names)}] * len(
                names
            )
        outs = [o for o in result.outputs]
        out: list[dict[str, Any]] = []
        for frame in range(len(names)):
            texts = {k: frame_report(v, frame, as_frame=0) for k, v in result.texts.items()}
            row = {"status": "ok", "time_s": elapsed, "batch_size": len(names), **summarize_texts(texts)}
            row["report"] = texts
            if frame < len(outs):
                row["image_png_base64"] = base64.b64encode(outs[frame].read()).decode()
            out.append(row)
        return out
