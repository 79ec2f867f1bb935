"""ScheduledFusion geometry on a real photo: crop -> mask -> paste, context crops, crop-space plans, seeds, batches.

Also the home of `astronaut_faceset()`, a FACES built by hand from the landmarks YuNet finds on skimage's astronaut
(so these tests do not depend on the detector node), imported by the other fusion tests.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from tokenfuse.faces.types import Face, FaceSet
from tokenfuse.fusion.crops import (
    aligned_crop,
    context_affine,
    context_transform,
    crop_plan,
    face_seed,
    make_batches,
    noise_mask_context,
    resize_square,
    top_tokens,
)

# FFHQ-512 five-point template (the one GFPGAN/CodeFormer crops use).
FFHQ_512 = np.array(
    [
        [192.98138, 239.94708],
        [318.90277, 240.1936],
        [256.63416, 314.01935],
        [201.26117, 371.41043],
        [313.08905, 371.15118],
    ],
    dtype=np.float64,
)
# YuNet (shared/assets/face_detection_yunet_2026may.onnx) on skimage.data.astronaut(): box and landmarks.
ASTRONAUT_BOX = (178.2, 62.9, 178.2 + 89.9, 62.9 + 113.3)
ASTRONAUT_LM = np.array([[200.1, 101.8], [247.1, 102.6], [220.4, 124.5], [198.6, 142.8], [239.7, 143.6]], np.float32)


def make_face(
    landmarks: np.ndarray,
    bbox: tuple[float, float, float, float],
    crop_size: int = 512,
    embedding: np.ndarray | None = None,
) -> Face:
    """A Face aligned to the FFHQ template with a soft elliptical mask (what FaceDetect produces, built by hand)."""
    dst = FFHQ_512 * (crop_size / 512.0)
    affine, _ = cv2.estimateAffinePartial2D(landmarks.astype(np.float64), dst, method=cv2.LMEDS)
    inverse = cv2.invertAffineTransform(affine)
    mask = np.zeros((crop_size, crop_size), np.float32)
    c = crop_size / 512.0
    cv2.ellipse(mask, (int(256 * c), int(290 * c)), (int(150 * c), int(190 * c)), 0, 0, 360, 1.0, -1)
    mask = cv2.GaussianBlur(mask, (0, 0), sigmaX=8 * c)
    return Face(
        bbox=bbox,
        score=0.9,
        landmarks=landmarks.astype(np.float32),
        affine=affine,
        inverse=inverse,
        crop_size=crop_size,
        mask=mask,
        embedding=embedding,
    )


def paste_crop(image: np.ndarray, face: Face, crop: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Inverse-warp a [S, S, 3] crop (any S) into a copy of image [H, W, 3] through `mask` (crop space, default the
    face mask). A preview of what Blend does (moved here from fusion/crops.py: only this test used it); pixels with
    zero mask weight stay bit-identical."""
    size = crop.shape[0]
    h, w = image.shape[:2]
    inv = np.asarray(face.inverse, dtype=np.float64).copy()
    inv[:, :2] *= face.crop_size / float(size)
    m = resize_square(np.asarray(face.mask if mask is None else mask, dtype=np.float32), size)
    back = cv2.warpAffine(np.ascontiguousarray(crop, dtype=np.float32), inv, (w, h), flags=cv2.INTER_LINEAR)
    alpha = cv2.warpAffine(m, inv, (w, h), flags=cv2.INTER_LINEAR, borderValue=0.0)[..., None]
    out = image.astype(np.float32, copy=True)
    sel = alpha[..., 0] > 0
    out[sel] = (alpha * back + (1.0 - alpha) * out)[sel]
    return out


def astronaut() -> np.ndarray:
    from skimage import data

    return data.astronaut().astype(np.float32) / 255.0


def astronaut_faceset(frames: int = 1, faces_per_frame: int = 1, crop_size: int = 512) -> tuple[np.ndarray, FaceSet]:
    """([frames, 512, 512, 3] float32 images, FaceSet). Extra faces per frame are the same face shifted a little, so
    every face is real image content."""
    img = astronaut()
    rows = []
    for _ in range(frames):
        row = []
        for k in range(faces_per_frame):
            shift = np.array([k * 3.0, k * 2.0], np.float32)
            box = tuple(float(v) for v in np.array(ASTRONAUT_BOX) + np.tile(shift, 2))
            row.append(make_face(ASTRONAUT_LM + shift, box, crop_size))  # type: ignore[arg-type]
        rows.append(tuple(row))
    return np.stack([img] * frames), FaceSet(image_size=(512, 512), faces=tuple(rows))


def test_aligned_crop_puts_the_eyes_on_the_template() -> None:
    img, fs = astronaut_faceset()
    face = fs.faces[0][0]
    for guide, cf in ((512, 1.0), (256, 1.0), (512, 1.5)):
        a, side = context_affine(face, guide, cf, max_size=2048)
        crop = aligned_crop(img[0], face, guide, cf, max_size=2048)
        assert crop.shape == (side, side, 3) and crop.dtype == np.float32
        lm = face.landmarks @ a[:, :2].T + a[:, 2]
        m_c, _ = context_transform(face.crop_size, guide, cf, 2048)
        in_crop = face.landmarks @ face.affine[:, :2].T + face.affine[:, 2]
        assert np.allclose(lm, in_crop @ m_c[:, :2].T + m_c[:, 2], atol=1e-6)  # frame -> crop -> context
        want = FFHQ_512 @ m_c[:, :2].T + m_c[:, 2]
        assert np.abs(lm - want).max() < 12.0 * m_c[0, 0]  # the similarity fit's residual (a turned head), in px
        # the crop shows the same pixels as the frame at the mapped nose tip
        nose_ctx = np.round(lm[2]).astype(int)
        nose_img = np.round(face.landmarks[2]).astype(int)
        assert np.abs(crop[nose_ctx[1], nose_ctx[0]] - img[0][nose_img[1], nose_img[0]]).max() < 0.15


def test_context_side_is_a_multiple_of_8_and_capped() -> None:
    assert context_transform(512, 512, 1.0, 1024)[1] == 512
    assert context_transform(512, 500, 1.0, 1024)[1] == 504
    assert context_transform(512, 512, 1.5, 1024)[1] == 768
    m, side = context_transform(512, 512, 3.0, 1024)
    assert side == 1024 and m[0, 0] == pytest.approx(1024 / (512 * 3.0))
    # crop_factor 1: the map is a pure scale, the crop fills the context
    m1, s1 = context_transform(512, 256, 1.0, 1024)
    assert s1 == 256 and np.allclose(m1, [[0.5, 0, 0], [0, 0.5, 0]])


def test_crop_then_paste_restores_the_frame() -> None:
    """Crop at guide 512, paste the untouched crop back: the face region is the original (up to interpolation) and
    every pixel outside the mask is bit-identical."""
    img, fs = astronaut_faceset()
    face = fs.faces[0][0]
    crop = aligned_crop(img[0], face, 512)
    out = paste_crop(img[0], face, crop)
    alpha = cv2.warpAffine(face.mask, face.inverse, (512, 512), borderValue=0.0)
    outside = alpha == 0
    assert outside.mean() > 0.8
    assert np.array_equal(out[outside], img[0][outside])
    inside = alpha > 0.9
    assert inside.sum() > 2000
    assert np.abs(out[inside] - img[0][inside]).mean() < 0.03

    # A changed crop shows up only where the mask is: paint the crop white, the face turns white, the sky does not.
    out2 = paste_crop(img[0], face, np.ones_like(crop))
    assert out2[inside].mean() > 0.97
    assert np.array_equal(out2[outside], img[0][outside])


def test_noise_mask_covers_the_face_with_a_soft_edge() -> None:
    _, fs = astronaut_faceset()
    face = fs.faces[0][0]
    m_c, side = context_transform(face.crop_size, 256, 1.5, 1024)
    mask = noise_mask_context(face, m_c, side, feather=0.04, grow=0.02)
    assert mask.shape == (side, side) and mask.dtype == np.float32
    assert 0.0 <= mask.min() and mask.max() <= 1.0
    c = side // 2
    assert mask[c, c] > 0.99  # face centre may change
    assert mask[2, 2] == 0.0 and mask[-3, -3] == 0.0  # context border stays
    soft = ((mask > 0.05) & (mask < 0.95)).mean()
    assert soft > 0.01  # a feathered edge, not a hard cut
    hard = noise_mask_context(face, m_c, side, feather=0.0, grow=0.0)
    assert ((hard > 0.05) & (hard < 0.95)).mean() < soft


def test_crop_plan_protects_the_face_in_crop_space() -> None:
    _, fs = astronaut_faceset()
    face = fs.faces[0][0]
    m_c, side = context_transform(face.crop_size, 512, 1.0, 1024)
    masks = np.stack([noise_mask_context(face, m_c, side)] * 2)
    plan = crop_plan(masks, floor=0.1, protect_threshold=0.5)
    assert plan.batch_size == 2 and plan.image_size == (512, 512)
    assert float(plan.importance.min()) == pytest.approx(0.1) and float(plan.importance.max()) == pytest.approx(1.0)
    lvl = plan.level_importance(64, 64, batch=4)  # CFG doubles the batch: cond/uncond share the map
    assert lvl.shape == (4, 64 * 64)
    assert bool((lvl[0] == lvl[2]).all())
    assert plan.uniform_tokens[0][8] == 64 * 64
    assert plan.uniform_tokens[0][8] > plan.budgets[0][8] > 0
    assert 0.0 < plan.expected_reduction() < 0.5


def test_crop_plan_with_landmarks_protects_only_eyes_and_mouth() -> None:
    """ScheduledFusion's crop plan: the eyes and mouth stay at full resolution, the rest of the face is reducible;
    far fewer protected tokens than the whole-mask plan (what let the schedule save time on the crop)."""
    _, fs = astronaut_faceset()
    face = fs.faces[0][0]
    m_c, side = context_transform(face.crop_size, 512, 1.0, 1024)
    mask = noise_mask_context(face, m_c, side)
    a_ctx = m_c @ np.vstack([face.affine, [0.0, 0.0, 1.0]])
    lm = np.asarray(face.landmarks, np.float64) @ a_ctx[:, :2].T + a_ctx[:, 2]
    whole = crop_plan(mask[None], protect_threshold=0.5)
    feats = crop_plan(mask[None], protect_threshold=0.5, landmarks=lm[None])
    prot_whole = int((whole.level_importance(64, 64, 1) >= 0.5).sum())
    prot_feats = int((feats.level_importance(64, 64, 1) >= 0.5).sum())
    assert prot_feats < 0.3 * prot_whole, (prot_feats, prot_whole)
    imp = feats.importance[0]
    for x, y in (lm[0], lm[1], (lm[3] + lm[4]) / 2):  # eyes, mouth centre: protected
        assert float(imp[int(round(y)), int(round(x))]) >= 0.5
    cheek = (lm[2] + lm[3]) / 2 + (lm[3] - lm[4]) * 0.5  # between nose and a mouth corner, outward: face, not feature
    assert 0.1 <= float(imp[int(round(cheek[1])), int(round(cheek[0]))]) < 0.5
    assert float(imp[2, 2]) == pytest.approx(0.1)  # background floor
    assert feats.budgets[0][8] < whole.budgets[0][8]
    with pytest.raises(ValueError, match="landmarks"):
        crop_plan(mask[None], landmarks=lm)  # [5, 2] without the batch axis
    # PatchTokenize's protect_threshold may go as low as 0.05: at or under the face weight the whole face is
    # protected (a lower threshold protects more); it once raised, and ScheduledFusion passed every face through
    low = crop_plan(mask[None], protect_threshold=0.3, landmarks=lm[None])
    assert float(low.importance[0][int(round(cheek[1])), int(round(cheek[0]))]) >= 0.3
    assert int((low.level_importance(64, 64, 1) >= 0.3).sum()) > prot_feats


def test_seeds_and_batches() -> None:
    assert [face_seed(7, k) for k in range(3)] == [7, 8, 9]
    assert face_seed(2**64 - 1, 1) == 0  # wraps like ComfyUI's 64-bit seed
    assert make_batches([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3], [4]]
    assert make_batches([0, 1], 0) == [[0], [1]]
    assert make_batches([], 3) == []
    assert top_tokens(512) == 4096 and top_tokens(1024) == 16384
