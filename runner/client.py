"""The runner against a running ComfyUI server (`--server URL`): GET /object_info for the node definitions,
POST /upload/image to hand over each input, POST /prompt, poll /history/<id> until it ends, GET /view for the
saved files, POST /interrupt on Ctrl-C. Standard library only.

Differences from the embedded engine: no per-step progress (the server reports steps on its websocket; this
client polls /history), no STRING report outputs (the server keeps only UI outputs), so the JSONL rows have no
face / fallback counts, and peak memory is not known.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from .engine import ExecResult, OutputFile, Progress


class ServerError(ConnectionError):
    """The server refused or failed a request; the message carries its answer."""


class ServerComfy:
    """A ComfyUI server at `url` (http://host:port). poll_s: /history polling interval."""

    def __init__(self, url: str, timeout_s: float = 3600.0, poll_s: float = 0.25) -> None:
        self.url = url.rstrip("/")
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.client_id = str(uuid.uuid4())
        self._request("GET", "/system_stats")  # fail early with a clear message when nothing answers

    def _request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                data = r.read()
                return json.loads(data) if r.headers.get_content_type() == "application/json" else data
        except urllib.error.HTTPError as e:
            raise ServerError(f"{method} {path}: HTTP {e.code}: {e.read()[:2000].decode(errors='replace')}") from e
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise ServerError(f"ComfyUI server at {self.url} did not answer ({e}); is it running?") from e

    def node_defs(self) -> dict[str, dict[str, Any]]:
        return dict(self._request("GET", "/object_info"))

    def stage(self, path: Path) -> str:
        name = f"tokenfuse_{uuid.uuid4().hex[:8]}_{path.name}"
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
        body = json.dumps({"prompt": prompt, "client_id": self.client_id}).encode()
        try:
            answer = self._request("POST", "/prompt", body, {"Content-Type": "application/json"})
        except ServerError as e:
            return ExecResult(ok=False, error=f"the server refused the prompt: {e}")
        prompt_id = answer["prompt_id"]
        deadline = time.monotonic() + self.timeout_s
        while True:
            history = self._request("GET", f"/history/{prompt_id}")
            if prompt_id in history:
                break
            if time.monotonic() > deadline:
                self.interrupt()
                return ExecResult(ok=False, error=f"no result after {self.timeout_s:.0f} s")
            time.sleep(self.poll_s)
        entry = history[prompt_id]
        status = entry.get("status", {})
        messages = status.get("messages", [])
        if status.get("status_str") != "success":
            interrupted = any(m[0] == "execution_interrupted" for m in messages)
            errors = [m[1] for m in messages if m[0] == "execution_error"]
            text = "interrupted" if interrupted else _error_text(errors)
            return ExecResult(ok=False, error=text, interrupted=interrupted)
        files = []
        for node_out in entry.get("outputs", {}).values():
            for entries in node_out.values():
                for e in entries if isinstance(entries, list) else []:
                    if isinstance(e, dict) and e.get("type") == "output" and "filename" in e:
                        query = urllib.parse.urlencode(
                            {"filename": e["filename"], "subfolder": e.get("subfolder", ""), "type": "output"}
                        )
                        files.append(OutputFile(e["filename"], e.get("subfolder", ""), _reader(self, f"/view?{query}")))
        return ExecResult(ok=True, outputs=files)

    def interrupt(self) -> None:
        try:
            self._request("POST", "/interrupt", b"{}", {"Content-Type": "application/json"})
        except ServerError:
            pass  # the server is gone: nothing left to interrupt

    def close(self) -> None:
        pass


def _reader(client: ServerComfy, path: str) -> Any:
    return lambda: bytes(client._request("GET", path))


def _error_text(errors: list[dict[str, Any]]) -> str:
    if not errors:
        return "execution failed"
    e = errors[0]
    return f"node {e.get('node_id')} ({e.get('node_type')}): {e.get('exception_type')}: {e.get('exception_message')}"
