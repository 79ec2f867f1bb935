"""Widget specs that several nodes offer alike, defined once.

FaceDetect (photos, per frame) and FaceTrack (video, per track and scene) offer the same face selection: detector
confidence, order, indices, count, size, reference identity, device. ScheduledFusion and VideoFaceFusion offer the
same seed widget. Types, defaults and ranges live here once; only the wording differs (a face of a frame vs a track of
a scene), so the two nodes cannot drift apart. Input names never change (saved workflows map values by them).
"""

from __future__ import annotations

from typing import Any, Literal, cast, get_args

from ..faces.types import FaceOrder
from ..scheduling.vocabulary import Device

Spec = tuple[Any, dict[str, Any]]
Unit = Literal["face", "track"]
SEED_MAX = 0xFFFFFFFFFFFFFFFF

_TIPS: dict[Unit, dict[str, str]] = {
    "face": {
        "score_threshold": "Minimum detector confidence. Lower finds small or side faces but adds false positives; "
        "0.5 suits most photos.",
        "order": "Order of the faces before indices / max_faces.",
        "indices": "Face positions to keep after ordering, e.g. '0' or '0,2' or '-1'; empty = all faces.",
        "max_faces": "Keep at most this many faces per frame (0 = no limit).",
        "min_face_size": "Ignore faces whose box is smaller than this (pixels, shorter side). Tiny faces gain little "
        "from diffusion refinement.",
        "device": "cpu leaves VRAM to the diffusion model; auto uses CUDA when onnxruntime-gpu is installed.",
        "model_name": "yunet: ONNX file in models/facedetection; insightface: pack name (default buffalo_l). Names "
        "resolve inside the model folders only. Empty = default.",
        "reference_faces": "Keep only faces similar to the first embedded face here (needs insightface embeddings on "
        "both sides).",
        "similarity_threshold": "ArcFace cosine similarity needed to match the reference; 0.3-0.4 is the same person.",
    },
    "track": {
        "score_threshold": "Minimum detector confidence (0.5 suits most clips).",
        "order": "Order of each scene's tracks before indices / max_faces.",
        "indices": "People to keep in each scene after ordering, e.g. '0' (the main face) or '0,1'; empty = all. A "
        "face hidden for a while (someone walking past) and back is still the same person.",
        "max_faces": "Keep at most this many people per scene (0 = no limit).",
        "min_face_size": "Ignore tracks whose median box is smaller (px, shorter side); tiny faces gain little.",
        "device": "cpu leaves VRAM to diffusion; auto uses onnxruntime-gpu if present.",
        "model_name": "yunet file / insightface pack name (empty = default), as FaceDetect.",
        "reference_faces": "Keep only tracks of this person (FaceDetect with insightface embeddings on the reference "
        "image; this node then needs the insightface backend too).",
        "similarity_threshold": "ArcFace similarity to the reference needed (0.3-0.4 = same person).",
    },
}


def selection_inputs(unit: Unit) -> dict[str, Spec]:
    """Required widgets, in node order: score_threshold, order, indices, max_faces, min_face_size."""
    tip = _TIPS[unit]
    return {
        "score_threshold": (
            "FLOAT",
            {"default": 0.5, "min": 0.05, "max": 1.0, "step": 0.01, "tooltip": tip["score_threshold"]},
        ),
        "order": (list(get_args(FaceOrder)), {"default": "large-small", "tooltip": tip["order"]}),
        "indices": ("STRING", {"default": "", "tooltip": tip["indices"]}),
        "max_faces": ("INT", {"default": 0, "min": 0, "max": 64, "tooltip": tip["max_faces"]}),
        "min_face_size": ("INT", {"default": 0, "min": 0, "max": 4096, "tooltip": tip["min_face_size"]}),
    }


def device_input(unit: Unit) -> Spec:
    """Where the face detector runs."""
    return (list(get_args(Device)), {"default": "cpu", "tooltip": _TIPS[unit]["device"]})


def identity_inputs(unit: Unit) -> dict[str, Spec]:
    """Optional inputs, in node order: model_name, reference_faces, similarity_threshold."""
    tip = _TIPS[unit]
    return {
        "model_name": ("STRING", {"default": "", "tooltip": tip["model_name"]}),
        "reference_faces": ("FACES", {"tooltip": tip["reference_faces"]}),
        "similarity_threshold": (
            "FLOAT",
            {"default": 0.3, "min": -1.0, "max": 1.0, "step": 0.01, "tooltip": tip["similarity_threshold"]},
        ),
    }


def seed_input(tooltip: str) -> Spec:
    """ComfyUI's seed widget (with its control_after_generate companion)."""
    return ("INT", {"default": 0, "min": 0, "max": SEED_MAX, "control_after_generate": True, "tooltip": tooltip})


def build_selection(
    order: str,
    indices: str,
    max_faces: int,
    min_face_size: int,
    score_threshold: float,
    reference: Any,
    similarity_threshold: float,
) -> Any:
    """The faces.select.Selection the selection widgets describe. reference: [D] unit embedding or None."""
    from ..faces.select import Selection, parse_indices

    return Selection(
        order=cast(FaceOrder, order),
        indices=None if (idx := parse_indices(indices)) is None else tuple(idx),
        max_faces=max_faces,
        min_size=float(min_face_size),
        score_threshold=score_threshold,
        reference=reference,
        similarity_threshold=similarity_threshold,
    )
