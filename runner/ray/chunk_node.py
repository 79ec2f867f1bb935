"""The runner-only node a Ray worker's embedded ComfyUI runs for one time chunk of a video workflow (never in the
pack's NODE_CLASS_MAPPINGS; RunnerWorker registers it, like the demo's model loader).

It stands in for VideoFaceFusion in the per-chunk prompt (runner/ray/workflow_chunks.chunk_prompt) with the same inputs
but `face_tracks`, plus `job`: the name under which the worker put the driver's whole-video tracks, the chunk and
every frame's pts (`JOBS`, filled by RunnerWorker.run_chunk just before it executes the prompt: large arrays do not
belong in a prompt). It runs the same video fusion function VideoFaceFusion runs (nodes/video_fusion.py) with that
window, so a chunk samples through exactly the code a whole-video run uses, and writes the chunk (video only) to the
job's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK_NODE = "TokenFuseRunnerVideoChunk"


@dataclass
class ChunkJob:
    """What the chunk node needs besides its prompt inputs; `stats` is filled by the node (video.fuse_pass
    VideoStats)."""

    tracks: Any
    chunk: Any
    pts: list[int | None]
    out_path: Path
    stats: Any = None
    report: str = ""


JOBS: dict[str, ChunkJob] = {}


class RunnerVideoChunk:
    """Runner-only node: a video fusion run on frames [chunk.start, chunk.stop) given the driver's tracks."""

    DESCRIPTION = "Runner-only: one time chunk of VideoFaceFusion under `run --ray` (written to the runner's file)."
    CATEGORY = "TokenFuse/runner"
    FUNCTION = "fuse_chunk"
    OUTPUT_NODE = True
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("report",)
    OUTPUT_TOOLTIPS = ("VideoFaceFusion's report for this chunk.",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        from ...nodes import video_fusion

        spec = video_fusion.input_types()
        required = {k: v for k, v in spec["required"].items() if k != "face_tracks"}
        required["job"] = ("STRING", {"default": "", "tooltip": "The runner's name for this chunk's job."})
        return {"required": required, "optional": spec["optional"]}

    def fuse_chunk(self, job: str, **inputs: Any) -> dict[str, Any]:
        from ...nodes import video_fusion
        from ...nodes.checks import check_inputs, refuse_undeclared

        if job not in JOBS:
            raise KeyError(f"no runner chunk job {job!r} in this worker (the node runs only under `run --ray`)")
        spec = self.INPUT_TYPES()  # the checks VideoFaceFusion's inputs get (nodes/checks.py)
        refuse_undeclared(type(self), {"job": job, **inputs}, spec)
        check_inputs(type(self), {"job": job, **inputs}, ("swap_model", "arcface_model"), spec)
        j = JOBS[job]
        links, widgets, swap_model, arcface_model = video_fusion.split_inputs(face_tracks=j.tracks, **inputs)
        run = video_fusion.fuse_video_run(
            links, widgets, (swap_model, arcface_model), None, str(j.out_path), (j.chunk, j.pts)
        )
        j.stats, j.report = run.stats, run.report
        return {"ui": {"text": [run.report]}, "result": (run.report,)}
