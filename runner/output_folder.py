"""The runner's output folder (`-o`): what it writes, moves and deletes there never goes through a link.

Anyone who can create entries in the output folder (a shared or world-writable `-o`) could otherwise plant a symbolic
link where the runner writes (`report.jsonl`, an item's folder, `.replaced`) and make it truncate, overwrite or delete
files elsewhere. So every entry the runner touches below the folder is checked first, component by component with
lstat: a link (or a Windows junction) is refused with OutputFolderError naming the entry, and so is a target whose
resolved path leaves the folder. New files are opened with O_NOFOLLOW (and O_EXCL where the runner creates them), a
file opened for writing must be a regular file with no other hard link, and deletes remove a link as a link: a tree is
removed with shutil.rmtree, which does not descend through links.

`-o` itself may be a link: the user named it, so it is resolved once when the run starts (output_root) and every
check is made against that folder.

The checks run just before each write, move or delete: they stop links that are in place when the runner gets there.
Someone who swaps a checked folder for a link in the instant between the check and the write is not stopped by them
(O_NOFOLLOW guards only a file's own name); an output folder only its user can write to closes that too.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import IO

from .errors import WorkflowError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows, where the lstat checks alone refuse links
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class OutputFolderError(WorkflowError):
    """An entry of the output folder is a link, leaves the folder, or is not what the runner expects there. Raised
    for `-o` itself or `report.jsonl` it stops the run (exit 2); raised for an item's files it fails that item."""


def refuse_non_folder(path: str | Path) -> None:
    """OutputFolderError when `-o` exists as something else than a folder (a regular file: `run ... -o photo.jpg`);
    checked before an engine starts, so a wrong command line costs nothing (exit 2)."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise OutputFolderError(f"output folder {path} exists and is not a folder: give a folder (-o), new or existing")


def output_root(path: str | Path) -> Path:
    """`-o` as a resolved folder, created when missing (parents too); OutputFolderError when it exists as something
    else than a folder or cannot be created."""
    refuse_non_folder(path)
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return folder.resolve(strict=True)
    except OSError as exc:  # a parent that is a file, a dangling link, no permission
        raise OutputFolderError(f"output folder {path} cannot be created: {exc.strerror or exc}") from exc


def _is_link(path: Path, st: os.stat_result) -> bool:
    isjunction = getattr(os.path, "isjunction", None)  # Python 3.12+: a Windows junction is a link too
    return stat.S_ISLNK(st.st_mode) or bool(isjunction is not None and isjunction(path))


def _inside(path: str, root: Path) -> bool:
    try:
        return os.path.commonpath([path, str(root)]) == str(root)
    except ValueError:  # another drive
        return False


def check_entry(root: Path, path: Path) -> Path:
    """`path` (below the resolved folder `root`) when none of its existing components below `root` is a link and it
    resolves inside `root`; OutputFolderError naming the first offending entry otherwise. Components that do not
    exist yet end the walk: the caller creates them (make_folders, open_report, write_new refuse links again)."""
    try:
        parts = path.relative_to(root).parts
    except ValueError as exc:
        raise OutputFolderError(f"{path} is outside the output folder {root}") from exc
    current = root
    for part in parts:
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            break
        if _is_link(current, st):
            raise OutputFolderError(
                f"{current} is a link (planted in the output folder?): the runner never writes, moves or deletes "
                "through a link; remove it, or give an output folder only you can write to"
            )
    if not _inside(os.path.realpath(path), root):
        raise OutputFolderError(f"{path} resolves outside the output folder {root}")
    return path


def make_folders(root: Path, folder: Path) -> Path:
    """Create `folder` and its missing parents below `root`, each as a real folder: an existing component that is a
    link or not a folder is an OutputFolderError (os.mkdir never follows a link)."""
    check_entry(root, folder)
    current = root
    for part in folder.relative_to(root).parts:
        current = current / part
        try:
            os.mkdir(current)
        except FileExistsError:
            st = os.lstat(current)
            if _is_link(current, st):
                check_entry(root, current)  # raises, naming the link
            if not stat.S_ISDIR(st.st_mode):
                raise OutputFolderError(f"{current} is in the way: a file where the runner needs a folder") from None
    return folder


def _own_regular_file(fd: int, path: Path) -> None:
    """OutputFolderError unless the open `fd` is a regular file with one name (a hard link planted to a file
    elsewhere would otherwise be written through, as a symbolic link would)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} hard links"
        raise OutputFolderError(f"{path} is {what}: the runner writes only files of its own there; remove it")


def _open_nofollow(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC, 0o644)
    except OSError as exc:
        if os.path.islink(path):  # ELOOP (Linux), EMLINK (FreeBSD), EFTYPE (NetBSD): the final component is a link
            raise OutputFolderError(f"{path} is a link: the runner never writes through a link; remove it") from exc
        raise


def open_report(root: Path, path: Path, append: bool) -> IO[str]:
    """`path` (the report) opened for text writing, appended to or emptied, without following a link: the file is
    created when missing, and an existing one must be a regular file with no other hard link (checked before it is
    emptied)."""
    check_entry(root, path)
    try:
        fd = _open_nofollow(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0))
    except OutputFolderError:
        raise
    except OSError as exc:  # a folder of that name, a read-only output folder: the run cannot keep its report
        raise OutputFolderError(f"the report {path} cannot be written: {exc.strerror or exc}") from exc
    try:
        _own_regular_file(fd, path)
        if not append:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, "a" if append else "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def read_report(root: Path, path: Path) -> str | None:
    """The report's text (None when there is none), refusing a link: --resume must not read a file elsewhere."""
    check_entry(root, path)
    try:
        fd = _open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OutputFolderError(f"{path} is not a regular file: move it away")
        return fh.read().decode("utf-8", errors="replace")


def write_new(path: Path, data: bytes) -> None:
    """Write `data` to `path`, a name that must not exist yet (O_CREAT | O_EXCL | O_NOFOLLOW: never an existing
    file, never through a link). The caller has checked the folder (check_entry / make_folders)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | getattr(os, "O_BINARY", 0), 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def remove_entry(root: Path, path: Path) -> None:
    """Delete `path` below `root` (nothing when absent): a link is removed as a link (what it points to stays), a
    folder with shutil.rmtree, which removes links inside it as links and never descends through them."""
    check_entry(root, path.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode) and not _is_link(path, st):
        shutil.rmtree(path)
    elif stat.S_ISDIR(st.st_mode):  # a Windows junction: rmdir removes the junction, not what it points to
        os.rmdir(path)
    else:
        os.unlink(path)
