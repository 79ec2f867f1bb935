"""FaceDetect, PatchTokenize and Blend: thin node classes over faces/ (detect, plan, paste back).

Heavy modules (torch, cv2, onnxruntime and the face cores) are imported inside the node functions so that ComfyUI's
start-up import of the pack stays light.
"""

from __future__ import annotations

import logging
from typing import Any, cast, get_args

from ..faces.types import DetectorBackend
from ..scheduling.vocabulary import LEVELS, Device
from .checks import checked_inputs
from .detector_inputs import BACKEND_TIP, detect_linked_batch, detector_folders, model_stamp, reference_embedding
from .glue import env, ui
from .input_specs import SelectionWidgets, device_input, identity_inputs, selection_inputs

log = logging.getLogger(__name__)


class FaceDetect:
    DESCRIPTION = (
        "Finds the faces in a photo or video frames, picks which ones to work on, and cuts out an aligned square "
        "of each. Start every TokenFuse workflow here."
    )
    CATEGORY = "TokenFuse/photo"
    FUNCTION = "detect"
    RETURN_TYPES = ("FACES", "IMAGE", "MASK")
    RETURN_NAMES = ("faces", "preview", "mask")
    OUTPUT_TOOLTIPS = (
        "Per frame: the selected faces with landmarks, alignment affine and inverse, soft mask (and embedding).",
        "The image with boxes, indices, scores and landmarks drawn.",
        "Union of the selected faces' soft masks, [B, H, W].",
    )

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE", {"tooltip": "Frames to search (a batch is processed frame by frame)."}),
                "backend": (list(get_args(DetectorBackend)), {"default": "auto", "tooltip": BACKEND_TIP}),
                **selection_inputs("face"),
                "crop_size": (
                    "INT",
                    {
                        "default": 512,
                        "min": 64,
                        "max": 2048,
                        "step": 8,
                        "tooltip": "Side of the aligned crop (512 = FFHQ, what GFPGAN/CodeFormer and "
                        "SD1.5 expect; 1024 for SDXL).",
                    },
                ),
                "crop_factor": (
                    "FLOAT",
                    {
                        "default": 1.0,
                        "min": 1.0,
                        "max": 4.0,
                        "step": 0.05,
                        "tooltip": "Zoom out around the face: 1.0 = FFHQ framing (the tightest: the face "
                        "mask needs the whole face in the crop), 1.5 adds hair and neck context at the cost of face "
                        "resolution.",
                    },
                ),
                "detect_size": (
                    "INT",
                    {
                        "default": 640,
                        "min": 0,
                        "max": 4096,
                        "step": 32,
                        "tooltip": "Detect on a copy whose long side is at most this (0 = full "
                        "size); boxes map back. 640 keeps 1080p frames fast; raise it "
                        "for small faces in large frames.",
                    },
                ),
                "device": device_input("face"),
            },
            "optional": {
                **identity_inputs("face"),
                "frame_smoothing": (
                    "FLOAT",
                    {
                        "default": 2.0,
                        "min": 0.0,
                        "max": 30.0,
                        "step": 0.5,
                        "tooltip": "For a batch of video frames: faces are linked across consecutive frames of one "
                        "shot (the same people kept in every frame, in the same order, missed frames filled) and "
                        "each face's alignment is smoothed over time with this sigma in frames (2-4 stops the crop "
                        "shaking; no lag). Frames that do not continue the previous one (unrelated photos, a cut) "
                        "are never linked. 0 = every frame on its own.",
                    },
                ),
            },
        }

    IS_CHANGED = staticmethod(model_stamp)

    @checked_inputs()
    def detect(  # noqa: PLR0913 - ComfyUI passes each INPUT_TYPES input as a keyword
        self,
        image: Any,
        backend: str,
        score_threshold: float,
        order: str,
        indices: str,
        max_faces: int,
        min_face_size: int,
        crop_size: int,
        crop_factor: float,
        detect_size: int,
        device: str,
        model_name: str = "",
        reference_faces: Any = None,
        similarity_threshold: float = 0.3,
        frame_smoothing: float = 2.0,
    ) -> tuple[Any, ...]:
        import numpy as np
        import torch

        from ..faces.analyse import AlignOptions, FaceFinder, detect_batch, load_backend
        from ..faces.draw import draw_faces, face_mask_image
        from ..faces.images import as_rgb_float, to_uint8
        from ..faces.types import FaceSet

        frames = as_rgb_float(image)
        b, h, w = frames.shape[:3]
        reference = None if reference_faces is None else reference_embedding(reference_faces)
        widgets = SelectionWidgets(order, indices, max_faces, min_face_size, score_threshold, similarity_threshold)
        sel = widgets.selection(reference)
        if b == 0:
            log.warning("FaceDetect got an empty batch: nothing to detect")
            return FaceSet(image_size=(h, w), faces=()), image, torch.zeros((0, h, w))
        folders, name = detector_folders(backend, model_name.strip())
        detector, embedder = load_backend(
            cast(DetectorBackend, backend), folders, name, cast(Device, device), cancel=env.throw_if_interrupted
        )
        if sel.reference is not None and embedder is None:
            raise ValueError(
                "reference_faces need embeddings on this side too: use the insightface backend with a "
                "pack that has a recognition model (w600k_*.onnx)."
            )
        u8 = np.stack([to_uint8(f) for f in frames])
        bar = env.progress_bar(b)
        finder = FaceFinder(detector, embedder, sel, AlignOptions(crop_size, crop_factor), detect_size)
        linked = detect_linked_batch(u8, finder, frame_smoothing, bar)
        if linked is not None:
            faceset, link_note = FaceSet(image_size=(h, w), faces=linked[0]), f"; {linked[1].summary()}"
        else:
            link_note = ""
            faceset = detect_batch(u8, finder, on_frame=lambda: bar.update(1))
        ran = backend if detector.name == backend else f"{backend}: {detector.name}"  # "auto: mtcnn"
        empty = sum(1 for f in faceset.faces if not f)
        if empty:
            log.warning("FaceDetect (%s): no face in %d of %d frame(s); those frames pass through", ran, empty, b)
        preview = torch.from_numpy(frames.copy())  # frames without a face pass through exactly
        for i in range(b):
            if faceset.faces[i]:
                drawn = draw_faces(u8[i], faceset.faces[i], f"detector: {detector.name}")
                preview[i] = torch.from_numpy(drawn).float() / 255
        mask = torch.from_numpy(np.stack([face_mask_image(h, w, faceset.faces[i]) for i in range(b)]))
        log.info("FaceDetect (%s): %d face(s) in %d frame(s)%s", ran, faceset.count, b, link_note)
        return faceset, preview, mask


class PatchTokenize:
    DESCRIPTION = (
        "Plans where the diffusion model keeps its tokens: the face keeps them, the background is merged. "
        "Shows the plan and the expected saving in the node."
    )
    CATEGORY = "TokenFuse/photo"
    FUNCTION = "tokenize"
    # An output node runs (and shows its plan and saving) even when nothing downstream uses its outputs.
    OUTPUT_NODE = True
    RETURN_TYPES = ("TOKEN_PLAN", "IMAGE")
    RETURN_NAMES = ("token_plan", "preview")
    OUTPUT_TOOLTIPS = (
        "Importance map and per-level token budgets for TokenSchedulerController / ScheduledFusion.",
        "The photo under the chosen level's token grid, coloured by kept fraction.",
    )

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE", {"tooltip": "The frames FaceDetect saw (used for the size check and the preview)."}),
                "faces": ("FACES", {"tooltip": "FACES from FaceDetect on the same image."}),
                "width": (
                    "INT",
                    {
                        "default": 0,
                        "min": 0,
                        "max": 16384,
                        "step": 8,
                        "tooltip": "Pixel width the sampler will run at (latent = /8); 0 = image width.",
                    },
                ),
                "height": (
                    "INT",
                    {
                        "default": 0,
                        "min": 0,
                        "max": 16384,
                        "step": 8,
                        "tooltip": "Pixel height the sampler will run at; 0 = image height.",
                    },
                ),
                "background_floor": (
                    "FLOAT",
                    {
                        "default": 0.1,
                        "min": 0.0,
                        "max": 0.49,
                        "step": 0.01,
                        "tooltip": "Importance of the background (0.1 = merge freely; "
                        "raise it to keep more background detail).",
                    },
                ),
                "face_weight": (
                    "FLOAT",
                    {
                        "default": 0.9,
                        "min": 0.0,
                        "max": 1.0,
                        "step": 0.01,
                        "tooltip": "Importance of the face hull (eyes and mouth are always 1.0). "
                        "At or above protect_threshold the face is never merged.",
                    },
                ),
                "falloff": (
                    "FLOAT",
                    {
                        "default": 0.35,
                        "min": 0.0,
                        "max": 2.0,
                        "step": 0.05,
                        "tooltip": "Width of the soft ring around the face, as a fraction of the face "
                        "size. Wider protects hair and neck, saves fewer tokens.",
                    },
                ),
                "min_keep": (
                    "FLOAT",
                    {
                        "default": 0.25,
                        "min": 0.05,
                        "max": 1.0,
                        "step": 0.01,
                        "tooltip": "Smallest kept fraction of any region (0.25 = merge at most 75%, "
                        "the safe upper bound for token merging).",
                    },
                ),
                "protect_threshold": (
                    "FLOAT",
                    {
                        "default": 0.5,
                        "min": 0.05,
                        "max": 1.0,
                        "step": 0.01,
                        "tooltip": "Tokens at least this important are never merged.",
                    },
                ),
                "preview_level": (
                    [str(f) for f in LEVELS],
                    {
                        "default": "16",
                        "tooltip": "U-Net level (downsampling factor vs the image) whose token grid is drawn.",
                    },
                ),
            },
        }

    @checked_inputs()
    def tokenize(  # noqa: PLR0913 - ComfyUI passes each INPUT_TYPES input as a keyword
        self,
        image: Any,
        faces: Any,
        width: int,
        height: int,
        background_floor: float,
        face_weight: float,
        falloff: float,
        min_keep: float,
        protect_threshold: float,
        preview_level: str,
    ) -> dict[str, Any]:
        import numpy as np
        import torch

        from ..faces.images import as_rgb_float, to_uint8
        from ..faces.importance import PlanOptions, build_plan, level_grid, plan_preview

        frames = as_rgb_float(image)
        b, h, w = frames.shape[:3]
        faces.check_image(h, w, b, "the image input of PatchTokenize")
        latent = (max(1, (height or h) // 8), max(1, (width or w) // 8))
        opts = PlanOptions(
            floor=background_floor,
            face_weight=face_weight,
            falloff=falloff,
            min_keep=min_keep,
            protect_threshold=protect_threshold,
        )
        plan = build_plan(faces, latent, opts)
        if b == 0:
            return {"ui": {"images": [], "text": ["PatchTokenize: empty batch, no plan"]}, "result": (plan, image)}
        bar = env.progress_bar(b)
        previews = []
        grid = level_grid(latent[0], latent[1], int(preview_level))
        for i in range(b):
            previews.append(plan_preview(to_uint8(frames[i]), plan, i, grid, opts))
            bar.update(1)
        if faces.count == 0:
            log.warning("PatchTokenize: no face in the FACES input; the plan treats every frame as background")
        log.info(
            "PatchTokenize: %d frame(s), expected token reduction %.1f%% vs uniform", b, 100 * plan.expected_reduction()
        )
        preview = torch.from_numpy(np.stack(previews)).float() / 255
        # ui: the editor shows the plan and the saving inside the node (web/tokenfuse_preview.js, tokenfuse_report.js)
        shown = {
            "images": ui.save_temp_previews(preview, "tokenfuse_plan"),
            "text": [plan_summary(faces.count, b, plan.expected_reduction(), int(preview_level))],
        }
        return {"ui": shown, "result": (plan, preview)}


class Blend:
    DESCRIPTION = (
        "Pastes the refined or restored faces back into the photo with a soft edge. Pixels outside the faces stay "
        "exactly as they were. Shows in the node whether faces were pasted or the photo passed through."
    )
    CATEGORY = "TokenFuse/photo"
    FUNCTION = "blend_and_show"
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("image",)
    OUTPUT_TOOLTIPS = ("The frames with the processed faces pasted back.",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "image": ("IMAGE", {"tooltip": "The original frames (the same ones FaceDetect saw)."}),
                "faces": ("FACES", {"tooltip": "FACES whose faces carry processed crops."}),
                "strength": (
                    "FLOAT",
                    {
                        "default": 1.0,
                        "min": 0.0,
                        "max": 1.0,
                        "step": 0.01,
                        "tooltip": "1.0 = full replacement inside the mask; lower mixes in the original face.",
                    },
                ),
                "color_transfer": (
                    "BOOLEAN",
                    {
                        "default": False,
                        "tooltip": "Match the crop's LAB mean/std to the original face (fixes "
                        "tint drift from diffusion or restoration).",
                    },
                ),
                "seamless": (
                    "BOOLEAN",
                    {
                        "default": False,
                        "tooltip": "Poisson-blend (cv2.seamlessClone) before feathering: hides "
                        "lighting seams, can wash out strong edits.",
                    },
                ),
            },
        }

    @checked_inputs()
    def blend(self, image: Any, faces: Any, strength: float, color_transfer: bool, seamless: bool) -> tuple[Any, ...]:
        import numpy as np
        import torch

        from ..faces.images import as_rgb_float, warn_out_of_range
        from ..faces.paste import BlendOptions, paste_frame

        frames = as_rgb_float(image)
        b, h, w = frames.shape[:3]
        faces.check_image(h, w, b, "the image input of Blend")
        with_crop = sum(1 for frame in faces.faces for f in frame if f.crop is not None)
        if with_crop == 0:
            log.warning("%s", blend_passthrough(faces.count))
            return (image,)
        warn_out_of_range(frames, "Blend")
        opts = BlendOptions(strength=strength, color_transfer=color_transfer, seamless=seamless)
        bar = env.progress_bar(b)
        out_frames = []
        for i in range(b):
            out_frames.append(paste_frame(frames[i], faces.faces[i], opts))
            bar.update(1)
        result = torch.from_numpy(np.stack(out_frames))
        log.info("Blend: pasted %d face(s) into %d frame(s)", with_crop, b)
        if image.is_floating_point() and image.ndim == 4 and image.shape[-1] >= 3:
            out = image.clone()
            out[..., :3] = result.to(device=image.device, dtype=image.dtype)
            return (out,)
        return (result,)

    def blend_and_show(
        self, image: Any, faces: Any, strength: float, color_transfer: bool, seamless: bool
    ) -> dict[str, Any]:
        """ComfyUI's entry point: blend(), plus one status line shown in the node (ui.text), so a pass-through is
        visible in the editor and not only in the server log."""
        (out,) = self.blend(image, faces, strength, color_transfer, seamless)
        return {"ui": {"text": [blend_status(faces, out is image)]}, "result": (out,)}


BLEND_NO_FACE = (
    "Blend: no face was found upstream (FaceDetect found none in this image), so there was nothing to paste; the "
    "image is unchanged"
)
BLEND_NO_CROP = (
    "Blend: no face carries a processed crop (connect ScheduledFusion or GFPGANEnhance before Blend); the image "
    "passes through unchanged"
)


def blend_passthrough(face_count: int) -> str:
    """Why Blend passed the image through: no face at all upstream (a photo without a face: the chain is fine), or
    faces without processed crops (the chain misses ScheduledFusion / GFPGANEnhance: then the advice helps)."""
    return BLEND_NO_FACE if face_count == 0 else BLEND_NO_CROP


def blend_status(faces: Any, passed_through: bool) -> str:
    """The line Blend shows in the editor: what it pasted, or the pass-through warning."""
    if passed_through:
        return f"WARNING: {blend_passthrough(faces.count)}"
    pasted = sum(1 for frame in faces.faces for f in frame if f.crop is not None)
    return f"Blend: pasted {pasted} face(s) into {faces.batch_size} frame(s)"


def plan_summary(faces: int, frames: int, reduction: float, level: int) -> str:
    """The line PatchTokenize shows in the editor under its plan preview."""
    if faces == 0:
        return f"PatchTokenize: no face in {frames} frame(s): no saving (the whole image is background)"
    return (
        f"PatchTokenize: {faces} face(s) in {frames} frame(s): {100 * reduction:.0f} % fewer tokens than uniform "
        f"tokenisation (preview: the /{level} grid)"
    )


NODE_CLASS_MAPPINGS = {
    "TokenFuseFaceDetect": FaceDetect,
    "TokenFusePatchTokenize": PatchTokenize,
    "TokenFuseBlend": Blend,
}
# Display names: the design-card name, with the words users search for (tests/test_editor_ui.py: how search ranks).
NODE_DISPLAY_NAME_MAPPINGS = {
    "TokenFuseFaceDetect": "FaceDetect",
    "TokenFusePatchTokenize": "Token Plan (PatchTokenize)",
    "TokenFuseBlend": "Blend / Paste Faces Back",
}
