"""`run --demo`: the whole chain (detect -> plan -> schedule -> fuse -> restore-less blend) on one photo with no
checkpoint download.

`demo_models()` is the one place that says which weights the demo uses: the project's small trained face model
(face_model/, a few-MB SD1.5-shaped U-Net and SD VAE trained on real faces for testing; real SD1.5/SDXL
checkpoints look far better). Its fixed learned context is both conditionings (cfg 1 in the demo graph).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PACK_DIR = Path(__file__).absolute().parents[1]
DEMO_WEIGHTS = "TokenFuse's small trained face model (face_model/; for testing, far below real checkpoints)"
DEMO_LOADER = "TokenFuseRunnerDemoModels"


def demo_models() -> tuple[Any, Any, Any, Any]:
    """(MODEL, positive CONDITIONING, negative CONDITIONING, VAE) for the demo; see the module docstring."""
    from ..face_model.loader import load_face_model

    face_model = load_face_model()
    cond = face_model.conditioning()
    return face_model.model, cond, cond, face_model.vae


class DemoModels:
    """Runner-only node (never in the pack's NODE_CLASS_MAPPINGS): the demo's model, conditioning and VAE."""

    RETURN_TYPES = ("MODEL", "CONDITIONING", "CONDITIONING", "VAE")
    RETURN_NAMES = ("model", "positive", "negative", "vae")
    FUNCTION = "load"
    CATEGORY = "TokenFuse/runner"
    DESCRIPTION = f"Demo models for `run --demo`: {DEMO_WEIGHTS}."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {}}

    def load(self) -> tuple[Any, Any, Any, Any]:
        return demo_models()


def demo_photo(folder: Path) -> Path:
    """A face photo from an installed package (scikit-image's astronaut, public domain), written to `folder`."""
    try:
        from skimage import data
    except ImportError as e:
        # not a requirement of the pack (ComfyUI does not ship it either); `--input NAME=FILE` binds the demo's
        # only loader and leaves no item, so the way round it is a photo as the item
        raise FileNotFoundError(
            "--demo's sample photo needs scikit-image (python -m pip install scikit-image), or give a photo of "
            "yours: run --demo photo.jpg"
        ) from e
    import cv2

    path = folder / "astronaut.png"
    ok, png = cv2.imencode(".png", data.astronaut()[:, :, ::-1])
    if not ok:
        raise OSError("could not encode the demo photo")
    path.write_bytes(png.tobytes())  # not cv2.imwrite: on Windows it takes ANSI paths (a user folder with é failed)
    return path


def demo_prompt(steps: int = 4, guide_size: int = 128) -> dict[str, dict[str, Any]]:
    """The demo graph as an API prompt; inputs not named here take their node defaults (filled by the runner)."""

    def node(kind: str, title: str, **inputs: Any) -> dict[str, Any]:
        return {"class_type": kind, "inputs": inputs, "_meta": {"title": title}}

    return {
        "1": node(DEMO_LOADER, "demo models"),
        "2": node("LoadImage", "image", image="astronaut.png"),
        "3": node("TokenFuseFaceDetect", "detect", image=["2", 0], crop_size=guide_size, max_faces=1),
        "4": node("TokenFusePatchTokenize", "plan", image=["2", 0], faces=["3", 0]),
        "5": node(
            "TokenFuseTokenSchedulerController", "schedule", model=["1", 0], token_plan=["4", 0], preset="balanced"
        ),
        "6": node(
            "TokenFuseScheduledFusion",
            "fuse",
            model=["5", 0],
            vae=["1", 3],
            positive=["1", 1],
            negative=["1", 2],
            image=["2", 0],
            faces=["3", 0],
            token_plan=["4", 0],
            steps=steps,
            cfg=1.0,  # one learned context serves as both conditionings
            guide_size=guide_size,
            max_size=guide_size,
            fallback="oom-only",
        ),
        "7": node("TokenFuseBlend", "blend", image=["2", 0], faces=["6", 1]),
        "8": node("SaveImage", "save", images=["7", 0], filename_prefix="tokenfuse_demo"),
    }


def fill_defaults(prompt: dict[str, dict[str, Any]], defs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Give every required widget input not set in `prompt` its definition's default (first choice for combos)."""
    for node in prompt.values():
        required = (defs.get(node["class_type"], {}).get("input") or {}).get("required") or {}
        for name, spec in required.items():
            if name in node["inputs"] or not isinstance(spec, (list, tuple)) or not spec:
                continue
            opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if "default" in opts:
                node["inputs"][name] = opts["default"]
            elif isinstance(spec[0], (list, tuple)) and spec[0]:
                node["inputs"][name] = spec[0][0]
    return prompt
