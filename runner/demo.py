"""`run --demo`: the whole chain (detect -> plan -> schedule -> fuse -> restore-less blend) on one photo with no
checkpoint download.

`demo_models()` is the one place that says which weights the demo uses. Until the trained small face model (issue 14,
devkit/face_model) is merged it returns SEEDED RANDOM WEIGHTS of the SD1.5 U-Net / SD VAE architectures (width 32):
the run proves the chain executes and writes a fused image, not image quality. After merging, point
`demo_models()` at the trained model's loader and set DEMO_WEIGHTS accordingly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

PACK_DIR = Path(__file__).absolute().parents[1]
DEMO_WEIGHTS = "seeded random weights (SD1.5 U-Net + SD VAE architecture, width 32): not a quality result"
DEMO_LOADER = "TokenFuseRunnerDemoModels"


def _bench_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"tokenfuse_bench_{name}", PACK_DIR / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demo_models() -> tuple[Any, Any, Any]:
    """(MODEL, positive CONDITIONING, negative CONDITIONING, VAE) for the demo; see the module docstring."""
    fusion = _bench_module("fusion")
    cm = fusion.comfy_models()
    model = cm.build_model("sd15", model_channels=32, tiny=True, seed=0)
    vae = fusion.build_vae(ch=32, seed=0)
    return model, cm.conditioning("sd15", seed=1), cm.conditioning("sd15", seed=2), vae


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
        raise FileNotFoundError("--demo without --input needs scikit-image (pip install scikit-image)") from e
    import cv2

    path = folder / "astronaut.png"
    cv2.imwrite(str(path), data.astronaut()[:, :, ::-1])
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
