"""The runner's `--server` mode (runner/on_comfyui/client.py + runner/on_comfyui/server_ws.py) against a loopback
stand-in of ComfyUI's HTTP and websocket API (tests/fake_comfy_server.py), in CI without ComfyUI: per-step progress from
the websocket, node errors and validation errors worded like the embedded engine's, the report's faces / fallbacks /
peak memory, the /history polling fallback, and Ctrl-C (the prompt deleted from the queue and interrupted by its id,
exit 130).

Against a real ComfyUI server: tests/integration/test_runner_comfy.py (test_server_mode_rows_equal_embedded).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("aiohttp", reason="aiohttp (requirements-test.txt; ComfyUI's own requirement) not installed")
from fake_comfy_server import fake_comfy  # noqa: E402
from PIL import Image  # noqa: E402
from tokenfuse.runner.items import expand  # noqa: E402
from tokenfuse.runner.on_comfyui.client import NO_WEBSOCKET, ServerComfy  # noqa: E402
from tokenfuse.runner.on_comfyui.server_ws import NO_MEMORY, PromptEvents  # noqa: E402
from tokenfuse.runner.run import RunTarget, Workflow, run_items  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# The keys of an ok row of the embedded engine (runner/run.py process_item + report.summarize_texts).
ROW_KEYS = {
    "item",
    "name",
    "kind",
    "status",
    "time_s",
    "peak_memory_mib",
    "memory_kind",
    "faces",
    "faces_with_fallbacks",
    "faces_passed_through",
    "fallbacks",
    "reports",
    "outputs",
}


def _prompt(steps: int = 3, image: str = "x.png") -> dict[str, dict[str, Any]]:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image}, "_meta": {"title": "photo"}},
        "2": {"class_type": "TokenFuseScheduledFusion", "inputs": {"image": ["1", 0], "steps": steps}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "fused"}},
    }


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from skimage import data

    root = tmp_path_factory.mktemp("photos")
    paths = [root / "astronaut.png", root / "coffee.jpg"]
    Image.fromarray(data.astronaut()).save(paths[0])
    Image.fromarray(data.coffee()).save(paths[1], quality=95)
    return paths


def test_rows_progress_faces_and_memory(photos: list[Path], tmp_path: Path) -> None:
    with fake_comfy(tmp_path / "server", faces=2, fallbacks=("smaller_guide",)) as fake:
        engine = ServerComfy(fake.url)
        assert engine.websocket
        steps: list[tuple[int, int]] = []
        result = engine.execute(_prompt(image=engine.stage(photos[0])), lambda v, t: steps.append((v, t)))
        assert result.ok, result.error
        assert steps == [(1, 3), (2, 3), (3, 3)]  # from the websocket's progress messages, in order
        summary = run_items(
            engine, Workflow(_prompt(), "1", {}, expand(photos)), RunTarget(tmp_path / "out", progress=False)
        )
        peaks = [float(t.split("peak RSS ")[1].split(" MiB")[0]) for t in fake.peak_texts]
    assert summary.exit_code == 0, summary.failures
    rows = [json.loads(line) for line in (tmp_path / "out" / "report.jsonl").read_text().splitlines()]
    assert [(r["name"], r["status"]) for r in rows] == [("astronaut", "ok"), ("coffee", "ok")]
    for row, photo, peak in zip(rows, photos, peaks[1:], strict=True):
        assert set(row) == ROW_KEYS
        assert (row["faces"], row["faces_with_fallbacks"], row["faces_passed_through"]) == (2, 1, 0)
        assert (
            len(row["fallbacks"]) == 1
            and "frame 0 face 0: fallback: smaller_guide: CUDA out of memory" in (row["fallbacks"][0])
        )
        assert list(row["reports"]) == ["2"] and "2 face(s), 1 with fallbacks" in row["reports"]["2"]
        # the stats of this prompt's sampling, not the 99999 MiB another client's run broadcast before it
        assert row["peak_memory_mib"] == peak and row["memory_kind"].startswith("server process peak RSS")
        assert row["time_s"] > 0
        (out,) = row["outputs"]
        assert Path(out).parent == tmp_path / "out" / photo.stem
        fused, original = Image.open(out), Image.open(photo).convert("RGB")
        assert np.array_equal(np.asarray(fused), np.asarray(original))


def test_node_error_and_validation_error(photos: list[Path], tmp_path: Path) -> None:
    """A file that does not decode fails in LoadImage (execution_error); a file never uploaded is refused by
    /prompt (400 + node_errors); both are worded like the embedded engine's messages; the good item goes on."""
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png at all")
    with fake_comfy(tmp_path / "server") as fake:
        engine = ServerComfy(fake.url)
        refused = engine.execute(_prompt(image="never_uploaded.png"))
        summary = run_items(
            engine,
            Workflow(_prompt(), "1", {}, expand([broken, photos[0]])),
            RunTarget(tmp_path / "out", progress=False),
        )
    assert not refused.ok and refused.error == (
        "Prompt outputs failed validation; node 1 (LoadImage): Value not in list: image: 'never_uploaded.png' not in []"
    )
    assert summary.exit_code == 1 and (summary.ok, summary.failed) == (1, 1)
    rows = [json.loads(line) for line in (tmp_path / "out" / "report.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert rows[0]["error"].startswith("node 1 (LoadImage): PIL.UnidentifiedImageError: cannot identify image file")


def test_a_partly_invalid_prompt_fails_the_item(photos: list[Path], tmp_path: Path) -> None:
    """One SaveImage validates, the other does not: ComfyUI answers /prompt 200 with `node_errors` and queues only
    the valid output. The runner used to report that item ok with one file; now it takes the prompt back (deleted
    from the queue, interrupted), fails the item with the node's error, and --resume redoes it."""
    prompt = _prompt(steps=50)
    prompt["4"] = {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "__invalid__"}}
    with fake_comfy(tmp_path / "server") as fake:
        engine = ServerComfy(fake.url)
        summary = run_items(
            engine, Workflow(prompt, "1", {}, expand(photos[:1])), RunTarget(tmp_path / "out", progress=False)
        )
        again = run_items(
            engine, Workflow(prompt, "1", {}, expand(photos[:1])), RunTarget(tmp_path / "out", True, False)
        )
        deleted = [body["delete"][0] for path, body in fake.requests if path == "/queue"]
    assert summary.exit_code == 1 and summary.failed == 1 and summary.ok == 0, summary
    (row, redo) = [json.loads(line) for line in (tmp_path / "out" / "report.jsonl").read_text().splitlines()]
    assert row["status"] == "failed" and "outputs" not in row, row
    assert row["error"] == "Some outputs failed validation; node 4 (SaveImage): Value not in list: __invalid__"
    assert len(deleted) == 2 and ("/interrupt", {"prompt_id": deleted[0]}) in fake.requests
    assert again.failed == 1 and again.skipped == 0 and redo["status"] == "failed"


def test_two_save_nodes_with_the_same_file_name_keep_both_files(photos: list[Path], tmp_path: Path) -> None:
    """SaveImage `left/img` and `right/img` both save img_<n>_.png: the runner used to drop the subfolder, so the
    second file overwrote the first and the report listed one path twice."""
    prompt = _prompt(steps=1)
    prompt["3"]["inputs"]["filename_prefix"] = "left/img"
    prompt["4"] = {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "right/img"}}
    with fake_comfy(tmp_path / "server") as fake:
        summary = run_items(
            ServerComfy(fake.url),
            Workflow(prompt, "1", {}, expand(photos[:1])),
            RunTarget(tmp_path / "out", progress=False),
        )
    assert summary.exit_code == 0, summary.failures
    (row,) = [json.loads(line) for line in (tmp_path / "out" / "report.jsonl").read_text().splitlines()]
    folder = tmp_path / "out" / "astronaut"
    assert row["outputs"] == [str(folder / "left" / "img_00000_.png"), str(folder / "right" / "img_00000_.png")]
    assert all(Path(out).is_file() for out in row["outputs"])


def test_polling_fallback_without_websocket(photos: list[Path], tmp_path: Path) -> None:
    """websocket=False (what a Python without aiohttp gets): same outputs and faces from /history, no per-step
    progress, peak memory unknown and said so."""
    with fake_comfy(tmp_path / "server", faces=1) as fake:
        engine = ServerComfy(fake.url, websocket=False)
        steps: list[tuple[int, int]] = []
        result = engine.execute(_prompt(image=engine.stage(photos[1])), lambda v, t: steps.append((v, t)))
        data = result.outputs[0].read()
    assert result.ok and steps == [] and result.texts and "1 face(s), 0 with fallbacks" in result.texts["2"]
    assert result.peak_memory_mib is None and result.memory_kind == NO_WEBSOCKET
    assert data[:4] == b"\x89PNG"


def test_a_file_name_with_quotes_or_line_breaks_is_staged_whole(photos: list[Path], tmp_path: Path) -> None:
    """The staged name went into the upload form's header line unescaped: a `"` or a line break (legal in Linux
    file names) cut the header short and the rest of the name read as more form fields."""
    odd = tmp_path / 'a"b\r\nContent-Type: text-plain\r\n\r\nx.png'
    odd.write_bytes(photos[0].read_bytes())
    with fake_comfy(tmp_path / "server", step_s=0.01) as fake:
        engine = ServerComfy(fake.url)
        name = engine.stage(odd)
        assert name.endswith(".png") and '"' not in name and "\n" not in name, name
        result = engine.execute(_prompt(image=name))
        assert result.ok, result.error


def test_interrupt_leaves_other_clients_prompts_alone(photos: list[Path], tmp_path: Path) -> None:
    """interrupt() while our prompt waits behind another client's: ours is deleted from the queue, execute()
    returns interrupted at once, and the other prompt (running) is not interrupted."""
    with fake_comfy(tmp_path / "server", step_s=0.05) as fake:
        engine = ServerComfy(fake.url)
        name = engine.stage(photos[0])
        body = json.dumps({"prompt": _prompt(steps=300, image=name), "client_id": "someone-else"}).encode()
        req = urllib.request.Request(fake.url + "/prompt", body, {"Content-Type": "application/json"})
        other = json.loads(urllib.request.urlopen(req, timeout=10).read())["prompt_id"]
        results: list[Any] = []
        worker = threading.Thread(target=lambda: results.append(engine.execute(_prompt(image=name))))
        worker.start()
        deadline = time.monotonic() + 10
        while not any(sid == engine.client_id for *_, sid in fake.pending) and time.monotonic() < deadline:
            time.sleep(0.01)
        (ours,) = [pid for pid, _, sid in fake.pending if sid == engine.client_id]
        assert fake.running == other
        t0 = time.monotonic()
        engine.interrupt()
        worker.join(10)
        waited = time.monotonic() - t0
        while other not in fake.history and time.monotonic() < deadline + 30:
            time.sleep(0.05)
    (result,) = results
    assert result.interrupted and result.error == "interrupted" and waited < 8.0, waited  # the other prompt runs 15 s
    assert ("/queue", {"delete": [ours]}) in fake.requests and ("/interrupt", {"prompt_id": ours}) in fake.requests
    assert fake.history[other]["status"]["status_str"] == "success" and ours not in fake.history


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_in_server_mode(photos: list[Path], tmp_path: Path, sig: signal.Signals) -> None:
    """`python <pack> run ... --server URL`, SIGINT while the item samples: the running prompt is interrupted by its
    id (POST /interrupt), the report says interrupted, exit 130. SIGTERM (timeout, systemd, Kubernetes) alike: it
    used to kill the run at once (exit 143, no report row, the server's prompt left running)."""
    (tmp_path / "wf.json").write_text(json.dumps(_prompt(steps=400)))
    out = tmp_path / "out"
    with fake_comfy(tmp_path / "server", step_s=0.05) as fake:
        cmd = [sys.executable, str(REPO), "run", str(tmp_path / "wf.json"), str(photos[0]), "-o", str(out)]
        proc = subprocess.Popen(
            [*cmd, "--server", fake.url, "--quiet"], cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=os.environ
        )
        try:
            deadline = time.monotonic() + 60
            while not any(k == "progress" for k, _ in fake.sent) and time.monotonic() < deadline:
                time.sleep(0.05)
            running = fake.running
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert running is not None and ("/interrupt", {"prompt_id": running}) in fake.requests
    (row,) = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert row["status"] == "interrupted" and row["error"] == "interrupted", row
    assert fake.history[running]["status"]["status_str"] == "error"


def test_resume_after_a_same_stem_file_was_added_keeps_the_finished_outputs(photos: list[Path], tmp_path: Path) -> None:
    """`run wf.json in/ --resume` after a.jpg was added next to the finished a.png: a.jpg used to get the name `a`
    and overwrite a.png's outputs; it gets a name the report does not use, and a.png is skipped."""
    (tmp_path / "wf.json").write_text(json.dumps(_prompt(steps=1)))
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    (folder / "a.png").write_bytes(photos[0].read_bytes())
    cmd = [sys.executable, str(REPO), "run", str(tmp_path / "wf.json"), str(folder), "-o", str(out), "--quiet"]
    with fake_comfy(tmp_path / "server") as fake:
        first = subprocess.run([*cmd, "--server", fake.url], capture_output=True, text=True, timeout=120)
        (done,) = json.loads((out / "report.jsonl").read_text())["outputs"]
        before = Path(done).read_bytes()
        Image.open(photos[1]).save(folder / "a.jpg", quality=95)
        again = subprocess.run([*cmd, "--server", fake.url, "--resume"], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and again.returncode == 0, again.stderr[-3000:]
    assert "1 ok, 0 failed, 1 skipped" in again.stderr, again.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert [(Path(r["item"]).name, r["name"]) for r in rows] == [("a.png", "a"), ("a.jpg", "a_2")]
    assert Path(done).read_bytes() == before and [Path(p).parent.name for p in rows[1]["outputs"]] == ["a_2"]


def test_a_misspelt_set_is_a_usage_error_before_any_item(photos: list[Path], tmp_path: Path) -> None:
    """`--set 3.filename_prefx=x` was ignored (exit 0, the default name) and `--set 3.images=5` failed every item
    (exit 1); both stop with exit 2, checked against the server's /object_info, before anything is uploaded."""
    (tmp_path / "wf.json").write_text(json.dumps(_prompt(steps=1)))
    cmd = [sys.executable, str(REPO), "run", str(tmp_path / "wf.json"), str(photos[0]), "-o", str(tmp_path / "out")]
    with fake_comfy(tmp_path / "server") as fake:
        typo = subprocess.run(
            [*cmd, "--server", fake.url, "--set", "3.filename_prefx=x"], capture_output=True, text=True, timeout=120
        )
        kind = subprocess.run(
            [*cmd, "--server", fake.url, "--set", "3.images=5"], capture_output=True, text=True, timeout=120
        )
    assert typo.returncode == 2 and "has no input 'filename_prefx'; its inputs: images, filename_prefix" in typo.stderr
    assert kind.returncode == 2 and "images takes a link (IMAGE)" in kind.stderr, kind.stderr[-2000:]
    assert not (tmp_path / "out" / "report.jsonl").exists() and not (tmp_path / "server" / "input").exists()


def test_a_server_that_went_away_stops_the_run_resumably(photos: list[Path], tmp_path: Path) -> None:
    """The ComfyUI server stops answering mid-run: every remaining item used to fail within milliseconds ("did not
    answer"), burning a long list. The run stops at the first such item instead, reported interrupted (exit 130),
    and --resume does the rest once the server is back."""
    items = expand(photos)
    with fake_comfy(tmp_path / "server") as fake:
        engine = ServerComfy(fake.url)
    summary = run_items(engine, Workflow(_prompt(), "1", {}, items), RunTarget(tmp_path / "out", progress=False))
    assert summary.interrupted and summary.exit_code == 130 and summary.failed == 0, summary
    (row,) = [json.loads(line) for line in (tmp_path / "out" / "report.jsonl").read_text().splitlines()]
    assert row["status"] == "interrupted" and "did not answer" in row["error"], row
    with fake_comfy(tmp_path / "server2") as fake:
        again = run_items(
            ServerComfy(fake.url), Workflow(_prompt(), "1", {}, items), RunTarget(tmp_path / "out", True, False)
        )
    assert again.exit_code == 0 and again.ok == 2, again


def test_prompt_events_protocol() -> None:
    """The message reducer alone: other prompts' messages are ignored, stats count only while the prompt runs, and
    the pack's three peak texts (nodes/model_patching.py) are read with what they mean."""
    ev = PromptEvents(prompt_id="p1")
    ev.feed("tokenfuse.stats", {"summary": "x, peak VRAM 5000 MiB [sd15]"})  # before ours started
    ev.feed("executing", {"node": "3", "prompt_id": "p0"})
    assert not ev.started and ev.peak_mib is None and ev.memory_kind == NO_MEMORY
    ev.feed("execution_start", {"prompt_id": "p1"})
    ev.feed("tokenfuse.stats", {"summary": "x, peak VRAM <= 812 MiB (earlier peak) [sd15]"})
    assert ev.peak_mib == 812 and "an earlier prompt set it" in ev.memory_kind
    ev.feed("tokenfuse.stats", {"summary": "x, peak VRAM 900 MiB [sd15]"})
    assert ev.peak_mib == 900 and ev.memory_kind.startswith("server cuda max_memory_allocated")
    ev.feed("tokenfuse.stats", {"summary": None, "peak_mem_mb": 700.0})  # a lower live value keeps the peak
    assert ev.peak_mib == 900
    ev.feed("tokenfuse.stats", {"summary": "x, peak VRAM 4000 MiB [sd15]", "prompt_id": "p0"})  # not ours
    assert ev.peak_mib == 900
    ev.feed("tokenfuse.stats", {"summary": None, "peak_mem_mb": 950.0, "peak_mem_kind": "rss"})  # a CPU server
    assert ev.peak_mib == 950 and ev.memory_kind.startswith("server process peak RSS during sampling")
    ev.feed("execution_interrupted", {"prompt_id": "p1", "node_id": "2", "node_type": "KSampler"})
    ev.feed("executing", {"node": None, "prompt_id": "p1"})
    ev.feed("tokenfuse.stats", {"summary": "x, peak RSS 99999 MiB (process) [sd15]"})  # after ours ended
    assert ev.finished and ev.outcome == "interrupted" and ev.error["node_type"] == "KSampler" and ev.peak_mib == 950
