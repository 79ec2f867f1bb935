"""The runner's output folder cannot be turned against files elsewhere (issue 34 item 1), and its command line's
raw errors (item 5): each case runs `run` through the CLI entry (runner/cli.main) with a recording engine in place
of ComfyUI (the item loop, the report and the output folder are the real ones).

Planted links: `OUT/.replaced -> victim` with an earlier `OUT/real/old.png` made a redo delete `victim/real/...`
(set_aside's rmtree through the link) and move old.png there; `OUT/report.jsonl -> victim file` truncated that file;
`OUT/real -> elsewhere` received the item's outputs. Each test keeps a victim outside `-o` and checks it untouched.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from tokenfuse.runner import cli
from tokenfuse.runner.on_comfyui.protocol import ExecResult, OutputFile
from tokenfuse.runner.output_folder import OutputFolderError
from tokenfuse.runner.report import ReportWriter
from tokenfuse.runner.run import save_outputs, set_aside

DEFS: dict[str, dict[str, Any]] = {
    "LoadImage": {"input": {"required": {"image": [["x.png"], {"image_upload": True}]}}, "output": ["IMAGE", "MASK"]},
    "SaveImage": {
        "input": {"required": {"images": ["IMAGE"], "filename_prefix": ["STRING", {"default": "ComfyUI"}]}},
        "output": [],
        "output_node": True,
    },
}
PROMPT = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "x.png"}},
    "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "tokenfuse/out"}},
}


class Recorder:
    """An engine whose every item saves `tokenfuse/out_00001_.png` holding the staged name."""

    def __init__(self) -> None:
        self.executed = 0

    def node_defs(self) -> dict[str, dict[str, Any]]:
        return DEFS

    def stage(self, path: Path) -> str:
        return path.name

    def execute(self, prompt: dict[str, dict[str, Any]], progress: Any = None) -> ExecResult:
        self.executed += 1
        data = str(prompt["1"]["inputs"]["image"]).encode()
        return ExecResult(ok=True, outputs=[OutputFile("out_00001_.png", "tokenfuse", read=lambda: data)])

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(cli, "_open_comfy", lambda args, extra: rec)
    return rec


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, list[str]]:
    """The workflow and two photos (real.jpg, other.jpg) as `run` arguments."""
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(PROMPT), encoding="utf-8")
    photos = []
    for name in ("real.jpg", "other.jpg"):
        (tmp_path / name).write_bytes(b"jpeg")
        photos.append(str(tmp_path / name))
    return wf, photos


def _run(job: tuple[Path, list[str]], out: Path, *extra: str) -> int:
    wf, photos = job
    return cli.main(["run", str(wf), *photos, "-o", str(out), "--quiet", *extra])


def _rows(out: Path) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in map(json.loads, (out / "report.jsonl").read_text().splitlines())}


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))
    }


def test_a_replaced_link_neither_deletes_nor_receives_anything(
    engine: Recorder, job: tuple[Path, list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`OUT/.replaced -> victim`: the redo of `real` used to delete victim/real/important.txt and leave old.png in
    victim/real. Now that item fails naming `.replaced`, its folder stays as it was, the other item is filed."""
    victim = tmp_path / "victim"
    (victim / "real").mkdir(parents=True)
    (victim / "real" / "important.txt").write_bytes(b"keep me")
    out = tmp_path / "out"
    (out / "real").mkdir(parents=True)
    (out / "real" / "old.png").write_bytes(b"old")
    (out / ".replaced").symlink_to(victim, target_is_directory=True)
    before = _tree(victim)
    with caplog.at_level(logging.ERROR):
        assert _run(job, out) == 1
    assert _tree(victim) == before
    assert (out / "real" / "old.png").read_bytes() == b"old"
    rows = _rows(out)
    assert rows["real"]["status"] == "failed" and ".replaced is a link" in rows["real"]["error"], rows["real"]
    assert rows["other"]["status"] == "ok" and (out / "other" / "out_00001_.png").read_bytes() == b"other.jpg"
    assert "real" in caplog.text and ".replaced is a link" in caplog.text


def test_a_link_inside_replaced_is_removed_as_a_link(tmp_path: Path) -> None:
    """`OUT/.replaced/real -> victim` (the place the earlier files go): the link goes, what it points to stays."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "important.txt").write_bytes(b"keep me")
    out = tmp_path / "out"
    (out / "real").mkdir(parents=True)
    (out / "real" / "old.png").write_bytes(b"old")
    (out / ".replaced").mkdir()
    (out / ".replaced" / "real").symlink_to(victim, target_is_directory=True)
    moved = set_aside(out / "real", out / ".replaced" / "real")
    assert moved is not None and not moved.is_symlink() and (moved / "old.png").read_bytes() == b"old"
    assert _tree(victim) == {"important.txt": b"keep me"}


def test_a_report_link_is_refused_and_its_target_kept(
    engine: Recorder, job: tuple[Path, list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`OUT/report.jsonl -> victim file` used to truncate it and fill it with report lines. Now the run stops before
    any item (exit 2, the entry named), also with --resume (which reads the report); a hard link to a file elsewhere
    is refused the same way."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.jsonl").symlink_to(victim)
    with caplog.at_level(logging.ERROR):
        assert _run(job, out) == 2
        assert _run(job, out, "--resume") == 2
    assert victim.read_bytes() == b"precious" and engine.executed == 0
    assert "report.jsonl is a link" in caplog.text
    (out / "report.jsonl").unlink()
    os.link(victim, out / "report.jsonl")
    with pytest.raises(OutputFolderError, match="2 hard links"):
        ReportWriter(out / "report.jsonl", append=False)
    assert victim.read_bytes() == b"precious"


def test_an_item_folder_link_receives_nothing(engine: Recorder, job: tuple[Path, list[str]], tmp_path: Path) -> None:
    """`OUT/real -> an empty folder elsewhere`: the item's outputs used to be written there. Now the item fails
    naming its folder, the folder elsewhere stays empty, the other item is filed."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "real").symlink_to(elsewhere, target_is_directory=True)
    assert _run(job, out) == 1
    assert list(elsewhere.iterdir()) == []
    rows = _rows(out)
    assert rows["real"]["status"] == "failed" and "real is a link" in rows["real"]["error"]
    assert rows["other"]["status"] == "ok"


def test_links_below_an_items_folder_are_not_written_through(tmp_path: Path) -> None:
    """A subfolder or a `.part` name planted as a link: the subfolder fails the write, the `.part` link is removed
    as a link; nothing lands in the victim folder."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "x.png").write_bytes(b"keep")
    out = tmp_path / "out"
    (out / "item").mkdir(parents=True)
    (out / "item" / "left").symlink_to(victim, target_is_directory=True)
    with pytest.raises(OutputFolderError, match="left is a link"):
        save_outputs([("left/x.png", b"L"), ("right/x.png", b"R")], out / "item")
    (out / "item" / "left").unlink()
    (out / "item" / "x.png.part").symlink_to(victim / "x.png")
    assert save_outputs([("x.png", b"new")], out / "item") == [str(out.resolve() / "item" / "x.png")]
    assert (out / "item" / "x.png").read_bytes() == b"new" and not (out / "item" / "x.png").is_symlink()
    assert _tree(victim) == {"x.png": b"keep"}


def test_an_output_folder_that_is_a_link_is_resolved_once(
    engine: Recorder, job: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """`-o` itself may be a link (the user named it): the run files into the folder it points to."""
    real = tmp_path / "real_out"
    real.mkdir()
    (tmp_path / "out_link").symlink_to(real, target_is_directory=True)
    assert _run(job, tmp_path / "out_link") == 0
    assert sorted(_rows(real)) == ["other", "real"] and (real / "real" / "out_00001_.png").is_file()


def test_an_output_that_is_a_file_is_a_usage_error(
    engine: Recorder, job: tuple[Path, list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`run ... -o <an existing regular file>`: a FileExistsError traceback and exit 1; now exit 2, one line, and
    the file stays as it was."""
    target = tmp_path / "photo.jpg"
    target.write_bytes(b"jpeg")
    with caplog.at_level(logging.ERROR):
        assert _run(job, target) == 2
    assert target.read_bytes() == b"jpeg" and engine.executed == 0
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "exists and is not a folder" in line and "\n" not in line
    (tmp_path / "clip.mp4").write_bytes(b"")
    assert cli.main(["run", "--engine", "core", str(tmp_path / "clip.mp4"), "-o", str(target), "--quiet"]) == 2
    assert target.read_bytes() == b"jpeg"


def test_a_deeply_nested_workflow_is_not_a_workflow(
    engine: Recorder, job: tuple[Path, list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A workflow file of `[` * 100000 ended in a RecursionError traceback; a valid JSON object nested 200 levels
    deep is refused the same way (later steps copy a prompt recursively)."""
    wf, photos = job
    deep = tmp_path / "deep.json"
    for text in ("[" * 100_000, '{"1": ' + "[" * 200 + "]" * 200 + "}"):
        deep.write_text(text, encoding="utf-8")
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert cli.main(["run", str(deep), *photos, "-o", str(tmp_path / "out"), "--quiet"]) == 2
        assert "is not a ComfyUI workflow: its JSON is nested too deeply" in caplog.text
    assert engine.executed == 0


def test_a_workflow_of_unknown_classes_names_them(
    engine: Recorder, job: tuple[Path, list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A workflow made only of node classes the engine does not know read "every loader is bound by --input"; now
    the message names the classes and says their custom node pack is missing."""
    wf, photos = job
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"1": {"class_type": "FancyLoader", "inputs": {}}, "2": {"class_type": "Zap"}}))
    with caplog.at_level(logging.ERROR):
        assert cli.main(["run", str(odd), *photos, "-o", str(tmp_path / "out"), "--quiet"]) == 2
    assert "node class(es) unknown to this ComfyUI: FancyLoader, Zap" in caplog.text
    assert "custom node pack(s) that provide them are not installed" in caplog.text
    assert "every loader is bound" not in caplog.text and engine.executed == 0
