"""A face photo with known landmarks for benches and integration tests: skimage's public-domain astronaut.

astronaut_faces builds FACES by hand (scaled landmarks, soft ellipse mask), so a test of the fusion path needs no
detector. Needs the pack loaded as `tokenfuse` (devkit/pack_loader.py or tests/conftest.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
# YuNet landmarks on skimage.data.astronaut() (512 px); scaled with the frame.
ASTRONAUT_LM = np.array([[200.1, 101.8], [247.1, 102.6], [220.4, 124.5], [198.6, 142.8], [239.7, 143.6]], np.float32)
ASTRONAUT_BOX = (178.2, 62.9, 268.1, 176.2)


def astronaut_frame(size: int) -> np.ndarray:
    import cv2
    from skimage import data

    img = data.astronaut().astype(np.float32) / 255.0
    frame: np.ndarray = cv2.resize(
        img, (size, size), interpolation=cv2.INTER_CUBIC if size > 512 else cv2.INTER_AREA
    ).clip(0, 1)
    return frame


def astronaut_faces(size: int, crop_size: int = 512) -> Any:
    """FACES for the astronaut frame at `size` px, built by hand (landmarks scaled; mask: soft ellipse)."""
    import cv2
    from tokenfuse.faces.types import Face, FaceSet

    s = size / 512.0
    lm = ASTRONAUT_LM * s
    dst = FFHQ_512 * (crop_size / 512.0)
    affine, _ = cv2.estimateAffinePartial2D(lm.astype(np.float64), dst, method=cv2.LMEDS)
    mask: np.ndarray = np.zeros((crop_size, crop_size), np.float32)
    c = crop_size / 512.0
    cv2.ellipse(mask, (int(256 * c), int(290 * c)), (int(150 * c), int(190 * c)), 0, 0, 360, 1.0, -1)
    mask = cv2.GaussianBlur(mask, (0, 0), sigmaX=8 * c)
    face = Face(
        bbox=(ASTRONAUT_BOX[0] * s, ASTRONAUT_BOX[1] * s, ASTRONAUT_BOX[2] * s, ASTRONAUT_BOX[3] * s),
        score=0.9,
        landmarks=lm,
        affine=affine,
        inverse=cv2.invertAffineTransform(affine),
        crop_size=crop_size,
        mask=mask,
    )
    return FaceSet(image_size=(size, size), faces=((face,),))
