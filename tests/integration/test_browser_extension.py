"""The web/ extension in a real ComfyUI page, in headless Chromium (integration; skipped without its tools).

Needs COMFYUI_PATH (a ComfyUI checkout; the shared `comfy_server` fixture runs it with this Python), Node.js, a
Chromium (CHROMIUM or `chromium` on PATH) and playwright-core (PLAYWRIGHT_CORE_DIR: a folder where `npm install
playwright-core` ran). Set TOKENFUSE_SCREENSHOT=<path.png> to keep the screenshot.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "integration" / "browser_check.mjs"
pytestmark = pytest.mark.integration


def _ours(line: str) -> bool:
    return "/extensions/" in line or "tokenfuse" in line.lower()


def test_scheduler_chart_in_real_frontend(
    browser_tools: tuple[str, dict[str, str]], comfy_server: SimpleNamespace, tmp_path: Path
) -> None:
    node, env = browser_tools
    shot = Path(os.environ.get("TOKENFUSE_SCREENSHOT") or tmp_path / "web.png")
    out = subprocess.run(
        [node, str(SCRIPT), comfy_server.url, str(shot)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert not res.get("fatal"), res["fatal"]
    assert {"tokenfuse.scheduler", "tokenfuse.planPreview"} <= set(res["extensions"]), res["extensions"]
    assert res["nodeCreated"]
    assert res["widgets"][-1] == "tokenfuse_chart", res["widgets"]
    assert res["changed"] == {"preset": True, "ratio": True}, "widget names changed: update web/tokenfuse_scheduler.js"
    assert res["reloaded"] is not None, "node lost when the saved workflow was loaded again"
    assert res["reloaded"]["widgets"] == res["widgets"], res["reloaded"]
    assert res["reloaded"]["values"][:3] == ["lowvram_8gb", "preset", 0.5], res["reloaded"]
    # The chart is display-only: not in the prompt, not in the saved workflow.
    assert "tokenfuse_chart" not in res["promptInputs"], res["promptInputs"]
    assert res["widgetsValues"] is not None and len(res["widgetsValues"]) == len(res["widgets"]) - 1
    if res["planNodeCreated"]:  # PatchTokenize registered: its preview gets room and is shown
        prev = res["planPreview"]
        assert prev["after"][1] > prev["before"][1] and prev["imgs"] >= 1, prev
    ours = [e for e in res["consoleErrors"] + res["pageErrors"] + res["failedRequests"] if _ours(e)]
    assert not ours, ours
    assert shot.is_file() and shot.stat().st_size > 10_000
