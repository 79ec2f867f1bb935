"""PatchTokenize core: face-importance maps and per-level token budgets (the TOKEN_PLAN), plus its preview.

Importance: 1.0 on the eyes and mouth, `face_weight` on the rest of the face hull (both >= the protect threshold, so
never merged), a smooth Gaussian falloff around the hull, and `floor` on the background. A token's kept fraction is
1 when its importance reaches the protect threshold and max(min_keep, importance) otherwise; the budget of a level
is the sum over its tokens, compared with uniform tokenisation (every token kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from ..scheduling.plan import TokenPlan
from ..scheduling.vocabulary import LEVELS
from .align import transform_points
from .masks import face_ellipse
from .types import Face, FaceSet

_WORK_SIDE = 512  # importance is built at this long side, then resized: it is smooth by construction


@dataclass(frozen=True)
class PlanOptions:
    """floor: background importance; face_weight: hull importance; falloff: Gaussian width around the hull as a
    fraction of the face size; min_keep: smallest kept fraction of any token; protect_threshold: see TokenPlan."""

    floor: float = 0.1
    face_weight: float = 0.9
    falloff: float = 0.35
    min_keep: float = 0.25
    protect_threshold: float = 0.5


def importance_map(h: int, w: int, faces: tuple[Face, ...], opts: PlanOptions = PlanOptions()) -> np.ndarray:
    """[H, W] float32 in [floor, 1] for one frame."""
    s = min(1.0, _WORK_SIDE / max(h, w))
    wh, ww = max(1, round(h * s)), max(1, round(w * s))
    imp = np.full((wh, ww), opts.floor, np.float32)
    for f in faces:
        lm_crop = transform_points(f.landmarks, f.affine)
        (cx, cy), (ax, ay), ang = face_ellipse(lm_crop)
        hull_crop = np.zeros((f.crop_size, f.crop_size), np.uint8)
        cv2.ellipse(hull_crop, (int(cx), int(cy)), (int(ax), int(ay)), ang, 0, 360, 1, -1)
        inv = f.inverse.copy() * s
        hull = cv2.warpAffine(hull_crop, inv, (ww, wh), flags=cv2.INTER_NEAREST, borderValue=0).astype(bool)
        face_px = max(f.width, f.height) * s
        if hull.any():
            dist = cv2.distanceTransform((~hull).astype(np.uint8), cv2.DIST_L2, 5)
            sigma = max(opts.falloff * face_px, 1.0)
            soft = np.exp(-0.5 * (dist / sigma) ** 2).astype(np.float32)
            level = opts.floor + (opts.face_weight - opts.floor) * soft
            np.maximum(imp, level, out=imp)
        np.maximum(imp, feature_discs(wh, ww, f.landmarks * s), out=imp)
    return cv2.resize(imp, (w, h), interpolation=cv2.INTER_LINEAR) if s < 1.0 else imp


def feature_discs(h: int, w: int, landmarks: np.ndarray) -> np.ndarray:
    """[h, w] float32 in [0, 1]: 1 on the eyes and the mouth (discs of ~0.3 x the eye distance around landmarks 0, 1
    and the mouth corners' midpoint, soft edge), 0 elsewhere. landmarks: [5, 2] in the same pixels as (h, w).

    The parts of a face where a merged or pooled token shows first (identity, gaze, expression)."""
    lm = np.asarray(landmarks, np.float64)
    r = max(1, round(0.3 * float(np.linalg.norm(lm[1] - lm[0]))))
    feat = np.zeros((h, w), np.float32)
    for p in (lm[0], lm[1], (lm[3] + lm[4]) / 2):
        cv2.circle(feat, (int(round(p[0])), int(round(p[1]))), r, 1.0, -1)
    k = 2 * r + 1
    out: np.ndarray = np.clip(cv2.GaussianBlur(feat, (k, k), r / 2) * 1.5, 0, 1)
    return out


def level_grid(latent_h: int, latent_w: int, factor: int) -> tuple[int, int]:
    """Token grid of the U-Net level at `factor` (8 = latent) for a latent of latent_h x latent_w (stride-2 convs
    with padding round up)."""
    gh, gw = latent_h, latent_w
    for _ in range(int(math.log2(factor // 8))):
        gh, gw = -(-gh // 2), -(-gw // 2)
    return gh, gw


def kept_fraction(importance: torch.Tensor, opts: PlanOptions) -> torch.Tensor:
    """Per-token kept fraction from per-token importance (same shape)."""
    keep = importance.clamp(min=opts.min_keep, max=1.0)
    return torch.where(importance >= opts.protect_threshold, torch.ones_like(keep), keep)


def build_plan(faceset: FaceSet, latent_hw: tuple[int, int], opts: PlanOptions = PlanOptions()) -> TokenPlan:
    """TOKEN_PLAN for every frame of a FaceSet; latent_hw is the latent size the sampler will run at."""
    h, w = faceset.image_size
    maps = [importance_map(h, w, frame, opts) for frame in faceset.faces]
    importance = torch.from_numpy(np.stack(maps)) if maps else torch.zeros((0, h, w))
    budgets, uniform = [], []
    for i in range(len(maps)):
        single = TokenPlan(importance=importance[i : i + 1], image_size=(h, w))
        b, u = {}, {}
        for f in LEVELS:
            gh, gw = level_grid(latent_hw[0], latent_hw[1], f)
            pooled = single.level_importance(gh, gw, 1)
            b[f] = int(math.ceil(float(kept_fraction(pooled, opts).sum())))
            u[f] = gh * gw
        budgets.append(b)
        uniform.append(u)
    return TokenPlan(
        importance=importance,
        image_size=(h, w),
        budgets=tuple(budgets),
        uniform_tokens=tuple(uniform),
        protect_threshold=opts.protect_threshold,
    )


def plan_preview(
    rgb: np.ndarray, plan: TokenPlan, index: int, grid: tuple[int, int], opts: PlanOptions = PlanOptions()
) -> np.ndarray:
    """rgb: [H, W, 3] uint8 -> the photo under a level's token grid, each cell coloured by its kept fraction
    (blue = min_keep, red = kept whole). grid: (rows, columns) of that level, level_grid(latent_h, latent_w, factor)."""
    h, w = rgb.shape[:2]
    gh, gw = grid
    pooled = plan.level_importance(gh, gw, plan.batch_size)[index].reshape(gh, gw)
    keep = kept_fraction(pooled, opts).numpy()
    t = ((keep - opts.min_keep) / max(1e-6, 1.0 - opts.min_keep) * 255).clip(0, 255).astype(np.uint8)
    colour = cv2.applyColorMap(t, cv2.COLORMAP_JET)[..., ::-1]
    colour = cv2.resize(colour, (w, h), interpolation=cv2.INTER_NEAREST)
    out = cv2.addWeighted(rgb, 0.55, colour, 0.45, 0)
    for j in range(1, gw):
        x = round(j * w / gw)
        out[:, x] = (out[:, x] * 0.5).astype(np.uint8)
    for i in range(1, gh):
        y = round(i * h / gh)
        out[y] = (out[y] * 0.5).astype(np.uint8)
    return out
