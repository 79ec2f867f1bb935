"""Calibration answers kept on disk per machine (scheduling/calibrate.py): a level's keep / drop decision changes the
samples, so it is made once per device and shape, not once per process. Timing noise then cannot make two runs of
one workflow, or the Ray workers of one run, compute different faces from the same seed.

One small JSON file per answer in $TOKENFUSE_CALIBRATION_DIR, else $XDG_CACHE_HOME/tokenfuse/calibration (default
~/.cache/tokenfuse/calibration). The key holds the machine (GPU name and compute capability, or the CPU model and
the thread count) and the torch version, so new hardware or a new torch build calibrates again by itself; delete the
folder to calibrate again on purpose. The first process to answer a key wins (the file is created with `os.link`,
which fails on an existing name) and later ones adopt its answer. A folder that cannot be written keeps the answers
in the process only (as before).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

ENV = "TOKENFUSE_CALIBRATION_DIR"


def folder() -> Path:
    """Where the answers live (see module docstring); not created here."""
    configured = os.environ.get(ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError as exc:  # no $HOME and no passwd entry (a container run with an arbitrary --user uid)
            raise OSError(f"no home folder for the calibration store ({exc}); set {ENV}") from exc
    return Path(base) / "tokenfuse" / "calibration"


@functools.lru_cache(maxsize=8)
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: torch.device) -> str:
    """What decides a timing besides the shapes: the device model, (CPU) the threads in use, the torch build."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = f"{torch.cuda.get_device_name(index)} sm{'.'.join(map(str, torch.cuda.get_device_capability(index)))}"
    elif device.type == "cpu":
        name = f"{_cpu_model()} x{torch.get_num_threads()} threads"
    else:
        name = device.type
    return f"{name} / torch {torch.__version__}"


def _path(key: tuple[Any, ...], device: torch.device) -> Path:
    digest = hashlib.sha256(repr((key, machine(device))).encode()).hexdigest()[:32]
    return folder() / f"{digest}.json"


def load(key: tuple[Any, ...], device: torch.device) -> dict[str, Any] | None:
    """The stored answer for key on this machine, or None (none yet, unreadable, or from another format)."""
    try:
        data = json.loads(_path(key, device).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == repr(key) else None


def save(key: tuple[Any, ...], device: torch.device, answer: dict[str, Any]) -> dict[str, Any] | None:
    """Store `answer` unless another process stored one first; returns that other answer (None: this one stands)."""
    record = {"key": repr(key), "machine": machine(device), **answer}
    try:
        path = _path(key, device)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calib_", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(record, out)
            os.link(tmp, path)  # atomic create: fails when another process answered first
        finally:
            os.unlink(tmp)
    except FileExistsError:
        return load(key, device)
    except OSError as exc:
        log.debug("TokenFuse: calibration not stored (%s); kept for this process", exc)
    return None
