"""Face tracks: per-frame detections linked into tracks by box overlap (and identity embedding when present),
gaps filled, one scene per track, and the identity to process chosen with FaceDetect's selection vocabulary.

Pass 1 of the video driver keeps only these small arrays per frame (boxes, 5 landmarks, an optional
embedding), never pixels, so a long video's tracks fit in a few MB.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..faces.detect import DetectInput, Detector, detect_input, detect_prepared
from ..faces.embed import ArcFaceEmbedder
from ..faces.select import Selection, pick_indices


@dataclass(frozen=True, eq=False)
class FaceObs:
    """One detection: bbox [4] float32 x1, y1, x2, y2; landmarks [5, 2] float32; embedding [D] unit or None."""

    bbox: np.ndarray
    score: float
    landmarks: np.ndarray
    embedding: np.ndarray | None = None


DetectFn = Callable[[np.ndarray], list[FaceObs]]


@dataclass(frozen=True)
class FrameDetect:
    """The per-frame detect function of make_detect, in two halves: `prepare` (the frame scaled for the detector;
    pure, so pass 1 runs it in its decoding thread, one frame ahead) and `run` (the detector, and the embedder on
    the full frame). Called as a function it does both: rgb [H, W, 3] uint8 -> detections."""

    detector: Detector
    detect_size: int = 480
    score_threshold: float = 0.5
    embedder: ArcFaceEmbedder | None = None

    def prepare(self, rgb: np.ndarray) -> DetectInput | None:
        return detect_input(rgb, self.detect_size)

    def run(self, rgb: np.ndarray, prepared: DetectInput | None) -> list[FaceObs]:
        dets = detect_prepared(self.detector, prepared, self.score_threshold)
        embedder = self.embedder
        return [
            FaceObs(
                d.bbox.astype(np.float32),
                float(d.score),
                d.landmarks.astype(np.float32),
                embedder.embed(rgb, d.landmarks) if embedder is not None else None,
            )
            for d in dets
        ]

    def __call__(self, rgb: np.ndarray) -> list[FaceObs]:
        return self.run(rgb, self.prepare(rgb))


def make_detect(
    detector: Detector,
    detect_size: int = 480,
    score_threshold: float = 0.5,
    embedder: ArcFaceEmbedder | None = None,
) -> FrameDetect:
    """A per-frame detect function over the pack's detectors: rgb [H, W, 3] uint8 -> detections.

    detect_size: long side the frame is scaled to for detection (faces need far fewer pixels than 1080p).
    embedder: ArcFace for identity (linking across occlusions and reference selection); None = boxes only.
    """
    return FrameDetect(detector, detect_size, score_threshold, embedder)


@dataclass(frozen=True, eq=False)
class Track:
    """One face followed through consecutive frames start .. start + length - 1 of a single scene.

    landmarks: [T, 5, 2] float32 raw detector landmarks (gaps linearly interpolated); bboxes: [T, 4];
    scores: [T] (0 where filled); detected: [T] bool; embedding: [D] unit mean identity or None;
    affines: [T, 2, 3] float64 smoothed image -> 512 aligned crop transforms (set by smooth.smooth_track);
    person: the id of the first track of the same person in this scene (group_people: a face hidden longer than
    max_gap comes back as a new track), None = its own.
    """

    id: int
    start: int
    segment: int
    landmarks: np.ndarray
    bboxes: np.ndarray
    scores: np.ndarray
    detected: np.ndarray
    embedding: np.ndarray | None = None
    affines: np.ndarray | None = field(default=None, repr=False)
    person: int | None = None

    @property
    def who(self) -> int:
        """The person this track shows (the id of that person's first track)."""
        return self.id if self.person is None else self.person

    @property
    def length(self) -> int:
        return int(len(self.landmarks))

    @property
    def end(self) -> int:
        """One past the last frame."""
        return self.start + self.length

    def covers(self, frame: int) -> bool:
        return self.start <= frame < self.end

    def median_box(self) -> np.ndarray:
        return np.asarray(np.median(self.bboxes[self.detected], axis=0))


def box_iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two boxes [4] x1, y1, x2, y2."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


@dataclass(frozen=True)
class LinkOptions:
    """iou_min: box overlap to continue a track; embed_min: identity similarity needed when both have embeddings;
    max_gap: frames a track may miss before it ends (gaps are interpolated); min_hits: detections a track needs
    unless it spans its whole scene (drops one-frame false positives, keeps a one-frame video's face)."""

    iou_min: float = 0.3
    embed_min: float = 0.3
    max_gap: int = 8
    min_hits: int = 3


@dataclass
class _Open:
    id: int
    frames: list[int]
    obs: list[FaceObs]
    emb_sum: np.ndarray | None

    def emb(self) -> np.ndarray | None:
        if self.emb_sum is None:
            return None
        return self.emb_sum / max(float(np.linalg.norm(self.emb_sum)), 1e-8)

    def predicted(self, t: int) -> np.ndarray:
        """The box at frame t moved on at the last two detections' speed (constant velocity): a face panning 10 px
        a frame is 30 px from its last box after a 2-frame miss, which the last box alone no longer overlaps."""
        last = np.asarray(self.obs[-1].bbox, np.float64)
        if len(self.obs) < 2:
            return last
        step = (last - np.asarray(self.obs[-2].bbox, np.float64)) / max(self.frames[-1] - self.frames[-2], 1)
        shift = (step[:2] + step[2:]) / 2 * (t - self.frames[-1])  # the centre's motion (size changes not carried)
        return last + np.tile(shift, 2)


def _finish(o: _Open, segment: int) -> Track:
    """Fill the gaps of an open track by linear interpolation and freeze it."""
    frames = np.asarray(o.frames)
    start, stop = int(frames[0]), int(frames[-1]) + 1
    t = np.arange(start, stop)
    lm = np.stack([ob.landmarks for ob in o.obs]).reshape(len(o.obs), -1)
    bb = np.stack([ob.bbox for ob in o.obs])
    lm_f = np.stack([np.interp(t, frames, lm[:, j]) for j in range(lm.shape[1])], 1).reshape(-1, 5, 2)
    bb_f = np.stack([np.interp(t, frames, bb[:, j]) for j in range(4)], 1)
    detected = np.zeros(len(t), bool)
    detected[frames - start] = True
    scores = np.zeros(len(t), np.float32)
    scores[frames - start] = [ob.score for ob in o.obs]
    return Track(o.id, start, segment, lm_f.astype(np.float32), bb_f.astype(np.float32), scores, detected, o.emb())


def segment_starts(cuts: Sequence[int]) -> list[int]:
    """Sorted first frames of the scenes after frame 0 (the cut frames)."""
    return sorted({int(c) for c in cuts if c > 0})


def segment_of(frame: int, starts: list[int]) -> int:
    return bisect.bisect_right(starts, frame)


def link_tracks(
    per_frame: Sequence[Sequence[FaceObs]], cuts: Sequence[int] = (), opts: LinkOptions = LinkOptions()
) -> list[Track]:
    """Link detections frame to frame (greedy on IoU + embedding similarity); a cut ends every track. The IoU is the
    better of the track's last box and that box moved on at the track's speed (misses on a fast pan kept breaking
    one face into several tracks: frames in the gaps unrefined, each piece its own seed). Tracks seen more recently
    choose first (DeepSORT's matching cascade): a face walking behind another moves on, as predicted, over the front
    face's box, and on a tie its track took the front face's detections (the front face's track ended, the hidden
    one's continued on the wrong face with the wrong seed).

    per_frame: detections of frames 0 .. N-1. cuts: first frames of new scenes. Returns tracks by start frame.
    """
    starts = segment_starts(cuts)
    seg_bounds = [0, *starts, len(per_frame)]
    active: list[_Open] = []
    done: list[tuple[_Open, int]] = []
    next_id = 0
    for t, dets in enumerate(per_frame):
        seg = segment_of(t, starts)
        still = []
        for o in active:
            if segment_of(o.frames[-1], starts) == seg and t - o.frames[-1] <= opts.max_gap:
                still.append(o)
            else:
                done.append((o, segment_of(o.frames[0], starts)))
        active = still
        pairs = []
        for i, o in enumerate(active):
            e = o.emb()
            for j, d in enumerate(dets):
                iou = max(box_iou(o.obs[-1].bbox, d.bbox), box_iou(o.predicted(t), d.bbox))
                if iou < opts.iou_min:
                    continue
                sim = float(np.dot(e, d.embedding)) if e is not None and d.embedding is not None else None
                if sim is not None and sim < opts.embed_min:
                    continue
                pairs.append((o.frames[-1], iou + (sim or 0.0), i, j))  # the latest seen first, then best
        used_o: set[int] = set()
        used_d: set[int] = set()
        for _, _, i, j in sorted(pairs, reverse=True):
            if i in used_o or j in used_d:
                continue
            used_o.add(i)
            used_d.add(j)
            o, d = active[i], dets[j]
            o.frames.append(t)
            o.obs.append(d)
            if d.embedding is not None:
                o.emb_sum = d.embedding.astype(np.float64) + (o.emb_sum if o.emb_sum is not None else 0.0)
        for j, d in enumerate(dets):
            if j not in used_d:
                emb = d.embedding.astype(np.float64) if d.embedding is not None else None
                active.append(_Open(next_id, [t], [d], emb))
                next_id += 1
    done.extend((o, segment_of(o.frames[0], starts)) for o in active)
    tracks = []
    for o, seg in done:
        scene_len = seg_bounds[seg + 1] - seg_bounds[seg]
        if len(o.frames) < min(opts.min_hits, scene_len):
            continue
        tracks.append(_finish(o, seg))
    tracks.sort(key=lambda tr: (tr.start, tr.id))
    return group_people(tracks, opts)


def _last_box(tr: Track) -> np.ndarray:
    return np.asarray(tr.bboxes[np.flatnonzero(tr.detected)[-1]], np.float64)


def _first_box(tr: Track) -> np.ndarray:
    return np.asarray(tr.bboxes[np.flatnonzero(tr.detected)[0]], np.float64)


def _centre_speed(tr: Track, last: int = 8) -> np.ndarray:
    """The box centre's velocity [2] (px/frame) over the track's last `last` detections; 0 for a single one."""
    idx = np.flatnonzero(tr.detected)[-last:]
    if len(idx) < 2:
        return np.zeros(2)
    c = (tr.bboxes[idx, :2].astype(np.float64) + tr.bboxes[idx, 2:]) / 2
    return np.asarray((c[-1] - c[0]) / float(idx[-1] - idx[0]))


def _continues(prev: Track, new: Track, opts: LinkOptions) -> float | None:
    """How well `new` continues the person whose latest track is `prev` (higher = better), None when it cannot: the
    same identity when both have embeddings (anywhere in the frame), else the face coming back where it was hidden
    or where it went at its speed while hidden (centres within half a face, sizes within 1.5x of each other). The
    second place: two people walking past each other hide one behind the other for longer than max_gap, and the
    hidden one came back as another person (its own seed, counted twice by selection)."""
    if prev.embedding is not None and new.embedding is not None:
        sim = float(np.dot(prev.embedding, new.embedding))
        return sim if sim >= opts.embed_min else None
    a, b = _last_box(prev), _first_box(new)
    size_a, size_b = max(a[2] - a[0], a[3] - a[1]), max(b[2] - b[0], b[3] - b[1])
    if min(size_a, size_b) <= 0 or max(size_a, size_b) > 1.5 * min(size_a, size_b):
        return None
    gap = new.start + int(np.flatnonzero(new.detected)[0]) - (prev.start + int(np.flatnonzero(prev.detected)[-1]))
    hidden_at, back_at = (a[:2] + a[2:]) / 2, (b[:2] + b[2:]) / 2
    went_to = hidden_at + _centre_speed(prev) * gap
    dist = min(float(np.hypot(*(hidden_at - back_at))), float(np.hypot(*(went_to - back_at))))
    return -dist / max(size_a, size_b) if dist <= 0.5 * max(size_a, size_b) else None


def group_people(tracks: Sequence[Track], opts: LinkOptions = LinkOptions()) -> list[Track]:
    """Mark the tracks of one scene that show the same person one after the other (`Track.person`).

    A face hidden for more than max_gap frames (someone walking past, a hand) ends its track and comes back as a new
    one: as two faces, selection counted it twice (max_faces 1 dropped the rest of the shot, `indices` 1 picked the
    same person again instead of the second one) and each piece got its own seed. Greedy in start order: a track joins
    the best-continued person (_continues) whose tracks all ended before it starts. tracks: by start frame.
    """
    people: list[list[Track]] = []  # each person's tracks in start order
    out: list[Track] = []
    for tr in tracks:
        best, best_score = None, -np.inf
        for person in people:
            last = person[-1]
            if last.segment != tr.segment or last.end > tr.start:
                continue
            score = _continues(last, tr, opts)
            if score is not None and score > best_score:
                best, best_score = person, score
        if best is None:
            people.append([tr])
            out.append(tr)
        else:
            joined = replace(tr, person=best[0].who)
            best.append(joined)
            out.append(joined)
    return out


def seed_offsets(tracks: Sequence[Track]) -> list[int]:
    """Per track, the seed offset of its person: the index of the person's first track in `tracks`, so every piece
    of one person is refined with the same noise (and a track alone keeps its own index, as before)."""
    first: dict[int, int] = {}
    return [first.setdefault(tr.who, j) for j, tr in enumerate(tracks)]


_ORDER: dict[str, Callable[[np.ndarray, float], float]] = {
    "left-right": lambda b, s: (b[0] + b[2]) / 2,
    "right-left": lambda b, s: -(b[0] + b[2]) / 2,
    "top-bottom": lambda b, s: (b[1] + b[3]) / 2,
    "large-small": lambda b, s: -(b[2] - b[0]) * (b[3] - b[1]),
    "small-large": lambda b, s: (b[2] - b[0]) * (b[3] - b[1]),
    "best-score": lambda b, s: -s,
}


def rank_people(tracks: Sequence[Track], order: str) -> list[list[Track]]:
    """The people of `tracks` (their tracks in start order) sorted by FaceDetect's order, each judged by the median
    box and mean score over all its detections."""
    people: dict[int, list[Track]] = {}
    for tr in sorted(tracks, key=lambda tr: (tr.start, tr.id)):
        people.setdefault(tr.who, []).append(tr)

    def key(person: list[Track]) -> float:
        boxes = np.concatenate([tr.bboxes[tr.detected] for tr in person])
        scores = np.concatenate([tr.scores[tr.detected] for tr in person])
        return _ORDER[order](np.median(boxes, axis=0), float(scores.mean()))

    return sorted(people.values(), key=key)


def select_tracks(tracks: Sequence[Track], sel: Selection) -> list[Track]:
    """FaceDetect's selection applied to tracks, scene by scene (a cut starts new tracks of the same people).

    Each track is judged by its median box and mean detection score: min_size, score_threshold, reference
    identity (tracks without embeddings never match a reference), then order, indices and max_faces within
    each scene. Returns the kept tracks by start frame.
    """
    return sorted(selection_order(tracks, sel), key=lambda tr: (tr.start, tr.id))


def selection_order(tracks: Sequence[Track], sel: Selection) -> list[Track]:
    """select_tracks' kept tracks in selection order: scene by scene, within a scene as FaceDetect returns faces
    (the sort order, or the order the indices are written in, each person once; out-of-range indices warned).
    indices and max_faces count people (group_people), a person's tracks follow each other in start order."""
    by_scene: dict[int, list[Track]] = {}
    for tr in tracks:
        box = tr.median_box()
        score = float(tr.scores[tr.detected].mean())
        if min(box[2] - box[0], box[3] - box[1]) < sel.min_size or score < sel.score_threshold:
            continue
        if sel.reference is not None:
            if tr.embedding is None or float(np.dot(tr.embedding, sel.reference)) < sel.similarity_threshold:
                continue
        by_scene.setdefault(tr.segment, []).append(tr)
    kept: list[Track] = []
    for scene in by_scene.values():
        people = rank_people(scene, sel.order)
        if sel.indices is not None:
            people = [people[i] for i in pick_indices(len(people), sel.indices)]
        if sel.max_faces > 0:
            people = people[: sel.max_faces]
        kept.extend(tr for person in people for tr in person)
    return kept
