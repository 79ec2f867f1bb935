"""ArcFace path of the insightface backend with a seeded stand-in recognition model of the real I/O signature
(no package ships ArcFace weights): embeddings are computed, unit length, and drive reference-face selection."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import tokenfuse
import torch
from tokenfuse.faces.embed import ArcFaceEmbedder
from tokenfuse.faces.models import ModelFileError

onnx = pytest.importorskip("onnx")


def _fake_arcface(path: Path, seed: int = 0) -> None:
    """[N, 3, 112, 112] -> AveragePool 8 -> Flatten -> MatMul [588, 512]: deterministic and appearance-sensitive."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((588, 512)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("AveragePool", ["input.1"], ["p"], kernel_shape=[8, 8], strides=[8, 8]),
            helper.make_node("Flatten", ["p"], ["f"], axis=1),
            helper.make_node("MatMul", ["f", "w"], ["683"]),
        ],
        "fake_arcface",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["N", 3, 112, 112])],
        [helper.make_tensor_value_info("683", TensorProto.FLOAT, ["N", 512])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def pack(shared_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("insightface")
    folder = root / "models" / "buffalo_test"
    folder.mkdir(parents=True)
    shutil.copy(shared_assets / "scrfd_500m_bnkps.onnx", folder / "det_500m.onnx")
    _fake_arcface(folder / "w600k_r50.onnx")
    return folder


@pytest.fixture(scope="module")
def t1() -> torch.Tensor:
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("insightface wheel not installed (pip install --no-deps insightface==2.1): no t1.jpg")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "images" / "t1.jpg"
    return torch.from_numpy(cv2.imread(str(path))[None, ..., ::-1].astype(np.float32) / 255)


def _detect(image: torch.Tensor, pack: Path, **kw):
    args = (
        dict(
            backend="insightface",
            score_threshold=0.5,
            order="left-right",
            indices="",
            max_faces=0,
            min_face_size=0,
            crop_size=512,
            crop_factor=1.0,
            detect_size=640,
            device="cpu",
            model_name=str(pack),
        )
        | kw
    )
    return tokenfuse.NODE_CLASS_MAPPINGS["TokenFuseFaceDetect"]().detect(image, **args)[0]


@pytest.mark.usefixtures("allow_absolute_model_paths")
def test_embeddings_and_reference_selection(pack: Path, t1: torch.Tensor) -> None:
    faces = _detect(t1, pack)
    assert faces.count == 6
    for f in faces.faces[0]:
        assert f.embedding is not None and f.embedding.shape == (512,)
        assert np.linalg.norm(f.embedding) == pytest.approx(1.0, abs=1e-5)
    ref = _detect(t1, pack, indices="2")
    target = ref.faces[0][0]
    picked = _detect(t1, pack, reference_faces=ref, similarity_threshold=0.999)
    assert picked.count == 1
    assert np.allclose(picked.faces[0][0].landmarks, target.landmarks)
    assert _detect(t1, pack, reference_faces=ref, similarity_threshold=-1.0).count == 6


def test_wrong_recognition_model(pack: Path, shared_assets: Path) -> None:
    with pytest.raises(ModelFileError, match="not an ArcFace recognition model"):
        ArcFaceEmbedder(shared_assets / "scrfd_500m_bnkps.onnx")
