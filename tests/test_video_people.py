"""A face hidden longer than max_gap comes back as a new track of the same person (group_people): selection counts
people, not pieces, and every piece of a person is refined with the same seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenfuse.faces.select import Selection
from tokenfuse.video.encode import EncodeOptions
from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, fuse_video
from tokenfuse.video.keyframes import KeyframeOptions
from tokenfuse.video.track_pass import TrackOptions, track_video
from tokenfuse.video.tracks import FaceObs, link_tracks, seed_offsets, select_tracks
from video_clips import encode_clip, read_frames

# Five landmarks as fractions of the box: eyes, nose, mouth corners.
_LM = np.array([[0.3, 0.35], [0.7, 0.35], [0.5, 0.55], [0.35, 0.75], [0.65, 0.75]], np.float32)


def _face(x: float, y: float, size: float, emb: np.ndarray | None = None) -> FaceObs:
    box = np.array([x, y, x + size, y + size], np.float32)
    return FaceObs(box, 0.9, box[:2] + _LM * size, emb)


def _scene(frames: int = 80, hidden: range = range(30, 50), a_back: tuple[float, float] = (20.0, 20.0), **emb):
    """Person A (big, left) hidden for `hidden` frames (> max_gap 8), coming back at `a_back`; B (small, right)
    throughout. emb: optional embeddings a / a_later (A once back) / b."""
    obs: list[list[FaceObs]] = []
    for t in range(frames):
        faces = [_face(130.0, 40.0, 40.0, emb.get("b"))]
        if t < hidden.start:
            faces.append(_face(20.0, 20.0, 64.0, emb.get("a")))
        elif t >= hidden.stop:
            faces.append(_face(*a_back, 64.0, emb.get("a_later", emb.get("a"))))
        obs.append(faces)
    return obs


def _unit(i: int) -> np.ndarray:
    v = np.zeros(8, np.float32)
    v[i] = 1.0
    return v


def test_a_face_back_after_a_long_occlusion_is_the_same_person() -> None:
    """max_faces 1 kept A only until it was hidden (the rest of the shot unrefined); indices "1" picked A's second
    piece instead of B; each piece got its own seed."""
    tracks = link_tracks(_scene())
    assert [(tr.start, tr.end) for tr in tracks] == [(0, 80), (0, 30), (50, 80)]
    b, a1, a2 = tracks
    assert a2.who == a1.who != b.who
    biggest = select_tracks(tracks, Selection(order="large-small", max_faces=1))
    assert [(tr.start, tr.end) for tr in biggest] == [(0, 30), (50, 80)]
    second = select_tracks(tracks, Selection(order="large-small", indices=(1,)))
    assert second == [b]
    assert seed_offsets(tracks) == [0, 1, 1]


def test_another_face_is_not_joined() -> None:
    """Without embeddings a track continues a person only where that face was hidden; across a cut never."""
    far = link_tracks(_scene(a_back=(200.0, 100.0)))
    assert len({tr.who for tr in far}) == 3
    cut = link_tracks(_scene(), cuts=[40])
    assert len({tr.who for tr in cut}) == 4  # A before, B before, B after the cut, A back after it
    bigger = [
        [_face(20.0, 20.0, 120.0) if fo.bbox[2] - fo.bbox[0] == 64 and t >= 50 else fo for fo in fr]
        for t, fr in enumerate(_scene())
    ]
    assert len({tr.who for tr in link_tracks(bigger)}) == 3  # a face twice the size is someone else


def _crossing(back_x: float, frames: int = 80, hidden: range = range(30, 50)) -> list[list[FaceObs]]:
    """A walks right at 3 px/frame and is hidden for `hidden` frames (behind B, > max_gap), back at x = back_x;
    B stands still."""
    obs: list[list[FaceObs]] = []
    for t in range(frames):
        faces = [_face(130.0, 40.0, 40.0)]
        if t < hidden.start:
            faces.append(_face(20.0 + 3 * t, 20.0, 40.0))
        elif t >= hidden.stop:
            faces.append(_face(back_x + 3 * (t - hidden.stop), 20.0, 40.0))
        obs.append(faces)
    return obs


def test_a_moving_face_back_where_its_walk_took_it_is_the_same_person() -> None:
    """A hidden while walking comes back 60 px on (1.5 faces): joined by its speed, so it keeps its seed and is
    counted once (was a new person: centres were compared only with where it was hidden)."""
    tracks = link_tracks(_crossing(back_x=20.0 + 3 * 50))
    assert [(tr.start, tr.end) for tr in tracks] == [(0, 80), (0, 30), (50, 80)]
    assert tracks[2].who == tracks[1].who != tracks[0].who
    assert seed_offsets(tracks) == [0, 1, 1]
    assert len(select_tracks(tracks, Selection(order="left-right", max_faces=2))) == 3  # two people, A in 2 pieces
    against = link_tracks(_crossing(back_x=20.0 + 3 * 29 - 60))  # someone 60 px behind where A was hidden
    assert len({tr.who for tr in against}) == 3
    stopped = link_tracks(_crossing(back_x=20.0 + 3 * 29))  # A stopped behind B: back where it was hidden
    assert len({tr.who for tr in stopped}) == 2


def test_embeddings_decide_where_they_exist() -> None:
    same = link_tracks(_scene(a_back=(200.0, 100.0), a=_unit(0), b=_unit(1)))  # A back elsewhere: still A
    assert len({tr.who for tr in same}) == 2
    other = link_tracks(_scene(a=_unit(0), a_later=_unit(2), b=_unit(1)))  # someone else where A was
    assert len({tr.who for tr in other}) == 3


@pytest.mark.parametrize(("seed", "want"), [(7, [7, 8]), (2**64 - 1, [0, 2**64 - 1])])
def test_every_piece_of_a_person_gets_the_same_seed(tmp_path: Path, seed: int, want: list[int]) -> None:
    """B's seed, A's (both pieces) the next; past 2**64 - 1 it wraps like the photo path's (torch refused it)."""
    frames = [np.full((120, 180, 3), 128, np.uint8) for _ in range(80)]
    src = encode_clip(tmp_path / "hide.mp4", frames)
    obs = iter(_scene())
    ft = track_video(src, lambda rgb: next(obs), TrackOptions())
    assert len(ft.tracks) == 3
    seen: list[int] = []

    def refine(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
        seen.extend(seeds)
        return crops

    opts = FuseOptions(crop_size=64, seed=seed, keyframes=KeyframeOptions(per_second=2.0))
    fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, refine, opts))
    assert sorted(set(seen)) == want  # was 7, 8, 9: A's second piece had its own


def _passing() -> list[list[FaceObs]]:
    """18 frames: B still at x 80 (listed first: track 0); A walking right at 8 px/frame behind it, not detected
    while within 30 px of it (frames 7-13: hidden 7 frames, within max_gap 8)."""
    obs: list[list[FaceObs]] = []
    for t in range(18):
        x = 8.0 * t
        faces = [_face(80.0, 40.0, 40.0)]
        if abs(x - 80.0) >= 30:
            faces.append(_face(x, 40.0, 40.0))
        obs.append(faces)
    return obs


def test_a_face_passing_behind_another_keeps_its_track() -> None:
    """A's box moved on at its speed lands on B's box while A is hidden: on that tie A's track took B's detections
    (B's track ended, A's followed B with A's seed; A came back as a third track). Recently seen tracks choose first."""
    tracks = link_tracks(_passing())
    assert [(tr.start, tr.end) for tr in tracks] == [(0, 18), (0, 18)], tracks
    b, a = tracks
    assert b.detected.all() and np.allclose(b.bboxes[:, 0], 80.0)
    assert np.flatnonzero(~a.detected).tolist() == list(range(7, 14))
    assert np.allclose(a.bboxes[:, 0], 8.0 * np.arange(18))  # the gap filled along A's walk


def test_a_face_passing_behind_another_is_pasted_under_it(tmp_path: Path) -> None:
    """A walks behind B (hidden 7 frames <= max_gap: its track is interpolated through B). A's guessed crop there
    shows B's face; pasted after B's (track order), it covered B's refined face with A's refinement of it. Faces
    the detector saw are pasted last now."""
    src = encode_clip(tmp_path / "pass.mp4", [np.full((120, 180, 3), 128, np.uint8) for _ in range(18)])
    it = iter(_passing())
    ft = track_video(src, lambda rgb: next(it), TrackOptions(smooth_seconds=0.0))
    a = ft.tracks[1]
    assert len(ft.tracks) == 2 and a.length == 18 and not a.detected.all(), ft.tracks
    colours = {0: (0.0, 0.0, 1.0), 1: (1.0, 0.0, 0.0)}  # B blue, A red

    def refine(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
        return np.stack([np.broadcast_to(np.float32(colours[s]), c.shape) for c, s in zip(crops, seeds, strict=True)])

    opts = FuseOptions(crop_size=64, keyframes=KeyframeOptions(per_second=0.0), encode=EncodeOptions(crf=0))
    fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, refine, opts))
    frames = read_frames(tmp_path / "out.mp4")
    hidden = [t for t in range(18) if not a.detected[t - a.start]]
    centre = [frames[t][60, 100].astype(int) for t in hidden]  # B's face centre
    assert all(c[2] > 200 and c[0] < 60 for c in centre), centre  # B's blue, never A's red
