"""`run workflows/tokenfuse_video_face_refine_sd15_6gb.json --ray` on real ComfyUI: the shipped video workflow
(converted with the workers' node definitions; its checkpoint loader and text encoders replaced by the runner's
demo loader, the small trained face model; 2 steps, guide 64, lossless x264) on a 105-frame clip with a face, a
faceless scene cut-in, the face mirrored and AAC audio, over a local 2-worker Ray cluster (CPU).

The chunked run (3 chunks on 2 workers, one worker killed while it writes its chunk) gives the frames of a
one-worker run of the whole video (the same workflow through ComfyUI's FaceTrack, faces_per_batch 1 as chunked
mode sets it) frame for frame, with the input's timestamps and audio packets. Skips without Ray or ComfyUI."""

from __future__ import annotations

import glob
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-scale.txt")

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "workflows" / "tokenfuse_video_face_refine_sd15_6gb.json"
# A RunnerWorker writes a chunk to this temporary name (video/encode.temp_path) while fusing it, in its folder under
# the pool's scratch folder (RayPool.scratch)
PARTS = f"{tempfile.gettempdir()}/tokenfuse_ray_*/tokenfuse_worker_*/files/.chunk_*.mp4.*.part"


def demo_video_prompt(defs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The shipped video workflow as an API prompt on the demo models (module docstring)."""
    from tokenfuse.runner.demo import DEMO_LOADER
    from tokenfuse.runner.on_comfyui.convert import ui_to_api

    prompt = ui_to_api(json.loads(WORKFLOW.read_text(encoding="utf-8")), defs)
    kinds = {nid: n["class_type"] for nid, n in prompt.items()}
    ckpt = next(n for n, k in kinds.items() if k == "CheckpointLoaderSimple")
    fusion = next(n for n, k in kinds.items() if k == "TokenFuseVideoFaceFusion")
    track = next(n for n, k in kinds.items() if k == "TokenFuseFaceTrack")
    text = {prompt[fusion]["inputs"]["positive"][0]: 1, prompt[fusion]["inputs"]["negative"][0]: 2}
    for nid in text:
        del prompt[nid]
    prompt[ckpt] = {"class_type": DEMO_LOADER, "inputs": {}}
    for node in prompt.values():
        for name, value in node["inputs"].items():
            if isinstance(value, list) and len(value) == 2:
                if value[0] in text:
                    node["inputs"][name] = [ckpt, text[value[0]]]
                elif value[0] == ckpt:  # MODEL 0 stays, VAE 2 -> 3
                    node["inputs"][name] = [ckpt, 3 if value[1] == 2 else value[1]]
    prompt[fusion]["inputs"].update(
        steps=2, cfg=1.0, denoise=0.5, guide_size=64, crf=0, preset="ultrafast", faces_per_batch=1
    )
    prompt[track]["inputs"].update(detect_size=160)
    sched = next(n for n, k in kinds.items() if k == "TokenFuseTokenSchedulerController")
    prompt[sched]["inputs"]["schedule_text"] = "telemetry_jsonl: video.jsonl"  # one file per video run / per chunk
    return prompt


def rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "report.jsonl").read_text().splitlines()]


def test_video_workflow_chunked_equals_one_worker(comfyui_path: Path, tmp_path: Path) -> None:
    from tokenfuse.runner.items import expand, item_slot
    from tokenfuse.runner.ray.cluster import _alive
    from tokenfuse.runner.ray.dispatch import run_items_ray
    from tokenfuse.runner.ray.pool import RayPool
    from tokenfuse.runner.ray.worker import WorkerSpec
    from tokenfuse.runner.ray.workflow_video import run_workflow_videos_ray
    from tokenfuse.runner.run import RunTarget, Workflow
    from video_clips import audio_packets, cut_clip, read_frames, video_pts

    (tmp_path / "in").mkdir()
    clip = cut_clip(tmp_path / "in", face_frames=60)
    killed: list[bool] = []
    before = set(glob.glob(PARTS))

    def kill_when_writing(actor: Any) -> None:
        deadline = time.monotonic() + 300
        while not set(glob.glob(PARTS)) - before and time.monotonic() < deadline:
            time.sleep(0.01)
        killed.append(bool(set(glob.glob(PARTS)) - before))
        ray.kill(actor, no_restart=True)

    def kill_chunk1(job: Any, actor: Any, attempt: int) -> None:
        if isinstance(job, tuple) and job[1].index == 1 and attempt == 1:
            threading.Thread(target=kill_when_writing, args=(actor,), daemon=True).start()

    pool = None
    try:
        pool = RayPool("local", 2, WorkerSpec(comfyui=str(comfyui_path), cpu=True, sdpa=True, demo=True))
        prompt = demo_video_prompt(pool.node_defs())
        slot = item_slot(prompt, set())
        items = expand([clip])
        one = run_items_ray(pool, Workflow(prompt, slot, {}, items), RunTarget(tmp_path / "one", progress=False))
        chunked = run_workflow_videos_ray(
            pool,
            Workflow(prompt, slot, {}, items),
            RunTarget(tmp_path / "chunked", progress=False),
            chunks=3,
            on_dispatch=kill_chunk1,
        )
    finally:
        if pool is not None:
            pool.close()
        ray.shutdown()
    assert one.exit_code == 0 and chunked.exit_code == 0, (one.failures, chunked.failures)
    (ref,) = rows(tmp_path / "one")
    (row,) = rows(tmp_path / "chunked")
    assert row["route"] == "chunks: 3 on 2 worker(s)" and row["faces_per_batch"] == 1, row
    assert [c["index"] for c in row["chunks"]] == [0, 1, 2] and len(row["workers"]) >= 2, row  # each chunk once
    assert killed == [True], "chunk 1's worker was killed while a chunk was being written"
    assert row["chunks"][1]["attempts"] == 2 and "worker lost" in row["chunks"][1]["retried"][0], row
    assert row["join"] == "copied" and row["frames"] == 105 and row["diffusion_runs"] > 0, row
    assert row["tracks"] == 2 and row["cuts"] >= 2, row
    out, *chunk_jsonl = row["outputs"]
    ref_out, ref_jsonl = ref["outputs"]
    # each chunk's telemetry comes back with the video (a worker's output folder goes with the pool's scratch)
    assert [Path(p).relative_to(tmp_path / "chunked") for p in chunk_jsonl] == [
        Path(clip.stem) / "tokenfuse" / f"video.chunk{i}.jsonl" for i in range(3)
    ], row["outputs"]
    # the workflow's SaveVideo writes into tokenfuse/ too: the item's files share it, so they are filed flat
    assert Path(ref_jsonl).relative_to(tmp_path / "one") == Path(clip.stem) / "video.jsonl"
    runs = [json.loads(Path(p).read_text().splitlines()[-1])["summary"] for p in (*chunk_jsonl, ref_jsonl)]
    assert all(r["status"] == "complete" for r in runs), runs
    assert sum(r["runs"] for r in runs[:3]) == row["diffusion_runs"] and runs[3]["runs"] > 0, (runs, row)
    assert Path(out).name == Path(ref_out).name  # named as the workflow's SaveVideo names it
    frames, expected, source = read_frames(Path(out)), read_frames(Path(ref_out)), read_frames(clip)
    assert len(frames) == len(expected) == len(source) == 105
    same = [bool(np.array_equal(a, b)) for a, b in zip(expected, frames, strict=True)]
    assert all(same), f"chunked != one-worker at frames {[i for i, s in enumerate(same) if not s]}"
    changed = [int(np.abs(a.astype(int) - b.astype(int)).max()) for a, b in zip(source, frames, strict=True)]
    assert max(changed[:60]) > 32, changed  # the faces were refined (lossless: the rest is YUV round trip)
    assert video_pts(Path(out))[0] == video_pts(clip)[0] == video_pts(Path(ref_out))[0]
    assert audio_packets(Path(out)) == audio_packets(clip)
    # the joined file's "prompt" tag is the workflow as SaveVideo embeds it in the one-worker run, the loader naming
    # the input file instead of the worker's staged copy (never the workers' chunk prompt)
    with av.open(out) as a, av.open(ref_out) as b:
        joined, single = json.loads(a.metadata["prompt"]), json.loads(b.metadata["prompt"])
    assert joined[slot]["inputs"].pop("file") == clip.name and single[slot]["inputs"].pop("file").endswith(clip.name)
    for node in single.values():  # ComfyUI's executor records its cache key (the staged file's mtime) in the prompt
        node.pop("is_changed", None)
    assert joined == single
    assert pool.pids and not any(_alive(p) for p in pool.pids), "close() left a worker process"
    assert pool.scratch is not None and not pool.scratch.exists()  # the killed worker's folder went with it
