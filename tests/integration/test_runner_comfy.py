"""The headless runner (runner/) against a real ComfyUI checkout: UI->API conversion of every example workflow
checked by ComfyUI's own validate_prompt (and equal to the real frontend's graphToPrompt when Node, Chromium and
playwright-core are present), every example workflow executed through the runner's item loop on the embedded
engine, the `python <pack> run` command line end to end (--demo, --resume, a bad item, exit codes, Ctrl-C), and
`--server` against a real ComfyUI server.

Substitutions for execution as in test_workflows_comfy.py (no real weights here): CheckpointLoaderSimple ->
a loader returning a seeded random-weight U-Net / SD VAE / conditioning stand-in, registered in this test process;
GFPGAN / inswapper / ArcFace model files with random weights of the real layouts; sizes shrunk for CPU (steps 1,
guide 64). Random weights check that the graphs run, never image quality.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
# The photo workflows (LoadImage items); the video workflow runs through test_workflows_comfy.py and
# test_video_server.py, and video items through the runner in test_video_items_through_a_loadvideo_workflow.
WORKFLOWS = sorted(p for p in (REPO / "workflows").glob("*.json") if "_video_" not in p.name)
SHRINK = [
    "--set",
    "fuse.steps=1",
    "--set",
    "fuse.guide_size=64",
    "--set",
    "fuse.max_size=64",
    "--set",
    "detect.crop_size=64",
]


@pytest.fixture(scope="module")
def engine(comfy: SimpleNamespace, random_model: Any, tmp_path_factory: pytest.TempPathFactory):
    """The runner's EmbeddedComfy with the test checkpoint loader and random-weight model files (module docstring)."""
    import folder_paths
    import torch
    from spandrel.architectures.GFPGAN import GFPGAN
    from test_swap import make_arcface, make_inswapper
    from test_workflows_comfy import TEST_LOADER, _ClipStandIn
    from tokenfuse.devkit import comfy_models
    from tokenfuse.nodes.glue import paths
    from tokenfuse.runner.embedded import EmbeddedComfy

    root = tmp_path_factory.mktemp("runner_models")
    for sub in ("facerestore", "insightface"):
        (root / sub).mkdir()
    torch.manual_seed(0)
    torch.save(
        {k: v.contiguous() for k, v in GFPGAN(different_w=True, sft_half=True).state_dict().items()},
        root / "facerestore" / "GFPGANv1.4.pth",
    )
    make_inswapper(root / "insightface" / "inswapper_128.onnx")
    make_arcface(root / "insightface" / "w600k_r50.onnx")
    paths.model_dirs("facerestore_models")  # registers the folder names with folder_paths
    paths.model_dirs("insightface")
    folder_paths.add_model_folder_path(paths.FACERESTORE_FOLDER, str(root / "facerestore"))
    folder_paths.add_model_folder_path("insightface", str(root / "insightface"))
    vae = comfy_models.build_vae(ch=32, seed=0)

    class RandomCheckpoint:
        RETURN_TYPES = ("MODEL", "CLIP", "VAE")
        FUNCTION = "load_checkpoint"
        CATEGORY = "testing"

        @classmethod
        def INPUT_TYPES(cls) -> dict:
            return {"required": {"ckpt_name": ("STRING", {"default": ""})}}

        def load_checkpoint(self, ckpt_name: str) -> tuple:
            family = "sdxl" if "xl" in ckpt_name.lower() else "sd15"
            return random_model(family), _ClipStandIn(family, comfy.models), vae

    saved = (folder_paths.get_input_directory(), folder_paths.get_output_directory(), folder_paths.get_temp_directory())
    eng = EmbeddedComfy(comfy.path, cpu=True, sdpa=True, extra_nodes={TEST_LOADER: RandomCheckpoint})
    try:
        yield eng
    finally:
        eng.close()
        comfy.nodes.NODE_CLASS_MAPPINGS.pop(TEST_LOADER, None)
        folder_paths.set_input_directory(saved[0])
        folder_paths.set_output_directory(saved[1])
        folder_paths.set_temp_directory(saved[2])


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    import shutil

    import cv2
    import insightface
    from skimage import data

    root = tmp_path_factory.mktemp("runner_photos")
    astronaut = data.astronaut()[:, :, ::-1]
    cv2.imwrite(str(root / "astronaut.png"), astronaut)
    cv2.imwrite(str(root / "mirrored.jpg"), np.ascontiguousarray(astronaut[:, ::-1]))
    shutil.copy(Path(insightface.__file__).parent / "data" / "images" / "t1.jpg", root / "group.jpg")
    return SimpleNamespace(
        root=root, astronaut=root / "astronaut.png", mirrored=root / "mirrored.jpg", group=root / "group.jpg"
    )


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_converted_workflow_validates_in_comfyui(engine: Any, path: Path) -> None:
    """Our UI->API conversion, fed to ComfyUI's own validate_prompt (model files swapped for the test loader)."""
    import execution
    from test_workflows_comfy import _substitute
    from tokenfuse.runner.convert import ui_to_api

    prompt = ui_to_api(json.loads(path.read_text(encoding="utf-8")), engine.node_defs())
    wf = json.loads(path.read_text(encoding="utf-8"))
    assert {k: v["class_type"] for k, v in prompt.items()} == {
        str(n["id"]): n["type"] for n in wf["nodes"] if n["type"] != "Note"
    }
    staged = _substitute(prompt)
    # loaders point at files of the saved workflow: stage a photo under every such name
    import cv2
    from skimage import data

    for node in staged.values():
        if node["class_type"] == "LoadImage":
            cv2.imwrite(str(engine.work / "input" / node["inputs"]["image"]), data.astronaut()[:, :, ::-1])
    valid, error, outputs, node_errors = asyncio.run(execution.validate_prompt(path.stem, staged, None))
    assert valid, (error, node_errors)
    assert outputs


def test_conversion_equals_real_frontend(engine: Any, browser_tools: Any, comfy_server: SimpleNamespace) -> None:
    """Same API prompt as the real frontend's app.graphToPrompt for every example workflow (skips without browser)."""
    from tokenfuse.runner.convert import ui_to_api

    node, env = browser_tools
    out = subprocess.run(
        [node, str(REPO / "tools" / "make_workflows.mjs"), "check", comfy_server.url, str(REPO / "workflows")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)["results"]
    defs = engine.node_defs()
    for path in WORKFLOWS:
        ours = ui_to_api(json.loads(path.read_text(encoding="utf-8")), defs)
        theirs = results[path.name]["prompt"]
        assert {k: v["inputs"] for k, v in ours.items()} == {k: v["inputs"] for k, v in theirs.items()}, path.name


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_every_workflow_runs_through_the_runner(
    engine: Any, photos: SimpleNamespace, path: Path, tmp_path: Path
) -> None:
    from test_workflows_comfy import _substitute
    from tokenfuse.runner.cli import apply_sets
    from tokenfuse.runner.convert import ui_to_api
    from tokenfuse.runner.items import expand, item_slot, resolve
    from tokenfuse.runner.run import run_items

    prompt = _substitute(ui_to_api(json.loads(path.read_text(encoding="utf-8")), engine.node_defs()))
    apply_sets(prompt, ["TokenFuseScheduledFusion.steps=1"])
    constants = {}
    if "swap" in path.stem:
        constants[resolve(prompt, "source_face")] = photos.mirrored
    slot = item_slot(prompt, set(constants))
    item = photos.group if "group" in path.stem else photos.astronaut
    summary = run_items(engine, prompt, slot, constants, expand([item]), tmp_path, progress=False)
    assert summary.exit_code == 0, summary.failures
    (row,) = [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    assert row["status"] == "ok" and row["faces"] == (3 if "group" in path.stem else 1), row
    assert row["time_s"] > 0 and row["peak_memory_mib"] > 0
    (out,) = row["outputs"]
    assert Path(out).parent == tmp_path / item.stem and Path(out).stat().st_size > 0


def _cli(args: list[str], cwd: Path, **kw: Any) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMFYUI_PATH": os.environ["COMFYUI_PATH"], "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(REPO), "run", *args], cwd=cwd, env=env, capture_output=True, text=True, **kw
    )


def test_cli_demo_folder_bad_item_resume(comfyui_path: Path, photos: SimpleNamespace, tmp_path: Path) -> None:
    """`python <pack> run --demo` on a folder with one good photo and one broken file: exit 1, the good item's
    fused photo written, the bad one reported; --resume then skips the good one and retries only the bad one."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a_astronaut.png").write_bytes(photos.astronaut.read_bytes())
    (folder / "b_broken.png").write_bytes(b"not a png at all")
    out = tmp_path / "out"
    res = _cli(["--demo", str(folder), "-o", str(out), "--cpu", "--quiet", *SHRINK], tmp_path, timeout=600)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "1 ok, 1 failed" in res.stderr and "b_broken.png" in res.stderr
    rows = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "failed"], rows
    assert rows[0]["faces"] == 1 and rows[0]["fallbacks"] == [] and "LoadImage" in rows[1]["error"]
    fused = sorted((out / "a_astronaut").glob("*.png"))
    assert len(fused) == 1
    from PIL import Image

    a = np.asarray(Image.open(fused[0]).convert("RGB")).astype(int)
    b = np.asarray(Image.open(photos.astronaut).convert("RGB")).astype(int)
    changed = np.abs(a - b).max(axis=2) > 8
    assert a.shape == b.shape and 0 < changed.mean() < 0.5, changed.mean()

    again = _cli(
        ["--demo", str(folder), "-o", str(out), "--cpu", "--quiet", "--resume", *SHRINK], tmp_path, timeout=600
    )
    assert again.returncode == 1 and "0 ok, 1 failed, 1 skipped" in again.stderr, again.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "failed", "failed"]


def test_cli_usage_errors(comfyui_path: Path, tmp_path: Path) -> None:
    wf = WORKFLOWS[0]
    res = _cli([str(wf), str(tmp_path / "missing.png"), "--cpu"], tmp_path, timeout=300)
    assert res.returncode == 2 and "input not found" in res.stderr, res.stderr[-2000:]
    swap = next(p for p in WORKFLOWS if "swap" in p.stem)
    (tmp_path / "x.png").write_bytes(b"")
    res = _cli([str(swap), str(tmp_path / "x.png"), "--cpu"], tmp_path, timeout=300)
    assert res.returncode == 2 and "bind all but one with --input" in res.stderr, res.stderr[-2000:]


def test_cli_ctrl_c_stops_cleanly(comfyui_path: Path, photos: SimpleNamespace, tmp_path: Path) -> None:
    """SIGINT during sampling: ComfyUI's interrupt stops the item, the report says interrupted, exit 130; the
    item is not marked done (so --resume redoes it)."""
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(REPO), "run", "--demo", str(photos.astronaut), "-o", str(out), "--cpu", "--quiet"]
    cmd += ["--set", "fuse.steps=50", "--set", "fuse.guide_size=64", "--set", "fuse.max_size=64", "-v"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until sampling has started
            lines.append(line)
            if "Requested to load BaseModel" in line or "loaded completely" in line and "BaseModel" in "".join(lines):
                break
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + rest
    assert proc.returncode == 130, text[-3000:]
    (row,) = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert row["status"] == "interrupted", row


def test_cli_against_server(comfy_server: SimpleNamespace, photos: SimpleNamespace, tmp_path: Path) -> None:
    """--server: a FaceDetect workflow (no checkpoint needed) on a list file of two photos over the HTTP API."""
    wf = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "x.png"}, "_meta": {"title": "photo"}},
        "2": {
            "class_type": "TokenFuseFaceDetect",
            "inputs": {"image": ["1", 0], "backend": "retinaface", "crop_size": 128},
        },
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 1], "filename_prefix": "runner_test"}},
    }
    from tokenfuse.runner.client import ServerComfy
    from tokenfuse.runner.demo import fill_defaults

    prompt = fill_defaults(copy.deepcopy(wf), ServerComfy(comfy_server.url).node_defs())
    (tmp_path / "wf.json").write_text(json.dumps(prompt))
    (tmp_path / "list.txt").write_text(f"{photos.astronaut}\n# a comment\n\n{photos.group}\n")
    out = tmp_path / "out"
    res = _cli(
        [str(tmp_path / "wf.json"), str(tmp_path / "list.txt"), "-o", str(out), "--server", comfy_server.url],
        tmp_path,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert [(r["name"], r["status"]) for r in rows] == [("astronaut", "ok"), ("group", "ok")]
    for r in rows:
        (f,) = r["outputs"]
        assert Path(f).parent == out / r["name"] and Path(f).read_bytes()[:4] == b"\x89PNG"


def _make_clip(path: Path, frames: int = 12) -> None:
    """A 64x64 H.264 clip at 12 fps with a mono AAC sine track (PyAV, as ComfyUI's video nodes use)."""
    import av

    with av.open(str(path), "w") as out:
        v = out.add_stream("libx264", rate=12)
        v.width, v.height, v.pix_fmt = 64, 64, "yuv420p"
        a = out.add_stream("aac", rate=16000)
        a.layout = "mono"
        for k in range(frames):
            img = np.full((64, 64, 3), 20 * k % 255, np.uint8)
            for packet in v.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in v.encode(None):
            out.mux(packet)
        t = np.arange(16000, dtype=np.float32) / 16000
        samples = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None]
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in a.encode(frame):
            out.mux(packet)
        for packet in a.encode(None):
            out.mux(packet)


def test_video_items_through_a_loadvideo_workflow(engine: Any, tmp_path: Path) -> None:
    """Video items go to a LoadVideo workflow (ComfyUI's core LoadVideo -> SaveVideo, UI format converted by the
    runner): every frame and the audio track come out in the item's folder."""
    import av
    from tokenfuse.runner.convert import ui_to_api
    from tokenfuse.runner.items import expand, item_slot
    from tokenfuse.runner.run import run_items

    (tmp_path / "clips").mkdir()
    _make_clip(tmp_path / "clips" / "one.mp4")
    _make_clip(tmp_path / "clips" / "two.mp4", frames=8)
    ui = {
        "nodes": [
            {"id": 1, "type": "LoadVideo", "widgets_values": ["x.mp4", "image"], "outputs": [{"links": [1]}]},
            {
                "id": 2,
                "type": "SaveVideo",
                "inputs": [{"name": "video", "link": 1, "type": "VIDEO"}],
                "widgets_values": ["video/runner", "auto", "auto"],
            },
        ],
        "links": [[1, 1, 0, 2, 0, "VIDEO"]],
    }
    prompt = ui_to_api(ui, engine.node_defs())
    assert prompt["2"]["inputs"] == {
        "video": ["1", 0],
        "filename_prefix": "video/runner",
        "format": "auto",
        "codec": "auto",
    }
    items = expand([tmp_path / "clips"])
    summary = run_items(engine, prompt, item_slot(prompt, set()), {}, items, tmp_path / "out", progress=False)
    assert summary.exit_code == 0, summary.failures
    rows = [json.loads(line) for line in (tmp_path / "out" / "report.jsonl").read_text().splitlines()]
    assert [(r["name"], r["kind"], r["status"]) for r in rows] == [("one", "video", "ok"), ("two", "video", "ok")]
    for r, frames in zip(rows, (12, 8), strict=True):
        (f,) = r["outputs"]
        with av.open(f) as c:
            assert sum(1 for _ in c.decode(video=0)) == frames
            assert len(c.streams.audio) == 1
