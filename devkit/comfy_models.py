"""Random-weight diffusion models built from real ComfyUI code, for integration tests and bench scripts.

No checkpoint is needed: the architecture comes from ComfyUI's `comfy.supported_models` configs (the published SD1.5 /
SDXL / Flux / SD3 hyper-parameters below complete them), weights are drawn here. Random weights are valid for speed,
memory and "does the patch run / change / stay bit-identical" checks, never for image quality.

Usage (before anything imports comfy.model_management):
    setup_comfy("/path/to/ComfyUI", cpu=True, sdpa=True)
    patcher = build_model("sd15", model_channels=32, tiny=True)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

# Architecture keys the supported_models classes leave to checkpoint detection (published SD1.5 / SDXL layouts).
_UNET_ARCH: dict[str, dict[str, Any]] = {
    "sd15": {
        "use_checkpoint": False,
        "image_size": 32,
        "in_channels": 4,
        "out_channels": 4,
        "use_spatial_transformer": True,
        "legacy": False,
        "num_res_blocks": [2, 2, 2, 2],
        "channel_mult": [1, 2, 4, 4],
        "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0],
        "transformer_depth_middle": 1,
        "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
        "use_temporal_resblock": False,
    },
    "sdxl": {
        "use_checkpoint": False,
        "image_size": 32,
        "in_channels": 4,
        "out_channels": 4,
        "use_spatial_transformer": True,
        "legacy": False,
        "num_classes": "sequential",
        "num_res_blocks": [2, 2, 2],
        "channel_mult": [1, 2, 4],
        "transformer_depth_middle": 10,
        "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
        "num_head_channels": 64,
        "use_temporal_resblock": False,
    },
}
# Shrunk transformer depths for tests (one block per attention site keeps the layout, not the cost).
_TINY_DEPTH: dict[str, dict[str, Any]] = {
    "sd15": {},
    "sdxl": {
        "transformer_depth": [0, 0, 1, 1, 1, 1],
        "transformer_depth_middle": 1,
        "transformer_depth_output": [0, 0, 0, 1, 1, 1, 1, 1, 1],
    },
}
# Flux.1-dev layout (hidden 3072, 19 double + 38 single blocks); tiny=True keeps the structure at hidden 64.
_FLUX_FULL = {
    "in_channels": 16,
    "out_channels": 16,
    "vec_in_dim": 768,
    "context_in_dim": 4096,
    "hidden_size": 3072,
    "mlp_ratio": 4.0,
    "num_heads": 24,
    "depth": 19,
    "depth_single_blocks": 38,
    "axes_dim": [16, 56, 56],
    "theta": 10000,
    "patch_size": 2,
    "qkv_bias": True,
    "guidance_embed": True,
}
_FLUX_TINY = {
    **_FLUX_FULL,
    "vec_in_dim": 32,
    "context_in_dim": 64,
    "hidden_size": 64,
    "num_heads": 2,
    "depth": 1,
    "depth_single_blocks": 1,
    "axes_dim": [8, 12, 12],
}

# SD3-medium layout (MMDiT depth 24: hidden 64 x depth, 24 heads); tiny=True: the structure at depth 2 (hidden 128).
_SD3_FULL: dict[str, Any] = {
    "in_channels": 16,
    "out_channels": 16,
    "patch_size": 2,
    "depth": 24,
    "pos_embed_max_size": 192,
    "adm_in_channels": 2048,
    "context_embedder_config": {"target": "torch.nn.Linear", "params": {"in_features": 4096, "out_features": 1536}},
}
_SD3_TINY: dict[str, Any] = {
    **_SD3_FULL,
    "depth": 2,
    "pos_embed_max_size": 64,
    "adm_in_channels": 32,
    "context_embedder_config": {"target": "torch.nn.Linear", "params": {"in_features": 64, "out_features": 128}},
}

FAMILIES = ("sd15", "sdxl", "flux", "sd3")


def setup_comfy(comfyui_path: str | Path, cpu: bool = True, sdpa: bool = True) -> None:
    """Put ComfyUI on sys.path and set its CLI args before comfy.model_management is imported.

    cpu: force ComfyUI's CPU mode. sdpa: select PyTorch SDPA attention (what NVIDIA users get); otherwise ComfyUI
    picks its own default for the device (sub-quadratic attention on CPU).
    """
    path = str(Path(comfyui_path).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)
    import comfy.cli_args

    if "comfy.model_management" not in sys.modules:
        comfy.cli_args.args.cpu = cpu
        comfy.cli_args.args.use_pytorch_cross_attention = sdpa
    import comfy.model_management  # noqa: F401  (fixes the device / attention choice now)


def attention_backend() -> str:
    """Name of the attention function ComfyUI's U-Net / DiT layers call (e.g. attention_pytorch = SDPA)."""
    import comfy.ldm.modules.attention as attention

    name = getattr(attention.optimized_attention, "__name__", str(attention.optimized_attention))
    return {
        "attention_pytorch": "pytorch-sdpa",
        "attention_sub_quad": "sub-quadratic",
        "attention_split": "split",
        "attention_xformers": "xformers",
        "attention_basic": "basic",
        "attention_sage": "sage",
        "attention_flash": "flash",
    }.get(name, name)


def torch_compiled(patcher: Any, backend: Any) -> Any:
    """patcher.clone() with ComfyUI's TorchCompileModel wrapper (`set_torch_compile_wrapper`: an APPLY_MODEL wrapper
    running a torch.compile'd diffusion_model), as the TorchCompileModel node applies it. backend: a dynamo backend
    name ("inductor", "eager") or a backend callable (tests count graphs with one)."""
    from comfy_api.torch_helpers import set_torch_compile_wrapper

    m = patcher.clone()
    set_torch_compile_wrapper(model=m, backend=backend)
    return m


def dynamo_graphs() -> int:
    """Graphs dynamo compiled in this process (its unique_graphs counter; torch._dynamo.reset() keeps it)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@torch.no_grad()
def init_random_weights(module: torch.nn.Module, seed: int = 0) -> None:
    """Seeded fan-in scaled init of every parameter (ComfyUI's layers skip init, so memory is garbage otherwise).

    Matrices/convs: N(0, 1/fan_in); norm scales 1, every other vector 0. Drawn on CPU so the weights do not depend
    on the device.
    """
    gen = torch.Generator().manual_seed(seed)
    norm_params = set()
    for m in module.modules():
        if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm)) or type(m).__name__ in ("RMSNorm",):
            if getattr(m, "weight", None) is not None:
                norm_params.add(id(m.weight))
    for _, p in module.named_parameters():
        if id(p) in norm_params:
            p.fill_(1.0)
        elif p.ndim >= 2:
            fan_in = math.prod(p.shape[1:])
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) / math.sqrt(fan_in))
        elif p.ndim == 1 and p.numel() > 0 and _is_scale(module, p):
            p.fill_(1.0)
        else:
            p.zero_()


def _is_scale(module: torch.nn.Module, p: torch.Tensor) -> bool:
    """A 1-D parameter named like a norm scale (Flux's QKNorm / RMSNorm `scale`)."""
    for name, q in module.named_parameters():
        if q is p:
            return name.endswith("scale")
    return False


def _unet_config(family: str, model_channels: int, tiny: bool, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    import comfy.supported_models as sm

    cls = {"sd15": sm.SD15, "sdxl": sm.SDXL}[family]
    cfg = {**cls.unet_config, **_UNET_ARCH[family], "model_channels": model_channels, "dtype": dtype}
    if tiny:
        cfg.update(_TINY_DEPTH[family])
        if family == "sdxl":  # keep >= 2 heads at 64-channel-wide levels
            cfg["num_head_channels"] = max(8, model_channels // 4)
    return cls, cfg


def build_model(
    family: str, *, model_channels: int = 320, tiny: bool = False, dtype: torch.dtype = torch.float32, seed: int = 0
) -> Any:
    """A ModelPatcher around a random-weight model of `family` ("sd15", "sdxl", "flux" or "sd3").

    model_channels: U-Net base width (320 is the real one; tests use 32). tiny: one transformer block per attention
    site (SDXL) / hidden 64 (Flux) / two joint blocks (SD3). Weights stay on the offload device until ComfyUI loads
    the model.
    """
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models as sm

    if family == "flux":
        cls = sm.Flux
        cfg = {**sm.Flux.unet_config, **(_FLUX_TINY if tiny else _FLUX_FULL), "dtype": dtype}
    elif family == "sd3":
        cls = sm.SD3
        cfg = {**sm.SD3.unet_config, **(_SD3_TINY if tiny else _SD3_FULL), "dtype": dtype}
    else:
        cls, cfg = _unet_config(family, model_channels, tiny, dtype)
    model_config = cls(cfg)
    model_config.set_inference_dtype(dtype, None)
    model = model_config.get_model({}, device=torch.device("cpu"))
    init_random_weights(model.diffusion_model, seed)
    model.diffusion_model.to(dtype)
    return comfy.model_patcher.ModelPatcher(
        model, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device()
    )


def conditioning(family: str, batch: int = 1, tokens: int = 77, seed: int = 1, tiny: bool = False) -> list[Any]:
    """Random text conditioning in ComfyUI's CONDITIONING format ([[cond [B,T,C], {"pooled_output": ...}]])."""
    gen = torch.Generator().manual_seed(seed)
    if family == "sd15":
        return [[torch.randn(batch, tokens, 768, generator=gen), {}]]
    if family == "sdxl":
        pooled = torch.randn(batch, 1280, generator=gen)
        return [[torch.randn(batch, tokens, 2048, generator=gen), {"pooled_output": pooled}]]
    if family == "sd3":
        sd3: dict[str, Any] = _SD3_TINY if tiny else _SD3_FULL
        width = sd3["context_embedder_config"]["params"]["in_features"]
        pooled = torch.randn(batch, sd3["adm_in_channels"], generator=gen)
        return [[torch.randn(batch, tokens, width, generator=gen), {"pooled_output": pooled}]]
    flux: dict[str, Any] = _FLUX_TINY if tiny else _FLUX_FULL
    return [
        [
            torch.randn(batch, tokens, flux["context_in_dim"], generator=gen),
            {"pooled_output": torch.randn(batch, flux["vec_in_dim"], generator=gen), "guidance": 3.5},
        ]
    ]


def latent_channels(family: str) -> int:
    return 16 if family in ("flux", "sd3") else 4


def model_inputs(
    patcher: Any, family: str, shape: tuple[int, int, int], seed: int = 0, tiny: bool = False
) -> dict[str, Any]:
    """Tensors for one direct `model.apply_model` call (what one sampling step feeds the model for a batch).

    shape: (batch, height, width), height/width in pixels (latent is /8). Returns x [B,C,H/8,W/8], t [B] (sigma),
    and the model kwargs (c_crossattn, y, guidance) on the model's device and dtype.
    """
    import comfy.model_management as mm

    batch, height, width = shape
    device = mm.get_torch_device()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, latent_channels(family), height // 8, width // 8, generator=gen)
    cond, extra = conditioning(family, batch=batch, seed=seed + 1, tiny=tiny)[0]
    kwargs: dict[str, Any] = {"c_crossattn": cond}
    if family == "sdxl":
        kwargs["y"] = patcher.model.encode_adm(pooled_output=extra["pooled_output"], width=width, height=height)
    elif family == "flux":
        kwargs["y"] = extra["pooled_output"]
        kwargs["guidance"] = torch.full((batch,), 3.5)
    elif family == "sd3":
        kwargs["y"] = extra["pooled_output"]
    sigma = 1.0 if family in ("flux", "sd3") else 7.0
    out = {"x": x.to(device), "t": torch.full((batch,), sigma, device=device)}
    out.update({k: v.to(device) for k, v in kwargs.items()})
    return out


SD_VAE_DDCONFIG = {
    "double_z": True,
    "z_channels": 4,
    "resolution": 256,
    "in_channels": 3,
    "out_ch": 3,
    "ch": 128,
    "ch_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_resolutions": [],
    "dropout": 0.0,
}


def build_vae(ch: int = 128, seed: int = 0, dtype: torch.dtype | None = None) -> Any:
    """comfy.sd.VAE of the SD (AutoencoderKL, /8, 4 latent channels) architecture with seeded random weights.

    ch=128 is the real SD VAE; tests use 32 (same layout, 16x fewer FLOPs). The state dict goes through
    comfy.sd.VAE's own loading (config path for a shrunk ch, key detection for the real one).
    """
    from comfy.ldm.models.autoencoder import AutoencoderKL
    from comfy.sd import VAE

    ddconfig = {**SD_VAE_DDCONFIG, "ch": ch}
    model = AutoencoderKL(ddconfig=ddconfig, embed_dim=4)
    init_random_weights(model, seed)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    config = None if ch == 128 else {"params": {"ddconfig": ddconfig, "embed_dim": 4}}
    return VAE(sd=sd, config=config, dtype=dtype)


def write_sd15_checkpoint(path: str | Path, seed: int = 0) -> Path:
    """A random-weight SD1.5 checkpoint file (U-Net, SD VAE, CLIP-L text encoder) that ComfyUI's
    CheckpointLoaderSimple loads and detects as SD1.5, for tests of code that takes a user's checkpoint by name.

    Full-size architectures (ComfyUI recognises SD1.5 by its 320-channel U-Net and 768-wide context): ~2.1 GB in
    fp16, seconds to write. Random weights check that a graph runs, never image quality. Requires ComfyUI imported
    (setup_comfy).
    """
    from comfy.ldm.models.autoencoder import AutoencoderKL
    from comfy.sd1_clip import SDClipModel
    from safetensors.torch import save_file

    state: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        unet = build_model("sd15", seed=seed).model.diffusion_model
        state.update({f"model.diffusion_model.{k}": v.half() for k, v in unet.state_dict().items()})
        del unet
        vae = AutoencoderKL(ddconfig=SD_VAE_DDCONFIG, embed_dim=4)
        init_random_weights(vae, seed + 1)
        state.update({f"first_stage_model.{k}": v.half() for k, v in vae.state_dict().items()})
        del vae
        clip = SDClipModel(device="cpu", dtype=torch.float32)
        init_random_weights(clip.transformer, seed + 2)
        text = {k: v for k, v in clip.state_dict().items() if k.startswith("transformer.text_model.")}
        state.update({f"cond_stage_model.{k}": v.half() for k, v in text.items()})
        del clip
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out))
    return out
