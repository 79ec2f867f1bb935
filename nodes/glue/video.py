"""ComfyUI side of the video nodes (VIDEO in/out, temp folder), imported lazily like the rest of nodes/glue/.

Every helper works outside ComfyUI too (files wrapped in `VideoPath`), which is how CI runs the video nodes.
"""

from __future__ import annotations

import atexit
import importlib
import io
import logging
import os
import tempfile
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from .env import comfy_available

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VideoPath:
    """A video file as a VIDEO outside ComfyUI (the runner, tests, benches): what comfy_api's VideoFromFile is inside
    it. Made only in code: a prompt cannot build one, so a VIDEO input never takes a path typed into a workflow."""

    path: str | os.PathLike[str]

    def get_stream_source(self) -> str:
        return os.fspath(self.path)


def stream_source(video: Any) -> str | io.BytesIO:
    """The streamable source of a VIDEO: `get_stream_source()` (a path or BytesIO), never `get_components()`
    (that decodes every frame into one float tensor).

    A plain string is refused: ComfyUI lets a raw value through on a VIDEO input, and a path in a prompt would read
    any video file on the server (SECURITY.md). Code that has a file wraps it in `VideoPath`. A VIDEO made in memory
    (core Create Video: its frames are already one tensor) cannot stream to a buffer in ComfyUI 0.3.x (PyAV gets no
    container format), so it is encoded once to a temp-folder .mp4 and streamed from there."""
    if hasattr(video, "get_stream_source"):
        try:
            source: str | io.BytesIO = video.get_stream_source()
        except Exception as exc:  # noqa: BLE001 - ComfyUI's in-memory VIDEO (Create Video) cannot stream to a buffer
            if not hasattr(video, "save_to"):
                raise TypeError(
                    f"this VIDEO cannot be read ({exc}); save it with Save Video and load it again"
                ) from exc
            return _encoded(video)
        return source
    raise TypeError(
        f"video must be a VIDEO (connect the core Load Video node), got {type(video).__name__}",
    )


_ENCODED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()  # in-memory VIDEO -> its .mp4


def _encoded(video: Any) -> str:
    """An in-memory VIDEO's temp .mp4, encoded on first use only (FaceTrack and VideoFaceFusion read the same VIDEO:
    one encode, not two) and deleted when the VIDEO object goes (ComfyUI drops its cached outputs) or at exit."""
    try:
        path = _ENCODED.get(video)
    except TypeError:  # not weak-referenceable: encode per call, deleted at exit
        path = None
    if path is not None and os.path.isfile(path):
        return path
    path = output_path("tokenfuse_input")
    video.save_to(path)  # the .mp4 name picks the container its buffer path could not
    log.debug("VIDEO has no file (e.g. from Create Video): encoded once to %s to stream it", path)
    try:
        _ENCODED[video] = path
    except TypeError:
        pass
    remove_with(video, path)
    return path


def remove_with(owner: Any, path: str) -> None:
    """Delete the file at `path` when `owner` (a VIDEO object) is collected, as ComfyUI drops a cached output; at
    exit when it cannot be weakly referenced."""
    try:
        weakref.finalize(owner, _remove, path)
    except TypeError:
        atexit.register(_remove, path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def output_path(prefix: str = "tokenfuse_video", codec: str = "h264") -> str:
    """A fresh path in ComfyUI's temp folder (the system temp folder outside ComfyUI) with the codec's file suffix
    (video/encode.py: .mp4 for every codec today)."""
    from ...video.encode import output_suffix

    folder = tempfile.gettempdir()
    if comfy_available():
        try:
            folder = importlib.import_module("folder_paths").get_temp_directory()
        except ImportError:
            pass
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{prefix}_{uuid.uuid4().hex[:12]}{output_suffix(codec)}")


def video_output(path: str, temporary: bool = False) -> Any:
    """A VIDEO for the path (comfy_api VideoFromFile: lazy, SaveVideo remuxes it without re-encoding); a `VideoPath`
    outside ComfyUI. temporary: the file is deleted when the VIDEO object goes (ComfyUI drops a cached output when
    the node runs again: each re-run's full-length MP4 piled up in the temp folder until the server restarted)."""
    video: Any = VideoPath(path)
    if comfy_available():
        try:
            video = importlib.import_module("comfy_api.input_impl").VideoFromFile(path)
        except ImportError:
            pass
    if temporary:
        remove_with(video, path)
    return video
