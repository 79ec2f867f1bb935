"""The service's replica logic without a server: its photo prompt (batch loader, per-photo seeds). No ComfyUI
(tests/integration/test_service.py runs the real service)."""

from __future__ import annotations

from tokenfuse.faces.types import FaceSet
from tokenfuse.runner.demo import demo_prompt
from tokenfuse.service.batch_node import FRAMES_APART, FramesApart, insert_frames_apart


def test_every_fusion_gets_the_batch_faces_as_independent_photos() -> None:
    """A photo's seeds must not depend on who else is in its batch: ScheduledFusion's faces come through FramesApart,
    which marks the FaceSet's frames independent (face k of each frame: seed + k); other links stay."""
    prompt = demo_prompt()
    assert insert_frames_apart(prompt) == 1
    assert prompt["6"]["inputs"]["faces"] == ["6_apart", 0]
    assert prompt["6_apart"] == {
        "class_type": FRAMES_APART,
        "inputs": {"faces": ["3", 0]},
        "_meta": {"title": "frames apart"},
    }
    assert prompt["4"]["inputs"]["faces"] == ["3", 0] and prompt["7"]["inputs"]["faces"] == ["6", 1]
    (marked,) = FramesApart().mark(FaceSet((8, 8), ((), ())))
    assert marked.independent_frames and marked.batch_size == 2
