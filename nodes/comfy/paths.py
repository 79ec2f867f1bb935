"""Model folders (ComfyUI's folder_paths, the pack's overrides) and model files by name.

One `model_dirs(kind)` for every model the pack reads, honouring the same overrides everywhere; names from prompts
resolve inside those folders only (faces/model_paths.resolve_model).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from ...faces.model_paths import MODELS_ENV, Want, resolve_model
from .env import comfy_available

ModelKind = Literal["facedetection", "insightface", "facerestore_models"]
FACERESTORE_FOLDER: ModelKind = "facerestore_models"


def model_dirs(kind: ModelKind) -> list[Path]:
    """Folders searched for models of `kind`, in order: ComfyUI's models/<kind> (registered with folder_paths on
    first use, as other face packs do) and its extra_model_paths entries, then $TOKENFUSE_MODELS/<kind> when that
    variable is set (the only folder outside ComfyUI). Folders that do not exist are listed too (the download
    target, the error message)."""
    dirs: list[Path] = []
    if comfy_available():
        try:
            import folder_paths

            if kind not in folder_paths.folder_names_and_paths:
                folder_paths.add_model_folder_path(kind, os.path.join(folder_paths.models_dir, kind))
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
    resolve_model accepts; sorted, without duplicates; [] when there are none."""
    out: set[str] = set()
    for root in model_dirs(kind):
        if not root.is_dir():
            continue
        real_root = root.resolve()
        for dirpath, _, files in os.walk(root, followlinks=True):
            for f in files:
                if not f.lower().endswith(extensions):
                    continue
                path = Path(dirpath) / f
                if path.resolve().is_relative_to(real_root):
                    out.add(path.relative_to(root).as_posix())
    return sorted(out)


def model_path(
    kind: ModelKind,
    name: str,
    what: str,
    *,
    want: Want = "file",
    candidates: Callable[[str], Sequence[str]] = lambda n: (n,),
    fix: str = "",
) -> Path:
    """The real path of model `name` of `kind` inside model_dirs(kind); ModelPathError (naming the folders searched)
    otherwise. Absolute names only with TOKENFUSE_ALLOW_ABSOLUTE_MODEL_PATHS=1."""
    return resolve_model(name, model_dirs(kind), what=what, want=want, candidates=candidates, fix=fix)
