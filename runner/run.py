"""The runner's item loop, the same for an embedded and a server ComfyUI: bind each item to the workflow's
loader, execute, file the outputs under `<output>/<item name>/`, append one JSONL report row, show progress.

A failed item is reported and the loop goes on; Ctrl-C or SIGTERM interrupts the running item (ComfyUI's own
interrupt, so the sampler stops at its next step), which is reported as interrupted (redone by --resume) and ends the
run.
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TextIO

from .items import Item, loaders
from .on_comfyui.protocol import Comfy, ComfyUnavailable, OutputFile
from .output_folder import check_entry, make_folders, output_root, remove_entry, write_new
from .report import ReportWriter, done_keys, summarize_texts

log = logging.getLogger("tokenfuse.runner")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # both stop a run resumably (exit 130)
REPLACED = ".replaced"  # <output>/.replaced/<item name>/: an item folder's files from before a redo (set_aside)


@dataclass
class Summary:
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_INTERRUPTED if self.interrupted else EXIT_FAILED if self.failed else EXIT_OK

    def line(self) -> str:
        state = ", interrupted" if self.interrupted else ""
        return f"{self.ok} ok, {self.failed} failed, {self.skipped} skipped (resume){state}, {self.seconds:.1f} s"


@dataclass(frozen=True)
class Workflow:
    """What a run executes: the API prompt, its item loader's node id (slot), the loaders bound to one file each
    (constants: node id -> file, e.g. a reference face) and the items."""

    prompt: dict[str, dict[str, Any]]
    slot: str
    constants: dict[str, Path]
    items: list[Item]


@dataclass(frozen=True)
class RunTarget:
    """Where and how a run files its items: the output folder, resume (skip the items its report says are done and
    append to it) and progress (the progress line on stderr)."""

    output: Path
    resume: bool = False
    progress: bool = True

    def log(self, total: int) -> RunLog:
        """The RunLog of a run of `total` items into this target."""
        return RunLog(self.output, total, self.resume, self.progress)


@dataclass(frozen=True)
class StagedPrompt:
    """A prompt ready for one ComfyUI's items: the API prompt, its item loader's node id (slot) and the constant
    loaders' files as staged in that ComfyUI's input folder (fixed: node id -> staged name)."""

    prompt: dict[str, dict[str, Any]]
    slot: str
    fixed: dict[str, str]


class ProgressLine:
    """`[3/10] name  step 4/20` on one terminal line (stderr); plain lines when stderr is not a terminal."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total, self.stream, self.enabled = total, stream or sys.stderr, enabled
        self.tty = self.stream.isatty()
        self.index, self.name, self._last = 0, "", ""

    def item(self, index: int, name: str) -> None:
        self.index, self.name = index, name
        self._show(f"[{index}/{self.total}] {name}")

    def step(self, value: int, total: int) -> None:
        if self.tty:  # per-step lines only on a terminal, where they overwrite each other
            self._show(f"[{self.index}/{self.total}] {self.name}  step {value}/{total}")

    def done(self, text: str) -> None:
        self._show(f"[{self.index}/{self.total}] {self.name}  {text}", end=True)

    def _show(self, text: str, end: bool = False) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + text.ljust(len(self._last)) + ("\n" if end else ""))
            self._last = "" if end else text
        elif end:
            self.stream.write(text + "\n")
        self.stream.flush()


def bind(prompt: dict[str, dict[str, Any]], names: dict[str, str]) -> dict[str, dict[str, Any]]:
    """A copy of `prompt` whose loader nodes (node id -> staged file name) load the given files."""
    p = copy.deepcopy(prompt)
    fields = loaders(p)
    for nid, name in names.items():
        p[nid]["inputs"][fields[nid][0]] = name
        if p[nid]["class_type"] == "LoadImage":
            p[nid]["inputs"].setdefault("upload", "image")
    return p


def save_outputs(files: list[tuple[str, bytes]], folder: Path, root: Path | None = None) -> list[str]:
    """Write an item's output files into its folder; returns their paths. Files of several subfolders keep them below
    the one they share (save nodes `left/img` and `right/img` both write img_00001_.png: `left/`, `right/`; the
    shipped workflows' single `tokenfuse/` stays flat), and a path an earlier file of the item took gets `_2`, `_3`,
    ...: no output overwrites another.

    root: the resolved output folder (default: the folder's parent). Nothing is written through a link below it
    (runner/output_folder.py): a folder on the way that is a link fails the item with OutputFolderError."""
    if root is None:
        folder.parent.mkdir(parents=True, exist_ok=True)
        root, folder = folder.parent.resolve(), folder.parent.resolve() / folder.name
    make_folders(root, folder)
    rels = [_relative_inside(filename) for filename, _ in files]
    shared = Path(os.path.commonpath([str(r.parent) for r in rels])) if rels else Path()
    written: list[str] = []
    for rel, (_, data) in zip(rels, files, strict=True):
        dst = _free_path(folder / rel.relative_to(shared), set(written))
        make_folders(root, dst.parent)
        part = dst.with_name(dst.name + ".part")  # a kill mid-write leaves a .part, never a truncated output
        remove_entry(root, part)  # a .part of a killed attempt (or a link planted there): removed as it is
        try:
            write_new(part, data)
            check_entry(root, dst)
            os.replace(part, dst)  # replaces the name `dst`, never what a link there points to
        except (OSError, ValueError):
            part.unlink(missing_ok=True)
            raise
        written.append(str(dst))
    return written


def set_aside(folder: Path, trash: Path, root: Path | None = None) -> Path | None:
    """Move what an earlier attempt left in an item's folder (a run killed mid-item, a run before this one) to
    `trash` before the item's new outputs are filed, so the folder holds one attempt's files only; returns where
    they went (None when there was nothing). Moved, not deleted: the folder may hold files the user put there. Only
    the latest set is kept per item.

    root: the resolved output folder (default: the folder's parent). The item's folder, `trash` and the folders on
    the way must not be links (OutputFolderError); an earlier `trash` is removed without following links."""
    if root is None:
        root = folder.parent.resolve()
        folder, trash = root / folder.name, root / trash.relative_to(folder.parent)
    check_entry(root, folder)
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    make_folders(root, trash.parent)
    remove_entry(root, trash)
    os.replace(folder, trash)
    return trash


def output_name(out: OutputFile) -> str:
    """An output's path relative to ComfyUI's output folder (`subfolder/filename`), as the item's files carry it."""
    sub = out.subfolder.replace("\\", "/").strip("/")
    return f"{sub}/{out.filename}" if sub else out.filename


def _relative_inside(name: str) -> Path:
    """`name` as a relative path that stays inside the item's folder: a server's subfolder is not trusted, so one
    that is absolute, names a drive or climbs out (`..`) is dropped and the file name alone is kept."""
    path = PurePosixPath(name.replace("\\", "/"))
    if not path.parts or path.name in ("", ".", "..") or name.endswith(("/", "\\")):  # no file name: "output"
        return Path("output")
    if path.is_absolute() or ".." in path.parts or ":" in path.parts[0]:
        return Path(path.name)
    return Path(*path.parts)


def _free_path(dst: Path, taken: set[str]) -> Path:
    """`dst`, or `<stem>_2<suffix>`, `_3`, ... when an earlier file of the same item took it."""
    candidate, n = dst, 1
    while str(candidate) in taken:
        n += 1
        candidate = dst.with_name(f"{dst.stem}_{n}{dst.suffix}")
    return candidate


def process_item(
    comfy: Comfy, bound: StagedPrompt, item: Item, step: Any = None, staged: str | None = None
) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """Stage, bind and execute one item; returns its report row (without `outputs`) and its output files (name,
    bytes). Never raises for a bad item: the row says failed and why. staged: the item's name in the ComfyUI's input
    folder when the caller staged it already (a Ray worker's WorkerFiles)."""
    row: dict[str, Any] = {"item": item.key, "name": item.name, "kind": item.kind}
    files: list[tuple[str, bytes]] = []
    t0 = time.perf_counter()
    try:
        name = comfy.stage(item.path) if staged is None else staged
        result = comfy.execute(bind(bound.prompt, {**bound.fixed, bound.slot: name}), step)
        row["time_s"] = round(time.perf_counter() - t0, 3)
        row["peak_memory_mib"] = None if result.peak_memory_mib is None else round(result.peak_memory_mib, 1)
        row["memory_kind"] = result.memory_kind
        if result.ok:
            files = [(output_name(out), out.read()) for out in [*result.outputs, *result.written]]
            row.update(summarize_texts(result.texts))
            row["reports"] = result.texts
            row["status"] = "ok"
        else:
            row["status"] = "interrupted" if result.interrupted else "failed"
            row["error"] = result.error
    except ComfyUnavailable as e:  # e.g. the --server ComfyUI is gone: the run stops here, resumable
        log.error("%s: the run stops here (--resume redoes this item and the rest)", e)
        row.update(status="interrupted", error=str(e), time_s=round(time.perf_counter() - t0, 3))
    except Exception as e:  # noqa: BLE001 - a bad item fails alone; the run goes on
        log.debug("item %s failed", item.path, exc_info=True)
        row.update(status="failed", error=f"{type(e).__name__}: {e}", time_s=round(time.perf_counter() - t0, 3))
    return row, files


def account(summary: Summary, bar: ProgressLine, row: dict[str, Any]) -> bool:
    """Count a finished row into the summary and the progress line; True when the run must stop (interrupted)."""
    if row["status"] == "ok":
        summary.ok += 1
        worker = f", worker {row['worker']}" if "worker" in row else ""
        bar.done(f"ok {row['time_s']:.1f} s, {len(row['outputs'])} file(s), faces {row.get('faces', 0)}{worker}")
        return False
    if row["status"] == "interrupted":
        summary.interrupted = True
        bar.done("interrupted")
        return True
    summary.failed += 1
    summary.failures.append(f"{row['item']}: {row['error']}")
    bar.done(f"FAILED: {row['error']}")
    return False


class RunLog:
    """The bookkeeping every runner loop shares (in-process, --server, --ray items, --ray video chunks): skip items
    a previous run finished (--resume), file an item's outputs under `<output>/<item name>/`, append its report
    row, count it into the summary and the progress line, log one summary line at the end."""

    def __init__(self, output: Path, total: int, resume: bool = False, progress: bool = True) -> None:
        self.started = time.perf_counter()
        self.output = output_root(output)  # resolved once: `-o` may be a link, nothing below it may (output_folder.py)
        self.report_path = self.output / "report.jsonl"
        self.finished = done_keys(self.report_path) if resume else set()
        self.writer = ReportWriter(self.report_path, append=resume, root=self.output)
        self.summary = Summary()
        self.bar = ProgressLine(total, enabled=progress)
        self._ended = False

    def skip_done(self, index: int, item: Item) -> bool:
        """True (counted and shown) when --resume found the item finished in the report."""
        if item.key not in self.finished:
            return False
        self.summary.skipped += 1
        self.bar.item(index, item.name)
        self.bar.done("skipped (done in a previous run)")
        return True

    def finish(self, index: int, item: Item, row: dict[str, Any], files: list[tuple[str, bytes]]) -> bool:
        """File an item's outputs (when ok), write its row, count and show it; True when the run must stop."""
        self.bar.item(index, item.name)
        if row["status"] == "ok":
            try:
                moved = set_aside(self.output / item.name, self.output / REPLACED / item.name, self.output)
                if moved is not None:
                    log.info("%s: the files of an earlier attempt were moved to %s", item.name, moved)
                row["outputs"] = save_outputs(files, self.output / item.name, self.output)
            except (OSError, ValueError) as exc:  # a disk full, a name the file system refuses (ValueError: a NUL
                # in a server's file name), a link planted in the output folder (OutputFolderError): this item
                # fails, the run goes on
                row.update(status="failed", error=f"its outputs could not be written: {exc}", outputs=[])
        self.writer.write(row)
        return account(self.summary, self.bar, row)

    def end(self, label: str = "") -> Summary:
        """Close the report, set the run time, log the one summary line (idempotent)."""
        if not self._ended:
            self._ended = True
            self.writer.close()
            self.summary.seconds = time.perf_counter() - self.started
            log.info("TokenFuse runner%s: %s; report %s", label, self.summary.line(), self.report_path)
        return self.summary


def run_items(comfy: Comfy, workflow: Workflow, target: RunTarget) -> Summary:
    """Run every item; returns the summary (its exit_code: 0 all ok, 1 some failed, 130 interrupted)."""
    items = workflow.items
    run = target.log(len(items))
    stop = {"requested": False}

    def on_sigint(signum: int, frame: Any) -> None:
        if stop["requested"]:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        stop["requested"] = True
        what = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
        sys.stderr.write(f"\nstopping ({what}) after interrupting the current item (Ctrl-C again to abort)\n")
        comfy.interrupt()

    # SIGTERM (timeout, systemd, Kubernetes, SLURM) is handled like Ctrl-C: the running item is interrupted and
    # reported, the ComfyUI closed (its work folder removed), exit 130; by default it killed the run on the spot.
    previous = {sig: signal.signal(sig, on_sigint) for sig in STOP_SIGNALS} if _main_thread() else {}
    try:
        fixed = {nid: comfy.stage(path) for nid, path in workflow.constants.items()}
        bound = StagedPrompt(workflow.prompt, workflow.slot, fixed)
        for index, item in enumerate(items, 1):
            if stop["requested"]:
                run.summary.interrupted = True
                break
            if run.skip_done(index, item):
                continue
            run.bar.item(index, item.name)
            row, files = process_item(comfy, bound, item, run.bar.step)
            if run.finish(index, item, row, files):
                break
    finally:
        run.end()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return run.summary


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
