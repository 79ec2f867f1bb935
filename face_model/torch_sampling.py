"""The face model end to end in plain torch: weights, SD1.5's discrete schedule, ComfyUI's euler sampler with a noise
mask, TokenFuse scheduling, and a FusionBackend for the pack's real fusion loop (fusion/run.py). No ComfyUI import.

What each piece reproduces (tests/integration/test_torch_face_model.py compares them with ComfyUI's classes):
- `DiscreteSchedule`: comfy.model_sampling.ModelSamplingDiscrete + EPS for SD1.5 (linear-in-sqrt betas 0.00085-0.012,
  1 000 steps; sigma -> nearest integer timestep; log-linear sigma(t)); `ksampler_sigmas` = KSampler.set_steps with
  the "normal" scheduler (denoise < 1: the last steps+1 sigmas of int(steps / denoise) steps).
- `sample`: comfy.sample.sample with sampler "euler", cfg 1 (one model row per step: ComfyUI skips the uncond row at
  cfg 1), a noise mask (KSamplerX0Inpaint: the unmasked latent is re-noised to the current sigma before each call and
  pinned to the clean latent after), per-seed noise from torch.manual_seed(seed) on CPU (prepare_noise), latents
  scaled by SD1.5's 0.18215 in and out. transformer_options per call: the model's own options (patches, plan, ...)
  plus sigmas (the [B] sigma), sample_sigmas, cond_or_uncond and uuids, as _calc_cond_batch sets them.
- `scheduled(model, preset, strategy)`: what TokenSchedulerController attaches for the sd15 family (the same
  Schedule from the widgets, the same scheduling/patches.py closures); "off" attaches nothing.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .loader import CONTEXT_KEY, UNET_FILE, VAE_FILE, WEIGHTS_DIR, read_file
from .nets import SD15_SCALE
from .torch_unet import TorchUNet
from .torch_vae import TorchVAE


class DiscreteSchedule:
    """SD1.5's eps-prediction discrete schedule, as ComfyUI's ModelSamplingDiscrete computes it (float32 tables)."""

    def __init__(self, linear_start: float = 0.00085, linear_end: float = 0.012, timesteps: int = 1000) -> None:
        betas = torch.linspace(linear_start**0.5, linear_end**0.5, timesteps, dtype=torch.float64) ** 2
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        sigmas = ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5
        self.sigmas = sigmas.float()
        self.log_sigmas = sigmas.log().float()

    @property
    def sigma_min(self) -> torch.Tensor:
        return self.sigmas[0]

    @property
    def sigma_max(self) -> torch.Tensor:
        return self.sigmas[-1]

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        """sigma [B] -> the index of the nearest table sigma in log space [B] (int64)."""
        dists = sigma.log().to(self.log_sigmas.device) - self.log_sigmas[:, None]
        return dists.abs().argmin(dim=0).view(sigma.shape).to(sigma.device)

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        t = torch.clamp(timestep.float(), min=0, max=len(self.sigmas) - 1)
        lo, hi, w = t.floor().long(), t.ceil().long(), t.frac()
        return ((1 - w) * self.log_sigmas[lo] + w * self.log_sigmas[hi]).exp()

    def normal(self, steps: int) -> torch.Tensor:
        """ComfyUI's "normal" scheduler: steps sigmas evenly spaced in timestep, then 0."""
        start, end = self.timestep(self.sigma_max), self.timestep(self.sigma_min)
        sigs = [float(self.sigma(ts)) for ts in torch.linspace(start, end, steps)]
        return torch.FloatTensor(sigs + [0.0])

    def ksampler_sigmas(self, steps: int, denoise: float) -> torch.Tensor:
        if denoise > 0.9999:
            return self.normal(steps)
        if denoise <= 0.0:
            return torch.FloatTensor([])
        return self.normal(int(steps / denoise))[-(steps + 1) :]


@dataclass
class TorchFaceModel:
    """unet/vae in eval mode (float32, CPU unless moved); context [1, T, D]; options: transformer_options the sampler
    passes to every U-Net call (empty = the plain model; `scheduled` returns a copy with patches)."""

    unet: TorchUNet
    vae: TorchVAE
    context: torch.Tensor
    meta: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    schedule: DiscreteSchedule = field(default_factory=DiscreteSchedule)

    def with_options(self, **options: Any) -> TorchFaceModel:
        """A copy sharing the networks whose transformer_options add `options` (patch lists are copied)."""
        merged = {**self.options, **options}
        if "patches" in self.options and "patches" in options:
            merged["patches"] = {**self.options["patches"], **options["patches"]}
        return replace(self, options=merged)

    @torch.no_grad()
    def denoise(self, x: torch.Tensor, sigma: torch.Tensor, sample_sigmas: torch.Tensor) -> torch.Tensor:
        """BaseModel.apply_model for eps: x [B,4,h,w] noisy latent at sigma [B] -> denoised latent."""
        s = sigma.view(-1, 1, 1, 1)
        xc = x / (s**2 + 1.0) ** 0.5
        t = self.schedule.timestep(sigma).float()
        to = dict(self.options)
        to.update(
            sigmas=sigma,
            sample_sigmas=sample_sigmas,
            cond_or_uncond=[0],
            uuids=[self._uuid],
        )
        dtype = next(self.unet.parameters()).dtype
        ctx = self.context.to(x.device, dtype).expand(x.shape[0], -1, -1)
        eps: torch.Tensor = self.unet(xc.to(dtype), t, ctx, to).float()
        return x - eps * s

    _uuid = uuid.uuid4()


def load_torch_face_model(folder: Path | None = None, device: str | torch.device = "cpu") -> TorchFaceModel:
    """The committed (or `folder`'s) weights in the plain-torch networks; strict load, float32, eval mode."""
    folder = Path(folder) if folder else WEIGHTS_DIR
    unet_sd, meta = read_file(folder / UNET_FILE)
    context = unet_sd.pop(CONTEXT_KEY)
    unet = TorchUNet(meta["unet_config"])
    unet.load_state_dict(unet_sd, strict=True)
    vae_sd, vae_meta = read_file(folder / VAE_FILE)
    vae = TorchVAE(vae_meta["ddconfig"], vae_meta["embed_dim"])
    vae.load_state_dict(vae_sd, strict=True)
    unet.eval().to(device)
    vae.eval().to(device)
    return TorchFaceModel(unet, vae, context.to(device), {**meta, "vae": vae_meta})


def prepare_noise(shape: tuple[int, ...], seeds: list[int]) -> torch.Tensor:
    """comfy.sample.prepare_noise per batch item (seed per face, as the pack's sampling glue does): [B, C, h, w]."""
    return torch.cat([torch.randn((1, *shape[1:]), generator=torch.manual_seed(int(s)), device="cpu") for s in seeds])


@dataclass(frozen=True)
class EulerRun:
    """One sampling run's settings: steps and denoise (as KSampler's widgets), the crop-space token plan (None: no
    plan) and callback(step index), called after every step."""

    steps: int = 20
    denoise: float = 0.45
    plan: Any = None
    callback: Callable[[int], None] | None = None


@torch.no_grad()
def sample(
    model: TorchFaceModel,
    latent: torch.Tensor,
    noise_mask: torch.Tensor | None,
    seeds: list[int],
    run: EulerRun = EulerRun(),
) -> torch.Tensor:
    """ComfyUI euler / normal / cfg 1 on an unscaled VAE latent [B, 4, h, w]; noise_mask [B, 1, H, W] in 0..1 at any
    size (1 = may change; bilinear to the latent as ComfyUI does). Returns the unscaled latent."""
    from ..scheduling.keys import PLAN_KEY

    steps, denoise, plan, callback = run.steps, run.denoise, run.plan, run.callback
    device = latent.device
    sigmas = model.schedule.ksampler_sigmas(steps, denoise).to(device)
    if sigmas.numel() == 0:
        return latent
    if plan is not None:
        model = model.with_options(**{PLAN_KEY: plan})
    noise = prepare_noise(tuple(latent.shape), seeds).to(device)
    clean = latent.float() * SD15_SCALE if torch.count_nonzero(latent) > 0 else latent.float()
    mask = None
    if noise_mask is not None:
        m = noise_mask.reshape((-1, 1, noise_mask.shape[-2], noise_mask.shape[-1])).float()
        m = F.interpolate(m, size=latent.shape[2:], mode="bilinear")
        mask = m.repeat(1, latent.shape[1], 1, 1)
        if mask.shape[0] < latent.shape[0]:
            mask = mask.repeat(math.ceil(latent.shape[0] / mask.shape[0]), 1, 1, 1)[: latent.shape[0]]
        mask = mask.to(device)
    s0 = sigmas[0]
    max_denoise = math.isclose(float(model.schedule.sigma_max), float(s0), rel_tol=1e-05) or float(s0) > float(
        model.schedule.sigma_max
    )
    x = noise * (torch.sqrt(1.0 + s0**2.0) if max_denoise else s0) + clean
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        sigma = sigmas[i] * s_in
        xin = x
        if mask is not None:
            xin = x * mask + (noise * sigma.view(-1, 1, 1, 1) + clean) * (1.0 - mask)
        den = model.denoise(xin, sigma, sigmas)
        if mask is not None:
            den = den * mask + clean * (1.0 - mask)
        d = (x - den) / sigmas[i]
        x = x + d * (sigmas[i + 1] - sigmas[i])
        if callback is not None:
            callback(i)
    return x / SD15_SCALE


def scheduled(model: TorchFaceModel, preset: str, strategy: str = "preset", ratio: float = 0.0) -> TorchFaceModel:
    """The model with TokenSchedulerController's sd15 schedule for these widgets attached (scheduling/patches.py)."""
    from ..scheduling.keys import PRESET_KEY
    from ..scheduling.patches import build_unet_patches
    from ..scheduling.telemetry import RunTelemetry
    from ..scheduling.widgets import schedule_from_widgets

    schedule = schedule_from_widgets(preset, strategy, ratio, "sd15")
    if schedule.is_off:
        return model.with_options(**{PRESET_KEY: preset})
    attn1, attn1_out = build_unet_patches(schedule, RunTelemetry())
    return with_patches(model, [attn1], [attn1_out], **{PRESET_KEY: preset})


def with_patches(model: TorchFaceModel, attn1: list[Any], attn1_output: list[Any], **options: Any) -> TorchFaceModel:
    """A copy with these attn1 / attn1_output patches appended after any already attached (ComfyUI's order)."""
    patches = {k: list(v) for k, v in model.options.get("patches", {}).items()}
    patches["attn1_patch"] = patches.get("attn1_patch", []) + list(attn1)
    patches["attn1_output_patch"] = patches.get("attn1_output_patch", []) + list(attn1_output)
    return replace(model, options={**model.options, **options, "patches": patches})


def fusion_backend(model: TorchFaceModel, steps: int = 20, denoise: float = 0.45) -> Any:
    """A fusion/run.FusionBackend running `model` (a plain or scheduled TorchFaceModel) in place of ComfyUI.

    "Scheduling off" attempts (the artifact fallback) get the model without patches, like strip_tokenfuse.
    """
    from ..fusion.backend import FusionBackend

    plain = replace(model, options={})

    def model_for(attempt: Any) -> tuple[TorchFaceModel, str]:
        return (model if attempt.scheduling else plain), ""

    def run(m: TorchFaceModel, latent: torch.Tensor, mask: torch.Tensor, seeds: list[int], plan: Any) -> torch.Tensor:
        return sample(m, latent, mask, seeds, EulerRun(steps, denoise, plan))

    return FusionBackend(
        encode=lambda px, tiled: model.vae.encode(px),
        decode=lambda lat, tiled: model.vae.decode(lat),
        sample=run,
        model_for=model_for,
    )
