"""`run --demo`: the checkpoint variant of its graph, the hint that names the option, and the contact sheet written
beside its output (runner/demo.py, runner/demo_sheet.py). The whole command against a real ComfyUI with a
random-weight SD1.5 checkpoint file: tests/integration/test_runner_comfy.py::test_cli_demo_with_a_checkpoint."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import cv2
import numpy as np
import pytest
from tokenfuse.runner import demo, demo_sheet
from tokenfuse.runner.cli import main
from tokenfuse.runner.errors import WorkflowError


def _defs(*names: str) -> dict:
    return {"CheckpointLoaderSimple": {"input": {"required": {"ckpt_name": [list(names), {}]}}}}


def test_checkpoint_graph_loads_the_named_file_with_a_text_prompt() -> None:
    prompt = demo.demo_prompt(checkpoint="my_sd15.safetensors", plan_image=True)
    assert prompt["1"]["class_type"] == "CheckpointLoaderSimple"
    assert prompt["1"]["inputs"]["ckpt_name"] == "my_sd15.safetensors"
    assert not any(n["class_type"] == demo.DEMO_LOADER for n in prompt.values())
    fuse = prompt["6"]["inputs"]
    assert fuse["vae"] == ["1", 2] and fuse["positive"] == ["10", 0] and fuse["negative"] == ["11", 0]
    assert {prompt[k]["class_type"] for k in ("10", "11")} == {"CLIPTextEncode"}
    assert fuse["guide_size"] == demo.CHECKPOINT_SETTINGS["guide_size"] and fuse["cfg"] > 1
    assert prompt["9"]["inputs"] == {"images": ["4", 1], "filename_prefix": demo.PLAN_PREFIX}
    # the test model's graph is unchanged without the options (serve --demo uses it)
    plain = demo.demo_prompt()
    assert plain["1"]["class_type"] == demo.DEMO_LOADER and "9" not in plain and plain["6"]["inputs"]["cfg"] == 1.0


def test_an_unknown_checkpoint_is_refused_with_the_files_there() -> None:
    demo.check_checkpoint("a.safetensors", _defs("a.safetensors", "b.ckpt"))
    with pytest.raises(WorkflowError, match=r"'c.safetensors': no such file .*found: a.safetensors, b.ckpt"):
        demo.check_checkpoint("c.safetensors", _defs("a.safetensors", "b.ckpt"))
    with pytest.raises(WorkflowError, match="found: none"):
        demo.check_checkpoint("c.safetensors", {})


def test_the_hint_names_the_option_only_when_checkpoints_exist() -> None:
    hint = demo.checkpoint_hint(_defs("v1-5-pruned-emaonly-fp16.safetensors"))
    assert hint is not None and "run --demo --checkpoint v1-5-pruned-emaonly-fp16.safetensors" in hint
    assert demo.checkpoint_hint(_defs()) is None and demo.checkpoint_hint({}) is None


def test_checkpoint_without_demo_is_a_usage_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wf = tmp_path / "w.json"
    wf.write_text("{}")
    assert main(["run", str(wf), "--checkpoint", "x.safetensors", "-o", str(tmp_path / "o")]) == 2
    assert "use it with --demo" in caplog.text


def test_sheet_text_says_which_model_ran() -> None:
    row = {"faces": 1, "faces_with_fallbacks": 0, "time_s": 3.2, "reports": {"6": "faces 1\nframe 0 face 0: ok"}}
    test = demo_sheet.sheet_lines(row, demo.model_label(None), test_model=True)
    assert test[0].startswith("model: TokenFuse's small trained face model")
    assert any(line.startswith("test model: blurry by design") for line in test)
    assert "frame 0 face 0: ok" in test and any("faces 1," in line for line in test)
    real = demo_sheet.sheet_lines(row, demo.model_label("my_sd15.safetensors"), test_model=False)
    assert "my_sd15.safetensors" in real[0] and not any("blurry" in line for line in real)


def _png(path: Path, shape: tuple[int, int], value: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cv2.imencode(".png", np.full((*shape, 3), value, np.uint8))[1].tobytes())
    return path


def test_a_sheet_is_written_beside_each_ok_item(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    photo = _png(tmp_path / "in" / "astronaut.png", (200, 300), 40)
    out = tmp_path / "out"
    fused = _png(out / "astronaut" / "tokenfuse_demo_00001_.png", (200, 300), 200)
    plan = _png(out / "astronaut" / f"{demo.PLAN_PREFIX}_00001_.png", (200, 300), 120)
    rows = [
        {"item": str(photo), "name": "astronaut", "status": "ok", "outputs": [str(fused), str(plan)], "faces": 1},
        {"item": str(tmp_path / "in" / "bad.png"), "name": "bad", "status": "failed", "error": "x"},
        {"item": "elsewhere.png", "name": "other", "status": "ok", "outputs": [str(fused)]},  # not this run's item
    ]
    (out / "report.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    keys = {str(photo), str(tmp_path / "in" / "bad.png")}
    with caplog.at_level(logging.INFO, logger="tokenfuse.runner"):
        written = demo_sheet.write_sheets(out / "report.jsonl", keys, "a model", True, demo.PLAN_PREFIX)
    sheet = out / "astronaut" / demo_sheet.SHEET_NAME
    assert written == [sheet] and str(sheet) in caplog.text
    img = cv2.imdecode(np.fromfile(str(sheet), np.uint8), cv2.IMREAD_COLOR)
    panel = round(300 * demo_sheet.PANEL_HEIGHT / 200)
    assert img.shape[1] == 3 * panel + 2 * 8 and img.shape[0] > demo_sheet.PANEL_HEIGHT + 28
    # the panels are the input, the plan and the output, in that order
    mid = demo_sheet.PANEL_HEIGHT // 2 + 28
    assert [int(img[mid, x].mean()) for x in (panel // 2, panel + 8 + panel // 2, 2 * (panel + 8) + panel // 2)] == [
        40,
        120,
        200,
    ]
    assert sorted(p.name for p in (out / "astronaut").glob("*.png")) == sorted([fused.name, plan.name])


def test_the_sample_photo_demo_gets_its_sheet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`run --demo` without a photo takes the sample from the run's scratch folder; the sheet was drawn after that
    folder was removed ("contact sheet for astronaut not written"). ComfyUI is replaced by an engine that returns
    the fused photo and the plan preview as the demo graph's SaveImage nodes would."""
    pytest.importorskip("skimage")
    import tokenfuse.runner.cli as cli
    from tokenfuse.runner.on_comfyui.protocol import ExecResult, OutputFile

    png = cv2.imencode(".png", np.full((64, 64, 3), 99, np.uint8))[1].tobytes()

    class Engine:
        def node_defs(self) -> dict:
            return _defs("my_sd15.safetensors")

        def stage(self, path: Path) -> str:
            assert path.is_file()
            return path.name

        def execute(self, prompt: dict, step: object = None) -> ExecResult:
            outputs = [
                OutputFile(f"{prefix}_00001_.png", "", lambda: png) for prefix in ("tokenfuse_demo", demo.PLAN_PREFIX)
            ]
            return ExecResult(ok=True, outputs=outputs, texts={"6": "faces 1"})

        def close(self) -> None:
            pass

    monkeypatch.setattr(cli, "_open_comfy", lambda args, extra: Engine())
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="tokenfuse.runner"):
        assert cli.main(["run", "--demo", "-o", str(out), "--quiet"]) == 0
    sheet = out / "astronaut" / demo_sheet.SHEET_NAME
    assert sheet.is_file() and str(sheet) in caplog.text, caplog.text
    assert "not written" not in caplog.text
    last = [r.getMessage() for r in caplog.records if r.name == "tokenfuse.runner"][-1]
    assert "run --demo --checkpoint my_sd15.safetensors" in last, last
