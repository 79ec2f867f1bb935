"""The pack loads in a real ComfyUI server and TokenSchedulerController is served in /object_info."""

from __future__ import annotations

import json
import urllib.request

import pytest

pytestmark = pytest.mark.integration


def test_scheduler_node_in_object_info(comfy_server) -> None:
    with urllib.request.urlopen(f"{comfy_server.url}/object_info", timeout=60) as resp:
        info = json.loads(resp.read().decode())
    node = info.get("TokenFuseTokenSchedulerController")
    log = comfy_server.log.read_text()
    assert node is not None, f"node missing from /object_info; server log tail:\n{log[-3000:]}"
    assert "(TokenSchedulerController)" in node["display_name"] and node["category"] == "TokenFuse/model"
    assert node["output"] == ["MODEL", "STRING"]
    required = node["input"]["required"]
    assert required["model"][0] == "MODEL" and "balanced" in required["preset"][0]
    assert all(entry[1].get("tooltip") for entry in required.values())
    assert "token_plan" in node["input"]["optional"]
    pack_lines = [ln for ln in log.splitlines() if comfy_server.pack in ln]
    assert pack_lines and not [ln for ln in pack_lines if "IMPORT FAILED" in ln or "Cannot import" in ln], pack_lines
