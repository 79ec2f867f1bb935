"""Node registry. Each node module exports its own NODE_CLASS_MAPPINGS / NODE_DISPLAY_NAME_MAPPINGS.

Node modules are light at import (no torch model code, no opencv); their cores load when a node runs.
Node ids never change once released: workflows saved by users refer to them.
"""

from __future__ import annotations

from importlib import import_module

_MODULES: tuple[str, ...] = ("scheduler_node", "face_nodes", "enhance_node", "fusion_node", "video_nodes")

NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}

for _name in _MODULES:
    _mod = import_module(f".{_name}", __name__)
    NODE_CLASS_MAPPINGS.update(_mod.NODE_CLASS_MAPPINGS)
    NODE_DISPLAY_NAME_MAPPINGS.update(_mod.NODE_DISPLAY_NAME_MAPPINGS)

# One start-up line naming FaceDetect's default detector (a find_spec, no model load), with the fix when it is not
# the best one or is missing.
_detector_choice = import_module("..faces.detector_choice", __name__)
_detector_choice.log_default_detector_once()
