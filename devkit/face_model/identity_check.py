"""The artifact check's "wrong identity" injection, calibrated with dlib's face descriptors (issue 14).

A good output is the trained face model's real ScheduledFusion crop of a photo; its identity score is dlib's L2
distance (and, recorded for comparison, the cosine distance) between the input face's and the output's 128-d
descriptors. A "wrong identity" output is that crop with its face replaced by ANOTHER person's aligned face:
  paste: the donor photo's aligned input crop pasted through the output's own face mask (the hair, background and
         mask edge stay the output's: what a sampler or swapper that lost the identity leaves behind);
  whole: the donor's whole aligned crop (a plain wrong face).
Donors are other photos of the same run whose person differs (person_of: held-out files are named
`<a>_<b>_<person>_<number>.jpg`, several photos per person; any other name is its own person).

Shared by bench/quality.py (JSON + table; --merge recomputes from the stored scores) and the tests. No ComfyUI here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

WrongKind = Literal["paste", "whole"]
WRONG_KINDS: tuple[WrongKind, ...] = ("paste", "whole")
_PERSON = re.compile(r"^\d+_\d+_(?P<person>.+)_\d+$")


class Embedder(Protocol):
    """What the calibration needs of devkit/face_model/quality.DlibIdentity: [S, S, 3] 0..1 aligned crop -> [128]."""

    def embed(self, crop: np.ndarray) -> np.ndarray: ...


@dataclass
class IdentityItem:
    """One good output: photo (file name), variant (unscheduled / preset), input and output aligned crops
    [S, S, 3] float 0..1 and the face mask [S, S] in crop space."""

    photo: str
    variant: str
    input_crop: np.ndarray
    output_crop: np.ndarray
    mask: np.ndarray


def person_of(photo: str) -> str:
    """The person a held-out file shows: `0_0_ouhao_0039.jpg` -> `ouhao`; any other name is its own person."""
    stem = photo.rsplit(".", 1)[0]
    m = _PERSON.match(stem)
    return m.group("person") if m else stem


def donor_for(photos: list[str], i: int) -> int | None:
    """Index of the next photo (cyclic) that shows a different person than photos[i]; None when all are one person."""
    n = len(photos)
    for step in range(1, n):
        j = (i + step) % n
        if person_of(photos[j]) != person_of(photos[i]):
            return j
    return None


def paste_face(output: np.ndarray, donor: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """output [S, S, 3] with donor [S, S, 3] (same alignment) blended in through mask [S, S] in 0..1."""
    m = np.clip(np.asarray(mask, np.float32), 0.0, 1.0)[..., None]
    out: np.ndarray = (m * donor + (1.0 - m) * output).astype(np.float32)
    return out


def scores(ref: np.ndarray, emb: np.ndarray) -> dict[str, float]:
    """dlib descriptors [128] -> {"l2": L2 distance, "cos": 1 - cosine similarity} (both: lower = same person)."""
    a, b = np.asarray(ref, np.float64), np.asarray(emb, np.float64)
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return {"l2": float(np.linalg.norm(a - b)), "cos": 1.0 - (float(a @ b) / den if den else 0.0)}


STRUCTURE_SIGMAS = {"struct_fine": 1 / 128, "struct": None, "struct_coarse": 1 / 32}
"""structure_similarity's low-pass per recorded scale (None: the check's own STRUCTURE_SIGMA); stored as 1 - corr."""


def structure_scores(input_crop: np.ndarray, output: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """{"struct", "struct_fine", "struct_coarse"}: 1 - structure_similarity(input, output) inside the mask at three
    low-passes (lower = the same face; the check uses "struct")."""
    from tokenfuse.fusion.artifacts import STRUCTURE_SIGMA, structure_similarity

    return {
        k: 1.0 - structure_similarity(input_crop, output, mask, STRUCTURE_SIGMA if v is None else v)
        for k, v in STRUCTURE_SIGMAS.items()
    }


def measure(items: list[IdentityItem], ident: Embedder | None) -> dict[str, list[dict[str, Any]]]:
    """Raw scores: "good" (input vs its output, per item) and "wrong" (input vs the output with another person's
    face, per unscheduled item and WRONG_KINDS), "same_person" (input vs another photo of the same person's input:
    dlib on this data, recorded, never used for the threshold). Every good and wrong row also holds
    structure_scores (model-free); without an embedder (ident None) only those."""
    inputs: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for it in items:
        if it.photo not in inputs:
            inputs[it.photo] = (it.input_crop, ident.embed(it.input_crop) if ident else None)

    def row(photo: str, crop: np.ndarray, mask: np.ndarray) -> dict[str, float]:
        ref = inputs[photo][1]
        emb = scores(ref, ident.embed(crop)) if ident is not None and ref is not None else {}
        return {**emb, **structure_scores(inputs[photo][0], crop, mask)}

    good = [{"photo": it.photo, "variant": it.variant, **row(it.photo, it.output_crop, it.mask)} for it in items]
    photos = list(inputs)
    wrong: list[dict[str, Any]] = []
    base = {it.photo: it for it in items if it.variant == "unscheduled"}
    for i, photo in enumerate(photos):
        j = donor_for(photos, i)
        if j is None or photo not in base:
            continue
        it, donor = base[photo], photos[j]
        donor_crop = inputs[donor][0]
        made = {"paste": paste_face(it.output_crop, donor_crop, it.mask), "whole": donor_crop}
        for kind in WRONG_KINDS:
            wrong.append({"photo": photo, "donor": donor, "kind": kind, **row(photo, made[kind], it.mask)})
    same = [
        {"photo": a, "other": b, **scores(ea, eb)}
        for k, a in enumerate(photos)
        for b in photos[k + 1 :]
        if person_of(a) == person_of(b) and (ea := inputs[a][1]) is not None and (eb := inputs[b][1]) is not None
    ]
    return {"good": good, "wrong": wrong, "same_person": same}


def separation(good: list[float], wrong: list[float]) -> dict[str, float | None]:
    """Gap between the worst good score and the best wrong one (lower = same), in units of all the scores' spread
    (std): > 0 separates. midpoint: the threshold halfway across the gap (None when they overlap)."""
    g, w = np.asarray(good, np.float64), np.asarray(wrong, np.float64)
    gap = float(w.min() - g.max())
    spread = float(np.concatenate([g, w]).std()) or 1.0
    return {
        "good_min": round(float(g.min()), 4),
        "good_max": round(float(g.max()), 4),
        "wrong_min": round(float(w.min()), 4),
        "wrong_max": round(float(w.max()), 4),
        "gap": round(gap, 4),
        "gap_over_spread": round(gap / spread, 3),
        "midpoint": round(float(g.max() + gap / 2), 4) if gap > 0 else None,
    }


def summarise(
    raw: dict[str, list[dict[str, Any]]], threshold: float, structure_floor: float | None = None
) -> dict[str, Any]:
    """The calibration's summary from measure()'s raw scores: per scale the separation; false positives on good
    outputs and true positives per wrong kind, counted by fusion/artifacts.check_crop's own rules: "dlib" (L2 above
    `threshold`, ArtifactThresholds.max_identity_distance_dlib; rows with dlib scores only), "structure"
    (structure_similarity below `structure_floor`, ArtifactThresholds.min_structure; None: that rule off) and
    "either" (what the check does with both). The top-level counts are "either"'s."""
    from tokenfuse.fusion.artifacts import ArtifactThresholds, IdentityScore, structure_failure

    t = ArtifactThresholds(max_identity_distance_dlib=threshold, min_structure=structure_floor)
    rules: dict[str, Any] = {}
    good, wrong = raw["good"], raw["wrong"]
    if good and "l2" in good[0]:
        rules["dlib"] = lambda r: IdentityScore("dlib", r["l2"]).failure(t) is not None
    if structure_floor is not None and good and "struct" in good[0]:
        rules["structure"] = lambda r: structure_failure(1.0 - r["struct"], t) is not None
    if len(rules) == 2:
        rules["either"] = lambda r: rules["dlib"](r) or rules["structure"](r)

    def counts(fails: Any) -> dict[str, Any]:
        return {
            "false_positives": sum(bool(fails(r)) for r in good),
            "true_positives": {
                k: f"{sum(bool(fails(r)) for r in wrong if r['kind'] == k)}/{sum(r['kind'] == k for r in wrong)}"
                for k in WRONG_KINDS
            },
        }

    by_rule = {name: counts(f) for name, f in rules.items()}
    out: dict[str, Any] = {
        "embedder": "dlib face_recognition_model_v1 (128-d), score = L2 distance input face vs output; structure = "
        "1 - correlation of the low-passed face, input vs output (model-free)",
        "threshold_l2": threshold,
        "structure_floor": structure_floor,
        "good_outputs": len(good),
        **(list(by_rule.values())[-1] if by_rule else {"false_positives": 0, "true_positives": {}}),
        "by_rule": by_rule,
        "separation": {},
    }
    if good and wrong:
        for scale in ("l2", "cos", *STRUCTURE_SIGMAS):
            if scale in good[0]:
                out["separation"][scale] = {
                    k: separation([r[scale] for r in good], [r[scale] for r in wrong if r["kind"] == k])
                    for k in WRONG_KINDS
                }
    same = raw.get("same_person", [])
    if same:
        out["same_person_l2"] = [round(min(r["l2"] for r in same), 4), round(max(r["l2"] for r in same), 4)]
    return out


def table(summary: dict[str, Any]) -> str:
    """The calibration as a Markdown table (one row per scale x wrong kind) plus a verdict line per rule."""
    lines = [
        "| scale | wrong kind | good min / max | wrong min / max | gap | gap / spread | midpoint |",
        "|---|---|---|---|---|---|---|",
    ]
    for scale, per_kind in summary.get("separation", {}).items():
        for kind, s in per_kind.items():
            mid = "-" if s["midpoint"] is None else f"{s['midpoint']:.3f}"
            lines.append(
                f"| {scale} | {kind} | {s['good_min']:.3f} / {s['good_max']:.3f} | {s['wrong_min']:.3f} / "
                f"{s['wrong_max']:.3f} | {s['gap']:+.3f} | {s['gap_over_spread']:+.2f} | {mid} |"
            )
    rule_text = {
        "dlib": f"dlib L2 <= {summary['threshold_l2']}",
        "structure": f"structure >= {summary.get('structure_floor')}",
        "either": "both",
    }
    for name, c in summary.get("by_rule", {}).items():
        lines.append(
            f"check with {rule_text[name]}: false positives {c['false_positives']}/{summary['good_outputs']} good "
            f"outputs; wrong identity caught {c['true_positives']}"
        )
    if "same_person_l2" in summary:
        lines.append(f"same person, other photo: dlib L2 {summary['same_person_l2']}")
    return "\n".join(lines)
