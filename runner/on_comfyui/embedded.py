"""ComfyUI embedded in this process: its own validate_prompt + PromptExecutor, kept warm between items (the
executor's output cache keeps loaded models, so only the nodes downstream of the changed input run again).

ComfyUI is found from --comfyui PATH, COMFYUI_PATH, or the pack's location (<ComfyUI>/custom_nodes/<pack>). Every
`comfy` / `execution` / `nodes` import is inside functions: importing this module costs nothing.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ...scheduling.schedule import TELEMETRY_NAME
from .convert import node_info
from .protocol import PARTIAL_INVALID, ExecResult, OutputFile, Progress, missing_saves, output_entries

log = logging.getLogger("tokenfuse.runner")
PACK_DIR = Path(__file__).absolute().parents[2]
# STRING outputs of the pack that carry a report: class -> output slot
REPORT_SLOTS = {"TokenFuseScheduledFusion": 2, "TokenFuseGFPGANEnhance": 2, "TokenFuseTokenSchedulerController": 1}


RUN_PREFIX = "tokenfuse_run_"  # EmbeddedComfy's own work folder in the system temp folder (tempfile.mkdtemp)
RUN_FOLDER = re.compile(r"tokenfuse_run_[a-z0-9_]{8}")  # mkdtemp adds 8 characters of [a-z0-9_]
STALE_RUN_S = 24 * 3600  # a work folder untouched this long, its lock not held, was left by a killed runner
RUN_LOCK = ".lock"  # held (flock) by the live process that owns the work folder
NAME_MAX_BYTES = 255  # one file-name component on ext4, APFS, NTFS (UTF-8 bytes; NTFS counts UTF-16 units, fewer)


def staged_name(prefix: str, name: str) -> str:
    """prefix + name, the stem cut (whole UTF-8 characters) so the result stays one valid file name: an input named
    with 250 bytes is legal, 6 more from the prefix are not (ENAMETOOLONG failed the item)."""
    stem, suffix = os.path.splitext(name)
    room = max(1, NAME_MAX_BYTES - len(prefix.encode()) - len(suffix.encode()))
    return prefix + stem.encode()[:room].decode("utf-8", "ignore") + suffix


def find_comfyui(explicit: str | Path | None = None) -> Path:
    """The ComfyUI checkout to embed: explicit path, $COMFYUI_PATH, or the one this pack is installed in."""
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit).expanduser())
    elif os.environ.get("COMFYUI_PATH"):
        candidates.append(Path(os.environ["COMFYUI_PATH"]).expanduser())
    else:
        candidates += [PACK_DIR.parents[1], Path(os.path.realpath(PACK_DIR)).parents[1]]
    for c in candidates:
        if (c / "comfy").is_dir() and (c / "execution.py").is_file():
            return c.resolve()
    where = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"no ComfyUI checkout found (looked at {where}): install the pack in ComfyUI/custom_nodes, "
        "or pass --comfyui PATH (or set COMFYUI_PATH)"
    )


class EmbeddedComfy:
    """A warm in-process ComfyUI with this pack's nodes registered.

    cpu: ComfyUI's --cpu. sdpa: --use-pytorch-cross-attention. work_dir: where inputs are staged and ComfyUI writes
    (input/, output/, temp/); a temp folder by default, removed by close(). extra_nodes: more node classes to
    register (the demo's model loader).
    """

    def __init__(
        self,
        comfyui: str | Path | None = None,
        cpu: bool = False,
        sdpa: bool = False,
        work_dir: Path | None = None,
        extra_nodes: dict[str, type] | None = None,
    ) -> None:
        self.path = find_comfyui(comfyui)
        if str(self.path) not in sys.path:
            sys.path.insert(0, str(self.path))
        import comfy.cli_args

        if "comfy.model_management" not in sys.modules:
            comfy.cli_args.args.cpu = cpu or comfy.cli_args.args.cpu or not _accelerator_present()
            comfy.cli_args.args.use_pytorch_cross_attention = sdpa or comfy.cli_args.args.use_pytorch_cross_attention
        import comfy.model_management  # noqa: F401  (fixes device and attention now)

        # Order matters (ComfyUI needs utils.extra_config before its nodes module; execution imports nodes).
        extra_config = importlib.import_module("utils.extra_config")
        nodes = importlib.import_module("nodes")
        execution = importlib.import_module("execution")
        folder_paths = importlib.import_module("folder_paths")

        if not hasattr(nodes, "common_ksampler"):
            raise ImportError(f"'nodes' resolved to {nodes.__file__}, not ComfyUI's nodes.py")
        yaml_path = self.path / "extra_model_paths.yaml"
        if yaml_path.is_file():
            extra_config.load_extra_path_config(str(yaml_path))
        if not getattr(nodes, "_tokenfuse_runner_extras", False):
            asyncio.run(nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
            setattr(nodes, "_tokenfuse_runner_extras", True)  # noqa: B010 - a flag on ComfyUI's module, untyped
        from ... import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

        nodes.NODE_CLASS_MAPPINGS.update({**NODE_CLASS_MAPPINGS, **(extra_nodes or {})})
        nodes.NODE_DISPLAY_NAME_MAPPINGS.update(NODE_DISPLAY_NAME_MAPPINGS)
        self._own_dir = work_dir is None
        self._lock: int | None = None
        if work_dir is None:
            sweep_stale_run_folders()  # what runners killed with SIGKILL left (their staged inputs and outputs)
            self.work = Path(tempfile.mkdtemp(prefix=RUN_PREFIX))
            self._lock = hold_run_lock(self.work)
        else:
            self.work = work_dir
        for sub in ("input", "output", "temp"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        folder_paths.set_input_directory(str(self.work / "input"))
        folder_paths.set_output_directory(str(self.work / "output"))
        folder_paths.set_temp_directory(str(self.work / "temp"))
        self._nodes, self._execution, self._folder_paths = nodes, execution, folder_paths
        self._server = SimpleNamespace(client_id=None, last_node_id=None, send_sync=lambda *a, **k: None)
        self.executor = execution.PromptExecutor(self._server)
        self._counter = itertools.count()
        log.info("embedded ComfyUI %s (device %s)", self.path, comfy.model_management.get_torch_device())

    def node_defs(self) -> dict[str, dict[str, Any]]:
        defs = {}
        for name, cls in self._nodes.NODE_CLASS_MAPPINGS.items():
            try:
                defs[name] = node_info(cls, name)
            except Exception as e:  # noqa: BLE001 - one broken node definition must not stop the runner
                log.debug("node %s has no usable definition: %s", name, e)
        return defs

    def stage(self, path: Path) -> str:
        """Link (or copy) `path` into ComfyUI's input folder under a unique name; returns that name."""
        name = staged_name(f"{next(self._counter):05d}_", path.name)
        dst = self.work / "input" / name
        try:
            dst.symlink_to(path.resolve())
        except OSError:
            shutil.copyfile(path, dst)
        return name

    def unstage(self, name: str) -> None:
        """Remove a name `stage` returned from ComfyUI's input folder (the file it links to stays)."""
        (self.work / "input" / name).unlink(missing_ok=True)

    def clear_outputs(self) -> None:
        """Delete every file the workflows saved so far (a Ray worker calls it once an item's files were read)."""
        shutil.rmtree(self.work / "output", ignore_errors=True)
        (self.work / "output").mkdir(parents=True, exist_ok=True)

    def execute(self, prompt: dict[str, dict[str, Any]], progress: Progress | None = None) -> ExecResult:
        import comfy.model_management as mm
        import comfy.utils
        import torch

        from ...nodes.glue.paths import OUTPUT_SUBFOLDER  # the pack's telemetry folder (without $TOKENFUSE_OUTPUT_DIR)

        prompt_id = str(uuid.uuid4())
        pack_output = self.work / "output" / OUTPUT_SUBFOLDER
        before = file_stamps(pack_output)
        valid, error, outputs, node_errors = asyncio.run(self._execution.validate_prompt(prompt_id, prompt, None))
        refused = validation_error(valid, error, node_errors)
        if refused:
            return ExecResult(ok=False, error=refused)
        if progress is not None:
            comfy.utils.set_progress_bar_global_hook(lambda value, total, *a, **k: progress(int(value), int(total)))
        cuda = torch.cuda.is_available() and mm.get_torch_device().type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            self.executor.execute(prompt, prompt_id, {}, outputs)
        finally:
            comfy.utils.set_progress_bar_global_hook(None)
        peak, kind = _peak_memory(cuda)
        messages = self.executor.status_messages
        interrupted = any(m[0] == "execution_interrupted" for m in messages)
        errors = [m[1] for m in messages if m[0] == "execution_error"]
        if interrupted or errors or not self.executor.success:
            text = "interrupted" if interrupted else _error_message(errors)
            return ExecResult(ok=False, error=text, interrupted=interrupted, peak_memory_mib=peak, memory_kind=kind)
        saved = output_entries(self.executor.history_result["outputs"])
        unsaved = missing_saves(prompt, saved)
        if unsaved:
            return ExecResult(ok=False, error=unsaved, peak_memory_mib=peak, memory_kind=kind)
        files: list[OutputFile] = []
        for e in (e for entries in saved.values() for e in entries):
            local = self.work / "output" / e.get("subfolder", "") / e["filename"]
            files.append(OutputFile(e["filename"], e.get("subfolder", ""), local.read_bytes, local))
        saved_paths = {f.local for f in files}  # a save node's prefix `tokenfuse/...` writes into that folder too
        written = [
            OutputFile(path.name, OUTPUT_SUBFOLDER, path.read_bytes, path)
            for path in changed_files(pack_output, before)
            if path not in saved_paths
        ]
        texts: dict[str, str] = {}
        for nid, node in prompt.items():
            slot = REPORT_SLOTS.get(node["class_type"])
            cached = self.executor.caches.outputs.get(nid) if slot is not None else None
            if cached is not None:
                value = getattr(cached, "outputs", cached)[slot]
                texts[nid] = "\n".join(str(v) for v in value)
        return ExecResult(ok=True, outputs=files, texts=texts, written=written, peak_memory_mib=peak, memory_kind=kind)

    def interrupt(self) -> None:
        self._nodes.interrupt_processing(True)

    def close(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.work, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def hold_run_lock(folder: Path) -> int | None:
    """Create `folder/.lock` and hold an exclusive flock on it; returns the descriptor to keep open while the folder
    is in use (the system releases the lock when the process ends, SIGKILL included), so sweep_stale_run_folders
    leaves a live runner's folder alone however long its run. None without fcntl (Windows: the folder's age alone
    decides)."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(folder / RUN_LOCK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def _lock_held(folder: Path) -> bool:
    """True when a live process holds `folder/.lock` (hold_run_lock); False without a lock file or fcntl."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(folder / RUN_LOCK, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:  # no lock file (a runner killed before it made one), or a link: the age decides
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases the lock just taken
    return False


def _last_touched(folder: Path) -> float:
    """The newest mtime of the work folder and its input/, output/, temp/ (staging an item touches input/)."""
    times = []
    for path in (folder, folder / "input", folder / "output", folder / "temp"):
        try:
            times.append(os.lstat(path).st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)


def sweep_stale_run_folders(root: Path | None = None, now: float | None = None) -> int:
    """Remove the `tokenfuse_run_XXXXXXXX` work folders in `root` (default: the system temp folder) that runners
    killed with SIGKILL left (the staged photos, the outputs): only folders of exactly that name, owned by this user,
    untouched for STALE_RUN_S, whose lock no live process holds; returns how many. A link of that name is not
    followed, and shutil.rmtree removes the links inside (staged inputs link to the user's files) as links."""
    root = Path(tempfile.gettempdir()) if root is None else root
    cutoff = (time.time() if now is None else now) - STALE_RUN_S
    uid = getattr(os, "getuid", lambda: None)()
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        if not RUN_FOLDER.fullmatch(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or (uid is not None and st.st_uid != uid):
                continue  # a link, a file, another user's folder
            folder = Path(entry.path)
            if _last_touched(folder) >= cutoff or _lock_held(folder):
                continue
            shutil.rmtree(folder)
            removed += 1
        except OSError:  # removed meanwhile, or not ours to remove
            continue
    if removed:
        log.info("removed %d stale runner work folder(s) in %s (left by killed runs)", removed, root)
    return removed


def file_stamps(folder: Path) -> dict[str, tuple[int, int]]:
    """name -> (mtime_ns, size) of the telemetry files (a schedule's `telemetry_jsonl` names) directly in `folder`
    ({} when it does not exist). Only those are stat'ed: the shipped workflows save into that folder too, and an
    in-process run keeps every item's outputs there until it ends."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return {}
    stamps = {}
    for e in entries:
        try:
            if TELEMETRY_NAME.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                stamps[e.name] = (st.st_mtime_ns, st.st_size)
        except OSError:  # removed meanwhile
            continue
    return stamps


def changed_files(folder: Path, before: dict[str, tuple[int, int]]) -> list[Path]:
    """The files of `folder` that are new or changed since `before` (file_stamps), by name: what one prompt wrote."""
    return [folder / name for name, stamp in sorted(file_stamps(folder).items()) if before.get(name) != stamp]


def _peak_memory(cuda: bool) -> tuple[float | None, str]:
    if cuda:
        import torch

        return torch.cuda.max_memory_allocated() / 2**20, "cuda max_memory_allocated"
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process peak RSS (cumulative)"
    except ImportError:  # Windows
        return None, ""


def validation_error(valid: bool, error: Any, node_errors: dict[str, Any]) -> str:
    """The error of validate_prompt's answer ("" when the prompt may run). Its `valid` is True as soon as one output
    validates, and ComfyUI would then run only those: any node error fails the item instead, so a workflow whose
    save node is invalid never reports ok with no outputs (which `--resume` would skip forever)."""
    if valid and not node_errors:
        return ""
    return _validation_message(error or PARTIAL_INVALID, node_errors)


def _validation_message(error: Any, node_errors: dict[str, Any]) -> str:
    parts = [str(error.get("message", error)) if isinstance(error, dict) else str(error)]
    for nid, ne in (node_errors or {}).items():
        for e in ne.get("errors", []):
            parts.append(f"node {nid} ({ne.get('class_type')}): {e.get('message')}: {e.get('details')}")
    return "; ".join(p for p in parts if p)


def _error_message(errors: list[dict[str, Any]]) -> str:
    if not errors:
        return "execution failed"
    e = errors[0]
    return f"node {e.get('node_id')} ({e.get('node_type')}): {e.get('exception_type')}: {e.get('exception_message')}"


def _accelerator_present() -> bool:
    """True when torch sees a CUDA/ROCm, XPU or MPS device; without one ComfyUI must run with --cpu (a CUDA build of
    torch on a machine without a driver would fail at start-up), so the runner picks it by itself."""
    import torch

    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return True
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())
