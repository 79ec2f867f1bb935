"""ComfyUI side of the video nodes (VIDEO in/out, temp folder), imported lazily like the rest of nodes/glue/.

Every helper works outside ComfyUI too (plain paths), which is how CI runs the video nodes.
"""

from __future__ import annotations

import importlib
import io
import os
import tempfile
import uuid
from typing import Any

from .env import comfy_available


def stream_source(video: Any) -> str | io.BytesIO:
    """The streamable source of a VIDEO: `get_stream_source()` (a path or BytesIO), never `get_components()`
    (that decodes every frame into one float tensor). A plain path or binary file object is accepted as is."""
    if hasattr(video, "get_stream_source"):
        return video.get_stream_source()
    if isinstance(video, (str, os.PathLike)):
        return str(video)
    if hasattr(video, "read") and hasattr(video, "seek"):
        return video
    raise TypeError(
        f"video must be a VIDEO (connect the core Load Video node), got {type(video).__name__}",
    )


def output_path(prefix: str = "tokenfuse_video") -> str:
    """A fresh .mp4 path in ComfyUI's temp folder (the system temp folder outside ComfyUI)."""
    folder = tempfile.gettempdir()
    if comfy_available():
        try:
            folder = importlib.import_module("folder_paths").get_temp_directory()
        except ImportError:
            pass
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{prefix}_{uuid.uuid4().hex[:12]}.mp4")


def video_output(path: str) -> Any:
    """A VIDEO for the path (comfy_api VideoFromFile: lazy, SaveVideo remuxes it without re-encoding); the path
    itself outside ComfyUI."""
    if comfy_available():
        try:
            return importlib.import_module("comfy_api.input_impl").VideoFromFile(path)
        except ImportError:
            pass
    return path
