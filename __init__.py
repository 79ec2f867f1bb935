"""TokenFuse: token-scheduled face fusion for ComfyUI on 4-8 GB GPUs.

ComfyUI imports this package under a path-derived module name, so everything inside uses relative imports.
Importing it is cheap: node classes import their torch/opencv cores only when they run.
"""

from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

WEB_DIRECTORY = "./web"

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
