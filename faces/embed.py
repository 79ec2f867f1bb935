"""ArcFace identity embeddings (insightface recognition models, e.g. buffalo_l/w600k_r50.onnx) via onnxruntime."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from .detect import Device, ort_session
from .models import ModelFileError

# insightface's arcface_dst: the 5-point template of its 112 x 112 recognition crops.
ARCFACE_112 = np.array(
    [[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655], [70.7299, 92.2041]],
    dtype=np.float32,
)


class ArcFaceEmbedder:
    """Embeds a face from its 5 landmarks: similarity-aligns to ARCFACE_112, runs the model, L2-normalises."""

    def __init__(self, model_path: Path, device: Device = "cpu") -> None:
        self.path = Path(model_path)
        self.session = ort_session(self.path, device, str(self.path))
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        if list(inp.shape[1:]) != [3, 112, 112]:
            raise ModelFileError(
                f"{self.path} is not an ArcFace recognition model (input {inp.shape}, want Nx3x112x112)."
            )

    def embed(self, rgb: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
        """rgb: [H, W, 3] uint8; landmarks: [5, 2]. Returns [D] float32, unit length."""
        from .align import similarity_transform

        m = similarity_transform(landmarks, ARCFACE_112)
        crop = cv2.warpAffine(rgb, m, (112, 112), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
        blob = ((crop.astype(np.float32) - 127.5) / 127.5).transpose(2, 0, 1)[None]
        vec = np.asarray(self.session.run(None, {self.input_name: blob})[0], np.float32).reshape(-1)
        return vec / max(float(np.linalg.norm(vec)), 1e-12)


def insightface_pack(root: Path, name: str) -> tuple[Path, Path | None]:
    """(detector, recognition or None) of a FaceAnalysis-style pack `root/models/<name>/` (or `root/<name>/`).

    The detector is the det_*/scrfd* ONNX file; the recognition model is w600k_*/glint*/arcface* if present.
    """
    candidates = [Path(root) / "models" / name, Path(root) / name]
    folder = next((c for c in candidates if c.is_dir()), None)
    if folder is None:
        raise ModelFileError(
            f"insightface pack '{name}' not found (looked in {', '.join(str(c) for c in candidates)}): put the pack's "
            "ONNX files (e.g. det_10g.onnx, w600k_r50.onnx) in models/insightface/models/<name>/."
        )
    onnx = sorted(folder.glob("*.onnx"))
    det = next((p for p in onnx if p.name.startswith(("det_", "scrfd"))), None)
    if det is None:
        raise ModelFileError(f"no detector (det_*.onnx or scrfd*.onnx) in {folder}: copy the pack's det_*.onnx there.")
    rec = next((p for p in onnx if p.name.startswith(("w600k", "glint", "arcface"))), None)
    return det, rec
