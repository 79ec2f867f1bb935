"""The crop-batch loop every fusion path runs: N faces, each in its own source image, refined in batches through a
`FusionBackend` (pure: never imports ComfyUI).

Per batch: context crop at guide size -> optional identity pre-swap (backend.hooks) -> VAE encode -> sample with a
noise mask from the face mask (and a crop-space TokenPlan) -> VAE decode -> composite through the mask -> artifact
check. OOM and artifacts walk the fallback policy (fusion/fallback.py: split the batch, stronger preset, tiled VAE,
smaller guide; scheduling off); a face that still fails passes through unchanged with a warning and the run goes on.

Two entries share it: `refine_crops` (aligned crops in, refined crops out: VideoFaceFusion, the runner's chunks and
the ComfyUI-free core engine) and fusion/run.run_fusion (faces in photos: ScheduledFusion).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import cv2
import numpy as np
import torch

from ..faces.align import WarpStyle, template, warp_to_crop
from ..faces.masks import crop_mask
from ..faces.types import Face
from .artifacts import ArtifactThresholds, IdentityScore, check_crop
from .backend import FusionBackend, MemoryEstimateError
from .crops import (
    aligned_crop,
    context_affine,
    context_transform,
    crop_plan,
    make_batches,
    noise_mask_context,
    top_tokens,
)
from .fallback import Attempt, FaceReport, FallbackConfig, after_artifact, after_oom

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FusionSettings:
    """guide_size: face resolution to sample at. crop_factor: context around the aligned crop (1 = the crop itself).
    max_size: cap on the sampled side. feather / grow: noise-mask edge softness and dilation (fractions of the
    side). faces_per_batch: faces of one frame sampled together. use_plan: pass a crop-space TokenPlan."""

    seed: int = 0
    guide_size: int = 512
    max_size: int = 1024
    crop_factor: float = 1.0
    feather: float = 0.04
    grow: float = 0.02
    faces_per_batch: int = 2
    use_plan: bool = False
    plan_floor: float = 0.1
    protect_threshold: float = 0.5
    fallback: FallbackConfig = field(default_factory=FallbackConfig)
    thresholds: ArtifactThresholds = field(default_factory=ArtifactThresholds)


@dataclass(frozen=True)
class CropJob:
    """One face to refine: `image` [H, W, 3] float32 0..1 is what its context crop is cut from (the photo it is in,
    or the aligned crop itself with an identity affine); `number` keys its report and output."""

    image: np.ndarray
    face: Face
    seed: int
    number: int


class _Broken(Exception):
    """Internal: some faces of a batch failed the artifact check."""


def _prepare(
    job: CropJob, attempt: Attempt, s: FusionSettings, backend: FusionBackend
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """(context crop [S,S,3], noise mask [S,S], crop->context map [2,3], landmarks in context px [5,2], S).

    The context crop is cut from the job's image at this attempt's guide size, so a smaller-guide fallback samples
    the source again instead of shrinking a crop already cut."""
    face, image = job.face, job.image
    m_c, side = context_transform(face.crop_size, attempt.guide_size, s.crop_factor, s.max_size)
    a_ctx, _ = context_affine(face, attempt.guide_size, s.crop_factor, s.max_size)
    crop = aligned_crop(image, face, attempt.guide_size, s.crop_factor, s.max_size)
    mask = noise_mask_context(face, m_c, side, s.feather, s.grow)
    lm = (np.asarray(face.landmarks, np.float64) @ a_ctx[:, :2].T + a_ctx[:, 2]).astype(np.float32)
    if backend.hooks.pre_swap is not None:
        crop = np.clip(backend.hooks.pre_swap(crop, lm), 0.0, 1.0).astype(np.float32)
    return crop, mask, m_c, lm, side


def _back_to_crop(ctx_img: np.ndarray, m_c: np.ndarray, crop_size: int) -> np.ndarray:
    """Context-space [S, S, 3] -> the face's aligned crop [crop_size, crop_size, 3]."""
    inv = cv2.invertAffineTransform(m_c)
    scale = float(np.sqrt(abs(np.linalg.det(m_c[:, :2]))))
    src = ctx_img
    if scale > 1.5:  # shrinking a lot: pre-blur so the bilinear warp does not alias
        src = cv2.GaussianBlur(ctx_img, (0, 0), sigmaX=0.5 * scale)
    out = cv2.warpAffine(
        np.ascontiguousarray(src, np.float32),
        inv,
        (crop_size, crop_size),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REPLICATE,
    )
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def _run_batch(
    jobs: list[CropJob],
    attempt: Attempt,
    s: FusionSettings,
    backend: FusionBackend,
    reports: dict[int, FaceReport],
) -> dict[int, np.ndarray]:
    """Sample one batch; returns {face number: crop-size output}. Raises OOM errors and _Broken(numbers, outputs)."""
    preps = [_prepare(j, attempt, s, backend) for j in jobs]
    side = preps[0][4]
    crops = np.stack([p[0] for p in preps])
    masks = np.stack([p[1] for p in preps])
    for j in jobs:
        reports[j.number].context_side = side
        reports[j.number].tokens = top_tokens(side)
    if backend.memory_check is not None and (misfit := backend.memory_check(len(jobs), side, attempt.tiled_vae)):
        raise MemoryEstimateError(misfit)
    model, note = backend.model_for(attempt)
    if note:
        for j in jobs:
            if note not in reports[j.number].warnings:
                reports[j.number].warnings.append(note)
    plan = None
    if s.use_plan and attempt.scheduling:
        landmarks = np.stack([p[3] for p in preps])
        plan = crop_plan(masks, floor=s.plan_floor, protect_threshold=s.protect_threshold, landmarks=landmarks)
    seeds = [j.seed for j in jobs]
    pixels = torch.from_numpy(crops)
    latent = backend.encode(pixels, attempt.tiled_vae)
    mask_t = torch.from_numpy(masks)[:, None]
    samples = backend.sample(model, latent, mask_t, seeds, plan)
    decoded = backend.decode(samples, attempt.tiled_vae)
    out = decoded.detach().float().cpu().numpy()
    if out.shape[1:3] != (side, side):  # a VAE that crops to a multiple of its factor: resize back
        out = np.stack([cv2.resize(o, (side, side), interpolation=cv2.INTER_CUBIC) for o in out])
    results: dict[int, np.ndarray] = {}
    broken: list[int] = []
    for k, j in enumerate(jobs):
        mk = masks[k][..., None]
        fused = mk * out[k] + (1.0 - mk) * crops[k]
        sim = None
        hooks = backend.hooks
        ref = hooks.identity_ref if hooks.identity_ref is not None else j.face.embedding
        if hooks.embed is not None and ref is not None:
            emb = hooks.embed(fused, preps[k][3])
            sim = None if emb is None else IdentityScore.between("arcface", ref, emb)  # ArcFace hooks (swap.py)
        verdict = check_crop(fused, masks[k], sim, s.thresholds, reference=crops[k])
        rep = reports[j.number]
        if plan is not None:
            rep.kept_tokens = plan.budgets[k][8]
        if not verdict.ok:
            rep.warnings.append(f"artifact: {', '.join(verdict.reasons)}")
            if s.fallback.on_artifact:
                broken.append(j.number)
                continue
            rep.warnings.append("output kept (artifact fallback off)")
        results[j.number] = _back_to_crop(fused, preps[k][2], j.face.crop_size)
    if broken:
        raise _Broken(broken, results)
    return results


def _try_batch(
    jobs: list[CropJob], attempt: Attempt, s: FusionSettings, backend: FusionBackend, reports: dict[int, FaceReport]
) -> tuple[dict[int, np.ndarray], list[int], tuple[bool, str] | None]:
    """One try of a batch: (outputs, job numbers whose output is broken, failure). failure: (is OOM, description)
    when the batch raised (the exception itself is not kept), else None; a cancel (backend.is_fatal) propagates."""
    try:
        res = _run_batch(jobs, attempt, s, backend, reports)
    except _Broken as exc:
        return exc.args[1], exc.args[0], None
    except Exception as exc:  # noqa: BLE001 - a face must never crash the batch; cancel propagates (is_fatal)
        if backend.is_fatal(exc):
            raise
        if isinstance(exc, MemoryEstimateError):
            return {}, [], (True, f"predicted out of memory: {exc}")
        if backend.is_oom(exc):
            return {}, [], (True, "out of memory")
        log.warning("fusion: face(s) %s failed: %r", [j.number for j in jobs], exc)
        return {}, [], (False, f"error: {type(exc).__name__}: {exc}")
    return res, [], None


def _account(jobs: list[CropJob], reports: dict[int, FaceReport], seconds: float, peak: int | None) -> None:
    """Share a batch's time among its faces' reports and raise their peak memory to the batch's."""
    for j in jobs:
        r = reports[j.number]
        r.time_s += seconds / len(jobs)
        if peak is not None:
            r.peak_memory = max(r.peak_memory or 0, peak)


def _process(
    jobs: list[CropJob],
    attempt: Attempt,
    s: FusionSettings,
    backend: FusionBackend,
    reports: dict[int, FaceReport],
) -> dict[int, np.ndarray]:
    """Run jobs under `attempt`, walking the fallback policy. Returns outputs of the faces that succeeded."""
    if attempt.single and len(jobs) > 1:
        done: dict[int, np.ndarray] = {}
        for j in jobs:
            done.update(_process([j], attempt, s, backend, reports))
        return done
    backend.empty_cache()
    backend.peak_reset()
    t0 = time.perf_counter()
    res, broken, failure = _try_batch(jobs, attempt, s, backend, reports)
    # _try_batch returned: the exception and its traceback, which hold the failed batch's tensors, are dropped, so
    # empty_cache() can give the memory back before the retry (ComfyUI's VAE does the same).
    _account(jobs, reports, time.perf_counter() - t0, backend.peak_bytes())
    if failure is not None:
        backend.empty_cache()
        is_oom, what = failure
        step = after_oom(attempt, s.fallback, len(jobs)) if is_oom else None
        if step is None:
            for j in jobs:
                reports[j.number].warnings.append(f"{what}; no fallback left")
            return {}
        nxt, action, detail = step
        for j in jobs:
            reports[j.number].add(action, f"{detail} (after {what})")
        return _process(jobs, nxt, s, backend, reports)
    if broken:
        step = after_artifact(attempt, s.fallback)
        bad = [j for j in jobs if j.number in broken]
        if step is not None:
            nxt, action, detail = step
            for j in bad:
                reports[j.number].add(action, detail)
            res.update(_process(bad, nxt, s, backend, reports))
    return res


def refine_jobs(
    batches: list[list[CropJob]], settings: FusionSettings, backend: FusionBackend, reports: dict[int, FaceReport]
) -> dict[int, np.ndarray]:
    """Run each batch from the settings' first attempt, walking the fallbacks; backend.progress() once per face when
    its batch is done (also when it raised). Returns {job number: [crop_size, crop_size, 3] float32} of the faces that
    succeeded; `reports` (one per job number) collect what happened."""
    outputs: dict[int, np.ndarray] = {}
    start = Attempt(guide_size=settings.guide_size)
    for jobs in batches:
        try:
            outputs.update(_process(jobs, start, settings, backend, reports))
        finally:
            for _ in jobs:
                backend.progress()
    return outputs


def crop_face(side: int, crop_factor: float = 1.0) -> Face:
    """The Face of an aligned crop seen as its own image: identity affine, FFHQ landmarks at `crop_factor` (the
    framing the crops were cut with) and the face mask drawn from them."""
    lm = template(side, crop_factor).astype(np.float32)
    eye = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    return Face(
        bbox=(0.0, 0.0, float(side), float(side)),
        score=1.0,
        landmarks=lm,
        affine=eye,
        inverse=eye,
        crop_size=side,
        mask=crop_mask(lm, side),
    )


def refine_crops(
    crops: np.ndarray,
    seeds: list[int],
    settings: FusionSettings,
    backend: FusionBackend,
    crop_factor: float = 1.0,
) -> tuple[np.ndarray, list[FaceReport]]:
    """Refine N aligned face crops: the one crop-batch entry of the fusion core.

    crops: [N, S, S, 3] float 0..1, each an aligned face crop framed at `crop_factor` (FFHQ template; where the face
    mask and landmarks are drawn). seeds: one per crop, used as given (the video path: one seed per track).
    settings: guide_size / max_size / crop_factor give the sampled side (a video passes S, S and 1.0: the crops
    already carry their context); faces_per_batch crops are sampled together, in order; seed is not used.
    Returns (refined crops [N, S, S, 3] float32 0..1, one FaceReport per crop: frame 0, index = the crop's position).
    A crop that fails after every fallback comes back unchanged with status "passthrough".
    """
    n, side = int(crops.shape[0]), int(crops.shape[1])
    if len(seeds) != n:
        raise ValueError(f"refine_crops needs one seed per crop: {n} crops, {len(seeds)} seeds")
    face = crop_face(side, crop_factor)
    jobs = [CropJob(np.asarray(crops[i], dtype=np.float32), face, int(seeds[i]), i) for i in range(n)]
    reports = {j.number: FaceReport(frame=0, index=j.number, seed=j.seed) for j in jobs}
    batches = [[jobs[i] for i in b] for b in make_batches(list(range(n)), settings.faces_per_batch)]
    outputs = refine_jobs(batches, settings, backend, reports)
    out = np.empty((n, side, side, 3), np.float32)
    for j in jobs:
        if j.number in outputs:
            out[j.number] = outputs[j.number]
            continue
        out[j.number] = passed_through(j, reports[j.number], f"crop {j.number}")
    return out, [reports[j.number] for j in jobs]


def passed_through(job: CropJob, report: FaceReport, what: str) -> np.ndarray:
    """A face that kept its input (every attempt failed): mark and log its report, and return its input crop
    [crop_size, crop_size, 3] as the job's image shows it."""
    report.status = "passthrough"
    report.warnings.append("face passed through unchanged")
    log.warning("fusion: %s passed through unchanged (%s)", what, "; ".join(report.warnings))
    return warp_to_crop(job.image, job.face.affine, job.face.crop_size, WarpStyle("linear", "reflect"))
