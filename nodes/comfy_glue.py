"""The one module that touches ComfyUI (`comfy.*`, `server`, `folder_paths`), always lazily inside functions.

Node modules call these helpers instead of importing ComfyUI, so the pack imports (and its node classes run) in CI
where ComfyUI is absent. Each helper either has a harmless fallback (progress bar, stats, interrupt check) or
raises `ComfyUnavailableError` naming what needs ComfyUI.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)


class ComfyUnavailableError(RuntimeError):
    """Raised when a feature needs ComfyUI and the `comfy` package cannot be imported."""


def comfy_available() -> bool:
    """True when ComfyUI's `comfy` package is importable (inside ComfyUI or with its folder on sys.path)."""
    return "comfy" in sys.modules or importlib.util.find_spec("comfy") is not None


def require_comfy(feature: str) -> None:
    """Raise a clear error when `feature` needs ComfyUI and it is absent."""
    if not comfy_available():
        raise ComfyUnavailableError(
            f"{feature} needs ComfyUI: run it inside ComfyUI (or put the ComfyUI folder on sys.path)."
        )


# ----------------------------------------------------------------------------------------------- progress / cancel
class _NoProgress:
    """Stand-in for comfy.utils.ProgressBar outside ComfyUI."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.current = 0

    def update(self, value: int) -> None:
        self.current += value

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        self.current = value
        if total is not None:
            self.total = total


def progress_bar(total: int) -> Any:
    """comfy.utils.ProgressBar(total) inside ComfyUI (its update() raises on user cancel); a no-op outside."""
    if comfy_available():
        try:
            import comfy.utils

            return comfy.utils.ProgressBar(total)
        except ImportError:
            pass
    return _NoProgress(total)


def throw_if_interrupted() -> None:
    """Raise ComfyUI's interrupt exception when the user pressed cancel; no-op outside ComfyUI."""
    if "comfy.model_management" in sys.modules:
        sys.modules["comfy.model_management"].throw_exception_if_processing_interrupted()


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

            return getattr(WrappersMP, kind)
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


# ------------------------------------------------------------------------------------------------ family detection
Route = Literal["unet", "override", "none"]

# model_base classes (matched along the MRO, so subclasses such as Chroma(Flux) or WAN22(WAN21) count).
_OVERRIDE_MODELS = {"Flux", "WAN21", "QwenImage", "HunyuanVideo", "LTXV"}
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


# ------------------------------------------------------------------------------------------------ live stats
def stats_listener_present() -> bool:
    """True when a ComfyUI server runs in this process (so live stats have somewhere to go)."""
    server = sys.modules.get("server")
    return getattr(getattr(server, "PromptServer", None), "instance", None) is not None


def send_stats(event: str, data: dict[str, Any]) -> bool:
    """Send a websocket event to the ComfyUI frontend when a server runs; False (no-op) otherwise.

    Reads `server` from sys.modules instead of importing it: outside a running server there is nobody to tell, and
    importing the server module would be expensive.
    """
    server = sys.modules.get("server")
    prompt_server = getattr(server, "PromptServer", None)
    instance = getattr(prompt_server, "instance", None)
    if instance is None:
        return False
    try:
        instance.send_sync(event, data)
    except Exception as exc:  # a stats event must never break sampling
        log.debug("send_sync(%s) failed: %s", event, exc)
        return False
    return True


def import_comfy(module: str) -> Any:
    """Import a ComfyUI module by name (e.g. "comfy.model_management"), or raise ComfyUnavailableError."""
    require_comfy(module)
    return importlib.import_module(module)


def save_temp_previews(images: Any, prefix: str = "tokenfuse_preview") -> list[dict[str, str]]:
    """Save IMAGE previews [B, H, W, 3] in 0..1 to ComfyUI's temp folder, as PreviewImage does, for a node's
    `{"ui": {"images": ...}}` (the editor shows them in the node). Without ComfyUI: nothing saved, []."""
    if not comfy_available() or images is None or len(images) == 0:
        return []
    import os
    import uuid

    import numpy as np
    from PIL import Image

    folder_paths = importlib.import_module("folder_paths")
    out_dir = folder_paths.get_temp_directory()
    os.makedirs(out_dir, exist_ok=True)
    saved = []
    for img in images:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}.png"
        pixels = (np.clip(img.detach().cpu().numpy(), 0.0, 1.0) * 255.0).round().astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(out_dir, name), compress_level=1)
        saved.append({"filename": name, "subfolder": "", "type": "temp"})
    return saved


# ------------------------------------------------------------------------------------------------ model files / memory
FACERESTORE_FOLDER = "facerestore_models"


def facerestore_dirs() -> list[str]:
    """Folders searched for face-restoration models: ComfyUI's models/facerestore_models (registered with
    folder_paths on first use, like other face packs do) plus any extra_model_paths entries; [] outside ComfyUI."""
    if not comfy_available():
        return []
    try:
        import folder_paths
    except ImportError:
        return []
    import os

    default = os.path.join(folder_paths.models_dir, FACERESTORE_FOLDER)
    folder_paths.add_model_folder_path(FACERESTORE_FOLDER, default)  # no-op when already listed
    return folder_paths.get_folder_paths(FACERESTORE_FOLDER)


def list_facerestore_models(extensions: tuple[str, ...]) -> list[str]:
    """File names (relative to the facerestore folders) with one of `extensions`; [] outside ComfyUI."""
    if not facerestore_dirs():
        return []
    import folder_paths

    return [f for f in folder_paths.get_filename_list(FACERESTORE_FOLDER) if f.lower().endswith(extensions)]


def facerestore_model_path(name: str) -> str:
    """Full path of a face-restoration model: an existing absolute path as is (scripts, CI), else looked up in
    models/facerestore_models. Raises FileNotFoundError naming the folder and the fix."""
    import os

    if os.path.isabs(name) and os.path.isfile(name):
        return name
    dirs = facerestore_dirs()
    if dirs:
        import folder_paths

        path = folder_paths.get_full_path(FACERESTORE_FOLDER, name)
        if path:
            return path
    where = ", ".join(dirs) if dirs else "ComfyUI/models/facerestore_models (ComfyUI not running: give a full path)"
    raise FileNotFoundError(
        f"face-restoration model {name!r} not found in {where}: download e.g. GFPGANv1.4.pth (or a converted "
        ".safetensors) into models/facerestore_models, then press R in ComfyUI to refresh the list."
    )


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


# ------------------------------------------------------------------------------------------------ ScheduledFusion
# Test hook: when > 0, the next fusion_sample calls raise ComfyUI's OOM exception (one per count). Set by the
# ScheduledFusion node from the environment variable FUSION_OOM_ENV at the start of each run (or by tests directly).
FUSION_OOM_ENV = "TOKENFUSE_FUSION_INDUCE_OOM"
_fusion_oom_left = [0]


def fusion_induce_oom(times: int) -> None:
    """Make the next `times` fusion_sample calls raise the OOM exception (tests, demos of the fallback chain)."""
    _fusion_oom_left[0] = max(0, int(times))


def fusion_oom_exception() -> type[BaseException]:
    """comfy.model_management.OOM_EXCEPTION inside ComfyUI (torch.cuda.OutOfMemoryError), MemoryError outside."""
    mm = sys.modules.get("comfy.model_management")
    if mm is None and comfy_available():
        mm = importlib.import_module("comfy.model_management")
    return getattr(mm, "OOM_EXCEPTION", MemoryError) if mm is not None else MemoryError


def fusion_is_oom(exc: BaseException) -> bool:
    oom = fusion_oom_exception()
    return isinstance(exc, MemoryError) or (oom is not Exception and isinstance(exc, oom))


def fusion_is_interrupt(exc: BaseException) -> bool:
    """True for ComfyUI's cancel exception (it must propagate, never count as a failed face)."""
    return type(exc).__name__ == "InterruptProcessingException"


def fusion_sampler_choices() -> tuple[list[str], list[str]]:
    """(sampler names, scheduler names) from comfy.samplers.KSampler; a minimal list outside ComfyUI."""
    if comfy_available():
        try:
            import comfy.samplers

            return list(comfy.samplers.KSampler.SAMPLERS), list(comfy.samplers.KSampler.SCHEDULERS)
        except ImportError:
            pass
    return ["euler", "euler_ancestral", "dpmpp_2m"], ["normal", "karras", "simple"]


def fusion_sample(
    model: Any,
    latent: Any,
    noise_mask: Any,
    seeds: list[int],
    plan: Any,
    *,
    steps: int,
    cfg: float,
    sampler_name: str,
    scheduler: str,
    positive: Any,
    negative: Any,
    denoise: float,
) -> Any:
    """Sample a batch of face latents through ComfyUI's own sampler path (comfy.sample.sample, as KSampler does).

    latent: [B, C, h, w]; noise_mask: [B, 1, S, S] in [0, 1] (1 = may change); seeds: one per batch item, so each
    face's noise is the same whether it is sampled alone or in a batch. plan: a crop-space TokenPlan or None; it
    reaches the attention patches through transformer_options["tokenfuse_plan"] on a clone.
    """
    require_comfy("ScheduledFusion sampling")
    import comfy.sample
    import comfy.utils
    import torch

    if _fusion_oom_left[0] > 0:
        _fusion_oom_left[0] -= 1
        raise fusion_oom_exception()(f"out of memory induced by {FUSION_OOM_ENV} (test hook)")
    latent_image = comfy.sample.fix_empty_latent_channels(model, latent)
    noise = torch.cat([comfy.sample.prepare_noise(latent_image[i : i + 1], int(s)) for i, s in enumerate(seeds)])
    m = model
    if plan is not None:
        m = model.clone()
        set_transformer_option(m, "tokenfuse_plan", plan)
    quiet = not comfy.utils.PROGRESS_BAR_ENABLED

    def cancel_point(step: int, x0: Any, x: Any, total: int) -> None:  # every step: cancel works mid-face
        throw_if_interrupted()

    return comfy.sample.sample(
        m,
        noise,
        steps,
        cfg,
        sampler_name,
        scheduler,
        positive,
        negative,
        latent_image,
        denoise=denoise,
        noise_mask=noise_mask,
        callback=cancel_point,
        disable_pbar=quiet,
        seed=int(seeds[0]),
    )


def fusion_vae_encode(vae: Any, pixels: Any, tiled: bool) -> Any:
    """pixels [B, S, S, 3] float 0..1 -> latent, with ComfyUI's VAE (tiled: vae.encode_tiled)."""
    return vae.encode_tiled(pixels[..., :3]) if tiled else vae.encode(pixels[..., :3])


def fusion_vae_decode(vae: Any, latent: Any, tiled: bool) -> Any:
    """latent -> pixels [B, S, S, 3] float 0..1 (tiled: vae.decode_tiled)."""
    out = vae.decode_tiled(latent) if tiled else vae.decode(latent)
    return out.reshape((-1,) + tuple(out.shape[-3:])) if out.ndim == 5 else out


def fusion_device(model: Any) -> Any:
    """The device sampling runs on (model.load_device; ComfyUI's torch device otherwise)."""
    dev = getattr(model, "load_device", None)
    if dev is None and comfy_available():
        import comfy.model_management as mm

        dev = mm.get_torch_device()
    return dev


def fusion_peak_reset(device: Any) -> None:
    import torch

    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)


def fusion_peak_bytes(device: Any) -> int | None:
    """Peak allocated device memory since fusion_peak_reset (CUDA); None where the device cannot tell (CPU)."""
    import torch

    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated(device))
    return None


def fusion_empty_cache() -> None:
    if "comfy.model_management" in sys.modules:
        sys.modules["comfy.model_management"].soft_empty_cache()


def insightface_dirs() -> list[str]:
    """Folders for insightface-style ONNX models (models/insightface), registering the name if ComfyUI lacks it."""
    if not comfy_available():
        return []
    import os

    import folder_paths

    if "insightface" not in folder_paths.folder_names_and_paths:
        folder_paths.add_model_folder_path("insightface", os.path.join(folder_paths.models_dir, "insightface"))
    return list(folder_paths.get_folder_paths("insightface"))


def list_insightface_onnx() -> list[str]:
    """ONNX files (relative names) under models/insightface; [] outside ComfyUI."""
    import os

    out: list[str] = []
    for root in insightface_dirs():
        if not os.path.isdir(root):
            continue
        for dirpath, _, files in os.walk(root):
            for f in files:
                if f.lower().endswith(".onnx"):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return sorted(set(out))


def insightface_model_path(name: str) -> str:
    """Full path of an ONNX model in models/insightface (an existing absolute path is returned as is)."""
    import os

    if os.path.isabs(name) and os.path.isfile(name):
        return name
    for root in insightface_dirs():
        path = os.path.join(root, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"model {name!r} not found in models/insightface: put the ONNX file (e.g. inswapper_128.onnx, "
        "w600k_r50.onnx) there and press R in ComfyUI to refresh the list."
    )


def face_model_dirs(kind: str) -> list[str]:
    """Model folders of `kind` ("facedetection" or "insightface"): ComfyUI's models/<kind> (registered on first use)
    plus extra_model_paths entries; outside ComfyUI, $TOKENFUSE_MODELS/<kind> when that variable is set, else []."""
    import os

    if comfy_available():
        try:
            import folder_paths

            if kind not in folder_paths.folder_names_and_paths:
                folder_paths.add_model_folder_path(kind, os.path.join(folder_paths.models_dir, kind))
            return list(folder_paths.get_folder_paths(kind))
        except ImportError:
            pass
    root = os.environ.get("TOKENFUSE_MODELS")
    return [os.path.join(root, kind)] if root else []
