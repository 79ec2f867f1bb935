"""Samplers for the ComfyUI-free video engine (runner/core_video.py), as video.fuse_pass.Refine functions.

"demo": the project's small trained face model (face_model/, plain torch, no ComfyUI, no download) through the
pack's real per-face fusion loop (fusion/run.run_fusion: VAE encode, euler with the face's noise mask, optional
TokenFuse scheduling, decode, composite, artifact fallbacks) — the same loop ScheduledFusion runs in ComfyUI.
"standin": the seeded stand-in (video/standin.py) for tests and benches of the video / scale-out paths.

Each crop is sampled on its own (one sampler call per crop, its track's seed): a crop's result then depends only on
the crop and its seed, never on which crops share a batch, which is what makes a video split into chunks over
several workers equal to a one-worker run frame for frame (video/chunks.py). Costs little on CPU; on a GPU a
batch would use it better (not done: batching changes float results in the last bits).
"""

from __future__ import annotations

import logging
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from ..video.fuse_pass import Refine

log = logging.getLogger("tokenfuse.runner")
RefineName = Literal["demo", "standin"]


@cache
def _face_model(device: str) -> Any:
    """The committed small face model in plain torch (loaded once per process)."""
    from ..face_model.torch_sampling import load_torch_face_model

    return load_torch_face_model(device=device)


def demo_refine(
    steps: int = 20,
    denoise: float = 0.45,
    preset: str = "balanced",
    crop_factor: float = 1.0,
    device: str = "cpu",
    threads: int = 0,
) -> Refine:
    """refine(crops [N, S, S, 3] float32 0..1, seeds [N]) -> refined crops with the small trained face model.

    preset: TokenFuse scheduling preset on the model ("off" = none); crop_factor: the tracks' crop factor (the face
    mask is drawn from the FFHQ template at it); threads: torch threads (0 = leave as is; the Ray workers get one
    per CPU they hold). S should be the model's training size (256) or a multiple of 8 near it.
    """
    import torch

    from ..face_model.torch_sampling import fusion_backend, scheduled
    from ..faces.align import template
    from ..faces.masks import crop_mask
    from ..faces.types import Face, FaceSet
    from ..fusion.run import FusionSettings, run_fusion

    if threads > 0:
        torch.set_num_threads(threads)
    model = _face_model(device)
    if preset != "off":
        model = scheduled(model, preset)
    backend = fusion_backend(model, steps, denoise)
    masks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def face_for(s: int) -> FaceSet:
        if s not in masks:
            lm = template(s, crop_factor).astype(np.float32)
            masks[s] = (lm, crop_mask(lm, s))
        lm, mask = masks[s]
        eye = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        face = Face(
            bbox=(0.0, 0.0, float(s), float(s)),
            score=1.0,
            landmarks=lm,
            affine=eye,
            inverse=eye,
            crop_size=s,
            mask=mask,
        )
        return FaceSet((s, s), ((face,),))

    def refine(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
        out = np.empty_like(crops, dtype=np.float32)
        for i, (crop, seed) in enumerate(zip(crops, seeds, strict=True)):
            s = int(crop.shape[0])
            settings = FusionSettings(seed=int(seed), guide_size=s, max_size=s, crop_factor=1.0, feather=0.04)
            with torch.inference_mode():
                result = run_fusion(np.ascontiguousarray(crop[None], np.float32), face_for(s), settings, backend)
            out[i] = np.clip(result.crops[0], 0.0, 1.0)
            if result.reports[0].status == "passthrough":
                log.warning(
                    "core engine: a crop passed through unchanged (seed %d): %s", seed, result.reports[0].warnings
                )
        return out

    return refine


def make_refine(name: RefineName, steps: int, denoise: float, preset: str, threads: int = 0) -> Refine:
    """The sampler called `name` (RefineName); the other arguments are the demo model's."""
    if name == "demo":
        return demo_refine(steps, denoise, preset, threads=threads)
    if name == "standin":
        from ..video.standin import standin_refine

        return standin_refine
    raise ValueError(f"unknown sampler {name!r}: use one of 'demo', 'standin'")
