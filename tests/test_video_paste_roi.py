"""The fusion pass pastes through the rectangle its faces' masks reach, not the whole crop footprint: the rectangle
must hold every pixel the paste changes (else a face would be cut), and be clearly smaller (the point)."""

from __future__ import annotations

import cv2
import numpy as np
from tokenfuse.faces.align import template
from tokenfuse.faces.masks import crop_mask
from tokenfuse.video.fuse_pass import _support_corners


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
