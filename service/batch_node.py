"""Runner-only node (never in the pack's NODE_CLASS_MAPPINGS) that the service puts in place of the workflow's
LoadImage: several staged photos of one size as one IMAGE batch [B, H, W, 3], so the pack's nodes handle the
photos of concurrent requests in one execution (FaceDetect per frame, ScheduledFusion batching faces across
frames up to faces_per_batch in one sampler call)."""

from __future__ import annotations

from typing import Any

BATCH_LOADER = "TokenFuseServiceLoadBatch"


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
        for name in [f for f in files.splitlines() if f]:
            bgr = cv2.imread(folder_paths.get_annotated_filepath(name), cv2.IMREAD_COLOR)
            if bgr is None:
                raise ValueError(f"not a readable image: {name}")
            frames.append(bgr[:, :, ::-1].astype(np.float32) / 255.0)
        if len({f.shape for f in frames}) != 1:
            raise ValueError("a batch needs photos of one size (the service groups them by size)")
        image = torch.from_numpy(np.stack(frames))
        return image, torch.zeros(image.shape[:3])
