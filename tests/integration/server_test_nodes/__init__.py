"""Test-only ComfyUI custom nodes for the integration tests that run a real ComfyUI server (no real weights exist
here). `start_comfy_server(..., extra_nodes={TEST_PACK: FOLDER})` symlinks this folder into the server's temp
custom_nodes; it is never installed anywhere else.

- TokenFuseTestRandomCheckpoint (ckpt_name) -> MODEL, CLIP, VAE: a seeded random-weight U-Net of the family the name
  says ("xl" -> SDXL architecture, else SD1.5; width 32, devkit/comfy_models.build_model), a random SD VAE of the real
  layout (ch 32) and a CLIP stand-in whose encode gives seeded random conditioning of the family's shape, so the real
  CLIPTextEncode nodes run. Built once per family and server.
- TokenFuseTestShowText: an output node returning its text as {"ui": {"text": [...]}}, which /history lists.
- TokenFuseTestInduceOOM (model, times) -> MODEL: a clone whose first `times` sampling runs raise ComfyUI's OOM
  exception (devkit/induce_oom.py; the pack itself carries no injector).
- TokenFuseTestModelMirror (image, url) -> IMAGE: points the pack's YuNet download at `url` (a loopback mirror the
  test runs), then passes the image on, so the FaceDetect node it feeds downloads from there.
- With TOKENFUSE_TEST_RANDOM_CHECKPOINTS=1 in the server's environment, ComfyUI's own CheckpointLoaderSimple loads
  those random models too (for workflows run as shipped, e.g. in the editor; its checkpoint files may be empty).

`ClipStandIn` is also what the in-process tests give their test loader (test_workflows_comfy, test_runner_comfy).
Random weights check that graphs run, never image quality.
"""

import os
import sys
from pathlib import Path

TEST_PACK = "tokenfuse_server_test_nodes"
FOLDER = Path(__file__).resolve().parent
_DEVKIT = str(FOLDER.parents[2] / "devkit")  # devkit/comfy_models.py imports nothing of the pack
_cache = {}


def _models():
    if _DEVKIT not in sys.path:
        sys.path.insert(0, _DEVKIT)
    import comfy_models

    return comfy_models


class ClipStandIn:
    """Stand-in text encoder: seeded random conditioning of the family's shape (SD1.5 [1, 77, 768]; SDXL
    [1, 77, 2048] + pooled [1, 1280]), the seed taken from the text."""

    def __init__(self, family, models=None):
        self.family, self.models = family, models

    def tokenize(self, text):
        return text

    def encode_from_tokens_scheduled(self, tokens):
        models = self.models or _models()
        return models.conditioning(self.family, seed=sum(map(ord, tokens)) % 1000)


def family_of(ckpt_name):
    """The architecture a test checkpoint name stands for: "sdxl" when it says xl, else "sd15"."""
    return "sdxl" if "xl" in ckpt_name.lower() else "sd15"


def load_random(ckpt_name):
    family = family_of(ckpt_name)
    if family not in _cache:
        models = _models()
        _cache[family] = (
            models.build_model(family, model_channels=32, tiny=True, seed=0),
            ClipStandIn(family),
            models.build_vae(ch=32, seed=0),
        )
    return _cache[family]


class RandomCheckpoint:
    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    FUNCTION = "load"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"ckpt_name": ("STRING", {"default": ""})}}

    def load(self, ckpt_name):
        return load_random(ckpt_name)


class ShowText:
    RETURN_TYPES = ()
    FUNCTION = "show"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"forceInput": True})}}

    def show(self, text):
        return {"ui": {"text": [text]}}


if os.environ.get("TOKENFUSE_TEST_RANDOM_CHECKPOINTS") == "1":
    import nodes

    nodes.CheckpointLoaderSimple.load_checkpoint = lambda self, ckpt_name: load_random(ckpt_name)


class InduceOOM:
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "wrap"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "times": ("INT", {"default": 1})}}

    def wrap(self, model, times):
        if _DEVKIT not in sys.path:
            sys.path.insert(0, _DEVKIT)
        import induce_oom

        return (induce_oom.oom_on_first_samples(model, times),)


class ModelMirror:
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "point"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",), "url": ("STRING", {"default": ""})}}

    def point(self, image, url):
        import dataclasses
        import importlib

        # the pack is loaded under its folder's name: find it by its FaceDetect node module
        (root,) = {n[: -len(".nodes.face_nodes")] for n in list(sys.modules) if n.endswith(".nodes.face_nodes")}
        models = importlib.import_module(f"{root}.faces.models")
        models.DOWNLOADS["yunet"] = dataclasses.replace(models.DOWNLOADS["yunet"], url=url)
        return (image,)


NODE_CLASS_MAPPINGS = {
    "TokenFuseTestRandomCheckpoint": RandomCheckpoint,
    "TokenFuseTestShowText": ShowText,
    "TokenFuseTestInduceOOM": InduceOOM,
    "TokenFuseTestModelMirror": ModelMirror,
}
