"""The service's replica logic without a server: its photo prompt (batch loader, per-photo seeds), per-request report
rows. No ComfyUI (tests/integration/test_service.py runs the real service)."""

from __future__ import annotations

from tokenfuse.faces.types import FaceSet
from tokenfuse.fusion.fallback import FaceReport, format_report
from tokenfuse.runner.demo import demo_prompt
from tokenfuse.runner.report import frame_report, summarize_texts
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


def _report(passthrough_frame: int) -> str:
    """ScheduledFusion's report of a 2-photo batch, one face each; the face of `passthrough_frame` fell back twice and
    passed through."""
    reports = []
    for frame in range(2):
        r = FaceReport(frame=frame, index=0, seed=0, context_side=128, tokens=256, time_s=0.5 + frame)
        if frame == passthrough_frame:
            r.add("smaller_guide", "out of memory")
            r.status = "passthrough"
        reports.append(r)
    return format_report(reports, "ScheduledFusion: 2 face(s) in 2 frame(s)")


def test_a_frame_report_counts_its_own_fallbacks_and_pass_throughs() -> None:
    """Each request's row counts from its own frame's face lines (the batch's summary line is the whole batch's)."""
    text = _report(passthrough_frame=1)
    first, second = (summarize_texts({"6": frame_report(text, f, as_frame=0)}) for f in (0, 1))
    assert (first["faces"], first["faces_with_fallbacks"], first["faces_passed_through"]) == (1, 0, 0)
    assert (second["faces"], second["faces_with_fallbacks"], second["faces_passed_through"]) == (1, 1, 1)
    assert second["fallbacks"] == ["frame 0 face 0: passthrough: smaller_guide: out of memory"]
    own = frame_report(text, 1, as_frame=0).splitlines()
    assert own[0].startswith("frame 0 face 0: passthrough") and own[-1].endswith("1.50 s total")
    assert frame_report("no summary here\nframe 0 face 0: x", 0) == "frame 0 face 0: x"
