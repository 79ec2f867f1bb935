"""GFPGANEnhance: real spandrel architectures with seeded random weights, saved the way real checkpoints are and
loaded through the real loader; a real face photo (skimage astronaut) aligned to the FFHQ-512 template.

Random weights prove loading, shapes, determinism and error handling, never quality. Each model run at 512 takes
several seconds on CPU, so every test restores at most one crop and the GFPGAN output is shared.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tokenfuse.faces.types import Face, FaceSet
from tokenfuse.fusion.restore import (
    RestorerLoadError,
    align_crop,
    load_restorer,
    mix_visibility,
    restore_crop,
)
from tokenfuse.nodes import enhance_node
from tokenfuse.nodes.enhance_node import NO_MODEL, GFPGANEnhance

# YuNet landmarks on skimage.data.astronaut() (detected once with the shared YuNet model; fixed here so this test
# needs no detector): left eye, right eye, nose, mouth left, mouth right.
ASTRONAUT_LANDMARKS = np.array(
    [[200.1, 101.8], [247.1, 102.6], [220.4, 124.5], [198.6, 142.8], [239.7, 143.6]], dtype=np.float32
)
ASTRONAUT_BBOX = (178.2, 62.9, 268.1, 176.2)
# FFHQ-512 five-point template used by GFPGAN / CodeFormer (facexlib).
FFHQ_512 = np.array(
    [[192.98138, 239.94708], [318.90277, 240.1936], [256.63416, 314.01935], [201.26117, 371.41043],
     [313.08905, 371.15118]],
    dtype=np.float32,
)  # fmt: skip


def _face(crop_size: int = 512, crop: np.ndarray | None = None) -> Face:
    affine, _ = cv2.estimateAffinePartial2D(ASTRONAUT_LANDMARKS, FFHQ_512 * (crop_size / 512), method=cv2.LMEDS)
    return Face(
        bbox=ASTRONAUT_BBOX,
        score=0.9,
        landmarks=ASTRONAUT_LANDMARKS,
        affine=affine,
        inverse=cv2.invertAffineTransform(affine),
        crop_size=crop_size,
        mask=np.ones((crop_size, crop_size), np.float32),
        crop=crop,
    )


@pytest.fixture(scope="module", autouse=True)
def _free_cached_model() -> object:
    """The node keeps its last model (350 MB for GFPGAN); drop it when this module is done."""
    yield
    enhance_node._CACHE.clear()


@pytest.fixture(scope="module")
def astronaut() -> torch.Tensor:
    from skimage import data

    return torch.from_numpy(data.astronaut().astype(np.float32) / 255.0)[None]  # [1, 512, 512, 3]


@pytest.fixture(scope="module")
def aligned(astronaut: torch.Tensor) -> np.ndarray:
    face = _face()
    return align_crop(astronaut[0].numpy(), face.affine, face.crop_size)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real GFPGAN v1 (clean) and RestoreFormer architectures, seeded, saved like the released checkpoints."""
    from spandrel.architectures.GFPGAN import GFPGAN
    from spandrel.architectures.RestoreFormer import RestoreFormer

    root = tmp_path_factory.mktemp("facerestore_models")
    torch.manual_seed(0)
    gfpgan = GFPGAN(out_size=512, num_style_feat=512, channel_multiplier=2, different_w=True, sft_half=True)
    sd = gfpgan.state_dict()
    torch.save({"params_ema": sd}, root / "GFPGANv1.4.pth")  # the released GFPGAN files wrap it like this
    save_file({k: v.contiguous() for k, v in sd.items()}, str(root / "GFPGANv1.4.safetensors"))
    torch.manual_seed(1)
    torch.save({"state_dict": RestoreFormer().state_dict()}, root / "RestoreFormer.pth")
    return {
        "gfpgan_pth": root / "GFPGANv1.4.pth",
        "gfpgan_st": root / "GFPGANv1.4.safetensors",
        "restoreformer_pth": root / "RestoreFormer.pth",
    }


@pytest.fixture(scope="module")
def gfpgan_restored(models: dict[str, Path], aligned: np.ndarray) -> np.ndarray:
    restorer = load_restorer(models["gfpgan_pth"])
    assert restorer.arch == "GFPGAN" and not restorer.takes_fidelity
    assert restorer.name == "GFPGANv1.4.pth"
    return restore_crop(restorer, aligned)


def test_align_crop_maps_landmarks_onto_template(astronaut: torch.Tensor, aligned: np.ndarray) -> None:
    assert aligned.shape == (512, 512, 3) and aligned.dtype == np.float32
    # the photo's landmarks land near the template (a similarity fit: a few pixels of residual are expected)
    face = _face()
    mapped = cv2.transform(ASTRONAUT_LANDMARKS[None], face.affine)[0]
    err = np.linalg.norm(mapped - FFHQ_512, axis=1)
    assert err.mean() < 8.0 and err.max() < 15.0, err
    assert 0.05 < float(aligned.mean()) < 0.95


def test_gfpgan_pth_restores_one_aligned_crop(gfpgan_restored: np.ndarray, aligned: np.ndarray) -> None:
    assert gfpgan_restored.shape == (512, 512, 3) and gfpgan_restored.dtype == np.float32
    assert np.isfinite(gfpgan_restored).all()
    assert gfpgan_restored.min() >= 0 and gfpgan_restored.max() <= 1
    assert np.abs(gfpgan_restored - aligned).mean() > 0.01


@pytest.mark.usefixtures("allow_absolute_model_paths")
def test_node_safetensors_matches_pth_deterministically(
    models: dict[str, Path], astronaut: torch.Tensor, aligned: np.ndarray, gfpgan_restored: np.ndarray
) -> None:
    """Same weights as .safetensors through the node (face carries a crop) == the .pth run: format and run agree."""
    faces = FaceSet(image_size=(512, 512), faces=((_face(crop=aligned),),))
    crops, out_faces, report = GFPGANEnhance().enhance(astronaut, faces, str(models["gfpgan_st"]), 1.0, 0.5)
    assert crops.shape == (1, 512, 512, 3) and crops.dtype == torch.float32
    restored = out_faces.faces[0][0].crop
    np.testing.assert_array_equal(restored, gfpgan_restored)
    np.testing.assert_array_equal(crops[0].numpy(), gfpgan_restored)
    assert faces.faces[0][0].crop is aligned  # the input FACES are not mutated
    assert "GFPGAN" in report and "1 face(s)" in report


def test_visibility_mix() -> None:
    rng = np.random.default_rng(0)
    restored, original = rng.random((2, 8, 8, 3), dtype=np.float32)
    np.testing.assert_array_equal(mix_visibility(restored, original, 0.0), original)
    np.testing.assert_array_equal(mix_visibility(restored, original, 1.0), restored)
    np.testing.assert_allclose(mix_visibility(restored, original, 0.25), 0.25 * restored + 0.75 * original, atol=1e-6)


def test_node_visibility_zero_is_identity(astronaut: torch.Tensor, aligned: np.ndarray) -> None:
    """No crop on the face: it is aligned from the IMAGE for the preview; visibility 0 (model not run) leaves the FACES
    as they came (no crop: Blend keeps the frame exactly; a resampled copy softened the face by up to 19/255)."""
    faces = FaceSet(image_size=(512, 512), faces=((_face(),),))
    crops, out_faces, report = GFPGANEnhance().enhance(astronaut, faces, "not-needed.pth", 0.0, 0.5)
    assert out_faces.faces[0][0] is faces.faces[0][0] and out_faces.faces[0][0].crop is None
    np.testing.assert_array_equal(crops[0].numpy(), aligned)
    assert "visibility 0" in report
    with_crop = FaceSet(image_size=(512, 512), faces=((_face().with_crop(aligned * 0.5),),))
    kept = GFPGANEnhance().enhance(astronaut, with_crop, "not-needed.pth", 0.0, 0.5)[1]
    np.testing.assert_array_equal(kept.faces[0][0].crop, aligned * 0.5)  # an earlier node's crop stays


def test_rgba_and_gray_images_are_taken_like_facedetect_and_blend_take_them(
    astronaut: torch.Tensor, aligned: np.ndarray
) -> None:
    """An RGBA image (core Join Image with Alpha) or a 1-channel one went through FaceDetect, ScheduledFusion and
    Blend but GFPGANEnhance refused it ("IMAGE must be [B, H, W, 3]"): alpha is dropped, gray repeated."""
    faces = FaceSet(image_size=(512, 512), faces=((_face(),),))
    rgba = torch.cat([astronaut, torch.ones_like(astronaut[..., :1])], dim=-1)
    crops, _, _ = GFPGANEnhance().enhance(rgba, faces, "not-needed.pth", 0.0, 0.5)
    np.testing.assert_array_equal(crops[0].numpy(), aligned)
    gray = astronaut[..., :1]
    crops, _, _ = GFPGANEnhance().enhance(gray, faces, "not-needed.pth", 0.0, 0.5)
    assert crops.shape[-1] == 3 and np.allclose(crops[0].numpy()[..., 0], crops[0].numpy()[..., 2])


def test_restoreformer_pth_on_a_256_crop(models: dict[str, Path], astronaut: torch.Tensor) -> None:
    """RestoreFormer (wrapped in "state_dict"), a 256 crop: resized to 512 for the model and back."""
    restorer = load_restorer(models["restoreformer_pth"])
    assert restorer.arch == "RestoreFormer"
    face = _face(crop_size=256)
    crop = align_crop(astronaut[0].numpy(), face.affine, 256)
    out = restore_crop(restorer, crop)
    assert out.shape == (256, 256, 3) and np.isfinite(out).all()
    assert out.min() >= 0 and out.max() <= 1
    assert np.abs(out - crop).mean() > 0.01


class _Evil:
    def __init__(self, fn: object, arg: str) -> None:
        self.fn, self.arg = fn, arg

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (self.fn, (self.arg,))


@pytest.mark.usefixtures("allow_absolute_model_paths")
@pytest.mark.parametrize("how", ["os.system", "open"])
def test_malicious_pickle_is_refused(tmp_path: Path, how: str) -> None:
    marker = tmp_path / "pwned"
    payload = _Evil(os.system, f"touch {marker}") if how == "os.system" else _Evil(open, str(marker))
    evil = tmp_path / "GFPGANv1.4.pth"
    torch.save({"params_ema": {"toRGB.0.weight": torch.zeros(1), "hook": payload}}, evil)
    assert not marker.exists()
    with pytest.raises(RestorerLoadError, match=r"refused to load GFPGANv1\.4\.pth.*safetensors"):
        load_restorer(evil)
    assert not marker.exists()
    with pytest.raises(RestorerLoadError, match="refused"):  # the node path refuses it too
        GFPGANEnhance().enhance(
            torch.zeros(1, 512, 512, 3), FaceSet(image_size=(512, 512), faces=((_face(),),)), str(evil), 1.0, 0.5
        )
    assert not marker.exists()


def test_unrecognised_and_non_face_models(tmp_path: Path) -> None:
    from spandrel.architectures.Compact import Compact

    unknown = tmp_path / "mystery.safetensors"
    save_file({"foo.weight": torch.zeros(3, 3)}, str(unknown))
    with pytest.raises(RestorerLoadError, match="mystery.safetensors: spandrel .* does not recognise"):
        load_restorer(unknown)

    torch.manual_seed(0)
    upscaler = tmp_path / "2x-compact.safetensors"
    save_file(Compact(num_feat=8, num_conv=2, upscale=2).state_dict(), str(upscaler))
    with pytest.raises(RestorerLoadError, match="not a face restorer"):
        load_restorer(upscaler)

    corrupt = tmp_path / "broken.safetensors"
    corrupt.write_bytes(b"\x00" * 64)
    with pytest.raises(RestorerLoadError, match="broken.safetensors"):
        load_restorer(corrupt)

    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"x")
    with pytest.raises(RestorerLoadError, match="unsupported model file type"):
        load_restorer(onnx)


def test_missing_model_names_folder_and_fix(astronaut: torch.Tensor) -> None:
    faces = FaceSet(image_size=(512, 512), faces=((_face(),),))
    with pytest.raises(FileNotFoundError, match="facerestore_models") as err:
        GFPGANEnhance().enhance(astronaut, faces, NO_MODEL, 1.0, 0.5)
    assert "download" in str(err.value)
    with pytest.raises(RestorerLoadError, match="not found"):
        load_restorer("/nonexistent/GFPGANv1.4.pth")


def test_missing_model_stops_the_run_on_a_photo_without_faces_too(astronaut: torch.Tensor) -> None:
    """Issue 33 item 1: a workflow naming a model that is not installed stops with the pack's message (file, folder,
    download address) whatever the photo holds, instead of passing the photo through."""
    no_faces = FaceSet(image_size=(512, 512), faces=((),))
    with pytest.raises(FileNotFoundError) as err:
        GFPGANEnhance().enhance(astronaut, no_faces, "GFPGANv1.4.pth", 1.0, 0.5)
    msg = str(err.value)
    assert "'GFPGANv1.4.pth'" in msg and "models/facerestore_models" in msg, msg
    assert "https://github.com/TencentARC/GFPGAN/releases/download/v1.3.0/GFPGANv1.4.pth" in msg, msg
    with pytest.raises(FileNotFoundError, match="no face-restoration model is installed"):
        GFPGANEnhance().enhance(astronaut, no_faces, NO_MODEL, 1.0, 0.5)


def test_model_name_skips_comfyuis_list_check() -> None:
    """VALIDATE_INPUTS takes model_name, so ComfyUI does not refuse a file missing from the list before the run (a
    red outline and a "successful" run): the node's own message stops it."""
    import inspect

    assert "model_name" in inspect.getfullargspec(GFPGANEnhance.VALIDATE_INPUTS).args
    assert GFPGANEnhance.VALIDATE_INPUTS(model_name="GFPGANv1.4.pth") is True
    assert "model_name" in str(GFPGANEnhance.VALIDATE_INPUTS(model_name=3))


def test_bad_inputs(astronaut: torch.Tensor, caplog: pytest.LogCaptureFixture) -> None:
    node = GFPGANEnhance()
    no_faces = FaceSet(image_size=(512, 512), faces=((),))
    with caplog.at_level(logging.WARNING):
        crops, out_faces, report = node.enhance(astronaut, no_faces, NO_MODEL, 0.0, 0.5)  # visibility 0: no model
    assert crops is astronaut and out_faces is no_faces and "no faces" in report
    assert any("no faces" in r.message for r in caplog.records)

    empty = torch.zeros(0, 512, 512, 3)
    crops, _, report = node.enhance(empty, FaceSet(image_size=(512, 512), faces=()), NO_MODEL, 0.0, 0.5)
    assert crops.shape[0] == 0 and "empty batch" in report

    wrong_size = FaceSet(image_size=(256, 256), faces=((_face(),),))
    with pytest.raises(ValueError, match="connect the same image"):
        node.enhance(astronaut, wrong_size, NO_MODEL, 1.0, 0.5)
    wrong_batch = FaceSet(image_size=(512, 512), faces=((), ()))
    with pytest.raises(ValueError, match="connect the same batch"):
        node.enhance(astronaut, wrong_batch, NO_MODEL, 1.0, 0.5)
    with pytest.raises(TypeError, match="FACES"):
        node.enhance(astronaut, {"faces": []}, NO_MODEL, 1.0, 0.5)


def test_model_choices_without_comfyui() -> None:
    choices = GFPGANEnhance.INPUT_TYPES()["required"]["model_name"][0]
    assert choices == [NO_MODEL] or all(c.endswith((".safetensors", ".pth", ".pt", ".ckpt", ".bin")) for c in choices)


class _FidelityEcho(torch.nn.Module):
    """Stand-in with CodeFormer's calling convention (spandrel_extra_arches: forward(x, weight) on [-1, 1])."""

    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, weight: float = 0.5) -> tuple[torch.Tensor, None]:
        assert x.min() >= -1 and x.max() <= 1
        return torch.full_like(x, weight * 2 - 1), None


def test_fidelity_reaches_models_that_take_it() -> None:
    from types import SimpleNamespace

    from tokenfuse.fusion.restore import Restorer, _fidelity_param

    module = _FidelityEcho()
    assert _fidelity_param(module) == "weight"
    restorer = Restorer(descriptor=SimpleNamespace(model=module), arch="CodeFormer", name="cf", takes_fidelity=True)
    crop = np.full((64, 64, 3), 0.3, np.float32)
    np.testing.assert_allclose(restore_crop(restorer, crop, fidelity=0.7), 0.7, atol=1e-5)
    np.testing.assert_allclose(restore_crop(restorer, crop, fidelity=0.2), 0.2, atol=1e-5)


def test_out_of_memory_on_one_face_passes_it_through(
    monkeypatch: pytest.MonkeyPatch, astronaut: torch.Tensor, aligned: np.ndarray
) -> None:
    """A face that runs out of memory keeps its input crop; the other faces and frames are still restored."""
    from types import SimpleNamespace

    from tokenfuse.fusion import restore as enhance
    from tokenfuse.fusion.restore import Restorer

    restorer = Restorer(SimpleNamespace(model=_FidelityEcho()), arch="CodeFormer", name="cf", takes_fidelity=True)
    monkeypatch.setattr(enhance_node, "_load", lambda path: (restorer, None))
    monkeypatch.setattr(enhance_node, "_model_file", lambda name: name)
    real, calls = enhance.restore_crop, []

    def flaky(*args: object, **kw: object) -> np.ndarray:
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("simulated")
        return real(*args, **kw)

    monkeypatch.setattr(enhance, "restore_crop", flaky)
    faces = FaceSet(image_size=(512, 512), faces=((_face(), _face()),))
    crops, out_faces, report = GFPGANEnhance().enhance(astronaut, faces, "cf", 1.0, 0.25)
    first, second = (f.crop for f in out_faces.faces[0])
    assert first is None  # passed through: the face as it came (Blend keeps the frame there)
    np.testing.assert_array_equal(crops[0].numpy(), aligned)
    np.testing.assert_allclose(second, 0.25, atol=1e-5)
    assert crops.shape == (2, 512, 512, 3)
    assert "1 passed through unrestored (frame 0 face 0: MemoryError)" in report

    monkeypatch.setattr(enhance, "restore_crop", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bug")))
    with pytest.raises(RuntimeError, match="bug"):  # anything else is a real error, not a pass-through
        GFPGANEnhance().enhance(astronaut, faces, "cf", 1.0, 0.25)


def test_a_model_file_replaced_under_its_name_runs_the_nodes_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ComfyUI re-runs a node only when its inputs or IS_CHANGED change: a GFPGANv1.4.pth (or inswapper) overwritten
    with other weights kept the old result on the next queue."""
    from tokenfuse.nodes.enhance_node import GFPGANEnhance
    from tokenfuse.nodes.fusion_node import ScheduledFusion

    monkeypatch.setenv("TOKENFUSE_MODELS", str(tmp_path))
    (tmp_path / "facerestore_models").mkdir()
    (tmp_path / "insightface").mkdir()
    restore, swap = tmp_path / "facerestore_models" / "GFPGANv1.4.pth", tmp_path / "insightface" / "inswapper_128.onnx"
    restore.write_bytes(b"old")
    swap.write_bytes(b"old")
    before = GFPGANEnhance.IS_CHANGED(model_name="GFPGANv1.4.pth", visibility=1.0)
    swap_before = ScheduledFusion.IS_CHANGED(swap_model="inswapper_128.onnx", seed=1)
    assert before and before == GFPGANEnhance.IS_CHANGED(model_name="GFPGANv1.4.pth", visibility=0.5)
    for path in (restore, swap):
        path.write_bytes(b"new weights")
        os.utime(path, ns=(1, 2))
    assert GFPGANEnhance.IS_CHANGED(model_name="GFPGANv1.4.pth") != before
    assert ScheduledFusion.IS_CHANGED(swap_model="inswapper_128.onnx") != swap_before
    assert GFPGANEnhance.IS_CHANGED(model_name="missing.pth") == ""  # its own check names the problem at run time
    assert ScheduledFusion.IS_CHANGED() == "|"


def test_a_detector_model_replaced_under_its_name_runs_face_detect_and_face_track_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenfuse.nodes.face_nodes import FaceDetect
    from tokenfuse.nodes.video_nodes import FaceTrack

    monkeypatch.setenv("TOKENFUSE_MODELS", str(tmp_path))
    (tmp_path / "facedetection").mkdir()
    pack = tmp_path / "insightface" / "models" / "mine"
    pack.mkdir(parents=True)
    yunet, rec = tmp_path / "facedetection" / "yunet_custom.onnx", pack / "w600k_r50.onnx"
    yunet.write_bytes(b"old")
    rec.write_bytes(b"old")
    before = {
        "yunet": FaceDetect.IS_CHANGED(backend="yunet", model_name="yunet_custom", max_faces=1),
        "insightface": FaceTrack.IS_CHANGED(backend="insightface", model_name="mine"),
    }
    assert all(before.values()) and FaceDetect.IS_CHANGED(backend="yunet", model_name="yunet_custom") == before["yunet"]
    for path in (yunet, rec):
        path.write_bytes(b"new weights")
        os.utime(path, ns=(1, 2))
    assert FaceDetect.IS_CHANGED(backend="yunet", model_name="yunet_custom") != before["yunet"]
    assert FaceTrack.IS_CHANGED(backend="insightface", model_name="mine") != before["insightface"]
    assert FaceDetect.IS_CHANGED(backend="auto", model_name="") == FaceDetect.IS_CHANGED(backend="mtcnn") == ""
