"""ArcFace identity embeddings (insightface recognition models, e.g. buffalo_l/w600k_r50.onnx) via onnxruntime.

The one ArcFace implementation of the pack: FaceDetect embeds detections with it (uint8 frames), ScheduledFusion's
identity pre-swap and identity check embed float 0..1 crops with it (fusion/swap.py).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from .align import similarity_transform
from .detect import Device, LoadFailure, ort_session
from .models import ModelFileError

# insightface's arcface_dst: the 5-point template of its 112 x 112 recognition crops (inswapper uses it at 128 px).
ARCFACE_112 = np.array(
    [[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655], [70.7299, 92.2041]],
    dtype=np.float32,
)
ARCFACE_SIZE = 112


def arcface_affine(landmarks: np.ndarray, size: int = ARCFACE_SIZE) -> np.ndarray:
    """[2, 3] similarity image -> ArcFace template scaled to a size x size crop, from landmarks [5, 2].

    Raises ValueError for degenerate landmarks (non-finite or all on one point), which no face can have.
    """
    m = similarity_transform(landmarks, ARCFACE_112.astype(np.float64) * (size / ARCFACE_SIZE))
    if not np.isfinite(m).all() or abs(float(np.linalg.det(m[:, :2]))) < 1e-12:
        raise ValueError(
            "could not fit the face landmarks to the ArcFace template (degenerate landmarks): "
            "check the FACES input's landmarks"
        )
    return m


def arcface_crop(image: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """[112, 112, 3] ArcFace-aligned crop of image [H, W, 3] (same dtype) from 5 landmarks [5, 2], for embedding."""
    return cv2.warpAffine(
        np.ascontiguousarray(image),
        arcface_affine(landmarks),
        (ARCFACE_SIZE, ARCFACE_SIZE),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
    )


class ArcFaceEmbedder:
    """An ArcFace recognition ONNX (input [N, 3, 112, 112], output [N, D]); embeddings are L2-normalised.

    Images are RGB, either uint8 0..255 or float 0..1; both are normalised the insightface way,
    (RGB255 - 127.5) / 127.5, so one face gives the same embedding from either dtype (up to uint8 rounding).
    `error` is the exception type raised for a missing or wrong model file (swap.py narrows it to SwapModelError).
    """

    error: type[ModelFileError] = ModelFileError

    def __init__(self, model_path: Path, device: Device = "cpu") -> None:
        self.path = Path(model_path)
        if not self.path.is_file():
            raise self.error(
                f"ArcFace model {self.path} not found: put a recognition ONNX (e.g. w600k_r50.onnx from buffalo_l) "
                f"in {self.path.parent} (ComfyUI's models/insightface/) or choose another model."
            )
        fix = (
            "Put a recognition ONNX (e.g. w600k_r50.onnx of buffalo_l) in models/insightface/ or choose another model."
        )
        self.session = ort_session(self.path, device, str(self.path), LoadFailure("ArcFace model", fix, self.error))
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        if list(inp.shape[1:]) != [3, ARCFACE_SIZE, ARCFACE_SIZE]:
            raise self.error(
                f"{self.path.name} is not an ArcFace recognition model (input {inp.shape}, want Nx3x112x112)."
            )

    def embed_crop112(self, crop112: np.ndarray) -> np.ndarray:
        """crop112: [112, 112, 3] ArcFace-aligned RGB, uint8 or float 0..1. Returns [D] float32, unit length."""
        crop = np.asarray(crop112)
        if crop.shape != (ARCFACE_SIZE, ARCFACE_SIZE, 3):
            raise ValueError(
                f"ArcFace needs an aligned [112, 112, 3] RGB crop, got shape {crop.shape}: use "
                "arcface_crop(image, landmarks) or embed(image, landmarks)"
            )
        rgb255 = crop.astype(np.float32) if crop.dtype == np.uint8 else crop.astype(np.float32) * 255.0
        blob = np.ascontiguousarray(((rgb255 - 127.5) / 127.5).transpose(2, 0, 1)[None])
        vec = np.asarray(self.session.run(None, {self.input_name: blob})[0], np.float32).reshape(-1)
        return vec / max(float(np.linalg.norm(vec)), 1e-12)

    def embed(self, rgb: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
        """rgb: [H, W, 3] uint8 or float 0..1; landmarks: [5, 2] in its pixels. Returns [D] float32, unit length."""
        image = np.asarray(rgb)
        if image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"ArcFace embeds an [H, W, 3] RGB image, got shape {image.shape}")
        if image.dtype != np.uint8:
            image = image.astype(np.float32, copy=False)
        return self.embed_crop112(arcface_crop(image, landmarks))


def insightface_pack(root: Path, name: str) -> tuple[Path, Path | None]:
    """(detector, recognition or None) of a FaceAnalysis-style pack `root/models/<name>/` (or `root/<name>/`).

    The detector is the det_*/scrfd* ONNX file; the recognition model is w600k_*/glint*/arcface* if present.
    """
    candidates = [Path(root) / "models" / name, Path(root) / name]
    folder = next((c for c in candidates if c.is_dir()), None)
    if folder is None:
        from .model_sources import get_it

        raise ModelFileError(
            f"insightface pack '{name}' not found (looked in {', '.join(str(c) for c in candidates)}): put the pack's "
            f"ONNX files (e.g. det_10g.onnx, w600k_r50.onnx) in models/insightface/models/{name}/. "
            + get_it(name, "insightface/models")
        )
    onnx = sorted(folder.glob("*.onnx"))
    det = next((p for p in onnx if p.name.startswith(("det_", "scrfd"))), None)
    if det is None:
        raise ModelFileError(f"no detector (det_*.onnx or scrfd*.onnx) in {folder}: copy the pack's det_*.onnx there.")
    rec = next((p for p in onnx if p.name.startswith(("w600k", "glint", "arcface"))), None)
    return det, rec
