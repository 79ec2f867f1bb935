"""TokenFuse: token-scheduled face fusion for ComfyUI on 4-8 GB GPUs.

ComfyUI imports this package under a path-derived module name, so everything inside uses relative imports.
Importing it is cheap: node classes import their torch/opencv cores only when they run.
"""

if __package__:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
else:
    # Imported as a lone file, not as a package: pytest does this to the folder holding tests/ when the clone's folder
    # name is not a Python identifier (`git clone .../ComfyUI-TokenFuse`). ComfyUI always imports it as a package.
    NODE_CLASS_MAPPINGS: dict[str, type] = {}
    NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}

WEB_DIRECTORY = "./web"

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
