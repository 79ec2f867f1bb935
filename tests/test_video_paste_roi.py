"""The fusion pass pastes through the rectangle its faces' masks reach, not the whole crop footprint: the rectangle
must hold every pixel the paste changes (else a face would be cut), and be clearly smaller (the point)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import tokenfuse.faces.paste as paste_module
from tokenfuse.faces.align import template
from tokenfuse.faces.masks import crop_mask
from tokenfuse.video.encode import EncodeOptions
from tokenfuse.video.fuse_pass import FuseJob, FuseOptions, _support_corners, fuse_video
from tokenfuse.video.keyframes import KeyframeOptions
from tokenfuse.video.track_pass import TrackOptions, track_video
from tokenfuse.video.tracks import FaceObs
from tokenfuse.video.yuv import planes_of
from video_clips import encode_clip, read_planes


def test_support_box_holds_every_pasted_pixel_under_rotation_and_scale() -> None:
    s = 256
    mask = crop_mask(template(s, 1.0), s, 0.08)
    corners = _support_corners(mask)
    (x0, y0), (x1, y1) = corners[0], corners[3]
    assert (x1 - x0) * (y1 - y0) < 0.6 * s * s  # the crop's corners are left out
    for angle, scale, tx, ty in [
        (0, 1.0, 100.3, 40.7),
        (17, 1.9, 300.5, 20.2),
        (-33, 0.6, 50.1, 80.9),
        (90, 1.3, 7, 9),
    ]:
        inv = cv2.getRotationMatrix2D((s / 2, s / 2), angle, scale)
        inv[:, 2] += (tx, ty)  # crop -> frame
        alpha = cv2.warpAffine(mask, inv, (700, 600), flags=cv2.INTER_LINEAR, borderValue=0)
        ys, xs = np.nonzero(alpha > 0)
        pts = corners @ inv[:, :2].T + inv[:, 2]
        fx0, fy0 = np.floor(pts.min(0)) - 2
        fx1, fy1 = np.ceil(pts.max(0)) + 2
        assert xs.min() >= fx0 and xs.max() < fx1 and ys.min() >= fy0 and ys.max() < fy1, angle


def test_empty_mask_keeps_the_whole_crop() -> None:
    corners = _support_corners(np.zeros((64, 64), np.float32))
    assert corners.tolist() == [[0, 0], [64, 0], [0, 64], [64, 64]]


def _two_faces(t: int) -> list[FaceObs]:
    """A face at the frame's left edge and one at its right edge, 240 px apart."""
    lm = np.array([[0.3, 0.35], [0.7, 0.35], [0.5, 0.55], [0.35, 0.75], [0.65, 0.75]], np.float32)
    faces = []
    for x in (10.0, 270.0):
        box = np.array([x, 40.0, x + 40.0, 80.0], np.float32)
        faces.append(FaceObs(box, 0.9, box[:2] + lm * 40.0, None))
    return faces


def test_faces_far_apart_are_pasted_each_in_its_own_footprint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two faces 240 px apart on a textured frame, lossless output: between them every Y, U and V value is the input's
    (one rectangle around both went back through RGB -> YUV, which moves textured chroma), each face is fused, and
    each cubic warp of paste-back covers one face's footprint, not a crop square inside a rectangle around both."""
    rng = np.random.default_rng(0)
    frames = [cv2.GaussianBlur(rng.integers(0, 256, (120, 320, 3), np.uint8), (0, 0), 1.5) for _ in range(6)]
    src = encode_clip(tmp_path / "two.mp4", frames)
    ft = track_video(src, lambda rgb: _two_faces(0), TrackOptions(smooth_seconds=0.0))
    assert len(ft.tracks) == 2

    def refine(crops: np.ndarray, seeds: list[int]) -> np.ndarray:
        return np.clip(crops * 0.5 + np.float32(0.4), 0.0, 1.0)

    warps: list[tuple[int, int]] = []
    real = cv2.warpAffine

    def warp(src_img: np.ndarray, matrix: np.ndarray, dsize: tuple[int, int], **kw: object) -> np.ndarray:
        if kw.get("flags") == cv2.INTER_CUBIC and src_img.shape[0] == 64:
            warps.append(tuple(dsize))
        out: np.ndarray = real(src_img, matrix, dsize, **kw)
        return out

    monkeypatch.setattr(paste_module.cv2, "warpAffine", warp)
    opts = FuseOptions(crop_size=64, keyframes=KeyframeOptions(per_second=2.0), encode=EncodeOptions(0, "ultrafast"))
    fuse_video(src, tmp_path / "out.mp4", FuseJob(ft, refine, opts))
    monkeypatch.undo()
    ins, outs = read_planes(src), read_planes(tmp_path / "out.mp4")
    # each warp spans one face's mask footprint (49 px wide here); the crop square inside a rectangle around both
    # faces spanned 58-59 px
    assert len(outs) == 6 and warps and max(w for w, _ in warps) < 54, warps
    for a, b in zip(ins, outs, strict=True):
        y_in, u_in, v_in = planes_of(a, 120, 320)
        y_out, u_out, v_out = planes_of(b, 120, 320)
        assert np.array_equal(y_in[:, 120:200], y_out[:, 120:200])
        assert np.array_equal(u_in[:, 60:100], u_out[:, 60:100]) and np.array_equal(v_in[:, 60:100], v_out[:, 60:100])
        for x0 in (20, 280):  # each face's centre was fused
            assert np.abs(y_in[50:70, x0 : x0 + 20].astype(int) - y_out[50:70, x0 : x0 + 20]).mean() > 10
