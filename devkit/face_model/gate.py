"""The quality gate without ComfyUI: ScheduledFusion's node code on the trained face model in plain torch.

`fuse_torch` calls the pack's real ScheduledFusion node (`ScheduledFusion(backend).fuse(...)`: the same crop, noise
mask, paste and artifact code a workflow runs) with a FusionBackend built from devkit/face_model/torch_sampling.py
instead of ComfyUI, so tests/test_quality_gate.py can hold every preset to the issue-14 gate in CI.
tests/integration/test_torch_face_model.py checks that this path gives ComfyUI's output on the same weights.

Gate (issue 14): PSNR >= 30 dB and SSIM >= 0.95 vs the unscheduled output over the face (devkit/face_model/quality.py
psnr/ssim: mask > 0.5 region, its bounding box for SSIM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import quality as q
from .torch_sampling import TorchFaceModel, fusion_backend

GATE_PSNR = 30.0
GATE_SSIM = 0.95
PRESETS = ("balanced", "lowvram_8gb", "lowvram_6gb", "lowvram_4gb")


@dataclass(frozen=True)
class GateResult:
    psnr: float
    ssim: float

    @property
    def passed(self) -> bool:
        return self.psnr >= GATE_PSNR and self.ssim >= GATE_SSIM


def astronaut_photo(pack: Any, crop_size: int = 512) -> q.Photo:
    """skimage's public-domain astronaut (never in training) with hand-built FACES: no detector needed."""
    import cv2

    from ..astronaut import astronaut_faces, astronaut_frame

    frame = astronaut_frame(512)
    faces = astronaut_faces(512, crop_size)
    face = faces.faces[0][0]
    crop = cv2.warpAffine(
        frame, face.affine, (crop_size, crop_size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT101
    )
    return q.Photo("astronaut", torch.from_numpy(frame)[None], faces, np.clip(crop, 0, 1), face.mask)


def fuse_torch(
    pack: Any,
    model: TorchFaceModel,
    photo: q.Photo,
    params: q.FusionParams,
    timer: Callable[[], float] | None = None,
) -> q.FaceRun:
    """ScheduledFusion (fallback off, cfg 1, euler/normal) on the photo's face with the plain-torch model."""
    import time

    node = q.node(pack, "TokenFuseScheduledFusion", fusion_backend(model, params.steps, params.denoise))
    t0 = time.perf_counter()
    with torch.inference_mode():
        crops, _, _ = node.fuse(
            model=model,
            vae=None,
            positive=None,
            negative=None,
            image=photo.image,
            faces=photo.faces,
            seed=params.seed,
            steps=params.steps,
            cfg=params.cfg,
            sampler_name=params.sampler,
            scheduler=params.scheduler,
            denoise=params.denoise,
            guide_size=params.guide,
            max_size=max(1024, params.guide),
            crop_factor=1.0,
            feather=0.04,
            faces_per_batch=1,
            fallback="off",
        )
    crop = np.clip(crops[0].float().numpy(), 0.0, 1.0).astype(np.float32)
    return q.FaceRun(crop, time.perf_counter() - t0)


def compare(run: q.FaceRun, base: q.FaceRun, photo: q.Photo) -> GateResult:
    return GateResult(q.psnr(run.crop, base.crop, photo.mask), q.ssim(run.crop, base.crop, photo.mask))
