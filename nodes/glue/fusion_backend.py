"""ComfyUI's sampler and VAE as a fusion.backend.FusionBackend (the backend ScheduledFusion, VideoFaceFusion and the
runner's chunk node sample through).

Lazily ComfyUI: nothing here imports comfy at module import (nodes/glue/env, sampling do it inside functions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import env, sampling
from .sampling import SamplerArgs

if TYPE_CHECKING:
    from ...fusion.backend import FusionBackend
    from ...fusion.fallback import Attempt


@dataclass(frozen=True)
class ComfyInputs:
    """The ComfyUI objects a fusion samples with: MODEL, VAE and the CONDITIONING pair, as linked to the node."""

    model: Any
    vae: Any
    positive: Any
    negative: Any


def comfy_backend(
    inputs: ComfyInputs,
    sampler: SamplerArgs,
    total: int,
    model_for: Callable[[Attempt], tuple[Any, str]],
    *,
    step_bar: bool | Callable[[int, int], None] = True,
) -> FusionBackend:
    """ComfyUI's sampler and VAE as a FusionBackend for `total` faces.

    model_for(attempt) -> (model, note): the MODEL for each fallback attempt (nodes/model_patching.attempt_models:
    scheduling off / stronger preset clones). step_bar: True, a bar of faces x steps moved from the sampler callback at
    every step (env.StepProgress; ScheduledFusion). False: no bar; the sampler callback and progress() are cancel
    points only. A callable on_step(steps done, steps): no bar, and it is called after every step (the video path's
    frame bar: nodes/video_fusion.StepRelay).
    """
    from ...fusion.backend import FusionBackend

    env.require_comfy("ScheduledFusion")
    model, vae = inputs.model, inputs.vae
    device = env.compute_device(model)
    bar = env.StepProgress(total, sampler.steps) if step_bar is True else None
    on_step = step_bar if callable(step_bar) else None

    def sample(m: Any, latent: Any, mask: Any, seeds: list[int], plan: Any) -> Any:
        step = on_step if bar is None else bar.on_step(len(seeds))
        call = sampling.SampleCall(sampler, inputs.positive, inputs.negative, plan, step)
        return sampling.sample(m, latent, mask, seeds, call)

    return FusionBackend(
        encode=lambda px, tiled: sampling.vae_encode(vae, px, tiled),
        decode=lambda lat, tiled: sampling.vae_decode(vae, lat, tiled),
        sample=sample,
        model_for=model_for,
        is_oom=env.is_oom,
        is_fatal=env.is_interrupt,
        progress=env.throw_if_interrupted if bar is None else bar.face_done,
        peak_reset=lambda: env.peak_reset(device),
        peak_bytes=lambda: env.peak_bytes(device),
        empty_cache=env.empty_cache,
        memory_check=lambda batch, side, tiled: sampling.memory_check(model, vae, batch, side, tiled),
    )
