"""ComfyUI's sampler and VAE for face crops (ScheduledFusion)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...scheduling.keys import PLAN_KEY
from .env import comfy_available, compute_device, require_comfy, throw_if_interrupted
from .patcher import set_transformer_option

# ------------------------------------------------------------------------------------------------ ScheduledFusion
# (Tests induce an OOM with devkit/induce_oom.py on the MODEL they pass in; this module carries no test hook.)


def sampler_choices() -> tuple[list[str], list[str]]:
    """(sampler names, scheduler names) from comfy.samplers.KSampler; a minimal list outside ComfyUI."""
    if comfy_available():
        try:
            import comfy.samplers

            return list(comfy.samplers.KSampler.SAMPLERS), list(comfy.samplers.KSampler.SCHEDULERS)
        except ImportError:
            pass
    return ["euler", "euler_ancestral", "dpmpp_2m"], ["normal", "karras", "simple"]


@dataclass(frozen=True)
class SamplerArgs:
    """KSampler's widgets, passed to comfy.sample.sample exactly as the node got them."""

    steps: int
    cfg: float
    sampler_name: str
    scheduler: str
    denoise: float


@dataclass(frozen=True)
class SampleCall:
    """What one sampling call adds to the latents: KSampler's widgets, the conditioning pair, the token plan and the
    step callback.

    plan: a crop-space TokenPlan or None; it reaches the attention patches through
    transformer_options["tokenfuse_plan"] on a clone. on_step(steps done, steps of this run): called from the
    sampler's callback after every step (the node's progress bar, env.StepProgress); the callback is also the cancel
    point, checked first.
    """

    sampler: SamplerArgs
    positive: Any
    negative: Any
    plan: Any = None
    on_step: Callable[[int, int], None] | None = None


def sample(model: Any, latent: Any, noise_mask: Any, seeds: list[int], call: SampleCall) -> Any:
    """Sample a batch of face latents through ComfyUI's own sampler path (comfy.sample.sample, as KSampler does).

    latent: [B, C, h, w]; noise_mask: [B, 1, S, S] in [0, 1] (1 = may change); seeds: one per batch item, so each
    face's noise is the same whether it is sampled alone or in a batch.
    """
    require_comfy("ScheduledFusion sampling")
    plan, on_step, args = call.plan, call.on_step, call.sampler
    import comfy.sample
    import comfy.utils
    import torch

    latent_image = comfy.sample.fix_empty_latent_channels(model, latent)
    noise = torch.cat([comfy.sample.prepare_noise(latent_image[i : i + 1], int(s)) for i, s in enumerate(seeds)])
    m = model
    if plan is not None:
        m = model.clone()
        set_transformer_option(m, PLAN_KEY, plan)
    quiet = not comfy.utils.PROGRESS_BAR_ENABLED

    def cancel_point(step: int, x0: Any, x: Any, total: int) -> None:  # every step: cancel works mid-face
        throw_if_interrupted()
        if on_step is not None:
            on_step(step + 1, total)

    return comfy.sample.sample(
        m,
        noise,
        args.steps,
        args.cfg,
        args.sampler_name,
        args.scheduler,
        call.positive,
        call.negative,
        latent_image,
        denoise=args.denoise,
        noise_mask=noise_mask,
        callback=cancel_point,
        disable_pbar=quiet,
        seed=int(seeds[0]),
    )


def vae_encode(vae: Any, pixels: Any, tiled: bool) -> Any:
    """pixels [B, S, S, 3] float 0..1 -> latent, with ComfyUI's VAE (tiled: vae.encode_tiled)."""
    return vae.encode_tiled(pixels[..., :3]) if tiled else vae.encode(pixels[..., :3])


def vae_decode(vae: Any, latent: Any, tiled: bool) -> Any:
    """latent -> pixels [B, S, S, 3] float 0..1 (tiled: vae.decode_tiled)."""
    out = vae.decode_tiled(latent) if tiled else vae.decode(latent)
    return out.reshape((-1,) + tuple(out.shape[-3:])) if out.ndim == 5 else out


def memory_check(model: Any, vae: Any, batch: int, side: int, tiled: bool) -> str:
    """Pre-flight for one fusion batch: "" when it fits, else a message. Uses ComfyUI's own estimates (the U-Net's
    memory_required for cond + uncond latents, the VAE's memory_used_encode/decode, one 512 px tile when tiled) against
    the free memory ComfyUI reports for the device (CPU: available RAM; GPU: free VRAM, or total minus this model's
    weights when other models can be unloaded first). Without these hooks (another model class) the check passes:
    ComfyUI's own OOM handling still applies."""
    if not comfy_available():
        return ""
    import comfy.model_management as mm
    import torch

    device = compute_device(model)
    h = max(1, side // 8)
    try:
        unet = float(model.model.memory_required([2 * batch, 4, h, h]))
        dtype = getattr(vae, "vae_dtype", None)
        px, lat = (min(side, 512), min(h, 64)) if tiled else (side, h)
        enc = float(vae.memory_used_encode([batch, 3, px, px], dtype))
        dec = float(vae.memory_used_decode([batch, 4, lat, lat], dtype))
    except (AttributeError, TypeError):
        return ""
    need = max(unet, enc, dec)
    free = float(mm.get_free_memory(device))
    if device is not None and torch.device(device).type == "cuda":
        free = max(free, float(mm.get_total_memory(device)) - float(model.model_size()))
    if need <= 0.9 * free:
        return ""
    gib = 1024.0**3
    part = "VAE" if max(enc, dec) >= unet else "U-Net"
    return (
        f"{batch} crop(s) of {side}px need ~{need / gib:.1f} GiB ({part}) but {free / gib:.1f} GiB are free on "
        f"{device}; lower guide_size / max_size / faces_per_batch"
    )
