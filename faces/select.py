"""Which detected faces a node works on: order, index list, count, size, score and identity filters."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .types import Face, FaceOrder

log = logging.getLogger(__name__)

INDICES_MAX_CHARS = 512  # a prompt may carry megabytes; a face index list never needs more

_KEYS = {
    "left-right": lambda f: (f.bbox[0] + f.bbox[2]) / 2,
    "right-left": lambda f: -(f.bbox[0] + f.bbox[2]) / 2,
    "top-bottom": lambda f: (f.bbox[1] + f.bbox[3]) / 2,
    "large-small": lambda f: -f.width * f.height,
    "small-large": lambda f: f.width * f.height,
    "best-score": lambda f: -f.score,
}


def parse_indices(text: str) -> list[int] | None:
    """ "0, 2, -1" -> [0, 2, -1]; "" or "all" -> None (every face). Raises ValueError naming the bad item."""
    if len(text) > INDICES_MAX_CHARS:
        raise ValueError(f"face indices text is {len(text)} characters; at most {INDICES_MAX_CHARS} are accepted")
    text = text.strip().lower()
    if text in ("", "all"):
        return None
    out = []
    for item in text.replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(int(item))
        except ValueError as exc:
            raise ValueError(
                f"face index '{item[:20]}' is not an integer: write indices like '0,2' or leave empty for all"
            ) from exc
    return out


@dataclass(frozen=True)
class Selection:
    """order: sort key; indices: positions after sorting (None = all; negative counts from the end);
    max_faces: 0 = no limit; min_size: px of the box's shorter side; reference: [D] unit embedding or None."""

    order: FaceOrder = "large-small"
    indices: tuple[int, ...] | None = None
    max_faces: int = 0
    min_size: float = 0.0
    score_threshold: float = 0.5
    reference: np.ndarray | None = None
    similarity_threshold: float = 0.3


def similarity(face: Face, reference: np.ndarray) -> float:
    """Cosine similarity of a face's embedding to a reference ([D], unit); -1 when the face has no embedding."""
    if face.embedding is None:
        return -1.0
    return float(np.dot(face.embedding, reference))


def pick_indices(n: int, indices: Sequence[int]) -> list[int]:
    """Positions (0..n-1, in the order written) that `indices` name among n sorted faces or tracks: negative ones
    count from the end, each face once (0 and -1 of one face), out-of-range ones left out with a warning."""
    missing = [i for i in indices if not -n <= i < n]
    if missing:
        valid = f"valid: 0..{n - 1} or -{n}..-1" if n else "no face passed the filters"
        log.warning(
            "TokenFuse: face index %s out of range: %d face(s) found after the size/score/identity filters (%s)",
            ", ".join(map(str, missing[:8])),
            n,
            valid,
        )
    named = [i % n for i in indices if -n <= i < n]
    positions = list(dict.fromkeys(named))
    if len(positions) < len(named):
        log.warning("TokenFuse: face indices %s name a face more than once; each face is kept once", tuple(indices))
    return positions


def select_faces(faces: Sequence[Face], sel: Selection) -> list[Face]:
    kept = [f for f in faces if min(f.width, f.height) >= sel.min_size and f.score >= sel.score_threshold]
    if sel.reference is not None:
        kept = [f for f in kept if similarity(f, sel.reference) >= sel.similarity_threshold]
    kept.sort(key=_KEYS[sel.order])
    if sel.indices is not None:
        kept = [kept[i] for i in pick_indices(len(kept), sel.indices)]
    if sel.max_faces > 0:
        kept = kept[: sel.max_faces]
    return kept
