"""Identity pre-swap with an inswapper_128-style ONNX model, applied to the aligned crop before diffusion refinement.

What the model needs (the layout of insightface's `inswapper_128.onnx`):
- input `target`: [1, 3, 128, 128] float32 RGB in [0, 1], the target face aligned to the ArcFace 5-point template
  scaled to 128 px (insightface's `arcface_dst * 128 / 112`);
- input `source`: [1, 512] float32, the source identity latent = L2-normalised(ArcFace embedding @ emap), where the
  ArcFace embedding is the L2-normalised 512-d output of a recognition model (e.g. buffalo_l/w600k_r50.onnx, input
  [1, 3, 112, 112], (RGB - 127.5) / 127.5) and `emap` is the 512 x 512 matrix stored as the model's last
  initializer (named "emap" here when present);
- output: [1, 3, 128, 128] float32 RGB in [0, 1], the swapped face.
The 128-px result is blurry by design: ScheduledFusion warps it back into the guide-size crop and the diffusion pass
that follows re-details it. Reading `emap` needs the `onnx` package (insightface itself depends on it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np

from ..faces.embed import ArcFaceEmbedder, arcface_affine
from ..faces.models import ModelFileError
from ..faces.types import Face
from .backend import CropHooks

SWAP_SIZE = 128  # inswapper works on the ArcFace template (faces/embed.py ARCFACE_112) scaled to 128 px


class SwapModelError(ModelFileError, ValueError):
    """The swap (or its ArcFace) model file is missing, malformed or of the wrong signature; the message names the fix.

    A ModelFileError like every face-model error, and a ValueError as it always was.
    """


class ArcFaceOnnx(ArcFaceEmbedder):
    """The shared ArcFace embedder (faces/embed.py) as the swap code uses it: model errors are SwapModelError.

    embed_image is the name this class always had for ArcFaceEmbedder.embed (float 0..1 or uint8 RGB [H, W, 3] plus
    landmarks [5, 2] -> [D] unit vector).
    """

    error = SwapModelError
    embed_image = ArcFaceEmbedder.embed


def read_emap(path: Path) -> np.ndarray:
    """The [512, 512] float32 `emap` initializer of an inswapper model (by name, else the last 512x512 one)."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SwapModelError(
            "the identity pre-swap reads the model's emap with the `onnx` package: pip install onnx"
        ) from exc
    model = onnx.load(str(path), load_external_data=False)
    inits = list(model.graph.initializer)
    named = [t for t in inits if t.name == "emap"]
    square = [t for t in inits if list(t.dims) == [512, 512]]
    pick = named[-1] if named else (square[-1] if square else None)
    if pick is None:
        raise SwapModelError(f"{path} has no 512x512 'emap' initializer: is it an inswapper_128 model?")
    return numpy_helper.to_array(pick).astype(np.float32)


class InSwapper:
    """An inswapper_128-style model: swap(target_crop_128, source_latent) -> swapped 128 crop."""

    def __init__(self, model_path: Path, providers: list[str] | None = None) -> None:
        import onnxruntime as ort

        self.path = Path(model_path)
        if not self.path.is_file():
            raise SwapModelError(f"swap model {self.path} not found: put inswapper_128.onnx in models/insightface/")
        try:
            self.session = ort.InferenceSession(str(self.path), providers=providers or ["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own classes (InvalidProtobuf, Fail, ...) for a bad file
            raise SwapModelError(
                f"could not load the swap model {self.path.name}: the file is corrupt or not an ONNX model. Put the "
                "official inswapper_128.onnx in models/insightface/ or set swap_model to none."
            ) from exc
        inputs = {i.name: list(i.shape) for i in self.session.get_inputs()}
        if (
            set(inputs) != {"target", "source"}
            or inputs["target"][1:] != [3, SWAP_SIZE, SWAP_SIZE]
            or inputs["source"][-1] != 512
        ):
            raise SwapModelError(
                f"{self.path} is not an inswapper_128-style model: inputs {inputs}, want target [1,3,128,128] and "
                "source [1,512]"
            )
        self.emap = read_emap(self.path)

    def source_latent(self, embedding: np.ndarray) -> np.ndarray:
        """ArcFace embedding [512] -> the model's source input [1, 512] (emap-projected, unit length)."""
        e = np.asarray(embedding, np.float32).reshape(1, -1)
        e = e / max(float(np.linalg.norm(e)), 1e-12)
        lat = e @ self.emap
        unit: np.ndarray = (lat / max(float(np.linalg.norm(lat)), 1e-12)).astype(np.float32)
        return unit

    def swap128(self, target: np.ndarray, latent: np.ndarray) -> np.ndarray:
        """target: [128, 128, 3] float32 RGB 0..1 on the ArcFace-128 template -> [128, 128, 3] float32 0..1."""
        blob = np.ascontiguousarray(target.transpose(2, 0, 1)[None], dtype=np.float32)
        out = self.session.run(None, {"target": blob, "source": latent.astype(np.float32)})[0]
        rgb: np.ndarray = np.clip(np.asarray(out, np.float32)[0].transpose(1, 2, 0), 0.0, 1.0)
        return rgb


def swap_in_crop(
    crop: np.ndarray, landmarks: np.ndarray, swapper: InSwapper, latent: np.ndarray, feather: float = 0.1
) -> np.ndarray:
    """Swap the face in an aligned crop.

    crop: [S, S, 3] float32 RGB 0..1; landmarks: [5, 2] in crop pixels. The face is warped to the ArcFace-128
    template, swapped, and warped back (upscaled) into the crop through a feathered square mask; pixels outside the
    128-px window are unchanged. Returns [S, S, 3] float32.
    """
    side = crop.shape[0]
    try:
        m = arcface_affine(landmarks, SWAP_SIZE)
    except ValueError as exc:
        raise SwapModelError(str(exc)) from exc
    target = cv2.warpAffine(
        np.ascontiguousarray(crop, np.float32),
        m,
        (SWAP_SIZE, SWAP_SIZE),
        flags=cv2.INTER_AREA if side > SWAP_SIZE else cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REFLECT101,
    )
    swapped = swapper.swap128(target, latent)
    inv = cv2.invertAffineTransform(m)
    back = cv2.warpAffine(swapped, inv, (side, crop.shape[1]), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE)
    win: np.ndarray = np.zeros((SWAP_SIZE, SWAP_SIZE), np.float32)
    pad = int(SWAP_SIZE * feather)
    win[pad : -pad or None, pad : -pad or None] = 1.0
    win = cv2.GaussianBlur(win, (0, 0), sigmaX=max(0.5, pad / 2.0))
    alpha = cv2.warpAffine(win, inv, (side, crop.shape[1]), flags=cv2.INTER_LINEAR, borderValue=0.0)[..., None]
    mixed: np.ndarray = np.clip(alpha * back + (1.0 - alpha) * crop, 0.0, 1.0).astype(np.float32)
    return mixed


def source_embedding(
    source: Face, rgb: np.ndarray | None, embed: Callable[[np.ndarray, np.ndarray], np.ndarray] | None
) -> np.ndarray:
    """The swap source's identity: the face's own embedding, else `embed(rgb [H, W, 3] float 0..1 of its frame,
    landmarks)`. ValueError naming the fix when neither is there."""
    if source.embedding is not None:
        return source.embedding
    if embed is None or rgb is None:
        raise ValueError(
            "the source face carries no ArcFace embedding: choose an arcface_model (e.g. "
            "w600k_r50.onnx) and connect source_image, or detect with an insightface backend."
        )
    return embed(rgb, source.landmarks)


def identity_hooks(
    hooks: CropHooks,
    embed: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    swapper: InSwapper | None = None,
    source: np.ndarray | None = None,
) -> CropHooks:
    """A copy of `hooks` with the identity check's embedder (when given) and the identity pre-swap of every crop to
    the `source` embedding [512] (when a swapper is given; the source is then also the check's reference)."""
    if embed is not None:
        hooks = replace(hooks, embed=embed)
    if swapper is None:
        return hooks
    if source is None:
        raise ValueError("identity_hooks: a swapper needs the source embedding")
    latent = swapper.source_latent(source)
    return replace(hooks, pre_swap=lambda crop, lm: swap_in_crop(crop, lm, swapper, latent), identity_ref=source)
