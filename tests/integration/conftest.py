"""Shared fixtures for integration tests against a real ComfyUI checkout (skipped without COMFYUI_PATH).

Generic on purpose: ComfyUI sys.path setup + in-process import, the random-weight model builder that the bench
scripts use too (devkit/comfy_models.py), and a real ComfyUI server with this pack loaded. Run with ComfyUI's venv:
    COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/integration
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from comfy_http import http_json

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def comfy(comfyui_path: Path) -> SimpleNamespace:
    """ComfyUI imported in-process on CPU with PyTorch SDPA attention.

    Returns a namespace: models (devkit/comfy_models: build_model, build_vae, conditioning, ...), nodes (ComfyUI's
    nodes.py),
    path. CLI args are set before comfy.model_management is first imported (DESIGN.md §5).
    """
    from tokenfuse.devkit import comfy_models

    comfy_models.setup_comfy(comfyui_path, cpu=True, sdpa=True)
    import utils.extra_config  # noqa: F401  (ComfyUI needs it imported before its nodes module)

    import nodes as nodes_module  # ComfyUI's nodes.py: its folder is first on sys.path now

    assert hasattr(nodes_module, "common_ksampler"), f"'nodes' resolved to {nodes_module.__file__}, not ComfyUI's"
    return SimpleNamespace(models=comfy_models, nodes=nodes_module, path=comfyui_path)


@pytest.fixture(scope="session")
def random_model(comfy: SimpleNamespace):
    """Factory: random_model(family, **kw) -> ModelPatcher of a seeded random-weight model (cached per arguments).

    family: "sd15" | "sdxl" | "flux". Defaults are test-sized (model_channels 32, tiny depth).
    """
    cache: dict = {}

    def make(family: str, model_channels: int = 32, tiny: bool = True, seed: int = 0):
        key = (family, model_channels, tiny, seed)
        if key not in cache:
            cache[key] = comfy.models.build_model(family, model_channels=model_channels, tiny=tiny, seed=seed)
        return cache[key]

    return make


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def start_comfy_server(
    comfyui_path: Path, base: Path, extra_nodes: dict[str, Path] | None = None, env: dict[str, str] | None = None
) -> Iterator[SimpleNamespace]:
    """A CPU ComfyUI server whose base directory is `base` (a temp folder), loading only this pack (symlinked as
    ComfyUI-TokenFuse) plus `extra_nodes` (custom node folder name -> folder, symlinked too); `env` is added to the
    server process's environment. Stops the server on exit.

    Yields url (http://127.0.0.1:PORT), log (path of the server's output), pack (this pack's folder name).
    """
    pack = "ComfyUI-TokenFuse"
    folders = {pack: REPO, **(extra_nodes or {})}
    (base / "custom_nodes").mkdir(parents=True, exist_ok=True)
    for name, folder in folders.items():
        (base / "custom_nodes" / name).symlink_to(folder, target_is_directory=True)
    port = _free_port()
    log_path = base / "server.log"
    cmd = [
        sys.executable,
        "main.py",
        "--cpu",
        "--listen",
        "127.0.0.1",
        "--port",
        str(port),
        "--base-directory",
        str(base),
        "--database-url",
        "sqlite:///:memory:",
        "--disable-all-custom-nodes",
        "--whitelist-custom-nodes",
        *folders,
        "--disable-auto-launch",
    ]
    full_env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(cmd, cwd=comfyui_path, stdout=log_file, stderr=subprocess.STDOUT, env=full_env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_s = float(os.environ.get("TOKENFUSE_SERVER_START_S", "120"))  # raise it on a loaded machine
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ComfyUI server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                http_json(f"{url}/system_stats", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail(f"ComfyUI server did not answer in {wait_s:.0f} s:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
        yield SimpleNamespace(url=url, log=log_path, pack=pack)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def comfy_server_factory(comfyui_path: Path):
    """start_comfy_server bound to the checkout: comfy_server_factory(base, extra_nodes=None, env=None) is a context
    manager yielding a server like `comfy_server` (for tests that need their own server)."""
    return functools.partial(start_comfy_server, comfyui_path)


@pytest.fixture(scope="session")
def comfy_server(comfyui_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A CPU ComfyUI server with only this pack as custom node; everything it writes goes to a temp folder.

    Yields url (http://127.0.0.1:PORT), log (path of the server's output), pack (the module folder name).
    """
    base = tmp_path_factory.mktemp("comfy_base")
    # Skip the first-start template browser and the minimap, which would cover the canvas in browser checks.
    (base / "user" / "default").mkdir(parents=True)
    (base / "user" / "default" / "comfy.settings.json").write_text(
        '{"Comfy.TutorialCompleted": true, "Comfy.Minimap.Visible": false}', encoding="utf-8"
    )
    with start_comfy_server(comfyui_path, base) as server:
        yield server


@pytest.fixture(scope="session")
def browser_tools() -> tuple[str, dict[str, str]]:
    """(node, env) for the Playwright scripts; skips unless Node, Chromium and playwright-core are present.

    CHROMIUM (or `chromium` on PATH) is Debian's browser; PLAYWRIGHT_CORE_DIR a folder where `npm install
    playwright-core` ran.
    """
    node = shutil.which("node")
    if node is None:
        pytest.skip("browser check: Node.js not installed")
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("browser check: no Chromium (apt-get install chromium, or set CHROMIUM)")
    env = dict(os.environ, CHROMIUM=chromium)
    probe = subprocess.run(
        [
            node,
            "-e",
            "const d = process.env.PLAYWRIGHT_CORE_DIR;"
            "require('module').createRequire(d ? require('path').join(d, 'package.json') : process.cwd() + '/x.js')"
            ".resolve('playwright-core')",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip("browser check: playwright-core not found (npm install playwright-core in PLAYWRIGHT_CORE_DIR)")
    return node, env
