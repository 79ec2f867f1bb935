"""ModelPatcher glue: keyed wrappers, transformer_options, model family detection, memory-managed modules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .env import comfy_available


# ------------------------------------------------------------------------------------------------ model patching
def add_wrapper(model: Any, kind: str, key: str, fn: Callable[..., Any]) -> None:
    """Attach `fn(executor, *args, **kw)` (must return `executor(*args, **kw)`) as a keyed ModelPatcher wrapper.

    kind: a comfy.patcher_extension.WrappersMP attribute name, e.g. "OUTER_SAMPLE" (one whole sampling run: per-run
    state reset + summary) or "PREDICT_NOISE" (once per step). `model` is a ModelPatcher clone (or a stand-in with
    add_wrapper_with_key in tests; the wrapper type then is the lower-case name, ComfyUI's own value).
    """
    model.add_wrapper_with_key(_wrapper_type(kind), key, fn)


def _wrapper_type(kind: str) -> str:
    if comfy_available():
        try:
            from comfy.patcher_extension import WrappersMP

            key: str = getattr(WrappersMP, kind)
            return key
        except ImportError:
            pass
    return kind.lower()


def has_wrapper(model: Any, kind: str, key: str) -> bool:
    """True when `model` (a ModelPatcher or stand-in) holds a wrapper of `kind` under `key`."""
    wrappers = getattr(model, "wrappers", None)
    return isinstance(wrappers, dict) and bool(wrappers.get(_wrapper_type(kind), {}).get(key))


def remove_wrapper(model: Any, kind: str, key: str) -> None:
    """Remove the keyed wrappers of `kind` from a clone (ModelPatcher.remove_wrappers_with_key, or its dict)."""
    remove = getattr(model, "remove_wrappers_with_key", None)
    if callable(remove):
        remove(_wrapper_type(kind), key)
    elif isinstance(getattr(model, "wrappers", None), dict):
        model.wrappers.get(_wrapper_type(kind), {}).pop(key, None)


def add_outer_sample_wrapper(model: Any, key: str, fn: Callable[..., Any]) -> None:
    """Attach `fn(executor, *args, **kw)` around one whole sampling run (see add_wrapper)."""
    add_wrapper(model, "OUTER_SAMPLE", key, fn)


def set_transformer_option(model: Any, key: str, value: Any) -> None:
    """Set `model.model_options["transformer_options"][key]` without touching dicts shared with other patchers.

    ModelPatcher.clone deep-copies model_options, but a stand-in or a careless node may share them, so the nested
    dict is copied before it is written.
    """
    opts = dict(model.model_options)
    to = dict(opts.get("transformer_options", {}))
    to[key] = value
    opts["transformer_options"] = to
    model.model_options = opts


def timestep_embedding() -> Callable[..., Any]:
    """ComfyUI's sinusoidal timestep embedding (what UNetModel._forward uses; the step cache's shallow forward too)."""
    from comfy.ldm.modules.diffusionmodules.util import timestep_embedding as embed

    fn: Callable[..., Any] = embed
    return fn


def sigma_window(model: Any, start_percent: float, end_percent: float) -> tuple[float, float]:
    """(start, end) sigmas of a window given in ComfyUI's sampling percent (0 = pure noise, 1 = clean), from the
    model's model_sampling, as EasyCache converts its start/end percent. `model`: a ModelPatcher."""
    sampling = model.get_model_object("model_sampling")
    return float(sampling.percent_to_sigma(start_percent)), float(sampling.percent_to_sigma(end_percent))


# ------------------------------------------------------------------------------------------------ family detection
Route = Literal["unet", "override", "none"]

# model_base classes (matched along the MRO, so subclasses such as Chroma(Flux) or WAN22(WAN21) count). SD3: ComfyUI
# 0.3.64's MMDiT hands transformer_options to its joint attention (older ones did not: no call reaches the override,
# and the run's summary warns that none did).
_OVERRIDE_MODELS = {"Flux", "WAN21", "QwenImage", "HunyuanVideo", "LTXV", "SD3"}
_SDXL_CONFIGS = {"SDXL", "SDXLRefiner", "SSD1B", "Segmind_Vega", "KOALA_700M", "KOALA_1B", "SDXL_instructpix2pix"}


@dataclass(frozen=True)
class ModelFamily:
    """How the scheduler can reach a model's attention.

    family: the schedule family ("sd15" for 4-level U-Nets, "sdxl" for 3-level U-Nets, "dit"), or "" if none.
    route: "unet" (attn1_patch / attn1_output_patch), "override" (optimized_attention_override), "none".
    name: the model class name, for logs and reports.
    """

    family: str
    route: Route
    name: str


def _mro_names(obj: Any) -> list[str]:
    return [c.__name__ for c in type(obj).__mro__] if obj is not None else []


def detect_family(model: Any) -> ModelFamily:
    """Classify a ModelPatcher by model.model (model_base class), its model_config and its diffusion_model.

    Works on stand-ins too: only class names and `unet_config` are read.
    """
    base = getattr(model, "model", None)
    config = getattr(base, "model_config", None)
    diffusion = getattr(base, "diffusion_model", None)
    base_names = _mro_names(base)
    config_names = _mro_names(config)
    name = (config_names or base_names or [type(model).__name__])[0]
    if "UNetModel" in _mro_names(diffusion):  # SD1.x/2.x, SDXL, SVD's VideoUNet (a UNetModel subclass)
        if _SDXL_CONFIGS & set(config_names) or "SDXL" in base_names or "SDXLRefiner" in base_names:
            return ModelFamily("sdxl", "unet", name)
        unet_config = getattr(config, "unet_config", {}) or {}
        depth = list(unet_config.get("transformer_depth", []) or [])
        if depth and depth[0] == 0:  # no attention at full resolution: SDXL-like level layout
            return ModelFamily("sdxl", "unet", name)
        return ModelFamily("sd15", "unet", name)
    if _OVERRIDE_MODELS & set(base_names):
        return ModelFamily("dit", "override", base_names[0])
    return ModelFamily("", "none", name if name != "NoneType" else type(model).__name__)


def text_first_patch_size(model: Any) -> int | None:
    """The patch size of a Flux-family model (model_base Flux and its subclasses: Chroma, ChromaRadiance), whose
    attention runs over [text tokens, patchified latent, reference latents]; None for any other model (their
    sequences are laid out differently: HunyuanVideo puts the image first, Wan attends over the image alone)."""
    base = getattr(model, "model", None)
    if "Flux" not in _mro_names(base):
        return None
    patch = getattr(getattr(base, "diffusion_model", None), "patch_size", None)
    return patch if isinstance(patch, int) and patch > 0 else None


def manage_module(module: Any, supports_half: bool = False, supports_bfloat16: bool = False) -> tuple[Any, Any]:
    """Hand a plain torch module (a face restorer) to ComfyUI's memory manager.

    Casts to fp16 (or bf16) where the device and the model allow it and wraps it in comfy.model_patcher.ModelPatcher,
    so ComfyUI can offload it when a diffusion model needs the memory; call load_managed before each use.
    Returns (patcher, dtype); outside ComfyUI (None, torch.float32) with the module left on the CPU.
    """
    import torch

    if not comfy_available():
        return None, torch.float32
    import comfy.model_management as mm
    import comfy.model_patcher

    device = mm.get_torch_device()
    dtype = torch.float32
    if supports_half and mm.should_use_fp16(device, prioritize_performance=True):
        dtype = torch.float16
    elif supports_bfloat16 and mm.should_use_bf16(device, prioritize_performance=True):
        dtype = torch.bfloat16
    if next(module.parameters()).dtype != dtype:
        module.to(dtype)
    patcher = comfy.model_patcher.ModelPatcher(module, load_device=device, offload_device=mm.unet_offload_device())
    return patcher, dtype


def load_managed(patcher: Any) -> None:
    """Put a ModelPatcher's weights on the compute device (model_management.load_model_gpu; frees others first)."""
    import comfy.model_management as mm

    mm.load_model_gpu(patcher)
