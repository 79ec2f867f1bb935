"""Face restoration (GFPGAN, RestoreFormer, ...) on aligned crops, loaded through spandrel.

Pure torch/numpy/opencv: the node layer decides the device and dtype and hands the memory manager the module;
this module loads weights safely, recognises the architecture and runs one aligned crop at a time.

Why one crop at a time: GFPGAN at 512 needs ~1-2 GiB of activations per image in fp32; faces in a frame are few, and
a per-face loop gives the progress bar its cancel point.
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from ..faces.align import WarpStyle, warp_to_crop
from ..scheduling.vocabulary import MODEL_EXTENSIONS

log = logging.getLogger(__name__)

MODEL_SIZE = 512  # GFPGAN / RestoreFormer / CodeFormer are trained on FFHQ-aligned 512x512 crops
# GFPGAN's own alignment pads outside the frame with this grey (facexlib border value), not black.
_BORDER_GREY = (135 / 255, 133 / 255, 132 / 255)


class RestorerLoadError(ValueError):
    """A face-restoration model file that cannot (or must not) be loaded; the message names the file and the fix."""


@dataclass(frozen=True, eq=False)
class Restorer:
    """A loaded face restorer.

    descriptor: spandrel ImageModelDescriptor (descriptor.model is the torch module the memory manager may move).
    arch: spandrel architecture id ("GFPGAN", "RestoreFormer", "CodeFormer" with extra arches, ...).
    name: file name, for logs and reports.
    takes_fidelity: the model accepts a fidelity weight (CodeFormer's w); others ignore the fidelity input.
    """

    descriptor: Any
    arch: str
    name: str
    takes_fidelity: bool

    @property
    def module(self) -> torch.nn.Module:
        model: torch.nn.Module = self.descriptor.model
        return model

    @property
    def supports_half(self) -> bool:
        return bool(self.descriptor.supports_half)

    @property
    def supports_bfloat16(self) -> bool:
        return bool(self.descriptor.supports_bfloat16)


def load_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a weights file without executing code: safetensors, or a pickle through torch's weights-only loader.

    A pickle that asks for anything beyond tensors and plain containers (e.g. a __reduce__ calling os.system) is
    refused with RestorerLoadError before any of its code runs.
    """
    path = Path(path)
    if not path.is_file():
        raise RestorerLoadError(f"face-restoration model file not found: {path}")
    ext = path.suffix.lower()
    if ext not in MODEL_EXTENSIONS:
        raise RestorerLoadError(
            f"{path.name}: unsupported model file type {ext!r}; use .safetensors (preferred) or a .pth state dict."
        )
    if ext == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as exc:  # safetensors raises its own error types for a corrupt header
            raise RestorerLoadError(f"{path.name}: not a valid .safetensors file ({exc}).") from exc
    try:
        data = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle.UnpicklingError for code, RuntimeError/EOFError for a corrupt zip
        raise RestorerLoadError(
            f"refused to load {path.name}: it is not a plain weights file (torch.load(weights_only=True) failed: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}). A model pickle may run code when "
            "loaded, so TokenFuse only reads tensors; get the .safetensors version of this model, or convert a "
            "file you trust to .safetensors."
        ) from exc
    if not isinstance(data, dict):
        raise RestorerLoadError(f"{path.name}: expected a state dict, found {type(data).__name__}.")
    return data


def _fidelity_param(module: torch.nn.Module) -> str | None:
    """Name of the explicit fidelity keyword of module.forward ('w' for CodeFormer), or None."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    for name in ("w", "weight", "fidelity"):
        p = params.get(name)
        if p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return name
    return None


def load_restorer(path: str | os.PathLike[str]) -> Restorer:
    """Load a face-restoration model on the CPU (fp32); the caller moves it.

    Raises RestorerLoadError when the file is unsafe or corrupt, when spandrel does not recognise it, or when it is
    not a face restorer (an upscaler, an inpainter).
    """
    try:
        import spandrel
    except ImportError as exc:
        raise RestorerLoadError("face restoration needs spandrel (ComfyUI ships it): pip install spandrel") from exc

    path = Path(path)
    state_dict = spandrel.canonicalize_state_dict(load_state_dict(path))
    try:
        descriptor = spandrel.ModelLoader(device="cpu").load_from_state_dict(state_dict)
    except spandrel.UnsupportedModelError as exc:
        raise RestorerLoadError(
            f"{path.name}: spandrel {spandrel.__version__} does not recognise this model's architecture. Supported "
            "face restorers: GFPGAN v1.3/v1.4, RestoreFormer (CodeFormer and others with spandrel_extra_arches)."
        ) from exc
    except Exception as exc:  # an architecture matched but the tensors did not fit (truncated/edited file)
        raise RestorerLoadError(f"{path.name}: spandrel failed to build the model ({exc}).") from exc
    arch = str(descriptor.architecture.id)
    if not isinstance(descriptor, spandrel.ImageModelDescriptor) or descriptor.purpose != "FaceSR":
        raise RestorerLoadError(
            f"{path.name} is a {arch} model (purpose {descriptor.purpose!r}), not a face restorer: choose a face "
            "model such as GFPGANv1.4 in models/facerestore_models (upscalers belong in Upscale Image (using Model))."
        )
    if descriptor.scale != 1:
        raise RestorerLoadError(f"{path.name}: face restorer with scale {descriptor.scale} is not supported.")
    descriptor.model.train(False)  # inference mode for dropout/norm layers (.eval() by another name)
    takes_fidelity = arch != "GFPGAN" and _fidelity_param(descriptor.model) is not None
    return Restorer(descriptor=descriptor, arch=arch, name=path.name, takes_fidelity=takes_fidelity)


def _run_model(restorer: Restorer, x: torch.Tensor, fidelity: float) -> torch.Tensor:
    """x: [1, 3, 512, 512] RGB in [0, 1] on the model's device/dtype -> same shape in [0, 1]."""
    module = restorer.module
    if restorer.arch == "GFPGAN":
        # spandrel's GFPGAN call passes the image raw, but GFPGAN is trained on [-1, 1] and returns [-1, 1]
        # (GFPGANer normalises with mean = std = 0.5). randomize_noise=False uses the checkpoint's stored StyleGAN
        # noise instead of fresh noise, so the node is deterministic.
        y: torch.Tensor = module(x * 2 - 1, return_rgb=False, randomize_noise=False)[0]
        return (y + 1) / 2
    if restorer.takes_fidelity:
        # CodeFormer convention: [-1, 1] in and out, w in [0, 1] (0 = most restoration, 1 = most fidelity).
        out = module(x * 2 - 1, **{_fidelity_param(module) or "w": float(fidelity)})
        yf: torch.Tensor = out[0] if isinstance(out, (tuple, list)) else out
        return (yf + 1) / 2
    restored: torch.Tensor = restorer.descriptor(x)
    return restored  # spandrel's call handles the model's own normalisation (RestoreFormer)


def restore_crop(restorer: Restorer, crop: np.ndarray, fidelity: float = 0.5) -> np.ndarray:
    """Restore one aligned face crop.

    crop: [S, S, 3] float32 RGB in [0, 1] (any S; resized to 512 for the model and back).
    Returns [S, S, 3] float32 in [0, 1]. The model runs on whatever device/dtype its parameters are on.
    """
    size = crop.shape[0]
    if crop.ndim != 3 or crop.shape[1] != size or crop.shape[2] != 3:
        raise ValueError(f"expected a square RGB crop [S, S, 3], got {tuple(crop.shape)}")
    x: np.ndarray = crop.astype(np.float32, copy=False)
    if size != MODEL_SIZE:
        interp = cv2.INTER_AREA if size > MODEL_SIZE else cv2.INTER_CUBIC
        x = cv2.resize(x, (MODEL_SIZE, MODEL_SIZE), interpolation=interp)
    param = next(restorer.module.parameters())
    t = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1)[None].contiguous().to(param.device, param.dtype)
    with torch.inference_mode():
        y = _run_model(restorer, t.clamp(0, 1), fidelity)
    out = y[0].float().clamp(0, 1).permute(1, 2, 0).cpu().numpy()
    if not np.isfinite(out).all():
        raise FloatingPointError(f"{restorer.name} produced non-finite pixels (try fp32: --force-fp32)")
    if size != MODEL_SIZE:
        interp = cv2.INTER_AREA if MODEL_SIZE > size else cv2.INTER_CUBIC
        out = np.clip(cv2.resize(out, (size, size), interpolation=interp), 0, 1)
    return out.astype(np.float32, copy=False)


def mix_visibility(restored: np.ndarray, original: np.ndarray, visibility: float) -> np.ndarray:
    """visibility * restored + (1 - visibility) * original; 0 returns `original` bit-exactly, 1 `restored`."""
    if visibility <= 0:
        return original.astype(np.float32, copy=True)
    if visibility >= 1:
        return restored.astype(np.float32, copy=True)
    return (visibility * restored + (1.0 - visibility) * original).astype(np.float32)


def align_crop(image: np.ndarray, affine: np.ndarray, crop_size: int) -> np.ndarray:
    """Warp the aligned face out of a frame.

    image: [H, W, 3] float32 RGB in [0, 1]; affine: [2, 3] image -> crop. Returns [crop_size, crop_size, 3] float32.
    Outside the frame is filled with GFPGAN's alignment grey (a black border reads as a dark beard or hair).
    """
    return warp_to_crop(
        np.asarray(image, dtype=np.float32),
        affine,
        crop_size,
        WarpStyle("linear", "constant", border_value=_BORDER_GREY, clip=True),
    )
