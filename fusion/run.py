"""ScheduledFusion's per-face loop, with the sampler, VAE and model handling injected (pure: never imports ComfyUI).

The node builds a `FusionBackend` from ComfyUI (nodes/glue/); tests build one from fakes, so the ordering,
per-face seeds, batching and fallback reporting are exercised without ComfyUI.

Per batch of faces of one frame: context crop at guide size -> optional identity pre-swap -> VAE encode -> sample
with a noise mask from the face mask (and a crop-space TokenPlan) -> VAE decode -> composite through the mask ->
artifact check. OOM and artifacts walk the fallback policy (fusion/fallback.py); a face that still fails passes
through unchanged with a warning and the batch goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import cv2
import numpy as np
import torch

from ..faces.align import warp_to_crop
from ..faces.types import Face, FaceSet
from .artifacts import ArtifactThresholds, IdentityScore, check_crop
from .crops import (
    aligned_crop,
    context_affine,
    context_transform,
    crop_plan,
    face_seed,
    make_batches,
    noise_mask_context,
    top_tokens,
)
from .fallback import Attempt, FaceReport, FallbackConfig, after_artifact, after_oom

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CropHooks:
    """What the node adds around each crop besides sampling (frozen; all optional).

    embed(crop [S, S, 3], landmarks [5, 2] in crop pixels) -> [D] or None: ArcFace embedding for the identity
        check; compared with identity_ref when set (the swap source), else with face.embedding.
    pre_swap(crop [S, S, 3], landmarks [5, 2] in crop pixels) -> crop: identity pre-swap.
    """

    embed: Callable[[np.ndarray, np.ndarray], np.ndarray | None] | None = None
    identity_ref: np.ndarray | None = None
    pre_swap: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None


@dataclass(frozen=True)
class FusionBackend:
    """The sampler interface: what the loop needs from a diffusion stack (frozen: derive variants with
    dataclasses.replace, never assign to a built one).

    encode(pixels [B, S, S, 3] float 0..1, tiled) -> latent [B, C, S/8, S/8].
    decode(latent, tiled) -> pixels [B, S, S, 3] float 0..1.
    sample(model, latent, noise_mask [B, 1, S, S], seeds: list[int], plan: TokenPlan | None) -> latent.
    model_for(attempt) -> (model, note): the model for this attempt (scheduling off / stronger preset); note is "" or
        what could not be done (reported).
    is_oom(exc) -> bool: an out-of-memory error (fallbacks apply). is_fatal(exc) -> bool: must propagate (cancel).
    progress(): once per face, when its batch is done (fallbacks included); ComfyUI's node moves its faces x steps
        bar from the sampler callback and here only catches up (denoise 0, a failed batch).
    peak_reset()/peak_bytes(): device memory peak (None = n/a).
    memory_check(batch, side, tiled_vae) -> "" when the estimated peak of sampling `batch` crops of side x side fits
        the device's free memory, else a message with the estimate; a misfit is handled like an OOM before any work
        (so a CPU run that would swap the machine steps down the fallback chain instead).
    hooks: the crop hooks (identity pre-swap and check), a separate frozen object (CropHooks).
    """

    encode: Callable[[torch.Tensor, bool], torch.Tensor]
    decode: Callable[[torch.Tensor, bool], torch.Tensor]
    sample: Callable[..., torch.Tensor]
    model_for: Callable[[Attempt], tuple[Any, str]]
    is_oom: Callable[[BaseException], bool] = lambda exc: isinstance(exc, MemoryError)
    is_fatal: Callable[[BaseException], bool] = lambda exc: False
    progress: Callable[[], None] = lambda: None
    peak_reset: Callable[[], None] = lambda: None
    peak_bytes: Callable[[], int | None] = lambda: None
    empty_cache: Callable[[], None] = lambda: None
    memory_check: Callable[[int, int, bool], str] | None = None
    hooks: CropHooks = field(default_factory=CropHooks)


def unsampled(backend: FusionBackend) -> FusionBackend:
    """The backend for denoise 0: nothing is re-generated, so no VAE round trip (it blurs the face) and no sampling;
    the crops come back as prepared (with the identity pre-swap, if any). Latents are the pixels themselves."""
    return replace(
        backend,
        encode=lambda pixels, tiled: pixels,
        decode=lambda latent, tiled: latent,
        sample=lambda model, latent, *args, **kwargs: latent,
        model_for=lambda attempt: (None, ""),
        memory_check=None,
    )


class MemoryEstimateError(MemoryError):
    """The pre-flight estimate says this batch cannot fit in free memory; the message holds the figures."""


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
class _Job:
    frame: int
    index: int
    number: int  # frame-major face number (the key of its report and output)
    face: Face
    seed_offset: int  # face_seed(seed, seed_offset): `number`, or `index` when the frames are independent photos


@dataclass
class FusionResult:
    faces: FaceSet
    crops: list[np.ndarray]  # one [crop_size, crop_size, 3] per face, frame-major (input crop when passed through)
    reports: list[FaceReport]


class _Broken(Exception):
    """Internal: some faces of a batch failed the artifact check."""


def _prepare(
    image: np.ndarray, job: _Job, attempt: Attempt, s: FusionSettings, backend: FusionBackend
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """(context crop [S,S,3], noise mask [S,S], crop->context map [2,3], landmarks in context px [5,2], S)."""
    face = job.face
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
    image: np.ndarray,
    jobs: list[_Job],
    attempt: Attempt,
    s: FusionSettings,
    backend: FusionBackend,
    reports: dict[int, FaceReport],
) -> dict[int, np.ndarray]:
    """Sample one batch; returns {face number: crop-size output}. Raises OOM errors and _Broken(numbers, outputs)."""
    preps = [_prepare(image, j, attempt, s, backend) for j in jobs]
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
    seeds = [face_seed(s.seed, j.seed_offset) for j in jobs]
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


def _process(
    image: np.ndarray,
    jobs: list[_Job],
    attempt: Attempt,
    s: FusionSettings,
    backend: FusionBackend,
    reports: dict[int, FaceReport],
) -> dict[int, np.ndarray]:
    """Run jobs under `attempt`, walking the fallback policy. Returns outputs of the faces that succeeded."""
    if attempt.single and len(jobs) > 1:
        done: dict[int, np.ndarray] = {}
        for j in jobs:
            done.update(_process(image, [j], attempt, s, backend, reports))
        return done
    backend.empty_cache()
    backend.peak_reset()
    t0 = time.perf_counter()
    failure: tuple[bool, str] | None = None  # (is OOM, description); the exception itself is not kept
    try:
        res = _run_batch(image, jobs, attempt, s, backend, reports)
        broken: list[int] = []
    except _Broken as exc:
        broken, res = exc.args[0], exc.args[1]
    except Exception as exc:  # noqa: BLE001 - a face must never crash the batch; cancel propagates (is_fatal)
        if backend.is_fatal(exc):
            raise
        if isinstance(exc, MemoryEstimateError):
            failure = (True, f"predicted out of memory: {exc}")
        elif backend.is_oom(exc):
            failure = (True, "out of memory")
        else:
            log.warning("ScheduledFusion: face(s) %s failed: %r", [j.number for j in jobs], exc)
            failure = (False, f"error: {type(exc).__name__}: {exc}")
        res, broken = {}, []
    # Leaving the except block drops the exception and its traceback, which hold the failed batch's tensors: only
    # then can empty_cache() give the memory back before the retry (ComfyUI's VAE does the same).
    dt = time.perf_counter() - t0
    peak = backend.peak_bytes()
    for j in jobs:
        r = reports[j.number]
        r.time_s += dt / len(jobs)
        if peak is not None:
            r.peak_memory = max(r.peak_memory or 0, peak)
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
        return _process(image, jobs, nxt, s, backend, reports)
    if broken:
        step = after_artifact(attempt, s.fallback)
        bad = [j for j in jobs if j.number in broken]
        if step is not None:
            nxt, action, detail = step
            for j in bad:
                reports[j.number].add(action, detail)
            res.update(_process(image, bad, nxt, s, backend, reports))
    return res


def run_fusion(images: np.ndarray, faces: FaceSet, settings: FusionSettings, backend: FusionBackend) -> FusionResult:
    """Refine every face of every frame.

    images: [B, H, W, 3] float32 in [0, 1] (checked against faces.image_size and batch size).
    Returns the FaceSet with processed crops attached (Face.with_crop), the crops in frame-major order, and one
    FaceReport per face. Faces that fail after all fallbacks keep crop unchanged (None) and report "passthrough".
    Face k (frame-major) is sampled with seed + k; with faces.independent_frames, face k of its frame (the service's
    batches of unrelated photos: each gets the seeds it would get alone).
    """
    b, h, w = int(images.shape[0]), int(images.shape[1]), int(images.shape[2])
    faces.check_image(h, w, b)
    jobs_per_frame: list[list[_Job]] = []
    number = 0
    for fi, frame_faces in enumerate(faces.faces):
        frame_jobs = []
        for k, face in enumerate(frame_faces):
            frame_jobs.append(_Job(fi, k, number, face, k if faces.independent_frames else number))
            number += 1
        jobs_per_frame.append(frame_jobs)
    reports = {
        j.number: FaceReport(frame=j.frame, index=j.index, seed=face_seed(settings.seed, j.seed_offset))
        for fj in jobs_per_frame
        for j in fj
    }
    outputs: dict[int, np.ndarray] = {}
    start = Attempt(guide_size=settings.guide_size)
    for fi, frame_jobs in enumerate(jobs_per_frame):
        image = np.asarray(images[fi], dtype=np.float32)
        for batch in make_batches(list(range(len(frame_jobs))), settings.faces_per_batch):
            jobs = [frame_jobs[i] for i in batch]
            try:
                outputs.update(_process(image, jobs, start, settings, backend, reports))
            finally:
                for _ in jobs:
                    backend.progress()
    new_frames: list[tuple[Face, ...]] = []
    crops: list[np.ndarray] = []
    for fi, frame_jobs in enumerate(jobs_per_frame):
        image = np.asarray(images[fi], dtype=np.float32)
        row = []
        for j in frame_jobs:
            rep = reports[j.number]
            if j.number in outputs:
                row.append(j.face.with_crop(outputs[j.number]))
                crops.append(outputs[j.number])
            else:
                rep.status = "passthrough"
                rep.warnings.append("face passed through unchanged")
                log.warning(
                    "ScheduledFusion: frame %d face %d passed through unchanged (%s)",
                    j.frame,
                    j.index,
                    "; ".join(rep.warnings),
                )
                row.append(j.face)
                crops.append(
                    warp_to_crop(image, j.face.affine, j.face.crop_size, interpolation="linear", border="reflect")
                )
        new_frames.append(tuple(row))
    out_set = replace(faces, faces=tuple(new_frames))  # keeps independent_frames for the nodes downstream
    return FusionResult(out_set, crops, [reports[n] for n in sorted(reports)])
