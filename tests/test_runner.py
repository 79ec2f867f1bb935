"""The headless runner's pure parts (no ComfyUI needed): UI->API conversion on the shipped example workflows and
on the frontend's special cases, item expansion and loader binding, the JSONL report and --resume bookkeeping,
--set, and the `python <pack folder> run` entry point's exit codes without a ComfyUI.

The conversion against real ComfyUI (validate_prompt, and equality with the real frontend's graphToPrompt) and real
runs are in tests/integration/test_runner_comfy.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tokenfuse import NODE_CLASS_MAPPINGS
from tokenfuse.runner.cli import apply_sets
from tokenfuse.runner.errors import WorkflowError
from tokenfuse.runner.items import expand, item_slot, resolve
from tokenfuse.runner.on_comfyui.convert import is_api_prompt, node_info, ui_to_api, widget_layout
from tokenfuse.runner.report import ReportWriter, done_keys, item_names, summarize_texts
from tokenfuse.runner.run import RunLog, RunTarget, Summary, Workflow, save_outputs

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))
# ComfyUI core nodes used by the example workflows, with the input definitions ComfyUI 0.3.64 gives in /object_info
# (only what conversion reads: names, order, widget kinds and flags).
CORE_DEFS: dict[str, dict[str, Any]] = {
    "CheckpointLoaderSimple": {"input": {"required": {"ckpt_name": [["v1-5-pruned-emaonly-fp16.safetensors"], {}]}}},
    "CLIPTextEncode": {
        "input": {"required": {"text": ["STRING", {"multiline": True, "dynamicPrompts": True}], "clip": ["CLIP"]}}
    },
    "LoadImage": {"input": {"required": {"image": [["portrait.png"], {"image_upload": True}]}}},
    "LoadVideo": {"input": {"required": {"file": [["talking_head.mp4"], {"video_upload": True}]}}},
    "SaveVideo": {
        "input": {
            "required": {
                "video": ["VIDEO"],
                "filename_prefix": ["STRING", {"default": "video/ComfyUI"}],
                "format": [["auto", "mp4"], {"default": "auto"}],
                "codec": [["auto", "h264"], {"default": "auto"}],
            }
        }
    },
    "PreviewImage": {"input": {"required": {"images": ["IMAGE"]}}},
    "SaveImage": {"input": {"required": {"images": ["IMAGE"], "filename_prefix": ["STRING", {"default": "ComfyUI"}]}}},
}
FILE_INPUTS = ("model_name", "swap_model", "arcface_model", "ckpt_name", " image")


def _defs() -> dict[str, dict[str, Any]]:
    return {**CORE_DEFS, **{k: node_info(c, k) for k, c in NODE_CLASS_MAPPINGS.items()}}


def _check_value(spec: Any, value: Any, where: str) -> None:
    kind, opts = spec[0], (spec[1] if len(spec) > 1 else {})
    if isinstance(kind, list):
        if not where.endswith(FILE_INPUTS):  # lists of model/input files depend on the machine
            assert value in kind, f"{where}: {value!r} not in {kind}"
    elif kind in ("INT", "FLOAT"):
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: {value!r}"
        assert kind == "FLOAT" or float(value).is_integer(), f"{where}: {value!r}"
        assert opts.get("min", -math.inf) <= value <= opts.get("max", math.inf), f"{where}: {value!r} out of range"
    elif kind == "BOOLEAN":
        assert isinstance(value, bool), f"{where}: {value!r}"
    elif kind == "STRING":
        assert isinstance(value, str), f"{where}: {value!r}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_example_workflows_convert_to_valid_inputs(path: Path) -> None:
    """Every widget value lands on the input it belongs to: a shift by one (a missed control_after_generate or
    upload slot) puts a string into a number or a number into a combo, which these checks catch."""
    wf = json.loads(path.read_text(encoding="utf-8"))
    defs = _defs()
    prompt = ui_to_api(wf, defs)
    assert {k: v["class_type"] for k, v in prompt.items()} == {
        str(n["id"]): n["type"] for n in wf["nodes"] if n["type"] != "Note"
    }
    for nid, node in prompt.items():
        inputs = defs[node["class_type"]]["input"]
        for name in inputs.get("required", {}):
            assert name in node["inputs"], f"{path.stem} node {nid} lacks {name}"
        for section in ("required", "optional"):
            for name, spec in inputs.get(section, {}).items():
                value = node["inputs"].get(name)
                if value is None or isinstance(value, list):  # absent optional / a link [node, slot]
                    continue
                _check_value(spec, value, f"{path.stem} node {nid} {name}")
    links = {(str(link[3]), link[4]) for link in wf["links"]}
    n_linked = sum(1 for n in prompt.values() for v in n["inputs"].values() if isinstance(v, list))
    assert n_linked == len(links)
    # the node with the seed widget (ScheduledFusion; VideoFaceFusion in the video workflow)
    (saved,) = [n for n in wf["nodes"] if n["type"] in ("TokenFuseScheduledFusion", "TokenFuseVideoFaceFusion")]
    seed, control, steps = saved["widgets_values"][:3]
    assert control in ("fixed", "increment", "decrement", "randomize")
    fusion = prompt[str(saved["id"])]["inputs"]
    assert (fusion["seed"], fusion["steps"]) == (seed, steps)  # steps comes after the control value


def test_widget_layout_extra_slots() -> None:
    info = {
        "input": {
            "required": {
                "image": [["a.png"], {"image_upload": True}],
                "seed": ["INT", {}],
                "strength": ["FLOAT", {"forceInput": True}],
                "mode": [["x", "y"], {"control_after_generate": True}],
            }
        }
    }
    assert [name for name, _ in widget_layout(info)] == ["image", None, "seed", None, "mode", None]


def _ui(nodes: list[dict[str, Any]], links: list[list[Any]]) -> dict[str, Any]:
    return {"nodes": nodes, "links": links, "version": 0.4}


def test_reroute_primitive_mute_bypass() -> None:
    defs = {
        "Src": {"input": {"required": {}}},
        "Mid": {"input": {"required": {"x": ["IMAGE"], "k": ["INT", {}]}}},
        "Sink": {"input": {"required": {"x": ["IMAGE"], "k": ["INT", {}]}}},
    }
    nodes = [
        {"id": 1, "type": "Src", "widgets_values": []},
        {"id": 2, "type": "Reroute", "inputs": [{"name": "", "link": 1, "type": "*"}]},
        {
            "id": 3,
            "type": "Mid",
            "mode": 4,
            "inputs": [{"name": "x", "link": 2, "type": "IMAGE"}],
            "widgets_values": [5],
        },
        {"id": 4, "type": "PrimitiveNode", "widgets_values": [7, "fixed"]},
        {
            "id": 5,
            "type": "Sink",
            "title": "out",
            "inputs": [{"name": "x", "link": 3, "type": "IMAGE"}, {"name": "k", "link": 4, "widget": {"name": "k"}}],
            "widgets_values": [1],
        },
        {"id": 6, "type": "Mid", "mode": 2, "widgets_values": [1]},
        {"id": 7, "type": "Note", "widgets_values": ["hello"]},
    ]
    links = [[1, 1, 0, 2, 0, "IMAGE"], [2, 2, 0, 3, 0, "IMAGE"], [3, 3, 0, 5, 0, "IMAGE"], [4, 4, 0, 5, 1, "INT"]]
    prompt = ui_to_api(_ui(nodes, links), defs)
    assert sorted(prompt) == ["1", "5"]  # reroute, primitive, bypassed, muted and note nodes are gone
    assert prompt["5"]["inputs"] == {"x": ["1", 0], "k": 7}  # through reroute + bypass; primitive's value
    assert prompt["5"]["_meta"]["title"] == "out"
    assert is_api_prompt(prompt) and not is_api_prompt(_ui(nodes, links))
    assert ui_to_api(prompt, {}) == prompt
    with pytest.raises(WorkflowError, match="not installed in this ComfyUI: Missing"):
        ui_to_api(_ui([{"id": 1, "type": "Missing"}], []), defs)


def test_a_reroute_loop_is_a_workflow_error_not_a_recursion_crash() -> None:
    """Two Reroutes feeding each other (a hand-edited or hostile file; the editor cannot draw it) ended the CLI in a
    RecursionError traceback."""
    defs = {"Sink": {"input": {"required": {"x": ["IMAGE"]}}}}
    nodes = [
        {"id": 1, "type": "Reroute", "inputs": [{"name": "", "link": 2, "type": "*"}]},
        {"id": 2, "type": "Reroute", "inputs": [{"name": "", "link": 1, "type": "*"}]},
        {"id": 3, "type": "Sink", "inputs": [{"name": "x", "link": 3, "type": "IMAGE"}]},
    ]
    links = [[1, 1, 0, 2, 0, "IMAGE"], [2, 2, 0, 1, 0, "IMAGE"], [3, 2, 0, 3, 0, "IMAGE"]]
    with pytest.raises(WorkflowError, match="loops through Reroute or bypassed nodes"):
        ui_to_api(_ui(nodes, links), defs)


def _prompt() -> dict[str, Any]:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": "target.png"}, "_meta": {"title": "Load Image"}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "source_face.png"}, "_meta": {"title": "source"}},
        "3": {"class_type": "TokenFuseScheduledFusion", "inputs": {"steps": 20}, "_meta": {"title": "fuse"}},
        "4": {"class_type": "TokenFuseScheduledFusion", "inputs": {"steps": 20}, "_meta": {"title": "second"}},
    }


def test_binding_by_name() -> None:
    p = _prompt()
    assert resolve(p, "2") == "2" and resolve(p, "source") == "2" and resolve(p, "SOURCE_FACE") == "2"
    assert resolve(p, "target") == "1"
    assert resolve(p, "image", exclude={"2"}) == "1"  # the kind, once the other loader is bound
    with pytest.raises(WorkflowError, match="matches several loaders"):
        resolve(p, "image")
    with pytest.raises(WorkflowError, match="matches no loader.*node 2 \\(LoadImage"):
        resolve(p, "nope")
    assert item_slot(p, {"2"}) == "1"
    with pytest.raises(WorkflowError, match="bind all but one with --input"):
        item_slot(p, set())
    apply_sets(p, ["fuse.steps=4", "TokenFuseScheduledFusion.cfg=5.5", "4.sampler_name=euler"])
    assert p["3"]["inputs"] == {"steps": 4, "cfg": 5.5} and p["4"]["inputs"]["sampler_name"] == "euler"
    with pytest.raises(WorkflowError, match="no node"):
        apply_sets(p, ["ghost.steps=1"])


def test_set_is_checked_against_the_node_definitions() -> None:
    """--set with a misspelt input used to be ignored (exit 0) and a value of the wrong kind failed every item
    (exit 1): both are a WorkflowError (exit 2) before any item runs, naming the valid inputs or choices."""
    defs = _defs()
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "x.png"}},
        "6": {"class_type": "TokenFuseScheduledFusion", "inputs": {"steps": 4}, "_meta": {"title": "fuse"}},
        "8": {"class_type": "SaveImage", "inputs": {"images": ["6", 0]}, "_meta": {"title": "save"}},
        "9": {"class_type": "ThirdPartyNode", "inputs": {}},
    }
    with pytest.raises(
        WorkflowError, match=r"node 8 \(SaveImage\) has no input 'filename_prefx'; its inputs: images, f"
    ):
        apply_sets(prompt, ["save.filename_prefx=x"], defs)
    with pytest.raises(WorkflowError, match="has no input 'step'; its inputs: model, vae, .*steps.*token_plan"):
        apply_sets(prompt, ["fuse.step=12"], defs)
    bad = {
        "save.images=5": r"images takes a link \(IMAGE\) from another node",
        "fuse.steps=12.5": "steps takes an integer, not '12.5'",
        "fuse.steps=many": "steps takes an integer",
        "fuse.steps=0": "steps 0 is outside 1 .. ",
        "fuse.cfg=true": "cfg takes a number",
        "fuse.fallback=sometimes": "fallback 'sometimes' is not one of its choices: ",
    }
    for flag, message in bad.items():
        with pytest.raises(WorkflowError, match=message):
            apply_sets(prompt, [flag], defs)
    assert prompt["6"]["inputs"] == {"steps": 4} and "filename_prefix" not in prompt["8"]["inputs"]
    good = ["save.filename_prefix=2024", "fuse.steps=8.0", "fuse.cfg=2", 'save.images=["1", 0]', "9.anything=1"]
    apply_sets(prompt, [*good, "fuse.fallback=oom-only"], defs)
    assert prompt["8"]["inputs"] == {"images": ["1", 0], "filename_prefix": "2024"}  # a STRING keeps the text
    assert prompt["6"]["inputs"]["steps"] == 8 and prompt["6"]["inputs"]["fallback"] == "oom-only"
    assert prompt["9"]["inputs"] == {"anything": 1}  # a class the engine does not know: ComfyUI validates it


def test_expand_items(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for name in ("b.png", "a.jpg", "notes.md", "clip.mp4"):
        (tmp_path / "d" / name).write_bytes(b"x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.png").write_bytes(b"x")
    (tmp_path / "list.txt").write_text("# photos\nother/a.png\n\nd/b.png\n")
    items = expand([tmp_path / "d", tmp_path / "list.txt"])
    assert [(i.name, i.kind) for i in items] == [
        ("a", "image"),
        ("b", "image"),
        ("clip", "video"),
        ("a_2", "image"),  # same stem from another folder: outputs never collide
        ("b_2", "image"),
    ]
    assert all(i.path.is_absolute() for i in items)
    with pytest.raises(WorkflowError, match="input not found"):
        expand([tmp_path / "missing.png"])
    with pytest.raises(WorkflowError, match="not an image or video"):
        expand([tmp_path / "d" / "notes.md"])


def test_item_names_never_collide_with_a_real_stem_or_by_case(tmp_path: Path) -> None:
    """d1/a.png, d1/a_2.png and d2/a.png once gave two items the name a_2: under --ray each worker clears its output
    folder per item, so one result overwrote the other and both report rows pointed at one file."""
    for rel in ("d1/a.png", "d1/a_2.png", "d2/a.png", "d2/A.png", "d3/a_2.png"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    names = [i.name for i in expand([tmp_path / "d1", tmp_path / "d2", tmp_path / "d3"])]
    assert len({n.casefold() for n in names}) == len(names) == 5, names
    assert names[:2] == ["a", "a_2"]  # a file's own stem first, when free


def test_item_folders_stay_inside_the_output_and_off_the_runners_own_names(tmp_path: Path) -> None:
    """`...png` was filed under the output's parent (its stem is `..`) and `..png` into the output folder itself
    (set_aside then tried to move the whole output folder); `report.jsonl.png`'s folder clashed with the report,
    `.replaced.png`'s with the redo folder; `nul.png` cannot be a folder on Windows, `a..png`'s `a.` is `a` there."""
    names = ("...png", "..png", ".replaced.png", "report.jsonl.png", "NUL.png", "com1.x.png", "a.png", "a..png")
    names += ("aux .y.png", "nula.png")
    (tmp_path / "d").mkdir()
    for name in names:
        (tmp_path / "d" / name).write_bytes(b"x")
    out = tmp_path / "out"
    got = {i.path.name: i.name for i in expand([tmp_path / "d"])}
    assert got == {
        "...png": "item",
        "..png": "item_2",
        ".replaced.png": ".replaced_",
        "report.jsonl.png": "report.jsonl_",
        "NUL.png": "NUL_",
        "com1.x.png": "com1_.x",  # not `com1.x_`: Windows reads the part before the first dot (COM1)
        "aux .y.png": "aux _.y",
        "nula.png": "nula",
        "a..png": "a",  # sorted first
        "a.png": "a_2",
    }, got
    assert all((out / name).resolve().parent == out.resolve() for name in got.values())


def test_resume_keeps_the_names_the_report_gave(tmp_path: Path) -> None:
    """--resume after a.jpg was added next to a finished a.png: sorted first, a.jpg used to get the name `a` and
    overwrite a.png's outputs. Items the report knows keep their names; new ones get names it does not use."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.png").write_bytes(b"x")
    (first,) = expand([tmp_path / "d"])
    writer = ReportWriter(tmp_path / "report.jsonl", append=False)
    writer.write({"item": first.key, "name": first.name, "status": "ok"})
    writer.write({"item": str(tmp_path / "gone.png"), "name": "A_2", "status": "failed"})
    writer.close()
    (tmp_path / "d" / "a.jpg").write_bytes(b"x")
    (tmp_path / "d" / "a_2.png").write_bytes(b"x")
    known = item_names(tmp_path / "report.jsonl")
    items = expand([tmp_path / "d"], known)
    assert [(i.path.name, i.name) for i in items] == [("a.jpg", "a_3"), ("a.png", "a"), ("a_2.png", "a_2_2")]
    assert [i.name for i in expand([tmp_path / "d"])] == ["a", "a_2", "a_2_2"]  # without --resume: fresh names
    assert item_names(tmp_path / "missing.jsonl") == {}


def test_list_files_with_a_bom_or_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"x")
    (tmp_path / "bom.txt").write_text("# photos\na.png\n", encoding="utf-8-sig")  # Notepad, PowerShell 7
    assert [i.name for i in expand([tmp_path / "bom.txt"])] == ["a"]
    (tmp_path / "wide.txt").write_text("a.png\n", encoding="utf-16")  # Windows PowerShell 5's `>`
    with pytest.raises(WorkflowError, match="is not UTF-8 text"):
        expand([tmp_path / "wide.txt"])


def test_report_resume_and_summary(tmp_path: Path) -> None:
    from tokenfuse.fusion.fallback import FaceReport, format_report

    ok, fb = FaceReport(frame=0, index=0, seed=1), FaceReport(frame=0, index=1, seed=2)
    fb.add("tiled_vae", "out of memory at guide 512")
    counts = summarize_texts({"6": format_report([ok, fb], header="ScheduledFusion: 2 face(s)")})
    assert counts == {
        "faces": 2,
        "faces_with_fallbacks": 1,
        "faces_passed_through": 0,
        "fallbacks": ["frame 0 face 1: fallback: tiled_vae: out of memory at guide 512"],
    }
    path = tmp_path / "report.jsonl"
    w = ReportWriter(path, append=False)
    w.write({"item": "/a.png", "status": "ok"})
    w.write({"item": "/b.png", "status": "failed"})
    w.write({"item": "/c.png", "status": "interrupted"})
    w.close()
    with path.open("a") as f:
        f.write('{"item": "/d.png", "status": "o')  # a line cut by a kill
    assert done_keys(path) == {"/a.png"}
    assert done_keys(tmp_path / "none.jsonl") == set()
    assert Summary(ok=2).exit_code == 0 and Summary(ok=1, failed=1).exit_code == 1
    assert Summary(ok=1, interrupted=True).exit_code == 130


def _run_main(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    full = {k: v for k, v in os.environ.items() if k != "COMFYUI_PATH"} | (env or {})
    return subprocess.run(
        [sys.executable, str(REPO), *args], capture_output=True, text=True, timeout=120, env=full, check=False
    )


def test_node_errors_fail_an_item_even_when_one_output_validates() -> None:
    """validate_prompt says valid when one output validates (ComfyUI then runs only that one): a node error in the
    answer fails the item anyway, worded as a validation error; and a save node that filed nothing fails it too."""
    from tokenfuse.runner.on_comfyui.embedded import validation_error
    from tokenfuse.runner.on_comfyui.protocol import missing_saves, output_entries

    bad = {"9": {"class_type": "SaveImage", "errors": [{"message": "Value not in list", "details": "x"}]}}
    assert validation_error(True, None, {}) == ""
    assert (
        validation_error(True, None, bad) == "Some outputs failed validation; node 9 (SaveImage): Value not in list: x"
    )
    assert validation_error(False, {"message": "Prompt outputs failed validation"}, bad).startswith("Prompt outputs")
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {}},
        "8": {"class_type": "SaveImage", "inputs": {}},
        "9": {"class_type": "SaveImage", "inputs": {}},
        "10": {"class_type": "PreviewImage", "inputs": {}},
    }
    ui = {
        "8": {"images": [{"filename": "a_00001_.png", "subfolder": "", "type": "output"}]},
        "10": {"images": [{"filename": "p.png", "subfolder": "", "type": "temp"}]},
    }
    saved = output_entries(ui)
    assert list(saved) == ["8"]
    assert missing_saves(prompt, saved) == "node 9 (SaveImage) saved no file"
    assert missing_saves({k: v for k, v in prompt.items() if k != "9"}, saved) == ""


def test_outputs_keep_their_subfolder_and_never_overwrite_each_other(tmp_path: Path) -> None:
    """Files of several save nodes: each keeps its subfolder below the one they share; the same path twice gets _2; a
    subfolder that would leave the item's folder (a server's answer is not trusted) is dropped."""
    files = [
        ("left/img_00001_.png", b"L"),
        ("right/img_00001_.png", b"R"),
        ("img_00001_.png", b"A"),
        ("img_00001_.png", b"B"),
        ("../../escape.png", b"E"),
        ("/etc/abs.png", b"F"),
        ("win\\sub\\w.png", b"W"),
    ]
    written = save_outputs(files, tmp_path / "item")
    rel = [str(Path(w).relative_to(tmp_path / "item")) for w in written]
    assert rel == [
        "left/img_00001_.png",
        "right/img_00001_.png",
        "img_00001_.png",
        "img_00001__2.png",
        "escape.png",
        "abs.png",
        "win/sub/w.png",
    ]
    assert [Path(w).read_bytes() for w in written] == [data for _, data in files]
    # one subfolder for all of an item's files (the shipped workflows' `tokenfuse/` prefix): filed flat, as before
    flat = save_outputs([("tokenfuse/a_00001_.png", b"a"), ("tokenfuse/b_00001_.png", b"b")], tmp_path / "flat")
    assert [Path(w).relative_to(tmp_path / "flat").as_posix() for w in flat] == ["a_00001_.png", "b_00001_.png"]
    shared = save_outputs([("t/left/x.png", b"L"), ("t/right/x.png", b"R")], tmp_path / "shared")
    assert [Path(w).relative_to(tmp_path / "shared").as_posix() for w in shared] == ["left/x.png", "right/x.png"]
    # names without a file name (a server's answer): "output", never the item folder itself or its parent
    odd = save_outputs([("sub/..", b"1"), ("sub/", b"2"), ("sub/x.png", b"3"), ("..", b"4")], tmp_path / "odd")
    assert sorted(Path(w).relative_to(tmp_path / "odd").as_posix() for w in odd) == [
        "output",
        "output_2",
        "output_3",
        "sub/x.png",
    ]


def test_a_kill_mid_write_leaves_no_truncated_output_and_a_redo_starts_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 while an output is written: the file used to stay truncated under its real name, and the redo
    (--resume) filed its outputs next to it. Now a write goes to .part and is renamed when complete, and a redo
    moves the item folder's earlier files to <output>/.replaced/<item>/ first."""
    from tokenfuse.runner.items import Item

    item = Item(path=tmp_path / "p2.png", name="p2", kind="image")
    files = [("img_00001_.png", b"first"), ("img_00002_.png", b"x" * 1000)]

    class Killed(BaseException):
        pass

    import tokenfuse.runner.run as run_module

    real = run_module.write_new

    def die_halfway(path: Path, data: bytes) -> None:  # what kill -9 leaves: half of the bytes, then nothing
        if path.name.startswith("img_00002_"):
            real(path, data[: len(data) // 2])
            raise Killed
        real(path, data)

    run = RunLog(tmp_path / "out", 1, progress=False)
    monkeypatch.setattr(run_module, "write_new", die_halfway)
    with pytest.raises(Killed):
        run.finish(1, item, {"item": item.key, "name": "p2", "status": "ok", "time_s": 0.1}, files)
    monkeypatch.undo()
    folder = tmp_path / "out" / "p2"
    assert sorted(p.name for p in folder.iterdir()) == ["img_00001_.png", "img_00002_.png.part"]

    redo = RunLog(tmp_path / "out", 1, resume=True, progress=False)
    redo.finish(
        1, item, {"item": item.key, "name": "p2", "status": "ok", "time_s": 0.1}, [("img_00003_.png", b"redone")]
    )
    redo.end()
    assert [p.name for p in folder.iterdir()] == ["img_00003_.png"]
    kept = tmp_path / "out" / ".replaced" / "p2"
    assert sorted(p.name for p in kept.iterdir()) == ["img_00001_.png", "img_00002_.png.part"]


def test_core_engine_options_are_refused_where_they_would_be_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`run --demo --preset off --steps 12` and workflow runs with --seed ... used to ignore the core engine's options
    silently (exit 0, the graph's own settings): exit 2 naming the --set that does it; a detector the core engine
    does not have is argparse's usage error; `serve --workflow X --demo` (the demo flag ignored) is refused."""
    from tokenfuse.runner.core.cli import spec_from_args
    from tokenfuse.runner.core.video import CoreSpec
    from tokenfuse.service.cli import build_parser, main

    assert main(["run", "--demo", "--preset", "off", "--steps", "12", "-o", str(tmp_path / "o")]) == 2
    assert "--steps, --preset only apply to --engine core" in caplog.text
    assert (
        "--steps: use --set TokenFuseScheduledFusion.steps=N (videos: TokenFuseVideoFaceFusion.steps; run --demo:"
        in (caplog.text)
    )
    for flag, value, hint in [
        ("--seed", "5", "fuse.seed"),
        ("--denoise", "0.3", "fuse.denoise"),
        ("--crop-size", "128", "guide_size"),
        ("--crf", "0", "TokenFuseVideoFaceFusion.crf"),
        ("--detector", "mtcnn", "TokenFuseFaceDetect.backend"),
        ("--keyframes-per-second", "4", "keyframes_per_second"),
        ("--sampler", "standin", "loader nodes pick the model"),
    ]:
        caplog.clear()
        assert main(["run", str(WORKFLOWS[0]), str(tmp_path / "x.png"), flag, value]) == 2, flag
        assert f"{flag} only apply to --engine core" in caplog.text and hint in caplog.text, caplog.text
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as usage:
        build_parser().parse_args(["run", "--engine", "core", "clip.mp4", "--detector", "foo"])
    assert usage.value.code == 2
    defaults = spec_from_args(build_parser().parse_args(["run", "--engine", "core", "clip.mp4"]))
    assert defaults == CoreSpec(refine="demo", chunks=0)
    assert main(["serve", "--workflow", str(WORKFLOWS[0]), "--demo"]) == 2
    assert "--demo serves the demo graph, --workflow a workflow of yours" in caplog.text


def test_entry_point_without_comfyui(tmp_path: Path) -> None:
    """`python <pack folder> run` works whatever the folder is called; no ComfyUI -> exit 2 and how to fix it."""
    res = _run_main("run", "--help")
    assert res.returncode == 0 and "--resume" in res.stdout and "--server" in res.stdout
    (tmp_path / "x.png").write_bytes(b"x")
    res = _run_main("run", str(WORKFLOWS[0]), str(tmp_path / "x.png"), "--comfyui", str(tmp_path))
    assert res.returncode == 2 and "no ComfyUI checkout found" in res.stderr and "--comfyui PATH" in res.stderr
    res = _run_main("run", str(WORKFLOWS[0]), str(tmp_path / "x.png"), "--server", "http://127.0.0.1:9")
    assert res.returncode == 2 and "did not answer" in res.stderr, res.stderr


def test_root_import_stays_light() -> None:
    """ComfyUI imports the root __init__: it must not pull in the runner (nor anything it imports)."""
    code = (
        "import importlib.util, sys; "
        f"s = importlib.util.spec_from_file_location('tf', {str(REPO / '__init__.py')!r}, "
        f"submodule_search_locations=[{str(REPO)!r}]); m = importlib.util.module_from_spec(s); "
        "sys.modules['tf'] = m; s.loader.exec_module(m); "
        "print(sorted(k for k in sys.modules if k.startswith('tf.runner') or k in ('ray', 'comfy', 'execution')))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert res.stdout.strip() == "[]", res.stdout


def test_cli_sends_video_workflows_under_ray_to_the_chunked_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`run <video workflow> --ray ... --chunks N` reaches run_workflow_videos_ray with the bound prompt, the video
    items and --chunks; photo workflows under --ray keep the per-item path (run_items_ray). The Ray and ComfyUI
    sides are replaced by recorders (tests/integration/test_runner_ray_video.py runs the real thing)."""
    import tokenfuse.runner.cli as cli
    import tokenfuse.runner.ray.dispatch as ray_dispatch
    import tokenfuse.runner.ray.workflow_video as workflow_video

    class Engine:
        closed = False

        def node_defs(self) -> dict[str, dict[str, Any]]:
            return _defs()

        def close(self) -> None:
            Engine.closed = True

    calls: dict[str, tuple[Any, ...]] = {}

    def chunked(engine: Any, workflow: Workflow, target: RunTarget, chunks: int) -> Summary:
        wf = workflow
        calls["chunked"] = (wf.prompt[wf.slot]["class_type"], [i.name for i in wf.items], target, chunks)
        return Summary(ok=len(wf.items))

    def per_item(engine: Any, workflow: Workflow, target: RunTarget) -> Summary:
        wf = workflow
        calls["per_item"] = (wf.prompt[wf.slot]["class_type"], [i.name for i in wf.items])
        return Summary(ok=len(wf.items), failed=1, failures=["x"])

    monkeypatch.setattr(cli, "_open_pool", lambda args: Engine())
    monkeypatch.setattr(workflow_video, "run_workflow_videos_ray", chunked)
    monkeypatch.setattr(ray_dispatch, "run_items_ray", per_item)
    clip, photo = tmp_path / "talk.mp4", tmp_path / "face.png"
    clip.write_bytes(b"")
    photo.write_bytes(b"")
    video_wf = REPO / "workflows" / "tokenfuse_video_face_refine_sd15_6gb.json"
    out = tmp_path / "out"
    argv = ["run", str(video_wf), str(clip), "--ray", "local", "--workers", "2", "--chunks", "3"]
    assert cli.main([*argv, "-o", str(out), "--quiet"]) == 0
    assert "per_item" not in calls and Engine.closed
    kind, names, target, chunks = calls["chunked"]
    assert (kind, names, target, chunks) == ("LoadVideo", ["talk"], RunTarget(out, False, False), 3)
    photo_wf = REPO / "workflows" / "tokenfuse_face_refine_sd15_4gb.json"
    assert cli.main(["run", str(photo_wf), str(photo), "--ray", "local", "-o", str(out), "--quiet"]) == 1
    assert calls["per_item"] == ("LoadImage", ["face"])


def test_a_ray_worker_that_cannot_start_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`--ray` with a wrong --comfyui (or none on a worker node): the worker's start-up error came back as a Ray
    ActorDiedError traceback, exit 1 ("some item failed"); without --ray the same mistake is a clean exit 2."""
    exceptions = pytest.importorskip(
        "ray.exceptions", reason="Ray not installed (pip install -r requirements-scale.txt)"
    )
    from tokenfuse.runner import cli

    def cmd_run(args: Any) -> int:
        missing = FileNotFoundError("no ComfyUI checkout found at /nowhere")
        trace = "Traceback (most recent call last):\nFileNotFoundError: no ComfyUI checkout found at /nowhere"
        raise exceptions.ActorDiedError(cause=exceptions.RayTaskError("RunnerWorker.__init__", trace, missing))

    monkeypatch.setattr(cli, "cmd_run", cmd_run)
    with caplog.at_level(logging.ERROR):
        assert cli.main(["run", "wf.json", "x.png", "--ray", "local"]) == 2
    assert "a Ray worker could not start: FileNotFoundError: no ComfyUI checkout found" in caplog.text

    def other(args: Any) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "cmd_run", other)
    with pytest.raises(RuntimeError):
        cli.main(["run", "wf.json", "x.png"])


def test_a_server_file_name_with_a_nul_fails_its_item_not_the_run(tmp_path: Path) -> None:
    """A --server answer's file name is the server's: one holding a NUL raised ValueError (not OSError) from the
    write and ended the whole run; it fails its item like any name the file system refuses."""
    from tokenfuse.runner.items import Item

    run = RunLog(tmp_path / "out", 2, progress=False)
    item = Item(path=tmp_path / "a.png", name="a", kind="image")
    row = {"item": item.key, "name": "a", "status": "ok", "time_s": 0.1}
    run.finish(1, item, row, [("tokenfuse/evil\x00.png", b"x")])
    assert row["status"] == "failed" and "could not be written" in row["error"], row
    ok = Item(path=tmp_path / "b.png", name="b", kind="image")
    run.finish(2, ok, {"item": ok.key, "name": "b", "status": "ok", "time_s": 0.1}, [("b_00001_.png", b"b")])
    assert (tmp_path / "out" / "b" / "b_00001_.png").read_bytes() == b"b"


def test_staging_keeps_a_long_input_name_one_valid_file_name(tmp_path: Path) -> None:
    """An input named with 250 UTF-8 bytes (legal) plus the staging prefix went past the 255-byte limit: the item
    failed with "File name too long" (embedded engine) or HTTP 500 (ComfyUI's upload, --server)."""
    import itertools

    from tokenfuse.runner.on_comfyui.embedded import EmbeddedComfy, staged_name

    src = tmp_path / ("é" * 100 + "a" * 46 + ".png")  # 250 bytes
    src.write_bytes(b"x")
    engine = object.__new__(EmbeddedComfy)
    engine.work, engine._counter = tmp_path / "work", itertools.count()
    (engine.work / "input").mkdir(parents=True)
    name = engine.stage(src)
    assert (engine.work / "input" / name).read_bytes() == b"x"
    assert name.startswith("00000_é") and name.endswith(".png") and len(name.encode()) <= 255
    assert staged_name("tokenfuse_0123abcd_", "中" * 85 + ".jpg").endswith("中.jpg")  # whole characters only
    assert staged_name("p_", "short name.png") == "p_short name.png"


def test_work_folders_of_killed_runners_are_removed_after_a_day(tmp_path: Path) -> None:
    """A runner killed with SIGKILL left its `tokenfuse_run_*` work folder (the staged photos) in the system temp
    folder for good. The next engine start removes those untouched for a day whose lock no live process holds:
    only that exact name, never a link of that name, never what the staged links point to, never a live runner's
    folder however old (a run that goes on for days holds the lock)."""
    import os
    import signal
    import time

    from tokenfuse.runner.on_comfyui.embedded import sweep_stale_run_folders

    victim = tmp_path / "photos"
    victim.mkdir()
    (victim / "me.jpg").write_bytes(b"mine")
    root = tmp_path / "tmp"
    root.mkdir()
    old = time.time() - 2 * 24 * 3600

    def work_folder(name: str, mtime: float) -> Path:
        folder = root / name
        for sub in ("input", "output", "temp"):
            (folder / sub).mkdir(parents=True)
        (folder / "input" / "00000_me.jpg").symlink_to(victim / "me.jpg")
        (folder / "output" / "out.png").write_bytes(b"png")
        for path in (folder / "input", folder / "output", folder / "temp", folder):
            os.utime(path, (mtime, mtime))
        return folder

    killed, young = work_folder("tokenfuse_run_k1ll3d_x", old), work_folder("tokenfuse_run_y0ung_ab", time.time())
    other = [work_folder(name, old) for name in ("tokenfuse_run_toolong12", "tokenfuse_runs_abcdefgh", "mine")]
    (root / "tokenfuse_run_l1nk_abc").symlink_to(victim, target_is_directory=True)
    # a live runner whose folder is two days old: it holds the lock (hold_run_lock) until it is killed
    live = work_folder("tokenfuse_run_l1ve_abc", old)
    code = (
        "import importlib.util, sys, time; from pathlib import Path; "
        f"s = importlib.util.spec_from_file_location('tokenfuse', {str(REPO / '__init__.py')!r}, "
        f"submodule_search_locations=[{str(REPO)!r}]); m = importlib.util.module_from_spec(s); "
        "sys.modules['tokenfuse'] = m; s.loader.exec_module(m); "
        "from tokenfuse.runner.on_comfyui.embedded import hold_run_lock; "
        f"fd = hold_run_lock(Path({str(live)!r})); print('locked', flush=True); time.sleep(60)"
    )
    runner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert runner.stdout is not None and runner.stdout.readline().strip() == "locked"
        os.utime(live, (old, old))  # the lock file's creation touched it
        assert sweep_stale_run_folders(root) == 1
        assert not killed.exists() and young.is_dir() and live.is_dir() and all(p.is_dir() for p in other)
        assert (root / "tokenfuse_run_l1nk_abc").is_symlink() and (victim / "me.jpg").read_bytes() == b"mine"
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=30)
    assert sweep_stale_run_folders(root) == 1 and not live.exists()  # killed: its lock went with it
    assert sorted(p.name for p in victim.iterdir()) == ["me.jpg"] and (victim / "me.jpg").read_bytes() == b"mine"


def test_files_the_pack_wrote_during_a_prompt_are_found_by_name_and_stamp(tmp_path: Path) -> None:
    """The embedded engine's temporary output folder holds the pack's telemetry JSONL (`telemetry_jsonl`): what one
    prompt wrote there (new or rewritten; hidden temporary files aside) is what it carries back with the item."""
    import os

    from tokenfuse.runner.on_comfyui.embedded import changed_files, file_stamps

    folder = tmp_path / "tokenfuse"
    assert file_stamps(folder) == {}  # no folder yet: nothing written before the first run
    folder.mkdir()
    (folder / "kept.jsonl").write_text("earlier item\n")
    (folder / "run.jsonl").write_text("earlier item\n")
    before = file_stamps(folder)
    (folder / "run.jsonl").write_text("this item, longer\n")
    os.utime(folder / "kept.jsonl", ns=(before["kept.jsonl"][0], before["kept.jsonl"][0]))
    (folder / "new.jsonl").write_text("{}\n")
    (folder / ".new.jsonl.0123456789ab.tmp").write_text("half")
    (folder / "sub").mkdir()
    assert [p.name for p in changed_files(folder, before)] == ["new.jsonl", "run.jsonl"]


def test_an_items_files_include_what_the_pack_wrote_besides_the_save_nodes(tmp_path: Path) -> None:
    """A schedule's telemetry JSONL lives in the embedded engine's temporary output folder (removed when the run
    ends, a Ray worker's with its scratch folder): the item carries it as `tokenfuse/<name>` next to the saved image,
    so it lands in `<output>/<item>/tokenfuse/`."""
    from tokenfuse.runner.items import Item
    from tokenfuse.runner.on_comfyui.protocol import ExecResult, OutputFile
    from tokenfuse.runner.run import StagedPrompt, process_item

    class Engine:
        def stage(self, path: Path) -> str:
            return path.name

        def execute(self, prompt: dict[str, Any], progress: Any = None) -> ExecResult:
            image = OutputFile("fused_00001_.png", "", lambda: b"png")
            jsonl = OutputFile("run.jsonl", "tokenfuse", lambda: b'{"summary": {}}\n')
            return ExecResult(ok=True, outputs=[image], written=[jsonl])

    photo = tmp_path / "a.png"
    photo.write_bytes(b"x")
    prompt = {"1": {"class_type": "LoadImage", "inputs": {"image": ""}}}
    row, files = process_item(Engine(), StagedPrompt(prompt, "1", {}), Item(path=photo, name="a", kind="image"))  # type: ignore[arg-type]
    assert row["status"] == "ok"
    assert files == [("fused_00001_.png", b"png"), ("tokenfuse/run.jsonl", b'{"summary": {}}\n')]
    assert save_outputs(files, tmp_path / "out" / "a")[1] == str(tmp_path / "out" / "a" / "tokenfuse" / "run.jsonl")


def _input_spec(kind: str, name: str) -> Any:
    types = NODE_CLASS_MAPPINGS[kind].INPUT_TYPES()
    return {**types.get("required", {}), **types.get("optional", {})}.get(name)


def test_core_option_hints_name_inputs_that_take_the_options_values() -> None:
    """The error for a core-engine option outside --engine core names the --set to use instead; every input it names
    (class or demo-graph title) must exist and, for an option with choices, take every one of them. The --preset hint
    sent video workflows to TokenFuseVideoFaceFusion.preset, which is the x264 speed preset (ultrafast ... veryslow):
    `--set TokenFuseVideoFaceFusion.preset=balanced` is refused, the scheduling preset is on the controller there."""
    from tokenfuse.runner.core.cli import CORE_DEFAULTS, WORKFLOW_EQUIVALENTS, add_core_arguments
    from tokenfuse.runner.demo import demo_prompt

    parser = argparse.ArgumentParser()
    add_core_arguments(parser)
    choices = {a.dest: a.choices for a in parser._actions if a.choices and a.dest in CORE_DEFAULTS}
    titles = {n["_meta"]["title"]: n["class_type"] for n in demo_prompt().values()}
    for option, hint in WORKFLOW_EQUIVALENTS.items():
        for node, name in re.findall(r"\b([A-Za-z]\w*)\.(\w+)\b", hint):
            kind = node if node in NODE_CLASS_MAPPINGS else titles.get(node)
            assert kind in NODE_CLASS_MAPPINGS, f"--{option} hint names {node}.{name}: no such node or demo title"
            spec = _input_spec(kind, name)
            assert spec is not None, f"--{option} hint names {node}.{name}: {kind} has no input {name!r}"
            if option in choices:
                assert isinstance(spec[0], (list, tuple)), f"--{option} hint: {node}.{name} is not a choice"
                missing = set(choices[option]) - set(spec[0])
                assert not missing, f"--{option} hint: {node}.{name} does not take {sorted(missing)}"
            elif isinstance(CORE_DEFAULTS[option], (int, float)):
                assert spec[0] in ("INT", "FLOAT"), f"--{option} hint: {node}.{name} is not a number"


def test_demo_without_scikit_image_says_how_to_run_anyway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scikit-image is not a requirement (nor ComfyUI's), so after the README's install `run --demo` stopped with
    "--demo without --input needs scikit-image": but `--input image=FILE` binds the demo's only loader and fails too.
    The message names the install and the way that works, the photo as the item."""
    from tokenfuse.runner.demo import demo_photo

    monkeypatch.setitem(sys.modules, "skimage", None)  # import skimage -> ImportError
    with pytest.raises(FileNotFoundError) as err:
        demo_photo(tmp_path)
    assert "python -m pip install scikit-image" in str(err.value) and "run --demo photo.jpg" in str(err.value)


def test_every_runner_option_says_what_it_does_in_help() -> None:
    """`tokenfuse serve --help` showed --port, --comfyui, --cpu, --sdpa and -v with no text (the first place a new user
    looks for where ComfyUI is taken from); every option of every sub-command has a help line."""
    from tokenfuse.service.cli import build_parser

    subs = next(a for a in build_parser()._actions if a.dest == "command").choices
    bare = [f"{name} {'/'.join(a.option_strings)}" for name, sub in subs.items() for a in sub._actions if not a.help]
    assert not bare, f"options without help text: {bare}"
