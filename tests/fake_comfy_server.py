"""A small ComfyUI server stand-in for the runner's `--server` tests in CI (no ComfyUI there), on loopback only.

It speaks the parts of ComfyUI 0.3.64's HTTP and websocket API the runner uses, with ComfyUI's message shapes (see
runner/on_comfyui/server_ws.py): /system_stats, /object_info, /upload/image, /prompt (400 with `error` + `node_errors`
for a LoadImage file that was never uploaded), /queue (GET, POST delete), /interrupt (global or by prompt_id), /history,
/view and /ws?clientId=. A SaveImage with an input "__invalid__" fails validation alone: 200, the prompt queued
without it, its error in `node_errors` (what ComfyUI does when another output validates). One prompt runs at a time,
in queue order, like ComfyUI's worker. Per node class:
- LoadImage decodes the uploaded file with PIL (a broken file -> execution_error naming the node, as ComfyUI does);
- a node with a `steps` input (KSampler, ScheduledFusion) sends `progress` 1..steps, `step_s` apart, and stops with
  execution_interrupted when interrupted; while it "samples" it broadcasts the pack's tokenfuse.stats events, the
  last one with a summary line whose peak text comes from the pack's own formatter (nodes/model_patching.py);
- TokenFuseScheduledFusion returns its report as UI text, made by the pack's fusion/fallback.format_report;
- SaveImage writes the loaded image as a PNG into the output folder (a `sub/` prefix: its subfolder) and reports it
  like ComfyUI.
Everything sent is also kept in `sent` (type, data), and every /interrupt and /queue body in `requests`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web
from PIL import Image

# /object_info entries for the node classes this server executes (ComfyUI's shapes, trimmed to what is used).
OBJECT_INFO: dict[str, Any] = {
    "LoadImage": {"input": {"required": {"image": [[], {"image_upload": True}]}}, "output": ["IMAGE", "MASK"]},
    "SaveImage": {
        "input": {"required": {"images": ["IMAGE"], "filename_prefix": ["STRING", {"default": "ComfyUI"}]}},
        "output": [],
        "output_node": True,
    },
    "TokenFuseScheduledFusion": {
        "input": {"required": {"image": ["IMAGE"], "steps": ["INT", {"default": 20}]}},
        "output": ["IMAGE", "FACES", "STRING"],
    },
}


@dataclass
class FakeComfy:
    """The server's state; `faces` is what ScheduledFusion reports per item (frame 0 face i), `fallbacks` the
    fallback actions of face 0; `peak_texts` the peak memory texts the stats' summary lines carried."""

    root: Path
    step_s: float = 0.05
    faces: int = 1
    fallbacks: tuple[str, ...] = ()
    url: str = ""
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    history: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    running: str | None = None
    interrupted: bool = False
    sockets: dict[str, web.WebSocketResponse] = field(default_factory=dict)
    peak_texts: list[str] = field(default_factory=list)

    # ----------------------------------------------------------------------------------------------- messages
    async def send(self, kind: str, data: dict[str, Any], sid: str | None) -> None:
        """To one client (sid) or, with sid None, to every client: ComfyUI's send_json."""
        self.sent.append((kind, data))
        targets = list(self.sockets.values()) if sid is None else [self.sockets[sid]] if sid in self.sockets else []
        for ws in targets:
            if not ws.closed:
                await ws.send_json({"type": kind, "data": data})

    # ----------------------------------------------------------------------------------------------- routes
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get("/ws", self.ws)
        app.router.add_get("/system_stats", lambda r: web.json_response({"system": {"comfyui_version": "fake"}}))
        app.router.add_get("/object_info", lambda r: web.json_response(OBJECT_INFO))
        app.router.add_post("/upload/image", self.upload)
        app.router.add_post("/prompt", self.prompt)
        app.router.add_get("/queue", self.queue)
        app.router.add_post("/queue", self.queue_delete)
        app.router.add_post("/interrupt", self.interrupt)
        app.router.add_get("/history/{prompt_id}", self.get_history)
        app.router.add_get("/view", self.view)
        return app

    async def ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sid = request.rel_url.query.get("clientId") or uuid.uuid4().hex
        self.sockets[sid] = ws
        await self.send("status", {"status": {"exec_info": {"queue_remaining": len(self.pending)}}, "sid": sid}, sid)
        await ws.send_bytes(b"\x00\x00\x00\x01" + b"not json: a preview frame")  # binary frames must be skipped
        async for _msg in ws:
            if _msg.type == WSMsgType.ERROR:
                break
        self.sockets.pop(sid, None)
        return ws

    async def upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        part: Any = form["image"]
        (self.root / "input").mkdir(parents=True, exist_ok=True)
        (self.root / "input" / part.filename).write_bytes(part.file.read())
        return web.json_response({"name": part.filename, "subfolder": "", "type": "input"})

    async def prompt(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt, prompt_id = body["prompt"], str(body.get("prompt_id") or uuid.uuid4())
        node_errors = {}
        for nid, node in prompt.items():
            image = node["inputs"].get("image")
            if node["class_type"] == "LoadImage" and not (self.root / "input" / str(image)).is_file():
                node_errors[nid] = {
                    "errors": [
                        {
                            "type": "value_not_in_list",
                            "message": "Value not in list",
                            "details": f"image: '{image}' not in []",
                            "extra_info": {"input_name": "image"},
                        }
                    ],
                    "dependent_outputs": [k for k, n in prompt.items() if n["class_type"] == "SaveImage"],
                    "class_type": "LoadImage",
                }
        invalid = {nid for nid, node in prompt.items() if "__invalid__" in node["inputs"].values()}
        for nid in invalid:  # ComfyUI's value_not_in_list on a widget; a SaveImage alone fails only its own output
            node_errors[nid] = {
                "errors": [{"type": "value_not_in_list", "message": "Value not in list", "details": "__invalid__"}],
                "dependent_outputs": [nid],
                "class_type": prompt[nid]["class_type"],
            }
        saves = {nid for nid, node in prompt.items() if node["class_type"] == "SaveImage"}
        if node_errors and saves - invalid and not node_errors.keys() - saves:  # queued with the valid outputs only
            prompt = {nid: node for nid, node in prompt.items() if nid not in invalid}
            self.pending.append((prompt_id, prompt, str(body.get("client_id", ""))))
            return web.json_response({"prompt_id": prompt_id, "number": len(self.history), "node_errors": node_errors})
        if node_errors:
            error = {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation"}
            return web.json_response(
                {"error": {**error, "details": "", "extra_info": {}}, "node_errors": node_errors}, status=400
            )
        self.pending.append((prompt_id, prompt, str(body.get("client_id", ""))))
        return web.json_response({"prompt_id": prompt_id, "number": len(self.history), "node_errors": {}})

    async def queue(self, request: web.Request) -> web.Response:
        running = [[0, self.running, {}, {}, []]] if self.running else []
        pending = [[i + 1, pid, {}, {}, []] for i, (pid, _, _) in enumerate(self.pending)]
        return web.json_response({"queue_running": running, "queue_pending": pending})

    async def queue_delete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/queue", body))
        self.pending = [p for p in self.pending if p[0] not in body.get("delete", [])]
        return web.Response()

    async def interrupt(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/interrupt", body))
        if body.get("prompt_id") in (None, self.running):
            self.interrupted = True
        return web.Response()

    async def get_history(self, request: web.Request) -> web.Response:
        pid = request.match_info["prompt_id"]
        return web.json_response({pid: self.history[pid]} if pid in self.history else {})

    async def view(self, request: web.Request) -> web.Response:
        path = self.root / "output" / request.query.get("subfolder", "") / request.query["filename"]
        return web.Response(body=path.read_bytes(), content_type="image/png")

    # ----------------------------------------------------------------------------------------------- worker
    async def worker(self) -> None:
        while True:
            if self.pending:
                prompt_id, prompt, sid = self.pending.pop(0)
                try:
                    await self.run_prompt(prompt_id, prompt, sid)
                except Exception as e:  # a bug in the fake must fail the test, not hang the client
                    self.running = None
                    error = {
                        "prompt_id": prompt_id,
                        "node_id": "?",
                        "node_type": "FakeComfy",
                        "exception_type": type(e).__name__,
                        "exception_message": f"fake server crashed: {e}",
                        "traceback": [],
                    }
                    self.history[prompt_id] = {
                        "prompt": [0, prompt_id, prompt, {"client_id": sid}, []],
                        "outputs": {},
                        "status": {"status_str": "error", "completed": False, "messages": [("execution_error", error)]},
                        "meta": {},
                    }
                    await self.send("execution_error", error, sid)
                    await self.send("executing", {"node": None, "prompt_id": prompt_id}, sid)
            else:
                await asyncio.sleep(0.01)

    async def run_prompt(self, prompt_id: str, prompt: dict[str, Any], sid: str) -> None:
        self.running, self.interrupted = prompt_id, False
        # a sampling run of another client, earlier: its stats must not count for this prompt
        await self.send("tokenfuse.stats", {"final": True, "summary": "peak VRAM 99999 MiB [other]"}, None)
        messages: list[tuple[str, dict[str, Any]]] = []

        async def message(kind: str, data: dict[str, Any], broadcast: bool = False) -> None:
            """ComfyUI's PromptExecutor.add_message: kept for the history entry and sent."""
            data = {**data, "prompt_id": prompt_id, "timestamp": int(time.time() * 1000)}
            messages.append((kind, data))
            await self.send(kind, data, None if broadcast else sid)

        await message("execution_start", {})
        await message("execution_cached", {"nodes": []})
        outputs: dict[str, Any] = {}
        ok = await self.run_nodes(prompt_id, prompt, sid, message, outputs, [])
        if ok:
            await message("execution_success", {})
        self.history[prompt_id] = {
            "prompt": [0, prompt_id, prompt, {"client_id": sid}, []],
            "outputs": outputs,
            "status": {"status_str": "success" if ok else "error", "completed": ok, "messages": messages},
            "meta": {},
        }
        self.running = None
        await self.send("executing", {"node": None, "prompt_id": prompt_id}, sid)

    async def run_nodes(
        self, prompt_id: str, prompt: dict[str, Any], sid: str, message: Any, outputs: dict[str, Any], done: list[str]
    ) -> bool:
        image: Image.Image | None = None
        for nid, node in prompt.items():
            kind, inputs = node["class_type"], node["inputs"]
            await self.send("executing", {"node": nid, "display_node": nid, "prompt_id": prompt_id}, sid)
            ui: dict[str, Any] = {}
            if kind == "LoadImage":
                try:
                    image = Image.open(self.root / "input" / inputs["image"]).convert("RGB")
                except Exception as e:  # noqa: BLE001 - reported like ComfyUI does
                    await message(
                        "execution_error",
                        {
                            "node_id": nid,
                            "node_type": kind,
                            "executed": done,
                            "exception_message": str(e),
                            "exception_type": f"{type(e).__module__}.{type(e).__name__}",
                            "traceback": [],
                            "current_inputs": {},
                            "current_outputs": [],
                        },
                    )
                    return False
            if "steps" in inputs:
                for step in range(1, int(inputs["steps"]) + 1):
                    if self.interrupted:
                        await message(
                            "execution_interrupted", {"node_id": nid, "node_type": kind, "executed": done}, True
                        )
                        return False
                    await asyncio.sleep(self.step_s)
                    await self.send(
                        "progress", {"value": step, "max": inputs["steps"], "node": nid, "prompt_id": prompt_id}, sid
                    )
                    stats = _stats(nid, step, int(inputs["steps"]))
                    if stats["summary"]:
                        self.peak_texts.append(stats["summary"])
                    await self.send("tokenfuse.stats", stats, None)
            if kind == "TokenFuseScheduledFusion":
                ui = {"text": [_fusion_report(self.faces, self.fallbacks)]}
            elif kind == "SaveImage" and image is not None:
                sub, _, stem = str(inputs.get("filename_prefix", "ComfyUI")).rpartition("/")  # as ComfyUI splits it
                name = f"{stem}_{len(self.history):05d}_.png"
                (self.root / "output" / sub).mkdir(parents=True, exist_ok=True)
                image.save(self.root / "output" / sub / name)
                ui = {"images": [{"filename": name, "subfolder": sub, "type": "output"}]}
            if ui:
                outputs[nid] = ui
                await self.send(
                    "executed", {"node": nid, "display_node": nid, "output": ui, "prompt_id": prompt_id}, sid
                )
            done.append(nid)
        return True


def _stats(node: str, step: int, steps: int) -> dict[str, Any]:
    """The pack's tokenfuse.stats payload (web/README.md); the last step's carries the run's summary line, whose
    peak text is made by the pack's own formatter for this process on CPU ("peak RSS N MiB (process)")."""
    from tokenfuse.nodes.peak_memory import peak_memory_start

    final = step == steps
    summary = f"TokenFuse: 24.5% q+k/v tokens saved, {peak_memory_start('cpu')[0]()} [sd15 balanced]" if final else None
    return {
        "node": node,
        "step": step,
        "steps": steps,
        "step_time_s": 0.01,
        "peak_mem_mb": None,
        "levels": [],
        "final": final,
        "summary": summary,
    }


def _fusion_report(faces: int, fallbacks: tuple[str, ...]) -> str:
    from tokenfuse.fusion.fallback import FaceReport, format_report

    reports = [FaceReport(frame=0, index=i, seed=42, context_side=512, tokens=4096, time_s=0.5) for i in range(faces)]
    for action in fallbacks:
        reports[0].add(action, "CUDA out of memory at guide 512")  # type: ignore[arg-type]
    return format_report(reports, "ScheduledFusion: fake server")


@contextmanager
def fake_comfy(root: Path, **settings: Any) -> Iterator[FakeComfy]:
    """Run a FakeComfy on 127.0.0.1 (a free port) in a background thread; yields it with `url` set."""
    server = FakeComfy(root, **settings)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner = web.AppRunner(server.app(), access_log=None)
    tasks: list[asyncio.Task[None]] = []

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        server.url = f"http://127.0.0.1:{port}"
        tasks.append(loop.create_task(server.worker()))
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(10), "fake ComfyUI did not start"
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(tasks[0].cancel)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
