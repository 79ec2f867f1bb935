"""Calibration answers kept on disk per machine (scheduling/calibrate.py): a level's keep / drop decision changes the
samples, so it is made once per device and shape, not once per process. Timing noise, load from other processes or
which process measured first then cannot make two runs of one workflow, two servers on one machine, or the Ray
workers of one run compute different faces from the same seed.

One small JSON file per answer in $TOKENFUSE_CALIBRATION_DIR, else $XDG_CACHE_HOME/tokenfuse/calibration (default
~/.cache/tokenfuse/calibration). The key holds the device model (GPU name and compute capability, or the CPU model)
and the torch version, so new hardware or a new torch build calibrates again by itself; not the thread count, which
differs between a server, a runner and its Ray workers (pinned to their CPU share) on one machine: they must read the
same answer. Delete the folder to calibrate again on purpose.

Race-free by construction: the first process to answer a key wins and no answer is ever overwritten. The file is
written under a temporary name and hard-linked to its final name (`os.link` fails on an existing name, and a reader
never sees a partial file); where the file system has no hard links it is created with O_CREAT | O_EXCL and filled,
and a reader waits up to `WAIT_S` for a file that does not parse yet. Every process that measured a different answer
adopts the stored one before using it (calibrate.check_level). A file that holds no readable answer (cut short by a
killed writer, edited by hand) is skipped for the key's next alternate name, the same sequence in every process, so
they still meet on one answer. A folder that cannot be written keeps the answers in the process only (logged once).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

ENV = "TOKENFUSE_CALIBRATION_DIR"
SLOTS = 4  # a key's file name, then alternates used only after a file that holds no readable answer
WAIT_S = 2.0  # a file younger than this that does not parse yet is being written (no hard links): wait for it
_POLL_S = 0.02
_warned: set[str] = set()


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
    """What decides a timing besides the shapes: the device model and the torch build (not the thread count: every
    process on the machine must read the same answer, whatever share of the CPU it was given)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = f"{torch.cuda.get_device_name(index)} sm{'.'.join(map(str, torch.cuda.get_device_capability(index)))}"
    elif device.type == "cpu":
        name = _cpu_model()
    else:
        name = device.type
    return f"{name} / torch {torch.__version__}"


def _paths(key: tuple[Any, ...], device: torch.device) -> list[Path]:
    """The key's file name, then its alternates (the same sequence in every process)."""
    digest = hashlib.sha256(repr((key, machine(device))).encode()).hexdigest()[:32]
    base = folder()
    return [base / f"{digest}.json"] + [base / f"{digest}.{i}.json" for i in range(1, SLOTS)]


def _parse(path: Path, key: tuple[Any, ...], fields: Iterable[str]) -> dict[str, Any] | None:
    """The answer in `path` when it is complete and for `key`; None otherwise. FileNotFoundError: no file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != repr(key) or any(f not in data for f in fields):
        return None
    return data


def _read(path: Path, key: tuple[Any, ...], fields: Iterable[str]) -> tuple[bool, dict[str, Any] | None]:
    """(exists, answer): (False, None) no file; (True, answer); (True, None) a file with no readable answer for key
    (waited for while it is younger than WAIT_S: a writer without hard links may still be filling it)."""
    fields = tuple(fields)
    while True:
        try:
            got = _parse(path, key, fields)
            if got is not None:
                return True, got
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return False, None
        except OSError:
            return True, None
        if not 0 <= age < WAIT_S:
            return True, None
        time.sleep(_POLL_S)


def _create(path: Path, data: bytes) -> None:
    """Create `path` holding `data`, failing with FileExistsError when it exists (never replaces a file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calib_", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        try:
            os.link(tmp, path)  # atomic: the name appears with its whole content, or not at all
            return
        except FileExistsError:
            raise
        except OSError:  # no hard links on this file system (some FUSE, SMB, FAT mounts): exclusive create below
            pass
    finally:
        os.unlink(tmp)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _keep_in_process(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        log.warning(
            "TokenFuse: balanced's device-aware decisions are kept in this process only (%s): other processes on "
            "this machine may decide differently; set %s to a writable folder",
            reason,
            ENV,
        )


def load(key: tuple[Any, ...], device: torch.device, fields: Iterable[str] = ()) -> dict[str, Any] | None:
    """The stored answer for key on this machine, or None (none yet). `fields`: what a usable answer must hold."""
    fields = tuple(fields)
    try:
        paths = _paths(key, device)
    except OSError:
        return None
    for path in paths:
        exists, got = _read(path, key, fields)
        if not exists or got is not None:
            return got
    return None


def save(
    key: tuple[Any, ...], device: torch.device, answer: dict[str, Any], fields: Iterable[str] = ()
) -> dict[str, Any] | None:
    """Store `answer` unless another process stored one first; returns that other answer (None: this one stands).

    Never overwrites: on an existing file its answer is returned (the caller must use it); a file with no readable
    answer moves the key to its next alternate name."""
    fields = tuple(fields)
    record = {"key": repr(key), "machine": machine(device), **answer}
    data = json.dumps(record).encode("utf-8")
    try:
        paths = _paths(key, device)
        paths[0].parent.mkdir(parents=True, exist_ok=True)
        for path in paths:
            for _ in range(3):  # a file removed between create and read (the folder being cleared): try the name again
                try:
                    _create(path, data)
                    return None
                except FileExistsError:
                    exists, theirs = _read(path, key, fields)
                    if theirs is not None:
                        return theirs
                    if exists:
                        log.warning(
                            "TokenFuse: calibration file %s holds no readable answer; using the next name", path
                        )
                        break
    except OSError as exc:
        _keep_in_process(str(exc))
        return None
    _keep_in_process(f"{SLOTS} unreadable files for one key")
    return None
