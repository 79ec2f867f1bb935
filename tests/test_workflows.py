"""The example workflows in workflows/ (UI format, written by the real frontend via tools/make_workflows.mjs).

Checks what a user loading them would hit: unknown node types, broken links, widget values out of range for our
nodes' INPUT_TYPES, a missing thumbnail or a Note without the model files and licences. The core node list is test
data taken from a real ComfyUI's /object_info (tests/data/comfy_core_nodes.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenfuse.nodes import NODE_CLASS_MAPPINGS

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))
CORE = json.loads((REPO / "tests" / "data" / "comfy_core_nodes.json").read_text(encoding="utf-8"))
CORE_TYPES = set(CORE["nodes"]) | set(CORE["frontend_only"])
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}
# Combos listing model files in the user's folders: CI sees placeholders, so only the file-name shape is checked.
MODEL_FILE_INPUTS = {
    ("TokenFuseGFPGANEnhance", "model_name"),
    ("TokenFuseScheduledFusion", "swap_model"),
    ("TokenFuseScheduledFusion", "arcface_model"),
    ("TokenFuseVideoFaceFusion", "swap_model"),
    ("TokenFuseVideoFaceFusion", "arcface_model"),
}
MODEL_SUFFIXES = (".safetensors", ".pth", ".onnx", ".ckpt")

ids = [p.stem for p in WORKFLOWS]


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _widget_spec(node_type: str) -> list[tuple[str, Any, dict[str, Any]]]:
    """(name, type or choice list, options) of each widget input, required then optional, INPUT_TYPES order."""
    types = NODE_CLASS_MAPPINGS[node_type].INPUT_TYPES()
    out = []
    for section in ("required", "optional"):
        for name, spec in types.get(section, {}).items():
            kind = spec[0]
            opts = spec[1] if len(spec) > 1 else {}
            if isinstance(kind, (list, tuple)) or kind in WIDGET_TYPES:
                out.append((name, kind, opts))
    return out


def _is_seed(kind: Any, opts: dict[str, Any]) -> bool:
    return kind == "INT" and bool(opts.get("control_after_generate"))


def test_the_issue_workflows_are_there() -> None:
    names = {p.stem for p in WORKFLOWS}
    assert {
        "tokenfuse_face_refine_sd15_4gb",
        "tokenfuse_face_swap_sd15_6gb",
        "tokenfuse_face_refine_sdxl_8gb",
        "tokenfuse_group_photo_multiface_sd15",
        "tokenfuse_video_face_refine_sd15_6gb",
    } <= names, names


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_parses_and_has_a_jpeg_thumbnail(path: Path) -> None:
    wf = _load(path)
    assert isinstance(wf["nodes"], list) and isinstance(wf["links"], list) and wf["nodes"]
    thumb = path.with_suffix(".jpg")
    assert thumb.is_file(), f"{thumb.name} missing: run tools/make_workflows.mjs"
    data = thumb.read_bytes()
    assert data[:3] == b"\xff\xd8\xff" and 5_000 < len(data) < 400_000, "thumbnail must be a small JPEG"


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_node_types_are_ours_or_core(path: Path) -> None:
    unknown = {n["type"] for n in _load(path)["nodes"]} - set(NODE_CLASS_MAPPINGS) - CORE_TYPES
    assert not unknown, f"{path.name}: node types neither TokenFuse nor ComfyUI core: {unknown}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_links_are_consistent(path: Path) -> None:
    wf = _load(path)
    nodes = {n["id"]: n for n in wf["nodes"]}
    assert len(nodes) == len(wf["nodes"]), "duplicate node ids"
    links = {}
    for link_id, src, src_slot, dst, dst_slot, kind in wf["links"]:
        assert link_id not in links, f"duplicate link id {link_id}"
        links[link_id] = (src, dst)
        out, inp = nodes[src]["outputs"][src_slot], nodes[dst]["inputs"][dst_slot]
        assert link_id in (out.get("links") or []), f"link {link_id} not in node {src}'s output {out['name']}"
        assert inp.get("link") == link_id, f"link {link_id} not on node {dst}'s input {inp['name']}"
        assert kind == out["type"] == inp["type"], f"link {link_id}: {out['type']} -> {inp['type']} as {kind}"
        for node_id, slot, side in ((src, src_slot, "out"), (dst, dst_slot, "in")):
            node_type = nodes[node_id]["type"]
            if node_type in NODE_CLASS_MAPPINGS:  # our declared types, not only what the file says
                cls = NODE_CLASS_MAPPINGS[node_type]
                if side == "out":
                    assert cls.RETURN_TYPES[slot] == kind, (node_type, slot, kind)
                else:
                    types = cls.INPUT_TYPES()
                    spec = {**types.get("required", {}), **types.get("optional", {})}[inp["name"]]
                    assert spec[0] == kind, (node_type, inp["name"], kind)
    # nothing dangles: every link a node mentions exists
    for n in wf["nodes"]:
        for inp in n.get("inputs") or []:
            assert inp.get("link") is None or inp["link"] in links, (n["id"], inp["name"])
        for out in n.get("outputs") or []:
            for link_id in out.get("links") or []:
                assert links.get(link_id, (None,))[0] == n["id"], (n["id"], out["name"], link_id)
    assert wf["last_link_id"] >= max(links) and wf["last_node_id"] >= max(nodes)


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_widget_values_fit_our_input_types(path: Path) -> None:
    for node in _load(path)["nodes"]:
        if node["type"] not in NODE_CLASS_MAPPINGS:
            continue
        spec = _widget_spec(node["type"])
        values = list(node["widgets_values"])
        # the frontend lists the widget inputs in the same order (what maps values to names)
        assert [i["name"] for i in node["inputs"] if i.get("widget")] == [s[0] for s in spec], node["type"]
        expected = len(spec) + sum(_is_seed(k, o) for _, k, o in spec)
        assert len(values) == expected, f"{node['type']}: {len(values)} widget values, INPUT_TYPES gives {expected}"
        for name, kind, opts in spec:
            value = values.pop(0)
            where = f"{path.name} node {node['id']} {node['type']}.{name}={value!r}"
            if isinstance(kind, (list, tuple)):
                if (node["type"], name) in MODEL_FILE_INPUTS:
                    assert value == "none" or str(value).endswith(MODEL_SUFFIXES), where
                else:
                    assert value in kind, f"{where} not among {kind}"
            elif kind == "BOOLEAN":
                assert isinstance(value, bool), where
            elif kind == "STRING":
                assert isinstance(value, str), where
            else:
                assert isinstance(value, (int, float)) and not isinstance(value, bool), where
                if kind == "INT":
                    assert float(value).is_integer(), where
                assert opts.get("min", value) <= value <= opts.get("max", value), f"{where} out of range"
            if _is_seed(kind, opts):
                control = values.pop(0)
                assert control in ("fixed", "increment", "decrement", "randomize"), f"{where}: control {control!r}"


def _widgets(wf: dict[str, Any], node_type: str) -> list[list[Any]]:
    return [n["widgets_values"] for n in wf["nodes"] if n["type"] == node_type]


def _named(node_type: str, values: list[Any]) -> dict[str, Any]:
    """widgets_values -> {input name: value} (seed controls skipped)."""
    out, it = {}, iter(values)
    for name, kind, opts in _widget_spec(node_type):
        out[name] = next(it)
        if _is_seed(kind, opts):
            next(it)
    return out


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_note_names_model_files_licences_and_trade_offs(path: Path) -> None:
    wf = _load(path)
    notes = _widgets(wf, "Note")
    assert len(notes) == 1, "one Note node explains the workflow"
    text = notes[0][0]
    assert "SETTINGS AND TRADE-OFFS" in text and "models/" in text
    for ckpt in (v[0] for v in _widgets(wf, "CheckpointLoaderSimple")):
        assert f"models/checkpoints/{ckpt}" in text
        assert ("Open RAIL++-M" if "xl" in ckpt.lower() else "CreativeML OpenRAIL-M") in text
    for values in _widgets(wf, "TokenFuseGFPGANEnhance"):
        assert f"models/facerestore_models/{values[0]}" in text and "Apache-2.0" in text and "TencentARC" in text
    for values in _widgets(wf, "TokenFuseScheduledFusion"):
        fusion = _named("TokenFuseScheduledFusion", values)
        for key in ("swap_model", "arcface_model"):
            if fusion[key] != "none":
                assert f"models/insightface/{fusion[key]}" in text and "non-commercial research" in text
    for values in _widgets(wf, "TokenFuseFaceDetect"):
        backend = _named("TokenFuseFaceDetect", values)["backend"]
        assert backend in text and "MIT" in text


@pytest.mark.parametrize("path", WORKFLOWS, ids=ids)
def test_every_model_with_a_download_page_is_in_the_missing_models_metadata(path: Path) -> None:
    """ComfyUI's missing-models dialog lists the `properties.models` entries ({name, url, directory}) whose name is
    one of the node's widget values (frontend 1.27 getSelectedModelsMetadata): every model file a workflow names that
    has a public download page (faces/model_sources.SOURCES, checkpoints) is there, with the address and folder the
    node's own not-found message gives."""
    from tokenfuse.faces.model_sources import SOURCES

    for node in _load(path)["nodes"]:
        listed = {m["name"]: m for m in (node.get("properties") or {}).get("models", [])}
        for value in node.get("widgets_values") or []:
            if not isinstance(value, str):
                continue
            where = f"{path.name} node {node['id']} {node['type']}: {value}"
            if value in SOURCES:
                source = SOURCES[value]
                assert value in listed, f"{where} is not in properties.models"
                assert listed[value]["url"] == source.url, where
                assert listed[value]["directory"] == source.folder, where
            elif node["type"] == "CheckpointLoaderSimple":
                assert value in listed and listed[value]["directory"] == "checkpoints", where
                assert listed[value]["url"].startswith("https://huggingface.co/"), where


def _only(wf: dict[str, Any], node_type: str) -> dict[str, Any]:
    (values,) = _widgets(wf, node_type)
    return _named(node_type, values)


def test_each_workflow_targets_its_budget() -> None:
    by = {p.stem: _load(p) for p in WORKFLOWS}
    wf = by["tokenfuse_face_refine_sd15_4gb"]
    assert _only(wf, "TokenFuseTokenSchedulerController")["preset"] == "lowvram_4gb"
    assert _only(wf, "TokenFuseScheduledFusion")["faces_per_batch"] == 1
    wf = by["tokenfuse_face_swap_sd15_6gb"]
    fusion = _only(wf, "TokenFuseScheduledFusion")
    assert _only(wf, "TokenFuseTokenSchedulerController")["preset"] == "lowvram_6gb"
    assert fusion["swap_model"].startswith("inswapper_128") and fusion["denoise"] <= 0.5
    fusion_node = next(n for n in wf["nodes"] if n["type"] == "TokenFuseScheduledFusion")
    linked = {i["name"] for i in fusion_node["inputs"] if i.get("link") is not None}
    assert {"source_image", "source_faces"} <= linked
    wf = by["tokenfuse_face_refine_sdxl_8gb"]
    assert _only(wf, "TokenFuseTokenSchedulerController")["preset"] == "lowvram_8gb"
    assert _only(wf, "TokenFuseScheduledFusion")["guide_size"] == 1024
    assert _only(wf, "TokenFuseFaceDetect")["crop_size"] == 1024
    wf = by["tokenfuse_group_photo_multiface_sd15"]
    detect = _only(wf, "TokenFuseFaceDetect")
    assert detect["max_faces"] == 0 and _only(wf, "TokenFuseScheduledFusion")["faces_per_batch"] > 1
    wf = by["tokenfuse_video_face_refine_sd15_6gb"]
    assert _only(wf, "TokenFuseTokenSchedulerController")["preset"] == "lowvram_6gb"
    video = _only(wf, "TokenFuseVideoFaceFusion")
    assert video["mode"] == "keyframes" and video["faces_per_batch"] == 2 and video["guide_size"] == 512


def test_readme_lists_every_workflow() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in WORKFLOWS if f"workflows/{p.name}" not in readme]
    assert not missing, f"README Workflows section lacks {missing}"
