"""Model folders (ComfyUI's folder_paths, the pack's overrides) and model files by name."""

from __future__ import annotations

from .env import comfy_available

# ------------------------------------------------------------------------------------------------ model files / memory
FACERESTORE_FOLDER = "facerestore_models"


def facerestore_dirs() -> list[str]:
    """Folders searched for face-restoration models: ComfyUI's models/facerestore_models (registered with
    folder_paths on first use, like other face packs do) plus any extra_model_paths entries; [] outside ComfyUI."""
    if not comfy_available():
        return []
    try:
        import folder_paths
    except ImportError:
        return []
    import os

    default = os.path.join(folder_paths.models_dir, FACERESTORE_FOLDER)
    folder_paths.add_model_folder_path(FACERESTORE_FOLDER, default)  # no-op when already listed
    return folder_paths.get_folder_paths(FACERESTORE_FOLDER)


def list_facerestore_models(extensions: tuple[str, ...]) -> list[str]:
    """File names (relative to the facerestore folders) with one of `extensions`; [] outside ComfyUI."""
    if not facerestore_dirs():
        return []
    import folder_paths

    return [f for f in folder_paths.get_filename_list(FACERESTORE_FOLDER) if f.lower().endswith(extensions)]


def facerestore_model_path(name: str) -> str:
    """Full path of a face-restoration model: an existing absolute path as is (scripts, CI), else looked up in
    models/facerestore_models. Raises FileNotFoundError naming the folder and the fix."""
    import os

    if os.path.isabs(name) and os.path.isfile(name):
        return name
    dirs = facerestore_dirs()
    if dirs:
        import folder_paths

        path = folder_paths.get_full_path(FACERESTORE_FOLDER, name)
        if path:
            return path
    where = ", ".join(dirs) if dirs else "ComfyUI/models/facerestore_models (ComfyUI not running: give a full path)"
    raise FileNotFoundError(
        f"face-restoration model {name!r} not found in {where}: download e.g. GFPGANv1.4 (.safetensors preferred) "
        "into models/facerestore_models, then press R in ComfyUI to refresh the list."
    )


def insightface_dirs() -> list[str]:
    """Folders for insightface-style ONNX models (models/insightface), registering the name if ComfyUI lacks it."""
    if not comfy_available():
        return []
    import os

    import folder_paths

    if "insightface" not in folder_paths.folder_names_and_paths:
        folder_paths.add_model_folder_path("insightface", os.path.join(folder_paths.models_dir, "insightface"))
    return list(folder_paths.get_folder_paths("insightface"))


def list_insightface_onnx() -> list[str]:
    """ONNX files (relative names) under models/insightface; [] outside ComfyUI."""
    import os

    out: list[str] = []
    for root in insightface_dirs():
        if not os.path.isdir(root):
            continue
        for dirpath, _, files in os.walk(root):
            for f in files:
                if f.lower().endswith(".onnx"):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return sorted(set(out))


def insightface_model_path(name: str) -> str:
    """Full path of an ONNX model in models/insightface (an existing absolute path is returned as is)."""
    import os

    if os.path.isabs(name) and os.path.isfile(name):
        return name
    for root in insightface_dirs():
        path = os.path.join(root, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"model {name!r} not found in models/insightface: put the ONNX file (e.g. inswapper_128.onnx, "
        "w600k_r50.onnx) there and press R in ComfyUI to refresh the list."
    )


def face_model_dirs(kind: str) -> list[str]:
    """Model folders of `kind` ("facedetection" or "insightface"): ComfyUI's models/<kind> (registered on first use)
    plus extra_model_paths entries; outside ComfyUI, $TOKENFUSE_MODELS/<kind> when that variable is set, else []."""
    import os

    if comfy_available():
        try:
            import folder_paths

            if kind not in folder_paths.folder_names_and_paths:
                folder_paths.add_model_folder_path(kind, os.path.join(folder_paths.models_dir, kind))
            return list(folder_paths.get_folder_paths(kind))
        except ImportError:
            pass
    root = os.environ.get("TOKENFUSE_MODELS")
    return [os.path.join(root, kind)] if root else []
