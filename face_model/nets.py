"""The small face model's two networks, built from ComfyUI's own classes (imported lazily: ComfyUI must be on
sys.path and its CLI args set first, see devkit/comfy_models.setup_comfy).

- VAE: `comfy.ldm.models.autoencoder.AutoencoderKL`, SD's layout (/8, 4 latent channels) at a quarter of SD's
  width (channels 32-64-64-64) with one res block per level: what `comfy.sd.VAE(sd, config=...)` loads.
- U-Net: `comfy.ldm.modules.diffusionmodules.openaimodel.UNetModel` in SD1.5's exact block layout (channel_mult
  1-2-4-4, two res blocks per level, a `SpatialTransformer` at the input/output blocks of the three top levels and in
  the middle block, 8 heads) at 32 base channels instead of 320 (a tenth of every width), so block indices, levels
  and attn1 call sites are SD1.5's. Cross-attention gets a fixed learned context [1, T, D] stored with the weights
  (an unconditional model).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

VAE_DDCONFIG: dict[str, Any] = {
    "double_z": True,
    "z_channels": 4,
    "resolution": 256,
    "in_channels": 3,
    "out_ch": 3,
    "ch": 32,
    "ch_mult": [1, 2, 2, 2],
    "num_res_blocks": 1,
    "attn_resolutions": [],
    "dropout": 0.0,
}
EMBED_DIM = 4
SD15_SCALE = 0.18215  # ComfyUI's SD15 latent format; the trained VAE is rescaled so its latents match it

# SD1.5's U-Net layout (comfy.supported_models.SD15 + the keys checkpoint detection fills in), narrower.
UNET_CONFIG: dict[str, Any] = {
    "use_checkpoint": False,
    "image_size": 32,
    "in_channels": 4,
    "out_channels": 4,
    "model_channels": 32,
    "num_res_blocks": [2, 2, 2, 2],
    "channel_mult": [1, 2, 4, 4],
    "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0],
    "transformer_depth_middle": 1,
    "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
    "use_spatial_transformer": True,
    "legacy": False,
    "context_dim": 64,
    "use_linear_in_transformer": False,
    "adm_in_channels": None,
    "use_temporal_attention": False,
    "use_temporal_resblock": False,
}
CONTEXT_TOKENS = 4


def reset_parameters(module: torch.nn.Module) -> None:
    """PyTorch's default init for every conv/linear/norm (ComfyUI's layers skip it to load fast)."""
    for m in module.modules():
        for base in (torch.nn.Conv2d, torch.nn.Linear, torch.nn.GroupNorm, torch.nn.LayerNorm):
            if isinstance(m, base):
                # the torch base class's init: ComfyUI's ops subclasses override reset_parameters with a no-op
                base.reset_parameters(m)  # type: ignore[arg-type]
                break


@torch.no_grad()
def _zero(module: torch.nn.Module) -> None:
    for p in module.parameters():
        p.zero_()


def build_vae(ddconfig: dict[str, Any] | None = None) -> torch.nn.Module:
    """A freshly initialised AutoencoderKL (train mode, fp32, CPU)."""
    from comfy.ldm.models.autoencoder import AutoencoderKL

    model = AutoencoderKL(ddconfig=copy.deepcopy(ddconfig or VAE_DDCONFIG), embed_dim=EMBED_DIM)
    reset_parameters(model)
    built: torch.nn.Module = model
    return built


def unet_model_config(unet_config: dict[str, Any] | None = None) -> Any:
    """comfy.supported_models.SD15 carrying our U-Net config (SD15's sampling, latent format and 8 heads)."""
    import comfy.supported_models as sm

    cfg = {**(unet_config or UNET_CONFIG)}
    cfg.setdefault("dtype", torch.float32)
    return sm.SD15(cfg)


def build_unet(unet_config: dict[str, Any] | None = None) -> torch.nn.Module:
    """A freshly initialised UNetModel (fp32, CPU): PyTorch default init, res-block and final output convolutions
    zeroed as in SD. The transformers' proj_out is NOT zeroed: with a few hundred CPU steps a zero-initialised
    attention path would stay near zero, and a model whose attention contributes is the point of this fixture."""
    from comfy.ldm.modules.diffusionmodules.openaimodel import ResBlock, UNetModel

    mc = unet_model_config(unet_config)
    cfg = {k: v for k, v in mc.unet_config.items() if k not in ("dtype",)}
    net = UNetModel(**cfg, dtype=torch.float32, device=torch.device("cpu"))
    reset_parameters(net)
    for m in net.modules():
        if isinstance(m, ResBlock):
            _zero(m.out_layers[-1])
    _zero(net.out[-1])
    built: torch.nn.Module = net
    return built


def count_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@torch.no_grad()
def fold_latent_scale(sd: dict[str, torch.Tensor], mean: torch.Tensor, std: torch.Tensor) -> None:
    """Rescale quant_conv / post_quant_conv so the encoder's latent mean has per-channel mean 0 and std
    1/0.18215 (SD1.5's latent format), leaving decode(encode(x)) unchanged. mean/std: [4]."""
    c = 1.0 / SD15_SCALE / std  # [4]
    w, b = sd["quant_conv.weight"], sd["quant_conv.bias"]  # [8, 8, 1, 1], [8]: first 4 rows = mean
    w[:4] *= c.view(4, 1, 1, 1)
    b[:4] = (b[:4] - mean) * c
    b[4:] += 2.0 * torch.log(c)  # logvar: the posterior width scales too
    pw, pb = sd["post_quant_conv.weight"], sd["post_quant_conv.bias"]  # [4, 4, 1, 1]
    pb += pw[:, :, 0, 0] @ mean
    pw /= c.view(1, 4, 1, 1)
