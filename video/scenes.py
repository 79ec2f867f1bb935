"""Scene-cut detection from consecutive frames: colour-histogram distance on a small thumbnail.

A cut changes the colour distribution of the whole frame at once; motion and talking do not. The thumbnail
(64 px wide) keeps this at well under a millisecond per frame at any resolution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np


def thumbnail_hist(rgb: np.ndarray, width: int = 64) -> np.ndarray:
    """rgb [H, W, 3] uint8 -> normalised HSV histogram (16 hue x 8 sat x 4 value bins) of a small copy, [512]."""
    h, w = rgb.shape[:2]
    small = cv2.resize(rgb, (width, max(1, round(h * width / max(w, 1)))), interpolation=cv2.INTER_AREA)
    hsv = cv2.cvtColor(small, cv2.COLOR_RGB2HSV)
    hist = cv2.calcHist([hsv], [0, 1, 2], None, [16, 8, 4], [0, 180, 0, 256, 0, 256]).reshape(-1)
    return hist / max(float(hist.sum()), 1.0)


@dataclass
class CutDetector:
    """Feed frames in order; `update` returns True on the first frame of a new scene.

    threshold: Bhattacharyya distance between consecutive histograms above which a cut is declared (0 = same
    distribution, 1 = disjoint). 0.45 separates cuts from fast motion on the test clips.
    """

    threshold: float = 0.45
    _prev: np.ndarray | None = field(default=None, repr=False)
    last_distance: float = 0.0

    def update(self, rgb: np.ndarray) -> bool:
        return self.update_hist(thumbnail_hist(rgb))

    def update_hist(self, hist: np.ndarray) -> bool:
        """update with the frame's thumbnail_hist computed already (e.g. in a decoding thread)."""
        prev, self._prev = self._prev, hist
        if prev is None:
            return False
        self.last_distance = float(
            cv2.compareHist(prev.astype(np.float32), hist.astype(np.float32), cv2.HISTCMP_BHATTACHARYYA)
        )
        return self.last_distance > self.threshold
