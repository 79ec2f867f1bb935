"""Model files named in a prompt resolve inside the model folders, nowhere else (pure: no ComfyUI import).

Workflows come from strangers and a server accepts prompts from anyone who reaches it, so a model name is untrusted
text. `resolve_model` is the one place that turns such a name into a path:
- the name is joined to each model folder and resolved (symlinks followed); the result must stay inside that folder,
  so `../` climbing out and symlinks that point elsewhere are refused;
- absolute paths only when the server operator opts in with TOKENFUSE_ALLOW_ABSOLUTE_MODEL_PATHS=1 (then the
  path's folder is searched as a model folder for its last component);
- a missing, unreadable or refused file gives one message naming the folders searched, never the path tried, so an
  error cannot tell a prompt author whether some file exists on the server;
- names longer than MAX_NAME_CHARS are refused before any file system call (a 1 MB name would otherwise come back
  as a megabyte-long OS error).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .models import ModelFileError

# Names Windows keeps for devices, with any extension (`NUL.jsonl` writes to the null device there): never a name the
# pack writes (telemetry files, the runner's item folders).
WINDOWS_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul"} | {f"{dev}{i}" for dev in ("com", "lpt") for i in range(1, 10)}
)
MODELS_ENV = "TOKENFUSE_MODELS"  # a folder with <kind>/ subfolders, searched after ComfyUI's own (and outside it)
ALLOW_ABSOLUTE_ENV = "TOKENFUSE_ALLOW_ABSOLUTE_MODEL_PATHS"  # "1": the operator allows absolute paths in prompts
MAX_NAME_CHARS = 255  # a file name limit on common file systems; relative names with subfolders fit easily
_SHOWN_CHARS = 80  # echoed names are cut to this length

Want = Literal["file", "dir"]


class ModelPathError(ModelFileError, FileNotFoundError):
    """A model name that does not resolve to a readable file (or folder) inside the model folders.

    A ModelFileError like every face-model error, and a FileNotFoundError as the model lookups always raised.
    """


def absolute_paths_allowed() -> bool:
    """True when the operator set TOKENFUSE_ALLOW_ABSOLUTE_MODEL_PATHS=1 (or true/yes) in the server's environment."""
    return os.environ.get(ALLOW_ABSOLUTE_ENV, "").strip().lower() in {"1", "true", "yes"}


def shown(name: str) -> str:
    """`name` quoted for a message, cut to a sane length."""
    return repr(name if len(name) <= _SHOWN_CHARS else name[:_SHOWN_CHARS] + "...")


def _usable(path: Path, want: Want) -> bool:
    if want == "dir":
        return path.is_dir() and os.access(path, os.R_OK | os.X_OK)
    return path.is_file() and os.access(path, os.R_OK)


def _as_given(name: str) -> Sequence[str]:
    return (name,)


@dataclass(frozen=True)
class ModelLookup:
    """How a model name is looked up, and how the messages call it.

    what: how the message calls the model ("face-restoration model"). want: "file" or "dir" (an insightface pack).
    candidates: relative names to try for `name`, e.g. `(n, n + ".onnx")` or `("models/" + n, n)`.
    fix: a sentence appended to the not-found message (where to get the model).
    """

    what: str
    want: Want = "file"
    candidates: Callable[[str], Sequence[str]] = _as_given
    fix: str = ""


def resolve_model(name: str, folders: Sequence[str | Path], lookup: ModelLookup) -> Path:
    """The real path of model `name` inside one of `folders` (first folder, then first candidate, wins).

    Raises ModelPathError; never returns a path outside the folders unless the operator allowed absolute paths.
    """
    what, want, candidates, fix = lookup.what, lookup.want, lookup.candidates, lookup.fix
    if not isinstance(name, str) or not name.strip():
        raise ModelPathError(f"no {what} given: choose one from the list.")
    if len(name) > MAX_NAME_CHARS:
        raise ModelPathError(
            f"{what} name is {len(name)} characters long (the limit is {MAX_NAME_CHARS}): choose a model from the list."
        )
    searched = ", ".join(str(f) for f in folders) or f"none (run inside ComfyUI or set {MODELS_ENV})"
    not_found = ModelPathError(
        f"{what} {shown(name)} is not a readable {'folder' if want == 'dir' else 'file'} in the model folders "
        f"searched ({searched}). {fix}".rstrip()
    )
    if "\x00" in name:
        raise not_found
    if os.path.isabs(name) or name.startswith("~"):
        if not absolute_paths_allowed():
            raise ModelPathError(
                f"{what} {shown(name)} is an absolute path: give a name inside the model folders ({searched}), or "
                f"set {ALLOW_ABSOLUTE_ENV}=1 in the server's environment to allow absolute paths in prompts."
            )
        # The operator allowed it: the path's folder is searched like a model folder, for its last component.
        path = Path(os.path.expanduser(name))
        folders, name = [path.parent], path.name
    for folder in folders:
        try:
            root = Path(folder).resolve()
        except (OSError, RuntimeError):
            continue
        for rel in candidates(name):
            try:
                real = (root / rel).resolve(strict=True)
            except (OSError, RuntimeError, ValueError):  # missing, a symlink loop, an invalid name
                continue
            if real != root and real.is_relative_to(root) and _usable(real, want):
                return real
    raise not_found
