"""The example workflows as the editor shows them (issue 12): model download metadata the frontend reads, model file
names that match the nodes' messages, FaceDetect's backend left to the node's default, a layout with room for the
after-run sizes, and square template-card pictures.

The after-run layout itself is checked in a real editor by tests/integration/test_editor_after_run.py; here the
saved positions and sizes are checked without a browser.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from tokenfuse.nodes import NODE_CLASS_MAPPINGS
from tokenfuse.nodes.enhance_node import NO_MODEL

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))  # the photo workflows and the video workflow (issue 9)
ids = [p.stem for p in WORKFLOWS]
TITLE_H = 30  # LiteGraph.NODE_TITLE_HEIGHT in comfyui-frontend-package 1.27
# What comfyui-frontend-package 1.27.x downloads from a node's properties.models without asking (MissingModelsWarning)
DOWNLOADABLE_SOURCES = ("https://huggingface.co/", "https://civitai.com/")
DOWNLOADABLE_SUFFIXES = (".safetensors", ".sft")


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _nodes(path: Path, node_type: str) -> list[dict[str, Any]]:
    return [n for n in _load(path)["nodes"] if n["type"] == node_type]


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_model_loaders_carry_download_urls(path: Path) -> None:
    for node_type, directory in (
        ("CheckpointLoaderSimple", "checkpoints"),
        ("TokenFuseGFPGANEnhance", "facerestore_models"),
    ):
        for node in _nodes(path, node_type):
            models = node.get("properties", {}).get("models")
            assert models, f"{path.name}: {node_type} has no properties.models"
            (model,) = models
            # the frontend matches entries to the selected file by name: it must be the widget's value
            assert model["name"] == node["widgets_values"][0] and model["directory"] == directory, model
            assert model["url"].startswith("https://"), model
            assert model["url"].split("?")[0].endswith("/" + model["name"]), model
            if model["name"].endswith(DOWNLOADABLE_SUFFIXES):
                assert model["url"].startswith(DOWNLOADABLE_SOURCES), "the frontend would refuse this download"


def test_model_urls_are_the_known_sources() -> None:
    urls = {
        m["name"]: m["url"]
        for p in WORKFLOWS
        for n in _load(p)["nodes"]
        for m in n.get("properties", {}).get("models", [])
    }
    assert urls["v1-5-pruned-emaonly-fp16.safetensors"].startswith(
        "https://huggingface.co/Comfy-Org/stable-diffusion-v1-5-archive/resolve/main/"
    )  # the file ComfyUI's own templates download
    assert urls["sd_xl_base_1.0.safetensors"].startswith(
        "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0/resolve/main/"
    )
    assert urls["GFPGANv1.4.pth"] == "https://github.com/TencentARC/GFPGAN/releases/download/v1.3.0/GFPGANv1.4.pth"


def test_gfpgan_file_named_alike_in_workflows_and_messages() -> None:
    names = {n["widgets_values"][0] for p in WORKFLOWS for n in _nodes(p, "TokenFuseGFPGANEnhance")}
    assert names == {"GFPGANv1.4.pth"}
    assert "GFPGANv1.4.pth" in NO_MODEL  # the list's placeholder when the folder is empty
    glue = (REPO / "nodes" / "enhance_node.py").read_text(encoding="utf-8")  # the not-found message
    assert "GFPGANv1.4.pth" in glue and "GFPGANv1.4 (.safetensors preferred)" not in glue
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "is preferred)" not in readme.split("## Models", 1)[1].split("## Nodes", 1)[0]


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_face_detect_uses_the_node_default_backend(path: Path) -> None:
    for node_type in ("TokenFuseFaceDetect", "TokenFuseFaceTrack"):
        default = NODE_CLASS_MAPPINGS[node_type].INPUT_TYPES()["required"]["backend"][1]["default"]
        for node in _nodes(path, node_type):
            assert node["widgets_values"][0] == default, f"tools/workflow_specs*.mjs must not pin a {node_type} backend"


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_layout_leaves_room_for_after_run_sizes(path: Path) -> None:
    nodes = _load(path)["nodes"]
    rects = [
        (n["id"], n["type"], n["pos"][0], n["pos"][1] - TITLE_H, n["size"][0], n["size"][1] + TITLE_H) for n in nodes
    ]
    for i, (ia, ta, ax, ay, aw, ah) in enumerate(rects):
        for ib, tb, bx, by, bw, bh in rects[i + 1 :]:
            assert not (ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah), (
                f"{ia}:{ta} overlaps {ib}:{tb}"
            )
    sizes = {n["type"]: n["size"] for n in nodes}
    if "_video_" in path.name:
        # room for what a run adds: the tracked-faces grid, the playing result, the two report panels
        assert sizes["PreviewImage"][1] >= 400 and sizes["SaveVideo"][1] >= 400 and sizes["LoadVideo"][1] >= 380
        assert sizes["TokenFuseFaceTrack"][1] >= 480 and sizes["TokenFuseVideoFaceFusion"][1] >= 620
        return
    # room for what a run adds: the photo previews, the plan preview + saving, the report panel
    assert sizes["PreviewImage"][1] >= 400 and sizes["SaveImage"][1] >= 400
    assert sizes["TokenFusePatchTokenize"][1] >= 600 and sizes["TokenFuseScheduledFusion"][1] >= 650


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_template_card_is_a_square_picture(path: Path) -> None:
    data = path.with_suffix(".jpg").read_bytes()
    assert data[:3] == b"\xff\xd8\xff"
    i = 2
    while i < len(data):  # walk the JPEG segments to the frame header
        marker, length = data[i + 1], struct.unpack(">H", data[i + 2 : i + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            break
        i += 2 + length
    assert w == h >= 256, (w, h)  # the template browser crops thumbnails to a square


def test_readme_lists_the_workflows_4gb_first() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Workflows", 1)[1].split("##", 1)[0]
    listed = re.findall(r"\[workflows/(tokenfuse_[a-z0-9_]+)\.json\]", table)
    assert listed[0] == "tokenfuse_face_refine_sd15_4gb", listed
