"""The web/ extension in a real ComfyUI page, in headless Chromium (integration; skipped without its tools).

Needs COMFYUI_PATH (a ComfyUI checkout; the server runs with this Python or COMFYUI_PYTHON), Node.js, a Chromium
(CHROMIUM or `chromium` on PATH) and playwright-core (PLAYWRIGHT_CORE_DIR: a folder where `npm install
playwright-core` ran). Set TOKENFUSE_SCREENSHOT=<path.png> to keep the screenshot.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "integration" / "browser_check.mjs"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tools() -> tuple[str, dict[str, str]]:
    """(node, env) for the check script; skips unless Node, Chromium and playwright-core are present."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("browser check: Node.js not installed")
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("browser check: no Chromium (apt-get install chromium, or set CHROMIUM)")
    env = dict(os.environ, CHROMIUM=chromium)
    probe = subprocess.run(
        [node, "-e", "const d = process.env.PLAYWRIGHT_CORE_DIR;"
         "require('module').createRequire(d ? require('path').join(d, 'package.json') : process.cwd() + '/x.js')"
         ".resolve('playwright-core')"],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )
    if probe.returncode != 0:
        pytest.skip("browser check: playwright-core not found (npm install playwright-core in PLAYWRIGHT_CORE_DIR)")
    return node, env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def comfy_server(tools: tuple[str, dict[str, str]], comfyui_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """A ComfyUI server (CPU) that loads only this pack, by path, without copying it."""
    tmp = tmp_path_factory.mktemp("comfy_web")
    for sub in ("out", "in", "temp", "user/default"):
        (tmp / sub).mkdir(parents=True)
    # Skip the first-start template browser and the minimap, which would cover the canvas.
    (tmp / "user/default/comfy.settings.json").write_text(
        '{"Comfy.TutorialCompleted": true, "Comfy.Minimap.Visible": false}', encoding="utf-8"
    )
    (tmp / "extra.yaml").write_text(f"tokenfuse:\n  custom_nodes: {REPO.parent}\n", encoding="utf-8")
    port = _free_port()
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
         "--extra-model-paths-config", str(tmp / "extra.yaml"), "--disable-all-custom-nodes",
         "--whitelist-custom-nodes", REPO.name, "--output-directory", str(tmp / "out"),
         "--input-directory", str(tmp / "in"), "--temp-directory", str(tmp / "temp"),
         "--user-directory", str(tmp / "user")],
        cwd=comfyui_path, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ComfyUI exited: {(tmp / 'server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/object_info/TokenFuseTokenSchedulerController", timeout=5) as r:
                    if json.load(r):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"ComfyUI did not serve the pack in 120 s: {(tmp / 'server.log').read_text()[-3000:]}")
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _ours(line: str) -> bool:
    return "/extensions/" in line or "tokenfuse" in line.lower()


def test_scheduler_chart_in_real_frontend(tools: tuple[str, dict[str, str]], comfy_server: str, tmp_path: Path) -> None:
    node, env = tools
    shot = Path(os.environ.get("TOKENFUSE_SCREENSHOT") or tmp_path / "web.png")
    out = subprocess.run(
        [node, str(SCRIPT), comfy_server, str(shot)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=240, check=False,
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
