"""Issue 13 through a real ComfyUI server: prompts cannot make the pack write or probe outside its folders.

Telemetry: `schedule_text` with a path (absolute or climbing) is refused with the pack's error and nothing is created;
a bare name lands in the server's output/tokenfuse/. Model names: FaceDetect's `model_name` cannot leave the model
folders, and an existing file outside them gets the same message as a missing one (no probing the disk).
Reuses test_fusion_server's server (this pack + a random-weight checkpoint node).
Run: COMFYUI_PATH=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/integration/test_security_server.py
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from comfy_http import http_json, wait_history
from test_fusion_server import fusion_server  # noqa: F401  (the module-scoped server fixture)

pytestmark = pytest.mark.integration


def _sampling_prompt(schedule_text: str) -> dict:
    return {
        "1": {"class_type": "TokenFuseTestRandomCheckpoint", "inputs": {"ckpt_name": "random-sd15"}},
        "2": {
            "class_type": "TokenFuseTokenSchedulerController",
            "inputs": {
                "model": ["1", 0],
                "preset": "balanced",
                "strategy": "preset",
                "ratio": 0.0,
                "schedule_text": schedule_text,
            },
        },
        "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "a face", "clip": ["1", 1]}},
        "5": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["2", 0],
                "seed": 0,
                "steps": 1,
                "cfg": 1.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "positive": ["4", 0],
                "negative": ["4", 0],
                "latent_image": ["3", 0],
                "denoise": 1.0,
            },
        },
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "PreviewImage", "inputs": {"images": ["6", 0]}},
    }


def _detect_prompt(model_name: str) -> dict:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": "tf_portrait.png"}},
        "2": {
            "class_type": "TokenFuseFaceDetect",
            "inputs": {
                "image": ["1", 0],
                "backend": "yunet",
                "score_threshold": 0.5,
                "order": "large-small",
                "indices": "",
                "max_faces": 0,
                "min_face_size": 0,
                "crop_size": 128,
                "crop_factor": 1.0,
                "detect_size": 320,
                "device": "cpu",
                "model_name": model_name,
            },
        },
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 1]}},
    }


def _run(server: SimpleNamespace, prompt: dict) -> tuple[str, str]:
    """(status_str, the execution error's message or "")."""
    answer = http_json(f"{server.url}/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert not answer.get("node_errors"), answer
    entry = wait_history(server.url, answer["prompt_id"])
    message = ""
    for kind, data in entry["status"].get("messages", []):
        if kind == "execution_error":
            message = str(data.get("exception_message", ""))
    return entry["status"]["status_str"], message


def test_telemetry_paths_from_a_prompt_write_nothing_outside_the_output_folder(fusion_server: SimpleNamespace) -> None:  # noqa: F811
    outside = Path("/tmp") / f"tokenfuse_escape_{uuid.uuid4().hex}"
    for name in (str(outside / "evil.jsonl"), "../../escape.jsonl", "sub/dir.jsonl"):
        status, message = _run(fusion_server, _sampling_prompt(json.dumps({"telemetry_jsonl": name})))
        assert status == "error" and "bare file name" in message, (name, status, message)
    assert not outside.exists()
    assert (
        not list(fusion_server.base.parent.glob("escape.jsonl")) and not (fusion_server.base / "escape.jsonl").exists()
    )

    status, message = _run(fusion_server, _sampling_prompt(json.dumps({"telemetry_jsonl": "tf_run.jsonl"})))
    assert status == "success", message
    written = fusion_server.base / "output" / "tokenfuse" / "tf_run.jsonl"
    summary = json.loads(written.read_text(encoding="utf-8").splitlines()[-1])["summary"]
    assert summary["calls"] > 0


def test_model_names_cannot_leave_the_model_folders_or_probe_the_disk(fusion_server: SimpleNamespace) -> None:  # noqa: F811
    messages = {}
    for name in ("../../../../../../etc/passwd", "../../../../../../etc/no_such_file_tf"):
        status, message = _run(fusion_server, _detect_prompt(name))
        assert status == "error", (name, message)
        messages[name] = message.replace(name, "<name>")
    existing, missing = messages.values()
    assert existing == missing, messages  # the same answer whether the file exists or not
    assert "facedetection" in existing and len(existing) < 700
    status, message = _run(fusion_server, _detect_prompt("/etc/passwd"))
    assert status == "error" and "absolute path" in message and "TOKENFUSE_ALLOW_ABSOLUTE_MODEL_PATHS" in message, (
        message
    )


@pytest.mark.parametrize(
    ("schedule_text", "message"),
    [
        ('{"end_percent": ' + "9" * 4000 + "}", "Schedule field 'end_percent' must be a number in [0.0, 1.0]"),
        ("end_percent: " + "9" * 4000, "Schedule field 'end_percent' must be a number in [0.0, 1.0]"),
        ("- " * 8000 + "x", "schedule text is nested too deep to read"),
        (
            '{"ratios": {"8": 0.5},\n "end_percent" 0.6}',
            "Expecting ':' delimiter at line 2, column 16. A valid example",
        ),
    ],
    ids=["json 4000 digits", "yaml 4000 digits", "yaml nested 8000 deep", "json syntax"],
)
def test_raw_schedule_text_errors_are_the_packs_and_short_in_the_log(
    fusion_server: SimpleNamespace,  # noqa: F811
    schedule_text: str,
    message: str,
) -> None:
    """Issue 34 item 5: a 4 000-digit end_percent gave a raw OverflowError; a YAML list nested 8 000 deep wrote a
    ~196 KB chained traceback into the server log for every such prompt. Now each ends in the pack's ScheduleError,
    and the prompt adds a few KB to the log at most."""
    before = fusion_server.log.stat().st_size
    status, got = _run(fusion_server, _sampling_prompt(schedule_text))
    assert status == "error" and message in got and len(got) < 400, (status, got[:500])
    grown = fusion_server.log.stat().st_size - before
    assert grown < 20_000, f"the server log grew {grown} bytes for one prompt"


def test_an_arcface_file_that_is_not_onnx_is_named_by_its_name_only(
    fusion_server: SimpleNamespace,  # noqa: F811
    shared_assets: Path,
) -> None:
    """Issue 34 item 5: a recognition model that is not ONNX showed onnxruntime's raw text ("[ONNXRuntimeError] : 7 :
    INVALID_PROTOBUF : Load model from <the server's full path> failed") to whoever queued the prompt. Now the pack's
    message names the file by its name and the fix, as the swap model's does."""
    assets = shared_assets / "scrfd_500m_bnkps.onnx"  # the real SCRFD detector: the pack's detector loads
    pack = fusion_server.base / "models" / "insightface" / "models" / "tf_badpack"
    pack.mkdir(parents=True, exist_ok=True)
    (pack / "det_500m.onnx").write_bytes(assets.read_bytes())
    (pack / "w600k_r50.onnx").write_bytes(b"not an onnx model" * 10)
    prompt = _detect_prompt("tf_badpack")
    prompt["2"]["inputs"]["backend"] = "insightface"
    status, message = _run(fusion_server, prompt)
    assert status == "error" and message.startswith("could not load the ArcFace model w600k_r50.onnx: the file is"), (
        message
    )
    assert "PROTOBUF" not in message.upper() and str(fusion_server.base) not in message, message
