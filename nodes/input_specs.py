"""Widget specs that several nodes offer alike, defined once.

FaceDetect (photos, per frame) and FaceTrack (video, per track and scene) offer the same face selection: detector
confidence, order, indices, count, size, reference identity, device. ScheduledFusion and VideoFaceFusion offer the
same seed widget. Types, defaults and ranges live here once; only the wording differs (a face of a frame vs a track of
a scene), so the two nodes cannot drift apart. Input names never change (saved workflows map values by them).
"""

from __future__ import annotations

from dataclasses import dataclass
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


def float_input(default: float, lo: float, hi: float, step: float, tip: str) -> Spec:
    """A FLOAT widget."""
    return ("FLOAT", {"default": default, "min": lo, "max": hi, "step": step, "tooltip": tip})


def int_input(default: int, lo: int, hi: int, tip: str, step: int = 1) -> Spec:
    """An INT widget."""
    return ("INT", {"default": default, "min": lo, "max": hi, "step": step, "tooltip": tip})


def seed_input(tooltip: str) -> Spec:
    """ComfyUI's seed widget (with its control_after_generate companion)."""
    return ("INT", {"default": 0, "min": 0, "max": SEED_MAX, "control_after_generate": True, "tooltip": tooltip})


@dataclass(frozen=True)
class SelectionWidgets:
    """The selection widgets of FaceDetect and FaceTrack (selection_inputs), as the node received them."""

    order: str
    indices: str
    max_faces: int
    min_face_size: int
    score_threshold: float
    similarity_threshold: float

    def selection(self, reference: Any) -> Any:
        """The faces.select.Selection these widgets describe. reference: [D] unit embedding or None."""
        from ..faces.select import Selection, parse_indices

        return Selection(
            order=cast(FaceOrder, self.order),
            indices=None if (idx := parse_indices(self.indices)) is None else tuple(idx),
            max_faces=self.max_faces,
            min_size=float(self.min_face_size),
            score_threshold=self.score_threshold,
            reference=reference,
            similarity_threshold=self.similarity_threshold,
        )


# ---------------------------------------------------------------------- diffusion inputs (ScheduledFusion, video)
# ScheduledFusion and VideoFaceFusion (and the runner's chunk node, which takes VideoFaceFusion's inputs) sample face
# crops alike: the same links, sampler widgets, guide size, fallback and identity pre-swap inputs, defined here once.


def diffusion_links() -> dict[str, Spec]:
    """Required links, in node order: model, vae, positive, negative."""
    return {
        "model": ("MODEL", {"tooltip": "The diffusion model, usually from TokenSchedulerController."}),
        "vae": ("VAE", {"tooltip": "The VAE of the model (encodes/decodes the face crops)."}),
        "positive": ("CONDITIONING", {"tooltip": "Prompt conditioning for the faces."}),
        "negative": ("CONDITIONING", {"tooltip": "Negative conditioning for the faces."}),
    }


def sampler_inputs() -> dict[str, Spec]:
    """KSampler's widgets, in node order: steps, cfg, sampler_name, scheduler, denoise (choices from ComfyUI)."""
    from .glue import sampling

    samplers, schedulers = sampling.sampler_choices()
    return {
        "steps": (
            "INT",
            {
                "default": 20,
                "min": 1,
                "max": 10000,
                "tooltip": "Sampling steps (with denoise < 1 only the last part runs).",
            },
        ),
        "cfg": (
            "FLOAT",
            {
                "default": 7.0,
                "min": 0.0,
                "max": 100.0,
                "step": 0.1,
                "tooltip": "Classifier-free guidance scale (4-8 typical for face refinement).",
            },
        ),
        "sampler_name": (samplers, {"default": samplers[0], "tooltip": "ComfyUI sampler."}),
        "scheduler": (schedulers, {"default": schedulers[0], "tooltip": "ComfyUI noise schedule."}),
        "denoise": (
            "FLOAT",
            {
                "default": 0.45,
                "min": 0.0,
                "max": 1.0,
                "step": 0.01,
                "tooltip": "How much of the face is re-generated: 0.3-0.5 refines and keeps "
                "identity; above 0.6 the face changes; 0 returns it as prepared (the swap alone, no VAE).",
            },
        ),
    }


def guide_size_input() -> Spec:
    """The side the faces are sampled at."""
    return (
        "INT",
        {
            "default": 512,
            "min": 64,
            "max": 2048,
            "step": 8,
            "tooltip": "Face resolution sampled (pixels). 512 suits SD1.5, 1024 SDXL; smaller is faster and lighter.",
        },
    )


def fallback_input() -> Spec:
    """Which failures the fusion fallbacks handle (fusion/fallback.py)."""
    from ..fusion.fallback import FallbackMode

    return (
        list(get_args(FallbackMode)),
        {
            "default": "auto",
            "tooltip": "auto: OOM -> split batch, stronger preset, tiled VAE, smaller guide; artifacts -> "
            "rerun with scheduling off. oom-only / artifacts-only: one chain. off: no retries (a "
            "face that runs out of memory passes through). Artifacts found without the artifact "
            "chain are reported and the output is kept.",
        },
    )


def swap_inputs() -> dict[str, Spec]:
    """Optional identity pre-swap inputs, in node order: swap_model, arcface_model, source_image, source_faces."""
    from .glue import paths

    onnx = paths.list_models("insightface", (".onnx",))
    return {
        "swap_model": (
            ["none", *onnx],
            {
                "default": "none",
                "tooltip": "Identity pre-swap: an inswapper_128-style ONNX in models/insightface. The 128-px "
                "swap is re-detailed by the diffusion pass. Needs source_faces (and an ArcFace model when "
                "they carry no embedding).",
            },
        ),
        "arcface_model": (
            ["none", *onnx],
            {
                "default": "none",
                "tooltip": "ArcFace recognition ONNX (e.g. w600k_r50.onnx) in models/insightface: source "
                "embedding for the swap and the identity-drop artifact check.",
            },
        ),
        "source_image": (
            "IMAGE",
            {
                "tooltip": "The image holding the source identity for the swap (its "
                "largest face is used when source_faces is not connected)."
            },
        ),
        "source_faces": (
            "FACES",
            {
                "tooltip": "FaceDetect on source_image; its first face is the source "
                "(its embedding is used when it has one)."
            },
        ),
    }
