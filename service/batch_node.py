"""Runner-only nodes (never in the pack's NODE_CLASS_MAPPINGS) that the service puts into the photo workflow.

LoadBatch replaces the workflow's LoadImage: several staged photos of one size as one IMAGE batch [B, H, W, 3], so
the pack's nodes handle the photos of concurrent requests in one execution. FramesApart goes in front of every
ScheduledFusion's faces input: the batch's frames are unrelated photos, so each one's faces are seeded as if it ran
alone (FaceSet.independent_frames); without it a photo's result would depend on who else was in its batch.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

BATCH_LOADER = "TokenFuseServiceLoadBatch"
FRAMES_APART = "TokenFuseServiceFramesApart"
FUSION_CLASS = "TokenFuseScheduledFusion"


class LoadBatch:
    RETURN_TYPES = ("IMAGE", "MASK")
    FUNCTION = "load"
    CATEGORY = "TokenFuse/service"
    DESCRIPTION = "Service-only: staged input photos (same size) as one IMAGE batch."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"files": ("STRING", {"default": "", "tooltip": "staged file names, one per line"})}}

    def load(self, files: str) -> tuple[Any, Any]:
        import cv2
        import folder_paths
        import numpy as np
        import torch

        frames = []
        folder = os.path.realpath(folder_paths.get_input_directory())
        for name in [f for f in files.splitlines() if f]:
            # only a file the service staged: a bare name inside the input folder. get_annotated_filepath took
            # "/any/path.png" or "../x" (and "x [output]") as they came, so a workflow holding its own copy of this node
            # could read any image on the server into the answer.
            bare = os.path.basename(name) == name and "\x00" not in name and name not in (".", "..")
            path = os.path.realpath(os.path.join(folder, name)) if bare else ""
            if not bare or os.path.dirname(path) != folder:
                raise ValueError(f"not a staged photo of this service: {name[:80]!r}")
            try:  # not cv2.imread: it takes ANSI paths on Windows
                bgr = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR)
            except (OSError, cv2.error):  # gone, or empty
                bgr = None
            if bgr is None:
                raise ValueError(f"not a readable image: {name}")
            frames.append(bgr[:, :, ::-1].astype(np.float32) / 255.0)
        if len({f.shape for f in frames}) != 1:
            raise ValueError("a batch needs photos of one size (the service groups them by size)")
        image = torch.from_numpy(np.stack(frames))
        return image, torch.zeros(image.shape[:3])


class FramesApart:
    RETURN_TYPES = ("FACES",)
    FUNCTION = "mark"
    CATEGORY = "TokenFuse/service"
    DESCRIPTION = "Service-only: the FACES of a batch of unrelated photos (each seeded as if alone)."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"faces": ("FACES", {"tooltip": "FaceDetect on the service's photo batch"})}}

    def mark(self, faces: Any) -> tuple[Any]:
        return (replace(faces, independent_frames=True),)


def insert_frames_apart(prompt: dict[str, dict[str, Any]]) -> int:
    """Route every ScheduledFusion's linked `faces` input through a FramesApart node (in place); returns how many.

    The new nodes take ids no node of the prompt has ("<fusion id>_apart")."""
    inserted = 0
    for nid, node in list(prompt.items()):
        link = node["inputs"].get("faces")
        if node["class_type"] != FUSION_CLASS or not isinstance(link, list):
            continue
        apart = f"{nid}_apart"
        prompt[apart] = {"class_type": FRAMES_APART, "inputs": {"faces": link}, "_meta": {"title": "frames apart"}}
        node["inputs"]["faces"] = [apart, 0]
        inserted += 1
    return inserted
