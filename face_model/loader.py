"""Load the committed small face model into ComfyUI objects (`run --demo`, tests, benches).

weights/unet.safetensors: the UNetModel state dict (fp16) plus `tokenfuse.context` [1, T, D], the fixed learned
cross-attention context; weights/vae.safetensors: the AutoencoderKL state dict (fp16). Each file's metadata key
`tokenfuse` holds the JSON config that rebuilds the architecture, so nothing is inferred from tensor shapes.
ComfyUI must already be importable with its CLI args set (the runner's embedded ComfyUI; in tests and benches
devkit/comfy_models.setup_comfy). `save_weights` is what training (devkit/face_model/train.py) exports with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
UNET_FILE = "unet.safetensors"
VAE_FILE = "vae.safetensors"
CONTEXT_KEY = "tokenfuse.context"


@dataclass
class FaceModel:
    """model: comfy ModelPatcher (SD15 model config: eps prediction, SD1.5 latent format); vae: comfy.sd.VAE;
    context: [1, T, D] float32; meta: the JSON stored with the weights (configs, steps, seed)."""

    model: Any
    vae: Any
    context: torch.Tensor
    meta: dict[str, Any]

    def conditioning(self, batch: int = 1) -> list[Any]:
        """ComfyUI CONDITIONING with the learned context (use it as positive and negative; cfg 1 skips the second)."""
        return [[self.context.expand(batch, -1, -1).clone(), {}]]


def weights_present(folder: Path | None = None) -> bool:
    folder = folder or WEIGHTS_DIR
    return (folder / UNET_FILE).is_file() and (folder / VAE_FILE).is_file()


def save_weights(
    dest: Path, unet_sd: dict[str, torch.Tensor], vae_sd: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    """Write both files as fp16 safetensors with their configs in the metadata (what training's export calls)."""
    from safetensors.torch import save_file

    from .nets import EMBED_DIM, VAE_DDCONFIG

    dest.mkdir(parents=True, exist_ok=True)
    unet_meta = {**meta, "kind": "unet"}
    vae_meta = {"kind": "vae", "ddconfig": VAE_DDCONFIG, "embed_dim": EMBED_DIM, "vae_steps": meta.get("vae_steps")}
    half = {k: v.detach().to(torch.float16).contiguous() for k, v in unet_sd.items()}
    save_file(half, str(dest / UNET_FILE), metadata={"tokenfuse": json.dumps(unet_meta)})
    half = {k: v.detach().to(torch.float16).contiguous() for k, v in vae_sd.items()}
    save_file(half, str(dest / VAE_FILE), metadata={"tokenfuse": json.dumps(vae_meta)})


def read_file(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(float32 state dict, tokenfuse metadata) of one weights file (safetensors: no pickle)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads((fh.metadata() or {}).get("tokenfuse", "{}"))
        sd = {k: fh.get_tensor(k).to(torch.float32) for k in fh.keys()}
    if not meta:
        raise ValueError(f"{path} has no 'tokenfuse' metadata: not a TokenFuse face-model file")
    return sd, meta


def load_face_model(folder: Path | None = None, dtype: torch.dtype = torch.float32) -> FaceModel:
    """ModelPatcher + comfy.sd.VAE from the weights folder (default: the committed weights).

    dtype: U-Net inference dtype (float32 on CPU; float16 on a GPU). Raises FileNotFoundError naming the folder.
    """
    import comfy.model_management as mm
    import comfy.model_patcher
    from comfy.sd import VAE

    from .nets import unet_model_config

    folder = folder or WEIGHTS_DIR
    if not weights_present(folder):
        raise FileNotFoundError(f"face model weights not found in {folder} ({UNET_FILE}, {VAE_FILE})")
    unet_sd, meta = read_file(folder / UNET_FILE)
    context = unet_sd.pop(CONTEXT_KEY)
    model_config = unet_model_config({**meta["unet_config"], "dtype": dtype})
    model_config.set_inference_dtype(dtype, None)
    model = model_config.get_model({}, device=torch.device("cpu"))
    missing, unexpected = model.diffusion_model.load_state_dict(unet_sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"{folder / UNET_FILE}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.diffusion_model.to(dtype)
    patcher = comfy.model_patcher.ModelPatcher(
        model, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device()
    )
    vae_sd, vae_meta = read_file(folder / VAE_FILE)
    config = {"params": {"ddconfig": vae_meta["ddconfig"], "embed_dim": vae_meta["embed_dim"]}}
    vae = VAE(sd=vae_sd, config=config)
    return FaceModel(model=patcher, vae=vae, context=context, meta={**meta, "vae": vae_meta})
