"""Model folders (ComfyUI's folder_paths, the pack's overrides) and model files by name.

One `model_dirs(kind)` for every model the pack reads, honouring the same overrides everywhere; names from prompts
resolve inside those folders only (faces/model_paths.resolve_model).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from ...faces.model_paths import MODELS_ENV, WINDOWS_DEVICE_NAMES, ModelLookup, Want, resolve_model
from .env import comfy_available

ModelKind = Literal["facedetection", "insightface", "facerestore_models"]
FACERESTORE_FOLDER: ModelKind = "facerestore_models"


def model_dirs(kind: ModelKind) -> list[Path]:
    """Folders searched for models of `kind`, in order: ComfyUI's models/<kind> (registered with folder_paths on
    first use, as other face packs do) and its extra_model_paths entries (those first when the yaml names the kind),
    then $TOKENFUSE_MODELS/<kind> when that variable is set (the only folder outside ComfyUI). Folders that do not
    exist are listed too (the download target, the error message)."""
    dirs: list[Path] = []
    if comfy_available():
        try:
            import folder_paths

            default = os.path.join(folder_paths.models_dir, kind)
            known = folder_paths.folder_names_and_paths.get(kind)
            if known is None or default not in known[0]:
                # also when extra_model_paths.yaml named the kind first: ComfyUI loads it before custom nodes, and
                # models/<kind> (where the README says to put the files) must stay searched (after the yaml's)
                folder_paths.add_model_folder_path(kind, default)
            dirs = [Path(p) for p in folder_paths.get_folder_paths(kind)]
        except ImportError:
            pass
    root = os.environ.get(MODELS_ENV)
    if root:
        extra = Path(root) / kind
        if extra not in dirs:
            dirs.append(extra)
    return dirs


def list_models(kind: ModelKind, extensions: tuple[str, ...]) -> list[str]:
    """Names (relative to their folder, "/"-separated) of the files with one of `extensions` in model_dirs(kind) that
    resolve_model accepts; sorted, without duplicates; [] when there are none. Linked folders are followed once:
    a link back up (`models -> .`) would list every file again per level, and two of them never end."""
    out: set[str] = set()
    for root in model_dirs(kind):
        if not root.is_dir():
            continue
        real_root = root.resolve()
        seen = {real_root}
        for dirpath, dirnames, files in os.walk(root, followlinks=True):
            kept = []
            for d in sorted(dirnames):
                real = (Path(dirpath) / d).resolve()
                if real not in seen and real.is_relative_to(real_root):
                    seen.add(real)
                    kept.append(d)
            dirnames[:] = kept
            for f in files:
                if not f.lower().endswith(extensions):
                    continue
                path = Path(dirpath) / f
                if path.resolve().is_relative_to(real_root):
                    out.add(path.relative_to(root).as_posix())
    return sorted(out)


def model_path(kind: ModelKind, name: str, lookup: ModelLookup) -> Path:
    """The real path of model `name` of `kind` inside model_dirs(kind); ModelPathError (naming the folders searched)
    otherwise. Absolute names only with TOKENFUSE_ALLOW_ABSOLUTE_MODEL_PATHS=1."""
    return resolve_model(name, model_dirs(kind), lookup)


def insightface_model(name: str, what: str) -> Path:
    """Path of an ONNX model named in a prompt, inside models/insightface (ModelPathError naming the fix otherwise):
    the identity pre-swap's inswapper and its ArcFace model. The error names the file, the folders searched and where
    to download it (faces/model_sources.py)."""
    from ...faces.model_sources import get_it

    return model_path("insightface", name, ModelLookup(what, fix=get_it(name, "insightface")))


def file_stamp(
    kind: ModelKind,
    name: str,
    *,
    want: Want = "file",
    candidates: Callable[[str], Sequence[str]] = lambda n: (n,),
) -> str:
    """A model file's (or a pack folder's files') identity for a node's IS_CHANGED: real path, mtime and size, so a
    model replaced under the same name runs the node again (ComfyUI saw the same name and showed the old result); ""
    when the name does not resolve (the node's own check names the problem when it runs)."""
    if not name or name == "none":
        return ""
    try:
        path = model_path(kind, name, ModelLookup("model", want=want, candidates=candidates))
        files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else [path]
        stats = [(f.name, f.stat()) for f in files]
    except (OSError, ValueError):
        return ""
    return f"{path}:" + ";".join(f"{n}:{st.st_mtime_ns}:{st.st_size}" for n, st in stats)


# ------------------------------------------------------------------------------------------------ files the pack writes
OUTPUT_DIR_ENV = "TOKENFUSE_OUTPUT_DIR"
OUTPUT_SUBFOLDER = "tokenfuse"  # under ComfyUI's output folder when OUTPUT_DIR_ENV is not set


class OutputPathError(ValueError):
    """A file the pack was asked to write would land outside its output folder; the message names the rule."""


def output_dir() -> Path:
    """The one folder the pack writes files into (telemetry JSONL): $TOKENFUSE_OUTPUT_DIR when the server operator sets
    it (its parent must exist), else ComfyUI's output folder + `tokenfuse/` (ComfyUI's output folder is created if the
    server has not made it yet). No folder named by a prompt is ever created."""
    configured = os.environ.get(OUTPUT_DIR_ENV)
    if configured:
        base = Path(configured)
    elif comfy_available():
        comfy_output = Path(importlib.import_module("folder_paths").get_output_directory())
        comfy_output.mkdir(
            parents=True, exist_ok=True
        )  # ComfyUI's own folder (it makes it lazily too), never a prompt's
        base = comfy_output / OUTPUT_SUBFOLDER
    else:
        raise OutputPathError(f"no output folder outside ComfyUI: set {OUTPUT_DIR_ENV} to a folder for TokenFuse files")
    if not base.parent.is_dir():
        raise OutputPathError(
            f"TokenFuse's output folder {base} has no parent folder; create it or set {OUTPUT_DIR_ENV}"
        )
    base.mkdir(exist_ok=True)
    return base


def output_file(name: str) -> Path:
    """Where a file named by a prompt (a bare file name, already validated by its schema) is written: inside
    output_dir(), never through a symlink or `..`, never a Windows device name. Raises OutputPathError otherwise."""
    if not name or os.sep in name or (os.altsep and os.altsep in name) or name in (".", "..") or ".." in name:
        raise OutputPathError(f"{name[:80]!r} is not a bare file name: TokenFuse only writes inside its output folder")
    if name.split(".")[0].strip().casefold() in WINDOWS_DEVICE_NAMES:
        raise OutputPathError(f"{name[:80]!r} is a device name on Windows: choose another file name")
    base = output_dir().resolve()
    target = base / name
    if target.is_symlink() or target.resolve().parent != base:
        raise OutputPathError(f"{name[:80]!r} resolves outside TokenFuse's output folder {base}; refusing to write it")
    return target
