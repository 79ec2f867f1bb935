"""The runner against a running ComfyUI server (`--server URL`): GET /object_info for the node definitions, POST
/upload/image to hand over each input, POST /prompt, follow the prompt on the server's websocket (per-step progress,
node errors, the pack's stats: runner/on_comfyui/server_ws.py), GET /history/<id> for its outcome and UI outputs, GET
/view for the saved files; Ctrl-C deletes the prompt from the queue and interrupts it (POST /queue, /interrupt with its
prompt_id, so other clients' prompts are left alone).

The report rows match the embedded ComfyUI's: faces / fallbacks come from ScheduledFusion's report, which the node
also returns as UI text (the server keeps only UI outputs, so the GFPGANEnhance and TokenSchedulerController report
strings are not in `reports`); peak memory is what the pack's stats say at the end of sampling (the server
process's CUDA max_memory_allocated, never reset, or its peak RSS on CPU) and unknown when no TokenFuse-scheduled
model samples. Without aiohttp (ComfyUI's Python has it) the client polls /history: no per-step progress and no
peak memory then. HTTP with the standard library.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from .embedded import REPORT_SLOTS, _error_message, _validation_message, staged_name
from .protocol import (
    PARTIAL_INVALID,
    ComfyUnavailable,
    ExecResult,
    OutputFile,
    Progress,
    missing_saves,
    output_entries,
)
from .server_ws import PromptEvents, WebsocketUnavailable, watch_prompt, websocket_available

log = logging.getLogger("tokenfuse.runner")
NO_WEBSOCKET = "not known: no websocket (aiohttp missing), so the pack's stats did not reach the runner"


class ServerError(ConnectionError):
    """The server refused or failed a request; the message carries its answer (`body`: its JSON, when it sent
    one)."""

    def __init__(self, message: str, body: Any = None) -> None:
        super().__init__(message)
        self.body = body


class ServerUnreachable(ServerError, ComfyUnavailable):
    """The server did not answer at all (gone, restarting, wrong address): the run stops (protocol.ComfyUnavailable)
    instead of failing every remaining item within a second."""


class ServerComfy:
    """A ComfyUI server at `url` (http://host:port).

    websocket: follow prompts on /ws (needs aiohttp); False, or aiohttp missing, polls /history every `poll_s`.
    timeout_s: a prompt still unfinished after this long is interrupted and fails.
    """

    def __init__(self, url: str, timeout_s: float = 3600.0, poll_s: float = 0.25, websocket: bool = True) -> None:
        self.url = url.rstrip("/")
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.client_id = str(uuid.uuid4())
        self._running: str | None = None  # the prompt id queued by execute() now
        self._stop = False  # interrupt() was called during this prompt
        self._request("GET", "/system_stats")  # fail early with a clear message when nothing answers
        self.websocket = websocket and websocket_available()
        if websocket and not self.websocket:
            log.warning(
                "aiohttp is not installed: --server polls /history (no per-step progress, no peak memory); "
                "run the runner with ComfyUI's Python or pip install aiohttp"
            )

    @property
    def ws_url(self) -> str:
        scheme, rest = self.url.split("://", 1)
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/ws?clientId={self.client_id}"

    def _request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                data = r.read()
                return json.loads(data) if r.headers.get_content_type() == "application/json" else data
        except urllib.error.HTTPError as e:
            text = e.read()[:20000].decode(errors="replace")
            try:
                answer = json.loads(text)
            except json.JSONDecodeError:
                answer = None
            raise ServerError(f"{method} {path}: HTTP {e.code}: {text[:2000]}", answer) from e
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise ServerUnreachable(f"ComfyUI server at {self.url} did not answer ({e}); is it running?") from e

    def _post_json(self, path: str, data: dict[str, Any]) -> Any:
        return self._request("POST", path, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def node_defs(self) -> dict[str, dict[str, Any]]:
        return dict(self._request("GET", "/object_info"))

    def stage(self, path: Path) -> str:
        # the name goes into the form's header line: a `"`, `\\` or line break in a file name (legal on Linux) ended
        # it early and the rest read as more form fields; the name only has to be unique and keep the extension
        safe = re.sub(r'["\\\r\n/;]', "_", path.name)
        name = staged_name(f"tokenfuse_{uuid.uuid4().hex[:8]}_", safe)
        boundary = uuid.uuid4().hex
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="type"\r\n\r\ninput\r\n'.encode(),
            f'--{boundary}\r\nContent-Disposition: form-data; name="overwrite"\r\n\r\ntrue\r\n'.encode(),
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n".encode(),
            path.read_bytes(),
            f"\r\n--{boundary}--\r\n".encode(),
        ]
        answer = self._request(
            "POST", "/upload/image", b"".join(parts), {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        )
        sub = answer.get("subfolder", "")
        return f"{sub}/{answer['name']}" if sub else str(answer["name"])

    def execute(self, prompt: dict[str, dict[str, Any]], progress: Progress | None = None) -> ExecResult:
        prompt_id = str(uuid.uuid4())  # ComfyUI takes the id from the request: messages can be matched at once
        deadline = time.monotonic() + self.timeout_s
        self._stop = False

        def submit() -> str:
            self._running = prompt_id  # before the request: a Ctrl-C during it must know what to delete
            try:
                answer = self._post_json(
                    "/prompt", {"prompt": prompt, "client_id": self.client_id, "prompt_id": prompt_id}
                )
            except ServerError as e:
                raise _Refused(_refusal(e)) from e
            node_errors = answer.get("node_errors") if isinstance(answer, dict) else None
            if node_errors:  # queued with only the outputs that validated: take it back, the item fails
                self._cancel(prompt_id)
                raise _Refused(_validation_message(PARTIAL_INVALID, node_errors))
            if self._stop:  # interrupted while queueing: the deletion may have come before the prompt
                self.interrupt()
            return prompt_id

        events: PromptEvents | None = None
        try:
            if self.websocket:
                try:
                    events = watch_prompt(self.ws_url, submit, progress, lambda ev: self._give_up(prompt_id, deadline))
                except WebsocketUnavailable as e:
                    log.warning("no websocket (%s): polling /history instead", e)
                    self.websocket = False
            if events is None:
                submit()
            entry = self._wait_history(prompt_id, deadline)
        except _Refused as e:  # /prompt answered with an error: validation
            return ExecResult(ok=False, error=str(e))
        finally:
            self._running = None
        memory = (events.peak_mib, events.memory_kind) if events is not None else (None, NO_WEBSOCKET)
        if entry is None:
            if self._stop:
                return ExecResult(ok=False, error="interrupted", interrupted=True)
            return ExecResult(ok=False, error=f"no result after {self.timeout_s:.0f} s (interrupted it)")
        return self._result(prompt, entry, events, memory)

    def _give_up(self, prompt_id: str, deadline: float) -> bool:
        """While the websocket is quiet: True when the wait must end (time-out, or the prompt left the queue
        without a history entry: deleted by interrupt())."""
        if time.monotonic() > deadline:
            return True
        return self._stop and self._gone(prompt_id)

    def _gone(self, prompt_id: str) -> bool:
        """Neither queued, running nor finished (history is read after the queue: a prompt that ended in between
        is in the history by then)."""
        queue = self._request("GET", "/queue")
        queued = {str(item[1]) for key in ("queue_running", "queue_pending") for item in queue.get(key, [])}
        return prompt_id not in queued and prompt_id not in self._request("GET", f"/history/{prompt_id}")

    def _wait_history(self, prompt_id: str, deadline: float) -> dict[str, Any] | None:
        """The prompt's /history entry, polling until it exists; None when it timed out (then interrupted) or was
        deleted from the queue by interrupt()."""
        while True:
            history = self._request("GET", f"/history/{prompt_id}")
            if prompt_id in history:
                return dict(history[prompt_id])
            if self._stop and self._gone(prompt_id):
                return None
            if time.monotonic() > deadline:
                self._running = prompt_id
                self.interrupt()
                return None
            time.sleep(self.poll_s)

    def _result(
        self,
        prompt: dict[str, dict[str, Any]],
        entry: dict[str, Any],
        events: PromptEvents | None,
        memory: tuple[float | None, str],
    ) -> ExecResult:
        peak, kind = memory
        status = entry.get("status", {})
        if status.get("status_str") != "success":
            messages = status.get("messages", [])
            interrupted = any(m[0] == "execution_interrupted" for m in messages)
            errors = [m[1] for m in messages if m[0] == "execution_error"]
            if not errors and events is not None and events.outcome == "error":
                errors = [events.error]
            text = "interrupted" if interrupted else _error_message(errors)
            return ExecResult(ok=False, error=text, interrupted=interrupted, peak_memory_mib=peak, memory_kind=kind)
        ui = {**(events.ui if events is not None else {}), **entry.get("outputs", {})}
        saved = output_entries(ui)
        unsaved = missing_saves(prompt, saved)
        if unsaved:
            return ExecResult(ok=False, error=unsaved, peak_memory_mib=peak, memory_kind=kind)
        files = []
        for e in (e for entries in saved.values() for e in entries):
            query = urllib.parse.urlencode(
                {"filename": e["filename"], "subfolder": e.get("subfolder", ""), "type": "output"}
            )
            files.append(OutputFile(e["filename"], e.get("subfolder", ""), _reader(self, f"/view?{query}")))
        texts = {
            nid: "\n".join(str(v) for v in ui[nid]["text"])
            for nid, node in prompt.items()
            if node["class_type"] in REPORT_SLOTS and isinstance(ui.get(nid, {}).get("text"), list)
        }
        return ExecResult(ok=True, outputs=files, texts=texts, peak_memory_mib=peak, memory_kind=kind)

    def interrupt(self) -> None:
        """Stop the prompt this client runs now: delete it from the queue (when still pending) and interrupt it
        (when running); prompts of other clients go on."""
        self._stop = True
        if self._running is not None:
            self._cancel(self._running)

    def _cancel(self, prompt_id: str) -> None:
        """Delete `prompt_id` from the queue (when still pending) and interrupt it (when running)."""
        try:
            self._post_json("/queue", {"delete": [prompt_id]})
            self._post_json("/interrupt", {"prompt_id": prompt_id})
        except ServerError:
            pass  # the server is gone: nothing left to interrupt

    def close(self) -> None:
        pass


class _Refused(Exception):
    """/prompt refused the prompt (not a connection problem: the item fails, the run goes on)."""


def _reader(client: ServerComfy, path: str) -> Any:
    return lambda: bytes(client._request("GET", path))


def _refusal(e: ServerError) -> str:
    """The /prompt answer to an invalid prompt, worded like the embedded ComfyUI's validation message."""
    body = e.body
    if isinstance(body, dict) and ("error" in body or "node_errors" in body):
        return _validation_message(body.get("error", ""), body.get("node_errors") or {})
    return f"the server refused the prompt: {e}"
