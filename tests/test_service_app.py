"""The service's replica logic without a server: its photo prompt (batch loader, per-photo seeds), per-request report
rows, --set over the photo and video workflows. No ComfyUI; the tests of FusionReplica itself skip without Ray
(tests/integration/test_service.py runs the real service)."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import zlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tokenfuse.faces.types import FaceSet
from tokenfuse.fusion.fallback import FaceReport, format_report
from tokenfuse.runner.cli import apply_sets, apply_sets_to
from tokenfuse.runner.demo import demo_prompt
from tokenfuse.runner.errors import WorkflowError
from tokenfuse.runner.on_comfyui.protocol import ExecResult
from tokenfuse.runner.report import frame_report, summarize_texts
from tokenfuse.service.batch_node import FRAMES_APART, FramesApart, insert_frames_apart


def _app() -> Any:
    pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-scale.txt")
    from tokenfuse.service import app

    return app


def test_every_fusion_gets_the_batch_faces_as_independent_photos() -> None:
    """A photo's seeds must not depend on who else is in its batch: ScheduledFusion's faces come through FramesApart,
    which marks the FaceSet's frames independent (face k of each frame: seed + k); other links stay."""
    prompt = demo_prompt()
    assert insert_frames_apart(prompt) == 1
    assert prompt["6"]["inputs"]["faces"] == ["6_apart", 0]
    assert prompt["6_apart"] == {
        "class_type": FRAMES_APART,
        "inputs": {"faces": ["3", 0]},
        "_meta": {"title": "frames apart"},
    }
    assert prompt["4"]["inputs"]["faces"] == ["3", 0] and prompt["7"]["inputs"]["faces"] == ["6", 1]
    (marked,) = FramesApart().mark(FaceSet((8, 8), ((), ())))
    assert marked.independent_frames and marked.batch_size == 2


def _report(passthrough_frame: int) -> str:
    """ScheduledFusion's report of a 2-photo batch, one face each; the face of `passthrough_frame` fell back twice and
    passed through."""
    reports = []
    for frame in range(2):
        r = FaceReport(frame=frame, index=0, seed=0, context_side=128, tokens=256, time_s=0.5 + frame)
        if frame == passthrough_frame:
            r.add("smaller_guide", "out of memory")
            r.status = "passthrough"
        reports.append(r)
    return format_report(reports, "ScheduledFusion: 2 face(s) in 2 frame(s)")


def test_a_frame_report_counts_its_own_fallbacks_and_pass_throughs() -> None:
    """Each request's row counts from its own frame's face lines (the batch's summary line is the whole batch's)."""
    text = _report(passthrough_frame=1)
    first, second = (summarize_texts({"6": frame_report(text, f, as_frame=0)}) for f in (0, 1))
    assert (first["faces"], first["faces_with_fallbacks"], first["faces_passed_through"]) == (1, 0, 0)
    assert (second["faces"], second["faces_with_fallbacks"], second["faces_passed_through"]) == (1, 1, 1)
    assert second["fallbacks"] == ["frame 0 face 0: passthrough: smaller_guide: out of memory"]
    own = frame_report(text, 1, as_frame=0).splitlines()
    assert own[0].startswith("frame 0 face 0: passthrough") and own[-1].endswith("1.50 s total")
    assert frame_report("no summary here\nframe 0 face 0: x", 0) == "frame 0 face 0: x"


VIDEO = {
    "1": {"class_type": "LoadVideo", "inputs": {"file": "clip.mp4"}, "_meta": {"title": "video"}},
    "2": {
        "class_type": "TokenFuseVideoFaceFusion",
        "inputs": {"steps": 20, "video": ["1", 0]},
        "_meta": {"title": "vf"},
    },
}


def test_each_set_goes_to_the_workflows_that_have_its_node() -> None:
    """serve has one --set list for the photo and the video workflow: a --set naming a node of one of them applies
    there; only a --set that names no node of either is an error."""
    photo, video = demo_prompt(), json.loads(json.dumps(VIDEO))
    apply_sets_to([photo, video], ["fuse.steps=8", "vf.steps=3", "TokenFuseFaceDetect.max_faces=2"])
    assert photo["6"]["inputs"]["steps"] == 8 and video["2"]["inputs"]["steps"] == 3
    assert photo["3"]["inputs"]["max_faces"] == 2 and "max_faces" not in video["2"]["inputs"]
    with pytest.raises(WorkflowError, match="no node with id, title or class 'ghost' in any of the workflows"):
        apply_sets_to([photo, video], ["ghost.steps=1"])
    with pytest.raises(WorkflowError, match="no node with id, title or class 'vf'$"):
        apply_sets(photo, ["vf.steps=3"])  # `run` has one workflow: unchanged


class _FakeEngine:
    """EmbeddedComfy's start-up surface: no ComfyUI, no node definitions (API prompts need none)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.work = Path(".")

    def node_defs(self) -> dict[str, dict[str, Any]]:
        return {}

    def close(self) -> None:
        pass


def test_replica_starts_with_a_set_of_only_one_workflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve --video-workflow V --set fuse.steps=8` (fuse: the photo graph's node) used to fail the replica's start:
    the --set was applied to the video workflow too, which has no `fuse`."""
    app = _app()
    import tokenfuse.runner.on_comfyui.embedded as embedded

    monkeypatch.setattr(embedded, "EmbeddedComfy", _FakeEngine)
    (tmp_path / "video.json").write_text(json.dumps(VIDEO))
    config = app.ServiceConfig(sets=("fuse.steps=8", "vf.steps=3"), video_workflow=str(tmp_path / "video.json"))
    replica = app.FusionReplica.__new__(app.FusionReplica)
    replica._start(asdict(config))
    assert replica.prompt["6"]["inputs"]["steps"] == 8 and replica.video_prompt["2"]["inputs"]["steps"] == 3
    assert replica.prompt["6"]["inputs"]["faces"] == ["6_apart", 0]  # and the photos stay independent
    bad = app.ServiceConfig(sets=("ghost.steps=1",), video_workflow=str(tmp_path / "video.json"))
    with pytest.raises(WorkflowError, match="ghost"):
        app.FusionReplica.__new__(app.FusionReplica)._start(asdict(bad))


class _Request:
    """The part of Starlette's Request the replica reads; the body arrives in chunks with no Content-Length (a chunked
    upload), and the test sees how many chunks were pulled."""

    def __init__(self, chunks: list[bytes], path: str = "/", method: str = "POST") -> None:
        self.url = SimpleNamespace(path=path)
        self.method = method
        self.headers: dict[str, str] = {}
        self.chunks = chunks
        self.pulled = 0

    async def stream(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.pulled += 1
            yield chunk

    async def body(self) -> bytes:
        return b"".join([chunk async for chunk in self.stream()])


def _replica(app: Any, **config: Any) -> Any:
    """A FusionReplica without ComfyUI: the config only; fuse() answers the bodies it gets (and records them)."""
    replica = app.FusionReplica.__new__(app.FusionReplica)
    replica.cfg = app.ServiceConfig(**config)
    replica.core = None
    replica.engine = None
    replica._init_state()
    replica.fused = []

    async def fuse(ticket: Any) -> dict[str, Any]:
        replica.fused.append(ticket.body)
        return {"status": "ok"}

    replica.fuse = fuse
    return replica


def _call(replica: Any, request: _Request) -> tuple[int, dict[str, Any]]:
    response = asyncio.run(replica(request))
    return response.status_code, json.loads(response.body)


def test_a_chunked_upload_over_the_limit_is_refused_as_it_arrives() -> None:
    """No Content-Length: the body is counted as it is read and refused with 413 once it passes --max-image-mb,
    without reading the rest (it was read whole into memory first, then measured)."""
    app = _app()
    replica = _replica(app, max_image_mb=1.0)
    request = _Request([b"x" * 2**19] * 600)  # 300 MB announced by nobody
    status, answer = _call(replica, request)
    assert status == 413 and "1 MB limit" in answer["error"] and request.pulled == 3 and not replica.fused
    photo = _png(64, 48)
    assert _call(replica, _Request([photo[:100], photo[100:]]))[0] == 200 and replica.fused == [photo]


def _png(width: int, height: int) -> bytes:
    """A PNG's signature, header declaring width x height, and an empty image data chunk: what the service reads
    before decoding (no pixels)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", b"")
    )


def test_a_photo_is_refused_from_its_header_before_it_joins_a_batch() -> None:
    """Over --max-megapixels: 413; a format whose size Pillow cannot read (Radiance .hdr, which OpenCV decodes:
    4 MB declaring 10000 x 10000 was decoded whole) or no image: 400. None of them reaches the batch."""
    app = _app()
    replica = _replica(app, max_megapixels=20.0)
    status, answer = _call(replica, _Request([_png(9000, 9000)]))
    assert status == 413 and answer["error"] == "9000x9000 is over this service's 20 megapixel limit"
    hdr = b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 10000 +X 10000\n" + bytes([2, 2, 39, 16]) * 8
    for body in (hdr, b"not an image"):
        status, answer = _call(replica, _Request([body]))
        assert status == 400 and answer["error"].startswith("not a decodable image"), answer
    # above Pillow's own cap (~179 Mpx) its header reader raises: still "too big" (413), not "undecodable" (400)
    status, answer = _call(replica, _Request([_png(20000, 20000)]))
    assert status == 413 and "over this service's 20 megapixel limit" in answer["error"], answer
    assert not replica.fused


class _BlockingEngine:
    """EmbeddedComfy's execution surface: execute() runs until interrupt() (or 30 s), like a long sampling."""

    def __init__(self, work: Path) -> None:
        self.work = work
        for sub in ("input", "output", "temp"):
            (work / sub).mkdir(exist_ok=True)
        self.started = threading.Event()
        self.interrupt_called = threading.Event()
        self.runs: list[list[str]] = []
        self.on_start: Callable[[], None] = lambda: None
        self.wait_s = 30.0

    def execute(self, prompt: dict[str, Any], progress: Callable[[int, int], None] | None = None) -> ExecResult:
        self.runs.append(prompt["1"]["inputs"]["files"].splitlines())
        self.on_start()
        self.interrupt_called.clear()  # ComfyUI clears its interrupt flag when an execution starts
        self.started.set()
        if progress is not None:
            progress(1, 20)  # the first sampling step
        stopped = self.interrupt_called.wait(self.wait_s)
        return ExecResult(ok=False, error="interrupted", interrupted=stopped)

    def interrupt(self) -> None:
        self.interrupt_called.set()

    def clear_outputs(self) -> None:
        pass

    def close(self) -> None:  # the replica's __del__ closes its engine
        pass


def _comfy_replica(app: Any, tmp_path: Path) -> Any:
    """A replica whose ComfyUI is _BlockingEngine, with the real fuse path on its own ComfyUI thread (no batching)."""
    replica = _replica(app)
    replica.engine = _BlockingEngine(tmp_path)
    replica.prompt, replica.slot = {"1": {"class_type": "batch", "inputs": {"files": ""}}}, "1"
    replica._pool = ThreadPoolExecutor(1)

    async def fuse(ticket: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return (await loop.run_in_executor(replica._pool, replica._fuse_sync, [ticket]))[0]

    replica.fuse = fuse
    return replica


def test_a_disconnect_interrupts_the_execution_nobody_waits_for(tmp_path: Path) -> None:
    """Serve cancels a request whose client left: the execution running only for it is interrupted (it ran to the
    end before, every later request waiting behind it), and /health shows how long the execution has been busy."""
    app = _app()
    replica = _comfy_replica(app, tmp_path)
    engine = replica.engine

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        task = asyncio.create_task(replica(_Request([_photo()])))
        assert await asyncio.to_thread(engine.started.wait, 30)
        await asyncio.sleep(0.2)
        busy = json.loads((await replica(_Request([], path="/health", method="GET"))).body)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(engine.interrupt_called.wait, 5), "the abandoned execution ran on"
        await asyncio.to_thread(replica._pool.submit(lambda: None).result, 30)
        idle = json.loads((await replica(_Request([], path="/health", method="GET"))).body)
        return busy, idle

    busy, idle = asyncio.run(scenario())
    assert busy["status"] == "ok" and busy["busy_s"] >= 0.2 and busy["interrupted"] == 0, busy
    assert idle["busy_s"] == 0.0 and idle["interrupted"] == 1, idle
    replica._pool.shutdown()


def test_a_batch_runs_only_for_the_clients_still_there(tmp_path: Path) -> None:
    """A request whose client left before its batch ran is dropped from it; a running batch is interrupted only
    when the last of its clients has left."""
    app = _app()
    replica = _comfy_replica(app, tmp_path)
    engine = replica.engine
    stay, leave = app.Ticket(_photo()), app.Ticket(_photo())
    leave.gone.set()
    engine.interrupt_called.set()  # execute() returns at once
    answers = replica._fuse_sync([leave, stay])
    assert len(engine.runs) == 1 and len(engine.runs[0]) == 1 and answers[0]["error"] == app.GONE
    left = [app.Ticket(b""), app.Ticket(b"")]
    for t in left:
        t.gone.set()
    assert [a["error"] for a in replica._fuse_sync(left)] == [app.GONE] * 2 and len(engine.runs) == 1
    engine.interrupt_called.clear()
    first, second = app.Ticket(b""), app.Ticket(b"")
    with replica._executing([first, second]):
        replica._abandon(first)
        assert not engine.interrupt_called.is_set()  # the other client still waits for its photo
        replica._abandon(second)
        assert engine.interrupt_called.is_set() and replica.interrupted == 1


def test_a_client_leaving_as_its_batch_starts_still_stops_it(tmp_path: Path) -> None:
    """The client left after the batch's last check but before ComfyUI started the execution: the interrupt was sent
    and then cleared by ComfyUI's start, and the batch ran to the end for nobody. The next progress update stops it."""
    app = _app()
    replica = _comfy_replica(app, tmp_path)
    engine = replica.engine
    engine.wait_s = 5.0
    ticket = app.Ticket(_photo())
    engine.on_start = lambda: replica._abandon(ticket)
    (answer,) = replica._fuse_sync([ticket])
    assert engine.interrupt_called.is_set() and replica.interrupted == 1, answer
    assert answer["status"] == "failed"


def _photo() -> bytes:
    import cv2
    import numpy as np

    return cv2.imencode(".png", np.full((32, 32, 3), 128, np.uint8))[1].tobytes()


class _SavingEngine:
    """EmbeddedComfy's file surface for one video request: stage() links the upload into input/, execute() saves
    the answer in output/ and, like VideoFaceFusion, an intermediate MP4 in temp/."""

    def __init__(self, work: Path) -> None:
        self.work = work
        for sub in ("input", "output", "temp"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        self.runs = 0

    def stage(self, path: Path) -> str:
        name = f"{self.runs:05d}_{path.name}"
        (self.work / "input" / name).symlink_to(path)
        return name

    def unstage(self, name: str) -> None:
        (self.work / "input" / name).unlink(missing_ok=True)

    def execute(self, prompt: dict[str, Any], step: Any = None) -> ExecResult:
        from tokenfuse.runner.on_comfyui.protocol import OutputFile

        self.runs += 1
        (self.work / "temp" / f"tokenfuse_video_{self.runs}.mp4").write_bytes(b"intermediate")
        saved = self.work / "output" / f"svc_{self.runs:05d}_.mp4"
        saved.write_bytes(b"fused video of request %d" % self.runs)
        return ExecResult(ok=True, outputs=[OutputFile(saved.name, "", saved.read_bytes, saved)])

    def clear_outputs(self) -> None:
        for p in (self.work / "output").iterdir():
            p.unlink()

    def close(self) -> None:  # the replica's __del__ closes its engine
        pass


def test_a_video_request_leaves_nothing_on_the_replica_disk(tmp_path: Path) -> None:
    """Like a photo's, a video request's files (the staged upload, the saved answer, VideoFaceFusion's temp MP4) are
    gone once it is answered: they stayed until the replica stopped, every client's video kept on the server's disk
    (up to --max-video-mb each, no limit on their number)."""
    app = _app()
    clip = _clip(tmp_path / "clip.mp4", 3)
    replica = _replica(app)
    replica.engine = _SavingEngine(tmp_path / "work")
    replica.video_prompt = {"1": {"class_type": "LoadVideo", "inputs": {"file": ""}}}
    replica.video_slot = "1"
    for n in (1, 2):
        status, report, mp4 = replica._video_sync(app.Ticket(clip))
        assert status == 200 and mp4 == b"fused video of request %d" % n, report
        left = [p.relative_to(tmp_path) for p in (tmp_path / "work").rglob("*") if not p.is_dir()]
        assert left == [], left


def test_a_workflow_cannot_bring_its_own_batch_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch loader reads the names the service staged, and nothing else: a workflow (shared by a stranger) that
    held its own TokenFuseServiceLoadBatch with files "/any/path.png" made every answer carry that server file."""
    app = _app()
    import tokenfuse.runner.on_comfyui.embedded as embedded
    from tokenfuse.service.batch_node import BATCH_LOADER, LoadBatch

    monkeypatch.setattr(embedded, "EmbeddedComfy", _FakeEngine)
    stranger = {**json.loads(json.dumps(VIDEO)), "99": {"class_type": BATCH_LOADER, "inputs": {"files": "/etc/x.png"}}}
    (tmp_path / "stranger.json").write_text(json.dumps(stranger))
    for config in (
        app.ServiceConfig(workflow=str(tmp_path / "stranger.json"), demo=False),
        app.ServiceConfig(video_workflow=str(tmp_path / "stranger.json")),
    ):
        with pytest.raises(WorkflowError, match="service-only"):
            app.FusionReplica.__new__(app.FusionReplica)._start(asdict(config))

    import cv2
    import numpy as np

    inputs, private = tmp_path / "input", tmp_path / "private"
    inputs.mkdir()
    private.mkdir()
    cv2.imwrite(str(private / "secret.png"), np.full((8, 8, 3), 200, np.uint8))
    cv2.imwrite(str(inputs / "req_1_0.png"), np.full((8, 8, 3), 10, np.uint8))
    (inputs / "link.png").symlink_to(private / "secret.png")
    monkeypatch.setitem(
        __import__("sys").modules, "folder_paths", SimpleNamespace(get_input_directory=lambda: str(inputs))
    )
    image, _ = LoadBatch().load("req_1_0.png")
    assert image.shape == (1, 8, 8, 3)
    for name in (str(private / "secret.png"), "../private/secret.png", "link.png", "secret.png [output]", ".."):
        with pytest.raises(ValueError, match="not a (staged photo|readable image)"):
            LoadBatch().load(name)


def _clip(path: Path, frames: int, width: int = 64, height: int = 48) -> bytes:
    import av
    import numpy as np

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), i * 9, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path.read_bytes()


def test_a_video_upload_goes_to_disk_as_it_arrives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A video body (up to --max-video-mb, 2 GB) was read whole into memory and joined (twice its size), several at
    once per replica; it is spooled to a file as it arrives, and the file is gone once the request is answered or
    refused."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    app = _app()
    replica = _replica(app, max_video_mb=0.01)  # 10 485 bytes
    replica._pool = ThreadPoolExecutor(1)
    seen: list[tuple[bytes, bytes]] = []

    def video_sync(ticket: Any) -> tuple[int, dict[str, Any], bytes]:
        seen.append((ticket.body, ticket.file.read_bytes()))
        return 200, {"status": "ok"}, b"fused"

    replica._video_sync = video_sync
    request = _Request([b"a" * 3000], path="/video")
    status, answer = _call(replica, request)  # no video workflow: refused before a byte is read
    assert status == 400 and answer["error"] == app.NO_VIDEO_WORKFLOW and request.pulled == 0, answer
    replica.video_prompt = {"1": {"class_type": "LoadVideo", "inputs": {"file": ""}}}
    response = asyncio.run(replica(_Request([b"a" * 3000, b"b" * 3000], path="/video")))
    assert response.status_code == 200 and response.body == b"fused"
    assert seen == [(b"", b"a" * 3000 + b"b" * 3000)]
    request = _Request([b"c" * 3000] * 10, path="/video")
    status, answer = _call(replica, request)
    assert status == 413 and request.pulled == 4, answer
    assert _call(replica, _Request([], path="/video"))[0] == 400  # empty
    replica._pool.submit(lambda: None).result(30)
    assert not list(tmp_path.glob("tokenfuse_upload_*"))
    replica._pool.shutdown()


def test_a_video_engine_error_names_no_server_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenfuse.runner.core import video as core_video

    def broken(path: Path, out: Path, *args: Any) -> dict[str, Any]:
        raise RuntimeError(f"cannot decode frame 3 of {path} into {out}")

    monkeypatch.setattr(core_video, "fuse_file", broken)
    app = _app()
    replica = _replica(app)
    replica.core, replica.refine = object(), None
    status, report, _ = replica._video_sync(app.Ticket(_clip(tmp_path / "clip.mp4", 4)))
    assert status == 400 and report["error"] == "RuntimeError: cannot decode frame 3 of the video into the output"
    assert "tokenfuse_req_" not in report["error"] and "/" not in report["error"], report


def test_a_video_over_the_frame_or_size_limit_is_refused_before_any_work(tmp_path: Path) -> None:
    """POST /video bounded only the file's bytes: 119 KB of H.264 hold 3000 black 4K frames (hours of one replica's
    work). Its frames (counted from its packets, not the header) and frame size are bounded too: 413 above."""
    app = _app()
    clip = _clip(tmp_path / "clip.mp4", 12)
    status, report, _ = _replica(app, max_video_frames=11)._video_sync(app.Ticket(clip))
    assert status == 413 and report["error"] == "it is over this service's 11 frame limit", report
    status, report, _ = _replica(app, max_video_megapixels=0.003)._video_sync(app.Ticket(clip))
    assert status == 413 and "0.003 megapixel limit" in report["error"], report
    replica = _replica(app, max_video_frames=12, max_video_megapixels=0.0031)
    replica.video_prompt = None
    status, report, _ = replica._video_sync(app.Ticket(clip))  # within both: on to the workflow (none here)
    assert status == 400 and "no video workflow" in report["error"] and replica.videos == 1, report
    for cut in (len(clip) // 2, len(clip) - 7):  # damaged: counted up to the damage, answered like before (no 500)
        status, report, _ = replica._video_sync(app.Ticket(clip[:cut]))
        assert status == 400 and report["status"] == "failed", report


class _FailingEngine(_SavingEngine):
    """A video workflow that fails the way ComfyUI reports it: the message names the staged input's server path."""

    def execute(self, prompt: dict[str, Any], step: Any = None) -> ExecResult:
        name = next(iter(prompt.values()))["inputs"]["file"]
        return ExecResult(ok=False, error=f"OSError: cannot open {self.work / 'input' / name}: invalid data")


def test_a_video_workflow_answer_names_no_server_path(tmp_path: Path) -> None:
    """The workflow path answered the runner's row as it was: its `item` is the request's temp path (in the 200
    answer's X-TokenFuse-Report header too) and its error named the staged file in the replica's work folder."""
    app = _app()
    clip = _clip(tmp_path / "clip.mp4", 3)
    for engine, want in ((_SavingEngine, 200), (_FailingEngine, 400)):
        replica = _replica(app)
        replica.engine = engine(tmp_path / f"work_{want}")
        replica.video_prompt = {"1": {"class_type": "LoadVideo", "inputs": {"file": ""}}}
        replica.video_slot = "1"
        status, report, _ = replica._video_sync(app.Ticket(clip))
        assert status == want, report
        text = json.dumps(report)
        assert "tokenfuse_req_" not in text and str(tmp_path) not in text and "/" not in text, report
    assert report["error"] == "OSError: cannot open the video: invalid data", report


def test_a_refused_video_upload_is_removed_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused upload (over --max-video-mb, up to 2 GB spooled) queued its removal behind the ComfyUI thread: while a
    long video ran, every refused upload stayed on the replica's disk."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    app = _app()
    replica = _replica(app, max_video_mb=0.01)
    replica.video_prompt = {"1": {"class_type": "LoadVideo", "inputs": {"file": ""}}}
    replica._pool = ThreadPoolExecutor(1)
    release = threading.Event()
    replica._pool.submit(release.wait, 30)  # a long execution holds the ComfyUI thread
    try:
        status, _ = _call(replica, _Request([b"c" * 3000] * 10, path="/video"))
        assert status == 413
        assert _call(replica, _Request([], path="/video"))[0] == 400
        assert not list(tmp_path.glob("tokenfuse_upload_*")), "removed before the running execution ends"
    finally:
        release.set()
        replica._pool.shutdown()


TOKEN = "s3cret-token-for-the-tests-0123"


def test_serve_beyond_loopback_without_a_token_is_refused(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    """Issue 34 item 7: `serve --host 0.0.0.0` served anyone who could reach the port. Without a token it now exits 2
    before Ray or ComfyUI start; a token from --token or TOKENFUSE_SERVE_TOKEN reaches the replicas as its sha256."""
    pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-scale.txt")
    from tokenfuse.service import app, deploy
    from tokenfuse.service.cli import main

    started: list[Any] = []
    monkeypatch.setattr(deploy, "serve_forever", lambda config, *a, **k: started.append((config, a)))
    monkeypatch.delenv(app.TOKEN_ENV, raising=False)
    for host in ("0.0.0.0", "::", "192.0.2.7", "my-host.example"):
        assert main(["serve", "--host", host]) == 2
        assert f"--host {host} exposes the service beyond this machine" in caplog.text
    assert main(["serve", "--host", "0.0.0.0", "--token", "short"]) == 2 and "at least 16 characters" in caplog.text
    assert not started
    assert main(["serve", "--host", "0.0.0.0", "--token", TOKEN]) == 0
    monkeypatch.setenv(app.TOKEN_ENV, TOKEN)
    assert main(["serve", "--host", "0.0.0.0"]) == 0
    monkeypatch.delenv(app.TOKEN_ENV)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):  # loopback: the token is optional
        assert main(["serve", "--host", host]) == 0
    digests = [config.token_sha256 for config, _ in started]
    assert digests == [app.token_digest(TOKEN)] * 2 + [None] * 4 and TOKEN not in repr(started)
    with pytest.raises(ValueError, match="exposes the service"):  # a direct caller of the real serve_forever too
        monkeypatch.undo()
        deploy.serve_forever(app.ServiceConfig(), deploy.ServeOptions(host="0.0.0.0"))


def test_with_a_token_every_request_needs_it_before_any_body_is_read() -> None:
    """401 (with WWW-Authenticate) without the token, with a wrong one or another scheme, before the body is read;
    200 with it. GET /health stays open to liveness probes but shows its counters only with the token."""
    app = _app()
    replica = _replica(app, token_sha256=app.token_digest(TOKEN))
    for header in (None, "Bearer wrong-token-of-the-same-size", f"Basic {TOKEN}", "Bearer", TOKEN):
        request = _Request([b"x"] * 3)
        if header is not None:
            request.headers["authorization"] = header
        response = asyncio.run(replica(request))
        assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer"), header
        assert json.loads(response.body)["error"] == app.UNAUTHORIZED and request.pulled == 0
    assert not replica.fused
    photo = _png(8, 8)
    request = _Request([photo])
    request.headers["authorization"] = f"bearer  {TOKEN} "
    assert _call(replica, request) == (200, {"status": "ok"}) and replica.fused == [photo]
    assert _call(replica, _Request([], path="/health", method="GET")) == (200, {"status": "ok"})
    health = _Request([], path="/health", method="GET")
    health.headers["authorization"] = f"Bearer {TOKEN}"
    status, answer = _call(replica, health)
    assert status == 200 and "served" in answer and "busy_s" in answer
    # no token configured (loopback): open, as before
    assert _call(_replica(app), _Request([photo])) == (200, {"status": "ok"})


def test_loopback_addresses() -> None:
    from tokenfuse.service.access import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "LOCALHOST", "::1", "[::1]", "127.1.2.3"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "", "10.0.0.1", "::ffff:10.0.0.1", "example.com"))
