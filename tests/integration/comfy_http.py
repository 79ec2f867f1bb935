"""HTTP helpers for tests that talk to a real ComfyUI server (imported by the integration tests and conftest)."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest


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
