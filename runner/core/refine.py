"""Samplers for the ComfyUI-free video engine (runner/core/video.py), as video.fuse_pass.Refine functions.

"demo": the project's small trained face model (face_model/, plain torch, no ComfyUI, no download) through the fusion
core's crop-batch entry (fusion.refine.refine_crops: VAE encode, euler with the face's noise mask, optional TokenFuse
scheduling, decode, composite, artifact fallbacks) — the same loop ScheduledFusion and VideoFaceFusion run in ComfyUI.
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
    from ...video.fuse_pass import Refine

log = logging.getLogger("tokenfuse.runner")
RefineName = Literal["demo", "standin"]


@cache
def _face_model(device: str) -> Any:
    """The committed small face model in plain torch (loaded once per process)."""
    from ...face_model.torch_sampling import load_torch_face_model

    return load_torch_face_model(device=device)


def demo_refine(
    steps: int = 20,
    denoise: float = 0.45,
    preset: str = "balanced",
    threads: int = 0,
) -> Refine:
    """refine(crops [N, S, S, 3] float32 0..1, seeds [N]) -> refined crops with the small trained face model.

    preset: TokenFuse scheduling preset on the model ("off" = none); threads: torch threads (0 = leave as is; the Ray
    workers get one per CPU they hold). Runs on the CPU; the tracks' crop factor is 1.0 (the face mask is drawn from
    the FFHQ template at it). S should be the model's training size (256) or a multiple of 8 near it.
    """
    import torch

    from ...face_model.torch_sampling import fusion_backend, scheduled
    from ...fusion.refine import FusionSettings, refine_crops

    if threads > 0:
        torch.set_num_threads(threads)
    model = _face_model("cpu")
    if preset != "off":
        model = scheduled(model, preset)
    backend = fusion_backend(model, steps, denoise)

    def refine(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
        s = int(crops.shape[1])
        settings = FusionSettings(guide_size=s, max_size=s, crop_factor=1.0, feather=0.04, faces_per_batch=1)
        with torch.inference_mode():
            out, reports = refine_crops(np.ascontiguousarray(crops, np.float32), seeds, settings, backend, 1.0)
        for seed, report in zip(seeds, reports, strict=True):
            if report.status == "passthrough":
                log.warning("core engine: a crop passed through unchanged (seed %d): %s", seed, report.warnings)
        return out

    return refine


def make_refine(name: RefineName, steps: int, denoise: float, preset: str, threads: int = 0) -> Refine:
    """The sampler called `name` (RefineName); the other arguments are the demo model's."""
    if name == "demo":
        return demo_refine(steps, denoise, preset, threads=threads)
    if name == "standin":
        from ...video.standin import standin_refine

        return standin_refine
    raise ValueError(f"unknown sampler {name!r}: use one of 'demo', 'standin'")
