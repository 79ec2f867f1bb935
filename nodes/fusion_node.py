"""ScheduledFusion: refine each face in its aligned crop at guide size through ComfyUI's own sampler.

Every model patch upstream (TokenSchedulerController, ControlNet, IPAdapter/InstantID/PuLID) applies, since sampling
goes through comfy.sample.sample with a noise mask. Fallbacks (OOM, artifacts) are reported in the STRING output.

"Scheduling off" (the artifact fallback) = a clone with TokenFuse's attn1 patches, wrappers and attention override
removed (another pack's override that ours wrapped is put back) and `transformer_options["tokenfuse_disabled"]` set,
which every TokenFuse patch honours.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .checks import checked_inputs, model_names_valid
from .glue import env, paths
from .glue.fusion_backend import ComfyInputs, comfy_backend
from .identity import check_swap_models, setup_swap
from .input_specs import diffusion_links, fallback_input, guide_size_input, sampler_inputs, seed_input, swap_inputs
from .model_patching import attempt_models

if TYPE_CHECKING:
    from ..fusion.backend import FusionBackend

log = logging.getLogger(__name__)


def _check_comfy_inputs(model: Any, vae: Any, positive: Any, negative: Any) -> None:
    """MODEL / VAE / CONDITIONING are ComfyUI objects: check their shape of use before sampling starts, so a wrong
    link gives this message instead of an AttributeError deep inside the sampler."""
    if not (hasattr(model, "clone") and hasattr(model, "model_options")):
        raise TypeError(
            f"ScheduledFusion: input 'model' expects a MODEL (Load Checkpoint, TokenSchedulerController), got "
            f"{type(model).__name__}"
        )
    if not (callable(getattr(vae, "encode", None)) and callable(getattr(vae, "decode", None))):
        raise TypeError(f"ScheduledFusion: input 'vae' expects a VAE (Load Checkpoint), got {type(vae).__name__}")
    for name, cond in (("positive", positive), ("negative", negative)):
        if not isinstance(cond, list) or not all(isinstance(c, (list, tuple)) and len(c) == 2 for c in cond):
            raise TypeError(
                f"ScheduledFusion: input '{name}' expects CONDITIONING (CLIP Text Encode), got {type(cond).__name__}"
            )


class ScheduledFusion:
    """Per-face diffusion refinement in aligned crops, with fallbacks that are always reported."""

    DESCRIPTION = (
        "Face detailer: re-draws each face with your diffusion model, only inside a small aligned square around the "
        "face, so it fits in 4-8 GB. Refines faces, or swaps them with an optional source photo. Shows a report per "
        "face (and any fallback taken) in the node. Connect its faces output to Blend."
    )
    CATEGORY = "TokenFuse/photo"
    FUNCTION = "fuse_and_show"
    RETURN_TYPES = ("IMAGE", "FACES", "STRING")
    RETURN_NAMES = ("crops", "faces", "report")
    OUTPUT_TOOLTIPS = (
        "The fused aligned face crops, one per face in frame order (faces that passed through: the input crop).",
        "The FACES carrying the fused crops (Face.crop) for GFPGANEnhance / Blend.",
        "Per face: seed, guide size, U-Net tokens, time, peak memory, fallbacks fired and warnings.",
    )

    def __init__(self, backend: FusionBackend | None = None) -> None:
        """backend: the sampler/VAE calls to use instead of ComfyUI's (the tests' fake stack, the quality gate's
        plain-torch model). ComfyUI makes nodes without arguments, so a
        workflow always gets ComfyUI's, built per run from the MODEL/VAE/CONDITIONING inputs."""
        self.backend = backend

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, dict[str, tuple[Any, ...]]]:
        return {
            "required": {
                **diffusion_links(),
                "image": ("IMAGE", {"tooltip": "The frames the FACES were detected on."}),
                "faces": ("FACES", {"tooltip": "Faces from FaceDetect on the same frames."}),
                "seed": seed_input("Base seed; face k (frame-major order) uses seed + k, stable across reruns."),
                **sampler_inputs(),
                "guide_size": guide_size_input(),
                "max_size": (
                    "INT",
                    {
                        "default": 1024,
                        "min": 64,
                        "max": 4096,
                        "step": 8,
                        "tooltip": "Cap on the sampled crop side (guide_size x crop_factor).",
                    },
                ),
                "crop_factor": (
                    "FLOAT",
                    {
                        "default": 1.0,
                        "min": 1.0,
                        "max": 4.0,
                        "step": 0.1,
                        "tooltip": "Context around the aligned face crop: 1 = the crop itself; 1.5 "
                        "gives the model more hair/neck (more tokens).",
                    },
                ),
                "feather": (
                    "FLOAT",
                    {
                        "default": 0.04,
                        "min": 0.0,
                        "max": 0.25,
                        "step": 0.01,
                        "tooltip": "Noise-mask edge softness as a fraction of the face size "
                        "(0.02-0.08 hides the seam).",
                    },
                ),
                "faces_per_batch": (
                    "INT",
                    {
                        "default": 2,
                        "min": 1,
                        "max": 8,
                        "tooltip": "Faces of one frame sampled together (2-3 fit 6-8 GB at 512 "
                        "with scheduling; an OOM splits the batch).",
                    },
                ),
                "fallback": fallback_input(),
            },
            "optional": {
                "token_plan": (
                    "TOKEN_PLAN",
                    {
                        "tooltip": "When connected (or given to TokenSchedulerController), each crop gets its own "
                        "plan from its face mask and landmarks: the eyes and mouth are protected, the rest of the "
                        "face can be reduced like the background (this plan's protect_threshold at 0.4 or lower "
                        "protects the whole face)."
                    },
                ),
                **swap_inputs(),
            },
        }

    @classmethod
    def IS_CHANGED(cls, swap_model: str = "none", arcface_model: str = "none", **_: Any) -> str:  # noqa: N802
        """The ONNX files' stamps (ComfyUI's name for it): a model replaced under the same name runs the node again."""
        return "|".join(paths.file_stamp("insightface", name) for name in (swap_model, arcface_model))

    @classmethod
    def VALIDATE_INPUTS(cls, swap_model: str = "none", arcface_model: str = "none") -> bool | str:  # noqa: N802
        """ComfyUI skips its "Value not in list" check for these two: a missing ONNX file stops the run with the
        pack's message (checks.model_names_valid)."""
        return model_names_valid(swap_model=swap_model, arcface_model=arcface_model)

    @checked_inputs("swap_model", "arcface_model")
    def fuse(  # noqa: PLR0913 - ComfyUI passes each INPUT_TYPES input as a keyword
        self,
        model: Any,
        vae: Any,
        positive: Any,
        negative: Any,
        image: Any,
        faces: Any,
        seed: int,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        denoise: float,
        guide_size: int,
        max_size: int,
        crop_factor: float,
        feather: float,
        faces_per_batch: int,
        fallback: str,
        token_plan: Any = None,
        swap_model: str = "none",
        arcface_model: str = "none",
        source_image: Any = None,
        source_faces: Any = None,
    ) -> tuple[Any, Any, str]:
        import numpy as np
        import torch

        from ..faces.images import as_rgb_float, warn_out_of_range
        from ..faces.types import FaceSet
        from ..fusion.fallback import FaceReport, format_report
        from ..fusion.run import run_fusion, unsampled
        from .fusion_settings import FusionWidgets

        if not isinstance(faces, FaceSet):
            raise TypeError(f"faces must be a FACES output (FaceSet), got {type(faces).__name__}: connect FaceDetect.")
        if not isinstance(image, torch.Tensor) or image.ndim != 4 or image.shape[-1] not in (1, 2, 3, 4):
            raise ValueError("image must be an IMAGE [B, H, W, C]: connect a LoadImage / VAE Decode output.")
        frames = as_rgb_float(image)  # gray repeated, alpha dropped: FaceDetect and Blend take them too
        faces.check_image(int(image.shape[1]), int(image.shape[2]), int(image.shape[0]))
        check_swap_models(swap_model, arcface_model)  # a missing file stops the run, faces or not
        if faces.count == 0:
            log.warning(
                "ScheduledFusion: no faces in %d frame(s); nothing to refine (Blend returns the image as is).",
                faces.batch_size,
            )
            empty = torch.zeros((0, guide_size, guide_size, 3))
            return empty, faces, format_report([], "ScheduledFusion: no faces detected; image unchanged.")
        warn_out_of_range(frames, "ScheduledFusion")
        widgets = FusionWidgets.from_inputs(
            seed=seed,
            steps=steps,
            cfg=cfg,
            sampler_name=sampler_name,
            scheduler=scheduler,
            denoise=denoise,
            guide_size=guide_size,
            max_size=max_size,
            crop_factor=crop_factor,
            feather=feather,
            faces_per_batch=faces_per_batch,
            fallback=fallback,
        )
        settings = widgets.settings_for(model, token_plan)
        backend = self.backend
        if backend is None:
            env.require_comfy("ScheduledFusion")
            _check_comfy_inputs(model, vae, positive, negative)
            inputs = ComfyInputs(model, vae, positive, negative)
            backend = comfy_backend(inputs, widgets.sampler_args(), faces.count, attempt_models(model))
        if widgets.denoise <= 0.0:
            backend = unsampled(backend)  # nothing to re-generate: skip the VAE round trip, which only blurs
        backend, swap_note = setup_swap(backend, swap_model, arcface_model, source_image, source_faces)
        result = run_fusion(frames, faces, settings, backend)
        crops = result.crops
        size = crops[0].shape[0]
        crops = [c if c.shape[0] == size else _resize(c, size) for c in crops]
        out = torch.from_numpy(np.stack(crops).astype(np.float32))
        reports: list[FaceReport] = result.reports
        header = widgets.header(faces.count, faces.batch_size, settings.use_plan) + swap_note
        report = format_report(reports, header)
        log.info("%s", report.splitlines()[-1])
        return out, result.faces, report

    def fuse_and_show(self, **inputs: Any) -> dict[str, Any]:
        """ComfyUI's entry point: fuse(), plus its per-face report shown in the node (ui.text), so fallbacks and
        warnings are visible in the editor and not only in the server log or an unwired output."""
        crops, faces, report = self.fuse(**inputs)
        return {"ui": {"text": [report]}, "result": (crops, faces, report)}


def _resize(img: Any, size: int) -> Any:
    from ..fusion.crops import resize_square

    return resize_square(img, size)


NODE_CLASS_MAPPINGS = {"TokenFuseScheduledFusion": ScheduledFusion}
# Display names start with what users search for ("face swap", "detailer", "refine"): ComfyUI's node search
# (frontend 1.27) matches the display name and the node id only, and favours words near the start.
NODE_DISPLAY_NAME_MAPPINGS = {"TokenFuseScheduledFusion": "Face Refine / Swap / Detailer (ScheduledFusion)"}
