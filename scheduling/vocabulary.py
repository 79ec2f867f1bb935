"""The pack's plain vocabulary: names and constants every layer shares, declared once (torch-free, import-light).

Why a module of its own and not scheduling/keys.py: keys.py is the transformer_options contract between the node
layer and the attention patches (strings ComfyUI carries to every attention call); this module holds the words the
rest of the pack speaks (level factors, preset names and their strength order, the ONNX device choice, model file
extensions, the identity closure). Both are torch-free so ComfyUI's start-up import of the nodes stays light.
scheduling/ is the bottom layer (faces/, fusion/, video/ and nodes/ may all import it), so the vocabulary lives here.

UI choices are derived from the Literal types with `typing.get_args`, so the widget list, the type checker and
validation cannot disagree. The browser extension reads the same words from web/lib/vocabulary.js, generated from this
module by tools/gen_vocabulary_js.py (tests/test_vocabulary.py checks it is up to date).
"""

from __future__ import annotations

from typing import Literal, TypeVar, get_args

# U-Net levels by their downsampling factor relative to the image; the latent is /8, so these are latent /1, /2, /4,
# /8 (SD1.5 has self-attention at all four, SDXL at 16 and 32).
Level = Literal[8, 16, 32, 64]
LEVELS: tuple[int, ...] = get_args(Level)

# Scheduler presets (scheduling/schedule.py owns their contents).
Preset = Literal["off", "balanced", "lowvram_4gb", "lowvram_6gb", "lowvram_8gb"]
# The same presets ordered weakest -> strongest: ScheduledFusion's OOM fallback steps to the next one in this order.
PRESET_ORDER: tuple[Preset, ...] = ("off", "balanced", "lowvram_8gb", "lowvram_6gb", "lowvram_4gb")

# Token-reduction strategies (scheduling/strategies/ holds one module each, registered in STRATEGIES there), with
# the names the web chart gives them.
Strategy = Literal["tome", "todo", "topk"]
STRATEGY_LABELS: dict[Strategy, str] = {
    "todo": "ToDo K/V pooling",
    "tome": "ToMe token merging",
    "topk": "top-K keys",
}

# Where the ONNX face models (detectors, embedders) run: cpu, or auto (CUDA when onnxruntime has it, else cpu).
Device = Literal["cpu", "auto"]

# Model weight files the pack lists and loads (face restorers); .safetensors preferred, .pth/.pt/.ckpt/.bin are
# loaded as state dicts with torch.load(weights_only=True), never unpickled.
MODEL_EXTENSIONS: tuple[str, ...] = (".safetensors", ".pth", ".pt", ".ckpt", ".bin")

_T = TypeVar("_T")


def do_nothing(x: _T) -> _T:
    """The identity: what a merge / downsample / top-K factory returns when its patch does not apply (ratio 0, a grid
    too small). One object, so callers can test `fn is do_nothing` to skip work."""
    return x
