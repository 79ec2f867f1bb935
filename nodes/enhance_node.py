"""GFPGANEnhance: restore each detected face on its aligned 512 crop (GFPGAN, RestoreFormer, ... via spandrel)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..scheduling.vocabulary import MODEL_EXTENSIONS
from .checks import checked_inputs, model_names_valid
from .glue import env, paths
from .glue import patcher as comfy_patcher

log = logging.getLogger(__name__)

NO_MODEL = "none found: put GFPGANv1.4.pth in models/facerestore_models"

# One loaded model (ComfyUI re-runs the node for every new frame/seed; reloading 350 MB each time would dominate).
# ComfyUI's memory manager owns its device placement through the ModelPatcher.
_CACHE: dict[tuple[str, int, int], tuple[Any, Any]] = {}


def _model_choices() -> list[str]:
    return paths.list_models(paths.FACERESTORE_FOLDER, MODEL_EXTENSIONS) or [NO_MODEL]


def _model_file(name: str) -> str:
    """Path of the face-restoration model named in the prompt, inside the facerestore folders; ModelPathError
    otherwise, naming the file, the folders searched and where to download it (faces/model_sources.py)."""
    from ..faces.model_paths import ModelLookup, ModelPathError
    from ..faces.model_sources import get_it

    if name == NO_MODEL:  # the list's placeholder: nothing is installed
        raise ModelPathError(
            "GFPGANEnhance: no face-restoration model is installed. "
            + get_it("GFPGANv1.4.pth", paths.FACERESTORE_FOLDER)
        )
    fix = get_it(name, paths.FACERESTORE_FOLDER)
    lookup = ModelLookup("GFPGANEnhance: face-restoration model", fix=fix)
    return str(paths.model_path(paths.FACERESTORE_FOLDER, name, lookup))


def _load(path: str) -> tuple[Any, Any]:
    """(Restorer, ModelPatcher or None) for a model file, on the compute device."""
    from ..fusion.restore import load_restorer

    st = os.stat(path)
    key = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        _CACHE.clear()
        restorer = load_restorer(path)
        patcher, _dtype = comfy_patcher.manage_module(
            restorer.module, restorer.supports_half, restorer.supports_bfloat16
        )
        _CACHE[key] = (restorer, patcher)
    restorer, patcher = _CACHE[key]
    if patcher is not None:
        comfy_patcher.load_managed(patcher)
    return restorer, patcher


class GFPGANEnhance:
    """Face restoration on aligned crops; Blend pastes the FACES' crops back into the frame."""

    DESCRIPTION = (
        "Face restore: sharpens each face with a face-restoration model (GFPGAN, RestoreFormer) from "
        "models/facerestore_models. Connect its faces output to Blend."
    )
    CATEGORY = "TokenFuse/photo"
    FUNCTION = "enhance"
    RETURN_TYPES = ("IMAGE", "FACES", "STRING")
    RETURN_NAMES = ("crops", "faces", "report")
    OUTPUT_TOOLTIPS = (
        "The restored aligned crops as a batch [faces, S, S, 3] (frame order, then face order), for preview. "
        "With no faces: the input image unchanged.",
        "The input FACES with each face's crop replaced by its restored crop: connect to Blend to paste back.",
        "One line per run: model, faces restored, seconds per face, device and dtype.",
    )

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, dict[str, tuple[Any, ...]]]:
        return {
            "required": {
                "image": (
                    "IMAGE",
                    {"tooltip": "The frames the FACES were detected in (used when a face has no crop)."},
                ),
                "faces": ("FACES", {"tooltip": "Faces from FaceDetect, or from ScheduledFusion with its crops."}),
                "model_name": (
                    _model_choices(),
                    {
                        "tooltip": "Face-restoration model in models/facerestore_models (GFPGANv1.4.pth is a good "
                        "default; .pth is read weights-only, a converted .safetensors works too)."
                    },
                ),
                "visibility": (
                    "FLOAT",
                    {
                        "default": 1.0,
                        "min": 0.0,
                        "max": 1.0,
                        "step": 0.05,
                        "tooltip": "Mix of restored and input crop: 1 = fully restored, 0 = unchanged (model skipped). "
                        "0.5-0.8 keeps more of the diffusion detail and skin texture.",
                    },
                ),
                "fidelity": (
                    "FLOAT",
                    {
                        "default": 0.5,
                        "min": 0.0,
                        "max": 1.0,
                        "step": 0.05,
                        "tooltip": "CodeFormer's w: 0 = strongest restoration, 1 = closest to the input. Models "
                        "without a fidelity input (GFPGAN, RestoreFormer) ignore it.",
                    },
                ),
            }
        }

    @classmethod
    def IS_CHANGED(cls, model_name: str = "", **_: Any) -> str:  # noqa: N802 - ComfyUI's name
        """The model file's stamp: a file replaced under the same name runs the node again."""
        return paths.file_stamp(paths.FACERESTORE_FOLDER, model_name)

    @classmethod
    def VALIDATE_INPUTS(cls, model_name: str = "") -> bool | str:  # noqa: N802 - ComfyUI's name
        """ComfyUI skips its "Value not in list" check for model_name: a missing file stops the run with the pack's
        message (checks.model_names_valid)."""
        return model_names_valid(model_name=model_name)

    @checked_inputs("model_name")
    def enhance(
        self, image: Any, faces: Any, model_name: str, visibility: float, fidelity: float
    ) -> tuple[Any, Any, str]:
        """image: [B, H, W, 3] float 0..1. Returns (crops [N, S, S, 3], FaceSet with restored crops, report)."""
        from dataclasses import replace

        import numpy as np
        import torch

        from ..faces.images import as_rgb_float
        from ..faces.types import FaceSet
        from ..fusion.restore import align_crop, mix_visibility, restore_crop

        if not isinstance(faces, FaceSet):
            raise TypeError(f"faces must be FACES from FaceDetect, got {type(faces).__name__}")
        if image.ndim != 4 or image.shape[-1] not in (1, 2, 3, 4):
            raise ValueError(f"IMAGE must be [B, H, W, C] with 1-4 channels, got {tuple(image.shape)}")
        batch, height, width = int(image.shape[0]), int(image.shape[1]), int(image.shape[2])
        faces.check_image(height, width, batch)
        model_file = _model_file(model_name) if visibility > 0 else ""  # a missing file stops the run, faces or not
        if batch == 0 or faces.count == 0:
            msg = "GFPGANEnhance: no faces" + (" (empty batch)" if batch == 0 else "") + ": image passed through"
            log.warning(msg)
            return image, faces, msg

        restorer = None
        if visibility > 0:
            restorer, _patcher = _load(model_file)
        pbar = env.progress_bar(faces.count)
        frames = as_rgb_float(image)  # gray repeated, alpha dropped: FaceDetect and Blend take them too
        out_faces: list[tuple[Any, ...]] = []
        crops: list[np.ndarray] = []
        failed: list[str] = []
        t0 = time.perf_counter()
        recoverable: tuple[type[BaseException], ...] = (FloatingPointError, *_oom_types())
        for b, frame_faces in enumerate(faces.faces):
            restored_faces: list[Any] = []
            for face in frame_faces:
                if face.crop is not None:
                    original = np.asarray(face.crop, dtype=np.float32)
                else:
                    original = align_crop(frames[b], face.affine, face.crop_size)
                crop, restored = original.copy(), False
                if restorer is not None:
                    try:
                        crop = mix_visibility(restore_crop(restorer, original, fidelity), original, visibility)
                        restored = True
                    except recoverable as exc:  # one bad face never sinks the batch
                        if not (isinstance(exc, FloatingPointError) or env.is_oom(exc)):
                            raise
                        failed.append(f"frame {b} face {len(restored_faces)}: {type(exc).__name__}")
                        log.warning("GFPGANEnhance: %s; that face passes through unrestored (%s)", failed[-1], exc)
                crops.append(crop)
                # a face not restored keeps what it had (its crop or none): a resampled copy of the frame's own face
                # would soften it in Blend (two interpolations) while the report says "unchanged"
                restored_faces.append(face.with_crop(crop) if restored else face)
                pbar.update(1)  # cancel point
            out_faces.append(tuple(restored_faces))
        seconds = time.perf_counter() - t0

        size = crops[0].shape[0]
        same = [c if c.shape[0] == size else _resize(c, size) for c in crops]
        crops_t = torch.from_numpy(np.stack(same)).to(image.dtype)
        if restorer is None:
            report = f"GFPGANEnhance: visibility 0, {len(crops)} face crop(s) passed through unchanged"
        else:
            param = next(restorer.module.parameters())
            report = (
                f"GFPGANEnhance: {restorer.arch} ({restorer.name}) restored {len(crops)} face(s) in {batch} frame(s), "
                f"{seconds / len(crops):.2f} s/face on {param.device} {str(param.dtype).replace('torch.', '')}, "
                f"visibility {visibility:.2f}"
            )
            if failed:
                report += f"; {len(failed)} passed through unrestored ({', '.join(failed)})"
        log.info(report)
        return crops_t, replace(faces, faces=tuple(out_faces)), report


def _oom_types() -> tuple[type[BaseException], ...]:
    """Exception types that mean "out of memory" here (ComfyUI's OOM_EXCEPTION inside ComfyUI, else MemoryError)."""
    return tuple({MemoryError, env.oom_exception()})


def _resize(crop: Any, size: int) -> Any:
    """Resize a crop for the preview batch when faces carry different crop sizes (rare: mixed upstream nodes)."""
    import cv2

    return cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)


NODE_CLASS_MAPPINGS = {"TokenFuseGFPGANEnhance": GFPGANEnhance}
NODE_DISPLAY_NAME_MAPPINGS = {"TokenFuseGFPGANEnhance": "Face Restore (GFPGANEnhance)"}  # "restore" is searched for
