"""One warp_to_crop (faces/align.py) behind every "warp the aligned crop out of the frame": each caller keeps its
exact pixels (interpolation, border, clipping, dtype) from before the merge.

The references below are the callers' own code as it stood before they were routed through warp_to_crop (commit
1110568), copied verbatim; the comparisons are bit-exact (np.array_equal), on a real photo, for a face in the middle
of the frame and one at its corner (so the border mode decides the pixels outside the frame).
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_fusion_geometry import ASTRONAUT_BOX, ASTRONAUT_LM, astronaut, make_face
from tokenfuse.faces.align import WarpStyle, warp_face, warp_to_crop
from tokenfuse.faces.types import Face, FaceSet
from tokenfuse.fusion.crops import aligned_crop, context_affine
from tokenfuse.fusion.fallback import FallbackConfig
from tokenfuse.fusion.restore import align_crop
from tokenfuse.fusion.run import FusionBackend, FusionSettings, run_fusion

_BORDER_GREY = (135 / 255, 133 / 255, 132 / 255)
H, W = 448, 512  # not square: a swapped width/height would show
CORNER = np.array([-185.0, -85.0], np.float32)  # moves the face to the top-left corner: half its crop is off-frame


def _frame() -> np.ndarray:
    """[H, W, 3] float32 in [0, 1]."""
    return np.ascontiguousarray(astronaut()[:H], dtype=np.float32)


def _face(where: str, crop_size: int = 128) -> Face:
    shift = CORNER if where == "corner" else np.zeros(2, np.float32)
    box = tuple(float(v) for v in np.array(ASTRONAUT_BOX) + np.tile(shift, 2))
    return make_face(ASTRONAUT_LM + shift, box, crop_size)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- the callers' old code
def _old_warp_face(image: np.ndarray, affine: np.ndarray, crop_size: int) -> np.ndarray:
    size = (crop_size, crop_size)
    return cv2.warpAffine(image, affine, size, flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT101)


def _old_align_crop(image: np.ndarray, affine: np.ndarray, crop_size: int) -> np.ndarray:
    crop = cv2.warpAffine(
        np.ascontiguousarray(image, dtype=np.float32),
        np.asarray(affine, dtype=np.float64),
        (int(crop_size), int(crop_size)),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=_BORDER_GREY,
    )
    return np.clip(crop, 0, 1)


def _old_aligned_crop(
    image: np.ndarray, face: Face, guide_size: int, crop_factor: float = 1.0, max_size: int = 4096
) -> np.ndarray:
    a, side = context_affine(face, guide_size, crop_factor, max_size)
    crop = cv2.warpAffine(
        np.ascontiguousarray(image, dtype=np.float32),
        a,
        (side, side),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REFLECT101,
    )
    return np.clip(crop, 0.0, 1.0)


def _old_prepare_crop(image: np.ndarray, face: Face, guide_size: int, crop_factor: float, max_size: int) -> np.ndarray:
    """fusion/run.py _prepare: the context crop handed to the VAE."""
    a_ctx, side = context_affine(face, guide_size, crop_factor, max_size)
    crop = cv2.warpAffine(
        np.ascontiguousarray(image, dtype=np.float32),
        a_ctx,
        (side, side),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REFLECT101,
    )
    return np.clip(crop, 0.0, 1.0)


def _old_passthrough_crop(image: np.ndarray, face: Face) -> np.ndarray:
    """fusion/run.py run_fusion: the crop of a face that passes through unchanged."""
    return cv2.warpAffine(
        image,
        np.asarray(face.affine, np.float64),
        (face.crop_size, face.crop_size),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REFLECT101,
    )


# ------------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("where", ["middle", "corner"])
@pytest.mark.parametrize("dtype", ["uint8", "float01"])
def test_warp_face_keeps_its_pixels(where: str, dtype: str) -> None:
    frame = np.round(_frame() * 255).astype(np.uint8) if dtype == "uint8" else _frame()
    face = _face(where, 512)
    got = warp_face(frame, face.affine, 512)
    want = _old_warp_face(frame, face.affine, 512)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("where", ["middle", "corner"])
def test_restore_align_crop_keeps_its_pixels(where: str) -> None:
    frame = _frame()
    face = _face(where, 256)
    got = align_crop(frame.astype(np.float64), face.affine, 256)  # float64 in: converted as before
    want = _old_align_crop(frame.astype(np.float64), face.affine, 256)
    assert got.dtype == want.dtype == np.float32 and np.array_equal(got, want)
    if where == "corner":
        assert np.allclose(got[0, 0], _BORDER_GREY, atol=1e-6)  # GFPGAN's grey, not a reflection


@pytest.mark.parametrize("where", ["middle", "corner"])
@pytest.mark.parametrize(("guide", "crop_factor", "max_size"), [(128, 1.0, 4096), (256, 1.6, 4096), (512, 2.0, 384)])
def test_fusion_aligned_crop_keeps_its_pixels(where: str, guide: int, crop_factor: float, max_size: int) -> None:
    frame = _frame() * 1.1  # values above 1: the clip is part of the behaviour
    face = _face(where)
    got = aligned_crop(frame, face, guide, crop_factor, max_size)
    want = _old_aligned_crop(frame, face, guide, crop_factor, max_size)
    assert got.dtype == want.dtype and np.array_equal(got, want)


class _Recorder:
    """A backend that records the crops handed to the VAE; `fail` makes every sample call raise (not an OOM), so
    every face passes through with the crop run_fusion warps for it."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.encoded: list[np.ndarray] = []

    def encode(self, pixels: torch.Tensor, tiled: bool) -> torch.Tensor:
        self.encoded += list(pixels.numpy().copy())
        return F.avg_pool2d(pixels.movedim(-1, 1), 8)

    def decode(self, latent: torch.Tensor, tiled: bool) -> torch.Tensor:
        return F.interpolate(latent, scale_factor=8, mode="bilinear", align_corners=False).movedim(1, -1).clamp(0, 1)

    def sample(self, model: Any, latent: torch.Tensor, mask: torch.Tensor, seeds: list[int], plan: Any) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("sampler broken on purpose")
        return latent

    def backend(self) -> FusionBackend:
        return FusionBackend(
            encode=self.encode, decode=self.decode, sample=self.sample, model_for=lambda attempt: ("model", "")
        )


def _two_faces() -> tuple[np.ndarray, FaceSet]:
    images = (_frame() * 1.1)[None]  # values above 1: the context crop clips, the passthrough crop does not
    faces = FaceSet(image_size=(H, W), faces=((_face("middle"), _face("corner")),))
    return images.astype(np.float32), faces


def test_fusion_context_crops_keep_their_pixels() -> None:
    images, faces = _two_faces()
    settings = FusionSettings(
        guide_size=128, max_size=256, crop_factor=1.5, faces_per_batch=2, fallback=FallbackConfig(mode="off")
    )
    rec = _Recorder(fail=False)
    run_fusion(images, faces, settings, rec.backend())
    assert len(rec.encoded) == 2
    for face, got in zip(faces.faces[0], rec.encoded, strict=True):
        want = _old_prepare_crop(images[0], face, 128, 1.5, 256)
        assert np.array_equal(got, want)


def test_fusion_passthrough_crops_keep_their_pixels() -> None:
    images, faces = _two_faces()
    result = run_fusion(images, faces, FusionSettings(guide_size=128), _Recorder(fail=True).backend())
    assert [r.status for r in result.reports] == ["passthrough", "passthrough"]
    for face, got in zip(faces.faces[0], result.crops, strict=True):
        want = _old_passthrough_crop(images[0], face)
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert result.crops[0].max() > 1.0  # not clipped, as before


def test_warp_to_crop_names_its_modes() -> None:
    img = np.arange(4 * 4 * 3, dtype=np.float32).reshape(4, 4, 3) / 48.0
    shift = np.array([[1.0, 0.0, -2.0], [0.0, 1.0, 0.0]])  # image -> crop: the crop's column 0 is the frame's column 2
    out = warp_to_crop(img, shift, 4, WarpStyle("nearest", "constant", border_value=(9.0, 9.0, 9.0)))
    assert np.array_equal(out[:, :2], img[:, 2:]) and (out[:, 2:] == 9.0).all()
    rep = warp_to_crop(img, shift, 4, WarpStyle("linear", "replicate"))
    assert np.array_equal(rep[:, 2:], np.repeat(img[:, 3:4], 2, axis=1))
    clipped = warp_to_crop(img * 3, shift, 4, WarpStyle("linear", "reflect", clip=True))
    assert clipped.max() == 1.0
    with pytest.raises(ValueError, match="interpolation"):
        WarpStyle("bogus", "reflect")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="border"):
        WarpStyle("linear", "bogus")  # type: ignore[arg-type]
