"""`run --demo`: the whole chain (detect -> plan -> schedule -> fuse -> restore-less blend) on one photo with no
checkpoint download.

`demo_models()` is the one place that says which weights the demo uses by default: the project's small trained face
model (face_model/, a few-MB SD1.5-shaped U-Net and SD VAE trained on real faces for testing; real SD1.5/SDXL
checkpoints look far better). Its fixed learned context is both conditionings (cfg 1 in the demo graph).
`run --demo --checkpoint NAME` runs the same graph with one of the user's SD1.5 checkpoints from ComfyUI's
checkpoints folder instead (ComfyUI's own CheckpointLoaderSimple and CLIPTextEncode nodes). After the run the runner
writes a contact sheet per photo beside its output (runner/demo_sheet.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("tokenfuse.runner")
PACK_DIR = Path(__file__).absolute().parents[1]
DEMO_WEIGHTS = "TokenFuse's small trained face model (face_model/; for testing, far below real checkpoints)"
DEMO_LOADER = "TokenFuseRunnerDemoModels"
CHECKPOINT_LOADER = "CheckpointLoaderSimple"
PLAN_PREFIX = "tokenfuse_demo_plan"  # the token plan preview's SaveImage (the contact sheet's middle panel)
# What a real SD1.5 checkpoint gets in the demo graph: refinement settings of the 4 GB workflow's kind.
CHECKPOINT_SETTINGS: dict[str, int] = {"steps": 20, "guide_size": 512}
CHECKPOINT_CFG = 5.0
POSITIVE = "a detailed photo of a face, natural skin texture, sharp focus"
NEGATIVE = "blurry, deformed, cartoon, lowres"


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
    load_photo: Callable[[], Any] = data.astronaut  # scikit-image has no type hints
    ok, png = cv2.imencode(".png", load_photo()[:, :, ::-1])
    if not ok:
        raise OSError("could not encode the demo photo")
    path.write_bytes(png.tobytes())  # not cv2.imwrite: on Windows it takes ANSI paths (a user folder with é failed)
    return path


def demo_prompt(
    steps: int = 4, guide_size: int = 128, checkpoint: str | None = None, plan_image: bool = False
) -> dict[str, dict[str, Any]]:
    """The demo graph as an API prompt; inputs not named here take their node defaults (filled by the runner).

    checkpoint: a file name in ComfyUI's checkpoints folder, loaded by CheckpointLoaderSimple with a text prompt (the
    steps / guide_size arguments give way to CHECKPOINT_SETTINGS); None: the small trained face model.
    plan_image: also save PatchTokenize's preview (PLAN_PREFIX), for the contact sheet.
    """

    def node(kind: str, title: str, **inputs: Any) -> dict[str, Any]:
        return {"class_type": kind, "inputs": inputs, "_meta": {"title": title}}

    if checkpoint is None:
        models = {"1": node(DEMO_LOADER, "demo models")}
        model, vae, positive, negative, cfg = ["1", 0], ["1", 3], ["1", 1], ["1", 2], 1.0  # one learned context
    else:
        steps, guide_size = CHECKPOINT_SETTINGS["steps"], CHECKPOINT_SETTINGS["guide_size"]
        models = {
            "1": node(CHECKPOINT_LOADER, "demo models", ckpt_name=checkpoint),
            "10": node("CLIPTextEncode", "positive", clip=["1", 1], text=POSITIVE),
            "11": node("CLIPTextEncode", "negative", clip=["1", 1], text=NEGATIVE),
        }
        model, vae, positive, negative, cfg = ["1", 0], ["1", 2], ["10", 0], ["11", 0], CHECKPOINT_CFG
    prompt = {
        **models,
        "2": node("LoadImage", "image", image="astronaut.png"),
        "3": node("TokenFuseFaceDetect", "detect", image=["2", 0], crop_size=guide_size, max_faces=1),
        "4": node("TokenFusePatchTokenize", "plan", image=["2", 0], faces=["3", 0]),
        "5": node("TokenFuseTokenSchedulerController", "schedule", model=model, token_plan=["4", 0], preset="balanced"),
        "6": node(
            "TokenFuseScheduledFusion",
            "fuse",
            model=["5", 0],
            vae=vae,
            positive=positive,
            negative=negative,
            image=["2", 0],
            faces=["3", 0],
            token_plan=["4", 0],
            steps=steps,
            cfg=cfg,
            guide_size=guide_size,
            max_size=guide_size,
            fallback="oom-only",
        ),
        "7": node("TokenFuseBlend", "blend", image=["2", 0], faces=["6", 1]),
        "8": node("SaveImage", "save", images=["7", 0], filename_prefix="tokenfuse_demo"),
    }
    if plan_image:
        prompt["9"] = node("SaveImage", "save plan", images=["4", 1], filename_prefix=PLAN_PREFIX)
    return prompt


def checkpoint_names(defs: dict[str, dict[str, Any]]) -> list[str]:
    """The files in ComfyUI's checkpoints folder, as CheckpointLoaderSimple lists them (its ckpt_name choices)."""
    spec = (((defs.get(CHECKPOINT_LOADER) or {}).get("input") or {}).get("required") or {}).get("ckpt_name")
    choices = spec[0] if isinstance(spec, (list, tuple)) and spec else []
    return [str(c) for c in choices] if isinstance(choices, (list, tuple)) else []


def check_checkpoint(name: str, defs: dict[str, dict[str, Any]]) -> None:
    """WorkflowError (exit 2) when `name` is not a file of ComfyUI's checkpoints folder; the message lists them."""
    from .errors import WorkflowError

    names = checkpoint_names(defs)
    if name not in names:
        found = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "") if names else "none"
        raise WorkflowError(
            f"--checkpoint {name!r}: no such file in ComfyUI's models/checkpoints (found: {found}); put an SD1.5 "
            "checkpoint there, e.g. v1-5-pruned-emaonly-fp16.safetensors"
        )


def checkpoint_hint(defs: dict[str, dict[str, Any]]) -> str | None:
    """The demo's last line when it ran the test model and ComfyUI has checkpoints: how to run it with one."""
    names = checkpoint_names(defs)
    if not names:
        return None
    listed = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
    return (
        f"the demo ran the small test model; with one of your SD1.5 checkpoints ({listed}): "
        f"run --demo --checkpoint {names[0]}"
    )


def model_label(checkpoint: str | None) -> str:
    """What ran, for the log and the contact sheet."""
    return DEMO_WEIGHTS if checkpoint is None else f"your checkpoint {checkpoint} (via CheckpointLoaderSimple)"


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


def write_demo_sheets(output: Path, keys: set[str], checkpoint: str | None) -> None:
    """After a demo run: a contact sheet beside each photo's output (its path logged). Call it while the items'
    files exist (the sample photo lives in the run's scratch folder)."""
    from .demo_sheet import write_sheets

    write_sheets(output / "report.jsonl", keys, model_label(checkpoint), checkpoint is None, PLAN_PREFIX)


def log_checkpoint_hint(checkpoint: str | None, defs: dict[str, dict[str, Any]]) -> None:
    """The demo's last line when the test model ran and ComfyUI has checkpoints: how to run it with one."""
    hint = checkpoint_hint(defs) if checkpoint is None else None
    if hint:
        log.info("%s", hint)
