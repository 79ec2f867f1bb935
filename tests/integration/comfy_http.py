"""HTTP helpers for tests that talk to a real ComfyUI server (imported by the integration tests and conftest)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def http_json(url: str, data: dict | None = None, timeout: float = 30.0) -> dict:
    """GET (or POST `data` as JSON) and decode the JSON answer."""
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def wait_history(url: str, prompt_id: str, timeout: float = 180.0) -> dict:
    """Poll /history until the prompt completed (either way); fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hist = http_json(f"{url}/history/{prompt_id}")
        if prompt_id in hist and hist[prompt_id].get("status", {}).get("completed") is not None:
            return hist[prompt_id]
        time.sleep(0.5)
    pytest.fail(f"prompt {prompt_id} did not finish in {timeout} s")


def run_node_script(
    browser_tools: tuple[str, dict[str, str]], script: Path, *args: str, timeout: float = 300, log: Path | None = None
) -> str:
    """`node SCRIPT ARGS...` (a headless-Chromium check against a server) from the repository root; its stdout. A
    failing script fails the test with its stderr (and the end of the server's `log`, when given).
    `browser_tools` is the conftest fixture's (node, env)."""
    node, env = browser_tools
    out = subprocess.run(
        [node, str(script), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    server = log.read_text()[-3000:] if log is not None else ""
    assert out.returncode == 0, out.stderr[-3000:] + server
    return out.stdout


def frontend_check(browser_tools: tuple[str, dict[str, str]], url: str) -> dict:
    """`node tools/make_workflows.mjs check URL workflows/`: the real frontend (headless Chromium) loads every example
    workflow from the server at `url`; per file: missing node types, the round trip and app.graphToPrompt's prompt."""
    script = REPO / "tools" / "make_workflows.mjs"
    return dict(json.loads(run_node_script(browser_tools, script, "check", url, str(REPO / "workflows"))))
