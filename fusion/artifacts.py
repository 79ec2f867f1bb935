"""Artifact check on a fused face crop: catches the failures a token schedule (or fp16) can cause.

A crop fails when it holds NaN/Inf, is near-constant or black, is blown out (most pixels clipped), looks like noise
(neighbouring pixels uncorrelated: a diverged sampler), optionally is no longer the face it was sampled from (the
coarse structure of the face region vs the crop the sampler started from; off by default, see min_structure), or
lost identity (only when embeddings exist: an IdentityScore on its embedder's own scale, checked against that
embedder's threshold). Thresholds are loose on purpose: a real face crop, even a dark or flat-lit one, passes; the
check exists to trigger a rerun, not to grade quality.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import cv2
import numpy as np

IdentityEmbedder = Literal["arcface", "dlib"]


STRUCTURE_FLOOR = 0.81
"""The opt-in min_structure calibrated on the trained face model's outputs of 20 held-out photos (guide 512, 20
steps): good outputs >= 0.898 at denoise 0.45 and >= 0.848 at 0.6; other people's faces pasted through the output's
mask <= 0.772. NOT the default: on a low-resolution source (carphone, 176x144, refined at a 128 or 256 crop) the same
model's good refines score 0.74-0.80, where pasted faces also lie (docs/quality.md)."""
STRUCTURE_SIGMA = 1 / 64
"""Low-pass of structure_similarity, as a fraction of the crop side (8 px at 512): what a refine keeps."""


@dataclass(frozen=True)
class ArtifactThresholds:
    """black_mean: mean below this is black. min_std: std below this is near-constant. max_clipped: fraction of pixels
    with a channel at 0 or 1 above this is blown (given a reference crop, only when also more than
    clipped_over_reference above the reference's own fraction). min_neighbour_corr: correlation of
    horizontally/vertically adjacent pixels below this is noise (real photos sit above 0.8). min_identity: ArcFace
    cosine similarity floor (not calibrated here: no ArcFace weights offline). max_identity_distance_dlib: ceiling
    on the L2 distance of dlib's 128-d descriptors, input face vs output: the worst of the trained face model's 20
    held-out good outputs (guide 512) is 0.731, so 0.76 keeps false positives at 0 (dlib's own "same person" cut,
    0.6, flags real outputs). It only catches far identities: other held-out people pasted into an output score
    0.41-0.80 (docs/quality.md). min_structure: floor on structure_similarity(sampled crop, output)
    inside the face; None (default) = off: a refine of a blurry, low-resolution face legitimately redraws it as much
    as another face differs (STRUCTURE_FLOOR).
    """

    black_mean: float = 0.04
    min_std: float = 0.02
    max_clipped: float = 0.4
    clipped_over_reference: float = 0.25
    min_neighbour_corr: float = 0.5
    min_identity: float = 0.35
    max_identity_distance_dlib: float = 0.76
    min_structure: float | None = None


@dataclass(frozen=True)
class IdentityScore:
    """How close an output face is to the reference identity, on ONE embedder's own scale.

    arcface: cosine similarity of ArcFace embeddings (faces/embed.py), higher = same person, checked against
    min_identity. dlib: L2 distance of dlib's 128-d descriptors (face-recognition-models), lower = same person, checked
    against max_identity_distance_dlib. The two scales are unrelated, so a score names its embedder and is only ever
    compared with that embedder's threshold. Build it with `between` from two embeddings of the same embedder.
    """

    embedder: IdentityEmbedder
    value: float

    def __post_init__(self) -> None:
        if self.embedder not in get_args(IdentityEmbedder):
            raise ValueError(f"unknown identity embedder {self.embedder!r}: use one of {get_args(IdentityEmbedder)}")

    @classmethod
    def between(cls, embedder: IdentityEmbedder, reference: np.ndarray, output: np.ndarray) -> IdentityScore:
        """Score of output's embedding against reference's ([D] each, both from `embedder`; dlib: D = 128).

        Raises ValueError for embeddings of different sizes: they come from different embedders and cannot be
        compared (e.g. a 512-d ArcFace reference with a 128-d dlib output)."""
        a = np.asarray(reference, dtype=np.float64).ravel()
        b = np.asarray(output, dtype=np.float64).ravel()
        if a.shape != b.shape or (embedder == "dlib" and a.size != 128):
            raise ValueError(
                f"cannot score identity with {embedder}: reference [{a.size}] and output [{b.size}] embeddings "
                "must both come from that embedder (ArcFace 512-d, dlib 128-d)"
            )
        if embedder == "dlib":
            return cls(embedder, float(np.linalg.norm(a - b)))
        return cls(embedder, cosine_similarity(a, b))

    def failure(self, t: ArtifactThresholds) -> str | None:
        """The reason this score fails t, or None when it passes (a non-finite score fails)."""
        if self.embedder == "dlib":
            if self.value <= t.max_identity_distance_dlib:
                return None
            return f"identity drop (dlib distance {self.value:.3f} > {t.max_identity_distance_dlib})"
        if self.value >= t.min_identity:
            return None
        return f"identity drop (similarity {self.value:.2f} < {t.min_identity})"

    @property
    def stat_name(self) -> str:
        """Key of this score in ArtifactResult.stats: one per embedder, so ranges of the two scales never mix."""
        return "identity" if self.embedder == "arcface" else "identity_dlib_distance"


@dataclass(frozen=True)
class ArtifactResult:
    ok: bool
    reasons: tuple[str, ...] = ()
    stats: tuple[tuple[str, float], ...] = ()

    def __bool__(self) -> bool:
        return self.ok


def _neighbour_corr(gray: np.ndarray, sel: np.ndarray) -> float:
    """Correlation of horizontally and vertically adjacent pixels, over the pairs with BOTH pixels in `sel`.

    gray, sel: [H, W]. Only pairs inside the region count: pairs from the untouched context around a face (the
    corners of an elliptical mask's bounding box: hair, background) are smooth, and with a contrast of their own they
    can carry the coefficient above the noise floor for a face that is pure noise (issue 14: 5 of 100 injected-noise
    outputs passed at 0.51 over the bounding box; inside the mask they score about 0).
    """
    h_pair = sel[:, :-1] & sel[:, 1:]
    v_pair = sel[:-1, :] & sel[1:, :]
    a = np.concatenate([gray[:, :-1][h_pair], gray[:-1, :][v_pair]])
    b = np.concatenate([gray[:, 1:][h_pair], gray[1:, :][v_pair]])
    if a.size < 2:
        return 1.0
    return _pearson(a, b, 1e-8)


def _pearson(a: np.ndarray, b: np.ndarray, eps: float) -> float:
    """Pearson correlation of two equal-length samples [N]; 1.0 when either is flat (std < eps): nothing to tell."""
    sa, sb = a.std(), b.std()
    if sa < eps or sb < eps:
        return 1.0
    return float(((a - a.mean()) * (b - b.mean())).mean() / (sa * sb))


def structure_similarity(
    reference: np.ndarray, output: np.ndarray, mask: np.ndarray | None = None, sigma: float = STRUCTURE_SIGMA
) -> float:
    """Correlation of the low-passed luminance of output and reference inside the face (mask > 0.5).

    reference, output: [H, W, 3] in 0..1, the same alignment (the crop the sampler started from, and its result);
    mask: [H, W] or None (whole crop). sigma: the Gaussian low-pass as a fraction of the side. A refine keeps the
    face's coarse layout (the trained face model on 20 held-out photos: >= 0.898 at denoise 0.45, >= 0.848 at 0.6)
    while another person's aligned face, or a sampler that drew something else, does not (<= 0.772); correlation
    ignores brightness and contrast, which a refine may change. A blurry low-resolution face is redrawn more (0.74-0.80
    on a 176x144 clip), which is why the rule is opt-in. 1.0 for a region too small or flat to tell.
    """
    a = np.asarray(reference, np.float32).mean(axis=2)
    b = np.asarray(output, np.float32).mean(axis=2)
    if a.shape != b.shape:
        raise ValueError(f"structure_similarity: reference {a.shape} and output {b.shape} differ in size")
    s = max(1.0, sigma * max(a.shape))
    a = cv2.GaussianBlur(a, (0, 0), sigmaX=s)
    b = cv2.GaussianBlur(b, (0, 0), sigmaX=s)
    sel = np.ones(a.shape, bool) if mask is None else np.asarray(mask, np.float32) > 0.5
    if sel.sum() < 16:
        return 1.0
    return _pearson(a[sel].astype(np.float64), b[sel].astype(np.float64), 1e-6)


def structure_failure(value: float, t: ArtifactThresholds) -> str | None:
    """The reason a structure_similarity `value` fails t.min_structure (a non-finite value fails), or None when it
    passes or the rule is off."""
    if t.min_structure is None or (np.isfinite(value) and value >= t.min_structure):
        return None
    return f"not the sampled face (structure {value:.2f} < {t.min_structure})"


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two embeddings ([D] each)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return 0.0 if den == 0 else float(a @ b / den)


def check_crop(
    crop: np.ndarray,
    mask: np.ndarray | None = None,
    identity_similarity: float | IdentityScore | None = None,
    thresholds: ArtifactThresholds | None = None,
    reference: np.ndarray | None = None,
) -> ArtifactResult:
    """Check one output crop.

    crop: [H, W, 3] float in [0, 1] (values outside are allowed and count as clipped/non-finite).
    mask: optional [H, W] face weight in [0, 1]; statistics are taken where mask > 0.5 (the refined region).
    identity_similarity: the output's identity vs the reference face, when embeddings are known: an IdentityScore
    (its embedder picks the threshold), or a plain float = ArcFace cosine similarity (the pack's embedder).
    reference: optional [H, W, 3] crop the sampler started from (same alignment): checked with structure_similarity
    against thresholds.min_structure; and "black" / "blown" only count when the reference is not so itself (an
    overexposed or warm-lit photo clips 40 % of its own face pixels, a night shot is dark: their refines are fine).
    """
    t = thresholds or ArtifactThresholds()
    identity = (
        IdentityScore("arcface", float(identity_similarity))
        if identity_similarity is not None and not isinstance(identity_similarity, IdentityScore)
        else identity_similarity
    )
    crop = np.asarray(crop)
    if crop.ndim != 3 or crop.shape[2] != 3 or crop.shape[0] < 2 or crop.shape[1] < 2:
        return ArtifactResult(False, (f"bad crop shape {tuple(crop.shape)}",))
    if not np.isfinite(crop).all():
        bad = float((~np.isfinite(crop)).mean())
        return ArtifactResult(False, (f"non-finite values ({bad:.1%})",))
    x = crop.astype(np.float32)
    sel = np.ones(x.shape[:2], dtype=bool)
    if mask is not None:
        m = np.asarray(mask, dtype=np.float32)
        if m.shape == x.shape[:2] and (m > 0.5).sum() >= 16:
            sel = m > 0.5
    px = x[sel]
    # spatial spread per channel: a flat single-colour face (e.g. skin tone everywhere) has a large spread across
    # channels but none across pixels, and must count as near-constant
    mean, std = float(px.mean()), float(px.std(axis=0).max())
    clipped = float(((px <= 0.005) | (px >= 0.995)).any(axis=1).mean())
    corr = _neighbour_corr(x.mean(axis=2), sel)
    ref_mean, ref_clipped = 1.0, 0.0
    if reference is not None and np.shape(reference) == crop.shape:
        ref_px = np.asarray(reference, dtype=np.float32)[sel]
        ref_mean, ref_clipped = float(ref_px.mean()), float(((ref_px <= 0.005) | (ref_px >= 0.995)).any(axis=1).mean())
    reasons = []
    if mean < t.black_mean and ref_mean >= t.black_mean:
        reasons.append(f"black (mean {mean:.3f})")
    if std < t.min_std:
        reasons.append(f"near-constant (std {std:.4f})")
    if clipped > t.max_clipped and clipped > ref_clipped + t.clipped_over_reference:
        reasons.append(f"blown ({clipped:.0%} pixels clipped)")
    if std >= t.min_std and corr < t.min_neighbour_corr:
        reasons.append(f"noise (neighbour correlation {corr:.2f})")
    structure = None
    if reference is not None and t.min_structure is not None and np.shape(reference) == crop.shape:
        structure = structure_similarity(reference, x, sel.astype(np.float32))
        if reason := structure_failure(structure, t):
            reasons.append(reason)
    id_reason = None if identity is None else identity.failure(t)
    if id_reason:
        reasons.append(id_reason)
    stats: tuple[tuple[str, float], ...] = (
        ("mean", mean),
        ("std", std),
        ("clipped", clipped),
        ("neighbour_corr", corr),
    )
    if structure is not None:
        stats += (("structure", structure),)
    if identity is not None:
        stats += ((identity.stat_name, float(identity.value)),)
    return ArtifactResult(not reasons, tuple(reasons), stats)
